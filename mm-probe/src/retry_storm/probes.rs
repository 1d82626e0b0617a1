//! The kernel hooks retry-storm uses, best first. None of these functions has a tracepoint.

use crate::probes::{Candidate, Hook, LogicalProbe, Mechanism, Target};

const HMM_RANGE_FAULT: &[Target] = &[Target { name: "hmm_range_fault", kernels: "5.8+, CONFIG_HMM_MIRROR" }];

pub const WALK: LogicalProbe = LogicalProbe {
    name: "hmm_range_fault walk",
    purpose: "every mirror walk: duration, result (-EBUSY = retry), range, notifier",
    candidates: &[
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

pub const PROBES: &[LogicalProbe] = &[WALK];
