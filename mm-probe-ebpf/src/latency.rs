//! Wakeup latency, keyed by pid for every task at once (ftrace's wakeup_rt follows one task
//! system-wide; see kernel/trace/trace_sched_wakeup.c).
//!
//! T0 is sched_wakeup / sched_wakeup_new, which fire in ttwu_do_wakeup() and
//! wake_up_new_task() once the task is on its runqueue (the same T0 as wakeup_rt; sched_waking
//! would add the time to get onto the runqueue). The end is the sched:sched_switch whose
//! `next_pid` is the task. At that switch the task that switched away (`prev`) is the one that
//! held the CPU: its kernel stack, its traced-function state and its syscall go into the spike.
//! The syscall is read from the task's saved user registers at that moment (see
//! `current_syscall`), so no program runs on the syscall path itself.
//!
//! Each sched hook has a BTF tracepoint program (task_struct members at BTF offsets; preferred,
//! see lat_sched_wakeup_btf) and a classic tracepoint fallback, whose record field offsets come
//! from user space (read from tracefs `format`; the defaults are the layout of non-RT builds).
//!
//! At each sched_switch the stay of the task switching out is closed into a small per-CPU ring
//! of run slices; a spike carries that ring so user space can tell who held the CPU during the
//! wait (one task throughout, or several in turn) without any judgement here. A stay of at
//! least half the threshold also leaves its task's stack and syscall in a per-CPU record, which
//! the spike carries too: the task that held the CPU is not always the one that switched away
//! last (a stopper or kernel thread can run between them).
//!
//! Traced kernel functions (madvise_cold_or_pageout_pte_range and the `--func` targets) are
//! timed entry to return, per task. A loaded fentry/fexit program is bound to one function (its
//! BTF id is fixed at load), so the object carries one entry/exit pair per function slot, each
//! with its slot number built in; the kprobe/kretprobe pairs mirror them for kernels where
//! trampolines are refused or the function has no BTF (module functions). Every pair feeds the
//! same per-task state, which the sched_switch program copies into wakeup spikes to say whether
//! the blocker was inside one.

use aya_ebpf::{
    EbpfContext, Global,
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns, generated},
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, map, perf_event, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, PerfEventContext, ProbeContext, RetProbeContext,
        TracePointContext, tracing::StackIdContext,
    },
};
use mm_probe_common::latency::{
    Counter, CpuCurrent, CpuSamples, CpuSlices, EXEC_UNKNOWN, FILTER_ALL, FILTER_PIDS, FuncSpike, FuncState,
    LATE_TIMER_ROWS, LONG_STAYS, LateTimer, LatencyHist, LongStays, MAX_CPUS, MAX_FUNCS, MAX_SAMPLES, MAX_SLICES,
    QUANTITIES, QUANTITY_WAKEUP, SyscallState, TaskWakeups, WakeupSpike, WakeupStart, hist_slot,
};

use crate::kernel::{
    btf_read, btf_read_comm, bump, current_pid, current_tgid, log2_bucket,
    offsets::{
        OFF_HRTIMER_FUNCTION, OFF_HRTIMER_SLEEPER_TASK, OFF_HRTIMER_SOFTEXPIRES, OFF_PT_REGS_AX, OFF_PT_REGS_DI,
        OFF_PT_REGS_DX, OFF_PT_REGS_ORIG_AX, OFF_PT_REGS_R10, OFF_PT_REGS_SI, OFF_TASK_STRUCT_COMM,
        OFF_TASK_STRUCT_CPU, OFF_TASK_STRUCT_EXEC_RUNTIME, OFF_TASK_STRUCT_PID, OFF_TASK_STRUCT_PRIO,
        OFF_TASK_STRUCT_TGID,
    },
    read_at, tp_field,
};

#[unsafe(no_mangle)]
static LAT_THRESHOLD_NS: Global<u64> = Global::new(500_000);
#[unsafe(no_mangle)]
static LAT_FILTER_MODE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static LAT_STREAM_SPIKES: Global<u32> = Global::new(1);

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
/// 1 when user space found the pt_regs members and a kernel with bpf_task_pt_regs (5.15+). A
/// read-only global: with 0 the verifier never visits the helper calls, so older kernels still
/// load the programs (without syscall attribution).
#[unsafe(no_mangle)]
static LAT_SYSCALL_FROM_REGS: Global<u32> = Global::new(0);
/// mm-probe's process id, for learning the sleep timers' callback (0: learn nothing).
#[unsafe(no_mangle)]
static LAT_OWN_TGID: Global<u32> = Global::new(0);
/// 1 where a kretprobe's stack ends at the trampoline (before 5.15): the kprobe entry keeps the
/// stack in LAT_FUNC_ENTRY_STACKS for the return to use. Read-only: elsewhere the verifier never
/// visits that work.
#[unsafe(no_mangle)]
static LAT_STACK_AT_ENTRY: Global<u32> = Global::new(0);

