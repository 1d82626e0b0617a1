//! `mm-probe retry-storm`: HMM / MMU-notifier retry storms.
//!
//! hooks (probes.rs) → kernel counters (counters.rs) + two rings (walks, invalidations) → decoder
//! (events.rs) → retry chains (chains.rs) and walk/invalidation overlap (overlap.rs) → windows
//! (aggregator.rs) → metrics (metrics.rs, rates.rs) → verdict and advice (judge.rs) → the report's
//! JSON lines (report.rs) or text (render.rs). With `--plot`, the kernel counters are also sampled
//! into a bounded series (timeline.rs) drawn at the end (plot.rs).

pub mod aggregator;
pub mod chains;
pub mod counters;
pub mod events;
pub mod judge;
pub mod metrics;
pub mod overlap;
pub mod plot;
pub mod probes;
pub mod rates;
pub mod render;
pub mod report;
pub mod timeline;

use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::Ebpf;
use mm_probe_common::hmm::{self as names, HmmEvent};

use self::{
    aggregator::{Collector, read_begins_by_caller},
    judge::{Band, Thresholds},
    report::Snapshot,
};
pub use self::{counters::KernelTotals, probes::observability};
use crate::{
    cli::RetryStormArgs,
    collect::{
        Limits, RingReader, Stop, Stopper, Ticker, monotonic_ns,
        run::{self as skeleton},
    },
    error::UserError,
    kernel::{Kallsyms, Kernel, privileges},
    probes::{GlobalValue, MapFamily, Planner, detach_all, load_object},
    report::{
        json,
        plot::{PlotFile, rates_over_time_svg},
        text,
    },
};

/// How often walks are settled when no `--interval` is asked for.
const SETTLE_TICK: Duration = Duration::from_millis(200);
/// How often `--plot` samples the kernel counters: two points a second show the shape of a
/// few-second storm; longer runs coarsen (see timeline.rs).
const PLOT_SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// Samples kept for `--plot` (five minutes at full resolution).
const PLOT_MAX_SAMPLES: usize = 600;

pub fn run(args: &RetryStormArgs) -> Result<()> {
    let plot = args.plot.as_deref().map(PlotFile::check).transpose()?;
    privileges::require_tracing()?;
    let thresholds = thresholds_from(args)?;
    let limits = Limits::of_processes(args.duration, &args.pids)?;
    skeleton::run(limits, async |stopper| attach_and_collect(args, thresholds, plot, stopper).await)
}

/// Everything from attaching to the summary, inside the run skeleton (its stop handlers are
/// already installed, so a Ctrl-C while attaching still ends with a summary).
async fn attach_and_collect(
    args: &RetryStormArgs,
    thresholds: Thresholds,
    plot: Option<PlotFile>,
    stopper: &mut Stopper,
) -> Result<()> {
    let kernel = Kernel::running()?;
    let mut ebpf = load_object(&kernel, &[MapFamily::RetryStorm], &settings(&args.pids))?;
    crate::probes::select_processes(&mut ebpf, names::TARGET_TGIDS_MAP, &args.pids)?;
    let plan = Planner::new(&kernel).attach_all(&mut ebpf, probes::PROBES);
    // Mapped before the plan is out: mapping runs in the kernel without rescheduling, and a
    // workload may start on the plan line.
    let rings = Rings::map(&mut ebpf)?;
    let seen = observability(&kernel, &plan);
    let timeout_ns = args.timeout.as_nanos() as u64;
    if args.json {
        println!("{}", report::plan_json(&kernel.release.text, &plan, &seen, &thresholds, timeout_ns));
    } else {
        text::eprint(&render::plan_text(&kernel.release.text, &plan, &seen));
    }
    let numa_balancing = std::fs::read_to_string("/proc/sys/kernel/numa_balancing").ok().map(|s| s.trim().to_string());
    let mut collector = Collector::new(monotonic_ns(), timeout_ns, seen, thresholds, numa_balancing);
    let plot = plot.map(|file| {
        collector.sample_every(PLOT_SAMPLE_PERIOD, PLOT_MAX_SAMPLES);
        PlotRequest { file, kernel: kernel.release.text.clone() }
    });
    collect(&mut ebpf, rings, collector, args, plot, kernel.kallsyms().ok(), stopper).await
}

/// The walk and invalidation rings, mapped for reading.
struct Rings {
    walks: RingReader<HmmEvent>,
    invalidations: RingReader<HmmEvent>,
}

impl Rings {
    fn map(ebpf: &mut Ebpf) -> Result<Self> {
        let mut ring = |name: &str| -> Result<RingReader<HmmEvent>> {
            RingReader::new(ebpf.take_map(name).with_context(|| format!("{name} missing from the object"))?)
        };
        Ok(Self { walks: ring(names::WALK_EVENTS_MAP)?, invalidations: ring(names::INVALIDATE_EVENTS_MAP)? })
    }
}

/// `--plot`: where to draw, and the kernel for the title.
struct PlotRequest {
    file: PlotFile,
    kernel: String,
}

/// Globals: whether only the `-p` processes are watched.
pub fn settings(pids: &[u32]) -> Vec<(&'static str, GlobalValue)> {
    vec![(names::FILTER_TGIDS, GlobalValue::U32(u32::from(!pids.is_empty())))]
}

