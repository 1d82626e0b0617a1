//! `mm-probe thp-why <pid>`: why a process gets no transparent huge pages.

pub mod probes;

use anyhow::Result;

use crate::{cli::ThpWhyArgs, error::UserError};

pub fn run(_args: &ThpWhyArgs) -> Result<()> {
    Err(UserError::new("thp-why is not in this build yet").into())
}
