//! Reading the kernel side's tables into user space's totals: per-CPU values summed, stacks
//! symbolized, comms decoded.
//!
//! The invalidations, waits and stacks tables come in two generations. [`Drain::drain`]
//! switches the programs to the other generation, waits until no program can still be writing
//! the one it left (synchronize_rcu, through membarrier: every tracing program runs inside an
//! RCU read-side section), then adds that generation to the totals and empties it. So the
//! kernel tables hold at most one drain period's keys, however long the run, and the totals
//! lose nothing between two readings.

use std::{collections::HashMap, hash::Hash, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap, StackTraceMap},
};
use mm_probe_common::invalidations::{
    self as names, CallbackKey, CallbackStats, Counter, InvalidationKey, InvalidationStats, KvmLock, Relation,
    STACK_GENERATION_SHIFT, WaitKey, WaitStats,
};

use crate::{
    cause,
    collect::counters::{counted_since, percpu_sums},
    kernel::{Kallsyms, stacks},
};

/// How often the run loop drains: each kernel table then needs to hold one second's keys.
pub const DRAIN_PERIOD: Duration = Duration::from_secs(1);

/// Distinct wait groups user space keeps. Past it, a new group's waits are still counted, under
/// its lock and relation with no thread, name or stack (`folded_waits` says how many): the
/// totals of a run of weeks stay bounded by the machine's locks.
const MAX_WAIT_GROUPS: usize = 16384;

/// Everything counted since the probes attached.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    pub invalidations: HashMap<InvalidationKey, InvalidationStats>,
    /// Each key's `stack_id` is an index into `stacks`, or negative: not taken (unrelated
    /// contention), or the kernel's error when it could not be.
    pub waits: HashMap<WaitKey, WaitStats>,
    /// Waiters' stacks, symbolized, innermost first; shared, so that the copies of the totals
    /// each window keeps (the exporter's window start, `since`) do not copy them.
    pub stacks: Vec<Arc<[String]>>,
    pub kvm_locks: Vec<(u64, KvmLock)>,
    pub callbacks: HashMap<u64, CallbackStats>,
    pub counters: Vec<u64>,
    /// Waits counted without their thread, name and stack (user space's bound on groups).
    pub folded_waits: u64,
    /// The cause classifier's bracket ends without their begin, and begins its table refused
    /// (cumulative).
    pub cause_brackets_missed: u64,
    pub cause_begins_refused: u64,
}

impl Tables {
    pub fn counter(&self, counter: Counter) -> u64 {
        self.counters.get(counter as usize).copied().unwrap_or(0)
    }

    pub fn kvm_lock(&self, lock: u64) -> Option<&KvmLock> {
        self.kvm_locks.iter().find(|(address, _)| *address == lock).map(|(_, kvm)| kvm)
    }

    /// The functions of a wait's stack (`WaitKey::stack_id`); empty when none was kept.
    pub fn stack(&self, stack_id: i64) -> &[String] {
        usize::try_from(stack_id).ok().and_then(|i| self.stacks.get(i)).map_or(&[], |stack| stack)
    }

    /// What was counted since `earlier`, a reading of the same totals: each row less its
    /// earlier counts, rows with nothing new left out. Maxima do not subtract: a row's `max_ns`
    /// stays the largest since the probes attached. Stacks and VMs are kept whole (rows index
    /// them).
    pub fn since(&self, earlier: &Tables) -> Tables {
        Tables {
            invalidations: rows_since(&self.invalidations, &earlier.invalidations, sub_invalidation, |s| s.count),
            waits: rows_since(&self.waits, &earlier.waits, sub_wait, |s| s.count),
            stacks: self.stacks.clone(),
            kvm_locks: self.kvm_locks.clone(),
            callbacks: rows_since(&self.callbacks, &earlier.callbacks, sub_callback, |s| s.calls),
            counters: counted_since(&self.counters, &earlier.counters),
            folded_waits: self.folded_waits.saturating_sub(earlier.folded_waits),
            cause_brackets_missed: self.cause_brackets_missed.saturating_sub(earlier.cause_brackets_missed),
            cause_begins_refused: self.cause_begins_refused.saturating_sub(earlier.cause_begins_refused),
        }
    }

