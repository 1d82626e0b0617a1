//! From the gathered facts to the report: the target's THP-disable mode and who set it, every
//! VMA judged, the live keys decoded (`decoder`), the reasons ranked (`rank`), and the verdict:
//! how much of the resident anonymous memory is in huge pages, and what keeps the rest small.
//! Pure functions of their inputs, so the whole judgement is tested without a kernel.

use std::collections::BTreeMap;

use mm_probe_common::thp::{FAULT_RANGE_SHIFT, MmSeen, PrctlEvent, ThpCheckKey};

use super::{
    ancestry::{self, Ancestor, SetBy},
    checks::{AllowCheck, Call, Step},
    collapse,
    decoder::{attribute_faults, decode_live},
    facts::{VmaFacts, VmaKind},
    per_size,
    procfs::{Mount, Vma},
    rank::{aggregate_reasons, region_fix},
    reasons::{Context, Denial, DisableMode, ModeSource, ReasonCode, evaluate},
    report::{
        Counters, DisableBitsLayout, FaultFacts, KernelFacts, LiveFacts, PrctlCall, PrctlEffect, ProcessFacts,
        Relation, Report, StoppedBy, SystemFacts, VmaClass, VmaEntry, VmaLive,
    },
    scan_result::ScanResults,
    sysfs::{GlobalMode, SystemPolicy},
};
use crate::{kernel::layout::ThpDisableBits, probes::Plan, units::format_bytes};

/// prctl arg3 flag of 6.18 (uapi prctl.h).
const PR_THP_DISABLE_EXCEPT_ADVISED: u64 = 1 << 1;

/// How the target's THP-disable mode was learned.
#[derive(Clone, Debug)]
pub struct DisableFacts {
    pub mode: Option<DisableMode>,
    pub source: ModeSource,
    pub mm_flags: Option<u64>,
    pub status_thp_enabled: Option<bool>,
}

/// The live run's raw material.
pub struct LiveInput {
    pub plan: Plan,
    pub checks: Vec<(ThpCheckKey, u64)>,
    pub fault_ranges: Vec<(u64, u64)>,
    pub counters: Counters,
    /// Collapse scan results on the target's mm: (`collapse_slot`, count).
    pub collapse: Vec<(u32, u64)>,
    pub duration_ns: u64,
    pub stopped_by: StoppedBy,
}

/// Everything `build` needs.
pub struct Inputs {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub kernel_release: String,
    pub allow_check: AllowCheck,
    pub bits: ThpDisableBits,
    /// The sysfs policy at the end of the run (judged) and at its start (for counter deltas).
    pub policy: SystemPolicy,
    pub policy_start: SystemPolicy,
    pub policy_changed: bool,
    /// This kernel's names of khugepaged's scan results.
    pub scan_results: ScanResults,
    pub vmstat_start: BTreeMap<String, u64>,
    pub vmstat_end: BTreeMap<String, u64>,
    /// smaps at the start of the run (for AnonHugePages deltas) and at the end (judged).
    pub vmas_start: Vec<Vma>,
    pub vmas_end: Vec<Vma>,
    pub mounts: Vec<Mount>,
    pub disable: DisableFacts,
    pub ancestors: Vec<Ancestor>,
    pub set_by: Option<SetBy>,
    pub prctl_events: Vec<PrctlEvent>,
    pub live: Option<LiveInput>,
    /// Why there is no live part, when there is none.
    pub live_skipped: Option<String>,
    pub notes: Vec<String>,
}

