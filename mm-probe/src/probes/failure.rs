//! Why one attach attempt failed, as a value: the planner decides the kind once, tests and
//! callers match on it, and the text people read (`doctor`, the plans in JSON) is its Display.

use std::fmt;

use serde::{Serialize, Serializer};

/// The reason one program did not load or attach to one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachFailure {
    /// The kernel's BTF is unusable (fentry, fexit, tp_btf need it).
    NoBtf(String),
    /// The function is not in the kernel's BTF: absent, renamed or inlined.
    FunctionNotInBtf {
        function: String,
    },
    /// CONFIG_KPROBES is off.
    KprobesNotBuiltIn,
    KallsymsUnreadable(String),
    /// No such function in /proc/kallsyms (not even a compiler clone).
    FunctionNotInKallsyms {
        function: String,
    },
    /// tracefs is not mounted or not readable; the text says which.
    TracefsUnusable(String),
    /// A catalog wrote a classic tracepoint without its category.
    NotCategoryEvent {
        target: String,
    },
    TracepointAbsent {
        event: String,
    },
    BtfTracepointAbsent {
        event: String,
    },
    /// The catalog names a program the embedded object does not have.
    ProgramMissing {
        program: &'static str,
    },
    /// The object's program is of another type than the catalog's mechanism.
    ProgramTypeMismatch(String),
    /// fentry/fexit refused with EPERM: the kernel does not permit BPF trampolines.
    TrampolinesRefused,
    /// The kernel refused to load the program with `errno` (EPERM: lockdown, missing privilege).
    LoadRefused {
        errno: i32,
        detail: String,
    },
    /// The verifier's last words.
    VerifierRejected(String),
    /// Any other error from loading or attaching, with its causes.
    Other(String),
}

impl AttachFailure {
    /// Refused by the kernel with EPERM, the program type (trampolines) or the program itself.
    pub fn is_permission_refusal(&self) -> bool {
        matches!(self, Self::TrampolinesRefused | Self::LoadRefused { errno: libc::EPERM, .. })
    }

    /// No BTF, or the target is not in it.
    pub fn is_missing_btf(&self) -> bool {
        matches!(self, Self::NoBtf(_) | Self::FunctionNotInBtf { .. } | Self::BtfTracepointAbsent { .. })
    }
}

/// "EPERM" for the errno values the kernel answers bpf(2) loads with most, the number otherwise.
fn errno_name(errno: i32) -> String {
    match errno {
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        libc::EINVAL => "EINVAL".into(),
        n => format!("errno {n}"),
    }
}

impl fmt::Display for AttachFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoBtf(why) => write!(f, "no kernel BTF ({why})"),
            Self::FunctionNotInBtf { function } => {
                write!(f, "{function} is not in this kernel's BTF (absent, renamed or inlined)")
            }
            Self::KprobesNotBuiltIn => f.write_str("kprobes are not built into this kernel (CONFIG_KPROBES is off)"),
            Self::KallsymsUnreadable(why) => write!(f, "cannot read kallsyms ({why})"),
            Self::FunctionNotInKallsyms { function } => {
                write!(f, "no function {function} in /proc/kallsyms on this kernel")
            }
            Self::TracefsUnusable(why) => f.write_str(why),
            Self::NotCategoryEvent { target } => write!(f, "tracepoint {target} is not written category:event"),
            Self::TracepointAbsent { event } => write!(f, "no tracepoint {event} on this kernel"),
            Self::BtfTracepointAbsent { event } => write!(f, "no BTF-typed tracepoint {event} on this kernel"),
            Self::ProgramMissing { program } => write!(f, "program {program} is missing from mm-probe's object"),
            Self::ProgramTypeMismatch(text) | Self::Other(text) => f.write_str(text),
            Self::TrampolinesRefused => f.write_str(
                "the kernel refused to load it (EPERM): BPF trampolines are not permitted on this kernel \
                 (lockdown, or no DYNAMIC_FTRACE_WITH_DIRECT_CALLS)",
            ),
            Self::LoadRefused { errno, detail } => {
                write!(f, "the kernel refused to load it ({}): {detail}", errno_name(*errno))
            }
            Self::VerifierRejected(last) => write!(f, "the verifier rejected it: {last}"),
        }
    }
}

/// In JSON an attempt's `reason` stays the sentence it always was.
impl Serialize for AttachFailure {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_of_each_failure_is_the_sentence_doctor_has_always_printed() {
        let cases = [
            (AttachFailure::NoBtf("no /sys/kernel/btf/vmlinux".into()), "no kernel BTF (no /sys/kernel/btf/vmlinux)"),
            (
                AttachFailure::FunctionNotInBtf { function: "hmm_range_fault".into() },
                "hmm_range_fault is not in this kernel's BTF (absent, renamed or inlined)",
            ),
            (AttachFailure::KprobesNotBuiltIn, "kprobes are not built into this kernel (CONFIG_KPROBES is off)"),
            (
                AttachFailure::FunctionNotInKallsyms { function: "kvm_age_hva".into() },
                "no function kvm_age_hva in /proc/kallsyms on this kernel",
            ),
            (
                AttachFailure::TracepointAbsent { event: "kvm:kvm_age_hva".into() },
                "no tracepoint kvm:kvm_age_hva on this kernel",
            ),
            (
                AttachFailure::BtfTracepointAbsent { event: "sched_switch".into() },
                "no BTF-typed tracepoint sched_switch on this kernel",
            ),
            (
                AttachFailure::ProgramMissing { program: "lat_typo" },
                "program lat_typo is missing from mm-probe's object",
            ),
            (
                AttachFailure::TrampolinesRefused,
                "the kernel refused to load it (EPERM): BPF trampolines are not permitted on this kernel (lockdown, \
                 or no DYNAMIC_FTRACE_WITH_DIRECT_CALLS)",
            ),
            (
                AttachFailure::LoadRefused { errno: libc::EPERM, detail: "lockdown".into() },
                "the kernel refused to load it (EPERM): lockdown",
            ),
            (
                AttachFailure::VerifierRejected("R1 invalid mem access".into()),
                "the verifier rejected it: R1 invalid mem access",
            ),
        ];
        for (failure, text) in cases {
            assert_eq!(failure.to_string(), text);
            assert_eq!(serde_json::to_value(&failure).unwrap(), serde_json::Value::from(text));
        }
    }

    #[test]
    fn permission_refusals_and_missing_btf_are_told_apart() {
        assert!(AttachFailure::TrampolinesRefused.is_permission_refusal());
        assert!(AttachFailure::LoadRefused { errno: libc::EPERM, detail: String::new() }.is_permission_refusal());
        assert!(!AttachFailure::LoadRefused { errno: libc::EINVAL, detail: String::new() }.is_permission_refusal());
        assert!(AttachFailure::FunctionNotInBtf { function: "f".into() }.is_missing_btf());
        assert!(!AttachFailure::KprobesNotBuiltIn.is_missing_btf());
    }
}
