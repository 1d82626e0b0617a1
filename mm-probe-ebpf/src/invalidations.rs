//! invalidations' kernel programs: where MMU-notifier invalidations spend their time.
//!
//! - KVM's kvm_unmap_hva_range / kvm_age_hva tracepoints fire inside KVM's notifier callbacks,
//!   in the invalidating task: they count invalidations of a VM's memory where no function
//!   probe is allowed, and they are where each VM's kvm->mmu_lock is learned (kvm_page_fault
//!   too, for VMs that fault but are not invalidated).
//! - lock:contention_begin/end (5.19+) time every contended acquisition of a watched waiter or
//!   of a learned kvm->mmu_lock, with the waiter's kernel stack: user space tells the notifier's
//!   start and end, vCPU faults and dirty logging apart by the functions on it.
//! - __mmu_notifier_invalidate_range_start/_end (function probes, where allowed) see every
//!   invalidation of an mm with subscribers, with its event and start→end time.
//! - One kprobe/kretprobe pair, attached to each subscriber callback, times the callbacks per
//!   function (bpf_get_func_ip) and per size class, for the amplification fit.
//! - The callbacks are found in the kernel's own structures (section "Subscriber discovery"
//!   below): user space attaches the pair to each new one as it appears.
//!
//! All of it is aggregated here (per-CPU hash maps, allocated on first use): contention can
//! fire millions of times a second, and no event is streamed. The tables whose keys grow with
//! the machine's activity come in two generations (INV_GENERATION says which one is written);
//! user space drains the other once a second, so a table holds one second's keys however long
//! the run. Contention that has nothing to do with invalidations is kept too, folded: no stack,
//! no thread, other processes' mmap_locks as one lock, so that thousands of short-lived
//! processes cannot crowd the waits that matter out of the table.
//!
//! Whose memory an invalidation is comes from the memory: the range's mm (function probes) or
//! the mm of the task inside KVM's callback, and its owner task (mm->owner), never from the
//! invalidating task alone: kcompactd, kdamond and khugepaged work on other processes' memory.
//!
//! The KVM subscription is found by walking mm->notifier_subscriptions->list (an hlist of
//! `struct mmu_notifier`, include/linux/mmu_notifier.h, unchanged 5.10 → 7.2) for the entry
//! whose ops->invalidate_range_start is KVM's (its address comes from kallsyms: the ops table
//! itself is a data symbol that many kernels leave out of kallsyms). container_of gives the
//! `struct kvm`, and mmu_lock its lock. Every offset comes from BTF.

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::{bpf_get_current_comm, bpf_get_current_task, bpf_ktime_get_ns, generated},
    macros::{kprobe, kretprobe, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, StackTrace},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext, tracing::StackIdContext},
};
use mm_probe_common::cause::{Cause, CauseClass};
use mm_probe_common::invalidations::{
    CallbackKey, CallbackStash, CallbackStats, Counter, DYNAMIC_LOCKS, DiscoveredCallback, FIT_CLASSES, FIT_SHIFT,
    INVALIDATIONS_ENTRIES, InvalidationKey, InvalidationStats, KvmLock, LockClass, OTHER_MMAP_LOCKS,
    OTHERS_MEMORY_SYSCALLS, OpsTable, Relation, SIZE_BUCKETS, STACK_GENERATION_SHIFT, STACK_NOT_TAKEN, STACKS_ENTRIES,
    Source, TIME_BUCKETS, WAITS_ENTRIES, WaitKey, WaitStash, WaitStats,
};

use crate::{
    cause,
    kernel::{
        bump, current_pid, current_tgid, entry_programs, get_or_insert, log2_bucket, offsets::*, read_at, read_or_zero,
        tp_field,
    },
};

/// Threads with a wait, an invalidation or a callback open at once; LRU so a missed end never
/// leaks.
const THREADS: u32 = 16384;
/// Subscriptions walked per mm: KVM, a GPU driver, an IOMMU, a few more; the list is short.
const MAX_SUBSCRIPTIONS: u32 = 8;
/// VMs searched for an invalidation's owner (their slots are written out in `remember_vm` and
/// `vm_by_range`): a slot is reused once its VM's mm is gone.
const MAX_VMS: u32 = 4;
/// Hash-map flag: allocate entries when first used, not all at load (per-CPU values of a few
/// hundred bytes times every CPU would otherwise be reserved up front).
const BPF_F_NO_PREALLOC: u32 = 1;

#[unsafe(no_mangle)]
static INV_FILTER_TGIDS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INV_KVM_RANGE_START_FN: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static INV_KERNEL_TEXT: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static INV_KERNEL_END: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static INV_FUNC_IP_FROM_REGS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INV_KVM_START_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static INV_KVM_END_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static INV_OTHERS_MEMORY_SYSCALLS: Global<[u64; OTHERS_MEMORY_SYSCALLS]> = Global::new([0; OTHERS_MEMORY_SYSCALLS]);

