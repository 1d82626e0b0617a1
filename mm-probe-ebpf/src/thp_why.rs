//! thp-why's kernel programs: the THP allow-check on the target's mm, the target's page faults,
//! prctl(PR_SET_THP_DISABLE) calls, the mm pointer and flags of processes whose mmap lock
//! mm-probe takes, and khugepaged's collapse scans of the target's memory. They count and copy
//! raw facts; user space decodes and judges.
//!
//! Allow-check prototypes, read from the kernel sources (see docs/kernel-facts.md#thp-allow-check):
//!   6.0–6.7  bool hugepage_vma_check(struct vm_area_struct *vma, unsigned long vm_flags,
//!                                    bool smaps, bool in_pf, bool enforce_sysfs)
//!   6.8–6.9  unsigned long __thp_vma_allowable_orders(vma, vm_flags, bool smaps, bool in_pf,
//!                                    bool enforce_sysfs, unsigned long orders)
//!   6.10–6.17 __thp_vma_allowable_orders(vma, vm_flags, unsigned long tva_flags, orders)
//!   6.18+    __thp_vma_allowable_orders(vma, vm_flags_t vm_flags, enum tva_type type, orders)
//! Which arguments name the caller is decided by user space from BTF (`THP_CALL_ARG_MASK`).

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        generated::{bpf_get_current_task_btf, bpf_get_func_arg},
    },
    macros::{btf_tracepoint, fexit, kprobe, kretprobe, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use mm_probe_common::thp::{
    COLLAPSE_SLOT_COUNT, COUNTER_COUNT, Counter, FAULT_BLOCK_SHIFT, FAULT_RANGE_SHIFT, FaultBlock, FaultRun,
    MM_SLOT_COUNT, MmSeen, MmSlot, PR_SET_THP_DISABLE, PendingCheck, PrctlEvent, RANGES_PER_BLOCK, ScanOrigin,
    ScanPath, ThpCheckKey, collapse_slot,
};

use crate::kernel::{
    btf_read, bump, current_tgid,
    offsets::{
        OFF_MM_OWNER, OFF_MM_STRUCT_FLAGS, OFF_TASK_STRUCT_MM, OFF_TASK_STRUCT_TGID, OFF_VMA_VM_END, OFF_VMA_VM_MM,
        OFF_VMA_VM_START,
    },
    read_at, tp_field,
};

#[unsafe(no_mangle)]
static THP_TARGET_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static THP_SELF_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static THP_EVERY_MM: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static THP_CALL_ARG_MASK: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static THP_VM_FLAGS_MASK: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static THP_MM_FLAGS_MASK: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static THP_FAULT_ADDRESS_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static THP_PRCTL_OPTION_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static THP_PRCTL_ARG2_OFFSET: Global<u32> = Global::new(24);
#[unsafe(no_mangle)]
static THP_PRCTL_ARG3_OFFSET: Global<u32> = Global::new(32);
#[unsafe(no_mangle)]
static THP_MMAP_LOCK_MM_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static THP_SCAN_PMD_MM_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static THP_SCAN_PMD_STATUS_OFFSET: Global<u32> = Global::new(32);
#[unsafe(no_mangle)]
static THP_SCAN_FILE_MM_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static THP_SCAN_FILE_RESULT_OFFSET: Global<u32> = Global::new(36);

/// Per-CPU values: no atomics needed (the BPF target has no fetch-add), user space sums them.
#[map]
static THP_CHECKS: PerCpuHashMap<ThpCheckKey, u64> = PerCpuHashMap::with_max_entries(8192, 0);
/// 2048 blocks: 4 GiB of touched address space, 512 KiB per CPU preallocated. (Preallocated:
/// tracing programs may use other hash maps only since 6.1.)
#[map]
static THP_FAULTS: PerCpuHashMap<u64, FaultBlock> = PerCpuHashMap::with_max_entries(2048, 0);
#[map]
static THP_FAULT_RUN: PerCpuArray<FaultRun> = PerCpuArray::with_max_entries(1, 0);
#[map]
static THP_MM: Array<MmSeen> = Array::with_max_entries(MM_SLOT_COUNT, 0);
#[map]
static THP_PRCTL_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
#[map]
static THP_COLLAPSE: PerCpuArray<u64> = PerCpuArray::with_max_entries(COLLAPSE_SLOT_COUNT, 0);
#[map]
static THP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);
/// Arguments saved by the kprobe until its kretprobe runs, per thread.
#[map]
static THP_PENDING: HashMap<u64, PendingCheck> = HashMap::with_max_entries(4096, 0);

#[inline(always)]
fn count(counter: Counter) {
    count_n(counter, 1);
}

#[inline(always)]
fn count_n(counter: Counter, n: u64) {
    bump(&THP_COUNTERS, counter as u32, n);
}

