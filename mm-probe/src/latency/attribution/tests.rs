use super::*;

enum Says {
    Starts,
    Contains,
    Ends,
}

/// The explanation holds `part` where `says` puts it; the whole explanation otherwise.
fn assert_says(a: &Attribution, says: Says, part: &str) {
    let text = &a.explanation;
    let holds = match says {
        Says::Starts => text.starts_with(part),
        Says::Contains => text.contains(part),
        Says::Ends => text.ends_with(part),
    };
    assert!(holds, "{part:?} not where expected in: {text}");
}
use crate::latency::{
    decoder::{Interrupted, OnCpu, Stack, TaskRef, TimerWait, decode_syscall, leaving_syscall},
    fixtures::*,
};
use mm_probe_common::latency::SyscallState;

#[test]
fn one_long_call_spanning_the_wait_is_the_cause() {
    let mut w = wakeup(1953 * US);
    // Entered 12 µs before the wakeup; still inside at the switch.
    w.blocker_funcs.entry_ns[0] = 10 * MS - 12 * US;
    w.blocker_funcs.total_ns[0] = 40 * MS;
    w.blocker_funcs.calls[0] = 100;
    w.prev_funcs = w.blocker_funcs;
    let a = attribute(&w, &names(), MM_PROBE);
    assert!(a.blocker_ran_until_switch && a.without_rescheduling);
    assert_eq!(a.functions.len(), 1);
    assert_eq!(a.functions[0].in_wait_ns, 1953 * US);
    assert_eq!(a.functions[0].calls, 1);
    assert_eq!(a.functions[0].running_call_ns, Some(1965 * US));
    assert_eq!(a.cause, Cause::Function(0));
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
    let a = attribute(&w, &names(), MM_PROBE);
    let share = &a.functions[0];
    assert_eq!(share.in_wait_ns, 200 * US + 800 * US + 100 * US);
    assert_eq!(share.calls, 4);
    assert_eq!(share.running_call_ns, Some(100 * US));
    assert_eq!(a.cause, Cause::Function(0));
    assert!(a.explanation.contains("for 1.1ms over 4 calls"), "{}", a.explanation);
}

#[test]
fn a_short_stay_in_a_function_is_reported_but_is_not_the_cause() {
    let mut w = wakeup(2 * MS);
    w.prev_funcs.total_ns[1] = 100 * US;
    w.prev_funcs.calls[1] = 1;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.functions[0].function, "zap_pte_range");
    assert_eq!(a.cause, Cause::Syscall(libc::SYS_madvise));
    assert_eq!(a.cause.label(&names()), "syscall madvise");
    assert!(a.explanation.contains("(in zap_pte_range for only 100µs of the wait)"), "{}", a.explanation);
    assert!(a.explanation.ends_with("without rescheduling"), "{}", a.explanation);
}

#[test]
fn another_task_switching_away_means_only_its_running_call_counts() {
    let mut w = wakeup(3 * MS);
    w.prev = fair(300, "kswapd0", 11 * MS);
    w.prev_funcs.entry_ns[0] = 11 * MS;
    w.prev_funcs.total_ns[0] = 99 * MS;
    w.prev_syscall = None;
    let a = attribute(&w, &names(), MM_PROBE);
    assert!(!a.blocker_ran_until_switch && !a.without_rescheduling);
    assert_eq!(a.functions[0].in_wait_ns, 2 * MS, "from 11 ms to the switch at 13 ms");
    assert_says(&a, Says::Contains, "stress-ng-264 was running at the wakeup, kswapd0-300 ran last before it");
    assert!(a.explanation.contains("kswapd0-300 was running → madvise"), "{}", a.explanation);
}

#[test]
fn a_wakeup_from_another_cpu_says_so() {
    let mut w = wakeup(2 * MS);
    w.waker_cpu = 0;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_says(&a, Says::Starts, "cyclictest-250 waited 2ms on CPU 1 (woken from CPU 0): ");
}

#[test]
fn an_idle_cpu_is_called_idle() {
    let mut w = wakeup(600 * US);
    let idle = fair(0, "swapper/1", MS);
    w.blocker = idle.clone();
    w.prev = idle;
    w.prev_syscall = None;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Idle);
    assert_says(&a, Says::Ends, "the CPU was idle, so the wait was spent waking it and handling interrupts");
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
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::PageFault);
    assert_says(&a, Says::Contains, "stress-ng-264 was in a page fault (outside the traced functions)");
}