/// The target's mode: kernel read of mm->flags, else /proc status, refined on 6.18 by smaps
/// (THP_enabled says 1 in except-advised mode; THPeligible 0 on a VMA nothing else refuses
/// betrays it).
pub fn disable_facts(
    kernel_seen: Option<MmSeen>,
    status_thp_enabled: Option<bool>,
    bits: ThpDisableBits,
    allow_check: &AllowCheck,
    policy: &SystemPolicy,
    vmas: &[Vma],
    mounts: &[Mount],
) -> DisableFacts {
    if let Some(seen) = kernel_seen {
        return DisableFacts {
            mode: Some(DisableMode::from_mm_flags(bits, seen.flags)),
            source: ModeSource::Kernel,
            mm_flags: Some(seen.flags),
            status_thp_enabled,
        };
    }
    let from_status = status_thp_enabled.map(|e| if e { DisableMode::None } else { DisableMode::Completely });
    if from_status == Some(DisableMode::None) && matches!(bits, ThpDisableBits::Split { .. }) {
        let ctx = Context { order: allow_check.order, policy, mm: DisableMode::None, past_wrapper: false };
        let betrayed = vmas.iter().any(|v| {
            let facts = VmaFacts::from_smaps(v, mounts);
            facts.is_anonymous()
                && !facts.vm_hugepage
                && v.thp_eligible == Some(false)
                && evaluate(&ctx, Call::Smaps, &facts).allowed()
        });
        if betrayed {
            return DisableFacts {
                mode: Some(DisableMode::ExceptAdvised),
                source: ModeSource::Smaps,
                mm_flags: None,
                status_thp_enabled,
            };
        }
    }
    DisableFacts { mode: from_status, source: ModeSource::Status, mm_flags: None, status_thp_enabled }
}

/// The ancestor chain with the target's own entry set to its judged mode, and who set it.
pub fn attribute(mut ancestors: Vec<Ancestor>, disable: &DisableFacts) -> (Vec<Ancestor>, Option<SetBy>) {
    if let Some(first) = ancestors.first_mut() {
        first.disable = disable.mode;
        first.source = disable.source;
    }
    let set_by = ancestry::set_by(&ancestors);
    (ancestors, set_by)
}

const HUGE_BYTES: u64 = 2 << 20;

const NO_THP: &str = "this kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE is off: \
                      /sys/kernel/mm/transparent_hugepage does not exist)";

pub fn build(input: Inputs) -> Report {
    let mut notes = input.notes.clone();
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let ctx = Context { order: input.allow_check.order, policy: &input.policy, mm: mode, past_wrapper: false };
    let fallback_delta = delta(&input, "thp_fault_fallback") + delta(&input, "thp_fault_fallback_charge");
    let mut vmas: Vec<VmaEntry> =
        input.vmas_end.iter().map(|vma| judge_vma(&ctx, vma, &input.mounts, fallback_delta > 0)).collect();
    vmas.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.start_addr.cmp(&b.start_addr)));
    for v in &mut vmas {
        v.fix = region_fix(v, &input);
    }

    let mut live = live_facts(&input);
    if live.allow_check_observed {
        for v in &mut vmas {
            (v.live.checks, v.live.denied) = (Some(0), Some(0));
        }
    }
    if let Some(li) = &input.live {
        decode_live(&input, li, &mut vmas, &mut live);
        attribute_faults(&li.fault_ranges, &mut vmas);
    }
    if input.policy_changed {
        notes.push("the sysfs THP settings changed during the run; reasons use the settings at the end".into());
    }
    let disagreeing = vmas.iter().filter(|v| v.kernel_agrees == Some(false)).count();
    if disagreeing > 0 {
        notes.push(format!(
            "{disagreeing} VMA(s) where the kernel's THPeligible differs from mm-probe's judgement (see kernel_agrees): \
             something /proc does not show decides them (read-only file THP, DAX, a driver's huge_fault, \
             or hardware-disabled THP)"
        ));
    }
    let faults = fault_facts(&input, &vmas);
    let reasons = aggregate_reasons(&input, &vmas, &live);
    let fix: Vec<String> = reasons.iter().filter(|r| r.code != ReasonCode::None).map(|r| r.fix.clone()).collect();
    let verdict = verdict_line(&input, &vmas, &live, &faults);
    let collapse = collapse::judge(&input, &vmas);
    let sizes = per_size::judge(&input, &vmas);
    Report {
        pid: input.pid,
        comm: input.comm.clone(),
        cmdline: input.cmdline.clone(),
        verdict,
        reasons,
        fix,
        process: ProcessFacts {
            thp_disable: input.disable.mode,
            source: input.disable.source,
            mm_flags: input.disable.mm_flags.map(|f| format!("{f:#x}")),
            status_thp_enabled: input.disable.status_thp_enabled,
            ancestors: input.ancestors.clone(),
            set_by: input.set_by.clone(),
            prctl_calls: prctl_calls(&input),
        },
        vmas,
        faults,
        system: SystemFacts { policy: input.policy.clone(), vmstat_delta: vmstat_delta(&input) },
        live,
        collapse,
        sizes,
        kernel: KernelFacts {
            release: input.kernel_release.clone(),
            allow_check: input.allow_check.clone(),
            thp_disable_bits: match input.bits {
                ThpDisableBits::Single { .. } => DisableBitsLayout::Single,
                ThpDisableBits::Split { .. } => DisableBitsLayout::Split,
            },
        },
        notes,
    }
}

