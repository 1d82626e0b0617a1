//! What a command cannot observe on this kernel, said once, in the same words in text and JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::probes::{Outcome, Plan};

/// One thing this kernel does not let a command see. Text prints what it is and what it
/// costs; the planner's reason is printed once, in the plan's list of unavailable probes (with
/// the pointer to `mm-probe doctor`). JSON carries all three in one sentence.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    /// "mmu_interval_read_begin is not observable".
    pub subject: String,
    /// The planner's reason, where a probe failed to attach.
    pub why: Option<String>,
    /// "walk windows start at walk entry …".
    pub cost: String,
}

impl Statement {
    /// The sentence for the terminal, without the reason.
    pub fn text(&self) -> String {
        format!("{}: {}", self.subject, self.cost)
    }

    /// The whole sentence, with the reason.
    pub fn sentence(&self) -> String {
        match self.why.as_deref().filter(|w| !w.is_empty()) {
            Some(why) => format!("{} ({why}): {}", self.subject, self.cost),
            None => self.text(),
        }
    }
}

impl Serialize for Statement {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.sentence())
    }
}

/// The plan as every command prints it on stderr: what is watched with what, what is not and
/// what that loses, the planner's reasons once, then what the command cannot see.
pub fn plan_text(command: &str, kernel: &str, plan: &Plan, statements: &[Statement]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "mm-probe {command} on {kernel}");
    for probe in &plan.probes {
        match &probe.outcome {
            Outcome::Attached { mechanism, target, caveat } => {
                let _ = writeln!(out, "  watching {:<30} {mechanism} on {target}", probe.probe);
                if let Some(caveat) = caveat {
                    let _ = writeln!(out, "      caveat: {caveat}");
                }
            }
            Outcome::Unavailable => {
                let _ = writeln!(out, "  NOT observable {:<24} lost: {}", probe.probe, probe.purpose);
            }
        }
    }
    out += &plan.unavailable_summary(crate::report::text::stderr_width());
    for statement in statements {
        let _ = writeln!(out, "  {}", statement.text());
    }
    out
}
