//! invalidations' text: the plan on stderr, a line per interval, the summary.

use std::fmt::Write as _;

use super::{
    probes::Observability,
    report::{Fit, Interval, LockRow, SubscriberRow, Summary},
};
use crate::{
    collect::Stop,
    probes::Plan,
    report::{Log2Histogram, statement, text, verdict::Level},
    units::{format_bytes, format_nanos},
};

pub fn plan_text(kernel: &str, plan: &Plan, callbacks_timed: &[&str], seen: &Observability) -> String {
    let mut out = statement::plan_text("invalidations", kernel, plan, &seen.statements);
    if !callbacks_timed.is_empty() {
        let _ = writeln!(out, "  timing callbacks: {}", callbacks_timed.join(", "));
    }
    out
}

pub fn interval_text(i: &Interval) -> String {
    format!(
        "[{:>7.1}s] invalidations {:>8}  contended {:>8}  waited {:>10}  callbacks {:>8}",
        i.end_s,
        i.invalidations,
        or_dash(i.contended.map(|c| c.to_string())),
        or_dash(i.wait_ns.map(format_nanos)),
        or_dash(i.callback_calls.map(|c| c.to_string())),
    )
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".into())
}

pub fn summary_text(s: &Summary, stopped_by: Stop) -> String {
    let width = text::width();
    let mut out = String::new();
    let i = &s.invalidations;
    let _ = writeln!(
        out,
        "Invalidations: {} in {:.1} s ({:.0}/s), {} ({})",
        i.count,
        s.duration_s,
        i.per_second,
        format_bytes(i.bytes),
        stopped_by.name()
    );
    if let Some(ns) = i.mean_duration_ns {
        let _ = writeln!(out, "  start to end: {} on average", format_nanos(ns as u64));
    }
    if !i.by_invalidator.is_empty() {
        let rows: Vec<Vec<String>> = i
            .by_invalidator
            .iter()
            .map(|r| {
                vec![
                    r.comm.clone(),
                    r.tgid.to_string(),
                    or_dash(r.owner_tgid.map(|t| t.to_string())),
                    r.source.to_string(),
                    r.event.unwrap_or("-").to_string(),
                    r.count.to_string(),
                    format_bytes(r.mean_bytes as u64),
                    or_dash(r.mean_duration_ns.map(|ns| format_nanos(ns as u64))),
                ]
            })
            .collect();
        out += &text::table(
            &["INVALIDATOR", "PID", "MEMORY OF", "SEEN BY", "EVENT", "COUNT", "MEAN SIZE", "MEAN TIME"],
            &rows,
            width,
            2,
        );
    }
    out += &locks_text(s, width);
    out += &subscribers_text(s, width);
    out += &verdict_text(s);
    out
}

fn locks_text(s: &Summary, width: usize) -> String {
    let mut out = String::new();
    if !s.lock_waits_observable {
        return out;
    }
    if s.locks.is_empty() {
        let _ = writeln!(out, "\nLock contention: none seen");
        return out;
    }
    let _ = writeln!(out, "\nLock contention (waits inside and against invalidations), most waited-on first");
    for (rank, lock) in s.locks.iter().take(LOCKS_SHOWN).enumerate() {
        out += &lock_text(lock, width, rank == 0);
    }
    let rest = &s.locks[s.locks.len().min(LOCKS_SHOWN)..];
    if !rest.is_empty() {
        let contended: u64 = rest.iter().map(|l| l.contended).sum();
        let waited: u64 = rest.iter().map(|l| l.wait_ns).sum();
        let _ = writeln!(
            out,
            "  {} more locks: {contended} contended, {} waited (--json lists them)",
            rest.len(),
            format_nanos(waited)
        );
    }
    out
}

/// Locks listed in text (JSON lists all); the histogram is drawn for the first only.
const LOCKS_SHOWN: usize = 5;

