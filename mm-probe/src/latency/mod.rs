//! `mm-probe latency`: real-time wakeup latency and the mm code that delays it.
//!
//! The kernel side (`sched.rs`, `func_latency.rs`) keeps log-linear histograms of every wakeup
//! and traced call and sends only those over the threshold. Here: decoder (records → typed
//! spikes, stacks symbolized) → attribution (who held the CPU, in which function, which
//! syscall) → aggregator (distributions, tasks, worst spikes) → verdict → render.

pub mod aggregator;
pub mod attribution;
pub mod decoder;
pub mod plot;
pub mod probes;
pub mod render;
pub mod verdict;

use crate::collect::monotonic_ns;
use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, StackTraceMap},
};
use mm_probe_common::{
    latency::{
        self as names, COUNTERS_MAP, Counter, FILTER_ALL, FILTER_PIDS, FILTER_RT, FuncSpike, MAX_FUNCS,
        QUANTITY_WAKEUP, WakeupSpike,
    },
    layout,
};

use self::{
    aggregator::{Distribution, HistReader, Worst},
    attribution::{Attribution, attribute},
    decoder::{Decoder, FunctionCall, Wakeup},
    render::{Availability, FunctionPlan, Header, Interval, LostEvents, Quantity, Summary},
};
use crate::{
    cli::{LatencyArgs, LatencySelection},
    collect::{
        RingReader, Stop,
        counters::{self, percpu_sums},
        wait_for_stop,
    },
    error::UserError,
    kernel::{Kallsyms, Kernel, layout::Layout, privileges, tracefs},
    probes::{GlobalValue, LogicalProbe, MapFamily, Plan, Planner, detach_all, load_object},
    report::{
        json,
        plot::{PlotFile, histogram_svg},
    },
    user_bail,
};

/// What to measure, checked against the machine before anything loads.
#[derive(Clone, Debug)]
pub struct Options {
    pub threshold_ns: u64,
    pub filter: u32,
    /// Thread ids to measure (with FILTER_PIDS): every thread of each `-p` process.
    pub pids: Vec<u32>,
    pub requested_pids: Vec<u32>,
    /// Function per slot: the default first, then each distinct `--func`.
    pub functions: Vec<String>,
    pub duration: Option<Duration>,
    pub interval: Option<Duration>,
    pub top: usize,
    pub json: bool,
    /// Where `--plot` draws the histograms at the end.
    pub plot: Option<PlotFile>,
}

impl Options {
    pub fn from_args(args: &LatencyArgs) -> Result<Self> {
        Ok(Self {
            duration: args.duration,
            interval: args.interval.filter(|i| !i.is_zero()),
            top: args.top,
            json: args.json,
            plot: args.plot.as_deref().map(PlotFile::check).transpose()?,
            ..Self::from_selection(&args.selection)?
        })
    }

    /// What to measure, checked, without a run length or output choices (the exporter's case).
    pub fn from_selection(args: &LatencySelection) -> Result<Self> {
        if args.threshold.is_zero() {
            user_bail!("--threshold must be above zero (e.g. 500us)");
        }
        let mut functions = vec![probes::DEFAULT_FUNCTION.to_string()];
        for f in &args.functions {
            if !functions.contains(f) {
                functions.push(f.clone());
            }
        }
        if functions.len() > MAX_FUNCS {
            user_bail!(
                "at most {} --func targets besides {} can be traced at once (got {})",
                MAX_FUNCS - 1,
                probes::DEFAULT_FUNCTION,
                args.functions.len()
            );
        }
        if !args.pids.is_empty() && args.all_tasks {
            user_bail!("-p and --all-tasks exclude each other: -p measures only the given processes");
        }
        let mut pids = Vec::new();
        for &pid in &args.pids {
            pids.extend(threads_of(pid)?);
        }
        let filter = match (args.pids.is_empty(), args.all_tasks) {
            (false, _) => FILTER_PIDS,
            (true, true) => FILTER_ALL,
            (true, false) => FILTER_RT,
        };
        Ok(Self {
            threshold_ns: u64::try_from(args.threshold.as_nanos()).unwrap_or(u64::MAX),
            filter,
            pids,
            requested_pids: args.pids.clone(),
            functions,
            duration: None,
            interval: None,
            top: 0,
            json: false,
            plot: None,
        })
    }