    fn add_waits(&mut self, drained: Vec<(WaitKey, WaitStats)>) {
        for (key, stats) in drained {
            let key = if self.waits.len() >= MAX_WAIT_GROUPS && !self.waits.contains_key(&key) {
                self.folded_waits += stats.count;
                WaitKey { stack_id: -1, tgid: 0, comm: [0; 16], ..key }
            } else {
                key
            };
            merge(&mut self.waits, key, stats, add_wait);
        }
    }
}

/// `now`'s rows less `earlier`'s, keeping those with a count left.
fn rows_since<K: Copy + Eq + Hash, V: Copy>(
    now: &HashMap<K, V>,
    earlier: &HashMap<K, V>,
    sub: fn(&mut V, &V),
    count: fn(&V) -> u64,
) -> HashMap<K, V> {
    let since = |(key, stats): (&K, &V)| {
        let mut row = *stats;
        if let Some(before) = earlier.get(key) {
            sub(&mut row, before);
        }
        (count(&row) > 0).then_some((*key, row))
    };
    now.iter().filter_map(since).collect()
}

fn merge<K: Eq + Hash, V>(into: &mut HashMap<K, V>, key: K, value: V, add: fn(&mut V, &V)) {
    match into.get_mut(&key) {
        Some(total) => add(total, &value),
        None => {
            into.insert(key, value);
        }
    }
}

/// The kernel tables' reader: the totals, the generation the programs write, and the stacks
/// symbolized so far.
#[derive(Default)]
pub struct Drain {
    pub totals: Tables,
    generation: u32,
    /// (generation << 32 | stack id) → index into `totals.stacks`.
    stack_index: HashMap<i64, usize>,
    interned: HashMap<Arc<[String]>, usize>,
}

impl Drain {
    /// Adds what the kernel counted since the last drain to the totals.
    pub fn drain(&mut self, ebpf: &mut Ebpf, kallsyms: Option<&Kallsyms>) -> Result<()> {
        let left = self.generation;
        self.generation ^= 1;
        let mut generation: Array<&mut MapData, u32> =
            Array::try_from(ebpf.map_mut(names::GENERATION_MAP).context("generation map missing")?)?;
        generation.set(0, self.generation, 0)?;
        wait_for_programs_in_flight();
        let slot = left as usize;
        let invalidations = take_percpu(ebpf, names::INVALIDATIONS_MAPS[slot], add_invalidation)?;
        for (key, stats) in invalidations {
            merge(&mut self.totals.invalidations, key, stats, add_invalidation);
        }
        self.take_stacks(ebpf, left, kallsyms)?;
        let waits = take_percpu::<WaitKey, WaitStats>(ebpf, names::WAITS_MAPS[slot], add_wait)?
            .into_iter()
            .map(|(key, stats)| (WaitKey { stack_id: self.stack_of(key.stack_id), ..key }, stats))
            .collect();
        self.totals.add_waits(waits);
        self.read_cumulative(ebpf)
    }

    /// The tables the kernel keeps cumulative (bounded by VMs and callbacks, not by time).
    fn read_cumulative(&mut self, ebpf: &Ebpf) -> Result<()> {
        let kvm_locks: BpfHashMap<&MapData, u64, KvmLock> =
            BpfHashMap::try_from(ebpf.map(names::KVM_LOCKS_MAP).context("kvm lock map missing")?)?;
        // Kept once learned: the kernel forgets a VM's lock once the VM is gone and its memory
        // is reused, but the waits counted on it before still need its name.
        for (lock, vm) in kvm_locks.iter().filter_map(Result::ok) {
            match self.totals.kvm_locks.iter_mut().find(|(known, _)| *known == lock) {
                Some(known) => known.1 = vm,
                None => self.totals.kvm_locks.push((lock, vm)),
            }
        }
        self.totals.callbacks = read_percpu(ebpf, names::CALLBACKS_MAP, add_callback)?
            .into_iter()
            .map(|(key, stats): (CallbackKey, CallbackStats)| (key.ip, stats))
            .collect();
        self.totals.counters = percpu_sums(ebpf, names::COUNTERS_MAP)?;
        self.totals.cause_brackets_missed = cause::probes::unmatched_ends(ebpf)?;
        self.totals.cause_begins_refused = cause::probes::refused_begins(ebpf)?;
        Ok(())
    }

