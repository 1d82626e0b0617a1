//! Why the mirrored memory was invalidated, and which of those causes the failed walks
//! collided with: the invalidations and the failures of one window by cause, bounded, and the
//! rows they become with the settings that stop each cause on this machine.

use std::{collections::HashMap, path::PathBuf};

use serde::Serialize;

use crate::cause::{self, CauseName, Knob};

/// Distinct causes kept per window. Details name threads (the compacting or reclaiming one), so
/// a busy machine could make many; past this, a new detail folds into its class.
const MAX_CAUSES: usize = 64;

/// Counts of one cause, and its settings as read when the window first saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    invalidations: u64,
    failed_walks: u64,
    knobs: Vec<Knob>,
}

/// The window's invalidations and collisions by cause.
#[derive(Clone, Debug, PartialEq)]
pub struct CauseTable {
    counts: HashMap<CauseName, Counts>,
    /// Where the settings are read ("/" on a live machine).
    root: PathBuf,
}

impl Default for CauseTable {
    fn default() -> Self {
        Self::reading_under(PathBuf::from("/"))
    }
}

impl CauseTable {
    pub fn reading_under(root: PathBuf) -> Self {
        Self { counts: HashMap::new(), root }
    }

    /// An invalidation made by `tgid`. A cause's settings are read the first time the window
    /// sees it, while the process is alive (a cgroup's limits are read from its cgroup).
    pub fn add_invalidation(&mut self, cause: &CauseName, tgid: u32) {
        let key = self.key(cause);
        let root = &self.root;
        let counts = self
            .counts
            .entry(key)
            .or_insert_with_key(|key| Counts { knobs: cause::knobs(root, key, tgid), ..Counts::default() });
        counts.invalidations += 1;
    }

    /// A failed walk that collided with an invalidation of `cause` (which the window has seen).
    pub fn add_failure(&mut self, cause: &CauseName) {
        let key = self.key(cause);
        self.counts.entry(key).or_default().failed_walks += 1;
    }

    pub fn merge(&mut self, other: &CauseTable) {
        for (cause, counts) in &other.counts {
            let key = self.key(cause);
            let slot = self.counts.entry(key).or_default();
            slot.invalidations += counts.invalidations;
            slot.failed_walks += counts.failed_walks;
            if slot.knobs.is_empty() {
                slot.knobs = counts.knobs.clone();
            }
        }
    }

    /// `cause` itself, or its class alone once the table holds [`MAX_CAUSES`] others.
    fn key(&self, cause: &CauseName) -> CauseName {
        if self.counts.contains_key(cause) || self.counts.len() < MAX_CAUSES {
            cause.clone()
        } else {
            CauseName { class: cause.class, detail: None }
        }
    }

    /// The rows, most failed walks first, then most invalidations; `failed_walks` is every
    /// failed walk of the window (the shares' denominator).
    pub fn rows(&self, failed_walks: u64) -> Vec<CauseRow> {
        let mut rows: Vec<CauseRow> = self
            .counts
            .iter()
            .map(|(cause, counts)| CauseRow {
                cause: cause.clone(),
                invalidations: counts.invalidations,
                failed_walks: counts.failed_walks,
                failed_walk_share: (failed_walks > 0).then(|| counts.failed_walks as f64 / failed_walks as f64),
                knobs: counts.knobs.clone(),
                remedy: cause::remedy(cause.class),
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.failed_walks, b.invalidations)
                .cmp(&(a.failed_walks, a.invalidations))
                .then_with(|| a.cause.cmp(&b.cause))
        });
        rows
    }
}

/// The invalidations of one cause and the failed walks that collided with them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CauseRow {
    pub cause: CauseName,
    pub invalidations: u64,
    /// Failed walks whose collision was an invalidation of this cause.
    pub failed_walks: u64,
    /// Of all failed walks (stale-sequence retries and unexplained ones included); null when
    /// no walk failed.
    pub failed_walk_share: Option<f64>,
    pub knobs: Vec<Knob>,
    pub remedy: Option<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(class: &'static str, detail: Option<&str>) -> CauseName {
        CauseName { class, detail: detail.map(str::to_string) }
    }

    #[test]
    fn rows_put_the_cause_most_walks_collided_with_first_with_its_share() {
        let mut t = CauseTable::reading_under(PathBuf::from("/nonexistent"));
        let kswapd = named("kswapd", None);
        let madvise = named("syscall", Some("madvise(MADV_DONTNEED)"));
        for _ in 0..10 {
            t.add_invalidation(&madvise, 5);
        }
        for _ in 0..4 {
            t.add_invalidation(&kswapd, 0);
        }
        for _ in 0..3 {
            t.add_failure(&kswapd);
        }
        t.add_failure(&madvise);
        let rows = t.rows(5);
        assert_eq!(rows[0].cause, kswapd);
        assert_eq!((rows[0].invalidations, rows[0].failed_walks, rows[0].failed_walk_share), (4, 3, Some(0.6)));
        assert_eq!(rows[0].knobs[0].setting, "vm.watermark_scale_factor");
        assert_eq!(rows[0].knobs[0].value, None, "a setting not readable here is null");
        assert_eq!(rows[1].cause, madvise);
        assert_eq!(t.rows(0)[0].failed_walk_share, None, "no failed walk: no share");
    }

    #[test]
    fn many_details_fold_into_their_class_and_merging_adds() {
        let mut t = CauseTable::reading_under(PathBuf::from("/nonexistent"));
        for i in 0..(MAX_CAUSES + 10) {
            t.add_invalidation(&named("direct_reclaim", Some(&format!("in job{i}"))), 1);
        }
        assert_eq!(t.counts.len(), MAX_CAUSES + 1);
        assert_eq!(t.counts[&named("direct_reclaim", None)].invalidations, 10);
        let mut total = CauseTable::default();
        total.merge(&t);
        total.merge(&t);
        let sum: u64 = total.counts.values().map(|c| c.invalidations).sum();
        assert_eq!(sum, 2 * (MAX_CAUSES as u64 + 10));
    }
}
