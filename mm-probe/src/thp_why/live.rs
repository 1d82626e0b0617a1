//! The live side: thp-why's settings for its kernel programs (which the run driver loads), their
//! attach through the planner, mm pointers and flags learned through them, and the raw counts
//! read back (allow-check keys, faults per 2 MiB range, prctl calls, counters).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, PerCpuHashMap},
};
use mm_probe_common::thp::{
    self as names, Counter, FAULT_BLOCK_SHIFT, FAULT_RANGE_SHIFT, FaultBlock, FaultRun, MmSeen, MmSlot, PrctlEvent,
    ThpCheckKey,
};

use super::{
    checks::AllowCheck,
    facts::vm_flags,
    probes,
    procfs::Proc,
    report::{Counters, LiveCounter},
};
use crate::{
    collect::{RingReader, counters::percpu_sums},
    kernel::{Kernel, tracefs},
    probes::{GlobalValue, LogicalProbe, Plan},
};

/// What the kernel programs counted, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub checks: Vec<(ThpCheckKey, u64)>,
    /// (address >> FAULT_RANGE_SHIFT, faults), ascending
    pub fault_ranges: Vec<(u64, u64)>,
    pub counters: Counters,
    /// (`collapse_slot`, scans), slots with none left out.
    pub collapse: Vec<(u32, u64)>,
}

impl Counts {
    pub fn counter(&self, counter: Counter) -> u64 {
        self.counters.get(counter)
    }
}

/// The programs attached to a loaded object, with what they are read through: the prctl ring
/// and the mm table, taken out of the object.
pub struct Live {
    pub plan: Plan,
    prctl: Option<RingReader<PrctlEvent>>,
    mm: Array<MapData, MmSeen>,
}

/// Tracepoint field offsets the programs read; defaults are the x86-64 layouts of 6.1–6.18.
fn tracepoint_offsets() -> Vec<(&'static str, GlobalValue)> {
    let root = tracefs::root().ok();
    let offset = |category, event, field, default| {
        let found = root.as_deref().and_then(|r| tracefs::field_offset(r, category, event, field));
        GlobalValue::U32(found.unwrap_or(default))
    };
    vec![
        (names::FAULT_ADDRESS_OFFSET, offset("exceptions", "page_fault_user", "address", 8)),
        (names::PRCTL_OPTION_OFFSET, offset("syscalls", "sys_enter_prctl", "option", 16)),
        (names::PRCTL_ARG2_OFFSET, offset("syscalls", "sys_enter_prctl", "arg2", 24)),
        (names::PRCTL_ARG3_OFFSET, offset("syscalls", "sys_enter_prctl", "arg3", 32)),
        (names::MMAP_LOCK_MM_OFFSET, offset("mmap_lock", "mmap_lock_start_locking", "mm", 8)),
        (names::SCAN_PMD_MM_OFFSET, offset("huge_memory", "mm_khugepaged_scan_pmd", "mm", 8)),
        (names::SCAN_PMD_STATUS_OFFSET, offset("huge_memory", "mm_khugepaged_scan_pmd", "status", 32)),
        (names::SCAN_FILE_MM_OFFSET, offset("huge_memory", "mm_khugepaged_scan_file", "mm", 8)),
        (names::SCAN_FILE_RESULT_OFFSET, offset("huge_memory", "mm_khugepaged_scan_file", "result", 36)),
    ]
}

/// Globals: whose checks and faults to count, how the allow-check's arguments name the caller,
/// which flag bits to keep, and this kernel's tracepoint field offsets.
pub fn settings(target_tgid: u32, allow_check: &AllowCheck, mm_flags_mask: u64) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = vec![
        (names::TARGET_TGID, GlobalValue::U32(target_tgid)),
        (names::SELF_TGID, GlobalValue::U32(std::process::id())),
        (names::CALL_ARG_MASK, GlobalValue::U32(allow_check.encoding.arg_mask())),
        (names::VM_FLAGS_MASK, GlobalValue::U64(vm_flags::KEPT)),
        (names::MM_FLAGS_MASK, GlobalValue::U64(mm_flags_mask)),
    ];
    settings.extend(tracepoint_offsets());
    settings
}

/// What the kernel programs of a loaded object counted so far, summed over CPUs. Faults of the
/// runs still open on each CPU are included; the sum is exact once the fault program is
/// detached (while it runs, a run closing between the reads could be counted twice).
pub fn read_counts(ebpf: &Ebpf) -> Result<Counts> {
    let checks_map: PerCpuHashMap<&MapData, ThpCheckKey, u64> =
        PerCpuHashMap::try_from(ebpf.map(names::CHECKS_MAP).context("checks map missing")?)?;
    let checks = checks_map.iter().filter_map(Result::ok).map(|(key, values)| (key, values.iter().sum())).collect();
    let faults_map: PerCpuHashMap<&MapData, u64, FaultBlock> =
        PerCpuHashMap::try_from(ebpf.map(names::FAULTS_MAP).context("faults map missing")?)?;
    let mut per_range = BTreeMap::new();
    for (block, per_cpu) in faults_map.iter().filter_map(Result::ok) {
        for counts in per_cpu.iter() {
            add_block(&mut per_range, block, counts);
        }
    }
    for run in open_fault_runs(ebpf)? {
        add_block(&mut per_range, run.block, &run.ranges);
    }
    let sums = percpu_sums(ebpf, names::COUNTERS_MAP)?;
    let counter = |c: Counter| sums.get(c as usize).copied().unwrap_or(0);
    let mut counters: BTreeMap<LiveCounter, u64> =
        Counter::ALL.iter().map(|&c| (LiveCounter::Kernel(c), counter(c))).collect();
    // Every fault of the target is in the map, or counted as not fitting.
    let faults = per_range.values().sum::<u64>() + counter(Counter::FaultMapFull);
    counters.insert(LiveCounter::Faults, faults);
    let collapse = percpu_sums(ebpf, names::COLLAPSE_MAP)?
        .into_iter()
        .enumerate()
        .filter(|(_, scans)| *scans > 0)
        .map(|(slot, scans)| (slot as u32, scans))
        .collect();
    Ok(Counts { checks, fault_ranges: per_range.into_iter().collect(), counters: Counters(counters), collapse })
}

