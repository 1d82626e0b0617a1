//! The collapse path: what khugepaged (and the process's own MADV_COLLAPSE) did with the target's
//! memory during the run, why ranges stayed small, and what would let them collapse. Pure
//! functions of the gathered facts, like `judge`.

use std::collections::BTreeMap;

use mm_probe_common::thp::{Counter, ScanOrigin, ScanPath, collapse_slot_parts};

use super::{
    inputs::{Inputs, LiveInput},
    probes,
    reasons::{DisableMode, ReasonCode},
    report::{CollapseFacts, CollapseResult, VmaClass, VmaEntry},
    scan_result::{Outcome, meaning},
    words::counted,
};
use crate::units::{format_bytes, format_nanos};

/// MMF_VM_HUGEPAGE: set in mm->flags while khugepaged has the mm on its list. Bit 17 from 2.6.38
/// through 6.18 (include/linux/mm_types.h, before that sched/coredump.h).
const MMF_VM_HUGEPAGE: u64 = 1 << 17;

const PMD_BYTES: u64 = 2 << 20;

pub fn judge(input: &Inputs, vmas: &[VmaEntry]) -> CollapseFacts {
    let (candidate_regions, candidate_small_bytes) = candidates(vmas);
    let mut facts = CollapseFacts {
        observed: false,
        why_not: None,
        names_from: input.scan_results.from,
        scans: None,
        by_khugepaged: None,
        by_madvise_collapse: None,
        collapsed: None,
        failed: None,
        results: Vec::new(),
        other_mm_scans: None,
        registered: input.disable.mm_flags.map(|flags| flags & MMF_VM_HUGEPAGE != 0),
        reached: None,
        not_reached: None,
        kept_away: kept_away(input),
        candidate_regions,
        candidate_small_bytes,
        full_scans_delta: khugepaged_delta(input, "full_scans"),
        pages_collapsed_delta: khugepaged_delta(input, "pages_collapsed"),
        anon_huge_bytes_delta: anon_huge_bytes(&input.vmas_end) as i64 - anon_huge_bytes(&input.vmas_start) as i64,
        advice: Vec::new(),
    };
    let Some(live) = input.live.as_ref() else {
        facts.why_not = Some(input.live_skipped.clone().unwrap_or_else(|| "no live window".into()));
        return facts;
    };
    match live.plan.get(probes::KHUGEPAGED_SCAN.name) {
        Some(scan) if scan.attached() => facts.observed = true,
        Some(scan) => facts.why_not = Some(scan.why_unavailable()),
        None => facts.why_not = Some("the scan tracepoint was not planned".into()),
    }
    if !facts.observed {
        return facts;
    }
    facts.results = results(input, live);
    let total =
        |keep: &dyn Fn(&CollapseResult) -> bool| facts.results.iter().filter(|r| keep(r)).map(|r| r.count).sum();
    let scans: u64 = total(&|_| true);
    facts.scans = Some(scans);
    facts.by_khugepaged = Some(total(&|r| r.origin == origin_name(ScanOrigin::Khugepaged)));
    facts.by_madvise_collapse = Some(total(&|r| r.origin == origin_name(ScanOrigin::Madvise)));
    facts.collapsed = Some(total(&|r| r.outcome == Outcome::Collapsed));
    facts.failed = Some(total(&|r| r.outcome == Outcome::Failed));
    facts.other_mm_scans = Some(live.counters.get(Counter::OtherMmScans));
    facts.reached = Some(facts.by_khugepaged.unwrap_or(0) > 0);
    if facts.reached == Some(false) {
        facts.not_reached = Some(not_reached(input, live, &facts));
    }
    facts.advice = advice(&facts);
    facts
}

/// The run's failed collapse scans of the target, led by the most frequent result: what kept its
/// eligible memory small once khugepaged (or its own MADV_COLLAPSE) came. The scan tracepoint
/// names the mm, not the address, so the failures are the process's, not one region's.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub failed: u64,
    pub top: CollapseResult,
}

impl Refusal {
    pub fn of(facts: &CollapseFacts) -> Option<Self> {
        let failed = facts.failed.filter(|&n| n > 0)?;
        // Results are most frequent first.
        let top = facts.results.iter().find(|r| r.outcome == Outcome::Failed)?.clone();
        Some(Self { failed, top })
    }

    /// ` (khugepaged/max_ptes_none is 32)`, where the result is a knob's limit.
    fn limit(&self) -> String {
        match (self.top.knob, self.top.knob_value) {
            (Some(knob), Some(value)) => format!(" (khugepaged/{knob} is {value})"),
            (Some(knob), None) => format!(" (khugepaged/{knob})"),
            _ => String::new(),
        }
    }

