//! Records and map names shared by the HMM / MMU-notifier programs (mm-probe-ebpf
//! `retry_storm.rs`) and `mm-probe retry-storm`.
//!
//! Counts that must be exact (walks, -EBUSY returns, invalidations) are kept in per-CPU
//! counters in the kernel; what user space must join (walks into retry chains, invalidations
//! against the walks they overlapped) is streamed as [`HmmEvent`]s through one ring buffer.

/// Ring buffer of [`HmmEvent`]s of kind Walk and NotifierRemove. Separate from the
/// invalidations so that an invalidation storm cannot crowd out the walks that retry chains
/// are built from.
pub const WALK_EVENTS_MAP: &str = "HMM_WALK_EVENTS";
/// Ring buffer of [`HmmEvent`]s of kind Invalidate.
pub const INVALIDATE_EVENTS_MAP: &str = "HMM_INVALIDATE_EVENTS";
/// The rings' sizes in bytes (powers of two, multiples of the page size).
pub const WALK_RING_BYTES: u32 = 2 << 20;
pub const INVALIDATE_RING_BYTES: u32 = 8 << 20;
/// Per-CPU array of u64 counters indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "HMM_COUNTERS";
/// Per-CPU hash map [`ReadBeginKey`] → u64: mmu_interval_read_begin() calls.
pub const READ_BEGINS_MAP: &str = "HMM_READ_BEGINS";
/// LRU hash map notifier pointer (u64) → its ops->invalidate (u64): the subscriber's callback,
/// whose symbol names the driver.
pub const NOTIFIER_CALLBACKS_MAP: &str = "HMM_NOTIFIER_CALLBACKS";
/// Hash map tgid (u32) → 1: the processes to watch when [`FILTER_TGIDS`] is set.
pub const TARGET_TGIDS_MAP: &str = "HMM_TARGET_TGIDS";
/// Hash map mm pointer (u64) → tgid (u32): mms whose memory is mirrored (seen in a walk or a
/// read_begin). Invalidations of other mms are counted, not streamed.
pub const MIRRORED_MMS_MAP: &str = "HMM_MIRRORED_MMS";
/// LRU hash, thread id → [`WalkStash`]: the walks in flight (entered, not yet returned).
pub const WALK_STASH_MAP: &str = "HMM_WALK_STASH";
/// LRU hash, thread id → [`SeqBegin`]: each thread's last read_begin.
pub const SEQ_BEGIN_MAP: &str = "HMM_SEQ_BEGIN";
/// Per-CPU array of log2 buckets (nanoseconds): time spent in
/// __mmu_notifier_invalidate_range_start, i.e. in the subscribers' invalidate callbacks.
pub const CALLBACK_HIST_MAP: &str = "HMM_CALLBACK_NS";
/// Per-CPU array of log2 buckets (nanoseconds): invalidate_range_start → _end (the window in
/// which read_begin on an overlapping notifier waits).
pub const WINDOW_HIST_MAP: &str = "HMM_WINDOW_NS";
/// Per-CPU array of log2 buckets (bytes): sizes of KVM unmap/age ranges (tracepoints).
pub const KVM_SIZE_HIST_MAP: &str = "HMM_KVM_SIZE";

/// Per-CPU array of u64 indexed by [`NotifierEvent`] ([`NOTIFIER_EVENTS`] slots, the last,
/// [`NotifierEvent::Unknown`], for values this build does not know): invalidations of mirrored
/// mms by event, so that a scrape can count them by event without reading the ring.
pub const INVALIDATIONS_BY_EVENT_MAP: &str = "HMM_INVALIDATIONS_BY_EVENT";
/// Per-CPU array of u64 indexed by [`crate::cause::count_slot`]
/// ([`crate::cause::CAUSE_COUNT_SLOTS`] slots): the same invalidations by why they happened, so
/// that a scrape can count them by cause without reading the ring.
pub const INVALIDATIONS_BY_CAUSE_MAP: &str = "HMM_INVALIDATIONS_BY_CAUSE";

/// Global u32: 1 = only the tgids in [`TARGET_TGIDS_MAP`], 0 = every process.
pub const FILTER_TGIDS: &str = "HMM_FILTER_TGIDS";
/// Global u32: 1 (default) = stream walks and invalidations through the rings; 0 = counters and
/// histograms only (the exporter, which reads nothing from the rings).
pub const STREAM_EVENTS: &str = "HMM_STREAM_EVENTS";

/// Slots of the log2 histograms (2^40 ns ≈ 18 min; 2^40 bytes = 1 TiB).
pub const LOG2_BUCKETS: u32 = 41;

