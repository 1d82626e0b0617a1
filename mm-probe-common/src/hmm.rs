//! Records and map names shared by the HMM / MMU-notifier programs (mm-probe-ebpf `hmm.rs`,
//! `notifier.rs`) and `mm-probe retry-storm`.
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
/// Per-CPU array of u64 counters indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "HMM_COUNTERS";
/// Per-CPU hash map [`ReadBeginKey`] → u64: mmu_interval_read_begin() calls.
pub const READ_BEGINS_MAP: &str = "HMM_READ_BEGINS";
/// Hash map tgid (u32) → 1: the processes to watch when [`FILTER_TGIDS`] is set.
pub const TARGET_TGIDS_MAP: &str = "HMM_TARGET_TGIDS";
/// Hash map mm pointer (u64) → tgid (u32): mms whose memory is mirrored (seen in a walk or a
/// read_begin). Invalidations of other mms are counted, not streamed.
pub const MIRRORED_MMS_MAP: &str = "HMM_MIRRORED_MMS";
/// Per-CPU array of log2 buckets (nanoseconds): time spent in
/// __mmu_notifier_invalidate_range_start, i.e. in the subscribers' invalidate callbacks.
pub const CALLBACK_HIST_MAP: &str = "HMM_CALLBACK_NS";
/// Per-CPU array of log2 buckets (nanoseconds): invalidate_range_start → _end (the window in
/// which read_begin on an overlapping notifier waits).
pub const WINDOW_HIST_MAP: &str = "HMM_WINDOW_NS";
/// Per-CPU array of log2 buckets (bytes): sizes of KVM unmap/age ranges (tracepoints).
pub const KVM_SIZE_HIST_MAP: &str = "HMM_KVM_SIZE";

/// Per-CPU array of u64 indexed by `enum mmu_notifier_event` ([`NOTIFIER_EVENTS`] slots, the
/// last for values this build does not know): invalidations of mirrored mms by event, so that
/// a scrape can count them by event without reading the ring.
pub const INVALIDATIONS_BY_EVENT_MAP: &str = "HMM_INVALIDATIONS_BY_EVENT";
/// UNMAP … EXCLUSIVE (0..=7, unchanged 5.15 → 6.18), then one slot for anything else.
pub const NOTIFIER_EVENTS: u32 = 9;

/// Global u32: 1 = only the tgids in [`TARGET_TGIDS_MAP`], 0 = every process.
pub const FILTER_TGIDS: &str = "HMM_FILTER_TGIDS";
/// Global u32: 1 (default) = stream walks and invalidations through the rings; 0 = counters and
/// histograms only (the exporter, which reads nothing from the rings).
pub const STREAM_EVENTS: &str = "HMM_STREAM_EVENTS";

/// Slots of the log2 histograms (2^40 ns ≈ 18 min; 2^40 bytes = 1 TiB).
pub const LOG2_BUCKETS: u32 = 41;

/// Slots of [`COUNTERS_MAP`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// hmm_range_fault() returns seen.
    Walks = 0,
    /// … of which returned -EBUSY (the range was invalidated: the caller must retry).
    WalkBusy = 1,
    /// … of which returned another error.
    WalkErrors = 2,
    /// mmu_interval_read_begin() calls.
    ReadBegins = 3,
    /// __mmu_notifier_invalidate_range_start() on a mirrored mm.
    Invalidations = 4,
    /// … on an mm nothing here mirrors (KVM's VMM, another driver's process before its first
    /// walk): counted so the report can say they were excluded.
    InvalidationsOtherMm = 5,
    /// __mmu_notifier_invalidate_range_end() matched with its start.
    InvalidateEnds = 6,
    /// kvm:kvm_unmap_hva_range.
    KvmUnmap = 7,
    /// kvm:kvm_age_hva.
    KvmAge = 8,
    /// Walk-ring reservations that failed: walk events lost (counts above stay exact).
    LostWalkEvents = 9,
    /// A return probe found no matching entry (kretprobe maxactive overflow, or attached
    /// mid-call): that walk's duration is unknown.
    StashMisses = 10,
    /// mmu_interval_notifier_remove() on a mirrored mm.
    NotifierRemoves = 11,
    /// Invalidate-ring reservations that failed.
    LostInvalidateEvents = 12,
    /// Nanoseconds spent in invalidate_range_start (the sum of [`CALLBACK_HIST_MAP`]'s samples).
    CallbackNs = 13,
}

pub const COUNTER_SLOTS: u32 = 14;

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
    pub comm: [u8; 16],
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

/// Per-thread: the last mmu_interval_read_begin().
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SeqBegin {
    pub ts_ns: u64,
    pub notifier: u64,
}

crate::user_pod!(HmmEvent, ReadBeginKey, Stash, SeqBegin);
