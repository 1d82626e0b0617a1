//! Newline-delimited JSON: every line carries `type`, `command` and `schema_version`, then its
//! payload. Each (command, type) pair a line can have is listed once, in [`Line`]; the JSON
//! Schema documents under `schemas/` at the repository root are keyed by the same pairs.

use serde::Serialize;
use serde_json::{Map, Value};

/// Version of the NDJSON schema family. Bump it when a field is renamed, goes away, or changes
/// type or meaning; adding a field or a line type leaves it alone (readers ignore what they do
/// not know).
pub const SCHEMA_VERSION: u32 = 6;

/// Keys every line carries; a payload field of the same name would be shadowed.
pub const ENVELOPE_KEYS: [&str; 3] = ["type", "command", "schema_version"];

/// Declares [`Line`] and its table from one list, so that a line the code can print cannot be
/// missing from [`Line::ALL`] (which the schema tests walk).
macro_rules! lines {
    ($($(#[$doc:meta])* $variant:ident => ($command:literal, $kind:literal),)*) => {
        /// Every kind of line mm-probe prints with `--json`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Line {
            $($(#[$doc])* $variant,)*
        }

        impl Line {
            pub const ALL: &'static [Line] = &[$(Line::$variant,)*];

            /// The subcommand that prints it, as the user types it.
            pub fn command(self) -> &'static str {
                match self {
                    $(Line::$variant => $command,)*
                }
            }

            /// Its `type`.
            pub fn kind(self) -> &'static str {
                match self {
                    $(Line::$variant => $kind,)*
                }
            }
        }
    };
}

lines! {
    /// `doctor --json`: the whole report in one line.
    Doctor => ("doctor", "doctor"),
    /// `thp-why --json`: the whole report in one line, printed when the run ends.
    ThpWhySummary => ("thp-why", "summary"),
    ThpWhyLostEvents => ("thp-why", "lost_events"),
    LatencyProbePlan => ("latency", "probe_plan"),
    LatencyInterval => ("latency", "interval"),
    LatencySummary => ("latency", "summary"),
    /// A wakeup or function-call spike (`kind` says which), worst first after the summary.
    LatencySpike => ("latency", "spike"),
    LatencyLostEvents => ("latency", "lost_events"),
    /// Where `--plot` wrote its figure, after everything else.
    LatencyPlot => ("latency", "plot"),
    RetryStormProbePlan => ("retry-storm", "probe_plan"),
    RetryStormInterval => ("retry-storm", "interval"),
    RetryStormSummary => ("retry-storm", "summary"),
    RetryStormLostEvents => ("retry-storm", "lost_events"),
    RetryStormPlot => ("retry-storm", "plot"),
    InvalidationsProbePlan => ("invalidations", "probe_plan"),
    InvalidationsInterval => ("invalidations", "interval"),
    InvalidationsSummary => ("invalidations", "summary"),
    InvalidationsLostEvents => ("invalidations", "lost_events"),
    InvalidationsPlot => ("invalidations", "plot"),
    /// `compare --json`: two runs of one command set side by side, in one line.
    Comparison => ("compare", "comparison"),
    /// `triage --json`: every finding, ranked, and what was healthy or not observable, in one line.
    TriageFindings => ("triage", "findings"),
    /// The hidden `bench-ring` subcommand's result, read by `cargo xtask bench`.
    BenchRingCheck => ("bench-ring", "ring_check"),
}

/// One NDJSON line: the envelope of `line`, then the fields of `payload`.
pub fn line(line: Line, payload: &impl Serialize) -> String {
    let mut object = Map::new();
    match serde_json::to_value(payload) {
        Ok(Value::Object(fields)) => {
            debug_assert!(
                ENVELOPE_KEYS.iter().all(|k| !fields.contains_key(*k)),
                "a payload field shadows the envelope of {line:?}"
            );
            object.extend(fields);
        }
        Ok(other) => {
            object.insert("value".into(), other);
        }
        Err(e) => {
            object.insert("error".into(), Value::from(e.to_string()));
        }
    }
    object.insert("type".into(), Value::from(line.kind()));
    object.insert("command".into(), Value::from(line.command()));
    object.insert("schema_version".into(), Value::from(SCHEMA_VERSION));
    Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_has_type_command_and_version() {
        #[derive(Serialize)]
        struct Interval {
            retries: u64,
        }
        let text = line(Line::RetryStormInterval, &Interval { retries: 3 });
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "interval");
        assert_eq!(v["command"], "retry-storm");
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_eq!(v["retries"], 3);
    }

    #[test]
    fn each_command_and_type_pair_is_listed_once() {
        let mut pairs: Vec<(&str, &str)> = Line::ALL.iter().map(|l| (l.command(), l.kind())).collect();
        pairs.sort_unstable();
        let before = pairs.len();
        pairs.dedup();
        assert_eq!(pairs.len(), before, "two lines share a (command, type): {pairs:?}");
    }
}
