//! `cargo xtask run -- <args>`: build mm-probe and run it as root (via sudo only when needed).

use std::process::Command;

use anyhow::Result;

use crate::cmd;

pub fn run(args: &[String]) -> Result<()> {
    cmd::run(Command::new("cargo").args(["build", "--package", "mm-probe", "--bin", "mm-probe"]))?;
    let binary = crate::paths::target_dir()?.join("debug/mm-probe");
    let mut command = if cmd::is_root() { Command::new(&binary) } else { sudo(&binary) };
    command.args(args);
    let status = command.status()?;
    std::process::exit(status.code().unwrap_or(2));
}

fn sudo(binary: &std::path::Path) -> Command {
    let mut c = Command::new("sudo");
    c.arg(binary);
    c
}
