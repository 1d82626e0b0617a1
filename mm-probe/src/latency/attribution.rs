//! Why a wakeup was late: who held the CPU during the wait (one task, several in turn, or
//! nobody), what the one holding it was doing (a traced function, a syscall that works, a page
//! fault…), and one sentence that says so.
//!
//! The kernel hands over the run CPU's last stays (run slices): those overlapping the wait say
//! who ran there between the wakeup and the switch-in. A task that went to sleep did not delay
//! anyone by sleeping: its sleeping syscall is told as context, never as the cause. For the
//! task that switched away last the kernel adds its stack, syscall and function state; the time
//! inside a traced function during the wait is the difference of two copies of that state (at
//! the wakeup and at the switch), corrected for calls that straddle either end of the wait.
//! When another task held the CPU and a short one (a stopper, a kernel thread) switched away
//! last, the holder's stack and syscall come from the CPU's last long stay, if it was the
//! holder's: the spike shows the culprit's stack, and says whose it is.

use std::cmp::Reverse;

use mm_probe_common::latency::{FuncState, MAX_FUNCS};
use serde::Serialize;

use super::decoder::{Departure, KernelEntry, Slice, Stack, Syscall, TaskRef, Wakeup, prev_state_name};
use super::sampling::{self, Sampled};
use crate::kernel::syscalls;
use crate::units::format_nanos;

mod budget;
mod explain;
mod facts;
mod unseen;

pub use budget::text as budget_text;
use facts::{CAUSE_SHARE, Facts, Occupancy, running};
pub use facts::{Cause, FunctionShare, Holder};

/// The explanation of one wakeup spike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attribution {
    /// The task that switched away to let the woken task run is the one that was running at
    /// the wakeup.
    pub blocker_ran_until_switch: bool,
    /// That task was on the CPU from before the wakeup until the switch.
    pub without_rescheduling: bool,
    /// Traced functions the last task spent time in during the wait, most first.
    pub functions: Vec<FunctionShare>,
    /// The one task that held the CPU (nearly) all the wait; `None` for contention or idle.
    pub held_by: Option<Holder>,
    /// Every task that ran on the CPU during the wait, longest first (idle as pid 0).
    pub ran_during_wait: Vec<Holder>,
    /// False when the start of the wait fell out of the kernel's slice ring.
    pub ran_during_wait_complete: bool,
    /// The part of the wait no kept stay covers: with every `ran_during_wait` entry's
    /// `on_cpu_ns` it adds up to the whole wait.
    pub unaccounted_ns: u64,
    /// The syscall the last task went to sleep in: context, never the cause.
    pub slept_in: Option<&'static str>,
    /// Time within the wait the tasks on the CPU were on it but not charged as running
    /// (hypervisor steal, or interrupts where IRQ time is accounted); `None` when some task's
    /// run time was not read.
    pub stolen_ns: Option<u64>,
    /// Whose `stack` and `syscall` these are: the holder's, else the task that switched away.
    pub stack_of: TaskRef,
    pub stack: Stack,
    pub syscall: Option<Syscall>,
    /// Where the sampled task's time went (the holder, else the busiest task, else the one
    /// that switched away); `None` when no sampler ran.
    pub samples: Option<Sampled>,
    #[serde(skip)]
    pub cause: Cause,
    pub explanation: String,
}

/// A task on the CPU for at least this share of the wait held it (the rest: short switches,
/// interrupts).
const HOLD_SHARE: f64 = 0.8;
/// Uncharged time (steal or IRQ) of at least this share of the wait is the cause.
const STEAL_SHARE: f64 = 0.5;

