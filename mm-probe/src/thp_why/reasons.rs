//! Why a VMA is or is not allowed a transparent huge page: the facts of one VMA (`facts.rs`: from
//! smaps, or from a live allow-check key) walked through the kernel's order of checks for the
//! running version (`checks.rs`). Every failing check is kept, in order: the first is what the kernel
//! returned on, the rest would refuse it next.

use serde::Serialize;

use super::{
    checks::{Call, Step},
    facts::{PAGE_SHIFT, VmaFacts, VmaKind},
    sysfs::{GlobalMode, SystemPolicy},
};
use crate::{
    kernel::layout::ThpDisableBits,
    report::verdict::{self, named},
};

named! {
    /// The metric the verdict judges.
    pub enum Metric {
        SmallShare => "small_share",
    }
}

/// thp-why's verdict: its metric, and its advice by reason code.
pub type Verdict = verdict::Verdict<Metric, ReasonCode>;

/// The stable reason codes of `thp-why --json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    PrctlThpDisable,
    PrctlThpDisableExceptAdvised,
    VmaNohugepage,
    SysfsNever,
    SysfsMadviseNotAdvised,
    VmaTooSmall,
    VmaUnaligned,
    SpecialVma,
    FileNotEligible,
    AllocFallback,
    /// Eligible, but khugepaged (or the process's MADV_COLLAPSE) scanned it during the run and
    /// failed to collapse it (exceed_none_pte and the like): not an allow-check refusal, a
    /// collapse one, counted from the scan results.
    CollapseRefused,
    /// Eligible; THP is being used (or may be).
    None,
    /// Internal: khugepaged/collapse skip a VMA never faulted (no anon_vma). Harmless and not
    /// a reason a process lacks huge pages, so it never appears in the public `reasons` list.
    NoAnonVma,
}

impl ReasonCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::PrctlThpDisable => "prctl_thp_disable",
            ReasonCode::PrctlThpDisableExceptAdvised => "prctl_thp_disable_except_advised",
            ReasonCode::VmaNohugepage => "vma_nohugepage",
            ReasonCode::SysfsNever => "sysfs_never",
            ReasonCode::SysfsMadviseNotAdvised => "sysfs_madvise_not_advised",
            ReasonCode::VmaTooSmall => "vma_too_small",
            ReasonCode::VmaUnaligned => "vma_unaligned",
            ReasonCode::SpecialVma => "special_vma",
            ReasonCode::FileNotEligible => "file_not_eligible",
            ReasonCode::AllocFallback => "alloc_fallback",
            ReasonCode::CollapseRefused => "collapse_refused",
            ReasonCode::None => "none",
            ReasonCode::NoAnonVma => "no_anon_vma",
        }
    }

    pub fn is_public(self) -> bool {
        self != ReasonCode::NoAnonVma
    }

    /// Applies to every VMA of the process (or of the system), not to one region.
    pub fn is_process_wide(self) -> bool {
        matches!(self, ReasonCode::PrctlThpDisable | ReasonCode::PrctlThpDisableExceptAdvised | ReasonCode::SysfsNever)
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The mm's THP-disable mode (prctl(PR_SET_THP_DISABLE)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisableMode {
    None,
    /// MMF_DISABLE_THP (≤6.17) or MMF_DISABLE_THP_COMPLETELY (6.18+).
    Completely,
    /// 6.18+: MMF_DISABLE_THP_EXCEPT_ADVISED: only MADV_HUGEPAGE regions may use THP.
    ExceptAdvised,
}

impl DisableMode {
    /// Decodes mm->flags with this kernel's bit meanings (bit 23 is not THP-related before 6.18).
    pub fn from_mm_flags(bits: ThpDisableBits, flags: u64) -> Self {
        match bits {
            ThpDisableBits::Single { disable } => {
                if flags & (1 << disable) != 0 {
                    DisableMode::Completely
                } else {
                    DisableMode::None
                }
            }
            ThpDisableBits::Split { completely, except_advised } => {
                if flags & (1 << completely) != 0 {
                    DisableMode::Completely
                } else if flags & (1 << except_advised) != 0 {
                    DisableMode::ExceptAdvised
                } else {
                    DisableMode::None
                }
            }
        }
    }

