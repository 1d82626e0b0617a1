//! What the triage tests share: running it, reading its one line, and the THP finding they
//! all make.
#![allow(dead_code)]

use serde_json::Value;

use crate::common::{Huge, json_lines, run_tool};

/// `triage --duration D --json` (and `extra`): its exit code and its one line.
pub fn triage(duration: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let out = run_tool(&[&["triage", "--duration", duration, "--json"], extra].concat());
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 1, "one findings line: {lines:?}");
    eprintln!("MEASURED triage: {}", lines[0]);
    (out.status.code(), lines[0].clone())
}

pub fn findings(t: &Value) -> &[Value] {
    t["findings"].as_array().expect("findings")
}

pub fn sources(statements: &Value) -> Vec<&str> {
    statements.as_array().expect("statements").iter().filter_map(|s| s["source"].as_str()).collect()
}

/// The wrapper's group is the finding: named by the wrapper, the largest process examined.
pub fn assert_thp_finding(finding: &Value, huge: &Huge) {
    assert_eq!(finding["source"], "thp-why", "{finding}");
    assert!(finding["level"] == "CRIT" || finding["level"] == "WARN", "{finding}");
    let problem = finding["problem"].as_str().unwrap();
    assert!(problem.contains(&format!("under pid {} ", huge.pids[0])), "named by the wrapper: {finding}");
    assert_eq!(finding["next_command"], format!("mm-probe thp-why {}", huge.pid()), "{finding}");
}

/// Whether this kernel has THP (the RT lines of Debian 6.1 are built without it): where it has
/// none, a wrapper's prctl disables nothing and there is no THP finding to make.
pub fn thp_here() -> bool {
    let here = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    if !here {
        eprintln!("this kernel has no THP (CONFIG_TRANSPARENT_HUGEPAGE off): no THP finding to make");
    }
    here
}
