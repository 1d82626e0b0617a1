//! From the kernel's tables to the report: invalidations per invalidator, contended locks named
//! and split by the path that waited, subscribers with their callback fit, and the evidence the
//! verdict judges.

use std::{cmp::Reverse, collections::BTreeMap, path::Path};

use mm_probe_common::{
    hmm::NotifierEvent,
    invalidations::{CallbackStats, Counter, FIT_CLASSES, FIT_SHIFT, Source},
};

use super::{
    decoder::Tables,
    judge::{self, Amplified, Busiest, DominantCause, Evidence, Fit, Metric, Thresholds},
    locks::{self, KvmMembers, LockRow, WaitPath},
    probes::{Observability, subscriber_name},
    report::{CauseRow, Interval, Invalidations, InvalidatorRow, Loss, LostEvents, Peak, SubscriberRow, Summary},
};
use crate::{
    cause::{self, CauseName, Namer},
    kernel::{Kallsyms, process::comm_text},
    report::Log2Histogram,
};

/// What the invalidation counts may cover here, and the processes -p named.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// __mmu_notifier_invalidate_range_start is probed: every mm with subscribers.
    pub range_starts: bool,
    /// KVM's tracepoints are attached: VMs' memory.
    pub kvm_unmaps: bool,
    pub pids: &'a [u32],
    pub namer: &'a Namer,
}

const SCOPE_EVERY_MM: &str = "every mm with subscribers";
const SCOPE_VMS: &str = "VMs' memory (KVM's tracepoints)";

pub fn invalidations(tables: &Tables, duration_s: f64, scope: Scope<'_>) -> Invalidations {
    let mut rows: Vec<InvalidatorRow> = tables
        .invalidations
        .iter()
        .map(|(key, stats)| InvalidatorRow {
            comm: comm_text(&key.comm),
            tgid: key.tgid,
            owner_tgid: (key.owner_tgid != 0).then_some(key.owner_tgid),
            source: source_name(key.source),
            event: event_name(key.event),
            cause: scope.namer.name(&key.cause, &comm_text(&key.comm), event_name(key.event)),
            count: stats.count,
            bytes: stats.bytes,
            mean_bytes: mean(stats.bytes, stats.count - stats.whole_mm),
            whole_address_space: stats.whole_mm,
            mean_duration_ns: (stats.ended > 0).then(|| stats.duration_ns as f64 / stats.ended as f64),
        })
        .collect();
    rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.comm.cmp(&b.comm)));
    let primary = primary_source(&rows);
    let (count, bytes, whole) = rows
        .iter()
        .filter(|r| r.source == primary)
        .fold((0, 0, 0), |(c, b, w), r| (c + r.count, b + r.bytes, w + r.whole_address_space));
    let mut sizes = vec![0u64; mm_probe_common::invalidations::SIZE_BUCKETS];
    let (mut ended, mut duration_ns) = (0u64, 0u64);
    for (key, stats) in &tables.invalidations {
        if source_name(key.source) == primary {
            for (into, from) in sizes.iter_mut().zip(stats.sizes.iter()) {
                *into += from;
            }
            ended += stats.ended;
            duration_ns += stats.duration_ns;
        }
    }
    let not_observable = not_observable(tables, scope);
    let count = not_observable.is_none().then_some(count);
    Invalidations {
        count,
        per_second: count.filter(|_| duration_s > 0.0).map(|c| c as f64 / duration_s),
        scope: if scope.range_starts { SCOPE_EVERY_MM } else { SCOPE_VMS },
        not_observable,
        bytes,
        whole_address_space: whole,
        busiest: busiest(&rows, primary),
        peak: None,
        sizes,
        mean_duration_ns: (ended > 0).then(|| duration_ns as f64 / ended as f64),
        by_cause: by_cause(&rows, primary, Path::new("/")),
        by_invalidator: rows,
    }
}

