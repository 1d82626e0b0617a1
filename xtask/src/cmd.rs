//! Running commands with their output visible and failures explained.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Runs `command`, inheriting stdio; fails with the command line when it exits non-zero.
pub fn run(command: &mut Command) -> Result<()> {
    let line = format!("{command:?}");
    eprintln!("xtask: {line}");
    let status = command.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

/// Runs `command` and returns its standard output; fails with its stderr when it exits non-zero.
pub fn output(command: &mut Command) -> Result<String> {
    let line = format!("{command:?}");
    let out = command.output().with_context(|| format!("starting {line}"))?;
    if !out.status.success() {
        bail!("{line} failed with {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
