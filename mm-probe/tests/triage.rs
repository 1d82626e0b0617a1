//! `mm-probe triage`: the whole machine watched by every capability at once. An idle machine
//! gets no invented finding and says what it cannot see; one problem alone (a wrapper that
//! disabled THP by prctl before exec'ing a program that wants huge pages) is the only finding;
//! a stop signal still gives the findings and leaves nothing loaded. "No invented finding"
//! includes latency's (no real-time program delayed; kernel threads' waits, which guests have,
//! are said, not found): a claim on guest time, so the guests run this executable under
//! instruction counting, where host load cannot delay a guest task.
//! Several problems at once are `triage_storms.rs`.

mod common;
mod triage_support;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Huge, json_lines, leftover_programs, our_programs, programs_loaded_since, require_root, run_tool};
use triage_support::{assert_thp_finding, findings, sources, thp_here, triage};

#[test]
fn an_idle_machine_gets_no_invented_finding_and_says_what_it_cannot_see() {
    require_root();
    let (code, t) = triage("3s", &[]);
    assert_eq!(code, Some(0));
    assert!(findings(&t).is_empty(), "nothing is wrong on an idle machine: {}", t["findings"]);
    assert_ne!(t["level"], "CRIT");
    // Without the test driver no process mirrors memory: retry-storm watched nothing, or (the
    // host: no kprobes) could not see the walks. Either way it is not called healthy.
    assert!(!sources(&t["healthy"]).contains(&"retry-storm"), "{}", t["healthy"]);
    let unjudged = [sources(&t["nothing_to_judge"]), sources(&t["not_observable"])].concat();
    assert!(unjudged.contains(&"retry-storm"), "retry-storm saw no walk and says so: {t}");
    let thp_said = if thp_here() { &t["healthy"] } else { &t["not_observable"] };
    assert!(sources(thp_said).contains(&"thp-why"), "no process has THP disabled, or no THP here: {t}");
}

#[test]
fn a_wrapper_that_disabled_thp_alone_is_the_only_finding() {
    require_root();
    if !thp_here() {
        return;
    }
    let huge = Huge::start(true);
    let (code, t) = triage("2s", &["--check"]);
    let all = findings(&t);
    assert_eq!(all.len(), 1, "one problem, one finding: {}", t["findings"]);
    assert_thp_finding(&all[0], &huge);
    let expected = if all[0]["level"] == "CRIT" { 3 } else { 0 };
    assert_eq!(code, Some(expected), "--check exits 3 exactly when a finding is CRIT");
}

/// Two triage runs compare like two runs of one command: the wrapper's THP finding gone is
/// "fixed" with its count (one metric per source, as pids change between runs); two runs of the
/// same healthy machine are "no change".
#[test]
fn compare_says_fixed_once_the_wrappers_thp_finding_is_gone_and_no_change_between_two_idle_runs() {
    require_root();
    if !thp_here() {
        return;
    }
    let dir = common::scratch_dir("triage-compare");
    let save = |name: &str| {
        let (_, t) = triage("2s", &[]);
        let path = dir.join(name);
        std::fs::write(&path, format!("{t}\n")).unwrap();
        (t, path.to_str().unwrap().to_string())
    };
    let huge = Huge::start(true);
    let (before, before_file) = save("before.json");
    drop(huge);
    let (after, after_file) = save("after.json");
    let (_, again_file) = save("again.json");
    assert_eq!(findings(&before).len(), 1, "{}", before["findings"]);
    assert!(findings(&after).is_empty(), "{}", after["findings"]);
    let compare = |a: &str, b: &str| {
        let out = run_tool(&["compare", a, b, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        json_lines(&out.stdout).remove(0)
    };
    let fixed = compare(&before_file, &after_file);
    assert_eq!(fixed["outcome"], "fixed", "{fixed}");
    let conclusion = fixed["conclusion"].as_str().unwrap();
    assert!(conclusion.contains("thp-why findings 1 → 0"), "{conclusion}");
    let same = compare(&after_file, &again_file);
    assert_eq!(same["outcome"], "no_change", "{same}");
}

#[test]
fn a_stop_signal_ends_every_watch_with_its_findings_and_leaves_nothing_loaded() {
    require_root();
    let before = our_programs();
    let child = Command::new(common::mm_probe())
        .args(["triage", "--duration", "10m", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting triage");
    // Until the last watch to start, latency's, has loaded its programs (seconds in an
    // emulated guest), or 120 s.
    let start = Instant::now();
    let latency_loaded = || programs_loaded_since(&before).iter().any(|p| p.starts_with("lat_"));
    while !latency_loaded() && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    // SIGTERM, as a script or a service manager stops it: the terminal's Ctrl-C reaches the
    // watches by itself, this one only through the triage.
    // SAFETY: kill(2) on our own running child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("triage");
    assert_eq!(out.status.code(), Some(0), "a stopped triage still reports");
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0]["duration_ns"].as_u64().unwrap() < 300_000_000_000, "stopped long before 10m");
    let watched = [&lines[0]["findings"], &lines[0]["healthy"], &lines[0]["nothing_to_judge"]];
    assert!(watched.iter().any(|l| !l.as_array().unwrap().is_empty()), "judged what it saw: {}", lines[0]);
    assert!(
        !lines[0]["not_observable"].to_string().contains("could not run"),
        "every watch ended with its summary: {}",
        lines[0]["not_observable"]
    );
    assert_eq!(leftover_programs(&before), Vec::<String>::new(), "nothing stays loaded");
}

#[test]
fn a_watch_of_zero_is_refused_in_one_line() {
    let out = run_tool(&["triage", "--duration", "0s"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("a watch of zero sees nothing"), "{stderr}");
}
