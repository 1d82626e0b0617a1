//! retry-storm's kernel programs: HMM mirror walks and the MMU-notifier invalidations that fail
//! them.
//!
//! Walks: hmm_range_fault() entry/return, mmu_interval_read_begin() and
//! mmu_interval_notifier_remove(), read from mm/hmm.c and mm/mmu_notifier.c of 5.15, 6.1, 6.12
//! and 6.18 (docs/kernel-facts.md, "hmm_range_fault and its -EBUSY"): `int hmm_range_fault(struct hmm_range *)` and
//! `unsigned long mmu_interval_read_begin(struct mmu_interval_notifier *)` are unchanged across
//! them and out of line; mmu_interval_read_retry() is static inline and invisible.
//!
//! Invalidations: __mmu_notifier_invalidate_range_start/_end and KVM's kvm_unmap_hva_range /
//! kvm_age_hva tracepoints (docs/kernel-facts.md, "MMU-notifier invalidations"). No
//! `mmu_notifier:*` tracepoint exists in those kernels, hence the function probes. The `__` functions run only for mms with at least one subscriber, and only
//! mirrored mms (seen by a walk or a read_begin) are streamed; others are counted.
//! `struct mmu_notifier_range` lost its `vma` member in 6.6, so every member is read through a
//! BTF offset. `__mmu_notifier_invalidate_range_end` is `(range, bool only_end)` up to 6.5 and
//! `(range)` from 6.6; only argument 0 is read, which is the same in both.
//!
//! Counts go to per-CPU counters (exact even when a ring overflows); each walk and each
//! invalidation is also streamed so user space can join walks into retry chains and against
//! the invalidations that overlapped them.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{fentry, fexit, kprobe, kretprobe, map, raw_tracepoint, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{FEntryContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
};
use mm_probe_common::hmm::{
    COUNTER_SLOTS, Counter, EBUSY, EventKind, FailedSeq, HmmEvent, INVALIDATE_RING_BYTES, LOG2_BUCKETS,
    NOTIFIER_EVENTS, NotifierEvent, ReadBeginKey, SeqBegin, SeqState, Stash, WALK_RING_BYTES, WalkStash,
};
use mm_probe_common::{
    cause::{CAUSE_COUNT_SLOTS, Cause, count_slot},
    ring_wakeup_bytes,
};

use crate::kernel::{
    bump, current_pid, current_tgid, entry_programs, get_or_insert, log2_bucket, offsets::*, read_at, wakeup_flags,
};

/// Threads with a walk or invalidation in flight at once; LRU so a missed return never leaks.
const THREADS: u32 = 16384;

#[unsafe(no_mangle)]
static HMM_FILTER_TGIDS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static HMM_STREAM_EVENTS: Global<u32> = Global::new(1);

#[map]
static HMM_WALK_EVENTS: RingBuf = RingBuf::with_byte_size(WALK_RING_BYTES, 0);
#[map]
static HMM_INVALIDATE_EVENTS: RingBuf = RingBuf::with_byte_size(INVALIDATE_RING_BYTES, 0);
#[map]
static HMM_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);
#[map]
static HMM_READ_BEGINS: PerCpuHashMap<ReadBeginKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);
#[map]
static HMM_NOTIFIER_CALLBACKS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);
#[map]
static HMM_TARGET_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);
#[map]
static HMM_MIRRORED_MMS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(1024, 0);
#[map]
static HMM_WALK_STASH: LruHashMap<u32, WalkStash> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static HMM_LAST_FAILED: LruHashMap<u32, FailedSeq> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static HMM_SEQ_BEGIN: LruHashMap<u32, SeqBegin> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static HMM_INVALIDATE_STASH: LruHashMap<u32, Stash> = LruHashMap::with_max_entries(THREADS, 0);
#[map]
static HMM_CALLBACK_NS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_WINDOW_NS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_KVM_SIZE: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_INVALIDATIONS_BY_EVENT: PerCpuArray<u64> = PerCpuArray::with_max_entries(NOTIFIER_EVENTS, 0);
#[map]
static HMM_INVALIDATIONS_BY_CAUSE: PerCpuArray<u64> = PerCpuArray::with_max_entries(CAUSE_COUNT_SLOTS, 0);

