//! Wakeup latency, keyed by pid for every task at once (ftrace's wakeup_rt follows one task
//! system-wide; see kernel/trace/trace_sched_wakeup.c).
//!
//! T0 is sched:sched_wakeup / sched_wakeup_new, which fire in ttwu_do_wakeup() and
//! wake_up_new_task() once the task is on its runqueue (the same T0 as wakeup_rt; sched_waking
//! would add the time to get onto the runqueue). The end is the sched:sched_switch whose
//! `next_pid` is the task. At that switch the task that switched away (`prev`) is the one that
//! held the CPU: its kernel stack, its traced-function state and its syscall go into the spike.
//! raw_syscalls:sys_enter/sys_exit keep each task's current syscall for that purpose.
//!
//! Tracepoint field offsets come from user space (read from tracefs `format`); the defaults are
//! the layout every non-RT build since 5.x has.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{TracePointContext, tracing::StackIdContext},
};
use mm_probe_common::latency::{
    COUNTER_COUNT, Counter, CpuCurrent, FILTER_ALL, FILTER_PIDS, FuncState, LatencyHist, MAX_CPUS, QUANTITIES,
    QUANTITY_WAKEUP, SyscallState, TaskWakeups, WakeupSpike, WakeupStart, hist_slot,
};

use crate::{
    func_latency::LAT_FUNC_STATE,
    kernel::{bump, log2_bucket},
};

#[unsafe(no_mangle)]
static LAT_THRESHOLD_NS: Global<u64> = Global::new(500_000);
#[unsafe(no_mangle)]
static LAT_FILTER_MODE: Global<u32> = Global::new(0);

#[unsafe(no_mangle)]
static LAT_TP_WAKEUP_COMM: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static LAT_TP_WAKEUP_PID: Global<u32> = Global::new(24);
#[unsafe(no_mangle)]
static LAT_TP_WAKEUP_PRIO: Global<u32> = Global::new(28);
#[unsafe(no_mangle)]
static LAT_TP_WAKEUP_TARGET_CPU: Global<u32> = Global::new(32);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_PREV_COMM: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_PREV_PID: Global<u32> = Global::new(24);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_PREV_PRIO: Global<u32> = Global::new(28);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_PREV_STATE: Global<u32> = Global::new(32);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_NEXT_COMM: Global<u32> = Global::new(40);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_NEXT_PID: Global<u32> = Global::new(56);
#[unsafe(no_mangle)]
static LAT_TP_SWITCH_NEXT_PRIO: Global<u32> = Global::new(60);
#[unsafe(no_mangle)]
static LAT_TP_SYS_ENTER_ID: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static LAT_TP_SYS_ENTER_ARGS: Global<u32> = Global::new(16);

/// Histograms of every quantity, per CPU.
#[map]
pub(crate) static LAT_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(QUANTITIES, 0);
#[map]
pub(crate) static LAT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);
/// Kernel stacks of spikes only, so a small table suffices.
#[map]
pub(crate) static LAT_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);
/// The syscall each task is in (LRU: exited tasks age out).
#[map]
pub(crate) static LAT_SYSCALLS: LruHashMap<u32, SyscallState> = LruHashMap::with_max_entries(32768, 0);

/// Pids to measure when the filter is FILTER_PIDS.
#[map]
static LAT_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);
/// Wakeups waiting for their task to run, by pid.
#[map]
static LAT_WAKEUPS: HashMap<u32, WakeupStart> = HashMap::with_max_entries(16384, 0);
/// Who runs on each CPU (an array so that a wakeup on one CPU can read another's entry).
#[map]
static LAT_CPU_CURRENT: Array<CpuCurrent> = Array::with_max_entries(MAX_CPUS, 0);
/// Per-task wakeup statistics.
#[map]
static LAT_TASKS: LruHashMap<u32, TaskWakeups> = LruHashMap::with_max_entries(8192, 0);
/// Scratch space for building a WakeupStart off the 512-byte stack.
#[map]
static LAT_SCRATCH: PerCpuArray<WakeupStart> = PerCpuArray::with_max_entries(1, 0);
#[map]
static LAT_WAKEUP_SPIKES: RingBuf = RingBuf::with_byte_size(512 * 1024, 0);

#[inline(always)]
fn field<T>(ctx: &TracePointContext, offset: &Global<u32>) -> Option<T> {
    unsafe { ctx.read_at::<T>((offset.load() & 0xfff) as usize) }.ok()
}

