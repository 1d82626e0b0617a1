//! `thp-why` on a real kernel: workloads set up each reason a process gets no huge pages, and the
//! tool must name it, with the right ancestor, the right per-VMA reason, and — where the kernel
//! lets the allow-check be probed (the Debian guests) — live counts matching the checks the
//! workload causes. What is observable is decided from the tool's own plan and the kernel's BTF,
//! never assumed.

mod common;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        OnceLock,
        mpsc::{Receiver, channel},
    },
    time::Duration,
};

use common::{mm_probe, require_root, run_tool, vm_kernel, workload};
use mm_probe::{
    kernel::{Kernel, layout::ThpDisableBits, tracefs},
    probes::{LogicalProbe, Planner, load_object},
    thp_why::{
        checks::{AllowCheck, Call, DecidedFrom},
        live::Live,
        probes,
        procfs::Proc,
        reasons::DisableMode,
        scan_result::{self, ScanResults},
    },
};
use serde_json::Value;

/// How long a workload or the tool may take to answer; the guests are emulated and slow.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(180);

/// The live window's upper bound; a test ends it with Ctrl-C (SIGINT) as soon as the workload
/// has done what it was asked, so the emulated guests do not sit through idle seconds.
fn live_window() -> &'static str {
    if vm_kernel().is_some() { "120s" } else { "15s" }
}

/// Time left to the tool after the workload answered, before it is interrupted.
fn settle() -> Duration {
    Duration::from_millis(if vm_kernel().is_some() { 1000 } else { 200 })
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// A running workload with its stdin and the JSON lines it prints.
struct Workload {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    /// Every pid the workload announced (tree: wrapper, relay, then thp_regions).
    pids: Vec<u32>,
}

impl Workload {
    fn spawn(program: &str, args: &[&str]) -> Self {
        let mut child = Command::new(workload(program))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the workload");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("workload: {line}"),
                }
            }
        });
        Self { child, stdin, lines, pids: Vec::new() }
    }

    fn next(&mut self) -> Value {
        let v = self.lines.recv_timeout(ANSWER_TIMEOUT).expect("the workload stopped answering");
        if let Some(pid) = v["pid"].as_u64().map(|p| p as u32).filter(|p| !self.pids.contains(p)) {
            self.pids.push(pid);
        }
        v
    }

    /// thp_regions directly; returns it with its first round.
    fn regions(args: &[&str]) -> (Self, Value) {
        let mut w = Self::spawn("thp_regions", args);
        let round = w.next();
        (w, round)
    }

    /// thp_tree (wrapper) -> thp_tree (relay) -> thp_regions; returns it with the first round.
    fn tree(args: &[&str]) -> (Self, Value) {
        let mut full = args.to_vec();
        full.extend(["--", "thp_regions"]);
        let mut w = Self::spawn("thp_tree", &full);
        assert_eq!(w.next()["role"], "wrapper");
        assert_eq!(w.next()["role"], "relay");
        let round = w.next();
        (w, round)
    }

    fn target(&self) -> u32 {
        *self.pids.last().unwrap()
    }

    fn command(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("writing to the workload");
        self.stdin.flush().unwrap();
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // The innermost process first: the tree's relays exit when it does.
        for &pid in self.pids.iter().rev() {
            // SAFETY: signalling a process this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The regions of one round, by name.
fn region<'a>(round: &'a Value, name: &str) -> &'a Value {
    round["regions"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()
}

fn start_of(region: &Value) -> String {
    format!("{:#x}", region["start"].as_u64().unwrap())
}

// ---------------------------------------------------------------------------------------------
// The tool

/// The report's VMA at `start` (the JSON carries every VMA).
fn vma<'a>(report: &'a Value, start: &str) -> &'a Value {
    report["vmas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["start"] == start)
        .unwrap_or_else(|| panic!("no VMA at {start}"))
}

fn reason<'a>(report: &'a Value, code: &str) -> Option<&'a Value> {
    report["reasons"].as_array().unwrap().iter().find(|r| r["code"] == code)
}

fn codes(vma: &Value) -> Vec<&str> {
    vma["reasons"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect()
}

fn parse_report(stdout: &[u8]) -> Value {
    let lines = common::json_lines(stdout);
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["summary", "lost_events"], "thp-why --json prints the report, then its lost events");
    let v = lines[0].clone();
    assert_eq!((v["type"].as_str(), v["command"].as_str()), (Some("summary"), Some("thp-why")), "{v}");
    v
}

