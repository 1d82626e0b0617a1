//! Booting one guest: qemu under TCG (or KVM when it really works), the host root and the results
//! directory over virtio-9p, the serial console captured to a file and scanned for kernel
//! failures, and a deadline after which the guest is killed.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::initramfs::{HEARTBEAT, HOST_ROOT_TAG, MARKER, PROBE_ARG, RESULTS_TAG};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Tcg,
    Kvm,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        }
    }

    fn qemu_arg(self) -> &'static str {
        match self {
            // Multi-threaded TCG: each of the 2 vCPUs gets a host thread.
            Accel::Tcg => "tcg,thread=multi",
            Accel::Kvm => "kvm",
        }
    }
}

/// How guest time passes in a boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// The accelerator's own (multi-threaded TCG, or KVM): guest time is the host's, so a vCPU
    /// thread the busy host does not run for milliseconds shows in the guest as a task that waited
    /// milliseconds (cyclictest saw 4-46 ms worst cases that way, on every kernel).
    #[default]
    Free,
    /// Instruction counting: one vCPU on single-threaded TCG whose clock advances 4 ns per
    /// instruction executed (shift=2; a fixed shift, since `auto` follows the host and does not
    /// repeat), and idle time skipped rather than slept through on the host (sleep=off). Host
    /// load then cannot make a guest task wait: waits follow the kernel's code, and control runs
    /// repeat to about 1 %. Two vCPUs hang at boot this way, hence one.
    InstructionCounted,
}

/// One boot of a kernel line: how its time passes and whether its memory and CPUs are two NUMA
/// nodes. Each test executable runs in exactly one of them ([`Boot::ALL`], in that order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Boot {
    pub clock: Clock,
    /// Free-running only: two nodes of one CPU and 1 GiB each ([`TWO_NODES`]).
    pub two_nodes: bool,
}

impl Boot {
    pub const FREE: Boot = Boot { clock: Clock::Free, two_nodes: false };
    pub const TWO_NODES: Boot = Boot { clock: Clock::Free, two_nodes: true };
    pub const INSTRUCTION_COUNTED: Boot = Boot { clock: Clock::InstructionCounted, two_nodes: false };
    pub const ALL: [Boot; 3] = [Boot::FREE, Boot::TWO_NODES, Boot::INSTRUCTION_COUNTED];

    /// How the report and the console echo name it ("free-running", "free-running, two nodes").
    pub fn name(self) -> String {
        if self.two_nodes { format!("{}, two nodes", self.clock.name()) } else { self.clock.name().to_owned() }
    }

    /// The file its console is kept in, one per boot of a line.
    pub fn console_file(self) -> &'static str {
        match (self.clock, self.two_nodes) {
            (Clock::Free, false) => "console.log",
            (Clock::Free, true) => "console-two-nodes.log",
            (Clock::InstructionCounted, _) => "console-icount.log",
        }
    }

    /// The suffix of its console lines' label after the line's name.
    pub fn label_suffix(self) -> &'static str {
        match (self.clock, self.two_nodes) {
            (Clock::Free, false) => "",
            (Clock::Free, true) => " two-nodes",
            (Clock::InstructionCounted, _) => " icount",
        }
    }
}

impl Clock {
    pub fn name(self) -> &'static str {
        match self {
            Clock::Free => "free-running",
            Clock::InstructionCounted => "instruction-counted",
        }
    }

    /// The accelerator, CPU count and memory arguments of a boot with `accel`; the free-running
    /// guest's as two NUMA nodes with `two_nodes`.
    fn qemu_args(self, accel: Accel, two_nodes: bool) -> Vec<&'static str> {
        let nodes: &[&str] = if two_nodes && self == Clock::Free { TWO_NODES } else { &[] };
        let args = match self {
            // SVM and nested paging, emulated by TCG, so that Debian's kvm_amd loads and the guest
            // runs VMs of its own (KVM's notifier paths behind kprobes and fentry). On the plain
            // 64-bit model, not `max`, under which the same tests ran slower (thp_why: 71 s in a
            // 6.12 guest against 61 s with this model).
            Clock::Free if accel == Accel::Tcg => {
                vec!["-accel", accel.qemu_arg(), "-cpu", "qemu64,+svm,+npt", "-smp", "2", "-m", "2048"]
            }
            Clock::Free => vec!["-accel", accel.qemu_arg(), "-smp", "2", "-m", "2048"],
            // More memory: the field case's walk covers 512 MiB beside the guest's own.
            Clock::InstructionCounted => {
                vec!["-accel", "tcg,thread=single", "-icount", "shift=2,sleep=off", "-smp", "1", "-m", "3584"]
            }
        };
        [&args, nodes].concat()
    }
}

