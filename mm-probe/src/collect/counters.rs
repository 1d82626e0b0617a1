//! Per-CPU counters kept by the kernel programs (events, lost events, denials…).

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};

/// Sum over all CPUs of slot `index` of the per-CPU array `map`.
pub fn percpu_sum(ebpf: &Ebpf, map: &str, index: u32) -> Result<u64> {
    let array: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(map).with_context(|| format!("map {map} missing from the object"))?)?;
    Ok(array.get(&index, 0)?.iter().sum())
}

/// Sums of every slot of the per-CPU array `map`.
pub fn percpu_sums(ebpf: &Ebpf, map: &str) -> Result<Vec<u64>> {
    let array: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(map).with_context(|| format!("map {map} missing from the object"))?)?;
    (0..array.len()).map(|i| Ok(array.get(&i, 0)?.iter().sum())).collect()
}
