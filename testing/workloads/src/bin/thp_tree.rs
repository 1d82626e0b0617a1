//! The lkp situation in miniature: a wrapper disables THP with prctl(PR_SET_THP_DISABLE), then
//! fork/execs a relay, which fork/execs the workload; the flag reaches the workload through two
//! fork+execve steps. Every process prints one JSON line with its role and pid before starting
//! the next, and all share stdin/stdout, so a test talks to the workload directly.
//!
//!   thp_tree [--except-advised] -- <program> [args…]
//!
//! The program is looked up next to this binary when it has no `/` (thp_regions, usually).

use std::{
    io::Write as _,
    path::PathBuf,
    process::{Command, ExitCode},
};

use mm_probe_workloads::thp::{PrctlMode, set_thp_disable};

fn announce(role: &str) {
    println!(r#"{{"role":"{role}","pid":{}}}"#, std::process::id());
    let _ = std::io::stdout().flush();
}

fn resolve(program: &str) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    let here = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(program)));
    here.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from(program))
}

/// Runs `argv` as a child (fork + execve) and waits for it.
fn run_child(argv: &[String]) -> anyhow::Result<ExitCode> {
    let (program, args) =
        argv.split_first().ok_or_else(|| anyhow::anyhow!("usage: thp_tree [--except-advised] -- <program> [args…]"))?;
    let status = Command::new(resolve(program)).args(args).status()?;
    Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
}

fn main() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or_else(|| anyhow::anyhow!("usage: thp_tree [--except-advised] -- <program> [args…]"))?;
    let (options, rest) = (&args[..split], &args[split + 1..]);
    if options.iter().any(|o| o == "--relay") {
        announce("relay");
        return run_child(rest);
    }
    let mode =
        if options.iter().any(|o| o == "--except-advised") { PrctlMode::ExceptAdvised } else { PrctlMode::Disable };
    set_thp_disable(mode)?;
    announce("wrapper");
    let mut relay = vec![std::env::current_exe()?.display().to_string(), "--relay".into(), "--".into()];
    relay.extend(rest.iter().cloned());
    run_child(&relay)
}
