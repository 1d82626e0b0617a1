//! Command-line definitions (clap derive), and the parse that checks what clap cannot check
//! alone: help wrapped to the terminal, each WARN limit no larger than its CRIT limit, and bad
//! input as one line that names the option and quotes the value as typed.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use clap::{ArgMatches, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, error::ErrorKind};

pub use crate::capability::CapabilityId;
use crate::{
    error,
    report::text,
    units::{
        parse_duration, parse_interval, parse_limit_duration, parse_limit_number, parse_pid, parse_run_duration,
        parse_watch_duration,
    },
};

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
    #[command(mut_arg("pids", |a| a.help(LATENCY_PIDS)), mut_arg("plot", |a| a.help(LATENCY_PLOT)))]
    Latency(LatencyArgs),
    /// HMM / MMU-notifier retry storms: how bad, who causes them, what to change.
    #[command(after_help = RETRY_STORM_EXAMPLES)]
    #[command(mut_arg("pids", |a| a.help(RETRY_STORM_PIDS)), mut_arg("plot", |a| a.help(RETRY_STORM_PLOT)))]
    RetryStorm(RetryStormArgs),
    /// Where MMU-notifier invalidations spend their time: per subscriber, lock contention
    /// inside and against the callbacks (kvm->mmu_lock), device-flush amplification.
    #[command(after_help = INVALIDATIONS_EXAMPLES)]
    #[command(mut_arg("pids", |a| a.help(INVALIDATIONS_PIDS)), mut_arg("plot", |a| a.help(INVALIDATIONS_PLOT)))]
    Invalidations(InvalidationsArgs),
    /// Two runs of one command (their --json output) side by side: each metric before and after,
    /// whether the verdict improved, and one line that says so.
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(CompareArgs),
    /// Watch the whole machine with every capability at once for a while, then rank what is
    /// wrong, each finding with its evidence and the command to run next.
    #[command(after_help = TRIAGE_EXAMPLES)]
    Triage(TriageArgs),
    /// Keep the probes attached and serve their counters and histograms to Prometheus over HTTP.
    #[command(after_help = EXPORTER_EXAMPLES)]
    Exporter(ExporterArgs),
    /// Benchmark hook (cargo xtask bench): one ring-buffer record per getppid(2) call of PID,
    /// until SIGINT; prints records received and lost, and this process's CPU time and RSS.
    #[command(hide = true)]
    BenchRing {
        #[arg(value_parser = parse_pid)]
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
    mm-probe doctor           # what this kernel lets mm-probe see, and why not
    mm-probe doctor --json    # the same as one JSON line";

const THP_WHY_EXAMPLES: &str = "\
Examples:
    mm-probe thp-why 4242                # why pid 4242 gets no huge pages
    mm-probe thp-why -p 4242 --duration 1m30s --all-vmas
    mm-probe thp-why 4242 --duration 0s  # /proc and /sys facts, no live tracing
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
    mm-probe retry-storm      # every process that mirrors memory, until Ctrl-C
    mm-probe retry-storm -p 4242 --duration 10s --interval 1s
    mm-probe retry-storm --retry-rate-warn 2 --retry-rate-crit 10 --json";

const COMPARE_EXAMPLES: &str = "\
Examples:
    mm-probe retry-storm --duration 30s --json > old.json
    mm-probe retry-storm --duration 30s --json > new.json
    mm-probe compare old.json new.json
    mm-probe compare old.json new.json --json | jq .outcome";

const TRIAGE_EXAMPLES: &str = "\
Examples:
    mm-probe triage                  # 30 s, text
    mm-probe triage --duration 2m --json > t.json
    mm-probe triage --check || page-someone";

const EXPORTER_EXAMPLES: &str = "\
Examples:
    mm-probe exporter                # http://127.0.0.1:9479/metrics
    mm-probe exporter --listen :9479 --only latency,thp
    mm-probe exporter --threshold 1ms -p 4242";

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON line instead of text (schemas/doctor/).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run before the change: what retry-storm, invalidations, latency or thp-why printed
    /// with --json (- for standard input).
    #[arg(value_name = "BEFORE")]
    pub before: String,
    /// The run after the change, of the same command.
    #[arg(value_name = "AFTER")]
    pub after: String,
    /// Print the comparison as one JSON line instead of text (schemas/compare/).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TriageArgs {
    /// How long to watch.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_watch_duration)]
    pub duration: Duration,
    /// Print the findings as one JSON line instead of text (schemas/triage/).
    #[arg(long)]
    pub json: bool,
    /// Exit with status 3 when a finding is CRIT (for scripts and health checks).
    #[arg(long)]
    pub check: bool,
}