/// The primary source's rows grouped by cause, with each cause's settings read under `root`.
fn by_cause(rows: &[InvalidatorRow], primary: &str, root: &Path) -> Vec<CauseRow> {
    let counted: Vec<&InvalidatorRow> = rows.iter().filter(|r| r.source == primary).collect();
    let total: u64 = counted.iter().map(|r| r.count).sum();
    let mut groups: BTreeMap<&CauseName, Vec<&InvalidatorRow>> = BTreeMap::new();
    for row in counted {
        groups.entry(&row.cause).or_default().push(row);
    }
    let mut causes: Vec<CauseRow> = groups
        .into_iter()
        .map(|(cause, rows)| {
            let count = rows.iter().map(|r| r.count).sum();
            let mut per_owner: BTreeMap<u32, u64> = BTreeMap::new();
            for row in &rows {
                if let Some(owner) = row.owner_tgid {
                    *per_owner.entry(owner).or_default() += row.count;
                }
            }
            let mut owners: Vec<(u32, u64)> = per_owner.into_iter().collect();
            owners.sort_by_key(|&(_, n)| Reverse(n));
            // The rows are sorted most first: the first is the busiest invalidating process.
            let tgid = rows.first().map_or(0, |r| r.tgid);
            CauseRow {
                cause: cause.clone(),
                count,
                share: count as f64 / total.max(1) as f64,
                owners: owners.into_iter().map(|(owner, _)| owner).collect(),
                knobs: cause::knobs(root, cause, tgid),
                remedy: cause::remedy(cause.class),
            }
        })
        .collect();
    causes.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.cause.cmp(&b.cause)));
    causes
}

/// Where function probes see every invalidation, KVM's tracepoints see some of them again.
pub fn primary_source(rows: &[InvalidatorRow]) -> &'static str {
    if rows.iter().any(|r| r.source == "invalidate_range_start") {
        "invalidate_range_start"
    } else {
        "kvm_unmap_hva_range"
    }
}

/// Why the invalidations asked about cannot be counted here, if they cannot: without the
/// notifier's function probes only VMs' memory is seen, so a -p of processes that are not VMs
/// would read 0 for what was not observed.
fn not_observable(tables: &Tables, scope: Scope<'_>) -> Option<String> {
    if scope.range_starts {
        return None;
    }
    if !scope.kvm_unmaps {
        return Some("neither __mmu_notifier_invalidate_range_start nor KVM's tracepoints can be attached".into());
    }
    let vms: Vec<u32> = tables.kvm_locks.iter().map(|(_, vm)| vm.tgid).collect();
    let not_vms: Vec<String> = scope.pids.iter().filter(|p| !vms.contains(p)).map(u32::to_string).collect();
    (!not_vms.is_empty()).then(|| {
        format!(
            "pid {} is not a VM here, and only VMs' invalidations are visible without function probes on \
             __mmu_notifier_invalidate_range_start",
            not_vms.join(", ")
        )
    })
}

/// The mm invalidated most (by the primary source; aging is not an invalidation of mappings).
fn busiest(rows: &[InvalidatorRow], primary: &str) -> Option<Busiest> {
    let mut per_owner: BTreeMap<Option<u32>, (u64, u64, u64, String)> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.source == primary) {
        let entry = per_owner.entry(row.owner_tgid).or_insert_with(|| (0, 0, 0, String::new()));
        entry.0 += row.count;
        entry.1 += row.bytes;
        entry.2 += row.whole_address_space;
        if row.owner_tgid == Some(row.tgid) || entry.3.is_empty() {
            entry.3 = row.comm.clone();
        }
    }
    let (owner, (count, bytes, whole, comm)) = per_owner.into_iter().max_by_key(|(_, v)| v.0)?;
    let comm = owner.and_then(process_comm).unwrap_or(comm);
    Some(Busiest { owner_tgid: owner, comm, count, mean_bytes: mean(bytes, count - whole) })
}

fn process_comm(tgid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{tgid}/comm")).ok().map(|c| c.trim_end().to_string())
}

/// The busiest mm's most invalidations within one drain period, kept across the run.
#[derive(Clone, Debug, Default)]
pub struct PeakRate {
    pub peak: Option<Peak>,
}

