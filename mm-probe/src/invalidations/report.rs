//! What invalidations reports, as data: the summary and interval records, and their JSON lines.
//! Anything this kernel did not let the tool measure is `None` (null), never 0.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    judge::{Thresholds, Verdict},
    locks::WaitPath,
    probes::Observability,
};
use crate::{collect::Stop, probes::Plan, report::json};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub duration_s: f64,
    pub invalidations: Invalidations,
    /// Contended locks, most waited-on first (empty and `lock_waits_observable` false when the
    /// lock tracepoints are missing).
    pub locks: Vec<LockRow>,
    pub lock_waits_observable: bool,
    /// Subscriber callbacks timed, slowest first.
    pub subscribers: Vec<SubscriberRow>,
    pub callbacks_observable: bool,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The kernel side's counters, lost and missed work included.
    pub counters: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Invalidations {
    pub count: u64,
    pub per_second: f64,
    pub bytes: u64,
    /// log2 buckets of bytes per invalidation.
    pub sizes: Vec<u64>,
    /// Start → end, where the notifier's functions can be probed; null otherwise.
    pub mean_duration_ns: Option<f64>,
    pub by_invalidator: Vec<InvalidatorRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InvalidatorRow {
    pub comm: String,
    pub tgid: u32,
    /// Whose memory: null when the owner of the mm was not seen.
    pub owner_tgid: Option<u32>,
    /// "kvm_unmap_hva_range", "kvm_age_hva" or "invalidate_range_start".
    pub source: &'static str,
    /// The notifier event (UNMAP, CLEAR, …); null where the hook does not carry it.
    pub event: Option<&'static str>,
    pub count: u64,
    pub bytes: u64,
    pub mean_bytes: f64,
    pub mean_duration_ns: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LockRow {
    pub address: String,
    /// "kvm->mmu_lock of VM pid 4242", "mmap_lock of pid 4242", or the address and caller.
    pub name: String,
    /// "kvm_mmu_lock", "mmap_lock" or "unknown".
    pub class: &'static str,
    pub owner_tgid: Option<u32>,
    /// How it was taken, from contention_begin's flags of its most waited-on path.
    pub kind: &'static str,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// log2 buckets of ns per wait.
    pub buckets: Vec<u64>,
    pub paths: Vec<PathRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PathRow {
    pub path: WaitPath,
    pub name: &'static str,
    /// Waiting inside an invalidation's callbacks.
    pub in_notifier: bool,
    pub kind: &'static str,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// The waiting threads' names.
    pub waiters: Vec<String>,
    /// The first function outside the locking code on the most waited-on stack.
    pub caller: Option<String>,
    /// That stack, innermost first (a few frames).
    pub stack: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SubscriberRow {
    /// "kvm", "hmm_mirror", "amdgpu", …; else the callback and its module (`my_invalidate [mymod]`).
    pub subscriber: String,
    pub callback: String,
    pub module: Option<String>,
    pub calls: u64,
    pub mean_ns: f64,
    pub max_ns: u64,
    /// Upper bounds of the log2 buckets holding the median and the 99th percentile.
    pub p50_le_ns: u64,
    pub p99_le_ns: u64,
    pub bytes_per_call: f64,
    /// Of its time, waiting on contended locks (left out of the fit); null without the lock
    /// tracepoints.
    pub lock_wait_ns: Option<u64>,
    /// Calls in a non-blockable context (the OOM reaper's), and how many refused.
    pub nonblocking: u64,
    pub refused: u64,
    pub buckets: Vec<u64>,
    /// Callback time against size; null with fewer than two size classes to fit.
    pub fit: Option<Fit>,
}

/// The callback's own time (lock waits left out; each size class's median) ≈ fixed_ns +
/// per_page_ns × pages, and what that does to small invalidations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub fixed_ns: f64,
    pub per_page_ns: f64,
    /// What a page costs in the smallest invalidations seen against what it costs in the
    /// largest (measured, not extrapolated): 1 when the cost is all per page, up to
    /// largest ÷ smallest when it is all fixed.
    pub amplification: f64,
    pub smallest_bytes: u64,
    pub largest_bytes: u64,
    pub size_classes: usize,
    /// The smallest invalidations' share of the callback's time: amplification matters only
    /// where they cost something in total.
    pub smallest_time_share: f64,
}

/// One `--interval`'s deltas.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Interval {
    /// Seconds since the probes attached, at the interval's end.
    pub end_s: f64,
    pub interval_s: f64,
    pub invalidations: u64,
    pub contended: Option<u64>,
    pub wait_ns: Option<u64>,
    pub callback_calls: Option<u64>,
}

#[derive(Serialize)]
struct PlanLine<'a> {
    kernel: &'a str,
    plan: &'a Plan,
    callbacks_timed: &'a [&'static str],
    observability: &'a Observability,
    thresholds: &'a Thresholds,
}

pub fn plan_json(
    kernel: &str,
    plan: &Plan,
    callbacks_timed: &[&'static str],
    seen: &Observability,
    thresholds: &Thresholds,
) -> String {
    let line = PlanLine { kernel, plan, callbacks_timed, observability: seen, thresholds };
    json::line(json::Line::InvalidationsProbePlan, &line)
}

pub fn interval_json(interval: &Interval) -> String {
    json::line(json::Line::InvalidationsInterval, interval)
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    stopped_by: &'static str,
    observability: &'a Observability,
}

pub fn summary_json(summary: &Summary, stopped_by: Stop, seen: &Observability) -> String {
    json::line(
        json::Line::InvalidationsSummary,
        &SummaryLine { summary, stopped_by: stopped_by.name(), observability: seen },
    )
}
