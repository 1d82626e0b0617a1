//! latency as the run driver runs it: its options, its attach (the sched probes, then each
//! function slot), and what it does at each step of a run (read the spike rings, take the
//! histograms' change per interval, rank the worst spikes and judge the totals at the end).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::StackTraceMap};
use mm_probe_common::latency::{self as names, COUNTERS_MAP, Counter, FuncSpike, QUANTITY_WAKEUP, WakeupSpike};

use super::{
    aggregator::{self, Distribution, HistReader, Worst},
    attach::{
        Attachment, attach, attach_sampler, check_functions_exist, function_availability, select_pids, settings,
        syscall_attribution,
    },
    attribution::{Attribution, Cause, attribute},
    decoder::{Decoder, FunctionCall, StackMap, Wakeup},
    judge,
    options::Options,
    plot, render,
    report::{FunctionSpikeJson, Header, Interval, Loss, LostEvents, Quantity, Summary, WakeupSpikeJson},
    sampling::Sampled,
    steal,
};
use crate::{
    capability::CapabilityId as Id,
    cli::{LatencyArgs, RunArgs},
    collect::{
        RingReader,
        counters::{self, percpu_sums},
        driver::{Capability, End, Printout, Session},
        monotonic_ns,
    },
    kernel::{Kallsyms, Kernel, config::KernelConfig, release::Release},
    probes::GlobalValue,
    report::{json, plot::histogram_svg},
};

/// `mm-probe latency`, its options checked.
pub struct Latency {
    run: RunArgs,
    options: Options,
}

impl Latency {
    pub fn from_args(args: &LatencyArgs) -> Result<Self> {
        Ok(Self { run: args.run.clone(), options: Options::from_args(args)? })
    }
}

impl Capability for Latency {
    type Session<'k> = Watch;
    const ID: Id = Id::Latency;
    const PLOT_LINE: Option<json::Line> = Some(json::Line::LatencyPlot);

    fn run_args(&self) -> &RunArgs {
        &self.run
    }

    fn check(&self, kernel: &Kernel) -> Result<()> {
        check_functions_exist(kernel, &self.options)
    }

    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        settings(&self.options, kernel)
    }

    fn attach(&self, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Watch> {
        select_pids(ebpf, &self.options)?;
        let Attachment { plan, functions, timer_expiry } = attach(kernel, ebpf, &self.options)?;
        let sampling = attach_sampler(ebpf, &self.options);
        // Read the symbols again now that the programs are attached (stacks through fentry pass
        // through BPF trampolines, whose bpf_trampoline_<id> symbols exist only from now on),
        // and before the plan is out, so that the reading does not compete with what is
        // measured.
        let kallsyms = Kallsyms::read().ok();
        // The rings are mapped before the plan too: mapping them runs in the kernel without
        // rescheduling (1.3 ms of a woken real-time task's wait in an emulated 6.12 guest, when
        // a workload started on the plan line).
        let wakeup_ring =
            RingReader::new(ebpf.take_map(names::WAKEUP_SPIKES_RING).context("wakeup spike ring missing")?)?;
        let call_ring =
            RingReader::new(ebpf.take_map(names::FUNC_SPIKES_RING).context("function spike ring missing")?)?;
        let hists = HistReader::new(ebpf)?;
        let mut stack_map = |name| ebpf.take_map(name).map(StackTraceMap::try_from).transpose().map(StackMap::new);
        let (stacks, sample_stacks) = (stack_map(names::STACKS_MAP)?, stack_map(names::SAMPLE_STACKS_MAP)?);
        let run_time_is_charged =
            KernelConfig::running(&kernel.release.text).is_some_and(|config| config.charges_less_than_wall_time());
        let decoder =
            Decoder { kallsyms, stacks, sample_stacks, run_time_is_charged, sampling: sampling.availability.available };
        let header = Header {
            kernel: kernel.release.to_string(),
            threshold_ns: self.options.threshold_ns,
            selection: self.options.selection(),
            pids: self.options.requested_pids.clone(),
            function_attribution: function_availability(&functions),
            syscall_attribution: syscall_attribution(kernel),
            sampling,
            timer_expiry,
            functions,
            plan,
        };
        let previous = read_all(&hists, header.functions.len())?;
        let start_ns = monotonic_ns();
        Ok(Watch {
            options: self.options.clone(),
            spikes_as_text: self.run.interval.is_some() && !self.run.json,
            names: header.functions.iter().map(|f| f.function.clone()).collect(),
            header,
            decoder,
            wakeup_ring,
            call_ring,
            hists,
            collected: Collected {
                wakeups: Worst::new(self.options.top),
                calls: Worst::new(self.options.top),
                causes: BTreeMap::new(),
                sampled_places: BTreeMap::new(),
                steal_at_start_ns: steal::read(),
                interval_wakeup_spikes: 0,
                interval_function_spikes: 0,
            },
            start_ns,
            previous,
            previous_ns: start_ns,
            release: kernel.release.clone(),
            skipped: None,
            last: None,
        })
    }
}