#[map]
static INV_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);
/// Slot 0: the generation (0 or 1) of the drained tables below that the programs write now.
#[map]
static INV_GENERATION: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static INV_INVALIDATIONS_0: PerCpuHashMap<InvalidationKey, InvalidationStats> =
    PerCpuHashMap::with_max_entries(INVALIDATIONS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static INV_INVALIDATIONS_1: PerCpuHashMap<InvalidationKey, InvalidationStats> =
    PerCpuHashMap::with_max_entries(INVALIDATIONS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static INV_WAITS_0: PerCpuHashMap<WaitKey, WaitStats> =
    PerCpuHashMap::with_max_entries(WAITS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static INV_WAITS_1: PerCpuHashMap<WaitKey, WaitStats> =
    PerCpuHashMap::with_max_entries(WAITS_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
static INV_STACKS_0: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
#[map]
static INV_STACKS_1: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
#[map]
static INV_KVM_LOCKS: HashMap<u64, KvmLock> = HashMap::with_max_entries(1024, 0);
#[map]
static INV_KNOWN_MMS: LruHashMap<u64, MmOwner> = LruHashMap::with_max_entries(4096, 0);
/// The VMs seen so far, to find whose memory another thread's invalidation is (`vm_by_range`).
/// Written only under INV_LEARNING.
#[map]
static INV_VMS: Array<KnownVm> = Array::with_max_entries(MAX_VMS, 0);
/// Held (its one key present) while a CPU learns a VM: INV_VMS's slots are checked then written,
/// and two VMs learned at once on two CPUs took the same empty slot, one lost and uncounted.
/// Taken by an insert that fails while another holds it, never waited for.
#[map]
static INV_LEARNING: HashMap<u32, u32> = HashMap::with_max_entries(1, 0);
#[map]
static INV_CALLBACKS: PerCpuHashMap<CallbackKey, CallbackStats> =
    PerCpuHashMap::with_max_entries(256, BPF_F_NO_PREALLOC);
#[map]
static INV_CALLBACK_KINDS: HashMap<u64, u32> = HashMap::with_max_entries(256, 0);
#[map]
static INV_TARGET_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);
#[map]
static INV_WAIT_STASH: LruHashMap<u32, WaitStash> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static INV_RANGE_STASH: LruHashMap<u32, RangeStash> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static INV_CALLBACK_STASH: LruHashMap<u32, CallbackStash> = LruHashMap::with_max_entries(THREADS, 0);
/// The mm of the aging a thread is in (__mmu_notifier_clear_young's argument), for KVM's
/// kvm_age_hva that follows: kdamond and kswapd age other processes' memory.
#[map]
static INV_AGING_MM: LruHashMap<u32, u64> = LruHashMap::with_max_entries(THREADS, 0);
/// All-zero values to insert from: the stats are larger than the 512-byte BPF stack.
#[map]
static INV_ZERO_INVALIDATION: Array<InvalidationStats> = Array::with_max_entries(1, 0);
#[map]
static INV_ZERO_WAIT: Array<WaitStats> = Array::with_max_entries(1, 0);
#[map]
static INV_ZERO_CALLBACK: Array<CallbackStats> = Array::with_max_entries(1, 0);

/// Whose memory an mm with subscribers is: its owner task's process (mm->owner), else the
/// process first seen with it as its own mm. -p selects invalidations of a process's memory by
/// anyone (kcompactd, khugepaged, the OOM reaper), so the owner must be known when they come.
#[repr(C)]
#[derive(Clone, Copy)]
struct MmOwner {
    tgid: u32,
    /// Its subscriptions were searched for KVM's (once per mm: inside KVM's callbacks).
    kvm_searched: u32,
    /// mm->notifier_subscriptions when learned: allocated with the mm's first subscriber and
    /// freed with the mm, so an mm_struct freed and reused by another process (slab reuse)
    /// shows another value, and its stale entry is not believed.
    subscriptions: u64,
}

#[inline(always)]
fn subscriptions_of(mm: u64) -> u64 {
    read_at(mm, OFF_MM_NOTIFIER_SUBSCRIPTIONS.load()).unwrap_or(0)
}

/// What is known of `mm`: all zero when nothing is, or when the entry is another (earlier)
/// mm's at the same address. Not an `Option`: LLVM reads an absent value's fields on both
/// paths, and the verifier refuses a register read before it is written ("!read_ok").
#[inline(always)]
fn known_mm(mm: u64) -> MmOwner {
    let unknown = MmOwner { tgid: 0, kvm_searched: 0, subscriptions: 0 };
    let Some(known) = (unsafe { INV_KNOWN_MMS.get(mm) }).copied() else { return unknown };
    if known.subscriptions == subscriptions_of(mm) { known } else { unknown }
}

/// A VM: its `struct kvm`, and its process's mm with that mm's subscriptions when learned (a
/// different value means the mm is gone and the slot is free).
#[repr(C)]
#[derive(Clone, Copy)]
struct KnownVm {
    kvm: u64,
    mm: u64,
    subscriptions: u64,
}

/// An invalidation open between range_start and range_end on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct RangeStash {
    key: InvalidationKey,
    range: u64,
    mm: u64,
    ts_ns: u64,
}

/// How a callback refuses (INV_CALLBACK_KINDS, set by user space per function; absent = int):
/// `int invalidate_range_start()` with non-zero, `bool invalidate()` (interval notifiers) with
/// false; `void invalidate_range_end()` never.
const RETURNS_BOOL: u32 = 1;
const RETURNS_VOID: u32 = 2;
/// `enum mmu_notifier_event` unknown to this hook (KVM's tracepoints do not carry it).
const EVENT_UNKNOWN: u32 = u32::MAX;
/// MMU_NOTIFIER_RANGE_BLOCKABLE, bit 0 of mmu_notifier_range.flags (5.0 → 7.2).
const RANGE_BLOCKABLE: u32 = 1;

#[inline(always)]
fn count(counter: Counter) {
    bump(&INV_COUNTERS, counter as u32, 1);
}

#[inline(always)]
fn watched(tgid: u32) -> bool {
    INV_FILTER_TGIDS.load() == 0 || unsafe { INV_TARGET_TGIDS.get(tgid) }.is_some()
}

#[inline(always)]
fn current_mm() -> u64 {
    let task = unsafe { bpf_get_current_task() };
    read_at(task, OFF_TASK_STRUCT_MM.load()).unwrap_or(0)
}

#[inline(always)]
fn comm() -> [u8; 16] {
    bpf_get_current_comm().unwrap_or([0; 16])
}

/// `map[key]` as a pointer, inserting a copy of the all-zero template first when absent (the
/// stats are larger than the BPF stack, so the template lives in a map).
macro_rules! stats_for {
    ($map:expr, $key:expr, $zero:expr) => {
        $zero.get(0).and_then(|zero| get_or_insert!($map, $key, zero))
    };
}

/// The owner of `mm`, an mm with subscribers, learned once: mm->owner's process where the
/// kernel keeps it (CONFIG_MEMCG), else `own_tgid`, the process whose own mm it is (0 from a
/// kernel thread, which then learns nothing). Returns 0 when it stays unknown.
#[inline(always)]
fn learn_owner(mm: u64, own_tgid: u32) -> u32 {
    if mm == 0 {
        return 0;
    }
    let known = known_mm(mm);
    if known.tgid != 0 {
        return known.tgid;
    }
    let task: u64 = read_at(mm, OFF_MM_OWNER.load()).unwrap_or(0);
    let tgid = read_at::<u32>(task, OFF_TASK_STRUCT_TGID.load()).filter(|&t| t != 0).unwrap_or(own_tgid);
    if tgid != 0 {
        let entry = MmOwner { tgid, kvm_searched: known.kvm_searched, subscriptions: subscriptions_of(mm) };
        let _ = INV_KNOWN_MMS.insert(mm, entry, 0);
    }
    tgid
}

/// The generation of the drained tables to write now.
#[inline(always)]
fn generation() -> u32 {
    INV_GENERATION.get(0).copied().unwrap_or(0) & 1
}

#[inline(always)]
fn invalidations_table() -> &'static PerCpuHashMap<InvalidationKey, InvalidationStats> {
    if generation() == 0 { &INV_INVALIDATIONS_0 } else { &INV_INVALIDATIONS_1 }
}

#[inline(always)]
fn waits_table() -> &'static PerCpuHashMap<WaitKey, WaitStats> {
    if generation() == 0 { &INV_WAITS_0 } else { &INV_WAITS_1 }
}

