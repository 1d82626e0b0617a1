//! `latency --plot`: the run's distributions as one figure, from the same kernel histograms the
//! summary prints. Drawing is `report::plot`'s; this only assembles the data.

use super::{
    aggregator::{Distribution, slot_bounds_us},
    report::{Quantity, Summary},
};
use crate::{
    report::plot::{Bar, HistogramPanel, HistogramPlot, Threshold},
    units::format_nanos,
};

/// The wakeup distribution, then one panel per attached function.
pub fn histogram_plot(
    kernel: &str,
    summary: &Summary,
    wakeups: &Distribution,
    functions: &[(String, Distribution)],
) -> HistogramPlot {
    let threshold = summary.threshold_ns;
    let mut panels = vec![panel("wakeup latency", "wakeups", "wakeup latency", &summary.wakeup, wakeups, threshold)];
    for ((name, distribution), quantity) in functions.iter().zip(&summary.functions) {
        panels.push(panel(name, "calls", "call duration, entry to return", quantity, distribution, threshold));
    }
    HistogramPlot {
        title: format!(
            "mm-probe latency on Linux {kernel}: {:.1} s traced{}",
            summary.duration_ns as f64 / 1e9,
            if summary.stopped_by == "interrupted" { ", stopped by Ctrl-C" } else { "" }
        ),
        panels,
    }
}

fn panel(
    name: &str,
    counted: &str,
    measured: &str,
    quantity: &Quantity,
    distribution: &Distribution,
    threshold_ns: u64,
) -> HistogramPanel {
    let threshold = format_nanos(threshold_ns);
    let p = &quantity.percentiles;
    let summary = if p.count == 0 {
        format!("no {counted}")
    } else {
        format!(
            "{} {counted}, P50 {}, P99 {}, max {}, {} over {threshold}",
            p.count,
            format_nanos(p.p50_ns),
            format_nanos(p.p99_ns),
            format_nanos(p.max_ns),
            quantity.over_threshold
        )
    };
    HistogramPanel {
        name: name.to_string(),
        summary,
        value_axis: format!("{measured} (µs, log2 scale)"),
        bars: bars(distribution),
        threshold: Some(Threshold { us: threshold_ns as f64 / 1e3, label: format!("threshold {threshold}") }),
    }
}

/// The kernel's log-linear slots, each with the microseconds it holds.
fn bars(distribution: &Distribution) -> Vec<Bar> {
    let filled = distribution.slots.iter().enumerate().filter(|&(_, &count)| count > 0);
    filled
        .map(|(slot, &count)| {
            let (low_us, high_us) = slot_bounds_us(slot);
            Bar { low_us, high_us, count }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::latency::judge::{Judgement, Verdict};
    use mm_probe_common::latency::hist_slot;

    fn distribution(values_us: &[u64]) -> Distribution {
        let mut d = Distribution::default();
        for &v in values_us {
            let log2 = if v == 0 { 0 } else { 63 - v.leading_zeros() };
            d.slots[hist_slot(v, log2)] += 1;
            d.count += 1;
            d.sum_ns += v * 1000;
            d.max_ns = d.max_ns.max(Some(v * 1000));
            d.over_threshold += u64::from(v > 500);
        }
        d
    }

    fn summary(wakeups: &Distribution, functions: &[(String, Distribution)]) -> Summary {
        Summary {
            duration_ns: 12_300_000_000,
            stopped_by: "interrupted",
            threshold_ns: 500_000,
            wakeup: Quantity::new("wakeup", wakeups, 500_000, true),
            functions: functions.iter().map(|(n, d)| Quantity::new(n, d, 500_000, true)).collect(),
            tasks: Vec::new(),
            wakeup_spikes: 0,
            function_spikes: 0,
            function_attribution: super::super::attach::Availability { available: true, reason: None },
            judgement: Judgement {
                verdict: Verdict::default(),
                spike_causes: Vec::new(),
                call_bound: None,
                sampled_places: Vec::new(),
            },
        }
    }

    #[test]
    fn the_figure_holds_every_wakeup_and_a_panel_per_function() {
        let wakeups = distribution(&[0, 3, 3, 20, 21, 700, 1953]);
        let walk = ("madvise_cold_or_pageout_pte_range".to_string(), distribution(&[40, 900]));
        let functions = std::slice::from_ref(&walk);
        let plot = histogram_plot("6.18.0", &summary(&wakeups, functions), &wakeups, functions);
        assert_eq!(plot.title, "mm-probe latency on Linux 6.18.0: 12.3 s traced, stopped by Ctrl-C");
        let every =
            plot.panels.iter().all(|p| p.threshold == Some(Threshold { us: 500.0, label: "threshold 500µs".into() }));
        assert!(every, "each panel is judged against the threshold");
        assert_eq!(plot.panels.len(), 2);
        let counted: u64 = plot.panels[0].bars.iter().map(|b| b.count).sum();
        assert_eq!(counted, 7, "every wakeup is in a bar");
        assert!(
            plot.panels[0].bars.contains(&Bar { low_us: 1920, high_us: 2047, count: 1 }),
            "{:?}",
            plot.panels[0].bars
        );
        assert!(plot.panels[0].summary.starts_with("7 wakeups, P50 "), "{}", plot.panels[0].summary);
        assert!(plot.panels[0].summary.ends_with("2 over 500µs"), "{}", plot.panels[0].summary);
        assert_eq!(plot.panels[1].name, "madvise_cold_or_pageout_pte_range");
        assert!(plot.panels[1].value_axis.starts_with("call duration"));
    }
}
