//! Records and map names shared by the invalidation programs (mm-probe-ebpf `invalidations.rs`)
//! and `mm-probe invalidations`.
//!
//! Everything is aggregated in the kernel: lock contention can fire millions of times a second,
//! so no event is streamed. The tables that grow with what the machine does (invalidations,
//! waits, stacks) come in two generations: the programs write the one [`GENERATION_MAP`] names,
//! and user space, once a second, switches to the other and drains the one it left (reads it,
//! adds it to its own totals, empties it). A table then only has to hold one second's keys, so
//! a run of weeks cannot fill it; what a full table still drops is counted.

use crate::slots;

/// Per-CPU array of u64 counters indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "INV_COUNTERS";
/// Array of one u32: the generation (0 or 1) of the drained tables the programs write now.
pub const GENERATION_MAP: &str = "INV_GENERATION";
/// Per generation, hash map [`InvalidationKey`] → [`InvalidationStats`].
pub const INVALIDATIONS_MAPS: [&str; 2] = ["INV_INVALIDATIONS_0", "INV_INVALIDATIONS_1"];
/// Per generation, hash map [`WaitKey`] → [`WaitStats`]: contended lock acquisitions.
pub const WAITS_MAPS: [&str; 2] = ["INV_WAITS_0", "INV_WAITS_1"];
/// Per generation, stack-trace map of the waiters' kernel stacks ([`WaitKey::stack_id`]).
pub const STACKS_MAPS: [&str; 2] = ["INV_STACKS_0", "INV_STACKS_1"];
/// Entries of each generation's tables: what one second of a busy machine can hold.
pub const INVALIDATIONS_ENTRIES: u32 = 1024;
pub const WAITS_ENTRIES: u32 = 4096;
pub const STACKS_ENTRIES: u32 = 4096;
/// Hash map lock address (u64) → [`KvmLock`]: each VM's kvm->mmu_lock, learned from the
/// subscriptions of the mm a KVM tracepoint fired in.
pub const KVM_LOCKS_MAP: &str = "INV_KVM_LOCKS";
/// Array of the VMs (at most 4) whose memslots say whose memory another thread invalidated.
pub const VMS_MAP: &str = "INV_VMS";
/// LRU hash map mm pointer (u64) → tgid (u32): mms whose subscriptions were already walked.
pub const KNOWN_MMS_MAP: &str = "INV_KNOWN_MMS";
/// Hash map [`CallbackKey`] → [`CallbackStats`]: time in each subscriber's callback.
pub const CALLBACKS_MAP: &str = "INV_CALLBACKS";
/// Hash map callback address (u64) → [`ReturnKind`] as u32, set by user space.
pub const CALLBACK_KINDS_MAP: &str = "INV_CALLBACK_KINDS";
/// Hash map tgid (u32) → 1: the processes to watch when [`FILTER_TGIDS`] is set.
pub const TARGET_TGIDS_MAP: &str = "INV_TARGET_TGIDS";
/// Hash map callback address (u64) → [`DiscoveredCallback`]: every function pointer found in
/// the ops of a watched mm's subscribers, for user space to time.
pub const DISCOVERED_CALLBACKS_MAP: &str = "INV_DISCOVERED_CALLBACKS";

