use mm_probe_common::thp::{Counter, PrctlEvent, ThpCheckKey};

use super::*;
use crate::{
    kernel::Release,
    probes::{Outcome, Plan, ProbePlan},
    thp_why::{
        facts::vm_flags,
        inputs::LiveInput,
        procfs::parse_smaps,
        report::{Counters, LiveCounter, PrctlEffect, Relation},
        scan_result::ScanResults,
        sysfs::tests::sample_tree,
    },
};

const SMAPS: &str = "\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
Size:              65536 kB
Rss:               65536 kB
Anonymous:         65536 kB
AnonHugePages:         0 kB
THPeligible:           0
VmFlags: rd wr mr mw me ac 
7f0004200000-7f0004300000 rw-p 00000000 00:00 0 
Size:               1024 kB
Rss:                1024 kB
Anonymous:          1024 kB
AnonHugePages:         0 kB
THPeligible:           0
VmFlags: rd wr mr mw me ac hg 
7f0004600000-7f0004a00000 rw-p 00000000 00:00 0 
Size:               4096 kB
Rss:                4096 kB
Anonymous:          4096 kB
AnonHugePages:      4096 kB
THPeligible:           1
VmFlags: rd wr mr mw me ac hg 
";

/// One smaps entry of `size_kb` at `start` with `anon_kb` resident, `huge_kb` of it huge, as
/// the kernel prints it under enabled=madvise (eligible with `hg` only).
pub(crate) fn smaps_entry(start: u64, size_kb: u64, anon_kb: u64, huge_kb: u64, flags: &str) -> String {
    format!(
        "{start:x}-{:x} rw-p 00000000 00:00 0 \nSize: {size_kb} kB\nRss: {anon_kb} kB\nAnonymous: {anon_kb} kB\n\
         AnonHugePages: {huge_kb} kB\nTHPeligible: {}\nVmFlags: rd wr mr mw me ac {flags} \n",
        start + size_kb * 1024,
        u8::from(flags == "hg")
    )
}

pub(crate) fn inputs(mode: DisableMode, release: &str, enabled: &str) -> Inputs {
    inputs_with(SMAPS, mode, release, enabled)
}

pub(crate) fn inputs_with(smaps: &str, mode: DisableMode, release: &str, enabled: &str) -> Inputs {
    let tree = sample_tree(enabled, "always [inherit] madvise never", "always inherit madvise [never]");
    let vmas = parse_smaps(smaps);
    let allow_check = AllowCheck::from_release(&Release::parse(release, ""));
    Inputs {
        pid: 4440,
        comm: "usemem".into(),
        cmdline: "usemem 64m".into(),
        kernel_release: release.into(),
        allow_check,
        bits: ThpDisableBits::Single { disable: 24 },
        policy: SystemPolicy::read_from(tree.path()),
        policy_start: SystemPolicy::read_from(tree.path()),
        policy_changed: false,
        scan_results: ScanResults::unknown(),
        vmstat_start: BTreeMap::new(),
        vmstat_end: BTreeMap::new(),
        vmas_start: vmas.clone(),
        vmas_end: vmas,
        mounts: Vec::new(),
        disable: DisableFacts {
            mode: Some(mode),
            source: ModeSource::Kernel,
            mm_flags: Some(1 << 24),
            status_thp_enabled: Some(mode == DisableMode::None),
        },
        ancestors: Vec::new(),
        set_by: Some(SetBy { pid: 4321, comm: "lkp".into(), cmdline: "lkp run job.yaml".into(), is_target: false }),
        prctl_events: Vec::new(),
        live: None,
        live_skipped: Some("--duration 0s".into()),
        notes: Vec::new(),
    }
}

pub(crate) fn key(start: u64, end: u64, flags: u64, mm_flags: u64, ret: u64, args: [u8; 4]) -> ThpCheckKey {
    ThpCheckKey { vm_start: start, vm_end: end, vm_flags: flags, mm_flags, ret, call_args: args, _pad: 0 }
}

