//! `invalidations --plot`: where the time went, as one figure of distributions from the same
//! kernel histograms the summary prints: each timed subscriber's callback (with the limit its
//! mean is judged against) and the most waited-on locks. Drawing is `report::plot`'s; this only
//! assembles the panels.

use super::{
    judge::Thresholds,
    locks::LockRow,
    render::fit_text,
    report::{SubscriberRow, Summary},
};
use crate::{
    collect::Stop,
    report::plot::{Bar, HistogramPanel, HistogramPlot, Threshold},
    units::{format_bytes, format_nanos},
};

/// Panels per kind at most: the figure stays readable, the summary lists the rest.
const MOST_PANELS: usize = 4;

const NOT_OBSERVABLE: &str = "not observable on this kernel (the report says why)";

/// Subscribers' callbacks, slowest first, then contended locks, most waited-on first.
pub fn histogram_plot(kernel: &str, summary: &Summary, stopped_by: Stop, thresholds: &Thresholds) -> HistogramPlot {
    let warn = Threshold {
        us: thresholds.callback_mean_ns.warn / 1e3,
        label: format!("WARN mean {}", format_nanos(thresholds.callback_mean_ns.warn as u64)),
    };
    let mut panels = match (summary.callbacks_observable, summary.subscribers.as_slice()) {
        (false, _) => vec![empty("subscriber callbacks", NOT_OBSERVABLE)],
        (true, []) => vec![empty("subscriber callbacks", "none was called")],
        (true, rows) => rows.iter().take(MOST_PANELS).map(|row| callback_panel(row, &warn)).collect(),
    };
    panels.extend(match (summary.lock_waits_observable, summary.locks.as_slice()) {
        (false, _) => vec![empty("lock contention", NOT_OBSERVABLE)],
        (true, []) => vec![empty("lock contention", "no lock was contended")],
        (true, rows) => rows.iter().take(MOST_PANELS).map(lock_panel).collect(),
    });
    HistogramPlot {
        title: format!(
            "mm-probe invalidations on Linux {kernel}: {:.1} s traced, {} invalidations{}",
            summary.duration_ns as f64 / 1e9,
            summary.invalidations.count.map_or_else(|| "an unknown number of".into(), |c| c.to_string()),
            if stopped_by == Stop::Interrupted { ", stopped by Ctrl-C" } else { "" }
        ),
        panels,
    }
}

fn callback_panel(row: &SubscriberRow, warn: &Threshold) -> HistogramPanel {
    let fit = row.fit.as_ref().map_or_else(String::new, |f| format!("; {}", fit_text(f)));
    HistogramPanel {
        name: format!("{} ({})", row.subscriber, row.callback),
        summary: format!(
            "{} calls of {} on average, mean {}, P99 <= {}, max {}{fit}",
            row.calls,
            format_bytes(row.bytes_per_call as u64),
            format_nanos(row.mean_ns as u64),
            format_nanos(row.p99_le_ns),
            format_nanos(row.max_ns)
        ),
        value_axis: "callback time, entry to return (µs, log2 scale)".into(),
        bars: Bar::from_log2_ns(&row.buckets),
        threshold: Some(warn.clone()),
    }
}

fn lock_panel(lock: &LockRow) -> HistogramPanel {
    HistogramPanel {
        name: lock.name.clone(),
        summary: format!(
            "{} contended ({}), {} waited, max {}",
            lock.contended,
            lock.kind,
            format_nanos(lock.wait_ns),
            format_nanos(lock.max_ns)
        ),
        value_axis: "wait per contended acquisition (µs, log2 scale)".into(),
        bars: Bar::from_log2_ns(&lock.buckets),
        threshold: None,
    }
}

