//! invalidations as the run driver runs it: its options, its attach (the catalog, then each
//! subscriber's callback as the kernel side finds it), and what it does at each step of a run
//! (drain the kernel's tables every period, close intervals, judge the totals at the end).

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::invalidations as names;

use super::{
    aggregator::{self, PeakRate, RunFacts},
    callbacks::{self, CallbackTimer},
    decoder::{DRAIN_PERIOD, Drain, Tables},
    globals::{kvm_locks_nameable, kvm_members, settings},
    judge::Thresholds,
    plot, probes,
    probes::Observability,
    render, report,
    report::Summary,
};
use crate::{
    capability::CapabilityId as Id,
    cause::Namer,
    cli::{Command, InvalidationsArgs, RunArgs},
    collect::{
        Ticker,
        driver::{Capability, End, Printout, Session},
        monotonic_ns,
    },
    error::UserError,
    kernel::{Kallsyms, Kernel},
    probes::{GlobalValue, Planner, select_processes},
    report::{json, plot::histogram_svg, verdict::Band},
};

/// `mm-probe invalidations`, its options checked.
pub struct Invalidations {
    run: RunArgs,
    thresholds: Thresholds,
}

impl Invalidations {
    pub fn from_args(args: &InvalidationsArgs) -> Result<Self, UserError> {
        Ok(Self { run: args.run.clone(), thresholds: thresholds_from(args)? })
    }
}

/// The limits `mm-probe invalidations` judges with when none is given (the exporter's).
pub fn default_thresholds() -> Result<Thresholds> {
    let args = crate::cli::defaults(Id::Invalidations.command(), |c| match c {
        Command::Invalidations(args) => Some(args),
        _ => None,
    })?;
    Ok(thresholds_from(&args)?)
}

fn thresholds_from(args: &InvalidationsArgs) -> Result<Thresholds, UserError> {
    let band = Band::checked;
    Ok(Thresholds {
        invalidate_freq: band("invalidate-freq", args.invalidate_freq_warn, args.invalidate_freq_crit)?,
        wait_per_invalidation_ns: Band::durations("wait", args.wait_warn, args.wait_crit)?,
        callback_mean_ns: Band::durations("callback", args.callback_warn, args.callback_crit)?,
        amplification: band("amplification", args.amplification_warn, args.amplification_crit)?,
    })
}

impl Capability for Invalidations {
    type Session<'k> = Watch<'k>;
    const ID: Id = Id::Invalidations;
    const PLOT_LINE: Option<json::Line> = Some(json::Line::InvalidationsPlot);

    fn run_args(&self) -> &RunArgs {
        &self.run
    }

    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        settings(kernel, &self.run.pids)
    }

    fn attach<'k>(&self, kernel: &'k Kernel, ebpf: &mut Ebpf) -> Result<Watch<'k>> {
        select_processes(ebpf, names::TARGET_TGIDS_MAP, &self.run.pids)?;
        let plan = Planner::new(kernel).attach_all(ebpf, probes::PROBES);
        let timer = CallbackTimer::start(kernel, ebpf, &plan);
        let seen = probes::observability(&plan, timer.plan(), kvm_locks_nameable(kernel), kernel);
        let release = &kernel.release.text;
        let plan_line = Printout::new(
            report::plan_json(release, &plan, &timer.plan().timed, &seen, &self.thresholds),
            render::plan_text(release, &plan, &timer.plan().timed, &seen),
        );
        let started_ns = monotonic_ns();
        Ok(Watch {
            kernel,
            pids: self.run.pids.clone(),
            thresholds: self.thresholds,
            plan_line,
            seen,
            namer: Namer::from_tracefs(),
            timer,
            drain: Drain::default(),
            peak: PeakRate::default(),
            started_ns,
            drained_ns: None,
            intervals: Intervals { previous: Tables::default(), previous_ns: started_ns },
            drain_tick: Ticker::every(Some(DRAIN_PERIOD)),
            poll_tick: Ticker::every(Some(callbacks::POLL_PERIOD)),
            skipped: None,
            summary: None,
        })
    }
}

/// invalidations while it watches: the totals drained so far, the peak rate, the callbacks
/// being timed.
pub struct Watch<'k> {
    kernel: &'k Kernel,
    pids: Vec<u32>,
    thresholds: Thresholds,
    plan_line: Printout,
    seen: Observability,
    namer: Namer,
    timer: CallbackTimer,
    drain: Drain,
    peak: PeakRate,
    started_ns: u64,
    drained_ns: Option<u64>,
    intervals: Intervals,
    drain_tick: Ticker,
    poll_tick: Ticker,
    /// Runs the kernel skipped (read before the detach unloads the programs).
    skipped: Option<u64>,
    summary: Option<Summary>,
}

