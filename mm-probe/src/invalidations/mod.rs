//! `mm-probe invalidations`: where MMU-notifier invalidations spend their time.
//!
//! hooks (probes.rs: KVM's tracepoints, lock contention, the notifier's functions, the known
//! subscribers' callbacks) → tables aggregated in the kernel → read and summed (decoder.rs) →
//! invalidators, contended locks named and split by waiting path (locks.rs), subscribers with
//! their time-against-size fit (aggregator.rs) → verdict and advice (judge.rs) → JSON lines
//! (report.rs) or text (render.rs), and with `--plot` a figure of the distributions (plot.rs).

pub mod aggregator;
pub mod callbacks;
pub mod contention;
pub mod decoder;
pub mod judge;
pub mod locks;
pub mod plot;
pub mod probes;
pub mod render;
pub mod report;

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::{
    invalidations::{self as names},
    layout as offsets,
};

use self::{
    aggregator::{PeakRate, Scope},
    decoder::{DRAIN_PERIOD, Drain, Tables},
    judge::Thresholds,
    locks::KvmMembers,
    probes::Observability,
    report::Summary,
};
use crate::{
    cli::InvalidationsArgs,
    collect::{Limits, Stop, Stopper, Ticker, monotonic_ns, run as skeleton},
    error::UserError,
    kernel::{Kallsyms, Kernel, layout::Layout, privileges, tracefs},
    probes::{GlobalValue, MapFamily, Planner, detach_all, load_object},
    report::{
        json,
        plot::{PlotFile, histogram_svg},
        text,
        verdict::Band,
    },
    units::format_nanos,
};

/// Runs the kernel skipped because the CPU's bpf_prog_active was taken: by another tracing
/// program, or on a preemptible kernel by a map syscall (this tool's reads among them) preempted
/// on that CPU; unknown (null) where the kernel does not count them all.
fn program_runs_skipped(kernel: &Kernel, ebpf: &Ebpf) -> Option<u64> {
    crate::collect::counters::program_runs_skipped(&kernel.release, ebpf, |program| program.starts_with("inv_"))
}

pub fn run(args: &InvalidationsArgs) -> Result<()> {
    privileges::require_tracing()?;
    let thresholds = thresholds_from(args)?;
    let plot = args.plot.as_deref().map(PlotFile::check).transpose()?;
    let limits = Limits::of_processes(args.duration, &args.pids)?;
    skeleton::run(limits, async |stopper| attach_and_collect(args, thresholds, plot, stopper).await)
}

async fn attach_and_collect(
    args: &InvalidationsArgs,
    thresholds: Thresholds,
    plot: Option<PlotFile>,
    stopper: &mut Stopper,
) -> Result<()> {
    let kernel = Kernel::running()?;
    let mut ebpf = load_object(&kernel, &[MapFamily::Invalidations], &settings(&kernel, &args.pids))?;
    crate::probes::select_processes(&mut ebpf, names::TARGET_TGIDS_MAP, &args.pids)?;
    let plan = Planner::new(&kernel).attach_all(&mut ebpf, probes::PROBES);
    let mut timer = callbacks::CallbackTimer::start(&kernel, &mut ebpf, &plan);
    let mut seen = probes::observability(&plan, timer.plan(), kvm_locks_nameable(&kernel));
    if args.json {
        println!("{}", report::plan_json(&kernel.release.text, &plan, &timer.plan().timed, &seen, &thresholds));
    } else {
        text::eprint(&render::plan_text(&kernel.release.text, &plan, &timer.plan().timed, &seen));
    }
    let started_ns = monotonic_ns();
    let kallsyms = kernel.kallsyms().ok();
    let mut run =
        Collection { drain: Drain::default(), peak: PeakRate::default(), kallsyms, started_ns, drained_ns: None };
    let mut intervals = Intervals::new(started_ns);
    let stopped_by = collect(&mut ebpf, &kernel, args, &seen, &mut run, &mut intervals, &mut timer, stopper).await?;
    // Read while the programs are loaded: detaching unloads them, and their fdinfo with them.
    let skipped = program_runs_skipped(&kernel, &ebpf);
    detach_all(&mut ebpf).await;
    run.drain_now(&mut ebpf)?;
    let end_ns = monotonic_ns();
    // The partial last interval too, however short: the intervals then add up to the summary.
    if args.interval.is_some() {
        intervals.print(run.drain.totals.clone(), end_ns, args.json, &seen);
    }
    for pid in stopper.exited_targets() {
        text::eprintln(&format!("mm-probe: process {pid} exited while being traced; partial results below"));
    }
    seen.callbacks_skipped = timer.skipped().to_vec();
    let kallsyms = timer.kallsyms().or_else(|| kernel.kallsyms().ok());
    let scope = Scope { range_starts: seen.range_starts, kvm_unmaps: seen.kvm_unmaps, pids: &args.pids };
    let duration_ns = end_ns - started_ns;
    let mut summary =
        summarize(&kernel, kallsyms, &run.drain.totals, &seen, &thresholds, duration_ns, scope, &run.peak);
    summary.lost_events.program_runs_skipped = skipped;
    if args.json {
        println!("{}", report::summary_json(&summary, stopped_by, &seen));
        println!("{}", report::lost_events_json(&summary.lost_events));
    } else {
        text::print(&render::summary_text(&summary, stopped_by));
    }
    if let Some(file) = plot {
        let figure = plot::histogram_plot(&kernel.release.text, &summary, stopped_by, &thresholds);
        file.write(&histogram_svg(&figure)?)?;
        println!("{}", file.written_line(args.json.then_some(json::Line::InvalidationsPlot)));
    }
    Ok(())
}

