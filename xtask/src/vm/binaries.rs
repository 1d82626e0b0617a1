//! The integration-test executables of the mm-probe package, built on the host, and the script
//! that runs them inside the guest (through the read-only 9p view of the host root, so the guest
//! runs exactly the files the host built).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    initramfs::{GUEST_RESULTS_DIR, MARKER},
    qemu::{Boot, Clock},
};

/// One integration-test executable (`mm-probe/tests/<name>.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    pub name: String,
    pub executable: PathBuf,
    /// The package directory: cargo runs tests from there, so the guest does too.
    pub package_dir: PathBuf,
}

/// Builds the tool, the workloads and the mm-probe integration tests (`release`: optimised, which
/// runs several times faster under TCG); returns the test executables, restricted to `only`
/// when it is not empty (an unknown name is an error).
pub fn build(only: &[String], release: bool) -> Result<Vec<TestBinary>> {
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    // The tests run the tool and the workloads as binaries found next to them. The listing
    // below resolves features as that build did (the whole workspace), so it compiles nothing.
    crate::build::for_tests(release)?;
    let mut command = Command::new("cargo");
    command.args(["test", "--workspace", "--tests", "--no-run", "--message-format=json"]).args(profile);
    eprintln!("xtask: {command:?}");
    // Compiler progress and errors go to the terminal; only the JSON messages are read.
    let out = command.stderr(Stdio::inherit()).output().context("starting cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the mm-probe integration tests failed with {}", out.status);
    }
    let all = integration_tests(&String::from_utf8_lossy(&out.stdout))?;
    if all.is_empty() {
        bail!("cargo built no integration-test executable for mm-probe");
    }
    select(all, only)
}

/// Test executables whose assertions depend on guest time: they run in a boot of their own
/// under instruction counting ([`Clock::InstructionCounted`]), where host load cannot make a
/// guest task wait. `latency_field` replays the field case (a SCHED_FIFO waker beside an
/// madvise(MADV_COLD) walk on its CPU) and asserts how long the walk delays it; `triage` that an
/// idle machine has no finding, latency's (no real-time task delayed) included.
const INSTRUCTION_COUNTED: &[&str] = &["latency_field", "triage"];

/// Test executables that need pages to have somewhere to move: they run in a boot of their own
/// whose 2 GiB and two CPUs are two NUMA nodes ([`Boot::TWO_NODES`]). `cause` proves NUMA
/// balancing and move_pages(2) between the nodes (its other tests do not depend on the nodes).
/// The rest were proved on one node and stay on one: Debian's kernels turn NUMA balancing on
/// wherever there are two, and reclaim and compaction work per node.
const TWO_NODES: &[&str] = &["cause"];

fn select(all: Vec<TestBinary>, only: &[String]) -> Result<Vec<TestBinary>> {
    if only.is_empty() {
        return Ok(all);
    }
    for name in only {
        if !all.iter().any(|b| &b.name == name) {
            let known: Vec<&str> = all.iter().map(|b| b.name.as_str()).collect();
            bail!("no integration test {name:?} in mm-probe; there are: {}", known.join(", "));
        }
    }
    Ok(all.into_iter().filter(|b| only.contains(&b.name)).collect())
}

/// The integration-test executables among `cargo --message-format=json` artifacts (kind `test`;
/// the library's own unit-test executable has kind `lib` and does not belong in the guest).
pub fn integration_tests(cargo_json: &str) -> Result<Vec<TestBinary>> {
    let mut binaries = Vec::new();
    for line in cargo_json.lines().filter(|l| l.starts_with('{')) {
        let message: Value = serde_json::from_str(line).context("parsing cargo's JSON message")?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let target = &message["target"];
        if target["kind"].as_array().is_none_or(|k| k.len() != 1 || k[0] != "test") {
            continue;
        }
        let (Some(name), Some(executable), Some(manifest)) =
            (target["name"].as_str(), message["executable"].as_str(), message["manifest_path"].as_str())
        else {
            continue;
        };
        // The listing covers the workspace; the matrix runs mm-probe's own.
        if !Path::new(manifest).ends_with("mm-probe/Cargo.toml") {
            continue;
        }
        let package_dir = Path::new(manifest).parent().context("manifest path has no directory")?.to_path_buf();
        binaries.push(TestBinary { name: name.to_owned(), executable: PathBuf::from(executable), package_dir });
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    binaries.dedup_by(|a, b| a.name == b.name);
    Ok(binaries)
}

/// A program the guest runs, from the host's files, with its output kept in the results share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestProgram {
    pub name: String,
    pub executable: PathBuf,
    /// Where it runs from (cargo runs a test from its package directory).
    pub dir: PathBuf,
    pub args: Vec<String>,
    /// The boot that runs it: how guest time passes there, and its NUMA nodes.
    pub boot: Boot,
}

