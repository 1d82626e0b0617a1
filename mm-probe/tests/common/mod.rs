//! What every end-to-end test needs: the tool and the workloads as built binaries, running them,
//! reading their NDJSON, and knowing which kernel of the matrix this is. The same test binaries
//! run on the host and inside each qemu guest (`cargo xtask vm-test`). They load programs and check
//! what is left loaded afterwards, so they run one at a time (`cargo xtask test` passes
//! `--test-threads=1`).
#![allow(dead_code)]

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Command, Output},
    sync::OnceLock,
};

use jsonschema::{Registry, Validator};
use serde_json::Value;

/// The mm-probe binary built with these tests.
pub fn mm_probe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mm-probe"))
}

/// A workload binary from testing/workloads (built by `cargo xtask test` before the tests run).
pub fn workload(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<workload>
    let path = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join(name);
    assert!(path.exists(), "workload {} not built: run `cargo build --workspace --bins` first", path.display());
    path
}

/// Runs the tool and returns its output, with stderr shown in the test log.
pub fn run_tool(args: &[&str]) -> Output {
    let output = Command::new(mm_probe()).args(args).output().expect("running mm-probe");
    eprintln!("$ mm-probe {}\n{}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    output
}

/// Parses NDJSON output into values (one per non-empty line), each checked against its schema.
pub fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout).lines().filter(|l| !l.trim().is_empty()).map(tool_line).collect()
}

/// Parses one line the tool printed with `--json` and checks it against the schema of its
/// (command, type): every test that reads the tool's JSON goes through here.
pub fn tool_line(text: &str) -> Value {
    let line: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let problems = schema_violations(&line);
    assert!(problems.is_empty(), "line breaks its schema:\n  {}\n{line}", problems.join("\n  "));
    line
}

// ---------------------------------------------------------------------------------------------
// The NDJSON schema family (schemas/ at the repository root)

/// `$id` of the shared definitions the line schemas refer to.
pub const COMMON_SCHEMA_ID: &str = "https://mm-probe.invalid/schemas/common.schema.json";
pub const COMMON_SCHEMA: &str = include_str!("../../../schemas/common.schema.json");

/// The schema of each (command, type) line. Embedded rather than read at run time, so that the
/// same test binaries check the tool's output inside the qemu guests, where the tree is not.
pub const LINE_SCHEMAS: &[(&str, &str, &str)] = &[
    ("doctor", "doctor", include_str!("../../../schemas/doctor/doctor.schema.json")),
    ("thp-why", "summary", include_str!("../../../schemas/thp-why/summary.schema.json")),
    ("thp-why", "lost_events", include_str!("../../../schemas/thp-why/lost_events.schema.json")),
    ("latency", "probe_plan", include_str!("../../../schemas/latency/probe_plan.schema.json")),
    ("latency", "interval", include_str!("../../../schemas/latency/interval.schema.json")),
    ("latency", "summary", include_str!("../../../schemas/latency/summary.schema.json")),
    ("latency", "spike", include_str!("../../../schemas/latency/spike.schema.json")),
    ("latency", "lost_events", include_str!("../../../schemas/latency/lost_events.schema.json")),
    ("retry-storm", "probe_plan", include_str!("../../../schemas/retry-storm/probe_plan.schema.json")),
    ("retry-storm", "interval", include_str!("../../../schemas/retry-storm/interval.schema.json")),
    ("retry-storm", "summary", include_str!("../../../schemas/retry-storm/summary.schema.json")),
    ("retry-storm", "lost_events", include_str!("../../../schemas/retry-storm/lost_events.schema.json")),
    ("bench-ring", "ring_check", include_str!("../../../schemas/bench-ring/ring_check.schema.json")),
];

/// Parses an embedded schema document.
pub fn schema_document(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("a schema under schemas/ is not JSON ({e}): {text}"))
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

/// The first line of type `kind`.
pub fn first_of<'a>(lines: &'a [Value], kind: &str) -> Option<&'a Value> {
    lines.iter().find(|v| v["type"] == kind)
}

/// The matrix kernel this runs on (`6.1`, `6.12-rt`…), or `None` on the host.
pub fn vm_kernel() -> Option<String> {
    std::env::var("MM_PROBE_VM_KERNEL").ok()
}

/// Directory holding the test kernel modules built for the running kernel (set by the harness).
pub fn module_dir() -> Option<PathBuf> {
    std::env::var_os("MM_PROBE_TEST_MODULES").map(PathBuf::from)
}

/// End-to-end tests load eBPF programs: fail loudly (not skip) when not root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "end-to-end tests load eBPF programs: run them as root");
}

/// Ids and names of the eBPF programs of mm-probe's object loaded in the kernel now. Program
/// names are truncated by the kernel to 15 bytes; every program of the object starts with one of
/// these prefixes.
pub fn our_programs() -> Vec<(u32, String)> {
    const PREFIXES: [&str; 6] = ["selftest_", "thp_", "lat_", "hmm_", "inv_", "mmu_"];
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(|name| (p.id(), name.to_string())))
        .filter(|(_, name)| PREFIXES.iter().any(|prefix| name.starts_with(prefix)))
        .collect()
}

/// Programs of ours loaded now that were not in `before` (taken with [`our_programs`] before the
/// tool started). Comparing with a snapshot keeps another mm-probe already running on the
/// machine from being blamed.
pub fn programs_loaded_since(before: &[(u32, String)]) -> Vec<String> {
    our_programs().into_iter().filter(|p| !before.contains(p)).map(|(_, name)| name).collect()
}

/// After the tool has exited, normally or by Ctrl-C, this must be empty: nothing it loaded stays
/// attached. The kernel frees a program after its last reference goes, through RCU, so a program
/// of a process that just exited can stay listed for a moment: allow it a few seconds to go.
pub fn leftover_programs(before: &[(u32, String)]) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = programs_loaded_since(before);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Sends SIGINT to a running tool, as Ctrl-C would.
pub fn interrupt(child: &std::process::Child) {
    // SAFETY: kill with a valid pid and signal number has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}
