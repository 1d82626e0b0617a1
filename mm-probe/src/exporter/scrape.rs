//! Collection: on every scrape, read what the kernel programs counted (per-CPU sums) into a
//! [`Snapshot`] of plain numbers. Nothing accumulates here between scrapes: every value is the
//! kernel's own running total since the object was loaded.

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::{hmm, latency as lat, thp};

use super::buckets::{Histogram, latency_histogram, log2_ns_histogram};
use crate::{
    cli::Capability,
    collect::counters::program_runs_skipped,
    invalidations::{self, aggregator, decoder},
    kernel::layout::ThpDisableBits,
    kernel::{Kallsyms, release::Release},
    latency::{self, attach::FunctionPlan},
    probes::Plan,
    retry_storm::{KernelTotals, events::NotifierEvent, report::Observability},
    thp_why::{checks::AllowCheck, decoder::system_wide_outcome, live::read_counts, sysfs::SystemPolicy},
};

/// Latency as attached: its plan, its function slots and the threshold it was loaded with.
pub struct LatencySource {
    pub plan: Plan,
    pub functions: Vec<FunctionPlan>,
    pub threshold_ns: u64,
}

/// Retry-storm as attached, and what its plan lets it see.
pub struct RetryStormSource {
    pub plan: Plan,
    pub seen: Observability,
    /// Its programs' names (for the recursion-guard count).
    pub programs: Vec<&'static str>,
}

/// The THP allow-check as attached, counting every mm, and how to decode its keys.
pub struct ThpSource {
    pub plan: Plan,
    pub allow_check: AllowCheck,
    pub bits: ThpDisableBits,
    pub programs: Vec<&'static str>,
}

/// Invalidations as attached: its plan, what it lets the exporter see, and the symbols that
/// name the waiters' paths and the subscribers' callbacks.
pub struct InvalidationsSource {
    pub plan: Plan,
    pub seen: invalidations::probes::Observability,
    pub kallsyms: Option<Kallsyms>,
    pub kvm_members: invalidations::locks::KvmMembers,
    /// The totals since attach: the kernel's tables are drained into them every second and at
    /// each scrape, so that weeks of a busy node never fill a table.
    pub drain: std::cell::RefCell<decoder::Drain>,
}

/// Everything attached, and the facts every scrape repeats.
pub struct Sources {
    pub release: Release,
    pub latency: Option<LatencySource>,
    pub retry_storm: Option<RetryStormSource>,
    pub thp: Option<ThpSource>,
    pub invalidations: Option<InvalidationsSource>,
}

/// One labelled value of a counter or gauge family (labels in the family's order).
#[derive(Clone, Debug, PartialEq)]
pub struct Series<V = u64> {
    pub labels: Vec<(&'static str, String)>,
    pub value: V,
}

/// A counter counted in a fractional unit (seconds).
pub type FloatSeries = Series<f64>;

impl Series {
    fn new(labels: &[(&'static str, &str)], value: u64) -> Self {
        Self { labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(), value }
    }
}

/// What one scrape read, named as the metric families are.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub build_info: Vec<Series>,
    pub probe_attached: Vec<Series>,
    pub lost_events: Vec<Series>,
    pub map_update_failures: Vec<Series>,
    pub wakeup_latency: Option<Histogram>,
    pub wakeups_over_threshold: Option<u64>,
    /// (function, duration histogram, calls over the threshold), attached slots only.
    pub function_durations: Vec<(String, Histogram, u64)>,
    pub hmm_range_fault_returns: Vec<Series>,
    pub mmu_invalidations: Vec<Series>,
    pub mmu_invalidation_callback: Option<Histogram>,
    pub kvm_notifier_events: Vec<Series>,
    pub thp_checks: Vec<Series>,
    /// invalidations: by hook (source) and event; contended locks and waits by lock class and
    /// waiting path; callbacks by subscriber. Every label set is bounded by a table of names.
    pub notifier_invalidations: Vec<Series>,
    pub lock_contended: Vec<Series>,
    pub lock_wait_seconds: Vec<FloatSeries>,
    pub callback_calls: Vec<Series>,
    pub callback_seconds: Vec<FloatSeries>,
}

impl Sources {
    /// Each attached capability's plan, in the capabilities' order.
    pub fn plans(&self) -> Vec<(Capability, &Plan)> {
        let latency = self.latency.as_ref().map(|s| (Capability::Latency, &s.plan));
        let retry_storm = self.retry_storm.as_ref().map(|s| (Capability::RetryStorm, &s.plan));
        let thp = self.thp.as_ref().map(|s| (Capability::Thp, &s.plan));
        let invalidations = self.invalidations.as_ref().map(|s| (Capability::Invalidations, &s.plan));
        [latency, retry_storm, thp, invalidations].into_iter().flatten().collect()
    }