impl PeakRate {
    /// Takes in the period between two readings of the totals, ending at `end_ns`.
    pub fn observe(&mut self, before: &Tables, now: &Tables, seconds: f64, end_ns: u64) {
        if seconds <= 0.0 {
            return;
        }
        let per_owner = |t: &Tables| {
            let mut counts: BTreeMap<u32, u64> = BTreeMap::new();
            for (key, stats) in &t.invalidations {
                if key.source != Source::KvmAge as u32 {
                    *counts.entry(if key.owner_tgid != 0 { key.owner_tgid } else { key.tgid }).or_default() +=
                        stats.count;
                }
            }
            counts
        };
        let (then, now) = (per_owner(before), per_owner(now));
        let Some((owner, delta)) = now
            .iter()
            .map(|(owner, count)| (*owner, count.saturating_sub(then.get(owner).copied().unwrap_or(0))))
            .max_by_key(|(_, delta)| *delta)
            .filter(|(_, delta)| *delta > 0)
        else {
            // A period in which nothing was invalidated has no busiest mm: not a rate of 0/s.
            return;
        };
        let rate = delta as f64 / seconds;
        if self.peak.as_ref().is_none_or(|p| rate > p.per_second) {
            self.peak = Some(Peak { per_second: rate, owner_tgid: Some(owner), end_ns });
        }
    }
}

/// `total / count`, null for no count.
fn mean(total: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| total as f64 / count as f64)
}

fn ratio(value: f64, count: u64) -> f64 {
    if count == 0 { 0.0 } else { value / count as f64 }
}

fn source_name(source: u32) -> &'static str {
    match source {
        s if s == Source::KvmUnmap as u32 => "kvm_unmap_hva_range",
        s if s == Source::KvmAge as u32 => "kvm_age_hva",
        _ => "invalidate_range_start",
    }
}

fn event_name(event: u32) -> Option<&'static str> {
    (event != u32::MAX).then(|| NotifierEvent::from_raw(event as i32).name())
}

/// The subscribers' callbacks, slowest mean first; their lock waits where the lock tracepoints
/// are attached (`seen_waits`).
pub fn subscribers(tables: &Tables, kallsyms: Option<&Kallsyms>, seen_waits: bool) -> Vec<SubscriberRow> {
    let mut rows: Vec<SubscriberRow> = tables
        .callbacks
        .iter()
        .filter(|(_, stats)| stats.calls > 0)
        .map(|(ip, stats)| {
            let symbol = kallsyms.and_then(|k| k.symbolize(*ip));
            let callback = symbol.as_ref().map_or_else(|| format!("{ip:#x}"), |s| s.symbol.name.to_string());
            let module = symbol.as_ref().and_then(|s| s.symbol.module.as_deref().map(str::to_string));
            SubscriberRow {
                subscriber: subscriber_name(&callback, module.as_deref()),
                module,
                calls: stats.calls,
                mean_ns: ratio(stats.total_ns as f64, stats.calls),
                max_ns: stats.max_ns,
                p50_le_ns: Log2Histogram::quantile_bound(&stats.buckets, 0.50).unwrap_or(0),
                p99_le_ns: Log2Histogram::quantile_bound(&stats.buckets, 0.99).unwrap_or(0),
                bytes_per_call: ratio(stats.bytes as f64, stats.calls),
                lock_wait_ns: seen_waits.then_some(stats.wait_ns),
                nonblocking: stats.nonblocking,
                refused: stats.refused,
                buckets: stats.buckets.to_vec(),
                fit: fit(stats),
                callback,
            }
        })
        .collect();
    rows.sort_by(|a, b| b.mean_ns.total_cmp(&a.mean_ns));
    rows
}

