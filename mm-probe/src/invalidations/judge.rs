//! Judging invalidations against the thresholds (docs/thresholds.md, "invalidations"; every band
//! can be overridden on the command line) and tying advice to the evidence.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    cause::{CauseName, Knob},
    report::verdict::{self, Band, Level, Unit, named},
    units::{format_bytes, format_nanos},
};

/// The mm invalidated most: whose memory, how much, in what sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Busiest {
    /// The process whose memory it is; null when no invalidation of it could be named.
    pub owner_tgid: Option<u32>,
    pub comm: String,
    pub count: u64,
    /// Mean size of its sized invalidations; null when all were whole address spaces.
    pub mean_bytes: Option<f64>,
}

/// Why the busiest mm was invalidated, mostly: the commonest cause of its invalidations, its
/// share of them, and the settings that stop it.
#[derive(Clone, Debug, PartialEq)]
pub struct DominantCause {
    pub cause: CauseName,
    pub share: f64,
    pub knobs: Vec<Knob>,
    pub remedy: Option<&'static str>,
}

/// The callback's own time (lock waits left out; each size class's median) ≈ fixed_ns +
/// per_page_ns × pages, and what that does to small invalidations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fit {
    pub fixed_ns: f64,
    pub per_page_ns: f64,
    /// What a page costs in the smallest invalidations seen against what it costs in the
    /// largest (measured, not extrapolated): 1 when the cost is all per page, up to
    /// largest ÷ smallest when it is all fixed.
    pub amplification: f64,
    pub smallest_bytes: u64,
    pub largest_bytes: u64,
    pub size_classes: usize,
    /// The smallest invalidations' share of the callback's time: amplification matters only
    /// where they cost something in total.
    pub smallest_time_share: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    /// Invalidations per second of one process's memory.
    pub invalidate_freq: Band,
    /// Lock wait inside invalidations per invalidation, ns.
    pub wait_per_invalidation_ns: Band,
    /// Mean callback time of the slowest subscriber, ns.
    pub callback_mean_ns: Band,
    /// A 4 KiB invalidation's cost against its per-page share.
    pub amplification: Band,
}

/// The measured values the verdict judges; `None` = not observable or nothing to judge.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// The busiest mm's invalidations per second in its busiest second: a storm of a few
    /// seconds inside a long run is what matters, and the run's mean would hide it.
    pub invalidate_freq: Option<f64>,
    /// The same over the whole run, for the evidence.
    pub invalidate_freq_mean: Option<f64>,
    /// The mm invalidated most: whose memory, and its sizes.
    pub busiest: Option<Busiest>,
    /// Why it was invalidated, mostly.
    pub busiest_cause: Option<DominantCause>,
    pub wait_per_invalidation_ns: Option<f64>,
    /// (subscriber, mean ns) of the slowest.
    pub slowest_callback: Option<(String, f64)>,
    /// The most amplified subscriber.
    pub amplification: Option<Amplified>,
    pub mean_invalidation_bytes: Option<f64>,
    /// The lock waited on most inside invalidations, and its wait.
    pub notifier_lock: Option<(String, u64)>,
    /// vCPU faults waited on the same lock the notifier waited on.
    pub vcpu_faults_wait: bool,
    /// Why a metric cannot be judged (not observable, or computed from lost data), by name.
    pub unknown_because: BTreeMap<Metric, String>,
}

/// A subscriber and its callback's time-against-size fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Amplified {
    pub subscriber: String,
    pub fit: Fit,
}

named! {
    /// The metrics the verdict judges, by the names of docs/thresholds.md.
    pub enum Metric {
        InvalidateFreq => "invalidate_freq",
        WaitPerInvalidation => "wait_per_invalidation",
        CallbackMean => "callback_mean",
        Amplification => "amplification",
    }
}

impl Metric {
    /// What it measures, and in what.
    fn defined(self) -> (&'static str, Unit) {
        match self {
            Metric::InvalidateFreq => {
                ("invalidations of the busiest mm in its busiest second (about one drain period)", Unit::PerSecond)
            }
            Metric::WaitPerInvalidation => ("lock wait inside invalidations' callbacks ÷ invalidations", Unit::Ns),
            Metric::CallbackMean => ("mean time of the slowest subscriber's callback", Unit::Ns),
            Metric::Amplification => (
                "what a page costs in the smallest invalidations ÷ what it costs in the largest, judged where the smallest take a quarter of the callback's time",
                Unit::Ratio,
            ),
        }
    }
}

