//! The NDJSON schema family (schemas/ at the repository root), compiled once per process, for
//! mm-probe's end-to-end tests (through `tool_line`) and its unit tests (lines built with every
//! optional part present). The schemas are embedded, so that the same test executables check
//! the tool's output inside the qemu guests, where the tree is not.

use std::{collections::HashMap, sync::OnceLock};

use jsonschema::{Registry, Validator};
use serde_json::Value;

/// Parses one line the tool printed with `--json` and checks it against the schema of its
/// (command, type): every test that reads the tool's JSON goes through here.
pub fn tool_line(text: &str) -> Value {
    let line: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let problems = schema_violations(&line);
    assert!(problems.is_empty(), "line breaks its schema:\n  {}\n{line}", problems.join("\n  "));
    line
}

/// `$id` of the shared definitions the line schemas refer to.
pub const COMMON_SCHEMA_ID: &str = "https://mm-probe.invalid/schemas/common.schema.json";
pub const COMMON_SCHEMA: &str = include_str!("../../../schemas/common.schema.json");

/// The schema of each (command, type) line.
pub const LINE_SCHEMAS: &[(&str, &str, &str)] = &[
    ("doctor", "doctor", include_str!("../../../schemas/doctor/doctor.schema.json")),
    ("thp-why", "summary", include_str!("../../../schemas/thp-why/summary.schema.json")),
    ("thp-why", "lost_events", include_str!("../../../schemas/thp-why/lost_events.schema.json")),
    ("latency", "probe_plan", include_str!("../../../schemas/latency/probe_plan.schema.json")),
    ("latency", "interval", include_str!("../../../schemas/latency/interval.schema.json")),
    ("latency", "summary", include_str!("../../../schemas/latency/summary.schema.json")),
    ("latency", "spike", include_str!("../../../schemas/latency/spike.schema.json")),
    ("latency", "lost_events", include_str!("../../../schemas/latency/lost_events.schema.json")),
    ("latency", "plot", include_str!("../../../schemas/latency/plot.schema.json")),
    ("retry-storm", "probe_plan", include_str!("../../../schemas/retry-storm/probe_plan.schema.json")),
    ("retry-storm", "interval", include_str!("../../../schemas/retry-storm/interval.schema.json")),
    ("retry-storm", "summary", include_str!("../../../schemas/retry-storm/summary.schema.json")),
    ("retry-storm", "lost_events", include_str!("../../../schemas/retry-storm/lost_events.schema.json")),
    ("retry-storm", "plot", include_str!("../../../schemas/retry-storm/plot.schema.json")),
    ("invalidations", "plot", include_str!("../../../schemas/invalidations/plot.schema.json")),
    ("invalidations", "probe_plan", include_str!("../../../schemas/invalidations/probe_plan.schema.json")),
    ("invalidations", "interval", include_str!("../../../schemas/invalidations/interval.schema.json")),
    ("invalidations", "summary", include_str!("../../../schemas/invalidations/summary.schema.json")),
    ("invalidations", "lost_events", include_str!("../../../schemas/invalidations/lost_events.schema.json")),
    ("compare", "comparison", include_str!("../../../schemas/compare/comparison.schema.json")),
    ("triage", "findings", include_str!("../../../schemas/triage/findings.schema.json")),
    ("bench-ring", "ring_check", include_str!("../../../schemas/bench-ring/ring_check.schema.json")),
];

/// Parses an embedded schema document.
pub fn schema_document(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("a schema under schemas/ is not JSON ({e}): {text}"))
}

/// Where `schema` breaks the draft 2020-12 meta-schema, if it does.
pub fn meta_schema_violation(schema: &Value) -> Option<String> {
    jsonschema::meta::validate(schema).err().map(|e| format!("at {}: {e}", e.instance_path()))
}

/// The schema of (command, type), compiled with the shared definitions.
pub fn compile_schema(text: &str) -> Validator {
    let registry = Registry::new()
        .add(COMMON_SCHEMA_ID, schema_document(COMMON_SCHEMA))
        .and_then(|builder| builder.prepare())
        .unwrap_or_else(|e| panic!("schemas/common.schema.json does not load: {e}"));
    jsonschema::draft202012::options()
        .with_registry(&registry)
        .build(&schema_document(text))
        .unwrap_or_else(|e| panic!("schema does not compile ({e}): {text}"))
}

fn validators() -> &'static HashMap<(&'static str, &'static str), Validator> {
    static VALIDATORS: OnceLock<HashMap<(&'static str, &'static str), Validator>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        LINE_SCHEMAS.iter().map(|(command, kind, text)| ((*command, *kind), compile_schema(text))).collect()
    })
}

/// Why `line` does not match the schema of its (command, type); empty when it does.
pub fn schema_violations(line: &Value) -> Vec<String> {
    let (command, kind) = (line["command"].as_str().unwrap_or("?"), line["type"].as_str().unwrap_or("?"));
    let Some(validator) = validators().get(&(command, kind)) else {
        return vec![format!("no schema for command {command:?}, type {kind:?}")];
    };
    validator.iter_errors(line).map(|e| format!("{}: {e}", e.instance_path())).collect()
}
