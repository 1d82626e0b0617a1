//! Where a holder's time went, from the samples the kernel took while the woken task waited
//! (decoded by `decoder`): the kernel function most of the holder's samples fell in, with the two
//! callers above it, and the sampler's period.
//!
//! A sample is one tick of a per-CPU perf event (cpu-clock) whose program records only while a
//! watched task waits on that CPU: the task running and the kernel stack of the interrupted
//! code. A tick that interrupted user space has no kernel stack (bpf_get_stackid gives -EFAULT
//! for user registers): those count as user time, not as failures.

use serde::Serialize;

use super::decoder::{TakenSample, TaskRef, WaitSamples};
use crate::kernel::stacks::{function_of, where_interrupts_return};

/// What the samples say about one task's time in the wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sampled {
    /// Every sample the CPU took during the wait (`None`: unknown, the task changed CPUs).
    pub taken: Option<u64>,
    /// Those kept for the spike (the ring holds the last 128).
    pub kept: u64,
    pub task: TaskRef,
    /// The kept samples that found `task` running.
    pub of_task: u64,
    /// Of those, the ticks in user space, and those whose stack was not stored.
    pub in_user_space: u64,
    pub unreadable: u64,
    /// The innermost function in most of the task's kernel samples; `None` when no function is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hottest: Option<HotFunction>,
    /// Each traced function on the stack of some of the task's samples, with how many: the
    /// sampled share beside the function's exact time.
    pub in_traced: Vec<TracedShare>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TracedShare {
    pub function: String,
    pub samples: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HotFunction {
    pub function: String,
    /// The task's kernel samples with this function on the stack.
    pub samples: u64,
    /// Of how many (the task's samples with a kernel stack).
    pub of: u64,
    /// Its callers, nearest first (up to two), as most of those samples had them.
    pub callers: Vec<String>,
}

impl Sampled {
    /// "shrink_folio_list ← reclaim_pages ← madvise_pageout": the place, without the counts.
    pub fn place(&self) -> Option<String> {
        let hot = self.hottest.as_ref()?;
        let path: Vec<&str> =
            std::iter::once(hot.function.as_str()).chain(hot.callers.iter().map(String::as_str)).collect();
        Some(path.join(" ← "))
    }

    /// "31 of 34 samples in shrink_folio_list ← reclaim_pages ← madvise_pageout".
    pub fn phrase(&self) -> Option<String> {
        let hot = self.hottest.as_ref()?;
        Some(format!("{} of {} samples in {}", hot.samples, hot.of, self.place()?))
    }
}

/// What `samples` say about `task`; `traced` names the traced functions.
pub fn sampled(samples: &WaitSamples, task: &TaskRef, traced: &[String]) -> Sampled {
    let own: Vec<&TakenSample> = samples.kept.iter().filter(|s| s.pid == task.pid).collect();
    let in_user_space = own.iter().filter(|s| s.stack.is_none()).count() as u64;
    let stacks: Vec<Vec<&str>> = own
        .iter()
        .filter_map(|s| s.stack.as_ref())
        .filter(|s| !s.frames.is_empty())
        .map(|s| s.frames.iter().map(|f| function_of(f)).collect())
        .collect();
    let unreadable = own.len() as u64 - in_user_space - stacks.len() as u64;
    let in_traced = traced
        .iter()
        .map(|f| TracedShare {
            function: f.clone(),
            samples: stacks.iter().filter(|s| s.contains(&f.as_str())).count() as u64,
        })
        .filter(|share| share.samples > 0)
        .collect();
    Sampled {
        taken: samples.taken,
        kept: samples.kept.len() as u64,
        task: task.clone(),
        of_task: own.len() as u64,
        in_user_space,
        unreadable,
        hottest: hottest(&stacks),
        in_traced,
    }
}

/// The innermost function on more than half of `stacks` (innermost frame first): where the
/// time went, as deep as the samples agree. Leaves differ from tick to tick (a spin, a page
/// copy, a TLB flush), the functions that loop over them do not.
fn hottest(stacks: &[Vec<&str>]) -> Option<HotFunction> {
    let on_stack = |function: &str| stacks.iter().filter(|s| s.contains(&function)).count() as u64;
    let majority = |function: &str| on_stack(function) * 2 > stacks.len() as u64;
    // Each stack's innermost majority function; the one most stacks name.
    let mut candidates: Vec<(&str, u64)> = Vec::new();
    for stack in stacks {
        let Some(&found) = stack.iter().find(|f| !where_interrupts_return(f) && majority(f)) else { continue };
        match candidates.iter_mut().find(|(f, _)| *f == found) {
            Some((_, n)) => *n += 1,
            None => candidates.push((found, 1)),
        }
    }
    let (function, _) = candidates.into_iter().max_by_key(|&(_, n)| n)?;
    Some(HotFunction {
        function: function.to_string(),
        samples: on_stack(function),
        of: stacks.len() as u64,
        callers: callers(stacks, function),
    })
}

/// The two frames above `function` that most stacks through it have.
fn callers(stacks: &[Vec<&str>], function: &str) -> Vec<String> {
    let mut paths: Vec<(Vec<&str>, u64)> = Vec::new();
    for stack in stacks {
        let Some(at) = stack.iter().position(|f| *f == function) else { continue };
        let above: Vec<&str> = stack.iter().skip(at + 1).take(2).copied().collect();
        match paths.iter_mut().find(|(p, _)| *p == above) {
            Some((_, n)) => *n += 1,
            None => paths.push((above, 1)),
        }
    }
    let (path, _) = paths.into_iter().max_by_key(|(_, n)| *n).unwrap_or_default();
    path.into_iter().map(str::to_string).collect()
}

/// The sampling period for a threshold: a quarter of it, so a wait just over the threshold has
/// about four samples, but no shorter than 100 µs (10,000 ticks a second on every CPU) and no
/// longer than 10 ms.
pub fn period_ns(threshold_ns: u64) -> u64 {
    (threshold_ns / 4).clamp(100_000, 10_000_000)
}

#[cfg(test)]
mod tests {
    use mm_probe_common::latency::{CpuSamples, MAX_SAMPLES, Sample};

    use super::*;
    use crate::latency::decoder::{IN_USER_SPACE, Stack, wait_samples};

    fn stack(frames: &[&str]) -> Stack {
        Stack { frames: frames.iter().map(|f| f.to_string()).collect(), error: None }
    }

    fn task(pid: u32) -> TaskRef {
        TaskRef { pid, comm: "stress-ng-vm".into() }
    }

    const PAGEOUT: [&str; 6] = [
        "shrink_folio_list+0x10",
        "reclaim_pages+0x20",
        "madvise_cold_or_pageout_pte_range+0x30",
        "walk_pgd_range+0x40",
        "do_madvise+0x50",
        "entry_SYSCALL_64_after_hwframe+0x60",
    ];

    #[test]
    fn the_innermost_function_most_samples_share_is_named_with_its_callers() {
        let leaf = |name: &str| stack(&[&[name][..], &PAGEOUT[..]].concat());
        let mut kept: Vec<TakenSample> = ["clear_page", "folio_referenced", "try_to_unmap", "clear_page"]
            .iter()
            .map(|l| TakenSample { pid: 7, stack: Some(leaf(l)) })
            .collect();
        // One tick of the same task elsewhere, one in user space, one of another task.
        kept.push(TakenSample { pid: 7, stack: Some(stack(&["do_exit", "entry_SYSCALL_64_after_hwframe"])) });
        kept.push(TakenSample { pid: 7, stack: None });
        kept.push(TakenSample { pid: 9, stack: Some(leaf("memcpy")) });
        let traced = ["madvise_cold_or_pageout_pte_range".to_string(), "zap_pte_range".to_string()];
        let s = sampled(&WaitSamples { taken: Some(9), kept }, &task(7), &traced);
        assert_eq!((s.taken, s.kept, s.of_task, s.in_user_space, s.unreadable), (Some(9), 7, 6, 1, 0));
        assert_eq!(s.in_traced, [TracedShare { function: traced[0].clone(), samples: 4 }]);
        let hot = s.hottest.clone().unwrap();
        assert_eq!((hot.function.as_str(), hot.samples, hot.of), ("shrink_folio_list", 4, 5));
        assert_eq!(hot.callers, ["reclaim_pages", "madvise_cold_or_pageout_pte_range"]);
        assert_eq!(
            s.phrase().unwrap(),
            "4 of 5 samples in shrink_folio_list ← reclaim_pages ← madvise_cold_or_pageout_pte_range"
        );
    }

    #[test]
    fn a_section_under_an_irqsave_lock_is_named_by_its_caller_not_the_unlock() {
        let under_lock = stack(&[
            "_raw_spin_unlock_irqrestore+0x1",
            "folio_batch_move_lru+0x2",
            "deactivate_page+0x3",
            "madvise_cold_or_pageout_pte_range+0x4",
        ]);
        let kept = vec![TakenSample { pid: 7, stack: Some(under_lock) }; 3];
        let s = sampled(&WaitSamples { taken: Some(3), kept }, &task(7), &[]);
        assert_eq!(
            s.phrase().unwrap(),
            "3 of 3 samples in folio_batch_move_lru ← deactivate_page ← madvise_cold_or_pageout_pte_range"
        );
    }

    #[test]
    fn without_a_task_sample_nothing_is_named() {
        let kept = vec![TakenSample { pid: 9, stack: Some(stack(&PAGEOUT)) }];
        let s = sampled(&WaitSamples { taken: None, kept }, &task(7), &[]);
        assert_eq!(s.phrase(), None);
        assert_eq!((s.of_task, s.hottest), (0, None));
    }

    #[test]
    fn a_stack_not_stored_is_unreadable_and_a_user_tick_is_not() {
        let mut raw = CpuSamples::default();
        for (n, (ns, stack_id)) in [(5, 1), (15, -libc::EEXIST), (20, IN_USER_SPACE), (40, 1)].into_iter().enumerate() {
            raw.samples[n] = Sample { ns, pid: 7, stack_id };
        }
        raw.written = 4;
        let samples = wait_samples(&raw, (10, 30), Some(1), |id| {
            if id < 0 { Stack { frames: Vec::new(), error: Some("EEXIST".into()) } } else { stack(&PAGEOUT) }
        });
        // The samples before the wakeup and after the switch are not the wait's.
        assert_eq!(samples.kept.len(), 2);
        assert_eq!(samples.taken, Some(3));
        let s = sampled(&samples, &task(7), &[]);
        assert_eq!((s.of_task, s.in_user_space, s.unreadable, s.hottest), (2, 1, 1, None));
    }

    #[test]
    fn the_ring_keeps_its_last_samples_in_order() {
        let mut raw = CpuSamples::default();
        let written = MAX_SAMPLES as u64 + 3;
        for n in 0..written {
            raw.samples[n as usize % MAX_SAMPLES] = Sample { ns: 100 + n, pid: n as u32, stack_id: IN_USER_SPACE };
        }
        raw.written = written;
        let samples = wait_samples(&raw, (0, u64::MAX), None, |_| unreachable!());
        assert_eq!(samples.kept.len(), MAX_SAMPLES);
        assert_eq!(samples.kept.first().unwrap().pid, 3);
        assert_eq!(samples.kept.last().unwrap().pid, written as u32 - 1);
    }

    #[test]
    fn the_period_is_a_quarter_threshold_within_bounds() {
        assert_eq!(period_ns(500_000), 125_000);
        assert_eq!(period_ns(100_000), 100_000);
        assert_eq!(period_ns(1_000_000_000), 10_000_000);
    }
}
