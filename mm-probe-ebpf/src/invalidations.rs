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
//! fire millions of times a second, and no event is streamed.
//!
//! The KVM subscription is found by walking mm->notifier_subscriptions->list (an hlist of
//! `struct mmu_notifier`, include/linux/mmu_notifier.h, unchanged 5.10 → 7.2) for the entry
//! whose ops->invalidate_range_start is KVM's (its address comes from kallsyms: the ops table
//! itself is a data symbol that many kernels leave out of kallsyms). container_of gives the
//! `struct kvm`, and mmu_lock its lock. Every offset comes from BTF.

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::{bpf_get_current_comm, bpf_get_current_task, bpf_ktime_get_ns, generated},
    macros::{kprobe, kretprobe, map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, StackTrace},
    programs::{ProbeContext, RetProbeContext, TracePointContext, tracing::StackIdContext},
};
use mm_probe_common::invalidations::{
    CallbackKey, CallbackStash, CallbackStats, Counter, DiscoveredCallback, FIT_CLASSES, FIT_SHIFT, InvalidationKey,
    InvalidationStats, KvmLock, LockClass, OpsTable, SIZE_BUCKETS, Source, TIME_BUCKETS, WaitKey, WaitStash, WaitStats,
};

use crate::kernel::{
    bump, current_pid, current_tgid, entry_programs, get_or_insert, log2_bucket, offsets::*, read_at, tp_field,
};

/// Threads with a wait, an invalidation or a callback open at once; LRU so a missed end never
/// leaks.
const THREADS: u32 = 16384;
/// Subscriptions walked per mm: KVM, a GPU driver, an IOMMU, a few more; the list is short.
const MAX_SUBSCRIPTIONS: u32 = 8;
/// Hash-map flag: allocate entries when first used, not all at load (per-CPU values of a few
/// hundred bytes times every CPU would otherwise be reserved up front).
const BPF_F_NO_PREALLOC: u32 = 1;

#[unsafe(no_mangle)]
static INV_FILTER_TGIDS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INV_KVM_RANGE_START_FN: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
static INV_BEGIN_LOCK_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static INV_BEGIN_FLAGS_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static INV_END_LOCK_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static INV_KVM_START_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static INV_KVM_END_OFFSET: Global<u32> = Global::new(16);

#[map]
static INV_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);
#[map]
static INV_INVALIDATIONS: PerCpuHashMap<InvalidationKey, InvalidationStats> =
    PerCpuHashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);
#[map]
static INV_WAITS: PerCpuHashMap<WaitKey, WaitStats> = PerCpuHashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);
#[map]
static INV_STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);
#[map]
static INV_KVM_LOCKS: HashMap<u64, KvmLock> = HashMap::with_max_entries(1024, 0);
#[map]
static INV_KNOWN_MMS: LruHashMap<u64, MmOwner> = LruHashMap::with_max_entries(4096, 0);
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
/// All-zero values to insert from: the stats are larger than the 512-byte BPF stack.
#[map]
static INV_ZERO_INVALIDATION: Array<InvalidationStats> = Array::with_max_entries(1, 0);
#[map]
static INV_ZERO_WAIT: Array<WaitStats> = Array::with_max_entries(1, 0);
#[map]
static INV_ZERO_CALLBACK: Array<CallbackStats> = Array::with_max_entries(1, 0);

/// Whose memory an mm is: the process first seen invalidating it as its own mm, or KVM's
/// tracepoints' invalidator. -p selects invalidations of a process's memory by anyone
/// (kcompactd, khugepaged, the OOM reaper), so the owner must be known before they come.
#[repr(C)]
#[derive(Clone, Copy)]
struct MmOwner {
    tgid: u32,
    /// Its subscriptions were searched for KVM's (once per mm: inside KVM's callbacks).
    kvm_searched: u32,
}

