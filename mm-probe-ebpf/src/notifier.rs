//! MMU-notifier invalidations: __mmu_notifier_invalidate_range_start/_end and KVM's
//! kvm_unmap_hva_range / kvm_age_hva tracepoints. See docs/kernel-facts.md#mmu-notifier.
//!
//! The `__` functions run only for mms with at least one subscriber, and only mirrored mms
//! (seen by a walk or a read_begin, see `hmm.rs`) are streamed; others are counted.
//! `struct mmu_notifier_range` lost its `vma` member in 6.6, so every member is read through a
//! BTF offset. `__mmu_notifier_invalidate_range_end` is `(range, bool only_end)` up to 6.5 and
//! `(range)` from 6.6; only argument 0 is read, which is the same in both.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{fentry, fexit, kprobe, kretprobe, map, tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use mm_probe_common::hmm::{Counter, EventKind, LOG2_BUCKETS, NOTIFIER_EVENTS, Stash};

use crate::{
    hmm::{blank_event, count, count_ns, emit, is_mirrored, watched},
    kernel::{bump, current_pid, current_tgid, log2_bucket, offsets::*, read_at},
};

#[map]
static HMM_INVALIDATE_STASH: LruHashMap<u32, Stash> = LruHashMap::with_max_entries(16384, 0);
#[map]
static HMM_CALLBACK_NS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_WINDOW_NS: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_KVM_SIZE: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOG2_BUCKETS, 0);
#[map]
static HMM_INVALIDATIONS_BY_EVENT: PerCpuArray<u64> = PerCpuArray::with_max_entries(NOTIFIER_EVENTS, 0);

/// kvm_unmap_hva_range / kvm_age_hva: `unsigned long start` at 8, `end` at 16 (the format is
/// byte-identical 5.15 → 6.18).
const KVM_START_OFFSET: usize = 8;
const KVM_END_OFFSET: usize = 16;

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
    bump(&HMM_INVALIDATIONS_BY_EVENT, if kind < NOTIFIER_EVENTS - 1 { kind } else { NOTIFIER_EVENTS - 1 }, 1);
    event.code = kind as i32;
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
fn kvm_range(ctx: &TracePointContext, counter: Counter) -> u32 {
    if !watched(current_tgid()) {
        return 0;
    }
    let start: u64 = unsafe { ctx.read_at(KVM_START_OFFSET) }.unwrap_or(0);
    let end: u64 = unsafe { ctx.read_at(KVM_END_OFFSET) }.unwrap_or(0);
    count(counter);
    bump(&HMM_KVM_SIZE, log2_bucket(end.saturating_sub(start), LOG2_BUCKETS), 1);
    0
}

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

/// fentry/__mmu_notifier_invalidate_range_end(struct mmu_notifier_range *range[, bool only_end])
#[fentry]
pub fn invalidate_end_fentry(ctx: FEntryContext) -> u32 {
    invalidate_end(ctx.arg::<u64>(0))
}

#[kprobe]
pub fn invalidate_end_kprobe(ctx: ProbeContext) -> u32 {
    invalidate_end(ctx.arg::<u64>(0).unwrap_or(0))
}

#[tracepoint]
pub fn kvm_unmap_hva_range(ctx: TracePointContext) -> u32 {
    kvm_range(&ctx, Counter::KvmUnmap)
}

#[tracepoint]
pub fn kvm_age_hva(ctx: TracePointContext) -> u32 {
    kvm_range(&ctx, Counter::KvmAge)
}
