//! The run: load and attach, read the rings until told to stop, print intervals, then the
//! summary.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::StackTraceMap};
use mm_probe_common::latency::{self as names, COUNTERS_MAP, Counter, FuncSpike, QUANTITY_WAKEUP, WakeupSpike};

use super::{
    aggregator::{self, Distribution, HistReader, Worst},
    attach::{attach, check_functions_exist, function_availability, select_pids, settings, syscall_attribution},
    attribution::{Attribution, Cause, attribute},
    decoder::{Decoder, FunctionCall, Wakeup},
    judge,
    options::Options,
    plot, render,
    report::{FunctionSpikeJson, Header, Interval, LostEvents, Quantity, Summary, WakeupSpikeJson},
    steal,
};
use crate::{
    cli::LatencyArgs,
    collect::{
        RingReader, Stop,
        counters::{self, percpu_sums},
        monotonic_ns,
        run::{Limits, Stopper, Ticker},
    },
    kernel::{Kallsyms, Kernel, config::KernelConfig, privileges},
    probes::{MapFamily, detach_all, load_object},
    report::{json, plot::histogram_svg, text},
};

pub fn run(args: &LatencyArgs) -> Result<()> {
    let options = Options::from_args(args)?;
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    check_functions_exist(&kernel, &options)?;
    let limits = Limits { duration: options.duration, targets: options.requested_pids.clone() };
    crate::collect::run::run(limits, async |stopper: &mut Stopper| trace(&kernel, &options, stopper).await)
}

/// Everything gathered from the ring buffers.
struct Collected {
    wakeups: Worst<(Wakeup, Attribution)>,
    calls: Worst<FunctionCall>,
    /// Every wakeup spike's cause, counted (not only the kept top N).
    causes: BTreeMap<Cause, u64>,
    /// Each CPU's steal time when tracing began (`None`: /proc/stat unreadable).
    steal_at_start_ns: Option<BTreeMap<u32, u64>>,
    interval_wakeup_spikes: u64,
    interval_function_spikes: u64,
}

async fn trace(kernel: &Kernel, options: &Options, stopper: &mut Stopper) -> Result<()> {
    let syscalls = syscall_attribution(kernel);
    let mut ebpf = load_object(kernel, &[MapFamily::Latency], &settings(options, &syscalls))?;
    select_pids(&mut ebpf, options)?;
    let (plan, functions) = attach(kernel, &mut ebpf, options)?;
    // Read the symbols again now that the programs are attached (stacks through fentry pass
    // through BPF trampolines, whose bpf_trampoline_<id> symbols exist only from now on), and
    // before the plan is out, so that the reading does not compete with what is measured.
    let symbols = Kallsyms::read().ok();
    // The rings are mapped before the plan too: mapping them runs in the kernel without
    // rescheduling (1.3 ms of a woken real-time task's wait in an emulated 6.12 guest, when a
    // workload started on the plan line).
    let mut wakeup_ring: RingReader<WakeupSpike> =
        RingReader::new(ebpf.take_map(names::WAKEUP_SPIKES_RING).context("wakeup spike ring missing")?)?;
    let mut call_ring: RingReader<FuncSpike> =
        RingReader::new(ebpf.take_map(names::FUNC_SPIKES_RING).context("function spike ring missing")?)?;
    let hists = HistReader::new(&mut ebpf)?;
    let stacks = ebpf.take_map(names::STACKS_MAP).map(StackTraceMap::try_from).transpose()?;
    let run_time_is_charged =
        KernelConfig::running(&kernel.release.text).is_some_and(|config| config.charges_less_than_wall_time());
    let mut decoder =
        Decoder { kallsyms: symbols.as_ref(), stacks, symbolized: Default::default(), run_time_is_charged };
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
    // The stop handlers have been in place since before loading: a SIGINT while attaching or
    // right after the plan ends the run here, with its summary.
    let stopped_early = stopper.poll_now().await;
    if options.json {
        println!("{}", json::line(json::Line::LatencyProbePlan, &header));
    } else {
        text::eprint(&render::header_text(&header));
    }

    let mut collected = Collected {
        wakeups: Worst::new(options.top),
        calls: Worst::new(options.top),
        causes: BTreeMap::new(),
        steal_at_start_ns: steal::read(),
        interval_wakeup_spikes: 0,
        interval_function_spikes: 0,
    };
    let function_count = header.functions.len();

    let mut ticker = Ticker::every(options.interval);
    let mut previous = read_all(&hists, function_count)?;
    let mut previous_ns = start_ns;
    let stopped_by = loop {
        if let Some(stopped) = stopped_early {
            break stopped;
        }
        let mut wakeup_batch = Vec::new();
        let mut call_batch = Vec::new();
        tokio::select! {
            stopped = stopper.wait() => break stopped,
            read = wakeup_ring.read(|r| wakeup_batch.push(r)) => { read?; }
            read = call_ring.read(|r| call_batch.push(r)) => { read?; }
            () = ticker.tick() => {
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
    if options.interval.is_some() {
        // The stretch since the last tick, so that the interval lines add up to the summary.
        let now_ns = monotonic_ns();
        print_interval(options, &header, &totals, &previous, now_ns - start_ns, now_ns - previous_ns, &mut collected);
    }
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
    for pid in stopper.exited_targets() {
        text::eprintln(&format!("mm-probe: process {pid} exited while being traced; partial results below"));
    }
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
        let attribution = attribute(&wakeup, &names, std::process::id());
        *collected.causes.entry(attribution.cause).or_default() += 1;
        collected.interval_wakeup_spikes += 1;
        if options.interval.is_some() && !options.json {
            text::println(&format!(
                "         +{:.3}s spike: {}",
                wakeup.wakeup_ns.saturating_sub(start_ns) as f64 / 1e9,
                attribution.explanation
            ));
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
        text::print(&render::interval_text(&interval));
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
    let names: Vec<String> = header.functions.iter().map(|f| f.function.clone()).collect();
    let steal_ns = collected
        .steal_at_start_ns
        .as_ref()
        .zip(steal::read())
        .map(|(before, now)| steal::since(&now, before))
        .unwrap_or_default();
    let verdict = judge::judge(&totals[0], options.threshold_ns, &collected.causes, &names, &functions, &steal_ns);
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
    if options.json {
        println!("{}", json::line(json::Line::LatencySummary, &summary));
        for (rank, (w, a)) in wakeup_spikes.iter().map(|x| (&x.0, &x.1)).enumerate() {
            println!(
                "{}",
                json::line(json::Line::LatencySpike, &WakeupSpikeJson::new(rank + 1, w, a, &names, start_ns))
            );
        }
        for (rank, call) in function_spikes.iter().enumerate() {
            let spike = FunctionSpikeJson {
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
        text::print(&render::summary_text(&render::SummaryText {
            summary: &summary,
            wakeups: &totals[0],
            functions: &functions,
            wakeup_spikes: &wakeup_spikes,
            function_spikes: &function_spikes,
            function_names: &names,
            lost,
            start_ns,
        }));
    }
    if let Some(file) = &options.plot {
        let figure = plot::histogram_plot(&header.kernel, &summary, &totals[0], &functions);
        file.write(&histogram_svg(&figure)?)?;
        println!("{}", file.written_line(options.json.then_some(json::Line::LatencyPlot)));
    }
    Ok(())
}
