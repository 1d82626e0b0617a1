//! The JSON model of `mm-probe latency --json`: one serde struct per line type (`probe_plan`,
//! `interval`, `summary`, `spike`, `lost_events`) and the parts they share. The text renderer
//! reads the same structs.

use serde::Serialize;

use super::{
    aggregator::{Distribution, TaskSummary},
    attach::{Availability, FunctionPlan, Sampling},
    attribution::Attribution,
    decoder::{FunctionCall, TaskRef, TimerWait, Wakeup, prev_state_name},
    judge::Judgement,
};
use crate::{
    probes::Plan,
    report::{
        Log2Histogram, Percentiles,
        lost::{self, loss_kinds},
    },
};

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
    pub sampling: Sampling,
    /// Whether a timer wakeup's wait starts at its timer's expiry (else at sched_wakeup).
    pub timer_expiry: Availability,
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

loss_kinds! {
    /// What latency's kernel side could not record: the `lost_events` line.
    pub enum Loss {
        WakeupSpikes => "wakeup_spikes", "wakeup spikes (ring buffer full)",
        FunctionSpikes => "function_spikes", "function spikes (ring buffer full)",
        Wakeups => "wakeups", "wakeups (pending-wakeup map full)",
        FunctionEntries => "function_entries", "function entries (per-task map full)",
        StackErrors => "stack_errors", "stacks (stack map collision or full)",
        SampleStacks => "sample_stacks", "sampled stacks (stack map collision or full; the sample is kept)",
        MalformedRecords => "malformed_records", "malformed records",
        /// Program runs the kernel skipped because another tracing program was running on that
        /// CPU (its recursion guard); a skipped sched_wakeup or function entry is a lost
        /// measurement.
        SkippedByRecursionGuard => "skipped_by_recursion_guard", "hook runs skipped while another tracing program ran on that CPU",
        /// Rows of the per-task table lost: evicted by its LRU when full, or never created.
        /// Their wakeups are in the totals, not in `tasks`.
        TaskRows => "task_rows", "task rows (per-task table full; their wakeups are in the totals)",
        /// Spikes whose late timer's interrupted code was gone from its table (not inserted, or
        /// evicted first): the wait is measured, what held the timer off is not told.
        LateTimers => "late_timers", "late timers' interrupted code (not kept or evicted; the wait is measured)",
    }
}

pub type LostEvents = lost::LostEvents<Loss>;

/// The `summary` line.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub duration_ns: u64,
    /// `duration`, `interrupted` or `target_exited`.
    pub stopped_by: &'static str,
    pub threshold_ns: u64,
    pub wakeup: Quantity,
    pub functions: Vec<Quantity>,
    pub tasks: Vec<TaskSummary>,
    pub wakeup_spikes: u64,
    pub function_spikes: u64,
    pub function_attribution: Availability,
    #[serde(flatten)]
    pub judgement: Judgement,
}

/// A `spike` line of kind `wakeup`.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupSpikeJson<'a> {
    pub kind: &'static str,
    pub rank: usize,
    pub pid: u32,
    pub comm: &'a str,
    pub prio: i32,
    /// The whole wait: from the expiry of the task's sleep timer for a timer wakeup, else from
    /// the wakeup.
    pub latency_ns: u64,
    /// The part from the wakeup to the switch-in (what `ran_during_wait` and `unaccounted_ns`
    /// add up to).
    pub since_wakeup_ns: u64,
    /// How late the task's sleep timer fired, and what it interrupted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer: Option<&'a TimerWait>,
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
    /// The attribution's cause, labelled.
    pub cause: String,
    #[serde(flatten)]
    pub attribution: &'a Attribution,
}