    /// For the verdict: "48 failed scans, most with exceed_none_pte (khugepaged/max_ptes_none is 32)".
    pub fn summary(&self) -> String {
        let most = if self.top.count == self.failed { "all" } else { "most" };
        format!(
            "{}, {most} with {}{}",
            counted(self.failed, "failed scan", "failed scans"),
            self.top.result,
            self.limit()
        )
    }

    pub fn detail(&self) -> String {
        let most = if self.top.count == self.failed { "all" } else { "most" };
        format!(
            "eligible, but collapsing it failed: {} of this process during the run, {most} with {}: {}{}; scans \
             are counted per process, not per region",
            counted(self.failed, "failed scan", "failed scans"),
            self.top.result,
            self.top.why,
            self.limit()
        )
    }

    pub fn fix(&self) -> String {
        let own = if self.top.fix.is_empty() { String::new() } else { format!("{}; or ", self.top.fix) };
        format!(
            "{own}collapse it from the application with madvise(MADV_COLLAPSE) (6.1+), which ignores khugepaged's \
             max_ptes_* limits"
        )
    }
}

/// Gives the refusal to each eligible region that still holds small pages where a 2 MiB page
/// fits: what the scans failed on is what keeps them small.
pub fn mark_refused(vmas: &mut [VmaEntry], refusal: &Refusal) {
    for v in vmas.iter_mut().filter(|v| is_candidate(v) && v.small_anonymous_bytes() > 0) {
        v.reason = ReasonCode::CollapseRefused;
        v.reasons.push(ReasonCode::CollapseRefused);
        v.detail = refusal.detail();
        v.details.push(v.detail.clone());
        v.fix = refusal.fix();
    }
}

fn is_candidate(v: &VmaEntry) -> bool {
    v.kind == VmaClass::Anon && v.reason == ReasonCode::None && v.aligned_2m_window
}

/// Eligible regions with at least one aligned 2 MiB range, and their resident small pages.
fn candidates(vmas: &[VmaEntry]) -> (usize, u64) {
    let eligible: Vec<&VmaEntry> = vmas.iter().filter(|v| is_candidate(v)).collect();
    (eligible.len(), eligible.iter().map(|v| v.small_anonymous_bytes()).sum())
}

fn anon_huge_bytes(vmas: &[super::procfs::Vma]) -> u64 {
    vmas.iter().map(|v| v.anon_huge_kb * 1024).sum()
}

fn khugepaged_delta(input: &Inputs, knob: &str) -> Option<i64> {
    let end = *input.policy.khugepaged.get(knob)?;
    let start = *input.policy_start.khugepaged.get(knob)?;
    Some(end as i64 - start as i64)
}

fn origin_name(origin: ScanOrigin) -> &'static str {
    match origin {
        ScanOrigin::Khugepaged => "khugepaged",
        ScanOrigin::Madvise => "madvise_collapse",
    }
}

/// The counted slots, named and explained, most frequent first.
fn results(input: &Inputs, live: &LiveInput) -> Vec<CollapseResult> {
    let mut results: Vec<CollapseResult> = live
        .collapse
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|&(slot, count)| {
            let (path, origin, raw) = collapse_slot_parts(slot);
            let name = input.scan_results.name(raw);
            let known = meaning(&name);
            let knob = known.and_then(|m| m.knob);
            CollapseResult {
                raw,
                path: match path {
                    ScanPath::Anon => "anon",
                    ScanPath::File => "file",
                },
                origin: origin_name(origin),
                count,
                outcome: known.map_or(Outcome::Failed, |m| m.outcome),
                why: known.map_or_else(
                    || format!("{name}: not described by mm-probe (see mm/khugepaged.c)"),
                    |m| m.why.into(),
                ),
                knob,
                knob_value: knob.and_then(|k| input.policy.khugepaged.get(k).copied()),
                fix: known.map_or_else(String::new, |m| m.fix.into()),
                result: name,
            }
        })
        .collect();
    results.sort_by(|a, b| b.count.cmp(&a.count).then(a.raw.cmp(&b.raw)));
    results
}