/// Least squares of the median callback time against pages over the size classes seen,
/// weighted by calls. The time is the callback's own: its traced lock waits are left out (the
/// kernel side subtracts them), as they are the lock's cost and depend on who held it, not on
/// the size. The median, not the mean: on a loaded machine (or a virtual one whose vCPU the
/// host deschedules) one call in a class can take milliseconds for reasons of its own, and a
/// few dozen calls' mean then says a per-page cost is a fixed one. Class c holds sizes in
/// [2^c, 2^(c+1)) pages and is placed at 2^c pages, exact for the power-of-two sizes madvise
/// and munmap usually get.
pub fn fit(stats: &CallbackStats) -> Option<Fit> {
    let points: Vec<(f64, f64, f64)> = (0..FIT_CLASSES)
        .filter_map(|c| {
            let buckets = &stats.fit_buckets[c];
            let median = Log2Histogram::quantile_estimate(buckets, 0.5)?;
            Some(((1u64 << c) as f64, median, buckets.iter().sum::<u64>() as f64))
        })
        .collect();
    if points.len() < 2 {
        return None;
    }
    let weight: f64 = points.iter().map(|p| p.2).sum();
    let mean_x = points.iter().map(|p| p.0 * p.2).sum::<f64>() / weight;
    let mean_y = points.iter().map(|p| p.1 * p.2).sum::<f64>() / weight;
    let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mean_x) * (p.1 - mean_y)).sum();
    // A cost is never negative: noise around a flat line can tilt it down a little (-23 ns a
    // page against a 179 us fixed flush in a 6.12 guest), and a flat line is then the fit.
    let per_page = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    let fixed = (mean_y - per_page * mean_x).max(0.0);
    let (small, large) = (points[0], points[points.len() - 1]);
    let page_cost = |point: (f64, f64, f64)| point.1 / point.0;
    let time = |point: (f64, f64, f64)| point.1 * point.2;
    let total_time: f64 = points.iter().copied().map(time).sum();
    Some(Fit {
        fixed_ns: fixed,
        per_page_ns: per_page,
        amplification: page_cost(small) / page_cost(large).max(f64::MIN_POSITIVE),
        smallest_bytes: (small.0 as u64) << FIT_SHIFT,
        largest_bytes: (large.0 as u64) << FIT_SHIFT,
        size_classes: points.len(),
        smallest_time_share: if total_time > 0.0 { time(small) / total_time } else { 0.0 },
    })
}

/// What a summary is built from besides the drained totals: what the plan let the run see,
/// which processes it watched, and what user space measured and read itself.
pub struct RunFacts<'a> {
    pub seen: &'a Observability,
    pub pids: &'a [u32],
    pub peak: Option<Peak>,
    pub kvm_members: &'a KvmMembers,
    pub kallsyms: Option<&'a Kallsyms>,
    /// Runs the kernel skipped (read before the detach unloaded the programs).
    pub skipped: Option<u64>,
    pub namer: &'a Namer,
}

/// The run's summary: the totals become rows, the rows the judge's evidence, and the evidence
/// its verdict.
pub fn summary(tables: &Tables, duration_ns: u64, run: &RunFacts<'_>, thresholds: &Thresholds) -> Summary {
    let seen = run.seen;
    let scope =
        Scope { range_starts: seen.range_starts, kvm_unmaps: seen.kvm_unmaps, pids: run.pids, namer: run.namer };
    let mut invalidations = invalidations(tables, duration_ns as f64 / 1e9, scope);
    invalidations.peak = run.peak.clone();
    let (locks, other_contention) = locks::locks(tables, run.kvm_members, run.namer);
    let subscribers = subscribers(tables, run.kallsyms, seen.lock_waits);
    let lost_events = lost_events(tables).with(Loss::ProgramRunsSkipped, run.skipped);
    let evidence = evidence(&invalidations, &locks, &subscribers, seen, &lost_events);
    Summary {
        duration_ns,
        verdict: judge::judge(&evidence, thresholds),
        invalidations,
        locks,
        other_contention,
        lock_waits_observable: seen.lock_waits,
        subscribers,
        callbacks_observable: seen.callbacks,
        lost_events,
        counters: counters(tables),
    }
}