fn delta(input: &Inputs, key: &str) -> i64 {
    let end = input.vmstat_end.get(key).copied().unwrap_or(0) as i64;
    let start = input.vmstat_start.get(key).copied().unwrap_or(0) as i64;
    end - start
}

fn vmstat_delta(input: &Inputs) -> BTreeMap<String, i64> {
    input.vmstat_end.keys().map(|k| (k.clone(), delta(input, k))).collect()
}

fn class_of(kind: &VmaKind) -> VmaClass {
    match kind {
        VmaKind::Anonymous => VmaClass::Anon,
        VmaKind::File => VmaClass::File,
        VmaKind::Shmem { .. } => VmaClass::Shmem,
        VmaKind::Special { .. } => VmaClass::Special,
        VmaKind::Gate => VmaClass::Gate,
    }
}

/// Judges one VMA as smaps' THPeligible does (no fault, sysfs enforced), then refines with
/// what happened: eligible but not backed although the kernel fell back → `alloc_fallback`.
fn judge_vma(ctx: &Context, vma: &Vma, mounts: &[Mount], fallback_seen: bool) -> VmaEntry {
    let facts = VmaFacts::from_smaps(vma, mounts);
    let mut eval = evaluate(ctx, Call::Smaps, &facts);
    if !ctx.policy.thp_built_in {
        // No allow-check at all: every VMA is refused for the same reason.
        eval.denials = vec![Denial {
            code: ReasonCode::SysfsNever,
            step: Step::WrapperAnonSysfs,
            in_wrapper: false,
            detail: NO_THP.into(),
        }];
        eval.uncertain = false;
    }
    let mut reasons = eval.codes();
    let mut details: Vec<String> = reasons
        .iter()
        .map(|c| eval.denials.iter().find(|d| d.code == *c).map(|d| d.detail.clone()).unwrap_or_default())
        .collect();
    let mut detail = eval.first().map(|d| d.detail.clone()).unwrap_or_default();
    let mut in_wrapper = eval.first().is_some_and(|d| d.in_wrapper);
    // What the kernel itself answered for smaps.
    let kernel_agrees = vma.thp_eligible.map(|k| k == eval.allowed());
    if eval.uncertain && vma.thp_eligible == Some(true) {
        // Read-only file THP or ->huge_fault allowed it: the kernel knows.
        reasons.clear();
        details.clear();
        in_wrapper = false;
        detail = "eligible as the kernel reports (read-only file THP or the driver's huge_fault)".into();
    }
    if reasons.is_empty() {
        detail = eligible_detail(ctx, &facts, vma, &eval.orders, fallback_seen, detail);
        if detail.starts_with(FALLBACK) {
            reasons.push(ReasonCode::AllocFallback);
            details.push(detail.clone());
        }
    }
    VmaEntry {
        start: format!("{:#x}", vma.start),
        end: format!("{:#x}", vma.end),
        size_bytes: vma.size_bytes(),
        kind: class_of(&facts.kind),
        name: vma.name.clone(),
        stack: vma.name == "[stack]" || vma.has_flag("gd"),
        aligned_2m_window: VmaFacts { kind: VmaKind::Anonymous, ..facts.clone() }.fits_order(ctx.policy.pmd_order()),
        hg: facts.vm_hugepage,
        nh: facts.vm_nohugepage,
        vm_flags: vma.vm_flags.join(" "),
        thp_eligible: vma.thp_eligible,
        anon_huge_bytes: vma.anon_huge_kb * 1024,
        rss_bytes: vma.rss_kb * 1024,
        anonymous_bytes: vma.anonymous_kb * 1024,
        reason: reasons.first().copied().unwrap_or(ReasonCode::None),
        reasons,
        detail,
        fix: String::new(),
        in_wrapper,
        kernel_agrees,
        live: VmaLive::default(),
        start_addr: vma.start,
        accessible: !vma.perms.starts_with("---"),
        details,
    }
}

