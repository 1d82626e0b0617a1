//! Rates over a run: one panel per quantity, time on the x axis, each series a line with a
//! marker per sample (a two-second run still shows its points), the health thresholds the
//! verdict judges against as dashed horizontal lines with their labels. A sample without a
//! value (a rate with nothing to divide by) leaves a gap instead of a made-up zero.

use plotters::{
    coord::types::RangedCoordf64,
    element::DashedPathElement,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{
    axis::compact_number,
    error::PlotError,
    style::{
        CAPTION_SIZE, LABEL_SIZE, NOTE_COLOR, NOTE_SIZE, PANEL_HEIGHT, SERIES_COLORS, THRESHOLD_COLOR, TITLE_HEIGHT,
        TITLE_SIZE, WARN_COLOR, WIDTH, font,
    },
};

/// One line: `(seconds since the start, value)` per sample.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, Option<f64>)>,
}

/// A limit drawn across the panel.
#[derive(Clone, Debug)]
pub struct ThresholdLine {
    pub value: f64,
    pub label: String,
    /// CRIT limits are red, WARN limits amber.
    pub crit: bool,
}

#[derive(Clone, Debug)]
pub struct RatePanel {
    pub title: String,
    /// The value axis' text, with its unit.
    pub unit: String,
    pub series: Vec<Series>,
    pub thresholds: Vec<ThresholdLine>,
    /// Why this quantity could not be measured here; written across the empty panel.
    pub unavailable: Option<String>,
}

#[derive(Clone, Debug)]
pub struct RatesPlot {
    pub title: String,
    pub duration_s: f64,
    pub panels: Vec<RatePanel>,
}

/// Room above the highest value or threshold, as a fraction of it, for the legend.
const HEADROOM: f64 = 0.35;
/// A limit more than this many times above both the data and the lowest limit is left off the
/// scale (named beside the highest drawn one): a CRIT line ten times above everything measured
/// would flatten the data against the floor.
const THRESHOLD_REACH: f64 = 3.0;

/// Renders `plot` as an SVG document.
pub fn rates_over_time_svg(plot: &RatesPlot) -> Result<String, PlotError> {
    let panels = plot.panels.len().max(1);
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(&plot.title, font(TITLE_SIZE))?;
        for (area, panel) in body.split_evenly((panels, 1)).iter().zip(&plot.panels) {
            draw_panel(area, panel, plot.duration_s.max(1.0))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// The value axis' top and the limits drawn under it: the lowest limit always, higher ones while
/// they are within reach of the data; those left off are named in the highest drawn one's label.
fn value_axis(panel: &RatePanel) -> (f64, Vec<ThresholdLine>) {
    let values = panel.series.iter().flat_map(|s| s.points.iter().filter_map(|p| p.1));
    let highest_value = values.fold(0.0, f64::max);
    let mut limits = panel.thresholds.clone();
    limits.sort_by(|a, b| a.value.total_cmp(&b.value));
    let lowest_limit = limits.first().map_or(0.0, |t| t.value);
    let reach = highest_value.max(lowest_limit) * THRESHOLD_REACH;
    let off_scale: Vec<String> = limits.iter().skip(1).filter(|t| t.value > reach).map(|t| t.label.clone()).collect();
    limits.retain(|t| t.value == lowest_limit || t.value <= reach);
    if let Some(highest_drawn) = limits.last_mut().filter(|_| !off_scale.is_empty()) {
        highest_drawn.label = format!("{} ({} off the scale)", highest_drawn.label, off_scale.join(", "));
    }
    let highest = limits.iter().map(|t| t.value).fold(highest_value, f64::max);
    let top = if highest > 0.0 { highest * (1.0 + HEADROOM) } else { 1.0 };
    (top, limits)
}

/// The stretches of consecutive samples that have a value.
fn runs(points: &[(f64, Option<f64>)]) -> Vec<Vec<(f64, f64)>> {
    let mut runs = vec![Vec::new()];
    for &(t, value) in points {
        match value {
            Some(v) => runs.last_mut().expect("never empty").push((t, v)),
            None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
            None => {}
        }
    }
    runs.retain(|r| !r.is_empty());
    runs
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &RatePanel,
    duration_s: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let (top, thresholds) = value_axis(panel);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, font(CAPTION_SIZE))
        .margin(10)
        .margin_right(28)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..duration_s, 0.0..top)?;
    // An unobservable quantity with no limits to show has no scale worth numbering.
    let scale_shown = panel.unavailable.is_none() || !panel.thresholds.is_empty();
    chart
        .configure_mesh()
        .x_desc("time since the start (s)")
        .y_desc(panel.unit.as_str())
        .x_labels(12)
        .y_labels(if scale_shown { 6 } else { 0 })
        .max_light_lines(1)
        .x_label_formatter(&|x| compact_number(*x))
        .y_label_formatter(&|y| compact_number(*y))
        .label_style(font(LABEL_SIZE))
        .axis_desc_style(font(LABEL_SIZE))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(242, 242, 242))
        .draw()?;

    draw_thresholds(&mut chart, &thresholds, duration_s)?;
    if let Some(reason) = &panel.unavailable {
        return draw_note(&mut chart, reason, duration_s, top);
    }
    draw_series(&mut chart, &panel.series)?;
    if panel.series.iter().all(|s| s.points.iter().all(|p| p.1.is_none())) {
        draw_note(&mut chart, "no samples", duration_s, top)?;
    }
    Ok(())
}

