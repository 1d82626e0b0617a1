//! Where a wait went, as a budget that adds up to the whole wait: each task's time on the CPU
//! (the idle task's too), and the rest as unaccounted. The kernel keeps only a CPU's last
//! [`MAX_SLICES`] stays; when more switches than that happened during a wait, its start is in
//! none of them. That part is stated as unaccounted, never spread over the tasks that were kept:
//! three tasks taking turns over the last 3.7 ms of a 1.76 s wait say nothing about the other
//! 1.756 s.

use mm_probe_common::latency::MAX_SLICES;

use super::facts::Holder;
use crate::units::format_nanos;

/// The time of a wait that no kept stay covers: the wait less every task's time on the CPU
/// within it (the stays of one CPU do not overlap, so the sum never exceeds the wait).
pub fn unaccounted_ns(holders: &[Holder], wait_ns: u64) -> u64 {
    wait_ns.saturating_sub(holders.iter().map(|h| h.on_cpu_ns).sum())
}

/// "python3-301 1.2ms (0.1%), idle 1ms (0.1%), unaccounted 1.76s (99.8%)": each part of the wait
/// with its share.
/// `truncated`: the kernel's ring had already dropped the stays at the start of the wait.
pub fn text(holders: &[Holder], wait_ns: u64, truncated: bool) -> String {
    let share = |ns: u64| format!("{} ({:.1}%)", format_nanos(ns), ns as f64 * 100.0 / wait_ns.max(1) as f64);
    let mut parts: Vec<String> = holders
        .iter()
        .map(|h| {
            let who = if h.pid == 0 { "idle".to_string() } else { h.task().to_string() };
            format!("{who} {}", share(h.on_cpu_ns))
        })
        .collect();
    let unaccounted = unaccounted_ns(holders, wait_ns);
    if unaccounted > 0 {
        parts.push(format!("unaccounted {}{}", share(unaccounted), why_unaccounted(truncated)));
    }
    parts.join(", ")
}

/// The clause an explanation ends with when part of the wait is unaccounted ("; unaccounted:
/// 1.76s of the 1.76s wait, before the last 8 stays the kernel kept"); empty otherwise.
pub fn unaccounted_clause(holders: &[Holder], wait_ns: u64, truncated: bool) -> String {
    match unaccounted_ns(holders, wait_ns) {
        0 => String::new(),
        ns => format!(
            "; unaccounted: {} of the {} wait{}",
            format_nanos(ns),
            format_nanos(wait_ns),
            why_unaccounted(truncated)
        ),
    }
}

fn why_unaccounted(truncated: bool) -> String {
    if truncated { format!(", before the last {MAX_SLICES} stays the kernel kept") } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::fixtures::{MS, US, holder};

    /// The tester's case: a 1.76 s wait of which the kept stays cover 3.7 ms.
    fn three_kept_of_a_long_wait() -> Vec<Holder> {
        vec![holder(301, "python3", 1500 * US), holder(264, "qemu", 1200 * US), holder(0, "swapper/1", 1000 * US)]
    }

    #[test]
    fn the_budget_adds_up_to_the_whole_wait() {
        let holders = three_kept_of_a_long_wait();
        let wait_ns = 1760 * MS;
        let unaccounted = unaccounted_ns(&holders, wait_ns);
        assert_eq!(unaccounted, 1760 * MS - 3700 * US);
        assert_eq!(holders.iter().map(|h| h.on_cpu_ns).sum::<u64>() + unaccounted, wait_ns);
        assert_eq!(
            text(&holders, wait_ns, true),
            "python3-301 1.5ms (0.1%), qemu-264 1.2ms (0.1%), idle 1ms (0.1%), \
             unaccounted 1.76s (99.8%), before the last 8 stays the kernel kept"
        );
        assert_eq!(
            unaccounted_clause(&holders, wait_ns, true),
            "; unaccounted: 1.76s of the 1.76s wait, before the last 8 stays the kernel kept"
        );
    }

    #[test]
    fn a_wait_the_kept_stays_cover_has_nothing_unaccounted() {
        let holders = vec![holder(264, "stress-ng", 1980 * US), holder(77, "sleeper", 20 * US)];
        assert_eq!(unaccounted_ns(&holders, 2 * MS), 0);
        assert_eq!(text(&holders, 2 * MS, false), "stress-ng-264 1.98ms (99.0%), sleeper-77 20µs (1.0%)");
        assert_eq!(unaccounted_clause(&holders, 2 * MS, false), "");
    }
}