    /// Moves what the kernel's drained tables hold into the totals.
    pub fn drain(&self, ebpf: &mut Ebpf) -> Result<()> {
        if let Some(source) = &self.invalidations {
            source.drain.borrow_mut().drain(ebpf, source.kallsyms.as_ref())?;
        }
        Ok(())
    }

    /// Reads every attached capability's kernel totals.
    pub fn read(&self, ebpf: &Ebpf) -> Result<Snapshot> {
        let mut snapshot = Snapshot {
            build_info: vec![Series::new(&[("version", env!("CARGO_PKG_VERSION")), ("kernel", &self.release.text)], 1)],
            ..Snapshot::default()
        };
        if let Some(source) = &self.latency {
            read_latency(ebpf, &self.release, source, &mut snapshot)?;
        }
        if let Some(source) = &self.retry_storm {
            read_retry_storm(ebpf, &self.release, source, &mut snapshot)?;
        }
        if let Some(source) = &self.thp {
            read_thp(ebpf, &self.release, source, &mut snapshot)?;
        }
        if let Some(source) = &self.invalidations {
            read_invalidations(ebpf, &self.release, source, &mut snapshot)?;
        }
        Ok(snapshot)
    }
}

/// The runs the kernel's recursion guard skipped; no series where this kernel does not count
/// them all (kprobes and classic tracepoints before 6.7): absent, not a false 0.
fn recursion_guard(capability: &str, skipped: Option<u64>) -> Option<Series> {
    skipped.map(|n| Series::new(&[("capability", capability), ("kind", "recursion_guard")], n))
}

/// One 0/1 series per logical probe of the plan.
fn probe_series(capability: Capability, plan: &Plan) -> impl Iterator<Item = Series> + '_ {
    plan.probes
        .iter()
        .map(move |p| Series::new(&[("capability", capability.name()), ("probe", p.probe)], u64::from(p.attached())))
}

fn read_latency(ebpf: &Ebpf, release: &Release, source: &LatencySource, snapshot: &mut Snapshot) -> Result<()> {
    let name = Capability::Latency.name();
    snapshot.probe_attached.extend(probe_series(Capability::Latency, &source.plan));
    let totals = latency::read_totals(ebpf, source.functions.len())?;
    let counter = |c: lat::Counter| latency::counter(&totals.counters, c);
    // Every latency program is named lat_*; a skipped run of the wakeup or switch program is a
    // wakeup the histogram never saw.
    let skipped = program_runs_skipped(release, ebpf, |program| program.starts_with("lat_"));
    snapshot.lost_events.extend(recursion_guard(name, skipped));
    snapshot.map_update_failures.extend([
        Series::new(&[("capability", name), ("map", "LAT_WAKEUPS")], counter(lat::Counter::LostWakeups)),
        Series::new(&[("capability", name), ("map", "LAT_FUNC_STATE")], counter(lat::Counter::LostFuncEntries)),
    ]);
    if latency::REQUIRED_PROBES.iter().all(|p| source.plan.is_attached(p)) {
        snapshot.wakeup_latency = Some(latency_histogram(&totals.wakeup, source.threshold_ns));
        snapshot.wakeups_over_threshold = Some(totals.wakeup.over_threshold);
    }
    for function in source.functions.iter().filter(|f| f.attached) {
        let distribution = &totals.functions[function.slot];
        snapshot.function_durations.push((
            function.function.clone(),
            latency_histogram(distribution, source.threshold_ns),
            distribution.over_threshold,
        ));
    }
    Ok(())
}

fn read_retry_storm(ebpf: &Ebpf, release: &Release, source: &RetryStormSource, snapshot: &mut Snapshot) -> Result<()> {
    let name = Capability::RetryStorm.name();
    snapshot.probe_attached.extend(probe_series(Capability::RetryStorm, &source.plan));
    let totals = KernelTotals::read(ebpf)?;
    let c = &totals.counters;
    let skipped = program_runs_skipped(release, ebpf, |program| source.programs.contains(&program));
    snapshot.lost_events.extend(recursion_guard(name, skipped));
    snapshot.lost_events.extend([
        // A walk return whose entry was not seen: counted, but its duration is unknown.
        Series::new(&[("capability", name), ("kind", "walk_entries")], c.get(hmm::Counter::StashMisses)),
    ]);
    if source.seen.walks {
        // Read in slot order (walks before their outcomes), so a walk returning between the
        // reads can make `ok` one too low for a scrape, never too high.
        let walks = c.get(hmm::Counter::Walks);
        let ebusy = c.get(hmm::Counter::WalkBusy);
        let other = c.get(hmm::Counter::WalkErrors);
        snapshot.hmm_range_fault_returns = vec![
            Series::new(&[("result", "ok")], walks.saturating_sub(ebusy + other)),
            Series::new(&[("result", "ebusy")], ebusy),
            Series::new(&[("result", "other_error")], other),
        ];
    }
    if source.seen.invalidations {
        snapshot.mmu_invalidations = totals
            .invalidations_by_event
            .iter()
            .enumerate()
            .map(|(raw, &count)| Series::new(&[("event", NotifierEvent::from_raw(raw as i32).name())], count))
            .collect();
        snapshot.mmu_invalidation_callback =
            Some(log2_ns_histogram(&totals.callback_ns, c.get(hmm::Counter::CallbackNs)));
    }
    // KVM's own tracepoints (the secondary MMU's side of the same invalidations).
    snapshot.kvm_notifier_events = kvm_events(
        source.seen.kvm_unmap.then(|| c.get(hmm::Counter::KvmUnmap)),
        source.seen.kvm_age.then(|| c.get(hmm::Counter::KvmAge)),
    );
    Ok(())
}

/// The one KVM family: each of KVM's tracepoints only where it attached (`None` otherwise).
fn kvm_events(unmaps: Option<u64>, ages: Option<u64>) -> Vec<Series> {
    [("unmap_hva_range", unmaps), ("age_hva", ages)]
        .into_iter()
        .filter_map(|(event, count)| Some(Series::new(&[("event", event)], count?)))
        .collect()
}

fn read_thp(ebpf: &Ebpf, release: &Release, source: &ThpSource, snapshot: &mut Snapshot) -> Result<()> {
    let name = Capability::Thp.name();
    snapshot.probe_attached.extend(probe_series(Capability::Thp, &source.plan));
    let counts = read_counts(ebpf)?;
    let skipped = program_runs_skipped(release, ebpf, |program| source.programs.contains(&program));
    snapshot.lost_events.extend(recursion_guard(name, skipped));
    snapshot.lost_events.extend([
        // A kretprobe run without its entry: that check is not counted.
        Series::new(
            &[("capability", name), ("kind", "allow_check_entries")],
            counts.counter(thp::Counter::ReturnWithoutEntry),
        ),
    ]);
    snapshot.map_update_failures.push(Series::new(
        &[("capability", name), ("map", thp::CHECKS_MAP)],
        counts.counter(thp::Counter::CheckMapFull),
    ));
    if !source.plan.probes.iter().any(|p| p.attached()) {
        return Ok(());
    }
    // The sysfs policy is read now: a refusal is judged against the policy in force.
    let policy = SystemPolicy::read();
    let mut tally: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
    for (key, count) in &counts.checks {
        let (allowed, reason) = system_wide_outcome(&source.allow_check, source.bits, &policy, key);
        *tally.entry((if allowed { "allowed" } else { "denied" }, reason)).or_default() += count;
    }
    snapshot.thp_checks = tally
        .into_iter()
        .map(|((verdict, reason), n)| Series::new(&[("verdict", verdict), ("reason", reason)], n))
        .collect();
    Ok(())
}

fn read_invalidations(
    ebpf: &Ebpf,
    release: &Release,
    source: &InvalidationsSource,
    snapshot: &mut Snapshot,
) -> Result<()> {
    use std::collections::BTreeMap;

    use mm_probe_common::invalidations as names;

    let name = Capability::Invalidations.name();
    snapshot.probe_attached.extend(probe_series(Capability::Invalidations, &source.plan));
    let drain = source.drain.borrow();
    let tables = &drain.totals;
    let lost = aggregator::lost_events(tables);
    let skipped = program_runs_skipped(release, ebpf, |program| program.starts_with("inv_"));
    snapshot.lost_events.extend(recursion_guard(name, skipped));
    snapshot.lost_events.extend([
        Series::new(&[("capability", name), ("kind", "waiter_stacks")], lost.wait_stacks),
        Series::new(&[("capability", name), ("kind", "owner_unresolved")], lost.owner_unresolved),
        Series::new(&[("capability", name), ("kind", "folded_waits")], lost.folded_waits),
        Series::new(&[("capability", name), ("kind", "callbacks_undiscovered")], lost.callbacks_undiscovered),
    ]);
    snapshot.map_update_failures.extend([
        Series::new(&[("capability", name), ("map", "INV_WAITS")], lost.waits),
        Series::new(&[("capability", name), ("map", "INV_INVALIDATIONS")], lost.invalidations),
        Series::new(&[("capability", name), ("map", names::CALLBACKS_MAP)], lost.callback_calls),
        Series::new(&[("capability", name), ("map", names::KVM_LOCKS_MAP)], lost.vm_locks),
    ]);
    let mut by_event: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let scope =
        aggregator::Scope { range_starts: source.seen.range_starts, kvm_unmaps: source.seen.kvm_unmaps, pids: &[] };
    // KVM's tracepoints are served once, in the KVM family below; this family is the notifier's.
    for row in aggregator::invalidations(tables, 0.0, scope).by_invalidator {
        if row.source == "invalidate_range_start" {
            *by_event.entry((row.source, row.event.unwrap_or("unknown"))).or_default() += row.count;
        }
    }
    snapshot.kvm_notifier_events = kvm_events(
        source.seen.kvm_unmaps.then(|| tables.counter(names::Counter::KvmUnmaps)),
        source.seen.kvm_ages.then(|| tables.counter(names::Counter::KvmAges)),
    );
    snapshot.notifier_invalidations = by_event
        .into_iter()
        .map(|((hook, event), count)| Series::new(&[("source", hook), ("event", event)], count))
        .collect();
    if source.seen.lock_waits {
        let (locks, other) = invalidations::contention::locks(tables, &source.kvm_members);
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
            snapshot
                .lock_wait_seconds
                .push(FloatSeries { labels: Series::new(&labels, 0).labels, value: wait_ns as f64 / 1e9 });
        }
    }
    if source.seen.callbacks {
        for row in aggregator::subscribers(tables, source.kallsyms.as_ref(), source.seen.lock_waits) {
            let labels = [("subscriber", row.subscriber.as_str()), ("callback", row.callback.as_str())];
            snapshot.callback_calls.push(Series::new(&labels, row.calls));
            let seconds = row.mean_ns * row.calls as f64 / 1e9;
            snapshot.callback_seconds.push(FloatSeries { labels: Series::new(&labels, 0).labels, value: seconds });
        }
    }
    Ok(())
}
