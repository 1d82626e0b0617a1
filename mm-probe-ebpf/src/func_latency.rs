//! Entry-to-return time of traced kernel functions (madvise_cold_or_pageout_pte_range and the
//! `--func` targets), per task.
//!
//! A loaded fentry/fexit program is bound to one function (its BTF id is fixed at load), so the
//! object carries one entry/exit pair per function slot, each with its slot number built in;
//! the kprobe/kretprobe pairs mirror them for kernels where trampolines are refused or the
//! function has no BTF (module functions). Every pair feeds the same per-task state, which the
//! sched_switch program copies into wakeup spikes to say whether the blocker was inside one.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{fentry, fexit, kprobe, kretprobe, map},
    maps::{Array, LruHashMap, RingBuf},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, tracing::StackIdContext},
};
use mm_probe_common::latency::{Counter, FuncSpike, FuncState, MAX_FUNCS};

use crate::{
    kernel::{current_pid, current_tgid},
    sched::{count, current_syscall, record, stack_id, stream_spikes, threshold_ns},
};

/// Each task's traced-function state (LRU: exited tasks age out).
#[map]
pub(crate) static LAT_FUNC_STATE: LruHashMap<u32, FuncState> = LruHashMap::with_max_entries(32768, 0);
/// One all-zero FuncState to insert from (too big for the stack next to everything else).
#[map]
pub(crate) static LAT_FUNC_ZERO: Array<FuncState> = Array::with_max_entries(1, 0);
/// Slot 0 is 1 once user space attached a function probe: until then no task has function
/// state, and the sched programs skip looking for it (an array lookup is inlined; a hash lookup
/// is not).
#[map]
pub(crate) static LAT_FUNCS_TRACED: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static LAT_FUNC_SPIKES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// The function state of task `pid`, if a traced function ever ran in it.
#[inline(always)]
pub(crate) fn function_state(pid: u32) -> Option<*const FuncState> {
    if pid == 0 || LAT_FUNCS_TRACED.get(0).copied().unwrap_or(0) == 0 {
        return None;
    }
    LAT_FUNC_STATE.get_ptr(pid)
}

#[inline(always)]
fn func_entry(slot: usize) -> u32 {
    let pid = current_pid();
    let now = unsafe { bpf_ktime_get_ns() };
    let state = match LAT_FUNC_STATE.get_ptr_mut(pid) {
        Some(state) => state,
        None => {
            let inserted = match LAT_FUNC_ZERO.get(0) {
                Some(zero) => LAT_FUNC_STATE.insert(pid, zero, 0).is_ok(),
                None => false,
            };
            match LAT_FUNC_STATE.get_ptr_mut(pid) {
                Some(state) if inserted => state,
                _ => {
                    count(Counter::LostFuncEntries);
                    return 0;
                }
            }
        }
    };
    if let Some(entry) = unsafe { (*state).entry_ns.get_mut(slot) } {
        *entry = now;
    }
    0
}

#[inline(always)]
fn func_exit<C: StackIdContext>(ctx: &C, slot: usize) -> u32 {
    let pid = current_pid();
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(state) = LAT_FUNC_STATE.get_ptr_mut(pid) else { return 0 };
    let state = unsafe { &mut *state };
    let (Some(entry), Some(total), Some(calls)) =
        (state.entry_ns.get_mut(slot), state.total_ns.get_mut(slot), state.calls.get_mut(slot))
    else {
        return 0;
    };
    if *entry == 0 {
        // Entered before tracing started.
        return 0;
    }
    let entry_ns = *entry;
    let duration_ns = now.saturating_sub(entry_ns);
    *entry = 0;
    *total += duration_ns;
    *calls += 1;
    let over = duration_ns > threshold_ns();
    record(1 + slot as u32, duration_ns, over);
    if over && stream_spikes() {
        emit_spike(ctx, slot, pid, entry_ns, duration_ns);
    }
    0
}

#[inline(always)]
fn emit_spike<C: StackIdContext>(ctx: &C, slot: usize, pid: u32, entry_ns: u64, duration_ns: u64) {
    let Some(mut entry) = LAT_FUNC_SPIKES.reserve::<FuncSpike>(0) else {
        count(Counter::LostFuncSpikes);
        return;
    };
    let spike = unsafe { &mut *entry.as_mut_ptr() };
    spike.slot = slot as u32;
    spike.pid = pid;
    spike.tgid = current_tgid();
    spike.cpu = unsafe { bpf_get_smp_processor_id() };
    spike.entry_ns = entry_ns;
    spike.duration_ns = duration_ns;
    spike.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    spike.stack_id = stack_id(ctx);
    current_syscall(&mut spike.syscall);
    entry.submit(0);
}

/// One fentry/fexit and one kprobe/kretprobe pair per slot, named `lat_func_<kind>_<slot>`.
macro_rules! function_slots {
    ($(($slot:literal, $entry:ident, $exit:ident, $kprobe:ident, $kretprobe:ident)),* $(,)?) => {
        $(
            #[fentry]
            pub fn $entry(_ctx: FEntryContext) -> u32 {
                func_entry($slot)
            }

            #[fexit]
            pub fn $exit(ctx: FExitContext) -> u32 {
                func_exit(&ctx, $slot)
            }

            #[kprobe]
            pub fn $kprobe(_ctx: ProbeContext) -> u32 {
                func_entry($slot)
            }

            #[kretprobe]
            pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
                func_exit(&ctx, $slot)
            }
        )*
        const _: () = assert!([$($slot),*].len() == MAX_FUNCS);
    };
}

function_slots!(
    (0, lat_func_entry_0, lat_func_exit_0, lat_func_kprobe_0, lat_func_kretprobe_0),
    (1, lat_func_entry_1, lat_func_exit_1, lat_func_kprobe_1, lat_func_kretprobe_1),
    (2, lat_func_entry_2, lat_func_exit_2, lat_func_kprobe_2, lat_func_kretprobe_2),
    (3, lat_func_entry_3, lat_func_exit_3, lat_func_kprobe_3, lat_func_kretprobe_3),
    (4, lat_func_entry_4, lat_func_exit_4, lat_func_kprobe_4, lat_func_kretprobe_4),
    (5, lat_func_entry_5, lat_func_exit_5, lat_func_kprobe_5, lat_func_kretprobe_5),
    (6, lat_func_entry_6, lat_func_exit_6, lat_func_kprobe_6, lat_func_kretprobe_6),
    (7, lat_func_entry_7, lat_func_exit_7, lat_func_kprobe_7, lat_func_kretprobe_7),
);