/// Walks `mm`'s subscriptions once and records each VM's mmu_lock under `tgid`. Called from
/// inside KVM's callbacks only, where KVM is subscribed: an mm learned earlier (at the
/// process's first invalidation, before it made a VM) is searched then.
#[inline(always)]
fn learn_kvm(mm: u64, tgid: u32) {
    let kvm_start = INV_KVM_RANGE_START_FN.load();
    if kvm_start == 0 || mm == 0 || known_mm(mm).kvm_searched != 0 {
        return;
    }
    // Another CPU is learning a VM: this one is learned at its next fault, wakeup or
    // invalidation (it stays unsearched), rather than racing that CPU for a slot.
    if INV_LEARNING.insert(0, 0, BPF_NOEXIST).is_err() {
        return;
    }
    // The other CPU may have learned this very VM (its other thread) meanwhile.
    if known_mm(mm).kvm_searched == 0 {
        search_subscriptions(mm, tgid, kvm_start);
    }
    let _ = INV_LEARNING.remove(0);
}

/// `learn_kvm` as a global BPF function: verified once, whatever state its callers reach it in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn inv_learn_kvm(mm: u64, tgid: u32) -> u32 {
    learn_kvm(mm, tgid);
    0
}

/// `learn_kvm`'s search, with the learning lock held.
#[inline(always)]
fn search_subscriptions(mm: u64, tgid: u32, kvm_start: u64) {
    let owner = learn_owner(mm, tgid);
    let subscriptions = subscriptions_of(mm);
    let _ = INV_KNOWN_MMS.insert(mm, MmOwner { tgid: owner, kvm_searched: 1, subscriptions }, 0);
    let mut node: u64 = read_at(subscriptions, OFF_SUBSCRIPTIONS_LIST.load()).unwrap_or(0);
    let hlist = OFF_MMU_NOTIFIER_HLIST.load() as u64;
    for _ in 0..MAX_SUBSCRIPTIONS {
        if node == 0 {
            break;
        }
        let subscription = node.wrapping_sub(hlist);
        let ops: u64 = read_at(subscription, OFF_MMU_NOTIFIER_OPS.load()).unwrap_or(0);
        let start: u64 = read_at(ops, OFF_NOTIFIER_OPS_RANGE_START.load()).unwrap_or(0);
        let (in_kvm, lock_in_kvm) = (OFF_KVM_MMU_NOTIFIER.load(), OFF_KVM_MMU_LOCK.load());
        if start == kvm_start && in_kvm != u32::MAX && lock_in_kvm != u32::MAX {
            let kvm = subscription.wrapping_sub(in_kvm as u64);
            let lock = kvm + lock_in_kvm as u64;
            remember_vm(KnownVm { kvm, mm, subscriptions });
            if INV_KVM_LOCKS.insert(lock, KvmLock { tgid: owner, _pad: 0, kvm }, 0).is_ok() {
                count(Counter::KvmLocksLearned);
            } else {
                count(Counter::KvmLocksMapFull);
            }
        }
        // hlist_node.next is its first member.
        node = read_at(node, 0).unwrap_or(0);
    }
}

/// Adds one invalidation of [start, end) to its group. An end of ULONG_MAX is a whole address
/// space (exit_mmap): counted apart, in the last size slot, and not added to the bytes.
#[inline(always)]
fn count_invalidation(key: &InvalidationKey, start: u64, end: u64) {
    let table = invalidations_table();
    let Some(stats) = stats_for!(table, key, INV_ZERO_INVALIDATION) else {
        count(Counter::InvalidationsMapFull);
        return;
    };
    let stats = unsafe { &mut *stats };
    stats.count += 1;
    let slot = if end == u64::MAX {
        stats.whole_mm += 1;
        SIZE_BUCKETS as u32 - 1
    } else {
        let bytes = end.saturating_sub(start);
        stats.bytes += bytes;
        log2_bucket(bytes, SIZE_BUCKETS as u32)
    };
    if let Some(slot) = stats.sizes.get_mut(slot as usize) {
        *slot += 1;
    }
}

/// Keeps `vm` in the first slot that is free, its own, or whose VM's mm is gone. The slots are
/// written out: 6.1's verifier refused the loop LLVM made of this search (it entered it past
/// its header, and a back edge onto a fall-through was only accepted from 6.4 on).
#[inline(always)]
fn remember_vm(vm: KnownVm) {
    if !(keep_vm_in(0, &vm) || keep_vm_in(1, &vm) || keep_vm_in(2, &vm) || keep_vm_in(3, &vm)) {
        count(Counter::VmsMapFull);
    }
}

