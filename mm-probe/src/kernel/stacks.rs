//! Kernel stacks taken by a tracing program, whose innermost frames are the machinery that ran
//! the program, not what the thread was doing.
//!
//! A raw or BTF tracepoint's stack starts inside the program itself, then bpf_trace_runN (and,
//! where not inlined, __bpf_trace_<event> and __traceiter_<event>); a classic tracepoint's may
//! start in perf_trace_<event>. The program's own frame has a name only where the kernel lists
//! JIT images in kallsyms and the table was read after the program was loaded: otherwise it is
//! named after whatever symbol lies below it (seen: `mpls_gso_exit`, a module's function).

/// Prefixes of the tracing machinery's functions.
const MACHINERY: [&str; 6] =
    ["bpf_trace_run", "__bpf_trace_", "__traceiter_", "perf_trace_", "trace_call_bpf", "bpf_prog_"];

/// The innermost frames the machinery can take: the program, bpf_trace_runN, __bpf_trace_,
/// __traceiter_, with room for one more.
const MACHINERY_DEPTH: usize = 5;

/// Whether a frame (`name+0x1f [module]` or a bare name) is the tracing machinery's.
fn is_tracing_machinery(frame: &str) -> bool {
    let name = frame.split('+').next().unwrap_or(frame);
    MACHINERY.iter().any(|prefix| name.starts_with(prefix))
}

/// How many innermost frames belong to the machinery: every frame up to the last machinery
/// frame among the first few, so that the program's own frame goes whatever it was named.
pub fn machinery_frames<S: AsRef<str>>(frames: &[S]) -> usize {
    let innermost = &frames[..frames.len().min(MACHINERY_DEPTH)];
    innermost.iter().rposition(|f| is_tracing_machinery(f.as_ref())).map_or(0, |last| last + 1)
}

/// "shrink_folio_list+0x1a2/0x3f0" → "shrink_folio_list".
pub fn function_of(frame: &str) -> &str {
    frame.split('+').next().unwrap_or(frame)
}

/// An interrupt cannot land in code that runs with interrupts off: it lands where they come
/// back on, so a section under a spinlock taken with irqsave shows as its unlock (on 6.1 every
/// sample of a MADV_COLD walk's wait fell in _raw_spin_unlock_irqrestore, called from
/// folio_batch_move_lru). The time is the caller's: these frames are never named as the place.
pub fn where_interrupts_return(function: &str) -> bool {
    let unlock = ["_raw_spin_unlock_irq", "_raw_read_unlock_irq", "_raw_write_unlock_irq"];
    unlock.iter().any(|prefix| function.starts_with(prefix))
}

/// The frames of the code an interrupt interrupted, innermost first: those outside the
/// interrupt's entry (`asm_sysvec_*`, `asm_common_interrupt`) in a stack taken inside its
/// handler. `None` when the stack has no interrupt entry; empty when the interrupt came from
/// user space (nothing of the kernel's below the entry).
pub fn interrupted_frames<S: AsRef<str>>(frames: &[S]) -> Option<&[S]> {
    let entry = frames.iter().position(|f| {
        let name = function_of(f.as_ref());
        name.starts_with("asm_sysvec_") || name == "asm_common_interrupt"
    })?;
    Some(&frames[entry + 1..])
}

/// Where interrupts came back on in `interrupted` (innermost first): its first function that
/// is not an irq-restoring unlock, with its two callers ("free_unref_page_list ← release_pages
/// ← tlb_batch_pages_flush").
pub fn landing_place<S: AsRef<str>>(interrupted: &[S]) -> Option<String> {
    let first = interrupted.iter().position(|f| !where_interrupts_return(function_of(f.as_ref())))?;
    let path: Vec<&str> = interrupted[first..].iter().take(3).map(|f| function_of(f.as_ref())).collect();
    Some(path.join(" ← "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_machinery_frames_are_not_the_tasks() {
        assert!(is_tracing_machinery("bpf_trace_run4+0x6d"));
        assert!(is_tracing_machinery("perf_trace_sched_switch+0x120"));
        assert!(is_tracing_machinery("bpf_prog_6deef7357e7b4530_lat_sched_switch_btf+0x5a1"));
        assert!(!is_tracing_machinery("__schedule+0x5bc"));
        assert!(!is_tracing_machinery("madvise_cold_or_pageout_pte_range+0x4a4"));
    }

    /// A raw tracepoint's stack in a 6.1-rt guest, its program's frame misnamed.
    #[test]
    fn the_programs_own_frame_goes_with_the_machinery_whatever_its_name() {
        let stack = ["mpls_gso_exit", "bpf_trace_run2", "rtlock_slowlock_locked", "rt_write_lock", "mirror_invalidate"];
        assert_eq!(machinery_frames(&stack), 2);
        let named = ["bpf_prog_0123_inv_contention_b+0x1a", "bpf_trace_run2+0x5a", "queued_write_lock_slowpath+0x70"];
        assert_eq!(machinery_frames(&named), 2);
        assert_eq!(machinery_frames(&["__schedule+0x5bc", "schedule+0x2e"]), 0);
        assert_eq!(machinery_frames::<&str>(&[]), 0);
    }

    /// Deeper than the machinery reaches, a name is the thread's own work.
    #[test]
    fn only_the_innermost_frames_can_be_machinery() {
        let stack = ["a", "b", "c", "d", "e", "perf_trace_buf_alloc", "f"];
        assert_eq!(machinery_frames(&stack), 0);
    }

    /// A late timer's stack on Debian 6.1, as the expiry program took it (machinery dropped).
    const LATE_TIMER_STACK: [&str; 13] = [
        "__run_hrtimer+0x5f/0x1f0",
        "__hrtimer_run_queues+0x10b/0x190",
        "hrtimer_interrupt+0x10f/0x240",
        "__sysvec_apic_timer_interrupt+0x56/0x100",
        "sysvec_apic_timer_interrupt+0x8b/0xb0",
        "asm_sysvec_apic_timer_interrupt+0x16/0x20",
        "_raw_spin_unlock_irqrestore+0x19/0x40",
        "free_unref_page_list+0x1a6/0x3b0",
        "release_pages+0x16c/0x5a0",
        "tlb_batch_pages_flush+0x3d/0x70",
        "unmap_page_range+0x8a9/0xe30",
        "do_syscall_64+0x58/0xc0",
        "entry_SYSCALL_64_after_hwframe+0x64/0xce",
    ];

    #[test]
    fn a_late_timer_names_where_interrupts_came_back_on() {
        let interrupted = interrupted_frames(&LATE_TIMER_STACK).unwrap();
        assert_eq!(interrupted.len(), 7);
        assert_eq!(
            landing_place(interrupted).as_deref(),
            Some("free_unref_page_list ← release_pages ← tlb_batch_pages_flush")
        );
        let from_user = &LATE_TIMER_STACK[..6];
        assert_eq!(interrupted_frames(from_user).map(<[&str]>::len), Some(0));
        assert_eq!(landing_place(interrupted_frames(from_user).unwrap()), None);
        assert_eq!(interrupted_frames(&LATE_TIMER_STACK[..3]), None);
    }
}
