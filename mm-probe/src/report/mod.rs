//! Rendering: BCC-style log2 histograms, percentiles, NDJSON lines, SVG plots, and text that
//! fits the terminal.

pub mod json;
pub mod log2;
pub mod lost;
pub mod percentiles;
pub mod plot;
pub mod statement;
pub mod tally;
pub mod text;
pub mod verdict;

/// The end-to-end tests' schema checks, shared with the unit tests that build lines with every
/// optional part present: shapes the host kernel never produces, that only the guests would.
#[cfg(test)]
pub use mm_probe_schemas as schema_check;

pub use log2::Log2Histogram;
pub use percentiles::Percentiles;
