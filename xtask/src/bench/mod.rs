//! `cargo xtask bench`: what mm-probe costs the machine it diagnoses, as ratios against a
//! baseline measured in the same run (never as timed assertions in tests), side by side with
//! the bpftrace script a user would otherwise run.

mod binaries;
mod capacity;
mod memory;
mod overhead;
mod process;
mod startup;
mod stats;

use std::{fmt::Write as _, path::PathBuf, process::Command, time::Duration};

use anyhow::Result;

use self::{binaries::Binaries, overhead::Place};
use crate::{
    cmd,
    vm::{Clock, binaries::GuestProgram},
};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Repetitions of each measurement (the median and the spread are reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Run only these parts (overhead, capacity, memory, startup, guest); default: all.
    #[arg(long = "only")]
    pub only: Vec<String>,
    /// Of the overhead tables, only the workloads whose row names contain this text (repeatable),
    /// e.g. `--scenario kvm_storm`; default: every one.
    #[arg(long = "scenario", value_name = "TEXT")]
    pub scenarios: Vec<String>,
    /// Kernel line whose guest measures the function-probe overhead (the `guest` part).
    #[arg(long, default_value = "6.12", value_name = "LINE")]
    pub guest_kernel: String,
    /// Inside the guest: measure the guest scenarios with the binaries in this directory and
    /// print the table (the guest sees the host's files read-only and has no cargo to run).
    #[arg(long, hide = true, value_name = "RELEASE_DIR")]
    pub in_guest: Option<PathBuf>,
}

/// Rounds in the guest: each emulated run takes seconds, and the whole bench must stay under
/// 10 minutes.
const GUEST_ROUNDS: usize = 5;
/// Boot and GUEST_ROUNDS rounds of every guest scenario, bpftrace compiling its script each
/// time under emulation. One instruction-counted vCPU runs what two free-running ones share.
fn guest_timeout(clock: Clock) -> Duration {
    match clock {
        Clock::Free => Duration::from_secs(420),
        Clock::InstructionCounted => Duration::from_secs(1200),
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if !cmd::is_root() {
        anyhow::bail!("the benchmarks load eBPF programs: run `sudo -E cargo xtask bench` (or as root)");
    }
    if let Some(release) = &args.in_guest {
        let bins = Binaries { mm_probe: release.join("mm-probe"), mm_probe_static: None, workloads: release.clone() };
        print!("{}", overhead::run(&bins, args.rounds, Place::Guest, &args.scenarios)?);
        return Ok(());
    }
    cmd::run(Command::new("cargo").args(["build", "--release", "--bins"]))?;
    let release = crate::paths::target_dir()?.join("release");
    let bins = Binaries {
        mm_probe: release.join("mm-probe"),
        mm_probe_static: Some(crate::dist::static_binary()?),
        workloads: release.clone(),
    };
    let mut report = header()?;
    let wanted = |part: &str| args.only.is_empty() || args.only.iter().any(|o| o == part);
    if wanted("overhead") {
        report += &overhead::run(&bins, args.rounds, Place::Host, &args.scenarios)?;
    }
    if wanted("guest") {
        // Both clocks: the free-running rows as users' guests run, the instruction-counted ones
        // because they repeat (the free-running ratios vary by ±30-50 % with the host's load).
        for clock in [Clock::Free, Clock::InstructionCounted] {
            report += &in_guest(&args.guest_kernel, &release, clock, &args.scenarios)?;
        }
    }
    if wanted("capacity") {
        report += &capacity::run(&bins)?;
    }
    if wanted("memory") {
        report += &memory::run(&bins)?;
    }
    if wanted("startup") {
        report += &startup::run(&bins, args.rounds)?;
    }
    let dir = crate::paths::target_dir()?.join("bench");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("results.md");
    std::fs::write(&path, &report)?;
    println!("{report}");
    eprintln!("xtask bench: results written to {}", path.display());
    Ok(())
}

/// The function-probe overhead, measured by this same program inside a real-kernel guest (the
/// host kernel has no kprobes and refuses fentry).
fn in_guest(line: &str, release: &std::path::Path, clock: Clock, scenarios: &[String]) -> Result<String> {
    let mut args: Vec<String> =
        ["bench", "--rounds", &GUEST_ROUNDS.to_string(), "--in-guest", &release.to_string_lossy()]
            .map(str::to_owned)
            .to_vec();
    args.extend(scenarios.iter().flat_map(|s| ["--scenario".to_owned(), s.clone()]));
    let program = GuestProgram {
        name: "bench".to_owned(),
        executable: std::env::current_exe()?,
        dir: std::env::current_dir()?,
        args,
        boot: crate::vm::Boot { clock, two_nodes: false },
    };
    eprintln!("xtask bench: measuring function-probe overhead in the {line} guest ({}; a few minutes)", clock.name());
    // Attaching tracepoints rewrites kernel text with int3 breakpoints, and under TCG another
    // vCPU can still execute a breakpoint the patching already removed (seen: an int3 Oops at a
    // sched tracepoint site). That is the emulator: one more boot, said out loud.
    let output = crate::vm::run_program(line, program.clone(), guest_timeout(clock)).or_else(|first| {
        eprintln!("xtask bench: the guest failed ({first:#}); booting it once more");
        crate::vm::run_program(line, program, guest_timeout(clock))
    })?;
    // Only the table: the guest's own progress lines stay in its log.
    let table = output.find("### ").map(|start| output[start..].to_owned());
    table.ok_or_else(|| anyhow::anyhow!("the guest printed no table:\n{output}"))
}

fn header() -> Result<String> {
    let mut out = String::from("## Benchmark results (cargo xtask bench)\n\n");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")?
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim().to_string();
    let bpftrace =
        cmd::output(Command::new("bpftrace").arg("--version")).unwrap_or_else(|e| format!("unavailable: {e}"));
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let _ = writeln!(out, "- machine: {cores} CPUs, {cpu}");
    let _ = writeln!(out, "- kernel: {kernel}");
    let _ = writeln!(out, "- mm-probe {} (release build); {}", env!("CARGO_PKG_VERSION"), bpftrace.trim());
    out.push('\n');
    Ok(out)
}