/// A process-wide refusal that keeps khugepaged from the whole process: the prctl (no region
/// of an MMF_DISABLE_THP mm registers it, khugepaged_enter_vma runs the same allow-check, and a
/// scan of an mm that has it drops the mm), or the 2 MiB size off system-wide (khugepaged only
/// runs while some PMD-size policy is on: start_stop_khugepaged).
fn kept_away(input: &Inputs) -> Option<String> {
    if !input.policy.thp_built_in {
        return Some("this kernel has no transparent huge pages, so no khugepaged".into());
    }
    if input.disable.mode == Some(DisableMode::Completely) {
        let from = match &input.set_by {
            Some(s) if s.is_target => " (the process set it itself)".to_string(),
            Some(s) => format!(
                ", inherited from ancestor {} ({})",
                s.pid,
                if s.cmdline.is_empty() { &s.comm } else { &s.cmdline }
            ),
            None => String::new(),
        };
        return Some(format!(
            "prctl(PR_SET_THP_DISABLE) keeps khugepaged away from this process{from}: no region of it can \
             register with khugepaged, madvise(MADV_HUGEPAGE) included, and MADV_COLLAPSE is refused too"
        ));
    }
    let pmd = input.policy.pmd_order();
    if !input.policy.anon_orders_allowed(true).contains(&pmd) {
        return Some(
            "the 2 MiB size is off system-wide (enabled=never, or its hugepages-2048kB control is never): \
             khugepaged does not run for anonymous memory"
                .into(),
        );
    }
    None
}

/// Why khugepaged did not scan the target during the run, from its list membership and pace.
fn not_reached(input: &Inputs, live: &LiveInput, facts: &CollapseFacts) -> String {
    if let Some(why) = &facts.kept_away {
        return why.clone();
    }
    if facts.registered == Some(false) {
        return "khugepaged does not have this process on its list (MMF_VM_HUGEPAGE is clear): no region has \
                registered it (a region registers when it becomes eligible: madvise(MADV_HUGEPAGE), or a new \
                mapping or fault under enabled=always)"
            .into();
    }
    let knob = |name: &str| input.policy.khugepaged.get(name).copied();
    let pace = match (knob("pages_to_scan"), knob("scan_sleep_millisecs")) {
        (Some(pages), Some(sleep)) => format!(
            ": it wakes every {sleep} ms (scan_sleep_millisecs) and scans {pages} pages ({}) per wake, one \
             registered process after another",
            format_bytes(pages * 4096)
        ),
        _ => String::new(),
    };
    let passes = match facts.full_scans_delta {
        Some(0) => "; it finished no full pass over its list".to_string(),
        Some(n) => format!("; it finished {} over its list", counted(n.unsigned_abs(), "full pass", "full passes")),
        None => String::new(),
    };
    format!(
        "khugepaged did not scan this process's memory during the {} run{pace}{passes}; it scanned other processes' \
         ranges {}",
        format_nanos(live.duration_ns),
        counted(facts.other_mm_scans.unwrap_or(0), "time", "times")
    )
}

/// What would let the memory collapse, tied to the results that stopped it; each line once.
fn advice(facts: &CollapseFacts) -> Vec<String> {
    let mut advice = Vec::new();
    let mut by_result: BTreeMap<&str, u64> = BTreeMap::new();
    for r in facts.results.iter().filter(|r| r.outcome == Outcome::Failed) {
        *by_result.entry(r.result.as_str()).or_default() += r.count;
    }
    let mut ordered: Vec<(&str, u64)> = by_result.into_iter().collect();
    ordered.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    for (name, count) in ordered {
        let Some(r) = facts.results.iter().find(|r| r.result == name) else { continue };
        if r.fix.is_empty() {
            continue;
        }
        // The result's meaning is printed beside its count; the advice adds only the fix.
        let limit = match (r.knob, r.knob_value) {
            (Some(knob), Some(value)) => format!(" ({knob} is {value})"),
            _ => String::new(),
        };
        advice.push(format!("{} failed with {name}{limit}: {}", counted(count, "scan", "scans"), r.fix));
    }
    if facts.failed.unwrap_or(0) > 0 && facts.by_khugepaged.unwrap_or(0) > 0 {
        advice.push(
            "from the application: madvise(MADV_COLLAPSE) (6.1+) collapses a range at once, without waiting for \
             khugepaged and without its max_ptes_* limits"
                .into(),
        );
    }
    if facts.reached == Some(false) && facts.kept_away.is_none() && facts.candidate_small_bytes > PMD_BYTES {
        advice.push(format!(
            "{} in {} {} for khugepaged: lower khugepaged/scan_sleep_millisecs or raise pages_to_scan for it to \
             come sooner, or collapse from the application with madvise(MADV_COLLAPSE)",
            format_bytes(facts.candidate_small_bytes),
            counted(facts.candidate_regions as u64, "eligible region", "eligible regions"),
            if facts.candidate_regions == 1 { "waits" } else { "wait" }
        ));
    }
    advice
}

#[cfg(test)]
mod tests {
    use mm_probe_common::thp::collapse_slot;