fn plan(allow_check: Outcome) -> Plan {
    let probe = |name, outcome| ProbePlan { probe: name, purpose: "", outcome, failed_attempts: Vec::new() };
    let faults = Outcome::Attached { mechanism: "tp_btf".into(), target: "page_fault_user".into(), caveat: None };
    let scan = Outcome::Attached {
        mechanism: "tracepoint".into(),
        target: "huge_memory:mm_khugepaged_scan_pmd".into(),
        caveat: None,
    };
    Plan {
        probes: vec![
            probe(super::super::probes::ALLOW_CHECK.name, allow_check),
            probe(super::super::probes::PAGE_FAULTS.name, faults),
            probe(super::super::probes::KHUGEPAGED_SCAN.name, scan),
        ],
    }
}

pub(crate) fn live(checks: Vec<(ThpCheckKey, u64)>) -> LiveInput {
    let attached = Outcome::Attached { mechanism: "fexit".into(), target: "hugepage_vma_check".into(), caveat: None };
    live_with(plan(attached), checks)
}

fn live_with(plan: Plan, checks: Vec<(ThpCheckKey, u64)>) -> LiveInput {
    LiveInput {
        plan,
        checks,
        fault_ranges: vec![(0x7f0000000000 >> FAULT_RANGE_SHIFT, 600), (0x7f0000ff0000 >> FAULT_RANGE_SHIFT, 40)],
        counters: Counters(BTreeMap::from([(LiveCounter::Faults, 640)])),
        collapse: Vec::new(),
        duration_ns: 5_000_000_000,
        stopped_by: StoppedBy::Duration,
    }
}

/// thp-why's two JSON lines with a live window, a setter and denials (the host has no
/// allow-check hook; the guests do), against their schemas.
#[test]
fn the_json_lines_of_a_live_run_match_their_schemas() {
    let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
    input.live = Some(live(vec![(key(0x7f0000000000, 0x7f0004000000, 0, 1 << 24, 0, [0, 1, 1, 0]), 651)]));
    let report = build(input);
    assert!(report.live.plan.is_some() && report.live.checks > Some(0), "{:?}", report.live);
    for line in super::super::render::json(&report).lines() {
        crate::report::schema_check::tool_line(line);
    }
}

#[test]
fn the_lkp_case_reads_like_the_issue() {
    let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
    // 651 fault-path checks on the 64 MiB region, all denied with bit 24 set (6.1 bools:
    // smaps=0, in_pf=1, enforce_sysfs=1).
    input.live = Some(live(vec![(key(0x7f0000000000, 0x7f0004000000, 0, 1 << 24, 0, [0, 1, 1, 0]), 651)]));
    input.live_skipped = None;
    let report = build(input);
    assert_eq!(
        report.verdict.headline,
        "THP disabled for pid 4440 (usemem): MMF_DISABLE_THP set by prctl in ancestor 4321 (lkp run job.yaml), \
         inherited across fork/exec; 651 THP checks, 651 denied"
    );
    let first = &report.reasons[0];
    assert_eq!((first.code, first.count), (ReasonCode::PrctlThpDisable, Some(651)));
    assert_eq!(first.set_by.as_ref().unwrap().pid, 4321);
    assert!(
        report.verdict.advice[0].action.starts_with("start the workload outside that wrapper (4321 lkp)"),
        "{}",
        report.verdict.advice[0].action
    );
    assert_eq!(report.live.by_call[&Call::PageFault].denied, 651);
    assert_eq!(report.live.unexplained, Some(0));
    let big = &report.vmas[0];
    assert_eq!((big.size_bytes, big.live.denied, big.live.faults), (64 << 20, Some(651), 640));
    assert_eq!(big.live.denied_by[&ReasonCode::PrctlThpDisable], 651);
    assert!(big.fix.starts_with("start the workload outside that wrapper (4321 lkp)"), "{}", big.fix);
}