/// The calling task's mm (0 for kernel threads such as khugepaged).
#[inline(always)]
fn current_mm() -> u64 {
    let task = unsafe { bpf_get_current_task() };
    read_at::<u64>(task, OFF_TASK_STRUCT_MM.load()).unwrap_or(0)
}

/// Records `mm` and its flags in `slot`.
#[inline(always)]
fn remember_mm(slot: MmSlot, mm: u64) {
    if mm == 0 {
        return;
    }
    record_mm(slot, mm, read_at::<u64>(mm, OFF_MM_STRUCT_FLAGS.load()).unwrap_or(0));
}

#[inline(always)]
fn record_mm(slot: MmSlot, mm: u64, flags: u64) {
    if let Some(seen) = THP_MM.get_ptr_mut(slot as u32) {
        unsafe {
            (*seen).mm = mm;
            (*seen).flags = flags;
            (*seen).updates += 1;
        }
    }
}

/// In the target's own context its mm is current->mm: keep the filter's mm up to date (exec
/// replaces it).
#[inline(always)]
fn learn_target_mm() {
    if current_tgid() == THP_TARGET_TGID.load() {
        remember_mm(MmSlot::Target, current_mm());
    }
}

#[inline(always)]
fn target_mm() -> u64 {
    THP_MM.get(MmSlot::Target as u32).map(|s| s.mm).unwrap_or(0)
}

/// Adds one to this CPU's `map[key]`, inserting it when absent; counts a full map in `full`.
#[inline(always)]
fn add_one<K>(map: &PerCpuHashMap<K, u64>, key: &K, full: Counter) {
    match map.get_ptr_mut(key) {
        Some(value) => unsafe { *value += 1 },
        None => {
            if map.insert(key, 1, 0).is_err() {
                count(full);
            }
        }
    }
}

/// Whether an allow-check on `mm` is the target's (learning the target's mm on the way).
#[inline(always)]
fn is_target_mm(mm: u64, tgid: u32) -> bool {
    if tgid == THP_TARGET_TGID.load() {
        remember_mm(MmSlot::Target, current_mm());
    }
    let target = target_mm();
    if target == 0 {
        count(Counter::MmUnknown);
        return false;
    }
    mm == target
}

/// Counts one allow-check of `vma` if it concerns the target's mm, or any mm with THP_EVERY_MM.
#[inline(always)]
fn record_check(vma: u64, vm_flags: u64, call_args: [u8; 4], ret: u64) {
    count(Counter::AllChecks);
    let Some(mm) = read_at::<u64>(vma, OFF_VMA_VM_MM.load()) else { return };
    let tgid = current_tgid();
    let every_mm = THP_EVERY_MM.load() != 0;
    if !every_mm && !is_target_mm(mm, tgid) {
        return;
    }
    if tgid == THP_SELF_TGID.load() {
        count(Counter::OwnChecks);
        return;
    }
    count(Counter::TargetChecks);
    // System-wide, a key per VMA would fill the map: the addresses are left out.
    let (vm_start, vm_end) = if every_mm {
        (0, 0)
    } else {
        (
            read_at::<u64>(vma, OFF_VMA_VM_START.load()).unwrap_or(0),
            read_at::<u64>(vma, OFF_VMA_VM_END.load()).unwrap_or(0),
        )
    };
    let key = ThpCheckKey {
        vm_start,
        vm_end,
        vm_flags: vm_flags & THP_VM_FLAGS_MASK.load(),
        mm_flags: read_at::<u64>(mm, OFF_MM_STRUCT_FLAGS.load()).unwrap_or(0) & THP_MM_FLAGS_MASK.load(),
        ret,
        call_args,
        _pad: 0,
    };
    add_one(&THP_CHECKS, &key, Counter::CheckMapFull);
}

/// Low bytes of the call-type arguments 2..=5 of a traced function (fexit: BTF-typed context).
#[inline(always)]
fn fexit_call_args(ctx: &FExitContext) -> [u8; 4] {
    let mask = THP_CALL_ARG_MASK.load();
    let mut args = [0u8; 4];
    let mut i = 0;
    while i < 4 {
        if mask & (1 << (i + 2)) != 0 {
            let mut value: u64 = 0;
            // bpf_get_func_arg checks the index against the function's real argument count.
            if unsafe { bpf_get_func_arg(ctx.as_ptr(), (i + 2) as u32, &mut value) } == 0 {
                args[i] = value as u8;
            }
        }
        i += 1;
    }
    args
}

#[fexit]
pub fn thp_allowable_exit(ctx: FExitContext) -> u32 {
    let vma: u64 = ctx.arg(0);
    let vm_flags: u64 = ctx.arg(1);
    let ret: u64 = ctx.ret().unwrap_or(0);
    record_check(vma, vm_flags, fexit_call_args(&ctx), ret);
    0
}

