//! Latency distributions: one panel per measured quantity, values on a log2 axis (the kernel's
//! buckets are powers of two, so every bucket edge falls on a tick), counts on a log10 axis (a
//! handful of spikes must stay visible beside thousands of fast wakeups), a panel's threshold
//! (when its quantity has one) as a dashed vertical line with its label, and bars over it in a
//! second colour.

use plotters::{
    element::DashedPathElement,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{
    axis::{TickedAxis, compact_number},
    error::PlotError,
    style::{
        BAR_COLOR, CAPTION_SIZE, LABEL_SIZE, NOTE_COLOR, NOTE_SIZE, OVER_THRESHOLD_COLOR, PANEL_HEIGHT,
        THRESHOLD_COLOR, TITLE_HEIGHT, TITLE_SIZE, WIDTH, font,
    },
};

/// `count` values within `[low_us, high_us]` (the inclusive bounds of one kernel slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    pub low_us: u64,
    pub high_us: u64,
    pub count: u64,
}

impl Bar {
    /// Bars of a histogram in log2 buckets of nanoseconds (bucket b holds [2^b, 2^(b+1)) ns), in
    /// whole microseconds: everything below 1 µs in one bar, each bar ending where the next
    /// begins so that none overlap.
    pub fn from_log2_ns(buckets: &[u64]) -> Vec<Bar> {
        let low_us = |bucket: usize| (1u64 << bucket.min(63)) / 1000;
        let mut bars: Vec<Bar> = Vec::new();
        for (bucket, &count) in buckets.iter().enumerate().filter(|&(_, &count)| count > 0) {
            let (low, next) = (low_us(bucket), low_us(bucket + 1));
            let high = if next > low { next - 1 } else { low };
            match bars.last_mut() {
                Some(last) if last.low_us == low => last.count += count,
                _ => bars.push(Bar { low_us: low, high_us: high, count }),
            }
        }
        bars
    }
}

/// A limit drawn across a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub us: f64,
    /// Written beside the line (`threshold 500µs`).
    pub label: String,
}

/// One measured quantity.
#[derive(Clone, Debug)]
pub struct HistogramPanel {
    /// What was measured: `wakeup latency`, or a traced function's name.
    pub name: String,
    /// Its numbers in one line (count, percentiles, how many over the threshold).
    pub summary: String,
    /// The value axis' text, with its unit.
    pub value_axis: String,
    pub bars: Vec<Bar>,
    /// The limit its values are judged against, if any.
    pub threshold: Option<Threshold>,
}

#[derive(Clone, Debug)]
pub struct HistogramPlot {
    pub title: String,
    pub panels: Vec<HistogramPanel>,
}

/// Where a bar starts on the value axis when its lower bound is 0: half a microsecond, so that
/// the kernel's "below 1 µs" slot gets the same width as the [1, 2) one.
const ZERO_US_DRAWN_AT: f64 = 0.5;
/// Bottom of the count axis, below log10(1) = 0, so that a bar of one count has a height.
const COUNT_AXIS_FLOOR: f64 = -0.3;
/// Room above the tallest bar for the threshold label, in decades.
const COUNT_AXIS_HEADROOM: f64 = 0.6;
/// More value-axis ticks than this are labelled every other one (labels would touch).
const MAX_VALUE_LABELS: usize = 16;

