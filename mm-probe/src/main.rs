use clap::Parser as _;
use mm_probe::{
    cli::{Cli, Command},
    doctor, error, latency, retry_storm, thp_why,
};

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(&args),
        Command::ThpWhy(args) => thp_why::run(&args),
        Command::Latency(args) => latency::run(&args),
        Command::RetryStorm(args) => retry_storm::run(&args),
    };
    if let Err(err) = result {
        eprintln!("mm-probe: {err:#}");
        std::process::exit(error::exit_code(&err));
    }
}
