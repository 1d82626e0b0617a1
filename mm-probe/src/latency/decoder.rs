//! From ring-buffer records to typed spikes: names out of comm bytes, stacks symbolized,
//! syscalls named, times made relative to the start of the run.

use aya::maps::{MapData, StackTraceMap};
use mm_probe_common::latency::{
    CpuCurrent, CpuSamples, CpuSlices, EXEC_UNKNOWN, FuncSpike, FuncState, LONG_STAYS, LateTimer, LongStay, LongStays,
    MAX_SAMPLES, MAX_SLICES, SyscallState, WakeupSpike,
};
use serde::Serialize;

use crate::kernel::{stacks, syscalls};
use crate::{kernel::Kallsyms, units::format_bytes};

/// A task as the tracepoints name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskRef {
    pub pid: u32,
    pub comm: String,
}

impl std::fmt::Display for TaskRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pid == 0 { write!(f, "idle") } else { write!(f, "{}-{}", self.comm, self.pid) }
    }
}

/// The task on a CPU when something happened, and since when it had been running there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnCpu {
    pub task: TaskRef,
    /// Monotonic time it was switched in; `None` when no switch was seen there since tracing
    /// started (then the task, too, is unknown unless the tracepoint named it).
    pub since_ns: Option<u64>,
    /// Its kernel priority then (below 100: real-time or deadline; 0 when it could not be read,
    /// which counts as real-time, so that no rule for fair tasks applies to it by mistake).
    pub prio: i32,
}

/// A syscall in progress, or one its task was preempted on its way out of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Syscall {
    pub nr: i64,
    pub name: Option<&'static str>,
    pub args: [u64; 4],
    /// "madvise(MADV_PAGEOUT, 2 GiB)".
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length_bytes: Option<u64>,
    /// Set when the call had returned (this value) and its task was preempted on the way back
    /// to user space: the time it held the CPU was spent inside the call all the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returned: Option<i64>,
}

/// A kernel stack, innermost frame first, or why it is missing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stack {
    pub frames: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How the task whose stack this is had entered the kernel, read from the outermost frame
/// (x86-64 entry symbol names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelEntry {
    Syscall,
    PageFault,
    /// Another exception (int3, general protection…).
    Exception,
    /// An interrupt taken while in user space.
    Interrupt,
    KernelThread,
    Idle,
}

impl KernelEntry {
    /// "in a page fault", as the explanation says it.
    pub fn phrase(self) -> &'static str {
        match self {
            KernelEntry::Syscall => "in a syscall",
            KernelEntry::PageFault => "in a page fault",
            KernelEntry::Exception => "in an exception handler",
            KernelEntry::Interrupt => "interrupted in user space",
            KernelEntry::KernelThread => "running in the kernel (a kernel thread)",
            KernelEntry::Idle => "idle",
        }
    }

    /// The cause category a spike gets when no traced function explains it.
    pub fn cause(self) -> &'static str {
        match self {
            KernelEntry::Syscall => "syscall",
            KernelEntry::PageFault => "page fault",
            KernelEntry::Exception => "exception",
            KernelEntry::Interrupt => "interrupt",
            KernelEntry::KernelThread => "kernel thread",
            KernelEntry::Idle => "idle",
        }
    }
}

impl Stack {
    /// How the task had entered the kernel, when the outermost frame says so.
    pub fn entry(&self) -> Option<KernelEntry> {
        let outermost = self.frames.last()?;
        let name = outermost.split('+').next().unwrap_or(outermost);
        Some(match name {
            n if n.starts_with("entry_SYSCALL") || n.starts_with("entry_INT80") => KernelEntry::Syscall,
            "asm_exc_page_fault" => KernelEntry::PageFault,
            n if n.starts_with("asm_exc_") => KernelEntry::Exception,
            n if n.starts_with("asm_sysvec_") || n == "asm_common_interrupt" => KernelEntry::Interrupt,
            n if n.starts_with("ret_from_fork") => KernelEntry::KernelThread,
            n if n.starts_with("secondary_startup")
                || n.starts_with("common_startup")
                || n.contains("start_kernel") =>
            {
                KernelEntry::Idle
            }
            _ => return None,
        })
    }
}

