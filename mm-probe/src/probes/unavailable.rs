//! What the commands print about the probes that did not attach: each reason once, with the
//! probes it cost, instead of the same reason under every probe (a kernel without kprobes and
//! trampolines fails most probes the same two ways). `doctor` prints every attempt.

use super::planner::{Plan, ProbePlan};
use crate::report::text::wrap;

/// The last line: where to read every attempt.
pub const DOCTOR_POINTER: &str = "(mm-probe doctor shows every attempt)";

impl Plan {
    /// One line per distinct reason, naming the probes that share it, then [`DOCTOR_POINTER`];
    /// empty when everything attached. Lines are indented by 2 and wrapped to `width`.
    pub fn unavailable_summary(&self, width: usize) -> String {
        unavailable_summary(self.unavailable(), width)
    }
}

/// [`Plan::unavailable_summary`] for some of a plan's probes (a command that explains some
/// probes in its own words leaves them out).
pub fn unavailable_summary<'a>(probes: impl IntoIterator<Item = &'a ProbePlan>, width: usize) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for probe in probes.into_iter().filter(|p| !p.attached()) {
        let reason = reason_of(probe);
        match groups.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(probe.probe),
            None => groups.push((reason, vec![probe.probe])),
        }
    }
    if groups.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for (reason, names) in &groups {
        out += &wrap(&format!("  unavailable: {} — {reason}", names.join(", ")), width, 6);
    }
    out += &wrap(&format!("  {DOCTOR_POINTER}"), width, 4);
    out
}

/// Each mechanism's failure once, in the order tried ("fentry+fexit: …; kprobe+kretprobe: …"):
/// the targets are left out, so probes that failed the same ways share the line.
fn reason_of(probe: &ProbePlan) -> String {
    let mut parts: Vec<String> = Vec::new();
    for attempt in &probe.failed_attempts {
        let part = format!("{}: {}", attempt.mechanism, attempt.reason);
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    if parts.is_empty() { "no candidate to try".to_string() } else { parts.join("; ") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{AttachFailure, Attempt, Outcome};

    fn probe(name: &'static str, attempts: &[(&str, &str, AttachFailure)]) -> ProbePlan {
        ProbePlan {
            probe: name,
            purpose: "test",
            outcome: Outcome::Unavailable,
            failed_attempts: attempts
                .iter()
                .map(|(m, t, r)| Attempt { mechanism: m.to_string(), target: t.to_string(), reason: r.clone() })
                .collect(),
        }
    }

    fn host_like(name: &'static str, function: &str) -> ProbePlan {
        probe(
            name,
            &[
                ("fentry+fexit", function, AttachFailure::TrampolinesRefused),
                ("kprobe+kretprobe", function, AttachFailure::KprobesNotBuiltIn),
            ],
        )
    }

    #[test]
    fn a_reason_shared_by_several_probes_is_printed_once_with_their_names() {
        let plan = Plan {
            probes: vec![
                host_like("hmm_range_fault walk", "hmm_range_fault"),
                host_like("mmu_interval_read_begin", "mmu_interval_read_begin"),
                probe(
                    "kvm_age_hva",
                    &[(
                        "tracepoint",
                        "kvm:kvm_age_hva",
                        AttachFailure::TracepointAbsent { event: "kvm:kvm_age_hva".into() },
                    )],
                ),
            ],
        };
        let text = plan.unavailable_summary(1000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("  unavailable: hmm_range_fault walk, mmu_interval_read_begin — fentry+fexit: "),
            "{text}"
        );
        assert_eq!(text.matches("CONFIG_KPROBES").count(), 1, "{text}");
        assert_eq!(text.matches("EPERM").count(), 1, "{text}");
        assert!(
            lines[1].starts_with("  unavailable: kvm_age_hva — tracepoint: no tracepoint kvm:kvm_age_hva"),
            "{text}"
        );
        assert_eq!(lines[2], format!("  {DOCTOR_POINTER}"));
    }

    #[test]
    fn the_summary_fits_the_width_and_is_empty_when_everything_attached() {
        let plan = Plan { probes: vec![host_like("a", "f"), host_like("b", "g")] };
        let text = plan.unavailable_summary(60);
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
        assert!(text.trim_end().ends_with(DOCTOR_POINTER), "{text}");
        assert_eq!(Plan::default().unavailable_summary(60), "");
    }
}
