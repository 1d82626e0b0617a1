//! The metric families: a [`Snapshot`] encoded with prometheus-client, as OpenMetrics text (what
//! Prometheus asks for) or the classic text format (what `curl` and `promtool check metrics`
//! read). Names are in base units (seconds); counters get their `_total` from the encoder.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric as _, NoLabelSet, text::encode},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use super::{
    buckets::Histogram,
    scrape::{Series, Snapshot},
};

/// The snapshot of one scrape, as a collector the registry encodes.
#[derive(Debug)]
struct Families(Snapshot);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        gauges(
            &mut encoder,
            "mm_probe_build_info",
            "mm-probe's version and the running kernel (always 1).",
            &s.build_info,
        )?;
        gauges(
            &mut encoder,
            "mm_probe_probe_attached",
            "1 when the logical probe attached, 0 when this kernel does not allow it (mm-probe doctor says why).",
            &s.probe_attached,
        )?;
        gauges(
            &mut encoder,
            "mm_probe_verdict",
            "Each capability's verdict over the last --window, judged as its command judges with the command's default limits: 1 for its level (UNKNOWN: nothing to judge, or not observable), 0 for the others. From the first window's end.",
            &s.verdicts,
        )?;
        gauges(
            &mut encoder,
            "mm_probe_finding",
            "1 while a capability's verdict over the last --window is WARN or CRIT (a finding, as mm-probe triage reports it), with the metric that decided it.",
            &s.findings,
        )?;
        counters(
            &mut encoder,
            "mm_probe_lost_events",
            "Events the kernel programs could not count: runs skipped by the kernel's recursion guard (no series where the kernel does not count them: kprobes before 6.7), returns without their entry.",
            &s.lost_events,
        )?;
        counters(
            &mut encoder,
            "mm_probe_map_update_failures",
            "Kernel map updates that failed because the map was full; what they would have held is missing.",
            &s.map_update_failures,
        )?;
        histogram_family(
            &mut encoder,
            "mm_probe_wakeup_latency_seconds",
            "Time from sched_wakeup (a timer wakeup: its sleep timer's expiry) to the sched_switch that ran the task (real-time tasks unless -p or --all-tasks).",
            s.wakeup_latency.as_ref(),
        )?;
        counter(
            &mut encoder,
            "mm_probe_wakeups_over_threshold",
            "Wakeups slower than --threshold.",
            s.wakeups_over_threshold,
        )?;
        function_durations(&mut encoder, s)?;
        counters(
            &mut encoder,
            "mm_probe_hmm_range_fault_returns",
            "hmm_range_fault() returns by result: ok, ebusy (the range was invalidated: the caller retries), other_error.",
            &s.hmm_range_fault_returns,
        )?;
        counter(
            &mut encoder,
            "mm_probe_hmm_stale_sequence_retries",
            "hmm_range_fault() -EBUSY returns of retries with the sequence their previous failure already had: loops that cannot succeed.",
            s.hmm_stale_retries,
        )?;
        counters(
            &mut encoder,
            "mm_probe_mmu_invalidations",
            "__mmu_notifier_invalidate_range_start() on mirrored memory, by enum mmu_notifier_event.",
            &s.mmu_invalidations,
        )?;
        counters(
            &mut encoder,
            "mm_probe_mirrored_invalidation_causes",
            "The same invalidations of mirrored memory by why they happened (compaction, numa_balancing, migration, direct_reclaim, cgroup_reclaim, kswapd, kernel_thread, syscall, fault, unknown), decided in the invalidating thread.",
            &s.mirrored_invalidation_causes,
        )?;
        histogram_family(
            &mut encoder,
            "mm_probe_mmu_invalidation_callback_seconds",
            "Time in __mmu_notifier_invalidate_range_start, i.e. in the subscribers' invalidate callbacks.",
            s.mmu_invalidation_callback.as_ref(),
        )?;
        counters(
            &mut encoder,
            "mm_probe_kvm_mmu_notifier_events",
            "KVM's MMU-notifier tracepoints on every VMM: kvm_unmap_hva_range (its guest mappings of the range are dropped), kvm_age_hva (aged for reclaim).",
            &s.kvm_notifier_events,
        )?;
        counters(
            &mut encoder,
            "mm_probe_thp_checks",
            "THP allow-checks on every process by verdict, and for denials the reason code thp-why uses (other: needs the VMA).",
            &s.thp_checks,
        )?;
        invalidation_families(&mut encoder, s)
    }
}