    fn selection(&self) -> &'static str {
        match self.filter {
            FILTER_PIDS => "pids",
            FILTER_ALL => "all",
            _ => "rt",
        }
    }
}

/// The threads of process `pid` (wakeups are per thread; a `-p` means all of them).
fn threads_of(pid: u32) -> Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir)
        .map_err(|_| UserError::new(format!("process {pid} does not exist (no {dir}); check the pid with ps")))?;
    let mut threads: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    threads.sort_unstable();
    Ok(threads)
}

pub fn run(args: &LatencyArgs) -> Result<()> {
    let options = Options::from_args(args)?;
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    check_functions_exist(&kernel, &options)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(trace(&kernel, &options))
}

/// A mistyped `--func` is a usage error, not a silently empty histogram.
pub fn check_functions_exist(kernel: &Kernel, options: &Options) -> Result<()> {
    if options.functions.len() < 2 {
        return Ok(());
    }
    let Ok(kallsyms) = kernel.kallsyms() else { return Ok(()) };
    for f in options.functions.iter().skip(1) {
        if kallsyms.resolve(f).is_none() {
            user_bail!(
                "--func {f}: no such kernel function in /proc/kallsyms (inlined, renamed, or its module is not loaded)"
            );
        }
    }
    Ok(())
}

/// Globals: threshold, selection, syscall reading (`syscall_attribution`), and the tracepoint
/// field offsets of this kernel.
pub fn settings(options: &Options, syscalls: &Availability) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = vec![
        (names::THRESHOLD_NS, GlobalValue::U64(options.threshold_ns)),
        (names::FILTER_MODE, GlobalValue::U32(options.filter)),
        (names::SYSCALL_FROM_REGS, GlobalValue::U32(u32::from(syscalls.available))),
    ];
    let Ok(root) = tracefs::root() else { return settings };
    // (category, event, [(field, global)]).
    type Fields<'a> = (&'a str, &'a str, &'a [(&'a str, &'static str)]);
    let fields: &[Fields] = &[
        (
            "sched",
            "sched_wakeup",
            &[
                ("comm", names::TP_WAKEUP_COMM),
                ("pid", names::TP_WAKEUP_PID),
                ("prio", names::TP_WAKEUP_PRIO),
                ("target_cpu", names::TP_WAKEUP_TARGET_CPU),
            ],
        ),
        (
            "sched",
            "sched_switch",
            &[
                ("prev_comm", names::TP_SWITCH_PREV_COMM),
                ("prev_pid", names::TP_SWITCH_PREV_PID),
                ("prev_prio", names::TP_SWITCH_PREV_PRIO),
                ("prev_state", names::TP_SWITCH_PREV_STATE),
                ("next_comm", names::TP_SWITCH_NEXT_COMM),
                ("next_pid", names::TP_SWITCH_NEXT_PID),
                ("next_prio", names::TP_SWITCH_NEXT_PRIO),
            ],
        ),
    ];
    for (category, event, wanted) in fields {
        // sched_wakeup_new shares sched_wakeup's record layout (sched_wakeup_template).
        let Ok(offsets) = tracefs::field_offsets(&root, category, event) else { continue };
        for (field, global) in *wanted {
            if let Some((_, offset)) = offsets.iter().find(|(name, _)| name == field) {
                settings.push((global, GlobalValue::U32(*offset)));
            }
        }
    }
    settings
}

/// The probes without which there is no wakeup latency.
pub const REQUIRED_PROBES: [&str; 2] = ["sched_wakeup", "sched_switch"];