fn thresholds_from(args: &RetryStormArgs) -> Result<Thresholds, UserError> {
    let band = Band::checked;
    Ok(Thresholds {
        retry_rate: band("retry-rate", args.retry_rate_warn / 100.0, args.retry_rate_crit / 100.0)?,
        timeout_rate: band("timeout-rate", args.timeout_rate_warn / 100.0, args.timeout_rate_crit / 100.0)?,
        avg_latency_ns: band(
            "avg-latency",
            args.avg_latency_warn.as_nanos() as f64,
            args.avg_latency_crit.as_nanos() as f64,
        )?,
        invalidate_freq: band("invalidate-freq", args.invalidate_freq_warn, args.invalidate_freq_crit)?,
    })
}

fn print_interval(json: bool, snapshot: &Snapshot) {
    if json {
        println!("{}", report::interval_json(snapshot));
    } else {
        text::println(&render::interval_text(snapshot));
    }
}

/// What woke the collection loop.
enum Turn {
    Read,
    Settle,
    Sample,
    Report,
}

async fn collect(
    ebpf: &mut Ebpf,
    rings: Rings,
    mut collector: Collector,
    args: &RetryStormArgs,
    plot: Option<PlotRequest>,
    kallsyms: Option<&Kallsyms>,
    stopper: &mut Stopper,
) -> Result<()> {
    let Rings { walks: mut walk_ring, invalidations: mut invalidate_ring } = rings;
    let mut settle_tick = Ticker::every(Some(SETTLE_TICK));
    let mut report_tick = Ticker::every(args.interval);
    let mut plot_tick = Ticker::every(collector.timeline.is_some().then_some(PLOT_SAMPLE_PERIOD));
    let (mut walk_batch, mut invalidate_batch) = (Vec::new(), Vec::new());
    let stopped_by: Stop = loop {
        let turn = tokio::select! {
            read = walk_ring.read(|raw| walk_batch.push(raw)) => { read?; Turn::Read }
            read = invalidate_ring.read(|raw| invalidate_batch.push(raw)) => { read?; Turn::Read }
            _ = settle_tick.tick() => Turn::Settle,
            _ = plot_tick.tick() => Turn::Sample,
            _ = report_tick.tick() => Turn::Report,
            reason = stopper.wait() => break reason,
        };
        if matches!(turn, Turn::Settle | Turn::Report) {
            // Records below the rings' wake-up mark are still in them: take everything written
            // so far, so that the settle sees every invalidation older than its cutoff.
            walk_ring.drain_now(|raw| walk_batch.push(raw));
            invalidate_ring.drain_now(|raw| invalidate_batch.push(raw));
        }
        // Walks first: an invalidation batch read in the same turn may be newer, never older
        // than what the overlap joiner still holds for them.
        for raw in walk_batch.drain(..) {
            collector.on_raw(&raw);
        }
        for raw in invalidate_batch.drain(..) {
            collector.on_raw(&raw);
        }
        match turn {
            Turn::Read => {}
            Turn::Settle => collector.settle(monotonic_ns()),
            Turn::Sample => collector.sample(ebpf, monotonic_ns())?,
            Turn::Report => {
                collector.settle(monotonic_ns());
                let snapshot = collector.close_window(KernelTotals::read(ebpf)?, monotonic_ns());
                print_interval(args.json, &snapshot);
            }
        }
    };
    // Whatever the rings still hold once nothing more can arrive, then close every open chain
    // and join.
    detach_all(ebpf).await;
    walk_ring.drain_now(|raw| walk_batch.push(raw));
    invalidate_ring.drain_now(|raw| invalidate_batch.push(raw));
    for raw in walk_batch.iter().chain(&invalidate_batch) {
        collector.on_raw(raw);
    }
    collector.finish_streams();
    let end_ns = monotonic_ns();
    collector.finish_sampling(ebpf, end_ns)?;
    let last = collector.close_window(KernelTotals::read(ebpf)?, end_ns);
    // The partial last interval is always printed, however short: the intervals then add up
    // to the summary.
    if args.interval.is_some() {
        print_interval(args.json, &last);
    }
    for note in exit_notes(&stopper.exited_targets()) {
        text::eprintln(&format!("mm-probe: {note}"));
    }
    let mut summary = collector.summary();
    if collector.seen.read_begins {
        summary.read_begins_by_caller = read_begins_by_caller(ebpf, kallsyms)?;
    }
    if args.json {
        println!("{}", report::summary_json(&summary, stopped_by, &collector.seen));
        println!("{}", report::lost_json(&summary));
    } else {
        text::print(&render::summary_text(&summary, &collector.seen, stopped_by));
    }
    let malformed = collector.malformed + walk_ring.malformed + invalidate_ring.malformed;
    if malformed > 0 {
        text::eprintln(&format!(
            "mm-probe: {malformed} malformed events ignored (the eBPF object and this binary disagree on a record layout)"
        ));
    }
    if let (Some(request), Some(timeline)) = (plot, &collector.timeline) {
        let run = plot::RunFacts { kernel: &request.kernel, duration_s: summary.duration_ns as f64 / 1e9, stopped_by };
        let figure = plot::rates_plot(&run, timeline.samples(), &collector.thresholds, &collector.seen);
        request.file.write(&rates_over_time_svg(&figure)?)?;
        println!("{}", request.file.written_line(args.json.then_some(json::Line::RetryStormPlot)));
    }
    Ok(())
}

/// One note per `-p` process that exited during the run: what follows covers only the time
/// it was alive.
fn exit_notes(exited: &[u32]) -> Vec<String> {
    exited.iter().map(|pid| format!("process {pid} exited while being traced; partial results below")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_target_that_exited_gets_one_note_and_the_others_none() {
        assert!(exit_notes(&[]).is_empty());
        assert_eq!(
            exit_notes(&[42, 7]),
            [
                "process 42 exited while being traced; partial results below",
                "process 7 exited while being traced; partial results below"
            ]
        );
    }
}