/// Renders `plot` as an SVG document.
pub fn histogram_svg(plot: &HistogramPlot) -> Result<String, PlotError> {
    let panels = plot.panels.len().max(1);
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels as u32;
    let axis = ValueAxis::covering(plot);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(&plot.title, font(TITLE_SIZE))?;
        for (area, panel) in body.split_evenly((panels, 1)).iter().zip(&plot.panels) {
            draw_panel(area, panel, &axis)?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Position of a value on the log2 axis.
fn log2_position(value_us: f64) -> f64 {
    value_us.max(ZERO_US_DRAWN_AT).log2()
}

/// The value axis every panel shares, so that panels compare at a glance: whole powers of two
/// from below the first bucket to past the last one, and every threshold inside.
struct ValueAxis {
    from: i32,
    to: i32,
}

impl ValueAxis {
    fn covering(plot: &HistogramPlot) -> Self {
        let thresholds: Vec<f64> =
            plot.panels.iter().filter_map(|p| p.threshold.as_ref()).map(|t| log2_position(t.us)).collect();
        let (low, high) = thresholds.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &t| (l.min(t), h.max(t)));
        // Without any threshold, 1 ms is where an axis of nothing measured is centred.
        let (low, high) = if thresholds.is_empty() { (10.0, 10.0) } else { (low, high) };
        let bars = plot.panels.iter().flat_map(|p| &p.bars).filter(|b| b.count > 0);
        let (mut from, mut to) = (low.floor() - 1.0, high.ceil() + 1.0);
        let mut any = false;
        for bar in bars {
            any = true;
            let (start, end) = bar_extent(bar);
            from = from.min(start.floor());
            // A quarter column at least between the last bar and the frame.
            to = to.max((end + 0.25).ceil());
        }
        if !any {
            // Nothing measured: show the neighbourhood of the thresholds rather than one column.
            from = low.floor() - 4.0;
            to = high.ceil() + 2.0;
        }
        let lowest = log2_position(0.0) as i32;
        Self { from: (from as i32).max(lowest), to: to as i32 }
    }

    fn range(&self) -> std::ops::Range<f64> {
        f64::from(self.from)..f64::from(self.to)
    }

    /// Labelled ticks: every power of two, or every other one when they would crowd.
    fn labelled(&self) -> Vec<f64> {
        let count = (self.to - self.from + 1) as usize;
        let step = count.div_ceil(MAX_VALUE_LABELS);
        (self.from..=self.to).step_by(step).map(f64::from).collect()
    }

    /// Grid lines: every power of two.
    fn grid(&self) -> Vec<f64> {
        (self.from..=self.to).map(f64::from).collect()
    }
}

/// Left and right edge of a bar on the log2 axis: `[low, high + 1)`, the values it holds.
fn bar_extent(bar: &Bar) -> (f64, f64) {
    (log2_position(bar.low_us as f64), log2_position(bar.high_us as f64 + 1.0))
}

/// A tick of the value axis in microseconds: `0` at the left edge of the below-1-µs slot.
fn value_label(position: f64) -> String {
    if position < 0.0 { "0".into() } else { format!("{}", position.exp2().round() as u64) }
}

/// The count axis of one panel: decades from 1 to above its tallest bar.
struct CountAxis {
    top: f64,
}

impl CountAxis {
    fn for_bars(bars: &[Bar]) -> Self {
        let peak = bars.iter().map(|b| b.count).max().unwrap_or(1).max(1) as f64;
        Self { top: (peak.log10() + COUNT_AXIS_HEADROOM).max(1.0) }
    }

    fn range(&self) -> std::ops::Range<f64> {
        COUNT_AXIS_FLOOR..self.top
    }

    fn decades(&self) -> Vec<f64> {
        (0..=self.top.floor() as i32).map(f64::from).collect()
    }

    /// Grid lines at 1, 2 and 5 of every decade.
    fn grid(&self) -> Vec<f64> {
        let steps = [1.0f64, 2.0, 5.0].map(f64::log10);
        self.decades().iter().flat_map(|d| steps.map(|s| d + s)).filter(|y| *y < self.top).collect()
    }
}

fn count_label(position: f64) -> String {
    compact_number(10f64.powf(position).round())
}

fn bar_height(count: u64) -> f64 {
    (count as f64).log10()
}

/// One panel's chart: the shared value axis across, its own count axis up.
type PanelChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<TickedAxis, TickedAxis>>;

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &HistogramPanel,
    axis: &ValueAxis,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let counts = CountAxis::for_bars(&panel.bars);
    let caption =
        if panel.summary.is_empty() { panel.name.clone() } else { format!("{}: {}", panel.name, panel.summary) };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, font(CAPTION_SIZE))
        .margin(10)
        .margin_right(28)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(
            TickedAxis::new(axis.range(), axis.labelled(), axis.grid()),
            TickedAxis::new(counts.range(), counts.decades(), counts.grid()),
        )?;
    chart
        .configure_mesh()
        .x_desc(panel.value_axis.as_str())
        .y_desc("count (log scale)")
        .x_label_formatter(&|x| value_label(*x))
        .y_label_formatter(&|y| count_label(*y))
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(LABEL_SIZE))
        .bold_line_style(RGBColor(205, 205, 205))
        .light_line_style(RGBColor(236, 236, 236))
        .draw()?;
    let threshold_us = panel.threshold.as_ref().map_or(f64::INFINITY, |t| t.us);
    draw_bars(&mut chart, &panel.bars, threshold_us)?;
    if let Some(threshold) = &panel.threshold {
        draw_threshold(&mut chart, threshold, axis, &counts)?;
    }
    if panel.bars.iter().all(|b| b.count == 0) {
        let middle = ((axis.range().start + axis.range().end) / 2.0, (COUNT_AXIS_FLOOR + counts.top) / 2.0);
        let style = font(NOTE_SIZE).color(&NOTE_COLOR).pos(Pos::new(HPos::Center, VPos::Center));
        chart.draw_series(std::iter::once(Text::new("no samples", middle, style)))?;
    }
    Ok(())
}

