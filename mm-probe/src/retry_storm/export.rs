//! Retry-storm's slice of `mm-probe exporter`: its probes attached with the event ring off, and
//! on every scrape the kernel's counters: hmm_range_fault's returns, the invalidations of
//! mirrored memory by event, the time in their callbacks, and KVM's tracepoints unless
//! invalidations has them.

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::hmm::{self as names, NotifierEvent};

use super::{
    counters::KernelTotals,
    probes::{KVM_AGE_PROBE, KVM_UNMAP_PROBE, PROBES, observability, settings},
    report::Observability,
};
use crate::{
    capability::CapabilityId,
    cause::probes as cause,
    exporter::{
        buckets::log2_ns_histogram,
        scrape::{Attached, Choice, Reader, Series, Slice, Snapshot, Source, catalog_programs, kvm_events},
    },
    kernel::Kernel,
    probes::{GlobalValue, LogicalProbe, Planner},
};

/// Retry-storm as the exporter was asked for it.
pub fn slice(choice: &Choice) -> Result<Box<dyn Slice>> {
    Ok(Box::new(RetryStormSlice { kvm_left_to_invalidations: choice.includes(CapabilityId::Invalidations) }))
}

struct RetryStormSlice {
    /// One attach per tracepoint: with invalidations chosen, KVM's tracepoints are its own (it
    /// learns each VM's lock there) and serve the one KVM family.
    kvm_left_to_invalidations: bool,
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
        Ok(Source { attached, reader: Box::new(RetryStormReader { seen }) })
    }
}

/// Reads retry-storm as attached, knowing what its plan lets it see.
struct RetryStormReader {
    seen: Observability,
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
}