/// Everything gathered from the ring buffers.
struct Collected {
    wakeups: Worst<(Wakeup, Attribution)>,
    calls: Worst<FunctionCall>,
    /// Every wakeup spike's cause, counted (not only the kept top N).
    causes: BTreeMap<Cause, u64>,
    /// Spikes no traced function explains, by the place their holder's samples named (at most
    /// `judge::MAX_PLACES` places; the spikes of further places under `judge::OTHER_PLACES`).
    sampled_places: BTreeMap<String, u64>,
    /// Each CPU's steal time when tracing began (`None`: /proc/stat unreadable).
    steal_at_start_ns: Option<BTreeMap<u32, u64>>,
    interval_wakeup_spikes: u64,
    interval_function_spikes: u64,
}

/// latency while it watches.
pub struct Watch {
    options: Options,
    /// Each spike as a line of text as it comes (`--interval` without `--json`).
    spikes_as_text: bool,
    header: Header,
    /// The function of each slot.
    names: Vec<String>,
    decoder: Decoder,
    wakeup_ring: RingReader<WakeupSpike>,
    call_ring: RingReader<FuncSpike>,
    hists: HistReader,
    collected: Collected,
    start_ns: u64,
    /// The histograms at the previous interval's end.
    previous: Vec<Distribution>,
    previous_ns: u64,
    release: Release,
    /// Runs the kernel's recursion guard skipped (read before the detach unloads them); `None`
    /// where the kernel does not count them all (kprobes and classic tracepoints before 6.7).
    skipped: Option<u64>,
    /// What the summary judged, for the figure.
    last: Option<(Summary, Vec<Distribution>)>,
}

impl Session for Watch {
    fn plan(&self) -> Printout {
        Printout::new(json::line(json::Line::LatencyProbePlan, &self.header), render::header_text(&self.header))
    }

    async fn turn(&mut self, _ebpf: &mut Ebpf) -> Result<()> {
        let (mut wakeups, mut calls) = (Vec::new(), Vec::new());
        tokio::select! {
            read = self.wakeup_ring.read(|r| wakeups.push(r)) => { read?; }
            read = self.call_ring.read(|r| calls.push(r)) => { read?; }
        }
        self.absorb(wakeups, calls);
        Ok(())
    }

    fn interval(&mut self, _ebpf: &mut Ebpf, now_ns: u64) -> Result<Printout> {
        let now = read_all(&self.hists, self.header.functions.len())?;
        let threshold_ns = self.options.threshold_ns;
        let quantity =
            |slot: usize, name: &str| Quantity::new(name, &now[slot].since(&self.previous[slot]), threshold_ns, false);
        let interval = Interval {
            elapsed_ns: now_ns - self.start_ns,
            interval_ns: now_ns - self.previous_ns,
            wakeup: quantity(0, "wakeup"),
            functions: self
                .header
                .functions
                .iter()
                .filter(|f| f.attached)
                .map(|f| quantity(f.slot + 1, &f.function))
                .collect(),
            wakeup_spikes: std::mem::take(&mut self.collected.interval_wakeup_spikes),
            function_spikes: std::mem::take(&mut self.collected.interval_function_spikes),
        };
        (self.previous, self.previous_ns) = (now, now_ns);
        Ok(Printout::new(json::line(json::Line::LatencyInterval, &interval), render::interval_text(&interval)))
    }

    fn before_detach(&mut self, ebpf: &Ebpf) {
        self.skipped = counters::program_runs_skipped(&self.release, ebpf, |_| true);
    }

    fn drain(&mut self, _ebpf: &mut Ebpf) -> Result<()> {
        let (mut wakeups, mut calls) = (Vec::new(), Vec::new());
        self.wakeup_ring.drain_now(|r| wakeups.push(r));
        self.call_ring.drain_now(|r| calls.push(r));
        self.absorb(wakeups, calls);
        Ok(())
    }

    fn summary(&mut self, ebpf: &mut Ebpf, end: &End) -> Result<Printout> {
        let totals = read_all(&self.hists, self.header.functions.len())?;
        let counters = percpu_sums(ebpf, COUNTERS_MAP)?;
        let tasks = aggregator::tasks(ebpf)?;
        // The LRU table evicts without a word: what it created and no longer holds was evicted.
        let evicted = counter(&counters, Counter::TaskRowsCreated).saturating_sub(tasks.len() as u64);
        let lost = LostEvents::from_fn(|kind| {
            let n = match kind {
                Loss::WakeupSpikes => counter(&counters, Counter::LostWakeupSpikes),
                Loss::FunctionSpikes => counter(&counters, Counter::LostFuncSpikes),
                Loss::Wakeups => counter(&counters, Counter::LostWakeups),
                Loss::FunctionEntries => counter(&counters, Counter::LostFuncEntries),
                Loss::StackErrors => counter(&counters, Counter::StackErrors),
                Loss::SampleStacks => counter(&counters, Counter::SampleStackErrors),
                Loss::MalformedRecords => self.wakeup_ring.malformed + self.call_ring.malformed,
                Loss::TaskRows => evicted + counter(&counters, Counter::LostTaskRows),
                Loss::LateTimers => counter(&counters, Counter::LostLateTimers),
                Loss::SkippedByRecursionGuard => return self.skipped,
            };
            Some(n)
        });
        let summary = self.judged(&totals, tasks, end);
        let printout = Printout::new(self.summary_json(&summary, &lost), self.summary_text(&summary, &totals, &lost));
        self.last = Some((summary, totals));
        Ok(printout)
    }