/// kvm_unmap_hva_range / kvm_age_hva: `unsigned long start` at 8, `end` at 16 (the format is
/// byte-identical 5.15 → 6.18).
const KVM_START_OFFSET: usize = 8;
const KVM_END_OFFSET: usize = 16;

/// Whether `tgid` is one of the processes the user asked about (all when no -p was given).
#[inline(always)]
fn watched(tgid: u32) -> bool {
    HMM_FILTER_TGIDS.load() == 0 || unsafe { HMM_TARGET_TGIDS.get(tgid) }.is_some()
}

#[inline(always)]
fn count(counter: Counter) {
    bump(&HMM_COUNTERS, counter as u32, 1);
}

/// Adds a duration to a counter that sums nanoseconds.
#[inline(always)]
fn count_ns(counter: Counter, ns: u64) {
    bump(&HMM_COUNTERS, counter as u32, ns);
}

/// Remembers that `mm` is mirrored, so its invalidations are streamed.
#[inline(always)]
fn mark_mirrored(mm: u64, tgid: u32) {
    if mm != 0 && unsafe { HMM_MIRRORED_MMS.get(mm) }.is_none() {
        let _ = HMM_MIRRORED_MMS.insert(mm, tgid, 0);
    }
}

#[inline(always)]
fn is_mirrored(mm: u64) -> bool {
    mm != 0 && unsafe { HMM_MIRRORED_MMS.get(mm) }.is_some()
}

/// Reserves and fills one event in the ring for its kind; a full ring is counted, never hidden.
#[inline(always)]
fn emit(event: HmmEvent) {
    if HMM_STREAM_EVENTS.load() == 0 {
        return;
    }
    let (ring, lost, wake_at) = if event.kind == EventKind::Invalidate as u32 {
        (&HMM_INVALIDATE_EVENTS, Counter::LostInvalidateEvents, ring_wakeup_bytes(INVALIDATE_RING_BYTES))
    } else {
        (&HMM_WALK_EVENTS, Counter::LostWalkEvents, ring_wakeup_bytes(WALK_RING_BYTES))
    };
    match ring.reserve::<HmmEvent>(0) {
        Some(mut entry) => {
            entry.write(event);
            entry.submit(wakeup_flags(ring, wake_at));
        }
        None => count(lost),
    }
}

#[inline(always)]
fn blank_event(kind: EventKind, ts_ns: u64) -> HmmEvent {
    HmmEvent {
        kind: kind as u32,
        pid: current_pid(),
        tgid: current_tgid(),
        code: 0,
        ts_ns,
        duration_ns: 0,
        seq_begin_ns: 0,
        notifier: 0,
        mm: 0,
        start: 0,
        end: 0,
        interval_start: 0,
        interval_last: 0,
        seq: 0,
        seq_state: SeqState::Unread as u32,
        begin_overtaken: 0,
        cause: Cause::default(),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    }
}

#[inline(always)]
fn walk_enter(range: u64) -> u32 {
    if !watched(current_tgid()) {
        return 0;
    }
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    let (seq, seq_state) = entry_seq(range);
    let stash = WalkStash { ts_ns, range, seq, seq_state: seq_state as u32, _pad: 0 };
    let _ = HMM_WALK_STASH.insert(current_pid(), stash, 0);
    0
}

/// The walk's sequence and whether the notifier had already moved past it: read at entry,
/// because at return an invalidation during the walk may have moved it too, and only a
/// sequence stale before the walk began tells a retry that cannot succeed from a collision.
#[inline(always)]
fn entry_seq(range: u64) -> (u64, SeqState) {
    let notifier: Option<u64> = read_at(range, OFF_HMM_RANGE_NOTIFIER.load());
    let seq: Option<u64> = read_at(range, OFF_HMM_RANGE_NOTIFIER_SEQ.load());
    let current: Option<u64> = notifier.and_then(|n| read_at(n, OFF_INTERVAL_NOTIFIER_INVALIDATE_SEQ.load()));
    match (seq, current) {
        (Some(seq), Some(current)) if seq == current => (seq, SeqState::Current),
        (Some(seq), Some(_)) => (seq, SeqState::Stale),
        _ => (0, SeqState::Unread),
    }
}

