//! Whether a change helped: each metric's move between its two runs, the verdict's move, and
//! what makes two runs hard to set side by side. Every rule is stated where it is applied and
//! proved by one test below.

use serde::Serialize;

use super::{
    findings::TRIAGE,
    input::{JudgedMetric, Run},
};
use crate::report::verdict::{Level, Unit, named};

/// A metric that stays in its WARN or CRIT band moves only when its value at least halves or
/// doubles: the move a user would call a change. It never decides the outcome, which follows
/// the verdict's level: under emulation two runs of one unchanged storm differed by up to 2.6x
/// (avg_latency 1.74 ms against 666 µs, 6.12 guest), so such moves are listed beside it.
pub const WITHIN_BAND_FACTOR: f64 = 2.0;

/// Runs whose pace of work (per second) differs by at least this factor are said to have
/// watched very different amounts of work.
pub const WORK_PACE_FACTOR: f64 = 10.0;

named! {
    /// How one metric moved. Every metric is worse the higher it is (OK below WARN).
    pub enum Movement {
        /// From WARN or CRIT to OK.
        Fixed => "fixed",
        /// To a lower band that is not OK, or down by [`WITHIN_BAND_FACTOR`] within its band.
        Better => "better",
        Same => "same",
        Worse => "worse",
        /// Not judged in one of the runs: no move can be claimed.
        Unknown => "unknown",
    }
}

named! {
    /// How the verdict moved.
    pub enum Outcome {
        /// From WARN or CRIT to OK.
        Fixed => "fixed",
        /// To a lower level that is not OK.
        Improved => "improved",
        NoChange => "no_change",
        Worse => "worse",
        /// One run judged nothing, or the runs judged against different limits.
        Unknown => "unknown",
    }
}

/// One metric in both runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricChange {
    pub metric: String,
    pub unit: Unit,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// after ÷ before, where both are known and before is not 0.
    pub ratio: Option<f64>,
    pub before_level: Level,
    pub after_level: Level,
    pub movement: Movement,
}

/// Every metric of either run, in the before run's order (a metric only one run judged is
/// unknown in the other).
pub fn changes(before: &Run, after: &Run) -> Vec<MetricChange> {
    let only_after = after.metrics.iter().filter(|m| find(before, &m.metric).is_none());
    before
        .metrics
        .iter()
        .chain(only_after)
        .map(|m| change(m, find(before, &m.metric), find(after, &m.metric)))
        .collect()
}

fn find<'r>(run: &'r Run, name: &str) -> Option<&'r JudgedMetric> {
    run.metrics.iter().find(|m| m.metric == name)
}

/// `metric` (as either run has it) in both runs.
fn change(metric: &JudgedMetric, before: Option<&JudgedMetric>, after: Option<&JudgedMetric>) -> MetricChange {
    let value = |m: Option<&JudgedMetric>| m.and_then(|m| m.value);
    let level = |m: Option<&JudgedMetric>| m.map_or(Level::Unknown, |m| m.level);
    let (b, a) = (value(before), value(after));
    let ratio = match (b, a) {
        (Some(b), Some(a)) if b != 0.0 => Some(a / b),
        _ => None,
    };
    MetricChange {
        metric: metric.metric.clone(),
        unit: metric.unit,
        before: b,
        after: a,
        ratio,
        before_level: level(before),
        after_level: level(after),
        movement: movement(b, level(before), a, level(after)),
    }
}

/// A change of band decides; within WARN or CRIT, only a halving or doubling that is not noise.
pub fn movement(before: Option<f64>, before_level: Level, after: Option<f64>, after_level: Level) -> Movement {
    let (Some(b), Some(a)) = (before, after) else { return Movement::Unknown };
    if before_level == Level::Unknown || after_level == Level::Unknown {
        return Movement::Unknown;
    }
    if after_level < before_level {
        return if after_level == Level::Ok { Movement::Fixed } else { Movement::Better };
    }
    if after_level > before_level {
        return Movement::Worse;
    }
    // Inside OK there is nothing to act on: only a change of band is a move there (0 → 0.03 %
    // of loops timing out, WARN at 0.1 %, is no news).
    if after_level == Level::Ok {
        Movement::Same
    } else if a * WITHIN_BAND_FACTOR <= b {
        Movement::Better
    } else if a >= b * WITHIN_BAND_FACTOR {
        Movement::Worse
    } else {
        Movement::Same
    }
}

