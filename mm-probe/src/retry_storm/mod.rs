//! `mm-probe retry-storm`: HMM / MMU-notifier retry storms.
//!
//! hooks (probes.rs) → kernel counters + two rings (walks, invalidations) → decoder
//! (events.rs) → retry chains (chains.rs) and walk/invalidation overlap (overlap.rs) → window
//! metrics (metrics.rs) → verdict (verdict.rs) → text or NDJSON (render.rs). With `--plot`, the
//! kernel counters are also sampled into a bounded series (timeline.rs) drawn at the end (plot.rs).

pub mod chains;
pub mod events;
pub mod metrics;
pub mod overlap;
pub mod plot;
pub mod probes;
pub mod render;
pub mod timeline;
pub mod verdict;

use crate::collect::monotonic_ns;
use std::{future::pending, time::Duration};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, PerCpuHashMap},
};
use mm_probe_common::hmm::{self as names, HmmEvent, ReadBeginKey};

use self::{
    chains::ChainJoiner,
    events::{Event, decode},
    metrics::{KernelCounters, Observability, ReadBeginCaller, Snapshot, Window, bucket_delta},
    overlap::OverlapJoiner,
    timeline::Timeline,
    verdict::{Band, Thresholds},
};
use crate::{
    cli::RetryStormArgs,
    collect::{RingReader, counters::percpu_sums, wait_for_stop},
    error::UserError,
    kernel::{Kernel, privileges},
    probes::{GlobalValue, MapFamily, Plan, Planner, detach_all, load_object},
    report::{
        json,
        plot::{PlotFile, rates_over_time_svg},
    },
    user_bail,
};

