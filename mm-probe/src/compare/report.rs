//! The comparison as printed: both runs' facts, each metric's move, the outcome and its one-line
//! conclusion, and what makes the runs hard to set side by side. The `comparison` line of
//! `compare --json` is this struct.

use serde::Serialize;

use super::{
    input::Run,
    judge::{self, MetricChange, Outcome},
};
use crate::report::verdict::Level;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The command both runs are outputs of.
    pub compared_command: String,
    pub outcome: Outcome,
    pub conclusion: String,
    pub before: Side,
    pub after: Side,
    pub metrics: Vec<MetricChange>,
    pub notes: Vec<String>,
}

/// One run, as the comparison sets it beside the other.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    pub file: String,
    pub level: Level,
    pub headline: String,
    pub duration_ns: Option<u64>,
    pub work: Option<WorkSeen>,
    /// Events lost, summed over every kind; null when some kind could not be counted.
    pub lost_events: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WorkSeen {
    pub what: &'static str,
    pub count: u64,
    pub per_second: Option<f64>,
}

impl Comparison {
    pub fn of(before: &Run, after: &Run) -> Self {
        let metrics = judge::changes(before, after);
        let comparable = judge::not_comparable(before, after, &metrics).is_empty();
        let outcome = judge::outcome(before.level, after.level, comparable);
        Self {
            compared_command: before.command.clone(),
            outcome,
            conclusion: judge::conclusion(outcome, before, after, &metrics),
            before: side(before),
            after: side(after),
            notes: judge::notes(before, after),
            metrics,
        }
    }
}

fn side(run: &Run) -> Side {
    Side {
        file: run.file.clone(),
        level: run.level,
        headline: run.headline.clone(),
        duration_ns: run.duration_ns,
        work: run.work.map(|w| WorkSeen { what: w.what, count: w.count, per_second: judge::pace(run) }),
        lost_events: (!run.lost.uncounted).then_some(run.lost.counted),
    }
}
