use super::*;

#[test]
fn comm_stops_at_the_first_nul() {
    let mut raw = [0u8; 16];
    raw[..10].copy_from_slice(b"cyclictest");
    assert_eq!(comm(&raw), "cyclictest");
    assert_eq!(comm(b"exactly16bytes!!"), "exactly16bytes!!");
}

#[test]
fn madvise_is_named_with_advice_and_length() {
    let raw = SyscallState {
        orig_ax: libc::SYS_madvise,
        ax: -i64::from(libc::ENOSYS),
        regs_read: 1,
        args: [0x7f00_0000_0000, 2 << 30, 21, 0],
    };
    let call = decode_syscall(&raw).unwrap();
    assert_eq!(call.summary, "madvise(MADV_PAGEOUT, 2 GiB)");
    assert_eq!(call.advice.as_deref(), Some("MADV_PAGEOUT"));
    assert_eq!(call.length_bytes, Some(2 << 30));
    let cold = SyscallState { args: [0, 4096, 20, 0], ..raw };
    assert_eq!(decode_syscall(&cold).unwrap().summary, "madvise(MADV_COLD, 4 KiB)");
    assert_eq!(
        decode_syscall(&SyscallState { orig_ax: 99999, ..raw }).unwrap().summary,
        "unknown syscall number 99999"
    );
}

#[test]
fn only_a_syscall_still_running_counts() {
    let running =
        SyscallState { orig_ax: libc::SYS_write, ax: -i64::from(libc::ENOSYS), regs_read: 1, args: [1, 0, 8, 0] };
    assert_eq!(decode_syscall(&running).unwrap().summary, "write()");
    // Returned (ax holds the result), on its way back to user space.
    assert!(decode_syscall(&SyscallState { ax: 8, ..running }).is_none());
    // An exception or interrupt from user space: orig_ax holds -1 or an error code.
    assert!(decode_syscall(&SyscallState { orig_ax: -1, ax: 0x7f00, ..running }).is_none());
    // A kernel thread: its saved registers are zero.
    assert!(decode_syscall(&SyscallState { regs_read: 1, ..SyscallState::default() }).is_none());
}

fn stack(frames: &[&str]) -> Stack {
    Stack { frames: frames.iter().map(|f| f.to_string()).collect(), error: None }
}

/// A stress-ng vm stressor preempted at the end of a 34 ms madvise without a reschedule
/// point on 6.1 showed exit_to_user_mode_prepare → schedule: the return path of a task that
/// entered through the syscall entry (the frames between, and the offsets, as x86-64 has them).
#[test]
fn a_syscall_preempted_on_its_way_out_is_named_with_what_it_returned() {
    let way_out = stack(&[
        "__schedule+0x2f2",
        "schedule+0x5a",
        "exit_to_user_mode_prepare+0xb9",
        "syscall_exit_to_user_mode+0x17",
        "do_syscall_64+0x67",
        "entry_SYSCALL_64_after_hwframe+0x64",
    ]);
    let returned =
        SyscallState { orig_ax: libc::SYS_madvise, ax: 0, regs_read: 1, args: [0x7f00_0000, 512 << 20, 21, 0] };
    let call = registers_syscall(&returned, &way_out).unwrap().unwrap();
    assert_eq!((call.summary.as_str(), call.returned), ("madvise(MADV_PAGEOUT, 512 MiB)", Some(0)));
    assert_eq!(serde_json::to_value(&call).unwrap()["returned"], 0);
    let in_it = SyscallState { ax: -i64::from(libc::ENOSYS), ..returned };
    assert_eq!(registers_syscall(&in_it, &way_out).unwrap().unwrap().returned, None, "still inside it");
    // A page fault from user space keeps its error code in orig_ax (6: a write to a page
    // not present); it is no syscall 6 (lstat), whatever the user's ax held.
    let fault = stack(&["__schedule+0x2f2", "irqentry_exit_to_user_mode+0x9", "asm_exc_page_fault+0x26"]);
    assert_eq!(registers_syscall(&SyscallState { orig_ax: 6, ..returned }, &fault), Some(None));
    // sigreturn leaves -1 there so that nothing restarts: no syscall.
    assert_eq!(registers_syscall(&SyscallState { orig_ax: -1, ..returned }, &way_out), Some(None));
    assert_eq!(registers_syscall(&SyscallState { regs_read: 0, ..returned }, &way_out), None, "not read");
}

