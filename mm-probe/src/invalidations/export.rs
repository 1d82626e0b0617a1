//! Invalidations' slice of `mm-probe exporter`: its probes and the known subscribers' callbacks
//! attached, its tables drained every period into totals kept since attach, and on every scrape
//! the notifier's invalidations by event, KVM's tracepoints, contended locks by class and waiting
//! path, and the subscribers' callbacks. Each window is judged from the change in the totals, as
//! the command judges a run of that length.

use std::{cell::RefCell, collections::BTreeMap, time::Duration};

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::invalidations::{self as names, Counter};

use super::{
    aggregator::{self, PeakRate, RunFacts, Scope},
    decoder::{DRAIN_PERIOD, Drain, Tables},
    globals::{kvm_locks_nameable, kvm_members, settings},
    judge::Thresholds,
    locks::{self, KvmMembers},
    probes::{Observability, PROBES, attach_callbacks, observability},
    report::{Invalidations, Loss},
    run::default_thresholds,
};
use crate::{
    capability::CapabilityId,
    cause::Namer,
    collect::monotonic_ns,
    exporter::scrape::{
        Attached, Choice, FloatSeries, Programs, Reader, Series, Slice, Snapshot, Source, WindowVerdict, kvm_events,
    },
    kernel::{Kallsyms, Kernel},
    probes::{GlobalValue, Planner},
};

/// Invalidations as the exporter was asked for it.
pub fn slice(_choice: &Choice) -> Result<Box<dyn Slice>> {
    Ok(Box::new(InvalidationsSlice { thresholds: default_thresholds()? }))
}

struct InvalidationsSlice {
    thresholds: Thresholds,
}

impl Slice for InvalidationsSlice {
    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        settings(kernel, &[])
    }

    fn attach(self: Box<Self>, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Source> {
        let plan = Planner::new(kernel).attach_all(ebpf, PROBES);
        let callbacks = attach_callbacks(kernel, ebpf);
        let seen = observability(&plan, &callbacks, kvm_locks_nameable(kernel), kernel);
        // Read again rather than borrowed: the source outlives the kernel's borrow.
        let reader = InvalidationsReader {
            seen,
            kallsyms: Kallsyms::read().ok(),
            namer: Namer::from_tracefs(),
            kvm_members: kvm_members(kernel),
            drain: RefCell::default(),
            thresholds: self.thresholds,
            window: RefCell::new(Window::starting(monotonic_ns())),
        };
        // Every program is named inv_*, each subscriber's callback probe too.
        let attached = Attached { capability: CapabilityId::Invalidations, plan, programs: Programs::Prefix("inv_") };
        Ok(Source { attached, reader: Box::new(reader) })
    }
}

/// Reads invalidations as attached: what its plan lets the exporter see, and the symbols that
/// name the waiters' paths and the subscribers' callbacks.
struct InvalidationsReader {
    seen: Observability,
    namer: Namer,
    kallsyms: Option<Kallsyms>,
    kvm_members: KvmMembers,
    /// The totals since attach: the kernel's tables are drained into them every period and at
    /// each scrape, so that weeks of a busy node never fill a table.
    drain: RefCell<Drain>,
    thresholds: Thresholds,
    window: RefCell<Window>,
}

/// The window being judged: the totals when it began, and its busiest second so far.
struct Window {
    start: Tables,
    peak: PeakRate,
    /// The totals at the last reading the peak rate took in, and when (monotonic ns).
    last: Tables,
    last_ns: u64,
}

impl Window {
    fn starting(now_ns: u64) -> Self {
        Self { start: Tables::default(), peak: PeakRate::default(), last: Tables::default(), last_ns: now_ns }
    }

    /// Takes the totals in for the peak rate, once at least half a drain period has passed since
    /// the last reading it took: a scrape drains too, and a rate over a few milliseconds is noise.
    fn observe(&mut self, totals: &Tables, now_ns: u64) {
        let seconds = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        if seconds < DRAIN_PERIOD.as_secs_f64() / 2.0 {
            return;
        }
        self.peak.observe(&self.last, totals, seconds, now_ns);
        self.last = totals.clone();
        self.last_ns = now_ns;
    }
}

impl Reader for InvalidationsReader {
    fn drain_period(&self) -> Option<Duration> {
        Some(DRAIN_PERIOD)
    }

    fn drain(&self, ebpf: &mut Ebpf) -> Result<()> {
        let mut drain = self.drain.borrow_mut();
        drain.drain(ebpf, self.kallsyms.as_ref())?;
        self.window.borrow_mut().observe(&drain.totals, monotonic_ns());
        Ok(())
    }

    /// The change in the totals over the window, summarized and judged as the command judges
    /// a run of that length (its busiest second from the drains in between).
    fn judge(&self, _ebpf: &Ebpf, window_ns: u64) -> Result<Option<WindowVerdict>> {
        let drain = self.drain.borrow();
        let mut window = self.window.borrow_mut();
        let run = RunFacts {
            seen: &self.seen,
            pids: &[],
            peak: window.peak.peak.take(),
            kvm_members: &self.kvm_members,
            kallsyms: self.kallsyms.as_ref(),
            skipped: None,
            namer: &self.namer,
        };
        let summary = aggregator::summary(&drain.totals.since(&window.start), window_ns, &run, &self.thresholds);
        window.start = drain.totals.clone();
        Ok(Some(WindowVerdict::of(&summary.verdict, summary.invalidations.count.unwrap_or(0))))
    }