/// What the verdict judges.
pub fn evidence(
    inv: &Invalidations,
    locks: &[LockRow],
    subscribers: &[SubscriberRow],
    seen: &Observability,
    lost: &LostEvents,
) -> Evidence {
    let seen_waits = seen.lock_waits;
    let count = inv.count.filter(|_| !lost.get(Loss::Invalidations) > 0);
    let notifier_wait: u64 = locks.iter().flat_map(|l| &l.paths).filter(|p| p.in_notifier).map(|p| p.wait_ns).sum();
    let notifier_lock = locks
        .iter()
        .map(|l| (l, l.paths.iter().filter(|p| p.in_notifier).map(|p| p.wait_ns).sum::<u64>()))
        .filter(|(_, wait)| *wait > 0)
        .max_by_key(|(_, wait)| *wait);
    let vcpu_faults_wait = notifier_lock.is_some_and(|(l, _)| l.paths.iter().any(|p| p.path == WaitPath::VcpuFault));
    let amplification = subscribers
        .iter()
        .filter_map(|s| s.fit.map(|fit| Amplified { subscriber: s.subscriber.to_string(), fit }))
        .max_by(|a, b| a.fit.amplification.total_cmp(&b.fit.amplification));
    let waits_known = seen_waits && !lost.get(Loss::Waits) > 0;
    Evidence {
        invalidate_freq: count.and(inv.peak.as_ref()).map(|p| p.per_second),
        invalidate_freq_mean: count.and(inv.per_second),
        busiest: count.and(inv.busiest.clone()),
        busiest_cause: count.and(inv.busiest.as_ref()).and_then(|b| dominant_cause(inv, b.owner_tgid)),
        wait_per_invalidation_ns: count.filter(|&c| waits_known && c > 0).map(|c| notifier_wait as f64 / c as f64),
        slowest_callback: subscribers.first().map(|s| (s.subscriber.to_string(), s.mean_ns)),
        amplification,
        mean_invalidation_bytes: count.filter(|_| inv.bytes > 0).and(inv.busiest.as_ref()).and_then(|b| b.mean_bytes),
        notifier_lock: notifier_lock.map(|(l, wait)| (l.name.clone(), wait)),
        vcpu_faults_wait,
        unknown_because: unknown_reasons(inv, seen, lost),
    }
}

/// The commonest cause of `owner`'s invalidations (by the counted hook), with its settings.
fn dominant_cause(inv: &Invalidations, owner: Option<u32>) -> Option<DominantCause> {
    let primary = primary_source(&inv.by_invalidator);
    let mut per_cause: BTreeMap<&CauseName, u64> = BTreeMap::new();
    let rows = inv.by_invalidator.iter().filter(|r| r.source == primary && r.owner_tgid == owner);
    for row in rows {
        *per_cause.entry(&row.cause).or_default() += row.count;
    }
    let total: u64 = per_cause.values().sum();
    let (cause, count) = per_cause.into_iter().max_by_key(|&(_, n)| n)?;
    let listed = inv.by_cause.iter().find(|c| &c.cause == cause);
    Some(DominantCause {
        cause: cause.clone(),
        share: count as f64 / total.max(1) as f64,
        knobs: listed.map(|c| c.knobs.clone()).unwrap_or_default(),
        remedy: cause::remedy(cause.class),
    })
}

/// Why each metric that reads UNKNOWN does.
fn unknown_reasons(inv: &Invalidations, seen: &Observability, lost: &LostEvents) -> BTreeMap<Metric, String> {
    use Metric::{Amplification, CallbackMean, InvalidateFreq, WaitPerInvalidation};
    // A loss from a kernel table that refused the row: full, or in use on that CPU.
    let refused = |loss: Loss, what: &str| {
        let n = lost.get(loss);
        (n > 0).then(|| format!("{n} {what} were lost (the kernel's table refused them: full, or in use on that CPU)"))
    };
    let callbacks_untimed =
        (!seen.callbacks).then(|| "subscriber callbacks are not timed on this kernel (the plan says why)".to_string());
    let waits_unseen = (!seen.lock_waits).then(|| "lock contention is not observable on this kernel".to_string());
    // Later reasons win: what was lost says more than what was never seen.
    let causes = [
        (callbacks_untimed, &[CallbackMean, Amplification][..]),
        (inv.not_observable.clone(), &[InvalidateFreq, WaitPerInvalidation]),
        (refused(Loss::Invalidations, "invalidations"), &[InvalidateFreq, WaitPerInvalidation]),
        (waits_unseen.clone(), &[WaitPerInvalidation]),
        (waits_unseen.is_none().then(|| refused(Loss::Waits, "contended waits")).flatten(), &[WaitPerInvalidation]),
        (refused(Loss::CallbackCalls, "callback calls"), &[CallbackMean, Amplification]),
    ];
    let mut reasons = BTreeMap::new();
    for (why, metrics) in causes {
        if let Some(why) = why {
            reasons.extend(metrics.iter().map(|&metric| (metric, why.clone())));
        }
    }
    reasons
}