/// Adds one sample to quantity `quantity`'s histogram on this CPU. Per-CPU values need no
/// atomics; on PREEMPT_RT a program runs with migration disabled but can be preempted by another
/// program on the same CPU, so a rare increment can be lost there (never double-counted).
#[inline(always)]
pub(crate) fn record(quantity: u32, value_ns: u64, over: bool) {
    let Some(hist) = LAT_HIST.get_ptr_mut(quantity) else { return };
    let hist = unsafe { &mut *hist };
    hist.count += 1;
    hist.sum_ns += value_ns;
    if value_ns > hist.max_ns {
        hist.max_ns = value_ns;
    }
    if over {
        hist.over_threshold += 1;
    }
    // Slots count microseconds, as BCC's histograms do; sum and max stay in nanoseconds.
    let value_us = value_ns / 1000;
    let slot = hist_slot(value_us, log2_bucket(value_us, 64));
    if let Some(count) = hist.slots.get_mut(slot) {
        *count += 1;
    }
}

#[inline(always)]
pub(crate) fn threshold_ns() -> u64 {
    LAT_THRESHOLD_NS.load()
}

/// The current kernel stack's id in LAT_STACKS, or the (negative) error.
#[inline(always)]
pub(crate) fn stack_id<C: StackIdContext>(ctx: &C) -> i64 {
    match ctx.get_stackid(&LAT_STACKS, 0) {
        Ok(id) => id,
        Err(error) => {
            count(Counter::StackErrors);
            i64::from(error)
        }
    }
}

#[inline(always)]
pub(crate) fn count(counter: Counter) {
    bump(&LAT_COUNTERS, counter as u32, 1);
}

#[tracepoint]
pub fn lat_sched_wakeup(ctx: TracePointContext) -> u32 {
    let _ = try_wakeup(&ctx);
    0
}

#[tracepoint]
pub fn lat_sched_wakeup_new(ctx: TracePointContext) -> u32 {
    let _ = try_wakeup(&ctx);
    0
}

#[inline(always)]
fn wanted(pid: u32, prio: i32) -> bool {
    match LAT_FILTER_MODE.load() {
        FILTER_ALL => true,
        FILTER_PIDS => unsafe { LAT_PIDS.get(&pid) }.is_some(),
        _ => prio < 100,
    }
}

fn try_wakeup(ctx: &TracePointContext) -> Option<()> {
    let pid: u32 = field(ctx, &LAT_TP_WAKEUP_PID)?;
    let prio: i32 = field(ctx, &LAT_TP_WAKEUP_PRIO)?;
    if pid == 0 || !wanted(pid, prio) {
        return None;
    }
    let target_cpu: u32 = field(ctx, &LAT_TP_WAKEUP_TARGET_CPU)?;
    let start = unsafe { &mut *LAT_SCRATCH.get_ptr_mut(0)? };
    start.wakeup_ns = unsafe { bpf_ktime_get_ns() };
    start.target_cpu = target_cpu;
    start.waker_cpu = unsafe { bpf_get_smp_processor_id() };
    start.prio = prio;
    match LAT_CPU_CURRENT.get(target_cpu) {
        Some(current) => start.blocker = *current,
        None => start.blocker = CpuCurrent::default(),
    }
    match unsafe { LAT_FUNC_STATE.get(&start.blocker.pid) } {
        Some(funcs) if start.blocker.pid != 0 => start.blocker_funcs = *funcs,
        _ => start.blocker_funcs = FuncState::default(),
    }
    if LAT_WAKEUPS.insert(&pid, &*start, 0).is_err() {
        count(Counter::LostWakeups);
    }
    Some(())
}

#[tracepoint]
pub fn lat_sched_switch(ctx: TracePointContext) -> u32 {
    let _ = try_switch(&ctx);
    0
}

fn try_switch(ctx: &TracePointContext) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let prev_pid: u32 = field(ctx, &LAT_TP_SWITCH_PREV_PID)?;
    let next_pid: u32 = field(ctx, &LAT_TP_SWITCH_NEXT_PID)?;

    // Who held this CPU until now, then who holds it from now on.
    let here = unsafe { &mut *LAT_CPU_CURRENT.get_ptr_mut(cpu)? };
    let prev_since_ns = if here.pid == prev_pid { here.since_ns } else { 0 };
    here.pid = next_pid;
    here.prio = field(ctx, &LAT_TP_SWITCH_NEXT_PRIO).unwrap_or(0);
    here.since_ns = now;
    here.comm = field(ctx, &LAT_TP_SWITCH_NEXT_COMM).unwrap_or([0; 16]);

    // A wakeup of a task that was still running (ttwu_runnable) never ends in a switch-in:
    // forget it when the task leaves the CPU, or its next switch-in would look very late.
    if prev_pid != 0 {
        let _ = LAT_WAKEUPS.remove(&prev_pid);
    }
    if next_pid == 0 {
        return None;
    }
    let start = unsafe { LAT_WAKEUPS.get(&next_pid)? };
    let latency_ns = now.saturating_sub(start.wakeup_ns);
    let over = latency_ns > threshold_ns();
    record(QUANTITY_WAKEUP, latency_ns, over);
    account_task(ctx, next_pid, start.prio, latency_ns, over);
    if over {
        emit_spike(ctx, start, next_pid, now, cpu, prev_pid, prev_since_ns);
    }
    let _ = LAT_WAKEUPS.remove(&next_pid);
    Some(())
}

