//! `--plot FILE.svg`: pictures of what a run measured, drawn with plotters' SVG backend from
//! plain data (no eBPF), so every figure is unit-testable and the binary needs no font or
//! system library: the SVG names a generic font family and the viewer draws the text.
//!
//! [`histogram_svg`] draws latency distributions on a log2 axis, one panel per quantity, with
//! its threshold marked; [`rates_over_time_svg`] draws rates over time against the health
//! thresholds; [`PlotFile`] checks the target before a run starts and writes it at the end.

mod axis;
mod file;
mod histogram;
mod rates;
mod style;

use plotters::drawing::DrawingAreaErrorKind;

pub use file::PlotFile;
pub use histogram::{Bar, HistogramPanel, HistogramPlot, Threshold, histogram_svg};
pub use plotters::style::RGBColor;
pub use rates::{RatePanel, RatesPlot, Series, ThresholdLine, rates_over_time_svg};
pub use style::{BAR_COLOR, OVER_THRESHOLD_COLOR, SERIES_COLORS, THRESHOLD_COLOR, WARN_COLOR};

/// Drawing failed (plotters reports backend errors as text; nothing here is the user's doing).
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot: {0}")]
pub struct PlotError(String);

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(error: DrawingAreaErrorKind<E>) -> Self {
        Self(error.to_string())
    }
}

/// A number for an axis tick or a label, short and in one style along an axis: `0.5`, `12`,
/// `500`, `1k`, `1.5k`, `16.4k`, `3M`.
pub fn compact_number(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = match magnitude {
        m if m >= 1e6 => (value / 1e6, "M"),
        m if m >= 1e3 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let digits = if scaled.abs() >= 100.0 || scaled.fract() == 0.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{scaled:.digits$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text };
    text + suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_compact_and_exact_where_it_matters() {
        assert_eq!(compact_number(0.0), "0");
        assert_eq!(compact_number(0.5), "0.5");
        assert_eq!(compact_number(2.25), "2.25");
        assert_eq!(compact_number(15.0), "15");
        assert_eq!(compact_number(12.34), "12.3");
        assert_eq!(compact_number(500.0), "500");
        assert_eq!(compact_number(1000.0), "1k");
        assert_eq!(compact_number(1500.0), "1.5k");
        assert_eq!(compact_number(16384.0), "16.4k");
        assert_eq!(compact_number(20000.0), "20k");
        assert_eq!(compact_number(3_000_000.0), "3M");
    }
}

/// Parsing and rasterizing, for the tests of every figure.
#[cfg(test)]
pub(crate) mod check {
    use resvg::{tiny_skia::Pixmap, usvg};

    /// Parses `svg` as real viewers do (a malformed document fails here) and rasterizes it.
    /// With MM_PROBE_KEEP_PLOTS=DIR the figure is also kept there as `<name>.svg`, for a person
    /// to look at.
    pub fn render(name: &str, svg: &str) -> Pixmap {
        // No fonts are loaded: text is not rasterized, and no check depends on the machine's fonts.
        let tree = usvg::Tree::from_str(svg, &usvg::Options::default())
            .unwrap_or_else(|e| panic!("not a well-formed SVG ({e}):\n{svg}"));
        let size = tree.size().to_int_size();
        let mut pixmap = Pixmap::new(size.width(), size.height()).expect("a non-empty canvas");
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        if let Some(dir) = std::env::var_os("MM_PROBE_KEEP_PLOTS").map(std::path::PathBuf::from) {
            std::fs::write(dir.join(format!("{name}.svg")), svg).expect("keeping the SVG");
        }
        pixmap
    }

    /// How many pixels are drawn: neither transparent nor white.
    pub fn inked_pixels(pixmap: &Pixmap) -> usize {
        pixmap.pixels().iter().filter(|p| p.alpha() > 0 && (p.red(), p.green(), p.blue()) != (255, 255, 255)).count()
    }

    /// The text of every `<text>` element, trimmed (plotters writes it on lines of its own).
    pub fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                let content = element.split_once('>')?.1.split_once("</text>")?.0;
                Some(content.trim().to_string())
            })
            .collect()
    }

    /// Whether some opaque pixel has exactly `color` (a bar, series or threshold drawn in it).
    pub fn has_color(pixmap: &Pixmap, color: plotters::style::RGBColor) -> bool {
        pixmap
            .pixels()
            .iter()
            .any(|p| p.alpha() == 255 && (p.red(), p.green(), p.blue()) == (color.0, color.1, color.2))
    }
}