/// 6.1's madvise(MADV_PAGEOUT) walk has no reschedule point: the vm stressor held the CPU
/// through the whole call and was preempted only on its way back to user space, where the
/// registers hold the call's result. The call is named all the same, and is the cause.
#[test]
fn a_holder_preempted_as_its_syscall_returned_is_blamed_on_that_syscall() {
    let mut w = wakeup(34 * MS);
    let returned =
        SyscallState { orig_ax: libc::SYS_madvise, ax: 0, regs_read: 1, args: [0x7f00_0000, 512 << 20, 21, 0] };
    w.prev_stack = Stack {
        frames: [
            "__schedule+0x2f2",
            "schedule+0x5a",
            "exit_to_user_mode_prepare+0xb9",
            "do_syscall_64+0x67",
            "entry_SYSCALL_64_after_hwframe+0x64",
        ]
        .map(String::from)
        .to_vec(),
        error: None,
    };
    w.prev_syscall = Some(leaving_syscall(&returned, &w.prev_stack));
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Syscall(libc::SYS_madvise));
    assert_says(
        &a,
        Says::Contains,
        "stress-ng-264 was in madvise(MADV_PAGEOUT, 512 MiB), preempted as it returned (outside the traced functions)",
    );
}

#[test]
fn user_space_blockers_are_named_as_such() {
    let mut w = wakeup(800 * US);
    w.prev_syscall = Some(None);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Preempted, "it was preempted running in user space");
    assert_says(
        &a,
        Says::Contains,
        "stress-ng-264 was in user space or an interrupt (outside the traced functions) without rescheduling",
    );
}

/// Seen on a cloud VM under load: a task sleeping 1 ms at a time was on the CPU for most of
/// a 2 ms wait, charged 100 µs of it. It did not hold the CPU by running: the hypervisor ran
/// another guest's vCPU (steal), and the spike says so instead of blaming the sleeper.
#[test]
fn time_the_scheduler_did_not_charge_is_steal_not_the_holders() {
    let w = ended_by_a_sleeper(vec![
        charged(slice(264, "stress-ng", 9 * MS, 10 * MS + 100 * US, 0x100), 1100 * US),
        charged(slice(77, "sleeper", 10 * MS + 100 * US, 12 * MS, 1), 100 * US),
    ]);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::StolenOrIrq);
    assert_eq!(a.cause.label(&names()), "steal or irq time");
    assert_eq!(a.stolen_ns, Some(1800 * US), "1.9 ms on the CPU, 0.1 ms of it charged");
    let sleeper = a.ran_during_wait.iter().find(|h| h.pid == 77).unwrap();
    assert_eq!((sleeper.on_cpu_ns, sleeper.executed_ns), (1900 * US, Some(100 * US)));
    assert_says(&a, Says::Contains, "but for 1.8ms of it no task ran (hypervisor steal or interrupts");
    assert_says(&a, Says::Contains, "sleeper-77 ran 100µs, stress-ng-264 ran 100µs of its time on the CPU");
}

#[test]
fn fully_charged_stays_keep_their_cause_and_unread_run_time_is_null() {
    let stays = |exec: Option<u64>| {
        let hog = slice(264, "stress-ng", 9 * MS, 12 * MS - 20 * US, 0x100);
        let sleeper = slice(77, "sleeper", 12 * MS - 20 * US, 12 * MS, 1);
        match exec {
            Some(_) => vec![charged(hog, 3 * MS - 20 * US), charged(sleeper, 20 * US)],
            None => vec![hog, sleeper],
        }
    };
    let charged_run = attribute(&ended_by_a_sleeper(stays(Some(0))), &names(), MM_PROBE);
    assert_eq!(charged_run.cause, Cause::Preempted);
    assert_eq!(charged_run.stolen_ns, Some(0));
    // The hog's stay began 1 ms before the wait: only its part within the wait counts.
    assert_eq!(charged_run.held_by.as_ref().and_then(|h| h.executed_ns), Some(2 * MS - 20 * US));
    let unread = attribute(&ended_by_a_sleeper(stays(None)), &names(), MM_PROBE);
    assert_eq!((unread.cause, unread.stolen_ns), (Cause::Preempted, None));
    assert_eq!(unread.held_by.as_ref().map(|h| h.executed_ns), Some(None));
}

fn sleeping_in(call: i64, args: [u64; 4]) -> Option<Option<Syscall>> {
    Some(decode_syscall(&SyscallState { orig_ax: call, ax: -i64::from(libc::ENOSYS), regs_read: 1, args }))
}

