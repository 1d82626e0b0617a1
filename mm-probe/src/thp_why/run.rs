//! thp-why as the run driver runs it: its target checked when the command is built, its kernel
//! side optional (without privileges, with `--duration 0s`, or when the object does not load, the
//! report rests on /proc and sysfs and says why), /proc and sysfs read before the watch and after
//! it (the mm flags through the programs while they are attached), prctl calls taken in while
//! watching, the counts read once detached, and one report at the end.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::Ebpf;
use mm_probe_common::thp::{MmSeen, PrctlEvent};

use super::{
    ancestry::{self, Ancestor},
    checks::{AllowCheck, DecidedFrom, disable_bits},
    inputs::{Inputs, LiveInput},
    judge::{self, attribute, disable_facts},
    live::{self, Counts, Live, read_counts},
    probes,
    procfs::{self, Mount, Proc, Vma},
    reasons::{DisableMode, ModeSource},
    render,
    report::{Report, StoppedBy},
    scan_result::ScanResults,
    sysfs::SystemPolicy,
    target::{Target, is_alive, read_smaps, validate_target},
};
use crate::{
    capability::CapabilityId as Id,
    cli::{RunArgs, ThpWhyArgs},
    collect::{
        Stop,
        driver::{Capability, End, KernelSide, Printout, Session, Untraced},
    },
    kernel::{Kernel, layout::ThpDisableBits, tracefs},
    probes::{GlobalValue, unavailable_summary},
    report::{json, text},
    units::format_nanos,
};

/// How far up the process tree to look for the process that set the flag.
const MAX_ANCESTORS: usize = 64;

/// `mm-probe thp-why`, its target checked.
pub struct ThpWhy {
    run: RunArgs,
    target: Target,
    all_vmas: bool,
}

impl ThpWhy {
    pub fn from_args(args: &ThpWhyArgs) -> Result<Self> {
        let target = validate_target(args.pid())?;
        // --duration is the watch alone: the driver counts it from its first wait, once attached
        // and the start read. The target's exit ends the watch too.
        let run = RunArgs {
            duration: Some(args.duration),
            interval: None,
            pids: vec![target.proc.pid],
            json: args.json,
            plot: None,
        };
        Ok(Self { run, target, all_vmas: args.all_vmas })
    }

    fn examination<'k>(&self, kernel: &'k Kernel, live: Option<Live>, live_skipped: Option<String>) -> Examination<'k> {
        let allow_check = AllowCheck::of(kernel);
        let mut notes = self.target.notes.clone();
        if allow_check.decided_from == DecidedFrom::Release && kernel.btf().is_err() {
            notes.push(format!(
                "no BTF for {}: the allow-check's arguments are assumed from the release number",
                allow_check.function
            ));
        }
        Examination {
            kernel,
            target: self.target.clone(),
            all_vmas: self.all_vmas,
            watch_for: self.run.duration.unwrap_or_default(),
            allow_check,
            bits: disable_bits(kernel),
            live,
            live_skipped,
            notes,
            start: None,
            finish: None,
            prctl_events: Vec::new(),
            ring_failed: false,
            counts: None,
            target_mm: None,
        }
    }
}

impl Capability for ThpWhy {
    type Session<'k> = Examination<'k>;
    const ID: Id = Id::Thp;
    const PLOT_LINE: Option<json::Line> = None;
    /// No privileges is not fatal: /proc still tells most of the story.
    const KERNEL_SIDE: KernelSide = KernelSide::Optional;

    fn run_args(&self) -> &RunArgs {
        &self.run
    }

    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        live::settings(self.target.proc.pid, &AllowCheck::of(kernel), DisableMode::mask(disable_bits(kernel)))
    }

    fn attach<'k>(&self, kernel: &'k Kernel, ebpf: &mut Ebpf) -> Result<Examination<'k>> {
        let live = Live::attach(kernel, ebpf, probes::PROBES)?;
        Ok(self.examination(kernel, Some(live), None))
    }

    fn without_tracing<'k>(&self, kernel: &'k Kernel, why: Untraced) -> Result<Examination<'k>> {
        let why = match why {
            Untraced::NoWatch => "live tracing skipped (--duration 0s)".into(),
            Untraced::NoPrivileges => "live tracing needs root (or CAP_BPF and CAP_PERFMON); /proc facts only".into(),
            Untraced::NotLoaded(error) => format!("the kernel programs did not load: {error:#}"),
        };
        Ok(self.examination(kernel, None, Some(why)))
    }
}

