//! From what every source saw to the triage: each WARN or CRIT verdict a finding (the
//! command's own headline, the metrics past their limits and its first advice, the command to
//! run next), ranked; each OK verdict over real work healthy; a watch that saw no work nothing to
//! judge; and everything a source could not see, or could not run, not observable.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{
    kmsg::Window,
    report::{Finding, Statement, Triage},
    thp::{Group, MAX_GROUPS, Scan},
    watch::{Outcome, Watch},
};
use crate::{
    compare::input::{JudgedMetric, Run},
    report::verdict::Level,
};

/// What the triage read, from each source.
pub struct Seen<'a> {
    pub kernel: String,
    pub duration_ns: u64,
    pub watches: &'a [Watch],
    pub thp: &'a Result<Scan, String>,
    pub log: &'a Result<Window, String>,
    /// The kernel has a THP prctl mode that /proc/PID/status does not show (6.18+).
    pub except_advised_mode: bool,
    /// The processes the watches named that are kernel threads.
    pub kernel_threads: BTreeSet<u64>,
}

/// The four lists, filled source by source.
#[derive(Default)]
struct Lists {
    findings: Vec<Finding>,
    healthy: Vec<Statement>,
    nothing_to_judge: Vec<Statement>,
    not_observable: Vec<Statement>,
}

pub fn triage(seen: &Seen<'_>) -> Triage {
    let mut lists = Lists::default();
    for watch in seen.watches {
        judge_watch(watch, &seen.kernel_threads, &mut lists);
    }
    judge_thp(seen.thp, seen.except_advised_mode, &mut lists);
    judge_log(seen.log, &mut lists);
    rank(&mut lists.findings);
    Triage {
        kernel: seen.kernel.clone(),
        duration_ns: seen.duration_ns,
        level: overall(&lists),
        findings: lists.findings,
        healthy: lists.healthy,
        nothing_to_judge: lists.nothing_to_judge,
        not_observable: lists.not_observable,
    }
}

fn judge_watch(watch: &Watch, kernel_threads: &BTreeSet<u64>, lists: &mut Lists) {
    let command = watch.capability.command();
    let run = match &watch.outcome {
        Outcome::Ran(run) => run,
        Outcome::Failed(why) => {
            lists.not_observable.push(Statement::new(command, format!("could not run: {why}")));
            return;
        }
    };
    lists.not_observable.extend(unobservable(run).into_iter().map(|s| Statement::new(command, s)));
    let work = watch.capability.definition().summary_work.map(|w| (w.what, run.work.map(|seen| seen.count)));
    let saw_no_work = matches!(work, Some((_, Some(0))));
    if let Some((waits, whose)) = own_startup_only(run).or_else(|| kernel_threads_only(run, kernel_threads)) {
        let other = run.work.map_or(0, |w| w.count).saturating_sub(waits);
        let said = format!("the {waits} wait(s) over the threshold were all {whose}; {other} other wakeup(s) seen");
        let list = if other > 0 { &mut lists.healthy } else { &mut lists.nothing_to_judge };
        list.push(Statement::new(command, said));
        return;
    }
    match run.level {
        Level::Warn | Level::Crit => lists.findings.push(finding(watch, run)),
        Level::Ok | Level::Unknown if saw_no_work => {
            let what = work.map_or("work", |(what, _)| what);
            lists.nothing_to_judge.push(Statement::new(command, format!("no {what} seen ({})", run.headline)));
        }
        Level::Ok => lists.healthy.push(Statement::new(command, run.headline.clone())),
        Level::Unknown => lists.not_observable.push(Statement::new(command, run.headline.clone())),
    }
}

/// The spikes of a WARN or CRIT run when every one of them was mm-probe's own start-up (latency
/// names that cause: the loading of the watch's own programs held the CPU): the tool's
/// disturbance, which a triage must not report as the machine's: how many, and whose. None
/// otherwise.
fn own_startup_only(run: &Run) -> Option<(u64, String)> {
    if run.level < Level::Warn {
        return None;
    }
    let causes = run.summary.pointer("/spike_causes")?.as_array()?;
    let own_label = crate::latency::own_startup_cause();
    let count = |c: &Value| c[1].as_u64().unwrap_or(0);
    let own: u64 = causes.iter().filter(|c| c[0] == own_label.as_str()).map(count).sum();
    let all: u64 = causes.iter().map(count).sum();
    let whose = "mm-probe's own start-up (loading its programs delayed real-time tasks), not this machine's work";
    (own > 0 && own == all).then(|| (own, whose.to_string()))
}