#[inline(always)]
fn keep_vm_in(slot: u32, vm: &KnownVm) -> bool {
    let Some(known) = INV_VMS.get_ptr_mut(slot) else { return true };
    let known = unsafe { &mut *known };
    if known.kvm == 0 || known.kvm == vm.kvm || subscriptions_of(known.mm) != known.subscriptions {
        *known = *vm;
        return true;
    }
    false
}

/// `vm_by_range` as a global BPF function: verified once, whatever state its callers reach it in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn inv_vm_by_range(start: u64, end: u64) -> u64 {
    vm_by_range(start, end)
}

/// The mm of the VM one of whose memslots overlaps [start, end): the memory an invalidation
/// made by another thread (compaction, reclaim, a kernel thread) is of. 0 when no live VM has
/// such a memslot.
#[inline(always)]
fn vm_by_range(start: u64, end: u64) -> u64 {
    if OFF_KVM_MEMSLOTS.load() == u32::MAX || OFF_KVM_MEMSLOTS_HVA_ROOT.load() == u32::MAX || end <= start {
        return 0;
    }
    let holding = |slot| vm_in_slot_holding(slot, start, end - 1);
    let mut mm = holding(0);
    if mm == 0 {
        mm = holding(1);
    }
    if mm == 0 {
        mm = holding(2);
    }
    if mm == 0 {
        mm = holding(3);
    }
    mm
}

/// The mm of the VM in `slot` when it is alive and a memslot of it overlaps [start, last].
#[inline(always)]
fn vm_in_slot_holding(slot: u32, start: u64, last: u64) -> u64 {
    let Some(vm) = INV_VMS.get(slot).copied() else { return 0 };
    if vm.kvm == 0 || read_or_zero(vm.mm, OFF_MM_NOTIFIER_SUBSCRIPTIONS.load()) != vm.subscriptions {
        return 0;
    }
    let memslots = read_or_zero(vm.kvm, OFF_KVM_MEMSLOTS.load());
    if memslot_overlaps(memslots, start, last) { vm.mm } else { 0 }
}

/// Whether a memslot of `memslots` covers part of [start, last]: the kernel's interval-tree
/// overlap search (include/linux/interval_tree_generic.h), pruned by each subtree's last, at
/// most MEMSLOT_TREE_DEPTH levels deep. One loop of branch-free reads (a failed read is 0,
/// which ends the walk or steers it away): with an Option per read and the steps written out,
/// the verifier walked about 33,000 instructions per VM slot here (host 6.18). 6.1 accepts
/// this loop's shape.
#[inline(always)]
fn memslot_overlaps(memslots: u64, start: u64, last: u64) -> bool {
    let rb = OFF_INTERVAL_NODE_RB.load() as u64;
    let (left_at, right_at) = (OFF_RB_NODE_LEFT.load(), OFF_RB_NODE_RIGHT.load());
    let (start_at, last_at) = (OFF_INTERVAL_NODE_START.load(), OFF_INTERVAL_NODE_LAST.load());
    let sub_last_at = OFF_INTERVAL_NODE_SUBTREE_LAST.load();
    // Whether the subtree under rb node `node` holds an interval ending at or after `start`.
    let reaches = |node: u64| node != 0 && read_or_zero(node.wrapping_sub(rb), sub_last_at) >= start;
    let mut node = read_or_zero(memslots, OFF_KVM_MEMSLOTS_HVA_ROOT.load());
    if !reaches(node) {
        return false;
    }
    for _ in 0..MEMSLOT_TREE_DEPTH {
        let left = read_or_zero(node, left_at);
        if reaches(left) {
            node = left;
            continue;
        }
        let interval = node.wrapping_sub(rb);
        if read_or_zero(interval, start_at) > last {
            return false;
        }
        if read_or_zero(interval, last_at) >= start {
            return true;
        }
        node = read_or_zero(node, right_at);
        if !reaches(node) {
            return false;
        }
    }
    false
}

/// Levels walked: a red-black tree of 255 memslots is at most 16 deep (2·log2(n+1)).
const MEMSLOT_TREE_DEPTH: u32 = 16;

#[inline(always)]
fn owner_of(mm: u64) -> u32 {
    known_mm(mm).tgid
}

/// The mm a KVM tracepoint's invalidation is of: the range's (an invalidation the function
/// probes opened on this thread), the aging's (clear_young's argument); else the thread's own
/// when it works on its own memory (a syscall, a fault), and otherwise the VM one of whose
/// memslots holds the range (compaction, reclaim and kernel threads work on others' memory),
/// or 0 when none does (the VM process's memory outside its memslots).
#[inline(always)]
fn kvm_event_mm(pid: u32, source: Source, cause: &Cause, start: u64, end: u64) -> u64 {
    // Plain values (0 when absent), and the thread's mm read only when it is wanted: else LLVM
    // spilled the mm on the path where its read failed from a register the verifier had never
    // seen written ("R3 !read_ok"; it did once learn_kvm changed shape around it).
    let from_probe = match source {
        Source::KvmAge => unsafe { INV_AGING_MM.get(pid) }.map_or(0, |&mm| mm),
        _ => unsafe { INV_RANGE_STASH.get(pid) }.map_or(0, |open| open.mm),
    };
    if from_probe != 0 {
        return from_probe;
    }
    // The class compared as a number: `CauseClass::from_raw` indexes a table in .rodata, an
    // offset the verifier cannot bound once the class comes from `cause_classify`'s result.
    let on_own_memory = if cause.class == CauseClass::Syscall as u32 {
        // process_madvise(2) and the like name another process: its memory, found by range.
        !on_others_memory(cause.detail)
    } else {
        cause.class == CauseClass::UserContext as u32
    };
    let own = if on_own_memory { current_mm() } else { 0 };
    if own != 0 {
        return own;
    }
    // Not the thread's own: none (unresolved, counted) unless a VM's memslot holds the range.
    inv_vm_by_range(start, end)
}

