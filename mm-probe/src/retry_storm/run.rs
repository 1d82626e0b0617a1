//! retry-storm as the run driver runs it: its options, its globals and attach, and what it
//! does at each step of a run (read the walk and invalidation rings, settle retry chains, sample
//! the counters for `--plot`, close windows).

use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::Ebpf;
use mm_probe_common::hmm::{self as names, HmmEvent};

use super::{
    aggregator::{Collector, Streams, read_begins_by_caller, walks_in_flight_since},
    counters::KernelTotals,
    judge::{Band, Thresholds},
    plot, probes, render, report,
};
use crate::{
    capability::CapabilityId as Id,
    cause::Namer,
    cli::{Command, RetryStormArgs, RunArgs},
    collect::{
        RingReader, Ticker,
        driver::{Capability, End, Printout, Session},
        monotonic_ns,
    },
    error::UserError,
    kernel::{Kallsyms, Kernel},
    probes::{GlobalValue, Planner, select_processes},
    report::{json, plot::rates_over_time_svg},
};

/// How often walks are settled between intervals.
const SETTLE_TICK: Duration = Duration::from_millis(200);
/// How often `--plot` samples the kernel counters: two points a second show the shape of a
/// few-second storm; longer runs coarsen (see timeline.rs).
const PLOT_SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// Samples kept for `--plot` (five minutes at full resolution).
const PLOT_MAX_SAMPLES: usize = 600;

/// `mm-probe retry-storm`, its options checked.
pub struct RetryStorm {
    run: RunArgs,
    thresholds: Thresholds,
    timeout_ns: u64,
}

impl RetryStorm {
    pub fn from_args(args: &RetryStormArgs) -> Result<Self, UserError> {
        Ok(Self {
            run: args.run.clone(),
            thresholds: thresholds_from(args)?,
            timeout_ns: args.timeout.as_nanos() as u64,
        })
    }
}

/// The limits `mm-probe retry-storm` judges with when none is given (the exporter's).
pub fn default_thresholds() -> Result<Thresholds> {
    let args = crate::cli::defaults(Id::RetryStorm.command(), |c| match c {
        Command::RetryStorm(args) => Some(args),
        _ => None,
    })?;
    Ok(thresholds_from(&args)?)
}

fn thresholds_from(args: &RetryStormArgs) -> Result<Thresholds, UserError> {
    let band = Band::checked;
    Ok(Thresholds {
        retry_rate: band("retry-rate", args.retry_rate_warn / 100.0, args.retry_rate_crit / 100.0)?,
        timeout_rate: band("timeout-rate", args.timeout_rate_warn / 100.0, args.timeout_rate_crit / 100.0)?,
        avg_latency_ns: Band::durations("avg-latency", args.avg_latency_warn, args.avg_latency_crit)?,
        invalidate_freq: band("invalidate-freq", args.invalidate_freq_warn, args.invalidate_freq_crit)?,
    })
}

impl Capability for RetryStorm {
    type Session<'k> = Watch<'k>;
    const ID: Id = Id::RetryStorm;
    const PLOT_LINE: Option<json::Line> = Some(json::Line::RetryStormPlot);

    fn run_args(&self) -> &RunArgs {
        &self.run
    }

    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        probes::settings(kernel, &self.run.pids)
    }

    fn attach<'k>(&self, kernel: &'k Kernel, ebpf: &mut Ebpf) -> Result<Watch<'k>> {
        select_processes(ebpf, names::TARGET_TGIDS_MAP, &self.run.pids)?;
        let plan = Planner::new(kernel).attach_all(ebpf, probes::PROBES);
        let mut ring = |name: &str| -> Result<RingReader<HmmEvent>> {
            RingReader::new(ebpf.take_map(name).with_context(|| format!("{name} missing from the object"))?)
        };
        let (walks, invalidations) = (ring(names::WALK_EVENTS_MAP)?, ring(names::INVALIDATE_EVENTS_MAP)?);
        let seen = probes::observability(kernel, &plan);
        let plan_line = Printout::new(
            report::plan_json(&kernel.release.text, &plan, &seen, &self.thresholds, self.timeout_ns),
            render::plan_text(&kernel.release.text, &plan, &seen),
        );
        let mut collector =
            Collector::new(monotonic_ns(), self.timeout_ns, seen, self.thresholds, Namer::from_tracefs());
        collector.read_from(Streams::new(walks, invalidations));
        let plotting = self.run.plot.is_some();
        if plotting {
            collector.sample_every(PLOT_SAMPLE_PERIOD, PLOT_MAX_SAMPLES);
        }
        Ok(Watch {
            kernel,
            plan_line,
            collector,
            settle_tick: Ticker::every(Some(SETTLE_TICK)),
            plot_tick: Ticker::every(plotting.then_some(PLOT_SAMPLE_PERIOD)),
        })
    }
}