/// What the run starts from, read before the watch: judged against the end.
struct Start {
    policy: SystemPolicy,
    vmstat: BTreeMap<String, u64>,
    /// The kernel's view of the target's mm, through the programs.
    seen: Option<MmSeen>,
    vmas: Vec<Vma>,
    mounts: Vec<Mount>,
    ancestors: Vec<Ancestor>,
    /// When the watch began: once all of the above was read.
    watch_began: Instant,
}

/// What the run ends with, read after the watch while the programs are still attached.
struct Finish {
    watched: Duration,
    seen: Option<MmSeen>,
    /// The start's VMAs when the target exited: they are what there is to judge.
    vmas: Vec<Vma>,
    policy: SystemPolicy,
    policy_changed: bool,
    vmstat: BTreeMap<String, u64>,
}

/// thp-why while it examines its target.
pub struct Examination<'k> {
    kernel: &'k Kernel,
    target: Target,
    all_vmas: bool,
    /// `--duration`: how long the watch lasts unless something ends it first.
    watch_for: Duration,
    allow_check: AllowCheck,
    bits: ThpDisableBits,
    /// The attached programs, or why there are none (`live_skipped`).
    live: Option<Live>,
    live_skipped: Option<String>,
    notes: Vec<String>,
    start: Option<Start>,
    finish: Option<Finish>,
    prctl_events: Vec<PrctlEvent>,
    /// Reading the prctl ring failed, which ended the watch.
    ring_failed: bool,
    /// What the programs counted, read once detached.
    counts: Option<Counts>,
    /// The target's mm as the programs learned it, read once detached.
    target_mm: Option<MmSeen>,
}

impl Examination<'_> {
    /// The report: the run's start and end, what the programs counted if they ran, judged.
    /// `stopped_by` is `None` when there was no watch.
    fn report(&mut self, stopped_by: Option<Stop>) -> Result<Report> {
        let start = self.start.take().context("the start of the run was not read")?;
        let end = self.finish.take().context("the end of the run was not read")?;
        let status = self.target.proc.status().ok();
        // Without THP in the kernel THP_enabled prints 0 for every process: it says nothing.
        let status_thp_enabled = status.and_then(|s| s.thp_enabled).filter(|_| end.policy.thp_built_in);
        // A kernel read at the end is current. One from earlier (the programs learning the target's
        // mm, or the start) predates any prctl made since, which /proc/PID/status, read now, has
        // seen: it stands in only where status does not answer (before 5.11 no mmap_lock
        // tracepoint reads the flags at the end).
        let earlier = self.target_mm.filter(|s| s.mm != 0).or(start.seen);
        let kernel_seen = end.seen.or(earlier.filter(|_| status_thp_enabled.is_none()));
        let disable = disable_facts(
            kernel_seen,
            status_thp_enabled,
            self.bits,
            &self.allow_check,
            &end.policy,
            &end.vmas,
            &start.mounts,
        );
        if disable.source == ModeSource::Smaps {
            self.notes.push(
                "the except-advised mode was inferred from smaps (THPeligible 0 where nothing else refuses): \
                 /proc/PID/status THP_enabled hides it and mm->flags could not be read here"
                    .into(),
            );
        }
        let (ancestors, set_by) = attribute(start.ancestors, &disable);
        let live = match (&self.live, self.counts.take(), stopped_by) {
            (Some(live), Some(counts), Some(stop)) => Some(LiveInput {
                plan: live.plan.clone(),
                checks: counts.checks,
                fault_ranges: counts.fault_ranges,
                counters: counts.counters,
                collapse: counts.collapse,
                duration_ns: end.watched.as_nanos() as u64,
                stopped_by: stopped_by_name(stop),
            }),
            _ => None,
        };
        Ok(judge::build(Inputs {
            pid: self.target.proc.pid,
            comm: self.target.comm.clone(),
            cmdline: self.target.cmdline.clone(),
            kernel_release: self.kernel.release.text.clone(),
            allow_check: self.allow_check.clone(),
            bits: self.bits,
            policy: end.policy,
            policy_start: start.policy,
            policy_changed: end.policy_changed,
            scan_results: scan_results(self.kernel),
            vmstat_start: start.vmstat,
            vmstat_end: end.vmstat,
            vmas_start: start.vmas,
            vmas_end: end.vmas,
            mounts: start.mounts,
            disable,
            ancestors,
            set_by,
            prctl_events: std::mem::take(&mut self.prctl_events),
            live,
            live_skipped: self.live_skipped.clone(),
            notes: std::mem::take(&mut self.notes),
        }))
    }

    fn printout(&self, report: &Report) -> Printout {
        Printout::new(render::json(report), render::text(report, self.all_vmas, text::width()))
    }
}

