//! What the kernel counted: its per-CPU counters and log2 histograms, summed over CPUs, and the
//! deltas of one window. Read by the aggregator for each window and by the timeline for `--plot`.

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::hmm::{self as names, COUNTER_SLOTS, Counter};

use crate::{cause, collect::counters::percpu_sums};

/// The kernel's per-CPU counters, summed (cumulative, or a window's delta).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters(pub [u64; COUNTER_SLOTS as usize]);

impl KernelCounters {
    pub fn from_slice(values: &[u64]) -> Self {
        let mut counters = Self::default();
        for (slot, value) in counters.0.iter_mut().zip(values) {
            *slot = *value;
        }
        counters
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.0.get(counter as usize).copied().unwrap_or(0)
    }

    /// `self - earlier`, slot by slot.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut delta = *self;
        for (d, e) in delta.0.iter_mut().zip(earlier.0) {
            *d = d.saturating_sub(e);
        }
        delta
    }

    pub(super) fn add(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

/// Kernel-side cumulative state (since the object was loaded), summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct KernelTotals {
    pub counters: KernelCounters,
    /// Log2 buckets (ns) of the time in invalidate_range_start.
    pub callback_ns: Vec<u64>,
    pub window_ns: Vec<u64>,
    pub kvm_sizes: Vec<u64>,
    /// Invalidations of mirrored mms by `enum mmu_notifier_event` (last slot: unknown).
    pub invalidations_by_event: Vec<u64>,
    /// The same invalidations by cause, in [`mm_probe_common::cause::count_slot`]'s slots.
    pub invalidations_by_cause: Vec<u64>,
    /// The cause classifier's bracket ends without their begin.
    pub cause_brackets_missed: u64,
}

impl KernelTotals {
    /// Reads every counter and histogram (cheap: the exporter does it on each scrape).
    pub fn read(ebpf: &Ebpf) -> Result<Self> {
        Ok(Self {
            counters: KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?),
            callback_ns: percpu_sums(ebpf, names::CALLBACK_HIST_MAP)?,
            window_ns: percpu_sums(ebpf, names::WINDOW_HIST_MAP)?,
            kvm_sizes: percpu_sums(ebpf, names::KVM_SIZE_HIST_MAP)?,
            invalidations_by_event: percpu_sums(ebpf, names::INVALIDATIONS_BY_EVENT_MAP)?,
            invalidations_by_cause: percpu_sums(ebpf, names::INVALIDATIONS_BY_CAUSE_MAP)?,
            cause_brackets_missed: cause::probes::unmatched_ends(ebpf)?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Kernel counters with the three every rate is made of.
    pub(crate) fn counters(walks: u64, busy: u64, invalidations: u64) -> KernelCounters {
        let mut c = KernelCounters::default();
        c.0[Counter::Walks as usize] = walks;
        c.0[Counter::WalkBusy as usize] = busy;
        c.0[Counter::Invalidations as usize] = invalidations;
        c
    }

    #[test]
    fn kernel_counter_deltas_are_taken_slot_by_slot() {
        let earlier = counters(5, 1, 10);
        let now = counters(8, 3, 15);
        let d = now.since(&earlier);
        assert_eq!((d.get(Counter::Walks), d.get(Counter::WalkBusy), d.get(Counter::Invalidations)), (3, 2, 5));
        assert_eq!(crate::collect::counters::counted_since(&[5, 7, 9], &[1, 7]), vec![4, 0, 9]);
    }
}
