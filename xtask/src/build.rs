//! The one build the tests share: `cargo xtask test` and `vm-test` run the same executables.

use std::process::Command;

use anyhow::Result;

use crate::cmd;

/// Builds what the tests run: the tool and the workloads (the end-to-end tests run them as the
/// user would) and every test executable, in one invocation whose feature resolution is the one
/// `cargo test --workspace` makes. A `cargo build --bins --exclude xtask` beside `cargo test`
/// resolved the shared dependencies' features differently and compiled the whole tree twice,
/// the eBPF object included (`cargo xtask test --no-vm` from a fresh clone: 12.0 minutes, 10.3
/// with one build).
pub fn for_tests(release: bool) -> Result<()> {
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    cmd::run(Command::new("cargo").args(["build", "--workspace", "--bins", "--tests"]).args(profile))
}