/// The losses, from the kernel counters and user space's own bound.
pub fn lost_events(tables: &Tables) -> LostEvents {
    LostEvents::from_fn(|kind| {
        let counter = match kind {
            Loss::Waits => Counter::WaitsMapFull,
            Loss::Invalidations => Counter::InvalidationsMapFull,
            Loss::CallbackCalls => Counter::CallbacksMapFull,
            Loss::WaitStacks => Counter::StackMisses,
            Loss::VmLocks => Counter::KvmLocksMapFull,
            Loss::OwnerUnresolved => Counter::OwnerUnresolved,
            Loss::CallbacksUndiscovered => Counter::CallbacksUndiscovered,
            Loss::VmsUntracked => Counter::VmsMapFull,
            Loss::FoldedWaits => return Some(tables.folded_waits),
            Loss::CauseBracketsMissed => return Some(tables.cause_brackets_missed),
            // Read from the programs' fdinfo by the run, not from the tables.
            Loss::ProgramRunsSkipped => return Some(0),
        };
        Some(tables.counter(counter))
    })
}

/// The kernel counters by name, the cause table's refusals with them (each is an unmatched end
/// in `lost_events` too: here they say why).
pub fn counters(tables: &Tables) -> BTreeMap<&'static str, u64> {
    let mut counters: BTreeMap<_, _> = Counter::ALL.iter().map(|&c| (c.name(), tables.counter(c))).collect();
    counters.insert("cause_begins_refused", tables.cause_begins_refused);
    counters
}

/// One interval's deltas between two readings.
pub fn interval(before: &Tables, now: &Tables, interval_ns: u64, seen_waits: bool, seen_callbacks: bool) -> Interval {
    let invalidations = |t: &Tables| {
        let rows: Vec<(u32, u64)> = t.invalidations.iter().map(|(k, s)| (k.source, s.count)).collect();
        let primary = if rows.iter().any(|(source, _)| *source == Source::RangeStart as u32) {
            Source::RangeStart
        } else {
            Source::KvmUnmap
        };
        rows.iter().filter(|(source, _)| *source == primary as u32).map(|(_, c)| c).sum::<u64>()
    };
    let waits = |t: &Tables| t.waits.values().fold((0u64, 0u64), |(c, w), s| (c + s.count, w + s.wait_ns));
    let calls = |t: &Tables| t.callbacks.values().map(|s| s.calls).sum::<u64>();
    let lost = |t: &Tables| {
        let l = lost_events(t);
        l.get(Loss::Waits) + l.get(Loss::Invalidations) + l.get(Loss::CallbackCalls)
    };
    let (contended_now, wait_now) = waits(now);
    let (contended_before, wait_before) = waits(before);
    Interval {
        end_ns: 0,
        interval_ns,
        invalidations: invalidations(now).saturating_sub(invalidations(before)),
        contended: seen_waits.then(|| contended_now.saturating_sub(contended_before)),
        wait_ns: seen_waits.then(|| wait_now.saturating_sub(wait_before)),
        callback_calls: seen_callbacks.then(|| calls(now).saturating_sub(calls(before))),
        lost: lost(now).saturating_sub(lost(before)),
    }
}

#[cfg(test)]
mod tests {
    use mm_probe_common::invalidations::{FIT_CLASSES, InvalidationKey, InvalidationStats, SIZE_BUCKETS, TIME_BUCKETS};

    use super::*;

    /// Totals holding `count` invalidations of process 7's memory.
    fn invalidated(count: u64) -> Tables {
        let key = InvalidationKey {
            tgid: 9,
            owner_tgid: 7,
            source: Source::KvmUnmap as u32,
            event: u32::MAX,
            comm: [b'a'; 16],
            cause: Default::default(),
        };
        let stats = InvalidationStats {
            count,
            bytes: 0,
            whole_mm: 0,
            sizes: [0; SIZE_BUCKETS],
            durations: [0; TIME_BUCKETS],
            duration_ns: 0,
            ended: 0,
        };
        Tables { invalidations: [(key, stats)].into(), ..Tables::default() }
    }

    #[test]
    fn the_peak_is_the_busiest_period_and_a_period_of_nothing_is_none_not_zero() {
        let mut peak = PeakRate::default();
        peak.observe(&invalidated(5), &invalidated(5), 1.0, 1);
        assert_eq!(peak.peak, None, "nothing new: no busiest mm");
        peak.observe(&invalidated(5), &invalidated(2005), 2.0, 2);
        peak.observe(&invalidated(2005), &invalidated(2505), 1.0, 3);
        let p = peak.peak.unwrap();
        assert_eq!((p.per_second, p.owner_tgid, p.end_ns), (1000.0, Some(7), 2));
    }

