use serde_json::json;

use super::*;
use crate::{
    capability::CapabilityId,
    compare::input::{Lost, Work},
    report::verdict::{MetricVerdict, Unit},
};

fn run(command: &str, level: Level, work: u64, summary: Value, plan: Option<Value>) -> Run {
    let metric = |level| MetricVerdict {
        metric: "retry_rate".to_string(),
        definition: "".into(),
        unit: Unit::Fraction,
        value: Some(0.43),
        level,
        warn: 0.1,
        crit: 0.5,
        unknown_because: None,
    };
    Run {
        file: command.to_string(),
        command: command.to_string(),
        level,
        headline: format!("{command} headline"),
        metrics: vec![metric(level)],
        duration_ns: Some(1_000_000_000),
        work: Some(Work { what: "walks", count: work }),
        lost: Lost::default(),
        summary,
        plan,
    }
}

fn watch(capability: CapabilityId, run: Run) -> Watch {
    Watch { capability, outcome: Outcome::Ran(Box::new(run)) }
}

fn seen<'a>(watches: &'a [Watch], thp: &'a Result<Scan, String>, log: &'a Result<Window, String>) -> Seen<'a> {
    Seen {
        kernel: "6.12".into(),
        duration_ns: 1,
        watches,
        thp,
        log,
        except_advised_mode: false,
        kernel_threads: [16, 19].into(),
    }
}

#[test]
fn a_crit_verdict_is_a_finding_with_its_figures_advice_and_next_command() {
    let summary = json!({
        "read_begins_by_caller": [{"tgid": 4242}, {"tgid": 4242}, {"tgid": 7}],
        "verdict": {"advice": [{"cause": "large walks", "action": "walk in 2 MiB chunks"}]}
    });
    let watches = [watch(CapabilityId::RetryStorm, run("retry-storm", Level::Crit, 100, summary, None))];
    let triage = triage(&seen(&watches, &Ok(Scan::default()), &Ok(Window::default())));
    let finding = &triage.findings[0];
    assert_eq!((finding.rank, finding.level, finding.processes), (1, Level::Crit, 2));
    assert_eq!(finding.next_command, "mm-probe retry-storm -p 4242 --interval 1s");
    assert_eq!(finding.evidence[0], "retry_rate 43.00 % (CRIT: WARN from 10.00 %, CRIT above 50.00 %)");
    assert_eq!(finding.evidence[1], "large walks: walk in 2 MiB chunks");
    assert_eq!(triage.level, Level::Crit);
}

#[test]
fn no_work_is_nothing_to_judge_and_never_healthy() {
    let watches = [
        watch(CapabilityId::Latency, run("latency", Level::Ok, 0, json!({}), None)),
        watch(CapabilityId::RetryStorm, run("retry-storm", Level::Unknown, 0, json!({}), None)),
    ];
    let triage = triage(&seen(&watches, &Err("no /proc".into()), &Err("cannot read /dev/kmsg".into())));
    assert!(triage.findings.is_empty() && triage.healthy.is_empty(), "{triage:?}");
    assert_eq!(triage.nothing_to_judge.len(), 2, "{triage:?}");
    assert_eq!(triage.level, Level::Unknown, "nothing judged is not OK");
    assert_eq!(triage.not_observable.len(), 2, "the THP scan and the log: {triage:?}");
}

#[test]
fn what_a_plan_could_not_attach_and_a_failed_watch_are_not_observable() {
    let plan = json!({"plan": {"probes": [
        {"probe": "a", "purpose": "when a runs", "status": "attached", "failed_attempts": []},
        {"probe": "b", "purpose": "when b runs", "status": "unavailable",
         "failed_attempts": [{"reason": "no kprobes"}]}
    ]}});
    let with_statements = json!({"observability": {"statements": ["callbacks are not timed"]}});
    let watches = [
        watch(CapabilityId::Latency, run("latency", Level::Ok, 5, json!({}), Some(plan))),
        watch(CapabilityId::Invalidations, run("invalidations", Level::Ok, 5, json!({}), Some(with_statements))),
        Watch { capability: CapabilityId::RetryStorm, outcome: Outcome::Failed("no BTF".into()) },
    ];
    let triage = triage(&seen(&watches, &Ok(Scan::default()), &Ok(Window::default())));
    let said: Vec<&str> = triage.not_observable.iter().map(|s| s.statement.as_str()).collect();
    assert_eq!(said, ["when b runs (b): not attached, no kprobes", "callbacks are not timed", "could not run: no BTF"]);
    assert_eq!(triage.healthy.len(), 4, "two watches, the THP scan, the log: {triage:?}");
    assert_eq!(triage.level, Level::Ok);
}