/// One stay of a task on the CPU the woken task ran on, as the slice ring recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub task: TaskRef,
    pub tgid: u32,
    /// `None` when its switch-in was before tracing started.
    pub start_ns: Option<u64>,
    pub end_ns: u64,
    /// How it left the CPU (sched_switch's prev_state encoding).
    pub state: i64,
    /// Bit `i`: inside the traced function of slot `i` when it left.
    pub in_funcs: u32,
    /// The run time the scheduler charged it over the whole stay; `None` when not read.
    pub exec_ns: Option<u64>,
}

/// A wakeup that took longer than the threshold.
#[derive(Clone, Debug)]
pub struct Wakeup {
    pub task: TaskRef,
    pub prio: i32,
    pub latency_ns: u64,
    pub wakeup_ns: u64,
    pub run_ns: u64,
    pub target_cpu: u32,
    pub run_cpu: u32,
    pub waker_cpu: u32,
    pub blocker: OnCpu,
    pub blocker_funcs: FuncState,
    pub prev: OnCpu,
    pub prev_state: i64,
    pub prev_stack: Stack,
    pub prev_funcs: FuncState,
    /// `None` when its registers could not be read; `Some(None)` when it was not in a syscall.
    pub prev_syscall: Option<Option<Syscall>>,
    /// The run CPU's stays that overlapped the wait, oldest first (the last is `prev`'s);
    /// empty when the kernel recorded none.
    pub slices: Vec<Slice>,
    /// Some stays at the start of the wait fell out of the ring (more switches than it holds).
    pub slices_truncated: bool,
    /// The run CPU's last stays of at least half the threshold, up to the switch, oldest first.
    pub long_stays: Vec<Departure>,
    /// What the run CPU's sampler saw during the wait; `None` when no sampler ran.
    pub samples: Option<WaitSamples>,
    /// For a wakeup by the task's own sleep timer that fired late: the wait before the wakeup.
    pub timer: Option<TimerWait>,
}

impl Wakeup {
    /// The whole wait: from the timer's expiry for a timer wakeup, else from the wakeup.
    pub fn total_ns(&self) -> u64 {
        self.latency_ns + self.timer.as_ref().map_or(0, |t| t.late_ns)
    }
}

/// How late a sleep timer fired: its wakeup's wait began at its expiry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TimerWait {
    pub late_ns: u64,
    /// What the timer interrupt finally interrupted; `None` when it was not kept (the timer was
    /// less than half the threshold late, or the kernel's table was full).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
}

/// The code a late timer's interrupt landed in: the code that had kept interrupts off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Interrupted {
    pub task: TaskRef,
    /// It ran in user space, where interrupts are always on: nothing in this kernel held the
    /// timer off (the hypervisor did, or the CPU itself).
    pub in_user_space: bool,
    /// Where interrupts came back on, with two callers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<String>,
    /// The interrupted code's stack, innermost first.
    pub stack: Stack,
    /// The syscall it was in, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall: Option<Syscall>,
}

/// What a task was doing when it left a CPU after a long stay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departure {
    pub pid: u32,
    /// The switch that ended the stay: its slice's `end_ns`.
    pub end_ns: u64,
    pub stack: Stack,
    /// As [`Wakeup::prev_syscall`].
    pub syscall: Option<Option<Syscall>>,
}

/// A traced function call that took longer than the threshold.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionCall {
    pub slot: usize,
    pub task: TaskRef,
    pub tgid: u32,
    pub cpu: u32,
    #[serde(skip)]
    pub entry_ns: u64,
    pub duration_ns: u64,
    pub stack: Stack,
    pub syscall: Option<Syscall>,
}

/// bpf_get_stackid's answer for a tick that interrupted user space: no kernel frames.
pub const IN_USER_SPACE: i32 = -libc::EFAULT;

/// The samples of one wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitSamples {
    /// Samples the CPU took during the wait; `None` when the task was woken for another CPU
    /// than it ran on (that CPU's ring is not carried).
    pub taken: Option<u64>,
    /// Those still in the ring at the switch, oldest first.
    pub kept: Vec<TakenSample>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenSample {
    pub pid: u32,
    /// `None` when the tick interrupted user space.
    pub stack: Option<Stack>,
}