/// Each watching command's `-p` and `--plot`, said in its own terms.
const LATENCY_PIDS: &str =
    "Only these processes, every thread of each (repeatable, or comma-separated); default: every real-time task";
const LATENCY_PLOT: &str = "At the end, draw the latency histograms (one panel per quantity, threshold marked) here";
const RETRY_STORM_PIDS: &str =
    "Only these processes (repeatable, or comma-separated); default: every process that mirrors memory";
const RETRY_STORM_PLOT: &str = "At the end, draw retry rate, -EBUSY returns and invalidations per second over the run, \
                                with the WARN/CRIT limits, here";
const INVALIDATIONS_PIDS: &str = "Only these processes (repeatable, or comma-separated), as invalidator, waiter, or \
                                  owner of the memory or the VM; default: every process";
const INVALIDATIONS_PLOT: &str = "At the end, draw the callbacks' times (WARN limit marked) and the lock waits, one \
                                  histogram per subscriber and per contended lock, here";

/// The options every watching command takes, declared once and flattened into each command's
/// own (`-p`'s and `--plot`'s help are each command's, set where the command is declared).
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_name = "DURATION", value_parser = parse_run_duration)]
    pub duration: Option<Duration>,
    /// Print a line per interval (at least 100ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub interval: Option<Duration>,
    /// Only these processes (repeatable, or comma-separated).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = parse_pid)]
    pub pids: Vec<u32>,
    /// Newline-delimited JSON instead of text (schemas/ at the repository root).
    #[arg(long)]
    pub json: bool,
    /// At the end, draw the run's figure here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ThpWhyArgs {
    /// The process to examine.
    #[arg(value_name = "PID", value_parser = parse_pid, required_unless_present = "pid_option", conflicts_with = "pid_option")]
    pub target_pid: Option<u32>,
    /// The process to examine (the same as the positional PID, as other tracing tools take it).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid)]
    pub pid_option: Option<u32>,
    /// How long to watch THP checks and page faults live (e.g. 5s, 500ms, 1m; 0s skips live tracing).
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
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
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub threshold: Duration,
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
    pub run: RunArgs,
    #[command(flatten)]
    pub selection: LatencySelection,
    /// How many spikes to list, worst first (0: none).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Take no samples: spikes then say who held the CPU but not where its time went. The
    /// sampler's timer ticks on idle CPUs too, which can let them choose shallower idle states.
    #[arg(long)]
    pub no_samples: bool,
}

#[derive(Debug, Args)]
pub struct RetryStormArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// A retry chain longer than this counts as a timeout (the driver's HMM timeout).
    #[arg(long, default_value = "1000ms", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub timeout: Duration,
    /// retry_rate (-EBUSY ÷ invalidations), in percent, from which the verdict is WARN.
    #[arg(long, default_value_t = 5.0, value_parser = parse_limit_number, value_name = "PERCENT")]
    pub retry_rate_warn: f64,
    /// retry_rate, in percent, above which the verdict is CRIT.
    #[arg(long, default_value_t = 15.0, value_parser = parse_limit_number, value_name = "PERCENT")]
    pub retry_rate_crit: f64,
    /// timeout_rate (retry loops that gave up ÷ invalidations), in percent, from which it is WARN.
    #[arg(long, default_value_t = 0.1, value_parser = parse_limit_number, value_name = "PERCENT")]
    pub timeout_rate_warn: f64,
    /// timeout_rate, in percent, above which the verdict is CRIT.
    #[arg(long, default_value_t = 1.0, value_parser = parse_limit_number, value_name = "PERCENT")]
    pub timeout_rate_crit: f64,
    /// Mean hmm_range_fault duration from which the verdict is WARN.
    #[arg(long, default_value = "100us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub avg_latency_warn: Duration,
    /// Mean hmm_range_fault duration above which the verdict is CRIT.
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub avg_latency_crit: Duration,
    /// Invalidations per second of mirrored memory from which the verdict is WARN.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_limit_number, value_name = "PER_SECOND")]
    pub invalidate_freq_warn: f64,
    /// Invalidations per second above which the verdict is CRIT.
    #[arg(long, default_value_t = 10000.0, value_parser = parse_limit_number, value_name = "PER_SECOND")]
    pub invalidate_freq_crit: f64,
}