const FALLBACK: &str = "eligible, but the kernel fell back to small pages";

/// What an eligible VMA got.
fn eligible_detail(
    ctx: &Context,
    facts: &VmaFacts,
    vma: &Vma,
    orders: &[u32],
    fallback_seen: bool,
    detail: String,
) -> String {
    let pmd = ctx.policy.pmd_order();
    if facts.is_anonymous() && vma.anon_huge_kb > 0 {
        format!(
            "eligible; {} of its {} resident in huge pages",
            format_bytes(vma.anon_huge_kb * 1024),
            format_bytes(vma.anonymous_kb * 1024)
        )
    } else if facts.is_anonymous() && !orders.is_empty() && !orders.contains(&pmd) {
        format!(
            "eligible for {} folios only (AnonHugePages counts PMD-mapped 2 MiB pages only)",
            orders.iter().map(|o| format_bytes(4096 << o)).collect::<Vec<_>>().join(", ")
        )
    } else if facts.is_anonymous() && vma.anonymous_kb * 1024 >= HUGE_BYTES && fallback_seen {
        format!("{FALLBACK} (the system-wide thp_fault_fallback grew during the run, for this process or another)")
    } else if facts.is_anonymous() && vma.anonymous_kb * 1024 >= HUGE_BYTES {
        "eligible, but no huge page is mapped: populated before THP was allowed, or in pieces; khugepaged may \
         collapse it later"
            .into()
    } else if detail.is_empty() {
        "eligible".into()
    } else {
        detail
    }
}

fn live_facts(input: &Inputs) -> LiveFacts {
    let plan = input.live.as_ref().map(|l| l.plan.clone());
    let allow = plan.as_ref().and_then(|p| p.get(super::probes::ALLOW_CHECK.name));
    let observed = allow.is_some_and(|p| p.attached());
    let allow_check = match allow.map(|p| &p.outcome) {
        Some(crate::probes::Outcome::Attached { mechanism, target, .. }) => format!("{target} via {mechanism}"),
        _ => input.allow_check.function.to_string(),
    };
    let why_not = if observed {
        None
    } else if let Some(skipped) = &input.live_skipped {
        Some(skipped.clone())
    } else {
        allow.map(|p| p.why_unavailable())
    };
    let wrapper_note = (observed && input.allow_check.has_wrapper()).then(|| {
        format!(
            "on this kernel the inline wrapper thp_vma_allowable_orders() refuses anonymous memory that sysfs \
             disables (enabled=never, or madvise without MADV_HUGEPAGE) before {} runs: those denials are \
             derived from sysfs and vm_flags, not counted",
            input.allow_check.function
        )
    });
    // Measured counts start at 0; unmeasured ones stay null.
    let zero = observed.then_some(0);
    LiveFacts {
        duration_ns: input.live.as_ref().map_or(0, |l| l.duration_ns),
        stopped_by: input.live.as_ref().map_or(StoppedBy::NotRun, |l| l.stopped_by),
        allow_check_observed: observed,
        allow_check,
        why_not,
        checks: zero,
        denied: zero,
        by_call: BTreeMap::new(),
        unexplained: zero,
        disagreements: zero,
        benign_denials: zero,
        gone_vmas: zero,
        denied_on_gone_vmas: BTreeMap::new(),
        wrapper_note,
        counters: input.live.as_ref().map(|l| l.counters.clone()).unwrap_or_default(),
        plan,
    }
}