/// retry-storm while it watches.
pub struct Watch<'k> {
    kernel: &'k Kernel,
    plan_line: Printout,
    collector: Collector,
    settle_tick: Ticker,
    plot_tick: Ticker,
}

/// What woke a turn.
enum Turn {
    Read,
    Settle,
    Sample,
}

impl Watch<'_> {
    fn kallsyms(&self) -> Option<&Kallsyms> {
        self.kernel.kallsyms().ok()
    }

    /// Takes everything the rings hold and judges the walks that have settled, keeping what
    /// the walks still in flight may need. The walks in flight are read first: one that returns
    /// after that read is in the rings the drain then reads, so no walk falls between the two.
    fn settle(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<()> {
        let in_flight = walks_in_flight_since(ebpf, now_ns)?;
        self.collector.drain_rings();
        self.collector.settle_with_walks_in_flight(now_ns, in_flight);
        Ok(())
    }
}

impl Session for Watch<'_> {
    fn plan(&self) -> Printout {
        self.plan_line.clone()
    }

    async fn turn(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let turn = tokio::select! {
            read = self.collector.read() => { read?; Turn::Read }
            () = self.settle_tick.tick() => Turn::Settle,
            () = self.plot_tick.tick() => Turn::Sample,
        };
        match turn {
            Turn::Read => {}
            Turn::Settle => self.settle(ebpf, monotonic_ns())?,
            Turn::Sample => self.collector.sample(ebpf, monotonic_ns())?,
        }
        Ok(())
    }

    fn interval(&mut self, ebpf: &mut Ebpf, now_ns: u64) -> Result<Printout> {
        self.settle(ebpf, now_ns)?;
        let snapshot = self.collector.close_window(KernelTotals::read(ebpf)?, now_ns);
        Ok(Printout::new(report::interval_json(&snapshot), render::interval_text(&snapshot)))
    }

    /// Whatever the rings still hold once nothing more can arrive; then every open chain
    /// closes and joins.
    fn drain(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        self.collector.drain_rings();
        self.collector.finish_streams();
        self.collector.finish_sampling(ebpf, monotonic_ns())
    }

    fn summary(&mut self, ebpf: &mut Ebpf, end: &End) -> Result<Printout> {
        let mut summary = self.collector.summary();
        if self.collector.seen.read_begins {
            summary.read_begins_by_caller = read_begins_by_caller(ebpf, self.kallsyms())?;
        }
        let seen = &self.collector.seen;
        let json = format!("{}\n{}", report::summary_json(&summary, end.stopped_by, seen), report::lost_json(&summary));
        Ok(Printout::new(json, render::summary_text(&summary, seen, end.stopped_by)))
    }

    fn notes(&self) -> Vec<String> {
        let malformed = self.collector.malformed();
        (malformed > 0)
            .then(|| {
                format!(
                    "{malformed} malformed events ignored (the eBPF object and this binary disagree on a record layout)"
                )
            })
            .into_iter()
            .collect()
    }

    fn plot(&self, end: &End) -> Result<String> {
        let summary = self.collector.summary();
        let run = plot::RunFacts {
            kernel: &self.kernel.release.text,
            duration_s: summary.duration_ns as f64 / 1e9,
            stopped_by: end.stopped_by,
        };
        let samples = self.collector.timeline.as_ref().map(|t| t.samples()).unwrap_or_default();
        let figure = plot::rates_plot(&run, samples, &self.collector.thresholds, &self.collector.seen);
        Ok(rates_over_time_svg(&figure)?)
    }
}