/// The verdict's move; UNKNOWN when either run judged nothing or something keeps the two from
/// being compared ([`not_comparable`]).
pub fn outcome(before: Level, after: Level, comparable: bool) -> Outcome {
    if !comparable || before == Level::Unknown || after == Level::Unknown {
        Outcome::Unknown
    } else if after < before {
        if after == Level::Ok { Outcome::Fixed } else { Outcome::Improved }
    } else if after > before {
        Outcome::Worse
    } else {
        Outcome::NoChange
    }
}

/// Why the verdicts cannot be set side by side even where both judged something: a metric
/// judged against other WARN or CRIT limits (a looser limit is not a fix), or a metric that
/// decided the before verdict and was not judged after (its silence is not a fix either).
pub fn not_comparable(before: &Run, after: &Run, changes: &[MetricChange]) -> Vec<String> {
    let mut reasons = Vec::new();
    for b in &before.metrics {
        let Some(a) = find(after, &b.metric) else { continue };
        if a.warn != b.warn || a.crit != b.crit {
            let band = |m: &JudgedMetric| format!("{}/{}", m.unit.format(m.warn), m.unit.format(m.crit));
            reasons.push(format!(
                "{} was judged against other limits (warn/crit {} before, {} after)",
                b.metric,
                band(b),
                band(a)
            ));
        }
    }
    let deciding = before.level > Level::Ok;
    for c in changes.iter().filter(|c| deciding && c.before_level == before.level && c.after_level == Level::Unknown) {
        let why = match find(after, &c.metric) {
            Some(m) => m.unknown_because.clone().unwrap_or_else(|| "no value".into()),
            None => "not in the run".into(),
        };
        reasons.push(format!("{}, which decided the before verdict, was not judged after ({why})", c.metric));
    }
    reasons
}

/// The one line that ends the comparison: the outcome, then the figures that decide it.
pub fn conclusion(outcome: Outcome, before: &Run, after: &Run, changes: &[MetricChange]) -> String {
    let moved = |kinds: &[Movement]| -> Vec<String> {
        changes.iter().filter(|c| kinds.contains(&c.movement)).map(figures).collect()
    };
    let levels = format!("{} → {}", before.level.name(), after.level.name());
    match outcome {
        Outcome::Fixed => format!("fixed: {}; now OK", moved(&[Movement::Fixed]).join(", ")),
        Outcome::Improved => format!("improved, {levels}: {}", moved(&[Movement::Fixed, Movement::Better]).join(", ")),
        Outcome::Worse => format!("worse, {levels}: {}", moved(&[Movement::Worse]).join(", ")),
        Outcome::NoChange => no_change(before.level, &moved(&[Movement::Better, Movement::Worse, Movement::Fixed])),
        Outcome::Unknown => cannot_say(before, after, changes),
    }
}

/// "retry_rate 39.90 % → 1.60 % (CRIT → OK)".
fn figures(c: &MetricChange) -> String {
    let value = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| c.unit.format(v));
    let band = if c.before_level == c.after_level {
        format!("within {}", c.after_level.name())
    } else {
        format!("{} → {}", c.before_level.name(), c.after_level.name())
    };
    format!("{} {} → {} ({band})", c.metric, value(c.before), value(c.after))
}

fn no_change(level: Level, moved: &[String]) -> String {
    let said = format!("no change: {} before and after", level.name());
    if moved.is_empty() { said } else { format!("{said}; other moves: {}", moved.join(", ")) }
}

fn cannot_say(before: &Run, after: &Run, changes: &[MetricChange]) -> String {
    for (which, run) in [("before", before), ("after", after)] {
        if run.level == Level::Unknown {
            return format!("cannot say: the {which} run judged nothing ({})", run.headline);
        }
    }
    format!("cannot say: {}", not_comparable(before, after, changes).join("; "))
}

