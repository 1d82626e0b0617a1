//! How a run ended: the requested duration elapsed, the user pressed Ctrl-C (or sent SIGTERM), or
//! every target exited. Either way the caller prints its summary; `run.rs` waits for it.

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
