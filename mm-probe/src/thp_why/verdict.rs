//! From the gathered facts to the report: judge every VMA, decode every live allow-check key,
//! aggregate the reasons, pick the verdict and the fix. Pure functions of their inputs, so the
//! whole judgement is tested without a kernel.

use std::collections::BTreeMap;

use mm_probe_common::thp::{FAULT_RANGE_SHIFT, PrctlEvent, ThpCheckKey};
use serde::Serialize;

use super::{
    ancestry::{Ancestor, SetBy},
    checks::Step,
    checks::{AllowCheck, Call},
    procfs::{Mount, Vma},
    reasons::{Context, Denial, DisableMode, ReasonCode, VmaFacts, VmaKind, evaluate, vm_flags},
    sysfs::{GlobalMode, SystemPolicy},
};
use crate::{kernel::layout::ThpDisableBits, probes::Plan, units::format_bytes};

/// prctl arg3 flag of 6.18 (uapi prctl.h).
const PR_THP_DISABLE_EXCEPT_ADVISED: u64 = 1 << 1;

/// How the target's THP-disable mode was learned.
#[derive(Clone, Debug, Serialize)]
pub struct DisableFacts {
    pub mode: Option<DisableMode>,
    /// `kernel` (mm->flags read by eBPF), `status` (/proc/PID/status THP_enabled), or
    /// `smaps` (inferred from THPeligible where nothing else explains a refusal).
    pub source: &'static str,
    pub mm_flags: Option<u64>,
    pub status_thp_enabled: Option<bool>,
}

/// The live run's raw material.
pub struct LiveInput {
    pub plan: Plan,
    pub checks: Vec<(ThpCheckKey, u64)>,
    pub fault_ranges: Vec<(u64, u64)>,
    pub counters: BTreeMap<&'static str, u64>,
    pub duration_ns: u64,
    pub stopped_by: &'static str,
}

