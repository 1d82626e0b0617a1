//! `mm-probe retry-storm`: HMM / MMU-notifier retry storms.

pub mod probes;

use anyhow::Result;

use crate::{cli::RetryStormArgs, error::UserError};

pub fn run(_args: &RetryStormArgs) -> Result<()> {
    Err(UserError::new("retry-storm is not in this build yet").into())
}
