//! What `mm-probe latency` measures, from the command line, checked before anything loads.

use anyhow::Result;
use mm_probe_common::latency::{FILTER_ALL, FILTER_PIDS, FILTER_RT, MAX_FUNCS};

use super::probes;
use crate::{
    cli::{LatencyArgs, LatencySelection},
    error::UserError,
    user_bail,
};

/// What to measure, checked against the machine before anything loads.
#[derive(Clone, Debug)]
pub struct Options {
    pub threshold_ns: u64,
    pub filter: u32,
    /// Thread ids to measure (with FILTER_PIDS): every thread of each `-p` process.
    pub pids: Vec<u32>,
    pub requested_pids: Vec<u32>,
    /// Function per slot: the default first, then each distinct `--func`.
    pub functions: Vec<String>,
    /// How many spikes to list, worst first.
    pub top: usize,
    /// Whether to sample the CPUs watched tasks wait on.
    pub samples: bool,
}

impl Options {
    pub fn from_args(args: &LatencyArgs) -> Result<Self> {
        Ok(Self { top: args.top, samples: !args.no_samples, ..Self::from_selection(&args.selection, &args.run.pids)? })
    }

    /// What to measure, checked, without a run length or output choices (the exporter's case).
    pub fn from_selection(args: &LatencySelection, requested_pids: &[u32]) -> Result<Self> {
        if args.threshold.is_zero() {
            user_bail!("--threshold must be above zero (e.g. 500us)");
        }
        let mut functions = vec![probes::DEFAULT_FUNCTION.to_string()];
        for f in &args.functions {
            if !functions.contains(f) {
                functions.push(f.clone());
            }
        }
        if functions.len() > MAX_FUNCS {
            user_bail!(
                "at most {} --func targets besides {} can be traced at once (got {})",
                MAX_FUNCS - 1,
                probes::DEFAULT_FUNCTION,
                args.functions.len()
            );
        }
        if !requested_pids.is_empty() && args.all_tasks {
            user_bail!("-p and --all-tasks exclude each other: -p measures only the given processes");
        }
        let mut pids = Vec::new();
        for &pid in requested_pids {
            pids.extend(threads_of(pid)?);
        }
        let filter = match (requested_pids.is_empty(), args.all_tasks) {
            (false, _) => FILTER_PIDS,
            (true, true) => FILTER_ALL,
            (true, false) => FILTER_RT,
        };
        Ok(Self {
            threshold_ns: u64::try_from(args.threshold.as_nanos()).unwrap_or(u64::MAX),
            filter,
            pids,
            requested_pids: requested_pids.to_vec(),
            functions,
            top: 0,
            samples: false,
        })
    }

    pub fn selection(&self) -> &'static str {
        match self.filter {
            FILTER_PIDS => "pids",
            FILTER_ALL => "all",
            _ => "rt",
        }
    }
}

/// The threads of process `pid` (wakeups are per thread; a `-p` means all of them).
/// A zombie or a pid that does not exist is refused here, with the one message every command
/// gives for it.
fn threads_of(pid: u32) -> Result<Vec<u32>> {
    crate::kernel::process::running_process(pid)?;
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir)
        .map_err(|_| UserError::new(format!("process {pid} does not exist (no {dir}); check the pid with ps")))?;
    let mut threads: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    threads.sort_unstable();
    Ok(threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser as _;

    fn options(args: &[&str]) -> Result<Options> {
        let mut argv = vec!["mm-probe", "latency"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?;
        match cli.command {
            crate::cli::Command::Latency(a) => Options::from_args(&a),
            _ => unreachable!("parsed latency"),
        }
    }

    #[test]
    fn default_traces_rt_tasks_and_the_pageout_walk() {
        let o = options(&[]).unwrap();
        assert_eq!(o.threshold_ns, 500_000);
        assert_eq!(o.filter, FILTER_RT);
        assert_eq!(o.functions, ["madvise_cold_or_pageout_pte_range"]);
    }

    #[test]
    fn funcs_are_deduplicated_and_bounded() {
        let o = options(&["--func", "zap_pte_range", "--func", "zap_pte_range", "--func", probes::DEFAULT_FUNCTION])
            .unwrap();
        assert_eq!(o.functions, ["madvise_cold_or_pageout_pte_range", "zap_pte_range"]);
        let many: Vec<String> = (0..8).flat_map(|i| ["--func".to_string(), format!("f{i}")]).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = options(&many).unwrap_err().to_string();
        assert!(err.contains("at most 7 --func targets"), "{err}");
    }

    #[test]
    fn thresholds_need_units_and_pids_must_exist() {
        assert_eq!(options(&["--threshold", "2ms"]).unwrap().threshold_ns, 2_000_000);
        let err = options(&["--threshold", "500"]).unwrap_err().to_string();
        assert!(err.contains("no unit"), "{err}");
        let err = options(&["--threshold", "5min"]).unwrap_err().to_string();
        assert!(err.contains("unknown unit"), "{err}");
        let me = std::process::id().to_string();
        let o = options(&["-p", &me]).unwrap();
        assert_eq!(o.filter, FILTER_PIDS);
        assert!(o.pids.contains(&std::process::id()));
        let err = options(&["-p", "999999999"]).unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(options(&["-p", &me, "--all-tasks"]).is_err());
    }
}
