//! `mm-probe retry-storm`: HMM / MMU-notifier retry storms.
//!
//! hooks (probes.rs) → kernel counters (counters.rs) + two rings (walks, invalidations) → decoder
//! (events.rs) → retry chains (chains.rs) and walk/invalidation overlap (overlap.rs) → windows
//! (aggregator.rs) → metrics (metrics.rs, rates.rs) → verdict and advice (judge.rs) → the report's
//! JSON lines (report.rs) or text (render.rs). run.rs is the capability as the run driver
//! runs it. With `--plot`, the kernel counters are also sampled
//! into a bounded series (timeline.rs) drawn at the end (plot.rs).

pub mod aggregator;
pub mod chains;
pub mod counters;
pub mod events;
pub mod export;
pub mod judge;
pub mod metrics;
pub mod overlap;
pub mod plot;
pub mod probes;
pub mod rates;
pub mod render;
pub mod report;
pub mod run;
pub mod timeline;

pub use self::{
    counters::KernelTotals,
    probes::{observability, settings},
};
use crate::{cli::RetryStormArgs, collect::driver};

pub fn run(args: &RetryStormArgs) -> anyhow::Result<()> {
    driver::drive(&run::RetryStorm::from_args(args)?)
}