    /// Callback stats from groups of `(size class, calls, ns each)`; a class may have several.
    fn stats(groups: &[(usize, u64, u64)]) -> CallbackStats {
        let mut s = CallbackStats {
            calls: 0,
            total_ns: 0,
            max_ns: 0,
            bytes: 0,
            refused: 0,
            nonblocking: 0,
            buckets: [0; TIME_BUCKETS],
            wait_ns: 0,
            fit_buckets: [[0; TIME_BUCKETS]; FIT_CLASSES],
        };
        for &(class, calls, ns_each) in groups {
            s.fit_buckets[class][Log2Histogram::bucket_of(ns_each)] += calls;
        }
        s
    }

    #[test]
    fn a_fixed_flush_per_call_fits_as_a_fixed_cost_and_amplifies_4k() {
        // 100 µs whatever the size (a tenth of the 4 KiB calls took 140), plus 10 ns a page:
        // 4 KiB, 64 KiB and 2 MiB invalidations.
        let fixed = stats(&[(0, 900, 100_010), (0, 100, 140_000), (4, 100, 100_160), (9, 10, 105_120)]);
        let fit = fit(&fixed).unwrap();
        // Medians are known to within their log2 bucket: a factor of two.
        assert!((65_536.0..131_072.0).contains(&fit.fixed_ns), "{fit:?}");
        assert!(fit.per_page_ns.abs() < 10.0, "{fit:?}");
        // A page of a 4 KiB invalidation costs ~500x what it costs in a 2 MiB one.
        assert!(fit.amplification > 400.0, "{fit:?}");
        assert_eq!((fit.smallest_bytes, fit.largest_bytes), (4096, 2 << 20));
        // 1000 calls of about 100 µs against 110 others of about as much: most of the time.
        assert!((0.85..0.95).contains(&fit.smallest_time_share), "{fit:?}");
    }

    #[test]
    fn a_per_page_flush_has_no_fixed_cost_and_no_amplification() {
        let per_page = stats(&[(0, 1000, 1000), (4, 100, 16_000), (9, 10, 512_000)]);
        let fit = fit(&per_page).unwrap();
        assert!(fit.fixed_ns < 100.0, "{fit:?}");
        assert!(fit.amplification < 1.2, "{fit:?}");
    }

    #[test]
    fn one_stretched_call_does_not_make_a_per_page_cost_look_fixed() {
        // Seen in a 6.1 guest: a 40 µs/page flush, 17 calls of each size, one 4 KiB call
        // stretched to 7 ms. By means, a page of 4 KiB cost 12x one of 2 MiB.
        let per_page = stats(&[(0, 16, 100_000), (0, 1, 7_000_000), (9, 17, 20_580_000)]);
        let fit = fit(&per_page).unwrap();
        assert!(fit.amplification < 10.0, "{fit:?}");
        assert!((20_000.0..80_000.0).contains(&fit.per_page_ns), "{fit:?}");
    }

    #[test]
    fn a_cost_falling_with_size_fits_as_a_fixed_cost_never_a_negative_one() {
        // Small calls a little slower than large ones (a cold cache, say): no cost per page.
        let falling = stats(&[(0, 100, 200_000), (9, 100, 150_000)]);
        let fit = fit(&falling).unwrap();
        assert_eq!(fit.per_page_ns, 0.0, "{fit:?}");
        assert!((65_536.0..262_144.0).contains(&fit.fixed_ns), "{fit:?}");
    }

    #[test]
    fn one_size_class_cannot_be_fitted() {
        assert_eq!(fit(&stats(&[(0, 1000, 100_000)])), None);
    }

    #[test]
    fn percentile_bounds_are_bucket_upper_edges() {
        let mut buckets = [0u64; TIME_BUCKETS];
        buckets[10] = 99;
        buckets[20] = 1;
        let bound = |q| Log2Histogram::quantile_bound(&buckets, q);
        assert_eq!(bound(0.5), Some(2047));
        assert_eq!(bound(0.99), Some(2047));
        assert_eq!(bound(1.0), Some((1 << 21) - 1));
    }
}
