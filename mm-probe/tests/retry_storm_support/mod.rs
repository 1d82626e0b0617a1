//! What the retry-storm end-to-end tests share: the tool running with `--json` until Ctrl-C,
//! its lines collected as they come, and reading its NDJSON.
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::common;

/// The tool running in the background, its NDJSON lines collected by a thread.
pub struct Tool {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<Value>,
}

impl Tool {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(args, &[])
    }

    /// `start`, with these variables in the tool's environment (the test hooks).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(common::mm_probe())
            .args(["retry-storm", "--json", "--duration", "120s"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting mm-probe");
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut tool = Tool { child, lines, seen: Vec::new() };
        tool.wait_for("probe_plan", Duration::from_secs(90));
        tool
    }

    pub fn wait_for(&mut self, kind: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(found) = self.seen.iter().find(|v| v["type"] == kind) {
                return found.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {kind} line from mm-probe within {limit:?}"));
            self.seen.push(common::tool_line(&line));
        }
    }

    /// Ctrl-C, then the summary it must print; also returns every line it printed.
    pub fn interrupt(mut self) -> (Value, Vec<Value>) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) }, 0);
        let summary = self.wait_for("summary", Duration::from_secs(60));
        let status = self.child.wait().expect("waiting for mm-probe");
        assert_eq!(status.code(), Some(0), "Ctrl-C ends the run with a summary and exit 0");
        // The reader thread ends with the tool's stdout: what it still holds is the rest.
        for line in self.lines.iter() {
            self.seen.push(common::tool_line(&line));
        }
        (summary, self.seen)
    }
}

pub fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The piece of the verdict's advice that blames `cause`.
pub fn has_advice(summary: &Value, cause: &str) -> Option<Value> {
    summary["verdict"]["advice"].as_array().unwrap().iter().find(|a| a["cause"] == cause).cloned()
}

/// Runs `program` and insists that it succeeds.
pub fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// hmm_storm with `args`, after `prefix` (a shell that moves it into a cgroup), with a 1 s
/// retry timeout; its JSON counters.
pub fn hmm_storm(prefix: &[&str], args: &[&str]) -> Value {
    let storm = common::workload("hmm_storm");
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&storm);
            c
        }
        None => Command::new(&storm),
    };
    let out = command.args(args).args(["--timeout-ms", "1000"]).output().expect("running hmm_storm");
    assert!(out.status.success(), "hmm_storm ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("hmm_storm prints one JSON object")
}

/// The rows of `by_cause` whose class is one of `classes`: (failed walks, invalidations).
pub fn of_classes(summary: &Value, classes: &[&str]) -> (f64, f64) {
    let rows = summary["invalidations"]["by_cause"].as_array().expect("by_cause");
    let rows = rows.iter().filter(|r| classes.iter().any(|c| r["cause"]["class"] == *c));
    rows.fold((0.0, 0.0), |(w, i), r| (w + f(&r["failed_walks"]), i + f(&r["invalidations"])))
}

/// One phase under the tool: the tool's summary and the driver's counters.
pub fn traced(phase: impl FnOnce() -> Value) -> (Value, Value) {
    let tool = Tool::start(&["--timeout", "1000ms"]);
    let driver = phase();
    let (summary, _) = tool.interrupt();
    assert_eq!(summary["walks"]["ebusy"], driver["busy_returns"], "the tool's -EBUSY count is the driver's: {driver}");
    (summary, driver)
}

/// Failed walks that collided with an invalidation (any cause). A walk can fail with none seen
/// in its window (`busy_causes.unexplained`): with a few whole-range walks, one such is a large
/// share, so "most" is judged among the collisions.
pub fn collisions(summary: &Value) -> f64 {
    let rows = summary["invalidations"]["by_cause"].as_array().expect("by_cause");
    let counted: f64 = rows.iter().map(|r| f(&r["failed_walks"])).sum();
    assert!(counted > 0.0, "some failed walk collided with an invalidation: {}", summary["walks"]["busy_causes"]);
    counted
}

pub fn ebusy_per_walk(summary: &Value) -> f64 {
    f(&summary["retry_rate"]["ebusy_per_walk"])
}
