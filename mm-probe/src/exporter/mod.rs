//! `mm-probe exporter`: keeps the chosen capabilities' probes attached and serves what their
//! kernel programs count to Prometheus.
//!
//! Each capability owns its slice of the exporter (its `export` module: settings, attach and the
//! series it reads); this module is the transport. One object is loaded with every chosen slice's
//! settings, the rings off (the programs' STREAM globals), so the kernel side only aggregates;
//! each slice attaches through its own catalog. Stages, one per file: `scrape` is what the slices
//! share (the snapshot they read into, the traits they implement), `buckets` the histograms'
//! exact `le` buckets, `families` encodes the snapshot, `http` serves it (`listen` reads
//! `--listen`, `negotiate` picks the format); `startup` says what attached. A selection of which
//! nothing attaches is an error (unless `--allow-empty`), and so is a flag the chosen
//! capabilities would ignore.

pub mod buckets;
pub mod families;
pub mod http;
pub mod listen;
pub mod negotiate;
pub mod scrape;
pub mod startup;

use std::{
    cell::{Cell, RefCell},
    net::SocketAddr,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::Ebpf;

use self::{
    http::{Exposition, Format},
    scrape::{Choice, Slice, Snapshot, Source, WindowVerdict, probe_series, recursion_guard},
};
use crate::{
    cause,
    cli::{CapabilityId, ExporterArgs},
    collect::{
        counters::program_runs_skipped,
        run::{Limits, Stopper, Ticker},
    },
    error::UserError,
    kernel::{Kernel, privileges, process::running_process, release::Release},
    probes::{MapFamily, detach_all, load_object},
};

/// The order the slices attach, say what attached and are read in (so the series of a family
/// shared by several, e.g. `mm_probe_probe_attached`, keep their order).
const SLICE_ORDER: [CapabilityId; 4] =
    [CapabilityId::Latency, CapabilityId::RetryStorm, CapabilityId::Thp, CapabilityId::Invalidations];

pub fn run(args: &ExporterArgs) -> Result<()> {
    let listen = listen::parse_listen(&args.listen)?;
    let capabilities = chosen(&args.only);
    refuse_ignored_flags(args, &capabilities)?;
    for &pid in &args.pids {
        running_process(pid)?;
    }
    // Each slice checks its own options here, before the privileges.
    let choice = Choice { args, capabilities: &capabilities };
    let slices = SLICE_ORDER
        .into_iter()
        .filter(|c| capabilities.contains(c))
        .map(|capability| slice(capability, &choice))
        .collect::<Result<Vec<_>>>()?;
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    for slice in &slices {
        slice.check(&kernel)?;
    }
    // Runs until a signal: the exporter has no duration, and -p's exit does not end it (a
    // restarted process is measured again once the exporter is restarted with its new pid).
    // The HTTP connections are served on the skeleton's one thread, next to the maps they read.
    let limits = Limits { duration: None, targets: vec![] };
    crate::collect::run::run(limits, async |stopper: &mut Stopper| {
        export(&kernel, &listen, &capabilities, slices, args, stopper).await
    })
}

/// `--only`, or every capability.
fn chosen(only: &[CapabilityId]) -> Vec<CapabilityId> {
    let mut capabilities = if only.is_empty() { CapabilityId::ALL.to_vec() } else { only.to_vec() };
    capabilities.sort_unstable();
    capabilities.dedup();
    capabilities
}

/// The chosen capability's slice, from its own `export` module.
fn slice(capability: CapabilityId, choice: &Choice) -> Result<Box<dyn Slice>> {
    match capability {
        CapabilityId::Latency => crate::latency::export::slice(choice),
        CapabilityId::RetryStorm => crate::retry_storm::export::slice(choice),
        CapabilityId::Thp => crate::thp_why::export::slice(choice),
        CapabilityId::Invalidations => crate::invalidations::export::slice(choice),
    }
}

/// Latency's flags are latency's only: given with an `--only` that leaves latency out, they
/// would be silently ignored, so they are refused.
fn refuse_ignored_flags(args: &ExporterArgs, capabilities: &[CapabilityId]) -> Result<(), UserError> {
    if capabilities.contains(&CapabilityId::Latency) {
        return Ok(());
    }
    let flags = [
        (args.threshold.is_some(), "--threshold"),
        (!args.pids.is_empty(), "-p"),
        (args.all_tasks, "--all-tasks"),
        (!args.functions.is_empty(), "--func"),
    ];
    let given: Vec<&str> = flags.into_iter().filter(|(given, _)| *given).map(|(_, flag)| flag).collect();
    if given.is_empty() {
        return Ok(());
    }
    let only: Vec<&str> = capabilities.iter().map(|c| c.name()).collect();
    let (verb, pronoun) = if given.len() == 1 { ("applies", "it") } else { ("apply", "them") };
    Err(UserError::new(format!(
        "{} {verb} only to latency, which --only {} leaves out: drop {pronoun}, or add latency to --only",
        given.join(", "),
        only.join(",")
    )))
}

async fn export(
    kernel: &Kernel,
    listen: &[SocketAddr],
    capabilities: &[CapabilityId],
    slices: Vec<Box<dyn Slice>>,
    args: &ExporterArgs,
    stopper: &mut Stopper,
) -> Result<()> {
    let listener = http::bind(listen).await?;
    let address = listener.local_addr().context("reading the listening address")?;
    let families: Vec<MapFamily> = capabilities.iter().flat_map(|c| c.map_families()).copied().collect();
    let settings: Vec<_> = slices.iter().flat_map(|slice| slice.settings(kernel)).collect();
    let mut ebpf = load_object(kernel, &families, &settings)?;
    let sources = slices.into_iter().map(|slice| slice.attach(kernel, &mut ebpf)).collect::<Result<Vec<_>>>()?;
    cause::probes::arm(&mut ebpf)?;
    crate::collect::memory::release_startup(kernel);
    let plans: Vec<_> = sources.iter().map(|source| (source.attached.capability, &source.attached.plan)).collect();
    if let Some(error) = startup::nothing_attached(&plans).filter(|_| !args.allow_empty) {
        detach_all(&mut ebpf).await;
        return Err(error.into());
    }
    for line in startup::lines(address, &plans) {
        println!("{line}");
    }
    let object = Rc::new(RefCell::new(Some(ebpf)));
    let exporter = Rc::new(Exporter {
        release: kernel.release.clone(),
        sources,
        object: object.clone(),
        verdicts: RefCell::default(),
        window_start: Cell::new(Instant::now()),
    });
    let served = tokio::select! {
        _ = stopper.wait() => Ok(()),
        drained = drain_every_period(&exporter) => drained,
        judged = judge_every_window(&exporter, args.window) => judged,
        served = http::serve(listener, exporter.clone()) => served,
    };
    // Taken out, so that a connection still served during the detach's grace period answers
    // 503 instead of reading maps whose programs are going.
    let taken = object.borrow_mut().take();
    if let Some(mut ebpf) = taken {
        detach_all(&mut ebpf).await;
    }
    eprintln!("mm-probe exporter: stopped, every probe detached");
    served
}

/// What answers the scrapes: the attached sources, the object whose maps they read (`None`
/// once shutting down), and the last window's verdicts.
struct Exporter {
    release: Release,
    sources: Vec<Source>,
    object: Rc<RefCell<Option<Ebpf>>>,
    verdicts: RefCell<Vec<(CapabilityId, WindowVerdict)>>,
    window_start: Cell<Instant>,
}

/// Drains the kernel's tables once a period whether or not anyone scrapes: a table must never
/// hold more than one period's keys (the shortest period any source asks for; none, when no
/// source keeps tables). Returns only on an error.
async fn drain_every_period(exporter: &Exporter) -> Result<()> {
    let period = exporter.sources.iter().filter_map(|source| source.reader.drain_period()).min();
    let mut tick = Ticker::every(period);
    loop {
        tick.tick().await;
        exporter.drain().map_err(anyhow::Error::msg)?;
    }
}

/// Judges every capability that has a verdict once a window. Returns only on an error (and then
/// inside the select!, so that every probe is still detached on the way out).
async fn judge_every_window(exporter: &Exporter, window: Duration) -> Result<()> {
    // The first window begins once every capability has attached, so that none judges the
    // others' loading: a judgement now only sets the baseline.
    exporter.judge().map_err(anyhow::Error::msg)?;
    exporter.verdicts.borrow_mut().clear();
    let mut tick = Ticker::every(Some(window));
    loop {
        tick.tick().await;
        exporter.judge().map_err(anyhow::Error::msg)?;
    }
}

impl Exporter {
    /// Each capability's verdict over the window since the last judgement, kept for the
    /// scrapes until the next (nothing once shutting down).
    fn judge(&self) -> Result<(), String> {
        self.drain()?;
        let object = self.object.borrow();
        let Some(ebpf) = object.as_ref() else { return Ok(()) };
        let window_ns = self.window_start.replace(Instant::now()).elapsed().as_nanos() as u64;
        let mut verdicts = Vec::new();
        for source in &self.sources {
            let judged = source.reader.judge(ebpf, window_ns).map_err(|e| format!("judging the window: {e:#}"))?;
            verdicts.extend(judged.map(|verdict| (source.attached.capability, verdict)));
        }
        *self.verdicts.borrow_mut() = verdicts;
        Ok(())
    }

    /// Moves the kernel's drained tables into the totals (nothing once shutting down).
    fn drain(&self) -> Result<(), String> {
        let mut object = self.object.borrow_mut();
        let Some(ebpf) = object.as_mut() else { return Ok(()) };
        for source in &self.sources {
            source.reader.drain(ebpf).map_err(|e| format!("draining the kernel maps: {e:#}"))?;
        }
        Ok(())
    }

    /// Every attached capability's series, in [`SLICE_ORDER`].
    fn read(&self, ebpf: &Ebpf) -> Result<Snapshot> {
        let mut snapshot = Snapshot::new(&self.release);
        for source in &self.sources {
            let attached = &source.attached;
            snapshot.probe_attached.extend(probe_series(attached.capability, &attached.plan));
            let skipped = program_runs_skipped(&self.release, ebpf, |program| attached.programs.contains(program));
            snapshot.lost_events.extend(recursion_guard(attached.capability, skipped));
            source.reader.read(ebpf, &mut snapshot)?;
        }
        for (capability, verdict) in self.verdicts.borrow().iter() {
            snapshot.verdicts.extend(verdict.levels(*capability));
            snapshot.findings.extend(verdict.finding(*capability));
        }
        Ok(snapshot)
    }
}

impl Exposition for Exporter {
    fn render(&self, format: Format) -> Result<String, String> {
        self.drain()?;
        let object = self.object.borrow();
        let ebpf = object.as_ref().ok_or_else(|| "mm-probe exporter is shutting down".to_string())?;
        let snapshot = self.read(ebpf).map_err(|e| format!("reading the kernel maps: {e:#}"))?;
        let text = families::openmetrics(snapshot).map_err(|e| format!("encoding the metrics: {e}"))?;
        Ok(if format == Format::OpenMetrics { text } else { families::classic(&text) })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn refusal(command_line: &[&str]) -> Option<String> {
        let cli = Cli::try_parse_from(["mm-probe", "exporter"].iter().chain(command_line)).unwrap();
        let Command::Exporter(args) = cli.command else { unreachable!() };
        refuse_ignored_flags(&args, &chosen(&args.only)).err().map(|e| e.to_string())
    }

    #[test]
    fn latency_flags_without_latency_are_refused_in_one_line() {
        let error = refusal(&["--only", "thp", "--threshold", "1ms"]).unwrap();
        assert_eq!(
            error,
            "--threshold applies only to latency, which --only thp leaves out: drop it, or add latency to --only"
        );
        let error = refusal(&["--only", "retry-storm,thp", "-p", "1", "--all-tasks", "--func", "f"]).unwrap();
        assert!(error.starts_with("-p, --all-tasks, --func apply only to latency, which --only retry-storm,thp"));
        // The default value of --threshold is not a flag given.
        assert_eq!(refusal(&["--only", "thp"]), None);
    }

    #[test]
    fn latency_flags_with_latency_chosen_are_taken() {
        assert_eq!(refusal(&["--threshold", "1ms", "-p", "1"]), None);
        assert_eq!(refusal(&["--only", "latency,thp", "--func", "f"]), None);
    }
}
