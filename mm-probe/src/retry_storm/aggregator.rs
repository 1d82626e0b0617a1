//! Aggregating what the kernel counted and what the rings streamed into observation windows
//! (an `--interval`, or the whole run): kernel counter deltas, walks, retry chains, invalidations
//! and their overlaps. [`super::metrics`] turns a closed window into its report.

use std::{collections::HashMap, time::Duration};

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::PerCpuHashMap};
use hdrhistogram::Histogram;
use mm_probe_common::hmm::{self as names, HmmEvent, NotifierEvent, ReadBeginKey};

use super::{
    chains::{Chain, ChainEnd, ChainJoiner},
    counters::{KernelCounters, KernelTotals, bucket_delta},
    events::{Event, Invalidation, Walk, decode},
    judge::Thresholds,
    overlap::{self, BusyCause, InvalidationOverlap, OverlapJoiner},
    report::{CauseTally, ChainTally, Invalidator, Observability, OverlapTally, ReadBeginCaller, Snapshot},
    timeline::Timeline,
};
use crate::{
    collect::counters::percpu_sums,
    kernel::Kallsyms,
    report::{Log2Histogram, percentiles::latency_histogram},
};

/// Log2 slots for chain lengths (walks per retry loop).
pub const CHAIN_LENGTH_BUCKETS: usize = 32;
const SIZE_BUCKETS: usize = names::LOG2_BUCKETS as usize;
/// How many invalidators the report lists.
pub const TOP_INVALIDATORS: usize = 10;
const PAGE_BYTES: u64 = 4096;
/// How long after a walk returned mm-probe waits for the invalidations that could have failed
/// it (they come through the other ring).
const SETTLE: Duration = Duration::from_millis(100);
/// How long invalidations are kept for walks whose window started long before they returned.
const RETAIN: Duration = Duration::from_secs(2);

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
    pub(super) invalidation_events: u64,
    pub(super) small_invalidations: u64,
    pub(super) invalidation_sizes: Vec<u64>,
    pub(super) invalidators: HashMap<(String, NotifierEvent), (u64, u64)>,
    pub busy_causes: CauseTally,
    pub(super) max_false_sharing_interval_bytes: u64,
    pub overlap: OverlapTally,
    pub callback_ns: Vec<u64>,
    pub window_ns: Vec<u64>,
    pub kvm_sizes: Vec<u64>,
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
            invalidation_events: 0,
            small_invalidations: 0,
            invalidation_sizes: vec![0; SIZE_BUCKETS],
            invalidators: HashMap::new(),
            busy_causes: CauseTally::default(),
            max_false_sharing_interval_bytes: 0,
            overlap: OverlapTally::default(),
            callback_ns: vec![0; SIZE_BUCKETS],
            window_ns: vec![0; SIZE_BUCKETS],
            kvm_sizes: vec![0; SIZE_BUCKETS],
        }
    }

    pub fn add_walk(&mut self, walk: &Walk) {
        self.walk_events += 1;
        self.walk_bytes_total = self.walk_bytes_total.saturating_add(walk.bytes());
        self.max_walk_bytes = self.max_walk_bytes.max(walk.bytes());
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
    }

    pub fn add_invalidation(&mut self, invalidation: &Invalidation) {
        let bytes = invalidation.bytes();
        self.invalidation_events += 1;
        if bytes <= PAGE_BYTES {
            self.small_invalidations += 1;
        }
        let bucket = Log2Histogram::bucket_of(bytes).min(SIZE_BUCKETS - 1);
        self.invalidation_sizes[bucket] += 1;
        let slot = self.invalidators.entry((invalidation.comm.clone(), invalidation.event)).or_default();
        slot.0 += 1;
        // RELEASE (exit_mmap) invalidates [0, ULONG_MAX): byte totals saturate.
        slot.1 = slot.1.saturating_add(bytes);
    }

    pub fn add_busy_cause(&mut self, walk: &Walk, cause: BusyCause) {
        match cause {
            BusyCause::TrueConflict => self.busy_causes.true_conflict += 1,
            BusyCause::FalseSharing => {
                self.busy_causes.false_sharing += 1;
                if let Some((start, last)) = walk.interval {
                    self.max_false_sharing_interval_bytes =
                        self.max_false_sharing_interval_bytes.max(last.saturating_sub(start).saturating_add(1));
                }
            }
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
        let c = &other.chains;
        self.chains.success += c.success;
        self.chains.error += c.error;
        self.chains.timed_out += c.timed_out;
        self.chains.gave_up += c.gave_up;
        self.chains.unfinished += c.unfinished;
        self.invalidation_events += other.invalidation_events;
        self.small_invalidations += other.small_invalidations;
        add_buckets(&mut self.invalidation_sizes, &other.invalidation_sizes);
        for (key, (count, bytes)) in &other.invalidators {
            let slot = self.invalidators.entry(key.clone()).or_default();
            slot.0 += count;
            slot.1 = slot.1.saturating_add(*bytes);
        }
        self.busy_causes.true_conflict += other.busy_causes.true_conflict;
        self.busy_causes.false_sharing += other.busy_causes.false_sharing;
        self.busy_causes.unexplained += other.busy_causes.unexplained;
        self.max_false_sharing_interval_bytes =
            self.max_false_sharing_interval_bytes.max(other.max_false_sharing_interval_bytes);
        let o = &other.overlap;
        self.overlap.walked_range += o.walked_range;
        self.overlap.notifier_interval_only += o.notifier_interval_only;
        self.overlap.outside_notifiers += o.outside_notifiers;
        self.overlap.no_walk_running += o.no_walk_running;
        add_buckets(&mut self.callback_ns, &other.callback_ns);
        add_buckets(&mut self.window_ns, &other.window_ns);
        add_buckets(&mut self.kvm_sizes, &other.kvm_sizes);
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

/// Everything user space keeps while the run lasts: the open window, the run's total, and
/// the joiners whose results land in the window open when they settle.
pub struct Collector {
    chains: ChainJoiner,
    overlap: OverlapJoiner,
    current: Window,
    total: Window,
    run_start_ns: u64,
    previous: KernelTotals,
    pub seen: Observability,
    pub thresholds: Thresholds,
    numa_balancing: Option<String>,
    /// Records of a kind this build does not know.
    pub malformed: u64,
    /// Rate samples for `--plot`; `None` without it.
    pub timeline: Option<Timeline>,
}

impl Collector {
    /// A run that starts at `start_ns`, when the kernel's counters were zero.
    pub fn new(
        start_ns: u64,
        timeout_ns: u64,
        seen: Observability,
        thresholds: Thresholds,
        numa_balancing: Option<String>,
    ) -> Self {
        Self {
            chains: ChainJoiner::new(timeout_ns),
            overlap: OverlapJoiner::new(SETTLE.as_nanos() as u64, RETAIN.as_nanos() as u64),
            current: Window::new(start_ns),
            total: Window::new(start_ns),
            run_start_ns: start_ns,
            previous: KernelTotals::default(),
            seen,
            thresholds,
            numa_balancing,
            malformed: 0,
            timeline: None,
        }
    }

    /// Samples the kernel's counters for `--plot` every `period`, keeping at most `capacity`.
    pub fn sample_every(&mut self, period: Duration, capacity: usize) {
        self.timeline = Some(Timeline::new(self.run_start_ns, period.as_nanos() as u64, capacity));
    }

    /// Reads the kernel counters into the `--plot` timeline.
    pub fn sample(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<()> {
        if let Some(timeline) = &mut self.timeline {
            timeline.record(now_ns, &KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?));
        }
        Ok(())
    }

    /// The last read of the `--plot` timeline, once nothing more can be counted.
    pub fn finish_sampling(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<()> {
        if let Some(timeline) = &mut self.timeline {
            timeline.finish(now_ns, &KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?));
        }
        Ok(())
    }

    pub fn on_raw(&mut self, raw: &HmmEvent) {
        match decode(raw) {
            Some(Event::Walk(walk)) => {
                self.current.add_walk(&walk);
                if let Some(chain) = self.chains.walk(&walk) {
                    self.current.add_chain(&chain);
                }
                self.overlap.add_walk(walk);
            }
            Some(Event::Invalidate(invalidation)) => {
                self.current.add_invalidation(&invalidation);
                self.overlap.add_invalidation(invalidation);
            }
            Some(Event::NotifierRemove(remove)) => {
                for chain in self.chains.notifier_removed(remove.notifier) {
                    self.current.add_chain(&chain);
                }
            }
            None => self.malformed += 1,
        }
    }

    fn apply_settled(&mut self, settled: overlap::Settled) {
        for (walk, cause) in &settled.busy_causes {
            self.current.add_busy_cause(walk, *cause);
        }
        for (_, overlap) in settled.invalidations {
            self.current.add_overlap(overlap);
        }
    }

    /// Judges the walks whose invalidations have all arrived by `now_ns`.
    pub fn settle(&mut self, now_ns: u64) {
        let settled = self.overlap.settle(now_ns);
        self.apply_settled(settled);
    }

    /// Once nothing more can arrive: every open chain ends unfinished, every held walk and
    /// invalidation is judged, all into the open window.
    pub fn finish_streams(&mut self) {
        for chain in self.chains.finish() {
            self.current.add_chain(&chain);
        }
        let settled = self.overlap.finish();
        self.apply_settled(settled);
    }

    /// Ends the current window at `now_ns` with the kernel's cumulative `totals`; returns its
    /// report. A window closed the instant it opened is still reported (its counts are in the
    /// run's total, so the intervals add up to the summary); its rates are unknown, not
    /// divided by zero.
    pub fn close_window(&mut self, totals: KernelTotals, now_ns: u64) -> Snapshot {
        let mut window = std::mem::replace(&mut self.current, Window::new(now_ns));
        window.end_ns = now_ns.max(window.start_ns);
        window.counters = totals.counters.since(&self.previous.counters);
        window.callback_ns = bucket_delta(&totals.callback_ns, &self.previous.callback_ns);
        window.window_ns = bucket_delta(&totals.window_ns, &self.previous.window_ns);
        window.kvm_sizes = bucket_delta(&totals.kvm_sizes, &self.previous.kvm_sizes);
        self.previous = totals;
        self.total.merge(&window);
        self.snapshot(&window)
    }

    /// The whole run's report so far (every closed window).
    pub fn summary(&self) -> Snapshot {
        self.snapshot(&self.total)
    }

    fn snapshot(&self, window: &Window) -> Snapshot {
        Snapshot::build(window, self.run_start_ns, &self.seen, &self.thresholds, self.numa_balancing.clone())
    }
}

/// The kernel's per-(notifier, tgid) read_begin counts, most first.
pub fn read_begins_by_caller(ebpf: &Ebpf, kallsyms: Option<&Kallsyms>) -> Result<Vec<ReadBeginCaller>> {
    let map: PerCpuHashMap<_, ReadBeginKey, u64> =
        PerCpuHashMap::try_from(ebpf.map(names::READ_BEGINS_MAP).context("read_begin map missing from the object")?)?;
    let callbacks: aya::maps::HashMap<_, u64, u64> = aya::maps::HashMap::try_from(
        ebpf.map(names::NOTIFIER_CALLBACKS_MAP).context("notifier callback map missing from the object")?,
    )?;
    let mut callers = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        let symbol = callbacks.get(&key.notifier, 0).ok().and_then(|ip| kallsyms?.symbolize(ip));
        let callback = symbol.as_ref().map(|s| s.symbol.name.clone());
        let subscriber = callback.as_deref().and_then(crate::invalidations::probes::subscriber_of).map(str::to_string);
        callers.push(ReadBeginCaller {
            tgid: key.tgid,
            notifier: format!("{:#x}", key.notifier),
            subscriber: subscriber.or_else(|| symbol.as_ref().and_then(|s| s.symbol.module.clone())),
            callback,
            calls: per_cpu.iter().sum(),
        });
    }
    callers.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.tgid.cmp(&b.tgid)));
    callers.truncate(TOP_INVALIDATORS);
    Ok(callers)
}