/// `mm-probe invalidations`' families: invalidations by hook and event, contended locks and
/// their waits by lock class and waiting path, subscriber callbacks.
fn invalidation_families(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), std::fmt::Error> {
    counters(
        encoder,
        "mm_probe_notifier_invalidations",
        "MMU-notifier invalidations by hook (kvm_unmap_hva_range, kvm_age_hva, invalidate_range_start) and enum mmu_notifier_event (unknown where the hook does not carry it).",
        &s.notifier_invalidations,
    )?;
    counters(
        encoder,
        "mm_probe_invalidation_causes",
        "MMU-notifier invalidations by the hook counted and why they happened (compaction, numa_balancing, migration, direct_reclaim, cgroup_reclaim, kswapd, kernel_thread, syscall, fault, unknown), decided in the invalidating thread.",
        &s.invalidation_causes,
    )?;
    counters(
        encoder,
        "mm_probe_lock_contended",
        "Contended lock acquisitions (lock:contention_begin) by lock class (kvm_mmu_lock, kvm_lock, mmap_lock, unknown) and the path that waited (notifier_start, vcpu_fault, ...).",
        &s.lock_contended,
    )?;
    counters(
        encoder,
        "mm_probe_lock_wait_seconds",
        "Time those acquisitions waited, by lock class and waiting path.",
        &s.lock_wait_seconds,
    )?;
    counters(
        encoder,
        "mm_probe_notifier_callback_calls",
        "Calls of each known subscriber's invalidate callback (kprobes; absent where the kernel has none).",
        &s.callback_calls,
    )?;
    counters(
        encoder,
        "mm_probe_notifier_callback_seconds",
        "Time in each known subscriber's invalidate callback.",
        &s.callback_seconds,
    )
}

/// A counter family, in whole counts or in seconds.
fn counters<V: EncodeCounterValue + Copy + std::fmt::Debug>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[Series<V>],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for s in series {
        ConstCounter::new(s.value).encode(family.encode_family(&s.labels)?)?;
    }
    Ok(())
}

/// A counter family of one unlabelled series, absent where nothing was measured.
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: Option<u64>) -> Result<(), std::fmt::Error> {
    let Some(value) = value else { return Ok(()) };
    ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauges(encoder: &mut DescriptorEncoder, name: &str, help: &str, series: &[Series]) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for s in series {
        ConstGauge::new(s.value as i64).encode(family.encode_family(&s.labels)?)?;
    }
    Ok(())
}

/// A histogram family of one series, absent where nothing was measured.
fn histogram_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    histogram_of: Option<&Histogram>,
) -> Result<(), std::fmt::Error> {
    let Some(h) = histogram_of else { return Ok(()) };
    histogram(encoder.encode_descriptor(name, help, None, MetricType::Histogram)?, h)
}

fn function_durations(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), std::fmt::Error> {
    if s.function_durations.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(
        "mm_probe_function_duration_seconds",
        "Entry-to-return time of traced kernel functions (madvise_cold_or_pageout_pte_range and --func).",
        None,
        MetricType::Histogram,
    )?;
    for (function, h, _) in &s.function_durations {
        histogram(family.encode_family(&[("function", function.as_str())])?, h)?;
    }
    let mut family = encoder.encode_descriptor(
        "mm_probe_function_calls_over_threshold",
        "Traced function calls slower than --threshold.",
        None,
        MetricType::Counter,
    )?;
    for (function, _, over) in &s.function_durations {
        ConstCounter::new(*over).encode(family.encode_family(&[("function", function.as_str())])?)?;
    }
    Ok(())
}

