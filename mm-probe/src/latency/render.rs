//! What the user reads: the header with the plan, interval lines, the summary (percentiles,
//! BCC histograms with the threshold row marked, tasks, spikes worst first, lost events, the
//! verdict), as text or as NDJSON lines with stable names.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    aggregator::{Distribution, TaskSummary},
    attribution::Attribution,
    decoder::{FunctionCall, Stack, Syscall, TaskRef, Wakeup, prev_state_name},
    verdict::Verdict,
};
use crate::{
    probes::Plan,
    report::{Log2Histogram, Percentiles},
    units::format_nanos,
};

/// Frames shown per stack in text (JSON has them all).
const TEXT_STACK_FRAMES: usize = 24;

/// Whether a facility works here, and why not.
#[derive(Clone, Debug, Serialize)]
pub struct Availability {
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One traced function and how it attached.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionPlan {
    pub slot: usize,
    pub function: String,
    pub attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The `probe_plan` line.
#[derive(Clone, Debug, Serialize)]
pub struct Header {
    pub kernel: String,
    pub threshold_ns: u64,
    /// `rt`, `pids` or `all`.
    pub selection: &'static str,
    pub pids: Vec<u32>,
    pub functions: Vec<FunctionPlan>,
    pub function_attribution: Availability,
    pub syscall_attribution: Availability,
    pub plan: Plan,
}

/// One measured quantity.
#[derive(Clone, Debug, Serialize)]
pub struct Quantity {
    /// `wakeup` or the function's name.
    pub name: String,
    #[serde(flatten)]
    pub percentiles: Percentiles,
    pub over_threshold: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub histogram: Option<HistogramJson>,
}

impl Quantity {
    pub fn new(name: &str, d: &Distribution, threshold_ns: u64, with_histogram: bool) -> Self {
        Self {
            name: name.to_string(),
            percentiles: d.percentiles(),
            over_threshold: d.over_threshold,
            histogram: with_histogram.then(|| HistogramJson::new(&d.log2_usecs(), threshold_ns)),
        }
    }
}

/// The BCC-style log2 histogram of microseconds that the text shows, with its row bounds in
/// nanoseconds like every other duration of the JSON.
#[derive(Clone, Debug, Serialize)]
pub struct HistogramJson {
    /// Log2 bucket number (of the value in microseconds) of the row holding the threshold.
    pub threshold_bucket: usize,
    pub buckets: Vec<BucketJson>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BucketJson {
    /// Inclusive bounds: a row of [low, high] µs holds every value of [low·1000, high·1000 + 999] ns.
    pub low_ns: u64,
    pub high_ns: u64,
    pub count: u64,
}

impl HistogramJson {
    fn new(h: &Log2Histogram, threshold_ns: u64) -> Self {
        let first = h.buckets.iter().position(|&c| c > 0).unwrap_or(0);
        let last = h.buckets.iter().rposition(|&c| c > 0).map_or(0, |l| l + 1);
        let buckets = (first..last)
            .map(|k| {
                let (low_us, high_us) = Log2Histogram::bounds(k);
                BucketJson { low_ns: low_us * 1000, high_ns: high_us * 1000 + 999, count: h.buckets[k] }
            })
            .collect();
        Self { threshold_bucket: Log2Histogram::bucket_of(threshold_ns / 1000), buckets }
    }
}

/// The `interval` line.
#[derive(Clone, Debug, Serialize)]
pub struct Interval {
    pub elapsed_ns: u64,
    pub interval_ns: u64,
    pub wakeup: Quantity,
    pub functions: Vec<Quantity>,
    pub wakeup_spikes: u64,
    pub function_spikes: u64,
}

/// Ring-buffer and map losses (the `lost_events` line); never hidden.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LostEvents {
    pub wakeup_spikes: u64,
    pub function_spikes: u64,
    pub wakeups: u64,
    pub function_entries: u64,
    pub stack_errors: u64,
    pub malformed_records: u64,
    /// Program runs the kernel skipped because another tracing program was running on that CPU
    /// (its recursion guard); a skipped sched_wakeup or function entry is a lost measurement.
    pub skipped_by_recursion_guard: u64,
}

impl LostEvents {
    pub fn any(&self) -> bool {
        self.wakeup_spikes
            + self.function_spikes
            + self.wakeups
            + self.function_entries
            + self.stack_errors
            + self.malformed_records
            + self.skipped_by_recursion_guard
            > 0
    }
}

/// The `summary` line.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub duration_ns: u64,
    /// `duration` or `interrupted`.
    pub stopped_by: &'static str,
    pub threshold_ns: u64,
    pub wakeup: Quantity,
    pub functions: Vec<Quantity>,
    pub tasks: Vec<TaskSummary>,
    pub wakeup_spikes: u64,
    pub function_spikes: u64,
    pub function_attribution: Availability,
    pub verdict: Verdict,
}

/// A `spike` line of kind `wakeup`.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupSpikeJson<'a> {
    pub kind: &'static str,
    pub rank: usize,
    pub pid: u32,
    pub comm: &'a str,
    pub prio: i32,
    pub latency_ns: u64,
    /// Since the start of tracing.
    pub woken_at_ns: u64,
    pub target_cpu: u32,
    pub run_cpu: u32,
    pub waker_cpu: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocker: Option<&'a TaskRef>,
    pub prev: &'a TaskRef,
    pub prev_state: String,
    /// How long `prev` had been on the CPU when it switched away (null: since before tracing).
    pub prev_on_cpu_ns: Option<u64>,
    pub stack: &'a Stack,
    pub syscall: Option<&'a Syscall>,
    #[serde(flatten)]
    pub attribution: &'a Attribution,
}

