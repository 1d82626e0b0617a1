//! `mm-probe retry-storm`: HMM / MMU-notifier retry storms.
//!
//! hooks (probes.rs) → kernel counters (counters.rs) + two rings (walks, invalidations) → the
//! collector (aggregator.rs) → records decoded, joined into retry chains and matched with the
//! invalidations that failed them (walks.rs) → observation windows and their metrics (window.rs,
//! rates.rs; invalidations and collisions by cause, causes.rs) → verdict and advice (judge.rs) → the report's JSON lines (report.rs) or text
//! (render.rs). run.rs is the capability as the run driver runs it. With `--plot`, the kernel counters are also sampled
//! into a bounded series (timeline.rs) drawn at the end (plot.rs).

pub mod aggregator;
pub mod causes;
pub mod counters;
pub mod export;
pub mod judge;
pub mod plot;
pub mod probes;
pub mod rates;
pub mod render;
pub mod report;
pub mod run;
pub mod timeline;
pub mod walks;
pub mod window;

pub use self::{
    counters::KernelTotals,
    probes::{observability, settings},
};
use crate::{cli::RetryStormArgs, collect::driver};

pub fn run(args: &RetryStormArgs) -> anyhow::Result<()> {
    driver::drive(&run::RetryStorm::from_args(args)?)
}