/// Histograms of every quantity, per CPU.
#[map]
static LAT_HIST: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(QUANTITIES, 0);
#[map]
static LAT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);
/// Kernel stacks of spikes only, so a small table suffices.
#[map]
static LAT_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);

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
/// Each CPU's last run slices, written at every switch there and read only there.
#[map]
static LAT_SLICES: PerCpuArray<CpuSlices> = PerCpuArray::with_max_entries(1, 0);
/// Each CPU's last long stays: the stack and syscall of a holder that did not switch away last.
#[map]
static LAT_LONG_STAYS: PerCpuArray<LongStays> = PerCpuArray::with_max_entries(1, 0);
/// The samples' stacks, apart from the spikes' own (LAT_STACKS) so that sampling cannot crowd
/// them out; full buckets are counted (SampleStackErrors).
#[map]
static LAT_SAMPLE_STACKS: StackTrace = StackTrace::with_max_entries(4096, 0);

#[map]
static LAT_SAMPLES: PerCpuArray<CpuSamples> = PerCpuArray::with_max_entries(1, 0);

/// 4,008 bytes per spike, half of them the samples: room for a burst of about 260.
#[map]
static LAT_WAKEUP_SPIKES: RingBuf = RingBuf::with_byte_size(1024 * 1024, 0);

/// Copies a record with one helper call. A plain assignment of a record this size compiles to
/// a byte-by-byte memmove loop, which the verifier walks byte by byte (and is slow to verify
/// in an emulated guest).
#[inline(always)]
fn copy_record<T>(dst: &mut T, src: *const T) {
    unsafe { generated::bpf_probe_read_kernel((dst as *mut T).cast(), size_of::<T>() as u32, src.cast()) };
}

/// An empty function state (copied from a map value that is never written).
#[inline(always)]
fn clear_funcs(dst: &mut FuncState) {
    match LAT_FUNC_ZERO.get_ptr(0) {
        Some(zero) => copy_record(dst, zero),
        None => dst.entry_ns = [0; mm_probe_common::latency::MAX_FUNCS],
    }
}

/// The current task's saved user registers: the syscall number and result slots and the first
/// four arguments. Whether that was a syscall is judged in user space (`decode_syscall`).
#[inline(always)]
fn current_syscall(dst: &mut SyscallState) {
    *dst = SyscallState::default();
    if LAT_SYSCALL_FROM_REGS.load() == 0 {
        return;
    }
    let task = unsafe { generated::bpf_get_current_task_btf() };
    let regs = unsafe { generated::bpf_task_pt_regs(task) } as u64;
    let (Some(orig_ax), Some(ax)) =
        (read_at::<i64>(regs, OFF_PT_REGS_ORIG_AX.load()), read_at::<i64>(regs, OFF_PT_REGS_AX.load()))
    else {
        return;
    };
    let arg = |offset: &Global<u32>| read_at::<u64>(regs, offset.load()).unwrap_or(0);
    *dst = SyscallState {
        orig_ax,
        ax,
        regs_read: 1,
        args: [arg(&OFF_PT_REGS_DI), arg(&OFF_PT_REGS_SI), arg(&OFF_PT_REGS_DX), arg(&OFF_PT_REGS_R10)],
    };
}