/// The free-running guest's 2 GiB and two CPUs as two NUMA nodes of one CPU and 1 GiB each
/// ([`Boot::TWO_NODES`]), so that NUMA balancing and move_pages have somewhere to move pages.
/// Every boot turns NUMA balancing off on the kernel command line ([`KERNEL_ARGS`]); the test
/// that needs it turns it on for its run.
const TWO_NODES: &[&str] = &[
    "-object",
    "memory-backend-ram,id=node0,size=1024M",
    "-object",
    "memory-backend-ram,id=node1,size=1024M",
    "-numa",
    "node,nodeid=0,cpus=0,memdev=node0",
    "-numa",
    "node,nodeid=1,cpus=1,memdev=node1",
];

/// Boots of one kind (free-running, two nodes, instruction-counted) of one kernel at most, when
/// the earlier ones failed by the emulator's fault: the int3 race hit one kernel in two of three
/// full matrix runs on this host, and the project's CI once failed 6.12 of it after the repeats
/// (the line took 17 minutes where it passes in 13 to 14, so the boots before had died too). A
/// repeat runs only what had not finished, so a fourth boot costs minutes, not a line.
pub const EMULATOR_BOOTS: usize = 4;

/// Every boot's kernel command line: a serial console, and a panic that ends qemu (`panic=-1`
/// reboots at once and qemu runs with -no-reboot). Debian's kernels enable NUMA balancing by
/// default wherever there are two nodes; off, the other tests see the one-node kernel they
/// were written against.
const KERNEL_ARGS: &str = "console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off numa_balancing=disable";

/// How long a KVM guest may take to reach /init before KVM is declared broken. A working KVM
/// gets there in about two seconds; nested KVM on this kind of host hangs or stops with
/// "emulation failure" instead, so TCG is the default that always works.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// KVM when /dev/kvm opens and a probe boot of `kernel` reaches /init, else TCG.
pub fn choose_accel(vmlinuz: &Path, initramfs: &Path, work: &Path) -> Accel {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_err() {
        return Accel::Tcg;
    }
    let spec = BootSpec {
        accel: Accel::Kvm,
        clock: Clock::Free,
        vmlinuz,
        initramfs,
        results: None,
        share_host_root: false,
        console_log: &work.join("kvm-probe-console.log"),
        extra_cmdline: PROBE_ARG,
        two_nodes: false,
        label: "kvm probe",
        echo_markers: false,
    };
    match boot(&spec, KVM_PROBE_TIMEOUT, KVM_PROBE_TIMEOUT) {
        Ok(run) if run.saw_marker("probe booted") => Accel::Kvm,
        Ok(_) => {
            eprintln!("xtask vm-test: /dev/kvm is there but a KVM guest does not boot (nested KVM?); using TCG");
            Accel::Tcg
        }
        Err(error) => {
            eprintln!("xtask vm-test: KVM probe failed ({error:#}); using TCG");
            Accel::Tcg
        }
    }
}

pub struct BootSpec<'a> {
    pub accel: Accel,
    pub clock: Clock,
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// The writable results directory (None for the probe boot).
    pub results: Option<&'a Path>,
    /// Whether the host root is offered over 9p (not to the probe and bare boots, which never
    /// mount it).
    pub share_host_root: bool,
    pub console_log: &'a Path,
    pub extra_cmdline: &'a str,
    /// The free-running guest as two NUMA nodes.
    pub two_nodes: bool,
    /// Prefix for console lines echoed on the host.
    pub label: &'a str,
    pub echo_markers: bool,
}