#[test]
fn vmas_are_judged_and_sorted_largest_first() {
    let report = build(inputs(DisableMode::None, "6.12.117+deb12-amd64", "always [madvise] never"));
    let sizes: Vec<u64> = report.vmas.iter().map(|v| v.size_bytes).collect();
    assert_eq!(sizes, [64 << 20, 4 << 20, 1 << 20]);
    let [plain, advised, small] = [&report.vmas[0], &report.vmas[1], &report.vmas[2]];
    assert_eq!(plain.reason, ReasonCode::SysfsMadviseNotAdvised);
    assert!(plain.in_wrapper, "6.12 refuses it in the inline wrapper");
    assert_eq!((advised.reason, advised.anon_huge_bytes), (ReasonCode::None, 4 << 20));
    assert_eq!(small.reason, ReasonCode::VmaTooSmall);
    assert!(!small.aligned_2m_window && plain.aligned_2m_window);
    assert!(report.vmas.iter().all(|v| v.kernel_agrees == Some(true)), "{:#?}", report.vmas);
    let codes: Vec<ReasonCode> = report.reasons.iter().map(|r| r.code).collect();
    assert_eq!(codes, [ReasonCode::SysfsMadviseNotAdvised, ReasonCode::VmaTooSmall, ReasonCode::None]);
    assert!(report.live.why_not.as_deref() == Some("--duration 0s"));
}

/// Mixed: the headline is the huge share, then what keeps the rest small, largest first.
#[test]
fn a_mixed_process_leads_with_its_huge_share_then_the_small_rest() {
    let report = build(inputs(DisableMode::None, "6.12.117+deb12-amd64", "always [madvise] never"));
    assert_eq!(
        report.verdict.headline,
        "pid 4440 (usemem): 4 MiB of 69 MiB resident anonymous memory is in huge pages (6 %); in small pages: \
         64 MiB without MADV_HUGEPAGE under enabled=madvise (sysfs_madvise_not_advised), 1 MiB in regions too \
         small for a 2 MiB page (vma_too_small)"
    );
    assert_eq!(report.vmas[0].fix, "madvise(MADV_HUGEPAGE) this region, or set enabled=always");
    assert_eq!(report.vmas[1].fix, "", "the huge region needs nothing");
}

/// Issue 14: under enabled=madvise a process whose 64 MiB MADV_HUGEPAGE region is entirely
/// huge uses huge pages; a small plain heap does not make it "get no huge pages".
#[test]
fn a_fully_huge_madvised_region_gives_a_positive_headline() {
    let smaps =
        smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg") + &smaps_entry(0x5555_0000_0000, 2048, 2048, 0, "");
    let report = build(inputs_with(&smaps, DisableMode::None, "6.18.44", "always [madvise] never"));
    assert!(
        report.verdict.headline.starts_with(
            "pid 4440 (usemem): 64 MiB of 66 MiB resident anonymous memory is in huge pages (97 %); in small \
             pages: 2 MiB without MADV_HUGEPAGE under enabled=madvise"
        ),
        "{}",
        report.verdict.headline
    );
    assert!(!report.verdict.headline.contains("no huge pages"), "{}", report.verdict.headline);
    let only_huge = smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg");
    let report = build(inputs_with(&only_huge, DisableMode::None, "6.18.44", "always [madvise] never"));
    assert_eq!(
        report.verdict.headline,
        "pid 4440 (usemem): 64 MiB of 64 MiB resident anonymous memory is in huge pages (100 %)"
    );
    assert!(report.verdict.advice.is_empty(), "{:?}", report.verdict.advice);
}

