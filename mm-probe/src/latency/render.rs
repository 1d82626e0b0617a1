//! What the user reads: the header with the plan, interval lines, the summary (percentiles,
//! BCC histograms with the threshold row marked, tasks, spikes worst first, lost events, the
//! verdict), as text. The JSON lines are report.rs's structs.

use std::fmt::Write as _;

use super::{
    aggregator::Distribution,
    attribution::{Attribution, budget_text},
    decoder::{FunctionCall, Stack, Wakeup, prev_state_name},
    report::{Header, Interval, LostEvents, Quantity, Summary},
};
use crate::units::format_nanos;

/// Frames shown per stack in text (JSON has them all).
const TEXT_STACK_FRAMES: usize = 24;

/// "RT 99", "DL", "nice 0" from a kernel priority.
pub fn priority(prio: i32) -> String {
    match prio {
        p if p < 0 => "DL".into(),
        p if p < 100 => format!("RT {}", 99 - p),
        p => format!("nice {}", p - 120),
    }
}

pub fn header_text(h: &Header) -> String {
    let mut out = String::new();
    let selection = match h.selection {
        "pids" => format!("tasks {:?}", h.pids),
        "all" => "every task".to_string(),
        _ => "real-time tasks (SCHED_FIFO/RR/DEADLINE)".to_string(),
    };
    let _ = writeln!(
        out,
        "Tracing wakeup latency of {selection} on {}; threshold {}. Ctrl-C to stop.",
        h.kernel,
        format_nanos(h.threshold_ns)
    );
    for p in &h.plan.probes {
        match &p.outcome {
            crate::probes::Outcome::Attached { mechanism, target, caveat } => {
                let _ = write!(out, "  {:<36} {mechanism} {target}", p.probe);
                if let Some(c) = caveat {
                    let _ = write!(out, " ({c})");
                }
                out.push('\n');
            }
            crate::probes::Outcome::Unavailable => {
                let _ = writeln!(out, "  {:<36} unavailable", p.probe);
            }
        }
    }
    // The function probes are explained once, in the function attribution line below.
    let not_a_function = |p: &&crate::probes::ProbePlan| h.functions.iter().all(|f| f.function != p.probe);
    out += &crate::probes::unavailable_summary(
        h.plan.probes.iter().filter(not_a_function),
        crate::report::text::stderr_width(),
    );
    if let Some(reason) = &h.timer_expiry.reason {
        let _ = writeln!(out, "timer wakeups start at sched_wakeup, not at the timer's expiry: {reason}");
    }
    if let Some(reason) = &h.function_attribution.reason {
        let verb = if h.function_attribution.available { "partly unavailable" } else { "unavailable" };
        let _ = writeln!(out, "function attribution {verb}: {reason}");
    }
    if let Some(reason) = &h.syscall_attribution.reason {
        let _ = writeln!(out, "syscall attribution unavailable: {reason}");
    }
    match &h.sampling.availability.reason {
        Some(reason) => {
            let _ = writeln!(out, "no sampling ({reason}): spikes will not say where the holder's time went");
        }
        None => {
            let _ = writeln!(
                out,
                "sampling every {} on {} CPUs while a watched task waits",
                format_nanos(h.sampling.period_ns),
                h.sampling.cpus
            );
        }
    }
    out
}

pub fn interval_text(i: &Interval) -> String {
    let w = &i.wakeup.percentiles;
    let mut line = format!(
        "{:>7.1}s  wakeups {:<6} p50 {:<7} p99 {:<7} max~{:<7} over {}",
        i.elapsed_ns as f64 / 1e9,
        w.count,
        format_nanos(w.p50_ns),
        format_nanos(w.p99_ns),
        format_nanos(w.max_ns),
        i.wakeup.over_threshold
    );
    for f in &i.functions {
        let p = &f.percentiles;
        let _ =
            write!(line, " | {} calls {} p99 {} over {}", f.name, p.count, format_nanos(p.p99_ns), f.over_threshold);
    }
    line.push('\n');
    line
}