/// The samples of `raw` taken within `[wakeup_ns, run_ns]`; `taken_before` is the CPU's count
/// at the wakeup when the wait stayed on one CPU. `stack` reads a stack id.
pub fn wait_samples(
    raw: &CpuSamples,
    (wakeup_ns, run_ns): (u64, u64),
    taken_before: Option<u64>,
    mut stack: impl FnMut(i64) -> Stack,
) -> WaitSamples {
    let kept = (raw.written.saturating_sub(MAX_SAMPLES as u64)..raw.written)
        .map(|n| &raw.samples[n as usize % MAX_SAMPLES])
        .filter(|s| s.ns >= wakeup_ns && s.ns <= run_ns)
        .map(|s| TakenSample { pid: s.pid, stack: (s.stack_id != IN_USER_SPACE).then(|| stack(i64::from(s.stack_id))) })
        .collect();
    WaitSamples { taken: taken_before.map(|before| raw.written.saturating_sub(before)), kept }
}

/// What decoding needs besides the record.
pub struct Decoder {
    pub kallsyms: Option<Kallsyms>,
    /// The spikes' stacks, and the samples' (a map of their own).
    pub stacks: StackMap,
    pub sample_stacks: StackMap,
    /// Whether run time read from the kernel means anything beside time on the CPU: only when
    /// the kernel leaves steal or IRQ time out of it (`KernelConfig::charges_less_than_wall_time`);
    /// elsewhere it is dropped and shown as not read.
    pub run_time_is_charged: bool,
    /// Whether the sampler is attached (without it the rings hold nothing, not an idle CPU).
    pub sampling: bool,
}

impl Decoder {
    pub fn wakeup(&mut self, raw: &WakeupSpike) -> Wakeup {
        let prev_stack = self.stack(raw.prev_stack_id);
        Wakeup {
            task: TaskRef { pid: raw.pid, comm: comm(&raw.comm) },
            prio: raw.prio,
            latency_ns: raw.run_ns.saturating_sub(raw.wakeup_ns),
            wakeup_ns: raw.wakeup_ns,
            run_ns: raw.run_ns,
            target_cpu: raw.target_cpu,
            run_cpu: raw.run_cpu,
            waker_cpu: raw.waker_cpu,
            blocker: on_cpu(&raw.blocker),
            blocker_funcs: if raw.blocker_funcs_valid != 0 { raw.blocker_funcs } else { FuncState::default() },
            prev: on_cpu(&raw.prev),
            prev_state: raw.prev_state,
            prev_syscall: registers_syscall(&raw.prev_syscall, &prev_stack),
            prev_stack,
            prev_funcs: raw.prev_funcs,
            slices: overlapping_slices(&raw.slices, raw.wakeup_ns, self.run_time_is_charged),
            slices_truncated: slices_truncated(&raw.slices, raw.wakeup_ns),
            long_stays: self.departures(&raw.long_stays),
            samples: self.sampling.then(|| self.samples(raw)),
            timer: (raw.timer_late_ns > 0).then(|| TimerWait {
                late_ns: raw.timer_late_ns,
                interrupted: (raw.late_timer_valid != 0).then(|| self.interrupted(&raw.late_timer)),
            }),
        }
    }

    /// What a late timer interrupted, from the stack its callback ran on.
    fn interrupted(&self, raw: &LateTimer) -> Interrupted {
        let depth = (raw.stack_bytes as usize / size_of::<u64>()).min(raw.frames.len());
        let frames = self.frames(&raw.frames[..depth]);
        let task = TaskRef { pid: raw.pid, comm: comm(&raw.comm) };
        match stacks::interrupted_frames(&frames) {
            Some(code) => {
                let stack = Stack { frames: code.to_vec(), error: None };
                Interrupted {
                    in_user_space: code.is_empty() && raw.pid != 0,
                    place: stacks::landing_place(code),
                    syscall: registers_syscall(&raw.syscall, &stack).flatten(),
                    stack,
                    task,
                }
            }
            None => Interrupted {
                task,
                in_user_space: false,
                place: None,
                stack: Stack { frames, error: Some("no interrupt entry on the timer's stack".into()) },
                syscall: None,
            },
        }
    }

