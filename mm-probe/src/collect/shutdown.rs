//! How a run ended: the requested duration elapsed, the user pressed Ctrl-C (or sent SIGTERM),
//! every target exited, or a source the capability reads failed and its summary says so. Either
//! way the caller prints its summary; `run.rs` waits for the first three.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    DurationElapsed,
    Interrupted,
    /// Every `-p` target exited (or became a zombie) during the run.
    TargetExited,
    /// One of the capability's own sources failed, which its summary reports instead of failing
    /// the run (thp-why's prctl ring; see `driver::Session::turn_failed`).
    SourceFailed,
}

impl Stop {
    /// The `stopped_by` value of every command's JSON.
    pub fn name(self) -> &'static str {
        match self {
            Stop::DurationElapsed => "duration",
            Stop::Interrupted => "interrupted",
            Stop::TargetExited => "target_exited",
            Stop::SourceFailed => "source_failed",
        }
    }
}
