//! Command-line definitions (clap derive) and nothing else.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

pub use crate::capability::Capability;
use crate::units::{parse_duration, parse_interval, parse_pid};

#[derive(Debug, Parser)]
#[command(name = "mm-probe", version, about = "Diagnose Linux memory-management performance problems with eBPF", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// What this kernel offers: BTF, program types (tried, not guessed) and each capability's attach plan.
    #[command(after_help = DOCTOR_EXAMPLES)]
    Doctor(DoctorArgs),
    /// Why a process gets no transparent huge pages, with evidence and the fix.
    #[command(after_help = THP_WHY_EXAMPLES)]
    ThpWhy(ThpWhyArgs),
    /// Wakeup latency of real-time tasks and the mm code that delays them.
    #[command(after_help = LATENCY_EXAMPLES)]
    Latency(LatencyArgs),
    /// HMM / MMU-notifier retry storms: how bad, who causes them, what to change.
    #[command(after_help = RETRY_STORM_EXAMPLES)]
    RetryStorm(RetryStormArgs),
    /// Where MMU-notifier invalidations spend their time: per subscriber, lock contention
    /// inside and against the callbacks (kvm->mmu_lock), device-flush amplification.
    #[command(after_help = INVALIDATIONS_EXAMPLES)]
    Invalidations(InvalidationsArgs),
    /// Keep the probes attached and serve their counters and histograms to Prometheus over HTTP.
    #[command(after_help = EXPORTER_EXAMPLES)]
    Exporter(ExporterArgs),
    /// Benchmark hook (cargo xtask bench): one ring-buffer record per getppid(2) call of PID,
    /// until SIGINT; prints records received and lost, and this process's CPU time and RSS.
    #[command(hide = true)]
    BenchRing {
        #[arg(value_parser = pid)]
        pid: u32,
    },
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

const DOCTOR_EXAMPLES: &str = "\
Examples:
    mm-probe doctor              # what this kernel lets mm-probe see, and why not
    mm-probe doctor --json       # the same as one JSON line";

const THP_WHY_EXAMPLES: &str = "\
Examples:
    mm-probe thp-why 4242                 # why pid 4242 gets no huge pages (5 s live)
    mm-probe thp-why -p 4242 --duration 30s --all-vmas
    mm-probe thp-why 4242 --duration 0s   # /proc and /sys facts only, nothing attached
    mm-probe thp-why 4242 --json | jq .verdict";

const LATENCY_EXAMPLES: &str = "\
Examples:
    mm-probe latency --threshold 500us          # real-time tasks, until Ctrl-C
    mm-probe latency -p 4242 --duration 1m      # every thread of process 4242
    mm-probe latency --all-tasks --interval 1s  # every task, a line per second
    mm-probe latency --func zap_pte_range --plot latency.svg";

const INVALIDATIONS_EXAMPLES: &str = "\
Examples:
    mm-probe invalidations                       # every process, until Ctrl-C
    mm-probe invalidations -p 4242 --duration 10s --interval 1s
    mm-probe invalidations -p 4242 --wait-warn 5us --json | jq .verdict
    mm-probe invalidations -p 4242 --duration 30s --plot invalidations.svg";

const RETRY_STORM_EXAMPLES: &str = "\
Examples:
    mm-probe retry-storm                        # every process that mirrors memory, until Ctrl-C
    mm-probe retry-storm -p 4242 --duration 10s --interval 1s
    mm-probe retry-storm --retry-rate-warn 2 --retry-rate-crit 10 --json";

const EXPORTER_EXAMPLES: &str = "\
Examples:
    mm-probe exporter                                  # http://127.0.0.1:9479/metrics
    mm-probe exporter --listen :9479 --only latency,thp
    mm-probe exporter --threshold 1ms -p 4242";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON line instead of text (schemas/doctor/).
    #[arg(long)]
    pub json: bool,
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

fn interval(text: &str) -> Result<Duration, String> {
    parse_interval(text).map_err(|e| e.to_string())
}

