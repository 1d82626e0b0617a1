//! Cumulative `le` buckets derived from the kernel's histograms, exact at every edge.
//!
//! Prometheus counts an observation in every bucket whose `le` is at least its value, so a bucket
//! edge is only exact where the kernel's slots have a seam: the last nanosecond of a slot, never
//! its round upper bound. Each capability knows where its own histogram's seams are (latency's
//! are in its `export` module); the shape the exposition encodes and the plain log2 histogram of
//! nanoseconds are here.

/// Rows of the nanosecond log2 histograms (invalidate callbacks) with an edge of their own: from
/// [512, 1023] ns (edge ≈ 1 µs) to [2^33, 2^34 − 1] ns (edge ≈ 17 s). Fewer edges stay exact;
/// the kernel's last slot gathers everything from 2^40 ns on and so never has an upper seam.
pub const FIRST_NS_ROW: u32 = 9;
pub const LAST_NS_ROW: u32 = 33;

/// One cumulative bucket: observations of at most `le_ns` nanoseconds (`None`: +Inf).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub le_ns: Option<u64>,
    pub cumulative: u64,
}

/// A histogram as Prometheus reads it: cumulative buckets ending with +Inf, count and sum.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub count: u64,
    pub sum_seconds: f64,
    pub buckets: Vec<Bucket>,
}

impl Histogram {
    /// The bucket's upper bound in seconds, as the exposition writes it (f64::MAX is +Inf for the
    /// encoder).
    pub fn le_seconds(bucket: &Bucket) -> f64 {
        bucket.le_ns.map_or(f64::MAX, |ns| ns as f64 / 1e9)
    }
}

/// A kernel log2 histogram of nanoseconds (slot k holds [2^k, 2^(k+1)) ns, slot 0 also 0) and
/// the exact sum of its samples.
pub fn log2_ns_histogram(slots: &[u64], sum_ns: u64) -> Histogram {
    let mut buckets: Vec<Bucket> = (FIRST_NS_ROW..=LAST_NS_ROW)
        .filter(|&row| (row as usize) + 1 < slots.len())
        .map(|row| Bucket {
            le_ns: Some((1u64 << (row + 1)) - 1),
            cumulative: slots.iter().take(row as usize + 1).sum(),
        })
        .collect();
    let count = slots.iter().sum();
    buckets.push(Bucket { le_ns: None, cumulative: count });
    Histogram { count, sum_seconds: sum_ns as f64 / 1e9, buckets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanosecond_log2_edges_end_where_each_row_ends() {
        let mut slots = vec![0u64; 41];
        slots[3] = 2; // [8, 15] ns
        slots[9] = 1; // [512, 1023] ns
        slots[10] = 4; // [1024, 2047] ns
        slots[40] = 1; // 2^40 ns and more: only +Inf knows it
        let h = log2_ns_histogram(&slots, 123_456);
        assert_eq!(h.buckets[0], Bucket { le_ns: Some(1023), cumulative: 3 });
        assert_eq!(h.buckets[1], Bucket { le_ns: Some(2047), cumulative: 7 });
        assert_eq!(h.buckets.iter().rev().nth(1).unwrap().le_ns, Some((1 << 34) - 1));
        assert_eq!(h.buckets.last().unwrap(), &Bucket { le_ns: None, cumulative: 8 });
        assert_eq!(h.count, 8);
    }
}