/// A 2 ms wait (10 to 12 ms) that ends when `sleeper-77`, which ran last, goes to sleep in
/// clock_nanosleep.
fn ended_by_a_sleeper(slices: Vec<Slice>) -> Wakeup {
    let mut w = wakeup(2 * MS);
    w.prev = OnCpu { since_ns: slices.last().and_then(|s| s.start_ns), ..fair(77, "sleeper", 0) };
    w.prev_state = 1;
    w.prev_syscall = sleeping_in(libc::SYS_clock_nanosleep, [1, 0, 0, 0]);
    w.slices = slices;
    w
}

#[test]
fn a_sleepers_clock_nanosleep_is_never_the_cause_the_hog_before_it_is() {
    let w = ended_by_a_sleeper(vec![
        slice(264, "stress-ng", 9 * MS, 12 * MS - 20 * US, 0x100),
        slice(77, "sleeper", 12 * MS - 20 * US, 12 * MS, 1),
    ]);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Preempted);
    assert_eq!(a.held_by.as_ref().map(|h| h.pid), Some(264));
    assert_eq!(a.slept_in, Some("clock_nanosleep"));
    assert_eq!(
        a.ran_during_wait.iter().map(|h| (h.pid, h.on_cpu_ns)).collect::<Vec<_>>(),
        [(264, 2 * MS - 20 * US), (77, 20 * US)]
    );
    assert_eq!(
        a.explanation,
        "cyclictest-250 waited 2ms on CPU 1: stress-ng-264 held the CPU for 1.98ms of it and left it \
         preempted (R+); sleeper-77 ran last before it"
    );
}

/// stress-ng-264 held CPU 1 from 9 ms in write(2) and was preempted at 12 ms - 20 µs by
/// migration/1, which switched away last: the CPU's last long stay is the hog's.
fn hog_then_stopper(departure_end_ns: u64) -> Wakeup {
    let mut w = wakeup(2 * MS);
    w.prev = OnCpu { task: task(21, "migration/1"), since_ns: Some(12 * MS - 20 * US), prio: 0 };
    w.prev_state = 1;
    w.prev_syscall = Some(None);
    w.prev_stack = Stack { frames: vec!["__schedule+0x50e".into(), "smpboot_thread_fn+0x1dc".into()], error: None };
    w.slices = vec![
        slice(264, "stress-ng", 9 * MS, 12 * MS - 20 * US, 0x100),
        slice(21, "migration/1", 12 * MS - 20 * US, 12 * MS, 1),
    ];
    let write =
        SyscallState { orig_ax: libc::SYS_write, ax: -i64::from(libc::ENOSYS), regs_read: 1, args: [3, 0, 8, 0] };
    w.long_stays = vec![Departure {
        pid: 264,
        end_ns: departure_end_ns,
        stack: Stack { frames: vec!["__schedule+0x10".into(), "ksys_write+0x60".into()], error: None },
        syscall: Some(decode_syscall(&write)),
    }];
    w
}

#[test]
fn a_holder_preempted_by_a_stopper_shows_its_own_stack_and_syscall() {
    let a = attribute(&hog_then_stopper(12 * MS - 20 * US), &names(), MM_PROBE);
    assert_eq!(a.held_by.as_ref().map(|h| h.pid), Some(264));
    assert_eq!(a.cause, Cause::Syscall(libc::SYS_write));
    assert_eq!(a.stack_of, task(264, "stress-ng"));
    assert_eq!(a.stack.frames[1], "ksys_write+0x60");
    assert_eq!(a.syscall.as_ref().and_then(|c| c.name), Some("write"));
    assert_says(&a, Says::Contains, "stress-ng-264 held the CPU for 1.98ms of it (in write(");
    assert_says(&a, Says::Ends, "; migration/1-21 ran last before it");
}

/// The case the 6.1 field test met once (pageout_storm preempted inside
/// madvise_cold_or_pageout_pte_range, then migration/0 ran): the function and the syscall are
/// both named, since the advice needs the call and its length.
#[test]
fn a_holder_preempted_by_a_stopper_inside_a_traced_function_shows_the_function_and_the_call() {
    let mut w = hog_then_stopper(12 * MS - 20 * US);
    w.slices[0].in_funcs = 1 << 1;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Function(1));
    assert_says(&a, Says::Contains, "stress-ng-264 held the CPU for 1.98ms of it inside zap_pte_range (in write(");
    assert_says(&a, Says::Ends, "; migration/1-21 ran last before it");
}

