//! Latency's slice of `mm-probe exporter`: its options checked as `mm-probe latency` checks them,
//! its programs loaded with the spike ring off, and on every scrape the wakeup and function
//! histograms the kernel keeps, with exact `le` edges.
//!
//! The edges: Prometheus counts an observation in every bucket whose `le` is at least its value,
//! so an edge is exact only at a seam of the kernel's slots. The latency programs truncate each
//! duration to whole microseconds before choosing a slot (`sched.rs` `record`): the log2 row
//! [2, 3] µs holds 2000 ns to 3999 ns, so its seam is 3.999 µs, not 4 µs (a wakeup of exactly
//! 4000 ns lies in the next row). The threshold is an edge too: the kernel counts
//! `latency_ns > threshold_ns` apart, so count(≤ threshold) = count − over_threshold.

use std::{cell::RefCell, collections::BTreeMap, time::Duration};

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::latency::{self as names, SUB_BUCKETS};

use super::{
    aggregator::Distribution,
    attach::{Attachment, FunctionPlan, REQUIRED_PROBES, attach_probes, check_functions_exist, select_pids, settings},
    judge,
    options::Options,
    run::{counter, read_totals},
};
use crate::{
    capability::CapabilityId,
    cli::{ExporterArgs, LatencySelection},
    exporter::{
        buckets::{Bucket, Histogram},
        scrape::{Attached, Choice, Programs, Reader, Series, Slice, Snapshot, Source, WindowVerdict},
    },
    kernel::Kernel,
    probes::GlobalValue,
};

/// `--threshold` when not given, as `mm-probe latency` has it.
const DEFAULT_THRESHOLD: Duration = Duration::from_micros(500);

/// Highest log2 row of the microsecond histograms with an edge of its own: the edge after row 24
/// is 2^25 µs − 1 ns ≈ 33.6 s; anything slower reaches only +Inf.
const LAST_LATENCY_ROW: u32 = 24;

/// Latency as the exporter was asked for it, its options checked.
pub fn slice(choice: &Choice) -> Result<Box<dyn Slice>> {
    Ok(Box::new(LatencySlice { options: options(choice.args)? }))
}

/// The latency selection, checked exactly as `mm-probe latency` checks it.
fn options(args: &ExporterArgs) -> Result<Options> {
    let selection = LatencySelection {
        threshold: args.threshold.unwrap_or(DEFAULT_THRESHOLD),
        all_tasks: args.all_tasks,
        functions: args.functions.clone(),
    };
    Options::from_selection(&selection, &args.pids)
}

struct LatencySlice {
    options: Options,
}

impl Slice for LatencySlice {
    fn check(&self, kernel: &Kernel) -> Result<()> {
        check_functions_exist(kernel, &self.options)
    }

    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        let mut settings = settings(&self.options, kernel);
        settings.push((names::STREAM_SPIKES, GlobalValue::U32(0)));
        settings
    }

    fn attach(self: Box<Self>, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Source> {
        select_pids(ebpf, &self.options)?;
        let Attachment { plan, functions, .. } = attach_probes(kernel, ebpf, &self.options);
        // Every latency program is named lat_*; a skipped run of the wakeup or switch program is a
        // wakeup the histogram never saw.
        let wakeups_seen = REQUIRED_PROBES.iter().all(|p| plan.is_attached(p));
        let threshold_ns = self.options.threshold_ns;
        let reader = LatencyReader { wakeups_seen, functions, threshold_ns, window_start: RefCell::default() };
        let attached = Attached { capability: CapabilityId::Latency, plan, programs: Programs::Prefix("lat_") };
        Ok(Source { attached, reader: Box::new(reader) })
    }
}

/// Reads latency as attached: its function slots and the threshold it was loaded with.
struct LatencyReader {
    /// The wakeup and switch probes attached: the histogram sees every wakeup.
    wakeups_seen: bool,
    functions: Vec<FunctionPlan>,
    threshold_ns: u64,
    /// The wakeup distribution when the window being judged began.
    window_start: RefCell<Distribution>,
}

impl Reader for LatencyReader {
    fn read(&self, ebpf: &Ebpf, snapshot: &mut Snapshot) -> Result<()> {
        let name = CapabilityId::Latency.name();
        let totals = read_totals(ebpf, self.functions.len())?;
        let counter = |c: names::Counter| counter(&totals.counters, c);
        snapshot.map_update_failures.extend([
            Series::new(&[("capability", name), ("map", "LAT_WAKEUPS")], counter(names::Counter::LostWakeups)),
            Series::new(&[("capability", name), ("map", "LAT_FUNC_STATE")], counter(names::Counter::LostFuncEntries)),
        ]);
        if self.wakeups_seen {
            snapshot.wakeup_latency = Some(latency_histogram(&totals.wakeup, self.threshold_ns));
            snapshot.wakeups_over_threshold = Some(totals.wakeup.over_threshold);
        }
        for function in self.functions.iter().filter(|f| f.attached) {
            let distribution = &totals.functions[function.slot];
            snapshot.function_durations.push((
                function.function.clone(),
                latency_histogram(distribution, self.threshold_ns),
                distribution.over_threshold,
            ));
        }
        Ok(())
    }

    /// The window's wakeups against the threshold, as `mm-probe latency` judges them; the spikes'
    /// causes come from the ring, which is off here, so the verdict names none.
    fn judge(&self, ebpf: &Ebpf, _window_ns: u64) -> Result<Option<WindowVerdict>> {
        let now = read_totals(ebpf, 0)?.wakeup;
        let start = self.window_start.replace(now.clone());
        let wakeups = if self.wakeups_seen { now.since(&start) } else { Distribution::default() };
        let judged = judge::judge(&wakeups, self.threshold_ns, &BTreeMap::new(), &[], &[], &BTreeMap::new());
        Ok(Some(WindowVerdict::of(&judged.verdict, wakeups.count)))
    }
}

/// The last nanosecond of log2 row `row` of a microsecond histogram: values of at most
/// 2^(row+1) − 1 µs, i.e. below 2^(row+1) µs.
fn latency_row_edge_ns(row: u32) -> u64 {
    (1u64 << (row + 1)) * 1000 - 1
}

/// A latency distribution (wakeup or function) with an edge at each log2 row up to
/// [`LAST_LATENCY_ROW`] and one at the threshold.
fn latency_histogram(distribution: &Distribution, threshold_ns: u64) -> Histogram {
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

#[cfg(test)]
mod tests {
    use mm_probe_common::latency::hist_slot;

    use super::*;

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
}
