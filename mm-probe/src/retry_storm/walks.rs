//! The walks the rings streamed, as the verdict needs them: decoded, joined into retry chains,
//! and each -EBUSY matched with the invalidation that caused it.
//!
//! # Records
//!
//! Decoding the kernel's [`HmmEvent`] records into typed walks, invalidations and notifier
//! removals.
//!
//! # Retry chains
//!
//! A driver mirrors a range with a loop: read_begin → hmm_range_fault → on -EBUSY retry, until
//! success, a hard error, or its timeout (1000 ms in every in-tree caller). mm-probe sees only
//! the walks, so a chain is every walk of one process on one notifier from the first walk
//! after the previous chain ended:
//! - a walk returning 0 ends it: success;
//! - a walk returning another error ends it: error;
//! - a walk returning -EBUSY when the chain has already run for `--timeout` ends it: timed out
//!   (the driver gives up at exactly this check);
//! - the driver removing the notifier while the chain is still failing ends it: gave up (the
//!   driver stopped retrying; drivers that time out inside one call drop their notifier then);
//! - the run ending leaves it unfinished.
//!
//! A success after mmu_interval_read_retry() failed is invisible (that check is static
//! inline); such a retry shows as a second chain on the same notifier.
//!
//! # Overlaps
//!
//! An invalidation fails a walk when it starts inside the walk's window (from the walk's
//! read_begin to its return) on the same mm and overlaps the walk's notifier interval:
//! - a *true conflict* when it also overlaps the walked range (the walk really raced with a
//!   change to the pages it mirrored: shorter walks help);
//! - *false sharing* when it overlaps only the notifier's interval (one coarse notifier turned
//!   an unrelated invalidation into a retry: finer notifiers help).
//!
//! Walks and invalidations arrive through different rings, so a walk is judged only once
//! every invalidation that could overlap it has arrived: `settle_ns` after it returned.
//!
//! # Stale sequences
//!
//! hmm_range_fault() checks the walk's sequence against the notifier's before it walks, so a
//! walk that starts with a sequence the notifier has already moved past fails whatever happens
//! during it. The kernel program reads both at entry, and calls a failed walk a *stale-sequence
//! retry* when it was stale so and carries the notifier and sequence of the same thread's
//! previous walk, which failed too: the driver did not call read_begin again, and its loop
//! cannot succeed until it gives up. The kernel counts them exactly (`Counter::StaleRetries`)
//! and marks their records; here they count per loop, and blame no invalidation. The first
//! failed walk of such a loop is judged as any other (its invalidation came during its window).

use std::collections::{HashMap, VecDeque};

pub use mm_probe_common::hmm::NotifierEvent;
use mm_probe_common::hmm::{EBUSY, EventKind, HmmEvent, SeqState};

use crate::{
    cause::{CauseName, Namer},
    report::tally::tally,
};

/// One hmm_range_fault() call.
#[derive(Clone, Debug, PartialEq)]
pub struct Walk {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub entry_ns: u64,
    pub exit_ns: u64,
    /// `None` when the entry was not seen (the return probe found no stash).
    pub duration_ns: Option<u64>,
    /// This thread's mmu_interval_read_begin() on the same notifier before the walk.
    pub seq_begin_ns: Option<u64>,
    pub ret: i32,
    pub notifier: u64,
    pub mm: u64,
    /// Walked range [start, end).
    pub start: u64,
    pub end: u64,
    /// The notifier's interval [start, last] (inclusive), when BTF gave its offsets.
    pub interval: Option<(u64, u64)>,
    /// The walk's sequence, when its entry was seen and BTF gave both sequences' offsets.
    pub seq: Option<u64>,
    /// A failed retry with the sequence of the thread's previous failed walk, stale at entry
    /// (the kernel's [`SeqState::StaleRetry`]).
    pub stale_retry: bool,
    /// At its read_begin an invalidation of the mm was in progress that had not yet reached
    /// the notifier (the kernel's [`mm_probe_common::hmm::SeqBegin::overtaken`]): begun before the window, it can
    /// still have failed the walk.
    pub begin_overtaken: bool,
}

impl Walk {
    pub fn busy(&self) -> bool {
        self.ret == -EBUSY
    }

    pub fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// When an invalidation could start failing this walk: from its read_begin (the sequence
    /// it checks was read there), else from its entry.
    pub fn window_start_ns(&self) -> u64 {
        self.seq_begin_ns.unwrap_or(self.entry_ns)
    }
}

/// One __mmu_notifier_invalidate_range_start() on a mirrored mm.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalidation {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub ts_ns: u64,
    pub mm: u64,
    /// Invalidated range [start, end).
    pub start: u64,
    pub end: u64,
    pub event: NotifierEvent,
    /// Why it happened, decided in the invalidating thread.
    pub cause: CauseName,
}

