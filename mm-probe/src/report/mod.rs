//! Rendering: BCC-style log2 histograms, percentiles, NDJSON lines, SVG plots.

pub mod json;
pub mod log2;
pub mod percentiles;
pub mod plot;

pub use log2::Log2Histogram;
pub use percentiles::Percentiles;
