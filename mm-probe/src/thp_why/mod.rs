//! `mm-probe thp-why <pid>`: why a process gets no transparent huge pages.
//!
//! The pipeline: `procfs`/`sysfs` read what /proc and /sys say, `ancestry` finds who set the
//! prctl flag, `probes` + `live` run the kernel programs (allow-check, faults, prctl, mm flags)
//! and read back their raw counts, `facts` is what the allow-check looks at in one VMA,
//! `checks` + `reasons` hold the kernel's order of checks per version and judge those facts,
//! `inputs` is everything gathered, which the judgement reads, `decoder` turns the live keys into
//! per-VMA counts, `judge` decides the mode, every VMA and the verdict, `rank` orders the reasons
//! and their fixes, `scan_result` + `collapse` explain khugepaged's scans of the target, `verdict`
//! says it in one line, `per_size` the per-size (mTHP) policy, `report` is the JSON model,
//! `render` (and `vma_table`) print it; `access` says why a process's memory map may not be read.

pub mod access;
pub mod ancestry;
pub mod checks;
pub mod collapse;
pub mod decoder;
pub mod export;
pub mod facts;
pub mod inputs;
pub mod judge;
pub mod live;
pub mod per_size;
pub mod probes;
pub mod procfs;
pub mod rank;
pub mod reasons;
pub mod render;
pub mod report;
pub mod scan_result;
pub mod sysfs;
pub mod verdict;
pub mod vma_table;
pub mod words;

use std::time::{Duration, Instant};

use anyhow::Result;
use mm_probe_common::thp::PrctlEvent;

use self::{
    checks::{AllowCheck, DecidedFrom, disable_bits},
    inputs::{Inputs, LiveInput},
    judge::{attribute, disable_facts},
    live::Live,
    procfs::{Proc, ProcError, Vma},
    reasons::{DisableMode, ModeSource},
    report::StoppedBy,
    scan_result::ScanResults,
    sysfs::SystemPolicy,
};
use crate::{
    cli::ThpWhyArgs,
    collect::{
        Stop,
        run::{Limits, Stopper},
    },
    error::UserError,
    kernel::{Kernel, layout::ThpDisableBits, privileges},
    report::text,
    user_bail,
};

/// How far up the process tree to look for the process that set the flag.
const MAX_ANCESTORS: usize = 64;

pub fn run(args: &ThpWhyArgs) -> Result<()> {
    let target = validate_target(args.pid())?;
    // --duration is the live watch alone (it starts once attached), so the skeleton is given no
    // deadline; the target's exit ends the run.
    let limits = Limits { duration: None, targets: vec![target.proc.pid] };
    let report = crate::collect::run::run(limits, async |stopper: &mut Stopper| examine(&target, args, stopper).await)?;
    if args.json {
        println!("{}", render::json(&report));
    } else {
        text::print(&render::text(&report, args.all_vmas, text::width()));
    }
    Ok(())
}

/// The process to examine, after the checks that make bad input a one-line error.
struct Target {
    proc: Proc,
    comm: String,
    cmdline: String,
    notes: Vec<String>,
}

fn validate_target(pid: u32) -> Result<Target> {
    if pid == 0 {
        user_bail!("pid 0 is the idle task, not a process: give the pid of a running process");
    }
    let mut notes = Vec::new();
    let mut proc = Proc::new(pid);
    let stat = proc.stat().map_err(|e| user_error(pid, e))?;
    if stat.is_kernel_thread() {
        user_bail!(
            "pid {pid} ({}) is a kernel thread: it has no user memory, so transparent huge pages do not apply",
            stat.comm
        );
    }
    if matches!(stat.state, 'Z' | 'X') {
        user_bail!(
            "pid {pid} ({}) is a zombie: it has exited and its memory is gone (parent {} has not reaped it yet)",
            stat.comm,
            stat.ppid
        );
    }
    let status = proc.status().map_err(|e| user_error(pid, e))?;
    if status.tgid != 0 && status.tgid != pid {
        notes.push(format!(
            "pid {pid} is a thread of process {}; examining the process (threads share one mm)",
            status.tgid
        ));
        proc = Proc::new(status.tgid);
    }
    proc.check_smaps_access().map_err(|e| user_error(pid, e))?;
    let comm = proc.stat().map(|s| s.comm).unwrap_or(stat.comm);
    let cmdline = proc.cmdline().unwrap_or_default();
    Ok(Target { proc, comm, cmdline, notes })
}

