//! The reasons, ranked: every VMA's refusals gathered per reason code (live denials, and the
//! VMAs whose judgement includes each), and each anonymous VMA counted once more under the reason
//! that decides it, in resident anonymous bytes (the verdict's measure), so the table adds up to
//! the verdict; each reason with its detail and fix, process-wide causes first; the advice (the
//! fixes of the causes present); and the fix of one region.

use std::collections::BTreeMap;

use super::{
    collapse::Refusal,
    inputs::Inputs,
    reasons::{DisableMode, ModeSource, ReasonCode},
    report::{LiveFacts, NonAnonymous, ReasonEntry, VmaClass, VmaEntry},
    words::count_of,
};
use crate::{kernel::layout::ThpDisableBits, report::verdict::Advice, units::format_bytes};

/// Below one 2 MiB page of memory in small pages a cause costs nothing a huge page could win
/// back: its fix is not offered.
const HUGE_BYTES: u64 = 2 << 20;

pub fn aggregate_reasons(
    input: &Inputs,
    vmas: &[VmaEntry],
    live: &LiveFacts,
    refusal: Option<&Refusal>,
) -> Vec<ReasonEntry> {
    let observed = live.allow_check_observed;
    let mut by_code: BTreeMap<ReasonCode, ReasonEntry> = BTreeMap::new();
    for v in vmas {
        let codes: Vec<ReasonCode> = if v.reasons.is_empty() { vec![ReasonCode::None] } else { v.reasons.clone() };
        for code in codes.into_iter().filter(|c| c.is_public() && !(v.opted_out() && is_sysfs(*c))) {
            let e = reason_entry(&mut by_code, code, v.detail_of(code), observed);
            e.vmas += 1;
            e.bytes += v.size_bytes;
            e.faults += v.live.faults;
        }
        if v.kind == VmaClass::Anon {
            let code = v.blocking_reason();
            let e = reason_entry(&mut by_code, code, v.detail_of(code), observed);
            e.deciding_vmas += 1;
            e.resident_bytes += v.anonymous_bytes;
            e.small_bytes += v.small_anonymous_bytes();
        }
        for (code, n) in &v.live.denied_by {
            if code.is_public() {
                *reason_entry(&mut by_code, *code, v.detail_of(*code), observed).count.get_or_insert(0) += n;
            }
        }
    }
    for (code, n) in &live.denied_on_gone_vmas {
        if code.is_public() {
            let detail = "denied live on VMAs unmapped before the end of the run";
            *reason_entry(&mut by_code, *code, detail, observed).count.get_or_insert(0) += n;
        }
    }
    if let Some(eligible) = by_code.get_mut(&ReasonCode::None) {
        eligible.detail = eligible_detail(eligible);
    }
    if let (Some(refused), Some(refusal)) = (by_code.get_mut(&ReasonCode::CollapseRefused), refusal) {
        // Counted by the scan tracepoint, whether or not the allow-check was traced.
        refused.count = Some(refusal.failed);
    }
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let prctl_code = match mode {
        DisableMode::Completely => Some(ReasonCode::PrctlThpDisable),
        DisableMode::ExceptAdvised => Some(ReasonCode::PrctlThpDisableExceptAdvised),
        DisableMode::None => None,
    };
    if let Some(code) = prctl_code {
        let detail = prctl_detail(input, mode);
        let e = reason_entry(&mut by_code, code, &detail, observed);
        e.detail = detail;
        e.set_by = input.set_by.clone();
    }
    let mut reasons: Vec<ReasonEntry> = by_code.into_values().collect();
    for r in &mut reasons {
        r.fix = match (r.code, refusal) {
            (ReasonCode::CollapseRefused, Some(refusal)) => refusal.fix(),
            (code, _) => fix_for(code, input),
        };
    }
    // Process-wide first, then what the kernel refused live most often, then the most memory in
    // small pages (the verdict's measure), then the most memory at all.
    let rank = |r: &ReasonEntry| {
        (r.code.is_process_wide(), r.code != ReasonCode::None, r.count, r.small_bytes, r.resident_bytes, r.bytes)
    };
    reasons.sort_by_key(|r| std::cmp::Reverse(rank(r)));
    if !input.policy.thp_built_in {
        // Nothing else matters on a kernel without THP.
        reasons.sort_by_key(|r| r.code != ReasonCode::SysfsNever);
    }
    reasons
}

/// The advice: the fixes of the causes present, in the reasons' order, each with its evidence: a
/// process-wide cause, or one that keeps at least one 2 MiB page's worth of resident anonymous
/// memory in small pages. Nothing when all of it is huge (or what is not could not fill a huge
/// page).
pub fn present_advice(reasons: &[ReasonEntry]) -> Vec<Advice<ReasonCode>> {
    // The prctl holds for memory the process has yet to map as well.
    let prctl = |code| matches!(code, ReasonCode::PrctlThpDisable | ReasonCode::PrctlThpDisableExceptAdvised);
    reasons
        .iter()
        .filter(|r| r.code != ReasonCode::None && !r.fix.is_empty())
        .filter(|r| prctl(r.code) || (r.code.is_process_wide() && r.deciding_vmas > 0) || r.small_bytes >= HUGE_BYTES)
        .map(|r| Advice {
            cause: r.code,
            evidence: format!(
                "{} of resident anonymous memory in small pages, in {}: {}",
                format_bytes(r.small_bytes),
                count_of(r.deciding_vmas as u64, "VMA"),
                r.detail
            ),
            action: r.fix.clone(),
        })
        .collect()
}