/// A panel that says why it has no bars, rather than drawing nothing as if nothing happened.
fn empty(name: &str, why: &str) -> HistogramPanel {
    HistogramPanel {
        name: name.into(),
        summary: why.into(),
        value_axis: "µs, log2 scale".into(),
        bars: Vec::new(),
        threshold: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invalidations::judge::{Fit, tests::thresholds};

    fn buckets(filled: &[(usize, u64)]) -> Vec<u64> {
        let mut buckets = vec![0u64; 32];
        for &(bucket, count) in filled {
            buckets[bucket] = count;
        }
        buckets
    }

    fn mirror() -> SubscriberRow {
        SubscriberRow {
            subscriber: "hmm_mirror".into(),
            callback: "mirror_invalidate".into(),
            module: Some("hmm_mirror".into()),
            calls: 300,
            mean_ns: 120_000.0,
            max_ns: 400_000,
            p50_le_ns: 131_071,
            p99_le_ns: 262_143,
            bytes_per_call: 1_050_000.0,
            lock_wait_ns: Some(0),
            nonblocking: 0,
            refused: 0,
            buckets: buckets(&[(16, 100), (17, 190), (18, 10)]),
            fit: Some(Fit {
                fixed_ns: 100_000.0,
                per_page_ns: 40.0,
                amplification: 480.0,
                smallest_bytes: 4096,
                largest_bytes: 2 << 20,
                size_classes: 2,
                smallest_time_share: 0.5,
            }),
        }
    }

    fn mmu_lock() -> LockRow {
        LockRow {
            address: "0xffff8880".into(),
            name: "kvm->mmu_lock of VM pid 4242".into(),
            class: "kvm_mmu_lock",
            relation: "vm_lock",
            owner_tgid: Some(4242),
            kind: "rwlock write",
            contended: 9000,
            wait_ns: 45_000_000,
            max_ns: 80_000,
            buckets: buckets(&[(11, 6000), (13, 3000)]),
            paths: Vec::new(),
            by_cause: Vec::new(),
        }
    }

    fn summary(subscribers: Vec<SubscriberRow>, locks: Vec<LockRow>) -> Summary {
        Summary {
            duration_ns: 12_340_000_000,
            invalidations: crate::invalidations::report::Invalidations { count: Some(0), ..Default::default() },
            subscribers,
            locks,
            callbacks_observable: true,
            lock_waits_observable: true,
            ..Summary::default()
        }
    }

    #[test]
    fn each_subscriber_and_each_lock_gets_a_panel_and_only_callbacks_are_judged() {
        let figure =
            histogram_plot("6.12.0", &summary(vec![mirror()], vec![mmu_lock()]), Stop::TargetExited, &thresholds());
        assert_eq!(figure.title, "mm-probe invalidations on Linux 6.12.0: 12.3 s traced, 0 invalidations");
        let [callback, lock] = figure.panels.as_slice() else { panic!("two panels: {:?}", figure.panels) };
        assert_eq!(callback.name, "hmm_mirror (mirror_invalidate)");
        assert_eq!(callback.threshold, Some(Threshold { us: 50.0, label: "WARN mean 50µs".into() }));
        assert!(callback.summary.contains("300 calls") && callback.summary.contains("480x"), "{}", callback.summary);
        assert_eq!(callback.bars.iter().map(|b| b.count).sum::<u64>(), 300, "every call in a bar");
        assert_eq!(lock.name, "kvm->mmu_lock of VM pid 4242");
        assert_eq!(lock.threshold, None, "a wait is judged per invalidation, not per acquisition");
        assert_eq!(lock.bars.iter().map(|b| b.count).sum::<u64>(), 9000);
        histogram_svg_renders(&figure);
    }

    #[test]
    fn what_this_kernel_cannot_see_is_said_not_drawn_as_nothing() {
        let blind = Summary { callbacks_observable: false, ..summary(Vec::new(), Vec::new()) };
        let figure = histogram_plot("6.18.0", &blind, Stop::Interrupted, &thresholds());
        assert!(figure.title.ends_with(", stopped by Ctrl-C"), "{}", figure.title);
        let summaries: Vec<&str> = figure.panels.iter().map(|p| p.summary.as_str()).collect();
        assert_eq!(summaries, [NOT_OBSERVABLE, "no lock was contended"]);
        histogram_svg_renders(&figure);
    }

    fn histogram_svg_renders(figure: &HistogramPlot) {
        let svg = crate::report::plot::histogram_svg(figure).expect("drawn");
        for panel in &figure.panels {
            assert!(svg.contains(&panel.name.replace('>', "&gt;")), "{} missing", panel.name);
        }
    }
}