fn account_task(ctx: &TracePointContext, pid: u32, prio: i32, latency_ns: u64, over: bool) {
    let task = match LAT_TASKS.get_ptr_mut(&pid) {
        Some(task) => task,
        None => {
            let fresh = TaskWakeups {
                prio,
                comm: field(ctx, &LAT_TP_SWITCH_NEXT_COMM).unwrap_or([0; 16]),
                ..TaskWakeups::default()
            };
            if LAT_TASKS.insert(&pid, &fresh, 0).is_err() {
                return;
            }
            match LAT_TASKS.get_ptr_mut(&pid) {
                Some(task) => task,
                None => return,
            }
        }
    };
    let task = unsafe { &mut *task };
    task.count += 1;
    task.total_ns += latency_ns;
    if latency_ns > task.max_ns {
        task.max_ns = latency_ns;
    }
    if over {
        task.over_threshold += 1;
    }
    task.prio = prio;
}

#[inline(always)]
fn emit_spike(
    ctx: &TracePointContext,
    start: &WakeupStart,
    pid: u32,
    now: u64,
    cpu: u32,
    prev_pid: u32,
    prev_since_ns: u64,
) {
    let Some(mut entry) = LAT_WAKEUP_SPIKES.reserve::<WakeupSpike>(0) else {
        count(Counter::LostWakeupSpikes);
        return;
    };
    let spike = unsafe { &mut *entry.as_mut_ptr() };
    spike.pid = pid;
    spike.prio = start.prio;
    spike.comm = field(ctx, &LAT_TP_SWITCH_NEXT_COMM).unwrap_or([0; 16]);
    spike.wakeup_ns = start.wakeup_ns;
    spike.run_ns = now;
    spike.target_cpu = start.target_cpu;
    spike.run_cpu = cpu;
    spike.waker_cpu = start.waker_cpu;
    spike.blocker = start.blocker;
    spike.blocker_funcs = start.blocker_funcs;
    spike.prev = CpuCurrent {
        pid: prev_pid,
        prio: field(ctx, &LAT_TP_SWITCH_PREV_PRIO).unwrap_or(0),
        since_ns: prev_since_ns,
        comm: field(ctx, &LAT_TP_SWITCH_PREV_COMM).unwrap_or([0; 16]),
    };
    spike.prev_state = field(ctx, &LAT_TP_SWITCH_PREV_STATE).unwrap_or(0);
    // The stack of the task switching away: this tracepoint runs in its context.
    spike.prev_stack_id = stack_id(ctx);
    match unsafe { LAT_FUNC_STATE.get(&prev_pid) } {
        Some(funcs) if prev_pid != 0 => spike.prev_funcs = *funcs,
        _ => spike.prev_funcs = FuncState::default(),
    }
    match unsafe { LAT_SYSCALLS.get(&prev_pid) } {
        Some(syscall) if prev_pid != 0 => spike.prev_syscall = *syscall,
        _ => spike.prev_syscall = SyscallState { nr: -1, ..SyscallState::default() },
    }
    entry.submit(0);
}

/// raw_syscalls:sys_enter: remember the syscall and its first arguments.
#[tracepoint]
pub fn lat_sys_enter(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter(&ctx);
    0
}

fn try_sys_enter(ctx: &TracePointContext) -> Option<()> {
    let pid = crate::kernel::current_pid();
    let state = SyscallState {
        nr: field(ctx, &LAT_TP_SYS_ENTER_ID)?,
        enter_ns: unsafe { bpf_ktime_get_ns() },
        args: field(ctx, &LAT_TP_SYS_ENTER_ARGS)?,
    };
    LAT_SYSCALLS.insert(&pid, &state, 0).ok()
}

/// raw_syscalls:sys_exit: the task is back in user space.
#[tracepoint]
pub fn lat_sys_exit(_ctx: TracePointContext) -> u32 {
    let pid = crate::kernel::current_pid();
    if let Some(state) = LAT_SYSCALLS.get_ptr_mut(&pid) {
        unsafe { (*state).nr = -1 };
    }
    0
}