/// The encoder takes each bucket's own count and accumulates them itself.
fn histogram(mut metric: prometheus_client::encoding::MetricEncoder, h: &Histogram) -> Result<(), std::fmt::Error> {
    let mut previous = 0;
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|b| {
            let own = b.cumulative - previous;
            previous = b.cumulative;
            (Histogram::le_seconds(b), own)
        })
        .collect();
    metric.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &buckets, None)
}

/// The snapshot in the OpenMetrics text format, `# EOF` included.
pub fn openmetrics(snapshot: Snapshot) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(snapshot)));
    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// OpenMetrics text as the classic text format (0.0.4) reads it. The samples are the same; two
/// things in the metadata differ: a counter family is named without `_total` in OpenMetrics
/// (`# TYPE x counter`, samples `x_total`) and with it in the classic format, whose parser
/// would otherwise see untyped `x_total` samples without help; and `# EOF` ends only OpenMetrics.
pub fn classic(openmetrics: &str) -> String {
    let counters: Vec<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(&name).then(|| format!("{tag}{name}_total {tail}"))
        });
        text.push_str(renamed.as_deref().unwrap_or(line));
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exporter::buckets::Bucket;

    fn snapshot() -> Snapshot {
        let series = |labels: &[(&'static str, &str)], value| Series {
            labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            value,
        };
        Snapshot {
            build_info: vec![series(&[("version", "0.1.0"), ("kernel", "6.18.44")], 1)],
            probe_attached: vec![series(&[("capability", "latency"), ("probe", "sched_wakeup")], 1)],
            lost_events: vec![series(&[("capability", "latency"), ("kind", "recursion_guard")], 0)],
            wakeup_latency: Some(Histogram {
                count: 3,
                sum_seconds: 0.0012,
                buckets: vec![
                    Bucket { le_ns: Some(1_999), cumulative: 1 },
                    Bucket { le_ns: Some(500_000), cumulative: 2 },
                    Bucket { le_ns: None, cumulative: 3 },
                ],
            }),
            wakeups_over_threshold: Some(1),
            kvm_notifier_events: vec![series(&[("event", "unmap_hva_range")], 7)],
            ..Snapshot::default()
        }
    }

    #[test]
    fn openmetrics_has_base_units_cumulative_buckets_and_eof() {
        let text = openmetrics(snapshot()).unwrap();
        assert!(text.contains("# TYPE mm_probe_lost_events counter\n"), "{text}");
        assert!(
            text.contains("mm_probe_lost_events_total{capability=\"latency\",kind=\"recursion_guard\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("mm_probe_wakeup_latency_seconds_bucket{le=\"0.0005\"} 2\n"), "{text}");
        assert!(text.contains("mm_probe_wakeup_latency_seconds_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("mm_probe_wakeup_latency_seconds_count 3\n"), "{text}");
        assert!(text.contains("mm_probe_wakeups_over_threshold_total 1\n"), "{text}");
        assert!(text.contains("mm_probe_build_info{version=\"0.1.0\",kernel=\"6.18.44\"} 1\n"), "{text}");
        assert!(text.contains("# TYPE mm_probe_kvm_mmu_notifier_events counter\n"), "{text}");
        assert!(text.contains("mm_probe_kvm_mmu_notifier_events_total{event=\"unmap_hva_range\"} 7\n"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert!(!text.contains("mm_probe_thp_checks"), "families without series are left out: {text}");
    }

    #[test]
    fn classic_names_counter_families_by_their_samples() {
        let text = classic(&openmetrics(snapshot()).unwrap());
        assert!(text.contains("# TYPE mm_probe_lost_events_total counter\n"), "{text}");
        assert!(text.contains("# HELP mm_probe_lost_events_total Events"), "{text}");
        assert!(text.contains("# TYPE mm_probe_wakeups_over_threshold_total counter\n"), "{text}");
        assert!(text.contains("# TYPE mm_probe_wakeup_latency_seconds histogram\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        let samples = |t: &str| t.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
        assert_eq!(samples(&text), samples(&openmetrics(snapshot()).unwrap()), "only metadata differs");
    }
}