fn fault_facts(input: &Inputs, vmas: &[VmaEntry]) -> FaultFacts {
    let observed = input.live.as_ref().is_some_and(|l| l.plan.is_attached(super::probes::PAGE_FAULTS.name));
    let total = input.live.as_ref().map_or(0, |l| l.counters.faults());
    let in_huge_pages = vmas
        .iter()
        .map(|v| {
            let before = input.vmas_start.iter().find(|s| s.start == v.start_addr).map_or(0, |s| s.anon_huge_kb * 1024);
            (v.anon_huge_bytes.saturating_sub(before) / HUGE_BYTES).min(v.live.faults)
        })
        .sum();
    let why_not = if observed {
        None
    } else {
        input.live_skipped.clone().or_else(|| {
            input.live.as_ref().and_then(|l| l.plan.get(super::probes::PAGE_FAULTS.name)).map(|p| p.why_unavailable())
        })
    };
    FaultFacts {
        observed,
        total,
        in_huge_pages,
        ranges: input.live.as_ref().map_or(0, |l| {
            let mut pmds: Vec<u64> = l.fault_ranges.iter().map(|(unit, _)| unit >> (21 - FAULT_RANGE_SHIFT)).collect();
            pmds.dedup();
            pmds.len()
        }),
        thp_fault_alloc: delta(input, "thp_fault_alloc"),
        thp_fault_fallback: delta(input, "thp_fault_fallback"),
        thp_fault_fallback_charge: delta(input, "thp_fault_fallback_charge"),
        why_not,
    }
}

fn prctl_effect(event: &PrctlEvent) -> PrctlEffect {
    if event.arg2 == 0 {
        PrctlEffect::Enable
    } else if event.arg3 & PR_THP_DISABLE_EXCEPT_ADVISED != 0 {
        PrctlEffect::DisableExceptAdvised
    } else {
        PrctlEffect::Disable
    }
}

fn prctl_calls(input: &Inputs) -> Vec<PrctlCall> {
    input
        .prctl_events
        .iter()
        .map(|e| PrctlCall {
            pid: e.pid,
            tgid: e.tgid,
            comm: comm_text(&e.comm),
            arg2: e.arg2,
            arg3: e.arg3,
            effect: prctl_effect(e),
            relation: if e.tgid == input.pid {
                Relation::Target
            } else if input.ancestors.iter().any(|a| a.pid == e.tgid) {
                Relation::Ancestor
            } else {
                Relation::Other
            },
        })
        .collect()
}

pub use crate::kernel::process::comm_text;

/// The prctl call caught live that explains the target's mode, if any: the target's own or an
/// ancestor's, the last one that set the mode the target has.
fn caught_prctl<'a>(input: &Inputs, calls: &'a [PrctlCall]) -> Option<&'a PrctlCall> {
    let want = match input.disable.mode? {
        DisableMode::Completely => PrctlEffect::Disable,
        DisableMode::ExceptAdvised => PrctlEffect::DisableExceptAdvised,
        DisableMode::None => return None,
    };
    calls.iter().rev().find(|c| c.effect == want && c.relation != Relation::Other)
}

