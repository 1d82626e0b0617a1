//! What an attribution is made of, shared by the reasoning (`attribution`), its sentence
//! (`explain`, `unseen`) and the budget of the wait (`budget`): the tasks that held the CPU, the
//! traced functions' shares of the wait, the cause, and the facts the sentence draws on.

use serde::Serialize;

use crate::kernel::syscalls;
use crate::latency::decoder::{Departure, TaskRef, Wakeup};

/// Time one traced function took out of a wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionShare {
    #[serde(skip)]
    pub slot: usize,
    pub function: String,
    /// Time inside the function during the wait.
    pub in_wait_ns: u64,
    /// Calls that overlapped the wait.
    pub calls: u64,
    /// How long the call still running at the switch had run (it may have started before the
    /// wakeup); `None` when the task had left the function.
    pub running_call_ns: Option<u64>,
}

/// A task that ran on the woken task's CPU during the wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    /// Its time on the CPU within the wait.
    pub on_cpu_ns: u64,
    /// The run time the scheduler charged it for that time (se.sum_exec_runtime): less than
    /// `on_cpu_ns` when the hypervisor ran something else meanwhile (steal) or, where IRQ time
    /// is accounted, interrupts ran. `None` when not read (classic tracepoints, a stay begun
    /// before tracing, the idle task).
    pub executed_ns: Option<u64>,
    /// How it last left the CPU within the wait ("preempted (R+)", "sleeping (S)"…).
    pub left: String,
    #[serde(skip)]
    pub tgid: u32,
    #[serde(skip)]
    pub state: i64,
    #[serde(skip)]
    pub in_funcs: u32,
    /// When it last left the CPU within the wait (its last slice's end).
    #[serde(skip)]
    pub left_at_ns: u64,
    /// It switched away to let the woken task run: its stack, syscall and functions are known.
    #[serde(skip)]
    pub is_prev: bool,
}

impl Holder {
    pub(super) fn task(&self) -> TaskRef {
        TaskRef { pid: self.pid, comm: self.comm.clone() }
    }
}

/// Why a wakeup waited. Serialized by [`Cause::label`] (the strings the JSON always had).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// The task holding the CPU spent most of the wait inside the traced function of this slot.
    Function(usize),
    /// It was preempted while running this syscall (one that works, not one that waits).
    Syscall(i64),
    /// It was in a syscall whose number could not be read (no saved registers here).
    UnnamedSyscall,
    PageFault,
    Exception,
    /// A kernel thread held the CPU, outside the traced functions.
    KernelThread,
    /// It held the CPU until preempted, in user space or in untraced kernel code.
    Preempted,
    /// A real-time task waited behind a fair task in user space, which it preempts at once:
    /// the time went to the hypervisor or to IRQ-off code the tool does not trace (`unseen`).
    OutsideKernelView,
    /// Several tasks took turns on the CPU, none for most of the wait.
    CpuContention,
    /// The CPU was idle: the wait was waking it and interrupts.
    Idle,
    /// mm-probe's own start-up (loading and attaching its programs) held the CPU.
    OwnStartup,
    /// Most of the wait the tasks on the CPU were on it but not running: time the scheduler did
    /// not charge them, which is the hypervisor running something else (steal, with paravirt
    /// time accounting) or interrupts (with IRQ time accounting).
    StolenOrIrq,
    /// Its sleep timer fired late for at least half the wait: interrupts were off on its CPU
    /// (the code where they came back on is named per spike).
    LateTimer,
    /// It held the CPU and then slept, or nothing recorded says what it ran.
    Unknown,
}

impl Cause {
    /// The cause as the JSON and the verdict name it; `functions[slot]` names each slot.
    pub fn label(self, functions: &[String]) -> String {
        match self {
            Cause::Function(slot) => functions.get(slot).cloned().unwrap_or_else(|| format!("function slot {slot}")),
            Cause::Syscall(nr) => match syscalls::name(nr) {
                Some(name) => format!("syscall {name}"),
                None => format!("unknown syscall number {nr}"),
            },
            Cause::UnnamedSyscall => "syscall (number not readable)".into(),
            Cause::PageFault => "page fault".into(),
            Cause::Exception => "exception".into(),
            Cause::KernelThread => "kernel thread".into(),
            Cause::Preempted => "preempted".into(),
            Cause::OutsideKernelView => "outside the kernel's view".into(),
            Cause::CpuContention => "cpu contention".into(),
            Cause::Idle => "idle".into(),
            Cause::OwnStartup => "mm-probe start-up".into(),
            Cause::StolenOrIrq => "steal or irq time".into(),
            Cause::LateTimer => "late timer".into(),
            Cause::Unknown => "unknown".into(),
        }
    }

    /// The cause in a sentence of the verdict.
    pub fn describe(self, functions: &[String]) -> String {
        match self {
            Cause::Function(_) => format!("the blocker was inside {}", self.label(functions)),
            Cause::Syscall(_) => format!(
                "the blocker was running {}, outside the traced functions",
                self.label(functions).trim_start_matches("syscall ")
            ),
            Cause::UnnamedSyscall => "the blocker was in a syscall whose number could not be read".into(),
            Cause::PageFault => "the blocker was in a page fault, outside the traced functions".into(),
            Cause::Exception => "the blocker was in an exception handler".into(),
            Cause::KernelThread => "a kernel thread held the CPU, outside the traced functions".into(),
            Cause::Preempted => "the blocker held the CPU until preempted (user space or untraced kernel code)".into(),
            Cause::OutsideKernelView => "time lost outside this kernel's view: the CPU ran a fair task in user space, \
                                         which a real-time wakeup preempts at once; hypervisor steal or untraced \
                                         IRQ-off code"
                .into(),
            Cause::CpuContention => "CPU contention: several tasks ran in turn, none for most of the wait".into(),
            Cause::Idle => "the CPU was idle (wakeup from idle, interrupts)".into(),
            Cause::OwnStartup => "mm-probe's own start-up (loading its programs)".into(),
            Cause::StolenOrIrq => "the tasks on the CPU were not running: hypervisor steal or interrupt time".into(),
            Cause::LateTimer => "its sleep timer fired late: interrupts were off on its CPU, in the code each spike \
                                 names"
                .into(),
            Cause::Unknown => "the blocker ran outside the traced functions and syscalls (then slept)".into(),
        }
    }
}

/// A share at least this large of the wait makes a function the cause.
pub(super) const CAUSE_SHARE: f64 = 0.5;

/// Who held the CPU during a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Occupancy {
    /// `holders[i]` held it.
    Held(usize),
    Contention,
    Idle,
}

/// What the explanation of a spike draws on.
pub(super) struct Facts<'a> {
    pub(super) wakeup: &'a Wakeup,
    pub(super) shares: &'a [FunctionShare],
    pub(super) functions: &'a [String],
    /// The holder's stack and syscall when it was not the last to switch away.
    pub(super) departure: Option<&'a Departure>,
    /// On-CPU time the scheduler did not charge, when every task's run time was read.
    pub(super) stolen_ns: Option<u64>,
    /// The holder was a fair task in user space that the woken real-time task preempts at once:
    /// the wait is time outside the kernel's view, whatever the cause (steal or not).
    pub(super) unseen: bool,
}

/// Whether a task that left the CPU in `state` was still running (preempted, or yielded).
pub(super) fn running(state: i64) -> bool {
    state == 0x100 || state == 0
}