/// Attaches the sched probes, then each function slot; fails (exit 1) only when wakeup latency
/// itself cannot be measured.
fn attach(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> Result<(Plan, Vec<FunctionPlan>)> {
    let (plan, functions) = attach_probes(kernel, ebpf, options);
    for required in REQUIRED_PROBES {
        if let Some(p) = plan.get(required).filter(|p| !p.attached()) {
            user_bail!(
                "cannot measure wakeup latency: {required} did not attach ({}); check that tracefs is mounted \
                 and this kernel has sched tracepoints (mm-probe doctor shows more)",
                p.why_unavailable()
            );
        }
    }
    Ok((plan, functions))
}

/// Attaches every probe it can: the sched probes, then each function slot.
pub fn attach_probes(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> (Plan, Vec<FunctionPlan>) {
    let planner = Planner::new(kernel);
    let mut plan = planner.attach_all(ebpf, &sched_probes(kernel));
    let mut functions = Vec::new();
    for (slot, name) in options.functions.iter().enumerate() {
        let probe = planner.attach(ebpf, &probes::function_probe(slot, name));
        functions.push(FunctionPlan {
            slot,
            function: name.clone(),
            attached: probe.attached(),
            mechanism: probe.mechanism().map(str::to_string),
            reason: (!probe.attached()).then(|| probe.why_unavailable()),
        });
        plan.probes.push(probe);
    }
    if functions.iter().any(|f| f.attached) {
        mark_functions_traced(ebpf);
    }
    (plan, functions)
}

/// Lets the sched programs look for function state (they skip the lookup until then). Should
/// the map be unwritable, attribution to functions is lost, not the measurement: say so.
fn mark_functions_traced(ebpf: &mut Ebpf) {
    let written = ebpf
        .map_mut(names::FUNCS_TRACED_MAP)
        .context("map missing")
        .and_then(|map| Ok(aya::maps::Array::<_, u32>::try_from(map)?))
        .and_then(|mut flag| Ok(flag.set(0, 1, 0)?));
    if let Err(e) = written {
        eprintln!("mm-probe: warning: spikes will not be attributed to functions ({}: {e:#})", names::FUNCS_TRACED_MAP);
    }
}

/// Tells the kernel side which threads `-p` selected.
pub fn select_pids(ebpf: &mut Ebpf, options: &Options) -> Result<()> {
    if options.filter != FILTER_PIDS {
        return Ok(());
    }
    let mut pids: BpfHashMap<_, u32, u8> =
        BpfHashMap::try_from(ebpf.map_mut(names::PIDS_MAP).context("pid filter map missing")?)?;
    for pid in &options.pids {
        pids.insert(pid, 1, 0).with_context(|| format!("adding pid {pid} to the filter"))?;
    }
    Ok(())
}

/// Set to `tracepoint` to use the classic sched tracepoints even where BTF ones work (the
/// end-to-end tests exercise the fallback with it).
pub const SCHED_HOOKS_ENV: &str = "MM_PROBE_SCHED_HOOKS";

/// The sched probes for this kernel: the BTF tracepoint programs read task_struct members, so
/// where BTF lacks one of them only the classic tracepoints are tried.
fn sched_probes(kernel: &Kernel) -> Vec<LogicalProbe> {
    let forced_classic = std::env::var(SCHED_HOOKS_ENV).is_ok_and(|v| v == "tracepoint");
    let members =
        [layout::TASK_STRUCT_PID, layout::TASK_STRUCT_PRIO, layout::TASK_STRUCT_COMM, layout::TASK_STRUCT_CPU];
    let btf_usable = kernel.btf().is_ok_and(|btf| members.iter().all(|m| Layout::offset_in(btf, m).is_some()));
    probes::SCHED_PROBES
        .iter()
        .map(|p| if (btf_usable && !forced_classic) || p.candidates.len() == 1 { *p } else { probes::classic_only(p) })
        .collect()
}

/// Whether a blocker's syscall can be read from its saved user registers: that needs the
/// bpf_task_pt_regs helper (5.15+) and x86-64's pt_regs members, both learned from BTF.
pub fn syscall_attribution(kernel: &Kernel) -> Availability {
    const MEMBERS: [&str; 6] = [
        layout::PT_REGS_ORIG_AX,
        layout::PT_REGS_AX,
        layout::PT_REGS_DI,
        layout::PT_REGS_SI,
        layout::PT_REGS_DX,
        layout::PT_REGS_R10,
    ];
    let unavailable = |reason: String| Availability { available: false, reason: Some(reason) };
    let btf = match kernel.btf() {
        Ok(btf) => btf,
        Err(why) => return unavailable(format!("no kernel BTF to find the saved registers in: {why}")),
    };
    if btf.enumerator("BPF_FUNC_task_pt_regs").is_none() {
        return unavailable(format!("kernel {} has no bpf_task_pt_regs helper (5.15+)", kernel.release));
    }
    match MEMBERS.iter().find(|m| Layout::offset_in(btf, m).is_none()) {
        Some(missing) => unavailable(format!("{missing} is not in this kernel's BTF (x86-64 only)")),
        None => Availability { available: true, reason: None },
    }
}

fn function_availability(functions: &[FunctionPlan]) -> Availability {
    let missing: Vec<String> = functions
        .iter()
        .filter(|f| !f.attached)
        .map(|f| format!("{}: {}", f.function, f.reason.as_deref().unwrap_or("did not attach")))
        .collect();
    let available = functions.iter().any(|f| f.attached);
    let reason = (!missing.is_empty()).then(|| {
        let mut text = missing.join("; ");
        if !available {
            text += ". Wakeup latency, blockers, stacks and syscalls are still measured from tracepoints; \
                     spikes cannot be attributed to functions";
        }
        text
    });
    Availability { available, reason }
}

/// Everything gathered from the ring buffers.
struct Collected {
    wakeups: Worst<(Wakeup, Attribution)>,
    calls: Worst<FunctionCall>,
    /// Every wakeup spike's cause, counted (not only the kept top N).
    causes: BTreeMap<String, u64>,
    interval_wakeup_spikes: u64,
    interval_function_spikes: u64,
}

async fn trace(kernel: &Kernel, options: &Options) -> Result<()> {
    let syscalls = syscall_attribution(kernel);
    let mut ebpf = load_object(kernel, &[MapFamily::Latency], &settings(options, &syscalls))?;
    select_pids(&mut ebpf, options)?;
    let (plan, functions) = attach(kernel, &mut ebpf, options)?;
    // Read the symbols again now that the programs are attached (stacks through fentry pass
    // through BPF trampolines, whose bpf_trampoline_<id> symbols exist only from now on), and
    // before the plan is out, so that the reading does not compete with what is measured.
    let symbols = Kallsyms::read().ok();
    let start_ns = monotonic_ns();
    let header = Header {
        kernel: kernel.release.to_string(),
        threshold_ns: options.threshold_ns,
        selection: options.selection(),
        pids: options.requested_pids.clone(),
        function_attribution: function_availability(&functions),
        syscall_attribution: syscalls,
        functions,
        plan,
    };
    // Listen for Ctrl-C before telling anyone tracing has begun: a SIGINT right after the plan
    // must end the run with a summary, not kill it.
    let stop = wait_for_stop(options.duration);
    tokio::pin!(stop);
    let stopped_early = tokio::select! {
        biased;
        stopped = &mut stop => Some(stopped),
        () = std::future::ready(()) => None,
    };
    if options.json {
        println!("{}", json::line(json::Line::LatencyProbePlan, &header));
    } else {
        eprint!("{}", render::header_text(&header));
    }

    let mut wakeup_ring: RingReader<WakeupSpike> =
        RingReader::new(ebpf.take_map(names::WAKEUP_SPIKES_RING).context("wakeup spike ring missing")?)?;
    let mut call_ring: RingReader<FuncSpike> =
        RingReader::new(ebpf.take_map(names::FUNC_SPIKES_RING).context("function spike ring missing")?)?;
    let hists = HistReader::new(&mut ebpf)?;
    let stacks = ebpf.take_map(names::STACKS_MAP).map(StackTraceMap::try_from).transpose()?;
    let mut decoder = Decoder { kallsyms: symbols.as_ref(), stacks, symbolized: Default::default() };
    let mut collected = Collected {
        wakeups: Worst::new(options.top),
        calls: Worst::new(options.top),
        causes: BTreeMap::new(),
        interval_wakeup_spikes: 0,
        interval_function_spikes: 0,
    };
    let function_count = header.functions.len();

    let mut ticker = options.interval.map(|i| tokio::time::interval_at(tokio::time::Instant::now() + i, i));
    let mut previous = read_all(&hists, function_count)?;
    let mut previous_ns = start_ns;
    let stopped_by = loop {
        if let Some(stopped) = stopped_early {
            break stopped;
        }
        let mut wakeup_batch = Vec::new();
        let mut call_batch = Vec::new();
        tokio::select! {
            stopped = &mut stop => break stopped,
            read = wakeup_ring.read(|r| wakeup_batch.push(r)) => { read?; }
            read = call_ring.read(|r| call_batch.push(r)) => { read?; }
            _ = async { match ticker.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                let now = read_all(&hists, function_count)?;
                let now_ns = monotonic_ns();
                print_interval(options, &header, &now, &previous, now_ns - start_ns, now_ns - previous_ns, &mut collected);
                previous = now;
                previous_ns = now_ns;
            }
        }
        absorb(&mut decoder, &mut collected, &header, options, start_ns, wakeup_batch, call_batch);
    };
    let skipped = recursion_misses(&ebpf);
    detach_all(&mut ebpf).await;
    let mut wakeup_batch = Vec::new();
    let mut call_batch = Vec::new();
    wakeup_ring.drain_now(|r| wakeup_batch.push(r));
    call_ring.drain_now(|r| call_batch.push(r));
    absorb(&mut decoder, &mut collected, &header, options, start_ns, wakeup_batch, call_batch);

    let totals = read_all(&hists, function_count)?;
    let counters = percpu_sums(&ebpf, COUNTERS_MAP)?;
    let lost = LostEvents {
        wakeup_spikes: counter(&counters, Counter::LostWakeupSpikes),
        function_spikes: counter(&counters, Counter::LostFuncSpikes),
        wakeups: counter(&counters, Counter::LostWakeups),
        function_entries: counter(&counters, Counter::LostFuncEntries),
        stack_errors: counter(&counters, Counter::StackErrors),
        malformed_records: wakeup_ring.malformed + call_ring.malformed,
        skipped_by_recursion_guard: skipped,
    };
    let tasks = aggregator::tasks(&ebpf)?;
    let duration_ns = monotonic_ns() - start_ns;
    report(options, &header, &totals, tasks, &collected, &lost, duration_ns, stopped_by, start_ns)
}

/// Runs of our programs the kernel skipped because another tracing program was running on
/// that CPU (bpf_prog_info.recursion_misses, shown in the program fd's fdinfo since 5.12).
fn recursion_misses(ebpf: &Ebpf) -> u64 {
    counters::recursion_misses(ebpf, |_| true)
}

pub fn counter(counters: &[u64], which: Counter) -> u64 {
    counters.get(which as usize).copied().unwrap_or(0)
}

/// Everything the kernel counted since the object was loaded, summed over CPUs.
#[derive(Clone, Debug)]
pub struct Totals {
    pub wakeup: Distribution,
    /// One per function slot, in slot order.
    pub functions: Vec<Distribution>,
    /// Indexed by [`Counter`].
    pub counters: Vec<u64>,
}

/// Reads the histograms of the wakeup and of `function_slots` slots, and the counters, from a
/// loaded object (cheap: one map lookup per quantity, made on every scrape by the exporter).
pub fn read_totals(ebpf: &Ebpf, function_slots: usize) -> Result<Totals> {
    let wakeup = aggregator::read_distribution(ebpf, QUANTITY_WAKEUP)?;
    let functions =
        (0..function_slots as u32).map(|slot| aggregator::read_distribution(ebpf, 1 + slot)).collect::<Result<_>>()?;
    Ok(Totals { wakeup, functions, counters: percpu_sums(ebpf, COUNTERS_MAP)? })
}

/// Wakeup distribution first, then one per function slot.
fn read_all(hists: &HistReader, functions: usize) -> Result<Vec<Distribution>> {
    (0..=functions as u32).map(|q| hists.read(if q == 0 { QUANTITY_WAKEUP } else { q })).collect()
}

fn absorb(
    decoder: &mut Decoder,
    collected: &mut Collected,
    header: &Header,
    options: &Options,
    start_ns: u64,
    wakeups: Vec<WakeupSpike>,
    calls: Vec<FuncSpike>,
) {
    let names: Vec<String> = header.functions.iter().map(|f| f.function.clone()).collect();
    for raw in wakeups {
        let wakeup = decoder.wakeup(&raw);
        let attribution = attribute(&wakeup, &names);
        *collected.causes.entry(attribution.cause.clone()).or_default() += 1;
        collected.interval_wakeup_spikes += 1;
        if options.interval.is_some() && !options.json {
            println!(
                "         +{:.3}s spike: {}",
                wakeup.wakeup_ns.saturating_sub(start_ns) as f64 / 1e9,
                attribution.explanation
            );
        }
        collected.wakeups.offer(wakeup.latency_ns, (wakeup, attribution));
    }
    for raw in calls {
        let call = decoder.function_call(&raw);
        collected.interval_function_spikes += 1;
        collected.calls.offer(call.duration_ns, call);
    }
}

fn print_interval(
    options: &Options,
    header: &Header,
    now: &[Distribution],
    previous: &[Distribution],
    elapsed_ns: u64,
    interval_ns: u64,
    collected: &mut Collected,
) {
    let quantity =
        |slot: usize, name: &str| Quantity::new(name, &now[slot].since(&previous[slot]), options.threshold_ns, false);
    let interval = Interval {
        elapsed_ns,
        interval_ns,
        wakeup: quantity(0, "wakeup"),
        functions: header.functions.iter().filter(|f| f.attached).map(|f| quantity(f.slot + 1, &f.function)).collect(),
        wakeup_spikes: std::mem::take(&mut collected.interval_wakeup_spikes),
        function_spikes: std::mem::take(&mut collected.interval_function_spikes),
    };
    if options.json {
        println!("{}", json::line(json::Line::LatencyInterval, &interval));
    } else {
        print!("{}", render::interval_text(&interval));
    }
}

#[allow(clippy::too_many_arguments)]
fn report(
    options: &Options,
    header: &Header,
    totals: &[Distribution],
    tasks: Vec<aggregator::TaskSummary>,
    collected: &Collected,
    lost: &LostEvents,
    duration_ns: u64,
    stopped_by: Stop,
    start_ns: u64,
) -> Result<()> {
    let functions: Vec<(String, Distribution)> = header
        .functions
        .iter()
        .filter(|f| f.attached)
        .map(|f| (f.function.clone(), totals[f.slot + 1].clone()))
        .collect();
    let verdict = verdict::judge(&totals[0], options.threshold_ns, &collected.causes, &functions);
    let summary = Summary {
        duration_ns,
        stopped_by: stopped_by.name(),
        threshold_ns: options.threshold_ns,
        wakeup: Quantity::new("wakeup", &totals[0], options.threshold_ns, true),
        functions: functions.iter().map(|(name, d)| Quantity::new(name, d, options.threshold_ns, true)).collect(),
        tasks,
        wakeup_spikes: collected.wakeups.seen(),
        function_spikes: collected.calls.seen(),
        function_attribution: header.function_attribution.clone(),
        verdict,
    };
    let wakeup_spikes = collected.wakeups.ranked();
    let function_spikes = collected.calls.ranked();
    let names: Vec<String> = header.functions.iter().map(|f| f.function.clone()).collect();
    if options.json {
        println!("{}", json::line(json::Line::LatencySummary, &summary));
        for (rank, (w, a)) in wakeup_spikes.iter().map(|x| (&x.0, &x.1)).enumerate() {
            println!(
                "{}",
                json::line(json::Line::LatencySpike, &render::WakeupSpikeJson::new(rank + 1, w, a, start_ns))
            );
        }
        for (rank, call) in function_spikes.iter().enumerate() {
            let spike = render::FunctionSpikeJson {
                kind: "function",
                rank: rank + 1,
                function: names.get(call.slot).map_or("?", String::as_str),
                entered_at_ns: call.entry_ns.saturating_sub(start_ns),
                call,
            };
            println!("{}", json::line(json::Line::LatencySpike, &spike));
        }
        println!("{}", json::line(json::Line::LatencyLostEvents, lost));
    } else {
        print!(
            "{}",
            render::summary_text(&render::SummaryText {
                summary: &summary,
                wakeups: &totals[0],
                functions: &functions,
                wakeup_spikes: &wakeup_spikes,
                function_spikes: &function_spikes,
                function_names: &names,
                lost,
                start_ns,
            })
        );
    }
    if let Some(file) = &options.plot {
        let figure = plot::histogram_plot(&header.kernel, &summary, &totals[0], &functions);
        file.write(&histogram_svg(&figure)?)?;
        println!("{}", file.written_line(options.json.then_some(json::Line::LatencyPlot)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser as _;

    fn options(args: &[&str]) -> Result<Options> {
        let mut argv = vec!["mm-probe", "latency"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?;
        match cli.command {
            crate::cli::Command::Latency(a) => Options::from_args(&a),
            _ => unreachable!("parsed latency"),
        }
    }

    #[test]
    fn default_traces_rt_tasks_and_the_pageout_walk() {
        let o = options(&[]).unwrap();
        assert_eq!(o.threshold_ns, 500_000);
        assert_eq!(o.filter, FILTER_RT);
        assert_eq!(o.functions, ["madvise_cold_or_pageout_pte_range"]);
    }

    #[test]
    fn funcs_are_deduplicated_and_bounded() {
        let o = options(&["--func", "zap_pte_range", "--func", "zap_pte_range", "--func", probes::DEFAULT_FUNCTION])
            .unwrap();
        assert_eq!(o.functions, ["madvise_cold_or_pageout_pte_range", "zap_pte_range"]);
        let many: Vec<String> = (0..8).flat_map(|i| ["--func".to_string(), format!("f{i}")]).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = options(&many).unwrap_err().to_string();
        assert!(err.contains("at most 7 --func targets"), "{err}");
    }

    #[test]
    fn thresholds_need_units_and_pids_must_exist() {
        assert_eq!(options(&["--threshold", "2ms"]).unwrap().threshold_ns, 2_000_000);
        let err = options(&["--threshold", "500"]).unwrap_err().to_string();
        assert!(err.contains("no unit"), "{err}");
        let err = options(&["--threshold", "5min"]).unwrap_err().to_string();
        assert!(err.contains("unknown unit"), "{err}");
        let me = std::process::id().to_string();
        let o = options(&["-p", &me]).unwrap();
        assert_eq!(o.filter, FILTER_PIDS);
        assert!(o.pids.contains(&std::process::id()));
        let err = options(&["-p", "999999999"]).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(options(&["-p", &me, "--all-tasks"]).is_err());
    }

    #[test]
    fn a_plot_must_be_an_svg_file_that_can_be_written() {
        let error = options(&["--plot", "latency.png"]).unwrap_err();
        assert!(error.to_string().contains("ending in .svg"), "{error}");
        assert_eq!(crate::error::exit_code(&error), crate::error::EXIT_USAGE);
        let error = options(&["--plot", "/nonexistent-mm-probe-dir/latency.svg"]).unwrap_err();
        assert!(error.to_string().contains("does not exist"), "{error}");
        let target = std::env::temp_dir().join(format!("mm-probe-latency-options-{}.svg", std::process::id()));
        let o = options(&["--plot", target.to_str().unwrap()]).unwrap();
        assert_eq!(o.plot.unwrap().path(), target);
    }

    #[test]
    fn missing_functions_are_explained_with_every_attempt() {
        let functions = vec![FunctionPlan {
            slot: 0,
            function: "a".into(),
            attached: false,
            mechanism: None,
            reason: Some("kprobes are not built in".into()),
        }];
        let a = function_availability(&functions);
        assert!(!a.available);
        let reason = a.reason.unwrap();
        assert!(reason.starts_with("a: kprobes are not built in."), "{reason}");
        assert!(reason.contains("still measured from tracepoints"), "{reason}");
    }
}