    /// The mm->flags bits that carry the mode on this kernel.
    pub fn mask(bits: ThpDisableBits) -> u64 {
        match bits {
            ThpDisableBits::Single { disable } => 1 << disable,
            ThpDisableBits::Split { completely, except_advised } => (1 << completely) | (1 << except_advised),
        }
    }
}

/// Where a process's THP-disable mode was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSource {
    /// mm->flags read by a kernel program.
    Kernel,
    /// /proc/PID/status THP_enabled.
    Status,
    /// Inferred from smaps THPeligible where nothing else explains a refusal.
    Smaps,
}

impl ModeSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ModeSource::Kernel => "kernel",
            ModeSource::Status => "status",
            ModeSource::Smaps => "smaps",
        }
    }
}

/// One refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub code: ReasonCode,
    pub step: Step,
    /// Refused by the 6.8+ inline wrapper, before the function a probe can see.
    pub in_wrapper: bool,
    pub detail: String,
}

/// The outcome of walking one VMA through the checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Every failing check, in the kernel's order.
    pub denials: Vec<Denial>,
    /// Page orders allowed when nothing refused (the PMD order is 9 on x86-64).
    pub orders: Vec<u32>,
    /// The kernel's answer depends on something /proc does not show (read-only file THP,
    /// ->huge_fault): smaps' THPeligible should decide.
    pub uncertain: bool,
}

impl Evaluation {
    pub fn allowed(&self) -> bool {
        self.denials.is_empty()
    }

    pub fn first(&self) -> Option<&Denial> {
        self.denials.first()
    }

    pub fn codes(&self) -> Vec<ReasonCode> {
        let mut codes: Vec<ReasonCode> = Vec::new();
        for d in &self.denials {
            if !codes.contains(&d.code) {
                codes.push(d.code);
            }
        }
        codes
    }
}

/// The environment of a check.
pub struct Context<'a> {
    pub order: &'a [Step],
    pub policy: &'a SystemPolicy,
    pub mm: DisableMode,
    /// The probed function ran, so the wrapper let the call through: skip `WrapperAnonSysfs`.
    pub past_wrapper: bool,
}