#[derive(Debug, Args)]
pub struct InvalidationsArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Invalidations per second (of one process's memory) from which the verdict is WARN.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_limit_number, value_name = "PER_SECOND")]
    pub invalidate_freq_warn: f64,
    /// Invalidations per second above which the verdict is CRIT.
    #[arg(long, default_value_t = 10000.0, value_parser = parse_limit_number, value_name = "PER_SECOND")]
    pub invalidate_freq_crit: f64,
    /// Lock wait inside invalidations, per invalidation, from which the verdict is WARN.
    #[arg(long, default_value = "10us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub wait_warn: Duration,
    /// Lock wait per invalidation above which the verdict is CRIT.
    #[arg(long, default_value = "100us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub wait_crit: Duration,
    /// Mean time of a subscriber's callback from which the verdict is WARN.
    #[arg(long, default_value = "50us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub callback_warn: Duration,
    /// Mean callback time above which the verdict is CRIT.
    #[arg(long, default_value = "500us", value_name = "DURATION", value_parser = parse_limit_duration)]
    pub callback_crit: Duration,
    /// How many times its per-page share a 4 KiB invalidation costs (a fixed cost per call)
    /// from which the verdict is WARN.
    #[arg(long, default_value_t = 10.0, value_parser = parse_limit_number, value_name = "RATIO")]
    pub amplification_warn: f64,
    /// Amplification above which the verdict is CRIT.
    #[arg(long, default_value_t = 100.0, value_parser = parse_limit_number, value_name = "RATIO")]
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
    pub only: Vec<CapabilityId>,
    /// Serve even when none of the chosen capabilities' probes attach on this kernel (only the
    /// exporter's own metrics); without it that is an error.
    #[arg(long)]
    pub allow_empty: bool,
    /// Judge each capability over windows this long, as its command would over such a run;
    /// mm_probe_verdict and mm_probe_finding show the last one.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_watch_duration)]
    pub window: Duration,
    /// Wakeups and function calls slower than this are counted apart, and the histograms get an
    /// exact bucket edge here (units: ns, us/µs, ms, s) [default: 500us].
    #[arg(long, value_name = "DURATION", value_parser = parse_limit_duration, help_heading = "Latency")]
    pub threshold: Option<Duration>,
    /// Only these processes' wakeups, every thread of each (repeatable, or comma-separated);
    /// default: every real-time task.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',', value_parser = parse_pid, help_heading = "Latency")]
    pub pids: Vec<u32>,
    /// Measure every task's wakeup latency, not only real-time ones.
    #[arg(long, help_heading = "Latency")]
    pub all_tasks: bool,
    /// Also time this kernel function, entry to return (repeatable).
    #[arg(long = "func", value_name = "FUNCTION", help_heading = "Latency")]
    pub functions: Vec<String>,
}

/// Parses this process's command line, or ends the process: help and version with exit 0, bad
/// input with one line and exit 1 ([`error::EXIT_USAGE`]; clap's 2 is mm-probe's own failure).
/// Help is wrapped to the width the rest of the output uses: stdout's terminal, else
/// `$COLUMNS`, else 100.
pub fn parse_or_exit() -> Cli {
    parse_from(std::env::args_os(), text::width()).unwrap_or_else(|e| exit_on_bad_command_line(&e))
}

/// `mm-probe SUBCOMMAND` with no option given: the command with its own defaults. The exporter
/// judges with its commands' default limits, read here so that the two cannot differ.
pub fn defaults<A>(subcommand: &str, its_args: impl FnOnce(Command) -> Option<A>) -> anyhow::Result<A> {
    let command = parse_from(["mm-probe", subcommand], 100)?.command;
    its_args(command).ok_or_else(|| anyhow::anyhow!("`mm-probe {subcommand}` parsed as another command"))
}

/// Parses `args` (the program name first) with help wrapped to `width` columns, then refuses a
/// WARN limit above its CRIT limit.
pub fn parse_from<I, T>(args: I, width: usize) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut command = Cli::command().term_width(width);
    let matches = command.try_get_matches_from_mut(args)?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
    if let Some((_, options)) = matches.subcommand()
        && let Some(message) = inverted_limits(options, &cli.command.limit_pairs())
    {
        return Err(command.error(ErrorKind::ValueValidation, message));
    }
    Ok(cli)
}

