//! One run as `compare` reads it: the NDJSON a command printed with `--json`, read line by line
//! (a long `--interval` run holds one summary among thousands of intervals, so only the lines
//! compare needs are kept), and refused with one line when it is not something compare can read.

use std::io::{BufRead, BufReader, Read};

use anyhow::Result;
use serde_json::Value;

use super::findings::{TRIAGE, VerdictLine};
use crate::{
    capability::CapabilityId,
    error::UserError,
    report::{
        json::{self, SCHEMA_VERSION},
        verdict::{Level, MetricVerdict},
    },
};

/// The figures of one run that a comparison uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// As the user named it (`-` for standard input).
    pub file: String,
    pub command: String,
    pub level: Level,
    pub headline: String,
    pub metrics: Vec<JudgedMetric>,
    pub duration_ns: Option<u64>,
    /// What the command counts as the work it watched, and how much it saw (None where its
    /// kernel did not let it count, or the command watches no stream of work).
    pub work: Option<Work>,
    pub lost: Lost,
    /// The summary line as printed, for what only one reader wants (triage's next command).
    pub summary: Value,
    /// The probe_plan line, where the command printed one.
    pub plan: Option<Value>,
}

/// One metric of the run's verdict, as its summary printed it.
pub type JudgedMetric = MetricVerdict<String>;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    /// "walks", "invalidations", "wakeups".
    pub what: &'static str,
    pub count: u64,
}

/// What the run's `lost_events` line says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Every counted loss, summed.
    pub counted: u64,
    /// Some kind was not countable on that kernel (null in its line), or there was no line.
    pub uncounted: bool,
}

/// Reads `file` (`-`: standard input).
pub fn read(file: &str) -> Result<Run> {
    let reader: Box<dyn Read> = if file == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(file).map_err(|e| UserError::new(format!("cannot read {file}: {e}")))?)
    };
    let lines = BufReader::new(reader).lines().map(|l| l.map_err(|e| format!("cannot read {file}: {e}")));
    Ok(from_lines(file, lines)?)
}

/// The run in `lines`, or why it cannot be compared.
pub fn from_lines(file: &str, lines: impl Iterator<Item = Result<String, String>>) -> Result<Run, UserError> {
    let kept = keep_lines(file, lines)?;
    let command = kept.command.ok_or_else(|| UserError::new(format!("{file} is empty: {WANTED}")))?;
    let summary = kept.summary.ok_or_else(|| no_summary(file, &command))?;
    let verdict: VerdictLine = if command == TRIAGE {
        super::findings::verdict(&summary)
            .map_err(|e| UserError::new(format!("{file}: its findings cannot be read: {e}")))?
    } else {
        serde_json::from_value(summary["verdict"].clone())
            .map_err(|e| UserError::new(format!("{file}: its summary's verdict cannot be read ({e})")))?
    };
    Ok(Run {
        file: file.to_string(),
        level: verdict.level,
        headline: verdict.headline,
        metrics: verdict.metrics,
        duration_ns: summary["duration_ns"].as_u64(),
        work: work_of(&command, &summary),
        lost: kept.lost.as_ref().map_or(Lost { counted: 0, uncounted: true }, lost_of),
        command,
        summary,
        plan: kept.plan,
    })
}

/// What compare reads, said in every refusal of a file that is not it.
const WANTED: &str = "compare reads what retry-storm, invalidations, latency, thp-why or triage print with --json";

/// The lines of one run that compare needs: its command, its last summary and lost_events.
#[derive(Default)]
struct Kept {
    command: Option<String>,
    summary: Option<Value>,
    lost: Option<Value>,
    plan: Option<Value>,
}

fn keep_lines(file: &str, lines: impl Iterator<Item = Result<String, String>>) -> Result<Kept, UserError> {
    let mut kept = Kept::default();
    for (number, line) in lines.enumerate() {
        let line = line.map_err(UserError::new)?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line)
            .map_err(|_| UserError::new(format!("{file} line {} is not JSON: {WANTED}", number + 1)))?;
        let command = envelope(file, number + 1, &value)?;
        match &kept.command {
            Some(first) if *first != command => {
                return Err(UserError::new(format!("{file} mixes the output of {first} and {command}")));
            }
            Some(_) => {}
            None => kept.command = Some(command),
        }
        match value["type"].as_str() {
            Some("summary") => kept.summary = Some(value),
            Some("findings") if value["command"] == TRIAGE => kept.summary = Some(value),
            Some("lost_events") => kept.lost = Some(value),
            Some("probe_plan") => kept.plan = Some(value),
            _ => {}
        }
    }
    Ok(kept)
}

/// The line's command, once its envelope says it is mm-probe output of this schema version.
fn envelope(file: &str, number: usize, value: &Value) -> Result<String, UserError> {
    let (Some(command), Some(_)) = (value["command"].as_str(), value["type"].as_str()) else {
        return Err(UserError::new(format!("{file} line {number} is not mm-probe output: {WANTED}")));
    };
    match value["schema_version"].as_u64() {
        Some(version) if version == u64::from(SCHEMA_VERSION) => Ok(command.to_string()),
        version => Err(UserError::new(format!(
            "{file} is schema_version {}, and this mm-probe reads {SCHEMA_VERSION}: compare it with the \
             mm-probe that wrote it",
            version.map_or_else(|| "missing".to_string(), |v| v.to_string())
        ))),
    }
}

