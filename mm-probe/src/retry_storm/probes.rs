//! The kernel hooks retry-storm uses, best first. None of these functions has a tracepoint
//! upstream (docs/kernel-facts.md#mmu-notifier: no `mmu_notifier:*` events in 5.15 → 6.18), so each has a
//! fentry/fexit candidate and a kprobe/kretprobe fallback; KVM's own tracepoints add the
//! secondary-MMU view where kvm is loaded.

use crate::{
    candidate,
    probes::{Candidate, Hook, LogicalProbe, Mechanism, Target},
};

const HMM_RANGE_FAULT: &[Target] = &[Target { name: "hmm_range_fault", kernels: "5.8+, CONFIG_HMM_MIRROR" }];
const READ_BEGIN: &[Target] = &[Target { name: "mmu_interval_read_begin", kernels: "5.10+, CONFIG_MMU_NOTIFIER" }];
const NOTIFIER_REMOVE: &[Target] =
    &[Target { name: "mmu_interval_notifier_remove", kernels: "5.10+, CONFIG_MMU_NOTIFIER" }];
const RANGE_START: &[Target] =
    &[Target { name: "__mmu_notifier_invalidate_range_start", kernels: "all, CONFIG_MMU_NOTIFIER" }];
const RANGE_END: &[Target] = &[Target {
    name: "__mmu_notifier_invalidate_range_end",
    kernels: "all; (range, only_end) up to 6.5, (range) from 6.6 — only the range is read",
}];

/// Walk probe name, as the plan and the tests refer to it.
pub const WALK_PROBE: &str = "hmm_range_fault walk";
pub const READ_BEGIN_PROBE: &str = "mmu_interval_read_begin";
pub const REMOVE_PROBE: &str = "mmu_interval_notifier_remove";
pub const INVALIDATE_START_PROBE: &str = "invalidate_range_start";
pub const INVALIDATE_END_PROBE: &str = "invalidate_range_end";
pub const KVM_UNMAP_PROBE: &str = "kvm_unmap_hva_range";
pub const KVM_AGE_PROBE: &str = "kvm_age_hva";

pub const WALK: LogicalProbe = LogicalProbe {
    name: WALK_PROBE,
    purpose: "every mirror walk: duration, result (-EBUSY = retry), range, notifier",
    candidates: &[
        // fexit first: a kretprobe misses returns once more than maxactive callers sleep in
        // the walk at once (hmm_range_fault faults pages and sleeps).
        candidate!(HMM_RANGE_FAULT; Fentry "hmm_fault_entry", Fexit "hmm_fault_exit"),
        candidate!(HMM_RANGE_FAULT; Kprobe "hmm_fault_kprobe", Kretprobe "hmm_fault_kretprobe"),
    ],
};

pub const READ_BEGINS: LogicalProbe = LogicalProbe {
    name: READ_BEGIN_PROBE,
    purpose: "sequence starts per notifier and process (storms stay visible where the retry moves inside the kernel), and the start of each walk's invalidation window",
    candidates: &[
        candidate!(READ_BEGIN; Fentry "read_begin_fentry"),
        candidate!(READ_BEGIN; Kprobe "read_begin_kprobe"),
    ],
};

pub const REMOVES: LogicalProbe = LogicalProbe {
    name: REMOVE_PROBE,
    purpose: "a driver dropping a notifier: a retry loop still failing at that point gave up",
    candidates: &[
        candidate!(NOTIFIER_REMOVE; Fentry "notifier_remove_fentry"),
        candidate!(NOTIFIER_REMOVE; Kprobe "notifier_remove_kprobe"),
    ],
};

pub const INVALIDATE_START: LogicalProbe = LogicalProbe {
    name: INVALIDATE_START_PROBE,
    purpose: "every invalidation of a mirrored mm: range, event (UNMAP, CLEAR, …), who invalidated, time in the invalidate callbacks",
    candidates: &[
        candidate!(RANGE_START; Fentry "invalidate_start_fentry", Fexit "invalidate_start_fexit"),
        candidate!(RANGE_START; Kprobe "invalidate_start_kprobe", Kretprobe "invalidate_start_kretprobe"),
    ],
};

pub const INVALIDATE_END: LogicalProbe = LogicalProbe {
    name: INVALIDATE_END_PROBE,
    purpose: "how long each invalidation held its range (read_begin on it waits that long)",
    candidates: &[
        candidate!(RANGE_END; Fentry "invalidate_end_fentry"),
        candidate!(RANGE_END; Kprobe "invalidate_end_kprobe"),
    ],
};

pub const KVM_UNMAP: LogicalProbe = LogicalProbe {
    name: KVM_UNMAP_PROBE,
    purpose: "KVM secondary-MMU unmaps of a VMM's memory (kvm.ko loaded)",
    candidates: &[Candidate {
        hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: "kvm_unmap_hva_range" }],
        targets: &[Target { name: "kvm:kvm_unmap_hva_range", kernels: "KVM with MMU notifiers, kvm.ko loaded" }],
    }],
};

pub const KVM_AGE: LogicalProbe = LogicalProbe {
    name: KVM_AGE_PROBE,
    purpose: "KVM secondary-MMU aging (clear_young) of a VMM's memory",
    candidates: &[Candidate {
        hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: "kvm_age_hva" }],
        targets: &[Target { name: "kvm:kvm_age_hva", kernels: "KVM with MMU notifiers, kvm.ko loaded" }],
    }],
};

/// In attach order: the walk and read_begin probes mark mms as mirrored, which the
/// invalidation probes filter on.
pub const PROBES: &[LogicalProbe] = &[WALK, READ_BEGINS, REMOVES, INVALIDATE_START, INVALIDATE_END, KVM_UNMAP, KVM_AGE];