/// Walks `vma` through the kernel's checks for `call`.
pub fn evaluate(ctx: &Context, call: Call, vma: &VmaFacts) -> Evaluation {
    let policy = ctx.policy;
    let pmd = policy.pmd_order();
    let mut eval = Evaluation::default();
    // Orders still in play: anonymous VMAs may use every size with a control (6.8+; the wrapper
    // masks them, or already did when the probed function ran), others only the PMD size.
    let has_sizes = ctx.order.contains(&Step::WrapperAnonSysfs);
    let mut orders: Vec<u32> = match (vma.is_anonymous() && has_sizes, ctx.past_wrapper) {
        (true, false) => policy.anon_orders(),
        (true, true) => {
            Some(policy.anon_orders_allowed(vma.vm_hugepage)).filter(|o| !o.is_empty()).unwrap_or(vec![pmd])
        }
        (false, _) => vec![pmd],
    };
    let deny = |eval: &mut Evaluation, code, step, detail: String| {
        eval.denials.push(Denial { code, step, in_wrapper: step == Step::WrapperAnonSysfs, detail })
    };
    for &step in ctx.order {
        match step {
            Step::WrapperAnonSysfs => {
                if ctx.past_wrapper || !vma.is_anonymous() || !call.enforce_sysfs() {
                    continue;
                }
                let allowed = policy.anon_orders_allowed(vma.vm_hugepage);
                orders.retain(|o| allowed.contains(o));
                if orders.is_empty() {
                    let (code, why) = sysfs_refusal(policy, vma.vm_hugepage);
                    deny(
                        &mut eval,
                        code,
                        step,
                        format!(
                            "{why}; refused in the inline wrapper thp_vma_allowable_orders() before the probed function \
                         (derived from sysfs and vm_flags, not seen live)"
                        ),
                    );
                    // Later checks are judged for the PMD size, as if sysfs allowed it.
                    orders = vec![pmd];
                }
            }
            Step::NoMm => {
                if vma.kind == VmaKind::Gate {
                    deny(&mut eval, ReasonCode::SpecialVma, step, "the gate VMA [vsyscall] has no mm".into());
                    return eval;
                }
            }
            Step::NoHugepageFlag => {
                if vma.vm_nohugepage {
                    deny(
                        &mut eval,
                        ReasonCode::VmaNohugepage,
                        step,
                        "VM_NOHUGEPAGE: the application's own opt-out (madvise(MADV_NOHUGEPAGE), or MAP_STACK on 6.7+)"
                            .into(),
                    );
                }
            }
            Step::MmfDisable => {
                if ctx.mm == DisableMode::Completely {
                    deny(
                        &mut eval,
                        ReasonCode::PrctlThpDisable,
                        step,
                        "MMF_DISABLE_THP set on the process by prctl(PR_SET_THP_DISABLE)".into(),
                    );
                }
            }
            Step::MmfExceptAdvised => {
                if ctx.mm == DisableMode::ExceptAdvised && !vma.vm_hugepage && call != Call::ForcedCollapse {
                    deny(
                        &mut eval,
                        ReasonCode::PrctlThpDisableExceptAdvised,
                        step,
                        "MMF_DISABLE_THP_EXCEPT_ADVISED set by prctl and the region has no MADV_HUGEPAGE".into(),
                    );
                }
            }
            Step::SpecialAllCallers | Step::SpecialKhugepagedOnly => {
                let applies = step == Step::SpecialAllCallers || (!call.in_pf() && !call.smaps());
                if applies && !vma.special_flags.is_empty() {
                    deny(
                        &mut eval,
                        ReasonCode::SpecialVma,
                        step,
                        format!("special mapping (VmFlags {})", vma.special_flags.join(" ")),
                    );
                }
            }
            Step::SizeAlignment => {
                if call.in_pf() {
                    continue;
                }
                // The kernel keeps only the largest order that fits.
                match orders.iter().rev().find(|&&o| vma.fits_order(o)) {
                    Some(&o) => orders = vec![o],
                    None => {
                        let (code, detail) = size_refusal(vma, pmd);
                        deny(&mut eval, code, step, detail);
                    }
                }
            }
            Step::Shmem => {
                if let VmaKind::Shmem { internal, tmpfs_huge } = &vma.kind
                    && !call.in_pf()
                {
                    if let Some((code, detail)) = shmem_refusal(policy, *internal, tmpfs_huge.as_deref(), vma, call) {
                        deny(&mut eval, code, step, detail);
                    }
                    break;
                }
            }
            Step::SysfsGlobal => {
                // shmem VMAs outside faults returned at `Shmem` already.
                if call.enforce_sysfs()
                    && let Some((code, why)) = global_refusal(policy, vma.vm_hugepage)
                {
                    deny(&mut eval, code, step, why);
                }
            }
            Step::FileThp => {
                // CONFIG_READ_ONLY_THP_FOR_FS (off in Debian) with VM_EXEC: not visible in /proc.
                if matches!(vma.kind, VmaKind::File) && !call.in_pf() {
                    eval.uncertain = true;
                }
            }
            Step::NotAnonymous => {
                if !vma.is_anonymous() {
                    deny(&mut eval, non_anonymous_code(vma), step, non_anonymous_detail(vma));
                    break;
                }
            }
            Step::NonAnonymous => {
                if vma.is_anonymous() {
                    continue;
                }
                if call.enforce_sysfs()
                    && let Some((code, why)) = global_refusal(policy, vma.vm_hugepage)
                {
                    deny(&mut eval, code, step, why);
                }
                // ->huge_fault (DAX, some drivers) or read-only file THP could still allow it.
                eval.uncertain = true;
                deny(&mut eval, non_anonymous_code(vma), step, non_anonymous_detail(vma));
                break;
            }
            Step::NoAnonVma => {
                if matches!(call, Call::Khugepaged | Call::ForcedCollapse) && !vma.has_anon_vma {
                    deny(&mut eval, ReasonCode::NoAnonVma, step, "never faulted yet (no anon_vma)".into());
                }
            }
        }
    }
    if eval.denials.is_empty() {
        eval.orders = orders;
    }
    eval
}

fn sysfs_refusal(policy: &SystemPolicy, vm_hugepage: bool) -> (ReasonCode, String) {
    let global = policy.enabled.map(|m| format!("{m:?}").to_lowercase()).unwrap_or_else(|| "absent".into());
    if !vm_hugepage && !policy.anon_orders_allowed(true).is_empty() {
        (
            ReasonCode::SysfsMadviseNotAdvised,
            format!("transparent_hugepage/enabled is {global} and the region has no MADV_HUGEPAGE"),
        )
    } else {
        (ReasonCode::SysfsNever, format!("transparent_hugepage/enabled is {global} and no size is enabled"))
    }
}

