//! `mm-probe invalidations`: where MMU-notifier invalidations spend their time.
//!
//! hooks (probes.rs: KVM's tracepoints, lock contention, the notifier's functions, the known
//! subscribers' callbacks) → tables aggregated in the kernel → read and summed (decoder.rs) →
//! invalidators, contended locks named and split by waiting path (locks.rs), subscribers with
//! their time-against-size fit (aggregator.rs) → verdict and advice (judge.rs) → JSON lines
//! (report.rs) or text (render.rs), and with `--plot` a figure of the distributions (plot.rs).

pub mod aggregator;
pub mod callbacks;
pub mod decoder;
pub mod export;
pub mod globals;
pub mod judge;
pub mod locks;
pub mod plot;
pub mod probes;
pub mod render;
pub mod report;
pub mod run;

use crate::{cli::InvalidationsArgs, collect::driver};

pub fn run(args: &InvalidationsArgs) -> anyhow::Result<()> {
    driver::drive(&run::Invalidations::from_args(args)?)
}