impl Invalidation {
    pub fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A driver removed an interval notifier.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifierRemove {
    pub ts_ns: u64,
    pub notifier: u64,
    pub mm: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Walk(Walk),
    Invalidate(Invalidation),
    NotifierRemove(NotifierRemove),
}

/// Turns one raw record into an event, its cause named by `namer`; `None` for an unknown kind
/// (a build mismatch).
pub fn decode(raw: &HmmEvent, namer: &Namer) -> Option<Event> {
    let comm = comm_string(&raw.comm);
    match EventKind::from_u32(raw.kind)? {
        EventKind::Walk => Some(Event::Walk(Walk {
            pid: raw.pid,
            tgid: raw.tgid,
            comm,
            entry_ns: raw.ts_ns,
            exit_ns: raw.ts_ns + raw.duration_ns,
            duration_ns: (raw.duration_ns != 0).then_some(raw.duration_ns),
            seq_begin_ns: (raw.seq_begin_ns != 0).then_some(raw.seq_begin_ns),
            ret: raw.code,
            notifier: raw.notifier,
            mm: raw.mm,
            start: raw.start,
            end: raw.end,
            interval: (raw.interval_last != 0).then_some((raw.interval_start, raw.interval_last)),
            seq: (SeqState::from_u32(raw.seq_state) != SeqState::Unread).then_some(raw.seq),
            stale_retry: SeqState::from_u32(raw.seq_state) == SeqState::StaleRetry,
            begin_overtaken: raw.begin_overtaken != 0,
        })),
        EventKind::Invalidate => {
            let event = NotifierEvent::from_raw(raw.code);
            Some(Event::Invalidate(Invalidation {
                pid: raw.pid,
                tgid: raw.tgid,
                cause: namer.name(&raw.cause, &comm, Some(event.name())),
                comm,
                ts_ns: raw.ts_ns,
                mm: raw.mm,
                start: raw.start,
                end: raw.end,
                event,
            }))
        }
        EventKind::NotifierRemove => {
            Some(Event::NotifierRemove(NotifierRemove { ts_ns: raw.ts_ns, notifier: raw.notifier, mm: raw.mm }))
        }
    }
}

fn comm_string(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainEnd {
    Success,
    Error(i32),
    TimedOut,
    GaveUp,
    Unfinished,
}

impl ChainEnd {
    /// A retry loop that gave up: the numerator of timeout_rate.
    pub fn is_timeout(self) -> bool {
        matches!(self, ChainEnd::TimedOut | ChainEnd::GaveUp)
    }
}

/// One retry loop as mm-probe reconstructed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    pub tgid: u32,
    pub notifier: u64,
    pub comm: String,
    pub first_ns: u64,
    pub last_ns: u64,
    pub walks: u32,
    pub busy_walks: u32,
    /// Time spent inside walks that returned -EBUSY: work thrown away.
    pub failed_walk_ns: u64,
    /// Its stale-sequence retries.
    pub stale_retries: u32,
    pub end: ChainEnd,
}

impl Chain {
    pub fn duration_ns(&self) -> u64 {
        self.last_ns.saturating_sub(self.first_ns)
    }
}

/// Open chains keyed by (tgid, notifier).
#[derive(Debug)]
pub struct ChainJoiner {
    timeout_ns: u64,
    open: HashMap<(u32, u64), Chain>,
}

impl ChainJoiner {
    pub fn new(timeout_ns: u64) -> Self {
        Self { timeout_ns, open: HashMap::new() }
    }

    pub fn open_chains(&self) -> usize {
        self.open.len()
    }

    /// Adds a walk (in the order the walker's thread made them); returns the chain it ended.
    pub fn walk(&mut self, walk: &Walk) -> Option<Chain> {
        let key = (walk.tgid, walk.notifier);
        let chain = self.open.entry(key).or_insert_with(|| Chain {
            tgid: walk.tgid,
            notifier: walk.notifier,
            comm: walk.comm.clone(),
            first_ns: walk.window_start_ns(),
            last_ns: walk.exit_ns,
            walks: 0,
            busy_walks: 0,
            failed_walk_ns: 0,
            stale_retries: 0,
            end: ChainEnd::Unfinished,
        });
        chain.walks += 1;
        chain.last_ns = chain.last_ns.max(walk.exit_ns);
        let end = if walk.busy() {
            chain.busy_walks += 1;
            chain.failed_walk_ns += walk.duration_ns.unwrap_or(0);
            chain.stale_retries += u32::from(walk.stale_retry);
            (chain.duration_ns() >= self.timeout_ns).then_some(ChainEnd::TimedOut)
        } else if walk.ret == 0 {
            Some(ChainEnd::Success)
        } else {
            Some(ChainEnd::Error(walk.ret))
        };
        let end = end?;
        let mut chain = self.open.remove(&key)?;
        chain.end = end;
        Some(chain)
    }

