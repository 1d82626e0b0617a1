//! Judging the metrics against the health thresholds (docs/thresholds.md, "retry-storm"; every
//! band can be overridden from the command line) and tying advice to the evidence.

use serde::Serialize;

use super::{causes::CauseRow, rates::ratio, walks::StaleLoops};
pub use crate::report::verdict::{Band, Level, Unit};
use crate::{
    cause::CauseName,
    report::verdict::{self, MetricVerdict, named},
    units::{format_bytes, format_nanos},
};

named! {
    /// The metrics the verdict judges, by the names of docs/thresholds.md.
    pub enum Metric {
        StaleRetries => "stale_retries",
        RetryRate => "retry_rate",
        TimeoutRate => "timeout_rate",
        AvgLatency => "avg_latency",
        InvalidateFreq => "invalidate_freq",
    }
}

named! {
    /// What a piece of advice blames.
    pub enum Cause {
        StaleSequence => "stale sequence",
        LargeWalks => "large walks",
        NotifierFalseSharing => "notifier false sharing",
        MemoryPressure => "memory pressure",
        CgroupLimit => "cgroup memory limit",
        Compaction => "compaction",
        NumaBalancing => "NUMA balancing",
        Migration => "page migration",
        KernelThread => "kernel thread",
        CopyOnWrite => "copy-on-write",
        FineGrainedUnmaps => "fine-grained unmaps",
        SlowInvalidateCallbacks => "slow invalidate callbacks",
    }
}

pub type Verdict = verdict::Verdict<Metric, Cause>;
type Advice = verdict::Advice<Cause>;

/// The defaults are docs/thresholds.md's table.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    /// -EBUSY returns ÷ invalidations (fraction).
    pub retry_rate: Band,
    /// Retry loops that gave up ÷ invalidations (fraction).
    pub timeout_rate: Band,
    /// Mean hmm_range_fault() duration, nanoseconds.
    pub avg_latency_ns: Band,
    /// Invalidations per second on mirrored mms.
    pub invalidate_freq: Band,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            retry_rate: Band { warn: 0.05, crit: 0.15 },
            timeout_rate: Band { warn: 0.001, crit: 0.01 },
            avg_latency_ns: Band { warn: 100_000.0, crit: 500_000.0 },
            invalidate_freq: Band { warn: 1_000.0, crit: 10_000.0 },
        }
    }
}

/// The measured values the verdict is built from (`None` = not observable or no data).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    pub walks: u64,
    pub busy_walks: u64,
    pub invalidations: u64,
    pub timeouts: u64,
    pub retry_rate: Option<f64>,
    pub busy_per_walk: Option<f64>,
    pub timeout_rate: Option<f64>,
    pub avg_walk_ns: Option<f64>,
    pub invalidate_freq: Option<f64>,
    pub mean_walk_bytes: Option<f64>,
    pub true_conflicts: u64,
    pub false_sharing: u64,
    /// Size of the notifier intervals the false-sharing walks used (largest seen).
    pub notifier_interval_bytes: Option<u64>,
    /// Invalidations and the failed walks that collided with them, by cause.
    pub by_cause: Vec<CauseRow>,
    /// Invalidations of at most one page ÷ all.
    pub small_invalidation_share: Option<f64>,
    pub callback_p99_ns: Option<u64>,
    /// -EBUSY returns of stale-sequence retries (kernel counter); `None` where the walks'
    /// sequences cannot be read.
    pub stale_retries: Option<u64>,
    /// The loops that ended in this window with stale retries.
    pub stale_loops: StaleLoops,
}

impl Evidence {
    /// Stale-sequence retries ÷ failed walks; unknown where the sequences cannot be read.
    fn stale_retry_share(&self) -> Option<f64> {
        self.stale_retries.map(|stale| ratio(stale, self.busy_walks).unwrap_or(0.0))
    }
}

/// Any stale-sequence retry is CRIT: such a loop cannot succeed, whatever the machine does.
/// (A band's lower bound is inclusive in WARN, so "above zero" is the smallest positive value.)
const STALE_RETRIES: Band = Band { warn: f64::MIN_POSITIVE, crit: f64::MIN_POSITIVE };

