//! One look for every figure: sizes, fonts and colours (the colour-blind-safe "tab10" hues most
//! plotting tools start from, so series read the same as in other tools' charts).

use plotters::style::{FontFamily, RGBColor, TextStyle};

/// Figure width; panels stack below a title.
pub const WIDTH: u32 = 1000;
pub const TITLE_HEIGHT: u32 = 44;
pub const PANEL_HEIGHT: u32 = 320;

/// Font sizes in plotters' units (the SVG says 1/1.24 of them in px).
pub const TITLE_SIZE: f64 = 24.0;
pub const CAPTION_SIZE: f64 = 18.0;
pub const LABEL_SIZE: f64 = 15.0;
pub const NOTE_SIZE: f64 = 17.0;

/// Values at or below the threshold, and above it.
pub const BAR_COLOR: RGBColor = RGBColor(31, 119, 180);
pub const OVER_THRESHOLD_COLOR: RGBColor = RGBColor(255, 127, 14);
/// Threshold lines: a CRIT limit (and the latency threshold) in red, a WARN limit in amber.
pub const THRESHOLD_COLOR: RGBColor = RGBColor(214, 39, 40);
pub const WARN_COLOR: RGBColor = RGBColor(188, 140, 0);
/// Series of a rates panel, in order.
pub const SERIES_COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];
pub const NOTE_COLOR: RGBColor = RGBColor(110, 110, 110);

/// The generic family every SVG viewer resolves to a font it has.
pub fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FontFamily::SansSerif, size))
}