/// Why a file of `command` has no summary: the command prints none, or the run never ended.
fn no_summary(file: &str, command: &str) -> UserError {
    let prints_summaries = json::Line::ALL.iter().any(|l| l.command() == command && l.kind() == "summary");
    if prints_summaries {
        UserError::new(format!(
            "{file} has no summary line: the {command} run did not reach its end (it prints its summary when \
             it stops), or the file holds only its intervals"
        ))
    } else {
        UserError::new(format!("{file} is {command} output, which has no verdict to compare: {WANTED}"))
    }
}

fn work_of(command: &str, summary: &Value) -> Option<Work> {
    let capability = CapabilityId::ALL.iter().find(|c| c.command() == command)?;
    let work = capability.definition().summary_work?;
    Some(Work { what: work.what, count: summary.pointer(work.count)?.as_u64()? })
}

/// Every count in the `lost_events` line, summed; a null is a kind that kernel could not count.
fn lost_of(line: &Value) -> Lost {
    let mut lost = Lost::default();
    for (key, value) in line.as_object().into_iter().flatten() {
        if json::ENVELOPE_KEYS.contains(&key.as_str()) {
            continue;
        }
        match value.as_u64() {
            Some(n) => lost.counted += n,
            None => lost.uncounted = true,
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retry-storm run as NDJSON: a plan, an interval, the summary, the lost events.
    pub(crate) fn storm_lines(retry_rate: f64, level: &str) -> Vec<String> {
        let v = SCHEMA_VERSION;
        vec![
            format!(r#"{{"type":"probe_plan","command":"retry-storm","schema_version":{v}}}"#),
            format!(r#"{{"type":"interval","command":"retry-storm","schema_version":{v}}}"#),
            format!(
                r#"{{"type":"summary","command":"retry-storm","schema_version":{v},"duration_ns":2000000000,
                "walks":{{"calls":1546}},"verdict":{{"level":"{level}","headline":"h","advice":[],"metrics":[
                {{"metric":"retry_rate","definition":"d","unit":"fraction","value":{retry_rate},"level":"{level}",
                "warn":0.05,"crit":0.15,"unknown_because":null}}]}}}}"#
            )
            .replace('\n', ""),
            format!(
                r#"{{"type":"lost_events","command":"retry-storm","schema_version":{v},"walk_events":3,"read_begin_callers":null}}"#
            ),
        ]
    }

    fn parse(lines: &[String]) -> Result<Run, UserError> {
        from_lines("f", lines.iter().map(|l| Ok(l.clone())))
    }

    #[test]
    fn a_run_keeps_its_verdict_work_and_losses() {
        let run = parse(&storm_lines(0.399, "CRIT")).unwrap();
        assert_eq!(
            (run.command.as_str(), run.level, run.duration_ns),
            ("retry-storm", Level::Crit, Some(2_000_000_000))
        );
        assert_eq!(run.work, Some(Work { what: "walks", count: 1546 }));
        assert_eq!(run.lost, Lost { counted: 3, uncounted: true });
        assert_eq!((run.metrics[0].metric.as_str(), run.metrics[0].value), ("retry_rate", Some(0.399)));
    }

    #[test]
    fn what_compare_cannot_read_is_refused_with_one_line() {
        let refused = |lines: &[String]| parse(lines).unwrap_err().to_string();
        assert!(refused(&[]).contains("f is empty"));
        assert!(refused(&["Verdict: CRIT".into()]).contains("f line 1 is not JSON"));
        assert!(refused(&[r#"{"a":1}"#.into()]).contains("not mm-probe output"));
        let mut cut = storm_lines(0.1, "WARN");
        cut.remove(2);
        assert!(refused(&cut).contains("has no summary line"), "{}", refused(&cut));
        let old =
            storm_lines(0.1, "WARN").iter().map(|l| l.replace(&format!(":{SCHEMA_VERSION}"), ":4")).collect::<Vec<_>>();
        assert!(refused(&old).contains("is schema_version 4"), "{}", refused(&old));
        let doctor = format!(r#"{{"type":"doctor","command":"doctor","schema_version":{SCHEMA_VERSION}}}"#);
        assert!(refused(&[doctor]).contains("doctor output, which has no verdict"));
        let mut mixed = storm_lines(0.1, "WARN");
        mixed.push(mixed[0].replace("retry-storm", "latency"));
        assert!(refused(&mixed).contains("mixes the output of retry-storm and latency"));
    }

    #[test]
    fn every_summary_work_pointer_names_an_integer_of_its_summary_schema() {
        for &capability in CapabilityId::ALL {
            let Some(work) = capability.definition().summary_work else { continue };
            let node = crate::capability::summary_schema_node(capability, work.count);
            assert!(node["type"].to_string().contains("integer"), "{capability:?}: {} is {node}", work.count);
        }
    }
}