/// Adds one sample to quantity `quantity`'s histogram on this CPU. Per-CPU values need no
/// atomics; on PREEMPT_RT a program runs with migration disabled but can be preempted by another
/// program on the same CPU, so a rare increment can be lost there (never double-counted).
#[inline(always)]
fn record(quantity: u32, value_ns: u64, over: bool) {
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
fn threshold_ns() -> u64 {
    LAT_THRESHOLD_NS.load()
}

/// Whether spikes go to user space (the exporter only reads histograms and counters).
#[inline(always)]
fn stream_spikes() -> bool {
    LAT_STREAM_SPIKES.load() != 0
}

/// The current kernel stack's id in LAT_STACKS, or the (negative) error.
#[inline(always)]
fn stack_id<C: StackIdContext>(ctx: &C) -> i64 {
    match ctx.get_stackid(&LAT_STACKS, 0) {
        Ok(id) => id,
        Err(error) => {
            count(Counter::StackErrors);
            i64::from(error)
        }
    }
}

/// bpf_get_stackid's error for registers with no kernel frames (a tick in user space).
const EFAULT: i32 = 14;

/// bpf_map_update_elem's flag: create the key only if it is not there.
const BPF_NOEXIST: u64 = 1;

#[inline(always)]
fn count(counter: Counter) {
    bump(&LAT_COUNTERS, counter as u32, 1);
}

/// What a switch tells, however it was read.
struct Switch {
    prev_pid: u32,
    prev_prio: i32,
    prev_comm: [u8; 16],
    /// sched_switch's report encoding: TASK_REPORT_MAX (0x100) when preempted, else state bits.
    prev_state: i64,
    next_pid: u32,
    next_prio: i32,
    next_comm: [u8; 16],
    /// se.sum_exec_runtime of each ([`EXEC_UNKNOWN`] from the classic tracepoint, whose record
    /// has no task pointers).
    prev_exec: u64,
    next_exec: u64,
}

/// tp_btf/sched_wakeup(struct task_struct *p). BTF tracepoints are preferred: the kernel's
/// recursion guard for them is per program, while classic tracepoint and kprobe programs share
/// one per-CPU guard, so a wakeup from an interrupt that lands while any other such program
/// runs on that CPU (a function probe's kprobe, say) would be skipped.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn lat_sched_wakeup_btf(ctx: BtfTracePointContext) -> u32 {
    let _ = try_wakeup_btf(&ctx);
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn lat_sched_wakeup_new_btf(ctx: BtfTracePointContext) -> u32 {
    let _ = try_wakeup_btf(&ctx);
    0
}

fn try_wakeup_btf(ctx: &BtfTracePointContext) -> Option<()> {
    let task: u64 = ctx.arg(0);
    let pid: u32 = btf_read(task, OFF_TASK_STRUCT_PID.load())?;
    let prio: i32 = btf_read(task, OFF_TASK_STRUCT_PRIO.load())?;
    let target_cpu: u32 = btf_read(task, OFF_TASK_STRUCT_CPU.load())?;
    on_wakeup(pid, prio, target_cpu)
}

/// Classic sched:sched_wakeup, where BTF tracepoints are unavailable.
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

fn try_wakeup(ctx: &TracePointContext) -> Option<()> {
    let pid: u32 = tp_field(ctx, &LAT_TP_WAKEUP_PID)?;
    let prio: i32 = tp_field(ctx, &LAT_TP_WAKEUP_PRIO)?;
    let target_cpu: u32 = tp_field(ctx, &LAT_TP_WAKEUP_TARGET_CPU)?;
    on_wakeup(pid, prio, target_cpu)
}

#[inline(always)]
fn wanted(pid: u32, prio: i32) -> bool {
    match LAT_FILTER_MODE.load() {
        FILTER_ALL => true,
        FILTER_PIDS => unsafe { LAT_PIDS.get(pid) }.is_some(),
        _ => prio < 100,
    }
}

#[inline(always)]
fn on_wakeup(pid: u32, prio: i32, target_cpu: u32) -> Option<()> {
    if pid == 0 || !wanted(pid, prio) {
        return None;
    }
    let start = unsafe { &mut *LAT_SCRATCH.get_ptr_mut(0)? };
    start.wakeup_ns = unsafe { bpf_ktime_get_ns() };
    start.timer_late_ns = timer_lateness(pid, start.wakeup_ns);
    start.target_cpu = target_cpu;
    start.waker_cpu = unsafe { bpf_get_smp_processor_id() };
    start.prio = prio;
    match LAT_CPU_CURRENT.get(target_cpu) {
        Some(current) => start.blocker = *current,
        None => {
            start.blocker.pid = 0;
            start.blocker.since_ns = 0;
        }
    }
    // Most blockers were never in a traced function: flag that instead of zeroing 192 bytes.
    start.blocker_funcs_valid = 0;
    if let Some(funcs) = function_state(start.blocker.pid) {
        copy_record(&mut start.blocker_funcs, funcs);
        start.blocker_funcs_valid = 1;
    }
    // By reference: by value would copy the 248-byte record onto the 512-byte BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = LAT_WAKEUPS.insert(pid, &*start, 0);
    if inserted.is_err() {
        count(Counter::LostWakeups);
        return None;
    }
    mark_waiting(target_cpu, pid, start.wakeup_ns);
    Some(())
}

/// Tells the sampler of `cpu` that a watched task waits there, unless it is the task running
/// there (a wakeup of a running task ends without a wait). A plain store from the waker's CPU:
/// racing the switch that clears it costs that wait its samples, or a stale mark keeps the
/// sampler recording until that CPU's next idle or ended wait.
#[inline(always)]
fn mark_waiting(cpu: u32, pid: u32, now: u64) {
    let Some(there) = LAT_CPU_CURRENT.get_ptr_mut(cpu) else { return };
    let there = unsafe { &mut *there };
    if there.pid != 0 && there.pid != pid && there.waited_since_ns == 0 {
        there.waited_since_ns = now;
    }
}

/// tp_btf/sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state): the fourth argument exists since 5.18 (fa2c3254d7cf); older
/// kernels refuse this program at load and the classic tracepoint is used.
#[btf_tracepoint(function = "sched_switch")]
pub fn lat_sched_switch_btf(ctx: BtfTracePointContext) -> u32 {
    let _ = try_switch_btf(&ctx);
    0
}

fn try_switch_btf(ctx: &BtfTracePointContext) -> Option<()> {
    let preempt: u64 = ctx.arg(0);
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let state: u64 = ctx.arg(3);
    let switch = Switch {
        prev_pid: btf_read(prev, OFF_TASK_STRUCT_PID.load())?,
        prev_prio: btf_read(prev, OFF_TASK_STRUCT_PRIO.load()).unwrap_or(0),
        prev_comm: btf_read_comm(prev, OFF_TASK_STRUCT_COMM.load()).unwrap_or([0; 16]),
        prev_state: report_state(preempt & 1 != 0, state as u32),
        next_pid: btf_read(next, OFF_TASK_STRUCT_PID.load())?,
        next_prio: btf_read(next, OFF_TASK_STRUCT_PRIO.load()).unwrap_or(0),
        next_comm: btf_read_comm(next, OFF_TASK_STRUCT_COMM.load()).unwrap_or([0; 16]),
        prev_exec: btf_read(prev, OFF_TASK_STRUCT_EXEC_RUNTIME.load()).unwrap_or(EXEC_UNKNOWN),
        next_exec: btf_read(next, OFF_TASK_STRUCT_EXEC_RUNTIME.load()).unwrap_or(EXEC_UNKNOWN),
    };
    on_switch(ctx, &switch)
}

/// The classic record's prev_state encoding from the raw __state (what the tracepoint's
/// __trace_sched_switch_state does): preempted is TASK_REPORT_MAX; TASK_IDLE (0x402) reports
/// as I (0x80); TASK_RTLOCK_WAIT (0x1000, a PREEMPT_RT spinlock) as D; otherwise the low bits.
#[inline(always)]
fn report_state(preempt: bool, state: u32) -> i64 {
    if preempt {
        0x100
    } else if state == 0x402 {
        0x80
    } else if state & 0x1000 != 0 {
        2
    } else {
        i64::from(state & 0x7f)
    }
}

/// Classic sched:sched_switch, where BTF tracepoints are unavailable.
#[tracepoint]
pub fn lat_sched_switch(ctx: TracePointContext) -> u32 {
    let _ = try_switch(&ctx);
    0
}

fn try_switch(ctx: &TracePointContext) -> Option<()> {
    let switch = Switch {
        prev_pid: tp_field(ctx, &LAT_TP_SWITCH_PREV_PID)?,
        prev_prio: tp_field(ctx, &LAT_TP_SWITCH_PREV_PRIO).unwrap_or(0),
        prev_comm: tp_field(ctx, &LAT_TP_SWITCH_PREV_COMM).unwrap_or([0; 16]),
        prev_state: tp_field(ctx, &LAT_TP_SWITCH_PREV_STATE).unwrap_or(0),
        next_pid: tp_field(ctx, &LAT_TP_SWITCH_NEXT_PID)?,
        next_prio: tp_field(ctx, &LAT_TP_SWITCH_NEXT_PRIO).unwrap_or(0),
        next_comm: tp_field(ctx, &LAT_TP_SWITCH_NEXT_COMM).unwrap_or([0; 16]),
        prev_exec: EXEC_UNKNOWN,
        next_exec: EXEC_UNKNOWN,
    };
    on_switch(ctx, &switch)
}

#[inline(always)]
fn on_switch<C: StackIdContext>(ctx: &C, switch: &Switch) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let (prev_pid, next_pid) = (switch.prev_pid, switch.next_pid);

    // Who held this CPU until now, then who holds it from now on.
    let here = unsafe { &mut *LAT_CPU_CURRENT.get_ptr_mut(cpu)? };
    let (prev_since_ns, prev_exec_since) =
        if here.pid == prev_pid { (here.since_ns, here.exec_at_switch_in) } else { (0, EXEC_UNKNOWN) };
    here.pid = next_pid;
    here.prio = switch.next_prio;
    here.since_ns = now;
    here.exec_at_switch_in = switch.next_exec;
    here.comm = switch.next_comm;
    if next_pid == 0 {
        // An idle CPU has nobody waiting on its runqueue.
        here.waited_since_ns = 0;
    }
    close_slice(switch, prev_since_ns, run_time(prev_exec_since, switch.prev_exec), now);
    if prev_since_ns != 0 && prev_pid != 0 && now - prev_since_ns >= threshold_ns() / 2 && stream_spikes() {
        keep_long_stay(ctx, prev_pid, prev_since_ns, now);
    }

    // A wakeup of a task that was still running (ttwu_runnable) never ends in a switch-in:
    // forget it when the task leaves the CPU, or its next switch-in would look very late.
    // Looked up first: a lookup takes no lock, a delete takes the bucket's, and on almost every
    // switch there is nothing to forget.
    if prev_pid != 0 && unsafe { LAT_WAKEUPS.get(prev_pid) }.is_some() {
        let _ = LAT_WAKEUPS.remove(prev_pid);
    }
    if next_pid == 0 {
        return None;
    }
    let start = unsafe { LAT_WAKEUPS.get(next_pid)? };
    // A timer wakeup's wait began when the timer should have fired.
    let latency_ns = now.saturating_sub(start.wakeup_ns) + start.timer_late_ns;
    let over = latency_ns > threshold_ns();
    record(QUANTITY_WAKEUP, latency_ns, over);
    account_task(switch, start.prio, latency_ns, over);
    if over && stream_spikes() {
        emit_wakeup_spike(ctx, switch, start, now, cpu, prev_since_ns);
    }
    let _ = LAT_WAKEUPS.remove(next_pid);
    // The wait is over: here, and on the CPU it was woken onto if it was pulled away.
    here.waited_since_ns = 0;
    if start.target_cpu != cpu
        && let Some(target) = LAT_CPU_CURRENT.get_ptr_mut(start.target_cpu)
    {
        unsafe { (*target).waited_since_ns = 0 };
    }
    Some(())
}