/// A pair of options `--NAME-warn` and `--NAME-crit`, and whether WARN was set above CRIT.
type LimitPair = (&'static str, bool);

impl Command {
    /// The WARN/CRIT pairs of this command's options.
    fn limit_pairs(&self) -> Vec<LimitPair> {
        fn pair<T: PartialOrd>(name: &'static str, warn: T, crit: T) -> LimitPair {
            (name, warn > crit)
        }
        match self {
            Command::RetryStorm(a) => vec![
                pair("retry-rate", a.retry_rate_warn, a.retry_rate_crit),
                pair("timeout-rate", a.timeout_rate_warn, a.timeout_rate_crit),
                pair("avg-latency", a.avg_latency_warn, a.avg_latency_crit),
                pair("invalidate-freq", a.invalidate_freq_warn, a.invalidate_freq_crit),
            ],
            Command::Invalidations(a) => vec![
                pair("invalidate-freq", a.invalidate_freq_warn, a.invalidate_freq_crit),
                pair("wait", a.wait_warn, a.wait_crit),
                pair("callback", a.callback_warn, a.callback_crit),
                pair("amplification", a.amplification_warn, a.amplification_crit),
            ],
            _ => Vec::new(),
        }
    }
}

/// The first pair with WARN above CRIT, as one sentence that quotes both values as they were
/// typed (or defaulted): `--retry-rate-warn 20` stays 20 (percent), not the 0.2 it becomes
/// inside.
fn inverted_limits(options: &ArgMatches, pairs: &[LimitPair]) -> Option<String> {
    let (name, _) = pairs.iter().find(|(_, inverted)| *inverted)?;
    let typed = |end: &str| {
        let id = format!("{}_{end}", name.replace('-', "_"));
        let raw = options.get_raw(&id).and_then(|mut values| values.next());
        raw.map(|v| v.to_string_lossy().into_owned()).unwrap_or_default()
    };
    Some(format!(
        "--{name}-warn {} must be no larger than --{name}-crit {}",
        typed("warn").trim(),
        typed("crit").trim()
    ))
}

/// Help and version go to stdout with exit 0. A bad value is one line that names the option,
/// quotes the value and, for a choice, lists the valid ones (`--interval 0s`, `--only nosuch`);
/// clap's usage block is kept for missing or unknown arguments, where it helps.
fn exit_on_bad_command_line(e: &clap::Error) -> ! {
    if !e.use_stderr() {
        let _ = e.print();
        std::process::exit(0);
    }
    match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => eprintln!("mm-probe: {}", one_line(e)),
        _ => {
            let _ = e.print();
        }
    }
    std::process::exit(error::EXIT_USAGE);
}

