//! The verdict against the threshold, in plain words with numbers.
//!
//! OK: no wakeup waited longer than the threshold. WARN: some did, but fewer than one in a
//! thousand (P99.9 still meets it). CRIT: one in a thousand or more. A CRIT is still a
//! successful diagnosis (exit 0). The cause most spikes share is named beside the level.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{aggregator::Distribution, attribution::Cause};
use crate::units::format_nanos;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Ok,
    Warn,
    Crit,
    /// No measured task woke up.
    NoData,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Crit => "CRIT",
            Level::NoData => "NO DATA",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub level: Level,
    pub text: String,
    /// Spikes per cause (labelled as in the spike lines: a traced function, `syscall <name>`,
    /// `cpu contention`, `idle`…), most first.
    pub causes: Vec<(String, u64)>,
}

/// Fewer spikes than this fraction of wakeups is a warning, not critical.
const WARN_FRACTION: f64 = 0.001;

/// Judges the run's wakeups against `threshold_ns`. `causes` counts every spike seen (not just
/// the listed top N) by cause; `names[slot]` names each function slot; `functions` gives each
/// attached traced function's distribution.
pub fn judge(
    wakeups: &Distribution,
    threshold_ns: u64,
    causes: &BTreeMap<Cause, u64>,
    names: &[String],
    functions: &[(String, Distribution)],
) -> Verdict {
    let mut ranked: Vec<(Cause, u64)> = causes.iter().map(|(c, n)| (*c, *n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.label(names).cmp(&b.0.label(names))));
    let threshold = format_nanos(threshold_ns);
    let (level, mut text) = if wakeups.count == 0 {
        (
            Level::NoData,
            "no measured task woke up: start the real-time workload, or widen the selection with -p or --all-tasks"
                .to_string(),
        )
    } else if wakeups.over_threshold == 0 {
        (
            Level::Ok,
            format!(
                "all {} wakeups ran within {threshold} (worst {})",
                wakeups.count,
                format_nanos(wakeups.max_ns.unwrap_or(0))
            ),
        )
    } else {
        let fraction = wakeups.over_threshold as f64 / wakeups.count as f64;
        let level = if fraction < WARN_FRACTION { Level::Warn } else { Level::Crit };
        let mut text = format!(
            "{} of {} wakeups ({:.2}%) waited longer than {threshold} (worst {})",
            wakeups.over_threshold,
            wakeups.count,
            fraction * 100.0,
            format_nanos(wakeups.max_ns.unwrap_or(0))
        );
        if let Some((cause, n)) = ranked.first() {
            let total: u64 = ranked.iter().map(|(_, n)| n).sum();
            text += &format!("; most common cause ({n} of {total} spikes): {}", cause.describe(names));
        }
        (level, text)
    };
    for (name, d) in functions.iter().filter(|(_, d)| d.over_threshold > 0) {
        text += &format!(
            "; {name} ran longer than {threshold} {} times (worst {})",
            d.over_threshold,
            format_nanos(d.max_ns.unwrap_or(0))
        );
    }
    Verdict { level, text, causes: ranked.into_iter().map(|(cause, n)| (cause.label(names), n)).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(count: u64, over: u64, max_ns: u64) -> Distribution {
        Distribution { count, over_threshold: over, max_ns: Some(max_ns), ..Distribution::default() }
    }

    #[test]
    fn levels_follow_the_share_over_threshold() {
        let none = BTreeMap::new();
        assert_eq!(judge(&dist(0, 0, 0), 500_000, &none, &[], &[]).level, Level::NoData);
        let ok = judge(&dist(1000, 0, 120_000), 500_000, &none, &[], &[]);
        assert_eq!(ok.level, Level::Ok);
        assert_eq!(ok.text, "all 1000 wakeups ran within 500µs (worst 120µs)");
        assert_eq!(judge(&dist(10_000, 9, 900_000), 500_000, &none, &[], &[]).level, Level::Warn);
        assert_eq!(judge(&dist(10_000, 10, 900_000), 500_000, &none, &[], &[]).level, Level::Crit);
    }

    #[test]
    fn the_common_cause_and_slow_functions_are_named() {
        let names = ["madvise_cold_or_pageout_pte_range".to_string()];
        let causes = BTreeMap::from([(Cause::Function(0), 15), (Cause::Syscall(libc::SYS_munmap), 2)]);
        let functions = [(names[0].clone(), dist(50_000, 20, 1_941_000))];
        let v = judge(&dist(12_034, 17, 1_953_000), 500_000, &causes, &names, &functions);
        assert_eq!(v.level, Level::Crit);
        assert_eq!(
            v.text,
            "17 of 12034 wakeups (0.14%) waited longer than 500µs (worst 1.95ms); most common cause (15 of \
             17 spikes): the blocker was inside madvise_cold_or_pageout_pte_range; \
             madvise_cold_or_pageout_pte_range ran longer than 500µs 20 times (worst 1.94ms)"
        );
        assert_eq!(v.causes, [(names[0].clone(), 15), ("syscall munmap".to_string(), 2)]);
    }

    #[test]
    fn contention_as_the_common_cause_is_said_in_words() {
        let causes = BTreeMap::from([(Cause::CpuContention, 5), (Cause::Preempted, 1)]);
        let v = judge(&dist(1000, 6, 3_000_000), 500_000, &causes, &[], &[]);
        assert!(v.text.ends_with("most common cause (5 of 6 spikes): CPU contention: several tasks ran in turn, none for most of the wait"), "{}", v.text);
        assert_eq!(v.causes[0], ("cpu contention".to_string(), 5));
    }
}