/// errno 16, EBUSY (include/uapi/asm-generic/errno-base.h, which every architecture's errno.h
/// includes): hmm_range_fault() returns `-EBUSY` when an invalidation moved the
/// notifier's sequence during the walk, and the caller must retry. Both the kernel programs and
/// user space compare a walk's return value with `-EBUSY`.
pub const EBUSY: i32 = 16;

/// Declares a `#[repr(u32)]` enum whose variants number the slots of a map, 0 upwards in the
/// order written, with `ALL` (every variant in slot order) and `COUNT` (how many slots the map
/// needs) derived from the list, so adding a variant cannot leave the map too small.
macro_rules! slots {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$doc])* $variant,)+
        }

        impl $name {
            /// Every slot, in slot order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];
            /// Slots in the map.
            pub const COUNT: u32 = Self::ALL.len() as u32;
        }
    };
}

slots! {
    /// Slots of [`COUNTERS_MAP`].
    pub enum Counter {
        /// hmm_range_fault() returns seen.
        Walks,
        /// … of which returned -EBUSY (the range was invalidated: the caller must retry).
        WalkBusy,
        /// … of which returned another error.
        WalkErrors,
        /// mmu_interval_read_begin() calls.
        ReadBegins,
        /// __mmu_notifier_invalidate_range_start() on a mirrored mm.
        Invalidations,
        /// … on an mm nothing here mirrors (KVM's VMM, another driver's process before its first
        /// walk): counted so the report can say they were excluded.
        InvalidationsOtherMm,
        /// __mmu_notifier_invalidate_range_end() matched with its start.
        InvalidateEnds,
        /// kvm:kvm_unmap_hva_range.
        KvmUnmap,
        /// kvm:kvm_age_hva.
        KvmAge,
        /// Walk-ring reservations that failed: walk events lost (counts above stay exact).
        LostWalkEvents,
        /// A return probe found no matching entry (kretprobe maxactive overflow, or attached
        /// mid-call): that walk's duration is unknown.
        StashMisses,
        /// mmu_interval_notifier_remove() on a mirrored mm.
        NotifierRemoves,
        /// Invalidate-ring reservations that failed.
        LostInvalidateEvents,
        /// Nanoseconds spent in invalidate_range_start (the sum of [`CALLBACK_HIST_MAP`]'s
        /// samples).
        CallbackNs,
        /// read_begin calls not counted by caller because [`READ_BEGINS_MAP`] was full (the
        /// total in `ReadBegins` stays exact).
        ReadBeginsMapFull,
        /// -EBUSY returns of stale-sequence retries ([`SeqState::StaleRetry`]): exact even when
        /// walk events are lost.
        StaleRetries,
    }
}

/// Slots of [`COUNTERS_MAP`].
pub const COUNTER_SLOTS: u32 = Counter::COUNT;

slots! {
    /// `enum mmu_notifier_event` (include/linux/mmu_notifier.h), the slots of
    /// [`INVALIDATIONS_BY_EVENT_MAP`]: UNMAP … EXCLUSIVE are 0..=7 in that header of 5.15, 6.1,
    /// 6.12 and 6.18 alike (docs/kernel-facts.md, "`enum mmu_notifier_event` values"), then one
    /// slot for any value this build does not know.
    pub enum NotifierEvent {
        Unmap,
        Clear,
        ProtectionVma,
        ProtectionPage,
        SoftDirty,
        Release,
        Migrate,
        Exclusive,
        Unknown,
    }
}

/// Slots of [`INVALIDATIONS_BY_EVENT_MAP`].
pub const NOTIFIER_EVENTS: u32 = NotifierEvent::COUNT;

impl NotifierEvent {
    /// The event a `range->event` value names; anything else is `Unknown`.
    pub fn from_raw(value: i32) -> Self {
        usize::try_from(value).ok().and_then(|slot| Self::ALL.get(slot)).copied().unwrap_or(Self::Unknown)
    }

    /// The kernel's name without its `MMU_NOTIFY_` prefix, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unmap => "UNMAP",
            Self::Clear => "CLEAR",
            Self::ProtectionVma => "PROTECTION_VMA",
            Self::ProtectionPage => "PROTECTION_PAGE",
            Self::SoftDirty => "SOFT_DIRTY",
            Self::Release => "RELEASE",
            Self::Migrate => "MIGRATE",
            Self::Exclusive => "EXCLUSIVE",
            Self::Unknown => "UNKNOWN",
        }
    }
}

/// What an [`HmmEvent`] records.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// One hmm_range_fault() call, emitted at its return.
    Walk = 1,
    /// One __mmu_notifier_invalidate_range_start() on a mirrored mm, emitted at its entry.
    Invalidate = 2,
    /// mmu_interval_notifier_remove(): the driver is done with this notifier; an open retry
    /// chain on it has ended.
    NotifierRemove = 3,
}

