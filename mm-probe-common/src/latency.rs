//! Records shared by the latency programs (mm-probe-ebpf's `latency.rs`) and `mm-probe latency`.
//!
//! Two quantities are measured in the kernel: the wakeup latency of a task (sched_wakeup to the
//! sched_switch that runs it) and the duration of traced kernel functions (entry to return).
//! Both go into log-linear histograms kept per CPU; only events over the threshold are sent to
//! user space, together with the facts needed to explain them (the blocker, its stack, whether
//! it was inside a traced function, its syscall).

/// Function slots: slot 0 is madvise_cold_or_pageout_pte_range by default, `--func` fills the
/// rest. The object carries one entry/exit program pair per slot because a loaded fentry program
/// is bound to one function (its BTF id is fixed at load time).
pub const MAX_FUNCS: usize = 8;

/// Histogram index of the wakeup latency; function slot `i` has index `1 + i`.
pub const QUANTITY_WAKEUP: u32 = 0;
pub const QUANTITIES: u32 = 1 + MAX_FUNCS as u32;

/// Each power of two is split into this many linear sub-buckets (log2 of it below), so that
/// percentiles computed from the histogram are within 1/8 of a power of two (about 6 %).
pub const SUB_BUCKET_BITS: u32 = 3;
pub const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
pub const LOG2_BUCKETS: usize = 64;
pub const HIST_SLOTS: usize = LOG2_BUCKETS * SUB_BUCKETS;

/// Entries of the per-CPU "who runs here" array; CPUs beyond it are not attributed.
pub const MAX_CPUS: u32 = 1024;

/// Globals user space sets before load.
pub const THRESHOLD_NS: &str = "LAT_THRESHOLD_NS";
/// 1 (default) = send spikes over the threshold through the rings; 0 = histograms and counters
/// only (the exporter, which reads nothing from the rings).
pub const STREAM_SPIKES: &str = "LAT_STREAM_SPIKES";
/// Which wakeups to measure, one of the `FILTER_*` values.
pub const FILTER_MODE: &str = "LAT_FILTER_MODE";
/// Real-time and deadline tasks: kernel priority below 100 (RT prio 99 - rt_priority, DL -1).
pub const FILTER_RT: u32 = 0;
/// The pids in [`PIDS_MAP`].
pub const FILTER_PIDS: u32 = 1;
/// Every task.
pub const FILTER_ALL: u32 = 2;

/// Tracepoint field offsets, read from tracefs `format` files by user space (real-time kernel
/// builds have carried extra common fields, so nothing after the common header is assumed).
pub const TP_WAKEUP_COMM: &str = "LAT_TP_WAKEUP_COMM";
pub const TP_WAKEUP_PID: &str = "LAT_TP_WAKEUP_PID";
pub const TP_WAKEUP_PRIO: &str = "LAT_TP_WAKEUP_PRIO";
pub const TP_WAKEUP_TARGET_CPU: &str = "LAT_TP_WAKEUP_TARGET_CPU";
pub const TP_SWITCH_PREV_COMM: &str = "LAT_TP_SWITCH_PREV_COMM";
pub const TP_SWITCH_PREV_PID: &str = "LAT_TP_SWITCH_PREV_PID";
pub const TP_SWITCH_PREV_PRIO: &str = "LAT_TP_SWITCH_PREV_PRIO";
pub const TP_SWITCH_PREV_STATE: &str = "LAT_TP_SWITCH_PREV_STATE";
pub const TP_SWITCH_NEXT_COMM: &str = "LAT_TP_SWITCH_NEXT_COMM";
pub const TP_SWITCH_NEXT_PID: &str = "LAT_TP_SWITCH_NEXT_PID";
pub const TP_SWITCH_NEXT_PRIO: &str = "LAT_TP_SWITCH_NEXT_PRIO";
/// 1 to read blockers' syscalls from their saved user registers (see [`SyscallState`]).
pub const SYSCALL_FROM_REGS: &str = "LAT_SYSCALL_FROM_REGS";
/// 1 where a kretprobe's stack ends at the kretprobe trampoline (kernels before 5.15): a traced
/// function's stack is then taken at its kprobe entry instead of at its return.
pub const STACK_AT_ENTRY: &str = "LAT_STACK_AT_ENTRY";
/// mm-probe's own process id: the timer program learns the sleep timers' callback from a sleep
/// of one of its threads (see [`TIMER_FN_MAP`]).
pub const OWN_TGID: &str = "LAT_OWN_TGID";

