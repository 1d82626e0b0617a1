//! Records shared by the thp-why programs (`mm-probe-ebpf/src/thp_why.rs`) and user space
//! (`mm-probe/src/thp_why/live.rs`).
//!
//! The kernel side only gathers raw facts: every THP allow-check on the target's mm is counted in
//! a hash map keyed by what the kernel was asked and what it answered ([`ThpCheckKey`]); user
//! space decodes the call type and judges the reason.

use crate::slots;

/// Global: the thread-group id of the process being examined.
pub const TARGET_TGID: &str = "THP_TARGET_TGID";
/// Global: mm-probe's own tgid, whose reads of /proc/PID/smaps(_rollup) reveal other processes'
/// mm pointers and flags, and whose own smaps-driven allow-checks are not the workload's.
pub const SELF_TGID: &str = "THP_SELF_TGID";
/// Global: bit `i` set when argument `i` (2..=5) of the allow-check function says which caller
/// made the check (`smaps`/`in_pf`/`enforce_sysfs`, `tva_flags` or `type`), as named in BTF.
pub const CALL_ARG_MASK: &str = "THP_CALL_ARG_MASK";
/// Global: 1 = count allow-checks on every mm, keyed without the VMA's addresses (so the key
/// set stays small system-wide); 0 (default) = only the target's mm, keyed per VMA.
pub const EVERY_MM: &str = "THP_EVERY_MM";
/// Global: the vm_flags bits worth keeping in a key (the rest would only split keys).
pub const VM_FLAGS_MASK: &str = "THP_VM_FLAGS_MASK";
/// Global: the mm->flags bits worth keeping (the THP-disable bits of this kernel).
pub const MM_FLAGS_MASK: &str = "THP_MM_FLAGS_MASK";
/// Globals: byte offsets of tracepoint fields, read from tracefs `format` files at start-up.
pub const FAULT_ADDRESS_OFFSET: &str = "THP_FAULT_ADDRESS_OFFSET";
pub const PRCTL_OPTION_OFFSET: &str = "THP_PRCTL_OPTION_OFFSET";
pub const PRCTL_ARG2_OFFSET: &str = "THP_PRCTL_ARG2_OFFSET";
pub const PRCTL_ARG3_OFFSET: &str = "THP_PRCTL_ARG3_OFFSET";
pub const MMAP_LOCK_MM_OFFSET: &str = "THP_MMAP_LOCK_MM_OFFSET";
pub const SCAN_PMD_MM_OFFSET: &str = "THP_SCAN_PMD_MM_OFFSET";
pub const SCAN_PMD_STATUS_OFFSET: &str = "THP_SCAN_PMD_STATUS_OFFSET";
pub const SCAN_FILE_MM_OFFSET: &str = "THP_SCAN_FILE_MM_OFFSET";
pub const SCAN_FILE_RESULT_OFFSET: &str = "THP_SCAN_FILE_RESULT_OFFSET";

/// Hash map [`ThpCheckKey`] → number of allow-checks with exactly those facts.
pub const CHECKS_MAP: &str = "THP_CHECKS";
/// Hash map (fault address >> FAULT_BLOCK_SHIFT) → [`FaultBlock`]: the target's page faults in
/// each 64 KiB of that 2 MiB.
pub const FAULTS_MAP: &str = "THP_FAULTS";
/// Per-CPU array of one [`FaultRun`]: faults counted but not yet added to `THP_FAULTS`.
pub const FAULT_RUN_MAP: &str = "THP_FAULT_RUN";
/// Array of [`MmSeen`], indexed by [`MmSlot`].
pub const MM_MAP: &str = "THP_MM";
/// Ring buffer of [`PrctlEvent`].
pub const PRCTL_EVENTS: &str = "THP_PRCTL_EVENTS";
/// Per-CPU array of collapse scan results on the target's mm, indexed by [`collapse_slot`].
pub const COLLAPSE_MAP: &str = "THP_COLLAPSE";
/// Per-CPU array of counters, indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "THP_COUNTERS";

/// prctl option numbers (uapi linux/prctl.h), the same on every version.
pub const PR_SET_THP_DISABLE: u64 = 41;

/// Faults are counted per 64 KiB (`address >> FAULT_RANGE_SHIFT`): fine enough to credit them to
/// the right VMA (VMAs are page-aligned, rarely smaller).
pub const FAULT_RANGE_SHIFT: u32 = 16;
/// ... and kept per 2 MiB block of those ranges (`address >> FAULT_BLOCK_SHIFT`), so that the
/// fault map is updated once per block touched.
pub const FAULT_BLOCK_SHIFT: u32 = 21;
pub const RANGES_PER_BLOCK: usize = 1 << (FAULT_BLOCK_SHIFT - FAULT_RANGE_SHIFT);

/// One kind of allow-check: every field is a raw value the kernel had, masked by user space's
/// globals. Explicit padding keeps the key's bytes fully defined (hash keys compare bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ThpCheckKey {
    pub vm_start: u64,
    pub vm_end: u64,
    /// The `vm_flags` argument, masked by `VM_FLAGS_MASK`.
    pub vm_flags: u64,
    /// `vma->vm_mm->flags` (first word), masked by `MM_FLAGS_MASK`.
    pub mm_flags: u64,
    /// What the function returned: a bool before 6.8, a bitmask of allowed orders since.
    pub ret: u64,
    /// Low byte of arguments 2..=5 where `CALL_ARG_MASK` marks them, else 0.
    pub call_args: [u8; 4],
    pub _pad: u32,
}

