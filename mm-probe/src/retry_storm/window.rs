//! One observation window (an `--interval`, or the whole run): what the walks, chains,
//! invalidations and overlaps added to it and the kernel counters' deltas, and the report it
//! becomes: rates from the kernel's exact counters, distributions from the streamed events, and
//! the evidence the verdict judges.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use mm_probe_common::hmm::{self as names, Counter, NotifierEvent};

use super::{
    causes::CauseTable,
    counters::KernelCounters,
    judge::{self, Evidence, Thresholds},
    rates::{per_second, ratio},
    report::{
        CauseTally, ChainMetrics, ChainTally, InvalidationMetrics, Invalidator, KvmMetrics, Loss, LostEvents,
        Observability, OverlapTally, RetryRate, Snapshot, StaleLoops, WalkMetrics,
    },
    walks::{BusyCause, Chain, ChainEnd, Failure, Invalidation, InvalidationOverlap, Walk},
};
use crate::report::{Log2Histogram, Percentiles, percentiles::latency_histogram};

/// Log2 slots for chain lengths (walks per retry loop).
pub const CHAIN_LENGTH_BUCKETS: usize = 32;
const SIZE_BUCKETS: usize = names::LOG2_BUCKETS as usize;
/// How many invalidators the report lists.
pub const TOP_INVALIDATORS: usize = 10;
const PAGE_BYTES: u64 = 4096;

/// Everything observed in one window.
#[derive(Clone, Debug)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
    pub counters: KernelCounters,
    pub(super) walk_ns: Histogram<u64>,
    pub(super) chain_ns: Histogram<u64>,
    pub(super) walk_events: u64,
    pub(super) walk_bytes_total: u64,
    pub(super) walk_ns_total: u64,
    pub(super) busy_walk_ns: u64,
    pub(super) max_walk_bytes: u64,
    pub(super) chain_lengths: Vec<u64>,
    pub chains: ChainTally,
    pub(super) stale_loops: StaleLoops,
    pub(super) sequences_read: u64,
    pub(super) invalidation_events: u64,
    pub(super) small_invalidations: u64,
    pub(super) invalidation_sizes: Vec<u64>,
    pub(super) invalidators: HashMap<(String, NotifierEvent), (u64, u64)>,
    pub busy_causes: CauseTally,
    pub(super) causes: CauseTable,
    pub(super) max_false_sharing_interval_bytes: u64,
    pub overlap: OverlapTally,
    pub callback_ns: Vec<u64>,
    pub window_ns: Vec<u64>,
    pub kvm_sizes: Vec<u64>,
    /// The cause classifier's bracket ends without their begin, in the window.
    pub cause_brackets_missed: u64,
}

impl Window {
    pub fn new(start_ns: u64) -> Self {
        Self {
            start_ns,
            end_ns: start_ns,
            counters: KernelCounters::default(),
            walk_ns: latency_histogram(),
            chain_ns: latency_histogram(),
            walk_events: 0,
            walk_bytes_total: 0,
            walk_ns_total: 0,
            busy_walk_ns: 0,
            max_walk_bytes: 0,
            chain_lengths: vec![0; CHAIN_LENGTH_BUCKETS],
            chains: ChainTally::default(),
            stale_loops: StaleLoops::default(),
            sequences_read: 0,
            invalidation_events: 0,
            small_invalidations: 0,
            invalidation_sizes: vec![0; SIZE_BUCKETS],
            invalidators: HashMap::new(),
            busy_causes: CauseTally::default(),
            causes: CauseTable::default(),
            max_false_sharing_interval_bytes: 0,
            overlap: OverlapTally::default(),
            callback_ns: vec![0; SIZE_BUCKETS],
            window_ns: vec![0; SIZE_BUCKETS],
            kvm_sizes: vec![0; SIZE_BUCKETS],
            cause_brackets_missed: 0,
        }
    }

