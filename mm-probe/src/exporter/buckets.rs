//! Cumulative `le` buckets derived from the kernel's histograms, exact at every edge.
//!
//! Prometheus counts an observation in every bucket whose `le` is at least its value, so a bucket
//! edge is only exact where the kernel's slots have a seam. The latency programs truncate each
//! duration to whole microseconds before choosing a slot (`sched.rs` `record`): the log2 row
//! [2, 3] µs holds 2000 ns to 3999 ns, so its seam is 3.999 µs, not 4 µs (a wakeup of exactly
//! 4000 ns lies in the next row). The threshold is an edge too: the kernel counts
//! `latency_ns > threshold_ns` apart, so count(≤ threshold) = count − over_threshold.

use mm_probe_common::latency::SUB_BUCKETS;

use crate::latency::aggregator::Distribution;

/// Highest log2 row of the microsecond histograms with an edge of its own: the edge after row 24
/// is 2^25 µs − 1 ns ≈ 33.6 s; anything slower reaches only +Inf.
pub const LAST_LATENCY_ROW: u32 = 24;
/// Rows of the nanosecond log2 histograms (invalidate callbacks) with an edge of their own: from
/// [512, 1023] ns (edge ≈ 1 µs) to [2^33, 2^34 − 1] ns (edge ≈ 17 s). Fewer edges stay exact;
/// the kernel's last slot gathers everything from 2^40 ns on and so never has an upper seam.
pub const FIRST_NS_ROW: u32 = 9;
pub const LAST_NS_ROW: u32 = 33;

/// One cumulative bucket: observations of at most `le_ns` nanoseconds (`None`: +Inf).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub le_ns: Option<u64>,
    pub cumulative: u64,
}

/// A histogram as Prometheus reads it: cumulative buckets ending with +Inf, count and sum.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub count: u64,
    pub sum_seconds: f64,
    pub buckets: Vec<Bucket>,
}

impl Histogram {
    /// The bucket's upper bound in seconds, as the exposition writes it (f64::MAX is +Inf for the
    /// encoder).
    pub fn le_seconds(bucket: &Bucket) -> f64 {
        bucket.le_ns.map_or(f64::MAX, |ns| ns as f64 / 1e9)
    }
}

/// The last nanosecond of log2 row `row` of a microsecond histogram: values of at most
/// 2^(row+1) − 1 µs, i.e. below 2^(row+1) µs.
pub fn latency_row_edge_ns(row: u32) -> u64 {
    (1u64 << (row + 1)) * 1000 - 1
}

/// A latency distribution (wakeup or function) with an edge at each log2 row up to
/// [`LAST_LATENCY_ROW`] and one at the threshold.
pub fn latency_histogram(distribution: &Distribution, threshold_ns: u64) -> Histogram {
    let mut buckets: Vec<Bucket> = (0..=LAST_LATENCY_ROW)
        .map(|row| {
            let slots_through_row = (row as usize + 1) * SUB_BUCKETS;
            Bucket {
                le_ns: Some(latency_row_edge_ns(row)),
                cumulative: distribution.slots.iter().take(slots_through_row).sum(),
            }
        })
        .collect();
    let slot_total: u64 = distribution.slots.iter().sum();
    // A per-CPU value read while its CPU records can be mid-update (count incremented, slot
    // not yet): take the larger total and keep every edge between its neighbours, so the
    // exposition stays monotonic; the next scrape is exact again.
    let count = distribution.count.max(slot_total);
    insert_threshold(&mut buckets, threshold_ns, distribution.count.saturating_sub(distribution.over_threshold));
    buckets.push(Bucket { le_ns: None, cumulative: count });
    Histogram { count, sum_seconds: distribution.sum_ns as f64 / 1e9, buckets }
}

/// Adds the threshold edge in order (unless a row edge already sits there: both counts are then
/// the same number), clamped between its neighbours.
fn insert_threshold(buckets: &mut Vec<Bucket>, threshold_ns: u64, at_most_threshold: u64) {
    let position = buckets.partition_point(|b| b.le_ns.is_some_and(|le| le < threshold_ns));
    if buckets.get(position).is_some_and(|b| b.le_ns == Some(threshold_ns)) {
        return;
    }
    let floor = position.checked_sub(1).map_or(0, |i| buckets[i].cumulative);
    let ceiling = buckets.get(position).map_or(u64::MAX, |b| b.cumulative);
    let cumulative = at_most_threshold.max(floor).min(ceiling.max(floor));
    buckets.insert(position, Bucket { le_ns: Some(threshold_ns), cumulative });
}