/// Walks larger than this are "large": the material's and amdgpu's advice is 2 MiB chunks.
pub const CHUNK_BYTES: u64 = 2 << 20;
/// Callbacks slower than this look like device TLB flushes inside the critical section
/// (such flushes take 10–500 µs each: docs/thresholds.md, "slow callbacks").
pub const SLOW_CALLBACK_NS: u64 = 100_000;

pub fn judge(e: &Evidence, t: &Thresholds) -> Verdict {
    let metric = |metric, definition, unit, value: Option<f64>, band: Band| {
        let mut judged = MetricVerdict::judged(metric, definition, unit, value, band, None);
        if value.is_none() {
            judged.unknown_because = Some(unseen(metric, e).into());
        }
        judged
    };
    let metrics = vec![
        // First: when it fires, it is the headline; no other figure matters until it is fixed.
        metric(
            Metric::StaleRetries,
            "hmm_range_fault retries with a sequence already stale ÷ -EBUSY returns (such a loop cannot succeed)",
            Unit::Fraction,
            e.stale_retry_share(),
            STALE_RETRIES,
        ),
        metric(
            Metric::RetryRate,
            "hmm_range_fault -EBUSY returns ÷ invalidations of mirrored mms (the material's definition)",
            Unit::Fraction,
            e.retry_rate,
            t.retry_rate,
        ),
        metric(
            Metric::TimeoutRate,
            "retry loops that gave up ÷ invalidations of mirrored mms",
            Unit::Fraction,
            e.timeout_rate,
            t.timeout_rate,
        ),
        metric(Metric::AvgLatency, "mean hmm_range_fault duration", Unit::Ns, e.avg_walk_ns, t.avg_latency_ns),
        metric(
            Metric::InvalidateFreq,
            "invalidations of mirrored mms per second",
            Unit::PerSecond,
            e.invalidate_freq,
            t.invalidate_freq,
        ),
    ];
    // A window with walks but no invalidations has no retry_rate; the others are still judged.
    let advice = advise(e, &metrics);
    Verdict::of(metrics, advice)
}

/// Why a metric has no value: what it is built on was not seen.
fn unseen(metric: Metric, e: &Evidence) -> &'static str {
    match metric {
        Metric::RetryRate | Metric::TimeoutRate | Metric::InvalidateFreq if e.invalidations == 0 => {
            "no invalidation of a mirrored mm was seen"
        }
        Metric::AvgLatency | Metric::StaleRetries if e.walks == 0 => "no mirror walk (hmm_range_fault) was seen",
        Metric::StaleRetries => "the walks' sequences are not readable on this kernel (no BTF offsets)",
        _ => verdict::NOTHING_SEEN,
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or("n/a".into(), |v| format!("{:.1} %", v * 100.0))
}

