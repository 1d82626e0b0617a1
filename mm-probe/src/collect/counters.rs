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

/// Runs of the object's programs (those `wanted` by name) that the kernel skipped because
/// another tracing program was running on that CPU: bpf_prog_info.recursion_misses, shown in
/// each program fd's fdinfo since 5.12 (0 where the kernel does not show it).
pub fn recursion_misses(ebpf: &Ebpf, wanted: impl Fn(&str) -> bool) -> u64 {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    ebpf.programs()
        .filter(|(name, _)| wanted(name))
        .filter_map(|(_, program)| program.fd().ok())
        .filter_map(|fd| std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd())).ok())
        .filter_map(|info| {
            info.lines().find_map(|l| l.strip_prefix("recursion_misses:").and_then(|v| v.trim().parse::<u64>().ok()))
        })
        .sum()
}