/// How long after a walk returned mm-probe waits for the invalidations that could have failed
/// it (they come through the other ring).
const SETTLE: Duration = Duration::from_millis(100);
/// How long invalidations are kept for walks whose window started long before they returned.
const RETAIN: Duration = Duration::from_secs(2);
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
    for pid in &args.pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            user_bail!("process {pid} does not exist: give the pid of a running process that mirrors memory (-p)");
        }
    }
    let kernel = Kernel::running()?;
    let mut ebpf = load_object(&kernel, &[MapFamily::RetryStorm], &settings(&args.pids))?;
    select_processes(&mut ebpf, &args.pids)?;
    let plan = Planner::new(&kernel).attach_all(&mut ebpf, probes::PROBES);
    let seen = observability(&kernel, &plan);
    let timeout_ns = args.timeout.as_nanos() as u64;
    if args.json {
        println!("{}", render::plan_json(&kernel.release.text, &plan, &seen, &thresholds, timeout_ns));
    } else {
        eprint!("{}", render::plan_text(&kernel.release.text, &plan, &seen));
    }
    let numa_balancing = std::fs::read_to_string("/proc/sys/kernel/numa_balancing").ok().map(|s| s.trim().to_string());
    let mut collector = Collector::new(timeout_ns, seen, thresholds, numa_balancing);
    let plot = plot.map(|file| {
        collector.timeline =
            Some(Timeline::new(collector.run_start_ns, PLOT_SAMPLE_PERIOD.as_nanos() as u64, PLOT_MAX_SAMPLES));
        PlotRequest { file, kernel: kernel.release.text.clone() }
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(collect(&mut ebpf, collector, args, plot))
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

/// Tells the kernel side which processes `-p` selected.
fn select_processes(ebpf: &mut Ebpf, pids: &[u32]) -> Result<()> {
    let mut targets: BpfHashMap<_, u32, u8> =
        BpfHashMap::try_from(ebpf.map_mut(names::TARGET_TGIDS_MAP).context("target map missing from the object")?)?;
    for pid in pids {
        targets.insert(pid, 1, 0).with_context(|| format!("watching process {pid}"))?;
    }
    Ok(())
}

fn thresholds_from(args: &RetryStormArgs) -> Result<Thresholds, UserError> {
    let band = |name: &str, warn: f64, crit: f64| {
        if !(warn.is_finite() && crit.is_finite() && warn >= 0.0 && warn <= crit) {
            return Err(UserError::new(format!(
                "--{name}-warn ({warn}) must be a number no larger than --{name}-crit ({crit})"
            )));
        }
        Ok(Band { warn, crit })
    };
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

/// Whether the kernel has hmm_range_fault at all (CONFIG_HMM_MIRROR), from BTF or kallsyms.
fn has_hmm(kernel: &Kernel) -> bool {
    kernel.btf().ok().and_then(|b| b.function_params("hmm_range_fault")).is_some()
        || kernel.kallsyms().ok().and_then(|k| k.resolve("hmm_range_fault")).is_some()
}

/// Reads the plan into what can be observed, with a plain sentence for each gap.
pub fn observability(kernel: &Kernel, plan: &Plan) -> Observability {
    let mut seen = Observability {
        walks: plan.is_attached(probes::WALK_PROBE),
        read_begins: plan.is_attached(probes::READ_BEGIN_PROBE),
        notifier_removes: plan.is_attached(probes::REMOVE_PROBE),
        invalidations: plan.is_attached(probes::INVALIDATE_START_PROBE),
        invalidation_ends: plan.is_attached(probes::INVALIDATE_END_PROBE),
        kvm_unmap: plan.is_attached(probes::KVM_UNMAP_PROBE),
        kvm_age: plan.is_attached(probes::KVM_AGE_PROBE),
        statements: Vec::new(),
    };
    let why = |probe: &str| plan.get(probe).map(|p| p.why_unavailable()).unwrap_or_default();
    if !seen.walks {
        let reason = if has_hmm(kernel) {
            format!(
                "hmm_range_fault is not observable: it exists on this kernel but could not be probed ({})",
                why(probes::WALK_PROBE)
            )
        } else {
            format!(
                "hmm_range_fault is not observable: this kernel has no hmm_range_fault (not in its BTF nor in /proc/kallsyms: it is built without CONFIG_HMM_MIRROR), so nothing here can mirror memory through HMM ({})",
                why(probes::WALK_PROBE)
            )
        };
        seen.statements
            .push(format!("{reason}. Retry rates, timeouts, retry loops and walk latency cannot be measured here."));
    }
    if !seen.read_begins && seen.walks {
        seen.statements.push(format!(
            "mmu_interval_read_begin is not observable ({}): walk windows start at walk entry and sequence starts are not counted.",
            why(probes::READ_BEGIN_PROBE)
        ));
    }
    if !seen.notifier_removes && seen.walks {
        seen.statements.push(format!(
            "mmu_interval_notifier_remove is not observable ({}): a retry loop that gives up before --timeout is seen only if it ran past --timeout.",
            why(probes::REMOVE_PROBE)
        ));
    }
    if !seen.invalidations {
        seen.statements.push(format!(
            "MMU-notifier invalidations are not observable ({}): retry_rate per invalidation, invalidate_freq, invalidators and overlaps cannot be measured.",
            why(probes::INVALIDATE_START_PROBE)
        ));
    } else if !seen.walks && !seen.read_begins {
        // Only mms seen mirroring are watched, and nothing can see them mirror here.
        seen.invalidations = false;
        seen.statements.push(
            "MMU-notifier invalidations are not watched: they are attributed to mirrored memory, which cannot be recognised without the walk or read_begin probes.".into(),
        );
    }
    if seen.invalidations && !seen.invalidation_ends {
        seen.statements.push(format!(
            "__mmu_notifier_invalidate_range_end is not observable ({}): invalidation windows are not measured.",
            why(probes::INVALIDATE_END_PROBE)
        ));
    }
    if !seen.kvm_unmap && !seen.kvm_age {
        seen.statements.push(format!(
            "KVM's kvm_unmap_hva_range/kvm_age_hva tracepoints are not available ({}).",
            why(probes::KVM_UNMAP_PROBE)
        ));
    }
    seen
}

/// Kernel-side cumulative state (since the object was loaded), summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct KernelTotals {
    pub counters: KernelCounters,
    /// Log2 buckets (ns) of the time in invalidate_range_start.
    pub callback_ns: Vec<u64>,
    pub window_ns: Vec<u64>,
    pub kvm_sizes: Vec<u64>,
    /// Invalidations of mirrored mms by `enum mmu_notifier_event` (last slot: unknown).
    pub invalidations_by_event: Vec<u64>,
}

impl KernelTotals {
    /// Reads every counter and histogram (cheap: the exporter does it on each scrape).
    pub fn read(ebpf: &Ebpf) -> Result<Self> {
        Ok(Self {
            counters: KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?),
            callback_ns: percpu_sums(ebpf, names::CALLBACK_HIST_MAP)?,
            window_ns: percpu_sums(ebpf, names::WINDOW_HIST_MAP)?,
            kvm_sizes: percpu_sums(ebpf, names::KVM_SIZE_HIST_MAP)?,
            invalidations_by_event: percpu_sums(ebpf, names::INVALIDATIONS_BY_EVENT_MAP)?,
        })
    }
}

/// Everything user space keeps while the run lasts.
struct Collector {
    chains: ChainJoiner,
    overlap: OverlapJoiner,
    current: Window,
    total: Window,
    run_start_ns: u64,
    previous: KernelTotals,
    seen: Observability,
    thresholds: Thresholds,
    numa_balancing: Option<String>,
    malformed: u64,
    /// Rate samples for `--plot`; `None` without it.
    timeline: Option<Timeline>,
}

impl Collector {
    fn new(timeout_ns: u64, seen: Observability, thresholds: Thresholds, numa_balancing: Option<String>) -> Self {
        let now = monotonic_ns();
        Self {
            chains: ChainJoiner::new(timeout_ns),
            overlap: OverlapJoiner::new(SETTLE.as_nanos() as u64, RETAIN.as_nanos() as u64),
            current: Window::new(now),
            total: Window::new(now),
            run_start_ns: now,
            previous: KernelTotals::default(),
            seen,
            thresholds,
            numa_balancing,
            malformed: 0,
            timeline: None,
        }
    }

    /// Reads the kernel counters into the `--plot` timeline.
    fn sample(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<()> {
        if let Some(timeline) = &mut self.timeline {
            timeline.record(now_ns, &KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?));
        }
        Ok(())
    }

    /// The last read of the `--plot` timeline, once nothing more can be counted.
    fn finish_sampling(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<()> {
        if let Some(timeline) = &mut self.timeline {
            timeline.finish(now_ns, &KernelCounters::from_slice(&percpu_sums(ebpf, names::COUNTERS_MAP)?));
        }
        Ok(())
    }

    fn on_raw(&mut self, raw: &HmmEvent) {
        match decode(raw) {
            Some(Event::Walk(walk)) => {
                self.current.add_walk(&walk);
                if let Some(chain) = self.chains.walk(&walk) {
                    self.current.add_chain(&chain);
                }
                self.overlap.add_walk(walk);
            }
            Some(Event::Invalidate(invalidation)) => {
                self.current.add_invalidation(&invalidation);
                self.overlap.add_invalidation(invalidation);
            }
            Some(Event::NotifierRemove(remove)) => {
                for chain in self.chains.notifier_removed(remove.notifier) {
                    self.current.add_chain(&chain);
                }
            }
            None => self.malformed += 1,
        }
    }

    fn apply_settled(&mut self, settled: overlap::Settled) {
        for (walk, cause) in &settled.busy_causes {
            self.current.add_busy_cause(walk, *cause);
        }
        for (_, overlap) in settled.invalidations {
            self.current.add_overlap(overlap);
        }
    }

    fn settle(&mut self, now_ns: u64) {
        let settled = self.overlap.settle(now_ns);
        self.apply_settled(settled);
    }

    /// Ends the current window at `now_ns` with the kernel's counters; returns its snapshot.
    fn close_window(&mut self, ebpf: &Ebpf, now_ns: u64) -> Result<Snapshot> {
        let totals = KernelTotals::read(ebpf)?;
        let mut window = std::mem::replace(&mut self.current, Window::new(now_ns));
        window.end_ns = now_ns;
        window.counters = totals.counters.since(&self.previous.counters);
        window.callback_ns = bucket_delta(&totals.callback_ns, &self.previous.callback_ns);
        window.window_ns = bucket_delta(&totals.window_ns, &self.previous.window_ns);
        window.kvm_sizes = bucket_delta(&totals.kvm_sizes, &self.previous.kvm_sizes);
        self.previous = totals;
        self.total.merge(&window);
        Ok(self.snapshot(&window))
    }

    fn snapshot(&self, window: &Window) -> Snapshot {
        Snapshot::build(window, self.run_start_ns, &self.seen, &self.thresholds, self.numa_balancing.clone())
    }
}

/// The kernel's per-(notifier, tgid) read_begin counts, most first.
fn read_begins_by_caller(ebpf: &Ebpf) -> Result<Vec<ReadBeginCaller>> {
    let map: PerCpuHashMap<_, ReadBeginKey, u64> =
        PerCpuHashMap::try_from(ebpf.map(names::READ_BEGINS_MAP).context("read_begin map missing from the object")?)?;
    let mut callers = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        callers.push(ReadBeginCaller {
            tgid: key.tgid,
            notifier: format!("{:#x}", key.notifier),
            calls: per_cpu.iter().sum(),
        });
    }
    callers.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.tgid.cmp(&b.tgid)));
    callers.truncate(metrics::TOP_INVALIDATORS);
    Ok(callers)
}