#[test]
fn a_long_stay_that_is_not_the_holders_last_is_not_shown_as_its_stack() {
    // The long stay kept is an earlier one of the same task: what it did then is not what
    // it did when it left in the wait.
    let a = attribute(&hog_then_stopper(8 * MS), &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Preempted);
    assert_eq!(a.stack_of, task(21, "migration/1"));
    assert_eq!(a.stack.frames[1], "smpboot_thread_fn+0x1dc");
    assert_eq!(a.syscall, None);
}

#[test]
fn a_holder_whose_last_short_stay_was_not_kept_shows_its_long_stay_in_the_wait() {
    // A stopper split the hold: the long part ended at 11.5 ms, the short rest (under half the
    // threshold, so not kept) at 12 ms - 40 µs, then migration/1 ran last.
    let mut w = hog_then_stopper(11 * MS + 500 * US);
    w.slices = vec![
        slice(264, "stress-ng", 9 * MS, 11 * MS + 500 * US, 0x100),
        slice(21, "migration/1", 11 * MS + 500 * US, 11 * MS + 520 * US, 1),
        slice(264, "stress-ng", 11 * MS + 520 * US, 12 * MS - 40 * US, 0x100),
        slice(21, "migration/1", 12 * MS - 40 * US, 12 * MS, 1),
    ];
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.held_by.as_ref().map(|h| h.pid), Some(264));
    assert_eq!(a.stack_of, task(264, "stress-ng"));
    assert_eq!(a.stack.frames[1], "ksys_write+0x60");
    assert_eq!(a.cause, Cause::Syscall(libc::SYS_write));
}

#[test]
fn a_long_stay_after_the_holders_does_not_hide_it() {
    // migration/1 itself stayed long (an emulated CPU stalled) after the holder left: the
    // ring still holds the holder's stay.
    let mut w = hog_then_stopper(12 * MS - 20 * US);
    let stopper = Departure {
        pid: 21,
        end_ns: 12 * MS,
        stack: Stack { frames: vec!["__schedule+0x50e".into(), "smpboot_thread_fn+0x1dc".into()], error: None },
        syscall: Some(None),
    };
    w.long_stays.push(stopper);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.stack_of, task(264, "stress-ng"));
    assert_eq!(a.syscall.as_ref().and_then(|c| c.name), Some("write"));
}

#[test]
fn a_task_that_ran_then_slept_is_the_holder_with_its_sleep_as_context() {
    let w = ended_by_a_sleeper(vec![slice(77, "sleeper", 9 * MS, 12 * MS, 1)]);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Unknown, "what it ran before sleeping is not recorded");
    assert!(!a.cause.label(&names()).contains("nanosleep"));
    assert_says(
        &a,
        Says::Ends,
        "sleeper-77 held the CPU for 2ms of it (outside the traced functions), then slept in clock_nanosleep",
    );
}

#[test]
fn a_task_preempted_in_a_waiting_syscall_is_not_blamed_for_it() {
    let mut w = wakeup(2 * MS);
    // futex(addr, FUTEX_WAIT_PRIVATE, …), preempted on its way in.
    w.prev_syscall = sleeping_in(libc::SYS_futex, [0, 128, 0, 0]);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Preempted);
    assert!(a.explanation.contains("preempted around futex(), a syscall that waits"), "{}", a.explanation);
}

#[test]
fn three_tasks_taking_turns_are_cpu_contention() {
    let mut w = wakeup(3 * MS);
    w.slices = vec![
        slice(301, "python3", 9 * MS, 11 * MS, 0x100),
        slice(302, "python3", 11 * MS, 12 * MS, 1),
        slice(264, "stress-ng", 12 * MS, 13 * MS, 0x100),
    ];
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::CpuContention);
    assert_eq!(a.cause.label(&names()), "cpu contention");
    assert_eq!(a.held_by, None);
    assert_eq!(a.ran_during_wait.len(), 3);
    assert!(
        a.explanation.ends_with("CPU contention: 3 tasks ran, longest python3-301 (1ms)"),
        "ties keep the earliest: {}",
        a.explanation
    );
}

#[test]
fn one_hog_through_the_wait_is_named_with_what_it_ran() {
    let mut w = wakeup(2 * MS);
    w.slices = vec![slice(264, "stress-ng", 9 * MS, 12 * MS, 0x100)];
    w.prev_syscall = Some(None);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.held_by.as_ref().map(|h| (h.pid, h.on_cpu_ns)), Some((264, 2 * MS)));
    assert_eq!(a.cause, Cause::Preempted);
    assert!(a.explanation.contains("stress-ng-264 was in user space or an interrupt"), "{}", a.explanation);
}