/// Whether syscall `nr` names another process whose memory it works on.
#[inline(always)]
fn on_others_memory(nr: u32) -> bool {
    let words = INV_OTHERS_MEMORY_SYSCALLS.load();
    // Constant indices: the verifier refuses a variable offset into the copy on the stack.
    let word = match nr / 64 {
        0 => words[0],
        1 => words[1],
        2 => words[2],
        3 => words[3],
        4 => words[4],
        5 => words[5],
        6 => words[6],
        7 => words[7],
        _ => 0,
    };
    word & (1 << (nr % 64)) != 0
}

/// kvm_unmap_hva_range / kvm_age_hva: one invalidation of a VM's memory, in the invalidator.
#[inline(always)]
fn kvm_range(source: Source, counter: Counter, start: u64, end: u64) -> u32 {
    let (tgid, pid) = (current_tgid(), current_pid());
    let cause = cause::classify();
    let mm = kvm_event_mm(pid, source, &cause, start, end);
    let own_tgid = if mm == current_mm() { tgid } else { 0 };
    inv_learn_kvm(mm, own_tgid);
    let owner = learn_owner(mm, own_tgid);
    if owner == 0 {
        count(Counter::OwnerUnresolved);
    }
    if !watched(tgid) && !watched(owner) {
        return 0;
    }
    count(counter);
    let key =
        InvalidationKey { tgid, owner_tgid: owner, source: source as u32, event: EVENT_UNKNOWN, comm: comm(), cause };
    count_invalidation(&key, start, end);
    0
}

/// __mmu_notifier_clear_young / __mmu_notifier_clear_flush_young(struct mm_struct *mm, …):
/// the mm that KVM's kvm_age_hva, fired inside, ages.
#[inline(always)]
fn aging(mm: u64) -> u32 {
    let _ = INV_AGING_MM.insert(current_pid(), mm, 0);
    0
}

entry_programs!(inv_clear_young_fentry, inv_clear_young_kprobe => aging);
entry_programs!(inv_clear_flush_young_fentry, inv_clear_flush_young_kprobe => aging);

/// The classic tracepoint's record: `start` and `end` at the offsets its format gives.
#[inline(always)]
fn kvm_record(ctx: &TracePointContext, source: Source, counter: Counter) -> u32 {
    let start: u64 = tp_field(ctx, &INV_KVM_START_OFFSET).unwrap_or(0);
    let end: u64 = tp_field(ctx, &INV_KVM_END_OFFSET).unwrap_or(0);
    kvm_range(source, counter, start, end)
}

#[tracepoint]
pub fn inv_kvm_unmap(ctx: TracePointContext) -> u32 {
    kvm_record(&ctx, Source::KvmUnmap, Counter::KvmUnmaps)
}

#[tracepoint]
pub fn inv_kvm_age(ctx: TracePointContext) -> u32 {
    kvm_record(&ctx, Source::KvmAge, Counter::KvmAges)
}

/// raw_tracepoint/kvm_unmap_hva_range(unsigned long start, unsigned long end[, …]): preferred
/// because a raw tracepoint is not skipped while a map syscall holds the CPU's guard (see
/// docs/kernel-facts.md, "The recursion guard").
#[raw_tracepoint(tracepoint = "kvm_unmap_hva_range")]
pub fn inv_kvm_unmap_raw(ctx: RawTracePointContext) -> u32 {
    kvm_range(Source::KvmUnmap, Counter::KvmUnmaps, ctx.arg::<u64>(0), ctx.arg::<u64>(1))
}

/// raw_tracepoint/kvm_age_hva(unsigned long start, unsigned long end[, bool fast_only]).
#[raw_tracepoint(tracepoint = "kvm_age_hva")]
pub fn inv_kvm_age_raw(ctx: RawTracePointContext) -> u32 {
    kvm_range(Source::KvmAge, Counter::KvmAges, ctx.arg::<u64>(0), ctx.arg::<u64>(1))
}

/// kvm:kvm_page_fault: only to learn the lock of a VM that faults before it is invalidated.
/// This and the wakeup are raw tracepoints, which detach at once (see cause.rs); they read no
/// argument, whose list differs across versions.
#[raw_tracepoint(tracepoint = "kvm_page_fault")]
pub fn inv_kvm_fault(_ctx: RawTracePointContext) -> u32 {
    inv_learn_kvm(current_mm(), current_tgid());
    0
}

/// kvm:kvm_vcpu_wakeup: an idle VM's vCPU threads wake at every guest timer tick, so even a VM
/// that neither faults nor invalidates its own memory is learned, and another thread's
/// invalidations of its memory (compaction, reclaim) are found to be its.
#[raw_tracepoint(tracepoint = "kvm_vcpu_wakeup")]
pub fn inv_kvm_wakeup(_ctx: RawTracePointContext) -> u32 {
    inv_learn_kvm(current_mm(), current_tgid());
    0
}

/// Whether `pid` is inside an invalidation or a callback the tool follows: a kernel thread
/// (kcompactd, the OOM reaper) invalidating a watched process's memory waits there for it.
#[inline(always)]
fn inside_watched_invalidation(pid: u32) -> bool {
    unsafe { INV_RANGE_STASH.get(pid).is_some() || INV_CALLBACK_STASH.get(pid).is_some() }
}

