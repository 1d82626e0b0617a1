//! Text and NDJSON renderings of retry-storm's plan, interval lines and summary.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    metrics::{Observability, Snapshot},
    verdict::{Level, Thresholds},
};
use crate::{
    probes::{Outcome, Plan},
    report::{Log2Histogram, Percentiles, json},
    units::{format_bytes, format_nanos},
};

fn percent(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{:.1} %", v * 100.0))
}

fn latency_line(p: &Percentiles) -> String {
    if p.count == 0 {
        return "no samples".into();
    }
    format!(
        "avg {}  P50 {}  P99 {}  P99.9 {}  max {}  ({} samples)",
        format_nanos(p.mean_ns as u64),
        format_nanos(p.p50_ns),
        format_nanos(p.p99_ns),
        format_nanos(p.p999_ns),
        format_nanos(p.max_ns),
        p.count
    )
}

#[derive(Serialize)]
struct PlanLine<'a> {
    kernel: &'a str,
    plan: &'a Plan,
    observability: &'a Observability,
    thresholds: &'a Thresholds,
    timeout_ns: u64,
}

pub fn plan_json(kernel: &str, plan: &Plan, seen: &Observability, thresholds: &Thresholds, timeout_ns: u64) -> String {
    json::line(json::Line::RetryStormProbePlan, &PlanLine { kernel, plan, observability: seen, thresholds, timeout_ns })
}

/// What is watched and what is not, before the run starts (to stderr in text mode).
pub fn plan_text(kernel: &str, plan: &Plan, seen: &Observability) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "mm-probe retry-storm on {kernel}");
    for probe in &plan.probes {
        match &probe.outcome {
            Outcome::Attached { mechanism, target, caveat } => {
                let _ = writeln!(out, "  watching {:<30} {mechanism} on {target}", probe.probe);
                if let Some(caveat) = caveat {
                    let _ = writeln!(out, "      caveat: {caveat}");
                }
            }
            Outcome::Unavailable => {
                let _ = writeln!(out, "  NOT observable {:<24} lost: {}", probe.probe, probe.purpose);
            }
        }
    }
    out += &plan.unavailable_summary(crate::report::text::stderr_width());
    for statement in &seen.statements {
        let _ = writeln!(out, "  {statement}");
    }
    out
}

pub fn interval_json(snapshot: &Snapshot) -> String {
    json::line(json::Line::RetryStormInterval, snapshot)
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    stopped_by: &'a str,
    observability: &'a Observability,
}

pub fn summary_json(snapshot: &Snapshot, stopped_by: &str, seen: &Observability) -> String {
    json::line(json::Line::RetryStormSummary, &SummaryLine { snapshot, stopped_by, observability: seen })
}

pub fn lost_json(snapshot: &Snapshot) -> String {
    json::line(json::Line::RetryStormLostEvents, &snapshot.lost_events)
}

/// One line per interval.
pub fn interval_text(s: &Snapshot) -> String {
    let mut line = format!("[{:>7.1}s]", (s.start_offset_ns + s.duration_ns) as f64 / 1e9);
    match (&s.walks, &s.retry_rate) {
        (Some(w), Some(r)) => {
            let _ = write!(
                line,
                " walks {} -EBUSY {} ({} of walks, {} of invalidations)",
                w.calls,
                w.ebusy,
                percent(r.ebusy_per_walk),
                percent(r.ebusy_per_invalidation)
            );
            if w.latency.count > 0 {
                let _ = write!(
                    line,
                    " avg {} P99 {}",
                    format_nanos(w.latency.mean_ns as u64),
                    format_nanos(w.latency.p99_ns)
                );
            }
        }
        _ => line.push_str(" walks not observable"),
    }
    if let Some(loops) = &s.retry_loops {
        let _ = write!(line, " | loops ok {} gave up {}", loops.tally.success, loops.timeouts);
    }
    if let Some(i) = &s.invalidations {
        let _ = write!(
            line,
            " | invalidations {} ({}/s)",
            i.count,
            i.per_second.map_or("n/a".into(), |f| format!("{f:.0}"))
        );
    }
    let lost = s.lost_events.walk_events + s.lost_events.invalidate_events;
    if lost > 0 {
        let _ = write!(line, " | LOST {lost} events");
    }
    let _ = write!(line, " → {}", s.verdict.overall.name());
    line
}

