//! `mm-probe exporter`: keeps the latency, retry-storm and thp probes attached and serves what
//! their kernel programs count to Prometheus.
//!
//! One object is loaded with every chosen capability's settings and attached through each
//! capability's own catalog; the rings stay off (the programs' STREAM globals), so the kernel
//! side only aggregates. Stages, one per file: `scrape` reads the maps into a snapshot,
//! `buckets` turns kernel histograms into exact `le` buckets, `families` encodes the snapshot,
//! `http` serves it.

pub mod buckets;
pub mod families;
pub mod http;
pub mod scrape;

use std::{cell::RefCell, net::SocketAddr, rc::Rc};

use anyhow::{Context as _, Result};
use aya::Ebpf;
use mm_probe_common::{hmm, latency as lat, thp};

use self::{
    http::{Exposition, Format},
    scrape::{LatencySource, RetryStormSource, Sources, ThpSource},
};
use crate::{
    cli::{Capability, ExporterArgs},
    collect::StopSignals,
    kernel::{Kernel, layout::ThpDisableBits, privileges},
    latency,
    probes::{GlobalValue, LogicalProbe, MapFamily, Plan, Planner, ProbePlan, detach_all, load_object},
    retry_storm,
    thp_why::{self, checks::AllowCheck, reasons::DisableMode},
};

/// How this kernel's allow-check names its caller and which mm->flags bits disable THP.
type ThpDecoding = (AllowCheck, ThpDisableBits);

pub fn run(args: &ExporterArgs) -> Result<()> {
    let listen = http::parse_listen(&args.listen)?;
    let capabilities = chosen(&args.only);
    let latency_options = capabilities.contains(&Capability::Latency).then(|| latency_options(args)).transpose()?;
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    if let Some(options) = &latency_options {
        latency::check_functions_exist(&kernel, options)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    // The HTTP connections are served on this one thread, next to the maps they read.
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, export(&kernel, listen, &capabilities, latency_options.as_ref()))
}

/// `--only`, or every capability.
fn chosen(only: &[Capability]) -> Vec<Capability> {
    let mut capabilities = if only.is_empty() { Capability::ALL.to_vec() } else { only.to_vec() };
    capabilities.sort_unstable();
    capabilities.dedup();
    capabilities
}

/// The latency selection, checked exactly as `mm-probe latency` checks it.
fn latency_options(args: &ExporterArgs) -> Result<latency::Options> {
    latency::Options::from_selection(&args.latency)
}

async fn export(
    kernel: &Kernel,
    listen: SocketAddr,
    capabilities: &[Capability],
    latency_options: Option<&latency::Options>,
) -> Result<()> {
    let listener = http::bind(listen).await?;
    let address = listener.local_addr().unwrap_or(listen);
    // Before attaching: a SIGINT from now on ends the run with everything detached.
    let mut signals = StopSignals::install()?;
    let thp_check = capabilities.contains(&Capability::Thp).then(|| thp_allow_check(kernel));
    let families: Vec<MapFamily> = capabilities.iter().map(|c| c.map_family()).collect();
    let mut ebpf =
        load_object(kernel, &families, &settings(kernel, capabilities, latency_options, thp_check.as_ref()))?;
    let sources =
        attach(kernel, &mut ebpf, latency_options, capabilities.contains(&Capability::RetryStorm), thp_check)?;
    println!("mm-probe exporter: listening on http://{address}/metrics; {}", startup_summary(&sources));
    let object = Rc::new(RefCell::new(Some(ebpf)));
    let exporter = Rc::new(Exporter { sources, object: object.clone() });
    let served = tokio::select! {
        _ = signals.wait(None) => Ok(()),
        served = http::serve(listener, exporter) => served,
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
    (allow_check, thp_why::disable_bits(kernel))
}

/// Attaches each chosen capability through its own catalog; what cannot attach is in its plan.
fn attach(
    kernel: &Kernel,
    ebpf: &mut Ebpf,
    latency_options: Option<&latency::Options>,
    retry_storm: bool,
    thp_check: Option<ThpDecoding>,
) -> Result<Sources> {
    let planner = Planner::new(kernel);
    let latency = match latency_options {
        Some(options) => {
            latency::select_pids(ebpf, options)?;
            let (plan, functions) = latency::attach_probes(kernel, ebpf, options);
            Some(LatencySource { plan, functions, threshold_ns: options.threshold_ns })
        }
        None => None,
    };
    let retry_storm = retry_storm.then(|| {
        let plan = planner.attach_all(ebpf, retry_storm::probes::PROBES);
        let seen = retry_storm::observability(kernel, &plan);
        RetryStormSource { plan, seen, programs: programs(retry_storm::probes::PROBES) }
    });
    // Only the allow-check: the faults, prctl and mmap_lock probes serve one target process.
    let thp = thp_check.map(|(allow_check, bits)| {
        let probes = [thp_why::probes::ALLOW_CHECK];
        let plan = planner.attach_all(ebpf, &probes);
        ThpSource { plan, allow_check, bits, programs: programs(&probes) }
    });
    Ok(Sources { kernel_release: kernel.release.text.clone(), latency, retry_storm, thp })
}

/// Every program a catalog may attach.
fn programs(probes: &[LogicalProbe]) -> Vec<&'static str> {
    probes.iter().flat_map(|p| p.candidates).flat_map(|c| c.hooks).map(|h| h.program).collect()
}

/// "latency: attached …; unavailable … (why)" for each capability, on one line.
fn startup_summary(sources: &Sources) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &sources.latency {
        parts.push(capability_summary(Capability::Latency, &s.plan));
    }
    if let Some(s) = &sources.retry_storm {
        parts.push(capability_summary(Capability::RetryStorm, &s.plan));
    }
    if let Some(s) = &sources.thp {
        parts.push(capability_summary(Capability::Thp, &s.plan));
    }
    parts.join("; ")
}

fn capability_summary(capability: Capability, plan: &Plan) -> String {
    let attached: Vec<&str> = plan.probes.iter().filter(|p| p.attached()).map(|p| p.probe).collect();
    let unavailable: Vec<String> =
        plan.unavailable().map(|p: &ProbePlan| format!("{} ({})", p.probe, p.why_unavailable())).collect();
    let mut text = format!("{}: attached [{}]", capability.name(), attached.join(", "));
    if !unavailable.is_empty() {
        text += &format!(", unavailable [{}]", unavailable.join("; "));
    }
    text
}

/// What answers the scrapes: the attached sources and the object whose maps they read (`None`
/// once shutting down).
struct Exporter {
    sources: Sources,
    object: Rc<RefCell<Option<Ebpf>>>,
}

impl Exposition for Exporter {
    fn render(&self, format: Format) -> Result<String, String> {
        let object = self.object.borrow();
        let ebpf = object.as_ref().ok_or_else(|| "mm-probe exporter is shutting down".to_string())?;
        let snapshot = self.sources.read(ebpf).map_err(|e| format!("reading the kernel maps: {e:#}"))?;
        let text = families::openmetrics(snapshot).map_err(|e| format!("encoding the metrics: {e}"))?;
        Ok(if format == Format::OpenMetrics { text } else { families::classic(&text) })
    }
}
