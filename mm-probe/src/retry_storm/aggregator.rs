//! The run's collector: each record the rings streamed is decoded and joined (walks.rs), its
//! result added to the open observation window (window.rs), and the window closed with the
//! kernel counters' deltas at each `--interval` and at the end.

use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::PerCpuHashMap};
use mm_probe_common::hmm::{self as names, HmmEvent, ReadBeginKey, SeqBegin, WalkStash};

use super::{
    counters::{KernelCounters, KernelTotals},
    judge::Thresholds,
    report::{Observability, ReadBeginCaller, Snapshot},
    timeline::Timeline,
    walks::{ChainJoiner, Event, OverlapJoiner, Settled, decode},
    window::{TOP_INVALIDATORS, Window},
};
use crate::{
    cause::Namer,
    collect::{
        RingReader,
        counters::{counted_since, percpu_sums},
    },
    kernel::Kallsyms,
};

/// How long after a walk returned mm-probe waits for the invalidations that could have failed
/// it (they come through the other ring).
const SETTLE: Duration = Duration::from_millis(100);
/// How long invalidations are kept for walks whose window started long before they returned.
const RETAIN: Duration = Duration::from_secs(2);

/// The two rings and what was read from them but not yet absorbed.
pub struct Streams {
    walks: RingReader<HmmEvent>,
    invalidations: RingReader<HmmEvent>,
    walk_batch: Vec<HmmEvent>,
    invalidate_batch: Vec<HmmEvent>,
}

impl Streams {
    pub fn new(walks: RingReader<HmmEvent>, invalidations: RingReader<HmmEvent>) -> Self {
        Self { walks, invalidations, walk_batch: Vec::new(), invalidate_batch: Vec::new() }
    }
}

/// Everything user space keeps while the run lasts: its rings, the open window, the run's
/// total, and the joiners whose results land in the window open when they settle.
pub struct Collector {
    /// `None` in unit tests, which hand records to [`Collector::on_raw`] themselves.
    streams: Option<Streams>,
    chains: ChainJoiner,
    overlap: OverlapJoiner,
    current: Window,
    total: Window,
    run_start_ns: u64,
    previous: KernelTotals,
    pub seen: Observability,
    pub thresholds: Thresholds,
    /// Names the causes the kernel decided (this kernel's migration reasons).
    namer: Namer,
    /// Records of a kind this build does not know.
    malformed: u64,
    /// Rate samples for `--plot`; `None` without it.
    pub timeline: Option<Timeline>,
}

impl Collector {
    /// A run that starts at `start_ns`, when the kernel's counters were zero.
    pub fn new(start_ns: u64, timeout_ns: u64, seen: Observability, thresholds: Thresholds, namer: Namer) -> Self {
        Self {
            streams: None,
            chains: ChainJoiner::new(timeout_ns),
            overlap: OverlapJoiner::new(SETTLE.as_nanos() as u64, RETAIN.as_nanos() as u64),
            current: Window::new(start_ns),
            total: Window::new(start_ns),
            run_start_ns: start_ns,
            previous: KernelTotals::default(),
            seen,
            thresholds,
            namer,
            malformed: 0,
            timeline: None,
        }
    }

    /// Reads the kernel's records from `streams`.
    pub fn read_from(&mut self, streams: Streams) {
        self.streams = Some(streams);
    }

    /// Waits for records on either ring and absorbs what arrived.
    pub async fn read(&mut self) -> Result<()> {
        let Some(s) = &mut self.streams else { return std::future::pending().await };
        tokio::select! {
            read = s.walks.read(|raw| s.walk_batch.push(raw)) => { read?; }
            read = s.invalidations.read(|raw| s.invalidate_batch.push(raw)) => { read?; }
        }
        self.absorb();
        Ok(())
    }

    /// Takes everything written so far: records below the rings' wake-up mark are still in
    /// them, and a settle must see every invalidation older than its cutoff.
    pub fn drain_rings(&mut self) {
        if let Some(s) = &mut self.streams {
            s.walks.drain_now(|raw| s.walk_batch.push(raw));
            s.invalidations.drain_now(|raw| s.invalidate_batch.push(raw));
        }
        self.absorb();
    }

    /// Walks first: an invalidation batch read in the same turn may be newer, never older, than
    /// what the overlap joiner still holds for them.
    fn absorb(&mut self) {
        let Some(s) = &mut self.streams else { return };
        // Taken out and given back, so the batches keep their capacity from turn to turn.
        let (mut walks, mut invalidations) =
            (std::mem::take(&mut s.walk_batch), std::mem::take(&mut s.invalidate_batch));
        for raw in walks.drain(..).chain(invalidations.drain(..)) {
            self.on_raw(&raw);
        }
        if let Some(s) = &mut self.streams {
            (s.walk_batch, s.invalidate_batch) = (walks, invalidations);
        }
    }

