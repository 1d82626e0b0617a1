//! `mm-probe latency`: real-time wakeup latency and the mm code that delays it.
//!
//! The kernel side (mm-probe-ebpf's `latency.rs`) keeps log-linear histograms of every wakeup
//! and traced call, a ring of the last run slices of each CPU, and sends only the events over
//! the threshold. Here, following the data:
//!
//! options (what to measure) → attach (settings, the hooks of `probes`) → run (rings, intervals,
//! stop) → decoder (records → typed spikes, stacks symbolized, syscalls named by `syscalls`) →
//! attribution (who held the CPU during the wait, and why: one task in a function or syscall,
//! several in turn, idle, time outside the kernel's view; a budget of the wait with what the
//! kept stays do not cover) → aggregator (distributions, tasks, worst spikes) → judge (verdict,
//! with `steal`: /proc/stat's steal as evidence) →
//! report (the JSON lines) → render (text) and plot.

pub mod aggregator;
pub mod attach;
pub mod attribution;
pub mod decoder;
pub mod export;
#[cfg(test)]
mod fixtures;
pub mod judge;
pub mod options;
pub mod plot;
pub mod probes;
pub mod render;
pub mod report;
pub mod run;
pub mod sampling;
pub mod steal;

pub use self::{
    attach::{
        REQUIRED_PROBES, SCHED_HOOKS_ENV, attach_probes, check_functions_exist, select_pids, settings,
        syscall_attribution,
    },
    options::Options,
    run::{Totals, counter, read_totals},
};

/// How a summary's `spike_causes` names the spikes that mm-probe's own start-up caused (its
/// programs loading held the CPU), which `triage` does not report as the machine's.
pub fn own_startup_cause() -> String {
    attribution::Cause::OwnStartup.label(&[])
}

/// `mm-probe latency`.
pub fn run(args: &crate::cli::LatencyArgs) -> anyhow::Result<()> {
    crate::collect::driver::drive(&run::Latency::from_args(args)?)
}