#[test]
fn crit_ranks_before_warn_and_more_processes_before_fewer() {
    let finding = |level, processes| Finding {
        rank: 0,
        level,
        source: String::new(),
        problem: format!("{level:?} {processes}"),
        evidence: vec![],
        next_command: String::new(),
        processes,
    };
    let mut findings = vec![finding(Level::Warn, 9), finding(Level::Crit, 1), finding(Level::Crit, 3)];
    rank(&mut findings);
    let order: Vec<(&str, usize)> = findings.iter().map(|f| (f.problem.as_str(), f.rank)).collect();
    assert_eq!(order, [("Crit 3", 1), ("Crit 1", 2), ("Warn 9", 3)]);
}

#[test]
fn a_thp_group_under_a_wrapper_is_one_finding_naming_the_wrapper() {
    let examined = run("thp-why", Level::Crit, 0, json!({}), None);
    let scan = Scan {
        processes_read: 40,
        groups: vec![Group {
            ancestor: (10, "wrapper".into()),
            pids: vec![10, 12],
            examined: 12,
            outcome: Ok(Box::new(examined)),
        }],
        groups_not_examined: 0,
    };
    let triage = triage(&seen(&[], &Ok(scan), &Ok(Window::default())));
    let finding = &triage.findings[0];
    assert!(finding.problem.contains("in 2 processes under pid 10 (wrapper)"), "{finding:?}");
    assert_eq!(finding.next_command, "mm-probe thp-why 12");
    assert_eq!(finding.evidence[0], "pid 12: thp-why headline");
}

#[test]
fn timeouts_in_the_log_are_a_warn_finding_with_the_lines() {
    let window = Window { matching: 3, kept: vec!["hmm_range_fault timeout".into()], overwritten: true };
    let triage = triage(&seen(&[], &Ok(Scan::default()), &Ok(window)));
    assert_eq!(triage.findings[0].level, Level::Warn);
    assert_eq!(triage.findings[0].evidence, ["hmm_range_fault timeout"]);
    assert!(triage.not_observable[0].statement.contains("wrapped"), "{triage:?}");
}

#[test]
fn latency_spikes_that_were_all_its_own_start_up_are_no_finding() {
    let own = json!({"spike_causes": [["mm-probe start-up", 1]]});
    let watches = [watch(CapabilityId::Latency, run("latency", Level::Crit, 1, own, None))];
    let triage = triage(&seen(&watches, &Ok(Scan::default()), &Ok(Window::default())));
    assert!(triage.findings.is_empty(), "{triage:?}");
    assert!(triage.nothing_to_judge[0].statement.contains("mm-probe's own start-up"), "{triage:?}");
    let mixed = json!({"spike_causes": [["mm-probe start-up", 1], ["syscall madvise", 2]]});
    let watches = [watch(CapabilityId::Latency, run("latency", Level::Crit, 9, mixed, None))];
    let judged = super::triage(&seen(&watches, &Ok(Scan::default()), &Ok(Window::default())));
    assert_eq!(judged.findings.len(), 1, "other causes stand: {judged:?}");
}

#[test]
fn latency_spikes_that_were_all_kernel_threads_are_no_finding_but_a_programs_are() {
    // pids 16 and 19 are kernel threads (`seen`); 700 is a program's thread.
    let spikes = |over: u64, tasks: Value| json!({"wakeup": {"over_threshold": over}, "tasks": tasks});
    let judged = |summary: Value| {
        let watches = [watch(CapabilityId::Latency, run("latency", Level::Crit, 40, summary, None))];
        super::triage(&seen(&watches, &Ok(Scan::default()), &Ok(Window::default())))
    };
    let kthreads = json!([
        {"pid": 16, "comm": "migration/0", "over_threshold": 1},
        {"pid": 19, "comm": "rcuc/0", "over_threshold": 2},
        {"pid": 700, "comm": "waker", "over_threshold": 0}
    ]);
    let triage = judged(spikes(3, kthreads));
    assert!(triage.findings.is_empty(), "{triage:?}");
    assert_eq!(
        triage.healthy[0].statement,
        "the 3 wait(s) over the threshold were all kernel threads' (migration/0-16, rcuc/0-19): the kernel \
         scheduling its own threads, not a real-time program's wakeup (mm-probe latency shows them); 37 other \
         wakeup(s) seen"
    );
    let with_a_program = json!([{"pid": 16, "comm": "migration/0", "over_threshold": 1}, {"pid": 700, "comm": "waker", "over_threshold": 1}]);
    assert_eq!(judged(spikes(2, with_a_program)).findings.len(), 1, "a program's wait stands");
    let rows_lost = json!([{"pid": 16, "comm": "migration/0", "over_threshold": 1}]);
    assert_eq!(judged(spikes(2, rows_lost)).findings.len(), 1, "a wait no row accounts for may be a program's");
}
