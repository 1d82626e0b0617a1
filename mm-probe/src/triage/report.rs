//! The triage as printed: findings ranked, then what was healthy, what watched nothing to judge,
//! and what could not be observed. One JSON line (`schemas/triage/findings.schema.json`).

use serde::Serialize;

use crate::report::verdict::Level;

#[derive(Clone, Debug, Serialize)]
pub struct Triage {
    pub kernel: String,
    pub duration_ns: u64,
    /// The worst finding's level; OK when there is none (and something was judged healthy),
    /// UNKNOWN when nothing could be judged at all.
    pub level: Level,
    pub findings: Vec<Finding>,
    pub healthy: Vec<Statement>,
    /// Watched, but nothing happened that the capability judges (no HMM walk, no wakeup of a
    /// real-time task): neither healthy nor a problem.
    pub nothing_to_judge: Vec<Statement>,
    pub not_observable: Vec<Statement>,
}

/// One problem: what it is, the figures that show it, and the command that looks closer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// 1 for the first.
    pub rank: usize,
    pub level: Level,
    /// The command whose verdict it is ("retry-storm", "thp-why"), or "kernel log".
    pub source: String,
    pub problem: String,
    pub evidence: Vec<String>,
    pub next_command: String,
    /// How many processes it involves, as the source counted them (its share of the machine).
    pub processes: usize,
}

/// One sentence about one source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Statement {
    pub source: String,
    pub statement: String,
}

impl Statement {
    pub fn new(source: &str, statement: impl Into<String>) -> Self {
        Self { source: source.to_string(), statement: statement.into() }
    }
}
