//! `mm-probe triage` with several problems at once, each made by the kernel's own mechanism: a
//! wrapper that disabled THP by prctl before exec'ing a program that wants huge pages; a VM whose
//! memslot two threads madvise (wherever KVM runs: the host, and the guests' nested KVM); the
//! test driver's retry storm (the non-RT guests). Each is a finding of its own source, ranked,
//! with the command that looks closer naming the process. These storms really delay real-time
//! tasks (kernel threads at FIFO priority; on a free-running guest the host's load too), so a
//! latency finding beside them is the machine's, not invented; the idle and one-problem proofs,
//! where none may appear, are `triage.rs`, under instruction counting.

mod common;
mod triage_support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    Huge, MirrorModule, cause_guest, json_lines, kvm_available, our_programs, programs_loaded_since, require_root,
    workload,
};
use serde_json::Value;
use triage_support::{assert_thp_finding, findings, thp_here};

/// The watch: long enough for every capability to attach in an emulated guest (latency last,
/// after the others) and then watch the storms.
const WATCH: &str = "40s";

/// How long the storms run, once every watch is attached, well inside the watch.
const STORMING: Duration = Duration::from_secs(8);

#[test]
fn several_problems_at_once_are_each_a_finding_ranked_with_the_next_command() {
    require_root();
    let (thp, kvm, mirror) = (thp_here(), kvm_available(), cause_guest());
    if !(thp || kvm || mirror) {
        // The PREEMPT_RT guests: no THP, no nested KVM, and the mirror's storms run on the
        // non-RT lines. An idle watch proves nothing is invented, which triage.rs proves.
        eprintln!("skipped: none of the problems this test makes can be made on this kernel");
        return;
    }
    let huge = thp.then(|| Huge::start(true));
    let mut vm = kvm.then(KvmStorm::start);
    let _module = mirror.then(MirrorModule::load);
    // The storms start once every watch is attached, and stop before the watches end: under
    // TCG, attaching or detaching (text patching through int3) while two threads hammer the
    // patched code wedged a 6.1 guest (both vCPUs in soft lockup in kvm-madv, 150 s) and took
    // an int3 Oops on 6.12. Real CPUs exclude that race; the emulator does not.
    let before = our_programs();
    let tool = Command::new(common::mm_probe())
        .args(["triage", "--duration", WATCH, "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting triage");
    let start = Instant::now();
    while !programs_loaded_since(&before).iter().any(|p| p.starts_with("lat_")) {
        assert!(start.elapsed() < Duration::from_secs(120), "every watch attaches");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    if let Some(vm) = &mut vm {
        vm.go();
    }
    let mirror = _module.as_ref().map(|_| Running::start("hmm_storm", &["--size", "64M", "--duration-ms", "120000"]));
    std::thread::sleep(STORMING);
    let (vm_pid, mirror_pid) = (vm.as_ref().map(|v| v.pid), mirror.as_ref().map(Running::pid));
    drop((vm, mirror));
    let out = tool.wait_with_output().expect("triage");
    assert_eq!(out.status.code(), Some(0));
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let t = &lines[0];
    eprintln!("MEASURED triage: {t}");
    let all = findings(t);
    let of = |source: &str| all.iter().find(|f| f["source"] == source);
    if let Some(huge) = &huge {
        assert_thp_finding(of("thp-why").unwrap_or_else(|| panic!("a thp-why finding: {t}")), huge);
    }
    if let Some(pid) = vm_pid {
        let finding = of("invalidations").unwrap_or_else(|| panic!("the VM's storm is a finding: {t}"));
        let next = finding["next_command"].as_str().unwrap();
        assert!(next.starts_with(&format!("mm-probe invalidations -p {pid} ")), "{finding}");
    }
    if let Some(pid) = mirror_pid {
        let finding = of("retry-storm").unwrap_or_else(|| panic!("the retry storm is a finding: {t}"));
        let next = finding["next_command"].as_str().unwrap();
        assert!(next.starts_with(&format!("mm-probe retry-storm -p {pid} ")), "{finding}");
    }
    // Each problem once; besides them only latency's, the real-time tasks these storms delay.
    let expected = usize::from(huge.is_some()) + usize::from(vm_pid.is_some()) + usize::from(mirror_pid.is_some());
    let made: Vec<&Value> = all.iter().filter(|f| f["source"] != "latency").collect();
    assert_eq!(made.len(), expected, "each problem once, nothing invented: {}", t["findings"]);
    let ranks: Vec<u64> = all.iter().map(|f| f["rank"].as_u64().unwrap()).collect();
    assert_eq!(ranks, (1..=all.len() as u64).collect::<Vec<_>>());
    let levels: Vec<&str> = all.iter().map(|f| f["level"].as_str().unwrap()).collect();
    assert!(levels.windows(2).all(|w| !(w[0] == "WARN" && w[1] == "CRIT")), "CRIT ranks first: {levels:?}");
}

/// A workload running until dropped (killed then), its pid its own.
struct Running(Child);

impl Running {
    fn start(name: &str, args: &[&str]) -> Self {
        let child =
            Command::new(workload(name)).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect(name);
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// kvm_storm with two threads madvising its memslot, its VM made at once and its storm started
/// by [`KvmStorm::go`], for far longer than it is let run: killed on drop.
struct KvmStorm {
    child: Child,
    pid: u32,
}

impl KvmStorm {
    fn start() -> Self {
        let mut child = Command::new(workload("kvm_storm"))
            .args(["--threads", "2", "--passes", "100000", "--size", "16M", "--wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting kvm_storm");
        let mut pid = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut pid).expect("kvm_storm's pid");
        let pid = pid.trim().parse().unwrap_or_else(|_| panic!("kvm_storm's pid: {pid:?}"));
        Self { child, pid }
    }

    /// Starts the storm of the VM made in [`Self::start`].
    fn go(&mut self) {
        self.child.stdin.take().expect("piped stdin").write_all(b"go\n").expect("starting the storm");
    }
}

impl Drop for KvmStorm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