    /// Symbolizes and interns every stack of generation `left`, then empties its map. A wait
    /// that began before a drain and ends after it refers to a stack taken out earlier, so the
    /// index keeps every id seen (ids are the stack's hash bucket: bounded by the map's size).
    fn take_stacks(&mut self, ebpf: &mut Ebpf, left: u32, kallsyms: Option<&Kallsyms>) -> Result<()> {
        let name = names::STACKS_MAPS[left as usize];
        let mut stacks = StackTraceMap::try_from(ebpf.map_mut(name).with_context(|| format!("{name} missing"))?)?;
        let ids: Vec<u32> = stacks.stack_ids().filter_map(Result::ok).collect();
        for id in ids {
            if let Ok(trace) = stacks.get(&id, 0) {
                let mut functions: Vec<String> = trace
                    .frames()
                    .iter()
                    .map(|f| {
                        kallsyms
                            .and_then(|k| k.symbolize(f.ip))
                            .map_or_else(|| format!("{:#x}", f.ip), |s| s.symbol.name.to_string())
                    })
                    .collect();
                functions.drain(..stacks::machinery_frames(&functions));
                let index = self.intern(functions);
                self.stack_index.insert(i64::from(id) | (i64::from(left) << STACK_GENERATION_SHIFT), index);
            }
            let _ = stacks.remove(&id);
        }
        Ok(())
    }

    fn intern(&mut self, functions: Vec<String>) -> usize {
        if let Some(&index) = self.interned.get(functions.as_slice()) {
            return index;
        }
        let index = self.totals.stacks.len();
        let stack: Arc<[String]> = functions.into();
        self.totals.stacks.push(Arc::clone(&stack));
        self.interned.insert(stack, index);
        index
    }

    /// A kernel stack id (generation in bit 32) as an index into the totals' stacks; negative
    /// ids (not taken, or the kernel's error) stay as they are.
    fn stack_of(&self, kernel_id: i64) -> i64 {
        if kernel_id < 0 {
            return kernel_id;
        }
        self.stack_index.get(&kernel_id).map_or(-1, |&i| i as i64)
    }
}

/// Waits until every program that may have read the old generation has returned: they run in
/// RCU read-side sections, and membarrier(MEMBARRIER_CMD_GLOBAL) is a synchronize_rcu(). It is
/// refused with nohz_full CPUs; a pause far longer than any program run stands in then.
fn wait_for_programs_in_flight() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let synchronized = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) } == 0;
    if !synchronized {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every entry of a per-CPU hash map, its CPUs' values folded into one with `add`.
fn read_percpu<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, name: &str, add: fn(&mut V, &V)) -> Result<Vec<(K, V)>> {
    let map: PerCpuHashMap<&MapData, K, V> =
        PerCpuHashMap::try_from(ebpf.map(name).with_context(|| format!("{name} missing from the object"))?)?;
    Ok(map.iter().filter_map(Result::ok).filter_map(|(key, per_cpu)| Some((key, fold(&per_cpu, add)?))).collect())
}