    fn plot(&self, _end: &End) -> Result<String> {
        let Some((summary, totals)) = &self.last else { anyhow::bail!("no summary to draw") };
        let figure = plot::histogram_plot(&self.header.kernel, summary, &totals[0], &self.functions(totals));
        Ok(histogram_svg(&figure)?)
    }
}

impl Watch {
    fn absorb(&mut self, wakeups: Vec<WakeupSpike>, calls: Vec<FuncSpike>) {
        for raw in wakeups {
            let wakeup = self.decoder.wakeup(&raw);
            let attribution = attribute(&wakeup, &self.names, std::process::id());
            *self.collected.causes.entry(attribution.cause).or_default() += 1;
            if !matches!(attribution.cause, Cause::Function(_))
                && let Some(place) = attribution.samples.as_ref().and_then(Sampled::place)
            {
                let places = &mut self.collected.sampled_places;
                let counted = places.len() < judge::MAX_PLACES || places.contains_key(&place);
                let key = if counted { place } else { judge::OTHER_PLACES.into() };
                *places.entry(key).or_default() += 1;
            }
            self.collected.interval_wakeup_spikes += 1;
            if self.spikes_as_text {
                crate::report::text::println(&format!(
                    "         +{:.3}s spike: {}",
                    wakeup.wakeup_ns.saturating_sub(self.start_ns) as f64 / 1e9,
                    attribution.explanation
                ));
            }
            self.collected.wakeups.offer(wakeup.total_ns(), (wakeup, attribution));
        }
        for raw in calls {
            let call = self.decoder.function_call(&raw);
            self.collected.interval_function_spikes += 1;
            self.collected.calls.offer(call.duration_ns, call);
        }
    }

    /// Each attached function with its distribution.
    fn functions(&self, totals: &[Distribution]) -> Vec<(String, Distribution)> {
        self.header
            .functions
            .iter()
            .filter(|f| f.attached)
            .map(|f| (f.function.clone(), totals[f.slot + 1].clone()))
            .collect()
    }

    fn judged(&self, totals: &[Distribution], tasks: Vec<aggregator::TaskSummary>, end: &End) -> Summary {
        let threshold_ns = self.options.threshold_ns;
        let functions = self.functions(totals);
        let steal_ns = self
            .collected
            .steal_at_start_ns
            .as_ref()
            .zip(steal::read())
            .map(|(before, now)| steal::since(&now, before))
            .unwrap_or_default();
        let mut judgement =
            judge::judge(&totals[0], threshold_ns, &self.collected.causes, &self.names, &functions, &steal_ns);
        judge::with_sampled_places(&mut judgement, &self.collected.sampled_places);
        Summary {
            duration_ns: end.end_ns.saturating_sub(self.start_ns),
            stopped_by: end.stopped_by.name(),
            threshold_ns,
            wakeup: Quantity::new("wakeup", &totals[0], threshold_ns, true),
            functions: functions.iter().map(|(name, d)| Quantity::new(name, d, threshold_ns, true)).collect(),
            tasks,
            wakeup_spikes: self.collected.wakeups.seen(),
            function_spikes: self.collected.calls.seen(),
            function_attribution: self.header.function_attribution.clone(),
            judgement,
        }
    }

    /// The summary, each kept spike worst first, then the lost events.
    fn summary_json(&self, summary: &Summary, lost: &LostEvents) -> String {
        let mut lines = vec![json::line(json::Line::LatencySummary, summary)];
        for (rank, (w, a)) in self.collected.wakeups.ranked().iter().map(|x| (&x.0, &x.1)).enumerate() {
            let spike = WakeupSpikeJson::new(rank + 1, w, a, &self.names, self.start_ns);
            lines.push(json::line(json::Line::LatencySpike, &spike));
        }
        for (rank, call) in self.collected.calls.ranked().iter().enumerate() {
            let spike = FunctionSpikeJson {
                kind: "function",
                rank: rank + 1,
                function: self.names.get(call.slot).map_or("?", String::as_str),
                entered_at_ns: call.entry_ns.saturating_sub(self.start_ns),
                call,
            };
            lines.push(json::line(json::Line::LatencySpike, &spike));
        }
        lines.push(json::line(json::Line::LatencyLostEvents, lost));
        lines.join("\n")
    }

    fn summary_text(&self, summary: &Summary, totals: &[Distribution], lost: &LostEvents) -> String {
        render::summary_text(&render::SummaryText {
            summary,
            wakeups: &totals[0],
            functions: &self.functions(totals),
            wakeup_spikes: &self.collected.wakeups.ranked(),
            function_spikes: &self.collected.calls.ranked(),
            function_names: &self.names,
            lost,
            start_ns: self.start_ns,
        })
    }
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
