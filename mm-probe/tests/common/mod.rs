//! What every end-to-end test needs: the tool and the workloads as built binaries, running them,
//! reading their NDJSON, and knowing which kernel of the matrix this is. The same test binaries
//! run on the host and inside each qemu guest (`cargo xtask vm-test`). They load programs and check
//! what is left loaded afterwards, so they run one at a time (`cargo xtask test` passes
//! `--test-threads=1`).
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
};

pub use mm_probe_schemas::*;
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

/// Parses NDJSON output into values (one per non-empty line), each checked against its schema.
pub fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout).lines().filter(|l| !l.trim().is_empty()).map(tool_line).collect()
}

/// The first line of type `kind`.
pub fn first_of<'a>(lines: &'a [Value], kind: &str) -> Option<&'a Value> {
    lines.iter().find(|v| v["type"] == kind)
}

/// The matrix kernel this runs on (`6.1`, `6.12-rt`…), or `None` on the host.
/// A /proc/vmstat counter, 0 where this kernel has none (the CONFIG_-dependent ones).
pub fn vmstat_or_zero(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap();
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0)
}

/// Runs a system program (not the tool); its stderr is the error when it fails.
pub fn run_program(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Settings (sysfs and procfs files) changed for a test and put back on drop, last first, also
/// when the test fails.
#[derive(Default)]
pub struct Knobs(Vec<(PathBuf, String)>);

impl Knobs {
    /// Sets `path` to `value`, keeping the old value; a setting that cannot be set fails the test.
    pub fn set(&mut self, path: impl Into<PathBuf>, value: &str) -> &mut Self {
        let path = path.into();
        assert!(self.try_set(&path, value), "setting {} to {value}", path.display());
        self
    }

    /// As [`Knobs::set`], for a setting this kernel may lack: false when it is absent or refused.
    pub fn try_set(&mut self, path: impl Into<PathBuf>, value: &str) -> bool {
        let path = path.into();
        let Ok(old) = std::fs::read_to_string(&path) else { return false };
        if std::fs::write(&path, value).is_err() {
            return false;
        }
        let old = setting_of(&old);
        eprintln!("{}: {old} -> {value} (put back after the test)", path.display());
        self.0.push((path, old));
        true
    }
}

/// The value a setting file holds: THP's files read "always [madvise] never", where the
/// bracketed word is it.
fn setting_of(text: &str) -> String {
    match text.split_once('[') {
        Some((_, rest)) => rest.split(']').next().unwrap_or_default().to_string(),
        None => text.trim().to_string(),
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        for (path, old) in self.0.iter().rev() {
            let _ = std::fs::write(path, old);
        }
    }
}

/// Swap on a compressed RAM disk while it lives, in a guest (guests have no disk): with swap,
/// reclaim really writes anonymous pages out. Turned off again on drop: the guest runs other
/// test binaries afterwards.
pub struct ZramSwap;

impl ZramSwap {
    const DEVICE: &str = "/dev/zram0";

    pub fn enable(bytes: u64) -> Result<Self, String> {
        run_program("modprobe", &["zram", "num_devices=1"])?;
        std::fs::write("/sys/block/zram0/disksize", bytes.to_string()).map_err(|e| format!("zram0 disksize: {e}"))?;
        run_program("mkswap", &[Self::DEVICE])?;
        run_program("swapon", &[Self::DEVICE])?;
        Ok(Self)
    }
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        let _ = run_program("swapoff", &[Self::DEVICE]);
        let _ = std::fs::write("/sys/block/zram0/reset", "1");
    }
}

/// One counter of /proc/vmstat.
pub fn vmstat(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap();
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or_else(|| panic!("{name} in /proc/vmstat"))
}

/// The running kernel is a PREEMPT_RT build (its version string says so).
pub fn preempt_rt() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/version").is_ok_and(|v| v.contains("PREEMPT_RT"))
}

/// Whether the cause-of-invalidation tests run here: in the non-RT guests only. Reclaim,
/// copy-on-write, khugepaged and KSM invalidate through the same code under PREEMPT_RT, and the
/// RT lines already take the longest; outside the guests the host has no HMM and no swap. Says
/// why when not.
pub fn cause_guest() -> bool {
    if vm_kernel().is_none() {
        eprintln!("skipped: these run in the test guests (the host has no HMM, and no swap is added to it)");
        return false;
    }
    if preempt_rt() {
        eprintln!("skipped: the cause tests run on the non-RT lines; PREEMPT_RT invalidates through the same code");
        return false;
    }
    true
}

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

/// Whether this kernel can run a VM whose memory is invalidated: /dev/kvm and KVM's
/// tracepoints.
pub fn kvm_available() -> bool {
    let tracepoint = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|root| std::path::Path::new(root).join("events/kvm/kvm_unmap_hva_range").exists());
    std::path::Path::new("/dev/kvm").exists() && tracepoint
}

/// Root, with a KVM to run a VM under; says why the test is skipped when there is none.
pub fn root_with_kvm() -> bool {
    require_root();
    let available = kvm_available();
    if !available {
        eprintln!("skipped: no /dev/kvm or no kvm tracepoints on this kernel");
    }
    available
}

