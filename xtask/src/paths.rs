//! Where the workspace's build products live: below every task module, which all need it.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::cmd;

/// The workspace's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> Result<PathBuf> {
    let metadata = cmd::output(Command::new("cargo").args(["metadata", "--format-version=1", "--no-deps"]))?;
    let value: serde_json::Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    value["target_directory"].as_str().map(PathBuf::from).context("cargo metadata has no target_directory")
}