/// An invalidation open between range_start and range_end on a thread.
#[repr(C)]
#[derive(Clone, Copy)]
struct RangeStash {
    key: InvalidationKey,
    range: u64,
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

/// Records `tgid` as the owner of `mm` unless one is known; returns the owner.
#[inline(always)]
fn learn_owner(mm: u64, tgid: u32) -> u32 {
    if let Some(known) = unsafe { INV_KNOWN_MMS.get(mm) } {
        return known.tgid;
    }
    let _ = INV_KNOWN_MMS.insert(mm, MmOwner { tgid, kvm_searched: 0 }, 0);
    tgid
}

/// Walks `mm`'s subscriptions once and records each VM's mmu_lock under `tgid`. Called from
/// inside KVM's callbacks only, where KVM is subscribed: an mm learned earlier (at the
/// process's first invalidation, before it made a VM) is searched then.
#[inline(always)]
fn learn_kvm(mm: u64, tgid: u32) {
    let kvm_start = INV_KVM_RANGE_START_FN.load();
    if kvm_start == 0 || mm == 0 || unsafe { INV_KNOWN_MMS.get(mm) }.is_some_and(|known| known.kvm_searched != 0) {
        return;
    }
    let _ = INV_KNOWN_MMS.insert(mm, MmOwner { tgid, kvm_searched: 1 }, 0);
    let subscriptions: u64 = read_at(mm, OFF_MM_NOTIFIER_SUBSCRIPTIONS.load()).unwrap_or(0);
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
            let _ = INV_KVM_LOCKS.insert(lock, KvmLock { tgid, _pad: 0, kvm }, 0);
            count(Counter::KvmLocksLearned);
        }
        // hlist_node.next is its first member.
        node = read_at(node, 0).unwrap_or(0);
    }
}

/// Adds one invalidation of `bytes` to its group; returns the group's key.
#[inline(always)]
fn count_invalidation(key: &InvalidationKey, bytes: u64) {
    let Some(stats) = stats_for!(INV_INVALIDATIONS, key, INV_ZERO_INVALIDATION) else {
        count(Counter::InvalidationsMapFull);
        return;
    };
    let stats = unsafe { &mut *stats };
    stats.count += 1;
    stats.bytes += bytes;
    if let Some(slot) = stats.sizes.get_mut(log2_bucket(bytes, SIZE_BUCKETS as u32) as usize) {
        *slot += 1;
    }
}

#[inline(always)]
fn owner_of(mm: u64) -> u32 {
    unsafe { INV_KNOWN_MMS.get(mm) }.map_or(0, |known| known.tgid)
}

/// kvm_unmap_hva_range / kvm_age_hva: one invalidation of a VM's memory, in the invalidator.
#[inline(always)]
fn kvm_range(ctx: &TracePointContext, source: Source, counter: Counter) -> u32 {
    let tgid = current_tgid();
    let mm = current_mm();
    learn_kvm(mm, tgid);
    let owner = owner_of(mm);
    if !watched(tgid) && !watched(owner) {
        return 0;
    }
    count(counter);
    let start: u64 = tp_field(ctx, &INV_KVM_START_OFFSET).unwrap_or(0);
    let end: u64 = tp_field(ctx, &INV_KVM_END_OFFSET).unwrap_or(0);
    let key = InvalidationKey { tgid, owner_tgid: owner, source: source as u32, event: EVENT_UNKNOWN, comm: comm() };
    count_invalidation(&key, end.saturating_sub(start));
    0
}

#[tracepoint]
pub fn inv_kvm_unmap(ctx: TracePointContext) -> u32 {
    kvm_range(&ctx, Source::KvmUnmap, Counter::KvmUnmaps)
}

#[tracepoint]
pub fn inv_kvm_age(ctx: TracePointContext) -> u32 {
    kvm_range(&ctx, Source::KvmAge, Counter::KvmAges)
}

/// kvm:kvm_page_fault: only to learn the lock of a VM that faults before it is invalidated.
#[tracepoint]
pub fn inv_kvm_fault(_ctx: TracePointContext) -> u32 {
    learn_kvm(current_mm(), current_tgid());
    0
}

/// Whether `pid` is inside an invalidation or a callback the tool follows: a kernel thread
/// (kcompactd, the OOM reaper) invalidating a watched process's memory waits there for it.
#[inline(always)]
fn inside_watched_invalidation(pid: u32) -> bool {
    unsafe { INV_RANGE_STASH.get(pid).is_some() || INV_CALLBACK_STASH.get(pid).is_some() }
}