fn quantity_text(out: &mut String, title: &str, unit_word: &str, q: &Quantity, d: &Distribution, threshold_ns: u64) {
    let p = &q.percentiles;
    let _ = writeln!(out, "{title}: {} {unit_word}, {} over {}", p.count, q.over_threshold, format_nanos(threshold_ns));
    if p.count > 0 {
        let _ = writeln!(
            out,
            "  P50 {}  P90 {}  P99 {}  P99.9 {}  max {}  (mean {})",
            format_nanos(p.p50_ns),
            format_nanos(p.p90_ns),
            format_nanos(p.p99_ns),
            format_nanos(p.p999_ns),
            format_nanos(p.max_ns),
            format_nanos(p.mean_ns as u64)
        );
    }
    out.push_str(&d.log2_usecs().render("usecs", Some(threshold_ns / 1000)));
    out.push('\n');
}

/// Everything printed at the end of a run, in text.
pub struct SummaryText<'a> {
    pub summary: &'a Summary,
    pub wakeups: &'a Distribution,
    pub functions: &'a [(String, Distribution)],
    pub wakeup_spikes: &'a [&'a (Wakeup, Attribution)],
    pub function_spikes: &'a [&'a FunctionCall],
    pub function_names: &'a [String],
    pub lost: &'a LostEvents,
    pub start_ns: u64,
}