    /// Records ignored: of a kind this build does not know, or of the wrong size.
    pub fn malformed(&self) -> u64 {
        self.malformed + self.streams.as_ref().map_or(0, |s| s.walks.malformed + s.invalidations.malformed)
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
        match decode(raw, &self.namer) {
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

    fn apply_settled(&mut self, settled: Settled) {
        for failure in &settled.failures {
            self.current.add_failure(failure);
        }
        for (_, overlap) in settled.invalidations {
            self.current.add_overlap(overlap);
        }
    }

    /// Judges the walks whose invalidations have all arrived by `now_ns`, keeping every
    /// invalidation a walk in flight since `in_flight_since` may still need.
    pub fn settle_with_walks_in_flight(&mut self, now_ns: u64, in_flight_since: Option<u64>) {
        self.overlap.walks_in_flight_since(in_flight_since);
        self.settle(now_ns);
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
        window.callback_ns = counted_since(&totals.callback_ns, &self.previous.callback_ns);
        window.window_ns = counted_since(&totals.window_ns, &self.previous.window_ns);
        window.kvm_sizes = counted_since(&totals.kvm_sizes, &self.previous.kvm_sizes);
        window.cause_brackets_missed = totals.cause_brackets_missed.saturating_sub(self.previous.cause_brackets_missed);
        self.previous = totals;
        self.total.merge(&window);
        self.snapshot(&window)
    }

    /// The whole run's report so far (every closed window).
    pub fn summary(&self) -> Snapshot {
        self.snapshot(&self.total)
    }

    fn snapshot(&self, window: &Window) -> Snapshot {
        Snapshot::build(window, self.run_start_ns, &self.seen, &self.thresholds)
    }
}

/// A walk in flight longer than this is taken for one whose return was missed (its entry
/// stays in the LRU stash until evicted) and no longer holds invalidations back.
const LONGEST_WALK: Duration = Duration::from_secs(60);

/// Where the earliest window of the walks now in flight began: each stashed walk's thread's
/// last read_begin when it came before the walk's entry, else the entry; `None` when no walk
/// is in flight.
pub fn walks_in_flight_since(ebpf: &Ebpf, now_ns: u64) -> Result<Option<u64>> {
    let stash: aya::maps::HashMap<_, u32, WalkStash> =
        aya::maps::HashMap::try_from(ebpf.map(names::WALK_STASH_MAP).context("walk stash missing from the object")?)?;
    let begins: aya::maps::HashMap<_, u32, SeqBegin> = aya::maps::HashMap::try_from(
        ebpf.map(names::SEQ_BEGIN_MAP).context("read_begin table missing from the object")?,
    )?;
    let recent = now_ns.saturating_sub(LONGEST_WALK.as_nanos() as u64);
    let mut earliest: Option<u64> = None;
    for entry in stash.iter() {
        let (pid, walk) = entry?;
        if walk.ts_ns < recent {
            continue;
        }
        let begin = begins.get(&pid, 0).ok().map(|b| b.ts_ns).filter(|&ts| ts <= walk.ts_ns);
        let start = begin.unwrap_or(walk.ts_ns);
        earliest = Some(earliest.map_or(start, |e| e.min(start)));
    }
    Ok(earliest)
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
        let callback = symbol.as_ref().map(|s| s.symbol.name.to_string());
        let subscriber = callback.as_deref().and_then(crate::invalidations::probes::subscriber_of).map(str::to_string);
        callers.push(ReadBeginCaller {
            tgid: key.tgid,
            notifier: format!("{:#x}", key.notifier),
            subscriber: subscriber
                .or_else(|| symbol.as_ref().and_then(|s| s.symbol.module.as_deref().map(str::to_string))),
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
    use super::*;
    use crate::retry_storm::{counters::tests::counters, report::Loss};

    fn totals(walks: u64, busy: u64, invalidations: u64) -> KernelTotals {
        KernelTotals { counters: counters(walks, busy, invalidations), ..KernelTotals::default() }
    }

    fn collector() -> Collector {
        let seen = Observability { walks: true, invalidations: true, ..Observability::default() };
        Collector::new(1_000, 1_000_000_000, seen, Thresholds::default(), Namer::default())
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
    fn bracket_ends_missed_are_a_windows_loss_and_add_up_in_the_summary() {
        let mut c = collector();
        let missed = |n| KernelTotals { cause_brackets_missed: n, ..totals(1, 0, 0) };
        let first = c.close_window(missed(2), 1_000 + 1_000_000_000);
        let second = c.close_window(missed(5), 1_000 + 2_000_000_000);
        let lost = |s: &Snapshot| s.lost_events.get(Loss::CauseBracketsMissed);
        assert_eq!((lost(&first), lost(&second), lost(&c.summary())), (2, 3, 5));
    }

    #[test]
    fn a_clock_read_before_the_window_opened_closes_it_empty_not_negative() {
        let mut c = collector();
        let snapshot = c.close_window(totals(1, 0, 0), 500);
        assert_eq!((snapshot.start_offset_ns, snapshot.duration_ns), (0, 0));
    }
}