#[test]
fn the_outermost_frame_says_how_the_kernel_was_entered() {
    let fault = stack(&[
        "__schedule+0x50e",
        "preempt_schedule_irq+0x3f",
        "asm_sysvec_apic_timer_interrupt+0x16",
        "clear_page_rep+0x7",
        "do_user_addr_fault+0x191",
        "exc_page_fault+0x73",
        "asm_exc_page_fault+0x22",
    ]);
    assert_eq!(fault.entry(), Some(KernelEntry::PageFault));
    let syscall = stack(&["__schedule+0x618", "do_syscall_64+0x71", "entry_SYSCALL_64_after_hwframe+0x76"]);
    assert_eq!(syscall.entry(), Some(KernelEntry::Syscall));
    let user = stack(&[
        "__schedule+0x5bc",
        "schedule+0x27",
        "irqentry_exit_to_user_mode+0xfc",
        "asm_sysvec_apic_timer_interrupt+0x1a",
    ]);
    assert_eq!(user.entry(), Some(KernelEntry::Interrupt));
    let kthread = stack(&["__schedule+0x50e", "smpboot_thread_fn+0x1dc", "kthread+0x101", "ret_from_fork+0x1f"]);
    assert_eq!(kthread.entry(), Some(KernelEntry::KernelThread));
    let idle =
        stack(&["__schedule+0x50e", "do_idle+0x17c", "start_kernel+0x700", "secondary_startup_64_no_verify+0xe5"]);
    assert_eq!(idle.entry(), Some(KernelEntry::Idle));
    assert_eq!(stack(&[]).entry(), None);
    assert_eq!(stack(&["0xffffffffc0001234"]).entry(), None);
}

fn raw_slice(pid: u32, start_ns: u64, end_ns: u64) -> mm_probe_common::latency::RunSlice {
    mm_probe_common::latency::RunSlice { pid, start_ns, end_ns, prev_state: 0x100, ..Default::default() }
}

#[test]
fn only_slices_ending_after_the_wakeup_are_kept_oldest_first() {
    let mut ring = CpuSlices::default();
    // Ten slices of 1 ms from 0 to 10 ms: the ring holds the last eight, [2, 10] ms.
    for n in 0..10u64 {
        ring.slices[n as usize % MAX_SLICES] = raw_slice(100 + n as u32, n * 1000, (n + 1) * 1000);
        ring.written = n + 1;
    }
    let kept = overlapping_slices(&ring, 7500, true);
    assert_eq!(kept.iter().map(|s| s.task.pid).collect::<Vec<_>>(), [107, 108, 109]);
    assert!(!slices_truncated(&ring, 7500));
    assert_eq!(overlapping_slices(&ring, 500, true).len(), MAX_SLICES);
    assert!(slices_truncated(&ring, 500), "stays from 0.5 to 2 ms were overwritten");
    assert!(overlapping_slices(&CpuSlices::default(), 0, true).is_empty());
}

#[test]
fn run_time_is_kept_only_where_the_kernel_charges_less_than_wall_time() {
    let mut ring = CpuSlices::default();
    ring.slices[0] = mm_probe_common::latency::RunSlice { exec_ns: 60_000, ..raw_slice(7, 1000, 1_700_000) };
    ring.written = 1;
    assert_eq!(overlapping_slices(&ring, 500, true)[0].exec_ns, Some(60_000));
    // Seen in an emulated guest with neither steal nor IRQ time accounting: a 1.7 ms stay
    // read as 60 µs of run time. Such a kernel charges time on the CPU in full, so the
    // difference is not steal and is not shown.
    assert_eq!(overlapping_slices(&ring, 500, false)[0].exec_ns, None);
    ring.slices[0].exec_ns = EXEC_UNKNOWN;
    assert_eq!(overlapping_slices(&ring, 500, true)[0].exec_ns, None);
}

#[test]
fn switch_states_read_like_ps() {
    assert_eq!(prev_state_name(0x100), "preempted (R+)");
    assert_eq!(prev_state_name(1), "sleeping (S)");
    assert_eq!(prev_state_name(0), "runnable (R)");
}