/// Adds one CPU's counts for a 2 MiB block to the per-64 KiB totals (ranges with no fault stay
/// out).
fn add_block(per_range: &mut BTreeMap<u64, u64>, block: u64, counts: &FaultBlock) {
    let first_range = block << (FAULT_BLOCK_SHIFT - FAULT_RANGE_SHIFT);
    for (offset, &faults) in counts.faults.iter().enumerate().filter(|(_, faults)| **faults != 0) {
        *per_range.entry(first_range + offset as u64).or_default() += faults;
    }
}

/// Each CPU's run of faults not yet added to the fault map (see `FaultRun`).
fn open_fault_runs(ebpf: &Ebpf) -> Result<Vec<FaultRun>> {
    let runs: PerCpuArray<&MapData, FaultRun> =
        PerCpuArray::try_from(ebpf.map(names::FAULT_RUN_MAP).context("fault run map missing")?)?;
    Ok(runs.get(&0, 0)?.iter().copied().collect())
}

impl Live {
    /// Attaches what it can of `catalog` to an object loaded with [`settings`]; the plan says
    /// what did not. The prctl ring is read only when its probe attached, and then a tokio
    /// reactor must be running.
    pub fn attach(kernel: &Kernel, ebpf: &mut Ebpf, catalog: &[LogicalProbe]) -> Result<Self> {
        let plan = probes::attach_catalog(kernel, ebpf, catalog);
        let prctl = if plan.is_attached(probes::PRCTL.name) {
            let map = ebpf.take_map(names::PRCTL_EVENTS).context("prctl ring buffer missing from the object")?;
            Some(RingReader::new(map)?)
        } else {
            None
        };
        let mm = Array::try_from(ebpf.take_map(names::MM_MAP).context("mm map missing from the object")?)?;
        Ok(Self { plan, prctl, mm })
    }

    /// The kernel's view of `proc`'s mm: clear the probe slot, read its smaps_rollup (which takes
    /// its mmap lock once, firing mmap_lock_start_locking in this process), read the slot back.
    /// `None` when the tracepoint is not attached or the process has no mm.
    pub fn probe_mm(&mut self, proc: &Proc) -> Option<MmSeen> {
        if !self.plan.is_attached(probes::MMAP_LOCK.name) {
            return None;
        }
        self.mm.set(MmSlot::Probe as u32, MmSeen::default(), 0).ok()?;
        proc.touch_smaps_rollup().ok()?;
        let seen = self.mm.get(&(MmSlot::Probe as u32), 0).ok()?;
        (seen.mm != 0).then_some(seen)
    }

    /// Tells the allow-check filter the target's mm, unless a program already learned it in the
    /// target's own context.
    pub fn offer_target_mm(&mut self, seen: MmSeen) -> Result<()> {
        if self.target_mm()?.mm == 0 {
            self.mm.set(MmSlot::Target as u32, seen, 0)?;
        }
        Ok(())
    }

    /// The target's mm as the programs know it (zero until one learned it).
    pub fn target_mm(&self) -> Result<MmSeen> {
        Ok(self.mm.get(&(MmSlot::Target as u32), 0)?)
    }

    /// prctl(PR_SET_THP_DISABLE) calls seen so far.
    pub fn drain_prctl(&mut self, into: &mut Vec<PrctlEvent>) {
        if let Some(reader) = self.prctl.as_mut() {
            reader.drain_now(|e| into.push(e));
        }
    }

    /// Waits for prctl events (for the run loop); pending forever without the tracepoint.
    pub async fn next_prctl(&mut self, into: &mut Vec<PrctlEvent>) -> Result<()> {
        match self.prctl.as_mut() {
            Some(reader) => reader.read(|e| into.push(e)).await.map(drop),
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CPUs counted faults in one block (summed), a third CPU's open run adds to a range
    /// of it, and ranges without faults stay out.
    #[test]
    fn blocks_become_per_64k_ranges_summed_over_cpus() {
        let block = 0x7f00_0000_0000u64 >> FAULT_BLOCK_SHIFT;
        let first = block << (FAULT_BLOCK_SHIFT - FAULT_RANGE_SHIFT);
        let counts = |pairs: &[(usize, u64)]| {
            let mut b = FaultBlock::default();
            for &(i, n) in pairs {
                b.faults[i] = n;
            }
            b
        };
        let mut per_range = BTreeMap::new();
        add_block(&mut per_range, block, &counts(&[(0, 16), (1, 16)]));
        add_block(&mut per_range, block, &counts(&[(1, 4)]));
        add_block(&mut per_range, block, &counts(&[(31, 3)]));
        assert_eq!(per_range, BTreeMap::from([(first, 16), (first + 1, 20), (first + 31, 3)]));
    }
}
