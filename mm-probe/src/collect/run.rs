//! The run skeleton every command shares, written once:
//!
//! 1. one tokio runtime (current-thread, inside a `LocalSet` so the exporter can serve its
//!    connections next to the maps they read);
//! 2. the stop handlers (SIGINT, SIGTERM) installed before the command's body runs, so before
//!    anything attaches: a signal that arrives before its handler exists would kill the tool
//!    without its summary (or be lost, when a non-interactive parent shell ignores SIGINT);
//! 3. one way to wait for the end ([`Stopper::wait`]): a signal, the `--duration`, or the exit
//!    of every target process;
//! 4. one interval tick ([`Ticker`]) with one missed-tick policy;
//! 5. the order at the end lives one level up, in the run driver (`driver.rs`): detach, then
//!    drain the rings, then read the final counts, then print, so that counters and rings
//!    describe the same events.

use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    time::{Instant, Interval, MissedTickBehavior},
};

use super::shutdown::Stop;
use crate::kernel::process;

/// What ends a run besides a signal.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    /// `--duration`; `None` runs until a signal (or the targets' exit).
    pub duration: Option<Duration>,
    /// Processes (`-p`) whose exit ends the run once every one of them has exited.
    pub targets: Vec<u32>,
}

impl Limits {
    /// The limits of a command run for `-p` processes: each must be running now (an unknown
    /// pid or a zombie is the user's error, said before anything attaches).
    pub fn of_processes(duration: Option<Duration>, pids: &[u32]) -> Result<Self, crate::error::UserError> {
        process::running_processes(pids)?;
        Ok(Self { duration, targets: pids.to_vec() })
    }
}

/// How often the targets are checked for exit: /proc is cheap to read, and a tenth of a second
/// is well under any `--interval` a user can ask for.
const TARGET_POLL: Duration = Duration::from_millis(100);

/// Builds the runtime, installs the stop handlers, then runs `body` to completion.
pub fn run<T>(limits: Limits, body: impl AsyncFnOnce(&mut Stopper) -> Result<T>) -> Result<T> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the tokio runtime")?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let mut stopper = with_stop_signals_held(|| Stopper::install(limits))?;
        body(&mut stopper).await
    })
}

/// Runs `install` with SIGINT and SIGTERM blocked on this thread, then delivers any that came
/// meanwhile. tokio's registry installs the sigaction first and publishes the action that
/// records the signal a moment later; a signal in between finds no action and is dropped,
/// although /proc already shows it caught. Held, it stays pending and reaches the complete
/// handler at the unblock. No other thread exists yet that could take it instead: the
/// current-thread runtime starts threads only for blocking work, later.
fn with_stop_signals_held<T>(install: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; pthread_sigmask changes
    // only this thread's mask and is restored below on every path (`install` cannot unwind
    // past it: panics end the process through the hook in main).
    unsafe {
        let mut stop: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut stop);
        libc::sigaddset(&mut stop, libc::SIGINT);
        libc::sigaddset(&mut stop, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &stop, &mut before);
        let installed = install();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        installed
    }
}

/// The end of a run, waited for in every command's loop.
pub struct Stopper {
    interrupt: Signal,
    terminate: Signal,
    duration: Option<Duration>,
    /// Set at the first wait: --duration counts from the moment the command is attached (its
    /// first wait), not from start-up, which takes seconds in an emulated guest.
    deadline: Option<Instant>,
    targets: Vec<u32>,
    exited: Vec<u32>,
    poll: Interval,
}

impl Stopper {
    /// Must run inside the runtime (tokio registers the signal handlers with its driver).
    fn install(limits: Limits) -> Result<Self> {
        let mut poll = tokio::time::interval(TARGET_POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            duration: limits.duration,
            deadline: None,
            targets: limits.targets,
            exited: Vec::new(),
            poll,
        })
    }

    /// Resolves when the run should end. Cancel-safe: call it again in every `select!` turn.
    pub async fn wait(&mut self) -> Stop {
        if self.deadline.is_none() {
            self.deadline = self.duration.map(|d| Instant::now() + d);
        }
        let deadline = async {
            match self.deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let targets_gone = async {
            if self.targets.is_empty() {
                return std::future::pending().await;
            }
            loop {
                self.poll.tick().await;
                note_exits(&self.targets, &mut self.exited);
                if self.exited.len() == self.targets.len() {
                    return;
                }
            }
        };
        tokio::select! {
            biased;
            _ = self.interrupt.recv() => Stop::Interrupted,
            _ = self.terminate.recv() => Stop::Interrupted,
            () = deadline => Stop::DurationElapsed,
            () = targets_gone => Stop::TargetExited,
        }
    }

    /// Whether the run should already end, without waiting (for bodies that do long blocking
    /// work between attaching and their loop).
    pub async fn poll_now(&mut self) -> Option<Stop> {
        tokio::select! {
            biased;
            stop = self.wait() => Some(stop),
            () = std::future::ready(()) => None,
        }
    }

    /// Targets seen to exit so far (a note for the summary: "process N exited while being
    /// traced; partial results below"), checked once more now.
    pub fn exited_targets(&mut self) -> Vec<u32> {
        note_exits(&self.targets, &mut self.exited);
        self.exited.clone()
    }
}

