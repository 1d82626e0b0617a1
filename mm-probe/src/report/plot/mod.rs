//! `--plot FILE.svg`: pictures of what a run measured, drawn with plotters' SVG backend from
//! plain data (no eBPF), so every figure is unit-testable and the binary needs no font or
//! system library: the SVG names a generic font family and the viewer draws the text.
//!
//! [`histogram_svg`] draws latency distributions on a log2 axis, one panel per quantity, with
//! its threshold marked; [`rates_over_time_svg`] draws rates over time against the health
//! thresholds; [`PlotFile`] checks the target before a run starts and writes it at the end.

mod axis;
mod error;
mod file;
mod histogram;
mod rates;
mod style;

pub use axis::compact_number;
pub use error::PlotError;
pub use file::PlotFile;
pub use histogram::{Bar, HistogramPanel, HistogramPlot, Threshold, histogram_svg};
pub use plotters::style::RGBColor;
pub use rates::{RatePanel, RatesPlot, Series, ThresholdLine, rates_over_time_svg};
pub use style::{BAR_COLOR, OVER_THRESHOLD_COLOR, SERIES_COLORS, THRESHOLD_COLOR, WARN_COLOR};

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