fn user_error(pid: u32, error: ProcError) -> anyhow::Error {
    match error {
        ProcError::Gone { .. } => {
            UserError::new(format!("no process {pid}: it does not exist (or has already exited)")).into()
        }
        ProcError::Denied { .. } => UserError::new(error.to_string()).into(),
        other => anyhow::Error::new(other),
    }
}

async fn examine(target: &Target, args: &ThpWhyArgs, stopper: &mut Stopper) -> Result<report::Report> {
    let pid = target.proc.pid;
    let kernel = Kernel::running()?;
    let allow_check =
        kernel.btf().ok().and_then(AllowCheck::from_btf).unwrap_or_else(|| AllowCheck::from_release(&kernel.release));
    let bits = disable_bits(&kernel);
    let mut notes = target.notes.clone();
    if allow_check.decided_from == DecidedFrom::Release {
        notes.push(format!(
            "no BTF for {}: the allow-check's arguments are assumed from the release number",
            allow_check.function
        ));
    }

    let policy_start = SystemPolicy::read();
    let vmstat_start = procfs::read_vmstat_thp();
    let (mut live, live_skipped) = start_live(&kernel, pid, &allow_check, bits, args.duration);

    // The kernel's view of the target's mm (and the filter's mm pointer), before anything else.
    let seen_start = live.as_mut().and_then(|l| l.probe_mm(&target.proc));
    if let (Some(l), Some(seen)) = (live.as_mut(), seen_start) {
        l.offer_target_mm(seen)?;
    }
    let vmas_start = read_smaps(&target.proc)?;
    let mounts = target.proc.mountinfo().unwrap_or_default();
    let thp_built_in = policy_start.thp_built_in;
    let ancestors = ancestry::walk(pid, MAX_ANCESTORS, |p| ancestor_mode(live.as_mut(), p, bits, thp_built_in));

    let started = Instant::now();
    let mut prctl_events = Vec::new();
    let stopped_by = match live.as_mut() {
        Some(l) => {
            text::eprintln(&format!(
                "mm-probe: watching pid {pid} ({}) for {} (Ctrl-C to stop early)",
                target.comm,
                crate::units::format_nanos(args.duration.as_nanos() as u64)
            ));
            // The allow-check and the faults are explained in the report; the others here.
            let reported = [probes::ALLOW_CHECK.name, probes::PAGE_FAULTS.name];
            let others = l.plan.unavailable().filter(|p| !reported.contains(&p.probe));
            eprint!("{}", crate::probes::unavailable_summary(others, text::stderr_width()));
            watch(l, stopper, args.duration, &mut prctl_events).await
        }
        None => StoppedBy::NotRun,
    };
    let elapsed = started.elapsed();

    let alive = target_alive(&target.proc);
    let seen_end = if alive { live.as_mut().and_then(|l| l.probe_mm(&target.proc)) } else { None };
    let vmas_end = if alive { read_smaps(&target.proc).unwrap_or_default() } else { Vec::new() };
    let exited = !alive || vmas_end.is_empty();
    if exited {
        notes.push(format!(
            "process {pid} exited during the run (after {:.1}s): partial results — VMAs are from the start of the \
             run, live counts up to its exit",
            elapsed.as_secs_f64()
        ));
    }
    let vmas_end = if exited { vmas_start.clone() } else { vmas_end };
    let policy = SystemPolicy::read();
    let policy_changed = policy.enabled != policy_start.enabled
        || policy.sizes.iter().map(|s| s.enabled).ne(policy_start.sizes.iter().map(|s| s.enabled));
    let vmstat_end = procfs::read_vmstat_thp();

    if let Some(l) = live.as_mut() {
        // Nothing is counted past this point, so the counts read below are exact (each CPU's
        // open run of faults included).
        l.detach().await;
        l.drain_prctl(&mut prctl_events);
    }
    let status = target.proc.status().ok();
    let kernel_seen =
        seen_end.or_else(|| live.as_ref().and_then(|l| l.target_mm().ok()).filter(|s| s.mm != 0)).or(seen_start);
    // Without THP in the kernel THP_enabled prints 0 for every process: it says nothing.
    let status_thp_enabled = status.and_then(|s| s.thp_enabled).filter(|_| policy.thp_built_in);
    let disable = disable_facts(kernel_seen, status_thp_enabled, bits, &allow_check, &policy, &vmas_end, &mounts);
    if disable.source == ModeSource::Smaps {
        notes.push(
            "the except-advised mode was inferred from smaps (THPeligible 0 where nothing else refuses): \
             /proc/PID/status THP_enabled hides it and mm->flags could not be read here"
                .into(),
        );
    }
    let (ancestors, set_by) = attribute(ancestors, &disable);
    let live_input = match live {
        Some(l) => {
            let counts = l.counts()?;
            Some(LiveInput {
                plan: l.plan.clone(),
                checks: counts.checks,
                fault_ranges: counts.fault_ranges,
                counters: counts.counters,
                collapse: counts.collapse,
                duration_ns: elapsed.as_nanos() as u64,
                stopped_by,
            })
        }
        None => None,
    };
    Ok(judge::build(Inputs {
        pid,
        comm: target.comm.clone(),
        cmdline: target.cmdline.clone(),
        kernel_release: kernel.release.text.clone(),
        allow_check,
        bits,
        policy,
        policy_start,
        policy_changed,
        scan_results: scan_results(&kernel),
        vmstat_start,
        vmstat_end,
        vmas_start,
        vmas_end,
        mounts,
        disable,
        ancestors,
        set_by,
        prctl_events,
        live: live_input,
        live_skipped,
        notes,
    }))
}