/// A VM_NOHUGEPAGE region is the application's own opt-out: named so, and never given the
/// sysfs fix (enabled=always does not override MADV_NOHUGEPAGE), although on 6.8+ the
/// wrapper's madvise-mode refusal comes first in the kernel's order.
#[test]
fn an_opted_out_region_is_named_and_not_given_the_sysfs_fix() {
    let smaps =
        smaps_entry(0x7f00_0000_0000, 8192, 8192, 8192, "hg") + &smaps_entry(0x7f10_0000_0000, 4096, 4096, 0, "nh");
    let report = build(inputs_with(&smaps, DisableMode::None, "6.18.44", "always [madvise] never"));
    let nh = report.vmas.iter().find(|v| v.nh).unwrap();
    assert_eq!(nh.reasons, [ReasonCode::SysfsMadviseNotAdvised, ReasonCode::VmaNohugepage], "kernel order");
    assert!(nh.fix.starts_with("the application opted this region out itself"), "{}", nh.fix);
    assert!(
        report
            .verdict
            .headline
            .ends_with("in small pages: 4 MiB opted out by the application itself (MADV_NOHUGEPAGE) (vma_nohugepage)"),
        "{}",
        report.verdict.headline
    );
    for fix in report.verdict.advice.iter().map(|a| &a.action).chain([&nh.fix]) {
        assert!(!fix.contains("always"), "the sysfs fix does not help an opt-out: {fix}");
    }
    assert!(report.reasons.iter().all(|r| r.code != ReasonCode::SysfsMadviseNotAdvised), "{:?}", report.reasons);
    let row = report.reasons.iter().find(|r| r.code == ReasonCode::VmaNohugepage).unwrap();
    assert!(row.detail.contains("the application's own opt-out"), "{}", row.detail);
    assert_eq!((row.vmas, row.bytes), (1, 4 << 20));
}

/// The `none` row is about all eligible VMAs, not the first one's figure.
#[test]
fn the_none_row_totals_its_vmas() {
    let smaps = smaps_entry(0x7f00_0000_0000, 8192, 8192, 8192, "hg")
        + &smaps_entry(0x7f10_0000_0000, 4096, 4096, 2048, "hg")
        + &smaps_entry(0x7f20_0000_0000, 4096, 2048, 0, "hg");
    let report = build(inputs_with(&smaps, DisableMode::None, "6.18.44", "always [madvise] never"));
    let none = report.reasons.iter().find(|r| r.code == ReasonCode::None).unwrap();
    assert_eq!((none.vmas, none.bytes), (3, 16 << 20));
    assert_eq!(
        none.detail,
        "eligible: 10 MiB of the 14 MiB resident anonymous memory of these 3 VMAs is in huge pages"
    );
}

/// Where the allow-check cannot be traced (the host: no kprobes, fentry refused) its counts
/// are unmeasured: null, not 0. Faults are still counted.
#[test]
fn untraced_allow_check_counts_are_null_not_zero() {
    let mut input = inputs(DisableMode::None, "6.18.44", "always [madvise] never");
    input.live_skipped = None;
    input.live = Some(live_with(plan(Outcome::Unavailable), Vec::new()));
    let report = build(input);
    assert!(!report.live.allow_check_observed);
    assert_eq!((report.live.checks, report.live.denied, report.live.unexplained), (None, None, None));
    assert!(report.reasons.iter().all(|r| r.count.is_none()), "{:?}", report.reasons);
    assert!(report.vmas.iter().all(|v| v.live.checks.is_none() && v.live.denied.is_none()));
    assert_eq!(report.faults.total, 640);
    assert!(report.verdict.headline.ends_with("; 640 page faults, ~0 in huge pages"), "{}", report.verdict.headline);
    let json: serde_json::Value =
        serde_json::from_str(super::super::render::json(&report).lines().next().unwrap()).unwrap();
    assert!(json["live"]["checks"].is_null() && json["reasons"][0]["count"].is_null(), "{json}");
    assert!(json["vmas"][0]["live"]["checks"].is_null() && json["faults"]["total"] == 640, "{json}");
    assert_eq!(json["live"]["counters"]["faults"], 640);
    // Traced, a VMA without checks has a measured 0.
    let mut input = inputs(DisableMode::None, "6.18.44", "always [madvise] never");
    input.live = Some(live(Vec::new()));
    let report = build(input);
    assert!(report.vmas.iter().all(|v| v.live.checks == Some(0)));
    assert!(report.reasons.iter().all(|r| r.count == Some(0)));
    assert_eq!(report.live.counters.get(Counter::CheckMapFull), 0);
}