/// What makes the runs hard to set side by side: very different paces of work or lengths, and
/// losses. The metrics are shares, rates and means, so they compare across lengths; these say
/// when the workload itself was not the same.
pub fn notes(before: &Run, after: &Run) -> Vec<String> {
    let mut notes = Vec::new();
    if let (Some(b), Some(a)) = (pace(before), pace(after))
        && far_apart(b, a)
    {
        let what = before.work.map_or("", |w| w.what);
        let paces = format!("{b:.0} {what}/s before, {a:.0}/s after");
        notes.push(if a == 0.0 || b == 0.0 {
            format!("the {} run watched no {what}", if a == 0.0 { "after" } else { "before" })
        } else if a < b {
            format!(
                "the after run watched far less work ({paces}): a run with little work looks healthy, so check \
                 that the workload ran as before"
            )
        } else {
            format!(
                "the after run watched far more work ({paces}): the metrics are shares, rates and means, so \
                 they still compare (a change that splits the work, as chunked walks do, multiplies it)"
            )
        });
    }
    if let (Some(b), Some(a)) = (before.duration_ns, after.duration_ns)
        && far_apart(b as f64, a as f64)
    {
        notes.push(format!(
            "the runs lasted very different times: {} before, {} after",
            crate::units::format_nanos(b),
            crate::units::format_nanos(a)
        ));
    }
    for (which, run) in [("before", before), ("after", after)] {
        if run.lost.counted > 0 {
            notes.push(format!(
                "the {which} run lost {} events (its lost_events line): what was made from them is UNKNOWN there",
                run.lost.counted
            ));
        }
        if run.lost.uncounted && run.command != TRIAGE {
            notes.push(format!("the {which} run could not count every kind of loss on its kernel"));
        }
    }
    if before.command == TRIAGE {
        // Its line has no loss count: each watch's own verdict made what its losses touched
        // UNKNOWN, which is how they reach the per-source counts compared here.
        notes.push("triage prints no loss count: a watch's losses made its own figures UNKNOWN".into());
    }
    notes
}

/// Work per second of the run, where both are known.
pub fn pace(run: &Run) -> Option<f64> {
    let seconds = run.duration_ns? as f64 / 1e9;
    (seconds > 0.0).then(|| run.work.map(|w| w.count as f64 / seconds)).flatten()
}

