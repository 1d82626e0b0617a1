//! Per-CPU counters kept by the kernel programs (events, lost events, denials…).

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
    programs::Program,
};

use crate::kernel::release::Release;

/// What cumulative kernel counters (or log2 buckets) gained since `earlier`, slot by slot; a slot
/// `earlier` lacks counts from 0, and a counter that went backwards (a reloaded object) gains 0.
pub fn counted_since(now: &[u64], earlier: &[u64]) -> Vec<u64> {
    now.iter().enumerate().map(|(i, v)| v.saturating_sub(earlier.get(i).copied().unwrap_or(0))).collect()
}

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

/// Runs of the object's programs (those `wanted` by name) that the kernel skipped because the
/// CPU's guard was taken (another tracing program, or a map syscall preempted on that CPU):
/// bpf_prog_info.recursion_misses, shown in each program fd's fdinfo since 5.12 (0 where the
/// kernel does not show it). See [`program_runs_skipped`] for the kernels where it is complete.
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

/// [`recursion_misses`] where it is the whole count, else `None` (unknown, not 0): kprobe and
/// classic tracepoint programs share trace_call_bpf's per-CPU guard, whose skips are counted
/// only since 6.7; fentry/fexit (5.12) and raw or BTF tracepoints count theirs.
pub fn program_runs_skipped(release: &Release, ebpf: &Ebpf, wanted: impl Fn(&str) -> bool) -> Option<u64> {
    let uncounted = |program: &Program| matches!(program, Program::KProbe(_) | Program::TracePoint(_));
    let any_uncounted =
        ebpf.programs().any(|(name, program)| wanted(name) && program.fd().is_ok() && uncounted(program));
    (release.at_least(6, 7) || !any_uncounted).then(|| recursion_misses(ebpf, wanted))
}
