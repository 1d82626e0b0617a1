//! `mm-probe latency`: real-time wakeup latency and the mm code that delays it.

pub mod probes;

use anyhow::Result;

use crate::{cli::LatencyArgs, error::UserError};

pub fn run(_args: &LatencyArgs) -> Result<()> {
    Err(UserError::new("latency is not in this build yet").into())
}