/// Closes the stay of the task switching out into this CPU's slice ring: a few stores, no
/// helper call beyond the map lookup (and the function-state lookup once functions are traced).
#[inline(always)]
fn close_slice(switch: &Switch, since_ns: u64, exec_ns: u64, now: u64) {
    let Some(ring) = LAT_SLICES.get_ptr_mut(0) else { return };
    let ring = unsafe { &mut *ring };
    let Some(slice) = ring.slices.get_mut(ring.written as usize & (MAX_SLICES - 1)) else { return };
    slice.start_ns = since_ns;
    slice.end_ns = now;
    slice.prev_state = switch.prev_state;
    slice.pid = switch.prev_pid;
    // The tracepoint runs in the context of the task switching out.
    slice.tgid = current_tgid();
    slice.comm = switch.prev_comm;
    slice.in_funcs = functions_in_progress(switch.prev_pid);
    slice.exec_ns = exec_ns;
    ring.written += 1;
}

/// Keeps what the task switching out after a long stay was doing: its kernel stack (copied, not
/// a stack-map id: long stays that delayed nobody would fill the map) and its syscall, in this
/// CPU's ring of long stays. At most one capture per half threshold per CPU.
#[inline(always)]
fn keep_long_stay<C: StackIdContext>(ctx: &C, pid: u32, since_ns: u64, now: u64) {
    let Some(ring) = LAT_LONG_STAYS.get_ptr_mut(0) else { return };
    let ring = unsafe { &mut *ring };
    let Some(stay) = ring.stays.get_mut(ring.written as usize & (LONG_STAYS - 1)) else { return };
    stay.pid = pid;
    stay.start_ns = since_ns;
    stay.end_ns = now;
    let bytes = unsafe {
        generated::bpf_get_stack(ctx.as_ptr(), stay.frames.as_mut_ptr().cast(), size_of_val(&stay.frames) as u32, 0)
    };
    stay.stack_bytes = if bytes > 0 { bytes as u32 } else { 0 };
    current_syscall(&mut stay.syscall);
    ring.written += 1;
}