fn advise(e: &Evidence, metrics: &[MetricVerdict<Metric>]) -> Vec<Advice> {
    let mut advice = Vec::new();
    let stale = &e.stale_loops;
    let stale_retries = e.stale_retries.unwrap_or(0);
    if stale_retries > 0 {
        advice.push(Advice {
            cause: Cause::StaleSequence,
            evidence: format!(
                "the driver retries with a stale sequence: this loop cannot succeed. {} of {} failed walks reused the sequence of an earlier failed walk of their loop, already stale when they began; {} such loops ended, {} given up after {} in all",
                stale_retries,
                e.busy_walks,
                stale.loops,
                stale.gave_up,
                format_nanos(stale.given_up_ns)
            ),
            action: "call mmu_interval_read_begin before each hmm_range_fault in the retry loop (range.notifier_seq = mmu_interval_read_begin(range.notifier) inside the loop, not once before it)".into(),
        });
    }
    let retrying = verdict::level_of(metrics, Metric::RetryRate) >= Level::Warn
        || verdict::level_of(metrics, Metric::TimeoutRate) >= Level::Warn
        || e.busy_per_walk.is_some_and(|r| r >= 0.05);
    if retrying && e.mean_walk_bytes.is_some_and(|b| b > CHUNK_BYTES as f64) {
        advice.push(Advice {
            cause: Cause::LargeWalks,
            evidence: format!(
                "walks average {} and take {} on average; {} of walks returned -EBUSY ({} of invalidations), {} retry loops gave up",
                format_bytes(e.mean_walk_bytes.unwrap_or(0.0) as u64),
                e.avg_walk_ns.map_or("n/a".into(), |n| format_nanos(n as u64)),
                percent(e.busy_per_walk),
                percent(e.retry_rate),
                e.timeouts
            ),
            action: "walk in 2 MiB chunks (one hmm_range_fault per chunk, each with its own read_begin), and make sure the retry loop re-reads the sequence per chunk instead of restarting the whole range".into(),
        });
    }
    if e.false_sharing > 0 && e.false_sharing >= e.true_conflicts && retrying {
        advice.push(Advice {
            cause: Cause::NotifierFalseSharing,
            evidence: format!(
                "{} of {} failed walks were failed only by invalidations outside the walked range but inside the notifier's interval ({}); {} were true conflicts",
                e.false_sharing,
                e.busy_walks,
                e.notifier_interval_bytes.map_or("size unknown".into(), format_bytes),
                e.true_conflicts
            ),
            action: "register finer interval notifiers (one per 2 MiB is the usual middle ground) so an invalidation fails only the walks of the pages it touches".into(),
        });
    }
    advice.extend(collision_advice(&e.by_cause));
    if verdict::level_of(metrics, Metric::InvalidateFreq) >= Level::Warn
        && e.small_invalidation_share.is_some_and(|s| s >= 0.5)
    {
        advice.push(Advice {
            cause: Cause::FineGrainedUnmaps,
            evidence: format!(
                "{} invalidations/s, {} of them one page or less",
                e.invalidate_freq.map_or("n/a".into(), |f| format!("{f:.0}")),
                percent(e.small_invalidation_share)
            ),
            action: "batch the munmap/madvise calls into larger ranges; each 4 KiB call invalidates (and fails walks) on its own".into(),
        });
    }
    if let Some(p99) = e.callback_p99_ns.filter(|&p| p >= SLOW_CALLBACK_NS) {
        advice.push(Advice {
            cause: Cause::SlowInvalidateCallbacks,
            evidence: format!("P99 time inside invalidate_range_start (the subscribers' callbacks) is {}", format_nanos(p99)),
            action: "move device TLB flushes out of the invalidate callback's critical section (defer them, or batch them per range); `mm-probe invalidations` shows whose callback it is and what it waits on".into(),
        });
    }
    advice
}

/// A cause is blamed when at least this share of the failed walks collided with it.
pub const COLLISION_SHARE: f64 = 0.1;

/// What each cause of invalidations is called in advice, and what stops it; `None` for the
/// process's own calls (the chunking and unmap advice speak to those), a fault that is not a
/// copy-on-write, and undecided causes.
fn remedy_for(cause: &CauseName) -> Option<(Cause, &'static str, &'static str)> {
    Some(match cause.class {
        "kswapd" | "direct_reclaim" => (
            Cause::MemoryPressure,
            "reclaim of the mirrored memory",
            "the machine is under memory pressure and reclaim unmaps the mirrored pages while the device walks them: give the workload memory or lower other consumers, raise the watermarks (vm.watermark_scale_factor) so kswapd starts earlier, or mlock the mirrored buffers",
        ),
        "cgroup_reclaim" => (
            Cause::CgroupLimit,
            "its memory cgroup's reclaim",
            "the cgroup is at its memory.high or memory.max: raise the limit above the working set, or mlock the mirrored buffers",
        ),
        "compaction" => (
            Cause::Compaction,
            "compaction moving the mirrored pages",
            "lower vm.compaction_proactiveness, set transparent_hugepage/defrag to defer or madvise; mlock does not stop compaction unless vm.compact_unevictable_allowed is 0",
        ),
        "numa_balancing" => (
            Cause::NumaBalancing,
            "NUMA balancing",
            "disable NUMA balancing for this workload (sysctl kernel.numa_balancing=0) or bind its memory (numactl --membind); mlock does not stop it",
        ),
        "migration" => (
            Cause::Migration,
            "page migration",
            "find what migrates the pages (the reason is named): mbind/move_pages calls, memory tiering's demotion, or memory hot-unplug; mlock does not stop migration",
        ),
        "kernel_thread" => (
            Cause::KernelThread,
            "a kernel thread working on the mirrored memory",
            "khugepaged: MADV_NOHUGEPAGE on the mirrored range or a lower khugepaged/pages_to_scan; ksmd: no MADV_MERGEABLE on it; kdamond: exclude the range from DAMON's scheme",
        ),
        "fault" if cause.detail.as_deref() == Some("copy-on-write") => (
            Cause::CopyOnWrite,
            "copy-on-write after fork",
            "the process forks while mirroring: MADV_DONTFORK or MADV_WIPEONFORK on the mirrored range",
        ),
        _ => return None,
    })
}