    /// The notifier went away: every chain still failing on it gave up.
    pub fn notifier_removed(&mut self, notifier: u64) -> Vec<Chain> {
        let keys: Vec<(u32, u64)> = self.open.keys().filter(|(_, n)| *n == notifier).copied().collect();
        keys.into_iter()
            .filter_map(|key| self.open.remove(&key))
            .map(|chain| Chain { end: ChainEnd::GaveUp, ..chain })
            .collect()
    }

    /// End of the run: chains still open were retrying when mm-probe stopped. They are never
    /// counted as timeouts: one past the timeout would already have ended at its last walk.
    pub fn finish(&mut self) -> Vec<Chain> {
        self.open.drain().map(|(_, chain)| Chain { end: ChainEnd::Unfinished, ..chain }).collect()
    }
}

tally! {
    /// Retry loops that retried with a sequence already stale: loops that cannot succeed.
    pub struct StaleLoops {
        /// Loops with at least one stale-sequence retry.
        pub loops,
        /// Their stale-sequence retries.
        pub retries,
        /// … of those loops, how many the driver gave up (timed out, or dropped its notifier).
        pub gave_up,
        /// The time those given-up loops lasted: the driver's timeout windows, lost.
        pub given_up_ns,
    }
}

impl StaleLoops {
    pub fn add_chain(&mut self, chain: &Chain) {
        if chain.stale_retries == 0 {
            return;
        }
        self.loops += 1;
        self.retries += u64::from(chain.stale_retries);
        if chain.end.is_timeout() {
            self.gave_up += 1;
            self.given_up_ns += chain.duration_ns();
        }
    }
}

/// Why a walk returned -EBUSY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyCause {
    TrueConflict,
    FalseSharing,
    /// A retry with a sequence already stale from an earlier failure of its loop: no
    /// invalidation during it was needed, and none is blamed.
    StaleSequence,
    /// No invalidation of the notifier's interval was seen in the window (lost events, or an
    /// invalidation from a path not probed).
    Unexplained,
}

/// How one invalidation related to the walks running while it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InvalidationOverlap {
    /// Overlapped the range some walk was walking.
    pub walked_range: bool,
    /// Overlapped only a walking notifier's interval (false sharing).
    pub interval_only: bool,
    /// Started during a walk on the same mm but outside every walking notifier's interval.
    pub outside: bool,
}

#[derive(Clone, Debug)]
struct Stored {
    invalidation: Invalidation,
    overlap: InvalidationOverlap,
}

/// A failed walk, why it failed, and the cause of the invalidation it collided with (the
/// first in its window that overlapped its range, else its notifier's interval).
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub walk: Walk,
    pub why: BusyCause,
    pub collided_with: Option<CauseName>,
}

/// What the joiner hands back when walks settle or invalidations age out.
#[derive(Debug, Default)]
pub struct Settled {
    pub failures: Vec<Failure>,
    /// Settled walks that succeeded or failed otherwise (for completeness of the caller's view).
    pub other_walks: Vec<Walk>,
    pub invalidations: Vec<(Invalidation, InvalidationOverlap)>,
}

#[derive(Debug)]
pub struct OverlapJoiner {
    settle_ns: u64,
    /// How long invalidations are kept for walks whose window started long ago.
    retain_ns: u64,
    /// Sorted by start time.
    invalidations: VecDeque<Stored>,
    pending: Vec<Walk>,
    /// Where the earliest window of a walk still in flight (entered, not returned) began: its
    /// invalidations are kept however long it walks.
    in_flight_since: Option<u64>,
}

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start < b_end && b_start < a_end
}

impl OverlapJoiner {
    pub fn new(settle_ns: u64, retain_ns: u64) -> Self {
        Self { settle_ns, retain_ns, invalidations: VecDeque::new(), pending: Vec::new(), in_flight_since: None }
    }

    pub fn add_invalidation(&mut self, invalidation: Invalidation) {
        let stored = Stored { invalidation, overlap: InvalidationOverlap::default() };
        // Nearly always in order; a late one goes to its place.
        let ts = stored.invalidation.ts_ns;
        let at = self.invalidations.iter().rposition(|s| s.invalidation.ts_ns <= ts).map_or(0, |i| i + 1);
        self.invalidations.insert(at, stored);
    }

    pub fn add_walk(&mut self, walk: Walk) {
        self.pending.push(walk);
    }

    /// Where the earliest window of the walks now in flight began (`None`: none is): a walk
    /// longer than `retain_ns` is seen only when it returns, and the invalidations of its first
    /// moments must still be here then.
    pub fn walks_in_flight_since(&mut self, since: Option<u64>) {
        self.in_flight_since = since;
    }

