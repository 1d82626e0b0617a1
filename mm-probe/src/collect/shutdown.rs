//! The end of a run: the requested duration elapsed, or the user pressed Ctrl-C (or sent
//! SIGTERM). Either way the caller prints its summary and drops its programs, which detaches them.

use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    DurationElapsed,
    Interrupted,
    /// Every `-p` target exited (or became a zombie) during the run.
    TargetExited,
}

impl Stop {
    /// The `stopped_by` value of every command's JSON.
    pub fn name(self) -> &'static str {
        match self {
            Stop::DurationElapsed => "duration",
            Stop::Interrupted => "interrupted",
            Stop::TargetExited => "target_exited",
        }
    }
}

/// SIGINT and SIGTERM handlers. Install them before attaching anything: a signal that arrives
/// before the handler exists would kill the tool without its summary (or, when the parent shell
/// ignores SIGINT, as non-interactive shells do for background jobs, be lost).
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    /// Must be called inside a tokio runtime.
    pub fn install() -> Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// Resolves when the run should end.
    pub async fn wait(&mut self, duration: Option<Duration>) -> Stop {
        let signalled = async {
            tokio::select! {
                _ = self.interrupt.recv() => {},
                _ = self.terminate.recv() => {},
            }
        };
        match duration {
            Some(limit) => tokio::select! {
                _ = tokio::time::sleep(limit) => Stop::DurationElapsed,
                _ = signalled => Stop::Interrupted,
            },
            None => {
                signalled.await;
                Stop::Interrupted
            }
        }
    }
}

/// Installs the handlers and waits. Prefer [`StopSignals::install`] before attaching, then
/// [`StopSignals::wait`]: this form leaves a window before the handlers exist.
pub async fn wait_for_stop(duration: Option<Duration>) -> Stop {
    match StopSignals::install() {
        Ok(mut signals) => signals.wait(duration).await,
        Err(_) => match duration {
            Some(limit) => {
                tokio::time::sleep(limit).await;
                Stop::DurationElapsed
            }
            None => std::future::pending().await,
        },
    }
}
