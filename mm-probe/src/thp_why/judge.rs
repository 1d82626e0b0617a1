//! From the gathered facts (`inputs`) to the report: the target's THP-disable mode and who set
//! it, every VMA judged, the live keys decoded (`decoder`), the reasons ranked (`rank`), and the
//! verdict: how much of the resident anonymous memory is in huge pages, and what keeps the rest
//! small. Pure functions of their inputs, so the whole judgement is tested without a kernel.

use std::collections::BTreeMap;

use mm_probe_common::thp::{FAULT_RANGE_SHIFT, MmSeen};

use super::words::count_of;
use super::{
    ancestry::{self, Ancestor, SetBy},
    checks::{AllowCheck, Call, Step},
    collapse::{self, Refusal},
    decoder::{attribute_faults, decode_live},
    facts::{VmaFacts, VmaKind},
    inputs::{DisableFacts, Inputs, prctl_calls},
    per_size,
    procfs::{Mount, Vma},
    rank::{aggregate_reasons, non_anonymous, present_advice, region_fix},
    reasons::{Context, Denial, DisableMode, ModeSource, NO_THP, ReasonCode, evaluate},
    report::{
        DisableBitsLayout, FaultFacts, KernelFacts, LiveFacts, ProcessFacts, Report, StoppedBy, SystemFacts, VmaClass,
        VmaEntry, VmaLive,
    },
    sysfs::SystemPolicy,
    verdict::{self, verdict_line},
};
use crate::{kernel::layout::ThpDisableBits, units::format_bytes};

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
            "{} where the kernel's THPeligible differs from mm-probe's judgement (see kernel_agrees): \
             something /proc does not show decides {} (read-only file THP, DAX, a driver's huge_fault, \
             or hardware-disabled THP)",
            count_of(disagreeing as u64, "VMA"),
            if disagreeing == 1 { "it" } else { "them" }
        ));
    }
    let faults = fault_facts(&input, &vmas);
    // Collapse first: the scans that failed on eligible regions are their reason.
    let collapse = collapse::judge(&input, &vmas);
    let refusal = Refusal::of(&collapse);
    if let Some(refusal) = &refusal {
        collapse::mark_refused(&mut vmas, refusal);
    }
    let reasons = aggregate_reasons(&input, &vmas, &live, refusal.as_ref());
    let line = verdict_line(&input, &vmas, &live, &faults, refusal.as_ref());
    let verdict = verdict::judge(line, &vmas, present_advice(&reasons));
    let sizes = per_size::judge(&input, &vmas);
    Report {
        pid: input.pid,
        comm: input.comm.clone(),
        cmdline: input.cmdline.clone(),
        verdict,
        reasons,
        non_anonymous: non_anonymous(&vmas),
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

#[cfg(test)]
#[path = "judge_tests.rs"]
pub(crate) mod tests;