/// Call-type arguments from registers (kprobe: x86-64 passes the first six in registers).
#[inline(always)]
fn kprobe_call_args(ctx: &ProbeContext) -> [u8; 4] {
    let mask = THP_CALL_ARG_MASK.load();
    let pick = |n: usize| -> u8 { if mask & (1 << n) != 0 { ctx.arg::<u64>(n).unwrap_or(0) as u8 } else { 0 } };
    [pick(2), pick(3), pick(4), pick(5)]
}

#[kprobe]
pub fn thp_allowable_entry(ctx: ProbeContext) -> u32 {
    let pending = PendingCheck {
        vma: ctx.arg::<u64>(0).unwrap_or(0),
        vm_flags: ctx.arg::<u64>(1).unwrap_or(0),
        call_args: kprobe_call_args(&ctx),
        _pad: 0,
    };
    let _ = THP_PENDING.insert(bpf_get_current_pid_tgid(), pending, 0);
    0
}

#[kretprobe]
pub fn thp_allowable_return(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(pending) = (unsafe { THP_PENDING.get(id) }).copied() else {
        count(Counter::ReturnWithoutEntry);
        return 0;
    };
    let _ = THP_PENDING.remove(id);
    record_check(pending.vma, pending.vm_flags, pending.call_args, ctx.ret::<u64>());
    0
}

/// page_fault_user as a BTF tracepoint: its arguments come straight from the call site
/// (address first), without the classic tracepoint's per-event record, which every page fault
/// on the machine would pay for while the tool runs.
#[btf_tracepoint(function = "page_fault_user")]
pub fn thp_page_fault_user_btf(ctx: BtfTracePointContext) -> u32 {
    if current_tgid() != THP_TARGET_TGID.load() {
        return 0;
    }
    if count_target_fault(ctx.arg::<u64>(0)) == Run::Opened {
        // current->mm and mm->flags with plain loads (BTF pointers): two helper calls fewer
        // than `learn_target_mm`.
        let task = unsafe { bpf_get_current_task_btf() } as u64;
        if let Some(mm) = btf_read::<u64>(task, OFF_TASK_STRUCT_MM.load()).filter(|&mm| mm != 0) {
            record_mm(MmSlot::Target, mm, btf_read::<u64>(mm, OFF_MM_STRUCT_FLAGS.load()).unwrap_or(0));
        }
    }
    0
}

/// exceptions:page_fault_user (x86), the classic tracepoint, where BTF is missing.
#[tracepoint]
pub fn thp_page_fault_user(ctx: TracePointContext) -> u32 {
    if current_tgid() != THP_TARGET_TGID.load() {
        return 0;
    }
    if let Some(address) = tp_field::<u64>(&ctx, &THP_FAULT_ADDRESS_OFFSET)
        && count_target_fault(address) == Run::Opened
    {
        learn_target_mm();
    }
    0
}

#[derive(PartialEq, Eq)]
enum Run {
    Extended,
    Opened,
}

/// Counts one of the target's faults in this CPU's run (see `FaultRun`), closing the run into
/// THP_FAULTS when the fault is in another 2 MiB block. The caller learns the target's mm only
/// when a run opens: the mm changes at exec, and the new image's faults open runs of their own.
#[inline(always)]
fn count_target_fault(address: u64) -> Run {
    let Some(run) = THP_FAULT_RUN.get_ptr_mut(0) else { return Run::Extended };
    // SAFETY: a per-CPU slot; tracing programs do not nest on one CPU (the kernel's recursion
    // guard skips a program that would run inside another).
    let run = unsafe { &mut *run };
    let block = address >> FAULT_BLOCK_SHIFT;
    let opened = run.block != block;
    if opened {
        close_run(run);
        run.block = block;
        run.ranges.faults = [0; RANGES_PER_BLOCK];
    }
    let range = (address >> FAULT_RANGE_SHIFT) as usize % RANGES_PER_BLOCK;
    run.ranges.faults[range] += 1;
    if opened { Run::Opened } else { Run::Extended }
}

/// Adds a run's faults to THP_FAULTS (inserting its block, straight from the run, when new).
#[inline(always)]
fn close_run(run: &FaultRun) {
    let faults: u64 = run.ranges.faults.iter().sum();
    if faults == 0 {
        return;
    }
    match THP_FAULTS.get_ptr_mut(run.block) {
        Some(block) => {
            let block = unsafe { &mut *block };
            for (total, added) in block.faults.iter_mut().zip(run.ranges.faults.iter()) {
                *total += *added;
            }
        }
        None => {
            // By reference: the 256-byte counts go to the kernel straight from the run's map
            // value, not through a copy on the 512-byte BPF stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            if THP_FAULTS.insert(run.block, &run.ranges, 0).is_err() {
                count_n(Counter::FaultMapFull, faults);
            }
        }
    }
}