/// `thp-why --json` with no live window.
fn thp_why_static(pid: u32) -> Value {
    let out = run_tool(&["thp-why", &pid.to_string(), "--json", "--duration", "0s"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    parse_report(&out.stdout)
}

/// `thp-why --json` over a live window; `during` runs once the programs are attached (the tool
/// says so on stderr), then the run is ended with SIGINT.
fn thp_why_live(pid: u32, during: impl FnOnce()) -> Value {
    thp_why_live_until(pid, during, true)
}

fn thp_why_live_until(pid: u32, during: impl FnOnce(), interrupt: bool) -> Value {
    let mut child = Command::new(mm_probe())
        .args(["thp-why", &pid.to_string(), "--json", "--duration", live_window()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running mm-probe");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("watching pid") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(ANSWER_TIMEOUT).expect("the tool never started watching");
    during();
    if interrupt {
        std::thread::sleep(settle());
        // SAFETY: signalling the tool this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let out = child.wait_with_output().expect("waiting for mm-probe");
    let stderr = reader.join().unwrap();
    eprintln!("mm-probe stderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report = parse_report(&out.stdout);
    if interrupt {
        assert_eq!(report["live"]["stopped_by"], "interrupted", "{}", report["live"]);
    }
    report
}

fn allow_check_observed(report: &Value) -> bool {
    report["live"]["allow_check_observed"].as_bool().unwrap()
}

/// What this kernel is, learned once per test executable (parsing BTF is slow in the guests).
struct KernelFacts {
    /// CONFIG_TRANSPARENT_HUGEPAGE (its sysfs directory exists); Debian's RT kernels lack it.
    thp_built_in: bool,
    /// The allow-check's prototype was found in BTF.
    allow_check_in_btf: bool,
    allow_check: AllowCheck,
    split_disable_bits: bool,
    /// Why the allow-check probe does not attach, if it does not.
    allow_check_unavailable: Option<String>,
}

fn kernel_facts() -> &'static KernelFacts {
    static FACTS: OnceLock<KernelFacts> = OnceLock::new();
    FACTS.get_or_init(|| {
        let kernel = Kernel::running().unwrap();
        let btf = kernel.btf().ok();
        let from_btf = btf.and_then(AllowCheck::from_btf);
        let allow_check_in_btf = from_btf.is_some();
        let allow_check = from_btf.unwrap_or_else(|| AllowCheck::from_release(&kernel.release));
        let split_disable_bits = matches!(btf.map(ThpDisableBits::from_btf), Some(ThpDisableBits::Split { .. }));
        let mut ebpf = load_object(&kernel, mm_probe::probes::MapFamily::ALL, &[]).unwrap();
        let plan = Planner::new(&kernel).attach(&mut ebpf, &probes::ALLOW_CHECK);
        let allow_check_unavailable = (!plan.attached()).then(|| plan.why_unavailable());
        let thp_built_in = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").is_dir();
        KernelFacts { thp_built_in, allow_check_in_btf, allow_check, split_disable_bits, allow_check_unavailable }
    })
}

fn thp_built_in() -> bool {
    kernel_facts().thp_built_in
}

/// On a kernel without THP the report must say so first, and judge every VMA by it.
fn assert_no_thp(report: &Value) {
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("THP unavailable for pid") && verdict.contains("CONFIG_TRANSPARENT_HUGEPAGE"),
        "{verdict}"
    );
    assert_eq!(report["reasons"][0]["code"], "sysfs_never", "{}", report["reasons"]);
    assert!(report["vmas"].as_array().unwrap().iter().all(|v| v["reason"] == "sysfs_never"));
    assert_eq!(report["system"]["thp_built_in"], false);
}

fn kernel_allow_check() -> &'static AllowCheck {
    &kernel_facts().allow_check
}

/// Whether the allow-check probe attaches here, asked of the planner before a test changes
/// sysfs for it. Where it does not, only the development host is excused, and only for the
/// reasons it really has (no kprobes, trampolines refused).
fn allow_check_attachable() -> bool {
    match &kernel_facts().allow_check_unavailable {
        None => true,
        Some(why) if !kernel_facts().thp_built_in => {
            // No THP, no allow-check function to probe.
            assert!(why.contains("not in this kernel's BTF") && why.contains("no function"), "{why}");
            eprintln!("this kernel has no THP; the live-count test does not apply");
            false
        }
        Some(why) => {
            assert!(vm_kernel().is_none(), "the allow-check must attach in the guests: {why}");
            assert!(why.contains("EPERM") || why.contains("CONFIG_KPROBES"), "unexplained: {why}");
            eprintln!("allow-check not attachable on this kernel ({why}); the live-count test does not apply");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// sysfs, set for a test and restored

const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Sets transparent_hugepage/enabled for the test's duration; the old value comes back on drop
/// (also when the test fails).
struct EnabledGuard(Option<String>);

impl EnabledGuard {
    fn set(mode: &str) -> Self {
        let text = std::fs::read_to_string(ENABLED).expect("THP sysfs");
        let current = text.split('[').nth(1).and_then(|s| s.split(']').next()).unwrap().to_string();
        if current == mode {
            return Self(None);
        }
        std::fs::write(ENABLED, mode).expect("setting transparent_hugepage/enabled");
        eprintln!("transparent_hugepage/enabled: {current} -> {mode} (restored after the test)");
        Self(Some(current))
    }
}

impl Drop for EnabledGuard {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(ENABLED, old);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host and guests: /proc, the ancestor, every per-VMA reason

#[test]
fn inherited_prctl_is_traced_to_the_wrapper() {
    require_root();
    let (tree, round) = Workload::tree(&[]);
    let [wrapper, relay, target] = [tree.pids[0], tree.pids[1], tree.target()];
    let report = thp_why_live(target, || {});
    assert_plan_explains_the_allow_check(&report);
    if !thp_built_in() {
        assert_no_thp(&report);
        // The flag is still set and inherited (prctl does not depend on THP); mm->flags says so.
        assert_eq!(report["process"]["source"], "kernel");
        assert_eq!(reason(&report, "prctl_thp_disable").unwrap()["set_by"]["pid"], wrapper);
        return;
    }
    let verdict = report["verdict"].as_str().unwrap();
    assert!(verdict.starts_with(&format!("THP disabled for pid {target} (thp_regions): MMF_DISABLE_THP")), "{verdict}");
    assert!(verdict.contains(&format!("by prctl in ancestor {wrapper} (")), "{verdict}");
    assert!(verdict.contains("inherited across fork/exec"), "{verdict}");
    let prctl = reason(&report, "prctl_thp_disable").expect("prctl_thp_disable");
    assert_eq!(report["reasons"][0]["code"], "prctl_thp_disable", "process-wide reason first");
    assert_eq!(prctl["set_by"]["pid"], wrapper);
    assert_eq!(prctl["set_by"]["comm"], "thp_tree");
    assert_eq!(report["process"]["thp_disable"], "completely");
    let chain: Vec<u64> =
        report["process"]["ancestors"].as_array().unwrap().iter().map(|a| a["pid"].as_u64().unwrap()).collect();
    assert_eq!(&chain[..3], &[target as u64, relay as u64, wrapper as u64]);
    // The mmap_lock tracepoint reads mm->flags from the kernel wherever tracepoints work.
    assert_eq!(report["process"]["source"], "kernel", "{}", report["process"]);
    assert!(report["fix"][0].as_str().unwrap().starts_with("start the workload outside that wrapper"));
    // Even the madvised region is refused, with the prctl among its reasons.
    let advised = vma(&report, &start_of(region(&round, "advised")));
    assert!(codes(advised).contains(&"prctl_thp_disable"), "{advised}");
    assert_eq!(advised["anon_huge_bytes"], 0);
}

/// The report says whether the allow-check was observed, and if not, why.
fn assert_plan_explains_the_allow_check(report: &Value) {
    let live = &report["live"];
    if allow_check_observed(report) {
        assert!(live["allow_check"].as_str().unwrap().starts_with(kernel_allow_check().function), "{live}");
        assert!(report["verdict"].as_str().unwrap().contains(" THP checks, "), "{}", report["verdict"]);
    } else if !thp_built_in() {
        let why = live["why_not"].as_str().unwrap();
        assert!(why.contains("not in this kernel's BTF"), "no THP, no allow-check function: {why}");
    } else {
        assert!(vm_kernel().is_none(), "every Debian guest kernel lets the allow-check be probed: {live}");
        let why = live["why_not"].as_str().unwrap();
        assert!(why.contains("EPERM") || why.contains("CONFIG_KPROBES"), "{why}");
        assert!(!report["verdict"].as_str().unwrap().contains("THP checks"), "{}", report["verdict"]);
    }
}

#[test]
fn except_advised_mode_is_read_from_the_kernel_on_6_18() {
    require_root();
    if !kernel_facts().split_disable_bits {
        // Before 6.18 PR_THP_DISABLE_EXCEPT_ADVISED does not exist: the wrapper's prctl fails
        // with EINVAL and the tree never starts the workload.
        let mut w = Workload::spawn("thp_tree", &["--except-advised", "--", "thp_regions"]);
        let status = w.child.wait().unwrap();
        assert!(!status.success(), "prctl(PR_SET_THP_DISABLE, 1, PR_THP_DISABLE_EXCEPT_ADVISED) must fail before 6.18");
        return;
    }
    let (tree, round) = Workload::tree(&["--except-advised"]);
    if !thp_built_in() {
        // 7.2-rt has the split bits but no THP: the prctl is accepted, and THP is absent first.
        assert_no_thp(&thp_why_static(tree.target()));
        return;
    }
    let report = thp_why_live(tree.target(), || {});
    // /proc/PID/status prints THP_enabled: 1 in this mode; only the kernel's mm->flags tell.
    assert_eq!(report["process"]["status_thp_enabled"], true);
    assert_eq!(report["process"]["thp_disable"], "except_advised");
    assert_eq!(report["process"]["source"], "kernel");
    assert!(report["verdict"].as_str().unwrap().contains("except MADV_HUGEPAGE regions"), "{}", report["verdict"]);
    let r = reason(&report, "prctl_thp_disable_except_advised").unwrap();
    assert_eq!(r["set_by"]["pid"], tree.pids[0]);
    let advised = vma(&report, &start_of(region(&round, "advised")));
    assert_eq!(advised["reason"], "none", "MADV_HUGEPAGE regions stay eligible: {advised}");
    let plain = vma(&report, &start_of(region(&round, "plain")));
    assert!(codes(plain).contains(&"prctl_thp_disable_except_advised"), "{plain}");
}

#[test]
fn each_region_gets_its_reason_under_madvise_policy() {
    require_root();
    if !thp_built_in() {
        let (w, _) = Workload::regions(&[]);
        assert_no_thp(&thp_why_static(w.target()));
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let (w, round) = Workload::regions(&[]);
    let report = thp_why_static(w.target());
    let check = kernel_allow_check();
    let at = |name| vma(&report, &start_of(region(&round, name)));

    let advised = at("advised");
    assert_eq!(advised["reason"], "none", "{advised}");
    assert!(advised["anon_huge_bytes"].as_u64().unwrap() > 0, "eligible and touched: {advised}");

    let plain = at("plain");
    assert_eq!(plain["reason"], "sysfs_madvise_not_advised", "{plain}");
    assert_eq!(plain["in_wrapper"], check.has_wrapper(), "6.8+ refuses it in the inline wrapper: {plain}");

    let nohuge = at("nohuge");
    assert_eq!(nohuge["nh"], true);
    // The kernel's order: 6.1 tests VM_NOHUGEPAGE first; 6.8+ anonymous memory meets the
    // wrapper's sysfs mask before it (an nh VMA has no VM_HUGEPAGE, so madvise mode refuses it).
    let first = if check.has_wrapper() { "sysfs_madvise_not_advised" } else { "vma_nohugepage" };
    assert_eq!(nohuge["reason"], first, "{nohuge}");
    assert!(codes(nohuge).contains(&"vma_nohugepage"), "{nohuge}");

    let small = at("small");
    assert_eq!(
        (small["reason"].as_str(), small["aligned_2m_window"].as_bool()),
        (Some("vma_too_small"), Some(false)),
        "{small}"
    );
    let unaligned = at("unaligned");
    assert_eq!(
        (unaligned["reason"].as_str(), unaligned["aligned_2m_window"].as_bool()),
        (Some("vma_unaligned"), Some(false)),
        "{unaligned}"
    );

    // The kernel's own THPeligible agrees with every judgement on these regions.
    for name in ["advised", "plain", "nohuge", "small", "unaligned"] {
        assert_eq!(at(name)["kernel_agrees"], true, "{name}: {}", at(name));
    }
    for code in ["sysfs_madvise_not_advised", "vma_nohugepage", "vma_too_small", "vma_unaligned", "none"] {
        let r = reason(&report, code).unwrap_or_else(|| panic!("{code} missing from {}", report["reasons"]));
        assert!(!r["detail"].as_str().unwrap().is_empty() && r["vmas"].as_u64().unwrap() >= 1, "{r}");
    }
    assert_eq!(report["system"]["enabled"], "madvise");
    assert_eq!(report["pid"], w.target());
}

/// Why the kernel left a MADV_HUGEPAGE region in small pages, from what the machine says: the
/// message a test fails with when the machine cannot make the region huge.
fn why_not_huge(huge_kb: u64, len: u64) -> String {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let counter =
        |name: &str| vmstat.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).unwrap_or("?").to_string();
    let sysfs = |name: &str| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"));
    format!(
        "this machine did not back the {} MiB MADV_HUGEPAGE region with huge pages (AnonHugePages {huge_kb} kB): \
         thp_fault_fallback {} (no free 2 MiB block: memory too fragmented, try echo 1 > \
         /proc/sys/vm/compact_memory), thp_fault_fallback_charge {} (the cgroup's memory limit); enabled: {}, \
         defrag: {}",
        len >> 20,
        counter("thp_fault_fallback"),
        counter("thp_fault_fallback_charge"),
        sysfs("enabled").unwrap_or_default().trim(),
        sysfs("defrag").unwrap_or_default().trim()
    )
}

/// Issue 14: under enabled=madvise a process whose 64 MiB MADV_HUGEPAGE region is entirely in
/// huge pages uses huge pages, and the report leads with that. Where the allow-check cannot be
/// traced (the host) its live counts are null, not 0; faults stay counted.
#[test]
fn a_fully_huge_madvised_region_is_reported_as_using_huge_pages() {
    require_root();
    if !thp_built_in() {
        eprintln!("this kernel has no THP: no region can be huge, the test does not apply");
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let mut w = Workload::spawn("thp_huge", &["64"]);
    let line = w.next();
    let (pid, start, len) = (w.target(), line["start"].as_u64().unwrap(), line["len"].as_u64().unwrap());
    assert_eq!(line["advised"], true, "{line}");
    let region = Proc::new(pid).smaps().unwrap().into_iter().find(|v| v.start == start).expect("the region's VMA");
    assert!(region.anon_huge_kb >= 60 << 10, "{}", why_not_huge(region.anon_huge_kb, len));

    let report = thp_why_live(pid, || {});
    let verdict = report["verdict"].as_str().unwrap();
    let prefix = format!("pid {pid} (thp_huge): ");
    assert!(
        verdict.starts_with(&prefix) && verdict.contains(" resident anonymous memory is in huge pages ("),
        "{verdict}"
    );
    assert!(!verdict.contains("no huge pages"), "{verdict}");
    let share: f64 =
        verdict.split(" in huge pages (").nth(1).and_then(|s| s.split(" %)").next()).unwrap().parse().unwrap();
    assert!(share >= 90.0, "64 MiB huge is nearly all of the process's anonymous memory: {verdict}");
    let v = vma(&report, &format!("{start:#x}"));
    assert_eq!((v["reason"].as_str(), v["fix"].as_str()), (Some("none"), Some("")), "{v}");
    assert!(v["anon_huge_bytes"].as_u64().unwrap() >= 60 << 20, "{v}");
    assert!(
        reason(&report, "none").unwrap()["detail"].as_str().unwrap().starts_with("eligible: "),
        "{}",
        report["reasons"]
    );

    let live = &report["live"];
    if allow_check_observed(&report) {
        assert!(live["checks"].is_u64() && live["denied"].is_u64(), "{live}");
    } else {
        assert_plan_explains_the_allow_check(&report);
        for key in ["checks", "denied", "unexplained", "disagreements", "benign_denials", "gone_vmas"] {
            assert!(live[key].is_null(), "live.{key} was not measured, so it is null: {live}");
        }
        for r in report["reasons"].as_array().unwrap() {
            assert!(r["count"].is_null(), "{r}");
        }
        assert!(report["vmas"].as_array().unwrap().iter().all(|v| v["live"]["checks"].is_null()));
    }
    // Faults are counted on every kernel: numbers, not null.
    let faults = &report["faults"];
    assert!(faults["observed"].as_bool().unwrap() && faults["total"].is_u64(), "{faults}");

    // The text leads with the same line and says how long it watched.
    let out = run_tool(&["thp-why", &pid.to_string(), "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().unwrap().starts_with(&prefix), "{text}");
    assert!(text.contains("window    watched 1."), "{text}");
}

#[test]
fn text_output_puts_the_verdict_first_and_lists_vmas_largest_first() {
    require_root();
    let (tree, _) = Workload::tree(&[]);
    let out = run_tool(&["thp-why", &tree.target().to_string(), "--duration", "0s"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap();
    let expected = if thp_built_in() { "THP disabled for pid" } else { "THP unavailable for pid" };
    assert!(first.starts_with(expected), "{text}");
    for heading in ["Evidence", "Reasons", "Fix", "VMAs (largest first"] {
        assert!(text.contains(heading), "no {heading} in:\n{text}");
    }
    assert!(text.contains("--all-vmas for all"), "{text}");
    let all = run_tool(&["thp-why", &tree.target().to_string(), "--duration", "0s", "--all-vmas"]);
    assert!(String::from_utf8_lossy(&all.stdout).lines().count() > text.lines().count());
}

// ---------------------------------------------------------------------------------------------
// Live: faults, prctl caught, and the allow-check counts where the kernel allows a probe

#[test]
fn live_round_is_counted_and_a_prctl_is_caught() {
    require_root();
    let (mut w, _) = Workload::regions(&[]);
    let target = w.target();
    let mut round = Value::Null;
    let report = thp_why_live(target, || {
        w.command("round");
        round = w.next();
        w.command("prctl-disable");
        assert_eq!(w.next()["done"], "prctl-disable");
    });
    assert_eq!(round["round"], 1);
    // The prctl during the run: caught by syscalls:sys_enter_prctl and named.
    let calls = report["process"]["prctl_calls"].as_array().unwrap();
    let call = calls.iter().find(|c| c["tgid"] == target).unwrap_or_else(|| panic!("prctl not caught: {calls:?}"));
    assert_eq!((call["effect"].as_str(), call["relation"].as_str()), (Some("disable"), Some("target")));
    assert_eq!(report["process"]["thp_disable"], "completely");
    assert_eq!(reason(&report, "prctl_thp_disable").unwrap()["set_by"]["pid"], target);
    let faults = &report["faults"];
    assert_eq!(faults["observed"], true, "exceptions:page_fault_user attaches everywhere on x86: {faults}");
    // VM_NOHUGEPAGE: one fault per 4 KiB page, whatever the policy. So for the regions too
    // small or unaligned for a 2 MiB page, as long as no smaller (mTHP) size is enabled.
    let nohuge = vma(&report, &start_of(region(&round, "nohuge")));
    assert_eq!(nohuge["live"]["faults"], 1024, "{nohuge}");
    if !thp_built_in() {
        // Without THP every page of every region faults on its own.
        for (name, pages) in [("advised", 1024), ("plain", 1024), ("small", 256), ("unaligned", 640)] {
            assert_eq!(vma(&report, &start_of(region(&round, name)))["live"]["faults"], pages, "{name}");
        }
        assert_eq!(faults["in_huge_pages"], 0);
        return;
    }
    let small_sizes_enabled = report["system"]["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["size_bytes"] != 2048 * 1024 && !s["enabled"].is_null() && s["enabled"] != "never");
    if !small_sizes_enabled {
        for (name, pages) in [("small", 256), ("unaligned", 640)] {
            let v = vma(&report, &start_of(region(&round, name)));
            assert_eq!(v["live"]["faults"], pages, "{name}: {v}");
        }
    }
    // A region backed by huge pages faulted once per 2 MiB, and those faults were satisfied by them.
    let advised = vma(&report, &start_of(region(&round, "advised")));
    let huge_pages = advised["anon_huge_bytes"].as_u64().unwrap() / (2 << 20);
    assert!(huge_pages > 0, "{advised}");
    assert_eq!(advised["live"]["faults"].as_u64().unwrap(), 1024 - huge_pages * 511, "{advised}");
    assert!(faults["in_huge_pages"].as_u64().unwrap() >= huge_pages, "{faults}");
    assert!(faults["total"].as_u64().unwrap() >= 1024 + 256 + 640, "{faults}");
    let per_region: Vec<String> = ["advised", "plain", "nohuge", "small", "unaligned"]
        .iter()
        .map(|name| format!("{name} {}", vma(&report, &start_of(region(&round, name)))["live"]["faults"]))
        .collect();
    eprintln!(
        "{}: round faults: {}; total {}, ~{} in huge pages",
        vm_kernel().unwrap_or("host".into()),
        per_region.join(", "),
        faults["total"],
        faults["in_huge_pages"]
    );
    assert!(
        report["verdict"].as_str().unwrap().contains("by prctl in the process itself (caught live)"),
        "{}",
        report["verdict"]
    );
}

/// Guests only: the allow-check counts of a round equal the PMD-level checks its first touches
/// cause. Tolerance: exact on 6.8+ (the PUD-level check of an anonymous VMA stops in the
/// wrapper, whose mask has no PUD order); on 6.1 up to one extra PUD-level check per region,
/// made when its first touch is also the first in a 1 GiB range (pud_none).
fn pud_tolerance(check: &AllowCheck, regions: usize) -> u64 {
    if check.has_wrapper() { 0 } else { regions as u64 }
}

fn fault_checks(vma: &Value) -> (u64, u64) {
    let c = &vma["live"]["by_call"]["page_fault"];
    (c["checks"].as_u64().unwrap_or(0), c["denied"].as_u64().unwrap_or(0))
}

/// Guests only: one round of the workload `spawn` starts, traced live under THP policy `mode`
/// (set before the workload maps anything), as (report, round, workload). `None` where the
/// allow-check cannot be attached: then there is nothing to check.
fn traced_round(mode: &str, spawn: impl FnOnce() -> (Workload, Value)) -> Option<(Value, Value, Workload)> {
    if !allow_check_attachable() {
        return None;
    }
    let _policy = EnabledGuard::set(mode);
    let (mut workload, _) = spawn();
    let mut round = Value::Null;
    let report = thp_why_live(workload.target(), || {
        workload.command("round");
        round = workload.next();
    });
    assert!(allow_check_observed(&report), "{}", report["live"]);
    Some((report, round, workload))
}

#[test]
fn guest_allow_check_counts_match_the_workload() {
    require_root();
    let Some((report, round, _)) = traced_round("always", || Workload::regions(&[])) else { return };
    let check = kernel_allow_check();
    let live = &report["live"];
    assert_eq!(live["unexplained"], 0, "{live}");
    assert_eq!(live["disagreements"], 0, "{live}");
    assert_eq!(live["counters"]["check_map_full"], 0, "{live}");
    let expected_denials = [
        ("advised", None),
        ("plain", None),
        ("nohuge", Some("vma_nohugepage")),
        ("small", Some("vma_too_small")),
        ("unaligned", Some("vma_unaligned")),
    ];
    let mut total = 0;
    for (name, denial) in expected_denials {
        let r = region(&round, name);
        let v = vma(&report, &start_of(r));
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        let (checks, denied) = fault_checks(v);
        eprintln!(
            "{name}: {pmd_ranges} first touches of 2 MiB ranges, {checks} fault-path checks, {denied} denied; {}",
            v["live"]
        );
        assert!(
            checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1),
            "{name}: {checks} fault-path checks for {pmd_ranges} 2 MiB ranges: {v}"
        );
        total += checks;
        // Faults skip the size check (do_huge_pmd_anonymous_page falls back later), so only
        // VM_NOHUGEPAGE refuses a fault here; khugepaged refuses the small and unaligned ones.
        let fault_denials_expected = if name == "nohuge" { checks } else { 0 };
        assert_eq!(denied, fault_denials_expected, "{name}: {v}");
        let denied_by = v["live"]["denied_by"].as_object().unwrap();
        for (code, n) in denied_by {
            assert_eq!(Some(code.as_str()), denial, "{name}: {n} denials decoded as {code}: {v}");
        }
        match denial {
            None => {
                assert_eq!(v["reason"], "none", "{name}: {v}");
                assert!(v["anon_huge_bytes"].as_u64().unwrap() > 0, "{name} is eligible and touched: {v}");
            }
            Some(code) => assert_eq!(v["reason"], code, "{name}: {v}"),
        }
    }
    let regions = expected_denials.len();
    assert!(total >= 9 && total <= 9 + pud_tolerance(check, regions), "{total} fault-path checks for 9 ranges");
    let nohuge = reason(&report, "vma_nohugepage").unwrap();
    assert!(nohuge["count"].as_u64().unwrap() >= 2, "{nohuge}");
    assert!(report["faults"]["in_huge_pages"].as_u64().unwrap() >= 4, "{}", report["faults"]);
    eprintln!("{}: {total} fault-path checks on the round's regions", vm_kernel().unwrap_or_default());
}

#[test]
fn guest_prctl_denials_are_counted_and_attributed() {
    require_root();
    let Some((report, round, tree)) = traced_round("always", || Workload::tree(&[])) else { return };
    let check = kernel_allow_check();
    let mut fault_checks_total = 0;
    for r in round["regions"].as_array().unwrap() {
        let v = vma(&report, &start_of(r));
        let (checks, denied) = fault_checks(v);
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        assert!(checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1), "{}: {v}", r["name"]);
        assert_eq!(denied, checks, "every check of a prctl-disabled process is denied: {v}");
        // VM_NOHUGEPAGE is tested before the mm flag, so the nohuge region's fault-path
        // denials name it. Its khugepaged check at mmap time, before madvise set the flag,
        // saw only the mm flag: the key's own vm_flags decide, and say prctl.
        let denied_by = &v["live"]["denied_by"];
        let all: u64 = denied_by.as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
        assert_eq!(all, v["live"]["denied"].as_u64().unwrap(), "every denial explained: {v}");
        if r["name"] == "nohuge" {
            assert_eq!(denied_by["vma_nohugepage"], denied, "{v}");
            assert!(
                denied_by.as_object().unwrap().keys().all(|k| k == "vma_nohugepage" || k == "prctl_thp_disable"),
                "{v}"
            );
        } else {
            assert_eq!(denied_by["prctl_thp_disable"], v["live"]["denied"], "{}: {v}", r["name"]);
        }
        assert_eq!(v["anon_huge_bytes"], 0);
        fault_checks_total += checks;
    }
    let prctl = reason(&report, "prctl_thp_disable").unwrap();
    assert!(prctl["count"].as_u64().unwrap() >= fault_checks_total - 2 - pud_tolerance(check, 1), "{prctl}");
    assert_eq!(prctl["set_by"]["pid"], tree.pids[0]);
    let verdict = report["verdict"].as_str().unwrap();
    let live = &report["live"];
    assert!(verdict.ends_with(&format!("; {} THP checks, {} denied", live["checks"], live["denied"])), "{verdict}");
    assert_eq!(live["checks"], live["denied"], "{live}");
    eprintln!("{}: {verdict}; by caller {}", vm_kernel().unwrap_or_default(), live["by_call"]);
}

#[test]
fn guest_madvise_policy_denials_are_counted_on_6_1_and_derived_on_6_8_plus() {
    require_root();
    let Some((report, round, _)) = traced_round("madvise", || Workload::regions(&[])) else { return };
    let check = kernel_allow_check();
    let plain = vma(&report, &start_of(region(&round, "plain")));
    let (checks, denied) = fault_checks(plain);
    assert_eq!(plain["reason"], "sysfs_madvise_not_advised");
    if check.has_wrapper() {
        // The wrapper refuses it before __thp_vma_allowable_orders: nothing to count, and the
        // report says the reason is derived.
        assert_eq!(checks, 0, "{plain}");
        assert_eq!(plain["in_wrapper"], true);
        assert!(report["live"]["wrapper_note"].as_str().unwrap().contains("derived from sysfs and vm_flags"));
    } else {
        assert!(checks >= 2 && checks <= 2 + pud_tolerance(check, 1), "{plain}");
        assert_eq!(denied, checks, "{plain}");
        // denied_by counts every caller's denials: khugepaged may scan the region too.
        assert_eq!(plain["live"]["denied_by"]["sysfs_madvise_not_advised"], plain["live"]["denied"], "{plain}");
    }
    let advised = vma(&report, &start_of(region(&round, "advised")));
    assert_eq!(advised["reason"], "none");
    assert!(advised["anon_huge_bytes"].as_u64().unwrap() > 0, "{advised}");
    assert_eq!(fault_checks(advised).1, 0, "{advised}");
    eprintln!(
        "{}: plain region under madvise: {checks} fault-path checks seen, {denied} denied",
        vm_kernel().unwrap_or_default()
    );
}

#[test]
fn the_allow_check_layout_comes_from_btf() {
    require_root();
    if !thp_built_in() {
        // No THP: the allow-check function is compiled out.
        assert!(!kernel_facts().allow_check_in_btf);
        return;
    }
    let check = kernel_allow_check();
    assert_eq!(check.decided_from, DecidedFrom::Btf, "every kernel of the matrix has BTF");
    let params: Vec<&str> = check.params.iter().map(String::as_str).collect();
    let kernel = Kernel::running().unwrap();
    // The prototypes of docs/kernel-facts.md#thp-allow-check, as this kernel's BTF states them.
    let expected: &[&str] = if kernel.release.at_least(6, 18) {
        &["vma", "vm_flags", "type", "orders"]
    } else if kernel.release.at_least(6, 10) {
        &["vma", "vm_flags", "tva_flags", "orders"]
    } else if kernel.release.at_least(6, 8) {
        &["vma", "vm_flags", "smaps", "in_pf", "enforce_sysfs", "orders"]
    } else {
        &["vma", "vm_flags", "smaps", "in_pf", "enforce_sysfs"]
    };
    assert_eq!(params, expected, "{}", check.function);
    eprintln!("{}: {}({})", kernel.release.text, check.function, params.join(", "));
}

#[test]
fn guest_kprobe_fallback_counts_like_the_fexit() {
    require_root();
    if !allow_check_attachable() {
        return;
    }
    let _policy = EnabledGuard::set("always");
    let (mut w, _) = Workload::regions(&[]);
    let kernel = Kernel::running().unwrap();
    let check = kernel_allow_check();
    let bits = ThpDisableBits::from_btf(kernel.btf().unwrap());
    // Only the allow-check's second candidate: kprobe at entry, kretprobe at return.
    let kprobe_only = LogicalProbe { candidates: &probes::ALLOW_CHECK.candidates[1..], ..probes::ALLOW_CHECK };
    let catalog = [kprobe_only, probes::PAGE_FAULTS, probes::MMAP_LOCK];
    let mut live = Live::start_with(&kernel, w.target(), check, DisableMode::mask(bits), &catalog).unwrap();
    let plan = live.plan.get(probes::ALLOW_CHECK.name).unwrap();
    assert_eq!(plan.mechanism(), Some("kprobe+kretprobe"), "{plan:?}");
    let seen = live.probe_mm(&Proc::new(w.target())).expect("mmap_lock tells the target's mm");
    live.offer_target_mm(seen).unwrap();
    w.command("round");
    let round = w.next();
    let counts = live.counts().unwrap();
    assert_eq!(counts.counter(mm_probe_common::thp::Counter::ReturnWithoutEntry), 0);
    for r in round["regions"].as_array().unwrap() {
        let start = r["start"].as_u64().unwrap();
        let faults = |denied_only: bool| -> u64 {
            counts
                .checks
                .iter()
                .filter(|(k, _)| k.vm_start == start && check.encoding.decode(k.call_args) == Some(Call::PageFault))
                .filter(|(k, _)| !denied_only || !check.allowed(k.ret))
                .map(|(_, n)| n)
                .sum()
        };
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        let (checks, denied) = (faults(false), faults(true));
        eprintln!("kprobe: {}: {pmd_ranges} first touches, {checks} fault-path checks, {denied} denied", r["name"]);
        assert!(checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1), "{}", r["name"]);
        assert_eq!(denied, if r["name"] == "nohuge" { checks } else { 0 }, "{}", r["name"]);
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input: one line, exit 1, never a panic

fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line, not a panic: {stderr}");
    assert!(stderr.contains(needle), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn unknown_pid_is_a_one_line_error() {
    require_root();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let unused = (300..pid_max).rev().find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap();
    assert_one_line_error(&run_tool(&["thp-why", &unused.to_string()]), "does not exist");
}

#[test]
fn a_kernel_thread_is_refused() {
    require_root();
    // kthreadd is pid 2 on every Linux system.
    assert_one_line_error(&run_tool(&["thp-why", "2"]), "kernel thread");
}

#[test]
fn a_zombie_is_refused() {
    require_root();
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Not reaped yet: a zombie until wait().
    let zombie = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(zombie);
    assert_one_line_error(&run_tool(&["thp-why", &pid.to_string()]), "zombie");
    child.wait().unwrap();
}

#[test]
fn without_permission_to_read_the_target_it_says_what_to_do() {
    require_root();
    let (w, _) = Workload::regions(&[]);
    // nobody may not read a root process's smaps (ptrace access check).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(mm_probe())
        .args(["thp-why", &w.target().to_string()])
        .output()
        .expect("running setpriv");
    assert_one_line_error(&out, "permission denied");
    assert!(String::from_utf8_lossy(&out.stderr).contains("run as root"));
}

#[test]
fn a_target_exiting_mid_run_gives_a_partial_result() {
    require_root();
    let (mut w, round) = Workload::regions(&[]);
    let target = w.target();
    let report = thp_why_live_until(target, || w.command("exit"), false);
    assert_eq!(report["live"]["stopped_by"], "target_exited", "{}", report["live"]);
    let notes = report["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("exited during the run")), "{notes:?}");
    // The VMAs from the start of the run are still judged.
    let expected = if thp_built_in() { "vma_too_small" } else { "sysfs_never" };
    assert_eq!(vma(&report, &start_of(region(&round, "small")))["reason"], expected);
}

// ---------------------------------------------------------------------------------------------
// The collapse path: khugepaged's scans of the target, by result name

const KHUGEPAGED: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged";

/// Sets khugepaged knobs for the test's duration; the old values come back on drop, in reverse
/// order (also when the test fails). Writing scan_sleep_millisecs wakes khugepaged.
struct KhugepagedGuard(Vec<(String, String)>);

impl KhugepagedGuard {
    fn set(knobs: &[(&str, &str)]) -> Self {
        let mut old = Vec::new();
        for &(knob, value) in knobs {
            let path = format!("{KHUGEPAGED}/{knob}");
            let current = std::fs::read_to_string(&path).expect("khugepaged sysfs").trim().to_string();
            std::fs::write(&path, value).unwrap_or_else(|e| panic!("setting {path}: {e}"));
            eprintln!("khugepaged/{knob}: {current} -> {value} (restored after the test)");
            old.push((path, current));
        }
        Self(old)
    }
}

impl Drop for KhugepagedGuard {
    fn drop(&mut self) {
        for (path, value) in self.0.iter().rev() {
            let _ = std::fs::write(path, value);
        }
    }
}

/// A thp_collapse workload: MIB MiB touched every EVERY-th page under MADV_NOHUGEPAGE.
fn collapse_workload(mib: &str, every: &str) -> (Workload, u64, u64) {
    let mut w = Workload::spawn("thp_collapse", &[mib, every]);
    let line = w.next();
    (w, line["start"].as_u64().unwrap(), line["len"].as_u64().unwrap())
}

fn advise(w: &mut Workload) {
    w.command("advise");
    let answer = w.next();
    assert_eq!(answer["advised"], true, "{answer}");
}

fn region_huge_kb(pid: u32, start: u64) -> u64 {
    Proc::new(pid).smaps().unwrap().into_iter().find(|v| v.start == start).map_or(0, |v| v.anon_huge_kb)
}

fn vmstat(name: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap();
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0)
}

/// Polls `done` until it holds or the answer timeout passes.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn result_count(report: &Value, name: &str) -> u64 {
    let results = report["collapse"]["results"].as_array().unwrap();
    results.iter().filter(|r| r["result"] == name).map(|r| r["count"].as_u64().unwrap()).sum()
}

/// The scan tracepoint is there wherever THP is; without THP nothing here applies.
fn collapse_applies() -> bool {
    require_root();
    if !thp_built_in() {
        eprintln!("this kernel has no THP: khugepaged does not exist, the test does not apply");
        return false;
    }
    true
}

/// Both of this kernel's sources of scan result names agree: BTF's `enum scan_result` and the
/// scan tracepoint's printed table (mapped to BTF's spelling), value for value.
#[test]
fn scan_result_names_from_btf_and_tracefs_agree() {
    if !collapse_applies() {
        return;
    }
    let kernel = Kernel::running().unwrap();
    let from_btf = ScanResults::from_btf(kernel.btf().unwrap()).expect("enum scan_result in BTF");
    let root = mm_probe::kernel::tracefs::root().unwrap();
    let printed = tracefs::print_symbols(&root, "huge_memory", "mm_khugepaged_scan_pmd", "status").unwrap();
    let from_tracefs = ScanResults::from_tracefs(&printed);
    eprintln!("scan results of this kernel: {printed:?}");
    for (value, name) in &printed {
        let raw = *value as u32;
        assert_eq!(from_btf.name(raw), from_tracefs.name(raw), "result {raw} (printed {name})");
        assert!(scan_result::meaning(&from_btf.name(raw)).is_some(), "no meaning for {}", from_btf.name(raw));
    }
    assert_eq!(from_btf.name(1), "succeed");
}

/// A region filled with small pages and then madvised huge is collapsed by khugepaged while the
/// tool watches: counted as collapses of the target, AnonHugePages grows by the region.
#[test]
fn khugepaged_collapsing_a_region_is_counted_as_success() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let _pace = KhugepagedGuard::set(&[("pages_to_scan", "32768"), ("scan_sleep_millisecs", "100")]);
    let (mut w, start, len) = collapse_workload("16", "1");
    let pid = w.target();
    assert_eq!(region_huge_kb(pid, start), 0, "faults under MADV_NOHUGEPAGE give small pages");
    let report = thp_why_live(pid, || {
        advise(&mut w);
        wait_for("khugepaged to collapse the region", || region_huge_kb(pid, start) * 1024 >= len);
    });
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(c["observed"], true, "{c}");
    let pmds = len >> 21;
    // Under enabled=madvise only the advised region is eligible: exactly its ranges collapse.
    assert_eq!(result_count(&report, "succeed"), pmds, "{pmds} ranges collapsed: {c}");
    assert_eq!(c["collapsed"].as_u64(), Some(pmds), "{c}");
    assert!(c["by_khugepaged"].as_u64().unwrap() >= pmds && c["pages_collapsed_delta"].as_i64() >= Some(pmds as i64));
    assert_eq!(c["reached"], true, "{c}");
    assert!(c["anon_huge_bytes_delta"].as_i64().unwrap() >= len as i64, "{c}");
    if !report["process"]["mm_flags"].is_null() {
        assert_eq!(c["registered"], true, "madvise(MADV_HUGEPAGE) put it on khugepaged's list: {c}");
    }
    let success = c["results"].as_array().unwrap().iter().find(|r| r["result"] == "succeed").unwrap();
    assert_eq!((success["outcome"].as_str(), success["origin"].as_str()), (Some("collapsed"), Some("khugepaged")));
    assert_eq!(c["failed"], 0, "{c}");
}

/// A sparsely touched region (64 of each 2 MiB's 512 pages) under a lowered max_ptes_none stays
/// small: every scan of it fails with exceed_none_pte, by name, with the knob and its value, and
/// the advice names the knob and MADV_COLLAPSE.
#[test]
fn a_sparse_region_fails_with_exceed_none_pte_under_a_low_max_ptes_none() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let _pace =
        KhugepagedGuard::set(&[("max_ptes_none", "32"), ("pages_to_scan", "32768"), ("scan_sleep_millisecs", "100")]);
    let (mut w, start, len) = collapse_workload("16", "8");
    let pid = w.target();
    let pmds = len >> 21;
    let before = vmstat("thp_scan_exceed_none_pte");
    let report = thp_why_live(pid, || {
        advise(&mut w);
        wait_for("khugepaged to scan the region", || vmstat("thp_scan_exceed_none_pte") >= before + pmds);
    });
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(region_huge_kb(pid, start), 0, "the region stayed small");
    assert!(result_count(&report, "exceed_none_pte") >= pmds, "each of its {pmds} ranges failed: {c}");
    let failure = c["results"].as_array().unwrap().iter().find(|r| r["result"] == "exceed_none_pte").unwrap();
    assert_eq!((failure["knob"].as_str(), failure["knob_value"].as_u64()), (Some("max_ptes_none"), Some(32)));
    assert_eq!(failure["outcome"], "failed");
    let advice: Vec<&str> = c["advice"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(advice.iter().any(|a| a.contains("failed with exceed_none_pte") && a.contains("max_ptes_none is 32")));
    assert!(advice.iter().any(|a| a.contains("MADV_COLLAPSE")), "{advice:?}");
}

/// A registered process that khugepaged does not come to during a short run (it sleeps 10
/// minutes between passes) is reported as not reached, with khugepaged's pace, not as an empty
/// result.
#[test]
fn a_process_khugepaged_does_not_reach_is_reported_as_such() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    // The write wakes khugepaged for one pass; the decoy, registered next, makes its list
    // non-empty (so that the target's registration wakes nobody) and shows when the pass is over.
    let _pace = KhugepagedGuard::set(&[("scan_sleep_millisecs", "600000")]);
    let (mut decoy, decoy_start, decoy_len) = collapse_workload("4", "1");
    advise(&mut decoy);
    let pass = Duration::from_secs(if vm_kernel().is_some() { 20 } else { 3 });
    let deadline = std::time::Instant::now() + pass;
    while region_huge_kb(decoy.target(), decoy_start) * 1024 < decoy_len && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));

    let (mut w, start, _) = collapse_workload("8", "1");
    advise(&mut w);
    let pid = w.target();
    let report = thp_why_live(pid, || std::thread::sleep(Duration::from_secs(2)));
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(region_huge_kb(pid, start), 0);
    assert_eq!(
        (c["observed"].as_bool(), c["scans"].as_u64(), c["reached"].as_bool()),
        (Some(true), Some(0), Some(false))
    );
    if !report["process"]["mm_flags"].is_null() {
        assert_eq!(c["registered"], true, "{c}");
    }
    let why = c["not_reached"].as_str().unwrap();
    assert!(why.contains("did not scan this process") && why.contains("600000 ms"), "{why}");
    assert!(c["results"].as_array().unwrap().is_empty());
    assert!(c["candidate_small_bytes"].as_u64().unwrap() >= 8 << 20, "{c}");
}
