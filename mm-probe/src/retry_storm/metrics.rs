//! Turning one aggregated window into its report: rates from the kernel's exact counters,
//! distributions from the streamed events, and the evidence the verdict judges.

use mm_probe_common::hmm::Counter;

use super::{
    aggregator::Window,
    judge::{self, Evidence, Thresholds},
    rates::{per_second, ratio},
    report::{
        ChainMetrics, InvalidationMetrics, KvmMetrics, Loss, LostEvents, Observability, RetryRate, Snapshot,
        WalkMetrics,
    },
};
use crate::report::{Log2Histogram, Percentiles};

/// 99th percentile of a kernel log2 histogram, as the upper bound of its bucket.
fn log2_p99(buckets: &[u64]) -> Option<u64> {
    Log2Histogram::quantile_bound(buckets, 0.99)
}

impl Snapshot {
    /// The report of `window`, judged against `thresholds`.
    pub fn build(
        window: &Window,
        run_start_ns: u64,
        seen: &Observability,
        thresholds: &Thresholds,
        numa_balancing: Option<String>,
    ) -> Self {
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
        });
        let retry_rate = seen.walks.then(|| RetryRate {
            ebusy_per_invalidation: if seen.invalidations { ratio(busy, invalidations) } else { None },
            ebusy_per_walk: ratio(busy, calls),
        });
        let retry_loops = seen.walks.then(|| ChainMetrics {
            tally: window.chains,
            timeouts: window.chains.timeouts(),
            timeout_rate_per_invalidation: if seen.invalidations {
                ratio(window.chains.timeouts(), invalidations)
            } else {
                None
            },
            timeout_rate_per_loop: ratio(window.chains.timeouts(), window.chains.ended()),
            duration: Percentiles::of(&window.chain_ns),
            length_log2_hist: window.chain_lengths.clone(),
        });
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
            notifier_interval_bytes: (window.max_false_sharing_interval_bytes > 0)
                .then_some(window.max_false_sharing_interval_bytes),
            top_invalidators: window.top_invalidators().into_iter().map(|i| (i.comm, i.event, i.count)).collect(),
            small_invalidation_share: ratio(window.small_invalidations, window.invalidation_events),
            callback_p99_ns: invalidation_metrics.as_ref().and_then(|i| i.callback_p99_ns),
            numa_balancing,
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
                }))
            }),
            read_begins_by_caller: Vec::new(),
            verdict: judge::judge(&evidence, thresholds),
        }
    }
}

#[cfg(test)]
mod tests {
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
        Snapshot::build(&w, 0, &all_seen(), &Thresholds::default(), None)
    }

    #[test]
    fn an_empty_window_has_unknown_rates_not_zero() {
        let w = Window::new(0);
        let s = Snapshot::build(&w, 0, &all_seen(), &Thresholds::default(), None);
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
        let s = Snapshot::build(&w, 0, &seen, &Thresholds::default(), None);
        assert!(s.walks.is_none() && s.retry_rate.is_none() && s.retry_loops.is_none());
        let nothing = Snapshot::build(&w, 0, &Observability::default(), &Thresholds::default(), None);
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
        let s = Snapshot::build(&w, 0, &all_seen(), &Thresholds::default(), None);
        assert_eq!(s.duration_ns, 0);
        assert_eq!(s.invalidations.as_ref().unwrap().per_second, None);
        let freq = s.verdict.metrics.iter().find(|m| m.metric == Metric::InvalidateFreq).unwrap();
        assert_eq!((freq.value, freq.level), (None, Level::Unknown));
    }
}