/// The waits over the threshold of a WARN or CRIT run when every one of them was a kernel
/// thread's (migration/N waiting for another kernel thread to reach a preemption point on a
/// kernel without full preemption; ktimers, rcuc and irq_work queued behind each other at FIFO 1
/// on PREEMPT_RT): the kernel scheduling its own threads, not the wakeup of a real-time program,
/// which is what a triage judges. Only when the per-task rows account for every such wait.
fn kernel_threads_only(run: &Run, kernel_threads: &BTreeSet<u64>) -> Option<(u64, String)> {
    if run.level < Level::Warn {
        return None;
    }
    let over = run.summary.pointer("/wakeup/over_threshold")?.as_u64()?;
    let (mut theirs, mut names) = (0, Vec::new());
    for task in run.summary.pointer("/tasks")?.as_array()? {
        let waits = task["over_threshold"].as_u64().unwrap_or(0);
        if waits == 0 {
            continue;
        }
        let pid = task["pid"].as_u64()?;
        if !kernel_threads.contains(&pid) {
            return None;
        }
        theirs += waits;
        names.push(format!("{}-{pid}", task["comm"].as_str().unwrap_or("?")));
    }
    let shown = names.len().min(MAX_NAMED_THREADS);
    let more = names.len() - shown;
    let named = names[..shown].join(", ") + &if more > 0 { format!(" and {more} more") } else { String::new() };
    let whose = format!(
        "kernel threads' ({named}): the kernel scheduling its own threads, not a real-time program's wakeup \
         (mm-probe latency shows them)"
    );
    (over > 0 && theirs == over).then_some((over, whose))
}

/// Kernel threads named in a statement; the rest are counted.
const MAX_NAMED_THREADS: usize = 3;

/// What the run's plan says it could not see: its own statements where it makes them, else each
/// probe that did not attach, with the last reason tried.
fn unobservable(run: &Run) -> Vec<String> {
    let Some(plan) = &run.plan else { return Vec::new() };
    if let Some(statements) = plan["observability"]["statements"].as_array() {
        return statements.iter().filter_map(|s| s.as_str().map(str::to_string)).collect();
    }
    let probes = plan["plan"]["probes"].as_array().map(Vec::as_slice).unwrap_or_default();
    probes
        .iter()
        .filter(|p| p["status"] != "attached")
        .map(|p| {
            let reason = p["failed_attempts"].as_array().and_then(|a| a.last()).and_then(|a| a["reason"].as_str());
            format!(
                "{} ({}): not attached{}",
                p["purpose"].as_str().unwrap_or("a probe"),
                p["probe"].as_str().unwrap_or("?"),
                reason.map(|r| format!(", {r}")).unwrap_or_default()
            )
        })
        .collect()
}

/// A WARN or CRIT verdict as a finding.
fn finding(watch: &Watch, run: &Run) -> Finding {
    let command = watch.capability.command();
    let pids = watch.capability.definition().focus.map(|f| focus_pids(&run.summary, f.list, f.pid)).unwrap_or_default();
    let target = pids.first().map(|pid| format!(" -p {pid}")).unwrap_or_default();
    let mut evidence: Vec<String> = run.metrics.iter().filter(|m| m.level >= Level::Warn).map(past_limit).collect();
    evidence.extend(first_advice(&run.summary));
    Finding {
        rank: 0,
        level: run.level,
        source: command.to_string(),
        problem: run.headline.clone(),
        evidence,
        next_command: format!("mm-probe {command}{target} --interval 1s"),
        processes: pids.len(),
    }
}

/// The distinct processes a summary's list names, in its order (0, a process it could not
/// name, left out).
pub fn focus_pids(summary: &Value, list: &str, pid: &str) -> Vec<u64> {
    let mut pids = Vec::new();
    for entry in summary.pointer(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        if let Some(p) = entry[pid].as_u64().filter(|&p| p != 0 && !pids.contains(&p)) {
            pids.push(p);
        }
    }
    pids
}

/// "retry_rate 43.05 % (CRIT: WARN from 10.00 %, CRIT above 50.00 %)".
fn past_limit(m: &JudgedMetric) -> String {
    let value = m.value.map_or_else(|| "-".to_string(), |v| m.unit.format(v));
    format!(
        "{} {value} ({}: WARN from {}, CRIT above {})",
        m.metric,
        m.level.name(),
        m.unit.format(m.warn),
        m.unit.format(m.crit)
    )
}