fn lock_text(lock: &LockRow, width: usize, histogram: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {} [{}]: {} contended, {} waited, max {}",
        lock.name,
        lock.kind,
        lock.contended,
        format_nanos(lock.wait_ns),
        format_nanos(lock.max_ns)
    );
    let rows: Vec<Vec<String>> = lock
        .paths
        .iter()
        .map(|p| {
            vec![
                p.name.to_string(),
                p.contended.to_string(),
                format_nanos(p.wait_ns),
                format_nanos(p.max_ns),
                p.waiters.join(","),
                p.caller.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out += &text::table(&["PATH", "CONTENDED", "WAITED", "MAX", "WAITERS", "CALLER"], &rows, width, 4);
    if histogram {
        let _ = write!(out, "{}", Log2Histogram::new(lock.buckets.clone()).render("nsecs", None));
    }
    out
}

fn subscribers_text(s: &Summary, width: usize) -> String {
    let mut out = String::new();
    if !s.callbacks_observable {
        return out;
    }
    if s.subscribers.is_empty() {
        let _ = writeln!(out, "\nSubscriber callbacks: no subscriber's callback ran on the watched memory");
        return out;
    }
    let _ = writeln!(out, "\nSubscriber callbacks");
    let rows: Vec<Vec<String>> = s
        .subscribers
        .iter()
        .map(|c| {
            let fit = c.fit.as_ref().map_or_else(|| "one size only".into(), fit_text);
            vec![
                c.subscriber.to_string(),
                c.callback.clone(),
                c.calls.to_string(),
                format_nanos(c.mean_ns as u64),
                format_nanos(c.p99_le_ns),
                format_nanos(c.max_ns),
                format_bytes(c.bytes_per_call as u64),
                waiting_share(c),
                fit,
            ]
        })
        .collect();
    out += &text::table(
        &["SUBSCRIBER", "CALLBACK", "CALLS", "MEAN", "P99<=", "MAX", "BYTES/CALL", "LOCK WAIT", "FIT (OWN TIME)"],
        &rows,
        width,
        2,
    );
    let refused: u64 = s.subscribers.iter().map(|c| c.refused).sum();
    let nonblocking: u64 = s.subscribers.iter().map(|c| c.nonblocking).sum();
    if nonblocking > 0 {
        let _ = writeln!(out, "  non-blockable calls (OOM reaper): {nonblocking}, refused: {refused}");
    }
    out
}

/// The share of a callback's time spent waiting on contended locks ("-" where not traced).
fn waiting_share(c: &SubscriberRow) -> String {
    let total = c.mean_ns * c.calls as f64;
    match c.lock_wait_ns {
        Some(wait) if total > 0.0 => format!("{:.0}%", wait as f64 * 100.0 / total),
        _ => "-".into(),
    }
}

/// A callback's time against size in one phrase:
/// `30µs + 40µs/page; a page of 4K costs 1x one of 2M (4K: 50% of the time)`.
pub fn fit_text(f: &Fit) -> String {
    let small = format_bytes(f.smallest_bytes);
    format!(
        "{} + {}/page; a page of {small} costs {:.0}x one of {} ({small}: {:.0}% of the time)",
        format_nanos(f.fixed_ns as u64),
        format_nanos(f.per_page_ns.max(0.0) as u64),
        f.amplification,
        format_bytes(f.largest_bytes),
        f.smallest_time_share * 100.0
    )
}

fn verdict_text(s: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nVerdict: {}", s.verdict.verdict.name());
    for m in &s.verdict.metrics {
        let value = match (m.value, m.metric) {
            (None, _) => "not observable / no data".to_string(),
            (Some(v), "invalidate_freq") => format!("{v:.0}/s"),
            (Some(v), "amplification") => format!("{v:.0}x"),
            (Some(v), _) => format_nanos(v as u64),
        };
        let _ = writeln!(out, "  {:<22} {:>24}  {}", m.metric, value, m.level.name());
    }
    if s.verdict.verdict == Level::Unknown {
        let _ = writeln!(out, "  nothing to judge: no invalidation, contention or callback was observed");
    }
    if !s.verdict.advice.is_empty() {
        let _ = writeln!(out, "\nAdvice");
        for a in &s.verdict.advice {
            let _ = writeln!(out, "  - {}: {}\n    → {}", a.cause, a.evidence, a.advice);
        }
    }
    out
}