/// One panel's chart: seconds across, the quantity up.
type PanelChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Dashed limits across the whole run, each labelled above its left end (the legend holds the
/// upper right).
fn draw_thresholds<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    thresholds: &[ThresholdLine],
    duration_s: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    for threshold in thresholds {
        let colour = if threshold.crit { THRESHOLD_COLOR } else { WARN_COLOR };
        let line = [(0.0, threshold.value), (duration_s, threshold.value)];
        chart.draw_series(std::iter::once(DashedPathElement::new(line, 8, 5, colour.stroke_width(2))))?;
        let style = font(LABEL_SIZE).color(&colour).pos(Pos::new(HPos::Left, VPos::Bottom));
        chart.draw_series(std::iter::once(
            EmptyElement::at((0.0, threshold.value)) + Text::new(threshold.label.clone(), (8, -4), style),
        ))?;
    }
    Ok(())
}

/// Each series as lines through its samples (broken where a sample has no value), a marker
/// per sample, and a legend entry.
fn draw_series<'a, DB: DrawingBackend + 'a>(chart: &mut PanelChart<'a, DB>, all: &[Series]) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    for (index, series) in all.iter().enumerate() {
        let colour = SERIES_COLORS[index % SERIES_COLORS.len()];
        for run in runs(&series.points) {
            chart.draw_series(LineSeries::new(run, colour.stroke_width(2)))?;
        }
        let samples = series.points.iter().filter_map(|&(t, v)| Some((t, v?)));
        chart
            .draw_series(samples.map(|point| Circle::new(point, 3, colour.filled())))?
            .label(series.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(3)));
    }
    if !all.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(font(LABEL_SIZE))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(190, 190, 190))
            .draw()?;
    }
    Ok(())
}