/// ≤6.7 (every non-shmem VMA) and 6.8+ (non-anonymous ones): the global mode.
fn global_refusal(policy: &SystemPolicy, vm_hugepage: bool) -> Option<(ReasonCode, String)> {
    match policy.enabled {
        None | Some(GlobalMode::Never) => {
            Some((ReasonCode::SysfsNever, "transparent_hugepage/enabled is never".into()))
        }
        Some(GlobalMode::Madvise) if !vm_hugepage => Some((
            ReasonCode::SysfsMadviseNotAdvised,
            "transparent_hugepage/enabled is madvise and the region has no MADV_HUGEPAGE".into(),
        )),
        _ => None,
    }
}

fn size_refusal(vma: &VmaFacts, pmd: u32) -> (ReasonCode, String) {
    let pmd_size = 1u64 << (PAGE_SHIFT + pmd);
    let size = crate::units::format_bytes(vma.size_bytes());
    if vma.size_bytes() < pmd_size {
        (
            ReasonCode::VmaTooSmall,
            format!("{size} is smaller than one {} huge page", crate::units::format_bytes(pmd_size)),
        )
    } else if !vma.is_anonymous() && vma.fits_order_ignoring_offset(pmd) {
        (
            ReasonCode::VmaUnaligned,
            format!("the file offset is not aligned to {} for this address", crate::units::format_bytes(pmd_size)),
        )
    } else {
        (
            ReasonCode::VmaUnaligned,
            format!(
                "{size} but no {}-aligned {} window inside [{:#x}, {:#x})",
                crate::units::format_bytes(pmd_size),
                crate::units::format_bytes(pmd_size),
                vma.start,
                vma.end
            ),
        )
    }
}

/// shmem_is_huge() / shmem_allowable_huge_orders(): the internal mount follows shmem_enabled,
/// a tmpfs mount its huge= option; `deny` and `force` override both.
fn shmem_refusal(
    policy: &SystemPolicy,
    internal: bool,
    tmpfs_huge: Option<&str>,
    vma: &VmaFacts,
    call: Call,
) -> Option<(ReasonCode, String)> {
    let sysfs = policy.shmem_pmd_choice().unwrap_or_else(|| "never".into());
    if !call.enforce_sysfs() || sysfs == "force" {
        return None;
    }
    if sysfs == "deny" {
        return Some((ReasonCode::SysfsNever, "shmem: transparent_hugepage/shmem_enabled is deny".into()));
    }
    let (setting, source) = if internal {
        (sysfs.as_str(), "transparent_hugepage/shmem_enabled")
    } else {
        (tmpfs_huge.unwrap_or("never"), "the tmpfs mount option huge=")
    };
    match setting {
        "always" | "within_size" => None,
        "advise" if vma.vm_hugepage => None,
        "advise" => Some((
            ReasonCode::SysfsMadviseNotAdvised,
            format!("shmem: {source} is advise and the region has no MADV_HUGEPAGE"),
        )),
        _ if internal => Some((ReasonCode::SysfsNever, format!("shmem: {source} is {setting}"))),
        _ => Some((ReasonCode::FileNotEligible, format!("tmpfs file: {source} is {setting}"))),
    }
}

fn non_anonymous_code(vma: &VmaFacts) -> ReasonCode {
    match vma.kind {
        VmaKind::Special { .. } | VmaKind::Gate => ReasonCode::SpecialVma,
        _ if !vma.special_flags.is_empty() => ReasonCode::SpecialVma,
        _ => ReasonCode::FileNotEligible,
    }
}

fn non_anonymous_detail(vma: &VmaFacts) -> String {
    match &vma.kind {
        VmaKind::Special { name } => format!("special mapping {name}"),
        _ if !vma.special_flags.is_empty() => format!("special mapping (VmFlags {})", vma.special_flags.join(" ")),
        _ => "file-backed: page cache THP needs CONFIG_READ_ONLY_THP_FOR_FS (read-only executable files) or a \
              filesystem with large folios"
            .into(),
    }
}

pub(super) const NO_THP: &str = "this kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE is off: \
                      /sys/kernel/mm/transparent_hugepage does not exist)";

#[cfg(test)]
#[path = "reasons_tests.rs"]
mod tests;
