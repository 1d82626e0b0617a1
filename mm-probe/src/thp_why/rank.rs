//! The reasons, ranked: every VMA's refusals gathered per reason code (VMAs, bytes, faults, live
//! denials), each with its detail and fix, process-wide causes first; and the fix of one region.

use std::collections::BTreeMap;

use super::{
    judge::Inputs,
    reasons::{DisableMode, ModeSource, ReasonCode},
    report::{LiveFacts, ReasonEntry, VmaClass, VmaEntry},
};
use crate::{kernel::layout::ThpDisableBits, units::format_bytes};

pub fn aggregate_reasons(input: &Inputs, vmas: &[VmaEntry], live: &LiveFacts) -> Vec<ReasonEntry> {
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
        eligible.detail = eligible_detail(vmas);
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
        fix: String::new(),
    })
}

/// The eligible VMAs together: how much of their resident anonymous memory is huge.
fn eligible_detail(vmas: &[VmaEntry]) -> String {
    let eligible: Vec<&VmaEntry> = vmas.iter().filter(|v| v.reasons.is_empty()).collect();
    let anon: Vec<&&VmaEntry> = eligible.iter().filter(|v| v.kind == VmaClass::Anon).collect();
    let resident: u64 = anon.iter().map(|v| v.anonymous_bytes).sum();
    let huge: u64 = anon.iter().map(|v| v.anon_huge_bytes).sum();
    format!(
        "eligible: {} of the {} resident anonymous memory of these {} VMAs is in huge pages",
        format_bytes(huge),
        format_bytes(resident),
        eligible.len()
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
        ReasonCode::None | ReasonCode::NoAnonVma => String::new(),
    }
}
