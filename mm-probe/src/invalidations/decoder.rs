//! Reading the kernel side's tables: per-CPU values summed, stacks symbolized, comms decoded.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap, StackTraceMap},
};
use mm_probe_common::invalidations::{
    self as names, CallbackKey, CallbackStats, Counter, InvalidationKey, InvalidationStats, KvmLock, WaitKey, WaitStats,
};

use crate::{collect::counters::percpu_sums, kernel::Kallsyms};

/// Everything the kernel side counted so far (cumulative since attach).
#[derive(Clone, Debug, Default)]
pub struct Tables {
    pub invalidations: Vec<(InvalidationKey, InvalidationStats)>,
    pub waits: Vec<(WaitKey, WaitStats)>,
    pub kvm_locks: Vec<(u64, KvmLock)>,
    pub callbacks: Vec<(u64, CallbackStats)>,
    pub counters: Vec<u64>,
}

impl Tables {
    pub fn counter(&self, counter: Counter) -> u64 {
        self.counters.get(counter as usize).copied().unwrap_or(0)
    }

    pub fn kvm_lock(&self, lock: u64) -> Option<&KvmLock> {
        self.kvm_locks.iter().find(|(address, _)| *address == lock).map(|(_, kvm)| kvm)
    }
}

pub fn read_tables(ebpf: &Ebpf) -> Result<Tables> {
    Ok(Tables {
        invalidations: read_percpu(ebpf, names::INVALIDATIONS_MAP, add_invalidation)?,
        waits: read_percpu(ebpf, names::WAITS_MAP, add_wait)?,
        kvm_locks: {
            let map: BpfHashMap<&MapData, u64, KvmLock> =
                BpfHashMap::try_from(ebpf.map(names::KVM_LOCKS_MAP).context("kvm lock map missing")?)?;
            map.iter().filter_map(Result::ok).collect()
        },
        callbacks: read_percpu(ebpf, names::CALLBACKS_MAP, add_callback)?
            .into_iter()
            .map(|(key, stats): (CallbackKey, CallbackStats)| (key.ip, stats))
            .collect(),
        counters: percpu_sums(ebpf, names::COUNTERS_MAP)?,
    })
}

/// Every entry of a per-CPU hash map, its CPUs' values folded into one with `add`.
fn read_percpu<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, name: &str, add: fn(&mut V, &V)) -> Result<Vec<(K, V)>> {
    let map: PerCpuHashMap<&MapData, K, V> =
        PerCpuHashMap::try_from(ebpf.map(name).with_context(|| format!("{name} missing from the object"))?)?;
    let mut entries = Vec::new();
    for (key, per_cpu) in map.iter().filter_map(Result::ok) {
        let mut values = per_cpu.iter();
        let Some(first) = values.next() else { continue };
        let mut sum = *first;
        for value in values {
            add(&mut sum, value);
        }
        entries.push((key, sum));
    }
    Ok(entries)
}

fn add_all(into: &mut [u64], from: &[u64]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

fn add_invalidation(into: &mut InvalidationStats, from: &InvalidationStats) {
    into.count += from.count;
    into.bytes += from.bytes;
    add_all(&mut into.sizes, &from.sizes);
    add_all(&mut into.durations, &from.durations);
    into.duration_ns += from.duration_ns;
    into.ended += from.ended;
}

fn add_wait(into: &mut WaitStats, from: &WaitStats) {
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

/// The function names of a waiter's stack, innermost first; empty when it was not taken.
pub fn stack_functions(ebpf: &Ebpf, stack_id: i64, kallsyms: Option<&Kallsyms>) -> Vec<String> {
    let (Ok(id), Some(kallsyms)) = (u32::try_from(stack_id), kallsyms) else { return Vec::new() };
    let Some(map) = ebpf.map(names::STACKS_MAP) else { return Vec::new() };
    let Ok(stacks) = StackTraceMap::try_from(map) else { return Vec::new() };
    let Ok(trace) = stacks.get(&id, 0) else { return Vec::new() };
    trace
        .frames()
        .iter()
        .map(|frame| kallsyms.symbolize(frame.ip).map_or_else(|| format!("{:#x}", frame.ip), |s| s.symbol.name.clone()))
        .collect()
}
