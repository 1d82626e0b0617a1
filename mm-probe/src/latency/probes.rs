//! The kernel hooks latency uses, best first.
//!
//! Wakeup latency comes from classic sched tracepoints, which every kernel of the matrix has
//! (the host included). Function durations need function probes: fentry/fexit where the kernel
//! allows trampolines and the function is in vmlinux BTF, kprobe/kretprobe otherwise (module
//! functions have no vmlinux BTF). The object has one program pair per function slot.

use mm_probe_common::latency::MAX_FUNCS;

use crate::probes::{Candidate, Hook, LogicalProbe, Mechanism, Target};

/// The function every run traces unless told otherwise: it walks up to 512 PTEs under the PTE
/// lock per call, and without the cond_resched() of upstream b2f557a21bc8 (v6.7) it can hold
/// the CPU for milliseconds (docs/kernel-facts.md#madvise-pageout).
pub const DEFAULT_FUNCTION: &str = "madvise_cold_or_pageout_pte_range";

/// What one call of a traced function covers, where it is a fixed step of a walk: the default
/// function is a pmd_entry callback of the page walker, so one call is one PMD, 512 PTEs on
/// x86-64 (docs/kernel-facts.md). The verdict names a bound in those terms.
pub fn one_call_is(function: &str) -> Option<&'static str> {
    (function == DEFAULT_FUNCTION).then_some("one 2 MiB step of the walk")
}

/// A sched hook: the BTF tracepoint program first (the kernel's recursion guard for those is
/// per program, so a wakeup raised while another tracing program runs on that CPU is not
/// skipped, as it is for classic tracepoint programs), then the classic tracepoint.
macro_rules! sched_probe {
    ($name:literal, $purpose:literal, $btf_program:literal, $program:literal) => {
        LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[
                Candidate {
                    hooks: &[Hook { mechanism: Mechanism::BtfTracepoint, program: $btf_program }],
                    targets: &[Target { name: $name, kernels: "BTF; sched_switch: 5.18+ (prev_state argument)" }],
                },
                Candidate {
                    hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: $program }],
                    targets: &[Target { name: concat!("sched:", $name), kernels: "all" }],
                },
            ],
        }
    };
}

pub const WAKEUP: LogicalProbe = sched_probe!(
    "sched_wakeup",
    "when a task became runnable (start of its wakeup latency)",
    "lat_sched_wakeup_btf",
    "lat_sched_wakeup"
);

pub const WAKEUP_NEW: LogicalProbe = sched_probe!(
    "sched_wakeup_new",
    "when a new task first became runnable",
    "lat_sched_wakeup_new_btf",
    "lat_sched_wakeup_new"
);

pub const SWITCH: LogicalProbe = sched_probe!(
    "sched_switch",
    "when a woken task ran, and who held the CPU until then (blocker and its stack)",
    "lat_sched_switch_btf",
    "lat_sched_switch"
);

/// Where a timer wakeup's wait begins: the expiry of the task's sleep timer. Only as a BTF
/// tracepoint: the program reads the timer through BTF (its callback and expiry) and the
/// `now` the interrupt read, which the classic record does not carry.
pub const TIMER_EXPIRY: LogicalProbe = LogicalProbe {
    name: "hrtimer_expire_entry",
    purpose: "when a sleep timer should have fired (start of a timer wakeup's wait) and what held it off",
    candidates: &[Candidate {
        hooks: &[Hook { mechanism: Mechanism::BtfTracepoint, program: "lat_hrtimer_expire_btf" }],
        targets: &[Target { name: "hrtimer_expire_entry", kernels: "BTF (5.5+)" }],
    }],
};

/// The sched probes without their BTF candidates, for kernels whose BTF lacks a task_struct
/// member the BTF programs read (they would attach and then see nothing).
pub fn classic_only(probe: &LogicalProbe) -> LogicalProbe {
    LogicalProbe { candidates: &probe.candidates[probe.candidates.len() - 1..], ..*probe }
}

/// The probes that do not depend on the command line.
pub const SCHED_PROBES: &[LogicalProbe] = &[WAKEUP, WAKEUP_NEW, SWITCH];