/// The previous `--interval` line's totals: each line is the change since then.
struct Intervals {
    previous: Tables,
    previous_ns: u64,
}

/// What woke a turn.
enum Turn {
    Drain,
    Poll,
}

impl Watch<'_> {
    /// Adds the kernel's tables to the totals and takes the period in for the peak rate.
    fn drain_now(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let before = self.drain.totals.clone();
        let before_ns = self.drained_ns.unwrap_or(self.started_ns);
        let kallsyms = self.kernel.kallsyms().ok();
        self.drain.drain(ebpf, kallsyms)?;
        let now_ns = monotonic_ns();
        self.drained_ns = Some(now_ns);
        let seconds = now_ns.saturating_sub(before_ns) as f64 / 1e9;
        self.peak.observe(&before, &self.drain.totals, seconds, now_ns - self.started_ns);
        Ok(())
    }

    /// The symbols that name callbacks: the timer's (read after its attaches, so a module's
    /// new symbols are in), else the kernel's.
    fn kallsyms(&self) -> Option<&Kallsyms> {
        self.timer.kallsyms().or_else(|| self.kernel.kallsyms().ok())
    }

    fn summarize(&self, end_ns: u64) -> Summary {
        let run = RunFacts {
            seen: &self.seen,
            pids: &self.pids,
            peak: self.peak.peak.clone(),
            kvm_members: &kvm_members(self.kernel),
            kallsyms: self.kallsyms(),
            skipped: self.skipped,
            namer: &self.namer,
        };
        aggregator::summary(&self.drain.totals, end_ns - self.started_ns, &run, &self.thresholds)
    }
}

impl Session for Watch<'_> {
    fn plan(&self) -> Printout {
        self.plan_line.clone()
    }

    /// Drains once per [`DRAIN_PERIOD`] and times each subscriber's callback as the kernel
    /// side finds it.
    async fn turn(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let turn = tokio::select! {
            () = self.drain_tick.tick() => Turn::Drain,
            () = self.poll_tick.tick() => Turn::Poll,
        };
        match turn {
            Turn::Drain => self.drain_now(ebpf)?,
            Turn::Poll => self.timer.poll(self.kernel, ebpf),
        }
        Ok(())
    }

    fn interval(&mut self, ebpf: &mut Ebpf, now_ns: u64) -> Result<Printout> {
        self.drain_now(ebpf)?;
        let now = self.drain.totals.clone();
        let previous = &self.intervals.previous;
        let interval_ns = now_ns.saturating_sub(self.intervals.previous_ns);
        let mut line = aggregator::interval(previous, &now, interval_ns, self.seen.lock_waits, self.seen.callbacks);
        line.end_ns = now_ns.saturating_sub(self.started_ns);
        self.intervals = Intervals { previous: now, previous_ns: now_ns };
        Ok(Printout::new(report::interval_json(&line), render::interval_text(&line)))
    }

    /// Read while the programs are loaded: detaching unloads them, and their fdinfo with them.
    fn before_detach(&mut self, ebpf: &Ebpf) {
        self.skipped = crate::collect::counters::program_runs_skipped(&self.kernel.release, ebpf, |program| {
            program.starts_with("inv_")
        });
    }

    fn drain(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        self.drain_now(ebpf)
    }

    fn summary(&mut self, _ebpf: &mut Ebpf, end: &End) -> Result<Printout> {
        self.seen.callbacks_skipped = self.timer.skipped().to_vec();
        let summary = self.summarize(end.end_ns);
        let json = format!(
            "{}\n{}",
            report::summary_json(&summary, end.stopped_by, &self.seen),
            report::lost_events_json(&summary.lost_events)
        );
        let text = render::summary_text(&summary, end.stopped_by);
        self.summary = Some(summary);
        Ok(Printout::new(json, text))
    }

    fn plot(&self, end: &End) -> Result<String> {
        let summary = self.summary.clone().unwrap_or_else(|| self.summarize(end.end_ns));
        let figure = plot::histogram_plot(&self.kernel.release.text, &summary, end.stopped_by, &self.thresholds);
        Ok(histogram_svg(&figure)?)
    }
}