/// The end-of-run report.
pub fn summary_text(s: &Snapshot, seen: &Observability, stopped_by: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nretry-storm summary: {:.1} s ({stopped_by})", s.duration_ns as f64 / 1e9);
    if !seen.statements.is_empty() {
        let _ = writeln!(out, "\nWhat could not be observed:");
        for statement in &seen.statements {
            let _ = writeln!(out, "  - {statement}");
        }
    }
    if let (Some(w), Some(r)) = (&s.walks, &s.retry_rate) {
        let _ = writeln!(out, "\nMirror walks (hmm_range_fault)");
        let _ = writeln!(
            out,
            "  calls {}  -EBUSY {}  other errors {}  read_begin {}",
            w.calls,
            w.ebusy,
            w.errors,
            w.read_begins.map_or("not observable".into(), |n| n.to_string())
        );
        let _ = writeln!(
            out,
            "  walk size: mean {}  max {}",
            w.mean_bytes.map_or("n/a".into(), |b| format_bytes(b as u64)),
            format_bytes(w.max_bytes)
        );
        let _ = writeln!(out, "  latency: {}", latency_line(&w.latency));
        let _ = writeln!(
            out,
            "  time lost in failed walks: {} ({} of walk time)",
            format_nanos(w.failed_walk_ns),
            percent(w.failed_walk_share)
        );
        let _ = writeln!(
            out,
            "  -EBUSY causes: true conflict {}  notifier false sharing {}  unexplained {}",
            w.busy_causes.true_conflict, w.busy_causes.false_sharing, w.busy_causes.unexplained
        );
        let _ = writeln!(out, "\nRetry rate");
        let _ = writeln!(
            out,
            "  -EBUSY ÷ invalidations (the material's retry_rate): {}",
            percent(r.ebusy_per_invalidation)
        );
        let _ = writeln!(out, "  -EBUSY ÷ hmm_range_fault calls (walks thrown away): {}", percent(r.ebusy_per_walk));
    }
    if let Some(loops) = &s.retry_loops {
        let t = &loops.tally;
        let _ = writeln!(out, "\nRetry loops (walks of one process on one notifier until success, error or giving up)");
        let _ = writeln!(
            out,
            "  success {}  error {}  timed out {}  gave up while failing {}  still retrying at the end {}",
            t.success, t.error, t.timed_out, t.gave_up, t.unfinished
        );
        let _ = writeln!(
            out,
            "  timeouts {}: {} of invalidations (timeout_rate), {} of loops",
            loops.timeouts,
            percent(loops.timeout_rate_per_invalidation),
            percent(loops.timeout_rate_per_loop)
        );
        let _ = writeln!(out, "  loop duration: {}", latency_line(&loops.duration));
        let _ = write!(
            out,
            "  walks per loop:\n{}",
            Log2Histogram::new(loops.length_log2_hist.clone()).render("walks", None)
        );
    }
    if let Some(i) = &s.invalidations {
        let _ = writeln!(out, "\nInvalidations of mirrored memory (__mmu_notifier_invalidate_range_start)");
        let _ = writeln!(
            out,
            "  {} ({}/s); {} more on mms nothing here mirrors (not counted)",
            i.count,
            i.per_second.map_or("n/a".into(), |f| format!("{f:.0}")),
            i.other_mms
        );
        let _ = write!(out, "  size:\n{}", Log2Histogram::new(i.size_bytes_log2_hist.clone()).render("bytes", None));
        if !i.top_invalidators.is_empty() {
            let _ = writeln!(
                out,
                "  top invalidators:\n    {:<16} {:<16} {:>10} {:>12}",
                "comm", "event", "count", "bytes"
            );
            for top in &i.top_invalidators {
                let _ = writeln!(
                    out,
                    "    {:<16} {:<16} {:>10} {:>12}",
                    top.comm,
                    top.event.name(),
                    top.count,
                    format_bytes(top.bytes)
                );
            }
        }
        let o = &i.overlap_with_walks;
        let _ = writeln!(
            out,
            "  overlapping walks: walked range {}  notifier interval only {}  outside the notifiers {}  no walk running {}",
            o.walked_range, o.notifier_interval_only, o.outside_notifiers, o.no_walk_running
        );
        let _ = write!(
            out,
            "  time in invalidate callbacks:\n{}",
            Log2Histogram::new(i.callback_ns_log2_hist.clone()).render("nsecs", Some(super::verdict::SLOW_CALLBACK_NS))
        );
    }
    if !s.read_begins_by_caller.is_empty() {
        let _ = writeln!(out, "\nSequence starts (mmu_interval_read_begin) by process and notifier");
        for caller in &s.read_begins_by_caller {
            let _ = writeln!(out, "    tgid {:<8} notifier {:<20} {:>10}", caller.tgid, caller.notifier, caller.calls);
        }
    }
    if let Some(k) = &s.kvm {
        let _ = writeln!(out, "\nKVM secondary MMU: unmap_hva_range {}  age_hva {}", k.unmap_hva_range, k.age_hva);
    }
    let l = &s.lost_events;
    let _ = writeln!(
        out,
        "\nLost events: {} walk, {} invalidation (ring buffer full); {} walk entries missed",
        l.walk_events, l.invalidate_events, l.walk_entries_missed
    );
    let _ = writeln!(out, "\nVerdict: {}", s.verdict.overall.name());
    for m in &s.verdict.metrics {
        let value = match (m.value, m.unit) {
            (None, _) => "not observable / no data".to_string(),
            (Some(v), "ns") => format_nanos(v as u64),
            (Some(v), "per_second") => format!("{v:.0}/s"),
            (Some(v), _) => format!("{:.2} %", v * 100.0),
        };
        let _ = writeln!(out, "  {:<16} {:>14}  {:<7} ({})", m.metric, value, m.level.name(), m.definition);
    }
    if s.verdict.overall == Level::Unknown {
        let _ = writeln!(out, "  nothing to judge: no mirror walk or invalidation was observed");
    }
    if !s.verdict.advice.is_empty() {
        let _ = writeln!(out, "\nAdvice");
        for a in &s.verdict.advice {
            let _ = writeln!(out, "  - {}: {}\n    → {}", a.cause, a.evidence, a.action);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        probes::{AttachFailure, Attempt, ProbePlan},
        report::schema_check::tool_line,
        retry_storm::{
            events::NotifierEvent,
            metrics::{
                CauseTally, ChainMetrics, ChainTally, InvalidationMetrics, Invalidator, KvmMetrics, LostEvents,
                OverlapTally, ReadBeginCaller, RetryRate, WalkMetrics,
            },
            verdict::{Evidence, judge},
        },
    };

    fn percentiles() -> Percentiles {
        Percentiles { count: 3, mean_ns: 1500.0, p50_ns: 1000, p90_ns: 2000, p99_ns: 2000, p999_ns: 2000, max_ns: 2000 }
    }

    /// A window where every probe attached and every metric has a value, advice included.
    fn everything_observed() -> Snapshot {
        let storm = Evidence {
            walks: 3,
            busy_walks: 2,
            retry_rate: Some(0.5),
            busy_per_walk: Some(0.6),
            avg_walk_ns: Some(900_000.0),
            mean_walk_bytes: Some(64.0 * 1024.0 * 1024.0),
            ..Evidence::default()
        };
        Snapshot {
            start_offset_ns: 1_000_000_000,
            duration_ns: 1_000_000_000,
            walks: Some(WalkMetrics {
                calls: 3,
                ebusy: 2,
                errors: 0,
                read_begins: Some(5),
                mean_bytes: Some(4096.0),
                max_bytes: 8192,
                latency: percentiles(),
                failed_walk_ns: 2000,
                failed_walk_share: Some(0.4),
                busy_causes: CauseTally { true_conflict: 1, false_sharing: 1, unexplained: 0 },
            }),
            retry_rate: Some(RetryRate { ebusy_per_invalidation: Some(0.2), ebusy_per_walk: Some(0.66) }),
            retry_loops: Some(ChainMetrics {
                tally: ChainTally { success: 1, gave_up: 1, ..ChainTally::default() },
                timeouts: 1,
                timeout_rate_per_invalidation: Some(0.1),
                timeout_rate_per_loop: Some(0.5),
                duration: percentiles(),
                length_log2_hist: vec![1, 1],
            }),
            invalidations: Some(InvalidationMetrics {
                count: 10,
                other_mms: 4,
                per_second: Some(10.0),
                size_bytes_log2_hist: vec![0, 0, 3],
                top_invalidators: vec![Invalidator {
                    comm: "madv".into(),
                    event: NotifierEvent::Clear,
                    count: 10,
                    bytes: 655_360,
                }],
                overlap_with_walks: OverlapTally { walked_range: 1, ..OverlapTally::default() },
                callback_ns_log2_hist: vec![0, 2],
                callback_p99_ns: Some(3),
                start_to_end_ns_log2_hist: vec![2],
            }),
            kvm: Some(KvmMetrics { unmap_hva_range: 1, age_hva: 2, size_bytes_log2_hist: vec![0, 3] }),
            lost_events: LostEvents { walk_events: 0, invalidate_events: 1, walk_entries_missed: 0 },
            read_begins_by_caller: vec![ReadBeginCaller { tgid: 42, notifier: "0xffff8881".into(), calls: 5 }],
            verdict: judge(&storm, &Thresholds::default()),
        }
    }

    fn plan() -> Plan {
        let failed = Attempt {
            mechanism: "fentry+fexit".into(),
            target: "hmm_range_fault".into(),
            reason: AttachFailure::TrampolinesRefused,
        };
        let attached = ProbePlan {
            probe: "hmm_range_fault walk",
            purpose: "walks",
            outcome: Outcome::Attached {
                mechanism: "kprobe".into(),
                target: "hmm_range_fault".into(),
                caveat: Some("clone".into()),
            },
            failed_attempts: vec![failed.clone()],
        };
        let missing = ProbePlan {
            probe: "kvm age",
            purpose: "kvm",
            outcome: Outcome::Unavailable,
            failed_attempts: vec![failed],
        };
        Plan { probes: vec![attached, missing] }
    }

    #[test]
    fn every_json_line_matches_its_schema_with_every_metric_observed() {
        let snapshot = everything_observed();
        assert!(!snapshot.verdict.advice.is_empty(), "the advice must be in the checked line too");
        let seen = Observability {
            walks: true,
            invalidations: true,
            kvm_age: true,
            statements: vec!["…".into()],
            ..Observability::default()
        };
        tool_line(&plan_json("6.12.57", &plan(), &seen, &Thresholds::default(), 1_000_000_000));
        tool_line(&interval_json(&snapshot));
        tool_line(&summary_json(&snapshot, "interrupted", &seen));
        tool_line(&lost_json(&snapshot));
    }
}
