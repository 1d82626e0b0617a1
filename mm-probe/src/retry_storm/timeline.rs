//! The counts behind `--plot`: hmm_range_fault returns, -EBUSY returns and invalidations per
//! sampling period, read from the kernel's cumulative counters (exact even when ring events are
//! lost), independent of `--interval`.
//!
//! Memory is bounded for runs of any length: when the series is full, neighbouring samples are
//! merged pairwise and the sampling period doubles, so a long run keeps its whole history at a
//! coarser resolution. Counts are only ever added, so the samples always sum to the run's totals.

use mm_probe_common::hmm::Counter;

use super::counters::KernelCounters;

/// Counts of one stretch of the run; times are nanoseconds since the run started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateSample {
    pub start_ns: u64,
    pub end_ns: u64,
    pub walks: u64,
    pub ebusy: u64,
    pub invalidations: u64,
}

impl RateSample {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// This sample followed by `later`, as one.
    fn merged_with(self, later: Self) -> Self {
        Self {
            start_ns: self.start_ns,
            end_ns: later.end_ns,
            walks: self.walks + later.walks,
            ebusy: self.ebusy + later.ebusy,
            invalidations: self.invalidations + later.invalidations,
        }
    }
}

/// Rate samples of one run, at most `capacity` of them.
#[derive(Debug)]
pub struct Timeline {
    run_start_ns: u64,
    last_read_ns: u64,
    last_counters: KernelCounters,
    period_ns: u64,
    capacity: usize,
    /// Counts read since the last sample was closed, shorter than the period.
    pending: Option<RateSample>,
    samples: Vec<RateSample>,
}

impl Timeline {
    /// Samples every `period_ns` from `run_start_ns`, when the kernel counters were zero.
    pub fn new(run_start_ns: u64, period_ns: u64, capacity: usize) -> Self {
        Self {
            run_start_ns,
            last_read_ns: run_start_ns,
            last_counters: KernelCounters::default(),
            period_ns,
            // Pairs merge: an odd capacity would leave one sample unmerged.
            capacity: capacity.max(2) & !1,
            pending: None,
            samples: Vec::new(),
        }
    }

    /// Takes the kernel's cumulative counters as read at `now_ns`.
    pub fn record(&mut self, now_ns: u64, cumulative: &KernelCounters) {
        let delta = cumulative.since(&self.last_counters);
        let sample = RateSample {
            start_ns: self.last_read_ns.saturating_sub(self.run_start_ns),
            end_ns: now_ns.saturating_sub(self.run_start_ns),
            walks: delta.get(Counter::Walks),
            ebusy: delta.get(Counter::WalkBusy),
            invalidations: delta.get(Counter::Invalidations),
        };
        self.last_read_ns = now_ns;
        self.last_counters = *cumulative;
        let pending = match self.pending.take() {
            Some(earlier) => earlier.merged_with(sample),
            None => sample,
        };
        if pending.duration_ns() >= self.period_ns {
            self.push(pending);
        } else {
            self.pending = Some(pending);
        }
    }

    /// The last read of the run: closes the partial sample too. A sliver much shorter than the
    /// period joins the sample before it, as a rate over a few milliseconds would only be noise.
    pub fn finish(&mut self, now_ns: u64, cumulative: &KernelCounters) {
        self.record(now_ns, cumulative);
        let Some(partial) = self.pending.take().filter(|p| p.duration_ns() > 0) else { return };
        match self.samples.last_mut() {
            Some(last) if partial.duration_ns() < self.period_ns / 4 => *last = last.merged_with(partial),
            _ => self.push(partial),
        }
    }

    pub fn samples(&self) -> &[RateSample] {
        &self.samples
    }

    fn push(&mut self, sample: RateSample) {
        if self.samples.len() >= self.capacity {
            self.halve_resolution();
        }
        self.samples.push(sample);
    }

    fn halve_resolution(&mut self) {
        let pairs = self.samples.chunks(2);
        self.samples =
            pairs.map(|pair| pair.iter().copied().reduce(RateSample::merged_with).unwrap_or_default()).collect();
        self.period_ns = self.period_ns.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry_storm::counters::tests::counters;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn each_period_gets_the_counts_read_in_it() {
        let mut timeline = Timeline::new(100, SECOND, 16);
        timeline.record(100 + SECOND, &counters(10, 2, 40));
        timeline.record(100 + 2 * SECOND, &counters(30, 12, 90));
        timeline.finish(100 + 2 * SECOND + SECOND / 2, &counters(31, 12, 95));
        let samples = timeline.samples();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0], RateSample { start_ns: 0, end_ns: SECOND, walks: 10, ebusy: 2, invalidations: 40 });
        assert_eq!((samples[1].walks, samples[1].ebusy, samples[1].invalidations), (20, 10, 50));
        assert_eq!((samples[2].duration_ns(), samples[2].invalidations), (SECOND / 2, 5), "the partial end is kept");
    }

    #[test]
    fn reads_closer_than_the_period_are_gathered_into_one_sample() {
        let mut timeline = Timeline::new(0, SECOND, 16);
        timeline.record(SECOND / 2, &counters(1, 1, 1));
        assert!(timeline.samples().is_empty());
        timeline.record(SECOND, &counters(3, 2, 5));
        assert_eq!(
            timeline.samples(),
            [RateSample { start_ns: 0, end_ns: SECOND, walks: 3, ebusy: 2, invalidations: 5 }]
        );
        timeline.finish(SECOND, &counters(3, 2, 5));
        assert_eq!(timeline.samples().len(), 1, "an empty end adds nothing");
        timeline.finish(SECOND + 1000, &counters(4, 2, 5));
        assert_eq!(timeline.samples().len(), 1, "a sliver joins the last sample");
        assert_eq!((timeline.samples()[0].end_ns, timeline.samples()[0].walks), (SECOND + 1000, 4));
    }

    #[test]
    fn a_long_run_stays_bounded_and_still_adds_up() {
        let mut timeline = Timeline::new(0, SECOND, 8);
        let mut total = 0;
        for second in 1..=1000u64 {
            total += second;
            timeline.record(second * SECOND, &counters(total, total / 2, 2 * total));
            assert!(timeline.samples().len() <= 8, "{} samples at {second} s", timeline.samples().len());
        }
        timeline.finish(1000 * SECOND + 1, &counters(total, total / 2, 2 * total));
        let samples = timeline.samples();
        assert_eq!(samples.iter().map(|s| s.walks).sum::<u64>(), total);
        assert_eq!(samples.iter().map(|s| s.invalidations).sum::<u64>(), 2 * total);
        assert_eq!(samples.first().unwrap().start_ns, 0);
        assert!(samples.windows(2).all(|w| w[0].end_ns == w[1].start_ns), "samples tile the run: {samples:?}");
        assert!(samples.len() >= 4, "the history is kept, coarser: {samples:?}");
    }
}