/// `range` is the argument when the return probe can read it (fexit), else 0 (kretprobe).
#[inline(always)]
fn walk_return(range: u64, ret: i32) -> u32 {
    let (pid, tgid) = (current_pid(), current_tgid());
    if !watched(tgid) {
        return 0;
    }
    let now = unsafe { bpf_ktime_get_ns() };
    let stash = unsafe { HMM_WALK_STASH.get(pid) }.copied();
    let _ = HMM_WALK_STASH.remove(pid);
    count(Counter::Walks);
    if ret == -EBUSY {
        count(Counter::WalkBusy);
    } else {
        // The loop ended (success or a hard error): the next failure starts a new one.
        let _ = HMM_LAST_FAILED.remove(pid);
        if ret != 0 {
            count(Counter::WalkErrors);
        }
    }
    let mut event = blank_event(EventKind::Walk, now);
    event.code = ret;
    let range = match stash {
        Some(s) => {
            event.ts_ns = s.ts_ns;
            event.duration_ns = now - s.ts_ns;
            event.seq = s.seq;
            event.seq_state = s.seq_state;
            if range != 0 { range } else { s.range }
        }
        None => {
            count(Counter::StashMisses);
            range
        }
    };
    let notifier: u64 = read_at(range, OFF_HMM_RANGE_NOTIFIER.load()).unwrap_or(0);
    event.notifier = notifier;
    event.start = read_at(range, OFF_HMM_RANGE_START.load()).unwrap_or(0);
    event.end = read_at(range, OFF_HMM_RANGE_END.load()).unwrap_or(0);
    event.mm = read_at(notifier, OFF_INTERVAL_NOTIFIER_MM.load()).unwrap_or(0);
    event.interval_start = read_at(notifier, OFF_INTERVAL_NOTIFIER_START.load()).unwrap_or(0);
    event.interval_last = read_at(notifier, OFF_INTERVAL_NOTIFIER_LAST.load()).unwrap_or(0);
    if let Some(begin) = unsafe { HMM_SEQ_BEGIN.get(pid) }
        && begin.notifier == notifier
    {
        event.seq_begin_ns = begin.ts_ns;
        event.begin_overtaken = begin.overtaken;
    }
    if ret == -EBUSY && mark_stale_retry(pid, &mut event) {
        count(Counter::StaleRetries);
    }
    mark_mirrored(event.mm, tgid);
    emit(event);
    0
}

/// Whether a failed walk is a stale-sequence retry: stale at entry, with the notifier and
/// sequence of the same thread's previous walk, which failed too (the driver did not call
/// read_begin again). Marks the event, and remembers this failure for the thread's next walk.
#[inline(always)]
fn mark_stale_retry(pid: u32, event: &mut HmmEvent) -> bool {
    let this = FailedSeq { notifier: event.notifier, seq: event.seq };
    let previous = unsafe { HMM_LAST_FAILED.get(pid) }.copied();
    let retry = event.seq_state == SeqState::Stale as u32 && previous == Some(this);
    if retry {
        event.seq_state = SeqState::StaleRetry as u32;
    }
    let _ = if event.seq_state == SeqState::Unread as u32 {
        HMM_LAST_FAILED.remove(pid)
    } else {
        HMM_LAST_FAILED.insert(pid, this, 0)
    };
    retry
}

#[inline(always)]
fn read_begin(notifier: u64) -> u32 {
    let tgid = current_tgid();
    if !watched(tgid) {
        return 0;
    }
    count(Counter::ReadBegins);
    let key = ReadBeginKey { notifier, tgid, _pad: 0 };
    match get_or_insert!(HMM_READ_BEGINS, key, 0u64) {
        Some(calls) => unsafe { *calls += 1 },
        None => count(Counter::ReadBeginsMapFull),
    }
    if unsafe { HMM_NOTIFIER_CALLBACKS.get(notifier) }.is_none() {
        let ops: u64 = read_at(notifier, OFF_INTERVAL_NOTIFIER_OPS.load()).unwrap_or(0);
        let callback: u64 = read_at(ops, OFF_INTERVAL_OPS_INVALIDATE.load()).unwrap_or(0);
        let _ = HMM_NOTIFIER_CALLBACKS.insert(notifier, callback, 0);
    }
    let mm: u64 = read_at(notifier, OFF_INTERVAL_NOTIFIER_MM.load()).unwrap_or(0);
    let overtaken = u32::from(overtaken(notifier, mm));
    let begin = SeqBegin { ts_ns: unsafe { bpf_ktime_get_ns() }, notifier, overtaken, _pad: 0 };
    let _ = HMM_SEQ_BEGIN.insert(current_pid(), begin, 0);
    mark_mirrored(mm, tgid);
    0
}