fn pid(text: &str) -> Result<u32, String> {
    parse_pid(text).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct ThpWhyArgs {
    /// The process to examine.
    #[arg(value_name = "PID", value_parser = pid, required_unless_present = "pid_option", conflicts_with = "pid_option")]
    pub target_pid: Option<u32>,
    /// The process to examine (the same as the positional PID, as other tracing tools take it).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = pid)]
    pub pid_option: Option<u32>,
    /// How long to watch THP checks and page faults live (e.g. 5s, 500ms, 1m; 0s skips live tracing).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = duration)]
    pub duration: Duration,
    /// List every VMA, not only the largest.
    #[arg(long)]
    pub all_vmas: bool,
    /// Newline-delimited JSON instead of text: the report, then its lost events (schemas/thp-why/).
    #[arg(long)]
    pub json: bool,
}

impl ThpWhyArgs {
    /// The process to examine, given either way (clap requires exactly one).
    pub fn pid(&self) -> u32 {
        self.target_pid.or(self.pid_option).unwrap_or_default()
    }
}

/// What `latency` measures; `latency` and `exporter` share it.
#[derive(Debug, Clone, Args)]
pub struct LatencySelection {
    /// Report wakeups and function calls slower than this (units: ns, us/µs, ms, s, m, h).
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = duration)]
    pub threshold: Duration,
    /// Only these processes, every thread of each (repeatable, or comma-separated); default: every real-time task.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = pid)]
    pub pids: Vec<u32>,
    /// Measure every task's wakeup latency, not only real-time ones.
    #[arg(long)]
    pub all_tasks: bool,
    /// Also time this kernel function, entry to return (repeatable).
    #[arg(long = "func", value_name = "FUNCTION")]
    pub functions: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub selection: LatencySelection,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval (at least 100ms).
    #[arg(long, value_name = "DURATION", value_parser = interval)]
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
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval (at least 100ms).
    #[arg(long, value_name = "DURATION", value_parser = interval)]
    pub interval: Option<Duration>,
    /// Only these processes (repeatable, or comma-separated); default: every process that mirrors memory.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = pid)]
    pub pids: Vec<u32>,
    /// A retry chain longer than this counts as a timeout (the driver's HMM timeout).
    #[arg(long, default_value = "1000ms", value_name = "DURATION", value_parser = duration)]
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
    #[arg(long, default_value = "100us", value_name = "DURATION", value_parser = duration)]
    pub avg_latency_warn: Duration,
    /// Mean hmm_range_fault duration above which the verdict is CRIT.
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = duration)]
    pub avg_latency_crit: Duration,
    /// Invalidations per second of mirrored memory from which the verdict is WARN.
    #[arg(long, default_value_t = 1000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_warn: f64,
    /// Invalidations per second above which the verdict is CRIT.
    #[arg(long, default_value_t = 10000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_crit: f64,
}

#[derive(Debug, Args)]
pub struct InvalidationsArgs {
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval (at least 100ms).
    #[arg(long, value_name = "DURATION", value_parser = interval)]
    pub interval: Option<Duration>,
    /// Only these processes (repeatable, or comma-separated), as invalidator, waiter, or owner of
    /// the memory or the VM; default: every process.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = pid)]
    pub pids: Vec<u32>,
    /// Newline-delimited JSON: a plan, one object per interval, then a summary.
    #[arg(long)]
    pub json: bool,
    /// At the end, draw the callbacks' times (WARN limit marked) and the lock waits, one
    /// histogram per subscriber and per contended lock, here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Invalidations per second (of one process's memory) from which the verdict is WARN.
    #[arg(long, default_value_t = 1000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_warn: f64,
    /// Invalidations per second above which the verdict is CRIT.
    #[arg(long, default_value_t = 10000.0, value_name = "PER_SECOND")]
    pub invalidate_freq_crit: f64,
    /// Lock wait inside invalidations, per invalidation, from which the verdict is WARN.
    #[arg(long, default_value = "10us", value_name = "DURATION", value_parser = duration)]
    pub wait_warn: Duration,
    /// Lock wait per invalidation above which the verdict is CRIT.
    #[arg(long, default_value = "100us", value_name = "DURATION", value_parser = duration)]
    pub wait_crit: Duration,
    /// Mean time of a subscriber's callback from which the verdict is WARN.
    #[arg(long, default_value = "50us", value_name = "DURATION", value_parser = duration)]
    pub callback_warn: Duration,
    /// Mean callback time above which the verdict is CRIT.
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = duration)]
    pub callback_crit: Duration,
    /// How many times its per-page share a 4 KiB invalidation costs (a fixed cost per call)
    /// from which the verdict is WARN.
    #[arg(long, default_value_t = 10.0, value_name = "RATIO")]
    pub amplification_warn: f64,
    /// Amplification above which the verdict is CRIT.
    #[arg(long, default_value_t = 100.0, value_name = "RATIO")]
    pub amplification_crit: f64,
}

/// The exporter's options. The latency ones are `Option` or empty by default, so that a flag the
/// chosen capabilities would ignore is known to be given and can be refused.
#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Where to serve /metrics: ADDRESS:PORT, HOST:PORT (resolved, e.g. localhost:9479) or :PORT,
    /// which serves every interface (IPv6 and IPv4), as Go exporters read it.
    #[arg(long, default_value = "127.0.0.1:9479", value_name = "ADDRESS:PORT")]
    pub listen: String,
    /// Only these capabilities (comma-separated); default: all.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Capability>,
    /// Serve even when none of the chosen capabilities' probes attach on this kernel (only the
    /// exporter's own metrics); without it that is an error.
    #[arg(long)]
    pub allow_empty: bool,
    /// Wakeups and function calls slower than this are counted apart, and the histograms get an
    /// exact bucket edge here (units: ns, us/µs, ms, s) [default: 500us].
    #[arg(long, value_name = "DURATION", value_parser = duration, help_heading = "Latency")]
    pub threshold: Option<Duration>,
    /// Only these processes' wakeups, every thread of each (repeatable, or comma-separated);
    /// default: every real-time task.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = pid, help_heading = "Latency")]
    pub pids: Vec<u32>,
    /// Measure every task's wakeup latency, not only real-time ones.
    #[arg(long, help_heading = "Latency")]
    pub all_tasks: bool,
    /// Also time this kernel function, entry to return (repeatable).
    #[arg(long = "func", value_name = "FUNCTION", help_heading = "Latency")]
    pub functions: Vec<String>,
}
