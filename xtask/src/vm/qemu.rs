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

use super::initramfs::{HOST_ROOT_TAG, MARKER, PROBE_ARG, RESULTS_TAG};

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

/// How long a KVM guest may take to reach /init before KVM is declared broken. A working KVM
/// gets there in about two seconds; nested KVM on this kind of host hangs or stops with
/// "emulation failure" instead, so TCG is the default that always works.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// KVM when /dev/kvm opens and a probe boot of `kernel` reaches /init, else TCG.
pub fn choose_accel(vmlinuz: &Path, initramfs: &Path, work: &Path) -> Accel {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_err() {
        return Accel::Tcg;
    }
    let spec = BootSpec {
        accel: Accel::Kvm,
        vmlinuz,
        initramfs,
        results: None,
        console_log: &work.join("kvm-probe-console.log"),
        extra_cmdline: PROBE_ARG,
        label: "kvm probe",
        echo_markers: false,
    };
    match boot(&spec, KVM_PROBE_TIMEOUT) {
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
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// The writable results directory (None for the probe boot).
    pub results: Option<&'a Path>,
    pub console_log: &'a Path,
    pub extra_cmdline: &'a str,
    /// Prefix for console lines echoed on the host.
    pub label: &'a str,
    pub echo_markers: bool,
}

/// How a boot ended.
#[derive(Debug)]
pub struct BootRun {
    pub elapsed: Duration,
    pub timed_out: bool,
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

    /// The last `lines` lines of the console, for failure reports.
    pub fn console_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.console_log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
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

/// Everything but the accelerator and the shares is the same for every kernel: 2 CPUs, 2 GiB,
/// serial console, no network (saves the iPXE option ROM), no reboot (a panic ends qemu, since
/// `panic=-1` reboots at once).
fn qemu_command(spec: &BootSpec<'_>) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-accel", spec.accel.qemu_arg(), "-smp", "2", "-m", "2048", "-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(spec.vmlinuz)
        .arg("-initrd")
        .arg(spec.initramfs)
        .arg("-append")
        .arg(format!("console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off {}", spec.extra_cmdline).trim_end())
        // multidevs=remap: the host root spans several file systems whose inode numbers collide.
        .arg("-virtfs")
        .arg(format!("local,path=/,mount_tag={HOST_ROOT_TAG},security_model=none,readonly=on,multidevs=remap"));
    if let Some(results) = spec.results {
        command
            .arg("-virtfs")
            .arg(format!("local,path={},mount_tag={RESULTS_TAG},security_model=none", results.display()));
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Boots and waits until qemu exits (the guest powered off, or panicked and "rebooted") or
/// `timeout` passes, then kills it.
pub fn boot(spec: &BootSpec<'_>, timeout: Duration) -> Result<BootRun> {
    let start = Instant::now();
    let mut command = qemu_command(spec);
    let mut child =
        command.spawn().context("starting qemu-system-x86_64 (install qemu-system-x86: `cargo xtask setup`)")?;
    let log = Arc::new(Mutex::new(
        File::create(spec.console_log).with_context(|| format!("creating {}", spec.console_log.display()))?,
    ));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let readers =
        [spawn_reader(child.stdout.take(), &log, &seen, spec), spawn_reader(child.stderr.take(), &log, &seen, spec)];
    let timed_out = wait_until(&mut child, start + timeout)?;
    for reader in readers.into_iter().flatten() {
        let _ = reader.join();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(BootRun {
        elapsed: start.elapsed(),
        timed_out,
        kernel_failures: seen.kernel_failures,
        markers: seen.markers,
        console_log: spec.console_log.to_path_buf(),
    })
}

#[derive(Default)]
struct Seen {
    kernel_failures: Vec<String>,
    markers: Vec<String>,
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
            let line = String::from_utf8_lossy(&raw).trim_end().to_owned();
            raw.clear();
            if let Ok(mut file) = log.lock() {
                let _ = writeln!(file, "{line}");
            }
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(text) = line.split_once(MARKER).map(|(_, t)| t.trim().to_owned()) {
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

/// Polls `child` until it exits or `deadline` passes; kills it then. Returns whether it timed out.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<bool> {
    loop {
        if child.try_wait()?.is_some() {
            return Ok(false);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(true);
        }
        thread::sleep(Duration::from_millis(200));
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
}