/// Whether an invalidation of `mm` is in progress that has not yet reached `notifier`, as
/// read_begin itself decides: the mm's sequence is odd while one runs, and it waits only when
/// the notifier's own sequence already equals it (its callback ran). Such an invalidation began
/// before this read_begin and can still fail the walk after it.
#[inline(always)]
fn overtaken(notifier: u64, mm: u64) -> bool {
    let subscriptions: u64 = read_at(mm, OFF_MM_NOTIFIER_SUBSCRIPTIONS.load()).unwrap_or(0);
    let mm_seq: Option<u64> = read_at(subscriptions, OFF_SUBSCRIPTIONS_INVALIDATE_SEQ.load());
    let own: Option<u64> = read_at(notifier, OFF_INTERVAL_NOTIFIER_INVALIDATE_SEQ.load());
    matches!((mm_seq, own), (Some(mm_seq), Some(own)) if mm_seq & 1 == 1 && own != mm_seq)
}

#[inline(always)]
fn notifier_remove(notifier: u64) -> u32 {
    let mm: u64 = read_at(notifier, OFF_INTERVAL_NOTIFIER_MM.load()).unwrap_or(0);
    if !is_mirrored(mm) {
        return 0;
    }
    count(Counter::NotifierRemoves);
    let mut event = blank_event(EventKind::NotifierRemove, unsafe { bpf_ktime_get_ns() });
    event.notifier = notifier;
    event.mm = mm;
    event.interval_start = read_at(notifier, OFF_INTERVAL_NOTIFIER_START.load()).unwrap_or(0);
    event.interval_last = read_at(notifier, OFF_INTERVAL_NOTIFIER_LAST.load()).unwrap_or(0);
    emit(event);
    0
}

#[inline(always)]
fn invalidate_start(range: u64) -> u32 {
    let mm: u64 = read_at(range, OFF_NOTIFIER_RANGE_MM.load()).unwrap_or(0);
    if !is_mirrored(mm) {
        count(Counter::InvalidationsOtherMm);
        return 0;
    }
    count(Counter::Invalidations);
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = HMM_INVALIDATE_STASH.insert(current_pid(), Stash { ts_ns: now, arg: range }, 0);
    let mut event = blank_event(EventKind::Invalidate, now);
    event.mm = mm;
    event.start = read_at(range, OFF_NOTIFIER_RANGE_START.load()).unwrap_or(0);
    event.end = read_at(range, OFF_NOTIFIER_RANGE_END.load()).unwrap_or(0);
    let kind = read_at::<u32>(range, OFF_NOTIFIER_RANGE_EVENT.load()).unwrap_or(u32::MAX);
    // Unknown and unreadable events share the last slot.
    let unknown = NotifierEvent::Unknown as u32;
    bump(&HMM_INVALIDATIONS_BY_EVENT, if kind < unknown { kind } else { unknown }, 1);
    event.code = kind as i32;
    // Counted for the exporter, whose ring is off; the record carries the whole cause.
    event.cause = crate::cause::classify();
    bump(&HMM_INVALIDATIONS_BY_CAUSE, count_slot(&event.cause, kind), 1);
    emit(event);
    0
}

/// The subscribers' callbacks ran inside invalidate_range_start: its duration is theirs.
#[inline(always)]
fn invalidate_start_return() -> u32 {
    if let Some(stash) = unsafe { HMM_INVALIDATE_STASH.get(current_pid()) } {
        let elapsed = unsafe { bpf_ktime_get_ns() } - stash.ts_ns;
        bump(&HMM_CALLBACK_NS, log2_bucket(elapsed, LOG2_BUCKETS), 1);
        count_ns(Counter::CallbackNs, elapsed);
    }
    0
}

#[inline(always)]
fn invalidate_end(range: u64) -> u32 {
    let pid = current_pid();
    let Some(stash) = (unsafe { HMM_INVALIDATE_STASH.get(pid) }).copied() else { return 0 };
    if stash.arg != range {
        return 0;
    }
    let _ = HMM_INVALIDATE_STASH.remove(pid);
    count(Counter::InvalidateEnds);
    let elapsed = unsafe { bpf_ktime_get_ns() } - stash.ts_ns;
    bump(&HMM_WINDOW_NS, log2_bucket(elapsed, LOG2_BUCKETS), 1);
    0
}