#[test]
fn an_earlier_holder_inside_a_traced_function_is_blamed_on_it() {
    let mut w = ended_by_a_sleeper(vec![
        slice(264, "stress-ng", 9 * MS, 12 * MS - 20 * US, 0x100),
        slice(77, "sleeper", 12 * MS - 20 * US, 12 * MS, 1),
    ]);
    w.slices[0].in_funcs = 1 << 1;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Function(1));
    assert!(a.explanation.contains("held the CPU for 1.98ms of it inside zap_pte_range"), "{}", a.explanation);
}

#[test]
fn a_mostly_idle_cpu_is_idle_even_when_a_task_ran_briefly() {
    let mut w = wakeup(2 * MS);
    w.slices = vec![
        slice(0, "swapper/1", 9 * MS, 11 * MS + 800 * US, 0x100),
        slice(264, "stress-ng", 11 * MS + 800 * US, 12 * MS, 1),
        slice(265, "kworker/1:1", 12 * MS, 12 * MS, 1),
    ];
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Idle);
}

#[test]
fn mm_probes_own_start_up_is_labelled_as_such() {
    let mut w = wakeup(2 * MS);
    w.slices = vec![Slice { tgid: MM_PROBE, ..slice(MM_PROBE + 1, "mm-probe", 9 * MS, 12 * MS, 0x100) }];
    w.prev = fair(MM_PROBE + 1, "mm-probe", 9 * MS);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::OwnStartup);
    assert_eq!(a.cause.label(&names()), "mm-probe start-up");
    assert!(a.explanation.contains("mm-probe's own start-up"), "{}", a.explanation);
}

/// Seen in the field: mm-probe's start-up ran 121.9 µs of an 18.09 ms wait, the longest of
/// the stays kept, while the rest of the wait fell out of the kernel's ring. Its start-up is
/// the cause only when it held most of the wait.
#[test]
fn mm_probes_start_up_is_the_cause_only_by_its_share_of_the_wait() {
    let own = |slice: Slice| Slice { tgid: MM_PROBE, ..slice };
    let mut w = wakeup(18_090 * US);
    let end = w.run_ns;
    w.slices = vec![
        own(slice(MM_PROBE + 1, "mm-probe", end - 200 * US, end - 78_100, 0x100)),
        slice(301, "python3", end - 78_100, end - 20 * US, 0x100),
        slice(264, "stress-ng", end - 20 * US, end, 0x100),
    ];
    w.slices_truncated = true;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.ran_during_wait[0].on_cpu_ns, 121_900, "the longest stay kept is mm-probe's");
    assert_eq!(a.cause, Cause::CpuContention);
    assert!(!a.explanation.contains("start-up"), "{}", a.explanation);
    assert_says(&a, Says::Ends, "; unaccounted: 17.89ms of the 18.09ms wait, before the last 8 stays the kernel kept");

    // The same three stays, where mm-probe's own threads ran 10 ms of the wait.
    w.slices[0].start_ns = Some(end - 10 * MS - 78_100);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::OwnStartup);
    assert_says(&a, Says::Contains, ", mm-probe's own start-up");
}

/// Seen in the field: "CPU contention: 3 tasks ran" for a 1.76 s wait whose kept stays cover
/// 3.7 ms. The rest is stated as unaccounted, and the parts add up to the whole wait.
#[test]
fn contention_over_a_few_kept_stays_says_how_much_of_the_wait_is_unaccounted() {
    let mut w = wakeup(1760 * MS);
    let end = w.run_ns;
    w.slices = vec![
        slice(301, "python3", end - 3700 * US, end - 2200 * US, 0x100),
        slice(302, "python3", end - 2200 * US, end - 1000 * US, 1),
        slice(264, "stress-ng", end - 1000 * US, end, 0x100),
    ];
    w.slices_truncated = true;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::CpuContention);
    assert_eq!(a.unaccounted_ns, 1760 * MS - 3700 * US);
    assert_eq!(a.ran_during_wait.iter().map(|h| h.on_cpu_ns).sum::<u64>() + a.unaccounted_ns, w.latency_ns);
    assert_says(
        &a,
        Says::Ends,
        "CPU contention: 3 tasks ran, longest python3-301 (1.5ms); unaccounted: 1.76s of the 1.76s wait, before \
         the last 8 stays the kernel kept",
    );
    assert!(!a.ran_during_wait_complete);
}