/// Faults in one 2 MiB block, per 64 KiB range (index: `(address >> FAULT_RANGE_SHIFT) % 32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultBlock {
    pub faults: [u64; RANGES_PER_BLOCK],
}

/// The target's latest faults on one CPU, all in one 2 MiB block: a page-by-page toucher faults
/// 512 times in a row per block, and counting those here costs a per-CPU array slot instead of a
/// hash update per fault (the hash update, missing the caches, cost more than the rest of the
/// program). The run is added to `THP_FAULTS` when a fault lands in another block; user space
/// adds the runs still open when it reads. A run with no faults counted is no run.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultRun {
    /// `address >> FAULT_BLOCK_SHIFT` of the run's faults.
    pub block: u64,
    pub ranges: FaultBlock,
}

/// A process's mm as a kernel program saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmSeen {
    /// `struct mm_struct *` (only compared, never dereferenced by user space).
    pub mm: u64,
    /// `mm->flags` (first word), unmasked.
    pub flags: u64,
    /// How many times the slot was written.
    pub updates: u64,
}

slots! {
    pub enum MmSlot {
        /// The target's mm, learned in the target's own context (page fault, mmap_lock,
        /// allow-check) or written by user space from a probe read. The allow-check filter
        /// compares against it.
        Target => "target",
        /// The last mm other than its own that mm-probe locked: user space reads
        /// /proc/PID/smaps_rollup of one process, then this slot, to learn that process's mm
        /// flags from the kernel.
        Probe => "probe",
    }
}

pub const MM_SLOT_COUNT: u32 = MmSlot::COUNT;

/// A prctl(PR_SET_THP_DISABLE, …) call by any process while mm-probe runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PrctlEvent {
    pub tgid: u32,
    pub pid: u32,
    pub arg2: u64,
    pub arg3: u64,
    /// The caller's mm->flags before the call.
    pub mm_flags_before: u64,
    pub comm: [u8; 16],
}

slots! {
    /// Slots of [`COUNTERS_MAP`]; `name` is the key of thp-why's `live.counters`.
    pub enum Counter {
        /// Faults not added to `THP_FAULTS` because the map was full (the target's faults are
        /// the map's sum plus these).
        FaultMapFull => "fault_map_full",
        /// Allow-checks on the target's mm (made by any task, khugepaged included); with
        /// [`EVERY_MM`], on every mm.
        TargetChecks => "target_checks",
        /// Allow-checks on the target's mm made by mm-probe reading smaps: not the workload's.
        OwnChecks => "own_smaps_checks",
        /// Checks not added to `THP_CHECKS` because the map was full.
        CheckMapFull => "check_map_full",
        /// prctl events lost because the ring buffer was full.
        PrctlLost => "prctl_lost",
        /// kretprobe runs without the matching kprobe entry (entry missed): not counted.
        ReturnWithoutEntry => "return_without_entry",
        /// Allow-checks on any mm: proves the probe fires at all.
        AllChecks => "all_checks",
        /// Allow-checks made before the target's mm was known: not attributable.
        MmUnknown => "mm_unknown",
        /// Collapse scans (khugepaged or MADV_COLLAPSE) of other processes' memory: proves the
        /// scan tracepoints fire, and that khugepaged was busy elsewhere when the target got none.
        OtherMmScans => "other_mm_scans",
    }
}

pub const COUNTER_COUNT: u32 = Counter::COUNT;

/// Arguments the kprobe saves at entry for its kretprobe (the kprobe+kretprobe fallback).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingCheck {
    pub vma: u64,
    pub vm_flags: u64,
    pub call_args: [u8; 4],
    pub _pad: u32,
}

/// Which collapse scan a result comes from: khugepaged's (or MADV_COLLAPSE's) scan of anonymous
/// PMD ranges, or of file and shmem ranges.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScanPath {
    Anon = 0,
    File = 1,
}

/// Who asked for the scan: khugepaged (a kernel thread, no mm of its own), or the process's own
/// madvise(MADV_COLLAPSE) (6.1+), which runs the same scan in the caller's context.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScanOrigin {
    Khugepaged = 0,
    Madvise = 1,
}

/// Scan results kept per (path, origin): `enum scan_result` has 31 values in 6.18; a result
/// past the last slot is counted in the last one (user space reports it as unknown).
pub const SCAN_RESULT_SLOTS: u32 = 64;
pub const COLLAPSE_SLOT_COUNT: u32 = 4 * SCAN_RESULT_SLOTS;

/// The `COLLAPSE_MAP` slot of one scan result: the kernel's raw number, never decoded here (the
/// numbering moves between versions; user space names it from BTF or tracefs).
pub const fn collapse_slot(path: ScanPath, origin: ScanOrigin, result: u32) -> u32 {
    let result = if result < SCAN_RESULT_SLOTS { result } else { SCAN_RESULT_SLOTS - 1 };
    ((path as u32) * 2 + origin as u32) * SCAN_RESULT_SLOTS + result
}

/// The inverse of [`collapse_slot`].
pub const fn collapse_slot_parts(slot: u32) -> (ScanPath, ScanOrigin, u32) {
    let group = slot / SCAN_RESULT_SLOTS;
    let path = if group / 2 == 0 { ScanPath::Anon } else { ScanPath::File };
    let origin = if group.is_multiple_of(2) { ScanOrigin::Khugepaged } else { ScanOrigin::Madvise };
    (path, origin, slot % SCAN_RESULT_SLOTS)
}

crate::user_pod!(ThpCheckKey, MmSeen, PrctlEvent, FaultBlock, FaultRun);
