//! Turning the kernel's per-CPU histograms into distributions (percentiles, log2 rows), keeping
//! per-task statistics, and ranking spikes worst first.
//!
//! The kernel counts microseconds in log-linear slots: the log2 bucket of the value, split into
//! `SUB_BUCKETS` linear parts. Summing a bucket's parts gives the BCC log2 row exactly;
//! percentiles taken from the parts are within 1/8 of a power of two. Count, sum and maximum
//! are kept exactly beside them, in nanoseconds.

use std::{cmp::Reverse, collections::BinaryHeap};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use mm_probe_common::latency::{
    HIST_MAP, HIST_SLOTS, LOG2_BUCKETS, LatencyHist, SUB_BUCKET_BITS, SUB_BUCKETS, TASKS_MAP, TaskWakeups,
};
use serde::Serialize;

use super::decoder::comm;
use crate::report::{Log2Histogram, Percentiles, percentiles::latency_histogram};

/// One quantity's distribution, summed over CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distribution {
    pub count: u64,
    pub sum_ns: u64,
    /// Exact maximum; `None` for an interval's difference (maxima do not subtract).
    pub max_ns: Option<u64>,
    pub over_threshold: u64,
    /// Log-linear slots of the value in microseconds.
    pub slots: Vec<u64>,
}

impl Default for Distribution {
    fn default() -> Self {
        Self { count: 0, sum_ns: 0, max_ns: Some(0), over_threshold: 0, slots: vec![0; HIST_SLOTS] }
    }
}

impl Distribution {
    pub fn from_per_cpu<'a>(per_cpu: impl IntoIterator<Item = &'a LatencyHist>) -> Self {
        let mut total = Self::default();
        for hist in per_cpu {
            total.count += hist.count;
            total.sum_ns += hist.sum_ns;
            total.max_ns = total.max_ns.max(Some(hist.max_ns));
            total.over_threshold += hist.over_threshold;
            for (sum, slot) in total.slots.iter_mut().zip(hist.slots.iter()) {
                *sum += slot;
            }
        }
        total
    }

    /// What happened since `earlier` (an interval).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            count: self.count.saturating_sub(earlier.count),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            max_ns: None,
            over_threshold: self.over_threshold.saturating_sub(earlier.over_threshold),
            slots: self.slots.iter().zip(&earlier.slots).map(|(a, b)| a.saturating_sub(*b)).collect(),
        }
    }

    /// P50…P99.9 from the slots; count, mean and (when known) max exact.
    pub fn percentiles(&self) -> Percentiles {
        let mut histogram = latency_histogram();
        for (slot, &count) in self.slots.iter().enumerate() {
            if count > 0 {
                let (low, high) = slot_bounds_us(slot);
                let middle_ns = ((low + high) * 1000 / 2).max(1);
                let _ = histogram.record_n(middle_ns, count);
            }
        }
        let mut p = Percentiles::of(&histogram);
        if self.count > 0 {
            p.count = self.count;
            p.mean_ns = self.sum_ns as f64 / self.count as f64;
        }
        match self.max_ns {
            Some(max) if self.count > 0 => {
                p.max_ns = max;
                // Slot midpoints can overshoot the true maximum.
                p.p50_ns = p.p50_ns.min(max);
                p.p90_ns = p.p90_ns.min(max);
                p.p99_ns = p.p99_ns.min(max);
                p.p999_ns = p.p999_ns.min(max);
            }
            _ => {}
        }
        p
    }

    /// The BCC log2 histogram in microseconds.
    pub fn log2_usecs(&self) -> Log2Histogram {
        let mut buckets = vec![0u64; LOG2_BUCKETS];
        for (slot, &count) in self.slots.iter().enumerate() {
            buckets[slot / SUB_BUCKETS] += count;
        }
        Log2Histogram::new(buckets)
    }
}

/// Inclusive microsecond range of a log-linear slot (`hist_slot`'s inverse).
pub fn slot_bounds_us(slot: usize) -> (u64, u64) {
    let (log2, sub) = ((slot / SUB_BUCKETS) as u32, (slot % SUB_BUCKETS) as u64);
    if log2 < SUB_BUCKET_BITS {
        return (sub, sub);
    }
    let shift = log2 - SUB_BUCKET_BITS;
    let low = (SUB_BUCKETS as u64 + sub) << shift;
    (low, low + (1u64 << shift) - 1)
}