/// Maps.
pub const HIST_MAP: &str = "LAT_HIST";
pub const TASKS_MAP: &str = "LAT_TASKS";
pub const PIDS_MAP: &str = "LAT_PIDS";
pub const STACKS_MAP: &str = "LAT_STACKS";
pub const WAKEUP_SPIKES_RING: &str = "LAT_WAKEUP_SPIKES";
pub const FUNC_SPIKES_RING: &str = "LAT_FUNC_SPIKES";
pub const COUNTERS_MAP: &str = "LAT_COUNTERS";
/// Per-CPU ring of the last run slices ([`CpuSlices`]).
pub const SLICES_MAP: &str = "LAT_SLICES";
/// Per-CPU last long stays ([`LongStays`]).
pub const LONG_STAYS_MAP: &str = "LAT_LONG_STAYS";
/// The samples' stacks: apart from the spikes' own, so that sampling cannot crowd them out.
pub const SAMPLE_STACKS_MAP: &str = "LAT_SAMPLE_STACKS";
/// Per-CPU ring of samples taken while a watched task waited ([`CpuSamples`]).
pub const SAMPLES_MAP: &str = "LAT_SAMPLES";
/// The perf-event program that takes them.
pub const SAMPLER_PROGRAM: &str = "lat_sample";
/// Slot 0 set to 1 once a function probe is attached.
pub const FUNCS_TRACED_MAP: &str = "LAT_FUNCS_TRACED";
/// Slot 0: the callback of sleep timers (`hrtimer_wakeup`), learned by the timer program from a
/// timer whose sleeper is one of mm-probe's threads; 0 until then. Learned rather than read from
/// kallsyms, which hides addresses from an agent holding only CAP_BPF and CAP_PERFMON.
pub const TIMER_FN_MAP: &str = "LAT_TIMER_FN";
/// Late sleep timers' context, by the pid of the task they woke ([`LateTimer`]).
pub const LATE_TIMERS_MAP: &str = "LAT_LATE_TIMERS";
/// Rows of [`LATE_TIMERS_MAP`]: an LRU, so a burst of late timers of tasks never switched in
/// ages out.
pub const LATE_TIMER_ROWS: u32 = 1024;

/// Defines a `#[repr(u32)]` enum of counter slots numbered 0, 1, … in order, with `ALL` and
/// `COUNT` derived from the list, so adding a counter cannot leave the array size behind.
macro_rules! counter_slots {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];
            /// Entries of the counter array.
            pub const COUNT: u32 = Self::ALL.len() as u32;
        }
    };
}

counter_slots! {
    /// Slots of the per-CPU counter array [`COUNTERS_MAP`].
    pub enum Counter {
        /// A wakeup spike could not be reserved in its ring buffer.
        LostWakeupSpikes,
        /// A function spike could not be reserved in its ring buffer.
        LostFuncSpikes,
        /// A wakeup could not be remembered (the pending-wakeup map was full).
        LostWakeups,
        /// A function entry could not be remembered (the per-task map was full).
        LostFuncEntries,
        /// bpf_get_stackid failed (bucket collision or map full); the spike has no stack.
        StackErrors,
        /// A task's row was created in the per-task table. The table is an LRU: the rows it
        /// evicted are these less the rows left at the end.
        TaskRowsCreated,
        /// A task's row could not be created: its wakeup is in the totals, in no task's row.
        LostTaskRows,
        /// A sample's stack could not be stored (bucket collision or map full): the sample is
        /// kept without its functions.
        SampleStackErrors,
        /// A spike's late timer had no context left (its row could not be inserted, or the
        /// LRU evicted it first): its wait is measured, what delayed the timer is not told.
        LostLateTimers,
    }
}

