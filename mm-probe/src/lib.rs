//! mm-probe's user-space agent: kernel facts, the attach planner, collectors, reports, and one
//! module per capability. `main.rs` only parses and dispatches.

pub mod capability;
pub mod cause;
pub mod cli;
pub mod collect;
pub mod compare;
pub mod doctor;
pub mod error;
pub mod exporter;
pub mod generate;
pub mod invalidations;
pub mod kernel;
pub mod latency;
pub mod probes;
pub mod report;
pub mod retry_storm;
pub mod selftest;
pub mod thp_why;
pub mod triage;
pub mod units;