/// The verdict's first advice: what it blames and what to do.
fn first_advice(summary: &Value) -> Option<String> {
    let advice = summary.pointer("/verdict/advice/0")?;
    Some(format!("{}: {}", advice["cause"].as_str()?, advice["action"].as_str()?))
}

fn judge_thp(scan: &Result<Scan, String>, except_advised_mode: bool, lists: &mut Lists) {
    const SOURCE: &str = "thp-why";
    if except_advised_mode {
        lists.not_observable.push(Statement::new(
            SOURCE,
            "a prctl that disables THP except where advised shows as enabled in /proc/PID/status, so this \
             scan does not find it: mm-probe thp-why PID reads it from the kernel",
        ));
    }
    let scan = match scan {
        Ok(scan) => scan,
        Err(why) => return lists.not_observable.push(Statement::new(SOURCE, why.clone())),
    };
    if scan.groups.is_empty() {
        let read = scan.processes_read;
        lists
            .healthy
            .push(Statement::new(SOURCE, format!("no process has THP disabled by prctl ({read} processes read)")));
    }
    for group in &scan.groups {
        judge_group(group, lists);
    }
    if scan.groups_not_examined > 0 {
        lists.not_observable.push(Statement::new(
            SOURCE,
            format!(
                "{} more groups of processes with THP disabled by prctl were not examined (the first {MAX_GROUPS} are)",
                scan.groups_not_examined
            ),
        ));
    }
}

fn judge_group(group: &Group, lists: &mut Lists) {
    const SOURCE: &str = "thp-why";
    let (ancestor, name) = &group.ancestor;
    let n = group.pids.len();
    let problem = format!(
        "THP disabled by prctl(PR_SET_THP_DISABLE) in {n} process{} under pid {ancestor} ({name})",
        if n == 1 { "" } else { "es" }
    );
    let run = match &group.outcome {
        Ok(run) => run,
        Err(why) => {
            let said = format!("{problem}; pid {} not examined: {why}", group.examined);
            return lists.not_observable.push(Statement::new(SOURCE, said));
        }
    };
    match run.level {
        Level::Warn | Level::Crit => {
            let mut evidence = vec![format!("pid {}: {}", group.examined, run.headline)];
            evidence.extend(run.metrics.iter().filter(|m| m.level >= Level::Warn).map(past_limit));
            lists.findings.push(Finding {
                rank: 0,
                level: run.level,
                source: SOURCE.to_string(),
                problem,
                evidence,
                next_command: format!("mm-probe thp-why {}", group.examined),
                processes: n,
            });
        }
        Level::Ok => lists.healthy.push(Statement::new(SOURCE, format!("{problem}, yet {}", run.headline))),
        Level::Unknown => lists.not_observable.push(Statement::new(SOURCE, format!("{problem}: {}", run.headline))),
    }
}

fn judge_log(log: &Result<Window, String>, lists: &mut Lists) {
    const SOURCE: &str = "kernel log";
    let window = match log {
        Ok(window) => window,
        Err(why) => return lists.not_observable.push(Statement::new(SOURCE, why.clone())),
    };
    if window.overwritten {
        lists.not_observable.push(Statement::new(
            SOURCE,
            "the log's ring wrapped during the watch: some of its records were gone before they were read",
        ));
    }
    if window.matching == 0 {
        lists.healthy.push(Statement::new(SOURCE, "no HMM or device fault timed out in the window"));
        return;
    }
    lists.findings.push(Finding {
        rank: 0,
        level: Level::Warn,
        source: SOURCE.to_string(),
        problem: format!("{} kernel log line(s) of HMM or device faults timing out in the window", window.matching),
        evidence: window.kept.clone(),
        next_command: "mm-probe retry-storm --interval 1s".to_string(),
        processes: 0,
    });
}

/// CRIT before WARN; then the finding that involves more processes (more of the machine); then
/// the order the sources were read in. Ranks count from 1.
fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| b.level.cmp(&a.level).then(b.processes.cmp(&a.processes)));
    for (i, finding) in findings.iter_mut().enumerate() {
        finding.rank = i + 1;
    }
}

/// The worst finding; OK when none and something was healthy; UNKNOWN when nothing was judged.
fn overall(lists: &Lists) -> Level {
    match lists.findings.iter().map(|f| f.level).max() {
        Some(level) => level,
        None if !lists.healthy.is_empty() => Level::Ok,
        None => Level::Unknown,
    }
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
