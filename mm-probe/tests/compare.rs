//! `mm-probe compare`: two real runs of one command set side by side. thp-why is the command
//! every kernel of the matrix runs without a test driver: a process whose THP a wrapper
//! disabled (before) against the same program started without the wrapper (after) is the fix
//! the tool itself advises, and two runs of one process are the same run twice. (The retry-storm
//! chunking before/after is compared in `retry_storm.rs`, beside the storms it runs.)

mod common;

use std::path::{Path, PathBuf};

use common::{Huge, Knobs, json_lines, require_root, run_tool, scratch_dir};
use serde_json::Value;

const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// `thp-why PID --json` (facts only, no live window), written to `file`.
fn thp_why_to(pid: u32, file: &Path) {
    let out = run_tool(&["thp-why", &pid.to_string(), "--duration", "0s", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    std::fs::write(file, &out.stdout).unwrap();
}

/// `compare BEFORE AFTER --json`: its one line, checked against its schema.
fn compare(before: &Path, after: &Path) -> Value {
    let out = run_tool(&["compare", &path(before), &path(after), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "one comparison line: {lines:?}");
    lines[0].clone()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn thp_here() -> bool {
    let here = Path::new(ENABLED).exists();
    if !here {
        eprintln!("this kernel has no THP (CONFIG_TRANSPARENT_HUGEPAGE off): no THP fix to compare");
    }
    here
}

#[test]
fn a_wrapper_that_disabled_thp_then_none_is_fixed_and_the_same_process_twice_is_no_change() {
    require_root();
    if !thp_here() {
        return;
    }
    let mut knobs = Knobs::default();
    knobs.set(ENABLED, "madvise");
    let dir = scratch_dir("compare-thp");
    let (before, after, again) = (dir.join("before.ndjson"), dir.join("after.ndjson"), dir.join("again.ndjson"));
    {
        let wrapped = Huge::start(true);
        thp_why_to(wrapped.pid(), &before);
    }
    let free = Huge::start(false);
    thp_why_to(free.pid(), &after);
    thp_why_to(free.pid(), &again);

    let fixed = compare(&before, &after);
    eprintln!("{fixed}");
    assert_eq!(
        (fixed["compared_command"].as_str(), fixed["outcome"].as_str()),
        (Some("thp-why"), Some("fixed")),
        "{fixed}"
    );
    assert_eq!((fixed["before"]["level"].as_str(), fixed["after"]["level"].as_str()), (Some("CRIT"), Some("OK")));
    let share = &fixed["metrics"][0];
    assert_eq!((share["metric"].as_str(), share["movement"].as_str()), (Some("small_share"), Some("fixed")), "{share}");
    assert!(share["before"].as_f64().unwrap() > 0.5 && share["after"].as_f64().unwrap() < 0.1, "{share}");
    let conclusion = fixed["conclusion"].as_str().unwrap();
    assert!(
        conclusion.starts_with("fixed: small_share ") && conclusion.ends_with(" (CRIT → OK); now OK"),
        "{conclusion}"
    );
    assert!(fixed["before"]["work"].is_null() && fixed["before"]["duration_ns"].is_null(), "thp-why watches no stream");

    let same = compare(&after, &again);
    assert_eq!(same["outcome"], "no_change", "{same}");
    assert_eq!(same["conclusion"], "no change: OK before and after", "{same}");

    // The text: both runs, the metric's row, and the conclusion last but for notes.
    let out = run_tool(&["compare", &path(&before), &path(&after)]);
    let text = String::from_utf8_lossy(&out.stdout);
    // The title names both files (wrapped where long paths pass the width).
    let title: String = text.split("\n   ").next().unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(title.starts_with(&format!("thp-why: {} → {}", path(&before), path(&after))), "{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("small_share") && l.contains("CRIT → OK")), "{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("fixed: small_share")), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs `compare` on these files: it must refuse with exit 1 and one line containing `said`.
fn refused(files: [&str; 2], said: &str) {
    let out = run_tool(&["compare", files[0], files[1]]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout when refused");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(said), "{said:?} not in {stderr}");
}

#[test]
fn what_cannot_be_compared_is_refused_with_one_line() {
    require_root();
    let dir = scratch_dir("compare-refused");
    let file = |name: &str, text: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let pid = std::process::id();
    let thp = dir.join("thp.ndjson");
    thp_why_to(pid, &thp);
    let thp_text = std::fs::read_to_string(&thp).unwrap();
    let other = file("other.ndjson", &thp_text.replace("\"thp-why\"", "\"latency\""));
    let doctor_out = run_tool(&["doctor", "--json"]);
    let doctor = file("doctor.ndjson", &String::from_utf8_lossy(&doctor_out.stdout));
    let text = file("text.txt", "Verdict: CRIT\n");
    let cut = file(
        "cut.ndjson",
        thp_text.lines().filter(|l| !l.contains("\"summary\"")).collect::<Vec<_>>().join("\n").as_str(),
    );
    let thp = path(&thp);

    refused([&thp, &path(&dir.join("missing"))], "cannot read");
    refused([&thp, &path(&text)], "line 1 is not JSON");
    refused([&thp, &path(&other)], "compare needs two runs of the same command");
    refused([&path(&doctor), &thp], "doctor output, which has no verdict to compare");
    refused([&thp, &path(&cut)], "has no summary line");
    refused(["-", "-"], "only one of BEFORE and AFTER can be standard input");
    std::fs::remove_dir_all(dir).unwrap();
}