impl TestBinary {
    /// The guest runs tests one at a time: they load eBPF programs and drive system-wide kernel
    /// state (THP policy, test modules). `libtest_args` follow (a name filter, `--nocapture`…).
    /// Each test's time is reported (`--report-time`, unstable: the guest script sets
    /// RUSTC_BOOTSTRAP for it), so the summary can say where the matrix's time goes.
    pub fn in_guest(&self, libtest_args: &[String]) -> GuestProgram {
        let mut args: Vec<String> =
            ["-Z", "unstable-options", "--report-time", "--test-threads=1"].map(str::to_owned).to_vec();
        args.extend_from_slice(libtest_args);
        GuestProgram {
            name: self.name.clone(),
            executable: self.executable.clone(),
            dir: self.package_dir.clone(),
            args,
            boot: self.boot(),
        }
    }

    fn boot(&self) -> Boot {
        if INSTRUCTION_COUNTED.contains(&self.name.as_str()) {
            Boot::INSTRUCTION_COUNTED
        } else if TWO_NODES.contains(&self.name.as_str()) {
            Boot::TWO_NODES
        } else {
            Boot::FREE
        }
    }
}

/// What the guest script needs to know besides the programs.
pub struct GuestRun<'a> {
    pub kernel_line: &'a str,
    pub module_dir: Option<&'a Path>,
    /// Said to the tests (MM_PROBE_VM_CLOCK), which assert on guest time only when it is counted.
    pub clock: Clock,
}

/// Result files of one binary inside the results share.
pub fn output_file(binary: &str) -> String {
    format!("{binary}.out")
}

pub fn status_file(binary: &str) -> String {
    format!("{binary}.status")
}

pub fn elapsed_file(binary: &str) -> String {
    format!("{binary}.elapsed_ms")
}

/// How long one program may run in the guest before it counts as hung and is killed, so that
/// the programs after it still run and the report names the one that hung. `latency` on 6.1
/// beside a second guest once took about 7 minutes; nothing else comes near.
pub const PROGRAM_LIMIT: Duration = Duration::from_secs(600);

/// The exit status `timeout` gives a program it killed at [`PROGRAM_LIMIT`].
pub const KILLED_AT_LIMIT: i32 = 124;

/// The POSIX sh script the chrooted guest runs: each program (under `timeout`) with its output
/// and exit status written to the results share, progress on the console.
pub fn guest_script(programs: &[&GuestProgram], run: &GuestRun<'_>) -> String {
    let mut script = String::from("# Generated by `cargo xtask vm-test`.\n");
    script.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    // RUSTC_BOOTSTRAP lets the stable-built test executables take `-Z unstable-options
    // --report-time` (libtest reads it when it starts).
    script.push_str("export HOME=/root TMPDIR=/tmp RUST_BACKTRACE=1 RUSTC_BOOTSTRAP=1\n");
    script.push_str(&format!("export MM_PROBE_VM_KERNEL={}\n", quote(run.kernel_line)));
    script.push_str(&format!("export MM_PROBE_VM_CLOCK={}\n", quote(run.clock.name())));
    if let Some(dir) = run.module_dir {
        script.push_str(&format!("export MM_PROBE_TEST_MODULES={}\n", quote(&dir.to_string_lossy())));
    }
    script.push_str(&format!("R={GUEST_RESULTS_DIR}\n"));
    // Files tests keep for a person to look at (plots) land beside the results on the host.
    script.push_str("export MM_PROBE_TEST_ARTIFACTS=\"$R/artifacts\"\n");
    script.push_str("now_ms() { echo $(( $(date +%s%N) / 1000000 )); }\n");
    // KVM inside the guest, where the emulated CPU has SVM or VMX (`-cpu max`): the tests that
    // run a VM skip without /dev/kvm, and say so.
    script.push_str("modprobe -q kvm_amd 2>/dev/null || modprobe -q kvm_intel 2>/dev/null\n");
    script.push_str(&format!("[ -e /dev/kvm ] && echo \"{MARKER} /dev/kvm ready\"\n"));
    for program in programs {
        let name = &program.name;
        let args: Vec<String> = program.args.iter().map(|a| quote(a)).collect();
        script.push_str(&format!(
            "echo \"{MARKER} running {name}\"\n\
             cd {dir} || exit 1\n\
             start=$(now_ms)\n\
             timeout -k 10 {limit} {exe} {args} > \"$R/{out}\" 2>&1\n\
             status=$?\n\
             echo $(( $(now_ms) - start )) > \"$R/{elapsed}\"\n\
             echo $status > \"$R/{status_file}\"\n\
             echo \"{MARKER} {name} exited with status $status\"\n",
            dir = quote(&program.dir.to_string_lossy()),
            exe = quote(&program.executable.to_string_lossy()),
            args = args.join(" "),
            limit = PROGRAM_LIMIT.as_secs(),
            out = output_file(name),
            elapsed = elapsed_file(name),
            status_file = status_file(name),
        ));
    }
    script
}

