//! Rendering: BCC-style log2 histograms, percentiles, NDJSON lines.

pub mod json;
pub mod log2;
pub mod percentiles;

pub use log2::Log2Histogram;
pub use percentiles::Percentiles;
