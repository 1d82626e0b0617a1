//! Why a wakeup was late: who held the CPU, whether it ran through the whole wait without
//! rescheduling, how much of the wait it spent inside each traced function, and which syscall
//! it was in — then one sentence that says so.
//!
//! The kernel hands over two copies of the task's function state (at the wakeup and at the
//! switch); the time inside a function during the wait is their difference, corrected for the
//! calls that straddle either end of the wait.

use mm_probe_common::latency::{FuncState, MAX_FUNCS};
use serde::Serialize;

use super::decoder::{Syscall, Wakeup};
use crate::units::format_nanos;

/// Time one traced function took out of a wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionShare {
    pub function: String,
    /// Time inside the function during the wait.
    pub in_wait_ns: u64,
    /// Calls that overlapped the wait.
    pub calls: u64,
    /// How long the call still running at the switch had run (it may have started before the
    /// wakeup); `None` when the task had left the function.
    pub running_call_ns: Option<u64>,
}

/// The explanation of one wakeup spike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attribution {
    /// The task that switched away to let the woken task run is the one that was running at
    /// the wakeup.
    pub blocker_ran_until_switch: bool,
    /// That task was on the CPU from before the wakeup until the switch.
    pub without_rescheduling: bool,
    /// Traced functions the blocker spent time in during the wait, most first.
    pub functions: Vec<FunctionShare>,
    /// The leading cause: a function name, `syscall <name>`, `idle`, or `unknown`.
    pub cause: String,
    pub explanation: String,
}

/// A share at least this large of the wait makes a function the cause.
const CAUSE_SHARE: f64 = 0.5;

/// Explains `wakeup`; `functions[slot]` names the traced function of each slot.
pub fn attribute(wakeup: &Wakeup, functions: &[String]) -> Attribution {
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
                    FunctionShare { function: functions[slot].clone(), in_wait_ns, calls, running_call_ns }
                })
            })
            .collect();
    shares.sort_by_key(|s| std::cmp::Reverse(s.in_wait_ns));
    let syscall = wakeup.prev_syscall.as_ref().and_then(Option::as_ref);
    let cause = cause(wakeup, &shares, syscall);
    let explanation = explain(wakeup, same_task, without_rescheduling, &shares, syscall);
    Attribution { blocker_ran_until_switch: same_task, without_rescheduling, functions: shares, cause, explanation }
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

fn cause(wakeup: &Wakeup, shares: &[FunctionShare], syscall: Option<&Syscall>) -> String {
    let wait = wakeup.latency_ns.max(1) as f64;
    if let Some(top) = shares.first().filter(|s| s.in_wait_ns as f64 >= CAUSE_SHARE * wait) {
        return top.function.clone();
    }
    if wakeup.prev.task.pid == 0 && wakeup.blocker.task.pid == 0 {
        return "idle".into();
    }
    match (syscall, wakeup.prev_stack.entry()) {
        (Some(call), _) => format!("syscall {}", call.name.unwrap_or("other")),
        (None, Some(entry)) => entry.cause().into(),
        (None, None) => "unknown".into(),
    }
}

