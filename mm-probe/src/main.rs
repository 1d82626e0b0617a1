use clap::Parser as _;

use mm_probe::{
    cli::{Cli, Command},
    doctor, error, exporter, generate, latency, retry_storm, selftest, thp_why,
};

fn main() {
    // Bad input is a usage error (exit 1), not clap's default 2, which mm-probe keeps for its
    // own failures.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(if e.use_stderr() { error::EXIT_USAGE } else { 0 });
    });
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(&args),
        Command::ThpWhy(args) => thp_why::run(&args),
        Command::Latency(args) => latency::run(&args),
        Command::RetryStorm(args) => retry_storm::run(&args),
        Command::Exporter(args) => exporter::run(&args),
        Command::BenchRing { pid } => selftest::run_ring_check(pid),
        Command::BenchHooks { tracepoints } => selftest::hold_noop_programs(&tracepoints),
        Command::GenerateDocs { out } => generate::run(&out),
    };
    if let Err(err) = result {
        eprintln!("mm-probe: {err:#}");
        std::process::exit(error::exit_code(&err));
    }
}