#[test]
fn live_denials_get_the_reason_of_their_facts() {
    let mut input = inputs(DisableMode::None, "6.1.0-57-amd64", "always [madvise] never");
    input.live_skipped = None;
    input.live = Some(live(vec![
        // 6.1 sees the madvise-mode denial inside the function (fault path).
        (key(0x7f0000000000, 0x7f0004000000, 0, 0, 0, [0, 1, 1, 0]), 32),
        // khugepaged on the 1 MiB region: too small.
        (key(0x7f0004200000, 0x7f0004300000, vm_flags::VM_HUGEPAGE, 0, 0, [0, 0, 1, 0]), 2),
        // A fault on the 1 MiB region is allowed (size is checked later).
        (key(0x7f0004200000, 0x7f0004300000, vm_flags::VM_HUGEPAGE, 0, 1, [0, 1, 1, 0]), 1),
        // An nh region mapped and unmapped during the run.
        (key(0x7f1000000000, 0x7f1000400000, vm_flags::VM_NOHUGEPAGE, 0, 0, [0, 1, 1, 0]), 2),
    ]));
    let report = build(input);
    assert_eq!((report.live.checks, report.live.denied), (Some(37), Some(36)));
    assert_eq!(
        (report.live.unexplained, report.live.disagreements, report.live.gone_vmas),
        (Some(0), Some(0), Some(2))
    );
    let count = |code| report.reasons.iter().find(|r| r.code == code).and_then(|r| r.count);
    assert_eq!(count(ReasonCode::SysfsMadviseNotAdvised), Some(32));
    assert_eq!(count(ReasonCode::VmaTooSmall), Some(2));
    assert!(report.verdict.headline.ends_with("; 37 THP checks, 36 denied"), "{}", report.verdict.headline);
}

#[test]
fn prctl_caught_live_names_the_caller() {
    let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
    input.set_by = Some(SetBy { pid: 4440, comm: "usemem".into(), cmdline: String::new(), is_target: true });
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"usemem");
    input.prctl_events = vec![PrctlEvent { tgid: 4440, pid: 4441, arg2: 1, arg3: 0, mm_flags_before: 0, comm }];
    let report = build(input);
    assert!(
        report.verdict.headline.contains("set by prctl in the process itself (caught live)"),
        "{}",
        report.verdict.headline
    );
    assert_eq!(report.process.prctl_calls[0].relation, Relation::Target);
    assert_eq!(report.process.prctl_calls[0].effect, PrctlEffect::Disable);
    let json = serde_json::to_value(&report.process.prctl_calls[0]).unwrap();
    assert_eq!((json["relation"].as_str(), json["effect"].as_str()), (Some("target"), Some("disable")));
}

#[test]
fn except_advised_on_6_18() {
    let mut input = inputs(DisableMode::ExceptAdvised, "6.18.44", "[always] madvise never");
    input.bits = ThpDisableBits::Split { completely: 24, except_advised: 23 };
    let report = build(input);
    assert!(
        report.verdict.headline.starts_with("THP disabled for pid 4440 (usemem) except MADV_HUGEPAGE regions"),
        "{}",
        report.verdict.headline
    );
    assert_eq!(report.reasons[0].code, ReasonCode::PrctlThpDisableExceptAdvised);
    let plain = &report.vmas[0];
    assert_eq!(plain.reason, ReasonCode::PrctlThpDisableExceptAdvised);
    assert_eq!(report.vmas[1].reason, ReasonCode::None, "the madvised region stays eligible");
}

#[test]
fn a_kernel_without_thp_says_so_first() {
    let mut input = inputs(DisableMode::Completely, "6.12.117+deb12-rt-amd64", "[always] madvise never");
    input.policy = SystemPolicy::read_from(std::path::Path::new("/nonexistent/transparent_hugepage"));
    let report = build(input);
    assert!(
        report
            .verdict
            .headline
            .starts_with("THP unavailable for pid 4440 (usemem): this kernel has no transparent huge pages"),
        "{}",
        report.verdict.headline
    );
    assert_eq!(report.reasons[0].code, ReasonCode::SysfsNever);
    assert!(
        report.verdict.advice[0].action.contains("CONFIG_TRANSPARENT_HUGEPAGE"),
        "{}",
        report.verdict.advice[0].action
    );
    assert!(report.vmas.iter().all(|v| v.reason == ReasonCode::SysfsNever));
    // The prctl flag is still real (set and inherited), so it stays listed.
    assert!(report.reasons.iter().any(|r| r.code == ReasonCode::PrctlThpDisable));
}

