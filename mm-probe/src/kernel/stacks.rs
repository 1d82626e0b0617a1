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
}
