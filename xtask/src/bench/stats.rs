//! Summaries of repeated measurements.

/// Median and range of a sample.
pub fn median_and_range(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    let median = if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 };
    (median, values[0], values[values.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(median_and_range(&mut [3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(median_and_range(&mut [4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(median_and_range(&mut []).0.is_nan());
    }
}
