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