/// Why qemu stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The guest powered off or rebooted (a panic).
    Exited,
    /// Killed at the boot's timeout.
    TimedOut,
    /// Killed after the harness in the guest had said nothing for this long.
    Silent(Duration),
}

/// How a boot ended.
#[derive(Debug)]
pub struct BootRun {
    pub elapsed: Duration,
    pub ended: Ended,
    /// Console lines telling of a kernel failure (panic, BUG, Oops).
    pub kernel_failures: Vec<String>,
    /// The harness's own console lines (`mm-probe-vm: …`), marker stripped.
    pub markers: Vec<String>,
    pub console_log: PathBuf,
}

impl BootRun {
    pub fn saw_marker(&self, text: &str) -> bool {
        self.markers.iter().any(|m| m.contains(text))
    }

    /// The console evidence for a failure report: from the first kernel failure on when there
    /// is one (the panic message, not the end of its stack trace), else the last lines.
    pub fn console_excerpt(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.console_log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let start = match all.iter().position(|l| kernel_failure(l)) {
            Some(first) => first.saturating_sub(2),
            None => all.len().saturating_sub(lines),
        };
        all[start..all.len().min(start + lines)].join("\n")
    }
}

/// The kernel's own words for "this kernel is broken": a panic, a BUG() or bad-access report, an
/// Oops. Lines the harness printed itself are not kernel messages and never match.
pub fn kernel_failure(line: &str) -> bool {
    if line.contains(MARKER) {
        return false;
    }
    ["Kernel panic", "BUG:", "Oops"].iter().any(|p| line.contains(p))
}

/// Everything but the clock (accelerator, CPUs, memory, nodes: [`Clock::qemu_args`]) and the
/// shares is the same for every kernel: the command line, no network (saves the iPXE option
/// ROM), no reboot.
fn qemu_command(spec: &BootSpec<'_>) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(spec.clock.qemu_args(spec.accel, spec.two_nodes))
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(spec.vmlinuz)
        .arg("-initrd")
        .arg(spec.initramfs)
        .arg("-append")
        .arg(format!("{KERNEL_ARGS} {}", spec.extra_cmdline).trim_end());
    if spec.share_host_root {
        // multidevs=remap: the host root spans several file systems whose inode numbers collide.
        command
            .arg("-virtfs")
            .arg(format!("local,path=/,mount_tag={HOST_ROOT_TAG},security_model=none,readonly=on,multidevs=remap"));
    }
    if let Some(results) = spec.results {
        command
            .arg("-virtfs")
            .arg(format!("local,path={},mount_tag={RESULTS_TAG},security_model=none", results.display()));
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Boots and waits until qemu exits (the guest powered off, or panicked and "rebooted"),
/// `timeout` passes, or the guest says nothing of its own (no harness line) for `silence`;
/// kills it then.
pub fn boot(spec: &BootSpec<'_>, timeout: Duration, silence: Duration) -> Result<BootRun> {
    let start = Instant::now();
    let mut command = qemu_command(spec);
    let mut child =
        command.spawn().context("starting qemu-system-x86_64 (install qemu-system-x86: `cargo xtask setup`)")?;
    let log = Arc::new(Mutex::new(
        File::create(spec.console_log).with_context(|| format!("creating {}", spec.console_log.display()))?,
    ));
    let seen = Arc::new(Mutex::new(Seen { last_marker: start, ..Seen::default() }));
    let readers =
        [spawn_reader(child.stdout.take(), &log, &seen, spec), spawn_reader(child.stderr.take(), &log, &seen, spec)];
    let ended = wait_until(&mut child, start + timeout, &seen, silence)?;
    for reader in readers.into_iter().flatten() {
        let _ = reader.join();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(BootRun {
        elapsed: start.elapsed(),
        ended,
        kernel_failures: seen.kernel_failures,
        markers: seen.markers,
        console_log: spec.console_log.to_path_buf(),
    })
}

struct Seen {
    kernel_failures: Vec<String>,
    markers: Vec<String>,
    /// When the harness last printed a line: a guest that goes quiet for longer than any
    /// program may run (the guest kills those itself) has a wedged kernel.
    last_marker: Instant,
}

impl Default for Seen {
    fn default() -> Self {
        Seen { kernel_failures: Vec::new(), markers: Vec::new(), last_marker: Instant::now() }
    }
}

/// Copies one qemu output stream to the console log, collecting markers and kernel failures.
fn spawn_reader<R: std::io::Read + Send + 'static>(
    stream: Option<R>,
    log: &Arc<Mutex<File>>,
    seen: &Arc<Mutex<Seen>>,
    spec: &BootSpec<'_>,
) -> Option<thread::JoinHandle<()>> {
    let stream = stream?;
    let (log, seen) = (Arc::clone(log), Arc::clone(seen));
    let (label, echo) = (spec.label.to_owned(), spec.echo_markers);
    Some(thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut raw = Vec::new();
        // Lines, not strings: the console carries terminal escapes and the odd invalid byte.
        while reader.read_until(b'\n', &mut raw).is_ok_and(|n| n > 0) {
            let line = strip_terminal_escapes(&String::from_utf8_lossy(&raw)).trim_end().to_owned();
            raw.clear();
            if let Ok(mut file) = log.lock() {
                let _ = writeln!(file, "{line}");
            }
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(text) = line.split_once(MARKER).map(|(_, t)| t.trim().to_owned()) {
                seen.last_marker = Instant::now();
                if text == HEARTBEAT {
                    continue;
                }
                if echo {
                    eprintln!("[{label}] {text}");
                }
                seen.markers.push(text);
            } else if kernel_failure(&line) {
                eprintln!("[{label}] KERNEL: {line}");
                seen.kernel_failures.push(line);
            }
        }
    }))
}

