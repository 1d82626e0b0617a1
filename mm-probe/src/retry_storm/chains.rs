//! Joining walks into retry chains.
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

use std::collections::HashMap;

use super::events::Walk;

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
            end: ChainEnd::Unfinished,
        });
        chain.walks += 1;
        chain.last_ns = chain.last_ns.max(walk.exit_ns);
        let end = if walk.busy() {
            chain.busy_walks += 1;
            chain.failed_walk_ns += walk.duration_ns.unwrap_or(0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use mm_probe_common::hmm::EBUSY;

    const MS: u64 = 1_000_000;

    fn walk(tgid: u32, notifier: u64, begin_ms: u64, exit_ms: u64, ret: i32) -> Walk {
        Walk {
            pid: tgid,
            tgid,
            comm: "gpu".into(),
            entry_ns: begin_ms * MS + 1,
            exit_ns: exit_ms * MS,
            duration_ns: Some(exit_ms * MS - begin_ms * MS - 1),
            seq_begin_ns: Some(begin_ms * MS),
            ret,
            notifier,
            mm: 1,
            start: 0,
            end: 2 << 20,
            interval: None,
        }
    }

    #[test]
    fn busy_walks_then_success_make_one_chain() {
        let mut j = ChainJoiner::new(1000 * MS);
        assert!(j.walk(&walk(1, 0xa, 0, 10, -EBUSY)).is_none());
        assert!(j.walk(&walk(1, 0xa, 10, 20, -EBUSY)).is_none());
        let chain = j.walk(&walk(1, 0xa, 20, 30, 0)).expect("success ends the chain");
        assert_eq!(chain.end, ChainEnd::Success);
        assert_eq!((chain.walks, chain.busy_walks), (3, 2));
        assert_eq!(chain.first_ns, 0);
        assert_eq!(chain.duration_ns(), 30 * MS);
        assert_eq!(chain.failed_walk_ns, 2 * (10 * MS - 1));
        assert_eq!(j.open_chains(), 0);
    }

    #[test]
    fn chains_are_per_process_and_notifier() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(2, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 10, -EBUSY));
        assert_eq!(j.open_chains(), 3);
        let chain = j.walk(&walk(2, 0xa, 10, 20, 0)).unwrap();
        assert_eq!((chain.tgid, chain.notifier, chain.walks), (2, 0xa, 2));
        assert_eq!(j.open_chains(), 2);
    }

    #[test]
    fn a_busy_walk_past_the_timeout_ends_the_chain_as_timed_out() {
        let mut j = ChainJoiner::new(1000 * MS);
        assert!(j.walk(&walk(1, 0xa, 0, 600, -EBUSY)).is_none());
        let chain = j.walk(&walk(1, 0xa, 600, 1000, -EBUSY)).expect("timeout ends it");
        assert_eq!(chain.end, ChainEnd::TimedOut);
        assert!(chain.end.is_timeout());
        // The driver's next call starts a fresh chain.
        assert!(j.walk(&walk(1, 0xa, 1001, 1002, -EBUSY)).is_none());
        assert_eq!(j.open_chains(), 1);
    }

    #[test]
    fn removing_the_notifier_of_a_failing_chain_means_it_gave_up() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 999, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 5, -EBUSY));
        let ended = j.notifier_removed(0xa);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].end, ChainEnd::GaveUp);
        assert!(ended[0].end.is_timeout());
        assert!(j.notifier_removed(0xa).is_empty());
        assert_eq!(j.open_chains(), 1);
    }

    #[test]
    fn a_hard_error_ends_the_chain_and_is_not_a_timeout() {
        let mut j = ChainJoiner::new(1000 * MS);
        let chain = j.walk(&walk(1, 0xa, 0, 1, -14)).unwrap();
        assert_eq!(chain.end, ChainEnd::Error(-14));
        assert!(!chain.end.is_timeout());
    }

    #[test]
    fn finishing_leaves_open_chains_unfinished_not_timed_out() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 999, -EBUSY));
        let ended = j.finish();
        assert_eq!(ended.len(), 2);
        assert!(ended.iter().all(|c| c.end == ChainEnd::Unfinished && !c.end.is_timeout()));
        assert_eq!(j.open_chains(), 0);
    }

    #[test]
    fn a_walk_without_read_begin_starts_its_chain_at_entry() {
        let mut j = ChainJoiner::new(1000 * MS);
        let mut w = walk(1, 0xa, 5, 10, 0);
        w.seq_begin_ns = None;
        let chain = j.walk(&w).unwrap();
        assert_eq!(chain.first_ns, 5 * MS + 1);
    }
}