/// Explains `wakeup`; `functions[slot]` names the traced function of each slot; `own_tgid` is
/// mm-probe's pid (its start-up can delay others).
pub fn attribute(wakeup: &Wakeup, functions: &[String], own_tgid: u32) -> Attribution {
    let same_task = wakeup.blocker.task.pid == wakeup.prev.task.pid
        && wakeup.blocker.since_ns.is_some()
        && wakeup.target_cpu == wakeup.run_cpu;
    let without_rescheduling = same_task && wakeup.prev.since_ns.is_some_and(|since| since <= wakeup.wakeup_ns);
    let window = (wakeup.wakeup_ns, wakeup.run_ns);
    let before = same_task.then_some(&wakeup.blocker_funcs);
    let mut shares: Vec<FunctionShare> =
        (0..MAX_FUNCS.min(functions.len()))
            .filter_map(|slot| {
                share(slot, before, &wakeup.prev_funcs, window).map(|(in_wait_ns, calls, running_call_ns)| {
                    FunctionShare { slot, function: functions[slot].clone(), in_wait_ns, calls, running_call_ns }
                })
            })
            .collect();
    shares.sort_by_key(|s| Reverse(s.in_wait_ns));
    let holders = holders(wakeup);
    let occupancy = occupancy(&holders, wakeup.latency_ns);
    let syscall = wakeup.prev_syscall.as_ref().and_then(Option::as_ref);
    let slept_in = syscall.filter(|_| !running(wakeup.prev_state)).and_then(|call| call.name);
    let held_by = match occupancy {
        Occupancy::Held(i) => Some(&holders[i]),
        _ => None,
    };
    let departure = held_by.and_then(|holder| departure_of(wakeup, holder));
    let stack_of = held_by.filter(|_| departure.is_some()).map_or_else(|| wakeup.prev.task.clone(), Holder::task);
    let stolen_ns = stolen(&holders);
    let mut facts = Facts { wakeup, shares: &shares, functions, departure, stolen_ns, unseen: false };
    let held = held_by.map(|holder| held_cause(&facts, holder, own_tgid));
    facts.unseen = held == Some(Cause::Preempted)
        && held_by.is_some_and(|holder| unseen::lost_outside_view(wakeup, holder, departure, &shares));
    let wait_share = |ns: u64, share: f64| ns as f64 >= share * wakeup.latency_ns.max(1) as f64;
    let cause = match occupancy {
        _ if stolen_ns.is_some_and(|s| wait_share(s, STEAL_SHARE)) => Cause::StolenOrIrq,
        Occupancy::Idle => Cause::Idle,
        // Its start-up is the cause only when it held most of the wait, not when it merely
        // ran the longest of the stays kept.
        Occupancy::Contention if wait_share(own_ns(&holders, own_tgid), CAUSE_SHARE) => Cause::OwnStartup,
        Occupancy::Contention => Cause::CpuContention,
        Occupancy::Held(_) if facts.unseen => Cause::OutsideKernelView,
        Occupancy::Held(_) => held.unwrap_or(Cause::Unknown),
    };
    let cause = late_timer_cause(wakeup).unwrap_or(cause);
    let mut explanation =
        explain::explain(&facts, occupancy, &holders, cause, same_task, without_rescheduling, slept_in);
    if cause == Cause::StolenOrIrq && !facts.unseen {
        explanation += &steal_text(&holders, stolen_ns.unwrap_or(0));
    }
    explanation += &budget::unaccounted_clause(&holders, wakeup.latency_ns, wakeup.slices_truncated);
    let samples =
        wakeup.samples.as_ref().map(|s| sampling::sampled(s, &sampled_task(wakeup, held_by, &holders), functions));
    if let Some(phrase) = samples.as_ref().and_then(Sampled::phrase) {
        explanation += &format!("; {phrase}");
    }
    Attribution {
        blocker_ran_until_switch: same_task,
        without_rescheduling,
        functions: shares,
        held_by: held_by.cloned(),
        ran_during_wait_complete: !wakeup.slices_truncated,
        unaccounted_ns: budget::unaccounted_ns(&holders, wakeup.latency_ns),
        ran_during_wait: holders,
        slept_in,
        stolen_ns,
        stack_of,
        stack: departure.map_or(&wakeup.prev_stack, |d| &d.stack).clone(),
        syscall: departure.map_or(syscall, |d| d.syscall.as_ref().and_then(Option::as_ref)).cloned(),
        samples,
        cause,
        explanation,
    }
}