    pub fn add_walk(&mut self, walk: &Walk) {
        self.walk_events += 1;
        self.walk_bytes_total = self.walk_bytes_total.saturating_add(walk.bytes());
        self.max_walk_bytes = self.max_walk_bytes.max(walk.bytes());
        self.sequences_read += u64::from(walk.seq.is_some());
        if let Some(ns) = walk.duration_ns {
            let _ = self.walk_ns.record(ns.max(1));
            self.walk_ns_total += ns;
            if walk.busy() {
                self.busy_walk_ns += ns;
            }
        }
    }

    pub fn add_chain(&mut self, chain: &Chain) {
        match chain.end {
            ChainEnd::Success => self.chains.success += 1,
            ChainEnd::Error(_) => self.chains.error += 1,
            ChainEnd::TimedOut => self.chains.timed_out += 1,
            ChainEnd::GaveUp => self.chains.gave_up += 1,
            ChainEnd::Unfinished => self.chains.unfinished += 1,
        }
        let bucket = Log2Histogram::bucket_of(u64::from(chain.walks)).min(CHAIN_LENGTH_BUCKETS - 1);
        self.chain_lengths[bucket] += 1;
        let _ = self.chain_ns.record(chain.duration_ns().max(1));
        self.stale_loops.add_chain(chain);
    }

    pub fn add_invalidation(&mut self, invalidation: &Invalidation) {
        let bytes = invalidation.bytes();
        self.invalidation_events += 1;
        if bytes <= PAGE_BYTES {
            self.small_invalidations += 1;
        }
        let bucket = Log2Histogram::bucket_of(bytes).min(SIZE_BUCKETS - 1);
        self.invalidation_sizes[bucket] += 1;
        self.causes.add_invalidation(&invalidation.cause, invalidation.tgid);
        let slot = self.invalidators.entry((invalidation.comm.clone(), invalidation.event)).or_default();
        slot.0 += 1;
        // RELEASE (exit_mmap) invalidates [0, ULONG_MAX): byte totals saturate.
        slot.1 = slot.1.saturating_add(bytes);
    }

    pub fn add_failure(&mut self, failure: &Failure) {
        if let Some(cause) = &failure.collided_with {
            self.causes.add_failure(cause);
        }
        let walk = &failure.walk;
        match failure.why {
            BusyCause::TrueConflict => self.busy_causes.true_conflict += 1,
            BusyCause::FalseSharing => {
                self.busy_causes.false_sharing += 1;
                if let Some((start, last)) = walk.interval {
                    self.max_false_sharing_interval_bytes =
                        self.max_false_sharing_interval_bytes.max(last.saturating_sub(start).saturating_add(1));
                }
            }
            BusyCause::StaleSequence => self.busy_causes.stale_sequence += 1,
            BusyCause::Unexplained => self.busy_causes.unexplained += 1,
        }
    }

    pub fn add_overlap(&mut self, overlap: InvalidationOverlap) {
        if overlap.walked_range {
            self.overlap.walked_range += 1;
        } else if overlap.interval_only {
            self.overlap.notifier_interval_only += 1;
        } else if overlap.outside {
            self.overlap.outside_notifiers += 1;
        } else {
            self.overlap.no_walk_running += 1;
        }
    }

    /// Folds a finished interval into the run's total.
    pub fn merge(&mut self, other: &Window) {
        self.start_ns = self.start_ns.min(other.start_ns);
        self.end_ns = self.end_ns.max(other.end_ns);
        self.counters.add(&other.counters);
        let _ = self.walk_ns.add(&other.walk_ns);
        let _ = self.chain_ns.add(&other.chain_ns);
        self.walk_events += other.walk_events;
        self.walk_bytes_total = self.walk_bytes_total.saturating_add(other.walk_bytes_total);
        self.walk_ns_total += other.walk_ns_total;
        self.busy_walk_ns += other.busy_walk_ns;
        self.max_walk_bytes = self.max_walk_bytes.max(other.max_walk_bytes);
        add_buckets(&mut self.chain_lengths, &other.chain_lengths);
        self.chains += other.chains;
        self.stale_loops += other.stale_loops;
        self.sequences_read += other.sequences_read;
        self.invalidation_events += other.invalidation_events;
        self.small_invalidations += other.small_invalidations;
        add_buckets(&mut self.invalidation_sizes, &other.invalidation_sizes);
        for (key, (count, bytes)) in &other.invalidators {
            let slot = self.invalidators.entry(key.clone()).or_default();
            slot.0 += count;
            slot.1 = slot.1.saturating_add(*bytes);
        }
        self.busy_causes += other.busy_causes;
        self.causes.merge(&other.causes);
        self.max_false_sharing_interval_bytes =
            self.max_false_sharing_interval_bytes.max(other.max_false_sharing_interval_bytes);
        self.overlap += other.overlap;
        add_buckets(&mut self.callback_ns, &other.callback_ns);
        add_buckets(&mut self.window_ns, &other.window_ns);
        add_buckets(&mut self.kvm_sizes, &other.kvm_sizes);
        self.cause_brackets_missed += other.cause_brackets_missed;
    }