/// One piece of advice per kind of cause that failed at least [`COLLISION_SHARE`] of the walks,
/// with the rows behind it and their settings as read on this machine.
fn collision_advice(rows: &[CauseRow]) -> Vec<Advice> {
    let mut groups: Vec<(Cause, &str, &str, Vec<&CauseRow>)> = Vec::new();
    for row in rows.iter().filter(|r| r.failed_walks > 0) {
        let Some((cause, what, action)) = remedy_for(&row.cause) else { continue };
        match groups.iter_mut().find(|group| group.0 == cause) {
            Some(group) => group.3.push(row),
            None => groups.push((cause, what, action, vec![row])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(cause, what, action, rows)| {
            let share: f64 = rows.iter().filter_map(|r| r.failed_walk_share).sum();
            let evidence = collision_evidence(what, share, &rows);
            (share >= COLLISION_SHARE).then(|| Advice { cause, evidence, action: action.into() })
        })
        .collect()
}

/// "86.0 % of failed walks (430) collided with reclaim of the mirrored memory (kswapd: 400,
/// direct reclaim in hog: 30); vm.swappiness = 60, …"
fn collision_evidence(what: &str, share: f64, rows: &[&CauseRow]) -> String {
    let failed: u64 = rows.iter().map(|r| r.failed_walks).sum();
    let each: Vec<String> = rows.iter().map(|r| format!("{}: {}", r.cause, r.failed_walks)).collect();
    let mut knobs: Vec<String> = Vec::new();
    for knob in rows.iter().flat_map(|r| &r.knobs) {
        let said = format!("{} = {}", knob.setting, knob.value.as_deref().unwrap_or("unreadable"));
        if !knobs.contains(&said) {
            knobs.push(said);
        }
    }
    let knobs = if knobs.is_empty() { String::new() } else { format!("; {}", knobs.join(", ")) };
    format!("{} of failed walks ({failed}) collided with {what} ({}){knobs}", percent(Some(share)), each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_follow_the_thresholds_table() {
        let t = Thresholds::default();
        assert_eq!(t.retry_rate.classify(Some(0.049)), Level::Ok);
        assert_eq!(t.retry_rate.classify(Some(0.05)), Level::Warn);
        assert_eq!(t.retry_rate.classify(Some(0.15)), Level::Warn);
        assert_eq!(t.retry_rate.classify(Some(0.151)), Level::Crit);
        assert_eq!(t.timeout_rate.classify(Some(0.0005)), Level::Ok);
        assert_eq!(t.timeout_rate.classify(Some(0.02)), Level::Crit);
        assert_eq!(t.avg_latency_ns.classify(Some(87_000.0)), Level::Ok);
        assert_eq!(t.avg_latency_ns.classify(Some(523_000.0)), Level::Crit);
        assert_eq!(t.invalidate_freq.classify(Some(5_000.0)), Level::Warn);
        assert_eq!(t.invalidate_freq.classify(None), Level::Unknown);
        assert_eq!(t.invalidate_freq.classify(Some(f64::NAN)), Level::Unknown);
    }

    #[test]
    fn the_materials_gpu_case_goes_from_crit_to_ok() {
        let t = Thresholds::default();
        let before = Evidence { retry_rate: Some(0.85), avg_walk_ns: Some(523_000.0), ..Evidence::default() };
        let after = Evidence { retry_rate: Some(0.056), avg_walk_ns: Some(87_000.0), ..Evidence::default() };
        assert_eq!(judge(&before, &t).level, Level::Crit);
        assert_eq!(judge(&after, &t).level, Level::Warn);
        let after = Evidence { retry_rate: Some(0.02), avg_walk_ns: Some(87_000.0), ..Evidence::default() };
        assert_eq!(judge(&after, &t).level, Level::Ok);
    }

    #[test]
    fn json_keeps_the_names_of_levels_metrics_units_and_causes() {
        let names = |values: Vec<serde_json::Value>| -> Vec<String> {
            values.into_iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        let levels = [Level::Unknown, Level::Ok, Level::Warn, Level::Crit].map(|l| serde_json::to_value(l).unwrap());
        assert_eq!(names(levels.to_vec()), ["UNKNOWN", "OK", "WARN", "CRIT"]);
        let metrics =
            [Metric::StaleRetries, Metric::RetryRate, Metric::TimeoutRate, Metric::AvgLatency, Metric::InvalidateFreq]
                .map(|m| serde_json::to_value(m).unwrap());
        assert_eq!(
            names(metrics.to_vec()),
            ["stale_retries", "retry_rate", "timeout_rate", "avg_latency", "invalidate_freq"]
        );
        let units = [Unit::Fraction, Unit::Ns, Unit::PerSecond].map(|u| serde_json::to_value(u).unwrap());
        assert_eq!(names(units.to_vec()), ["fraction", "ns", "per_second"]);
        let causes = [
            Cause::StaleSequence,
            Cause::LargeWalks,
            Cause::NotifierFalseSharing,
            Cause::MemoryPressure,
            Cause::NumaBalancing,
            Cause::FineGrainedUnmaps,
            Cause::SlowInvalidateCallbacks,
        ]
        .map(|c| serde_json::to_value(c).unwrap());
        assert_eq!(
            names(causes.to_vec()),
            [
                "stale sequence",
                "large walks",
                "notifier false sharing",
                "memory pressure",
                "NUMA balancing",
                "fine-grained unmaps",
                "slow invalidate callbacks"
            ]
        );
    }

    #[test]
    fn a_stale_sequence_retry_is_crit_and_the_headline_whatever_the_rates() {
        let stale_loops = StaleLoops { loops: 2, retries: 900, gave_up: 2, given_up_ns: 2_000_000_000 };
        let e = Evidence {
            walks: 1000,
            busy_walks: 990,
            invalidations: 2,
            retry_rate: Some(0.01),
            stale_retries: Some(900),
            stale_loops,
            ..Evidence::default()
        };
        let v = judge(&e, &Thresholds::default());
        assert_eq!(v.level, Level::Crit);
        assert!(v.headline.starts_with("stale_retries"), "{}", v.headline);
        let first = &v.advice[0];
        assert_eq!(first.cause, Cause::StaleSequence);
        assert!(first.evidence.contains("cannot succeed") && first.evidence.contains("given up after 2s"), "{first:?}");
        assert!(first.action.contains("mmu_interval_read_begin before each hmm_range_fault"));
    }

    #[test]
    fn live_collisions_are_never_called_stale_and_unread_sequences_are_unknown() {
        let e = Evidence { walks: 10, busy_walks: 5, stale_retries: Some(0), ..Evidence::default() };
        let v = judge(&e, &Thresholds::default());
        assert_eq!(verdict::level_of(&v.metrics, Metric::StaleRetries), Level::Ok);
        assert!(v.advice.iter().all(|a| a.cause != Cause::StaleSequence));
        let unread = Evidence { stale_retries: None, ..e };
        let v = judge(&unread, &Thresholds::default());
        let stale = v.metrics.iter().find(|m| m.metric == Metric::StaleRetries).unwrap();
        assert_eq!(stale.level, Level::Unknown);
        assert!(stale.unknown_because.as_deref().unwrap().contains("sequences are not readable"));
    }

    #[test]
    fn nothing_observed_is_unknown_overall() {
        assert_eq!(judge(&Evidence::default(), &Thresholds::default()).level, Level::Unknown);
    }

    #[test]
    fn overridden_thresholds_change_the_level() {
        let t = Thresholds { retry_rate: Band { warn: 0.5, crit: 0.9 }, ..Thresholds::default() };
        let e = Evidence { retry_rate: Some(0.3), ..Evidence::default() };
        assert_eq!(judge(&e, &t).level, Level::Ok);
    }

    #[test]
    fn large_failing_walks_get_the_chunking_advice() {
        let e = Evidence {
            walks: 100,
            busy_walks: 90,
            invalidations: 200,
            retry_rate: Some(0.45),
            busy_per_walk: Some(0.9),
            avg_walk_ns: Some(2e6),
            mean_walk_bytes: Some((64u64 << 20) as f64),
            ..Evidence::default()
        };
        let v = judge(&e, &Thresholds::default());
        assert_eq!(v.level, Level::Crit);
        let chunk = v.advice.iter().find(|a| a.cause == Cause::LargeWalks).expect("chunking advice");
        assert!(chunk.action.contains("2 MiB chunks"), "{chunk:?}");
        assert!(chunk.evidence.contains("64 MiB"), "{chunk:?}");
    }

    #[test]
    fn small_walks_do_not_get_the_chunking_advice_but_false_sharing_gets_finer_notifiers() {
        let e = Evidence {
            walks: 1000,
            busy_walks: 100,
            invalidations: 400,
            retry_rate: Some(0.25),
            busy_per_walk: Some(0.1),
            mean_walk_bytes: Some((2u64 << 20) as f64),
            true_conflicts: 10,
            false_sharing: 90,
            notifier_interval_bytes: Some(64 << 20),
            ..Evidence::default()
        };
        let v = judge(&e, &Thresholds::default());
        assert!(v.advice.iter().all(|a| a.cause != Cause::LargeWalks), "{v:?}");
        let finer = v.advice.iter().find(|a| a.cause == Cause::NotifierFalseSharing).expect("false sharing advice");
        assert!(finer.action.contains("finer interval notifiers"));
    }

    fn row(class: &'static str, detail: Option<&str>, failed_walks: u64, share: f64) -> CauseRow {
        let cause = crate::cause::CauseName { class, detail: detail.map(str::to_string) };
        CauseRow {
            knobs: crate::cause::knobs(std::path::Path::new("/nonexistent"), &cause, 1),
            remedy: crate::cause::remedy(class),
            cause,
            invalidations: failed_walks * 2,
            failed_walks,
            failed_walk_share: Some(share),
        }
    }

    #[test]
    fn reclaim_numa_small_unmaps_and_slow_callbacks_are_named() {
        let e = Evidence {
            invalidations: 100,
            invalidate_freq: Some(20_000.0),
            small_invalidation_share: Some(0.9),
            by_cause: vec![
                row("kswapd", None, 30, 0.6),
                row("direct_reclaim", Some("in hog"), 5, 0.1),
                row("numa_balancing", Some("hinting faults set up by task_numa_work"), 10, 0.2),
                row("syscall", Some("madvise(MADV_DONTNEED)"), 5, 0.1),
            ],
            callback_p99_ns: Some(300_000),
            ..Evidence::default()
        };
        let advice = judge(&e, &Thresholds::default()).advice;
        let causes: Vec<Cause> = advice.iter().map(|a| a.cause).collect();
        assert_eq!(
            causes,
            [Cause::MemoryPressure, Cause::NumaBalancing, Cause::FineGrainedUnmaps, Cause::SlowInvalidateCallbacks]
        );
        let pressure = &advice[0].evidence;
        assert!(pressure.starts_with("70.0 % of failed walks (35) collided with reclaim"), "{pressure}");
        assert!(pressure.contains("kswapd: 30, direct reclaim in hog: 5"), "{pressure}");
        assert!(pressure.contains("vm.swappiness = unreadable"), "the knob is named even unread: {pressure}");
    }

    #[test]
    fn a_cause_below_a_tenth_of_the_failed_walks_the_processs_own_calls_or_a_plain_fault_get_no_cause_advice() {
        let e = Evidence {
            by_cause: vec![
                row("syscall", Some("madvise(MADV_DONTNEED)"), 90, 0.9),
                row("fault", None, 40, 0.4),
                row("compaction", None, 5, 0.05),
            ],
            ..Evidence::default()
        };
        let advice = judge(&e, &Thresholds::default()).advice;
        assert!(advice.is_empty(), "{advice:?}");
    }
}