fn verdict_line(input: &Inputs, vmas: &[VmaEntry], live: &LiveFacts, faults: &FaultFacts) -> String {
    let who = format!("pid {} ({})", input.pid, input.comm);
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let calls = prctl_calls(input);
    let caught = caught_prctl(input, &calls);
    let setter = match (&input.set_by, caught) {
        (_, Some(c)) if c.relation == Relation::Target => " by prctl in the process itself (caught live)".to_string(),
        (_, Some(c)) => format!(" by prctl in ancestor {} ({}) (caught live)", c.tgid, c.comm),
        (Some(s), None) if s.is_target => " by prctl in the process itself".to_string(),
        (Some(s), None) => format!(
            " by prctl in ancestor {} ({}), inherited across fork/exec",
            s.pid,
            if s.cmdline.is_empty() { &s.comm } else { &s.cmdline }
        ),
        (None, None) => " by prctl".to_string(),
    };
    let mut line = match mode {
        _ if !input.policy.thp_built_in => format!("THP unavailable for {who}: {NO_THP}"),
        DisableMode::Completely => {
            let flag = if matches!(input.bits, ThpDisableBits::Split { .. }) {
                "MMF_DISABLE_THP_COMPLETELY"
            } else {
                "MMF_DISABLE_THP"
            };
            format!("THP disabled for {who}: {flag} set{setter}")
        }
        DisableMode::ExceptAdvised => {
            format!("THP disabled for {who} except MADV_HUGEPAGE regions: MMF_DISABLE_THP_EXCEPT_ADVISED set{setter}")
        }
        DisableMode::None
            if input.policy.enabled == Some(GlobalMode::Never) && input.policy.anon_orders_allowed(true).is_empty() =>
        {
            format!("THP disabled system-wide for {who}: /sys/kernel/mm/transparent_hugepage/enabled is never")
        }
        DisableMode::None => memory_verdict(&who, vmas),
    };
    if let (true, Some(checks), Some(denied)) = (live.allow_check_observed, live.checks, live.denied) {
        line.push_str(&format!("; {checks} THP checks, {denied} denied"));
    } else if faults.observed && faults.total > 0 {
        // Without the allow-check probe (no kprobes, no trampolines) the faults still tell.
        line.push_str(&format!("; {} page faults, ~{} in huge pages", faults.total, faults.in_huge_pages));
    }
    line
}

/// Without a process-wide cause, what matters: how much of the resident anonymous memory (what
/// THP is for) is in huge pages, then what keeps the rest in small pages, largest first.
fn memory_verdict(who: &str, vmas: &[VmaEntry]) -> String {
    let anon: Vec<&VmaEntry> = vmas.iter().filter(|v| v.kind == VmaClass::Anon).collect();
    let resident: u64 = anon.iter().map(|v| v.anonymous_bytes).sum();
    let huge: u64 = anon.iter().map(|v| v.anon_huge_bytes).sum();
    if resident == 0 {
        return format!("{who}: no resident anonymous memory yet, so nothing for huge pages to back");
    }
    let share = 100.0 * huge as f64 / resident as f64;
    let mut line = format!(
        "{who}: {} of {} resident anonymous memory is in huge pages ({share:.0} %)",
        format_bytes(huge),
        format_bytes(resident)
    );
    let mut small: BTreeMap<ReasonCode, u64> = BTreeMap::new();
    for v in anon.iter().filter(|v| v.small_anonymous_bytes() > 0) {
        *small.entry(v.blocking_reason()).or_default() += v.small_anonymous_bytes();
    }
    let mut small: Vec<(ReasonCode, u64)> = small.into_iter().collect();
    small.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = small.iter().take(3).map(|&(code, bytes)| small_part(code, bytes)).collect();
    if !parts.is_empty() {
        line.push_str("; in small pages: ");
        line.push_str(&parts.join(", "));
        if small.len() > parts.len() {
            line.push_str(", …");
        }
    }
    line
}

/// One cause of resident anonymous memory in small pages, for the verdict.
fn small_part(code: ReasonCode, bytes: u64) -> String {
    let what = match code {
        ReasonCode::VmaNohugepage => "opted out by the application itself (MADV_NOHUGEPAGE)",
        ReasonCode::SysfsMadviseNotAdvised => "without MADV_HUGEPAGE under enabled=madvise",
        ReasonCode::SysfsNever => "refused by sysfs (never)",
        ReasonCode::VmaTooSmall => "in regions too small for a 2 MiB page",
        ReasonCode::VmaUnaligned => "in regions without an aligned 2 MiB window",
        ReasonCode::AllocFallback => "eligible, but the kernel fell back to small pages",
        ReasonCode::None => "eligible, but not (yet) in huge pages",
        _ => "refused",
    };
    format!("{} {what} ({})", format_bytes(bytes), code.as_str())
}

