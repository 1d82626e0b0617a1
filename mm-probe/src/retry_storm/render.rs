//! Text renderings of retry-storm's plan, interval lines and summary (the JSON lines are
//! report.rs's).

use std::fmt::Write as _;

use super::{
    judge::SLOW_CALLBACK_NS,
    report::{CauseRow, Observability, Snapshot},
};
use crate::{
    collect::Stop,
    probes::Plan,
    report::{Log2Histogram, Percentiles, text},
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

/// What is watched and what is not, before the run starts (to stderr in text mode).
pub fn plan_text(kernel: &str, plan: &Plan, seen: &Observability) -> String {
    crate::report::statement::plan_text("retry-storm", kernel, plan, &seen.statements)
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
    let lost = s.lost_events.total();
    if lost > 0 {
        let _ = write!(line, " | LOST {lost} events");
    }
    let _ = write!(line, " → {}", s.verdict.level.name());
    line
}

/// The end-of-run report.
pub fn summary_text(s: &Snapshot, seen: &Observability, stopped_by: Stop) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nretry-storm summary: {:.1} s ({})", s.duration_ns as f64 / 1e9, stopped_by.name());
    if !seen.statements.is_empty() {
        let _ = writeln!(out, "\nWhat could not be observed:");
        for statement in &seen.statements {
            let _ = writeln!(out, "  - {}", statement.text());
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
        let c = &w.busy_causes;
        let _ = writeln!(
            out,
            "  -EBUSY causes: true conflict {}  notifier false sharing {}\n                stale sequence {}  unexplained {}",
            c.true_conflict, c.false_sharing, c.stale_sequence, c.unexplained
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
        let stale = &loops.stale_sequence;
        if stale.loops > 0 {
            let _ = writeln!(
                out,
                "  cannot succeed (stale sequence): {} loops, {} retries\n    {} given up after {} in all",
                stale.loops,
                stale.retries,
                stale.gave_up,
                format_nanos(stale.given_up_ns)
            );
        }
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
        out += &causes_text(&i.by_cause);
        let o = &i.overlap_with_walks;
        let _ = writeln!(
            out,
            "  overlapping walks: walked range {}  notifier interval only {}  outside the notifiers {}  no walk running {}",
            o.walked_range, o.notifier_interval_only, o.outside_notifiers, o.no_walk_running
        );
        let _ = write!(
            out,
            "  time in invalidate callbacks:\n{}",
            Log2Histogram::new(i.callback_ns_log2_hist.clone()).render("nsecs", Some(SLOW_CALLBACK_NS))
        );
    }
    if !s.read_begins_by_caller.is_empty() {
        let _ = writeln!(out, "\nSequence starts (mmu_interval_read_begin) by process and notifier");
        for caller in &s.read_begins_by_caller {
            let owner = match (&caller.subscriber, &caller.callback) {
                (Some(subscriber), Some(callback)) => format!("{subscriber} ({callback})"),
                (None, Some(callback)) => callback.clone(),
                _ => "subscriber unknown".into(),
            };
            let _ = writeln!(
                out,
                "    tgid {:<8} notifier {:<20} {owner:<36} {:>10}",
                caller.tgid, caller.notifier, caller.calls
            );
        }
    }
    if let Some(k) = &s.kvm {
        let _ = writeln!(out, "\nKVM secondary MMU: unmap_hva_range {}  age_hva {}", k.unmap_hva_range, k.age_hva);
    }
    out.push('\n');
    out += &s.lost_events.text();
    out += &s.verdict.text();
    out
}

/// Why the mirrored memory was invalidated and what the failed walks collided with, with
/// each cause's settings on this machine.
fn causes_text(causes: &[CauseRow]) -> String {
    if causes.is_empty() {
        return String::new();
    }
    let cells: Vec<Vec<String>> = causes
        .iter()
        .map(|c| {
            let share = c.failed_walk_share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
            vec![c.cause.to_string(), c.invalidations.to_string(), c.failed_walks.to_string(), share]
        })
        .collect();
    let mut out = String::from("  why (the invalidating thread's context):\n");
    out += &text::table(&["CAUSE", "INVALIDATIONS", "FAILED WALKS", "SHARE"], &cells, text::width(), 4);
    for c in causes.iter().filter(|c| !c.knobs.is_empty() || c.remedy.is_some()) {
        let _ = writeln!(out, "    {}", crate::cause::settings_line(&c.cause, &c.knobs, c.remedy));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry_storm::report::tests::everything_observed;

    #[test]
    fn the_verdict_prints_each_metric_in_its_unit_and_each_cause_by_name() {
        let text = summary_text(&everything_observed(), &Observability::default(), Stop::Interrupted);
        let line = |metric: &str| {
            text.lines().find(|l| l.trim_start().starts_with(metric)).unwrap_or_else(|| panic!("{metric}: {text}"))
        };
        assert!(line("retry_rate").contains("50.00 %"), "{text}");
        assert!(line("avg_latency").contains("900µs"), "{text}");
        let unobserved = line("invalidate_freq");
        assert!(unobserved.contains(" - ") && unobserved.contains("UNKNOWN"), "no value, UNKNOWN: {text}");
        assert!(text.contains("  - large walks: "), "{text}");
        assert!(text.contains("(interrupted)"), "{text}");
        assert!(text.contains("CLEAR"), "invalidation events by the kernel's names: {text}");
        let why = text.lines().find(|l| l.trim_start().starts_with("kswapd ")).unwrap_or_else(|| panic!("{text}"));
        assert!(why.contains("100%"), "the failed walks' share by cause: {why}");
        assert!(text.contains("kswapd: vm.swappiness=60; memory pressure"), "its settings as read: {text}");
    }

    #[test]
    fn stale_loops_are_said_to_be_unable_to_succeed_in_80_columns() {
        let mut snapshot = everything_observed();
        let loops = snapshot.retry_loops.as_mut().unwrap();
        loops.stale_sequence = crate::retry_storm::report::StaleLoops {
            loops: 123,
            retries: 123_456,
            gave_up: 120,
            given_up_ns: 120 << 30,
        };
        let text = summary_text(&snapshot, &Observability::default(), Stop::Interrupted);
        assert!(text.contains("cannot succeed (stale sequence): 123 loops, 123456 retries"), "{text}");
        assert!(text.contains("stale sequence 0"), "the cause tally names stale retries: {text}");
        let stale_lines = text.lines().filter(|l| l.contains("stale sequence") || l.contains("given up after"));
        let wide: Vec<&str> = stale_lines.filter(|l| l.chars().count() > 80).collect();
        assert!(wide.is_empty(), "{wide:?}");
    }
}
