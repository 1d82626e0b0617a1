//! triage's findings line read as a verdict, so that two triage runs compare like two runs of
//! one command: each source (retry-storm, invalidations, latency, thp-why, the kernel log) is one
//! metric, the count of its findings at the level of its worst one; 0 and OK where the source was
//! judged healthy; no value and UNKNOWN where it watched nothing to judge or could not observe.
//! A finding's text and next command name pids, which change between runs: the source does not.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::report::verdict::{Level, MetricVerdict, Unit};

type JudgedMetric = MetricVerdict<String>;

/// A summary's verdict as compare reads it (a command's `verdict` object), or triage's findings
/// read as one.
#[derive(Deserialize)]
pub struct VerdictLine {
    pub level: Level,
    pub headline: String,
    pub metrics: Vec<JudgedMetric>,
}

/// The command whose one line, its findings, stands for a summary.
pub const TRIAGE: &str = "triage";

/// What each per-source metric counts.
const DEFINITION: &str = "triage's findings from this source, at the level of the worst";

/// The verdict of a triage `findings` line.
pub fn verdict(line: &Value) -> Result<VerdictLine, String> {
    let level: Level = serde_json::from_value(line["level"].clone()).map_err(|e| format!("its level ({e})"))?;
    let findings = line["findings"].as_array().ok_or("it has no findings list")?;
    let mut sources: BTreeMap<String, JudgedMetric> = BTreeMap::new();
    for finding in findings {
        let source = text(finding, "source");
        let finding_level: Level = serde_json::from_value(finding["level"].clone()).unwrap_or(Level::Unknown);
        let metric = sources.entry(source.clone()).or_insert_with(|| metric(&source, Some(0.0), Level::Ok, None));
        metric.value = metric.value.map(|n| n + 1.0);
        metric.level = metric.level.max(finding_level);
    }
    for statement in list(line, "healthy") {
        let source = text(statement, "source");
        sources.entry(source.clone()).or_insert_with(|| metric(&source, Some(0.0), Level::Ok, None));
    }
    for statement in list(line, "nothing_to_judge").chain(list(line, "not_observable")) {
        let source = text(statement, "source");
        let why = text(statement, "statement");
        sources.entry(source.clone()).or_insert_with(|| metric(&source, None, Level::Unknown, Some(why)));
    }
    let headline = match findings.first() {
        Some(first) => format!("{} finding(s), first: {}", findings.len(), text(first, "problem")),
        None => "no finding".to_string(),
    };
    Ok(VerdictLine { level, headline, metrics: sources.into_values().collect() })
}

fn metric(source: &str, value: Option<f64>, level: Level, unknown_because: Option<String>) -> JudgedMetric {
    JudgedMetric {
        metric: format!("{source} findings"),
        definition: DEFINITION.into(),
        unit: Unit::Count,
        value,
        level,
        // A finding's level is its source's verdict, not a band of this count: both limits
        // are the first finding, and equal in every run, so no run is "judged differently".
        warn: 1.0,
        crit: 1.0,
        unknown_because,
    }
}

fn list<'v>(line: &'v Value, key: &str) -> impl Iterator<Item = &'v Value> {
    line[key].as_array().into_iter().flatten()
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or("?").to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_source_is_one_metric_counted_at_its_worst_findings_level() {
        let line = json!({
            "level": "CRIT",
            "findings": [
                {"source": "retry-storm", "level": "CRIT", "problem": "a retry storm in pid 7"},
                {"source": "thp-why", "level": "WARN", "problem": "THP disabled"},
                {"source": "retry-storm", "level": "WARN", "problem": "another"}
            ],
            "healthy": [{"source": "kernel log", "statement": "quiet"}, {"source": "thp-why", "statement": "x"}],
            "nothing_to_judge": [{"source": "latency", "statement": "no wakeup of a real-time task seen"}],
            "not_observable": [{"source": "latency", "statement": "later"}]
        });
        let verdict = verdict(&line).unwrap();
        assert_eq!(verdict.level, Level::Crit);
        assert!(verdict.headline.starts_with("3 finding(s), first: a retry storm in pid 7"), "{}", verdict.headline);
        let of = |name: &str| verdict.metrics.iter().find(|m| m.metric == name).unwrap();
        assert_eq!((of("retry-storm findings").value, of("retry-storm findings").level), (Some(2.0), Level::Crit));
        assert_eq!((of("thp-why findings").value, of("thp-why findings").level), (Some(1.0), Level::Warn));
        assert_eq!((of("kernel log findings").value, of("kernel log findings").level), (Some(0.0), Level::Ok));
        let latency = of("latency findings");
        assert_eq!((latency.value, latency.level), (None, Level::Unknown));
        assert_eq!(latency.unknown_because.as_deref(), Some("no wakeup of a real-time task seen"));
    }
}