#[test]
fn alloc_fallback_when_eligible_memory_stayed_small() {
    let mut input = inputs(DisableMode::None, "6.12.117+deb12-amd64", "[always] madvise never");
    input.vmstat_start.insert("thp_fault_fallback".into(), 10);
    input.vmstat_end.insert("thp_fault_fallback".into(), 42);
    let report = build(input);
    assert_eq!(report.vmas[0].reasons, [ReasonCode::AllocFallback]);
    assert_eq!(report.vmas[0].reason, ReasonCode::AllocFallback);
    assert!(report.vmas[0].detail.contains("system-wide thp_fault_fallback"), "{}", report.vmas[0].detail);
    assert_eq!(report.faults.thp_fault_fallback, 32);
}

/// 8 MiB of touched anonymous memory without MADV_HUGEPAGE that the kernel calls ineligible
/// although enabled=always: on 6.18 only the except-advised mode does that.
const EXCEPT_ADVISED_SMAPS: &str = "7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \nSize: 8192 kB\n\
    Rss: 8192 kB\nAnonymous: 8192 kB\nAnonHugePages: 0 kB\nTHPeligible: 0\nVmFlags: rd wr mr mw me ac \n";

fn facts(seen: Option<MmSeen>, status: Option<bool>, bits: ThpDisableBits) -> DisableFacts {
    let tree =
        sample_tree("[always] madvise never", "always [inherit] madvise never", "always inherit madvise [never]");
    let policy = SystemPolicy::read_from(tree.path());
    let check = AllowCheck::from_release(&Release::parse("6.18.44", ""));
    disable_facts(seen, status, bits, &check, &policy, &parse_smaps(EXCEPT_ADVISED_SMAPS), &[])
}

const SPLIT: ThpDisableBits = ThpDisableBits::Split { completely: 24, except_advised: 23 };
const SINGLE: ThpDisableBits = ThpDisableBits::Single { disable: 24 };

#[test]
fn the_kernel_read_wins_over_status() {
    let seen = MmSeen { mm: 0xffff_8880_0000_0000, flags: 1 << 23, updates: 1 };
    let f = facts(Some(seen), Some(true), SPLIT);
    assert_eq!((f.mode, f.source, f.mm_flags), (Some(DisableMode::ExceptAdvised), ModeSource::Kernel, Some(1 << 23)));
}

#[test]
fn status_zero_is_the_complete_disable() {
    let f = facts(None, Some(false), SINGLE);
    assert_eq!((f.mode, f.source), (Some(DisableMode::Completely), ModeSource::Status));
}

#[test]
fn except_advised_is_inferred_from_smaps_only_on_6_18() {
    let f = facts(None, Some(true), SPLIT);
    assert_eq!((f.mode, f.source), (Some(DisableMode::ExceptAdvised), ModeSource::Smaps));
    // Before 6.18 there is no such mode: the mismatch stays a mismatch.
    let f = facts(None, Some(true), SINGLE);
    assert_eq!((f.mode, f.source), (Some(DisableMode::None), ModeSource::Status));
    // No status line (kernel thread, or no THP): unknown.
    assert_eq!(facts(None, None, SPLIT).mode, None);
}

#[test]
fn the_target_entry_of_the_chain_takes_the_judged_mode() {
    let a = |pid, disable, source| Ancestor { pid, comm: "x".into(), cmdline: String::new(), disable, source };
    let chain = vec![
        a(9, Some(DisableMode::None), ModeSource::Status),
        a(8, Some(DisableMode::ExceptAdvised), ModeSource::Kernel),
        a(1, Some(DisableMode::None), ModeSource::Kernel),
    ];
    let seen = MmSeen { mm: 1, flags: 1 << 23, updates: 1 };
    let (chain, set_by) = attribute(chain, &facts(Some(seen), Some(true), SPLIT));
    assert_eq!((chain[0].disable, chain[0].source), (Some(DisableMode::ExceptAdvised), ModeSource::Kernel));
    assert_eq!(set_by.map(|s| s.pid), Some(8));
}