/// Global u32: 1 = only the tgids in [`TARGET_TGIDS_MAP`] (as invalidator, waiter or owner of
/// the memory or lock), 0 = every process.
pub const FILTER_TGIDS: &str = "INV_FILTER_TGIDS";
/// Global u64: the address of kvm_mmu_notifier_invalidate_range_start (kallsyms), which a KVM
/// subscription's ops point to; 0 when KVM is absent.
pub const KVM_RANGE_START_FN: &str = "INV_KVM_RANGE_START_FN";
/// Globals u64: the kernel image's [_text, _end) (kallsyms). An unrelated contended lock outside
/// it is a per-object lock (a page table's, an inode's, a socket's): all of them fold into
/// [`DYNAMIC_LOCKS`], since short-lived processes bring new ones every second.
pub const KERNEL_TEXT: &str = "INV_KERNEL_TEXT";
pub const KERNEL_END: &str = "INV_KERNEL_END";
/// The lock address that stands for every unrelated per-object lock.
pub const DYNAMIC_LOCKS: u64 = 1;
/// The lock address that stands for other processes' own mmap_locks (unrelated).
pub const OTHER_MMAP_LOCKS: u64 = 0;
/// Globals u64: bit i set = the 8 bytes at offset 8×i of `struct mmu_notifier_ops` (of
/// `struct mmu_interval_notifier_ops`) are a function pointer (from BTF); 0 = no BTF, nothing
/// is read.
pub const NOTIFIER_OPS_WORDS: &str = "INV_NOTIFIER_OPS_WORDS";
pub const INTERVAL_OPS_WORDS: &str = "INV_INTERVAL_OPS_WORDS";
/// Global u32: 1 where the kernel has no bpf_get_func_ip() (before 5.15): the callback timing's
/// kprobe then takes its function from the saved instruction pointer, which an x86 kprobe
/// leaves one byte past the probed address (its breakpoint's length, emulated the same way by a
/// kprobe on ftrace). Those kernels predate IBT, so the probed address is the function's own.
pub const FUNC_IP_FROM_REGS: &str = "INV_FUNC_IP_FROM_REGS";
/// Globals u32: the field offsets of kvm_unmap_hva_range / kvm_age_hva (identical formats).
pub const KVM_START_OFFSET: &str = "INV_KVM_START_OFFSET";
pub const KVM_END_OFFSET: &str = "INV_KVM_END_OFFSET";
/// Global [u64; OTHERS_MEMORY_SYSCALLS]: a bitmap by syscall number (bit n % 64 of word n / 64)
/// of the syscalls that work on another process's memory (process_madvise, process_mrelease,
/// process_vm_writev, move_pages, migrate_pages). Their invalidations are not the caller's. A
/// bitmap read at a constant index, not a search over a list: with the search, a 6.1 guest
/// locked up (soft lockups) while doctor loaded the programs, three boots of three.
pub const OTHERS_MEMORY_SYSCALLS_GLOBAL: &str = "INV_OTHERS_MEMORY_SYSCALLS";
pub const OTHERS_MEMORY_SYSCALLS: usize = 8;

/// Slots of the log2 histograms: 2^31 ns ≈ 2 s for waits and callbacks; longer ones land in
/// the last slot.
pub const TIME_BUCKETS: usize = 32;
/// Slots of the size histogram: log2 of bytes, up to 2^47 (128 TiB, a whole address space).
pub const SIZE_BUCKETS: usize = 48;
/// Size classes of the callback fit: 4 KiB (2^12) to 2^35 bytes, log2.
pub const FIT_SHIFT: u32 = 12;
pub const FIT_CLASSES: usize = 24;

/// [`WaitKey::stack_id`] of a wait whose stack was not taken on purpose (unrelated contention:
/// its stack would cost a stack-map entry and say nothing about invalidations).
pub const STACK_NOT_TAKEN: i64 = i64::MIN;
/// Bit 32 of a taken [`WaitKey::stack_id`]: which generation's stack map holds it (a wait can
/// begin in one generation and end in the next).
pub const STACK_GENERATION_SHIFT: u32 = 32;

/// Stack frames kept per waiter (enough to reach the syscall or the vCPU ioctl from the lock).
pub const STACK_DEPTH: u32 = 32;