    use super::*;
    use crate::{
        kernel::KernelBtf,
        thp_why::{
            judge::{
                build,
                tests::{inputs_with, live, smaps_entry},
            },
            reasons::DisableMode,
            report::Report,
            scan_result::{ScanResults, tests::scan_result_6_18},
        },
    };

    fn names_6_18() -> ScanResults {
        let btf = KernelBtf::from_bytes(crate::kernel::btf::tests::btf_with_enum("scan_result", &scan_result_6_18()));
        ScanResults::from_btf(&btf.unwrap()).unwrap()
    }

    /// A 64 MiB madvised region half in small pages, scanned by khugepaged.
    fn scanned(results: &[(u32, u64)], khugepaged: &[(&str, u64)]) -> CollapseFacts {
        scanned_report(results, khugepaged).collapse
    }

    fn scanned_report(results: &[(u32, u64)], khugepaged: &[(&str, u64)]) -> Report {
        let smaps = smaps_entry(0x7f00_0000_0000, 65536, 65536, 32768, "hg");
        let mut input = inputs_with(&smaps, DisableMode::None, "6.18.0", "always [madvise] never");
        input.scan_results = names_6_18();
        // On khugepaged's list (MMF_VM_HUGEPAGE), THP not disabled.
        input.disable.mm_flags = Some(1 << 17);
        for &(knob, value) in khugepaged {
            input.policy.khugepaged.insert(knob.into(), value);
        }
        let mut run = live(Vec::new());
        run.collapse =
            results.iter().map(|&(raw, n)| (collapse_slot(ScanPath::Anon, ScanOrigin::Khugepaged, raw), n)).collect();
        input.live = Some(run);
        build(input)
    }

    #[test]
    fn a_sparse_region_fails_on_max_ptes_none_by_name_and_gets_the_knob_as_advice() {
        let facts = scanned(&[(5, 224), (1, 2)], &[("max_ptes_none", 32)]);
        assert!(facts.observed);
        assert_eq!((facts.scans, facts.collapsed, facts.failed), (Some(226), Some(2), Some(224)));
        let first = &facts.results[0];
        assert_eq!((first.result.as_str(), first.count, first.knob_value), ("exceed_none_pte", 224, Some(32)));
        assert!(facts.advice[0].starts_with("224 scans failed with exceed_none_pte"), "{:?}", facts.advice);
        assert!(facts.advice[0].contains("max_ptes_none is 32"), "{}", facts.advice[0]);
        assert!(facts.advice.iter().any(|a| a.contains("MADV_COLLAPSE")), "{:?}", facts.advice);
        assert_eq!(facts.reached, Some(true));
        assert_eq!(facts.candidate_regions, 1);
    }

    /// The text names each result once with its count and knob, and the advice adds only the fix.
    #[test]
    fn the_collapse_section_explains_each_result_once() {
        let report = scanned_report(&[(5, 224), (1, 2)], &[("max_ptes_none", 32)]);
        let text = crate::thp_why::render::text(&report, false, 100);
        let section = text.split("Collapse (khugepaged)").nth(1).unwrap().split("\n\n").next().unwrap();
        assert!(section.contains("226 of this process's ranges (226 by khugepaged): 2 collapsed, 224 stayed small"));
        assert!(section.contains("exceed_none_pte") && section.contains("max_ptes_none 32"), "{section}");
        assert_eq!(section.matches("sparsely touched").count(), 1, "{section}");
        assert!(section.contains("224 scans failed with exceed_none_pte (max_ptes_none is 32): touch"), "{section}");
    }

    #[test]
    fn no_scan_of_a_registered_process_is_not_reached_with_khugepaged_pace() {
        let facts = scanned(&[], &[("pages_to_scan", 4096), ("scan_sleep_millisecs", 10000)]);
        assert_eq!((facts.scans, facts.reached), (Some(0), Some(false)));
        let why = facts.not_reached.as_deref().unwrap();
        assert!(why.contains("did not scan this process") && why.contains("10000 ms"), "{why}");
        assert!(facts.advice.iter().any(|a| a.contains("scan_sleep_millisecs")), "{:?}", facts.advice);
        assert!(facts.results.is_empty());
    }

    #[test]
    fn without_the_scan_tracepoint_nothing_is_counted_as_zero() {
        let smaps = smaps_entry(0x7f00_0000_0000, 4096, 4096, 0, "hg");
        let facts = build(inputs_with(&smaps, DisableMode::None, "6.18.0", "always [madvise] never")).collapse;
        assert!(!facts.observed && facts.why_not.is_some());
        assert_eq!((facts.scans, facts.collapsed, facts.reached), (None, None, None));
    }
}