/// One quantity's histogram on one CPU (value of the per-CPU array [`HIST_MAP`]). The slots
/// count values in microseconds: slot `k * SUB_BUCKETS + s` counts values whose highest set bit
/// is `k` and whose next `SUB_BUCKET_BITS` bits are `s`; values below `SUB_BUCKETS` use
/// `k * SUB_BUCKETS + value`. Count, sum and maximum are exact, in nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LatencyHist {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    /// How many exceeded the threshold.
    pub over_threshold: u64,
    pub slots: [u64; HIST_SLOTS],
}

/// A task's traced-function state (value of the per-task map, also copied into spikes): which
/// slot's call is in progress since when, and running totals of completed calls. User space
/// diffs two copies to learn how long a task spent in each function during a wait.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuncState {
    /// Entry time of the call in progress, 0 when not inside the function.
    pub entry_ns: [u64; MAX_FUNCS],
    /// Total time in completed calls.
    pub total_ns: [u64; MAX_FUNCS],
    /// Completed calls.
    pub calls: [u64; MAX_FUNCS],
}

/// A task's saved user registers, read when a spike was recorded: user space judges from them
/// whether, and in which syscall, the task was (`decoder::decode_syscall`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallState {
    /// `orig_ax`: the syscall number during a syscall; a vector or error code after an
    /// interrupt or exception; 0 for a kernel thread (its saved registers are zeroed).
    pub orig_ax: i64,
    /// `ax`: -ENOSYS while a syscall runs; its result, or the user's value, otherwise.
    pub ax: i64,
    /// 1 when the registers were read; 0 when unknown (not x86-64, kernel without
    /// bpf_task_pt_regs).
    pub regs_read: u64,
    /// The first four arguments (madvise: start, len, advice).
    pub args: [u64; 4],
}

/// The task running on a CPU, as the last sched_switch there left it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuCurrent {
    pub pid: u32,
    pub prio: i32,
    /// When it was switched in; 0 when no switch was seen on this CPU since tracing started.
    pub since_ns: u64,
    /// Its se.sum_exec_runtime at that switch-in; [`EXEC_UNKNOWN`] without BTF tracepoints.
    pub exec_at_switch_in: u64,
    pub comm: [u8; 16],
    /// When a watched task woken onto this CPU began to wait behind whoever runs here; 0 when
    /// none waits. Set by the waker (on any CPU), cleared by the switch that ends the wait or
    /// idles the CPU: the sampler records only while it is set.
    pub waited_since_ns: u64,
    /// Samples this CPU's sampler has taken so far (its [`CpuSamples::written`]), readable from
    /// other CPUs: a wakeup copies it, so a spike knows how many were taken during its wait.
    pub samples_taken: u64,
}

/// Samples kept per CPU: at a sample every quarter threshold, the last 32 thresholds of a
/// wait. A power of two (masked index).
pub const MAX_SAMPLES: usize = 128;

/// What a CPU was running at one tick of the sampler, while a watched task waited on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub ns: u64,
    pub pid: u32,
    /// Kernel stack of the interrupted code (id in [`SAMPLE_STACKS_MAP`]), negative on failure
    /// (-EFAULT: the tick interrupted user space).
    pub stack_id: i32,
}

/// The last [`MAX_SAMPLES`] samples of one CPU (value of the per-CPU [`SAMPLES_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpuSamples {
    /// Samples written so far: sample `n` is at index `n % MAX_SAMPLES`.
    pub written: u64,
    pub samples: [Sample; MAX_SAMPLES],
}

impl Default for CpuSamples {
    fn default() -> Self {
        Self { written: 0, samples: [Sample::default(); MAX_SAMPLES] }
    }
}

/// A run time (se.sum_exec_runtime) that was not read.
pub const EXEC_UNKNOWN: u64 = u64::MAX;