/// The VMAs the deciding counts leave out, as the table's footnote says.
pub fn non_anonymous(vmas: &[VmaEntry]) -> NonAnonymous {
    let others = vmas.iter().filter(|v| v.kind != VmaClass::Anon);
    others.fold(NonAnonymous::default(), |acc, v| NonAnonymous {
        vmas: acc.vmas + 1,
        rss_bytes: acc.rss_bytes + v.rss_bytes,
    })
}

/// A sysfs refusal: of an opted-out region it is not what keeps it small (the opt-out stays when
/// sysfs allows), so the region is not counted for it and its fix is not offered there.
fn is_sysfs(code: ReasonCode) -> bool {
    matches!(code, ReasonCode::SysfsNever | ReasonCode::SysfsMadviseNotAdvised)
}

fn reason_entry<'a>(
    by_code: &'a mut BTreeMap<ReasonCode, ReasonEntry>,
    code: ReasonCode,
    detail: &str,
    observed: bool,
) -> &'a mut ReasonEntry {
    by_code.entry(code).or_insert_with(|| ReasonEntry {
        code,
        count: observed.then_some(0),
        detail: detail.to_string(),
        set_by: None,
        vmas: 0,
        bytes: 0,
        faults: 0,
        deciding_vmas: 0,
        resident_bytes: 0,
        small_bytes: 0,
        fix: String::new(),
    })
}

/// The anonymous VMAs nothing refuses, together: how much of their resident memory is huge.
fn eligible_detail(row: &ReasonEntry) -> String {
    let these =
        if row.deciding_vmas == 1 { "this VMA".to_string() } else { format!("these {} VMAs", row.deciding_vmas) };
    format!(
        "eligible: {} of the {} resident anonymous memory of {these} is in huge pages",
        format_bytes(row.resident_bytes - row.small_bytes),
        format_bytes(row.resident_bytes),
    )
}

fn prctl_detail(input: &Inputs, mode: DisableMode) -> String {
    let flag = match (mode, input.bits) {
        (DisableMode::ExceptAdvised, _) => "MMF_DISABLE_THP_EXCEPT_ADVISED",
        (_, ThpDisableBits::Split { .. }) => "MMF_DISABLE_THP_COMPLETELY",
        _ => "MMF_DISABLE_THP",
    };
    let source = match input.disable.source {
        ModeSource::Kernel => "read from mm->flags by eBPF",
        ModeSource::Status => "from /proc/PID/status THP_enabled: 0",
        ModeSource::Smaps => "inferred from smaps THPeligible",
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

const OPT_OUT_FIX: &str = "the application opted this region out itself (madvise(MADV_NOHUGEPAGE), or MAP_STACK on \
                           6.7+): drop that call, or madvise(MADV_HUGEPAGE) the region; no sysfs setting overrides it";

/// What would let one region have huge pages: the fix of the refusal that blocks it (see
/// [`VmaEntry::blocking_reason`]), worded for one region.
pub fn region_fix(v: &VmaEntry, input: &Inputs) -> String {
    match v.blocking_reason() {
        ReasonCode::VmaNohugepage => OPT_OUT_FIX.into(),
        ReasonCode::SysfsMadviseNotAdvised => "madvise(MADV_HUGEPAGE) this region, or set enabled=always".into(),
        code => fix_for(code, input),
    }
}

pub fn fix_for(code: ReasonCode, input: &Inputs) -> String {
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
        ReasonCode::VmaNohugepage => "these regions are the application's own opt-out: drop its \
             madvise(MADV_NOHUGEPAGE) (or MAP_STACK, which implies it on 6.7+) for them, or madvise(MADV_HUGEPAGE) \
             them; no sysfs setting overrides it"
            .into(),
        ReasonCode::SysfsNever if !input.policy.thp_built_in => "run a kernel built with \
             CONFIG_TRANSPARENT_HUGEPAGE (Debian's PREEMPT_RT kernels are built without it), or map \
             hugetlbfs pages (MAP_HUGETLB) where huge pages are needed"
            .into(),
        ReasonCode::SysfsNever => "echo madvise (or always) > /sys/kernel/mm/transparent_hugepage/enabled \
             (shmem: shmem_enabled)"
            .into(),
        ReasonCode::SysfsMadviseNotAdvised => "madvise(addr, len, MADV_HUGEPAGE) these regions, or set \
             enabled=always (echo always > /sys/kernel/mm/transparent_hugepage/enabled)"
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
        ReasonCode::CollapseRefused => "let khugepaged collapse it (see the Collapse section), or collapse it from \
             the application with madvise(MADV_COLLAPSE) (6.1+)"
            .into(),
        ReasonCode::None | ReasonCode::NoAnonVma => String::new(),
    }
}