#[cfg(test)]
pub(crate) mod tests {
    use mm_probe_common::thp::Counter;

    use super::*;
    use crate::{
        kernel::Release,
        probes::{Outcome, ProbePlan},
        thp_why::{facts::vm_flags, procfs::parse_smaps, report::LiveCounter, sysfs::tests::sample_tree},
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
        let attached =
            Outcome::Attached { mechanism: "fexit".into(), target: "hugepage_vma_check".into(), caveat: None };
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
            report.verdict,
            "THP disabled for pid 4440 (usemem): MMF_DISABLE_THP set by prctl in ancestor 4321 (lkp run job.yaml), \
             inherited across fork/exec; 651 THP checks, 651 denied"
        );
        let first = &report.reasons[0];
        assert_eq!((first.code, first.count), (ReasonCode::PrctlThpDisable, Some(651)));
        assert_eq!(first.set_by.as_ref().unwrap().pid, 4321);
        assert!(report.fix[0].starts_with("start the workload outside that wrapper (4321 lkp)"), "{}", report.fix[0]);
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
            report.verdict,
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
        let smaps = smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg")
            + &smaps_entry(0x5555_0000_0000, 2048, 2048, 0, "");
        let report = build(inputs_with(&smaps, DisableMode::None, "6.18.44", "always [madvise] never"));
        assert!(
            report.verdict.starts_with(
                "pid 4440 (usemem): 64 MiB of 66 MiB resident anonymous memory is in huge pages (97 %); in small \
                 pages: 2 MiB without MADV_HUGEPAGE under enabled=madvise"
            ),
            "{}",
            report.verdict
        );
        assert!(!report.verdict.contains("no huge pages"), "{}", report.verdict);
        let only_huge = smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg");
        let report = build(inputs_with(&only_huge, DisableMode::None, "6.18.44", "always [madvise] never"));
        assert_eq!(
            report.verdict,
            "pid 4440 (usemem): 64 MiB of 64 MiB resident anonymous memory is in huge pages (100 %)"
        );
        assert!(report.fix.is_empty(), "{:?}", report.fix);
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
            report.verdict.ends_with(
                "in small pages: 4 MiB opted out by the application itself (MADV_NOHUGEPAGE) (vma_nohugepage)"
            ),
            "{}",
            report.verdict
        );
        for fix in report.fix.iter().chain([&nh.fix]) {
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
        assert!(report.verdict.ends_with("; 640 page faults, ~0 in huge pages"), "{}", report.verdict);
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
        assert!(report.verdict.ends_with("; 37 THP checks, 36 denied"), "{}", report.verdict);
    }

    #[test]
    fn prctl_caught_live_names_the_caller() {
        let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
        input.set_by = Some(SetBy { pid: 4440, comm: "usemem".into(), cmdline: String::new(), is_target: true });
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"usemem");
        input.prctl_events = vec![PrctlEvent { tgid: 4440, pid: 4441, arg2: 1, arg3: 0, mm_flags_before: 0, comm }];
        let report = build(input);
        assert!(report.verdict.contains("set by prctl in the process itself (caught live)"), "{}", report.verdict);
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
            report.verdict.starts_with("THP disabled for pid 4440 (usemem) except MADV_HUGEPAGE regions"),
            "{}",
            report.verdict
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
                .starts_with("THP unavailable for pid 4440 (usemem): this kernel has no transparent huge pages"),
            "{}",
            report.verdict
        );
        assert_eq!(report.reasons[0].code, ReasonCode::SysfsNever);
        assert!(report.fix[0].contains("CONFIG_TRANSPARENT_HUGEPAGE"), "{}", report.fix[0]);
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
        assert_eq!(
            (f.mode, f.source, f.mm_flags),
            (Some(DisableMode::ExceptAdvised), ModeSource::Kernel, Some(1 << 23))
        );
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
}
