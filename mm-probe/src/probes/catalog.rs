//! The vocabulary of the probe catalog. The catalogs themselves live with their capabilities
//! (`thp_why::probes`, `latency::probes`, `retry_storm::probes`, `selftest`).

use serde::Serialize;

/// How a program hooks into the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    Fentry,
    Fexit,
    Kprobe,
    Kretprobe,
    /// Classic tracepoint, target `category:event`.
    Tracepoint,
    /// Raw tracepoint, target `event`.
    RawTracepoint,
    /// BTF-typed tracepoint (tp_btf), target `event`.
    BtfTracepoint,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fentry => "fentry",
            Mechanism::Fexit => "fexit",
            Mechanism::Kprobe => "kprobe",
            Mechanism::Kretprobe => "kretprobe",
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::RawTracepoint => "raw_tracepoint",
            Mechanism::BtfTracepoint => "tp_btf",
        }
    }

    /// Runs at a function's return.
    pub fn is_return(self) -> bool {
        matches!(self, Mechanism::Fexit | Mechanism::Kretprobe)
    }

    /// Function probes need a kernel function symbol; the others attach to trace events.
    pub fn is_function_probe(self) -> bool {
        matches!(self, Mechanism::Fentry | Mechanism::Fexit | Mechanism::Kprobe | Mechanism::Kretprobe)
    }
}

/// One program of the object and how it attaches.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub mechanism: Mechanism,
    /// The program's name in the eBPF object.
    pub program: &'static str,
}

/// A kernel symbol or event a candidate may attach to, with the kernels known to carry it.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub name: &'static str,
    pub kernels: &'static str,
}

/// A [`Candidate`] written as its targets and `Mechanism "program"` pairs, for the catalogs:
/// `candidate!(TARGETS; Fentry "walk_entry", Fexit "walk_exit")`.
#[macro_export]
macro_rules! candidate {
    ($targets:expr; $($mechanism:ident $program:literal),+ $(,)?) => {
        $crate::probes::catalog::Candidate {
            hooks: &[$($crate::probes::catalog::Hook { mechanism: $crate::probes::catalog::Mechanism::$mechanism, program: $program }),+],
            targets: $targets,
        }
    };
}

/// A [`LogicalProbe`] on one tracepoint, the catalogs' commonest entry:
/// `tracepoint_probe!("name", "purpose"; "kvm:kvm_age_hva" on "KVM kernels" => "program")`, or
/// `=> raw "raw_program" | "program"` to prefer a raw tracepoint on the same event, or
/// `=> raw "raw_program"` for a raw tracepoint alone.
#[macro_export]
macro_rules! tracepoint_probe {
    ($name:expr, $purpose:expr; $event:literal on $kernels:literal => $program:literal) => {
        $crate::probes::catalog::LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[$crate::candidate!(&[$crate::probes::catalog::Target { name: $event, kernels: $kernels }]; Tracepoint $program)],
        }
    };
    // A raw tracepoint first, the classic one where it is refused: a raw tracepoint's program
    // has a guard of its own, so it is not skipped while a map syscall (ours, reading the
    // tables) is preempted on that CPU holding the guard classic tracepoints and kprobes share.
    ($name:expr, $purpose:expr; $event:literal on $kernels:literal => raw $raw:literal | $program:literal) => {
        $crate::probes::catalog::LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[
                $crate::candidate!(&[$crate::probes::catalog::Target { name: $event, kernels: $kernels }]; RawTracepoint $raw),
                $crate::candidate!(&[$crate::probes::catalog::Target { name: $event, kernels: $kernels }]; Tracepoint $program),
            ],
        }
    };
    // A raw tracepoint alone: for programs that read no argument whose place moved across
    // versions, on events every supported kernel has in raw form.
    ($name:expr, $purpose:expr; $event:literal on $kernels:literal => raw $raw:literal) => {
        $crate::probes::catalog::LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[$crate::candidate!(&[$crate::probes::catalog::Target { name: $event, kernels: $kernels }]; RawTracepoint $raw)],
        }
    };
}

/// A [`LogicalProbe`] on kernel functions, in the order every catalog prefers: BPF trampolines
/// first (cheaper per call, and an fexit sees every return, where a kretprobe misses returns
/// once more than maxactive callers sleep inside), kprobes where trampolines are refused.
/// `function_probe!("name", "purpose", TARGETS; Fentry "a", Fexit "b" | Kprobe "c", Kretprobe "d")`.
#[macro_export]
macro_rules! function_probe {
    ($name:expr, $purpose:expr, $targets:expr;
     $($trampoline:ident $tprogram:literal),+ | $($kprobe:ident $kprogram:literal),+) => {
        $crate::probes::catalog::LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[
                $crate::candidate!($targets; $($trampoline $tprogram),+),
                $crate::candidate!($targets; $($kprobe $kprogram),+),
            ],
        }
    };
}

/// One way to implement a logical probe: every hook attaches to the same target.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub hooks: &'static [Hook],
    pub targets: &'static [Target],
}

impl Candidate {
    /// "fentry+fexit", "kprobe+kretprobe", "tracepoint": the entry first, whichever attaches
    /// first (the hooks' order).
    pub fn label(&self) -> String {
        let (returns, entries): (Vec<&Hook>, Vec<&Hook>) = self.hooks.iter().partition(|h| h.mechanism.is_return());
        entries.iter().chain(&returns).map(|h| h.mechanism.name()).collect::<Vec<_>>().join("+")
    }
}

/// What a capability wants to observe, and the ways to observe it, best first.
#[derive(Clone, Copy, Debug)]
pub struct LogicalProbe {
    pub name: &'static str,
    /// What is lost when it cannot attach (printed by `doctor` and in degraded output).
    pub purpose: &'static str,
    pub candidates: &'static [Candidate],
}

#[cfg(test)]
mod tests {
    use super::LogicalProbe;

    #[test]
    fn a_raw_tracepoint_comes_first_with_the_classic_one_on_the_same_event_behind_it() {
        const PROBE: LogicalProbe =
            crate::tracepoint_probe!("age", "aging"; "kvm:kvm_age_hva" on "KVM" => raw "age_raw" | "age_classic");
        let labels: Vec<String> = PROBE.candidates.iter().map(|c| c.label()).collect();
        assert_eq!(labels, ["raw_tracepoint", "tracepoint"]);
        assert_eq!(PROBE.candidates[0].hooks[0].program, "age_raw");
        assert!(PROBE.candidates.iter().all(|c| c.targets[0].name == "kvm:kvm_age_hva"));
    }
}