/// The first line of clap's message, with the valid choices (which clap prints on lines of
/// their own) appended.
fn one_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match e.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(choices)) if !choices.is_empty() => {
            format!("{first}: choose from {}", choices.join(", "))
        }
        _ => first.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `mm-probe ARGS` refuses, as the one line the user reads (without `mm-probe: `).
    fn refusal(args: &[&str]) -> String {
        let args = std::iter::once("mm-probe").chain(args.iter().copied());
        let error = parse_from(args, 80).expect_err("refused");
        assert!(error.use_stderr(), "{error}");
        one_line(&error)
    }

    fn accepted(args: &[&str]) -> Cli {
        parse_from(std::iter::once("mm-probe").chain(args.iter().copied()), 80).expect("accepted")
    }

    #[test]
    fn every_help_fits_80_columns() {
        let cli = Cli::command();
        let mut helps = vec![vec!["--help"], vec!["-h"]];
        for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
            helps.push(vec![command.get_name(), "--help"]);
            helps.push(vec![command.get_name(), "-h"]);
        }
        assert!(helps.len() > 10, "{helps:?}");
        for args in helps {
            let args = std::iter::once("mm-probe").chain(args.iter().copied());
            let help = parse_from(args, 80).expect_err("help ends the parse").to_string();
            for line in help.lines() {
                assert!(line.chars().count() <= 80, "over 80 columns:\n{line}\n\n{help}");
            }
        }
    }

    /// `--retry-rate-warn` is in percent and becomes a fraction inside: the refusal quotes the
    /// percent, as typed, and the default it collides with.
    #[test]
    fn a_warn_limit_above_its_crit_limit_is_quoted_as_typed() {
        assert_eq!(
            refusal(&["retry-storm", "--retry-rate-warn", "20"]),
            "--retry-rate-warn 20 must be no larger than --retry-rate-crit 15"
        );
        assert_eq!(
            refusal(&["retry-storm", "--timeout-rate-crit", "0.05"]),
            "--timeout-rate-warn 0.1 must be no larger than --timeout-rate-crit 0.05"
        );
        assert_eq!(
            refusal(&["invalidations", "--wait-warn", "200us", "--wait-crit", "0.1ms"]),
            "--wait-warn 200us must be no larger than --wait-crit 0.1ms"
        );
        assert!(accepted(&["retry-storm", "--retry-rate-warn", "15"]).command.limit_pairs().iter().all(|p| !p.1));
    }

    #[test]
    fn a_choice_that_is_not_one_lists_the_valid_ones() {
        let refused = refusal(&["exporter", "--only", "nosuch"]);
        assert!(refused.contains("'nosuch'") && refused.contains("--only"), "{refused}");
        assert!(refused.ends_with("choose from retry-storm, thp, latency, invalidations"), "{refused}");
    }

    /// Every duration and number option, decided one by one: a zero limit would flag every
    /// event, a zero timeout would make every retry chain a timeout, and a zero run of a live
    /// command would end before anything is seen. Each refusal names the option.
    #[test]
    fn zero_is_refused_where_it_makes_no_sense_naming_the_option() {
        let zero_durations = [
            ("latency", "--threshold"),
            ("latency", "--duration"),
            ("retry-storm", "--duration"),
            ("retry-storm", "--timeout"),
            ("retry-storm", "--avg-latency-warn"),
            ("retry-storm", "--avg-latency-crit"),
            ("invalidations", "--duration"),
            ("invalidations", "--wait-warn"),
            ("invalidations", "--wait-crit"),
            ("invalidations", "--callback-warn"),
            ("invalidations", "--callback-crit"),
            ("exporter", "--threshold"),
        ];
        for (command, option) in zero_durations {
            let refused = refusal(&[command, option, "0us"]);
            assert!(refused.contains(&format!("'0us' for '{option} ")), "{command} {option}: {refused}");
        }
        let zero_numbers = [
            ("retry-storm", "--retry-rate-warn"),
            ("retry-storm", "--retry-rate-crit"),
            ("retry-storm", "--timeout-rate-warn"),
            ("retry-storm", "--timeout-rate-crit"),
            ("retry-storm", "--invalidate-freq-warn"),
            ("retry-storm", "--invalidate-freq-crit"),
            ("invalidations", "--invalidate-freq-warn"),
            ("invalidations", "--invalidate-freq-crit"),
            ("invalidations", "--amplification-warn"),
            ("invalidations", "--amplification-crit"),
        ];
        for (command, option) in zero_numbers {
            let refused = refusal(&[command, &format!("{option}=0")]);
            assert!(refused.contains(&format!("'0' for '{option} ")), "{command} {option}: {refused}");
            assert!(refusal(&[command, &format!("{option}=nan")]).contains("number"), "{command} {option}");
        }
        for interval in ["latency", "retry-storm", "invalidations"] {
            assert!(refusal(&[interval, "--interval", "0s"]).contains("never ends"));
        }
    }

    #[test]
    fn zero_stays_meaningful_where_it_means_something() {
        let Command::ThpWhy(thp) = accepted(&["thp-why", "1", "--duration", "0s"]).command else { panic!() };
        assert!(thp.duration.is_zero(), "thp-why --duration 0s: /proc and /sys facts only");
        let Command::Latency(latency) = accepted(&["latency", "--top", "0"]).command else { panic!() };
        assert_eq!(latency.top, 0, "--top 0: no spike list");
    }

    #[test]
    fn compound_durations_are_accepted_by_every_duration_option() {
        let Command::Latency(latency) = accepted(&["latency", "--duration", "1m30s", "--interval", "1.5s"]).command
        else {
            panic!()
        };
        assert_eq!(latency.run.duration, Some(Duration::from_secs(90)));
        assert_eq!(latency.run.interval, Some(Duration::from_millis(1500)));
        let Command::RetryStorm(storm) = accepted(&["retry-storm", "--duration", "1h2m"]).command else { panic!() };
        assert_eq!(storm.run.duration, Some(Duration::from_secs(3720)));
        let refused = refusal(&["latency", "--duration", "1m30"]);
        assert!(refused.contains("'1m30' for '--duration") && refused.contains("without a unit"), "{refused}");
    }
}