/// This kernel's names of khugepaged's scan results: BTF, else the tracepoint's own table.
fn scan_results(kernel: &Kernel) -> ScanResults {
    if let Some(names) = kernel.btf().ok().and_then(ScanResults::from_btf) {
        return names;
    }
    let printed = crate::kernel::tracefs::root().ok().and_then(|root| {
        crate::kernel::tracefs::print_symbols(&root, "huge_memory", "mm_khugepaged_scan_pmd", "status")
    });
    printed.map_or_else(ScanResults::unknown, |symbols| ScanResults::from_tracefs(&symbols))
}

/// Starts the kernel side, or says why there is none (no privileges is not fatal: /proc still
/// tells most of the story).
fn start_live(
    kernel: &Kernel,
    pid: u32,
    allow_check: &AllowCheck,
    bits: ThpDisableBits,
    duration: Duration,
) -> (Option<Live>, Option<String>) {
    if duration.is_zero() {
        return (None, Some("live tracing skipped (--duration 0s)".into()));
    }
    if !privileges::can_trace(privileges::effective_caps()) {
        return (None, Some("live tracing needs root (or CAP_BPF and CAP_PERFMON); /proc facts only".into()));
    }
    match Live::start(kernel, pid, allow_check, DisableMode::mask(bits)) {
        Ok(live) => (Some(live), None),
        Err(e) => (None, Some(format!("the kernel programs did not load: {e:#}"))),
    }
}

fn read_smaps(proc: &Proc) -> Result<Vec<Vma>> {
    let vmas = proc.smaps().map_err(|e| match e {
        ProcError::Gone { pid } => UserError::new(format!("process {pid} exited before it could be examined")).into(),
        ProcError::Denied { .. } => anyhow::Error::new(UserError::new(e.to_string())),
        other => anyhow::Error::new(other).context("reading smaps"),
    })?;
    if vmas.is_empty() && !target_alive(proc) {
        user_bail!("process {} exited before it could be examined", proc.pid);
    }
    Ok(vmas)
}

fn target_alive(proc: &Proc) -> bool {
    proc.stat().is_ok_and(|s| !matches!(s.state, 'Z' | 'X'))
}

/// Waits for the duration, Ctrl-C or the target's exit, collecting prctl calls meanwhile.
async fn watch(live: &mut Live, stopper: &mut Stopper, duration: Duration, events: &mut Vec<PrctlEvent>) -> StoppedBy {
    let deadline = tokio::time::sleep(duration);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            why = stopper.wait() => return match why {
                Stop::DurationElapsed => StoppedBy::Duration,
                Stop::Interrupted => StoppedBy::Interrupted,
                Stop::TargetExited => StoppedBy::TargetExited,
            },
            () = &mut deadline => return StoppedBy::Duration,
            result = live.next_prctl(events) => if result.is_err() { return StoppedBy::RingBufferError },
        }
    }
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