/// What a run keeps between drains: the totals, the peak rate, the symbols.
struct Collection<'k> {
    drain: Drain,
    peak: PeakRate,
    kallsyms: Option<&'k Kallsyms>,
    started_ns: u64,
    drained_ns: Option<u64>,
}

impl Collection<'_> {
    /// Adds the kernel's tables to the totals and takes the period in for the peak rate.
    fn drain_now(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let before = self.drain.totals.clone();
        let before_ns = self.drained_ns.unwrap_or(self.started_ns);
        self.drain.drain(ebpf, self.kallsyms)?;
        let now_ns = monotonic_ns();
        self.drained_ns = Some(now_ns);
        let seconds = now_ns.saturating_sub(before_ns) as f64 / 1e9;
        self.peak.observe(&before, &self.drain.totals, seconds, now_ns - self.started_ns);
        Ok(())
    }
}

/// The `--interval` lines: each the totals' change since the previous one.
struct Intervals {
    previous: Tables,
    previous_ns: u64,
    started_ns: u64,
}

impl Intervals {
    fn new(started_ns: u64) -> Self {
        Self { previous: Tables::default(), previous_ns: started_ns, started_ns }
    }

    /// Prints the interval that ends with `now` (read at `now_ns`).
    fn print(&mut self, now: Tables, now_ns: u64, json: bool, seen: &Observability) {
        let mut line = aggregator::interval(
            &self.previous,
            &now,
            now_ns.saturating_sub(self.previous_ns),
            seen.lock_waits,
            seen.callbacks,
        );
        line.end_ns = now_ns.saturating_sub(self.started_ns);
        if json {
            println!("{}", report::interval_json(&line));
        } else {
            text::println(&render::interval_text(&line));
        }
        (self.previous, self.previous_ns) = (now, now_ns);
    }
}

/// Drains once per [`DRAIN_PERIOD`], prints a line per `--interval` and times each
/// subscriber's callback as the kernel side finds it, until the end.
async fn collect(
    ebpf: &mut Ebpf,
    kernel: &Kernel,
    args: &InvalidationsArgs,
    seen: &Observability,
    run: &mut Collection<'_>,
    intervals: &mut Intervals,
    timer: &mut callbacks::CallbackTimer,
    stopper: &mut Stopper,
) -> Result<Stop> {
    let mut drain = Ticker::every(Some(DRAIN_PERIOD));
    let mut tick = Ticker::every(args.interval);
    let mut poll = Ticker::every(Some(callbacks::POLL_PERIOD));
    loop {
        tokio::select! {
            () = drain.tick() => run.drain_now(ebpf)?,
            () = tick.tick() => {
                run.drain_now(ebpf)?;
                intervals.print(run.drain.totals.clone(), monotonic_ns(), args.json, seen);
            }
            () = poll.tick() => timer.poll(kernel, ebpf),
            reason = stopper.wait() => return Ok(reason),
        }
    }
}

fn summarize(
    kernel: &Kernel,
    kallsyms: Option<&Kallsyms>,
    tables: &Tables,
    seen: &Observability,
    thresholds: &Thresholds,
    duration_ns: u64,
    scope: Scope<'_>,
    peak: &PeakRate,
) -> Summary {
    let mut invalidations = aggregator::invalidations(tables, duration_ns as f64 / 1e9, scope);
    invalidations.peak = peak.peak.clone();
    let (locks, other_contention) = contention::locks(tables, &kvm_members(kernel));
    let subscribers = aggregator::subscribers(tables, kallsyms, seen.lock_waits);
    let lost_events = aggregator::lost_events(tables);
    let evidence = aggregator::evidence(&invalidations, &locks, &subscribers, seen, &lost_events);
    Summary {
        duration_ns,
        verdict: judge::judge(&evidence, thresholds),
        invalidations,
        locks,
        other_contention,
        lock_waits_observable: seen.lock_waits,
        subscribers,
        callbacks_observable: seen.callbacks,
        lost_events,
        counters: aggregator::counters(tables),
    }
}

