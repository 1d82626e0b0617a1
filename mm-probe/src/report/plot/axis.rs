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
}
