//! Where the workspace's build products live, and the cache of what is downloaded or built once
//! per machine: below every task module, which all need them.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::cmd;

/// The workspace's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> Result<PathBuf> {
    let metadata = cmd::output(Command::new("cargo").args(["metadata", "--format-version=1", "--no-deps"]))?;
    let value: serde_json::Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    value["target_directory"].as_str().map(PathBuf::from).context("cargo metadata has no target_directory")
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/mm-probe`: kernels, apt lists and build chroots live outside
/// the work tree, so `cargo clean` or a fresh clone does not download them again.
pub fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?).join(".cache")
        }
    };
    Ok(base.join("mm-probe"))
}