pub fn summary_text(s: &SummaryText) -> String {
    let mut out = String::new();
    let sum = s.summary;
    let _ = writeln!(out, "\n=== {:.1}s traced ({}) ===\n", sum.duration_ns as f64 / 1e9, sum.stopped_by);
    quantity_text(&mut out, "wakeup latency", "wakeups", &sum.wakeup, s.wakeups, sum.threshold_ns);
    for ((name, d), q) in s.functions.iter().zip(&sum.functions) {
        quantity_text(&mut out, name, "calls", q, d, sum.threshold_ns);
    }
    if !sum.function_attribution.available {
        let _ = writeln!(
            out,
            "function durations and attribution: unavailable ({})\n",
            sum.function_attribution.reason.as_deref().unwrap_or("no function probe attached")
        );
    }
    if !sum.tasks.is_empty() {
        let _ = writeln!(out, "tasks, worst first:");
        let _ = writeln!(
            out,
            "  {:>7}  {:<16} {:<8} {:>8} {:>9} {:>9} {:>6}",
            "PID", "COMM", "PRIO", "WAKEUPS", "MEAN", "MAX", "OVER"
        );
        for t in sum.tasks.iter().take(10) {
            let _ = writeln!(
                out,
                "  {:>7}  {:<16} {:<8} {:>8} {:>9} {:>9} {:>6}",
                t.pid,
                t.comm,
                priority(t.prio),
                t.wakeups,
                format_nanos(t.mean_ns),
                format_nanos(t.max_ns),
                t.over_threshold
            );
        }
        if sum.tasks.len() > 10 {
            let _ = writeln!(out, "  … and {} more", sum.tasks.len() - 10);
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "wakeups over {}: {} (worst {} shown)",
        format_nanos(sum.threshold_ns),
        sum.wakeup_spikes,
        s.wakeup_spikes.len()
    );
    for (rank, (w, a)) in s.wakeup_spikes.iter().map(|x| (&x.0, &x.1)).enumerate() {
        wakeup_spike_text(&mut out, rank + 1, w, a, s.start_ns);
    }
    if !s.function_names.is_empty() && sum.function_attribution.available {
        let _ = writeln!(
            out,
            "\nfunction calls over {}: {} (worst {} shown)",
            format_nanos(sum.threshold_ns),
            sum.function_spikes,
            s.function_spikes.len()
        );
        for (rank, call) in s.function_spikes.iter().enumerate() {
            let name = s.function_names.get(call.slot).map_or("?", String::as_str);
            let _ = writeln!(
                out,
                "{:>3}. {name} took {} in {} on CPU {}{}",
                rank + 1,
                format_nanos(call.duration_ns),
                call.task,
                call.cpu,
                call.syscall.as_ref().map(|c| format!(", in {}", c.summary)).unwrap_or_default()
            );
            stack_text(&mut out, "stack at its return (its callers)", &call.stack);
        }
    }
    out.push('\n');
    out += &s.lost.text();
    out += &sum.judgement.verdict.text();
    out
}

fn wakeup_spike_text(out: &mut String, rank: usize, w: &Wakeup, a: &Attribution, start_ns: u64) {
    let _ = writeln!(out, "{rank:>3}. {}", a.explanation);
    let _ = write!(
        out,
        "      {} {}, woken at +{:.3}s from CPU {}; {} switched away {}",
        w.task,
        priority(w.prio),
        w.wakeup_ns.saturating_sub(start_ns) as f64 / 1e9,
        w.waker_cpu,
        w.prev.task,
        prev_state_name(w.prev_state)
    );
    if let Some(since) = w.prev.since_ns {
        let _ = write!(out, " after {} on the CPU", format_nanos(w.run_ns.saturating_sub(since)));
    }
    out.push('\n');
    // rtla-style: where the wait went, adding up to the whole wait (after the wakeup, for a
    // timer wakeup: its lateness is in the explanation).
    let after = if w.timer.is_some() { " after its wakeup" } else { "" };
    let _ = writeln!(
        out,
        "      where the {}{after} went: {}",
        format_nanos(w.latency_ns),
        budget_text(&a.ran_during_wait, w.latency_ns, !a.ran_during_wait_complete)
    );
    for share in &a.functions {
        let _ = write!(
            out,
            "      in {} for {} of the wait ({} call{}",
            share.function,
            format_nanos(share.in_wait_ns),
            share.calls,
            if share.calls == 1 { "" } else { "s" }
        );
        if let Some(running) = share.running_call_ns {
            let _ = write!(out, "; the call running at the switch had run {}", format_nanos(running));
        }
        out.push_str(")\n");
    }
    let left = if a.stack_of == w.prev.task { "switched away" } else { "left the CPU" };
    stack_text(out, &format!("stack of {} when it {left}", a.stack_of), &a.stack);
}

fn stack_text(out: &mut String, title: &str, stack: &Stack) {
    if let Some(error) = &stack.error {
        let _ = writeln!(out, "      {title}: unavailable ({error})");
        return;
    }
    let _ = writeln!(out, "      {title}:");
    for frame in stack.frames.iter().take(TEXT_STACK_FRAMES) {
        let _ = writeln!(out, "        {frame}");
    }
    if stack.frames.len() > TEXT_STACK_FRAMES {
        let _ = writeln!(out, "        … {} more frames", stack.frames.len() - TEXT_STACK_FRAMES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_read_like_chrt() {
        assert_eq!(priority(0), "RT 99");
        assert_eq!(priority(49), "RT 50");
        assert_eq!(priority(-1), "DL");
        assert_eq!(priority(120), "nice 0");
    }

    #[test]
    fn lost_events_are_listed_never_hidden() {
        use crate::latency::report::Loss;

        assert_eq!(LostEvents::default().text(), "lost events: none\n");
        let lost = LostEvents::default().with(Loss::WakeupSpikes, Some(3)).with(Loss::StackErrors, Some(1));
        assert_eq!(
            lost.text(),
            "lost events: 3 wakeup spikes (ring buffer full), 1 stacks (stack map collision or full)\n"
        );
        let evicted = LostEvents::default().with(Loss::TaskRows, Some(96));
        assert_eq!(
            evicted.text(),
            "lost events: 96 task rows (per-task table full; their wakeups are in the totals)\n"
        );
    }
}
