//! mm-probe's own tasks: `setup` (toolchain and packages on a fresh machine), `run` (build and
//! run the tool, with sudo only when not root), `test` (everything: unit, host end-to-end, and
//! the real-kernel matrix), `vm-test` (the matrix alone) and `bench`.

mod bench;
mod cmd;
mod modules;
mod paths;
mod run;
mod setup;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent): rust-src, bpf-linker, Debian packages.
    Setup,
    /// Build mm-probe and run it with these arguments (as root; via sudo when not root).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Every test: unit tests, host end-to-end tests, and the real-kernel matrix.
    Test {
        /// Skip the real-kernel matrix (for quick iterations; CI never sets this).
        #[arg(long)]
        no_vm: bool,
    },
    /// The real-kernel matrix: Debian 6.1, 6.12 and their PREEMPT_RT builds under qemu.
    VmTest(vm::VmTestArgs),
    /// Overhead, capacity and start-up, against a baseline and bpftrace measured in the same run.
    Bench(bench::BenchArgs),
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        // `run` and `test` set the machine up first (each step is a cheap check when done), so
        // each is one command on a fresh machine.
        Task::Run { args } => setup::run().and_then(|()| run::run(&args)),
        Task::Test { no_vm } => setup::run().and_then(|()| test::run(no_vm)),
        Task::VmTest(args) => vm::run(&args),
        // Inside a guest the machine is read-only and already set up by the host.
        Task::Bench(args) if args.in_guest.is_some() => bench::run(&args),
        Task::Bench(args) => setup::run().and_then(|()| bench::run(&args)),
    }
}
