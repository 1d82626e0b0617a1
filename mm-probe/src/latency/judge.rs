//! The verdict against the threshold, in plain words with numbers.
//!
//! OK: no wakeup waited longer than the threshold. WARN: some did, but fewer than one in a
//! thousand (P99.9 still meets it). CRIT: one in a thousand or more. A CRIT is still a
//! successful diagnosis (exit 0). The cause most spikes share is named beside the level.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{aggregator::Distribution, attribution::Cause};
use crate::{
    report::verdict::{self, Advice, Level, MetricVerdict, Unit, named},
    units::format_nanos,
};

named! {
    /// The metric the verdict judges.
    pub enum Metric {
        OverThreshold => "over_threshold",
    }
}

named! {
    /// What a piece of advice blames.
    pub enum Advised {
        OneCallBoundsTheWait => "one call bounds the wait",
        SampledFunction => "sampled function",
    }
}

pub type Verdict = verdict::Verdict<Metric, Advised>;

/// The verdict and the facts it rests on that only latency has.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    /// Spikes per cause (labelled as in the spike lines: a traced function, `syscall <name>`,
    /// `cpu contention`, `idle`…), most first.
    pub spike_causes: Vec<(String, u64)>,
    /// The worst wait against one call of a traced function that takes longer than the
    /// threshold: whether the kernel lets a woken task in only between calls, or within one.
    pub call_bound: Option<CallBound>,
    /// Where the sampled holders' time went in the spikes no traced function explains: each
    /// place (a function and its callers, "a ← b ← c") with its spikes, most first (up to 5).
    pub sampled_places: Vec<(String, u64)>,
}

/// Places listed in the verdict's `sampled_places`.
const SAMPLED_PLACES: usize = 5;
/// Distinct places a run counts one by one; the spikes of further places are counted together
/// under [`OTHER_PLACES`], which is listed but never named as a place or advised.
pub const MAX_PLACES: usize = 256;
pub const OTHER_PLACES: &str = "(other places)";