/// Seen on the host under load: a stay whose switch-in the kernel did not see, kept after
/// three others, was counted from the wakeup, over them, and the stays added up to more
/// than the wait. It begins where the stay before it ended.
#[test]
fn a_stay_whose_start_was_not_seen_begins_after_the_stay_before_it() {
    let mut w = wakeup(3 * MS);
    w.slices = vec![
        slice(264, "stress-ng", 9 * MS, 11 * MS, 0x100),
        Slice { start_ns: None, ..slice(77, "sleeper", 0, 12 * MS, 1) },
        slice(264, "stress-ng", 12 * MS, 13 * MS, 0x100),
    ];
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.ran_during_wait.iter().map(|h| (h.pid, h.on_cpu_ns)).collect::<Vec<_>>(), [(264, 2 * MS), (77, MS)]);
    assert_eq!(a.unaccounted_ns, 0);
    assert_eq!(a.ran_during_wait.iter().map(|h| h.on_cpu_ns).sum::<u64>(), w.latency_ns);
}

#[test]
fn syscall_causes_are_named_never_numbered() {
    assert_eq!(Cause::Syscall(232).label(&names()), "syscall epoll_wait");
    assert_eq!(Cause::Function(0).label(&names()), "madvise_cold_or_pageout_pte_range");
}

/// A timer 16 ms late whose interrupt landed where stress-ng, unmapping, turned interrupts back
/// on; then 85 µs from the wakeup to the switch.
fn late_timer(late_ns: u64, interrupted: Option<Interrupted>) -> Wakeup {
    let mut w = wakeup(85 * US);
    w.timer = Some(TimerWait { late_ns, interrupted });
    w
}

fn interrupted(pid: u32, in_user_space: bool) -> Interrupted {
    let munmap = decode_syscall(&SyscallState {
        orig_ax: libc::SYS_munmap,
        ax: -i64::from(libc::ENOSYS),
        regs_read: 1,
        args: [0, 512 << 20, 0, 0],
    });
    Interrupted {
        task: TaskRef { pid, comm: if pid == 0 { "swapper/1".into() } else { "stress-ng-vm".into() } },
        in_user_space,
        place: (!in_user_space).then(|| "free_unref_page_list ← release_pages ← tlb_batch_pages_flush".into()),
        stack: Stack::default(),
        syscall: munmap.filter(|_| !in_user_space),
    }
}

#[test]
fn a_timer_late_for_most_of_the_wait_is_the_cause_and_names_where_interrupts_came_back_on() {
    let w = late_timer(16 * MS, Some(interrupted(186, false)));
    assert_eq!(w.total_ns(), 16 * MS + 85 * US);
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::LateTimer);
    assert_says(
        &a,
        Says::Starts,
        "cyclictest-250 waited 16.09ms on CPU 1: its timer fired 16ms late, interrupts coming back on in \
         free_unref_page_list ← release_pages ← tlb_batch_pages_flush (stress-ng-vm-186 in munmap(512 MiB)); \
         in the 85µs after its wakeup: stress-ng-264 was in madvise",
    );
}

#[test]
fn a_timer_a_little_late_leaves_the_cause_to_what_ran_after_the_wakeup() {
    let mut w = late_timer(20 * US, None);
    w.latency_ns = 900 * US;
    w.run_ns = w.wakeup_ns + w.latency_ns;
    let a = attribute(&w, &names(), MM_PROBE);
    assert_eq!(a.cause, Cause::Syscall(libc::SYS_madvise));
    assert_says(&a, Says::Contains, ": its timer fired 20µs late; in the 900µs after its wakeup: stress-ng-264");
}

#[test]
fn a_timer_held_off_in_user_space_or_idle_is_not_the_kernels_code() {
    let user = attribute(&late_timer(16 * MS, Some(interrupted(186, true))), &names(), MM_PROBE);
    assert_eq!(user.cause, Cause::OutsideKernelView);
    assert_says(
        &user,
        Says::Contains,
        "its timer fired 16ms late while stress-ng-vm-186 ran in user space, interrupts on;",
    );
    let idle = attribute(&late_timer(16 * MS, Some(interrupted(0, false))), &names(), MM_PROBE);
    assert_eq!(idle.cause, Cause::Idle);
    assert_says(&idle, Says::Contains, "its timer fired 16ms late while the CPU was idle;");
}