/// How a wait on `lock` by the current thread relates to invalidations; `None` when -p leaves
/// it out. In order: a VM's lock, a wait inside an invalidation, a waiter (or an mmap_lock)
/// of an mm with subscribers, a watched waiter; system-wide, everything else is unrelated.
#[inline(always)]
fn relation_of(lock: u64, mm: u64, tgid: u32, pid: u32) -> Option<Relation> {
    if let Some(kvm) = unsafe { INV_KVM_LOCKS.get(lock) }.copied() {
        if still_a_vm(&kvm) {
            if watched(kvm.tgid) {
                return Some(Relation::VmLock);
            }
        } else {
            // The VM is gone and its memory holds something else now.
            let _ = INV_KVM_LOCKS.remove(lock);
        }
    }
    if inside_watched_invalidation(pid) {
        return Some(Relation::InInvalidation);
    }
    let mmap_lock = OFF_MM_MMAP_LOCK.load();
    let locked_mm = if mmap_lock == u32::MAX { 0 } else { lock.wrapping_sub(mmap_lock as u64) };
    let subscribed = |mm: u64| {
        let owner = if mm == 0 { 0 } else { owner_of(mm) };
        owner != 0 && watched(owner)
    };
    if subscribed(mm) || subscribed(locked_mm) {
        return Some(Relation::SubscribedMm);
    }
    if INV_FILTER_TGIDS.load() != 0 {
        return watched(tgid).then_some(Relation::Watched);
    }
    Some(Relation::Unrelated)
}

/// Whether a learned `struct kvm` is still a VM: its notifier's ops still KVM's. A VM that
/// exited leaves its entry, and its memory is reused for other objects.
#[inline(always)]
fn still_a_vm(vm: &KvmLock) -> bool {
    let in_kvm = OFF_KVM_MMU_NOTIFIER.load();
    if in_kvm == u32::MAX {
        return false;
    }
    let ops: u64 = read_at(vm.kvm + in_kvm as u64, OFF_MMU_NOTIFIER_OPS.load()).unwrap_or(0);
    read_at::<u64>(ops, OFF_NOTIFIER_OPS_RANGE_START.load()) == Some(INV_KVM_RANGE_START_FN.load())
}

/// The waiter's kernel stack in this generation's stack map, its generation in bit 32.
#[inline(always)]
fn wait_stack(ctx: &RawTracePointContext) -> i64 {
    let generation = generation();
    let taken = if generation == 0 { ctx.get_stackid(&INV_STACKS_0, 0) } else { ctx.get_stackid(&INV_STACKS_1, 0) };
    match taken {
        Ok(id) => id | ((generation as i64) << STACK_GENERATION_SHIFT),
        Err(error) => {
            count(Counter::StackMisses);
            i64::from(error)
        }
    }
}

/// raw_tracepoint/contention_begin(void *lock, unsigned int flags), unchanged 5.19 → 7.2. The
/// lock pair is raw, as the brackets are (cause.rs): their links detach at once, and their own
/// recursion guard keeps them running while a map syscall holds the CPU's bpf_prog_active.
#[raw_tracepoint(tracepoint = "contention_begin")]
pub fn inv_contention_begin(ctx: RawTracePointContext) -> u32 {
    let lock = ctx.arg::<u64>(0);
    let pid = current_pid();
    // contention_begin may fire twice for one acquisition (a mutex spins, then sleeps): the
    // first opens the wait, the second is ignored.
    if unsafe { INV_WAIT_STASH.get(pid) }.is_some_and(|open| open.lock == lock) {
        return 0;
    }
    let tgid = current_tgid();
    let mm = current_mm();
    let Some(relation) = relation_of(lock, mm, tgid, pid) else { return 0 };
    count(Counter::ContentionBegins);
    let mmap_lock = OFF_MM_MMAP_LOCK.load();
    let own_mmap_lock = mm != 0 && mmap_lock != u32::MAX && lock == mm + mmap_lock as u64;
    let class = if own_mmap_lock { LockClass::MmapLock } else { LockClass::Other };
    let flags = ctx.arg::<u64>(1) as u32;
    let key = if relation == Relation::Unrelated {
        // Every process's own mmap_lock is one lock here, and every per-object lock another:
        // their number grows with the machine's processes, which churn makes unbounded. Locks in
        // the kernel image (zone, LRU, global locks) are few and keep their address.
        let in_image = lock >= INV_KERNEL_TEXT.load() && lock < INV_KERNEL_END.load();
        let lock = if own_mmap_lock {
            OTHER_MMAP_LOCKS
        } else if in_image {
            lock
        } else {
            DYNAMIC_LOCKS
        };
        let (tgid, class, comm, cause) = (0, class as u32, [0; 16], Cause::default());
        WaitKey { lock, stack_id: STACK_NOT_TAKEN, flags, tgid, class, relation: 0, comm, cause }
    } else {
        let stack_id = wait_stack(&ctx);
        // The waiter's own cause: inside an invalidation's callback, that invalidation's.
        let (class, relation, cause) = (class as u32, relation as u32, cause::classify());
        WaitKey { lock, stack_id, flags, tgid, class, relation, comm: comm(), cause }
    };
    // Timed after the stack is taken, so that taking it is not counted as waiting.
    let _ = INV_WAIT_STASH.insert(pid, WaitStash { key, lock, ts_ns: unsafe { bpf_ktime_get_ns() } }, 0);
    0
}

/// raw_tracepoint/contention_end(void *lock, int ret)
#[raw_tracepoint(tracepoint = "contention_end")]
pub fn inv_contention_end(ctx: RawTracePointContext) -> u32 {
    let pid = current_pid();
    let Some(open) = (unsafe { INV_WAIT_STASH.get(pid) }).copied() else { return 0 };
    if ctx.arg::<u64>(0) != open.lock {
        return 0;
    }
    let _ = INV_WAIT_STASH.remove(pid);
    count(Counter::ContentionEnds);
    let waited = unsafe { bpf_ktime_get_ns() }.saturating_sub(open.ts_ns);
    // A wait inside a callback is the lock's cost, not the callback's own work (its fit).
    if let Some(callback) = INV_CALLBACK_STASH.get_ptr_mut(pid) {
        unsafe { (*callback).waited_ns += waited };
    }
    let table = waits_table();
    let Some(stats) = stats_for!(table, &open.key, INV_ZERO_WAIT) else {
        count(Counter::WaitsMapFull);
        return 0;
    };
    let stats = unsafe { &mut *stats };
    stats.count += 1;
    stats.wait_ns += waited;
    if waited > stats.max_ns {
        stats.max_ns = waited;
    }
    if let Some(slot) = stats.buckets.get_mut(log2_bucket(waited, TIME_BUCKETS as u32) as usize) {
        *slot += 1;
    }
    0
}