/// Adds to `exited` every target that is gone or a zombie now.
fn note_exits(targets: &[u32], exited: &mut Vec<u32>) {
    for &pid in targets {
        if !exited.contains(&pid) && !process::is_alive(pid) {
            exited.push(pid);
        }
    }
}

/// A tick every `period`, or never. The first tick is one period from now (a tick at once
/// would print an empty interval); a late tick delays the next instead of making up the missed
/// ones in a burst of near-empty intervals.
pub struct Ticker(Option<Interval>);

impl Ticker {
    pub fn every(period: Option<Duration>) -> Self {
        Self(period.filter(|p| !p.is_zero()).map(|p| {
            let mut tick = tokio::time::interval_at(Instant::now() + p, p);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        }))
    }

    /// Resolves at the next tick; never without a period. Cancel-safe.
    pub async fn tick(&mut self) {
        match self.0.as_mut() {
            Some(tick) => {
                tick.tick().await;
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raised signal reaches every Stopper alive in this test binary: one test at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[test]
    fn the_duration_ends_a_run() {
        let _serial = serial();
        let limits = Limits { duration: Some(Duration::from_millis(20)), targets: vec![] };
        let stop = run(limits, async |stopper: &mut Stopper| Ok(stopper.wait().await)).unwrap();
        assert_eq!(stop, Stop::DurationElapsed);
    }

    /// Sends SIGTERM to this thread, whose handler tokio has installed.
    fn raise_sigterm() {
        // SAFETY: raise() has no memory effects; the signal is caught, not fatal.
        unsafe { libc::raise(libc::SIGTERM) };
    }

    #[test]
    fn a_signal_sent_before_the_wait_is_not_lost() {
        let _serial = serial();
        // Raised after the handlers exist but before anyone waits: the moment between attaching
        // and the first turn of a command's loop.
        let stop = run(Limits::default(), async |stopper: &mut Stopper| {
            raise_sigterm();
            std::thread::sleep(Duration::from_millis(20));
            Ok(stopper.wait().await)
        });
        assert_eq!(stop.unwrap(), Stop::Interrupted);
    }

    #[test]
    fn a_signal_held_while_the_handlers_are_installed_reaches_the_stopper() {
        let _serial = serial();
        // The registry's window only exists at the process's first install, which an earlier
        // test has passed: this checks the other half, that the held signal is delivered at the
        // unblock and not kept blocked or dropped. The guests' Ctrl-C test covers the window.
        let held_install = || {
            raise_sigterm();
            Stopper::install(Limits::default())
        };
        let stop =
            run(Limits::default(), async |_: &mut Stopper| Ok(with_stop_signals_held(held_install)?.wait().await));
        assert_eq!(stop.unwrap(), Stop::Interrupted);
    }

    #[test]
    fn the_exit_of_every_target_ends_a_run() {
        let _serial = serial();
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let pid = child.id();
        // Reap it from another thread so that it does not stay a zombie of this test.
        let reaper = std::thread::spawn(move || child.wait());
        let limits = Limits { duration: Some(Duration::from_secs(10)), targets: vec![pid] };
        let (stop, exited) =
            run(limits, async |stopper: &mut Stopper| Ok((stopper.wait().await, stopper.exited_targets()))).unwrap();
        reaper.join().unwrap().unwrap();
        assert_eq!(stop, Stop::TargetExited);
        assert_eq!(exited, [pid]);
    }

    #[test]
    fn poll_now_does_not_wait() {
        let _serial = serial();
        let limits = Limits { duration: Some(Duration::from_secs(10)), targets: vec![] };
        let polled = run(limits, async |stopper: &mut Stopper| Ok(stopper.poll_now().await)).unwrap();
        assert_eq!(polled, None);
    }

    #[test]
    fn a_ticker_without_a_period_never_ticks() {
        let _serial = serial();
        let ticked = run(Limits::default(), async |_: &mut Stopper| {
            let mut never = Ticker::every(None);
            let mut fast = Ticker::every(Some(Duration::from_millis(5)));
            Ok(tokio::select! {
                () = never.tick() => "never",
                () = fast.tick() => "fast",
            })
        })
        .unwrap();
        assert_eq!(ticked, "fast");
    }
}