slots! {
    /// Slots of [`COUNTERS_MAP`].
    pub enum Counter {
        /// lock:contention_begin seen for a watched waiter or lock.
        ContentionBegins => "contention_begins",
        /// lock:contention_end that closed a watched wait.
        ContentionEnds => "contention_ends",
        /// Waits not counted because the waits table refused the insert: full, or (rarely, even
        /// with room) busy on this CPU, when an interrupt's program met the map mid-update.
        WaitsMapFull => "waits_map_full",
        /// Waits whose stack could not be taken (stack map full or a collision).
        StackMisses => "stack_misses",
        /// kvm_unmap_hva_range tracepoints of watched processes.
        KvmUnmaps => "kvm_unmaps",
        /// kvm_age_hva tracepoints of watched processes.
        KvmAges => "kvm_ages",
        /// __mmu_notifier_invalidate_range_start calls of watched processes.
        RangeStarts => "range_starts",
        /// __mmu_notifier_invalidate_range_end calls that closed a start seen.
        RangeEnds => "range_ends",
        /// Invalidations not counted because the invalidations table refused the insert (full,
        /// or busy on this CPU).
        InvalidationsMapFull => "invalidations_map_full",
        /// Callback returns whose entry was not seen (attached mid-call).
        CallbackStashMisses => "callback_stash_misses",
        /// Callbacks not counted because [`CALLBACKS_MAP`] was full.
        CallbacksMapFull => "callbacks_map_full",
        /// KVM subscriptions found (each VM's mmu_lock once).
        KvmLocksLearned => "kvm_locks_learned",
        /// Invalidations whose memory could not be named: a kernel thread (kcompactd, kdamond,
        /// kswapd) inside KVM's callback, where no function probe gave the range's mm. With -p
        /// they may have been the watched process's and are not counted as its.
        OwnerUnresolved => "owner_unresolved",
        /// KVM subscriptions not recorded because [`KVM_LOCKS_MAP`] was full.
        KvmLocksMapFull => "kvm_locks_map_full",
        /// Subscriber callbacks found but not recorded, so never timed: the table of discovered
        /// callbacks was full (or refused the insert on that CPU).
        CallbacksUndiscovered => "callbacks_undiscovered",
        /// VMs not remembered because every slot of [`VMS_MAP`] held a live VM: other threads'
        /// invalidations of their memory stay [`Counter::OwnerUnresolved`].
        VmsMapFull => "vms_map_full",
    }
}

/// Where an invalidation was seen.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// kvm:kvm_unmap_hva_range, inside KVM's invalidate_range_start callback.
    KvmUnmap = 0,
    /// kvm:kvm_age_hva, inside KVM's clear_young callback (reclaim aging).
    KvmAge = 1,
    /// __mmu_notifier_invalidate_range_start (every subscriber, function probes).
    RangeStart = 2,
}

/// How a subscriber callback says it refused (in a non-blockable context).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnKind {
    /// `int invalidate_range_start()`, clear_young…: non-zero (-EAGAIN) refuses.
    Int = 0,
    /// `bool invalidate()` of interval notifiers: false refuses.
    Bool = 1,
    /// `void invalidate_range_end()`: cannot refuse.
    Void = 2,
}

/// How a contended wait relates to invalidations, decided in the kernel when it begins: the
/// report ranks related waits and folds the rest (every other contended lock on the machine).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Relation {
    /// Nothing to do with invalidations: no stack taken, no waiter kept.
    Unrelated = 0,
    /// A learned kvm->mmu_lock.
    VmLock = 1,
    /// The waiter was inside an invalidation or a subscriber callback the tool follows.
    InInvalidation = 2,
    /// The waiter's own mm has subscribers (a VM's threads), or the lock is such an mm's
    /// mmap_lock.
    SubscribedMm = 3,
    /// The waiter is a process named with -p.
    Watched = 4,
}

/// What kind of lock a contention was on, as far as the kernel side can tell at once.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockClass {
    /// Not recognised in the kernel: user space looks it up in [`KVM_LOCKS_MAP`] and kallsyms.
    Other = 0,
    /// The waiter's own mm's mmap_lock.
    MmapLock = 1,
}