/// Everything `build` needs.
pub struct Inputs {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub kernel_release: String,
    pub allow_check: AllowCheck,
    pub bits: ThpDisableBits,
    pub policy: SystemPolicy,
    pub policy_changed: bool,
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

#[derive(Clone, Debug, Default, Serialize)]
pub struct CallCounts {
    pub checks: u64,
    pub denied: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VmaLive {
    pub checks: u64,
    pub denied: u64,
    pub by_call: BTreeMap<Call, CallCounts>,
    /// Live denials by decoded reason code.
    pub denied_by: BTreeMap<ReasonCode, u64>,
    pub faults: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VmaEntry {
    pub start: String,
    pub end: String,
    pub size_bytes: u64,
    pub kind: &'static str,
    pub name: String,
    pub stack: bool,
    pub aligned_2m_window: bool,
    pub hg: bool,
    pub nh: bool,
    pub vm_flags: String,
    pub thp_eligible: Option<bool>,
    pub anon_huge_bytes: u64,
    pub rss_bytes: u64,
    /// The first refusal in the kernel's order for this version (`none`: eligible).
    pub reason: ReasonCode,
    /// Every refusal, in the kernel's order (empty when eligible).
    pub reasons: Vec<ReasonCode>,
    pub detail: String,
    /// The first refusal happens in the 6.8+ inline wrapper, before the probed function.
    pub in_wrapper: bool,
    /// Whether the kernel's THPeligible matches this judgement (null: no THPeligible line).
    pub kernel_agrees: Option<bool>,
    pub live: VmaLive,
    #[serde(skip)]
    start_addr: u64,
    /// Not PROT_NONE: it can fault.
    #[serde(skip)]
    accessible: bool,
    /// The detail of each of `reasons`, same order.
    #[serde(skip)]
    details: Vec<String>,
}

impl VmaEntry {
    fn detail_of(&self, code: ReasonCode) -> &str {
        self.reasons.iter().position(|c| *c == code).and_then(|i| self.details.get(i)).map_or(&self.detail, |d| d)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ReasonEntry {
    pub code: ReasonCode,
    /// Live denials decoded to this reason (0 when the check is not observable here).
    pub count: u64,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_by: Option<SetBy>,
    /// VMAs whose judgement includes this reason, and their size.
    pub vmas: usize,
    pub bytes: u64,
    /// Page faults of the target in those VMAs during the run.
    pub faults: u64,
    pub fix: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct PrctlCall {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub arg2: u64,
    pub arg3: u64,
    /// `disable`, `disable_except_advised` or `enable`.
    pub effect: &'static str,
    /// `target`, `ancestor` or `other`.
    pub relation: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessFacts {
    pub thp_disable: Option<DisableMode>,
    pub source: &'static str,
    pub mm_flags: Option<String>,
    pub status_thp_enabled: Option<bool>,
    pub ancestors: Vec<Ancestor>,
    pub set_by: Option<SetBy>,
    pub prctl_calls: Vec<PrctlCall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FaultFacts {
    pub observed: bool,
    pub total: u64,
    /// Faults that got a PMD huge page: AnonHugePages growth per VMA over the run in 2 MiB
    /// units, capped by that VMA's faults (an estimate; the tracepoint does not say).
    pub in_huge_pages: u64,
    /// Distinct 2 MiB ranges the faults fell in.
    pub ranges: usize,
    pub thp_fault_alloc: i64,
    pub thp_fault_fallback: i64,
    pub thp_fault_fallback_charge: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemFacts {
    #[serde(flatten)]
    pub policy: SystemPolicy,
    /// thp_* counters of /proc/vmstat: change over the run (system-wide).
    pub vmstat_delta: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveFacts {
    pub duration_ns: u64,
    pub stopped_by: &'static str,
    pub allow_check_observed: bool,
    pub allow_check: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    pub checks: u64,
    pub denied: u64,
    pub by_call: BTreeMap<Call, CallCounts>,
    /// Denials the kernel's order of checks does not explain with what mm-probe sees.
    pub unexplained: u64,
    /// Allowed by the kernel but refused by the evaluation (a sign the model is off).
    pub disagreements: u64,
    /// khugepaged skipping never-faulted VMAs: not a reason for missing huge pages.
    pub benign_denials: u64,
    /// Checks on VMAs gone by the end of the run, and their denials by reason.
    pub gone_vmas: u64,
    pub denied_on_gone_vmas: BTreeMap<ReasonCode, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wrapper_note: Option<String>,
    pub counters: BTreeMap<&'static str, u64>,
    pub plan: Option<Plan>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelFacts {
    pub release: String,
    pub allow_check: AllowCheck,
    /// `single` (MMF_DISABLE_THP, bit 24) or `split` (6.18: COMPLETELY 24, EXCEPT_ADVISED 23).
    pub thp_disable_bits: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub verdict: String,
    pub reasons: Vec<ReasonEntry>,
    pub fix: Vec<String>,
    pub process: ProcessFacts,
    pub vmas: Vec<VmaEntry>,
    pub faults: FaultFacts,
    pub system: SystemFacts,
    pub live: LiveFacts,
    pub kernel: KernelFacts,
    pub notes: Vec<String>,
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

    let mut live = live_facts(&input);
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
    let verdict = verdict_line(&input, &vmas, &live, &faults, &reasons);
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
        kernel: KernelFacts {
            release: input.kernel_release.clone(),
            allow_check: input.allow_check.clone(),
            thp_disable_bits: match input.bits {
                ThpDisableBits::Single { .. } => "single",
                ThpDisableBits::Split { .. } => "split",
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

fn kind_label(kind: &VmaKind) -> &'static str {
    match kind {
        VmaKind::Anonymous => "anon",
        VmaKind::File => "file",
        VmaKind::Shmem { .. } => "shmem",
        VmaKind::Special { .. } => "special",
        VmaKind::Gate => "gate",
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
    let eligible = reasons.is_empty();
    if eligible {
        let pmd = ctx.policy.pmd_order();
        let orders = &eval.orders;
        detail = if facts.is_anonymous() && vma.anon_huge_kb > 0 {
            format!("eligible; {} in huge pages", format_bytes(vma.anon_huge_kb * 1024))
        } else if facts.is_anonymous() && !orders.is_empty() && !orders.contains(&pmd) {
            format!(
                "eligible for {} folios only (AnonHugePages counts PMD-mapped 2 MiB pages only)",
                orders.iter().map(|o| format_bytes(4096 << o)).collect::<Vec<_>>().join(", ")
            )
        } else if facts.is_anonymous() && vma.anonymous_kb * 1024 >= HUGE_BYTES && fallback_seen {
            let why = "eligible, but the kernel fell back to small pages (thp_fault_fallback grew during the run)";
            reasons.push(ReasonCode::AllocFallback);
            details.push(why.into());
            why.into()
        } else if facts.is_anonymous() && vma.anonymous_kb * 1024 >= HUGE_BYTES {
            "eligible, but no huge page is mapped: populated before THP was allowed, or in pieces; khugepaged \
             may collapse it later"
                .into()
        } else if detail.is_empty() {
            "eligible".into()
        } else {
            detail
        };
    }
    VmaEntry {
        start: format!("{:#x}", vma.start),
        end: format!("{:#x}", vma.end),
        size_bytes: vma.size_bytes(),
        kind: kind_label(&facts.kind),
        name: vma.name.clone(),
        stack: vma.name == "[stack]" || vma.has_flag("gd"),
        aligned_2m_window: VmaFacts { kind: VmaKind::Anonymous, ..facts.clone() }.fits_order(ctx.policy.pmd_order()),
        hg: facts.vm_hugepage,
        nh: facts.vm_nohugepage,
        vm_flags: vma.vm_flags.join(" "),
        thp_eligible: vma.thp_eligible,
        anon_huge_bytes: vma.anon_huge_kb * 1024,
        rss_bytes: vma.rss_kb * 1024,
        reason: reasons.first().copied().unwrap_or(ReasonCode::None),
        reasons,
        detail,
        in_wrapper,
        kernel_agrees,
        live: VmaLive::default(),
        start_addr: vma.start,
        accessible: !vma.perms.starts_with("---"),
        details,
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
    LiveFacts {
        duration_ns: input.live.as_ref().map_or(0, |l| l.duration_ns),
        stopped_by: input.live.as_ref().map_or("not_run", |l| l.stopped_by),
        allow_check_observed: observed,
        allow_check,
        why_not,
        checks: 0,
        denied: 0,
        by_call: BTreeMap::new(),
        unexplained: 0,
        disagreements: 0,
        benign_denials: 0,
        gone_vmas: 0,
        denied_on_gone_vmas: BTreeMap::new(),
        wrapper_note,
        counters: input.live.as_ref().map(|l| l.counters.clone()).unwrap_or_default(),
        plan,
    }
}

/// The facts of the VMA a key was counted on: the key's own (addresses, vm_flags) over what
/// smaps says about the VMA at that address (kind, file offset, faulted).
fn key_facts(key: &ThpCheckKey, vma: Option<&Vma>, mounts: &[Mount]) -> VmaFacts {
    let mut facts = match vma {
        Some(v) => VmaFacts::from_smaps(v, mounts),
        None => VmaFacts {
            start: key.vm_start,
            end: key.vm_end,
            pgoff: 0,
            kind: VmaKind::Anonymous,
            vm_hugepage: false,
            vm_nohugepage: false,
            special_flags: Vec::new(),
            has_anon_vma: true,
        },
    };
    facts.start = key.vm_start;
    facts.end = key.vm_end;
    facts.vm_hugepage = key.vm_flags & vm_flags::VM_HUGEPAGE != 0;
    facts.vm_nohugepage = key.vm_flags & vm_flags::VM_NOHUGEPAGE != 0;
    facts.special_flags =
        vm_flags::SPECIAL_MNEMONICS.iter().filter(|(_, bit)| key.vm_flags & bit != 0).map(|(m, _)| *m).collect();
    facts
}

/// The refusals a key counted system-wide cannot explain: it carries no VMA (size, alignment,
/// backing, anon_vma are not kept), only vm_flags, the mm's THP-disable flags and the caller.
pub const OTHER_REASON: &str = "other";

/// Whether a key counted on every mm (`THP_EVERY_MM`: no VMA addresses) was allowed, and the
/// reason code of a refusal: the first the kernel's order of checks gives from the key's own facts
/// and the sysfs policy, judged as an anonymous VMA that fits a huge page; a refusal only the
/// missing facts explain is [`OTHER_REASON`].
pub fn system_wide_outcome(
    allow_check: &AllowCheck,
    bits: ThpDisableBits,
    policy: &SystemPolicy,
    key: &ThpCheckKey,
) -> (bool, &'static str) {
    if allow_check.allowed(key.ret) {
        return (true, ReasonCode::None.as_str());
    }
    let Some(call) = allow_check.encoding.decode(key.call_args) else { return (false, OTHER_REASON) };
    let mut facts = key_facts(key, None, &[]);
    // One PMD-aligned huge page's worth, so that size and alignment refuse nothing.
    let pmd_bytes = 1u64 << (12 + policy.pmd_order());
    (facts.start, facts.end) = (pmd_bytes, 2 * pmd_bytes);
    let mm = DisableMode::from_mm_flags(bits, key.mm_flags);
    let ctx = Context { order: allow_check.order, policy, mm, past_wrapper: true };
    match evaluate(&ctx, call, &facts).first() {
        Some(denial) if denial.code != ReasonCode::NoAnonVma => (false, denial.code.as_str()),
        _ => (false, OTHER_REASON),
    }
}

/// Decodes every live key: who asked, allowed or not, and for denials the reason the kernel's
/// order gives for those facts (the wrapper let it through, or the function would not have run).
fn decode_live(input: &Inputs, li: &LiveInput, vmas: &mut [VmaEntry], live: &mut LiveFacts) {
    for (key, count) in &li.checks {
        let count = *count;
        let call = input.allow_check.encoding.decode(key.call_args);
        let allowed = input.allow_check.allowed(key.ret);
        live.checks += count;
        let slot = live.by_call.entry(call.unwrap_or(Call::Khugepaged)).or_default();
        slot.checks += count;
        if !allowed {
            live.denied += count;
            slot.denied += count;
        }
        let vma = input.vmas_end.iter().chain(&input.vmas_start).find(|v| v.start == key.vm_start);
        let entry = vmas.iter_mut().find(|v| v.start_addr == key.vm_start);
        if vma.is_none() {
            live.gone_vmas += count;
        }
        let facts = key_facts(key, vma, &input.mounts);
        let mm = DisableMode::from_mm_flags(input.bits, key.mm_flags);
        let ctx = Context { order: input.allow_check.order, policy: &input.policy, mm, past_wrapper: true };
        let eval = call.map(|c| evaluate(&ctx, c, &facts));
        let code = match (&eval, allowed) {
            (Some(e), false) => match e.first() {
                Some(d) if d.code == ReasonCode::NoAnonVma => {
                    live.benign_denials += count;
                    None
                }
                Some(d) => Some(d.code),
                None => {
                    live.unexplained += count;
                    None
                }
            },
            (None, false) => {
                live.unexplained += count;
                None
            }
            (Some(e), true) => {
                if !e.allowed() && !e.uncertain {
                    live.disagreements += count;
                }
                None
            }
            (None, true) => None,
        };
        if let Some(entry) = entry {
            entry.live.checks += count;
            let per_call = entry.live.by_call.entry(call.unwrap_or(Call::Khugepaged)).or_default();
            per_call.checks += count;
            if !allowed {
                entry.live.denied += count;
                per_call.denied += count;
                if let Some(code) = code {
                    *entry.live.denied_by.entry(code).or_default() += count;
                }
            }
        } else if let Some(code) = code {
            // The VMA is gone (unmapped during the run): its denials still count for the reason.
            *live.denied_on_gone_vmas.entry(code).or_default() += count;
        }
    }
}

/// Credits the faults counted per 64 KiB unit to the VMA they fell in: of the accessible VMAs
/// overlapping the unit, the one overlapping it most (a unit holding two VMAs' pages is credited
/// to one of them).
fn attribute_faults(ranges: &[(u64, u64)], vmas: &mut [VmaEntry]) {
    for &(unit, faults) in ranges {
        let lo = unit << FAULT_RANGE_SHIFT;
        let hi = lo + (1 << FAULT_RANGE_SHIFT);
        let overlap = |v: &VmaEntry| (v.start_addr + v.size_bytes).min(hi).saturating_sub(v.start_addr.max(lo));
        if let Some(v) = vmas.iter_mut().filter(|v| v.accessible && overlap(v) > 0).max_by_key(|v| overlap(v)) {
            v.live.faults += faults;
        }
    }
}

fn fault_facts(input: &Inputs, vmas: &[VmaEntry]) -> FaultFacts {
    let observed = input.live.as_ref().is_some_and(|l| l.plan.is_attached(super::probes::PAGE_FAULTS.name));
    let total = input.live.as_ref().map_or(0, |l| l.counters.get("faults").copied().unwrap_or(0));
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

fn prctl_effect(event: &PrctlEvent) -> &'static str {
    if event.arg2 == 0 {
        "enable"
    } else if event.arg3 & PR_THP_DISABLE_EXCEPT_ADVISED != 0 {
        "disable_except_advised"
    } else {
        "disable"
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
                "target"
            } else if input.ancestors.iter().any(|a| a.pid == e.tgid) {
                "ancestor"
            } else {
                "other"
            },
        })
        .collect()
}

pub fn comm_text(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// The prctl call caught live that explains the target's mode, if any: the target's own or an
/// ancestor's, the last one that set the mode the target has.
fn caught_prctl<'a>(input: &Inputs, calls: &'a [PrctlCall]) -> Option<&'a PrctlCall> {
    let want = match input.disable.mode? {
        DisableMode::Completely => "disable",
        DisableMode::ExceptAdvised => "disable_except_advised",
        DisableMode::None => return None,
    };
    calls.iter().rev().find(|c| c.effect == want && c.relation != "other")
}

fn aggregate_reasons(input: &Inputs, vmas: &[VmaEntry], live: &LiveFacts) -> Vec<ReasonEntry> {
    let mut by_code: BTreeMap<ReasonCode, ReasonEntry> = BTreeMap::new();
    for v in vmas {
        let codes: Vec<ReasonCode> = if v.reasons.is_empty() { vec![ReasonCode::None] } else { v.reasons.clone() };
        for code in codes.into_iter().filter(|c| c.is_public()) {
            let e = reason_entry(&mut by_code, code, v.detail_of(code));
            e.vmas += 1;
            e.bytes += v.size_bytes;
            e.faults += v.live.faults;
        }
        for (code, n) in &v.live.denied_by {
            if code.is_public() {
                reason_entry(&mut by_code, *code, v.detail_of(*code)).count += n;
            }
        }
    }
    for (code, n) in &live.denied_on_gone_vmas {
        if code.is_public() {
            reason_entry(&mut by_code, *code, "denied live on VMAs unmapped before the end of the run").count += n;
        }
    }
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let prctl_code = match mode {
        DisableMode::Completely => Some(ReasonCode::PrctlThpDisable),
        DisableMode::ExceptAdvised => Some(ReasonCode::PrctlThpDisableExceptAdvised),
        DisableMode::None => None,
    };
    if let Some(code) = prctl_code {
        let detail = prctl_detail(input, mode);
        let e = reason_entry(&mut by_code, code, &detail);
        e.detail = detail;
        e.set_by = input.set_by.clone();
    }
    let mut reasons: Vec<ReasonEntry> = by_code.into_values().collect();
    for r in &mut reasons {
        r.fix = fix_for(r.code, input);
    }
    // Process-wide first, then what the kernel refused live most often, then the most memory.
    reasons.sort_by(|a, b| {
        (b.code.is_process_wide(), a.code == ReasonCode::None, b.count, b.bytes).cmp(&(
            a.code.is_process_wide(),
            b.code == ReasonCode::None,
            a.count,
            a.bytes,
        ))
    });
    if !input.policy.thp_built_in {
        // Nothing else matters on a kernel without THP.
        reasons.sort_by_key(|r| r.code != ReasonCode::SysfsNever);
    }
    reasons
}

fn reason_entry<'a>(
    by_code: &'a mut BTreeMap<ReasonCode, ReasonEntry>,
    code: ReasonCode,
    detail: &str,
) -> &'a mut ReasonEntry {
    by_code.entry(code).or_insert_with(|| ReasonEntry {
        code,
        count: 0,
        detail: detail.to_string(),
        set_by: None,
        vmas: 0,
        bytes: 0,
        faults: 0,
        fix: String::new(),
    })
}

fn prctl_detail(input: &Inputs, mode: DisableMode) -> String {
    let flag = match (mode, input.bits) {
        (DisableMode::ExceptAdvised, _) => "MMF_DISABLE_THP_EXCEPT_ADVISED",
        (_, ThpDisableBits::Split { .. }) => "MMF_DISABLE_THP_COMPLETELY",
        _ => "MMF_DISABLE_THP",
    };
    let source = match input.disable.source {
        "kernel" => "read from mm->flags by eBPF",
        "status" => "from /proc/PID/status THP_enabled: 0",
        _ => "inferred from smaps THPeligible",
    };
    match &input.set_by {
        Some(s) if s.is_target => format!("{flag} set by prctl(PR_SET_THP_DISABLE) in the process itself ({source})"),
        Some(s) => format!(
            "{flag} set by prctl(PR_SET_THP_DISABLE) in ancestor {} ({}), inherited across fork/exec ({source})",
            s.pid,
            if s.cmdline.is_empty() { &s.comm } else { &s.cmdline }
        ),
        None => format!("{flag} set by prctl(PR_SET_THP_DISABLE) ({source})"),
    }
}

fn fix_for(code: ReasonCode, input: &Inputs) -> String {
    match code {
        ReasonCode::PrctlThpDisable => match &input.set_by {
            Some(s) if !s.is_target => format!(
                "start the workload outside that wrapper ({} {}), or call prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0) \
                 before exec; on 6.18 PR_THP_DISABLE_EXCEPT_ADVISED keeps madvised regions eligible",
                s.pid, s.comm
            ),
            _ => "remove the prctl(PR_SET_THP_DISABLE, 1, …) call or undo it with prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0); \
                  on 6.18 PR_THP_DISABLE_EXCEPT_ADVISED keeps madvised regions eligible"
                .into(),
        },
        ReasonCode::PrctlThpDisableExceptAdvised => "madvise(MADV_HUGEPAGE) the regions that should use huge pages, \
             or clear the mode with prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0) before exec"
            .into(),
        ReasonCode::VmaNohugepage => "drop madvise(MADV_NOHUGEPAGE) (or MAP_STACK, which implies it on 6.7+) for these \
             regions, or madvise(MADV_HUGEPAGE) them"
            .into(),
        ReasonCode::SysfsNever if !input.policy.thp_built_in => "run a kernel built with \
             CONFIG_TRANSPARENT_HUGEPAGE (Debian's PREEMPT_RT kernels are built without it), or map \
             hugetlbfs pages (MAP_HUGETLB) where huge pages are needed"
            .into(),
        ReasonCode::SysfsNever => "echo madvise (or always) > /sys/kernel/mm/transparent_hugepage/enabled \
             (shmem: shmem_enabled)"
            .into(),
        ReasonCode::SysfsMadviseNotAdvised => "madvise(addr, len, MADV_HUGEPAGE) these regions, or \
             echo always > /sys/kernel/mm/transparent_hugepage/enabled"
            .into(),
        ReasonCode::VmaTooSmall => "allocate in regions of at least 4 MiB (one arena instead of many small mmaps) so \
             an aligned 2 MiB window fits"
            .into(),
        ReasonCode::VmaUnaligned => "align the region to 2 MiB (mmap 2 MiB more and trim, or posix_memalign with \
             2 MiB alignment)"
            .into(),
        ReasonCode::SpecialVma => "nothing to fix: device, I/O, PFN-mapped and hugetlb mappings are not THP \
             candidates (hugetlb has its own huge pages)"
            .into(),
        ReasonCode::FileNotEligible => "file pages get huge pages only with CONFIG_READ_ONLY_THP_FOR_FS (read-only \
             executables) or on tmpfs mounted with huge=; use anonymous memory for data that must be huge"
            .into(),
        ReasonCode::AllocFallback => "the kernel found no free 2 MiB block (or the cgroup limit refused it, \
             thp_fault_fallback_charge): compact memory (echo 1 > /proc/sys/vm/compact_memory), use \
             defrag=defer+madvise with MADV_HUGEPAGE, or raise the memory.max of the cgroup"
            .into(),
        ReasonCode::None | ReasonCode::NoAnonVma => String::new(),
    }
}

fn verdict_line(
    input: &Inputs,
    vmas: &[VmaEntry],
    live: &LiveFacts,
    faults: &FaultFacts,
    reasons: &[ReasonEntry],
) -> String {
    let who = format!("pid {} ({})", input.pid, input.comm);
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let calls = prctl_calls(input);
    let caught = caught_prctl(input, &calls);
    let setter = match (&input.set_by, caught) {
        (_, Some(c)) if c.relation == "target" => " by prctl in the process itself (caught live)".to_string(),
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
        DisableMode::None => memory_verdict(&who, vmas, reasons),
    };
    if live.allow_check_observed {
        line.push_str(&format!("; {} THP checks, {} denied", live.checks, live.denied));
    } else if faults.observed && faults.total > 0 {
        // Without the allow-check probe (no kprobes, no trampolines) the faults still tell.
        line.push_str(&format!("; {} page faults, ~{} in huge pages", faults.total, faults.in_huge_pages));
    }
    line
}

/// Without a process-wide cause: what the anonymous memory (what THP is for) gets.
fn memory_verdict(who: &str, vmas: &[VmaEntry], reasons: &[ReasonEntry]) -> String {
    let anon: Vec<&VmaEntry> = vmas.iter().filter(|v| v.kind == "anon" || v.kind == "shmem").collect();
    let weight = |v: &VmaEntry| if v.rss_bytes > 0 { v.rss_bytes } else { v.size_bytes };
    let total: u64 = anon.iter().map(|v| weight(v)).sum();
    let huge: u64 = anon.iter().map(|v| v.anon_huge_bytes).sum();
    let mut refused: BTreeMap<ReasonCode, u64> = BTreeMap::new();
    for v in anon.iter().filter(|v| v.reason != ReasonCode::None) {
        *refused.entry(v.reason).or_default() += weight(v);
    }
    let refused_total: u64 = refused.values().sum();
    match refused.iter().max_by_key(|(_, b)| **b) {
        Some((code, _)) if refused_total > 0 => {
            let detail = reasons.iter().find(|r| r.code == *code).map(|r| r.detail.as_str()).unwrap_or("");
            format!(
                "{who} gets no huge pages for {} of its {} of anonymous memory; mostly {} ({detail}); {} in huge pages",
                format_bytes(refused_total),
                format_bytes(total),
                code.as_str(),
                format_bytes(huge)
            )
        }
        _ if huge > 0 => format!(
            "THP in use by {who}: {} of {} anonymous memory in huge pages",
            format_bytes(huge),
            format_bytes(total)
        ),
        _ => format!(
            "THP allowed for {who}, but none of its {} of anonymous memory is in huge pages yet",
            format_bytes(total)
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        kernel::Release,
        thp_why::{procfs::parse_smaps, sysfs::tests::sample_tree},
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

    pub(crate) fn inputs(mode: DisableMode, release: &str, enabled: &str) -> Inputs {
        let tree = sample_tree(enabled, "always [inherit] madvise never", "always inherit madvise [never]");
        let vmas = parse_smaps(SMAPS);
        let allow_check = AllowCheck::from_release(&Release::parse(release, ""));
        Inputs {
            pid: 4440,
            comm: "usemem".into(),
            cmdline: "usemem 64m".into(),
            kernel_release: release.into(),
            allow_check,
            bits: ThpDisableBits::Single { disable: 24 },
            policy: SystemPolicy::read_from(tree.path()),
            policy_changed: false,
            vmstat_start: BTreeMap::new(),
            vmstat_end: BTreeMap::new(),
            vmas_start: vmas.clone(),
            vmas_end: vmas,
            mounts: Vec::new(),
            disable: DisableFacts {
                mode: Some(mode),
                source: "kernel",
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

    fn key(start: u64, end: u64, flags: u64, mm_flags: u64, ret: u64, args: [u8; 4]) -> ThpCheckKey {
        ThpCheckKey { vm_start: start, vm_end: end, vm_flags: flags, mm_flags, ret, call_args: args, _pad: 0 }
    }

    fn live(checks: Vec<(ThpCheckKey, u64)>) -> LiveInput {
        use crate::probes::{Outcome, ProbePlan};
        let plan = Plan {
            probes: vec![ProbePlan {
                probe: super::super::probes::ALLOW_CHECK.name,
                purpose: "",
                outcome: Outcome::Attached {
                    mechanism: "fexit".into(),
                    target: "hugepage_vma_check".into(),
                    caveat: None,
                },
                failed_attempts: Vec::new(),
            }],
        };
        LiveInput {
            plan,
            checks,
            fault_ranges: vec![(0x7f0000000000 >> FAULT_RANGE_SHIFT, 600), (0x7f0000ff0000 >> FAULT_RANGE_SHIFT, 40)],
            counters: BTreeMap::new(),
            duration_ns: 5_000_000_000,
            stopped_by: "duration",
        }
    }

    /// thp-why's two JSON lines with a live window, a setter and denials (the host has no
    /// allow-check hook; the guests do), against their schemas.
    #[test]
    fn the_json_lines_of_a_live_run_match_their_schemas() {
        let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
        input.live = Some(live(vec![(key(0x7f0000000000, 0x7f0004000000, 0, 1 << 24, 0, [0, 1, 1, 0]), 651)]));
        let report = build(input);
        assert!(report.live.plan.is_some() && report.live.checks > 0, "{:?}", report.live);
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
        assert_eq!((first.code, first.count), (ReasonCode::PrctlThpDisable, 651));
        assert_eq!(first.set_by.as_ref().unwrap().pid, 4321);
        assert!(report.fix[0].starts_with("start the workload outside that wrapper (4321 lkp)"), "{}", report.fix[0]);
        assert_eq!(report.live.by_call[&Call::PageFault].denied, 651);
        assert_eq!(report.live.unexplained, 0);
        let big = &report.vmas[0];
        assert_eq!((big.size_bytes, big.live.denied, big.live.faults), (64 << 20, 651, 640));
        assert_eq!(big.live.denied_by[&ReasonCode::PrctlThpDisable], 651);
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
        assert!(report.verdict.contains("gets no huge pages for 65 MiB of its 69 MiB"), "{}", report.verdict);
        assert!(report.verdict.contains("sysfs_madvise_not_advised"), "{}", report.verdict);
        let codes: Vec<ReasonCode> = report.reasons.iter().map(|r| r.code).collect();
        assert_eq!(codes, [ReasonCode::SysfsMadviseNotAdvised, ReasonCode::VmaTooSmall, ReasonCode::None]);
        assert!(report.live.why_not.as_deref() == Some("--duration 0s"));
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
        assert_eq!((report.live.checks, report.live.denied), (37, 36));
        assert_eq!((report.live.unexplained, report.live.disagreements, report.live.gone_vmas), (0, 0, 2));
        let count = |code| report.reasons.iter().find(|r| r.code == code).map(|r| r.count);
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
        assert_eq!(report.process.prctl_calls[0].relation, "target");
        assert_eq!(report.process.prctl_calls[0].effect, "disable");
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
        assert_eq!(report.faults.thp_fault_fallback, 32);
    }

    #[test]
    fn system_wide_keys_get_the_reason_their_own_facts_give() {
        let input = inputs(DisableMode::None, "6.1.0-57-amd64", "always [madvise] never");
        let outcome = |k: ThpCheckKey| system_wide_outcome(&input.allow_check, input.bits, &input.policy, &k);
        // Keys counted on every mm carry no addresses (THP_EVERY_MM).
        assert_eq!(outcome(key(0, 0, 0, 0, 1, [0, 1, 1, 0])), (true, "none"));
        assert_eq!(outcome(key(0, 0, 0, 0, 0, [0, 1, 1, 0])), (false, "sysfs_madvise_not_advised"));
        assert_eq!(outcome(key(0, 0, vm_flags::VM_NOHUGEPAGE, 0, 0, [0, 1, 1, 0])), (false, "vma_nohugepage"));
        assert_eq!(outcome(key(0, 0, 0, 1 << 24, 0, [0, 1, 1, 0])), (false, "prctl_thp_disable"));
        // Advised, nothing in the key refuses it: the VMA's size or backing did, which a
        // system-wide key does not carry.
        assert_eq!(outcome(key(0, 0, vm_flags::VM_HUGEPAGE, 0, 0, [0, 0, 1, 0])), (false, OTHER_REASON));
    }
}
