//! `cargo xtask dist`: the release binary with its man pages and shell completions, under
//! target/dist/. The pages come from the binary itself (`mm-probe generate-docs`, hidden), so
//! xtask needs no dependency on mm-probe, whose build script needs the eBPF toolchain.

use std::{fs, process::Command};

use anyhow::{Context as _, Result};

use crate::{cmd, paths};

pub fn run() -> Result<()> {
    cmd::run(Command::new("cargo").args(["build", "--release", "--package", "mm-probe", "--bin", "mm-probe"]))?;
    let target = paths::target_dir()?;
    let binary = target.join("release/mm-probe");
    let dist = target.join("dist");
    // Pages of commands that no longer exist must not survive from an earlier run.
    if dist.exists() {
        fs::remove_dir_all(&dist).with_context(|| format!("clearing {}", dist.display()))?;
    }
    fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    cmd::run(Command::new(&binary).arg("generate-docs").arg("--out").arg(&dist))?;
    fs::copy(&binary, dist.join("mm-probe"))
        .with_context(|| format!("copying {} to {}", binary.display(), dist.display()))?;
    eprintln!("xtask dist: mm-probe, man/ and completions/ are in {}", dist.display());
    Ok(())
}