    fn read(&self, _ebpf: &Ebpf, snapshot: &mut Snapshot) -> Result<()> {
        let name = CapabilityId::Invalidations.name();
        let drain = self.drain.borrow();
        let tables = &drain.totals;
        let lost = aggregator::lost_events(tables);
        snapshot.lost_events.extend([
            Series::new(&[("capability", name), ("kind", "waiter_stacks")], lost.get(Loss::WaitStacks)),
            Series::new(&[("capability", name), ("kind", "owner_unresolved")], lost.get(Loss::OwnerUnresolved)),
            Series::new(&[("capability", name), ("kind", "folded_waits")], lost.get(Loss::FoldedWaits)),
            Series::new(
                &[("capability", name), ("kind", "cause_brackets_missed")],
                lost.get(Loss::CauseBracketsMissed),
            ),
            Series::new(
                &[("capability", name), ("kind", "callbacks_undiscovered")],
                lost.get(Loss::CallbacksUndiscovered),
            ),
        ]);
        snapshot.map_update_failures.extend([
            Series::new(&[("capability", name), ("map", "INV_WAITS")], lost.get(Loss::Waits)),
            Series::new(&[("capability", name), ("map", "INV_INVALIDATIONS")], lost.get(Loss::Invalidations)),
            Series::new(&[("capability", name), ("map", names::CALLBACKS_MAP)], lost.get(Loss::CallbackCalls)),
            Series::new(&[("capability", name), ("map", names::KVM_LOCKS_MAP)], lost.get(Loss::VmLocks)),
            Series::new(&[("capability", name), ("map", names::VMS_MAP)], lost.get(Loss::VmsUntracked)),
        ]);
        let mut by_event: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        let scope = Scope {
            range_starts: self.seen.range_starts,
            kvm_unmaps: self.seen.kvm_unmaps,
            pids: &[],
            namer: &self.namer,
        };
        let invalidations = aggregator::invalidations(tables, 0.0, scope);
        // KVM's tracepoints are served once, in the KVM family below; this family is the
        // notifier's.
        for row in &invalidations.by_invalidator {
            if row.source == "invalidate_range_start" {
                *by_event.entry((row.source, row.event.unwrap_or("unknown"))).or_default() += row.count;
            }
        }
        snapshot.invalidation_causes = causes(&invalidations);
        snapshot.kvm_notifier_events.extend(kvm_events(
            self.seen.kvm_unmaps.then(|| tables.counter(Counter::KvmUnmaps)),
            self.seen.kvm_ages.then(|| tables.counter(Counter::KvmAges)),
        ));
        snapshot.notifier_invalidations = by_event
            .into_iter()
            .map(|((hook, event), count)| Series::new(&[("source", hook), ("event", event)], count))
            .collect();
        if self.seen.lock_waits {
            read_lock_waits(tables, &self.kvm_members, &self.namer, snapshot);
        }
        if self.seen.callbacks {
            for row in aggregator::subscribers(tables, self.kallsyms.as_ref(), self.seen.lock_waits) {
                let labels = [("subscriber", row.subscriber.as_str()), ("callback", row.callback.as_str())];
                snapshot.callback_calls.push(Series::new(&labels, row.calls));
                let seconds = row.mean_ns * row.calls as f64 / 1e9;
                snapshot.callback_seconds.push(FloatSeries::new(&labels, seconds));
            }
        }
        Ok(())
    }
}

/// The counted invalidations by cause class (the details, unbounded, stay in the JSON).
fn causes(invalidations: &Invalidations) -> Vec<Series> {
    let source = invalidations
        .by_invalidator
        .iter()
        .find(|r| r.source == "invalidate_range_start")
        .map_or("kvm_unmap_hva_range", |r| r.source);
    let mut by_class: BTreeMap<&str, u64> = BTreeMap::new();
    for row in &invalidations.by_cause {
        *by_class.entry(row.cause.class).or_default() += row.count;
    }
    by_class.into_iter().map(|(class, count)| Series::new(&[("source", source), ("cause", class)], count)).collect()
}

/// Contended acquisitions and their waits by lock class and waiting path.
fn read_lock_waits(tables: &Tables, kvm_members: &KvmMembers, namer: &Namer, snapshot: &mut Snapshot) {
    let (locks, other) = locks::locks(tables, kvm_members, namer);
    let mut by_path: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    if other.locks > 0 {
        // The rest of the machine's contention, one series: its locks are not bounded.
        by_path.insert(("unrelated", "other"), (other.contended, other.wait_ns));
    }
    for lock in &locks {
        for path in &lock.paths {
            let sums = by_path.entry((lock.class, path.path.label())).or_default();
            sums.0 += path.contended;
            sums.1 += path.wait_ns;
        }
    }
    for ((class, path), (contended, wait_ns)) in by_path {
        let labels = [("lock_class", class), ("path", path)];
        snapshot.lock_contended.push(Series::new(&labels, contended));
        snapshot.lock_wait_seconds.push(FloatSeries::new(&labels, wait_ns as f64 / 1e9));
    }
}
