//! `mm-probe exporter`: keeps the latency, retry-storm and thp probes attached and serves what
//! their kernel programs count to Prometheus.
//!
//! One object is loaded with every chosen capability's settings and attached through each
//! capability's own catalog; the rings stay off (the programs' STREAM globals), so the kernel
//! side only aggregates. Stages, one per file: `scrape` reads the maps into a snapshot,
//! `buckets` turns kernel histograms into exact `le` buckets, `families` encodes the snapshot,
//! `http` serves it (`listen` reads `--listen`, `negotiate` picks the format); `startup` says
//! what attached. A selection of which nothing attaches is an error (unless `--allow-empty`),
//! and so is a flag the chosen capabilities would ignore.

pub mod buckets;
pub mod families;
pub mod http;
pub mod listen;
pub mod negotiate;
pub mod scrape;
pub mod startup;

use std::{cell::RefCell, net::SocketAddr, rc::Rc, time::Duration};

use anyhow::{Context as _, Result};
use aya::Ebpf;
use mm_probe_common::{hmm, latency as lat, thp};

use self::{
    http::{Exposition, Format},
    scrape::{InvalidationsSource, LatencySource, RetryStormSource, Sources, ThpSource},
};
use crate::{
    cli::{Capability, ExporterArgs, LatencySelection},
    collect::run::{Limits, Stopper, Ticker},
    error::UserError,
    invalidations,
    kernel::{Kallsyms, Kernel, layout::ThpDisableBits, privileges, process::running_process},
    latency,
    probes::{GlobalValue, LogicalProbe, MapFamily, Planner, detach_all, load_object},
    retry_storm,
    thp_why::{self, checks::AllowCheck, reasons::DisableMode},
};

/// How this kernel's allow-check names its caller and which mm->flags bits disable THP.
type ThpDecoding = (AllowCheck, ThpDisableBits);

/// `--threshold` when not given, as `mm-probe latency` has it.
const DEFAULT_THRESHOLD: Duration = Duration::from_micros(500);

pub fn run(args: &ExporterArgs) -> Result<()> {
    let listen = listen::parse_listen(&args.listen)?;
    let capabilities = chosen(&args.only);
    refuse_ignored_flags(args, &capabilities)?;
    for &pid in &args.pids {
        running_process(pid)?;
    }
    let latency_options = capabilities.contains(&Capability::Latency).then(|| latency_options(args)).transpose()?;
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    if let Some(options) = &latency_options {
        latency::check_functions_exist(&kernel, options)?;
    }
    // Runs until a signal: the exporter has no duration, and -p's exit does not end it (a
    // restarted process is measured again once the exporter is restarted with its new pid).
    // The HTTP connections are served on the skeleton's one thread, next to the maps they read.
    let limits = Limits { duration: None, targets: vec![] };
    crate::collect::run::run(limits, async |stopper: &mut Stopper| {
        export(&kernel, &listen, &capabilities, latency_options.as_ref(), args.allow_empty, stopper).await
    })
}

/// `--only`, or every capability.
fn chosen(only: &[Capability]) -> Vec<Capability> {
    let mut capabilities = if only.is_empty() { Capability::ALL.to_vec() } else { only.to_vec() };
    capabilities.sort_unstable();
    capabilities.dedup();
    capabilities
}