/// A sentence across the middle of an empty panel.
fn draw_note<DB: DrawingBackend>(
    chart: &mut PanelChart<'_, DB>,
    note: &str,
    duration_s: f64,
    top: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let style = font(NOTE_SIZE).color(&NOTE_COLOR).pos(Pos::new(HPos::Center, VPos::Center));
    chart.draw_series(std::iter::once(Text::new(note.to_string(), (duration_s / 2.0, top / 2.0), style)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::plot::check;

    fn storm() -> RatesPlot {
        let seconds = |f: fn(f64) -> Option<f64>| (0..8).map(|i| (f64::from(i) + 0.5, f(f64::from(i)))).collect();
        RatesPlot {
            title: "mm-probe retry-storm on 6.12.0, 8 s".into(),
            duration_s: 8.0,
            panels: vec![
                RatePanel {
                    title: "retry rate".into(),
                    unit: "%".into(),
                    series: vec![
                        Series {
                            name: "-EBUSY ÷ invalidations".into(),
                            points: seconds(|t| (t > 0.0).then_some(20.0 + t)),
                        },
                        Series { name: "-EBUSY ÷ walks".into(), points: seconds(|t| Some(80.0 - t)) },
                    ],
                    thresholds: vec![
                        ThresholdLine { value: 5.0, label: "WARN 5 %".into(), crit: false },
                        ThresholdLine { value: 15.0, label: "CRIT 15 %".into(), crit: true },
                    ],
                    unavailable: None,
                },
                RatePanel {
                    title: "invalidations of mirrored memory".into(),
                    unit: "per second".into(),
                    series: vec![Series {
                        name: "invalidations/s".into(),
                        points: seconds(|t| Some(15000.0 + 100.0 * t)),
                    }],
                    thresholds: vec![ThresholdLine { value: 10000.0, label: "CRIT 10k/s".into(), crit: true }],
                    unavailable: None,
                },
            ],
        }
    }

    #[test]
    fn rates_render_with_series_thresholds_and_labels() {
        let svg = rates_over_time_svg(&storm()).unwrap();
        let pixmap = check::render("rates-storm", &svg);
        assert_eq!(pixmap.height(), TITLE_HEIGHT + 2 * PANEL_HEIGHT);
        assert!(check::inked_pixels(&pixmap) > 10_000);
        for colour in [SERIES_COLORS[0], SERIES_COLORS[1], THRESHOLD_COLOR, WARN_COLOR] {
            assert!(check::has_color(&pixmap, colour), "{colour:?} not drawn");
        }
        for text in ["WARN 5 %", "CRIT 15 %", "CRIT 10k/s", "-EBUSY ÷ walks", "time since the start (s)", "per second"]
        {
            assert!(svg.contains(text), "{text} missing");
        }
    }

    #[test]
    fn an_unobservable_quantity_says_why_instead_of_drawing_zeros() {
        let mut plot = storm();
        plot.panels[0].series.iter_mut().for_each(|s| s.points.iter_mut().for_each(|p| p.1 = None));
        plot.panels[0].unavailable = Some("hmm_range_fault is not observable on this kernel".into());
        let svg = rates_over_time_svg(&plot).unwrap();
        assert!(check::inked_pixels(&check::render("rates-unobservable", &svg)) > 0);
        assert!(svg.contains("hmm_range_fault is not observable on this kernel"));
        assert!(svg.contains("CRIT 15 %"), "the limits are still shown");
        assert!(!svg.contains("-EBUSY ÷ walks"), "no legend for lines that cannot exist");
    }

    #[test]
    fn gaps_split_lines_and_the_axis_holds_the_thresholds() {
        let points = [(0.5, Some(1.0)), (1.5, None), (2.5, Some(2.0)), (3.5, Some(3.0)), (4.5, None)];
        assert_eq!(runs(&points), vec![vec![(0.5, 1.0)], vec![(2.5, 2.0), (3.5, 3.0)]]);
        let plot = storm();
        let (top, limits) = value_axis(&plot.panels[0]);
        assert!(top > 79.0, "the highest value fits");
        assert_eq!(limits.len(), 2, "WARN 5 % and CRIT 15 % are both within reach");
        let (top, limits) = value_axis(&plot.panels[1]);
        assert!(top > 15_000.0 && limits.len() == 1, "a storm above the CRIT line shows both");
    }

    #[test]
    fn a_limit_far_above_the_data_is_named_not_drawn() {
        let mut quiet = storm().panels[1].clone();
        quiet.series[0].points = vec![(0.5, Some(700.0)), (1.5, Some(300.0))];
        quiet.thresholds.insert(0, ThresholdLine { value: 1000.0, label: "WARN 1k/s".into(), crit: false });
        let (top, limits) = value_axis(&quiet);
        assert!((1000.0..2000.0).contains(&top), "{top}: the data and the WARN line fill the panel");
        let labels: Vec<&str> = limits.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["WARN 1k/s (CRIT 10k/s off the scale)"]);
        let svg =
            rates_over_time_svg(&RatesPlot { title: "quiet".into(), duration_s: 2.0, panels: vec![quiet] }).unwrap();
        assert!(check::texts(&svg).iter().any(|t| t == "WARN 1k/s (CRIT 10k/s off the scale)"));
        check::render("rates-quiet", &svg);
    }
}
