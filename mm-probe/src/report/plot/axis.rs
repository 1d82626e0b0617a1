//! A linear axis whose ticks are chosen by the figure, not by plotters: the histogram puts its
//! labels on whole powers of two and decades. (plotters' own key-point wrapper drops the label
//! formatter of f64 axes, so this small coordinate type stands in for it.)

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

pub struct TickedAxis {
    range: Range<f64>,
    /// Ticks with a label and a bold grid line.
    labelled: Vec<f64>,
    /// Light grid lines.
    grid: Vec<f64>,
}

impl TickedAxis {
    pub fn new(range: Range<f64>, labelled: Vec<f64>, grid: Vec<f64>) -> Self {
        Self { range, labelled, grid }
    }
}

impl Ranged for TickedAxis {
    // Every tick gets a formatter from the figure; the default only has to exist.
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let fraction = if span > 0.0 { (value - self.range.start) / span } else { 0.0 };
        limit.0 + (fraction * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { self.grid.clone() } else { self.labelled.clone() }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
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
    fn maps_linearly_onto_the_pixels() {
        let axis = TickedAxis::new(-1.0..3.0, vec![0.0], vec![]);
        assert_eq!(axis.map(&-1.0, (10, 410)), 10);
        assert_eq!(axis.map(&1.0, (10, 410)), 210);
        assert_eq!(axis.map(&3.0, (410, 10)), 10, "y axes run upwards");
    }

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
