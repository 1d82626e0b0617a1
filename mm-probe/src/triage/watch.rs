//! The watches: every watching command of mm-probe run at once, each as this same executable
//! with `--json`, so each goes through its own run driver, loads its own object and prints what
//! it would print alone. Their outputs are read back as `compare` reads a run. Every watch lasts
//! at least the triage's `--duration`.
//!
//! A capability disturbed by the others' loading (latency: verifying and attaching programs
//! delays real-time tasks) starts once the others are attached, and the others are stopped only
//! after it has ended, so that it reports neither their start-up nor their detaching as the
//! machine's latency. A stop signal (Ctrl-C reaches the children from the
//! terminal too; SIGTERM from a script does not) is passed on as SIGINT, which ends each child's
//! watch early with its summary, as it would alone; the triage then judges what they saw.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    capability::CapabilityId,
    compare::input::{self, Run},
};

/// What one capability's watch gave.
#[derive(Debug)]
pub struct Watch {
    pub capability: CapabilityId,
    pub outcome: Outcome,
}

#[derive(Debug)]
pub enum Outcome {
    /// It ran to its summary.
    Ran(Box<Run>),
    /// It did not: its own last words (the one-line error every command ends with).
    Failed(String),
}

/// The capabilities that watch a stream of work; thp-why, which examines one process, is
/// `thp.rs`'s to run per process.
pub fn watched() -> impl Iterator<Item = CapabilityId> {
    CapabilityId::ALL.iter().copied().filter(|c| c.definition().summary_work.is_some())
}

/// Runs every watching capability for `duration`, at once (those disturbed by the others'
/// loading once the others are attached); returns when all have printed their summaries (or
/// failed), in the order of the capability table.
pub fn watch_all(duration: Duration) -> Result<Vec<Watch>> {
    catch_stop_signals();
    let (first, last): (Vec<CapabilityId>, Vec<CapabilityId>) =
        watched().partition(|c| !c.definition().disturbed_by_loading);
    // The first ones run until told to stop: they outlive the last ones, whose watch their
    // detaching would disturb too (a kworker freeing programs delayed a FIFO kthread by 0.9 ms
    // in a one-CPU 6.12 guest), and stop once those are done and `duration` has passed.
    let first_until = Instant::now() + duration;
    let mut first: Vec<Started> = first.into_iter().map(|c| start(c, None)).collect::<Result<_>>()?;
    for watch in &first {
        // Its first line is its plan, printed once it is attached; a watch that ends without
        // one (an error) is waited for no longer either.
        let _ = watch.attached.recv_timeout(ATTACH_LIMIT);
    }
    let mut last_started = Vec::new();
    let mut stopped_before_start = Vec::new();
    for capability in last {
        if STOP.load(Ordering::Relaxed) {
            stopped_before_start.push(capability);
        } else {
            last_started.push(start(capability, Some(duration))?);
        }
    }
    for watch in &last_started {
        let _ = watch.attached.recv_timeout(ATTACH_LIMIT);
    }
    // On stderr, as the other commands say what they watch: a user knows the wait has begun,
    // and a benchmark knows when every capability is attached.
    eprintln!(
        "mm-probe: triage watching with every capability for {} (Ctrl-C to stop early)",
        crate::units::format_nanos(duration.as_nanos() as u64)
    );
    wait_then_stop(&mut first, &mut last_started, first_until);
    let mut watches = Vec::new();
    for mut watch in first.into_iter().chain(last_started) {
        let (stdout, stderr) = watch.output.join().unwrap_or_default();
        let status = watch.child.wait().with_context(|| format!("waiting for {}", watch.capability.command()))?;
        watches.push(Watch {
            capability: watch.capability,
            outcome: outcome(watch.capability, status.success(), &stdout, &stderr),
        });
    }
    watches.extend(stopped_before_start.into_iter().map(|capability| Watch {
        capability,
        outcome: Outcome::Failed("the triage was stopped before this watch started".to_string()),
    }));
    watches.sort_by_key(|w| CapabilityId::ALL.iter().position(|c| *c == w.capability));
    Ok(watches)
}

/// How long a watch may take to attach before the ones started after it go ahead anyway (an
/// emulated guest takes seconds).
const ATTACH_LIMIT: Duration = Duration::from_secs(120);

/// One running watch: its process, its output as it is read, and word of its first line.
struct Started {
    capability: CapabilityId,
    child: Child,
    output: thread::JoinHandle<(String, String)>,
    attached: mpsc::Receiver<()>,
}