/// lock:contention_begin(void *lock_addr, unsigned int flags)
#[tracepoint]
pub fn inv_contention_begin(ctx: TracePointContext) -> u32 {
    let Some(lock) = tp_field::<u64>(&ctx, &INV_BEGIN_LOCK_OFFSET) else { return 0 };
    let tgid = current_tgid();
    let pid = current_pid();
    let lock_watched = unsafe { INV_KVM_LOCKS.get(lock) }.is_some_and(|kvm| watched(kvm.tgid));
    if !lock_watched && !watched(tgid) && !inside_watched_invalidation(pid) {
        return 0;
    }
    // contention_begin may fire twice for one acquisition (a mutex spins, then sleeps): the
    // first opens the wait, the second is ignored.
    if unsafe { INV_WAIT_STASH.get(pid) }.is_some_and(|open| open.key.lock == lock) {
        return 0;
    }
    count(Counter::ContentionBegins);
    let mm = current_mm();
    let mmap_lock = OFF_MM_MMAP_LOCK.load();
    let class = if mm != 0 && mmap_lock != u32::MAX && lock == mm + mmap_lock as u64 {
        LockClass::MmapLock
    } else {
        LockClass::Other
    };
    let stack_id = match ctx.get_stackid(&INV_STACKS, 0) {
        Ok(id) => id,
        Err(error) => {
            count(Counter::StackMisses);
            i64::from(error)
        }
    };
    let key = WaitKey {
        lock,
        stack_id,
        flags: tp_field(&ctx, &INV_BEGIN_FLAGS_OFFSET).unwrap_or(0),
        tgid,
        class: class as u32,
        _pad: 0,
        comm: comm(),
    };
    // Timed after the stack is taken, so that taking it is not counted as waiting.
    let _ = INV_WAIT_STASH.insert(pid, WaitStash { key, ts_ns: unsafe { bpf_ktime_get_ns() } }, 0);
    0
}

/// lock:contention_end(void *lock_addr, int ret)
#[tracepoint]
pub fn inv_contention_end(ctx: TracePointContext) -> u32 {
    let pid = current_pid();
    let Some(open) = (unsafe { INV_WAIT_STASH.get(pid) }).copied() else { return 0 };
    if tp_field::<u64>(&ctx, &INV_END_LOCK_OFFSET) != Some(open.key.lock) {
        return 0;
    }
    let _ = INV_WAIT_STASH.remove(pid);
    count(Counter::ContentionEnds);
    let waited = unsafe { bpf_ktime_get_ns() }.saturating_sub(open.ts_ns);
    // A wait inside a callback is the lock's cost, not the callback's own work (its fit).
    if let Some(callback) = INV_CALLBACK_STASH.get_ptr_mut(pid) {
        unsafe { (*callback).waited_ns += waited };
    }
    let Some(stats) = stats_for!(INV_WAITS, &open.key, INV_ZERO_WAIT) else {
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
    // A process invalidating its own memory names its mm's owner (a kernel thread has no mm).
    let own = mm != 0 && mm == current_mm() && watched(tgid);
    let owner = if own { learn_owner(mm, tgid) } else { owner_of(mm) };
    if !watched(tgid) && !watched(owner) {
        return 0;
    }
    count(Counter::RangeStarts);
    let start: u64 = read_at(range, OFF_NOTIFIER_RANGE_START.load()).unwrap_or(0);
    let end: u64 = read_at(range, OFF_NOTIFIER_RANGE_END.load()).unwrap_or(0);
    let event = read_at::<u32>(range, OFF_NOTIFIER_RANGE_EVENT.load()).unwrap_or(EVENT_UNKNOWN);
    let key = InvalidationKey { tgid, owner_tgid: owner, source: Source::RangeStart as u32, event, comm: comm() };
    count_invalidation(&key, end.saturating_sub(start));
    let stash = RangeStash { key, range, ts_ns: unsafe { bpf_ktime_get_ns() } };
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
    let Some(stats) = INV_INVALIDATIONS.get_ptr_mut(open.key) else { return 0 };
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
        ip: unsafe { generated::bpf_get_func_ip(ctx.as_ptr()) },
        ts_ns: unsafe { bpf_ktime_get_ns() },
        bytes: end.saturating_sub(start),
        blockable: flags & RANGE_BLOCKABLE,
        _pad: 0,
        waited_ns: 0,
    };
    let _ = INV_CALLBACK_STASH.insert(current_pid(), stash, 0);
    0
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
            let _ = INV_DISCOVERED_CALLBACKS.insert(address, found, BPF_NOEXIST);
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