/// The next tick of `tick`, or never when there is none.
async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(tick) => {
            tick.tick().await;
        }
        None => pending::<()>().await,
    }
}

/// A tick every `period`, the first one period from now; late ticks are not made up in a burst
/// (a burst would close samples only microseconds long).
fn every(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

async fn collect(
    ebpf: &mut Ebpf,
    mut collector: Collector,
    args: &RetryStormArgs,
    plot: Option<PlotRequest>,
) -> Result<()> {
    let mut walk_ring: RingReader<HmmEvent> =
        RingReader::new(ebpf.take_map(names::WALK_EVENTS_MAP).context("walk ring missing from the object")?)?;
    let mut invalidate_ring: RingReader<HmmEvent> = RingReader::new(
        ebpf.take_map(names::INVALIDATE_EVENTS_MAP).context("invalidation ring missing from the object")?,
    )?;
    let stop = wait_for_stop(args.duration);
    tokio::pin!(stop);
    let mut settle_tick = tokio::time::interval(SETTLE_TICK);
    let mut report_tick =
        args.interval.map(|period| tokio::time::interval_at(tokio::time::Instant::now() + period, period));
    let mut plot_tick = collector.timeline.is_some().then(|| every(PLOT_SAMPLE_PERIOD));
    let (mut walk_batch, mut invalidate_batch) = (Vec::new(), Vec::new());
    let stopped_by = loop {
        tokio::select! {
            read = walk_ring.read(|raw| walk_batch.push(raw)) => { read?; }
            read = invalidate_ring.read(|raw| invalidate_batch.push(raw)) => { read?; }
            _ = settle_tick.tick() => collector.settle(monotonic_ns()),
            _ = next_tick(&mut plot_tick) => collector.sample(ebpf, monotonic_ns())?,
            _ = next_tick(&mut report_tick) => {
                collector.settle(monotonic_ns());
                let snapshot = collector.close_window(ebpf, monotonic_ns())?;
                if args.json {
                    println!("{}", render::interval_json(&snapshot));
                } else {
                    println!("{}", render::interval_text(&snapshot));
                }
            }
            reason = &mut stop => break reason,
        }
        // Walks first: an invalidation batch read in the same turn may be newer, never older
        // than what the overlap joiner still holds for them.
        for raw in walk_batch.drain(..) {
            collector.on_raw(&raw);
        }
        for raw in invalidate_batch.drain(..) {
            collector.on_raw(&raw);
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
    for chain in collector.chains.finish() {
        collector.current.add_chain(&chain);
    }
    let settled = collector.overlap.finish();
    collector.apply_settled(settled);
    let end_ns = monotonic_ns();
    collector.finish_sampling(ebpf, end_ns)?;
    let last = collector.close_window(ebpf, end_ns)?;
    if args.interval.is_some() && last.duration_ns > 0 {
        if args.json {
            println!("{}", render::interval_json(&last));
        } else {
            println!("{}", render::interval_text(&last));
        }
    }
    let total = collector.total.clone();
    let mut summary = collector.snapshot(&total);
    if collector.seen.read_begins {
        summary.read_begins_by_caller = read_begins_by_caller(ebpf)?;
    }
    let stopped_by = stopped_by.name();
    if args.json {
        println!("{}", render::summary_json(&summary, stopped_by, &collector.seen));
        println!("{}", render::lost_json(&summary));
    } else {
        print!("{}", render::summary_text(&summary, &collector.seen, stopped_by));
    }
    if collector.malformed + walk_ring.malformed + invalidate_ring.malformed > 0 {
        eprintln!(
            "mm-probe: {} malformed events ignored (the eBPF object and this binary disagree on a record layout)",
            collector.malformed + walk_ring.malformed + invalidate_ring.malformed
        );
    }
    if let (Some(request), Some(timeline)) = (plot, &collector.timeline) {
        let run = plot::RunFacts { kernel: &request.kernel, duration_s: summary.duration_ns as f64 / 1e9, stopped_by };
        let figure = plot::rates_plot(&run, timeline.samples(), &collector.thresholds, &collector.seen);
        request.file.write(&rates_over_time_svg(&figure)?)?;
        println!("{}", request.file.written_line(args.json.then_some(json::Line::RetryStormPlot)));
    }
    Ok(())
}
