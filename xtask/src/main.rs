//! mm-probe's own tasks: `setup` (toolchain and packages on a fresh machine), `run` (build and
//! run the tool, with sudo only when not root), `test` (everything: unit, host end-to-end, and
//! the real-kernel matrix), `vm-test` (the matrix alone), `bench`, and `dist` (the static
//! binary and its packages).

mod apt;
mod bench;
mod build;
mod chroot;
mod cmd;
mod dist;
mod headers;
#[cfg(test)]
mod import_graph;
mod modules;
mod paths;
mod run;
mod setup;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// mm-probe's development tasks, run as `cargo xtask <TASK>`: set the machine up, build and run
/// the tool, test it on the host and on real kernels under qemu, benchmark it, package it.
#[derive(Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", subcommand_value_name = "TASK", subcommand_help_heading = "Tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent): nightly rust-src, bpf-linker, Debian packages, validators.
    Setup,
    /// Build mm-probe and run it with these arguments (as root; via sudo when not root).
    Run {
        /// mm-probe's command line, after `--` (e.g. `cargo xtask run -- thp-why 1234`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test: unit tests, host end-to-end tests (root), and the real-kernel matrix.
    Test {
        /// Skip the real-kernel matrix (for quick iterations; CI never sets this).
        #[arg(long)]
        no_vm: bool,
    },
    /// Run the test executables on real kernels: Debian 6.1, 6.12, unstable's newest and their PREEMPT_RT builds under qemu.
    VmTest(vm::VmTestArgs),
    /// Run one command in a guest of a kernel line, as the matrix boots it, and print its output.
    VmRun(vm::VmRunArgs),
    /// Measure overhead, capacity and start-up against a baseline and bpftrace in the same run (root).
    Bench(bench::BenchArgs),
    /// Build the static release binary and package it: tarball, .deb, .rpm, OCI image, SHA256SUMS in target/dist/.
    Dist {
        /// Then prove each product where users install it (as `cargo xtask test` does; root).
        #[arg(long)]
        check: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        // `run` and `test` set the machine up first (each step is a cheap check when done), so
        // each is one command on a fresh machine.
        Task::Run { args } => setup::run().and_then(|()| run::run(&args)),
        Task::Test { no_vm } => setup::run().and_then(|()| test::run(no_vm)),
        Task::VmTest(args) => vm::run(&args),
        Task::VmRun(args) => vm::run_command(&args),
        // Inside a guest the machine is read-only and already set up by the host.
        Task::Bench(args) if args.in_guest.is_some() => bench::run(&args),
        Task::Bench(args) => setup::run().and_then(|()| bench::run(&args)),
        Task::Dist { check } => setup::run().and_then(|()| dist::run()).and_then(|release| match check {
            true => dist::check::run(&release),
            false => Ok(()),
        }),
    }
}