/// Latency's flags are latency's only: given with an `--only` that leaves latency out, they
/// would be silently ignored, so they are refused.
fn refuse_ignored_flags(args: &ExporterArgs, capabilities: &[Capability]) -> Result<(), UserError> {
    if capabilities.contains(&Capability::Latency) {
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

/// The latency selection, checked exactly as `mm-probe latency` checks it.
fn latency_options(args: &ExporterArgs) -> Result<latency::Options> {
    let selection = LatencySelection {
        threshold: args.threshold.unwrap_or(DEFAULT_THRESHOLD),
        all_tasks: args.all_tasks,
        functions: args.functions.clone(),
    };
    latency::Options::from_selection(&selection, &args.pids)
}

async fn export(
    kernel: &Kernel,
    listen: &[SocketAddr],
    capabilities: &[Capability],
    latency_options: Option<&latency::Options>,
    allow_empty: bool,
    stopper: &mut Stopper,
) -> Result<()> {
    let listener = http::bind(listen).await?;
    let address = listener.local_addr().context("reading the listening address")?;
    let thp_check = capabilities.contains(&Capability::Thp).then(|| thp_allow_check(kernel));
    let families: Vec<MapFamily> = capabilities.iter().map(|c| c.map_family()).collect();
    let mut ebpf =
        load_object(kernel, &families, &settings(kernel, capabilities, latency_options, thp_check.as_ref()))?;
    let sources = attach(kernel, &mut ebpf, latency_options, capabilities, thp_check)?;
    let plans = sources.plans();
    if let Some(error) = startup::nothing_attached(&plans).filter(|_| !allow_empty) {
        detach_all(&mut ebpf).await;
        return Err(error.into());
    }
    for line in startup::lines(address, &plans) {
        println!("{line}");
    }
    let object = Rc::new(RefCell::new(Some(ebpf)));
    let exporter = Rc::new(Exporter { sources, object: object.clone() });
    let served = tokio::select! {
        _ = stopper.wait() => Ok(()),
        drained = drain_every_period(&exporter) => drained,
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

/// Every chosen capability's globals, with its rings switched off: the exporter reads only maps.
fn settings(
    kernel: &Kernel,
    capabilities: &[Capability],
    latency_options: Option<&latency::Options>,
    thp_check: Option<&ThpDecoding>,
) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = Vec::new();
    if let Some(options) = latency_options {
        settings.extend(latency::settings(options, &latency::syscall_attribution(kernel)));
        settings.push((lat::STREAM_SPIKES, GlobalValue::U32(0)));
    }
    if capabilities.contains(&Capability::RetryStorm) {
        settings.extend(retry_storm::settings(&[]));
        settings.push((hmm::STREAM_EVENTS, GlobalValue::U32(0)));
    }
    if capabilities.contains(&Capability::Invalidations) {
        settings.extend(invalidations::globals::settings(kernel, &[]));
    }
    if let Some((allow_check, bits)) = thp_check {
        // No target process: the allow-check counts every mm (THP_EVERY_MM).
        settings.extend(thp_why::live::settings(0, allow_check, DisableMode::mask(*bits)));
        settings.push((thp::EVERY_MM, GlobalValue::U32(1)));
    }
    settings
}

/// The running kernel's allow-check and THP-disable bits, as thp-why decides them.
fn thp_allow_check(kernel: &Kernel) -> ThpDecoding {
    let allow_check =
        kernel.btf().ok().and_then(AllowCheck::from_btf).unwrap_or_else(|| AllowCheck::from_release(&kernel.release));
    (allow_check, thp_why::checks::disable_bits(kernel))
}

/// Attaches each chosen capability through its own catalog; what cannot attach is in its plan.
fn attach(
    kernel: &Kernel,
    ebpf: &mut Ebpf,
    latency_options: Option<&latency::Options>,
    capabilities: &[Capability],
    thp_check: Option<ThpDecoding>,
) -> Result<Sources> {
    let retry_storm = capabilities.contains(&Capability::RetryStorm);
    let planner = Planner::new(kernel);
    let latency = match latency_options {
        Some(options) => {
            latency::select_pids(ebpf, options)?;
            let (plan, functions) = latency::attach_probes(kernel, ebpf, options);
            Some(LatencySource { plan, functions, threshold_ns: options.threshold_ns })
        }
        None => None,
    };
    let invalidations_chosen = capabilities.contains(&Capability::Invalidations);
    let retry_storm = retry_storm.then(|| {
        // One attach per tracepoint: with invalidations chosen, KVM's tracepoints are its own
        // (it learns each VM's lock there) and serve the one KVM family.
        let kvm = [retry_storm::probes::KVM_UNMAP_PROBE, retry_storm::probes::KVM_AGE_PROBE];
        let probes: Vec<LogicalProbe> = retry_storm::probes::PROBES
            .iter()
            .filter(|p| !(invalidations_chosen && kvm.contains(&p.name)))
            .copied()
            .collect();
        let plan = planner.attach_all(ebpf, &probes);
        let seen = retry_storm::observability(kernel, &plan);
        RetryStormSource { plan, seen, programs: programs(retry_storm::probes::PROBES) }
    });
    // Only the allow-check: the faults, prctl and mmap_lock probes serve one target process.
    let thp = thp_check.map(|(allow_check, bits)| {
        let probes = [thp_why::probes::ALLOW_CHECK];
        let plan = planner.attach_all(ebpf, &probes);
        ThpSource { plan, allow_check, bits, programs: programs(&probes) }
    });
    let invalidations = invalidations_chosen.then(|| {
        let plan = planner.attach_all(ebpf, invalidations::probes::PROBES);
        let callbacks = invalidations::probes::attach_callbacks(kernel, ebpf);
        let seen =
            invalidations::probes::observability(&plan, &callbacks, invalidations::globals::kvm_locks_nameable(kernel));
        // Read again rather than borrowed: the sources outlive this function's kernel borrow.
        InvalidationsSource {
            plan,
            seen,
            kallsyms: Kallsyms::read().ok(),
            kvm_members: invalidations::globals::kvm_members(kernel),
            drain: Default::default(),
        }
    });
    Ok(Sources { release: kernel.release.clone(), latency, retry_storm, thp, invalidations })
}

/// Every program a catalog may attach.
fn programs(probes: &[LogicalProbe]) -> Vec<&'static str> {
    probes.iter().flat_map(|p| p.candidates).flat_map(|c| c.hooks).map(|h| h.program).collect()
}

/// What answers the scrapes: the attached sources and the object whose maps they read (`None`
/// once shutting down).
struct Exporter {
    sources: Sources,
    object: Rc<RefCell<Option<Ebpf>>>,
}

/// Drains the kernel's tables once a period whether or not anyone scrapes: a table must never
/// hold more than one period's keys. Returns only on an error.
async fn drain_every_period(exporter: &Exporter) -> Result<()> {
    let mut tick = Ticker::every(Some(invalidations::decoder::DRAIN_PERIOD));
    loop {
        tick.tick().await;
        exporter.drain().map_err(anyhow::Error::msg)?;
    }
}

impl Exporter {
    /// Moves the kernel's drained tables into the totals (nothing once shutting down).
    fn drain(&self) -> Result<(), String> {
        let mut object = self.object.borrow_mut();
        match object.as_mut() {
            Some(ebpf) => self.sources.drain(ebpf).map_err(|e| format!("draining the kernel maps: {e:#}")),
            None => Ok(()),
        }
    }
}

impl Exposition for Exporter {
    fn render(&self, format: Format) -> Result<String, String> {
        self.drain()?;
        let object = self.object.borrow();
        let ebpf = object.as_ref().ok_or_else(|| "mm-probe exporter is shutting down".to_string())?;
        let snapshot = self.sources.read(ebpf).map_err(|e| format!("reading the kernel maps: {e:#}"))?;
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
