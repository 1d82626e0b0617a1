//! Retry-storm's slice of `mm-probe exporter`: its probes attached with the event ring off, and
//! on every scrape the kernel's counters: hmm_range_fault's returns, the invalidations of
//! mirrored memory by event and by cause, the time in their callbacks, and KVM's tracepoints
//! unless invalidations has them. Each window is judged from the same counters.

use std::{cell::RefCell, collections::BTreeMap};

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::{
    cause::counted_cause,
    hmm::{self as names, Counter, NotifierEvent},
};

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
    cause::{Namer, probes as cause},
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
        shared_left_to_invalidations: choice.includes(CapabilityId::Invalidations),
        thresholds: default_thresholds()?,
    }))
}

struct RetryStormSlice {
    /// One attach per tracepoint: with invalidations chosen, KVM's tracepoints are its own (it
    /// learns each VM's lock there) and serve the one KVM family, and so are the cause brackets
    /// (one object: the classifier's table is the same for both).
    shared_left_to_invalidations: bool,
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
        let brackets: Vec<&str> = cause::BRACKETS.iter().map(|p| p.name).collect();
        let shared = |name: &str| kvm.contains(&name) || brackets.contains(&name);
        let attached: Vec<LogicalProbe> =
            PROBES.iter().filter(|p| !(self.shared_left_to_invalidations && shared(p.name))).copied().collect();
        let plan = Planner::new(kernel).attach_all(ebpf, &attached);
        let seen = observability(kernel, &plan);
        let attached = Attached { capability: CapabilityId::RetryStorm, plan, programs: catalog_programs(PROBES) };
        let reader = RetryStormReader {
            seen,
            namer: Namer::from_tracefs(),
            brackets_missed_are_ours: !self.shared_left_to_invalidations,
            thresholds: self.thresholds,
            window_start: RefCell::default(),
        };
        Ok(Source { attached, reader: Box::new(reader) })
    }
}

/// Reads retry-storm as attached, knowing what its plan lets it see.
struct RetryStormReader {
    seen: Observability,
    namer: Namer,
    /// Whether this slice attached the cause brackets, and so reports the ends they missed
    /// (invalidations does when it has them: one count, reported once).
    brackets_missed_are_ours: bool,
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
        if self.brackets_missed_are_ours {
            // Invalidations made inside such work were classified by their thread instead.
            let missed =
                Series::new(&[("capability", name), ("kind", "cause_brackets_missed")], totals.cause_brackets_missed);
            snapshot.lost_events.push(missed);
        }
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
            snapshot.mirrored_invalidation_causes = causes(&totals.invalidations_by_cause, &self.namer);
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

/// The counted invalidations by cause class, named as the reports name them (a migration by its
/// reason, a fault by its event): bounded by the class list. Classes never counted are left out.
fn causes(by_slot: &[u64], namer: &Namer) -> Vec<Series> {
    let mut by_class: BTreeMap<&str, u64> = BTreeMap::new();
    for (slot, &count) in by_slot.iter().enumerate().filter(|(_, count)| **count > 0) {
        let (cause, event) = counted_cause(slot as u32);
        let event = event.map(|raw| NotifierEvent::from_raw(raw as i32).name());
        *by_class.entry(namer.name(&cause, "", event).class).or_default() += count;
    }
    by_class.into_iter().map(|(class, count)| Series::new(&[("cause", class)], count)).collect()
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
    fn counted_causes_are_named_by_class_as_the_reports_name_them() {
        use mm_probe_common::cause::{CAUSE_COUNT_SLOTS, Cause, CauseClass, count_slot};
        let mut by_slot = vec![0; CAUSE_COUNT_SLOTS as usize];
        let mut count = |class: CauseClass, event: NotifierEvent, n: u64| {
            let cause = Cause { class: class as u32, ..Cause::default() };
            by_slot[count_slot(&cause, event as u32) as usize] += n;
        };
        count(CauseClass::Syscall, NotifierEvent::Unmap, 5);
        // Outside any syscall: task_numa_work's protection change, and faults.
        count(CauseClass::UserContext, NotifierEvent::ProtectionVma, 3);
        count(CauseClass::UserContext, NotifierEvent::Clear, 2);
        count(CauseClass::UserContext, NotifierEvent::Unmap, 1);
        let named: Vec<(String, u64)> =
            causes(&by_slot, &Namer::default()).into_iter().map(|s| (s.labels[0].1.clone(), s.value)).collect();
        let expected = [("fault", 3), ("numa_balancing", 3), ("syscall", 5)];
        assert_eq!(named, expected.map(|(class, n)| (class.to_string(), n)));
    }

    #[test]
    fn the_exporter_judges_with_the_commands_own_default_limits() {
        assert_eq!(default_thresholds().unwrap(), Thresholds::default());
    }
}