impl<'a> WakeupSpikeJson<'a> {
    /// `functions[slot]` names each function slot (for the cause).
    pub fn new(rank: usize, w: &'a Wakeup, a: &'a Attribution, functions: &[String], start_ns: u64) -> Self {
        Self {
            kind: "wakeup",
            rank,
            pid: w.task.pid,
            comm: &w.task.comm,
            prio: w.prio,
            latency_ns: w.total_ns(),
            since_wakeup_ns: w.latency_ns,
            timer: w.timer.as_ref(),
            woken_at_ns: w.wakeup_ns.saturating_sub(start_ns),
            target_cpu: w.target_cpu,
            run_cpu: w.run_cpu,
            waker_cpu: w.waker_cpu,
            blocker: w.blocker.since_ns.map(|_| &w.blocker.task),
            prev: &w.prev.task,
            prev_state: prev_state_name(w.prev_state),
            prev_on_cpu_ns: w.prev.since_ns.map(|since| w.run_ns.saturating_sub(since)),
            cause: a.cause.label(functions),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::decoder::{Interrupted, Stack, Syscall};
    use crate::latency::{aggregator::Distribution, attribution::Cause, judge};

    /// A CRIT run whose worst wait is one call of the traced walk: every part of the verdict
    /// (metric, advice, spike causes, call bound) present.
    fn judged_with_a_call_bound() -> judge::Judgement {
        const WALK: &str = "madvise_cold_or_pageout_pte_range";
        let wakeups = Distribution { count: 3, over_threshold: 1, max_ns: Some(1_100_000), ..Distribution::default() };
        let calls = Distribution { count: 10, sum_ns: 10_000_000, max_ns: Some(1_200_000), ..Distribution::default() };
        let causes = std::collections::BTreeMap::from([(Cause::Function(0), 1)]);
        let judged =
            judge::judge(&wakeups, 500_000, &causes, &[WALK.into()], &[(WALK.into(), calls)], &Default::default());
        assert_eq!(judged.verdict.advice.len(), 1, "{judged:?}");
        judged
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
            latency::{
                attribution::{Cause, FunctionShare, Holder},
                decoder::OnCpu,
                sampling::{HotFunction, Sampled, TracedShare},
            },
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
            sampling: Sampling { availability: available.clone(), period_ns: 125_000, cpus: 2 },
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
            timer_expiry: Availability { available: false, reason: Some("this kernel's BTF lacks hrtimer".into()) },
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
            judgement: judged_with_a_call_bound(),
        };
        let syscall = Syscall {
            nr: 28,
            name: Some("madvise"),
            args: [0x7f00_0000_0000, 1 << 30, 21, 0],
            summary: "madvise(MADV_PAGEOUT, 1 GiB)".into(),
            advice: Some("MADV_PAGEOUT".into()),
            length_bytes: Some(1 << 30),
            returned: None,
        };
        let stack = Stack { frames: vec![format!("{WALK}+0x1a")], error: None };
        let storm = OnCpu { task: TaskRef { pid: 7, comm: "storm".into() }, since_ns: Some(5), prio: 120 };
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
            slices: Vec::new(),
            slices_truncated: false,
            long_stays: Vec::new(),
            samples: None,
            timer: Some(TimerWait {
                late_ns: 300_000,
                interrupted: Some(Interrupted {
                    task: storm.task.clone(),
                    in_user_space: false,
                    place: Some("free_unref_page_list ← release_pages ← tlb_batch_pages_flush".into()),
                    stack: stack.clone(),
                    syscall: Some(syscall.clone()),
                }),
            }),
        };
        let storm_holder = Holder {
            pid: 7,
            comm: "storm".into(),
            on_cpu_ns: 1_000_000,
            executed_ns: Some(1_000_000),
            left: "preempted (R+)".into(),
            tgid: 7,
            state: 0x100,
            in_funcs: 1,
            left_at_ns: 1_100_010,
            is_prev: true,
        };
        let attribution = Attribution {
            blocker_ran_until_switch: true,
            without_rescheduling: true,
            held_by: Some(storm_holder.clone()),
            ran_during_wait: vec![storm_holder.clone(), Holder { pid: 0, comm: "swapper/1".into(), ..storm_holder }],
            ran_during_wait_complete: true,
            unaccounted_ns: 100_000,
            slept_in: Some("clock_nanosleep"),
            stolen_ns: Some(0),
            functions: vec![FunctionShare {
                slot: 0,
                function: WALK.into(),
                in_wait_ns: 1_000_000,
                calls: 2,
                running_call_ns: Some(900_000),
            }],
            stack_of: storm.task.clone(),
            stack: stack.clone(),
            syscall: Some(syscall.clone()),
            samples: Some(Sampled {
                taken: Some(9),
                kept: 9,
                task: storm.task.clone(),
                of_task: 8,
                in_user_space: 0,
                unreadable: 0,
                hottest: Some(HotFunction {
                    function: "shrink_folio_list".into(),
                    samples: 7,
                    of: 8,
                    callers: vec!["reclaim_pages".into(), WALK.into()],
                }),
                in_traced: vec![TracedShare { function: WALK.into(), samples: 8 }],
            }),
            cause: Cause::Function(0),
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
            json::line(Line::LatencySpike, &WakeupSpikeJson::new(1, &wakeup, &attribution, &[WALK.to_string()], 0)),
            json::line(Line::LatencySpike, &function_spike),
            json::line(Line::LatencyLostEvents, &LostEvents::default().with(Loss::WakeupSpikes, Some(1))),
        ] {
            tool_line(&line);
        }
    }
}
