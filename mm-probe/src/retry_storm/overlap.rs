//! Which invalidations overlapped which walks, and why each -EBUSY happened.
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

use std::collections::VecDeque;

use super::events::{Invalidation, Walk};

/// Why a walk returned -EBUSY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyCause {
    TrueConflict,
    FalseSharing,
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

/// What the joiner hands back when walks settle or invalidations age out.
#[derive(Debug, Default)]
pub struct Settled {
    pub busy_causes: Vec<(Walk, BusyCause)>,
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
}

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start < b_end && b_start < a_end
}

impl OverlapJoiner {
    pub fn new(settle_ns: u64, retain_ns: u64) -> Self {
        Self { settle_ns, retain_ns, invalidations: VecDeque::new(), pending: Vec::new() }
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

    /// Judges every walk that returned at least `settle_ns` before `now_ns` and releases
    /// invalidations older than `retain_ns` that no pending walk can still need.
    pub fn settle(&mut self, now_ns: u64) -> Settled {
        let cutoff = now_ns.saturating_sub(self.settle_ns);
        let (ready, pending): (Vec<Walk>, Vec<Walk>) = self.pending.drain(..).partition(|w| w.exit_ns <= cutoff);
        self.pending = pending;
        let mut settled = Settled::default();
        for walk in ready {
            let cause = self.judge(&walk);
            match cause {
                Some(cause) => settled.busy_causes.push((walk, cause)),
                None => settled.other_walks.push(walk),
            }
        }
        let oldest_needed = self.pending.iter().map(Walk::window_start_ns).min().unwrap_or(u64::MAX);
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

    /// Marks the invalidations in `walk`'s window; returns the cause when the walk was busy.
    fn judge(&mut self, walk: &Walk) -> Option<BusyCause> {
        let (window_start, window_end) = (walk.window_start_ns(), walk.exit_ns);
        let first = self.invalidations.partition_point(|s| s.invalidation.ts_ns < window_start);
        let mut cause = BusyCause::Unexplained;
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
                cause = BusyCause::TrueConflict;
            } else if walk.interval.is_some_and(|(s, last)| overlaps(inv.start, inv.end, s, last.saturating_add(1))) {
                stored.overlap.interval_only = true;
                if cause == BusyCause::Unexplained {
                    cause = BusyCause::FalseSharing;
                }
            } else {
                stored.overlap.outside = true;
            }
        }
        walk.busy().then_some(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mm_probe_common::hmm::{EBUSY, NotifierEvent};

    const MIB: u64 = 1 << 20;

    fn walk(start: u64, end: u64, window: (u64, u64), ret: i32) -> Walk {
        Walk {
            pid: 1,
            tgid: 1,
            comm: "gpu".into(),
            entry_ns: window.0 + 1,
            exit_ns: window.1,
            duration_ns: Some(window.1 - window.0 - 1),
            seq_begin_ns: Some(window.0),
            ret,
            notifier: 0xa,
            mm: 7,
            start,
            end,
            interval: Some((0, 64 * MIB - 1)),
        }
    }

    fn inv(ts: u64, start: u64, end: u64) -> Invalidation {
        Invalidation {
            pid: 2,
            tgid: 1,
            comm: "madv-storm".into(),
            ts_ns: ts,
            mm: 7,
            start,
            end,
            event: NotifierEvent::Clear,
        }
    }

    #[test]
    fn an_invalidation_of_the_walked_range_is_a_true_conflict() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, MIB, MIB + 65536));
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.busy_causes.len(), 1);
        assert_eq!(s.busy_causes[0].1, BusyCause::TrueConflict);
        let done = j.finish();
        assert!(done.invalidations[0].1.walked_range);
    }

    #[test]
    fn an_invalidation_elsewhere_in_the_notifier_is_false_sharing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, 40 * MIB, 40 * MIB + 65536));
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.busy_causes[0].1, BusyCause::FalseSharing);
        let done = j.finish();
        assert!(done.invalidations[0].1.interval_only && !done.invalidations[0].1.walked_range);
    }

    #[test]
    fn invalidations_outside_the_window_or_mm_explain_nothing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(50, 0, MIB)); // before read_begin
        j.add_invalidation(inv(250, 0, MIB)); // after the walk returned
        let mut other_mm = inv(150, 0, MIB);
        other_mm.mm = 8;
        j.add_invalidation(other_mm);
        j.add_invalidation(inv(160, 100 * MIB, 101 * MIB)); // outside the interval
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.busy_causes[0].1, BusyCause::Unexplained);
        let done = j.finish();
        let outside: Vec<_> = done.invalidations.iter().filter(|(_, o)| o.outside).collect();
        assert_eq!(outside.len(), 1);
        assert_eq!(outside[0].0.start, 100 * MIB);
    }

    #[test]
    fn walks_wait_until_settled_and_late_invalidations_still_count() {
        let mut j = OverlapJoiner::new(100, 10_000);
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        assert!(j.settle(250).busy_causes.is_empty(), "not settled yet");
        // Arrives after the walk (other ring), started inside its window.
        j.add_invalidation(inv(180, 0, 4096));
        let s = j.settle(400);
        assert_eq!(s.busy_causes[0].1, BusyCause::TrueConflict);
    }

    #[test]
    fn successful_walks_mark_overlaps_but_have_no_cause() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, 40 * MIB, 40 * MIB + 4096));
        j.add_walk(walk(0, 2 * MIB, (100, 200), 0));
        let s = j.settle(1_000);
        assert!(s.busy_causes.is_empty());
        assert_eq!(s.other_walks.len(), 1);
    }

    #[test]
    fn empty_joiner_settles_to_nothing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        let s = j.finish();
        assert!(s.busy_causes.is_empty() && s.invalidations.is_empty());
    }
}