macro_rules! slot_hooks {
    ($($slot:literal),*) => {
        [$(
            [
                [
                    Hook { mechanism: Mechanism::Fentry, program: concat!("lat_func_entry_", $slot) },
                    Hook { mechanism: Mechanism::Fexit, program: concat!("lat_func_exit_", $slot) },
                ],
                // The kretprobe first: before 5.15 kprobes at one address run newest first and
                // the unwinder stops at the kretprobe trampoline, so the entry, which then keeps
                // the stack, must run before the kretprobe replaces the return address.
                [
                    Hook { mechanism: Mechanism::Kretprobe, program: concat!("lat_func_kretprobe_", $slot) },
                    Hook { mechanism: Mechanism::Kprobe, program: concat!("lat_func_kprobe_", $slot) },
                ],
            ]
        ),*]
    };
}

/// Per slot: the fentry/fexit pair, then the kprobe/kretprobe pair.
static SLOT_HOOKS: [[[Hook; 2]; 2]; MAX_FUNCS] = slot_hooks!(0, 1, 2, 3, 4, 5, 6, 7);

const DEFAULT_TARGETS: &[Target] =
    &[Target { name: DEFAULT_FUNCTION, kernels: "5.4+ (static, called through cold_walk_ops, never inlined)" }];

/// Slot 0 with its default function, as `doctor` shows it.
pub const DEFAULT_FUNCTION_PROBE: LogicalProbe = LogicalProbe {
    name: DEFAULT_FUNCTION,
    purpose: "how long madvise_cold_or_pageout_pte_range held the CPU, and attribution of spikes to it",
    candidates: &[
        Candidate { hooks: &SLOT_HOOKS[0][0], targets: DEFAULT_TARGETS },
        Candidate { hooks: &SLOT_HOOKS[0][1], targets: DEFAULT_TARGETS },
    ],
};

/// What `doctor` tries for this capability.
pub const PROBES: &[LogicalProbe] = &[WAKEUP, WAKEUP_NEW, SWITCH, TIMER_EXPIRY, DEFAULT_FUNCTION_PROBE];

/// The probe for function `name` in slot `slot` (< MAX_FUNCS). The catalog vocabulary is
/// `'static` because it is normally a table; a `--func` name is leaked once per run to join it.
pub fn function_probe(slot: usize, name: &str) -> LogicalProbe {
    if slot == 0 && name == DEFAULT_FUNCTION {
        return DEFAULT_FUNCTION_PROBE;
    }
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let targets: &'static [Target] = Box::leak(Box::new([Target { name, kernels: "named with --func" }]));
    let hooks = &SLOT_HOOKS[slot % MAX_FUNCS];
    let candidates: &'static [Candidate] =
        Box::leak(Box::new([Candidate { hooks: &hooks[0], targets }, Candidate { hooks: &hooks[1], targets }]));
    LogicalProbe {
        name,
        purpose: "entry-to-return time of a --func target, and attribution of spikes to it",
        candidates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_probes_prefer_btf_tracepoints_and_keep_the_classic_fallback() {
        for probe in [WAKEUP, WAKEUP_NEW, SWITCH] {
            assert_eq!(probe.candidates[0].label(), "tp_btf", "{}", probe.name);
            assert_eq!(probe.candidates[1].targets[0].name, format!("sched:{}", probe.name));
            let classic = classic_only(&probe);
            assert_eq!(classic.candidates.len(), 1);
            assert_eq!(classic.candidates[0].label(), "tracepoint");
        }
    }

    #[test]
    fn every_slot_has_its_own_programs() {
        let a = function_probe(1, "zap_pte_range");
        let b = function_probe(2, "zap_pte_range");
        assert_eq!(a.candidates[0].hooks[0].program, "lat_func_entry_1");
        assert_eq!(a.candidates[1].hooks[0].program, "lat_func_kretprobe_1", "the return attaches first");
        assert_eq!(b.candidates[0].hooks[1].program, "lat_func_exit_2");
        assert_eq!(a.candidates[0].label(), "fentry+fexit");
        assert_eq!(a.candidates[1].label(), "kprobe+kretprobe");
        assert_eq!(function_probe(0, DEFAULT_FUNCTION).name, DEFAULT_FUNCTION);
        assert_eq!(SLOT_HOOKS[7][1][1].program, "lat_func_kprobe_7");
    }
}