/// Single-quotes `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_integration_test_executables_are_taken() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/mm-probe#0.1.0","manifest_path":"/w/mm-probe/Cargo.toml","target":{"kind":["lib"],"name":"mm_probe"},"profile":{"test":true},"executable":"/w/target/debug/deps/mm_probe-aaa"}
{"reason":"compiler-artifact","manifest_path":"/w/mm-probe/Cargo.toml","target":{"kind":["test"],"name":"foundation"},"profile":{"test":true},"executable":"/w/target/debug/deps/foundation-bbb"}
{"reason":"compiler-artifact","manifest_path":"/w/mm-probe/Cargo.toml","target":{"kind":["bin"],"name":"mm-probe"},"profile":{"test":false},"executable":"/w/target/debug/mm-probe"}
{"reason":"compiler-artifact","manifest_path":"/w/mm-probe-common/Cargo.toml","target":{"kind":["lib"],"name":"mm_probe_common"},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            integration_tests(json).unwrap(),
            [TestBinary {
                name: "foundation".into(),
                executable: "/w/target/debug/deps/foundation-bbb".into(),
                package_dir: "/w/mm-probe".into(),
            }]
        );
    }

    #[test]
    fn unknown_test_binary_is_an_error_naming_the_real_ones() {
        let all = vec![TestBinary { name: "foundation".into(), executable: "/x".into(), package_dir: "/".into() }];
        let error = select(all.clone(), &["hmm".into()]).unwrap_err().to_string();
        assert!(error.contains("foundation"), "{error}");
        assert_eq!(select(all.clone(), &["foundation".into()]).unwrap(), all);
    }

    #[test]
    fn each_executable_runs_in_the_boot_its_proof_needs() {
        let boot_of = |name: &str| {
            TestBinary { name: name.into(), executable: "/x".into(), package_dir: "/".into() }.in_guest(&[]).boot
        };
        assert_eq!(boot_of("foundation"), Boot::FREE);
        assert_eq!(boot_of("latency_field"), Boot::INSTRUCTION_COUNTED);
        assert_eq!(boot_of("cause"), Boot::TWO_NODES);
        let consoles: Vec<&str> = Boot::ALL.iter().map(|b| b.console_file()).collect();
        assert_eq!(consoles, ["console.log", "console-two-nodes.log", "console-icount.log"], "one log per boot");
    }

    #[test]
    fn guest_script_passes_kernel_modules_and_filter() {
        let binary = TestBinary {
            name: "foundation".into(),
            executable: "/w/t/foundation-1".into(),
            package_dir: "/w/mm-probe".into(),
        };
        let filter = ["it's".to_owned()];
        let run = GuestRun {
            kernel_line: "6.12-rt",
            module_dir: Some(Path::new("/w/target/kmod/6.12")),
            clock: Clock::InstructionCounted,
        };
        let script = guest_script(&[&binary.in_guest(&filter)], &run);
        assert!(script.contains("export MM_PROBE_VM_CLOCK='instruction-counted'\n"), "{script}");
        assert!(script.contains("export MM_PROBE_VM_KERNEL='6.12-rt'\n"), "{script}");
        assert!(script.contains("export MM_PROBE_TEST_MODULES='/w/target/kmod/6.12'\n"), "{script}");
        assert!(script.contains("export MM_PROBE_TEST_ARTIFACTS=\"$R/artifacts\"\n"), "{script}");
        assert!(script.contains("timeout -k 10 600 '/w/t/foundation-1'"), "a hung program is killed: {script}");
        assert!(script.contains("modprobe -q kvm_amd"), "KVM where the CPU allows it: {script}");
        assert!(script.contains(" RUSTC_BOOTSTRAP=1\n"), "each test's time is reported: {script}");
        assert!(
            script.contains(
                r#"'/w/t/foundation-1' '-Z' 'unstable-options' '--report-time' '--test-threads=1' 'it'\''s' > "$R/foundation.out" 2>&1"#
            ),
            "{script}"
        );
    }
}