    /// Judges every walk that returned at least `settle_ns` before `now_ns` and releases
    /// invalidations older than `retain_ns` that no pending walk can still need.
    pub fn settle(&mut self, now_ns: u64) -> Settled {
        let cutoff = now_ns.saturating_sub(self.settle_ns);
        let (ready, pending): (Vec<Walk>, Vec<Walk>) = self.pending.drain(..).partition(|w| w.exit_ns <= cutoff);
        self.pending = pending;
        let mut settled = Settled::default();
        for walk in ready {
            match self.judge(&walk) {
                Some((why, collided_with)) => settled.failures.push(Failure { walk, why, collided_with }),
                None => settled.other_walks.push(walk),
            }
        }
        let oldest_needed =
            self.pending.iter().map(Walk::window_start_ns).chain(self.in_flight_since).min().unwrap_or(u64::MAX);
        let keep_after = now_ns.saturating_sub(self.retain_ns).min(oldest_needed).min(cutoff);
        while self.invalidations.front().is_some_and(|s| s.invalidation.ts_ns < keep_after) {
            if let Some(s) = self.invalidations.pop_front() {
                settled.invalidations.push((s.invalidation, s.overlap));
            }
        }
        settled
    }

    /// Everything still held, at the end of the run.
    pub fn finish(&mut self) -> Settled {
        let mut settled = self.settle(u64::MAX);
        settled.invalidations.extend(self.invalidations.drain(..).map(|s| (s.invalidation, s.overlap)));
        settled
    }

    /// Marks the invalidations in `walk`'s window; when the walk was busy, returns why and
    /// the cause of the invalidation that failed it.
    fn judge(&mut self, walk: &Walk) -> Option<(BusyCause, Option<CauseName>)> {
        if walk.stale_retry {
            // Its window starts at the loop's one read_begin and holds the invalidation the
            // loop's first failure already answered for.
            return Some((BusyCause::StaleSequence, None));
        }
        let (window_start, window_end) = (walk.window_start_ns(), walk.exit_ns);
        let first = self.invalidations.partition_point(|s| s.invalidation.ts_ns < window_start);
        let mut why = BusyCause::Unexplained;
        let mut collided_with: Option<CauseName> = None;
        for stored in self.invalidations.iter_mut().skip(first) {
            let inv = &stored.invalidation;
            if inv.ts_ns > window_end {
                break;
            }
            if inv.mm != walk.mm {
                continue;
            }
            if overlaps(inv.start, inv.end, walk.start, walk.end) {
                stored.overlap.walked_range = true;
                // The first overlap of the range itself is what moved the sequence first.
                if why != BusyCause::TrueConflict {
                    collided_with = Some(stored.invalidation.cause.clone());
                }
                why = BusyCause::TrueConflict;
            } else if walk.interval.is_some_and(|(s, last)| overlaps(inv.start, inv.end, s, last.saturating_add(1))) {
                stored.overlap.interval_only = true;
                if why == BusyCause::Unexplained {
                    why = BusyCause::FalseSharing;
                    collided_with = Some(stored.invalidation.cause.clone());
                }
            } else {
                stored.overlap.outside = true;
            }
        }
        if why == BusyCause::Unexplained && walk.busy() && walk.begin_overtaken {
            return Some(self.blame_overtaking(walk, first));
        }
        walk.busy().then_some((why, collided_with))
    }

    /// A failed walk with nothing in its window, whose read_begin met an invalidation of the
    /// mm still on its way to the notifier: that invalidation began before the window. The
    /// latest of the mm's before it that overlapped the walked range is blamed, else the latest
    /// that overlapped the notifier's interval (`before`: the first index inside the window).
    fn blame_overtaking(&mut self, walk: &Walk, before: usize) -> (BusyCause, Option<CauseName>) {
        let latest_overlapping = |start: u64, end: u64| {
            let earlier = self.invalidations.range(..before).enumerate().rev();
            earlier
                .filter(|(_, s)| s.invalidation.mm == walk.mm)
                .find(|(_, s)| overlaps(s.invalidation.start, s.invalidation.end, start, end))
        };
        let in_range = latest_overlapping(walk.start, walk.end).map(|(at, _)| (BusyCause::TrueConflict, at));
        let in_interval = || {
            let (start, last) = walk.interval?;
            latest_overlapping(start, last.saturating_add(1)).map(|(at, _)| (BusyCause::FalseSharing, at))
        };
        let Some((why, at)) = in_range.or_else(in_interval) else { return (BusyCause::Unexplained, None) };
        let stored = &mut self.invalidations[at];
        match why {
            BusyCause::TrueConflict => stored.overlap.walked_range = true,
            _ => stored.overlap.interval_only = true,
        }
        (why, Some(stored.invalidation.cause.clone()))
    }
}

#[cfg(test)]
mod tests;
