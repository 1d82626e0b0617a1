//! `cargo xtask test`: unit tests, host end-to-end tests (these load real eBPF programs, so they
//! need root), the release products where users install them (crate::dist::check), and the
//! real-kernel matrix.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{build, cmd, dist, vm};

pub fn run(no_vm: bool) -> Result<()> {
    if !cmd::is_root() {
        bail!("the end-to-end tests load eBPF programs: run `sudo -E cargo xtask test` (or as root)");
    }
    // Everything is built optimised, once: the real-kernel matrix runs the same release test
    // executables (emulated guests are slow enough without debug builds).
    build::for_tests(true)?;
    cmd::run(Command::new("cargo").args(["test", "--release", "--workspace", "--", "--test-threads=1"]))?;
    dist::check::run(&dist::run()?)?;
    if no_vm {
        eprintln!("xtask test: real-kernel matrix skipped (--no-vm)");
        return Ok(());
    }
    vm::run(&vm::VmTestArgs::default())
}