/// syscalls:sys_enter_prctl: every PR_SET_THP_DISABLE call, from any process.
#[tracepoint]
pub fn thp_prctl_enter(ctx: TracePointContext) -> u32 {
    learn_target_mm();
    let read = |global: &Global<u32>| tp_field::<u64>(&ctx, global).unwrap_or(0);
    // `option` is an int in an 8-byte slot: compare the low half only.
    if read(&THP_PRCTL_OPTION_OFFSET) & 0xffff_ffff != PR_SET_THP_DISABLE {
        return 0;
    }
    let Some(mut entry) = THP_PRCTL_EVENTS.reserve::<PrctlEvent>(0) else {
        count(Counter::PrctlLost);
        return 0;
    };
    let id = bpf_get_current_pid_tgid();
    let mm = current_mm();
    entry.write(PrctlEvent {
        tgid: (id >> 32) as u32,
        pid: id as u32,
        arg2: read(&THP_PRCTL_ARG2_OFFSET),
        arg3: read(&THP_PRCTL_ARG3_OFFSET),
        mm_flags_before: read_at::<u64>(mm, OFF_MM_STRUCT_FLAGS.load()).unwrap_or(0),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    entry.submit(0);
    0
}

/// mmap_lock:mmap_lock_start_locking: when mm-probe itself locks another process's mm (reading
/// its /proc/PID/smaps_rollup), remember that mm and its flags; in the target's context, learn the
/// target's mm.
#[tracepoint]
pub fn thp_mmap_lock(ctx: TracePointContext) -> u32 {
    let tgid = current_tgid();
    if tgid == THP_TARGET_TGID.load() {
        learn_target_mm();
        return 0;
    }
    if tgid != THP_SELF_TGID.load() {
        return 0;
    }
    let Some(mm) = tp_field::<u64>(&ctx, &THP_MMAP_LOCK_MM_OFFSET) else { return 0 };
    if mm != current_mm() {
        remember_mm(MmSlot::Probe, mm);
    }
    0
}

/// huge_memory:mm_khugepaged_scan_pmd: the end of one scan of an anonymous PMD range, with its
/// final result (a collapse included: the tracepoint fires after collapse_huge_page returns).
#[tracepoint]
pub fn thp_scan_pmd(ctx: TracePointContext) -> u32 {
    count_scan(&ctx, ScanPath::Anon, &THP_SCAN_PMD_MM_OFFSET, &THP_SCAN_PMD_STATUS_OFFSET);
    0
}

/// huge_memory:mm_khugepaged_scan_file (6.2+): the same for a file or shmem range.
#[tracepoint]
pub fn thp_scan_file(ctx: TracePointContext) -> u32 {
    count_scan(&ctx, ScanPath::File, &THP_SCAN_FILE_MM_OFFSET, &THP_SCAN_FILE_RESULT_OFFSET);
    0
}

/// Whether `mm`, met before anything learned the target's mm, is the target's by its owner
/// (mm->owner, with memcg): learned so when it is. A target that does not fault during the run
/// is otherwise learned only by the mmap_lock tracepoint (5.11+): whose memory a scan is comes
/// from the memory.
#[inline(always)]
fn owned_by_target(mm: u64) -> bool {
    if target_mm() != 0 {
        return false;
    }
    let owner: u64 = read_at(mm, OFF_MM_OWNER.load()).unwrap_or(0);
    let tgid = read_at::<u32>(owner, OFF_TASK_STRUCT_TGID.load()).unwrap_or(0);
    let target = tgid != 0 && tgid == THP_TARGET_TGID.load();
    if target {
        remember_mm(MmSlot::Target, mm);
    }
    target
}

/// Counts one scan result on the target's mm by its raw number; other mms only in a counter.
/// khugepaged is a kernel thread (no mm); a scan in a process's own context is its
/// madvise(MADV_COLLAPSE).
#[inline(always)]
fn count_scan(ctx: &TracePointContext, path: ScanPath, mm_offset: &Global<u32>, result_offset: &Global<u32>) {
    let Some(mm) = tp_field::<u64>(ctx, mm_offset) else { return };
    if mm == 0 || (mm != target_mm() && !owned_by_target(mm)) {
        count(Counter::OtherMmScans);
        return;
    }
    let result = tp_field::<u32>(ctx, result_offset).unwrap_or(u32::MAX);
    let origin = if current_mm() == 0 { ScanOrigin::Khugepaged } else { ScanOrigin::Madvise };
    bump(&THP_COLLAPSE, collapse_slot(path, origin, result), 1);
}