named! {
    /// What a piece of advice blames.
    pub enum Cause {
        FrequentInvalidations => "frequent invalidations",
        FineGrainedInvalidations => "fine-grained invalidations",
        NotifierAgainstVcpuFaults => "notifier against vCPU faults",
        LockWaitsInTheNotifier => "lock waits in the notifier",
        DeviceFlushAmplification => "device-flush amplification",
        SlowInvalidateCallbacks => "slow invalidate callbacks",
    }
}

pub type Verdict = verdict::Verdict<Metric, Cause>;
type Advice = verdict::Advice<Cause>;
type MetricVerdict = verdict::MetricVerdict<Metric>;

/// Invalidations smaller than this on average are worth batching (a PMD's worth).
const BATCH_BYTES: f64 = (2 << 20) as f64;

/// The smallest invalidations' share of a callback's time from which their amplification is
/// judged: below it they are amplified, perhaps, but cost little in total (a batching VMM's
/// threads unmap a few 4 KiB pieces of their own at start and exit).
pub const AMPLIFIED_TIME_SHARE: f64 = 0.25;

pub fn judge(e: &Evidence, t: &Thresholds) -> Verdict {
    let metric = |metric: Metric, value: Option<f64>, band: Band| {
        let (definition, unit) = metric.defined();
        MetricVerdict::judged(metric, definition, unit, value, band, e.unknown_because.get(&metric).cloned())
    };
    let amplified = e.amplification.as_ref();
    let mut amplification = metric(Metric::Amplification, amplified.map(|a| a.fit.amplification), t.amplification);
    let matters = amplified.is_some_and(|a| a.fit.smallest_time_share >= AMPLIFIED_TIME_SHARE);
    if amplification.value.is_some() && !matters {
        amplification.level = Level::Ok;
    }
    let metrics = vec![
        metric(Metric::InvalidateFreq, e.invalidate_freq, t.invalidate_freq),
        metric(Metric::WaitPerInvalidation, e.wait_per_invalidation_ns, t.wait_per_invalidation_ns),
        metric(Metric::CallbackMean, e.slowest_callback.as_ref().map(|(_, ns)| *ns), t.callback_mean_ns),
        amplification,
    ];
    // Unknown only when nothing could be judged: one OK metric and three unobservable is OK.
    let advice = advise(e, &metrics);
    Verdict::of(metrics, advice)
}

fn advise(e: &Evidence, metrics: &[MetricVerdict]) -> Vec<Advice> {
    let mut advice = Vec::new();
    if verdict::level_of(metrics, Metric::InvalidateFreq) >= Level::Warn {
        advice.push(frequent_invalidations(e));
    }
    let waits = verdict::level_of(metrics, Metric::WaitPerInvalidation) >= Level::Warn;
    if let (true, Some((lock, wait_ns)), Some(bytes)) = (waits, &e.notifier_lock, e.mean_invalidation_bytes)
        && bytes < BATCH_BYTES
    {
        advice.push(Advice {
            cause: Cause::FineGrainedInvalidations,
            evidence: format!(
                "invalidations of {} on average waited {} in total on {lock}",
                format_bytes(bytes as u64),
                format_nanos(*wait_ns)
            ),
            action: "batch them: madvise/munmap in 2 MiB (or larger) ranges; each invalidation takes the lock once, whatever its size".into(),
        });
    }
    if waits && e.vcpu_faults_wait {
        let lock = e.notifier_lock.as_ref().map_or("the notifier's lock", |(l, _)| l.as_str());
        advice.push(Advice {
            cause: Cause::NotifierAgainstVcpuFaults,
            evidence: format!("vCPU page faults and the notifier both waited on {lock}"),
            action: "shrink the critical section: collect under the lock and do the slow work outside it; in non-blockable context try the lock and return false".into(),
        });
    }
    let waits_advised = advice.iter().any(|a| a.cause != Cause::FrequentInvalidations);
    if waits && !waits_advised {
        advice.push(waits_in_the_notifier(e));
    }
    if let (Some(Amplified { subscriber, fit }), true) =
        (&e.amplification, verdict::level_of(metrics, Metric::Amplification) >= Level::Warn)
    {
        advice.push(Advice {
            cause: Cause::DeviceFlushAmplification,
            evidence: format!(
                "{subscriber}'s callback costs ~{} per call whatever its size: a page of a {} invalidation costs ~{:.0}x what it costs in a {} one, and those take {:.0}% of its time",
                format_nanos(fit.fixed_ns as u64),
                format_bytes(fit.smallest_bytes),
                fit.amplification,
                format_bytes(fit.largest_bytes),
                fit.smallest_time_share * 100.0,
            ),
            action: "coarser or batched invalidations, notifier ranges aligned to 2 MiB, range-based or deferred device flushes".into(),
        });
    } else if let (Some((subscriber, mean_ns)), true) =
        (&e.slowest_callback, verdict::level_of(metrics, Metric::CallbackMean) >= Level::Warn)
    {
        advice.push(Advice {
            cause: Cause::SlowInvalidateCallbacks,
            evidence: format!("{subscriber}'s callback takes {} per call on average", format_nanos(*mean_ns as u64)),
            action: "move the device's wait out of the callback (flush asynchronously, wait in the fault path) or flush only the range".into(),
        });
    }
    advice
}