/// Ids and names of the eBPF programs of mm-probe's object loaded in the kernel now. Program
/// names are truncated by the kernel to 15 bytes; every program of the object starts with one of
/// these prefixes (retry-storm's are named after their hooks).
pub fn our_programs() -> Vec<(u32, String)> {
    const PREFIXES: [&str; 10] =
        ["selftest_", "thp_", "lat_", "hmm_", "inv_", "mmu_", "read_begin_", "notifier_remov", "invalidate_", "kvm_"];
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

/// A fresh directory for one test's files, under the temporary directory.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mm-probe-test-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Copies a file a test produced (a plot) into MM_PROBE_TEST_ARTIFACTS when that is set (the
/// guest harness sets it to its results share), so that a person can look at it afterwards.
pub fn keep_artifact(file: &std::path::Path) {
    let Some(dir) = std::env::var_os("MM_PROBE_TEST_ARTIFACTS").map(PathBuf::from) else { return };
    let kept = dir.join(file.file_name().expect("a file name"));
    let _ = std::fs::create_dir_all(&dir);
    match std::fs::copy(file, &kept) {
        Ok(_) => eprintln!("kept {}", kept.display()),
        Err(e) => eprintln!("could not keep {} in {}: {e}", file.display(), dir.display()),
    }
}

/// An SVG file as a viewer sees it: parsed (a malformed document fails the test), rasterized,
/// and its text.
pub struct RenderedSvg {
    pub width: u32,
    pub height: u32,
    pixels: Vec<(u8, u8, u8, u8)>,
    /// The content of every `<text>` element, trimmed.
    pub texts: Vec<String>,
}

impl RenderedSvg {
    pub fn open(path: &std::path::Path) -> Self {
        let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        // No fonts are loaded: text is not rasterized, so nothing here depends on the machine's fonts.
        let tree = resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default())
            .unwrap_or_else(|e| panic!("{} is not a well-formed SVG ({e})", path.display()));
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).expect("a non-empty canvas");
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        let pixels = pixmap.pixels().iter().map(|p| (p.red(), p.green(), p.blue(), p.alpha())).collect();
        let texts = svg
            .split("<text")
            .skip(1)
            .filter_map(|element| Some(element.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
            .collect();
        Self { width: size.width(), height: size.height(), pixels, texts }
    }

    /// Pixels drawn: neither transparent nor white.
    pub fn inked_pixels(&self) -> usize {
        self.pixels.iter().filter(|&&(r, g, b, a)| a > 0 && (r, g, b) != (255, 255, 255)).count()
    }

    /// Whether some opaque pixel has exactly this colour (a bar, a line drawn in it).
    pub fn has_color(&self, (red, green, blue): (u8, u8, u8)) -> bool {
        self.pixels.contains(&(red, green, blue, 255))
    }

    /// The first text that contains `part`.
    pub fn text_containing(&self, part: &str) -> Option<&str> {
        self.texts.iter().map(String::as_str).find(|t| t.contains(part))
    }
}

/// Loads hmm_mirror.ko (or another test driver built from it) for the test and unloads it
/// afterwards (also on failure).
pub struct MirrorModule(&'static str);

impl MirrorModule {
    pub fn load() -> Self {
        Self::load_named("hmm_mirror")
    }

    /// `hmm_shadow`: the same driver under another module, device and callback name.
    pub fn load_named(name: &'static str) -> Self {
        let dir = module_dir().expect("MM_PROBE_TEST_MODULES must name the test modules built for this kernel");
        let ko = dir.join(format!("{name}.ko"));
        let _ = Command::new("rmmod").arg(name).output();
        let out = Command::new("insmod").arg(&ko).output().expect("running insmod");
        assert!(out.status.success(), "insmod {}: {}", ko.display(), String::from_utf8_lossy(&out.stderr));
        MirrorModule(name)
    }
}

impl Drop for MirrorModule {
    fn drop(&mut self) {
        let out = Command::new("rmmod").arg(self.0).output().expect("running rmmod");
        if !std::thread::panicking() {
            assert!(out.status.success(), "{} must unload cleanly: {}", self.0, String::from_utf8_lossy(&out.stderr));
        }
    }
}

/// A workload that maps and touches 64 MiB of MADV_HUGEPAGE memory, optionally under the
/// wrapper that disables THP by prctl before exec'ing it; killed on drop, every process of it
/// (the wrapper's relay and thp_huge outlive a killed wrapper, holding the test's pipes).
pub struct Huge {
    child: Child,
    /// Every pid the workload announced: wrapper and relay first, thp_huge last.
    pub pids: Vec<u32>,
}

impl Huge {
    pub fn start(under_wrapper: bool) -> Self {
        let mut command = if under_wrapper {
            let mut c = Command::new(workload("thp_tree"));
            c.args(["--", "thp_huge", "64"]);
            c
        } else {
            let mut c = Command::new(workload("thp_huge"));
            c.arg("64");
            c
        };
        let child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("starting thp_huge");
        // Owned before anything can fail, so that a failed read still kills what started.
        let mut huge = Self { child, pids: Vec::new() };
        let mut lines = BufReader::new(huge.child.stdout.take().unwrap()).lines();
        // The wrapper and its relay announce themselves first; thp_huge's line has the region.
        loop {
            let line: Value = serde_json::from_str(&lines.next().expect("a line").unwrap()).unwrap();
            huge.pids.push(line["pid"].as_u64().unwrap() as u32);
            if line["start"].is_u64() {
                return huge;
            }
        }
    }

    /// thp_huge's pid.
    pub fn pid(&self) -> u32 {
        *self.pids.last().expect("thp_huge announced itself")
    }
}

impl Drop for Huge {
    fn drop(&mut self) {
        for &pid in self.pids.iter().rev() {
            // SAFETY: kill(2) on pids this workload announced, still ours until reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}