    /// Invalidators by (comm, event), most invalidations first.
    pub fn top_invalidators(&self) -> Vec<Invalidator> {
        let mut top: Vec<Invalidator> = self
            .invalidators
            .iter()
            .map(|((comm, event), (count, bytes))| Invalidator {
                comm: comm.clone(),
                event: *event,
                count: *count,
                bytes: *bytes,
            })
            .collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.comm.cmp(&b.comm)));
        top.truncate(TOP_INVALIDATORS);
        top
    }
}

fn add_buckets(into: &mut [u64], from: &[u64]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

/// 99th percentile of a kernel log2 histogram, as the upper bound of its bucket.
fn log2_p99(buckets: &[u64]) -> Option<u64> {
    Log2Histogram::quantile_bound(buckets, 0.99)
}

impl Snapshot {
    /// The report of `window`, judged against `thresholds`.
    pub fn build(window: &Window, run_start_ns: u64, seen: &Observability, thresholds: &Thresholds) -> Self {
        let c = &window.counters;
        let elapsed_ns = window.end_ns.saturating_sub(window.start_ns);
        let invalidations = c.get(Counter::Invalidations);
        let busy = c.get(Counter::WalkBusy);
        let calls = c.get(Counter::Walks);
        let walks = seen.walks.then(|| WalkMetrics {
            calls,
            ebusy: busy,
            errors: c.get(Counter::WalkErrors),
            read_begins: seen.read_begins.then(|| c.get(Counter::ReadBegins)),
            mean_bytes: ratio(window.walk_bytes_total, window.walk_events),
            max_bytes: window.max_walk_bytes,
            latency: Percentiles::of(&window.walk_ns),
            failed_walk_ns: window.busy_walk_ns,
            failed_walk_share: ratio(window.busy_walk_ns, window.walk_ns_total),
            busy_causes: window.busy_causes,
            sequences_read: window.sequences_read,
            stale_retries: seen.sequences.then(|| c.get(Counter::StaleRetries)),
        });
        let retry_rate = seen.walks.then(|| RetryRate {
            ebusy_per_invalidation: if seen.invalidations { ratio(busy, invalidations) } else { None },
            ebusy_per_walk: ratio(busy, calls),
        });
        let retry_loops = seen.walks.then(|| ChainMetrics {
            tally: window.chains,
            timeouts: window.chains.timeouts(),
            stale_sequence: window.stale_loops,
            timeout_rate_per_invalidation: if seen.invalidations {
                ratio(window.chains.timeouts(), invalidations)
            } else {
                None
            },
            timeout_rate_per_loop: ratio(window.chains.timeouts(), window.chains.ended()),
            duration: Percentiles::of(&window.chain_ns),
            length_log2_hist: window.chain_lengths.clone(),
        });
        let b = &window.busy_causes;
        let failed_walks = b.true_conflict + b.false_sharing + b.stale_sequence + b.unexplained;
        let by_cause = if seen.invalidations { window.causes.rows(failed_walks) } else { Vec::new() };
        let invalidation_metrics = seen.invalidations.then(|| InvalidationMetrics {
            count: invalidations,
            other_mms: c.get(Counter::InvalidationsOtherMm),
            per_second: per_second(invalidations, elapsed_ns),
            size_bytes_log2_hist: window.invalidation_sizes.clone(),
            top_invalidators: window.top_invalidators(),
            overlap_with_walks: window.overlap,
            callback_ns_log2_hist: window.callback_ns.clone(),
            callback_p99_ns: log2_p99(&window.callback_ns),
            start_to_end_ns_log2_hist: window.window_ns.clone(),
            by_cause: by_cause.clone(),
        });
        let kvm = (seen.kvm_unmap || seen.kvm_age).then(|| KvmMetrics {
            unmap_hva_range: c.get(Counter::KvmUnmap),
            age_hva: c.get(Counter::KvmAge),
            size_bytes_log2_hist: window.kvm_sizes.clone(),
        });
        let evidence = Evidence {
            walks: calls,
            busy_walks: busy,
            invalidations,
            timeouts: window.chains.timeouts(),
            retry_rate: retry_rate.as_ref().and_then(|r| r.ebusy_per_invalidation),
            busy_per_walk: retry_rate.as_ref().and_then(|r| r.ebusy_per_walk),
            timeout_rate: retry_loops.as_ref().and_then(|r| r.timeout_rate_per_invalidation),
            avg_walk_ns: walks.as_ref().and_then(|w| (w.latency.count > 0).then_some(w.latency.mean_ns)),
            invalidate_freq: invalidation_metrics.as_ref().and_then(|i| i.per_second),
            mean_walk_bytes: walks.as_ref().and_then(|w| w.mean_bytes),
            true_conflicts: window.busy_causes.true_conflict,
            false_sharing: window.busy_causes.false_sharing,
            stale_retries: walks.as_ref().and_then(|w| w.stale_retries),
            stale_loops: window.stale_loops,
            notifier_interval_bytes: (window.max_false_sharing_interval_bytes > 0)
                .then_some(window.max_false_sharing_interval_bytes),
            by_cause,
            small_invalidation_share: ratio(window.small_invalidations, window.invalidation_events),
            callback_p99_ns: invalidation_metrics.as_ref().and_then(|i| i.callback_p99_ns),
        };
        Snapshot {
            start_offset_ns: window.start_ns.saturating_sub(run_start_ns),
            duration_ns: elapsed_ns,
            walks,
            retry_rate,
            retry_loops,
            invalidations: invalidation_metrics,
            kvm,
            lost_events: LostEvents::from_fn(|kind| {
                Some(c.get(match kind {
                    Loss::WalkEvents => Counter::LostWalkEvents,
                    Loss::InvalidateEvents => Counter::LostInvalidateEvents,
                    Loss::WalkEntriesMissed => Counter::StashMisses,
                    Loss::ReadBeginCallers => Counter::ReadBeginsMapFull,
                    Loss::CauseBracketsMissed => return Some(window.cause_brackets_missed),
                }))
            }),
            read_begins_by_caller: Vec::new(),
            verdict: judge::judge(&evidence, thresholds),
        }
    }
}

#[cfg(test)]
mod tests {
    use mm_probe_common::hmm::EBUSY;

    use super::*;
    use crate::retry_storm::{
        counters::tests::counters,
        judge::{Level, Metric},
    };

    fn all_seen() -> Observability {
        Observability { walks: true, read_begins: true, invalidations: true, ..Observability::default() }
    }

    /// The snapshot of a window of `seconds` whose kernel counters are `walks`, `ebusy` and
    /// `invalidations`, with every probe attached and the default thresholds.
    fn snapshot_of(seconds: u64, (walks, ebusy, invalidations): (u64, u64, u64)) -> Snapshot {
        let mut w = Window::new(0);
        w.end_ns = seconds * 1_000_000_000;
        w.counters = counters(walks, ebusy, invalidations);
        Snapshot::build(&w, 0, &all_seen(), &Thresholds::default())
    }

    #[test]
    fn an_empty_window_has_unknown_rates_not_zero() {
        let w = Window::new(0);
        let s = Snapshot::build(&w, 0, &all_seen(), &Thresholds::default());
        let r = s.retry_rate.unwrap();
        assert_eq!((r.ebusy_per_invalidation, r.ebusy_per_walk), (None, None));
        assert_eq!(s.invalidations.unwrap().per_second, None);
        assert_eq!(s.verdict.level, Level::Unknown);
    }

    #[test]
    fn walks_without_invalidations_have_a_per_walk_rate_only() {
        let s = snapshot_of(1, (10, 0, 0));
        let r = s.retry_rate.unwrap();
        assert_eq!(r.ebusy_per_invalidation, None);
        assert_eq!(r.ebusy_per_walk, Some(0.0));
        assert_eq!(s.invalidations.unwrap().per_second, Some(0.0));
    }

    #[test]
    fn both_retry_rate_definitions_are_computed_from_the_kernel_counters() {
        let s = snapshot_of(2, (200, 170, 1000));
        let r = s.retry_rate.unwrap();
        assert_eq!(r.ebusy_per_invalidation, Some(0.17));
        assert_eq!(r.ebusy_per_walk, Some(0.85));
        assert_eq!(s.invalidations.as_ref().unwrap().per_second, Some(500.0));
        assert_eq!(s.verdict.level, Level::Crit);
    }

    #[test]
    fn unobservable_walks_are_absent_not_zero() {
        let mut w = Window::new(0);
        w.end_ns = 1_000_000_000;
        let seen = Observability { invalidations: true, ..Observability::default() };
        let s = Snapshot::build(&w, 0, &seen, &Thresholds::default());
        assert!(s.walks.is_none() && s.retry_rate.is_none() && s.retry_loops.is_none());
        let nothing = Snapshot::build(&w, 0, &Observability::default(), &Thresholds::default());
        assert!(nothing.invalidations.is_none());
        assert_eq!(nothing.verdict.level, Level::Unknown);
    }

    #[test]
    fn the_p99_of_a_log2_histogram_is_its_buckets_upper_bound() {
        let mut buckets = vec![0; 20];
        buckets[10] = 99;
        buckets[17] = 1;
        assert_eq!(log2_p99(&buckets), Some(2047));
        assert_eq!(log2_p99(&[0, 0]), None);
    }

    #[test]
    fn a_zero_length_window_has_no_rates_and_judges_nothing() {
        // A window closed at the instant it opened (a tick that coincides with the stop, or
        // a zero interval): counts may still be there, but nothing is divided by zero.
        let mut w = Window::new(5_000);
        w.end_ns = 5_000;
        w.counters = counters(10, 5, 20);
        let s = Snapshot::build(&w, 0, &all_seen(), &Thresholds::default());
        assert_eq!(s.duration_ns, 0);
        assert_eq!(s.invalidations.as_ref().unwrap().per_second, None);
        let freq = s.verdict.metrics.iter().find(|m| m.metric == Metric::InvalidateFreq).unwrap();
        assert_eq!((freq.value, freq.level), (None, Level::Unknown));
    }

    #[test]
    fn merging_windows_adds_everything() {
        let walk = Walk {
            pid: 1,
            tgid: 1,
            comm: "w".into(),
            entry_ns: 0,
            exit_ns: 1000,
            duration_ns: Some(1000),
            seq_begin_ns: None,
            ret: -EBUSY,
            notifier: 1,
            mm: 1,
            start: 0,
            end: 4096,
            interval: None,
            seq: None,
            stale_retry: false,
            begin_overtaken: false,
        };
        let mut a = Window::new(0);
        a.add_walk(&walk);
        a.counters = counters(1, 1, 2);
        let mut b = Window::new(10);
        b.end_ns = 20;
        b.add_walk(&Walk { ret: 0, ..walk });
        b.counters = counters(1, 0, 3);
        let mut total = Window::new(0);
        total.merge(&a);
        total.merge(&b);
        assert_eq!(total.counters.get(Counter::Walks), 2);
        assert_eq!(total.counters.get(Counter::Invalidations), 5);
        assert_eq!(total.walk_events, 2);
        assert_eq!(total.busy_walk_ns, 1000);
        assert_eq!((total.start_ns, total.end_ns), (0, 20));
    }
}