/// Advice for lock waits inside invalidations that neither batching nor the vCPU fault path
/// explains: which lock, whose memory, what sizes, and where to look.
fn waits_in_the_notifier(e: &Evidence) -> Advice {
    let (lock, wait_ns) = e.notifier_lock.clone().unwrap_or_else(|| ("a lock".into(), 0));
    let whose = e.busiest.as_ref().and_then(|b| Some(format!(" of pid {} ({})'s memory", b.owner_tgid?, b.comm)));
    let size =
        e.mean_invalidation_bytes.map_or_else(String::new, |b| format!(", {} on average", format_bytes(b as u64)));
    Advice {
        cause: Cause::LockWaitsInTheNotifier,
        evidence: format!(
            "invalidations{}{size} waited {} in total on {lock}",
            whose.unwrap_or_default(),
            format_nanos(wait_ns)
        ),
        action: "find who else holds that lock (its other paths in the lock table) and shorten that critical section, or take the lock once per batch of invalidations".into(),
    }
}

/// Advice for a high rate: whose memory, how large, and batching when the pieces are small.
fn frequent_invalidations(e: &Evidence) -> Advice {
    let whose = e.busiest.as_ref().map_or_else(
        || "one mm".to_string(),
        |b| match b.owner_tgid {
            Some(tgid) => format!("pid {tgid} ({})", b.comm),
            None => format!("memory not named (invalidated by {})", b.comm),
        },
    );
    let bytes = e.busiest.as_ref().and_then(|b| b.mean_bytes);
    let size = bytes.map_or_else(|| "of unknown size".into(), |b| format!("of {} on average", format_bytes(b as u64)));
    let why = e
        .busiest_cause
        .as_ref()
        .map_or_else(String::new, |d| format!("; {:.0} % of them {}", d.share * 100.0, d.cause));
    let evidence = format!(
        "{whose}'s memory was invalidated {:.0} times in its busiest second ({:.0}/s over the run), {size}{why}",
        e.invalidate_freq.unwrap_or(0.0),
        e.invalidate_freq_mean.unwrap_or(0.0),
    );
    let by_the_process = e.busiest_cause.as_ref().is_none_or(|d| matches!(d.cause.class, "syscall" | "unknown"));
    let advice = if !by_the_process {
        e.busiest_cause.as_ref().map_or_else(String::new, stop_the_cause)
    } else if bytes.is_some_and(|b| b < BATCH_BYTES) {
        "batch them: madvise/munmap in 2 MiB (or larger) ranges; every invalidation calls every subscriber once, whatever its size".into()
    } else {
        "find who invalidates it (the invalidators below) and make that less frequent: reclaim, compaction, NUMA balancing and khugepaged each have their knob".into()
    };
    Advice { cause: Cause::FrequentInvalidations, evidence, action: advice }
}