/// __mmu_notifier_invalidate_range_start(struct mmu_notifier_range *range)
#[inline(always)]
fn range_start(range: u64) -> u32 {
    let tgid = current_tgid();
    let mm: u64 = read_at(range, OFF_NOTIFIER_RANGE_MM.load()).unwrap_or(0);
    // The range's mm has subscribers (the kernel calls this only then): its owner is learned
    // from the mm, or from a process invalidating its own memory (a kernel thread has no mm).
    let owner = learn_owner(mm, if mm == current_mm() { tgid } else { 0 });
    if !watched(tgid) && !watched(owner) {
        return 0;
    }
    count(Counter::RangeStarts);
    let start: u64 = read_at(range, OFF_NOTIFIER_RANGE_START.load()).unwrap_or(0);
    let end: u64 = read_at(range, OFF_NOTIFIER_RANGE_END.load()).unwrap_or(0);
    let event = read_at::<u32>(range, OFF_NOTIFIER_RANGE_EVENT.load()).unwrap_or(EVENT_UNKNOWN);
    let key = InvalidationKey {
        tgid,
        owner_tgid: owner,
        source: Source::RangeStart as u32,
        event,
        comm: comm(),
        cause: cause::classify(),
    };
    count_invalidation(&key, start, end);
    let stash = RangeStash { key, range, mm, ts_ns: unsafe { bpf_ktime_get_ns() } };
    let _ = INV_RANGE_STASH.insert(current_pid(), stash, 0);
    0
}

/// __mmu_notifier_invalidate_range_end(struct mmu_notifier_range *range[, bool only_end])
#[inline(always)]
fn range_end(range: u64) -> u32 {
    let pid = current_pid();
    let Some(open) = (unsafe { INV_RANGE_STASH.get(pid) }).copied() else { return 0 };
    if open.range != range {
        return 0;
    }
    let _ = INV_RANGE_STASH.remove(pid);
    count(Counter::RangeEnds);
    let held = unsafe { bpf_ktime_get_ns() }.saturating_sub(open.ts_ns);
    // Into this generation's table, which a drain may have emptied since the start.
    let table = invalidations_table();
    let Some(stats) = stats_for!(table, &open.key, INV_ZERO_INVALIDATION) else {
        count(Counter::InvalidationsMapFull);
        return 0;
    };
    let stats = unsafe { &mut *stats };
    stats.ended += 1;
    stats.duration_ns += held;
    if let Some(slot) = stats.durations.get_mut(log2_bucket(held, TIME_BUCKETS as u32) as usize) {
        *slot += 1;
    }
    0
}

entry_programs!(inv_range_start_fentry, inv_range_start_kprobe => range_start);
entry_programs!(inv_range_end_fentry, inv_range_end_kprobe => range_end);

/// Entry of any subscriber callback: `(subscription, const struct mmu_notifier_range *range,
/// …)` for both kinds (mmu_notifier_ops.invalidate_range_start and _end, and
/// mmu_interval_notifier_ops.invalidate), so the range is always argument 1.
#[kprobe]
pub fn inv_callback_kprobe(ctx: ProbeContext) -> u32 {
    let range: u64 = ctx.arg(1).unwrap_or(0);
    if !watched(current_tgid()) && !watched(owner_of(read_at(range, OFF_NOTIFIER_RANGE_MM.load()).unwrap_or(0))) {
        return 0;
    }
    let start: u64 = read_at(range, OFF_NOTIFIER_RANGE_START.load()).unwrap_or(0);
    let end: u64 = read_at(range, OFF_NOTIFIER_RANGE_END.load()).unwrap_or(0);
    let flags: u32 = read_at(range, OFF_NOTIFIER_RANGE_FLAGS.load()).unwrap_or(RANGE_BLOCKABLE);
    let stash = CallbackStash {
        ip: probed_function(&ctx),
        ts_ns: unsafe { bpf_ktime_get_ns() },
        bytes: end.saturating_sub(start),
        blockable: flags & RANGE_BLOCKABLE,
        _pad: 0,
        waited_ns: 0,
    };
    let _ = INV_CALLBACK_STASH.insert(current_pid(), stash, 0);
    0
}

/// The function this kprobe was attached to. The global is read-only, so the verifier walks
/// only the branch this kernel takes, and an older kernel never meets the helper it lacks.
#[inline(always)]
fn probed_function(ctx: &ProbeContext) -> u64 {
    if INV_FUNC_IP_FROM_REGS.load() != 0 {
        // SAFETY: a kprobe's context is the saved registers, readable at any offset in them.
        unsafe { (*ctx.regs).rip }.wrapping_sub(1)
    } else {
        unsafe { generated::bpf_get_func_ip(ctx.as_ptr()) }
    }
}

#[kretprobe]
pub fn inv_callback_kretprobe(ctx: RetProbeContext) -> u32 {
    let pid = current_pid();
    let Some(open) = (unsafe { INV_CALLBACK_STASH.get(pid) }).copied() else {
        if watched(current_tgid()) {
            count(Counter::CallbackStashMisses);
        }
        return 0;
    };
    let _ = INV_CALLBACK_STASH.remove(pid);
    let took = unsafe { bpf_ktime_get_ns() }.saturating_sub(open.ts_ns);
    let ret = ctx.ret::<u64>();
    let refused = match unsafe { INV_CALLBACK_KINDS.get(open.ip) }.copied() {
        Some(RETURNS_BOOL) => ret & 0xff == 0,
        Some(RETURNS_VOID) => false,
        _ => ret as u32 != 0,
    };
    let Some(stats) = stats_for!(INV_CALLBACKS, &CallbackKey { ip: open.ip }, INV_ZERO_CALLBACK) else {
        count(Counter::CallbacksMapFull);
        return 0;
    };
    let stats = unsafe { &mut *stats };
    stats.calls += 1;
    stats.total_ns += took;
    stats.bytes += open.bytes;
    stats.wait_ns += open.waited_ns;
    if took > stats.max_ns {
        stats.max_ns = took;
    }
    if open.blockable == 0 {
        stats.nonblocking += 1;
        if refused {
            stats.refused += 1;
        }
    }
    if let Some(slot) = stats.buckets.get_mut(log2_bucket(took, TIME_BUCKETS as u32) as usize) {
        *slot += 1;
    }
    let class = log2_bucket(open.bytes, 64).saturating_sub(FIT_SHIFT) as usize;
    let class = if class >= FIT_CLASSES { FIT_CLASSES - 1 } else { class };
    let own = log2_bucket(took.saturating_sub(open.waited_ns), TIME_BUCKETS as u32) as usize;
    if let Some(slot) = stats.fit_buckets.get_mut(class).and_then(|buckets| buckets.get_mut(own)) {
        *slot += 1;
    }
    0
}

