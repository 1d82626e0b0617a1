//! Retry-storm's slice of `mm-probe exporter`: its probes attached with the event ring off, and
//! on every scrape the kernel's counters: hmm_range_fault's returns, the invalidations of
//! mirrored memory by event, the time in their callbacks, and KVM's tracepoints unless
//! invalidations has them. Each window is judged from the same counters.

use std::cell::RefCell;

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::hmm::{self as names, Counter, NotifierEvent};

use super::{
    counters::{KernelCounters, KernelTotals},
    judge::{Evidence, Thresholds, judge},
    probes::{KVM_AGE_PROBE, KVM_UNMAP_PROBE, PROBES, observability, settings},
    rates::{per_second, ratio},
    report::Observability,
    run::default_thresholds,
};
use crate::{
    capability::CapabilityId,
    cause::probes as cause,
    collect::counters::counted_since,
    exporter::{
        buckets::log2_ns_histogram,
        scrape::{
            Attached, Choice, Reader, Series, Slice, Snapshot, Source, WindowVerdict, catalog_programs, kvm_events,
        },
    },
    kernel::Kernel,
    probes::{GlobalValue, LogicalProbe, Planner},
    report::Log2Histogram,
};

/// Retry-storm as the exporter was asked for it.
pub fn slice(choice: &Choice) -> Result<Box<dyn Slice>> {
    Ok(Box::new(RetryStormSlice {
        kvm_left_to_invalidations: choice.includes(CapabilityId::Invalidations),
        thresholds: default_thresholds()?,
    }))
}

struct RetryStormSlice {
    /// One attach per tracepoint: with invalidations chosen, KVM's tracepoints are its own (it
    /// learns each VM's lock there) and serve the one KVM family.
    kvm_left_to_invalidations: bool,
    thresholds: Thresholds,
}

impl Slice for RetryStormSlice {
    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        let mut settings = settings(kernel, &[]);
        settings.push((names::STREAM_EVENTS, GlobalValue::U32(0)));
        settings
    }

    fn attach(self: Box<Self>, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Source> {
        let kvm = [KVM_UNMAP_PROBE, KVM_AGE_PROBE];
        // The cause brackets classify streamed invalidations only, and the ring is off here.
        let brackets: Vec<&str> = cause::BRACKETS.iter().map(|p| p.name).collect();
        let attached: Vec<LogicalProbe> = PROBES
            .iter()
            .filter(|p| !(brackets.contains(&p.name) || self.kvm_left_to_invalidations && kvm.contains(&p.name)))
            .copied()
            .collect();
        let plan = Planner::new(kernel).attach_all(ebpf, &attached);
        let seen = observability(kernel, &plan);
        let attached = Attached { capability: CapabilityId::RetryStorm, plan, programs: catalog_programs(PROBES) };
        let reader = RetryStormReader { seen, thresholds: self.thresholds, window_start: RefCell::default() };
        Ok(Source { attached, reader: Box::new(reader) })
    }
}

/// Reads retry-storm as attached, knowing what its plan lets it see.
struct RetryStormReader {
    seen: Observability,
    thresholds: Thresholds,
    /// The kernel's totals when the window being judged began.
    window_start: RefCell<KernelTotals>,
}

impl Reader for RetryStormReader {
    fn read(&self, ebpf: &Ebpf, snapshot: &mut Snapshot) -> Result<()> {
        let name = CapabilityId::RetryStorm.name();
        let totals = KernelTotals::read(ebpf)?;
        let c = &totals.counters;
        snapshot.lost_events.extend([
            // A walk return whose entry was not seen: counted, but its duration is unknown.
            Series::new(&[("capability", name), ("kind", "walk_entries")], c.get(names::Counter::StashMisses)),
        ]);
        // A read_begin the per-caller table refused: the total stays exact, its caller is lost.
        snapshot.map_update_failures.push(Series::new(
            &[("capability", name), ("map", names::READ_BEGINS_MAP)],
            c.get(names::Counter::ReadBeginsMapFull),
        ));
        if self.seen.walks {
            // Read in slot order (walks before their outcomes), so a walk returning between the
            // reads can make `ok` one too low for a scrape, never too high.
            let walks = c.get(names::Counter::Walks);
            let ebusy = c.get(names::Counter::WalkBusy);
            let other = c.get(names::Counter::WalkErrors);
            snapshot.hmm_range_fault_returns = vec![
                Series::new(&[("result", "ok")], walks.saturating_sub(ebusy + other)),
                Series::new(&[("result", "ebusy")], ebusy),
                Series::new(&[("result", "other_error")], other),
            ];
            snapshot.hmm_stale_retries = self.seen.sequences.then(|| c.get(names::Counter::StaleRetries));
        }
        if self.seen.invalidations {
            snapshot.mmu_invalidations = totals
                .invalidations_by_event
                .iter()
                .enumerate()
                .map(|(raw, &count)| Series::new(&[("event", NotifierEvent::from_raw(raw as i32).name())], count))
                .collect();
            snapshot.mmu_invalidation_callback =
                Some(log2_ns_histogram(&totals.callback_ns, c.get(names::Counter::CallbackNs)));
        }
        // KVM's own tracepoints (the secondary MMU's side of the same invalidations); none here
        // when invalidations attached them.
        snapshot.kvm_notifier_events.extend(kvm_events(
            self.seen.kvm_unmap.then(|| c.get(names::Counter::KvmUnmap)),
            self.seen.kvm_age.then(|| c.get(names::Counter::KvmAge)),
        ));
        Ok(())
    }