/// Adds where the holders' time went, from samples, to a judgement whose common cause is not a
/// traced function: the place most spikes' samples name, and the advice to time it exactly.
/// `places` counts, per place, the spikes no traced function explains whose samples name it.
pub fn with_sampled_places(judgement: &mut Judgement, places: &BTreeMap<String, u64>) {
    let mut ranked: Vec<(String, u64)> = places.iter().map(|(p, n)| (p.clone(), *n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(SAMPLED_PLACES);
    judgement.sampled_places = ranked;
    let Some((place, n)) = judgement.sampled_places.iter().find(|(place, _)| place != OTHER_PLACES) else { return };
    let function = place.split(" ← ").next().unwrap_or(place);
    let evidence = format!("the holders' samples fell mostly in {place} in {n} spikes outside the traced functions");
    judgement.verdict.headline += &format!("; {evidence}");
    judgement.verdict.advice.push(Advice {
        cause: Advised::SampledFunction,
        evidence,
        action: format!(
            "time it exactly with `mm-probe latency --func {function}`, and keep the task that runs it off the real-time task's CPU"
        ),
    });
}

/// How a traced function bounds the waits: a function that does not reschedule inside a call
/// delays a woken task up to one call (T); one that does, by a small fraction of T.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CallBound {
    pub function: String,
    /// T: the function's mean call time in this run.
    pub mean_call_ns: u64,
    pub worst_wait_ns: u64,
    /// worst wait ÷ T.
    pub worst_wait_calls: f64,
    pub bound: Bound,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The worst wait is about one call (at least half of T), and the function is the common
    /// cause: the woken task gets the CPU only when a call ends.
    OneCall,
    /// The worst wait stays under a quarter of T although calls outlast the threshold: the
    /// function lets a woken task in within a call.
    WithinACall,
}

/// At least this share of one call for a wait to be "bounded by one call".
const ONE_CALL_SHARE: f64 = 0.5;
/// Under this share of one call, the function reschedules within a call.
const WITHIN_A_CALL_SHARE: f64 = 0.25;

/// The bound a traced function puts on the waits, when one of its calls lasts longer than the
/// threshold (otherwise no wait over the threshold can be about one call).
fn call_bound(
    wakeups: &Distribution,
    threshold_ns: u64,
    common_cause: Option<Cause>,
    functions: &[(String, Distribution)],
    names: &[String],
) -> Option<CallBound> {
    let worst = wakeups.max_ns.filter(|_| wakeups.count > 0)?;
    functions.iter().filter(|(_, d)| d.count > 0).find_map(|(name, d)| {
        let mean = d.sum_ns / d.count;
        if mean <= threshold_ns {
            return None;
        }
        let share = worst as f64 / mean as f64;
        let is_common = common_cause.is_some_and(|c| c.label(names) == *name);
        let bound = if is_common && share >= ONE_CALL_SHARE {
            Bound::OneCall
        } else if !is_common && share < WITHIN_A_CALL_SHARE {
            Bound::WithinACall
        } else {
            return None;
        };
        Some(CallBound {
            function: name.clone(),
            mean_call_ns: mean,
            worst_wait_ns: worst,
            worst_wait_calls: share,
            bound,
        })
    })
}

impl CallBound {
    /// The clause the verdict ends with.
    fn says(&self) -> String {
        let call = super::probes::one_call_is(&self.function).map(|c| format!(" ({c})")).unwrap_or_default();
        let t = format_nanos(self.mean_call_ns);
        match self.bound {
            Bound::OneCall => format!(
                "waits are bounded by one call of {}{call}, T = {t}: the worst wait is {:.2} T, so the kernel lets the woken task in only between calls",
                self.function, self.worst_wait_calls
            ),
            Bound::WithinACall => format!(
                "one call of {}{call} takes T = {t}, yet the worst wait is {:.2} T: the kernel lets a woken task in within a call",
                self.function, self.worst_wait_calls
            ),
        }
    }
}

/// "; /proc/stat counted steal during the run: CPU 1 2.1s": said only when there was some, since
/// a zero may mean the kernel reads no steal clock.
fn steal_evidence(steal_ns: &BTreeMap<u32, u64>) -> String {
    if steal_ns.is_empty() {
        return String::new();
    }
    let cpus: Vec<String> = steal_ns.iter().map(|(cpu, ns)| format!("CPU {cpu} {}", format_nanos(*ns))).collect();
    format!("; /proc/stat counted steal (the hypervisor running something else) during the run: {}", cpus.join(", "))
}

/// Fewer spikes than this fraction of wakeups is a warning, not critical.
const WARN_FRACTION: f64 = 0.001;

const OVER_THRESHOLD: &str =
    "wakeups that waited longer than the threshold ÷ wakeups: any is WARN, one in a thousand or more CRIT";

/// The share of wakeups over the threshold, judged: any is WARN, `WARN_FRACTION` or more CRIT
/// (a band whose CRIT bound is inclusive, so it is judged here rather than by `Band`).
fn over_threshold(wakeups: &Distribution) -> MetricVerdict<Metric> {
    let value = (wakeups.count > 0).then(|| wakeups.over_threshold as f64 / wakeups.count as f64);
    let level = match value {
        None => Level::Unknown,
        Some(0.0) => Level::Ok,
        Some(v) if v < WARN_FRACTION => Level::Warn,
        Some(_) => Level::Crit,
    };
    MetricVerdict {
        metric: Metric::OverThreshold,
        definition: OVER_THRESHOLD.into(),
        unit: Unit::Fraction,
        value,
        level,
        warn: 0.0,
        crit: WARN_FRACTION,
        unknown_because: value.is_none().then(|| "no measured task woke up".into()),
    }
}

/// Judges the run's wakeups against `threshold_ns`. `causes` counts every spike seen (not just
/// the listed top N) by cause; `names[slot]` names each function slot; `functions` gives each
/// attached traced function's distribution; `steal_ns` each CPU's steal during the run (CPUs
/// with none left out), the evidence for time lost outside the kernel's view.
pub fn judge(
    wakeups: &Distribution,
    threshold_ns: u64,
    causes: &BTreeMap<Cause, u64>,
    names: &[String],
    functions: &[(String, Distribution)],
    steal_ns: &BTreeMap<u32, u64>,
) -> Judgement {
    let mut ranked: Vec<(Cause, u64)> = causes.iter().map(|(c, n)| (*c, *n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.label(names).cmp(&b.0.label(names))));
    let threshold = format_nanos(threshold_ns);
    let metric = over_threshold(wakeups);
    let level = metric.level;
    let mut text = if wakeups.count == 0 {
        "no measured task woke up: start the real-time workload, or widen the selection with -p or --all-tasks"
            .to_string()
    } else if wakeups.over_threshold == 0 {
        format!(
            "all {} wakeups ran within {threshold} (worst {})",
            wakeups.count,
            format_nanos(wakeups.max_ns.unwrap_or(0))
        )
    } else {
        let fraction = wakeups.over_threshold as f64 / wakeups.count as f64;
        let mut text = format!(
            "{} of {} wakeups ({:.2}%) waited longer than {threshold} (worst {})",
            wakeups.over_threshold,
            wakeups.count,
            fraction * 100.0,
            format_nanos(wakeups.max_ns.unwrap_or(0))
        );
        if let Some((cause, n)) = ranked.first() {
            let total: u64 = ranked.iter().map(|(_, n)| n).sum();
            text += &format!("; most common cause ({n} of {total} spikes): {}", cause.describe(names));
        }
        if causes.contains_key(&Cause::OutsideKernelView) {
            text += &steal_evidence(steal_ns);
        }
        text
    };
    let call_bound = call_bound(wakeups, threshold_ns, ranked.first().map(|(c, _)| *c), functions, names);
    if let Some(bound) = &call_bound {
        text += &format!("; {}", bound.says());
    }
    for (name, d) in functions.iter().filter(|(_, d)| d.over_threshold > 0) {
        text += &format!(
            "; {name} ran longer than {threshold} {} times (worst {})",
            d.over_threshold,
            format_nanos(d.max_ns.unwrap_or(0))
        );
    }
    let metrics = vec![metric];
    let advice = call_bound.iter().filter(|b| b.bound == Bound::OneCall).map(one_call_advice).collect();
    Judgement {
        verdict: Verdict { level, headline: text, metrics, advice },
        spike_causes: ranked.into_iter().map(|(cause, n)| (cause.label(names), n)).collect(),
        call_bound,
        sampled_places: Vec::new(),
    }
}

/// A wait as long as one call of a function that does not reschedule within a call: the call
/// is the unit to shrink.
fn one_call_advice(bound: &CallBound) -> Advice<Advised> {
    Advice {
        cause: Advised::OneCallBoundsTheWait,
        evidence: bound.says(),
        action: format!(
            "shorten one call of {}: give it less work per call (smaller ranges), or keep the work it does off the real-time task's CPU",
            bound.function
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(count: u64, over: u64, max_ns: u64) -> Distribution {
        Distribution { count, over_threshold: over, max_ns: Some(max_ns), ..Distribution::default() }
    }

    #[test]
    fn levels_follow_the_share_over_threshold() {
        let none = BTreeMap::new();
        assert_eq!(judge(&dist(0, 0, 0), 500_000, &none, &[], &[], &BTreeMap::new()).verdict.level, Level::Unknown);
        let ok = judge(&dist(1000, 0, 120_000), 500_000, &none, &[], &[], &BTreeMap::new());
        assert_eq!(ok.verdict.level, Level::Ok);
        assert_eq!(ok.verdict.headline, "all 1000 wakeups ran within 500µs (worst 120µs)");
        assert_eq!(
            judge(&dist(10_000, 9, 900_000), 500_000, &none, &[], &[], &BTreeMap::new()).verdict.level,
            Level::Warn
        );
        assert_eq!(
            judge(&dist(10_000, 10, 900_000), 500_000, &none, &[], &[], &BTreeMap::new()).verdict.level,
            Level::Crit
        );
    }

    fn places_first() -> String {
        "collapse_huge_page ← hpage_collapse_scan_pmd ← khugepaged".to_string()
    }

    #[test]
    fn the_place_most_samples_name_is_said_and_advised_with_func() {
        let causes = BTreeMap::from([(Cause::KernelThread, 3)]);
        let mut v = judge(&dist(1000, 3, 4_860_000), 500_000, &causes, &[], &[], &BTreeMap::new());
        let places = BTreeMap::from([
            ("collapse_huge_page ← hpage_collapse_scan_pmd ← khugepaged".to_string(), 2),
            ("unmap_page_range ← unmap_vmas ← exit_mmap".to_string(), 1),
        ]);
        with_sampled_places(&mut v, &places);
        assert!(
            v.verdict.headline.ends_with(
                "; the holders' samples fell mostly in collapse_huge_page ← hpage_collapse_scan_pmd ← khugepaged in 2 spikes outside the traced functions"
            ),
            "{}",
            v.verdict.headline
        );
        assert_eq!(v.sampled_places.len(), 2);
        assert!(
            v.verdict.advice[0].action.starts_with("time it exactly with `mm-probe latency --func collapse_huge_page`")
        );
        // Places beyond those counted one by one are listed, never advised.
        let mut crowded = judge(&dist(1000, 3, 4_860_000), 500_000, &causes, &[], &[], &BTreeMap::new());
        with_sampled_places(&mut crowded, &BTreeMap::from([(OTHER_PLACES.to_string(), 9), (places_first(), 2)]));
        assert_eq!(crowded.sampled_places[0].0, OTHER_PLACES);
        assert!(crowded.verdict.advice[0].action.contains("--func collapse_huge_page`"), "{:?}", crowded.verdict);
        let mut quiet = judge(&dist(1000, 0, 100_000), 500_000, &BTreeMap::new(), &[], &[], &BTreeMap::new());
        with_sampled_places(&mut quiet, &BTreeMap::new());
        assert!(quiet.verdict.advice.is_empty() && quiet.sampled_places.is_empty());
    }

    #[test]
    fn the_common_cause_and_slow_functions_are_named() {
        let names = ["madvise_cold_or_pageout_pte_range".to_string()];
        let causes = BTreeMap::from([(Cause::Function(0), 15), (Cause::Syscall(libc::SYS_munmap), 2)]);
        let functions = [(names[0].clone(), dist(50_000, 20, 1_941_000))];
        let v = judge(&dist(12_034, 17, 1_953_000), 500_000, &causes, &names, &functions, &BTreeMap::new());
        assert_eq!(v.verdict.level, Level::Crit);
        assert_eq!(
            v.verdict.headline,
            "17 of 12034 wakeups (0.14%) waited longer than 500µs (worst 1.95ms); most common cause (15 of \
             17 spikes): the blocker was inside madvise_cold_or_pageout_pte_range; \
             madvise_cold_or_pageout_pte_range ran longer than 500µs 20 times (worst 1.94ms)"
        );
        assert_eq!(v.spike_causes, [(names[0].clone(), 15), ("syscall munmap".to_string(), 2)]);
    }

    fn calls(count: u64, mean_ns: u64) -> Distribution {
        Distribution { count, sum_ns: count * mean_ns, max_ns: Some(mean_ns * 2), ..Distribution::default() }
    }

    #[test]
    fn waits_as_long_as_one_call_of_the_common_cause_are_bounded_by_one_call() {
        let names = ["madvise_cold_or_pageout_pte_range".to_string()];
        let causes = BTreeMap::from([(Cause::Function(0), 40), (Cause::Preempted, 2)]);
        let functions = [(names[0].clone(), calls(2_000, 1_640_000))];
        let v = judge(&dist(3_000, 42, 1_680_000), 500_000, &causes, &names, &functions, &BTreeMap::new());
        let bound = v.call_bound.clone().expect("a bound");
        assert_eq!((bound.bound, bound.mean_call_ns, bound.worst_wait_ns), (Bound::OneCall, 1_640_000, 1_680_000));
        assert!(v.verdict.headline.contains("waits are bounded by one call of madvise_cold_or_pageout_pte_range (one 2 MiB step of the walk), T = 1.64ms: the worst wait is 1.02 T"), "{}", v.verdict.headline);
    }

    #[test]
    fn waits_far_shorter_than_one_call_mean_the_function_lets_a_task_in_within_a_call() {
        let names = ["madvise_cold_or_pageout_pte_range".to_string()];
        let functions = [(names[0].clone(), calls(2_000, 1_900_000))];
        let v = judge(&dist(3_000, 0, 230_000), 500_000, &BTreeMap::new(), &names, &functions, &BTreeMap::new());
        assert_eq!(v.call_bound.as_ref().map(|b| b.bound), Some(Bound::WithinACall));
        assert!(
            v.verdict.headline.contains("yet the worst wait is 0.12 T: the kernel lets a woken task in"),
            "{}",
            v.verdict.headline
        );
    }

    #[test]
    fn calls_shorter_than_the_threshold_or_waits_in_between_say_nothing_about_a_bound() {
        let names = ["madvise_cold_or_pageout_pte_range".to_string()];
        let short = [(names[0].clone(), calls(2_000, 300_000))];
        assert_eq!(
            judge(&dist(3_000, 0, 250_000), 500_000, &BTreeMap::new(), &names, &short, &BTreeMap::new()).call_bound,
            None
        );
        // A third of a call, with other causes: neither bounded by a call nor clearly within one.
        let long = [(names[0].clone(), calls(2_000, 1_800_000))];
        let causes = BTreeMap::from([(Cause::CpuContention, 3)]);
        assert_eq!(judge(&dist(3_000, 3, 600_000), 500_000, &causes, &names, &long, &BTreeMap::new()).call_bound, None);
    }

    #[test]
    fn contention_as_the_common_cause_is_said_in_words() {
        let causes = BTreeMap::from([(Cause::CpuContention, 5), (Cause::Preempted, 1)]);
        let v = judge(&dist(1000, 6, 3_000_000), 500_000, &causes, &[], &[], &BTreeMap::new());
        assert!(v.verdict.headline.ends_with("most common cause (5 of 6 spikes): CPU contention: several tasks ran in turn, none for most of the wait"), "{}", v.verdict.headline);
        assert_eq!(v.spike_causes[0], ("cpu contention".to_string(), 5));
    }

    /// The tester's hour on a busy 2-CPU virtual machine: 23 of 35 spikes were a SCHED_FIFO
    /// waiter behind a fair qemu thread in user space. The verdict counts them as time lost
    /// outside the kernel's view, blames no task, and gives /proc/stat's steal as evidence.
    #[test]
    fn time_outside_the_kernels_view_is_the_common_cause_with_steal_as_evidence() {
        let causes = BTreeMap::from([(Cause::OutsideKernelView, 23), (Cause::CpuContention, 8), (Cause::Preempted, 4)]);
        let steal = BTreeMap::from([(1, 2_100_000_000)]);
        let v = judge(&dist(3_600_000, 35, 10_700_000), 500_000, &causes, &[], &[], &steal);
        assert!(
            v.verdict.headline.contains(
                "most common cause (23 of 35 spikes): time lost outside this kernel's view: the CPU ran a fair task in \
                 user space, which a real-time wakeup preempts at once; hypervisor steal or untraced IRQ-off code; \
                 /proc/stat counted steal (the hypervisor running something else) during the run: CPU 1 2.1s"
            ),
            "{}",
            v.verdict.headline
        );
        assert!(!v.verdict.headline.contains("blocker"), "no task is blamed: {}", v.verdict.headline);
        assert_eq!(v.spike_causes[0], ("outside the kernel's view".to_string(), 23));
        let without_steal = judge(&dist(3_600_000, 35, 10_700_000), 500_000, &causes, &[], &[], &BTreeMap::new());
        assert!(
            !without_steal.verdict.headline.contains("/proc/stat"),
            "no steal is claimed unless counted: {}",
            without_steal.verdict.headline
        );
    }

    #[test]
    fn steal_is_not_mentioned_for_causes_the_kernel_saw() {
        let causes = BTreeMap::from([(Cause::CpuContention, 5)]);
        let v = judge(&dist(1000, 5, 3_000_000), 500_000, &causes, &[], &[], &BTreeMap::from([(0, 1_000_000)]));
        assert!(!v.verdict.headline.contains("steal"), "{}", v.verdict.headline);
    }
}
