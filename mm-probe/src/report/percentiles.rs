//! Percentiles of a distribution recorded in an HdrHistogram.

use hdrhistogram::Histogram;
use serde::Serialize;

/// The summary latency people ask for first. Values are in the histogram's unit (nanoseconds
/// everywhere in mm-probe; the field names say so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        Self {
            count: histogram.len(),
            mean_ns: histogram.mean(),
            p50_ns: histogram.value_at_quantile(0.50),
            p90_ns: histogram.value_at_quantile(0.90),
            p99_ns: histogram.value_at_quantile(0.99),
            p999_ns: histogram.value_at_quantile(0.999),
            max_ns: histogram.max(),
        }
    }
}

/// A histogram for nanosecond latencies from 1 ns to an hour at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("static bounds are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_all_zero_not_nan() {
        let p = Percentiles::of(&latency_histogram());
        assert_eq!(p, Percentiles::default());
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = latency_histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1000);
        assert!((p.p50_ns as i64 - 500_000).abs() <= 500, "{p:?}");
        assert!((p.p99_ns as i64 - 990_000).abs() <= 1000, "{p:?}");
        assert!((p.max_ns as i64 - 1_000_000).abs() <= 1000, "{p:?}");
    }
}