#[inline(always)]
fn kvm_range(counter: Counter, start: u64, end: u64) -> u32 {
    if !watched(current_tgid()) {
        return 0;
    }
    count(counter);
    bump(&HMM_KVM_SIZE, log2_bucket(end.saturating_sub(start), LOG2_BUCKETS), 1);
    0
}

/// fentry/hmm_range_fault(struct hmm_range *range)
#[fentry]
pub fn hmm_fault_entry(ctx: FEntryContext) -> u32 {
    walk_enter(ctx.arg::<u64>(0))
}

/// fexit/hmm_range_fault: argument 0 is the range, slot 1 the int return value.
#[fexit]
pub fn hmm_fault_exit(ctx: FExitContext) -> u32 {
    walk_return(ctx.arg::<u64>(0), ctx.arg::<u64>(1) as i32)
}

#[kprobe]
pub fn hmm_fault_kprobe(ctx: ProbeContext) -> u32 {
    walk_enter(ctx.arg::<u64>(0).unwrap_or(0))
}

/// kretprobe/hmm_range_fault: arguments are gone at return; the range comes from the stash.
#[kretprobe]
pub fn hmm_fault_kretprobe(ctx: RetProbeContext) -> u32 {
    walk_return(0, ctx.ret::<u64>() as i32)
}

// mmu_interval_read_begin(struct mmu_interval_notifier *interval_sub)
entry_programs!(read_begin_fentry, read_begin_kprobe => read_begin);

// mmu_interval_notifier_remove(struct mmu_interval_notifier *interval_sub)
entry_programs!(notifier_remove_fentry, notifier_remove_kprobe => notifier_remove);

/// fentry/__mmu_notifier_invalidate_range_start(struct mmu_notifier_range *range)
#[fentry]
pub fn invalidate_start_fentry(ctx: FEntryContext) -> u32 {
    invalidate_start(ctx.arg::<u64>(0))
}

#[fexit]
pub fn invalidate_start_fexit(_ctx: FExitContext) -> u32 {
    invalidate_start_return()
}

#[kprobe]
pub fn invalidate_start_kprobe(ctx: ProbeContext) -> u32 {
    invalidate_start(ctx.arg::<u64>(0).unwrap_or(0))
}

#[kretprobe]
pub fn invalidate_start_kretprobe(_ctx: RetProbeContext) -> u32 {
    invalidate_start_return()
}

// __mmu_notifier_invalidate_range_end(struct mmu_notifier_range *range[, bool only_end])
entry_programs!(invalidate_end_fentry, invalidate_end_kprobe => invalidate_end);

/// The classic tracepoint's record.
#[inline(always)]
fn kvm_record(ctx: &TracePointContext, counter: Counter) -> u32 {
    let start: u64 = unsafe { ctx.read_at(KVM_START_OFFSET) }.unwrap_or(0);
    let end: u64 = unsafe { ctx.read_at(KVM_END_OFFSET) }.unwrap_or(0);
    kvm_range(counter, start, end)
}

#[tracepoint]
pub fn kvm_unmap_hva_range(ctx: TracePointContext) -> u32 {
    kvm_record(&ctx, Counter::KvmUnmap)
}

#[tracepoint]
pub fn kvm_age_hva(ctx: TracePointContext) -> u32 {
    kvm_record(&ctx, Counter::KvmAge)
}

/// raw_tracepoint/kvm_unmap_hva_range(unsigned long start, unsigned long end[, …]): preferred,
/// as a raw tracepoint is not skipped while a map syscall holds the CPU's guard.
#[raw_tracepoint(tracepoint = "kvm_unmap_hva_range")]
pub fn kvm_unmap_hva_range_raw(ctx: RawTracePointContext) -> u32 {
    kvm_range(Counter::KvmUnmap, ctx.arg::<u64>(0), ctx.arg::<u64>(1))
}

#[raw_tracepoint(tracepoint = "kvm_age_hva")]
pub fn kvm_age_hva_raw(ctx: RawTracePointContext) -> u32 {
    kvm_range(Counter::KvmAge, ctx.arg::<u64>(0), ctx.arg::<u64>(1))
}