/// One quantity's distribution from the histogram map of a loaded object, summed over CPUs.
pub fn read_distribution(ebpf: &Ebpf, quantity: u32) -> Result<Distribution> {
    let map = ebpf.map(HIST_MAP).with_context(|| format!("map {HIST_MAP} missing from the object"))?;
    let array: PerCpuArray<&MapData, LatencyHist> = PerCpuArray::try_from(map)?;
    let values = array.get(&quantity, 0).with_context(|| format!("reading histogram {quantity}"))?;
    Ok(Distribution::from_per_cpu(values.iter()))
}

/// Reads every quantity's distribution from the per-CPU histogram map (taken out of the object).
pub struct HistReader {
    map: PerCpuArray<MapData, LatencyHist>,
}

impl HistReader {
    pub fn new(ebpf: &mut Ebpf) -> Result<Self> {
        let map = ebpf.take_map(HIST_MAP).with_context(|| format!("map {HIST_MAP} missing from the object"))?;
        Ok(Self { map: PerCpuArray::try_from(map)? })
    }

    pub fn read(&self, quantity: u32) -> Result<Distribution> {
        let values = self.map.get(&quantity, 0).with_context(|| format!("reading histogram {quantity}"))?;
        Ok(Distribution::from_per_cpu(values.iter()))
    }
}

/// One task's wakeups.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskSummary {
    pub pid: u32,
    pub comm: String,
    /// Kernel priority (RT: 99 - rt_priority; DL: -1; normal: 100-139).
    pub prio: i32,
    pub wakeups: u64,
    pub mean_ns: u64,
    pub max_ns: u64,
    pub over_threshold: u64,
}

/// Every task's wakeup statistics, worst maximum first.
pub fn tasks(ebpf: &Ebpf) -> Result<Vec<TaskSummary>> {
    let map = ebpf.map(TASKS_MAP).with_context(|| format!("map {TASKS_MAP} missing from the object"))?;
    let map: aya::maps::HashMap<&MapData, u32, TaskWakeups> = aya::maps::HashMap::try_from(map)?;
    let mut tasks: Vec<TaskSummary> = map
        .iter()
        .filter_map(Result::ok)
        .map(|(pid, t)| TaskSummary {
            pid,
            comm: comm(&t.comm),
            prio: t.prio,
            wakeups: t.count,
            mean_ns: t.total_ns.checked_div(t.count).unwrap_or(0),
            max_ns: t.max_ns,
            over_threshold: t.over_threshold,
        })
        .collect();
    tasks.sort_by(|a, b| b.max_ns.cmp(&a.max_ns).then(a.pid.cmp(&b.pid)));
    Ok(tasks)
}

/// The `capacity` worst items seen (by key), and how many were seen in all.
#[derive(Debug)]
pub struct Worst<T> {
    capacity: usize,
    seen: u64,
    sequence: u64,
    heap: BinaryHeap<Reverse<Entry<T>>>,
}

/// Key, arrival (earlier ranks higher on ties), item.
type Entry<T> = (u64, Reverse<u64>, Ranked<T>);

/// Wraps an item so the heap orders only by the key and arrival.
#[derive(Debug)]
struct Ranked<T>(T);

