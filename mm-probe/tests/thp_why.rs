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
    probes::{LogicalProbe, MapFamily, load_object},
    thp_why::{
        checks::{AllowCheck, Call, DecidedFrom},
        live::{Live, read_counts},
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
    parse_lines(stdout).0
}

/// The report and its lost events.
fn parse_lines(stdout: &[u8]) -> (Value, Value) {
    let lines = common::json_lines(stdout);
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["summary", "lost_events"], "thp-why --json prints the report, then its lost events");
    let v = lines[0].clone();
    assert_eq!((v["type"].as_str(), v["command"].as_str()), (Some("summary"), Some("thp-why")), "{v}");
    (v, lines[1].clone())
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
    thp_why_live_lines(pid, during, interrupt, &[]).0
}

/// The live run, with these variables in the tool's environment (the test hooks); the report
/// and its lost events.
fn thp_why_live_lines(pid: u32, during: impl FnOnce(), interrupt: bool, env: &[(&str, &str)]) -> (Value, Value) {
    let mut child = Command::new(mm_probe())
        .args(["thp-why", &pid.to_string(), "--json", "--duration", live_window()])
        .envs(env.iter().copied())
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
    let (report, lost) = parse_lines(&out.stdout);
    if interrupt {
        assert_eq!(report["live"]["stopped_by"], "interrupted", "{}", report["live"]);
    }
    (report, lost)
}

/// Whether the mmap_lock tracepoint attached, by which the kernel's mm->flags are read at the end.
fn mm_flags_read_at_the_end(report: &Value) -> bool {
    let probes = report["live"]["plan"]["probes"].as_array().expect("the live plan");
    probes.iter().any(|p| p["probe"] == "mmap_lock" && p["status"] == "attached")
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
        let from_btf = btf.as_deref().and_then(AllowCheck::from_btf);
        let allow_check_in_btf = from_btf.is_some();
        let allow_check = from_btf.unwrap_or_else(|| AllowCheck::from_release(&kernel.release));
        let split_disable_bits =
            matches!(btf.as_deref().map(ThpDisableBits::from_btf), Some(ThpDisableBits::Split { .. }));
        let mut ebpf = load_object(&kernel, MapFamily::ALL, &[]).unwrap();
        let plan = mm_probe::thp_why::probes::attach_catalog(&kernel, &mut ebpf, &[probes::ALLOW_CHECK]);
        let plan = plan.get(probes::ALLOW_CHECK.name).unwrap();
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
    let verdict = report["verdict"]["headline"].as_str().unwrap();
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
/// sysfs for it. Where it does not, only kernels before 6.0 (no such function) and the
/// development host (no kprobes, trampolines refused) are excused, each for that reason.
fn allow_check_attachable() -> bool {
    match &kernel_facts().allow_check_unavailable {
        None => true,
        Some(why) if uncountable(why) => {
            eprintln!("this kernel's THP checks cannot be counted ({why}); the live-count test does not apply");
            false
        }
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
    let verdict = report["verdict"]["headline"].as_str().unwrap();
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
    // The mmap_lock tracepoint (5.11+) reads mm->flags from the kernel wherever tracepoints
    // work; without it /proc/PID/status, read at the end, tells the same.
    let source = if mm_flags_read_at_the_end(&report) { "kernel" } else { "status" };
    assert_eq!(report["process"]["source"], source, "{}", report["process"]);
    assert!(
        report["verdict"]["advice"][0]["action"]
            .as_str()
            .unwrap()
            .starts_with("start the workload outside that wrapper")
    );
    // Even the madvised region is refused, with the prctl among its reasons.
    let advised = vma(&report, &start_of(region(&round, "advised")));
    assert!(codes(advised).contains(&"prctl_thp_disable"), "{advised}");
    assert_eq!(advised["anon_huge_bytes"], 0);
    // The collapse section blames the prctl and its setter, not a missing madvise.
    let c = &report["collapse"];
    let kept = c["kept_away"].as_str().unwrap_or_else(|| panic!("no kept_away: {c}"));
    assert!(kept.starts_with("prctl(PR_SET_THP_DISABLE) keeps khugepaged away from this process"), "{kept}");
    assert!(kept.contains(&format!("inherited from ancestor {wrapper} (")), "{kept}");
    let not_reached = c["not_reached"].as_str().unwrap_or_default();
    assert!(!not_reached.contains("no region has registered"), "{not_reached}");
}

/// Before 6.0 no one function takes the caller's arguments: the tool does not try, and says so.
fn uncountable(why: &str) -> bool {
    let uncountable = why.contains("no single allow-check with its caller's arguments");
    if uncountable {
        assert!(!kernel_facts().allow_check_in_btf, "a kernel whose BTF decodes the check counts it: {why}");
    }
    uncountable
}

/// The report says whether the allow-check was observed, and if not, why.
fn assert_plan_explains_the_allow_check(report: &Value) {
    let live = &report["live"];
    if allow_check_observed(report) {
        assert!(live["allow_check"].as_str().unwrap().starts_with(kernel_allow_check().function), "{live}");
        assert!(
            report["verdict"]["headline"].as_str().unwrap().contains(" THP checks, "),
            "{}",
            report["verdict"]["headline"]
        );
    } else if !thp_built_in() {
        let why = live["why_not"].as_str().unwrap();
        assert!(uncountable(why) || why.contains("not in this kernel's BTF"), "no THP, no allow-check function: {why}");
    } else {
        let why = live["why_not"].as_str().unwrap();
        assert!(
            uncountable(why) || vm_kernel().is_none(),
            "every Debian guest kernel from 6.1 lets the allow-check be probed: {live}"
        );
        assert!(uncountable(why) || why.contains("EPERM") || why.contains("CONFIG_KPROBES"), "{why}");
        assert!(
            !report["verdict"]["headline"].as_str().unwrap().contains("THP checks"),
            "{}",
            report["verdict"]["headline"]
        );
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
    assert!(
        report["verdict"]["headline"].as_str().unwrap().contains("except MADV_HUGEPAGE regions"),
        "{}",
        report["verdict"]["headline"]
    );
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
    let verdict = report["verdict"]["headline"].as_str().unwrap();
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

    // Nearly all of it huge is OK.
    assert_eq!(report["verdict"]["level"], "OK", "{}", report["verdict"]);
    // The text leads with the same line and says how long it watched.
    let out = run_tool(&["thp-why", &pid.to_string(), "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().unwrap().starts_with(&format!("OK: {prefix}")), "{text}");
    assert!(text.contains("window    watched 1."), "{text}");
}

#[path = "thp_why/text.rs"]
mod text;

// ---------------------------------------------------------------------------------------------
// Live: faults, prctl caught, and the allow-check counts where the kernel allows a probe

#[path = "thp_why/live.rs"]
mod live;

// ---------------------------------------------------------------------------------------------
// Bad input: one line, exit 1, never a panic

#[path = "thp_why/bad_input.rs"]
mod bad_input;

// ---------------------------------------------------------------------------------------------
// The collapse path: khugepaged's scans of the target, by result name

#[path = "thp_why/collapse.rs"]
mod collapse;