/// One group of invalidations: who invalidated, whose memory, how it was seen, which event.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InvalidationKey {
    /// The invalidating task's process and thread name.
    pub tgid: u32,
    /// The process whose memory it was: the mm's owner task (mm->owner, CONFIG_MEMCG), else the
    /// first tgid seen with the mm as its own; 0 when not known.
    pub owner_tgid: u32,
    /// A [`Source`].
    pub source: u32,
    /// `enum mmu_notifier_event` from the range (function probes); u32::MAX when the hook
    /// does not carry it (KVM's tracepoints).
    pub event: u32,
    pub comm: [u8; 16],
    /// Why it happened, from the invalidating thread's context.
    pub cause: crate::cause::Cause,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InvalidationStats {
    pub count: u64,
    /// Bytes of the sized ones: a whole address space's invalidation at exit (end ULONG_MAX)
    /// is counted in `whole_mm`, not here.
    pub bytes: u64,
    pub whole_mm: u64,
    /// log2 of each invalidation's size in bytes.
    pub sizes: [u64; SIZE_BUCKETS],
    /// invalidate_range_start → _end, log2 ns (function probes only).
    pub durations: [u64; TIME_BUCKETS],
    pub duration_ns: u64,
    pub ended: u64,
}

/// One group of contended acquisitions: which lock, how it was taken, by whom, from where.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitKey {
    pub lock: u64,
    /// Kernel stack of the waiter at contention_begin; negative when it could not be taken.
    pub stack_id: i64,
    /// contention_begin's flags (LCB_F_SPIN, _READ, _WRITE, _RT, _PERCPU, _MUTEX).
    pub flags: u32,
    pub tgid: u32,
    /// A [`LockClass`].
    pub class: u32,
    /// A [`Relation`]. Unrelated waits keep no stack, thread or name (tgid 0, comm zero), and
    /// other processes' mmap_locks fold into lock 0, so that their keys are bounded by the
    /// machine's locks, not by its processes.
    pub relation: u32,
    pub comm: [u8; 16],
    /// Why the waiter is doing what it does (the cause of the invalidation whose callback waits,
    /// when it waits inside one); zero for unrelated waits.
    pub cause: crate::cause::Cause,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WaitStats {
    pub count: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// log2 of each wait in ns.
    pub buckets: [u64; TIME_BUCKETS],
}

/// A waiter's open contention, keyed by thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WaitStash {
    pub key: WaitKey,
    /// The lock waited on: the key's may be a folded stand-in ([`DYNAMIC_LOCKS`]), and the
    /// wait's end must be matched with the lock itself.
    pub lock: u64,
    pub ts_ns: u64,
}

/// A VM's kvm->mmu_lock and who owns it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvmLock {
    /// The VM's process (the first tgid seen with the subscription in its mm).
    pub tgid: u32,
    pub _pad: u32,
    /// The `struct kvm`.
    pub kvm: u64,
}

/// One subscriber callback, by its function's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallbackKey {
    pub ip: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallbackStats {
    pub calls: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub bytes: u64,
    /// Calls in a non-blockable context (the OOM reaper) that returned a refusal.
    pub refused: u64,
    pub nonblocking: u64,
    pub buckets: [u64; TIME_BUCKETS],
    /// Time the callbacks spent waiting on contended locks (traced), part of `total_ns`.
    pub wait_ns: u64,
    /// Per size class (log2 bytes from [`FIT_SHIFT`]), a log2 histogram of the callback's own
    /// time (its lock waits left out): the fit of time against size takes each class's
    /// median, which one call stretched by preemption or a descheduled vCPU cannot move.
    pub fit_buckets: [[u64; TIME_BUCKETS]; FIT_CLASSES],
}

/// Which ops table a discovered callback was read from.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpsTable {
    /// `struct mmu_notifier_ops`, of a subscription on mm->notifier_subscriptions->list.
    Notifier = 0,
    /// `struct mmu_interval_notifier_ops`, of an interval notifier.
    Interval = 1,
}

/// A callback found in a subscriber's ops: the table and the member's byte offset in it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscoveredCallback {
    /// An [`OpsTable`].
    pub table: u32,
    pub member_offset: u32,
}

crate::user_pod!(DiscoveredCallback);

/// A callback in flight on a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallbackStash {
    pub ip: u64,
    pub ts_ns: u64,
    pub bytes: u64,
    pub blockable: u32,
    pub _pad: u32,
    /// Contended-lock waits that ended inside it so far.
    pub waited_ns: u64,
}

crate::user_pod!(InvalidationKey, InvalidationStats, WaitKey, WaitStats, KvmLock, CallbackKey, CallbackStats);