fn explain(
    wakeup: &Wakeup,
    same_task: bool,
    without_rescheduling: bool,
    shares: &[FunctionShare],
    syscall: Option<&Syscall>,
) -> String {
    let mut text = format!("{} waited {} on CPU {}", wakeup.task, format_nanos(wakeup.latency_ns), wakeup.run_cpu);
    if wakeup.target_cpu != wakeup.run_cpu {
        text += &format!(" (woken for CPU {})", wakeup.target_cpu);
    } else if wakeup.waker_cpu != wakeup.run_cpu {
        // The woken task could only preempt once CPU `run_cpu` took the reschedule IPI.
        text += &format!(" (woken from CPU {})", wakeup.waker_cpu);
    }
    text += ": ";
    if wakeup.blocker.since_ns.is_none() && wakeup.target_cpu == wakeup.run_cpu {
        text += "no task switch had been seen on that CPU since tracing started; ";
    } else if wakeup.blocker.task.pid == 0 && wakeup.prev.task.pid == 0 {
        return text + "the CPU was idle, so the wait was spent waking it and handling interrupts";
    } else if !same_task {
        text +=
            &format!("{} was running at the wakeup, {} ran last before it; ", wakeup.blocker.task, wakeup.prev.task);
    }
    text += &format!("{} was ", wakeup.prev.task);
    text += &match (syscall, wakeup.prev_stack.entry()) {
        (Some(call), _) => format!("in {}", call.summary),
        (None, Some(entry)) => entry.phrase().to_string(),
        (None, None) if wakeup.prev_syscall.is_some() => "in user space or an interrupt".to_string(),
        (None, None) => "running".to_string(),
    };
    match shares.first() {
        Some(top) if top.in_wait_ns as f64 >= CAUSE_SHARE * wakeup.latency_ns.max(1) as f64 => {
            text += &format!(" → {} for {}", top.function, format_nanos(top.in_wait_ns));
            if top.calls > 1 {
                text += &format!(" over {} calls", top.calls);
            }
        }
        Some(top) => {
            text += &format!(" (in {} for only {} of the wait)", top.function, format_nanos(top.in_wait_ns));
        }
        None => text += " (outside the traced functions)",
    }
    if without_rescheduling {
        text += " without rescheduling";
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::decoder::{OnCpu, Stack, TaskRef, decode_syscall};
    use mm_probe_common::latency::SyscallState;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    fn task(pid: u32, comm: &str) -> TaskRef {
        TaskRef { pid, comm: comm.into() }
    }

    /// cyclictest-250 woken at 10 ms on CPU 1 while stress-ng-264 had been running since 9 ms.
    fn wakeup(latency_ns: u64) -> Wakeup {
        let stress = OnCpu { task: task(264, "stress-ng"), since_ns: Some(9 * MS) };
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
        }
    }

    fn names() -> Vec<String> {
        vec!["madvise_cold_or_pageout_pte_range".into(), "zap_pte_range".into()]
    }

    #[test]
    fn one_long_call_spanning_the_wait_is_the_cause() {
        let mut w = wakeup(1953 * US);
        // Entered 12 µs before the wakeup; still inside at the switch.
        w.blocker_funcs.entry_ns[0] = 10 * MS - 12 * US;
        w.blocker_funcs.total_ns[0] = 40 * MS;
        w.blocker_funcs.calls[0] = 100;
        w.prev_funcs = w.blocker_funcs;
        let a = attribute(&w, &names());
        assert!(a.blocker_ran_until_switch && a.without_rescheduling);
        assert_eq!(a.functions.len(), 1);
        assert_eq!(a.functions[0].in_wait_ns, 1953 * US);
        assert_eq!(a.functions[0].calls, 1);
        assert_eq!(a.functions[0].running_call_ns, Some(1965 * US));
        assert_eq!(a.cause, "madvise_cold_or_pageout_pte_range");
        assert_eq!(
            a.explanation,
            "cyclictest-250 waited 1.95ms on CPU 1: stress-ng-264 was in madvise(MADV_PAGEOUT, 2 GiB) \
             → madvise_cold_or_pageout_pte_range for 1.95ms without rescheduling"
        );
    }

    #[test]
    fn calls_completed_during_the_wait_are_summed_without_their_part_before_it() {
        let mut w = wakeup(2 * MS);
        // At the wakeup: inside a call that began 300 µs earlier.
        w.blocker_funcs.entry_ns[0] = 10 * MS - 300 * US;
        w.blocker_funcs.total_ns[0] = 5 * MS;
        w.blocker_funcs.calls[0] = 10;
        // At the switch: that call (500 µs) and two more (400 µs each) completed, a fourth has
        // run for 100 µs.
        w.prev_funcs.total_ns[0] = 5 * MS + 500 * US + 800 * US;
        w.prev_funcs.calls[0] = 13;
        w.prev_funcs.entry_ns[0] = 12 * MS - 100 * US;
        let a = attribute(&w, &names());
        let share = &a.functions[0];
        assert_eq!(share.in_wait_ns, 200 * US + 800 * US + 100 * US);
        assert_eq!(share.calls, 4);
        assert_eq!(share.running_call_ns, Some(100 * US));
        assert_eq!(a.cause, "madvise_cold_or_pageout_pte_range");
        assert!(a.explanation.contains("for 1.1ms over 4 calls"), "{}", a.explanation);
    }

    #[test]
    fn a_short_stay_in_a_function_is_reported_but_is_not_the_cause() {
        let mut w = wakeup(2 * MS);
        w.prev_funcs.total_ns[1] = 100 * US;
        w.prev_funcs.calls[1] = 1;
        let a = attribute(&w, &names());
        assert_eq!(a.functions[0].function, "zap_pte_range");
        assert_eq!(a.cause, "syscall madvise");
        assert!(a.explanation.contains("(in zap_pte_range for only 100µs of the wait)"), "{}", a.explanation);
        assert!(a.explanation.ends_with("without rescheduling"), "{}", a.explanation);
    }

    #[test]
    fn another_task_switching_away_means_only_its_running_call_counts() {
        let mut w = wakeup(3 * MS);
        w.prev = OnCpu { task: task(300, "kswapd0"), since_ns: Some(11 * MS) };
        w.prev_funcs.entry_ns[0] = 11 * MS;
        w.prev_funcs.total_ns[0] = 99 * MS;
        w.prev_syscall = None;
        let a = attribute(&w, &names());
        assert!(!a.blocker_ran_until_switch && !a.without_rescheduling);
        assert_eq!(a.functions[0].in_wait_ns, 2 * MS, "from 11 ms to the switch at 13 ms");
        assert!(
            a.explanation.contains("stress-ng-264 was running at the wakeup, kswapd0-300 ran last before it"),
            "{}",
            a.explanation
        );
        assert!(a.explanation.contains("kswapd0-300 was running → madvise"), "{}", a.explanation);
    }

    #[test]
    fn a_wakeup_from_another_cpu_says_so() {
        let mut w = wakeup(2 * MS);
        w.waker_cpu = 0;
        let a = attribute(&w, &names());
        assert!(
            a.explanation.starts_with("cyclictest-250 waited 2ms on CPU 1 (woken from CPU 0): "),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn an_idle_cpu_is_called_idle() {
        let mut w = wakeup(600 * US);
        let idle = OnCpu { task: task(0, "swapper/1"), since_ns: Some(MS) };
        w.blocker = idle.clone();
        w.prev = idle;
        w.prev_syscall = None;
        let a = attribute(&w, &names());
        assert_eq!(a.cause, "idle");
        assert!(
            a.explanation.ends_with("the CPU was idle, so the wait was spent waking it and handling interrupts"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn a_blocker_in_a_page_fault_is_named_from_its_stack() {
        let mut w = wakeup(800 * US);
        w.prev_syscall = Some(None);
        w.prev_stack = Stack {
            frames: vec![
                "__schedule+0x4f8".into(),
                "exit_to_user_mode_prepare+0x17c".into(),
                "asm_exc_page_fault+0x22".into(),
            ],
            error: None,
        };
        let a = attribute(&w, &names());
        assert_eq!(a.cause, "page fault");
        assert!(
            a.explanation.contains("stress-ng-264 was in a page fault (outside the traced functions)"),
            "{}",
            a.explanation
        );
    }

    #[test]
    fn user_space_blockers_are_named_as_such() {
        let mut w = wakeup(800 * US);
        w.prev_syscall = Some(None);
        let a = attribute(&w, &names());
        assert_eq!(a.cause, "unknown");
        assert!(
            a.explanation.contains(
                "stress-ng-264 was in user space or an interrupt (outside the traced functions) without rescheduling"
            ),
            "{}",
            a.explanation
        );
    }
}