/// The cause when the task's sleep timer fired late for at least half the whole wait: the code
/// that held the interrupt off, unless the interrupt landed in user space (interrupts were on:
/// the time went outside the kernel's view) or in the idle task (waking the CPU).
fn late_timer_cause(w: &Wakeup) -> Option<Cause> {
    let timer = w.timer.as_ref().filter(|t| t.late_ns * 2 >= w.total_ns())?;
    Some(match &timer.interrupted {
        Some(i) if i.task.pid == 0 => Cause::Idle,
        Some(i) if i.in_user_space => Cause::OutsideKernelView,
        _ => Cause::LateTimer,
    })
}

/// The holder's own departure, when it did not switch away last: the latest of its long stays
/// that ended in the wait (usually its last stay; an earlier one when a stopper split its hold
/// and the rest was short).
fn departure_of<'a>(w: &'a Wakeup, holder: &Holder) -> Option<&'a Departure> {
    let own = |d: &&Departure| d.pid == holder.pid && d.end_ns > w.wakeup_ns && d.end_ns <= holder.left_at_ns;
    w.long_stays.iter().rev().find(own).filter(|_| !holder.is_prev)
}

/// Whose samples say where the time went: the holder's, else the busiest task's, else those of
/// the task that switched away.
fn sampled_task(w: &Wakeup, held_by: Option<&Holder>, holders: &[Holder]) -> TaskRef {
    let busiest = holders.iter().find(|h| h.pid != 0);
    held_by.or(busiest).map_or_else(|| w.prev.task.clone(), Holder::task)
}

/// The time mm-probe's own threads were on the CPU within the wait.
fn own_ns(holders: &[Holder], own_tgid: u32) -> u64 {
    holders.iter().filter(|h| h.tgid == own_tgid && own_tgid != 0 && h.pid != 0).map(|h| h.on_cpu_ns).sum()
}

/// On-CPU time within the wait the scheduler did not charge as run time, summed over the
/// tasks (not the idle task, whose run time is never charged); `None` unless every task's run
/// time is known.
fn stolen(holders: &[Holder]) -> Option<u64> {
    let busy = holders.iter().filter(|h| h.pid != 0);
    busy.map(|h| h.executed_ns.map(|ran| h.on_cpu_ns.saturating_sub(ran))).sum()
}

/// "; but for 4.7ms of it no task ran (hypervisor steal or interrupts): nap_1ms-25443 ran 0.1ms
/// of its time on the CPU".
fn steal_text(holders: &[Holder], stolen_ns: u64) -> String {
    let ran: Vec<String> = holders
        .iter()
        .filter(|h| h.pid != 0)
        .filter_map(|h| h.executed_ns.map(|ns| format!("{} ran {}", h.task(), format_nanos(ns))))
        .collect();
    format!(
        "; but for {} of it no task ran (hypervisor steal or interrupts: time the scheduler did not charge): {} of its time on the CPU",
        format_nanos(stolen_ns),
        ran.join(", ")
    )
}

/// Bit `slot` set for each function the state shows in progress.
fn in_progress(funcs: &FuncState) -> u32 {
    funcs.entry_ns.iter().enumerate().filter(|(_, entry)| **entry != 0).fold(0, |bits, (slot, _)| bits | 1 << slot)
}