/// A kernel log2 histogram of nanoseconds (slot k holds [2^k, 2^(k+1)) ns, slot 0 also 0) and
/// the exact sum of its samples.
pub fn log2_ns_histogram(slots: &[u64], sum_ns: u64) -> Histogram {
    let mut buckets: Vec<Bucket> = (FIRST_NS_ROW..=LAST_NS_ROW)
        .filter(|&row| (row as usize) + 1 < slots.len())
        .map(|row| Bucket {
            le_ns: Some((1u64 << (row + 1)) - 1),
            cumulative: slots.iter().take(row as usize + 1).sum(),
        })
        .collect();
    let count = slots.iter().sum();
    buckets.push(Bucket { le_ns: None, cumulative: count });
    Histogram { count, sum_seconds: sum_ns as f64 / 1e9, buckets }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mm_probe_common::latency::hist_slot;

    /// Records `value_ns` the way the kernel's `record` does.
    fn record(d: &mut Distribution, value_ns: u64, threshold_ns: u64) {
        let us = value_ns / 1000;
        let log2 = if us == 0 { 0 } else { 63 - us.leading_zeros() };
        d.slots[hist_slot(us, log2)] += 1;
        d.count += 1;
        d.sum_ns += value_ns;
        d.over_threshold += u64::from(value_ns > threshold_ns);
    }

    /// What Prometheus would say: observations of at most `le_ns`.
    fn at_most(values: &[u64], le_ns: u64) -> u64 {
        values.iter().filter(|&&v| v <= le_ns).count() as u64
    }

    #[test]
    fn row_edges_are_the_last_nanosecond_before_the_next_microsecond_row() {
        assert_eq!(latency_row_edge_ns(0), 1_999, "row 0 holds 0 and 1 µs");
        assert_eq!(latency_row_edge_ns(1), 3_999, "row 1 holds 2 and 3 µs");
        assert_eq!(latency_row_edge_ns(8), 511_999, "row 8 holds [256, 511] µs");
        assert_eq!(latency_row_edge_ns(LAST_LATENCY_ROW), (1 << 25) * 1000 - 1);
    }

    #[test]
    fn every_edge_counts_exactly_what_prometheus_means_by_le() {
        let threshold_ns = 500_000;
        // Values on both sides of every seam: the last nanosecond of a row and the first of the
        // next, the threshold itself and its neighbours.
        let mut values = vec![0, 999, 1_000, 1_999, 2_000, 3_999, 4_000, 499_999, 500_000, 500_001, 511_999, 512_000];
        values.extend([1_953_000, 40_000_000_000, 7_777]);
        let mut d = Distribution::default();
        for &v in &values {
            record(&mut d, v, threshold_ns);
        }
        let h = latency_histogram(&d, threshold_ns);
        assert_eq!(h.count, values.len() as u64);
        assert_eq!(h.buckets.last().unwrap(), &Bucket { le_ns: None, cumulative: values.len() as u64 });
        for bucket in &h.buckets[..h.buckets.len() - 1] {
            let le = bucket.le_ns.unwrap();
            assert_eq!(bucket.cumulative, at_most(&values, le), "le = {le} ns");
        }
        let threshold = h.buckets.iter().find(|b| b.le_ns == Some(threshold_ns)).expect("threshold edge");
        assert_eq!(threshold.cumulative, d.count - d.over_threshold);
        assert!(h.buckets.windows(2).all(|w| w[0].le_ns < w[1].le_ns || w[1].le_ns.is_none()), "edges ascend");
        assert_eq!(h.buckets.len(), LAST_LATENCY_ROW as usize + 1 + 1 + 1, "rows, threshold, +Inf");
        assert!((h.sum_seconds - values.iter().sum::<u64>() as f64 / 1e9).abs() < 1e-9);
    }

    #[test]
    fn a_threshold_on_a_row_edge_is_not_repeated() {
        let threshold_ns = latency_row_edge_ns(3);
        let mut d = Distribution::default();
        for v in [1_000, 15_999, 16_000] {
            record(&mut d, v, threshold_ns);
        }
        let h = latency_histogram(&d, threshold_ns);
        let edges: Vec<_> = h.buckets.iter().filter(|b| b.le_ns == Some(threshold_ns)).collect();
        assert_eq!(edges.len(), 1);
        assert_eq!(edges[0].cumulative, 2);
    }

    #[test]
    fn a_torn_read_keeps_the_buckets_monotonic() {
        let threshold_ns = 500_000;
        let mut d = Distribution::default();
        record(&mut d, 100_000, threshold_ns);
        // The kernel incremented count for a second sample over the threshold but had not yet
        // counted it over the threshold nor put it in a slot.
        d.count += 1;
        let h = latency_histogram(&d, threshold_ns);
        assert!(h.buckets.windows(2).all(|w| w[0].cumulative <= w[1].cumulative), "{h:?}");
        assert_eq!(h.count, 2);
        assert_eq!(h.buckets.last().unwrap().cumulative, 2);
    }

    #[test]
    fn nanosecond_log2_edges_end_where_each_row_ends() {
        let mut slots = vec![0u64; 41];
        slots[3] = 2; // [8, 15] ns
        slots[9] = 1; // [512, 1023] ns
        slots[10] = 4; // [1024, 2047] ns
        slots[40] = 1; // 2^40 ns and more: only +Inf knows it
        let h = log2_ns_histogram(&slots, 123_456);
        assert_eq!(h.buckets[0], Bucket { le_ns: Some(1023), cumulative: 3 });
        assert_eq!(h.buckets[1], Bucket { le_ns: Some(2047), cumulative: 7 });
        assert_eq!(h.buckets.iter().rev().nth(1).unwrap().le_ns, Some((1 << 34) - 1));
        assert_eq!(h.buckets.last().unwrap(), &Bucket { le_ns: None, cumulative: 8 });
        assert_eq!(h.count, 8);
    }
}
