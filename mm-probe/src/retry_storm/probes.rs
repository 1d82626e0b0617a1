//! The kernel hooks retry-storm uses, best first. None of these functions has a tracepoint
//! upstream (kernel-facts §4: no `mmu_notifier:*` events in 5.15 → 6.18), so each has a
//! fentry/fexit candidate and a kprobe/kretprobe fallback; KVM's own tracepoints add the
//! secondary-MMU view where kvm is loaded.

use crate::probes::{Candidate, Hook, LogicalProbe, Mechanism, Target};

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
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Fentry, program: "hmm_fault_entry" },
                Hook { mechanism: Mechanism::Fexit, program: "hmm_fault_exit" },
            ],
            targets: HMM_RANGE_FAULT,
        },
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Kprobe, program: "hmm_fault_kprobe" },
                Hook { mechanism: Mechanism::Kretprobe, program: "hmm_fault_kretprobe" },
            ],
            targets: HMM_RANGE_FAULT,
        },
    ],
};

pub const READ_BEGINS: LogicalProbe = LogicalProbe {
    name: READ_BEGIN_PROBE,
    purpose: "sequence starts per notifier and process (storms stay visible where the retry moves inside the kernel), and the start of each walk's invalidation window",
    candidates: &[
        Candidate { hooks: &[Hook { mechanism: Mechanism::Fentry, program: "read_begin_fentry" }], targets: READ_BEGIN },
        Candidate { hooks: &[Hook { mechanism: Mechanism::Kprobe, program: "read_begin_kprobe" }], targets: READ_BEGIN },
    ],
};

pub const REMOVES: LogicalProbe = LogicalProbe {
    name: REMOVE_PROBE,
    purpose: "a driver dropping a notifier: a retry loop still failing at that point gave up",
    candidates: &[
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::Fentry, program: "notifier_remove_fentry" }],
            targets: NOTIFIER_REMOVE,
        },
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::Kprobe, program: "notifier_remove_kprobe" }],
            targets: NOTIFIER_REMOVE,
        },
    ],
};

pub const INVALIDATE_START: LogicalProbe = LogicalProbe {
    name: INVALIDATE_START_PROBE,
    purpose: "every invalidation of a mirrored mm: range, event (UNMAP, CLEAR, …), who invalidated, time in the invalidate callbacks",
    candidates: &[
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Fentry, program: "invalidate_start_fentry" },
                Hook { mechanism: Mechanism::Fexit, program: "invalidate_start_fexit" },
            ],
            targets: RANGE_START,
        },
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Kprobe, program: "invalidate_start_kprobe" },
                Hook { mechanism: Mechanism::Kretprobe, program: "invalidate_start_kretprobe" },
            ],
            targets: RANGE_START,
        },
    ],
};

pub const INVALIDATE_END: LogicalProbe = LogicalProbe {
    name: INVALIDATE_END_PROBE,
    purpose: "how long each invalidation held its range (read_begin on it waits that long)",
    candidates: &[
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::Fentry, program: "invalidate_end_fentry" }],
            targets: RANGE_END,
        },
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::Kprobe, program: "invalidate_end_kprobe" }],
            targets: RANGE_END,
        },
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
pub const PROBES: &[LogicalProbe] =
    &[WALK, READ_BEGINS, REMOVES, INVALIDATE_START, INVALIDATE_END, KVM_UNMAP, KVM_AGE];