/// Bars from the floor of the count axis; those that start at or above the threshold stand out.
fn draw_bars<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    bars: &[Bar],
    threshold_us: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let filled = bars.iter().filter(|b| b.count > 0);
    chart.draw_series(filled.flat_map(|bar| {
        let (start, end) = bar_extent(bar);
        let corners = [(start, COUNT_AXIS_FLOOR), (end, bar_height(bar.count))];
        let colour = if bar.low_us as f64 >= threshold_us { OVER_THRESHOLD_COLOR } else { BAR_COLOR };
        // The white outline keeps neighbouring slots apart where their heights match.
        [Rectangle::new(corners, colour.filled()), Rectangle::new(corners, WHITE.stroke_width(1))]
    }))?;
    Ok(())
}

/// The dashed threshold line, labelled at its top on the side with more room.
fn draw_threshold<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    threshold: &Threshold,
    axis: &ValueAxis,
    counts: &CountAxis,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let label = threshold.label.clone();
    let threshold = log2_position(threshold.us);
    let line = [(threshold, COUNT_AXIS_FLOOR), (threshold, counts.top)];
    chart.draw_series(std::iter::once(DashedPathElement::new(line, 8, 5, THRESHOLD_COLOR.stroke_width(2))))?;
    let room_on_the_right = (threshold - f64::from(axis.from)) / f64::from(axis.to - axis.from) < 0.65;
    let (offset, anchor) = if room_on_the_right { (8, HPos::Left) } else { (-8, HPos::Right) };
    let style = font(LABEL_SIZE).color(&THRESHOLD_COLOR).pos(Pos::new(anchor, VPos::Top));
    chart.draw_series(std::iter::once(
        EmptyElement::at((threshold, counts.top)) + Text::new(label, (offset, 6), style),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::plot::check;

    fn bar(low_us: u64, high_us: u64, count: u64) -> Bar {
        Bar { low_us, high_us, count }
    }

    fn plot(panels: Vec<HistogramPanel>) -> HistogramPlot {
        HistogramPlot { title: "mm-probe latency on 6.18.0, 10 s traced".into(), panels }
    }

    fn threshold() -> Option<Threshold> {
        Some(Threshold { us: 500.0, label: "threshold 500µs".into() })
    }

    fn wakeups() -> HistogramPanel {
        HistogramPanel {
            name: "wakeup latency".into(),
            summary: "12000 wakeups, P99 40µs, 3 over 500µs".into(),
            value_axis: "latency (µs, log2 scale)".into(),
            bars: vec![bar(0, 0, 10), bar(3, 3, 4000), bar(4, 4, 6000), bar(40, 47, 1990), bar(1920, 2047, 3)],
            threshold: threshold(),
        }
    }

    #[test]
    fn a_histogram_renders_with_its_threshold_labels_and_both_bar_colours() {
        let svg = histogram_svg(&plot(vec![wakeups()])).unwrap();
        let pixmap = check::render("histogram-wakeups", &svg);
        assert_eq!((pixmap.width(), pixmap.height()), (WIDTH, TITLE_HEIGHT + PANEL_HEIGHT));
        assert!(check::inked_pixels(&pixmap) > 10_000, "a figure, not a blank page");
        assert!(check::has_color(&pixmap, BAR_COLOR) && check::has_color(&pixmap, OVER_THRESHOLD_COLOR));
        assert!(check::has_color(&pixmap, THRESHOLD_COLOR), "the threshold line is drawn");
        for text in
            ["threshold 500µs", "wakeup latency: 12000 wakeups", "latency (µs, log2 scale)", "count (log scale)"]
        {
            assert!(svg.contains(text), "{text} missing");
        }
        let texts = check::texts(&svg);
        for tick in ["1", "10", "1k", "10k", "0", "512", "2048"] {
            assert!(texts.iter().any(|t| t == tick), "no tick {tick} in {texts:?}");
        }
    }

    #[test]
    fn one_panel_per_quantity_and_an_empty_one_says_so() {
        let idle = HistogramPanel {
            name: "madvise_cold_or_pageout_pte_range".into(),
            summary: String::new(),
            value_axis: "call duration (µs, log2 scale)".into(),
            bars: vec![],
            threshold: threshold(),
        };
        let svg = histogram_svg(&plot(vec![wakeups(), idle])).unwrap();
        let pixmap = check::render("histogram-two-panels", &svg);
        assert_eq!(pixmap.height(), TITLE_HEIGHT + 2 * PANEL_HEIGHT);
        assert!(svg.contains("madvise_cold_or_pageout_pte_range") && svg.contains("no samples"));
        assert_eq!(svg.matches("threshold 500µs").count(), 2, "every panel marks the threshold");
    }

    #[test]
    fn the_value_axis_holds_every_bar_and_the_threshold() {
        let axis = ValueAxis::covering(&plot(vec![wakeups()]));
        assert_eq!((axis.from, axis.to), (-1, 12), "0 µs up to 2048 µs, and a column of room");
        assert_eq!(value_label(-1.0), "0");
        assert_eq!(value_label(10.0), "1024");
        let nothing = ValueAxis::covering(&plot(vec![HistogramPanel { bars: vec![], ..wakeups() }]));
        assert!(nothing.from <= 4 && nothing.to >= 10, "around 500 µs: {}..{}", nothing.from, nothing.to);
        let wide = ValueAxis { from: -1, to: 30 };
        assert!(wide.labelled().len() <= MAX_VALUE_LABELS, "{:?}", wide.labelled());
    }

    #[test]
    fn a_panel_without_a_threshold_draws_no_line_and_one_colour() {
        let waits = HistogramPanel { name: "kvm->mmu_lock".into(), threshold: None, ..wakeups() };
        let svg = histogram_svg(&plot(vec![waits])).unwrap();
        let pixmap = check::render("histogram-no-threshold", &svg);
        assert!(check::has_color(&pixmap, BAR_COLOR));
        assert!(!check::has_color(&pixmap, OVER_THRESHOLD_COLOR) && !check::has_color(&pixmap, THRESHOLD_COLOR));
        assert!(!svg.contains("threshold 500µs"));
    }

    #[test]
    fn nanosecond_log2_buckets_become_whole_microsecond_bars_that_do_not_overlap() {
        let mut buckets = vec![0u64; 32];
        buckets[3] = 5; // 8-15 ns
        buckets[9] = 2; // 512-1023 ns: the same bar, below 1 µs
        buckets[11] = 7; // 2048-4095 ns
        buckets[12] = 1;
        buckets[20] = 4; // 1.05-2.1 ms
        let bars = Bar::from_log2_ns(&buckets);
        assert_eq!(bars, [bar(0, 0, 7), bar(2, 3, 7), bar(4, 7, 1), bar(1048, 2096, 4)]);
        assert_eq!(bars.iter().map(|b| b.count).sum::<u64>(), 19, "every value in a bar");
    }

    #[test]
    fn counts_are_drawn_on_decades() {
        let axis = CountAxis::for_bars(&[bar(1, 1, 6000)]);
        assert_eq!(axis.decades(), [0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(count_label(2.0), "100");
        assert_eq!(count_label(3.0), "1k");
        assert_eq!(count_label(4.0), "10k");
        assert!(bar_height(1) > COUNT_AXIS_FLOOR, "a single count has a visible bar");
    }
}
