//! What every end-to-end test needs: the tool and the workloads as built binaries, running them,
//! reading their NDJSON, and knowing which kernel of the matrix this is. The same test binaries
//! run on the host and inside each qemu guest (`cargo xtask vm-test`). They load programs and check
//! what is left loaded afterwards, so they run one at a time (`cargo xtask test` passes
//! `--test-threads=1`).
#![allow(dead_code)]

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use serde_json::Value;

/// The mm-probe binary built with these tests.
pub fn mm_probe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mm-probe"))
}

/// A workload binary from testing/workloads (built by `cargo xtask test` before the tests run).
pub fn workload(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<workload>
    let path = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join(name);
    assert!(path.exists(), "workload {} not built: run `cargo build --workspace --bins` first", path.display());
    path
}

/// Runs the tool and returns its output, with stderr shown in the test log.
pub fn run_tool(args: &[&str]) -> Output {
    let output = Command::new(mm_probe()).args(args).output().expect("running mm-probe");
    eprintln!("$ mm-probe {}\n{}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    output
}

/// Parses NDJSON output into values (one per non-empty line).
pub fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The first line of type `kind`.
pub fn first_of<'a>(lines: &'a [Value], kind: &str) -> Option<&'a Value> {
    lines.iter().find(|v| v["type"] == kind)
}

/// The matrix kernel this runs on (`6.1`, `6.12-rt`…), or `None` on the host.
pub fn vm_kernel() -> Option<String> {
    std::env::var("MM_PROBE_VM_KERNEL").ok()
}

/// Directory holding the test kernel modules built for the running kernel (set by the harness).
pub fn module_dir() -> Option<PathBuf> {
    std::env::var_os("MM_PROBE_TEST_MODULES").map(PathBuf::from)
}

/// End-to-end tests load eBPF programs: fail loudly (not skip) when not root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "end-to-end tests load eBPF programs: run them as root");
}

/// Ids and names of the eBPF programs of mm-probe's object loaded in the kernel now. Program
/// names are truncated by the kernel to 15 bytes; every program of the object starts with one of
/// these prefixes (retry-storm's are named after their hooks).
pub fn our_programs() -> Vec<(u32, String)> {
    const PREFIXES: [&str; 10] = [
        "selftest_",
        "thp_",
        "lat_",
        "hmm_",
        "inv_",
        "mmu_",
        "read_begin_",
        "notifier_remov",
        "invalidate_",
        "kvm_",
    ];
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(|name| (p.id(), name.to_string())))
        .filter(|(_, name)| PREFIXES.iter().any(|prefix| name.starts_with(prefix)))
        .collect()
}

/// Programs of ours loaded now that were not in `before` (taken with [`our_programs`] before the
/// tool started). Comparing with a snapshot keeps another mm-probe already running on the
/// machine from being blamed.
pub fn programs_loaded_since(before: &[(u32, String)]) -> Vec<String> {
    our_programs().into_iter().filter(|p| !before.contains(p)).map(|(_, name)| name).collect()
}

/// After the tool has exited, normally or by Ctrl-C, this must be empty: nothing it loaded stays
/// attached. The kernel frees a program after its last reference goes, through RCU, so a program
/// of a process that just exited can stay listed for a moment: allow it a few seconds to go.
pub fn leftover_programs(before: &[(u32, String)]) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = programs_loaded_since(before);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Sends SIGINT to a running tool, as Ctrl-C would.
pub fn interrupt(child: &std::process::Child) {
    // SAFETY: kill with a valid pid and signal number has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}
