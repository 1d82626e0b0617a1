//! `retry-storm --plot`: the run's rates over time against the limits the verdict uses. Drawing
//! is `report::plot`'s; this only turns rate samples into series.

use super::{
    judge::{Band, Thresholds},
    rates::{per_second, ratio},
    report::Observability,
    timeline::RateSample,
};
use crate::{
    collect::Stop,
    report::plot::{RatePanel, RatesPlot, Series, ThresholdLine, compact_number},
};

/// What the figure says about the run as a whole.
pub struct RunFacts<'a> {
    pub kernel: &'a str,
    pub duration_s: f64,
    pub stopped_by: Stop,
}

/// -EBUSY returns, retry rate (both definitions) and invalidations, one panel each.
pub fn rates_plot(run: &RunFacts, samples: &[RateSample], thresholds: &Thresholds, seen: &Observability) -> RatesPlot {
    RatesPlot {
        title: format!(
            "mm-probe retry-storm on Linux {}: {:.1} s traced{}",
            run.kernel,
            run.duration_s,
            if run.stopped_by == Stop::Interrupted { ", stopped by Ctrl-C" } else { "" }
        ),
        duration_s: run.duration_s,
        panels: vec![
            returns_panel(samples, seen),
            retry_rate_panel(samples, thresholds, seen),
            invalidations_panel(samples, thresholds, seen),
        ],
    }
}

/// A series valued at the middle of each sample, in seconds.
fn series(name: &str, samples: &[RateSample], value: impl Fn(&RateSample) -> Option<f64>) -> Series {
    let middle_s = |s: &RateSample| (s.start_ns + s.end_ns) as f64 / 2e9;
    Series { name: name.to_string(), points: samples.iter().map(|s| (middle_s(s), value(s))).collect() }
}

/// The WARN and CRIT lines of `band`, its values scaled by `scale` and labelled with `unit`.
fn band_lines(band: &Band, scale: f64, unit: &str) -> Vec<ThresholdLine> {
    let line = |value: f64, level: &str, crit: bool| ThresholdLine {
        value: value * scale,
        label: format!("{level} {}{unit}", compact_number(value * scale)),
        crit,
    };
    vec![line(band.warn, "WARN", false), line(band.crit, "CRIT", true)]
}

const NOT_OBSERVABLE_WALKS: &str = "hmm_range_fault is not observable on this kernel (the report says why)";
const NOT_OBSERVABLE_INVALIDATIONS: &str =
    "invalidations of mirrored memory are not observable on this kernel (the report says why)";

fn returns_panel(samples: &[RateSample], seen: &Observability) -> RatePanel {
    RatePanel {
        title: "hmm_range_fault returns".into(),
        unit: "per second".into(),
        series: vec![
            series("-EBUSY returns/s", samples, |s| per_second(s.ebusy, s.duration_ns())),
            series("all returns/s", samples, |s| per_second(s.walks, s.duration_ns())),
        ],
        thresholds: Vec::new(),
        unavailable: (!seen.walks).then(|| NOT_OBSERVABLE_WALKS.into()),
    }
}

fn retry_rate_panel(samples: &[RateSample], thresholds: &Thresholds, seen: &Observability) -> RatePanel {
    let percent = |fraction: Option<f64>| fraction.map(|f| f * 100.0);
    let per_invalidation =
        |s: &RateSample| if seen.invalidations { percent(ratio(s.ebusy, s.invalidations)) } else { None };
    RatePanel {
        title: "retry rate (the verdict judges -EBUSY ÷ invalidations)".into(),
        unit: "percent".into(),
        series: vec![
            series("-EBUSY ÷ invalidations", samples, per_invalidation),
            series("-EBUSY ÷ hmm_range_fault calls", samples, |s| percent(ratio(s.ebusy, s.walks))),
        ],
        thresholds: band_lines(&thresholds.retry_rate, 100.0, " %"),
        unavailable: (!seen.walks).then(|| NOT_OBSERVABLE_WALKS.into()),
    }
}

fn invalidations_panel(samples: &[RateSample], thresholds: &Thresholds, seen: &Observability) -> RatePanel {
    RatePanel {
        title: "MMU-notifier invalidations of mirrored memory".into(),
        unit: "per second".into(),
        series: vec![series("invalidations/s", samples, |s| per_second(s.invalidations, s.duration_ns()))],
        thresholds: band_lines(&thresholds.invalidate_freq, 1.0, "/s"),
        unavailable: (!seen.invalidations).then(|| NOT_OBSERVABLE_INVALIDATIONS.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn sample(second: u64, walks: u64, ebusy: u64, invalidations: u64) -> RateSample {
        RateSample { start_ns: second * SECOND, end_ns: (second + 1) * SECOND, walks, ebusy, invalidations }
    }

    fn run() -> RunFacts<'static> {
        RunFacts { kernel: "6.12.0", duration_s: 3.0, stopped_by: Stop::Interrupted }
    }

    fn everything() -> Observability {
        Observability { walks: true, read_begins: true, invalidations: true, ..Observability::default() }
    }

    #[test]
    fn rates_are_per_second_and_percent_with_the_verdicts_limits() {
        let samples = [sample(0, 0, 0, 0), sample(1, 200, 170, 1000), sample(2, 100, 0, 0)];
        let plot = rates_plot(&run(), &samples, &Thresholds::default(), &everything());
        assert_eq!(plot.title, "mm-probe retry-storm on Linux 6.12.0: 3.0 s traced, stopped by Ctrl-C");
        let [returns, retry, invalidations] = &plot.panels[..] else { panic!("three panels") };
        assert_eq!(returns.series[0].points, [(0.5, Some(0.0)), (1.5, Some(170.0)), (2.5, Some(0.0))]);
        let per_invalidation: Vec<Option<f64>> = retry.series[0].points.iter().map(|p| p.1).collect();
        assert_eq!(per_invalidation, [None, Some(17.0), None], "no invalidations: no rate, not 0 %");
        assert_eq!(retry.series[1].points[1].1, Some(85.0));
        let limits: Vec<(f64, &str)> = retry.thresholds.iter().map(|t| (t.value, t.label.as_str())).collect();
        assert_eq!(limits, [(5.0, "WARN 5 %"), (15.0, "CRIT 15 %")]);
        let limits: Vec<&str> = invalidations.thresholds.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(limits, ["WARN 1k/s", "CRIT 10k/s"]);
        assert!(plot.panels.iter().all(|p| p.unavailable.is_none()));
    }

    #[test]
    fn what_this_kernel_cannot_show_is_said_on_its_panels() {
        let plot = rates_plot(&run(), &[sample(0, 0, 0, 0)], &Thresholds::default(), &Observability::default());
        assert!(plot.panels.iter().all(|p| p.unavailable.as_deref().is_some_and(|u| u.contains("not observable"))));
    }
}
