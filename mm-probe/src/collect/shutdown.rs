//! The end of a run: the requested duration elapsed, or the user pressed Ctrl-C (or sent
//! SIGTERM). Either way the caller prints its summary and drops its programs, which detaches them.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    DurationElapsed,
    Interrupted,
}

/// Resolves when the run should end.
pub async fn wait_for_stop(duration: Option<Duration>) -> Stop {
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let mut terminate = signal(SignalKind::terminate()).ok();
    let interrupted = async {
        tokio::select! {
            _ = async { if let Some(s) = interrupt.as_mut() { s.recv().await } else { std::future::pending().await } } => {},
            _ = async { if let Some(s) = terminate.as_mut() { s.recv().await } else { std::future::pending().await } } => {},
        }
    };
    match duration {
        Some(limit) => tokio::select! {
            _ = tokio::time::sleep(limit) => Stop::DurationElapsed,
            _ = interrupted => Stop::Interrupted,
        },
        None => {
            interrupted.await;
            Stop::Interrupted
        }
    }
}
