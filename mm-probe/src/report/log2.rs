//! Log2 histograms in the layout BCC and bpftrace users read fluently, with the bucket that
//! holds a threshold marked. The kernel programs fill the buckets (slot k counts values in
//! [2^k, 2^(k+1)); slot 0 also counts 0); this only renders them.

use std::fmt::Write as _;

/// Width of the bar column, as in BCC.
const BAR_WIDTH: u64 = 40;
/// Width of each bucket bound, as in BCC (enough for 2^33).
const BOUND_WIDTH: usize = 10;
/// Width of the count column before its bar, as in BCC.
const COUNT_WIDTH: usize = 9;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log2Histogram {
    pub buckets: Vec<u64>,
}

impl Log2Histogram {
    pub fn new(buckets: Vec<u64>) -> Self {
        Self { buckets }
    }

    /// The bucket a value falls into: the kernel side's own function, over all 64 buckets.
    pub fn bucket_of(value: u64) -> usize {
        mm_probe_common::histogram::log2_bucket(value, u64::BITS) as usize
    }

    /// Lower and upper bound (inclusive) of bucket `k`.
    pub fn bounds(k: usize) -> (u64, u64) {
        if k == 0 { (0, 1) } else { (1u64 << k, (1u64 << (k + 1)) - 1) }
    }

    /// The upper bound of the bucket holding quantile `q` (0 to 1) of kernel log2 buckets;
    /// `None` when they are empty.
    pub fn quantile_bound(buckets: &[u64], q: f64) -> Option<u64> {
        let total: u64 = buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let target = ((total as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (k, count) in buckets.iter().enumerate() {
            seen += count;
            if seen >= target {
                return Some(Self::bounds(k).1);
            }
        }
        None
    }

    /// Quantile `q` (0 to 1) of kernel log2 buckets, placed inside its bucket by rank and
    /// evenly in log space (a bucket spans a factor of two): exact to within that factor, and
    /// moved by no single outlier. `None` when they are empty.
    pub fn quantile_estimate(buckets: &[u64], q: f64) -> Option<f64> {
        let total: u64 = buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let target = total as f64 * q.clamp(0.0, 1.0);
        let mut below = 0u64;
        for (k, &count) in buckets.iter().enumerate().filter(|(_, count)| **count > 0) {
            if (below + count) as f64 >= target {
                let fraction = (target - below as f64) / count as f64;
                let (low, _) = Self::bounds(k);
                return Some(if k == 0 { fraction } else { low as f64 * fraction.exp2() });
            }
            below += count;
        }
        None
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
        // Columns as wide as BCC's, wider when a bound or count needs it, so that the header's
        // colon stays above the rows' colons and "distribution" above the bars.
        let digits = |n: u64| n.to_string().len();
        let low_width = (first..=last).map(|k| digits(Self::bounds(k).0)).max().unwrap_or(0).max(BOUND_WIDTH);
        let high_width = (first..=last).map(|k| digits(Self::bounds(k).1)).max().unwrap_or(0).max(BOUND_WIDTH);
        let count_width = digits(peak).max(COUNT_WIDTH);
        let label_width = low_width + " -> ".len() + high_width;
        let _ = writeln!(out, "{unit:>w$} : {:<c$}distribution", "count", w = label_width - 1, c = count_width + 1);
        for k in first..=last {
            let (low, high) = Self::bounds(k);
            let count = self.buckets[k];
            let stars = (count * BAR_WIDTH).div_ceil(peak).min(BAR_WIDTH) as usize;
            let stars = if count == 0 { 0 } else { stars };
            let mark = if marked == Some(k) { " <- threshold" } else { "" };
            let bar = format!("{:<w$}", "*".repeat(stars), w = BAR_WIDTH as usize);
            let _ = writeln!(out, "{low:>low_width$} -> {high:<high_width$}: {count:<count_width$}|{bar}|{mark}");
        }
        out
    }
}

/// A log2 histogram as JSON says it: `{"base": 2, "unit": "ns", "buckets": [...]}`, slot k
/// counting values in [2^k, 2^(k+1)) (slot 0 also 0), so a reader needs no documentation to
/// read the bare counts. For `#[serde(serialize_with = ...)]` on a `Vec<u64>` of buckets.
pub fn serialize_log2<S: serde::Serializer>(unit: &str, buckets: &[u64], serializer: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    let mut object = serializer.serialize_struct("Log2Histogram", 3)?;
    object.serialize_field("base", &2)?;
    object.serialize_field("unit", unit)?;
    object.serialize_field("buckets", buckets)?;
    object.end()
}

pub fn log2_ns<S: serde::Serializer>(buckets: &[u64], serializer: S) -> Result<S::Ok, S::Error> {
    serialize_log2("ns", buckets, serializer)
}

pub fn log2_bytes<S: serde::Serializer>(buckets: &[u64], serializer: S) -> Result<S::Ok, S::Error> {
    serialize_log2("bytes", buckets, serializer)
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
    fn quantile_estimates_stay_inside_their_bucket_and_ignore_one_outlier() {
        let mut buckets = vec![0u64; 32];
        buckets[16] = 16; // 65536 to 131071 ns
        buckets[22] = 1; // one call of 4 ms or more
        let median = Log2Histogram::quantile_estimate(&buckets, 0.5).unwrap();
        assert!((65_536.0..131_072.0).contains(&median), "{median}");
        // Half of the bucket's calls below the median: the middle of the bucket in log space.
        buckets[22] = 0;
        let median = Log2Histogram::quantile_estimate(&buckets, 0.5).unwrap();
        assert!((median - 65_536.0 * 2f64.sqrt()).abs() < 1.0, "{median}");
        assert_eq!(Log2Histogram::quantile_estimate(&[0; 4], 0.5), None);
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
    fn the_header_colon_is_above_the_row_colons_and_distribution_above_the_bars() {
        for (buckets, unit) in [
            (vec![0, 0, 0, 10, 0, 0, 0, 0, 5], "usecs"),
            // Bounds past 10 digits and a count past the column: everything moves together.
            ((0..40).map(|k| if k == 38 { 123_456_789_012 } else { u64::from(k % 3 == 0) }).collect(), "nsecs"),
        ] {
            let text = Log2Histogram::new(buckets).render(unit, None);
            let lines: Vec<&str> = text.lines().collect();
            let colon = lines[0].find(" : ").unwrap() + 1;
            let distribution = lines[0].find("distribution").unwrap();
            let count = lines[0].find("count").unwrap();
            for row in &lines[1..] {
                assert_eq!(row.find(':'), Some(colon), "{text}");
                assert_eq!(row.find('|').map(|bar| bar + 1), Some(distribution), "{text}");
                assert_eq!(row[colon + 1..].find(|c: char| c != ' ').map(|i| i + colon + 1), Some(count), "{text}");
            }
        }
    }

    #[test]
    fn empty_histogram_says_so() {
        assert!(Log2Histogram::new(vec![0; 4]).render("usecs", None).contains("no samples"));
    }
}