/// SeaBIOS and the firmware clear the screen with escape sequences (`ESC c`, `ESC [2J`); they
/// make the log and the console tails in reports unreadable.
fn strip_terminal_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            // CSI: parameters and intermediates up to a final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

/// Polls `child` until it exits, `deadline` passes or the harness has been silent for
/// `silence`; kills it in the last two cases. Returns how it ended.
fn wait_until(child: &mut Child, deadline: Instant, seen: &Mutex<Seen>, silence: Duration) -> Result<Ended> {
    loop {
        if child.try_wait()?.is_some() {
            return Ok(Ended::Exited);
        }
        let quiet = seen.lock().unwrap_or_else(|e| e.into_inner()).last_marker.elapsed();
        let ended = if Instant::now() >= deadline {
            Ended::TimedOut
        } else if quiet >= silence {
            Ended::Silent(quiet)
        } else {
            thread::sleep(Duration::from_millis(200));
            continue;
        };
        let _ = child.kill();
        let _ = child.wait();
        return Ok(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_failures_are_recognised_and_harness_lines_are_not() {
        assert!(kernel_failure("[   12.3] Kernel panic - not syncing: Attempted to kill init!"));
        assert!(kernel_failure("[    5.1] BUG: kernel NULL pointer dereference, address: 0000000000000008"));
        assert!(kernel_failure("[    5.1] Oops: 0002 [#1] PREEMPT SMP NOPTI"));
        assert!(!kernel_failure("mm-probe-vm: running Oops_BUG:_tests"));
        assert!(!kernel_failure("[    1.0] Run /init as init process"));
    }

    #[test]
    fn only_the_two_node_boot_has_two_nodes() {
        let numa = |boot: Boot| Clock::qemu_args(boot.clock, Accel::Tcg, boot.two_nodes).contains(&"-numa");
        assert!(numa(Boot::TWO_NODES));
        assert!(!numa(Boot::FREE));
        assert!(!numa(Boot::INSTRUCTION_COUNTED));
    }

    #[test]
    fn firmware_screen_clearing_is_stripped() {
        assert_eq!(
            strip_terminal_escapes("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS (version 1.16.2)"),
            "SeaBIOS (version 1.16.2)"
        );
        assert_eq!(strip_terminal_escapes("plain [2J text"), "plain [2J text");
    }
}