impl<'a> WakeupSpikeJson<'a> {
    pub fn new(rank: usize, w: &'a Wakeup, a: &'a Attribution, start_ns: u64) -> Self {
        Self {
            kind: "wakeup",
            rank,
            pid: w.task.pid,
            comm: &w.task.comm,
            prio: w.prio,
            latency_ns: w.latency_ns,
            woken_at_ns: w.wakeup_ns.saturating_sub(start_ns),
            target_cpu: w.target_cpu,
            run_cpu: w.run_cpu,
            waker_cpu: w.waker_cpu,
            blocker: w.blocker.since_ns.map(|_| &w.blocker.task),
            prev: &w.prev.task,
            prev_state: prev_state_name(w.prev_state),
            prev_on_cpu_ns: w.prev.since_ns.map(|since| w.run_ns.saturating_sub(since)),
            stack: &w.prev_stack,
            syscall: w.prev_syscall.as_ref().and_then(Option::as_ref),
            attribution: a,
        }
    }
}

/// A `spike` line of kind `function`.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionSpikeJson<'a> {
    pub kind: &'static str,
    pub rank: usize,
    pub function: &'a str,
    pub entered_at_ns: u64,
    #[serde(flatten)]
    pub call: &'a FunctionCall,
}

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
    if let Some(reason) = &h.function_attribution.reason {
        let verb = if h.function_attribution.available { "partly unavailable" } else { "unavailable" };
        let _ = writeln!(out, "function attribution {verb}: {reason}");
    }
    if let Some(reason) = &h.syscall_attribution.reason {
        let _ = writeln!(out, "syscall attribution unavailable: {reason}");
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
    out += &lost_text(s.lost);
    let _ = writeln!(out, "verdict: {}: {}", sum.verdict.level.label(), sum.verdict.text);
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
    stack_text(out, &format!("stack of {} when it switched away", w.prev.task), &w.prev_stack);
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

pub fn lost_text(lost: &LostEvents) -> String {
    if !lost.any() {
        return "lost events: none\n".into();
    }
    let mut parts = Vec::new();
    for (n, what) in [
        (lost.wakeup_spikes, "wakeup spikes (ring buffer full)"),
        (lost.function_spikes, "function spikes (ring buffer full)"),
        (lost.wakeups, "wakeups (pending-wakeup map full)"),
        (lost.function_entries, "function entries (per-task map full)"),
        (lost.stack_errors, "stacks (stack map collision or full)"),
        (lost.malformed_records, "malformed records"),
        (lost.skipped_by_recursion_guard, "hook runs skipped while another tracing program ran on that CPU"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    format!("lost events: {}\n", parts.join(", "))
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
    fn histogram_json_names_the_threshold_row() {
        let mut buckets = vec![0; 64];
        buckets[3] = 2;
        buckets[10] = 1;
        let j = HistogramJson::new(&Log2Histogram::new(buckets), 500_000);
        assert_eq!(j.threshold_bucket, 8, "500 µs is in [256, 511]");
        assert_eq!(j.buckets.len(), 8);
        assert_eq!((j.buckets[0].low_ns, j.buckets[0].high_ns, j.buckets[0].count), (8_000, 15_999, 2));
        assert_eq!((j.buckets[7].low_ns, j.buckets[7].high_ns, j.buckets[7].count), (1_024_000, 2_047_999, 1));
    }

    /// Every line `latency --json` can print, with functions traced, a spike of each kind, and
    /// every optional part present (the host kernel cannot trace functions; the guests can).
    #[test]
    fn every_json_line_matches_its_schema_with_functions_traced() {
        use mm_probe_common::latency::FuncState;

        use crate::{
            latency::{attribution::FunctionShare, decoder::OnCpu, verdict::Level},
            probes::{Outcome, ProbePlan},
            report::{
                json::{self, Line},
                schema_check::tool_line,
            },
        };

        const WALK: &str = "madvise_cold_or_pageout_pte_range";
        let threshold_ns = 500_000;
        let mut buckets = vec![0; 64];
        buckets[3] = 2;
        buckets[10] = 1;
        let percentiles = Percentiles {
            count: 3,
            mean_ns: 372_000.5,
            p50_ns: 9_000,
            p90_ns: 1_100_000,
            p99_ns: 1_100_000,
            p999_ns: 1_100_000,
            max_ns: 1_100_000,
        };
        let quantity = |name: &str, with_histogram: bool| Quantity {
            name: name.into(),
            percentiles,
            over_threshold: 1,
            histogram: with_histogram.then(|| HistogramJson::new(&Log2Histogram::new(buckets.clone()), threshold_ns)),
        };
        let available = Availability { available: true, reason: None };
        let header = Header {
            kernel: "6.12.57".into(),
            threshold_ns,
            selection: "pids",
            pids: vec![42],
            functions: vec![
                FunctionPlan {
                    slot: 0,
                    function: WALK.into(),
                    attached: true,
                    mechanism: Some("fentry+fexit".into()),
                    reason: None,
                },
                FunctionPlan {
                    slot: 1,
                    function: "gone".into(),
                    attached: false,
                    mechanism: None,
                    reason: Some("not in BTF".into()),
                },
            ],
            function_attribution: Availability { available: true, reason: Some("gone: not in BTF".into()) },
            syscall_attribution: available.clone(),
            plan: Plan {
                probes: vec![ProbePlan {
                    probe: "sched_switch",
                    purpose: "switches",
                    outcome: Outcome::Attached {
                        mechanism: "tp_btf".into(),
                        target: "sched_switch".into(),
                        caveat: None,
                    },
                    failed_attempts: Vec::new(),
                }],
            },
        };
        let interval = Interval {
            elapsed_ns: 2_000_000_000,
            interval_ns: 1_000_000_000,
            wakeup: quantity("wakeup", false),
            functions: vec![quantity(WALK, false)],
            wakeup_spikes: 1,
            function_spikes: 1,
        };
        let summary = Summary {
            duration_ns: 2_000_000_000,
            stopped_by: "interrupted",
            threshold_ns,
            wakeup: quantity("wakeup", true),
            functions: vec![quantity(WALK, true)],
            tasks: vec![TaskSummary {
                pid: 42,
                comm: "rt_waker".into(),
                prio: 0,
                wakeups: 3,
                mean_ns: 372_000,
                max_ns: 1_100_000,
                over_threshold: 1,
            }],
            wakeup_spikes: 1,
            function_spikes: 1,
            function_attribution: available,
            verdict: Verdict {
                level: Level::Warn,
                text: "one wakeup waited 1.1 ms".into(),
                causes: vec![(WALK.into(), 1)],
            },
        };
        let syscall = Syscall {
            nr: 28,
            name: Some("madvise"),
            args: [0x7f00_0000_0000, 1 << 30, 21, 0],
            summary: "madvise(MADV_PAGEOUT, 1 GiB)".into(),
            advice: Some("MADV_PAGEOUT".into()),
            length_bytes: Some(1 << 30),
        };
        let stack = Stack { frames: vec![format!("{WALK}+0x1a")], error: None };
        let storm = OnCpu { task: TaskRef { pid: 7, comm: "storm".into() }, since_ns: Some(5) };
        let wakeup = Wakeup {
            task: TaskRef { pid: 42, comm: "rt_waker".into() },
            prio: 0,
            latency_ns: 1_100_000,
            wakeup_ns: 10,
            run_ns: 1_100_010,
            target_cpu: 1,
            run_cpu: 1,
            waker_cpu: 0,
            blocker: storm.clone(),
            blocker_funcs: FuncState::default(),
            prev: storm.clone(),
            prev_state: 0,
            prev_stack: stack.clone(),
            prev_funcs: FuncState::default(),
            prev_syscall: Some(Some(syscall.clone())),
        };
        let attribution = Attribution {
            blocker_ran_until_switch: true,
            without_rescheduling: true,
            functions: vec![FunctionShare {
                function: WALK.into(),
                in_wait_ns: 1_000_000,
                calls: 2,
                running_call_ns: Some(900_000),
            }],
            cause: WALK.into(),
            explanation: "storm-7 held CPU 1".into(),
        };
        let call = FunctionCall {
            slot: 0,
            task: storm.task,
            tgid: 7,
            cpu: 1,
            entry_ns: 20,
            duration_ns: 1_000_000,
            stack,
            syscall: Some(syscall),
        };
        let function_spike =
            FunctionSpikeJson { kind: "function", rank: 1, function: WALK, entered_at_ns: 20, call: &call };
        for line in [
            json::line(Line::LatencyProbePlan, &header),
            json::line(Line::LatencyInterval, &interval),
            json::line(Line::LatencySummary, &summary),
            json::line(Line::LatencySpike, &WakeupSpikeJson::new(1, &wakeup, &attribution, 0)),
            json::line(Line::LatencySpike, &function_spike),
            json::line(Line::LatencyLostEvents, &LostEvents { wakeup_spikes: 1, ..LostEvents::default() }),
        ] {
            tool_line(&line);
        }
    }

    #[test]
    fn lost_events_are_listed_never_hidden() {
        assert_eq!(lost_text(&LostEvents::default()), "lost events: none\n");
        let lost = LostEvents { wakeup_spikes: 3, stack_errors: 1, ..LostEvents::default() };
        assert_eq!(
            lost_text(&lost),
            "lost events: 3 wakeup spikes (ring buffer full), 1 stacks (stack map collision or full)\n"
        );
    }
}
