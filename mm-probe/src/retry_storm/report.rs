//! The JSON model of retry-storm's report: what each NDJSON line (schemas/retry-storm/) holds,
//! and the text renderer reads. Built by [`super::window`] from an observation window.

use mm_probe_common::hmm::NotifierEvent;
use serde::{Serialize, Serializer};

pub use super::causes::CauseRow;
use super::judge::{Thresholds, Verdict};
pub use super::walks::StaleLoops;
use crate::{
    collect::shutdown::Stop,
    probes::Plan,
    report::{
        Percentiles, json,
        lost::{self, loss_kinds},
        tally::tally,
    },
};

/// Invalidation events are printed by the kernel's names (UNMAP, CLEAR, …).
fn event_name<S: Serializer>(event: &NotifierEvent, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(event.name())
}

tally! {
    /// Retry loops by how they ended.
    pub struct ChainTally {
        pub success,
        pub error,
        pub timed_out,
        pub gave_up,
        pub unfinished,
    }
}

impl ChainTally {
    pub fn ended(&self) -> u64 {
        self.success + self.error + self.timed_out + self.gave_up
    }

    pub fn timeouts(&self) -> u64 {
        self.timed_out + self.gave_up
    }
}

tally! {
    /// Why the failed walks failed.
    pub struct CauseTally {
        pub true_conflict,
        pub false_sharing,
        /// Retries with a sequence an earlier failure of their loop had already used.
        pub stale_sequence,
        pub unexplained,
    }
}

tally! {
    /// How the invalidations related to the walks running when they started.
    pub struct OverlapTally {
        /// Invalidations that overlapped a range being walked.
        pub walked_range,
        /// … that overlapped only a walking notifier's interval.
        pub notifier_interval_only,
        /// … that started during a walk of their mm but touched no walking notifier.
        pub outside_notifiers,
        /// … that started while no walk of their mm was running.
        pub no_walk_running,
    }
}

/// What this kernel let mm-probe see, decided from the attach plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Observability {
    pub walks: bool,
    pub read_begins: bool,
    pub notifier_removes: bool,
    pub invalidations: bool,
    pub invalidation_ends: bool,
    pub kvm_unmap: bool,
    pub kvm_age: bool,
    /// Walks' sequences are read at their entry (the stale-sequence check can decide).
    pub sequences: bool,
    /// What could not be observed, what that costs, and why.
    pub statements: Vec<Statement>,
}