    /// The run CPU's samples of the wait; how many it took is known when the wait stayed on
    /// one CPU (the wakeup copied that CPU's count).
    fn samples(&mut self, raw: &WakeupSpike) -> WaitSamples {
        let before = (raw.target_cpu == raw.run_cpu && raw.blocker.since_ns != 0).then_some(raw.blocker.samples_taken);
        let (kallsyms, stacks) = (self.kallsyms.as_ref(), &mut self.sample_stacks);
        wait_samples(&raw.samples, (raw.wakeup_ns, raw.run_ns), before, |id| stacks.read(kallsyms, id))
    }

    /// The long stays in the ring, oldest first.
    fn departures(&self, raw: &LongStays) -> Vec<Departure> {
        (raw.written.saturating_sub(LONG_STAYS as u64)..raw.written)
            .map(|n| self.departure(&raw.stays[n as usize % LONG_STAYS]))
            .collect()
    }

    fn departure(&self, raw: &LongStay) -> Departure {
        let depth = (raw.stack_bytes as usize / size_of::<u64>()).min(raw.frames.len());
        let stack = match depth {
            0 => Stack { frames: Vec::new(), error: Some("bpf_get_stack failed".into()) },
            _ => Stack { frames: self.frames(&raw.frames[..depth]), error: None },
        };
        Departure { pid: raw.pid, end_ns: raw.end_ns, syscall: registers_syscall(&raw.syscall, &stack), stack }
    }

    pub fn function_call(&mut self, raw: &FuncSpike) -> FunctionCall {
        FunctionCall {
            slot: raw.slot as usize,
            task: TaskRef { pid: raw.pid, comm: comm(&raw.comm) },
            tgid: raw.tgid,
            cpu: raw.cpu,
            entry_ns: raw.entry_ns,
            duration_ns: raw.duration_ns,
            stack: self.stack(raw.stack_id),
            syscall: decode_syscall(&raw.syscall),
        }
    }

    fn stack(&mut self, id: i64) -> Stack {
        self.stacks.read(self.kallsyms.as_ref(), id)
    }

    fn frames(&self, ips: &[u64]) -> Vec<String> {
        frames(self.kallsyms.as_ref(), ips)
    }
}

/// A stack map (`None`: not in the object) and the stacks already read from it, by id.
pub struct StackMap {
    map: Option<StackTraceMap<MapData>>,
    symbolized: std::collections::HashMap<u32, Vec<String>>,
}

impl StackMap {
    pub fn new(map: Option<StackTraceMap<MapData>>) -> Self {
        Self { map, symbolized: Default::default() }
    }

    /// Reads and symbolizes a stack, once per id: spikes with the same blocking path share an
    /// id, so ids stay in the map (a full map or a hash collision shows as a stack error).
    fn read(&mut self, kallsyms: Option<&Kallsyms>, id: i64) -> Stack {
        if id < 0 {
            let why = if id == -i64::from(libc::EEXIST) {
                "hash bucket held another stack (EEXIST)".to_string()
            } else {
                format!("bpf_get_stackid failed ({})", std::io::Error::from_raw_os_error(-id as i32))
            };
            return Stack { frames: Vec::new(), error: Some(why) };
        }
        let id = id as u32;
        if let Some(frames) = self.symbolized.get(&id) {
            return Stack { frames: frames.clone(), error: None };
        }
        let Some(map) = self.map.as_ref() else {
            return Stack { frames: Vec::new(), error: Some("stack map unavailable".into()) };
        };
        let trace = match map.get(&id, 0) {
            Ok(trace) => trace,
            Err(e) => return Stack { frames: Vec::new(), error: Some(format!("stack {id} not readable: {e}")) },
        };
        let ips: Vec<u64> = trace.frames().iter().map(|f| f.ip).collect();
        let frames = frames(kallsyms, &ips);
        self.symbolized.insert(id, frames.clone());
        Stack { frames, error: None }
    }
}