fn far_apart(a: f64, b: f64) -> bool {
    let (low, high) = if a < b { (a, b) } else { (b, a) };
    high >= low * WORK_PACE_FACTOR && high > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::input::{Lost, Work};

    fn moved(b: f64, bl: Level, a: f64, al: Level) -> Movement {
        movement(Some(b), bl, Some(a), al)
    }

    #[test]
    fn a_change_of_band_decides_the_move() {
        assert_eq!(moved(0.40, Level::Crit, 0.016, Level::Ok), Movement::Fixed);
        assert_eq!(moved(0.40, Level::Crit, 0.10, Level::Warn), Movement::Better);
        assert_eq!(moved(0.01, Level::Ok, 0.10, Level::Warn), Movement::Worse);
    }

    #[test]
    fn within_a_band_only_a_halving_or_doubling_moves() {
        assert_eq!(moved(0.40, Level::Crit, 0.35, Level::Crit), Movement::Same);
        assert_eq!(moved(0.80, Level::Crit, 0.20, Level::Crit), Movement::Better);
        assert_eq!(moved(0.20, Level::Crit, 0.80, Level::Crit), Movement::Worse);
    }

    #[test]
    fn inside_ok_only_a_change_of_band_moves() {
        // Two runs of one storm in a 6.12 guest: timeout_rate 0 → 0.03 %, WARN at 0.1 %.
        assert_eq!(moved(0.0, Level::Ok, 0.0003, Level::Ok), Movement::Same);
        assert_eq!(moved(0.04, Level::Ok, 0.001, Level::Ok), Movement::Same);
    }

    #[test]
    fn a_metric_one_run_did_not_judge_never_moves() {
        assert_eq!(movement(None, Level::Unknown, Some(0.1), Level::Warn), Movement::Unknown);
        assert_eq!(movement(Some(0.1), Level::Warn, None, Level::Unknown), Movement::Unknown);
    }

    #[test]
    fn the_verdict_moves_by_level_and_unknown_or_other_limits_say_nothing() {
        assert_eq!(outcome(Level::Crit, Level::Ok, true), Outcome::Fixed);
        assert_eq!(outcome(Level::Crit, Level::Warn, true), Outcome::Improved);
        assert_eq!(outcome(Level::Ok, Level::Warn, true), Outcome::Worse);
        assert_eq!(outcome(Level::Crit, Level::Crit, true), Outcome::NoChange);
        assert_eq!(outcome(Level::Unknown, Level::Ok, true), Outcome::Unknown);
        assert_eq!(outcome(Level::Crit, Level::Ok, false), Outcome::Unknown, "not comparable");
    }

    fn run(level: Level, metrics: &[(&str, f64, Level, f64)], walks: u64) -> Run {
        Run {
            file: "f".into(),
            command: "retry-storm".into(),
            level,
            headline: "nothing to judge was seen".into(),
            metrics: metrics
                .iter()
                .map(|&(name, value, level, warn)| JudgedMetric {
                    metric: name.into(),
                    definition: "".into(),
                    unit: Unit::Fraction,
                    value: (level != Level::Unknown).then_some(value),
                    level,
                    warn,
                    crit: 0.15,
                    unknown_because: (level == Level::Unknown).then(|| "events lost".into()),
                })
                .collect(),
            duration_ns: Some(2_000_000_000),
            work: Some(Work { what: "walks", count: walks }),
            lost: Lost::default(),
            summary: serde_json::Value::Null,
            plan: None,
        }
    }

    #[test]
    fn the_conclusion_names_the_figures_that_decide_it() {
        let before = run(
            Level::Crit,
            &[("retry_rate", 0.399, Level::Crit, 0.05), ("timeout_rate", 0.0, Level::Ok, 0.001)],
            1546,
        );
        let after =
            run(Level::Ok, &[("retry_rate", 0.016, Level::Ok, 0.05), ("timeout_rate", 0.0, Level::Ok, 0.001)], 6905);
        let c = changes(&before, &after);
        assert_eq!(
            conclusion(Outcome::Fixed, &before, &after, &c),
            "fixed: retry_rate 39.90 % → 1.60 % (CRIT → OK); now OK"
        );
        let same = changes(&before, &before);
        assert_eq!(conclusion(Outcome::NoChange, &before, &before, &same), "no change: CRIT before and after");
        let halved = run(Level::Crit, &[("retry_rate", 0.18, Level::Crit, 0.05)], 1546);
        let c = changes(&before, &halved);
        assert_eq!(
            conclusion(Outcome::NoChange, &before, &halved, &c),
            "no change: CRIT before and after; other moves: retry_rate 39.90 % → 18.00 % (within CRIT)"
        );
    }

    #[test]
    fn other_limits_a_silent_deciding_metric_or_a_run_that_judged_nothing_cannot_be_concluded() {
        let before = run(Level::Crit, &[("retry_rate", 0.399, Level::Crit, 0.05)], 1546);
        let loose = run(Level::Ok, &[("retry_rate", 0.399, Level::Ok, 0.50)], 1546);
        assert_eq!(not_comparable(&before, &loose, &changes(&before, &loose)).len(), 1);
        let said = conclusion(Outcome::Unknown, &before, &loose, &changes(&before, &loose));
        assert!(said.starts_with("cannot say: retry_rate was judged against other limits"), "{said}");
        // The metric that made the before run CRIT went silent after (lost events), the others
        // are OK: the after verdict is OK, but nothing says the problem went away.
        let before = run(
            Level::Crit,
            &[("retry_rate", 0.399, Level::Crit, 0.05), ("timeout_rate", 0.0, Level::Ok, 0.001)],
            1546,
        );
        let silent =
            run(Level::Ok, &[("retry_rate", 0.0, Level::Unknown, 0.05), ("timeout_rate", 0.0, Level::Ok, 0.001)], 1546);
        let c = changes(&before, &silent);
        assert_eq!(not_comparable(&before, &silent, &c).len(), 1);
        let said = conclusion(Outcome::Unknown, &before, &silent, &c);
        assert_eq!(
            said,
            "cannot say: retry_rate, which decided the before verdict, was not judged after (events lost)"
        );
        let idle = run(Level::Unknown, &[("retry_rate", 0.0, Level::Unknown, 0.05)], 0);
        let said = conclusion(Outcome::Unknown, &before, &idle, &changes(&before, &idle));
        assert_eq!(said, "cannot say: the after run judged nothing (nothing to judge was seen)");
    }

    #[test]
    fn very_different_paces_and_losses_are_said() {
        let before = run(Level::Crit, &[], 1546);
        assert!(
            notes(&before, &run(Level::Ok, &[], 6905)).is_empty(),
            "4.5x more walks is a chunked walk, not another workload"
        );
        let more = notes(&before, &run(Level::Ok, &[], 20_000));
        assert!(
            more[0].starts_with("the after run watched far more work (773 walks/s before, 10000/s after"),
            "{more:?}"
        );
        let less = notes(&before, &run(Level::Ok, &[], 100));
        assert!(less[0].contains("a run with little work looks healthy"), "{less:?}");
        assert_eq!(notes(&before, &run(Level::Unknown, &[], 0)), ["the after run watched no walks"]);
        let mut lossy = run(Level::Ok, &[], 1546);
        lossy.lost = Lost { counted: 7, uncounted: true };
        let said = notes(&before, &lossy);
        assert!(said.iter().any(|n| n.contains("after run lost 7 events")), "{said:?}");
        assert!(said.iter().any(|n| n.contains("could not count every kind")), "{said:?}");
    }
}