    fn judge(&self, ebpf: &Ebpf, window_ns: u64) -> Result<Option<WindowVerdict>> {
        let now = KernelTotals::read(ebpf)?;
        let start = self.window_start.replace(now.clone());
        let counted = now.counters.since(&start.counters);
        let callback_ns = counted_since(&now.callback_ns, &start.callback_ns);
        let evidence = counted_evidence(&counted, &callback_ns, window_ns, &self.seen);
        Ok(Some(WindowVerdict::of(&judge(&evidence, &self.thresholds), evidence.walks)))
    }
}

/// What the kernel's counters tell of one window. The walks' durations, the retry loops and
/// what each failed walk collided with come from the event ring, which is off in the exporter:
/// avg_latency and timeout_rate stay UNKNOWN, never 0.
fn counted_evidence(c: &KernelCounters, callback_ns: &[u64], window_ns: u64, seen: &Observability) -> Evidence {
    let walks = if seen.walks { c.get(Counter::Walks) } else { 0 };
    let busy_walks = if seen.walks { c.get(Counter::WalkBusy) } else { 0 };
    let invalidations = if seen.invalidations { c.get(Counter::Invalidations) } else { 0 };
    Evidence {
        walks,
        busy_walks,
        invalidations,
        retry_rate: if seen.walks && seen.invalidations { ratio(busy_walks, invalidations) } else { None },
        busy_per_walk: ratio(busy_walks, walks),
        invalidate_freq: if seen.invalidations { per_second(invalidations, window_ns) } else { None },
        callback_p99_ns: Log2Histogram::quantile_bound(callback_ns, 0.99),
        stale_retries: (seen.walks && seen.sequences).then(|| c.get(Counter::StaleRetries)),
        ..Evidence::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        report::verdict::Level,
        retry_storm::{counters::tests::counters, judge::Metric},
    };

    fn seen() -> Observability {
        Observability { walks: true, invalidations: true, sequences: true, ..Observability::default() }
    }

    fn judged(evidence: &Evidence) -> Vec<(Metric, Level)> {
        judge(evidence, &Thresholds::default()).metrics.iter().map(|m| (m.metric, m.level)).collect()
    }

    #[test]
    fn a_window_of_counters_judges_what_they_measure_and_leaves_the_rest_unknown() {
        // 400 of 1000 walks failed against 1000 invalidations in 2 s: CRIT on retry_rate.
        let evidence = counted_evidence(&counters(1000, 400, 1000), &[], 2_000_000_000, &seen());
        assert_eq!((evidence.retry_rate, evidence.invalidate_freq), (Some(0.4), Some(500.0)));
        let verdict = judge(&evidence, &Thresholds::default());
        assert_eq!(
            WindowVerdict::of(&verdict, evidence.walks),
            WindowVerdict { level: Level::Crit, metric: Some("retry_rate".into()) }
        );
        let levels = judged(&evidence);
        // Walk durations and retry loops come from the ring: unknown here, never 0.
        assert!(levels.contains(&(Metric::AvgLatency, Level::Unknown)), "{levels:?}");
        assert!(levels.contains(&(Metric::TimeoutRate, Level::Unknown)), "{levels:?}");
        assert!(levels.contains(&(Metric::StaleRetries, Level::Ok)), "{levels:?}");
    }

    #[test]
    fn what_the_plan_could_not_attach_is_not_judged() {
        let unseen = Observability { walks: true, ..Observability::default() };
        let evidence = counted_evidence(&counters(1000, 400, 1000), &[], 1_000_000_000, &unseen);
        assert_eq!((evidence.retry_rate, evidence.invalidate_freq, evidence.invalidations), (None, None, 0));
        let nothing = counted_evidence(&counters(0, 0, 0), &[], 1_000_000_000, &Observability::default());
        assert_eq!(judge(&nothing, &Thresholds::default()).level, Level::Unknown);
    }

    #[test]
    fn the_exporter_judges_with_the_commands_own_default_limits() {
        assert_eq!(default_thresholds().unwrap(), Thresholds::default());
    }
}
