//! The live keys decoded: each allow-check key the kernel program counted becomes who asked,
//! whether it was allowed, and for a denial the reason the kernel's order of checks gives for
//! the key's facts; each 64 KiB unit of faults is credited to its VMA.

use mm_probe_common::thp::{FAULT_RANGE_SHIFT, ThpCheckKey};

use super::{
    checks::{AllowCheck, Call},
    facts::{VmaFacts, VmaKind, vm_flags},
    inputs::{Inputs, LiveInput},
    procfs::{Mount, Vma},
    reasons::{Context, DisableMode, ReasonCode, evaluate},
    report::{LiveFacts, VmaEntry},
    sysfs::SystemPolicy,
};
use crate::kernel::layout::ThpDisableBits;

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

fn add(slot: &mut Option<u64>, n: u64) {
    *slot.get_or_insert(0) += n;
}

/// What one key says: its reason code when denied for a reason the model explains, counting
/// benign, unexplained and disagreeing keys on the way.
fn key_reason(
    input: &Inputs,
    key: &ThpCheckKey,
    vma: Option<&Vma>,
    count: u64,
    live: &mut LiveFacts,
) -> Option<ReasonCode> {
    let call = input.allow_check.encoding.decode(key.call_args);
    let allowed = input.allow_check.allowed(key.ret);
    let facts = key_facts(key, vma, &input.mounts);
    let mm = DisableMode::from_mm_flags(input.bits, key.mm_flags);
    // The probed function ran, so the wrapper let the call through.
    let ctx = Context { order: input.allow_check.order, policy: &input.policy, mm, past_wrapper: true };
    let eval = call.map(|c| evaluate(&ctx, c, &facts));
    match (&eval, allowed) {
        (Some(e), false) => match e.first() {
            Some(d) if d.code == ReasonCode::NoAnonVma => {
                add(&mut live.benign_denials, count);
                None
            }
            Some(d) => Some(d.code),
            None => {
                add(&mut live.unexplained, count);
                None
            }
        },
        (None, false) => {
            add(&mut live.unexplained, count);
            None
        }
        (Some(e), true) => {
            if !e.allowed() && !e.uncertain {
                add(&mut live.disagreements, count);
            }
            None
        }
        (None, true) => None,
    }
}

/// Decodes every live key: who asked, allowed or not, and for denials the reason the kernel's
/// order gives for those facts (the wrapper let it through, or the function would not have run).
pub fn decode_live(input: &Inputs, li: &LiveInput, vmas: &mut [VmaEntry], live: &mut LiveFacts) {
    for (key, count) in &li.checks {
        let count = *count;
        let call = input.allow_check.encoding.decode(key.call_args).unwrap_or(Call::Khugepaged);
        let allowed = input.allow_check.allowed(key.ret);
        add(&mut live.checks, count);
        let slot = live.by_call.entry(call).or_default();
        slot.checks += count;
        if !allowed {
            add(&mut live.denied, count);
            slot.denied += count;
        }
        let vma = input.vmas_end.iter().chain(&input.vmas_start).find(|v| v.start == key.vm_start);
        if vma.is_none() {
            add(&mut live.gone_vmas, count);
        }
        let code = key_reason(input, key, vma, count, live);
        if let Some(entry) = vmas.iter_mut().find(|v| v.start_addr == key.vm_start) {
            add(&mut entry.live.checks, count);
            let per_call = entry.live.by_call.entry(call).or_default();
            per_call.checks += count;
            if !allowed {
                add(&mut entry.live.denied, count);
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
pub fn attribute_faults(ranges: &[(u64, u64)], vmas: &mut [VmaEntry]) {
    for &(unit, faults) in ranges {
        let lo = unit << FAULT_RANGE_SHIFT;
        let hi = lo + (1 << FAULT_RANGE_SHIFT);
        let overlap = |v: &VmaEntry| (v.start_addr + v.size_bytes).min(hi).saturating_sub(v.start_addr.max(lo));
        if let Some(v) = vmas.iter_mut().filter(|v| v.accessible && overlap(v) > 0).max_by_key(|v| overlap(v)) {
            v.live.faults += faults;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thp_why::judge::tests::{inputs, key};

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