/// Whether VMs' locks can be named: KVM's callback in kallsyms, `struct kvm` in BTF (vmlinux's,
/// or the kvm module's).
pub fn kvm_locks_nameable(kernel: &Kernel) -> bool {
    if kvm_range_start(kernel).is_none() {
        return false;
    }
    let Ok(btf) = kernel.btf() else { return false };
    Layout::offset_in(btf, offsets::KVM_MMU_LOCK).is_some()
        && Layout::offset_in(btf, offsets::KVM_MMU_NOTIFIER).is_some()
}

/// `struct kvm`'s members, to name the locks inside a VM (empty without KVM's BTF).
pub fn kvm_members(kernel: &Kernel) -> KvmMembers {
    let Ok(btf) = kernel.btf() else { return KvmMembers::default() };
    btf.struct_members("kvm")
        .or_else(|| btf.module("kvm")?.struct_members("kvm"))
        .map(|(size, members)| KvmMembers { size, members })
        .unwrap_or_default()
}

/// The kernel image's [_text, _end), where static locks live.
fn kernel_image(kernel: &Kernel) -> Option<(u64, u64)> {
    kernel.kallsyms().ok()?.kernel_image()
}

fn kvm_range_start(kernel: &Kernel) -> Option<u64> {
    kernel.kallsyms().ok().and_then(|k| k.address_of(probes::KVM_RANGE_START))
}

/// Globals: the -p filter, KVM's callback address, this kernel's tracepoint field offsets.
pub fn settings(kernel: &Kernel, pids: &[u32]) -> Vec<(&'static str, GlobalValue)> {
    let kvm_start = kvm_range_start(kernel);
    let image = kernel_image(kernel);
    let root = tracefs::root().ok();
    let offset = |category, event, field, default| {
        let found = root.as_deref().and_then(|r| tracefs::field_offset(r, category, event, field));
        GlobalValue::U32(found.unwrap_or(default))
    };
    let [notifier_ops, interval_ops] = callbacks::settings(kernel);
    vec![
        (names::FILTER_TGIDS, GlobalValue::U32(u32::from(!pids.is_empty()))),
        (names::KVM_RANGE_START_FN, GlobalValue::U64(kvm_start.unwrap_or(0))),
        (names::KERNEL_TEXT, GlobalValue::U64(image.map_or(0, |i| i.0))),
        (names::KERNEL_END, GlobalValue::U64(image.map_or(0, |i| i.1))),
        (names::BEGIN_LOCK_OFFSET, offset("lock", "contention_begin", "lock_addr", 8)),
        (names::BEGIN_FLAGS_OFFSET, offset("lock", "contention_begin", "flags", 16)),
        (names::END_LOCK_OFFSET, offset("lock", "contention_end", "lock_addr", 8)),
        (names::KVM_START_OFFSET, offset("kvm", "kvm_unmap_hva_range", "start", 8)),
        (names::KVM_END_OFFSET, offset("kvm", "kvm_unmap_hva_range", "end", 16)),
        notifier_ops,
        interval_ops,
    ]
}

/// A band of durations, in nanoseconds, refused in the units the user typed.
fn duration_band(name: &str, warn: std::time::Duration, crit: std::time::Duration) -> Result<Band, UserError> {
    if warn > crit {
        return Err(UserError::new(format!(
            "--{name}-warn ({}) must be no longer than --{name}-crit ({})",
            format_nanos(warn.as_nanos() as u64),
            format_nanos(crit.as_nanos() as u64)
        )));
    }
    Ok(Band { warn: warn.as_nanos() as f64, crit: crit.as_nanos() as f64 })
}

fn thresholds_from(args: &InvalidationsArgs) -> Result<Thresholds, UserError> {
    let band = Band::checked;
    Ok(Thresholds {
        invalidate_freq: band("invalidate-freq", args.invalidate_freq_warn, args.invalidate_freq_crit)?,
        wait_per_invalidation_ns: duration_band("wait", args.wait_warn, args.wait_crit)?,
        callback_mean_ns: duration_band("callback", args.callback_warn, args.callback_crit)?,
        amplification: band("amplification", args.amplification_warn, args.amplification_crit)?,
    })
}