/// Return addresses, innermost first, as symbols, without the tracing machinery's frames.
fn frames(kallsyms: Option<&Kallsyms>, ips: &[u64]) -> Vec<String> {
    let mut frames: Vec<String> = ips.iter().map(|&ip| symbolize(kallsyms, ip)).collect();
    frames.drain(..stacks::machinery_frames(&frames));
    frames
}

/// No kernel function is this large: a bigger offset means the address lies past the last
/// symbol of a region (BPF images, module gaps) and the name would be a lie.
const MAX_FUNCTION_OFFSET: u64 = 1 << 20;

fn symbolize(kallsyms: Option<&Kallsyms>, address: u64) -> String {
    match kallsyms.and_then(|k| k.symbolize(address)) {
        Some(resolved) if resolved.offset < MAX_FUNCTION_OFFSET => resolved.to_string(),
        _ => format!("{address:#x}"),
    }
}

/// A comm field (NUL-padded, at most 16 bytes) as text.
pub fn comm(bytes: &[u8; 16]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn on_cpu(raw: &CpuCurrent) -> OnCpu {
    OnCpu {
        task: TaskRef { pid: raw.pid, comm: comm(&raw.comm) },
        since_ns: (raw.since_ns != 0).then_some(raw.since_ns),
        prio: raw.prio,
    }
}

/// The ring's slices that ended after the wakeup, oldest first.
pub fn overlapping_slices(ring: &CpuSlices, wakeup_ns: u64, run_time_is_charged: bool) -> Vec<Slice> {
    let written = ring.written;
    (written.saturating_sub(MAX_SLICES as u64)..written)
        .map(|n| &ring.slices[n as usize % MAX_SLICES])
        .filter(|raw| raw.end_ns > wakeup_ns)
        .map(|raw| Slice {
            task: TaskRef { pid: raw.pid, comm: comm(&raw.comm) },
            tgid: raw.tgid,
            start_ns: (raw.start_ns != 0).then_some(raw.start_ns),
            end_ns: raw.end_ns,
            state: raw.prev_state,
            in_funcs: raw.in_funcs,
            exec_ns: (run_time_is_charged && raw.exec_ns != EXEC_UNKNOWN).then_some(raw.exec_ns),
        })
        .collect()
}

/// Whether stays from the start of the wait were overwritten: the ring is full and even its
/// oldest slice began after the wakeup.
fn slices_truncated(ring: &CpuSlices, wakeup_ns: u64) -> bool {
    if ring.written <= MAX_SLICES as u64 {
        return false;
    }
    let oldest = &ring.slices[ring.written as usize % MAX_SLICES];
    oldest.end_ns > wakeup_ns && oldest.start_ns > wakeup_ns
}

/// As [`Wakeup::prev_syscall`]: `None` when the registers were not read, else the syscall the
/// task was in ([`decode_syscall`]) or leaving ([`leaving_syscall`]), with `stack` its stack then.
fn registers_syscall(raw: &SyscallState, stack: &Stack) -> Option<Option<Syscall>> {
    (raw.regs_read != 0).then(|| decode_syscall(raw).or_else(|| leaving_syscall(raw, stack)))
}

/// The syscall a task was preempted on its way out of: the call returned (`ax` holds its result,
/// no longer -ENOSYS) and the task met the reschedule on the return path (exit_to_user_mode_prepare
/// → schedule), its number and arguments still in the saved registers. A call with no reschedule
/// point inside (madvise's walks on 6.1) holds the CPU until exactly there, so this is where its
/// stay ends. Only the stack, entered through the syscall entry, tells this from an exception
/// taken in user space, whose error code sits in `orig_ax` as a number would.
pub fn leaving_syscall(raw: &SyscallState, stack: &Stack) -> Option<Syscall> {
    if stack.entry() != Some(KernelEntry::Syscall) {
        return None;
    }
    let call = decode_syscall(&SyscallState { ax: -i64::from(libc::ENOSYS), ..*raw })?;
    Some(Syscall { returned: Some(raw.ax), ..call })
}

/// The syscall a task was in, from its saved user registers; `None` when it was not in one.
///
/// x86-64's syscall entry stores the number in `orig_ax` and -ENOSYS in `ax` until the syscall
/// returns (do_syscall_64); an interrupt or exception taken from user space leaves the user's
/// `ax` there and a vector or error code in `orig_ax`, and a kernel thread's saved registers are
/// all zero. So "in a syscall" is `orig_ax >= 0` with `ax == -ENOSYS`; a task on its way back to
/// user space already counts as out of it.
pub fn decode_syscall(raw: &SyscallState) -> Option<Syscall> {
    if raw.orig_ax < 0 || raw.ax != -i64::from(libc::ENOSYS) {
        return None;
    }
    let nr = raw.orig_ax;
    let name = syscall_name(nr);
    let [_, a1, a2, a3] = raw.args;
    let (summary, advice, length_bytes) = match name {
        Some("madvise") => {
            let advice = madvise_advice(a2);
            (format!("madvise({advice}, {})", format_bytes(a1)), Some(advice), Some(a1))
        }
        Some("process_madvise") => {
            let advice = madvise_advice(a3);
            (format!("process_madvise({advice}, {a2} ranges)"), Some(advice), None)
        }
        Some(call @ ("munmap" | "mprotect" | "msync" | "mlock" | "munlock")) => {
            (format!("{call}({})", format_bytes(a1)), None, Some(a1))
        }
        Some("mmap") => (format!("mmap({})", format_bytes(a1)), None, Some(a1)),
        Some("mremap") => (format!("mremap({} -> {})", format_bytes(a1), format_bytes(a2)), None, Some(a2)),
        Some(call) => (format!("{call}()"), None, None),
        None => (format!("unknown syscall number {nr}"), None, None),
    };
    Some(Syscall { nr, name, args: raw.args, summary, advice, length_bytes, returned: None })
}

/// The name of syscall `nr` on x86-64.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    syscalls::name(nr)
}

