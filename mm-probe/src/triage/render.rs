//! The triage as text: a headline, each finding in three parts (the problem, the evidence with
//! its figures, the next command), then what was healthy, what had nothing to judge and what
//! could not be observed, fitted to the terminal.

use super::report::{Statement, Triage};
use crate::{report::text::wrap, units::format_nanos};

pub fn render(t: &Triage, width: usize) -> String {
    let count = match t.findings.len() {
        0 => "no finding".to_string(),
        1 => "1 finding".to_string(),
        n => format!("{n} findings"),
    };
    let mut out = wrap(
        &format!("triage of {} over {}: {}, {count}", t.kernel, format_nanos(t.duration_ns), t.level.name()),
        width,
        2,
    );
    for f in &t.findings {
        out.push('\n');
        out += &wrap(&format!("{}. {} {}: {}", f.rank, f.level.name(), f.source, f.problem), width, 5);
        if !f.evidence.is_empty() {
            out += &wrap(&format!("   evidence: {}", f.evidence.join("; ")), width, 5);
        }
        out += &wrap(&format!("   next: {}", f.next_command), width, 5);
    }
    out += &section("Healthy", &t.healthy, width);
    out += &section("Nothing to judge", &t.nothing_to_judge, width);
    out += &section("Not observable", &t.not_observable, width);
    out
}

fn section(title: &str, statements: &[Statement], width: usize) -> String {
    if statements.is_empty() {
        return String::new();
    }
    let mut out = format!("\n{title}:\n");
    for s in statements {
        out += &wrap(&format!("  {}: {}", s.source, s.statement), width, 4);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{report::verdict::Level, triage::report::Finding};

    #[test]
    fn findings_come_first_in_three_parts_and_every_line_fits() {
        let long = "a problem described at length ".repeat(6);
        let triage = Triage {
            kernel: "6.12.118".into(),
            duration_ns: 30_000_000_000,
            level: Level::Crit,
            findings: vec![Finding {
                rank: 1,
                level: Level::Crit,
                source: "retry-storm".into(),
                problem: long,
                evidence: vec!["retry_rate 43.05 %".into(), "large walks: walk in 2 MiB chunks".into()],
                next_command: "mm-probe retry-storm -p 4242 --interval 1s".into(),
                processes: 1,
            }],
            healthy: vec![Statement::new("kernel log", "no HMM or device fault timed out in the window")],
            nothing_to_judge: vec![],
            not_observable: vec![Statement::new("latency", "when b runs (b): not attached")],
        };
        let text = render(&triage, 60);
        assert!(text.starts_with("triage of 6.12.118 over 30s: CRIT, 1 finding\n"), "{text}");
        assert!(text.contains("\n1. CRIT retry-storm: a problem"), "{text}");
        assert!(text.contains("   evidence: retry_rate 43.05 %; large walks"), "{text}");
        assert!(text.contains("   next: mm-probe retry-storm -p 4242 --interval 1s\n"), "{text}");
        assert!(text.find("Healthy:").unwrap() < text.find("Not observable:").unwrap(), "{text}");
        assert!(!text.contains("Nothing to judge"), "an empty section is left out: {text}");
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
    }
}