/// Each task's time on the CPU within the wait, longest first. Without recorded slices, the
/// task that switched away stands for the whole of its stay.
fn holders(w: &Wakeup) -> Vec<Holder> {
    let synthesized;
    let slices: &[Slice] = if w.slices.is_empty() {
        synthesized = [Slice {
            task: w.prev.task.clone(),
            tgid: 0,
            start_ns: w.prev.since_ns,
            end_ns: w.run_ns,
            state: w.prev_state,
            in_funcs: in_progress(&w.prev_funcs),
            exec_ns: None,
        }];
        &synthesized
    } else {
        &w.slices
    };
    let mut holders: Vec<Holder> = Vec::new();
    // The stays of one CPU follow each other: none began before the one kept before it ended.
    // A stay whose switch-in the kernel did not see (start unknown: before tracing, or a switch
    // it missed) is counted from there, never from the wakeup over the stays before it.
    let mut earliest_start_ns = w.wakeup_ns;
    for (i, slice) in slices.iter().enumerate() {
        let start = slice.start_ns.unwrap_or(0).max(earliest_start_ns);
        earliest_start_ns = earliest_start_ns.max(slice.end_ns);
        let on_cpu_ns = slice.end_ns.min(w.run_ns).saturating_sub(start);
        let is_prev = i + 1 == slices.len() && slice.task.pid == w.prev.task.pid;
        if on_cpu_ns == 0 && !is_prev {
            continue;
        }
        let left = prev_state_name(slice.state);
        let executed_ns = executed_within(slice, on_cpu_ns);
        match holders.iter_mut().find(|h| h.pid == slice.task.pid) {
            Some(h) => {
                h.on_cpu_ns += on_cpu_ns;
                h.executed_ns = h.executed_ns.zip(executed_ns).map(|(a, b)| a + b);
                (h.state, h.in_funcs, h.left, h.is_prev) = (slice.state, slice.in_funcs, left, h.is_prev || is_prev);
                h.left_at_ns = slice.end_ns;
            }
            None => holders.push(Holder {
                pid: slice.task.pid,
                comm: slice.task.comm.clone(),
                on_cpu_ns,
                executed_ns,
                left,
                tgid: slice.tgid,
                state: slice.state,
                in_funcs: slice.in_funcs,
                left_at_ns: slice.end_ns,
                is_prev,
            }),
        }
    }
    holders.sort_by_key(|h| Reverse(h.on_cpu_ns));
    holders
}

/// The run time of `slice` that fell within the wait, `on_cpu_ns` of its stay: the stay's run
/// time in proportion (the kernel reads it only at the stay's two ends). Never for the idle
/// task, whose run time the scheduler does not charge.
fn executed_within(slice: &Slice, on_cpu_ns: u64) -> Option<u64> {
    let stay_ns = slice.end_ns.saturating_sub(slice.start_ns?);
    let exec_ns = slice.exec_ns.filter(|_| slice.task.pid != 0)?;
    if stay_ns == 0 {
        return Some(0);
    }
    Some((exec_ns.min(stay_ns) as u128 * on_cpu_ns as u128 / stay_ns as u128) as u64)
}

/// One task held the CPU when it ran for most of the wait, or was the only one to run for
/// longer than the CPU idled; otherwise a mostly idle CPU is idle, and a busy one contended.
fn occupancy(holders: &[Holder], wait_ns: u64) -> Occupancy {
    let idle_ns: u64 = holders.iter().filter(|h| h.pid == 0).map(|h| h.on_cpu_ns).sum();
    let busy: Vec<usize> = (0..holders.len()).filter(|&i| holders[i].pid != 0).collect();
    let Some(&top) = busy.first() else { return Occupancy::Idle };
    let top_ns = holders[top].on_cpu_ns;
    let busy_ns: u64 = busy.iter().map(|&i| holders[i].on_cpu_ns).sum();
    if top_ns as f64 >= HOLD_SHARE * wait_ns.max(1) as f64 || (busy.len() == 1 && top_ns >= idle_ns) {
        Occupancy::Held(top)
    } else if idle_ns >= busy_ns {
        Occupancy::Idle
    } else {
        Occupancy::Contention
    }
}

