//! Command-line definitions (clap derive) and nothing else.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::units::parse_duration;

#[derive(Debug, Parser)]
#[command(name = "mm-probe", version, about = "Diagnose Linux memory-management performance problems with eBPF", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// What this kernel offers: BTF, program types (tried, not guessed) and each capability's attach plan.
    Doctor(DoctorArgs),
    /// Why a process gets no transparent huge pages, with evidence and the fix.
    ThpWhy(ThpWhyArgs),
    /// Wakeup latency of real-time tasks and the mm code that delays them.
    Latency(LatencyArgs),
    /// HMM / MMU-notifier retry storms: how bad, who causes them, what to change.
    RetryStorm(RetryStormArgs),
    /// Keep the probes attached and serve their counters and histograms to Prometheus over HTTP.
    Exporter(ExporterArgs),
    /// Benchmark hook (cargo xtask bench): one ring-buffer record per getppid(2) call of PID,
    /// until SIGINT; prints records received and lost, and this process's CPU time and RSS.
    #[command(hide = true)]
    BenchRing { pid: u32 },
    /// Benchmark hook (cargo xtask bench): a program that returns at once on each named BTF
    /// tracepoint, until SIGINT: what the hooks alone cost a workload.
    #[command(hide = true)]
    BenchHooks {
        #[arg(long = "btf-tracepoint", value_name = "NAME", required = true)]
        tracepoints: Vec<String>,
    },
    /// Packaging hook (cargo xtask dist): write man pages and shell completions, generated from
    /// these definitions, under DIR/man/ and DIR/completions/.
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON line instead of text (schemas/doctor/).
    #[arg(long)]
    pub json: bool,
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct ThpWhyArgs {
    /// The process to examine.
    pub pid: u32,
    /// How long to watch THP checks and page faults live (e.g. 5s, 500ms; 0s skips live tracing).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub duration: Duration,
    /// List every VMA, not only the largest.
    #[arg(long)]
    pub all_vmas: bool,
    /// Newline-delimited JSON instead of text: the report, then its lost events (schemas/thp-why/).
    #[arg(long)]
    pub json: bool,
}

/// What `latency` measures; `latency` and `exporter` share it.
#[derive(Debug, Clone, Args)]
pub struct LatencySelection {
    /// Report wakeups and function calls slower than this (units: ns, us/µs, ms, s).
    #[arg(long, default_value = "500us", value_parser = duration)]
    pub threshold: Duration,
    /// Only these tasks (repeatable); default: every real-time task.
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// Measure every task's wakeup latency, not only real-time ones.
    #[arg(long)]
    pub all_tasks: bool,
    /// Also time this kernel function, entry to return (repeatable).
    #[arg(long = "func")]
    pub functions: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub selection: LatencySelection,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_parser = duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval.
    #[arg(long, value_parser = duration)]
    pub interval: Option<Duration>,
    /// How many spikes to list, worst first.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Newline-delimited JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// At the end, draw the latency histograms (one panel per quantity, threshold marked) here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RetryStormArgs {
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_parser = duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval.
    #[arg(long, value_parser = duration)]
    pub interval: Option<Duration>,
    /// Only these processes (repeatable); default: every process that mirrors memory.
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// A retry chain longer than this counts as a timeout (the driver's HMM timeout).
    #[arg(long, default_value = "1000ms", value_parser = duration)]
    pub timeout: Duration,
    /// Newline-delimited JSON: one object per interval, then a summary.
    #[arg(long)]
    pub json: bool,
    /// At the end, draw retry rate, -EBUSY returns and invalidations per second over the run,
    /// with the WARN/CRIT limits, here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// retry_rate (-EBUSY ÷ invalidations), in percent, from which the verdict is WARN.
    #[arg(long, default_value_t = 5.0, value_name = "PERCENT")]
    pub retry_rate_warn: f64,
    /// retry_rate, in percent, above which the verdict is CRIT.
    #[arg(long, default_value_t = 15.0, value_name = "PERCENT")]
    pub retry_rate_crit: f64,
    /// timeout_rate (retry loops that gave up ÷ invalidations), in percent, from which it is WARN.
    #[arg(long, default_value_t = 0.1, value_name = "PERCENT")]
    pub timeout_rate_warn: f64,
    /// timeout_rate, in percent, above which the verdict is CRIT.
    #[arg(long, default_value_t = 1.0, value_name = "PERCENT")]
    pub timeout_rate_crit: f64,
    /// Mean hmm_range_fault duration from which the verdict is WARN.
    #[arg(long, default_value = "100us", value_parser = duration)]
    pub avg_latency_warn: Duration,
    /// Mean hmm_range_fault duration above which the verdict is CRIT.
    #[arg(long, default_value = "500us", value_parser = duration)]
    pub avg_latency_crit: Duration,
    /// Invalidations per second of mirrored memory from which the verdict is WARN.
    #[arg(long, default_value_t = 1000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_warn: f64,
    /// Invalidations per second above which the verdict is CRIT.
    #[arg(long, default_value_t = 10000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_crit: f64,
}

/// The capabilities the exporter can keep attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Capability {
    Latency,
    RetryStorm,
    Thp,
}

impl Capability {
    /// The maps this capability's programs use.
    pub fn map_family(self) -> crate::probes::MapFamily {
        match self {
            Capability::Latency => crate::probes::MapFamily::Latency,
            Capability::RetryStorm => crate::probes::MapFamily::RetryStorm,
            Capability::Thp => crate::probes::MapFamily::Thp,
        }
    }

    /// The `capability` label value: the command's name.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Latency => "latency",
            Capability::RetryStorm => "retry-storm",
            Capability::Thp => "thp",
        }
    }
}

#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Address and port to serve /metrics on (an all-interfaces address only if you give one).
    #[arg(long, default_value = "127.0.0.1:9479", value_name = "ADDRESS:PORT")]
    pub listen: String,
    /// Only these capabilities (comma-separated); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Capability>,
    /// What latency measures (the exporter's histograms get an exact bucket edge at the threshold).
    #[command(flatten, next_help_heading = "Latency")]
    pub latency: LatencySelection,
}
