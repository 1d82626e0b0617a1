//! Rates made of counts: the share of one count in another, and events per second. Unknown,
//! never 0 % or infinite, when there is nothing to divide by. Used by the metrics, the verdict's
//! advice and the plot.

/// Divides, or `None` when there is nothing to divide by (an empty window is not a 0 % rate).
pub fn ratio(numerator: u64, denominator: u64) -> Option<f64> {
    (denominator != 0).then(|| numerator as f64 / denominator as f64)
}

/// Events per second over `window_ns`; `None` for an empty window (a zero-length interval has
/// no rate, not an infinite one).
pub fn per_second(count: u64, window_ns: u64) -> Option<f64> {
    (window_ns != 0).then(|| count as f64 * 1e9 / window_ns as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_of_empty_windows_are_unknown_not_zero() {
        assert_eq!(ratio(0, 0), None);
        assert_eq!(ratio(5, 0), None);
        assert_eq!(ratio(0, 10), Some(0.0));
        assert_eq!(ratio(85, 100), Some(0.85));
        assert_eq!(per_second(10, 0), None);
        assert_eq!(per_second(1000, 500_000_000), Some(2000.0));
    }
}
