//! Log2 histograms in the layout BCC and bpftrace users read fluently, with the bucket that
//! holds a threshold marked. The kernel programs fill the buckets (slot k counts values in
//! [2^k, 2^(k+1)); slot 0 also counts 0); this only renders them.

use std::fmt::Write as _;

/// Width of the bar column, as in BCC.
const BAR_WIDTH: u64 = 40;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log2Histogram {
    pub buckets: Vec<u64>,
}

impl Log2Histogram {
    pub fn new(buckets: Vec<u64>) -> Self {
        Self { buckets }
    }

    /// The bucket a value falls into (the same arithmetic as the kernel side).
    pub fn bucket_of(value: u64) -> usize {
        if value == 0 { 0 } else { (63 - value.leading_zeros()) as usize }
    }

    /// Lower and upper bound (inclusive) of bucket `k`.
    pub fn bounds(k: usize) -> (u64, u64) {
        if k == 0 { (0, 1) } else { (1u64 << k, (1u64 << (k + 1)) - 1) }
    }

    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Renders rows from the first to the last non-empty bucket. `unit` names the values
    /// ("usecs"); the row holding `threshold` (same unit) is marked.
    pub fn render(&self, unit: &str, threshold: Option<u64>) -> String {
        let mut out = String::new();
        let Some(last) = self.buckets.iter().rposition(|&c| c > 0) else {
            let _ = writeln!(out, "     (no samples)");
            return out;
        };
        let first = self.buckets.iter().position(|&c| c > 0).unwrap_or(0);
        let peak = self.buckets.iter().copied().max().unwrap_or(1).max(1);
        let marked = threshold.map(Self::bucket_of);
        let _ = writeln!(out, "{:>20} : count     distribution", unit);
        for k in first..=last {
            let (low, high) = Self::bounds(k);
            let count = self.buckets[k];
            let stars = (count * BAR_WIDTH).div_ceil(peak).min(BAR_WIDTH) as usize;
            let stars = if count == 0 { 0 } else { stars };
            let mark = if marked == Some(k) { " <- threshold" } else { "" };
            let _ = writeln!(out, "{low:>10} -> {high:<10}: {count:<9}|{:<40}|{mark}", "*".repeat(stars));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_kernel_arithmetic() {
        assert_eq!(Log2Histogram::bucket_of(0), 0);
        assert_eq!(Log2Histogram::bucket_of(1), 0);
        assert_eq!(Log2Histogram::bucket_of(2), 1);
        assert_eq!(Log2Histogram::bucket_of(3), 1);
        assert_eq!(Log2Histogram::bucket_of(500), 8);
        assert_eq!(Log2Histogram::bucket_of(512), 9);
        assert_eq!(Log2Histogram::bounds(8), (256, 511));
    }

    #[test]
    fn renders_bcc_layout_and_marks_the_threshold() {
        let mut buckets = vec![0; 12];
        buckets[3] = 10;
        buckets[8] = 5;
        buckets[10] = 1;
        let text = Log2Histogram::new(buckets).render("usecs", Some(500));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].trim_start().starts_with("usecs : count"), "{text}");
        assert!(
            lines[1].contains("8 -> 15") && lines[1].contains("|****************************************|"),
            "{text}"
        );
        let marked: Vec<&&str> = lines.iter().filter(|l| l.ends_with("<- threshold")).collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].contains("256 -> 511"), "{text}");
        assert_eq!(lines.len(), 1 + 8, "rows from bucket 3 to bucket 10: {text}");
    }

    #[test]
    fn empty_histogram_says_so() {
        assert!(Log2Histogram::new(vec![0; 4]).render("usecs", None).contains("no samples"));
    }
}
