//! The wakeups the unit tests of attribution and judgement start from: cyclictest-250, a
//! real-time task, woken on CPU 1 while stress-ng-264 runs there, and the pieces tests change.

use mm_probe_common::latency::{FuncState, SyscallState};

use super::{
    attribution::Holder,
    decoder::{OnCpu, Slice, Stack, TaskRef, Wakeup, decode_syscall},
};

pub const MS: u64 = 1_000_000;
pub const US: u64 = 1_000;
/// mm-probe's pid in these tests.
pub const MM_PROBE: u32 = 4000;
/// The kernel priority of a SCHED_OTHER task at nice 0.
pub const NICE_0: i32 = 120;

pub fn task(pid: u32, comm: &str) -> TaskRef {
    TaskRef { pid, comm: comm.into() }
}

/// A fair (nice 0) task on the CPU since `since_ns`.
pub fn fair(pid: u32, comm: &str, since_ns: u64) -> OnCpu {
    OnCpu { task: task(pid, comm), since_ns: Some(since_ns), prio: NICE_0 }
}

/// cyclictest-250 (SCHED_FIFO 99) woken at 10 ms on CPU 1 while stress-ng-264 (nice 0) had been
/// running since 9 ms in madvise(MADV_PAGEOUT, 2 GiB).
pub fn wakeup(latency_ns: u64) -> Wakeup {
    let stress = fair(264, "stress-ng", 9 * MS);
    Wakeup {
        task: task(250, "cyclictest"),
        prio: 0,
        latency_ns,
        wakeup_ns: 10 * MS,
        run_ns: 10 * MS + latency_ns,
        target_cpu: 1,
        run_cpu: 1,
        waker_cpu: 1,
        blocker: stress.clone(),
        blocker_funcs: FuncState::default(),
        prev: stress,
        prev_state: 0x100,
        prev_stack: Stack::default(),
        prev_funcs: FuncState::default(),
        prev_syscall: Some(decode_syscall(&SyscallState {
            orig_ax: libc::SYS_madvise,
            ax: -i64::from(libc::ENOSYS),
            regs_read: 1,
            args: [0, 2 << 30, 21, 0],
        })),
        slices: Vec::new(),
        slices_truncated: false,
        long_stays: Vec::new(),
        samples: None,
        timer: None,
    }
}

pub fn names() -> Vec<String> {
    vec!["madvise_cold_or_pageout_pte_range".into(), "zap_pte_range".into()]
}

pub fn slice(pid: u32, comm: &str, start_ns: u64, end_ns: u64, state: i64) -> Slice {
    Slice { task: task(pid, comm), tgid: pid, start_ns: Some(start_ns), end_ns, state, in_funcs: 0, exec_ns: None }
}

/// The same stay, with the run time the scheduler charged for all of it.
pub fn charged(slice: Slice, exec_ns: u64) -> Slice {
    Slice { exec_ns: Some(exec_ns), ..slice }
}

/// A task that was on the CPU `on_cpu_ns` of a wait and left it preempted.
pub fn holder(pid: u32, comm: &str, on_cpu_ns: u64) -> Holder {
    Holder {
        pid,
        comm: comm.into(),
        on_cpu_ns,
        executed_ns: None,
        left: "preempted (R+)".into(),
        tgid: pid,
        state: 0x100,
        in_funcs: 0,
        left_at_ns: 0,
        is_prev: false,
    }
}

/// The stack of a task preempted at an interrupt it took in user space (the outermost frame is
/// the interrupt's entry).
pub fn interrupted_in_user_space() -> Stack {
    Stack {
        frames: vec![
            "__schedule+0x4f8".into(),
            "preempt_schedule_irq+0x3c".into(),
            "irqentry_exit_to_user_mode+0x1d5".into(),
            "asm_sysvec_apic_timer_interrupt+0x1a".into(),
        ],
        error: None,
    }
}
