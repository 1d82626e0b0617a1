//! What invalidations reports, as data: the summary and interval records, and their JSON lines.
//! Anything this kernel did not let the tool measure is `None` (null), never 0.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    judge::{Busiest, Fit, Thresholds, Verdict},
    locks::{LockRow, OtherContention},
    probes::Observability,
};
use crate::{
    cause::{CauseName, Knob},
    collect::Stop,
    probes::Plan,
    report::{
        json,
        log2::{log2_bytes, log2_ns},
        lost::{self, loss_kinds},
    },
};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub duration_ns: u64,
    pub invalidations: Invalidations,
    /// Contended locks related to invalidations, most related first, then most waited-on (empty
    /// and `lock_waits_observable` false when the lock tracepoints are missing).
    pub locks: Vec<LockRow>,
    /// Every other contended lock of the machine, folded.
    pub other_contention: OtherContention,
    pub lock_waits_observable: bool,
    /// Subscriber callbacks timed, slowest first.
    pub subscribers: Vec<SubscriberRow>,
    pub callbacks_observable: bool,
    pub verdict: Verdict,
    /// What was lost on the way: the figures built on it are null (UNKNOWN) with the reason.
    pub lost_events: LostEvents,
    /// The kernel side's counters, lost and missed work included.
    pub counters: BTreeMap<&'static str, u64>,
}

loss_kinds! {
    /// Work the tool saw but could not count in full. Each figure that depends on a table that
    /// lost entries is UNKNOWN, never a smaller number.
    pub enum Loss {
        /// Contended waits not counted: the kernel's waits table refused them (full within one
        /// drain period, or busy on that CPU).
        Waits => "waits", "waits (table refused them)",
        /// Invalidations not counted: the kernel's invalidations table was full.
        Invalidations => "invalidations", "invalidations (table refused them)",
        /// Callback calls not counted: the callbacks table was full.
        CallbackCalls => "callback_calls", "callback calls (table refused them)",
        /// Waits whose stack could not be kept: counted, their path "other".
        WaitStacks => "wait_stacks", "waiters' stacks",
        /// VMs whose mmu_lock could not be recorded (the table of VMs was full).
        VmLocks => "vm_locks", "VMs' locks (table full)",
        /// Invalidations of VM memory by kernel threads (kcompactd, kdamond, kswapd) whose memory
        /// could not be named: KVM's tracepoints carry no mm and no function probe gave it.
        /// With -p they may have been the watched process's.
        OwnerUnresolved => "owner_unresolved", "invalidations whose memory could not be named",
        /// Waits counted without their thread and stack (user space's bound on groups).
        FoldedWaits => "folded_waits", "waits folded without their thread",
        /// Program runs the kernel skipped (bpf_prog_info.recursion_misses); uncounted (null)
        /// before 6.7, whose kprobes skip a run without counting it (a preempted map syscall can
        /// hold the CPU's bpf_prog_active on PREEMPT_RT): a callback, wait or invalidation that
        /// went unseen.
        ProgramRunsSkipped => "program_runs_skipped", "program runs the kernel skipped",
        /// Subscriber callbacks found in the kernel but never timed: the table of found
        /// callbacks refused them (full).
        CallbacksUndiscovered => "callbacks_undiscovered", "callbacks found but never timed (table full)",
        /// VMs beyond the four whose memslots are remembered: other threads' invalidations of
        /// their memory are counted as owner_unresolved.
        VmsUntracked => "vms_untracked", "VMs whose memslots were not remembered (table full)",
        /// Ends of reclaim, compaction or migration whose begin the cause table no longer held
        /// (evicted when full) or never saw (begun before the probes attached): invalidations
        /// made inside that work were named by their thread instead.
        CauseBracketsMissed => "cause_brackets_missed", "ends of mm work whose begin was not held (cause from the thread)",
    }
}

pub type LostEvents = lost::LostEvents<Loss>;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Invalidations {
    /// Null where this kernel does not let the tool see the invalidations asked about.
    pub count: Option<u64>,
    pub per_second: Option<f64>,
    /// Which invalidations `count` covers: every mm with subscribers (function probes), or
    /// VMs' memory only (KVM's tracepoints).
    pub scope: &'static str,
    /// Why `count` is null.
    pub not_observable: Option<String>,
    /// Bytes of the sized invalidations (whole address spaces left out).
    pub bytes: u64,
    /// Whole address spaces invalidated at exit (end ULONG_MAX): no size.
    pub whole_address_space: u64,
    /// The mm invalidated most, and its sizes.
    pub busiest: Option<Busiest>,
    /// The busiest second of the busiest mm.
    pub peak: Option<Peak>,
    /// log2 buckets of bytes per invalidation; the last also holds whole address spaces.
    #[serde(serialize_with = "log2_bytes")]
    pub sizes: Vec<u64>,
    /// Start → end, where the notifier's functions can be probed; null otherwise.
    pub mean_duration_ns: Option<f64>,
    pub by_invalidator: Vec<InvalidatorRow>,
    /// The primary source's invalidations grouped by why they happened, most first.
    pub by_cause: Vec<CauseRow>,
}

/// The invalidations of one cause, with the settings that stop it on this machine.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CauseRow {
    pub cause: CauseName,
    pub count: u64,
    /// Of the invalidations counted (the primary source's).
    pub share: f64,
    /// Whose memory, most invalidated first (owners not seen are left out).
    pub owners: Vec<u32>,
    pub knobs: Vec<Knob>,
    pub remedy: Option<&'static str>,
}

/// The most invalidations of one mm within one drain period (about a second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Peak {
    pub per_second: f64,
    pub owner_tgid: Option<u32>,
    /// When it ended, since the probes attached.
    pub end_ns: u64,
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
    /// Why: decided in the kernel from the invalidating thread's context.
    pub cause: CauseName,
    pub count: u64,
    pub bytes: u64,
    /// Null when every one was a whole address space.
    pub mean_bytes: Option<f64>,
    pub whole_address_space: u64,
    pub mean_duration_ns: Option<f64>,
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
    /// log2 buckets of ns per call.
    #[serde(serialize_with = "log2_ns")]
    pub buckets: Vec<u64>,
    /// Callback time against size; null with fewer than two size classes to fit.
    pub fit: Option<Fit>,
}

/// One `--interval`'s deltas.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Interval {
    /// Since the probes attached, at the interval's end.
    pub end_ns: u64,
    pub interval_ns: u64,
    pub invalidations: u64,
    pub contended: Option<u64>,
    pub wait_ns: Option<u64>,
    pub callback_calls: Option<u64>,
    /// Waits, invalidations and callback calls lost in this interval (tables full).
    pub lost: u64,
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

pub fn lost_events_json(lost: &LostEvents) -> String {
    json::line(json::Line::InvalidationsLostEvents, lost)
}