impl Session for Examination<'_> {
    /// The policy and counters at the start, the target's mm as the kernel sees it (offered to
    /// the allow-check filter, before anything else), its VMAs and mounts, and its ancestors.
    fn before_watch(&mut self) -> Result<()> {
        let policy = SystemPolicy::read();
        let vmstat = procfs::read_vmstat_thp();
        let seen = self.live.as_mut().and_then(|l| l.probe_mm(&self.target.proc));
        if let (Some(live), Some(seen)) = (self.live.as_mut(), seen) {
            live.offer_target_mm(seen)?;
        }
        let vmas = read_smaps(&self.target.proc)?;
        let mounts = self.target.proc.mountinfo().unwrap_or_default();
        let (bits, thp_built_in) = (self.bits, policy.thp_built_in);
        let ancestors = ancestry::walk(self.target.proc.pid, MAX_ANCESTORS, |p| {
            ancestor_mode(self.live.as_mut(), p, bits, thp_built_in)
        });
        self.start = Some(Start { policy, vmstat, seen, vmas, mounts, ancestors, watch_began: Instant::now() });
        Ok(())
    }

    /// What is watched, on stderr; the allow-check and the faults are explained in the report,
    /// the other probes that did not attach here.
    fn plan(&self) -> Printout {
        let Some(live) = &self.live else { return Printout::default() };
        let watching = format!(
            "mm-probe: watching pid {} ({}) for {} (Ctrl-C to stop early)",
            self.target.proc.pid,
            self.target.comm,
            format_nanos(self.watch_for.as_nanos() as u64)
        );
        let reported = [probes::ALLOW_CHECK.name, probes::PAGE_FAULTS.name];
        let others = live.plan.unavailable().filter(|p| !reported.contains(&p.probe));
        let unavailable = unavailable_summary(others, text::stderr_width());
        Printout::new(String::new(), format!("{watching}\n{unavailable}"))
    }

    async fn turn(&mut self, _ebpf: &mut Ebpf) -> Result<()> {
        match self.live.as_mut() {
            Some(live) => live.next_prctl(&mut self.prctl_events).await,
            None => std::future::pending().await,
        }
    }

    /// The report says the prctl ring failed and when, with everything else it has.
    fn turn_failed(&mut self, _error: anyhow::Error) -> Result<()> {
        self.ring_failed = true;
        Ok(())
    }

    /// No `--interval`: one report at the end.
    fn interval(&mut self, _ebpf: &mut Ebpf, _now_ns: u64) -> Result<Printout> {
        Ok(Printout::default())
    }

    /// The target's VMAs, mm and the policy at the end; a target that exited leaves the VMAs of
    /// the start, and a note.
    fn after_watch(&mut self) -> Result<()> {
        let start = self.start.as_ref().context("the start of the run was not read")?;
        let watched = start.watch_began.elapsed();
        let proc = &self.target.proc;
        let alive = is_alive(proc);
        let seen = if alive { self.live.as_mut().and_then(|l| l.probe_mm(proc)) } else { None };
        let vmas = if alive { read_smaps(proc).unwrap_or_default() } else { Vec::new() };
        let exited = !alive || vmas.is_empty();
        if exited {
            self.notes.push(format!(
                "process {} exited during the run (after {:.1}s): partial results — VMAs are from the start of \
                 the run, live counts up to its exit",
                proc.pid,
                watched.as_secs_f64()
            ));
        }
        let vmas = if exited { start.vmas.clone() } else { vmas };
        let policy = SystemPolicy::read();
        let policy_changed = policy.enabled != start.policy.enabled
            || policy.sizes.iter().map(|s| s.enabled).ne(start.policy.sizes.iter().map(|s| s.enabled));
        let vmstat = procfs::read_vmstat_thp();
        self.finish = Some(Finish { watched, seen, vmas, policy, policy_changed, vmstat });
        Ok(())
    }

    /// Nothing is counted past the detach, so the counts read here are exact (each CPU's open
    /// run of faults included).
    fn drain(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        if let Some(live) = self.live.as_mut() {
            live.drain_prctl(&mut self.prctl_events);
            self.target_mm = live.target_mm().ok();
        }
        self.counts = Some(read_counts(ebpf)?);
        Ok(())
    }

    /// The report's notes say it, with when and what its VMAs are from.
    fn target_exited(&self, _pid: u32) -> Option<String> {
        None
    }

    fn summary(&mut self, _ebpf: &mut Ebpf, end: &End) -> Result<Printout> {
        let stopped_by = if self.ring_failed { Stop::SourceFailed } else { end.stopped_by };
        let report = self.report(Some(stopped_by))?;
        Ok(self.printout(&report))
    }

    fn untraced_summary(&mut self) -> Result<Printout> {
        let report = self.report(None)?;
        Ok(self.printout(&report))
    }
}

