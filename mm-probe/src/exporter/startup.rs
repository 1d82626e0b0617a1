//! What the exporter says when it starts, in a few lines of at most [`WIDTH`] columns: where it
//! listens, per capability what attached, and how many probes did not (`mm-probe doctor` lists
//! them with the reason; `mm_probe_probe_attached` shows them too). And the one-line error for
//! a selection of which nothing attached.

use std::net::SocketAddr;

use crate::{cli::CapabilityId, error::UserError, probes::Plan};

pub const WIDTH: usize = 100;

/// The start-up lines; the last always begins with `  unavailable:`.
pub fn lines(address: SocketAddr, plans: &[(CapabilityId, &Plan)]) -> Vec<String> {
    let mut lines = vec![format!("mm-probe exporter: listening on http://{address}/metrics")];
    for (capability, plan) in plans {
        let attached: Vec<&str> = plan.probes.iter().filter(|p| p.attached()).map(|p| p.probe).collect();
        if attached.is_empty() {
            lines.push(format!("  {}: nothing attached", capability.name()));
        } else {
            lines.extend(wrapped(&format!("  {}: attached ", capability.name()), &attached));
        }
    }
    let unavailable: usize = plans.iter().map(|(_, plan)| plan.unavailable().count()).sum();
    lines.push(match unavailable {
        0 => "  unavailable: none".to_string(),
        1 => "  unavailable: 1 probe, see `mm-probe doctor`".to_string(),
        n => format!("  unavailable: {n} probes, see `mm-probe doctor`"),
    });
    lines
}

/// `head` then the items, comma-separated, continued on lines indented by four spaces once a
/// line would pass [`WIDTH`] (an item longer than a line gets a line of its own).
fn wrapped(head: &str, items: &[&str]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = head.to_string();
    let mut fresh = true;
    for (i, item) in items.iter().enumerate() {
        let piece = if i + 1 < items.len() { format!("{item},") } else { item.to_string() };
        let separator = if fresh { "" } else { " " };
        if !fresh && line.chars().count() + separator.len() + piece.chars().count() > WIDTH {
            lines.push(std::mem::replace(&mut line, "    ".to_string()));
            line.push_str(&piece);
        } else {
            line.push_str(separator);
            line.push_str(&piece);
        }
        fresh = false;
    }
    lines.push(line);
    lines
}

/// When no chosen probe attached: the error naming what did not, unless that was asked for.
pub fn nothing_attached(plans: &[(CapabilityId, &Plan)]) -> Option<UserError> {
    if plans.iter().any(|(_, plan)| plan.probes.iter().any(|p| p.attached())) {
        return None;
    }
    let missing: Vec<String> = plans
        .iter()
        .map(|(capability, plan)| {
            let probes: Vec<&str> = plan.probes.iter().map(|p| p.probe).collect();
            format!("{} ({})", capability.name(), probes.join(", "))
        })
        .collect();
    Some(UserError::new(format!(
        "no probe of {} attached on this kernel, so there is nothing to export: `mm-probe doctor` says why; \
         --allow-empty serves the exporter's own metrics anyway",
        missing.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{Attempt, Outcome, ProbePlan};

    fn probe(probe: &'static str, attached: bool) -> ProbePlan {
        let outcome = if attached {
            Outcome::Attached { mechanism: "tracepoint".into(), target: probe.into(), caveat: None }
        } else {
            Outcome::Unavailable
        };
        let failed_attempts = if attached {
            vec![]
        } else {
            vec![Attempt {
                mechanism: "kprobe".into(),
                target: probe.into(),
                reason: crate::probes::AttachFailure::VerifierRejected("x".repeat(300)),
            }]
        };
        ProbePlan { probe, purpose: "", outcome, failed_attempts }
    }

    fn plan(probes: &[(&'static str, bool)]) -> Plan {
        Plan { probes: probes.iter().map(|&(name, attached)| probe(name, attached)).collect() }
    }

    #[test]
    fn startup_is_a_few_short_lines_ending_with_the_unavailable_count() {
        let latency = plan(&[("sched_wakeup", true), ("sched_switch", true), ("madvise_cold", false)]);
        let retry = plan(&[("hmm_range_fault walk", false), ("kvm_unmap_hva_range", true), ("kvm_age_hva", true)]);
        let thp = plan(&[("THP allow-check", false)]);
        let plans = [(CapabilityId::Latency, &latency), (CapabilityId::RetryStorm, &retry), (CapabilityId::Thp, &thp)];
        assert_eq!(
            lines("127.0.0.1:9479".parse().unwrap(), &plans),
            [
                "mm-probe exporter: listening on http://127.0.0.1:9479/metrics",
                "  latency: attached sched_wakeup, sched_switch",
                "  retry-storm: attached kvm_unmap_hva_range, kvm_age_hva",
                "  thp: nothing attached",
                "  unavailable: 3 probes, see `mm-probe doctor`",
            ]
        );
        let all = plan(&[("sched_wakeup", true)]);
        assert_eq!(
            lines("[::]:1".parse().unwrap(), &[(CapabilityId::Latency, &all)]).last().unwrap(),
            "  unavailable: none"
        );
    }

    #[test]
    fn long_attached_lists_wrap_within_the_width() {
        let names: Vec<&'static str> =
            (0..30).map(|i| &*Box::leak(format!("probe_number_{i}").into_boxed_str())).collect();
        let many = Plan { probes: names.iter().map(|name| probe(name, true)).collect() };
        let lines = lines("127.0.0.1:9479".parse().unwrap(), &[(CapabilityId::Latency, &many)]);
        assert!(lines.len() > 4, "{lines:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH), "{lines:#?}");
        assert!(lines[2].starts_with("    probe_number_"), "{lines:#?}");
        let listed: String = lines[1..lines.len() - 1].join(" ");
        assert!(names.iter().all(|n| listed.contains(&format!("{n},")) || listed.ends_with(n)), "{listed}");
    }

    #[test]
    fn a_selection_of_which_nothing_attached_is_one_line_naming_what_did_not() {
        let thp = plan(&[("THP allow-check", false)]);
        let error = nothing_attached(&[(CapabilityId::Thp, &thp)]).unwrap().to_string();
        assert!(error.starts_with("no probe of thp (THP allow-check) attached"), "{error}");
        assert!(error.contains("--allow-empty") && error.contains("mm-probe doctor") && !error.contains('\n'));
        let some = plan(&[("THP allow-check", false), ("other", true)]);
        assert!(nothing_attached(&[(CapabilityId::Thp, &thp), (CapabilityId::Latency, &some)]).is_none());
    }
}