/// A wakeup waiting for its task to run (value of the pending-wakeup map, keyed by pid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WakeupStart {
    pub wakeup_ns: u64,
    pub target_cpu: u32,
    pub prio: i32,
    /// The CPU sched_wakeup fired on: another CPU than `target_cpu` means the woken task
    /// could only run once that CPU took a reschedule IPI (or a TTWU_QUEUE'd wakeup).
    pub waker_cpu: u32,
    /// 1 when `blocker_funcs` was copied; 0 when the blocker had no function state (never in
    /// a traced function), and `blocker_funcs` holds stale bytes that mean "all zero".
    pub blocker_funcs_valid: u32,
    /// The task running on `target_cpu` when the wakeup happened.
    pub blocker: CpuCurrent,
    /// The blocker's function state at the wakeup.
    pub blocker_funcs: FuncState,
    /// When the wakeup came from the task's own sleep timer: how long after its expiry the
    /// timer fired (the wait starts at the expiry, as cyclictest measures it); 0 otherwise.
    pub timer_late_ns: u64,
}

/// Per-task wakeup statistics (value of [`TASKS_MAP`], keyed by pid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskWakeups {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub over_threshold: u64,
    pub prio: i32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// Run slices remembered per CPU: enough to tell one task holding the CPU through a wait from
/// several taking turns (a power of two, so the ring index is a mask).
pub const MAX_SLICES: usize = 8;

/// One stay of a task on a CPU, closed by the sched_switch that took it off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunSlice {
    /// When it was switched in; 0 when that switch was not seen (before tracing started).
    pub start_ns: u64,
    pub end_ns: u64,
    /// How it left, in sched_switch's prev_state encoding (0x100: preempted; 1: slept; …).
    pub prev_state: i64,
    pub pid: u32,
    pub tgid: u32,
    pub comm: [u8; 16],
    /// Bit `i` set: the task was inside the traced function of slot `i` when it switched out.
    pub in_funcs: u32,
    pub _pad: u32,
    /// The run time the scheduler charged it over the stay (se.sum_exec_runtime at the switch
    /// out minus at the switch in): less than the stay when, with paravirt time accounting, the
    /// hypervisor ran something else meanwhile. [`EXEC_UNKNOWN`] when not read.
    pub exec_ns: u64,
}

/// The last [`MAX_SLICES`] run slices of one CPU (value of the per-CPU [`SLICES_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSlices {
    /// Slices written so far: slice `n` is at index `n % MAX_SLICES`, the newest at
    /// `(written - 1) % MAX_SLICES`.
    pub written: u64,
    pub slices: [RunSlice; MAX_SLICES],
}

/// Frames kept of a long stay's kernel stack: the deepest sched_switch stacks seen (a page
/// fault inside a syscall, under the tracepoint's own frames) stay well under it.
pub const LONG_STAY_FRAMES: usize = 40;

/// What a task that stayed long on a CPU was doing when it left. A stay counts as long from
/// half the threshold: a task that held the CPU through most of a wait over the threshold
/// stayed that long, so when another task switched away last, the holder's stack and syscall
/// are still kept, without a stack-map entry per stay.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LongStay {
    /// 0 when no stay was long yet.
    pub pid: u32,
    /// Bytes of `frames` that bpf_get_stack filled (0 on failure).
    pub stack_bytes: u32,
    /// The switch that ended the stay (its slice's `end_ns`), and the one that began it.
    pub end_ns: u64,
    pub start_ns: u64,
    pub syscall: SyscallState,
    pub frames: [u64; LONG_STAY_FRAMES],
}

impl Default for LongStay {
    fn default() -> Self {
        Self {
            pid: 0,
            stack_bytes: 0,
            end_ns: 0,
            start_ns: 0,
            syscall: SyscallState::default(),
            frames: [0; LONG_STAY_FRAMES],
        }
    }
}

/// Long stays remembered per CPU: the holder's, and one more that may follow it within the
/// same wait (a stopper or kernel thread that ran long between the holder and the woken task).
/// Kept without judgement: user space picks the holder's. A power of two (masked index).
pub const LONG_STAYS: usize = 2;

/// The last [`LONG_STAYS`] long stays of one CPU (value of the per-CPU [`LONG_STAYS_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LongStays {
    /// Stays written so far: stay `n` is at index `n % LONG_STAYS`.
    pub written: u64,
    pub stays: [LongStay; LONG_STAYS],
}