/// How the watch ended, in the report's words.
fn stopped_by_name(stop: Stop) -> StoppedBy {
    match stop {
        Stop::DurationElapsed => StoppedBy::Duration,
        Stop::Interrupted => StoppedBy::Interrupted,
        Stop::TargetExited => StoppedBy::TargetExited,
        Stop::SourceFailed => StoppedBy::RingBufferError,
    }
}

/// This kernel's names of khugepaged's scan results: BTF, else the tracepoint's own table.
fn scan_results(kernel: &Kernel) -> ScanResults {
    if let Some(names) = kernel.btf().ok().and_then(|btf| ScanResults::from_btf(&btf)) {
        return names;
    }
    let printed = tracefs::root()
        .ok()
        .and_then(|root| tracefs::print_symbols(&root, "huge_memory", "mm_khugepaged_scan_pmd", "status"));
    printed.map_or_else(ScanResults::unknown, |symbols| ScanResults::from_tracefs(&symbols))
}

/// An ancestor's mode: the kernel's mm->flags when the mmap_lock probe works, else THP_enabled.
fn ancestor_mode(
    live: Option<&mut Live>,
    proc: &Proc,
    bits: ThpDisableBits,
    thp_built_in: bool,
) -> (Option<DisableMode>, ModeSource) {
    if let Some(seen) = live.and_then(|l| l.probe_mm(proc)) {
        return (Some(DisableMode::from_mm_flags(bits, seen.flags)), ModeSource::Kernel);
    }
    let status = proc.status().ok().and_then(|s| s.thp_enabled).filter(|_| thp_built_in);
    (status.map(|enabled| if enabled { DisableMode::None } else { DisableMode::Completely }), ModeSource::Status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's stops in the report's words; the one source of thp-why that can fail is the
    /// prctl ring.
    #[test]
    fn each_way_the_watch_ends_has_its_report_name() {
        let named =
            [Stop::DurationElapsed, Stop::Interrupted, Stop::TargetExited, Stop::SourceFailed].map(stopped_by_name);
        assert_eq!(
            named,
            [StoppedBy::Duration, StoppedBy::Interrupted, StoppedBy::TargetExited, StoppedBy::RingBufferError]
        );
    }
}
