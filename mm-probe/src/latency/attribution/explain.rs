//! The one sentence a spike is told in: who held the CPU, what it ran, and for how long.

use super::{
    facts::{CAUSE_SHARE, Cause, Facts, FunctionShare, Holder, Occupancy, running},
    unseen,
};
use crate::kernel::syscalls;
use crate::latency::decoder::{Stack, Syscall, TimerWait, prev_state_name};
use crate::units::format_nanos;

pub(super) fn explain(
    f: &Facts,
    occupancy: Occupancy,
    holders: &[Holder],
    cause: Cause,
    same_task: bool,
    without_rescheduling: bool,
    slept_in: Option<&str>,
) -> String {
    let w = f.wakeup;
    let mut text = format!("{} waited {} on CPU {}", w.task, format_nanos(w.total_ns()), w.run_cpu);
    if w.target_cpu != w.run_cpu {
        text += &format!(" (woken for CPU {})", w.target_cpu);
    } else if w.waker_cpu != w.run_cpu {
        // The woken task could only preempt once CPU `run_cpu` took the reschedule IPI.
        text += &format!(" (woken from CPU {})", w.waker_cpu);
    }
    text += ": ";
    if let Some(timer) = &w.timer {
        text += &timer_clause(timer, w.latency_ns);
    }
    let holder = match occupancy {
        Occupancy::Idle => return text + "the CPU was idle, so the wait was spent waking it and handling interrupts",
        Occupancy::Contention => return text + &contention(holders, cause),
        Occupancy::Held(i) => &holders[i],
    };
    if f.unseen {
        text += &unseen::explain(holder, f.stolen_ns);
        if !holder.is_prev {
            text += &format!("; {} ran last before it", w.prev.task);
        }
        return text;
    }
    if !holder.is_prev {
        text += &format!("{} held the CPU for {} of it", holder.task(), format_nanos(holder.on_cpu_ns));
        match (cause, f.departure) {
            // What it ran too (madvise(MADV_COLD, 512 MiB)): the advice hangs on the call.
            (Cause::Function(_), Some(d)) => {
                text += &format!(" inside {} ({})", cause.label(f.functions), what_it_ran(&d.syscall, &d.stack))
            }
            (Cause::Function(_), None) => text += &format!(" inside {}", cause.label(f.functions)),
            (Cause::OwnStartup, _) => text += " (mm-probe's own start-up)",
            (_, Some(d)) => text += &format!(" ({})", what_it_ran(&d.syscall, &d.stack)),
            _ => {}
        }
        return text + &format!(" and left it {}; {} ran last before it", prev_state_name(holder.state), w.prev.task);
    }
    if w.blocker.since_ns.is_none() && w.target_cpu == w.run_cpu {
        text += "no task switch had been seen on that CPU since tracing started; ";
    } else if !same_task {
        text += &format!("{} was running at the wakeup, {} ran last before it; ", w.blocker.task, w.prev.task);
    }
    if cause == Cause::OwnStartup {
        text += "mm-probe's own start-up: ";
    }
    if running(w.prev_state) {
        text += &format!("{} was {}", w.prev.task, what_it_ran(&w.prev_syscall, &w.prev_stack));
    } else {
        text += &format!("{} held the CPU for {} of it", w.prev.task, format_nanos(holder.on_cpu_ns));
    }
    text += &function_text(f.shares, w.latency_ns);
    if !running(w.prev_state) {
        // The sleep is context: it began when the CPU was given up.
        match slept_in {
            Some(name) => text += &format!(", then slept in {name}"),
            None => text += &format!(", then left it {}", prev_state_name(w.prev_state)),
        }
    }
    if without_rescheduling {
        text += " without rescheduling";
    }
    text
}

/// "CPU contention: 3 tasks ran, longest stress-ng-264 (1.2ms)" (what the kept stays do not
/// cover is added as unaccounted).
fn contention(holders: &[Holder], cause: Cause) -> String {
    let busy: Vec<&Holder> = holders.iter().filter(|h| h.pid != 0).collect();
    let mut text = format!(
        "CPU contention: {} tasks ran, longest {} ({})",
        busy.len(),
        busy[0].task(),
        format_nanos(busy[0].on_cpu_ns)
    );
    if cause == Cause::OwnStartup {
        text += ", mm-probe's own start-up";
    }
    text
}

/// What a task was running when it was preempted, from its syscall and stack.
fn what_it_ran(syscall: &Option<Option<Syscall>>, stack: &Stack) -> String {
    match (syscall.as_ref().and_then(Option::as_ref), stack.entry()) {
        (Some(call), _) if call.name.is_some_and(|name| syscalls::only_waits(name, &call.args)) => {
            format!("preempted around {}, a syscall that waits", call.summary)
        }
        (Some(call), _) if call.returned.is_some() => format!("in {}, preempted as it returned", call.summary),
        (Some(call), _) => format!("in {}", call.summary),
        (None, Some(entry)) => entry.phrase().to_string(),
        (None, None) if syscall.is_some() => "in user space or an interrupt".to_string(),
        (None, None) => "running".to_string(),
    }
}

fn function_text(shares: &[FunctionShare], latency_ns: u64) -> String {
    match shares.first() {
        Some(top) if top.in_wait_ns as f64 >= CAUSE_SHARE * latency_ns.max(1) as f64 => {
            let mut text = format!(" → {} for {}", top.function, format_nanos(top.in_wait_ns));
            if top.calls > 1 {
                text += &format!(" over {} calls", top.calls);
            }
            text
        }
        Some(top) => format!(" (in {} for only {} of the wait)", top.function, format_nanos(top.in_wait_ns)),
        None => " (outside the traced functions)".to_string(),
    }
}

/// The wait before a timer wakeup, and where the rest begins: "its timer fired 16ms late,
/// interrupts coming back on in free_unref_page_list ← release_pages ← tlb_batch_pages_flush
/// (stress-ng-vm-186 in munmap(512 MiB)); in the 85µs after its wakeup: ".
fn timer_clause(timer: &TimerWait, since_wakeup_ns: u64) -> String {
    let mut text = format!("its timer fired {} late", format_nanos(timer.late_ns));
    if let Some(i) = &timer.interrupted {
        let whose = match &i.syscall {
            Some(call) => format!("{} in {}", i.task, call.summary),
            None => i.task.to_string(),
        };
        text += &match (&i.place, i.in_user_space, i.task.pid) {
            (_, _, 0) => " while the CPU was idle".to_string(),
            (_, true, _) => format!(" while {} ran in user space, interrupts on", i.task),
            (Some(place), ..) => format!(", interrupts coming back on in {place} ({whose})"),
            (None, ..) => format!(", interrupting {whose}"),
        };
    }
    text + &format!("; in the {} after its wakeup: ", format_nanos(since_wakeup_ns))
}