// ---- Subscriber discovery -------------------------------------------------------------------
//
// Which functions to time is read from the kernel, not from a list of drivers:
// - an mm's subscribers with their own ops (KVM, nouveau's svmm, kfd's process notifier, IOMMU
//   SVA, …) hang on mm->notifier_subscriptions->list; it is walked at an invalidation of a
//   watched mm, again only when the list's first node changed (subscriptions are added at the
//   head, hlist_add_head_rcu, and removing the first changes it too);
// - interval notifiers (every HMM, userptr and ODP driver) sit in the subscriptions' interval
//   tree, which a program cannot walk; each is met where its driver hands it to
//   mmu_interval_read_begin, which every driver calls before it reads the pages it mirrors.
// Each function pointer of the ops is recorded once with the member it came from; user space
// decides from BTF which take the range and can be timed.

/// Words of an ops table read: `struct mmu_notifier_ops` has 8 to 11 function pointers
/// (5.10 → 7.2), `struct mmu_interval_notifier_ops` fewer.
const OPS_WORDS: u32 = 16;
/// bpf_map_update_elem flag: only insert, never overwrite.
const BPF_NOEXIST: u64 = 1;
/// What an insert with BPF_NOEXIST returns for a key already there.
const EEXIST: i32 = -17;

#[unsafe(no_mangle)]
static INV_NOTIFIER_OPS_WORDS: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static INV_INTERVAL_OPS_WORDS: Global<u64> = Global::new(0);

#[map]
static INV_DISCOVERED_CALLBACKS: HashMap<u64, DiscoveredCallback> = HashMap::with_max_entries(256, 0);
/// mm → the first node of its subscription list when it was last walked.
#[map]
static INV_WALKED_HEADS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// Records the function pointers of an ops table: the words whose bit is set in `words`.
#[inline(always)]
fn note_ops(ops: u64, words: u64, table: OpsTable) {
    for word in 0..OPS_WORDS {
        if words & (1 << word) == 0 {
            continue;
        }
        let address: u64 = read_at(ops, word * 8).unwrap_or(0);
        if address != 0 {
            let found = DiscoveredCallback { table: table as u32, member_offset: word * 8 };
            // Found before is the usual case; any other refusal leaves a callback untimed.
            if let Err(error) = INV_DISCOVERED_CALLBACKS.insert(address, found, BPF_NOEXIST)
                && error != EEXIST
            {
                count(Counter::CallbacksUndiscovered);
            }
        }
    }
}

#[inline(always)]
fn memory_watched(mm: u64) -> bool {
    watched(current_tgid()) || watched(owner_of(mm))
}

/// Records every function pointer of the ops of `mm`'s subscriptions, unless the list is the
/// one walked last time.
#[inline(always)]
fn walk_subscriptions(mm: u64) {
    let words = INV_NOTIFIER_OPS_WORDS.load();
    let subscriptions: u64 = read_at(mm, OFF_MM_NOTIFIER_SUBSCRIPTIONS.load()).unwrap_or(0);
    let mut node: u64 = read_at(subscriptions, OFF_SUBSCRIPTIONS_LIST.load()).unwrap_or(0);
    if words == 0 || node == 0 || unsafe { INV_WALKED_HEADS.get(mm) }.is_some_and(|head| *head == node) {
        return;
    }
    let _ = INV_WALKED_HEADS.insert(mm, node, 0);
    let hlist = OFF_MMU_NOTIFIER_HLIST.load() as u64;
    for _ in 0..MAX_SUBSCRIPTIONS {
        if node == 0 {
            break;
        }
        let ops: u64 = read_at(node.wrapping_sub(hlist), OFF_MMU_NOTIFIER_OPS.load()).unwrap_or(0);
        note_ops(ops, words, OpsTable::Notifier);
        // hlist_node.next is its first member.
        node = read_at(node, 0).unwrap_or(0);
    }
}

/// __mmu_notifier_invalidate_range_start(struct mmu_notifier_range *range): the mm is about to
/// call its subscribers.
#[inline(always)]
fn subscriptions_at_invalidation(range: u64) -> u32 {
    let mm: u64 = read_at(range, OFF_NOTIFIER_RANGE_MM.load()).unwrap_or(0);
    if memory_watched(mm) {
        walk_subscriptions(mm);
    }
    0
}

/// mmu_interval_read_begin(struct mmu_interval_notifier *interval_sub)
#[inline(always)]
fn interval_read_begin(interval_sub: u64) -> u32 {
    let mm: u64 = read_at(interval_sub, OFF_INTERVAL_NOTIFIER_MM.load()).unwrap_or(0);
    if memory_watched(mm) {
        let ops: u64 = read_at(interval_sub, OFF_INTERVAL_NOTIFIER_OPS.load()).unwrap_or(0);
        note_ops(ops, INV_INTERVAL_OPS_WORDS.load(), OpsTable::Interval);
    }
    0
}

entry_programs!(inv_subscriptions_fentry, inv_subscriptions_kprobe => subscriptions_at_invalidation);
entry_programs!(inv_interval_begin_fentry, inv_interval_begin_kprobe => interval_read_begin);
