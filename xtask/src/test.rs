//! `cargo xtask test`: unit tests, host end-to-end tests (these load real eBPF programs, so they
//! need root), and the real-kernel matrix.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, vm};

pub fn run(no_vm: bool) -> Result<()> {
    if !cmd::is_root() {
        bail!("the end-to-end tests load eBPF programs: run `sudo -E cargo xtask test` (or as root)");
    }
    // Workloads and the tool are built first: the end-to-end tests run them as the user would.
    cmd::run(Command::new("cargo").args(["build", "--workspace", "--bins"]))?;
    cmd::run(Command::new("cargo").args(["test", "--workspace", "--", "--test-threads=1"]))?;
    if no_vm {
        eprintln!("xtask test: real-kernel matrix skipped (--no-vm)");
        return Ok(());
    }
    vm::run(&vm::VmTestArgs::default())
}

/// The workspace's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> Result<PathBuf> {
    let metadata = cmd::output(Command::new("cargo").args(["metadata", "--format-version=1", "--no-deps"]))?;
    let value: serde_json::Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    value["target_directory"].as_str().map(PathBuf::from).context("cargo metadata has no target_directory")
}