/// Starts `capability`'s command as this executable, for `duration` (None: until SIGINT),
/// reading what it prints.
fn start(capability: CapabilityId, duration: Option<Duration>) -> Result<Started> {
    let exe = std::env::current_exe().context("finding mm-probe's own executable")?;
    let mut args = vec![capability.command().to_string(), "--json".to_string()];
    if let Some(duration) = duration {
        args.extend(["--duration".to_string(), format!("{}ms", duration.as_millis().max(1))]);
    }
    let mut command = Command::new(&exe);
    command.args(&args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // A watch without --duration ends only when told: should the triage die without telling
    // it (SIGKILL), the kernel tells it instead.
    // SAFETY: prctl(2) is async-signal-safe, the only kind of call allowed between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = command.spawn().with_context(|| format!("starting {}", capability.command()))?;
    let (tell, attached) = mpsc::channel();
    let output = read_both(&mut child, tell);
    Ok(Started { capability, child, output, attached })
}

/// Reads a child's stdout and stderr to their ends on threads of their own, so that a child
/// never blocks on a full pipe while another is waited for; says when its first line (or its
/// end) came.
fn read_both(child: &mut Child, attached: mpsc::Sender<()>) -> thread::JoinHandle<(String, String)> {
    let stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    thread::spawn(move || {
        let err_thread = thread::spawn(move || {
            let mut err = String::new();
            if let Some(pipe) = stderr.as_mut() {
                let _ = pipe.read_to_string(&mut err);
            }
            err
        });
        let mut out = String::new();
        if let Some(pipe) = stdout {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                out.push_str(&line);
                out.push('\n');
                let _ = attached.send(());
            }
        }
        let _ = attached.send(());
        (out, err_thread.join().unwrap_or_default())
    })
}

/// Set by SIGINT or SIGTERM to the triage itself.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Catches SIGINT and SIGTERM before any child starts, so that a stop ends the watches with
/// their summaries instead of killing the triage.
fn catch_stop_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
    }
}

/// Waits for every watch. The first ones get SIGINT once the last ones have ended and
/// `first_until` has passed; a stop signal to the triage is passed on, once, as SIGINT to every
/// watch still running.
fn wait_then_stop(first: &mut [Started], last: &mut [Started], first_until: Instant) {
    let (mut first_stopped, mut all_stopped) = (false, false);
    loop {
        let (first_running, last_running) = (running(first), running(last));
        if first_running.is_empty() && last_running.is_empty() {
            return;
        }
        if STOP.load(Ordering::Relaxed) && !all_stopped {
            interrupt(first_running.iter().chain(&last_running));
            (first_stopped, all_stopped) = (true, true);
        } else if !first_stopped && last_running.is_empty() && Instant::now() >= first_until {
            interrupt(first_running.iter());
            first_stopped = true;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of the watches still running.
fn running(watches: &mut [Started]) -> Vec<u32> {
    watches.iter_mut().filter_map(|w| matches!(w.child.try_wait(), Ok(None)).then(|| w.child.id())).collect()
}

/// SIGINT, as Ctrl-C: each watch ends with its summary.
fn interrupt<'a>(pids: impl Iterator<Item = &'a u32>) {
    for &pid in pids {
        // SAFETY: kill(2) on a child that try_wait has just found running, so not reaped and
        // its pid not reused.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    }
}

/// The watch's run, or why there is none.
fn outcome(capability: CapabilityId, succeeded: bool, stdout: &str, stderr: &str) -> Outcome {
    match read_run(capability.command(), succeeded, stdout, stderr) {
        Ok(run) => Outcome::Ran(run),
        Err(why) => Outcome::Failed(why),
    }
}

/// What a run of `command` (this executable, `--json`) printed, read as `compare` reads a run;
/// or why there is nothing to read: its own last words (the one-line error every command ends
/// with), or why its output could not be read.
pub fn read_run(command: &str, succeeded: bool, stdout: &str, stderr: &str) -> Result<Box<Run>, String> {
    if !succeeded {
        let line = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("it printed nothing");
        return Err(line.trim_start_matches("mm-probe: ").to_string());
    }
    input::from_lines(command, stdout.lines().map(|l| Ok(l.to_string())))
        .map(Box::new)
        .map_err(|e| format!("its output could not be read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_that_counts_work_is_watched_and_thp_is_not() {
        let watched: Vec<CapabilityId> = watched().collect();
        assert!(!watched.contains(&CapabilityId::Thp));
        assert_eq!(watched.len(), CapabilityId::ALL.len() - 1, "{watched:?}");
    }

    #[test]
    fn a_failed_watch_keeps_its_one_line_error() {
        let failed = outcome(CapabilityId::Latency, false, "", "warning\nmm-probe: no BTF here\n");
        assert!(matches!(failed, Outcome::Failed(ref why) if why == "no BTF here"), "{failed:?}");
        let unreadable = outcome(CapabilityId::Latency, true, "not json\n", "");
        assert!(matches!(unreadable, Outcome::Failed(ref why) if why.contains("could not be read")), "{unreadable:?}");
    }
}