impl<T> PartialEq for Ranked<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Ranked<T> {}
impl<T> PartialOrd for Ranked<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Ranked<T> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<T> Worst<T> {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, seen: 0, sequence: 0, heap: BinaryHeap::new() }
    }

    /// Offers an item; it is kept if it is among the worst `capacity` so far (ties: earliest).
    pub fn offer(&mut self, key: u64, item: T) {
        self.seen += 1;
        self.sequence += 1;
        if self.capacity == 0 {
            return;
        }
        let entry = Reverse((key, Reverse(self.sequence), Ranked(item)));
        if self.heap.len() < self.capacity {
            self.heap.push(entry);
        } else if let Some(least) = self.heap.peek()
            && (key, Reverse(self.sequence)) > (least.0.0, least.0.1)
        {
            self.heap.pop();
            self.heap.push(entry);
        }
    }

    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The kept items, worst first (ties: earliest first).
    pub fn ranked(&self) -> Vec<&T> {
        let mut items: Vec<_> = self.heap.iter().map(|Reverse((key, seq, item))| (*key, *seq, &item.0)).collect();
        items.sort_by_key(|&(key, seq, _)| Reverse((key, seq)));
        items.into_iter().map(|(_, _, item)| item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mm_probe_common::latency::hist_slot;

    fn record(d: &mut Distribution, value_us: u64) {
        let log2 = if value_us == 0 { 0 } else { 63 - value_us.leading_zeros() };
        d.slots[hist_slot(value_us, log2)] += 1;
        d.count += 1;
        d.sum_ns += value_us * 1000;
        d.max_ns = d.max_ns.max(Some(value_us * 1000));
    }

    #[test]
    fn slots_decode_to_the_ranges_they_hold() {
        for value in [0u64, 1, 2, 3, 7, 8, 9, 15, 16, 17, 500, 511, 512, 1953, 879, 1 << 40] {
            let log2 = if value == 0 { 0 } else { 63 - value.leading_zeros() };
            let slot = hist_slot(value, log2);
            let (low, high) = slot_bounds_us(slot);
            assert!(low <= value && value <= high, "{value} decoded to [{low}, {high}] from slot {slot}");
            assert_eq!(slot / SUB_BUCKETS, Log2Histogram::bucket_of(value), "{value}: log2 row");
        }
        // 1953 µs: log2 bucket 10 ([1024, 2047]), split into 128-µs parts: part 7 is [1920, 2047].
        assert_eq!(slot_bounds_us(hist_slot(1953, 10)), (1920, 2047));
        assert_eq!(slot_bounds_us(hist_slot(512, 9)), (512, 575), "[512, 1023] in 64-µs parts");
    }

    #[test]
    fn log2_rows_sum_the_parts_and_mark_the_threshold_row() {
        let mut d = Distribution::default();
        for v in [3, 20, 21, 22, 600, 700, 1953] {
            record(&mut d, v);
        }
        let log2 = d.log2_usecs();
        assert_eq!(log2.buckets[1], 1);
        assert_eq!(log2.buckets[4], 3, "20..22 µs are in [16, 31]");
        assert_eq!(log2.buckets[9], 2, "600 and 700 µs are in [512, 1023]");
        assert_eq!(log2.buckets[10], 1);
        let text = log2.render("usecs", Some(500));
        let marked: Vec<&str> = text.lines().filter(|l| l.ends_with("<- threshold")).collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].contains("256 -> 511"), "the 500 µs threshold lies in [256, 511]: {text}");
    }

    #[test]
    fn percentiles_are_within_a_sub_bucket_and_max_is_exact() {
        let mut d = Distribution::default();
        for v in 1..=1000u64 {
            record(&mut d, v);
        }
        let p = d.percentiles();
        assert_eq!(p.count, 1000);
        assert_eq!(p.max_ns, 1_000_000);
        for (got, want) in [(p.p50_ns, 500_000), (p.p90_ns, 900_000), (p.p99_ns, 990_000)] {
            let error = (got as f64 - want as f64).abs() / want as f64;
            assert!(error < 0.07, "{got} vs {want}: {error}");
        }
        assert!((p.mean_ns - 500_500.0).abs() < 1.0);
    }

    #[test]
    fn intervals_subtract_counts_and_forget_the_max() {
        let mut earlier = Distribution::default();
        record(&mut earlier, 10);
        let mut now = earlier.clone();
        record(&mut now, 100);
        record(&mut now, 100);
        let interval = now.since(&earlier);
        assert_eq!(interval.count, 2);
        assert_eq!(interval.max_ns, None);
        let p = interval.percentiles();
        assert!((96_000..=104_000).contains(&p.max_ns), "{p:?}");
    }

    #[test]
    fn spikes_rank_worst_first_and_keep_only_the_top() {
        let mut worst = Worst::new(3);
        for (key, name) in [(500, "a"), (1953, "b"), (700, "c"), (879, "d"), (700, "e"), (100, "f")] {
            worst.offer(key, name);
        }
        assert_eq!(worst.seen(), 6);
        assert_eq!(worst.ranked(), [&"b", &"d", &"c"], "ties keep the earliest");
        let mut none: Worst<&str> = Worst::new(0);
        none.offer(1, "x");
        assert!(none.ranked().is_empty());
    }
}
