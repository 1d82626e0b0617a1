//! One trivial program per program type, each counting the target process's fsync(2) calls.
//! User space attaches whichever it wants to try; a count equal to the number of fsync calls the
//! test made proves the program type loads, attaches and fires on this kernel.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, map, raw_tracepoint, tracepoint},
    maps::{PerCpuArray, RingBuf},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RawTracePointContext, RetProbeContext,
        TracePointContext,
    },
};
use mm_probe_common::selftest::{RING_BYTES, RING_WAKEUP_BYTES, RingRecord, SLOT_COUNT, Slot};

use crate::kernel::{bump, current_pid, current_tgid, wakeup_flags};

#[unsafe(no_mangle)]
static SELFTEST_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SELFTEST_FSYNC_NR: Global<u64> = Global::new(u64::MAX);

#[map]
static SELFTEST_HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(SLOT_COUNT, 0);

#[inline(always)]
fn count(slot: Slot) -> u32 {
    if current_tgid() == SELFTEST_TGID.load() {
        bump(&SELFTEST_HITS, slot as u32, 1);
    }
    0
}

#[inline(always)]
fn count_fsync_syscall(slot: Slot, syscall_nr: u64) -> u32 {
    if syscall_nr == SELFTEST_FSYNC_NR.load() {
        count(slot);
    }
    0
}

#[tracepoint]
pub fn selftest_tracepoint(_ctx: TracePointContext) -> u32 {
    count(Slot::Tracepoint)
}

/// raw_syscalls:sys_enter(struct pt_regs *regs, long id)
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn selftest_raw_tracepoint(ctx: RawTracePointContext) -> u32 {
    count_fsync_syscall(Slot::RawTracepoint, ctx.arg::<u64>(1))
}

/// tp_btf/sys_enter(struct pt_regs *regs, long id)
#[btf_tracepoint(function = "sys_enter")]
pub fn selftest_btf_tracepoint(ctx: BtfTracePointContext) -> u32 {
    count_fsync_syscall(Slot::BtfTracepoint, ctx.arg::<u64>(1))
}

/// Returns at once. Attached where a capability's programs attach, it measures what the hook
/// itself costs the traced workload (the kernel's dispatch to any program there): the floor under
/// every tracer's overhead in `cargo xtask bench`.
#[btf_tracepoint(function = "sys_enter")]
pub fn selftest_noop_btf(_ctx: BtfTracePointContext) -> u32 {
    0
}

#[kprobe]
pub fn selftest_kprobe(_ctx: ProbeContext) -> u32 {
    count(Slot::Kprobe)
}

#[kretprobe]
pub fn selftest_kretprobe(_ctx: RetProbeContext) -> u32 {
    count(Slot::Kretprobe)
}

#[fentry]
pub fn selftest_fentry(_ctx: FEntryContext) -> u32 {
    count(Slot::Fentry)
}

#[fexit]
pub fn selftest_fexit(_ctx: FExitContext) -> u32 {
    count(Slot::Fexit)
}

#[map]
static SELFTEST_EVENTS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);
#[map]
static SELFTEST_RING_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// syscalls:sys_enter_getppid: one record per call of the target process.
#[tracepoint]
pub fn selftest_ring(_ctx: TracePointContext) -> u32 {
    if current_tgid() != SELFTEST_TGID.load() {
        return 0;
    }
    match SELFTEST_EVENTS.reserve::<RingRecord>(0) {
        Some(mut entry) => {
            entry.write(RingRecord {
                timestamp_ns: unsafe { bpf_ktime_get_ns() },
                pid: current_pid(),
                cpu: unsafe { bpf_get_smp_processor_id() },
            });
            entry.submit(wakeup_flags(&SELFTEST_EVENTS, RING_WAKEUP_BYTES));
        }
        None => bump(&SELFTEST_RING_LOST, 0, 1),
    }
    0
}
