//! The kernel hooks latency uses, best first.

use crate::probes::{Candidate, Hook, LogicalProbe, Mechanism, Target};

pub const WAKEUP: LogicalProbe = LogicalProbe {
    name: "sched_wakeup",
    purpose: "when a task became runnable",
    candidates: &[Candidate {
        hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: "lat_sched_wakeup" }],
        targets: &[Target { name: "sched:sched_wakeup", kernels: "all" }],
    }],
};

pub const SWITCH: LogicalProbe = LogicalProbe {
    name: "sched_switch",
    purpose: "when a woken task ran, and who ran before it",
    candidates: &[Candidate {
        hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: "lat_sched_switch" }],
        targets: &[Target { name: "sched:sched_switch", kernels: "all" }],
    }],
};

/// Functions known to hold a CPU under memory pressure; `--func` adds more.
const MM_FUNCTIONS: &[Target] = &[Target { name: "madvise_cold_or_pageout_pte_range", kernels: "5.4+" }];

pub const MM_FUNCTION: LogicalProbe = LogicalProbe {
    name: "mm function duration",
    purpose: "how long madvise_cold_or_pageout_pte_range held the CPU, and attribution of spikes to it",
    candidates: &[
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Fentry, program: "lat_func_entry" },
                Hook { mechanism: Mechanism::Fexit, program: "lat_func_exit" },
            ],
            targets: MM_FUNCTIONS,
        },
        Candidate {
            hooks: &[
                Hook { mechanism: Mechanism::Kprobe, program: "lat_func_kprobe" },
                Hook { mechanism: Mechanism::Kretprobe, program: "lat_func_kretprobe" },
            ],
            targets: MM_FUNCTIONS,
        },
    ],
};

pub const PROBES: &[LogicalProbe] = &[WAKEUP, SWITCH, MM_FUNCTION];