/// What the one task holding the CPU was doing. The last task has a stack and syscall; an
/// earlier one has how it left and the functions it was inside, and its stack and syscall
/// when its stay was the CPU's last long one.
fn held_cause(f: &Facts, holder: &Holder, own_tgid: u32) -> Cause {
    let w = f.wakeup;
    if holder.tgid == own_tgid && own_tgid != 0 {
        return Cause::OwnStartup;
    }
    if !holder.is_prev {
        return match (0..f.functions.len().min(MAX_FUNCS)).find(|slot| holder.in_funcs & (1 << slot) != 0) {
            Some(slot) => Cause::Function(slot),
            None if !running(holder.state) => Cause::Unknown,
            None => f.departure.map_or(Cause::Preempted, |d| activity_cause(&d.syscall, &d.stack)),
        };
    }
    if let Some(top) = f.shares.first().filter(|s| s.in_wait_ns as f64 >= CAUSE_SHARE * w.latency_ns.max(1) as f64) {
        return Cause::Function(top.slot);
    }
    if w.prev.task.pid == 0 {
        return Cause::Idle;
    }
    if !running(w.prev_state) {
        // It went to sleep: the syscall it slept in held nobody up.
        return Cause::Unknown;
    }
    activity_cause(&w.prev_syscall, &w.prev_stack)
}

/// What a task preempted while running was doing, from its syscall (`None`: registers not
/// read) and its stack.
fn activity_cause(syscall: &Option<Option<Syscall>>, stack: &Stack) -> Cause {
    match syscall.as_ref().and_then(Option::as_ref) {
        Some(call) if call.name.is_some_and(|name| syscalls::only_waits(name, &call.args)) => Cause::Preempted,
        Some(call) => Cause::Syscall(call.nr),
        None => match stack.entry() {
            Some(KernelEntry::PageFault) => Cause::PageFault,
            Some(KernelEntry::Exception) => Cause::Exception,
            Some(KernelEntry::KernelThread) => Cause::KernelThread,
            Some(KernelEntry::Idle) => Cause::Idle,
            Some(KernelEntry::Syscall) if syscall.is_none() => Cause::UnnamedSyscall,
            _ => Cause::Preempted,
        },
    }
}

/// Time in slot `slot` during `window`, the calls that overlapped it, and the running call's
/// age. `before` is the state at the wakeup when the same task ran throughout; without it only
/// the call in progress at the switch is known.
fn share(
    slot: usize,
    before: Option<&FuncState>,
    after: &FuncState,
    (wakeup_ns, run_ns): (u64, u64),
) -> Option<(u64, u64, Option<u64>)> {
    let wait = run_ns.saturating_sub(wakeup_ns);
    let entry_after = after.entry_ns[slot];
    let running_call_ns = (entry_after != 0).then(|| run_ns.saturating_sub(entry_after));
    let (mut in_wait, mut calls) = (0u64, 0u64);
    match before {
        Some(before) => {
            let entry_before = before.entry_ns[slot];
            if entry_before != 0 && entry_before == entry_after {
                // One call spans the whole wait.
                in_wait = wait;
                calls = 1;
            } else {
                in_wait = after.total_ns[slot].saturating_sub(before.total_ns[slot]);
                calls = after.calls[slot].saturating_sub(before.calls[slot]);
                if entry_before != 0 {
                    // The call running at the wakeup finished during the wait: drop its part
                    // before the wakeup.
                    in_wait = in_wait.saturating_sub(wakeup_ns.saturating_sub(entry_before));
                }
                if entry_after != 0 {
                    in_wait += run_ns.saturating_sub(entry_after.max(wakeup_ns));
                    calls += 1;
                }
            }
        }
        None => {
            if entry_after != 0 {
                in_wait = run_ns.saturating_sub(entry_after.max(wakeup_ns));
                calls = 1;
            }
        }
    }
    (in_wait > 0 || calls > 0).then_some((in_wait.min(wait), calls, running_call_ns))
}

#[cfg(test)]
mod tests;