pub use crate::report::statement::Statement;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Invalidator {
    pub comm: String,
    #[serde(serialize_with = "event_name")]
    pub event: NotifierEvent,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WalkMetrics {
    /// hmm_range_fault() returns (kernel counter: exact even if events were lost).
    pub calls: u64,
    pub ebusy: u64,
    pub errors: u64,
    pub read_begins: Option<u64>,
    pub mean_bytes: Option<f64>,
    pub max_bytes: u64,
    pub latency: Percentiles,
    /// Time spent in walks that returned -EBUSY, and its share of all walk time.
    pub failed_walk_ns: u64,
    pub failed_walk_share: Option<f64>,
    pub busy_causes: CauseTally,
    /// Streamed walks whose sequence was read at entry (the stale-sequence check needs it).
    pub sequences_read: u64,
    /// -EBUSY returns of stale-sequence retries (kernel counter: exact even if events were
    /// lost); null where the walks' sequences cannot be read on this kernel.
    pub stale_retries: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetryRate {
    /// -EBUSY ÷ invalidations of mirrored mms: the field material's definition.
    pub ebusy_per_invalidation: Option<f64>,
    /// -EBUSY ÷ hmm_range_fault() calls: the share of walks thrown away.
    pub ebusy_per_walk: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainMetrics {
    pub tally: ChainTally,
    /// Retry loops that gave up (timed out, or abandoned while failing).
    pub timeouts: u64,
    pub stale_sequence: StaleLoops,
    pub timeout_rate_per_invalidation: Option<f64>,
    pub timeout_rate_per_loop: Option<f64>,
    pub duration: Percentiles,
    /// Log2 buckets of walks per loop: slot k counts loops of [2^k, 2^(k+1)) walks.
    pub length_log2_hist: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InvalidationMetrics {
    /// Invalidations of mirrored mms (kernel counter).
    pub count: u64,
    /// Invalidations of mms nothing here mirrors (excluded from the rates).
    pub other_mms: u64,
    pub per_second: Option<f64>,
    /// Log2 buckets of bytes per invalidation (slot k: [2^k, 2^(k+1)) bytes).
    pub size_bytes_log2_hist: Vec<u64>,
    pub top_invalidators: Vec<Invalidator>,
    pub overlap_with_walks: OverlapTally,
    /// Log2 buckets (ns) of time inside invalidate_range_start (the callbacks).
    pub callback_ns_log2_hist: Vec<u64>,
    pub callback_p99_ns: Option<u64>,
    /// Log2 buckets (ns) of invalidate_range_start → _end.
    pub start_to_end_ns_log2_hist: Vec<u64>,
    /// Why the mirrored memory was invalidated, and which causes the failed walks collided
    /// with, most failed walks first.
    pub by_cause: Vec<CauseRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvmMetrics {
    pub unmap_hva_range: u64,
    pub age_hva: u64,
    /// Log2 buckets of bytes per unmapped or aged range.
    pub size_bytes_log2_hist: Vec<u64>,
}

loss_kinds! {
    /// What retry-storm's kernel side could not record: the `lost_events` line.
    pub enum Loss {
        WalkEvents => "walk_events", "walk events (ring buffer full)",
        InvalidateEvents => "invalidate_events", "invalidation events (ring buffer full)",
        /// Walk returns whose entry was not seen (duration unknown).
        WalkEntriesMissed => "walk_entries_missed", "walk entries missed (duration unknown)",
        /// read_begin calls the kernel's per-caller table refused (full): `read_begins_by_caller`
        /// misses them.
        ReadBeginCallers => "read_begin_callers", "read_begin callers not counted (table full)",
        /// Ends of reclaim, compaction or migration whose begin the cause table no longer held
        /// (evicted when full) or never saw (begun before the probes attached): invalidations
        /// made inside that work were named by their thread instead.
        CauseBracketsMissed => "cause_brackets_missed", "ends of mm work whose begin was not held (cause from the thread)",
    }
}

pub type LostEvents = lost::LostEvents<Loss>;

/// mmu_interval_read_begin() calls of one process on one notifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadBeginCaller {
    pub tgid: u32,
    pub notifier: String,
    /// The driver that owns the notifier ("hmm_mirror", "amdgpu", …, or the callback's module),
    /// from its ops->invalidate; null when the callback could not be read or symbolized.
    pub subscriber: Option<String>,
    /// That callback's function.
    pub callback: Option<String>,
    pub calls: u64,
}

/// One window's report: what the renderers print and `--json` emits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// Start of the window since the start of the run.
    pub start_offset_ns: u64,
    pub duration_ns: u64,
    /// `None` where the walk probe did not attach: not observable, not zero.
    pub walks: Option<WalkMetrics>,
    pub retry_rate: Option<RetryRate>,
    pub retry_loops: Option<ChainMetrics>,
    pub invalidations: Option<InvalidationMetrics>,
    pub kvm: Option<KvmMetrics>,
    pub lost_events: LostEvents,
    /// Sequence starts per (process, notifier), most first (whole run only; empty per interval).
    pub read_begins_by_caller: Vec<ReadBeginCaller>,
    pub verdict: Verdict,
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

pub fn interval_json(snapshot: &Snapshot) -> String {
    json::line(json::Line::RetryStormInterval, snapshot)
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    stopped_by: &'static str,
    observability: &'a Observability,
}

pub fn summary_json(snapshot: &Snapshot, stopped_by: Stop, seen: &Observability) -> String {
    let line = SummaryLine { snapshot, stopped_by: stopped_by.name(), observability: seen };
    json::line(json::Line::RetryStormSummary, &line)
}

pub fn lost_json(snapshot: &Snapshot) -> String {
    json::line(json::Line::RetryStormLostEvents, &snapshot.lost_events)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        probes::{AttachFailure, Attempt, Outcome, ProbePlan},
        report::schema_check::tool_line,
        retry_storm::judge::{Evidence, judge},
    };

    fn percentiles() -> Percentiles {
        Percentiles { count: 3, mean_ns: 1500.0, p50_ns: 1000, p90_ns: 2000, p99_ns: 2000, p999_ns: 2000, max_ns: 2000 }
    }

    /// A window where every probe attached and every metric has a value, advice included.
    pub(crate) fn everything_observed() -> Snapshot {
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
                busy_causes: CauseTally { true_conflict: 1, false_sharing: 1, ..CauseTally::default() },
                sequences_read: 3,
                stale_retries: Some(0),
            }),
            retry_rate: Some(RetryRate { ebusy_per_invalidation: Some(0.2), ebusy_per_walk: Some(0.66) }),
            retry_loops: Some(ChainMetrics {
                tally: ChainTally { success: 1, gave_up: 1, ..ChainTally::default() },
                timeouts: 1,
                stale_sequence: StaleLoops::default(),
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
                by_cause: vec![CauseRow {
                    cause: crate::cause::CauseName { class: "kswapd", detail: None },
                    invalidations: 10,
                    failed_walks: 2,
                    failed_walk_share: Some(1.0),
                    knobs: vec![crate::cause::Knob { setting: "vm.swappiness".into(), value: Some("60".into()) }],
                    remedy: crate::cause::remedy("kswapd"),
                }],
            }),
            kvm: Some(KvmMetrics { unmap_hva_range: 1, age_hva: 2, size_bytes_log2_hist: vec![0, 3] }),
            lost_events: LostEvents::default().with(Loss::InvalidateEvents, Some(1)),
            read_begins_by_caller: vec![ReadBeginCaller {
                tgid: 42,
                notifier: "0xffff8881".into(),
                subscriber: Some("hmm_mirror".into()),
                callback: Some("mirror_invalidate".into()),
                calls: 5,
            }],
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
            statements: vec![Statement { subject: "…".into(), why: Some("…".into()), cost: "…".into() }],
            ..Observability::default()
        };
        tool_line(&plan_json("6.12.57", &plan(), &seen, &Thresholds::default(), 1_000_000_000));
        tool_line(&interval_json(&snapshot));
        for stop in [Stop::Interrupted, Stop::DurationElapsed, Stop::TargetExited] {
            tool_line(&summary_json(&snapshot, stop, &seen));
        }
        tool_line(&lost_json(&snapshot));
    }
}