impl EventKind {
    pub fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Walk),
            2 => Some(Self::Invalidate),
            3 => Some(Self::NotifierRemove),
            _ => None,
        }
    }
}

/// One streamed event. Fields not meaningful for a kind are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HmmEvent {
    /// [`EventKind`].
    pub kind: u32,
    /// Thread and process of the caller (the walker, or the task that invalidated).
    pub pid: u32,
    pub tgid: u32,
    /// Walk: hmm_range_fault()'s return value. Invalidate: `enum mmu_notifier_event`.
    pub code: i32,
    /// Walk: entry time. Invalidate: entry time. Remove: time. (bpf_ktime_get_ns, CLOCK_MONOTONIC)
    pub ts_ns: u64,
    /// Walk: entry to return. 0 when the entry was not seen.
    pub duration_ns: u64,
    /// Walk: when this thread last called mmu_interval_read_begin() on the same notifier
    /// (the start of the window in which an invalidation fails the walk); 0 if not seen.
    pub seq_begin_ns: u64,
    /// Walk, remove: the `struct mmu_interval_notifier *`. Invalidate: 0.
    pub notifier: u64,
    /// The `struct mm_struct *` walked or invalidated.
    pub mm: u64,
    /// Walk: `hmm_range.start/end`. Invalidate: `mmu_notifier_range.start/end`.
    pub start: u64,
    pub end: u64,
    /// Walk, remove: the notifier's interval, `interval_tree.start` and `.last` (inclusive).
    pub interval_start: u64,
    pub interval_last: u64,
    /// Walk: `hmm_range.notifier_seq` at entry, the sequence the driver's read_begin returned
    /// (meaningful when `seq_state` is not [`SeqState::Unread`]).
    pub seq: u64,
    /// Walk: [`SeqState`] at entry.
    pub seq_state: u32,
    /// Walk: [`SeqBegin::overtaken`] of the read_begin before it (its invalidation began
    /// before the window that `seq_begin_ns` opens).
    pub begin_overtaken: u32,
    /// Invalidate: why it happened, decided in the invalidating thread.
    pub cause: crate::cause::Cause,
    pub comm: [u8; 16],
}

/// How a walk's sequence stood against its notifier's at the walk's entry.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqState {
    /// Entry not seen, or the layout to read either sequence is missing on this kernel.
    Unread = 0,
    /// Equal: only an invalidation from now on can fail the walk.
    Current = 1,
    /// The notifier's sequence had already moved past the walk's: the walk fails whatever
    /// happens during it (hmm_range_fault checks the sequence before it walks).
    Stale = 2,
    /// Stale, and a retry: the same thread's previous walk failed on the same notifier with
    /// this very sequence, so the driver did not take a new one. Set at the walk's return.
    StaleRetry = 3,
}

impl SeqState {
    pub fn from_u32(value: u32) -> Self {
        match value {
            1 => Self::Current,
            2 => Self::Stale,
            3 => Self::StaleRetry,
            _ => Self::Unread,
        }
    }
}

/// Key of [`READ_BEGINS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBeginKey {
    pub notifier: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// Per-thread entry state for the return probes (walks and invalidate_range_start).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stash {
    pub ts_ns: u64,
    /// The first argument (hmm_range or mmu_notifier_range pointer), for kretprobes, which
    /// cannot read arguments, and to pair invalidate_range_start with its _end.
    pub arg: u64,
}

/// Per-thread entry state of a walk: when it began, its range, and its sequence's state then.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkStash {
    pub ts_ns: u64,
    /// The `struct hmm_range *`, for kretprobes, which cannot read arguments at return.
    pub range: u64,
    pub seq: u64,
    /// [`SeqState`].
    pub seq_state: u32,
    pub _pad: u32,
}

/// Per-thread: the notifier and sequence of the thread's last walk, when it failed with a
/// sequence read at its entry (absent after a walk that did not fail).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedSeq {
    pub notifier: u64,
    pub seq: u64,
}

/// Per-thread: the last mmu_interval_read_begin().
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SeqBegin {
    pub ts_ns: u64,
    pub notifier: u64,
    /// 1 when an invalidation of the mm was in progress and had not yet moved this notifier's
    /// sequence: read_begin did not wait for it, and it can still fail the walk.
    pub overtaken: u32,
    pub _pad: u32,
}

crate::user_pod!(HmmEvent, ReadBeginKey, Stash, WalkStash, FailedSeq, SeqBegin);