/// [`read_percpu`], emptying the map: for a generation no program writes any more.
fn take_percpu<K: aya::Pod, V: aya::Pod>(ebpf: &mut Ebpf, name: &str, add: fn(&mut V, &V)) -> Result<Vec<(K, V)>> {
    let mut map: PerCpuHashMap<&mut MapData, K, V> =
        PerCpuHashMap::try_from(ebpf.map_mut(name).with_context(|| format!("{name} missing from the object"))?)?;
    let keys: Vec<K> = map.keys().filter_map(Result::ok).collect();
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(per_cpu) = map.get(&key, 0)
            && let Some(sum) = fold(&per_cpu, add)
        {
            entries.push((key, sum));
        }
        let _ = map.remove(&key);
    }
    Ok(entries)
}

fn fold<V: aya::Pod>(per_cpu: &[V], add: fn(&mut V, &V)) -> Option<V> {
    let (first, rest) = per_cpu.split_first()?;
    let mut sum = *first;
    for value in rest {
        add(&mut sum, value);
    }
    Some(sum)
}

fn add_all(into: &mut [u64], from: &[u64]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

pub fn add_invalidation(into: &mut InvalidationStats, from: &InvalidationStats) {
    into.count += from.count;
    into.bytes += from.bytes;
    into.whole_mm += from.whole_mm;
    add_all(&mut into.sizes, &from.sizes);
    add_all(&mut into.durations, &from.durations);
    into.duration_ns += from.duration_ns;
    into.ended += from.ended;
}

pub fn add_wait(into: &mut WaitStats, from: &WaitStats) {
    into.count += from.count;
    into.wait_ns += from.wait_ns;
    into.max_ns = into.max_ns.max(from.max_ns);
    add_all(&mut into.buckets, &from.buckets);
}

fn add_callback(into: &mut CallbackStats, from: &CallbackStats) {
    into.calls += from.calls;
    into.total_ns += from.total_ns;
    into.max_ns = into.max_ns.max(from.max_ns);
    into.bytes += from.bytes;
    into.refused += from.refused;
    into.nonblocking += from.nonblocking;
    into.wait_ns += from.wait_ns;
    add_all(&mut into.buckets, &from.buckets);
    for (into, from) in into.fit_buckets.iter_mut().zip(&from.fit_buckets) {
        add_all(into, from);
    }
}

fn sub_invalidation(from: &mut InvalidationStats, earlier: &InvalidationStats) {
    from.count = from.count.saturating_sub(earlier.count);
    from.bytes = from.bytes.saturating_sub(earlier.bytes);
    from.whole_mm = from.whole_mm.saturating_sub(earlier.whole_mm);
    sub_all(&mut from.sizes, &earlier.sizes);
    sub_all(&mut from.durations, &earlier.durations);
    from.duration_ns = from.duration_ns.saturating_sub(earlier.duration_ns);
    from.ended = from.ended.saturating_sub(earlier.ended);
}

fn sub_wait(from: &mut WaitStats, earlier: &WaitStats) {
    from.count = from.count.saturating_sub(earlier.count);
    from.wait_ns = from.wait_ns.saturating_sub(earlier.wait_ns);
    sub_all(&mut from.buckets, &earlier.buckets);
}

fn sub_callback(from: &mut CallbackStats, earlier: &CallbackStats) {
    from.calls = from.calls.saturating_sub(earlier.calls);
    from.total_ns = from.total_ns.saturating_sub(earlier.total_ns);
    from.bytes = from.bytes.saturating_sub(earlier.bytes);
    from.refused = from.refused.saturating_sub(earlier.refused);
    from.nonblocking = from.nonblocking.saturating_sub(earlier.nonblocking);
    from.wait_ns = from.wait_ns.saturating_sub(earlier.wait_ns);
    sub_all(&mut from.buckets, &earlier.buckets);
    for (from, earlier) in from.fit_buckets.iter_mut().zip(&earlier.fit_buckets) {
        sub_all(from, earlier);
    }
}

fn sub_all(from: &mut [u64], earlier: &[u64]) {
    for (a, b) in from.iter_mut().zip(earlier) {
        *a = a.saturating_sub(*b);
    }
}

/// A wait's relation to invalidations, from its key.
pub fn relation_of(key: &WaitKey) -> Relation {
    match key.relation {
        1 => Relation::VmLock,
        2 => Relation::InInvalidation,
        3 => Relation::SubscribedMm,
        4 => Relation::Watched,
        _ => Relation::Unrelated,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mm_probe_common::invalidations::TIME_BUCKETS;

    use super::*;

    fn wait(lock: u64, tgid: u32, count: u64) -> (WaitKey, WaitStats) {
        let key = WaitKey {
            lock,
            stack_id: 3,
            flags: 0,
            tgid,
            class: 0,
            relation: Relation::VmLock as u32,
            comm: [b'a'; 16],
            cause: Default::default(),
        };
        (key, WaitStats { count, wait_ns: count * 10, max_ns: 10, buckets: [0; TIME_BUCKETS] })
    }

    #[test]
    fn drained_waits_add_up_across_drains() {
        let mut tables = Tables::default();
        tables.add_waits(vec![wait(1, 7, 2)]);
        tables.add_waits(vec![wait(1, 7, 3), wait(2, 7, 1)]);
        let total: u64 = tables.waits.values().map(|s| s.count).sum();
        assert_eq!((tables.waits.len(), total), (2, 6));
        assert_eq!(tables.folded_waits, 0);
    }

    #[test]
    fn past_the_bound_new_groups_fold_but_every_wait_is_counted() {
        let mut tables = Tables::default();
        tables.add_waits((0..MAX_WAIT_GROUPS as u32).map(|tgid| wait(1, tgid, 1)).collect());
        // Thousands of new processes waiting on the same lock: one folded group more.
        tables.add_waits((0..1000).map(|tgid| wait(1, 1_000_000 + tgid, 2)).collect());
        let total: u64 = tables.waits.values().map(|s| s.count).sum();
        assert_eq!(total, MAX_WAIT_GROUPS as u64 + 2000);
        assert_eq!(tables.waits.len(), MAX_WAIT_GROUPS + 1);
        assert_eq!(tables.folded_waits, 2000);
        // A group already known keeps its own row.
        tables.add_waits(vec![wait(1, 5, 1)]);
        assert_eq!(tables.folded_waits, 2000);
    }

    #[test]
    fn a_window_is_what_was_counted_since_its_start() {
        let mut earlier = Tables { counters: vec![4, 1], folded_waits: 1, ..Tables::default() };
        earlier.add_waits(vec![wait(1, 7, 2), wait(2, 7, 5)]);
        let mut now = earlier.clone();
        now.add_waits(vec![wait(1, 7, 3), wait(3, 8, 1)]);
        now.counters = vec![10, 1, 2];
        now.folded_waits = 3;
        let window = now.since(&earlier);
        let counts: BTreeMap<u64, u64> = window.waits.iter().map(|(k, s)| (k.lock, s.count)).collect();
        // Lock 2 counted nothing new: left out, not a row of zeros.
        assert_eq!(counts, BTreeMap::from([(1, 3), (3, 1)]));
        assert_eq!(window.waits.values().map(|s| s.wait_ns).sum::<u64>(), 40);
        assert_eq!((window.counters, window.folded_waits), (vec![6, 0, 2], 2));
        assert!(now.since(&now).waits.is_empty());
    }

    #[test]
    fn a_stack_is_found_whichever_generation_took_it() {
        let mut drain = Drain::default();
        let index = drain.intern(vec!["kvm_mmu_notifier_invalidate_range_start".into()]);
        drain.stack_index.insert(5 | (1 << STACK_GENERATION_SHIFT), index);
        assert_eq!(drain.stack_of(5 | (1 << STACK_GENERATION_SHIFT)), index as i64);
        assert_eq!(drain.stack_of(5), -1, "generation 0's id 5 was never seen");
        assert_eq!(drain.stack_of(mm_probe_common::invalidations::STACK_NOT_TAKEN), i64::MIN);
        assert_eq!(drain.intern(vec!["kvm_mmu_notifier_invalidate_range_start".into()]), index);
    }
}