/// madvise(2) advice values (include/uapi/asm-generic/mman-common.h).
pub fn madvise_advice(advice: u64) -> String {
    let name = match advice {
        0 => "MADV_NORMAL",
        1 => "MADV_RANDOM",
        2 => "MADV_SEQUENTIAL",
        3 => "MADV_WILLNEED",
        4 => "MADV_DONTNEED",
        8 => "MADV_FREE",
        9 => "MADV_REMOVE",
        10 => "MADV_DONTFORK",
        11 => "MADV_DOFORK",
        12 => "MADV_MERGEABLE",
        13 => "MADV_UNMERGEABLE",
        14 => "MADV_HUGEPAGE",
        15 => "MADV_NOHUGEPAGE",
        16 => "MADV_DONTDUMP",
        17 => "MADV_DODUMP",
        18 => "MADV_WIPEONFORK",
        19 => "MADV_KEEPONFORK",
        20 => "MADV_COLD",
        21 => "MADV_PAGEOUT",
        22 => "MADV_POPULATE_READ",
        23 => "MADV_POPULATE_WRITE",
        24 => "MADV_DONTNEED_LOCKED",
        25 => "MADV_COLLAPSE",
        100 => "MADV_HWPOISON",
        101 => "MADV_SOFT_OFFLINE",
        other => return format!("advice {other}"),
    };
    name.to_string()
}

/// sched_switch's prev_state: TASK_REPORT_MAX (0x100 since 4.14) when preempted, otherwise
/// `1 << (state index - 1)`, 0 for a task that was still runnable (it yielded).
pub fn prev_state_name(state: i64) -> String {
    match state {
        0 => "runnable (R)".into(),
        0x100 => "preempted (R+)".into(),
        1 => "sleeping (S)".into(),
        2 => "uninterruptible (D)".into(),
        4 => "stopped (T)".into(),
        8 => "traced (t)".into(),
        16 => "dead (X)".into(),
        32 => "zombie (Z)".into(),
        64 => "parked (P)".into(),
        128 => "idle (I)".into(),
        other => format!("state {other:#x}"),
    }
}

#[cfg(test)]
mod tests;