/// Frames kept of the stack a late timer interrupted: the timer interrupt's own frames and the
/// interrupted code's innermost ones, where interrupts came back on.
pub const LATE_TIMER_FRAMES: usize = 24;

/// What a sleep timer interrupted when it fired at least half the threshold late: the code
/// that kept interrupts off (value of [`LATE_TIMERS_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LateTimer {
    /// The interrupted task (0: idle).
    pub pid: u32,
    /// Bytes of `frames` that bpf_get_stack filled (0 on failure).
    pub stack_bytes: u32,
    pub late_ns: u64,
    pub comm: [u8; 16],
    /// Its saved user registers: its syscall, if it was in one.
    pub syscall: SyscallState,
    /// The kernel stack at the timer's callback, innermost first: the interrupt's frames, then
    /// the interrupted code's.
    pub frames: [u64; LATE_TIMER_FRAMES],
}

/// A wakeup over the threshold, sent at the sched_switch that finally ran the task.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WakeupSpike {
    pub pid: u32,
    pub prio: i32,
    pub comm: [u8; 16],
    pub wakeup_ns: u64,
    pub run_ns: u64,
    pub target_cpu: u32,
    /// The CPU it finally ran on.
    pub run_cpu: u32,
    /// The CPU the wakeup happened on.
    pub waker_cpu: u32,
    /// As in [`WakeupStart`]: 0 means `blocker_funcs` is all zero.
    pub blocker_funcs_valid: u32,
    /// Who ran on `target_cpu` at the wakeup.
    pub blocker: CpuCurrent,
    pub blocker_funcs: FuncState,
    /// Who switched away to let it run (usually the blocker), and when it had been switched in.
    pub prev: CpuCurrent,
    pub prev_state: i64,
    /// Kernel stack of `prev` at that switch (id in [`STACKS_MAP`]), negative on failure.
    pub prev_stack_id: i64,
    pub prev_funcs: FuncState,
    pub prev_syscall: SyscallState,
    /// The run CPU's last slices at the switch (the newest is `prev`'s, just closed): user
    /// space keeps those overlapping the wait to see who held the CPU during it.
    pub slices: CpuSlices,
    /// This CPU's last long stays at the switch (the holder's context when it was not `prev`).
    pub long_stays: LongStays,
    /// The run CPU's last samples at the switch: user space keeps those taken during the wait.
    pub samples: CpuSamples,
    /// As in [`WakeupStart`]: the wait began this long before `wakeup_ns`, at the expiry of
    /// the task's sleep timer.
    pub timer_late_ns: u64,
    /// 1 when `late_timer` holds what the late timer interrupted.
    pub late_timer_valid: u64,
    pub late_timer: LateTimer,
}

/// A traced function call over the threshold, sent at its return.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FuncSpike {
    pub slot: u32,
    pub pid: u32,
    pub tgid: u32,
    pub cpu: u32,
    pub entry_ns: u64,
    pub duration_ns: u64,
    pub comm: [u8; 16],
    /// Kernel stack at the return (the caller chain), negative on failure.
    pub stack_id: i64,
    pub syscall: SyscallState,
}

crate::user_pod!(
    LatencyHist,
    FuncState,
    SyscallState,
    CpuCurrent,
    WakeupStart,
    TaskWakeups,
    RunSlice,
    CpuSlices,
    Sample,
    CpuSamples,
    LateTimer,
    WakeupSpike,
    FuncSpike
);

/// Histogram slot of `value`, given its log2 bucket (the kernel computes the bucket with an
/// unrolled search; user space uses the same function to decode).
#[inline(always)]
pub fn hist_slot(value: u64, log2: u32) -> usize {
    let sub = if log2 >= SUB_BUCKET_BITS {
        (value >> (log2 - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1)
    } else {
        value as usize & (SUB_BUCKETS - 1)
    };
    (log2 as usize * SUB_BUCKETS + sub) & (HIST_SLOTS - 1)
}