/// "make compaction less frequent (vm.compaction_proactiveness=20, …); mlock does not stop …".
fn stop_the_cause(d: &DominantCause) -> String {
    let knobs: Vec<String> =
        d.knobs.iter().map(|k| format!("{}={}", k.setting, k.value.as_deref().unwrap_or("UNKNOWN"))).collect();
    let settings = if knobs.is_empty() { String::new() } else { format!(" ({})", knobs.join(", ")) };
    let remedy = d.remedy.map_or_else(String::new, |r| format!("; {r}"));
    format!("make {} less frequent{settings}{remedy}", d.cause.class.replace('_', " "))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The command's default bands.
    pub(crate) fn thresholds() -> Thresholds {
        Thresholds {
            invalidate_freq: Band { warn: 1000.0, crit: 10000.0 },
            wait_per_invalidation_ns: Band { warn: 10_000.0, crit: 100_000.0 },
            callback_mean_ns: Band { warn: 50_000.0, crit: 500_000.0 },
            amplification: Band { warn: 10.0, crit: 100.0 },
        }
    }

    #[test]
    fn nothing_observable_is_unknown_never_ok() {
        let verdict = judge(&Evidence::default(), &thresholds());
        assert_eq!(verdict.level, Level::Unknown);
        assert!(verdict.advice.is_empty());
        assert!(verdict.metrics.iter().all(|m| m.value.is_none()));
    }

    #[test]
    fn small_invalidations_waiting_on_the_lock_are_told_to_batch() {
        let e = Evidence {
            invalidate_freq: Some(50_000.0),
            wait_per_invalidation_ns: Some(20_000.0),
            mean_invalidation_bytes: Some(4096.0),
            notifier_lock: Some(("kvm->mmu_lock of VM pid 7".into(), 1_000_000)),
            vcpu_faults_wait: true,
            ..Evidence::default()
        };
        let verdict = judge(&e, &thresholds());
        assert_eq!(verdict.level, Level::Crit);
        let causes: Vec<&str> = verdict.advice.iter().map(|a| a.cause.name()).collect();
        assert_eq!(causes, ["frequent invalidations", "fine-grained invalidations", "notifier against vCPU faults"]);
        // Already 2 MiB: batching is not the advice.
        let big = Evidence { mean_invalidation_bytes: Some((2 << 20) as f64), ..e };
        assert!(judge(&big, &thresholds()).advice.iter().all(|a| a.cause != Cause::FineGrainedInvalidations));
    }

    #[test]
    fn every_warn_or_crit_comes_with_advice_naming_what_to_look_at() {
        // Large invalidations waiting on a lock no vCPU takes: neither batching nor the fault path.
        let e = Evidence {
            invalidate_freq: Some(10.0),
            wait_per_invalidation_ns: Some(200_000.0),
            mean_invalidation_bytes: Some((2 << 20) as f64),
            notifier_lock: Some(("lock 0xffff888100 (taken in drm_flush)".into(), 9_000_000)),
            busiest: Some(Busiest { owner_tgid: Some(77), comm: "app".into(), count: 45, mean_bytes: Some(2e6) }),
            ..Evidence::default()
        };
        let verdict = judge(&e, &thresholds());
        assert_eq!(verdict.level, Level::Crit);
        let advice = verdict.advice.iter().find(|a| a.cause == Cause::LockWaitsInTheNotifier).expect("advice");
        assert!(
            advice.evidence.contains("pid 77 (app)") && advice.evidence.contains("drm_flush"),
            "{}",
            advice.evidence
        );
        for metric in verdict.metrics.iter().filter(|m| m.level >= Level::Warn) {
            assert!(!verdict.advice.is_empty(), "{} is {:?} without advice", metric.metric, metric.level);
        }
    }

    #[test]
    fn a_fixed_cost_per_call_is_reported_as_amplification() {
        let e = Evidence {
            slowest_callback: Some(("hmm_mirror".into(), 100_000.0)),
            amplification: Some(Amplified {
                subscriber: "hmm_mirror".into(),
                fit: Fit {
                    fixed_ns: 100_000.0,
                    per_page_ns: 10.0,
                    amplification: 500.0,
                    smallest_bytes: 4096,
                    largest_bytes: 2 << 20,
                    size_classes: 2,
                    smallest_time_share: 0.5,
                },
            }),
            ..Evidence::default()
        };
        let verdict = judge(&e, &thresholds());
        assert_eq!(verdict.level, Level::Crit);
        assert_eq!(verdict.advice.len(), 1);
        assert_eq!(verdict.advice[0].cause, Cause::DeviceFlushAmplification);
        assert!(
            verdict.advice[0].evidence.contains("4 KiB invalidation costs ~500x"),
            "{}",
            verdict.advice[0].evidence
        );
    }

    #[test]
    fn amplified_small_invalidations_that_take_little_of_the_time_are_not_a_problem() {
        // A VMM that madvises in 2 MiB pieces; its threads' own few 4 KiB unmaps are amplified.
        let fit = Fit {
            fixed_ns: 20_000.0,
            per_page_ns: 2.0,
            amplification: 480.0,
            smallest_bytes: 4096,
            largest_bytes: 2 << 20,
            size_classes: 2,
            smallest_time_share: 0.08,
        };
        let e = Evidence {
            amplification: Some(Amplified { subscriber: "kvm".into(), fit }),
            slowest_callback: Some(("kvm".into(), 21_000.0)),
            ..Evidence::default()
        };
        let verdict = judge(&e, &thresholds());
        let metric = verdict.metrics.iter().find(|m| m.metric == Metric::Amplification).unwrap();
        assert_eq!((metric.value, metric.level), (Some(480.0), Level::Ok), "measured, and judged harmless");
        assert!(verdict.advice.is_empty(), "{:?}", verdict.advice);
        let mattering = Fit { smallest_time_share: AMPLIFIED_TIME_SHARE, ..fit };
        let e = Evidence { amplification: Some(Amplified { subscriber: "kvm".into(), fit: mattering }), ..e };
        assert_eq!(judge(&e, &thresholds()).level, Level::Crit);
    }

    #[test]
    fn a_storm_inside_a_long_run_is_judged_by_its_peak_and_advised_with_whose_memory_and_size() {
        // 2.7 s at ~30k/s inside 150 s: 545/s over the run.
        let e = Evidence {
            invalidate_freq: Some(30_000.0),
            invalidate_freq_mean: Some(545.0),
            busiest: Some(Busiest {
                owner_tgid: Some(4242),
                comm: "qemu-kvm".into(),
                count: 81_000,
                mean_bytes: Some(4096.0),
            }),
            ..Evidence::default()
        };
        let verdict = judge(&e, &thresholds());
        assert_eq!(verdict.level, Level::Crit);
        let advice = &verdict.advice[0];
        assert_eq!(advice.cause, Cause::FrequentInvalidations);
        assert!(
            advice.evidence.contains("pid 4242 (qemu-kvm)") && advice.evidence.contains("4 KiB"),
            "{}",
            advice.evidence
        );
        assert!(advice.action.starts_with("batch them"), "{}", advice.action);
        let metric = &verdict.metrics[0];
        assert_eq!((metric.unit, metric.warn, metric.crit), (Unit::PerSecond, 1000.0, 10000.0));
    }

    #[test]
    fn a_storm_made_by_compaction_is_advised_with_compactions_settings_not_batching() {
        let e = Evidence {
            invalidate_freq: Some(40_000.0),
            invalidate_freq_mean: Some(2_000.0),
            busiest: Some(Busiest {
                owner_tgid: Some(4242),
                comm: "qemu-kvm".into(),
                count: 42_399,
                mean_bytes: Some(4096.0),
            }),
            busiest_cause: Some(DominantCause {
                cause: CauseName { class: "compaction", detail: Some("migration".into()) },
                share: 0.97,
                knobs: vec![Knob { setting: "vm.compaction_proactiveness".into(), value: Some("20".into()) }],
                remedy: crate::cause::remedy("compaction"),
            }),
            ..Evidence::default()
        };
        let advice = &judge(&e, &thresholds()).advice[0];
        assert!(advice.evidence.ends_with("; 97 % of them compaction migration"), "{}", advice.evidence);
        assert!(
            advice.action.starts_with("make compaction less frequent (vm.compaction_proactiveness=20); mlock"),
            "{}",
            advice.action
        );
    }

    #[test]
    fn a_figure_from_lost_data_is_unknown_with_the_reason_never_ok() {
        let mut unknown_because = BTreeMap::new();
        unknown_because
            .insert(Metric::WaitPerInvalidation, "5241 contended waits were lost (the kernel's table was full)".into());
        let e = Evidence { wait_per_invalidation_ns: Some(0.0), unknown_because, ..Evidence::default() };
        let verdict = judge(&e, &thresholds());
        let metric = verdict.metrics.iter().find(|m| m.metric == Metric::WaitPerInvalidation).unwrap();
        assert_eq!((metric.value, metric.level), (None, Level::Unknown));
        assert!(metric.unknown_because.as_deref().unwrap().contains("lost"));
    }
}
