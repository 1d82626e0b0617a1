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

/// `program` as given when it names a file, else the first match on PATH.
pub fn which(program: &str) -> Result<std::path::PathBuf> {
    let given = std::path::Path::new(program);
    if program.contains('/') {
        return std::path::absolute(given).with_context(|| format!("resolving {program}"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{program} is not on PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_finds_programs_on_path_and_keeps_paths_given() {
        assert!(which("sh").unwrap().ends_with("sh"));
        assert!(which("no-such-program-anywhere").is_err());
        let given = which("scripts/probe.sh").unwrap();
        assert!(given.is_absolute() && given.ends_with("scripts/probe.sh"), "{}", given.display());
    }
}