/// The run time charged between two readings of se.sum_exec_runtime, unknown if either is.
/// The scheduler updates prev's before the tracepoint fires (put_prev_task), and next's has
/// not moved since it last left a CPU.
#[inline(always)]
fn run_time(at_switch_in: u64, at_switch_out: u64) -> u64 {
    if at_switch_in == EXEC_UNKNOWN || at_switch_out == EXEC_UNKNOWN || at_switch_out < at_switch_in {
        EXEC_UNKNOWN
    } else {
        at_switch_out - at_switch_in
    }
}

/// Bit `i` set when task `pid` is inside the function of slot `i`.
#[inline(always)]
fn functions_in_progress(pid: u32) -> u32 {
    let Some(state) = function_state(pid) else { return 0 };
    let mut bits = 0;
    for slot in 0..MAX_FUNCS {
        if unsafe { (*state).entry_ns[slot] } != 0 {
            bits |= 1 << slot;
        }
    }
    bits
}

#[inline(always)]
fn account_task(switch: &Switch, prio: i32, latency_ns: u64, over: bool) {
    let pid = switch.next_pid;
    let task = match LAT_TASKS.get_ptr_mut(pid) {
        Some(task) => task,
        None => {
            let fresh = TaskWakeups { prio, comm: switch.next_comm, ..TaskWakeups::default() };
            // NOEXIST: a row another CPU created meanwhile is not created twice, so user space
            // can count the rows the LRU evicted (created less those left).
            if LAT_TASKS.insert(pid, fresh, BPF_NOEXIST).is_ok() {
                count(Counter::TaskRowsCreated);
            }
            match LAT_TASKS.get_ptr_mut(pid) {
                Some(task) => task,
                None => {
                    count(Counter::LostTaskRows);
                    return;
                }
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
    // The latest name: a task first seen before its exec would keep its parent's.
    task.comm = switch.next_comm;
}

#[inline(always)]
fn emit_wakeup_spike<C: StackIdContext>(
    ctx: &C,
    switch: &Switch,
    start: &WakeupStart,
    now: u64,
    cpu: u32,
    prev_since_ns: u64,
) {
    let Some(mut entry) = LAT_WAKEUP_SPIKES.reserve::<WakeupSpike>(0) else {
        count(Counter::LostWakeupSpikes);
        return;
    };
    let prev_pid = switch.prev_pid;
    let spike = unsafe { &mut *entry.as_mut_ptr() };
    spike.pid = switch.next_pid;
    spike.prio = start.prio;
    spike.comm = switch.next_comm;
    spike.wakeup_ns = start.wakeup_ns;
    spike.run_ns = now;
    spike.target_cpu = start.target_cpu;
    spike.run_cpu = cpu;
    spike.waker_cpu = start.waker_cpu;
    copy_record(&mut spike.blocker, &start.blocker);
    spike.blocker_funcs_valid = start.blocker_funcs_valid;
    copy_record(&mut spike.blocker_funcs, &start.blocker_funcs);
    spike.prev.pid = prev_pid;
    spike.prev.prio = switch.prev_prio;
    spike.prev.since_ns = prev_since_ns;
    spike.prev.comm = switch.prev_comm;
    spike.prev_state = switch.prev_state;
    // The stack of the task switching away: this tracepoint runs in its context.
    spike.prev_stack_id = stack_id(ctx);
    match function_state(prev_pid) {
        Some(funcs) => copy_record(&mut spike.prev_funcs, funcs),
        None => clear_funcs(&mut spike.prev_funcs),
    }
    // sched_switch runs in the context of the task switching away, so "current" is prev.
    current_syscall(&mut spike.prev_syscall);
    match LAT_SLICES.get_ptr(0) {
        Some(ring) => copy_record(&mut spike.slices, ring),
        None => spike.slices.written = 0,
    }
    match LAT_LONG_STAYS.get_ptr(0) {
        Some(ring) => copy_record(&mut spike.long_stays, ring),
        None => spike.long_stays.written = 0,
    }
    match LAT_SAMPLES.get_ptr(0) {
        Some(ring) => copy_record(&mut spike.samples, ring),
        None => spike.samples.written = 0,
    }
    spike.timer_late_ns = start.timer_late_ns;
    spike.late_timer_valid = 0;
    if start.timer_late_ns >= threshold_ns() / 2 {
        match LAT_LATE_TIMERS.get_ptr(switch.next_pid) {
            // Not a row left by an earlier late timer whose wakeup stayed under the threshold.
            Some(late) if unsafe { (*late).late_ns } == start.timer_late_ns => {
                copy_record(&mut spike.late_timer, late);
                spike.late_timer_valid = 1;
                let _ = LAT_LATE_TIMERS.remove(switch.next_pid);
            }
            _ => count(Counter::LostLateTimers),
        }
    }
    entry.submit(0);
}

// Timer expiry.

/// The last sleep timer of a watched task that fired on this CPU (value of [`LAT_TIMER_EXPIRY`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct TimerExpiry {
    /// The sleeper; 0 once its wakeup took the lateness.
    pid: u32,
    _pad: u32,
    /// How long after its expiry it fired.
    late_ns: u64,
    /// When it fired (bpf_ktime).
    fired_ns: u64,
}

/// Slot 0: the sleep timers' callback once learned (see `mm_probe_common::latency::TIMER_FN_MAP`).
#[map]
static LAT_TIMER_FN: Array<u64> = Array::with_max_entries(1, 0);
#[map]
static LAT_TIMER_EXPIRY: PerCpuArray<TimerExpiry> = PerCpuArray::with_max_entries(1, 0);
#[map]
static LAT_LATE_TIMERS: LruHashMap<u32, LateTimer> = LruHashMap::with_max_entries(LATE_TIMER_ROWS, 0);
/// Scratch space for building a LateTimer off the 512-byte stack.
#[map]
static LAT_LATE_SCRATCH: PerCpuArray<LateTimer> = PerCpuArray::with_max_entries(1, 0);

/// tp_btf/hrtimer_expire_entry(struct hrtimer *timer, ktime_t *now): a timer's callback is
/// about to run. For a watched task's sleep timer (nanosleep, clock_nanosleep, poll and futex
/// timeouts) it records on this CPU how late the timer fired, which the callback's wakeup, on
/// this CPU right after, takes as the start of its wait: the time a task spent waiting for an
/// interrupt held off (interrupts disabled) is part of its latency, as cyclictest counts it,
/// and nothing between sched_wakeup and sched_switch can see it.
#[btf_tracepoint(function = "hrtimer_expire_entry")]
pub fn lat_hrtimer_expire_btf(ctx: BtfTracePointContext) -> u32 {
    let _ = try_timer_expire(&ctx);
    0
}

fn try_timer_expire(ctx: &BtfTracePointContext) -> Option<()> {
    let timer: u64 = ctx.arg(0);
    let now_ptr: u64 = ctx.arg(1);
    let function: u64 = btf_read(timer, OFF_HRTIMER_FUNCTION.load())?;
    let learned = LAT_TIMER_FN.get_ptr_mut(0)?;
    // The callback is compared before anything else is read: most expiries are other timers
    // (the scheduler tick among them), and for those this is the whole cost.
    let learning = unsafe { *learned } == 0;
    if !learning && function != unsafe { *learned } {
        return None;
    }
    let task: u64 = read_at(timer, OFF_HRTIMER_SLEEPER_TASK.load())?;
    if learning {
        learn_sleep_callback(task, function, learned);
        return None;
    }
    if task == 0 {
        return None;
    }
    let pid: u32 = read_at(task, OFF_TASK_STRUCT_PID.load())?;
    let prio: i32 = read_at(task, OFF_TASK_STRUCT_PRIO.load())?;
    if pid == 0 || !wanted(pid, prio) {
        return None;
    }
    // `now` is the clock base's time the interrupt read, on the timer's own clock (monotonic,
    // realtime, boottime or TAI): the difference is clock-independent.
    let now_base: i64 = read_at(now_ptr, 0)?;
    let expires: i64 = btf_read(timer, OFF_HRTIMER_SOFTEXPIRES.load())?;
    let fired_ns = unsafe { bpf_ktime_get_ns() };
    let late_ns = since_interrupts_could_fire(now_base.saturating_sub(expires).max(0) as u64, fired_ns);
    let expiry = unsafe { &mut *LAT_TIMER_EXPIRY.get_ptr_mut(0)? };
    *expiry = TimerExpiry { pid, _pad: 0, late_ns, fired_ns };
    if late_ns >= threshold_ns() / 2 && stream_spikes() {
        keep_late_timer(ctx, pid, late_ns);
    }
    Some(())
}

/// Takes `function` as the sleep callback when `task`, the would-be sleeper, is one of
/// mm-probe's threads: user space makes one sleep right after attaching.
#[inline(always)]
fn learn_sleep_callback(task: u64, function: u64, learned: *mut u64) {
    let own = LAT_OWN_TGID.load();
    if own == 0 || task == 0 || function == 0 {
        return;
    }
    if read_at::<u32>(task, OFF_TASK_STRUCT_TGID.load()) == Some(own) {
        unsafe { *learned = function };
    }
}

/// A timer's lateness, from no earlier than the switch-in of the task it interrupted: every
/// context switch turns interrupts on (finish_task_switch), so a timer that expired before it
/// was not held off by this task; it was armed already past (a periodic task that fell behind),
/// which is no wait at all.
#[inline(always)]
fn since_interrupts_could_fire(late_ns: u64, fired_ns: u64) -> u64 {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    match LAT_CPU_CURRENT.get(cpu) {
        Some(here) if here.since_ns != 0 => late_ns.min(fired_ns.saturating_sub(here.since_ns)),
        _ => late_ns,
    }
}

/// Keeps what a late timer interrupted, by the pid of the task it wakes: the task (current
/// here, in the interrupt), its syscall and the stack down into the interrupted code.
#[inline(always)]
fn keep_late_timer(ctx: &BtfTracePointContext, sleeper: u32, late_ns: u64) {
    let Some(late) = LAT_LATE_SCRATCH.get_ptr_mut(0) else { return };
    let late = unsafe { &mut *late };
    late.pid = current_pid();
    late.late_ns = late_ns;
    late.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let bytes = unsafe {
        generated::bpf_get_stack(ctx.as_ptr(), late.frames.as_mut_ptr().cast(), size_of_val(&late.frames) as u32, 0)
    };
    late.stack_bytes = if bytes > 0 { bytes as u32 } else { 0 };
    current_syscall(&mut late.syscall);
    // A row that cannot be inserted, or is evicted before its wakeup runs, is counted where it
    // is missed: at the spike that needed it.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = LAT_LATE_TIMERS.insert(sleeper, &*late, 0);
}

/// How late the sleep timer of `pid` fired, when its wakeup comes on the CPU it fired on, within
/// a threshold of it (the callback wakes at once); 0 for every other wakeup. Taken once.
#[inline(always)]
fn timer_lateness(pid: u32, now: u64) -> u64 {
    let Some(expiry) = LAT_TIMER_EXPIRY.get_ptr_mut(0) else { return 0 };
    let expiry = unsafe { &mut *expiry };
    if expiry.pid != pid || now.saturating_sub(expiry.fired_ns) > threshold_ns() {
        return 0;
    }
    expiry.pid = 0;
    expiry.late_ns
}

// Sampling.

/// A perf event's tick on each CPU (cpu-clock, a period chosen from the threshold): while a
/// watched task waits on this CPU, records what runs here and its kernel stack, taken from the
/// interrupted registers, so a spike can say where the holder's time went even where no
/// traced function covers it. Otherwise it returns at once.
#[perf_event]
pub fn lat_sample(ctx: PerfEventContext) -> u32 {
    let _ = try_sample(&ctx);
    0
}

fn try_sample(ctx: &PerfEventContext) -> Option<()> {
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let here = unsafe { &mut *LAT_CPU_CURRENT.get_ptr_mut(cpu)? };
    let pid = current_pid();
    if here.waited_since_ns == 0 || pid == 0 {
        return None;
    }
    let ring = unsafe { &mut *LAT_SAMPLES.get_ptr_mut(0)? };
    let sample = ring.samples.get_mut(ring.written as usize & (MAX_SAMPLES - 1))?;
    sample.ns = unsafe { bpf_ktime_get_ns() };
    sample.pid = pid;
    sample.stack_id = match ctx.get_stackid(&LAT_SAMPLE_STACKS, 0) {
        Ok(id) => id as i32,
        // A tick in user space has no kernel stack: not a failure.
        Err(error) if error == -EFAULT => error,
        Err(error) => {
            count(Counter::SampleStackErrors);
            error
        }
    };
    ring.written += 1;
    here.samples_taken = ring.written;
    Some(())
}

// Traced functions.

/// Each task's traced-function state (LRU: exited tasks age out).
#[map]
static LAT_FUNC_STATE: LruHashMap<u32, FuncState> = LruHashMap::with_max_entries(32768, 0);
/// With LAT_STACK_AT_ENTRY: each task's stack id at the entry of the call in progress, per slot
/// (as bounded as LAT_FUNC_STATE, and aged out the same way).
#[map]
static LAT_FUNC_ENTRY_STACKS: LruHashMap<u32, [i64; MAX_FUNCS]> = LruHashMap::with_max_entries(32768, 0);
/// One all-zero FuncState to insert from (too big for the stack next to everything else).
#[map]
static LAT_FUNC_ZERO: Array<FuncState> = Array::with_max_entries(1, 0);
/// Slot 0 is 1 once user space attached a function probe: until then no task has function
/// state, and the sched programs skip looking for it (an array lookup is inlined; a hash lookup
/// is not).
#[map]
static LAT_FUNCS_TRACED: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static LAT_FUNC_SPIKES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// The function state of task `pid`, if a traced function ever ran in it.
#[inline(always)]
fn function_state(pid: u32) -> Option<*const FuncState> {
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

/// Keeps the stack at a kprobe entry, where the return's would end at the trampoline.
#[inline(always)]
fn keep_entry_stack(ctx: &ProbeContext, slot: usize) {
    if LAT_STACK_AT_ENTRY.load() == 0 {
        return;
    }
    let pid = current_pid();
    let stacks = match LAT_FUNC_ENTRY_STACKS.get_ptr_mut(pid) {
        Some(stacks) => stacks,
        None => {
            let _ = LAT_FUNC_ENTRY_STACKS.insert(pid, [0; MAX_FUNCS], 0);
            match LAT_FUNC_ENTRY_STACKS.get_ptr_mut(pid) {
                Some(stacks) => stacks,
                None => {
                    count(Counter::StackErrors);
                    return;
                }
            }
        }
    };
    if let Some(id) = unsafe { (*stacks).get_mut(slot) } {
        *id = stack_id(ctx);
    }
}

/// The stack a kretprobe's spike shows: the one kept at entry where the return's ends at the
/// trampoline (ENOENT when none was kept), else its own.
#[inline(always)]
fn return_stack_id(ctx: &RetProbeContext, slot: usize) -> i64 {
    if LAT_STACK_AT_ENTRY.load() == 0 {
        return stack_id(ctx);
    }
    const ENOENT: i64 = 2;
    let kept = unsafe { LAT_FUNC_ENTRY_STACKS.get(current_pid()) }.and_then(|stacks| stacks.get(slot).copied());
    kept.unwrap_or(-ENOENT)
}

#[inline(always)]
fn func_exit<C: StackIdContext>(ctx: &C, slot: usize, stack: impl FnOnce(&C) -> i64) -> u32 {
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
        emit_func_spike(stack(ctx), slot, pid, entry_ns, duration_ns);
    }
    0
}

#[inline(always)]
fn emit_func_spike(stack_id: i64, slot: usize, pid: u32, entry_ns: u64, duration_ns: u64) {
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
    spike.stack_id = stack_id;
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
                func_exit(&ctx, $slot, stack_id)
            }

            #[kprobe]
            pub fn $kprobe(ctx: ProbeContext) -> u32 {
                keep_entry_stack(&ctx, $slot);
                func_entry($slot)
            }

            #[kretprobe]
            pub fn $kretprobe(ctx: RetProbeContext) -> u32 {
                func_exit(&ctx, $slot, |ctx| return_stack_id(ctx, $slot))
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