#[cfg(test)]
pub(crate) mod tests {
    use mm_probe_common::hmm::{Counter, EBUSY};

    use super::*;
    use crate::retry_storm::counters::tests::counters;

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

    fn totals(walks: u64, busy: u64, invalidations: u64) -> KernelTotals {
        KernelTotals { counters: counters(walks, busy, invalidations), ..KernelTotals::default() }
    }

    fn collector() -> Collector {
        let seen = Observability { walks: true, invalidations: true, ..Observability::default() };
        Collector::new(1_000, 1_000_000_000, seen, Thresholds::default(), None)
    }

    #[test]
    fn intervals_add_up_to_the_summary_even_when_the_last_one_has_no_length() {
        let mut c = collector();
        let first = c.close_window(totals(10, 4, 20), 1_000 + 1_000_000_000);
        assert_eq!(first.walks.as_ref().map(|w| (w.calls, w.ebusy)), Some((10, 4)));
        // The run stops at the instant the interval ended: what the kernel counted since (the
        // final ring drain) is a window of no length, still reported, with no rate.
        let last = c.close_window(totals(13, 5, 26), 1_000 + 1_000_000_000);
        assert_eq!(last.duration_ns, 0);
        assert_eq!(last.walks.as_ref().map(|w| (w.calls, w.ebusy)), Some((3, 1)));
        assert_eq!(last.invalidations.as_ref().and_then(|i| i.per_second), None);
        let summary = c.summary();
        assert_eq!(summary.walks.as_ref().map(|w| (w.calls, w.ebusy)), Some((13, 5)));
        assert_eq!(summary.duration_ns, 1_000_000_000);
        assert_eq!(summary.invalidations.as_ref().and_then(|i| i.per_second), Some(26.0));
    }

    #[test]
    fn a_clock_read_before_the_window_opened_closes_it_empty_not_negative() {
        let mut c = collector();
        let snapshot = c.close_window(totals(1, 0, 0), 500);
        assert_eq!((snapshot.start_offset_ns, snapshot.duration_ns), (0, 0));
    }
}
