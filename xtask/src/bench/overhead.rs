//! Overhead: a workload's run time with a tracer attached to it ÷ without, for mm-probe and for
//! the bpftrace script that counts the same events. Rounds rotate the order of the three runs so
//! drift (thermal, page cache) does not favour one of them.

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::Result;

use super::{
    Binaries, median_and_range,
    process::{Ready, Tracer, WaitingWorkload},
};

struct Scenario {
    name: &'static str,
    workload: &'static str,
    workload_args: &'static [&'static str],
    /// mm-probe arguments; `{pid}` is replaced by the workload's pid.
    mm_probe_args: &'static [&'static str],
    /// How to tell mm-probe has attached: NDJSON commands print their `probe_plan` line then;
    /// thp-why prints one object at the end, so it gets a settle time.
    mm_probe_ready: Ready,
    /// The equivalent bpftrace program; `{pid}` as above.
    bpftrace: &'static str,
}

/// Where the overhead is measured: the host (tracepoints only: no kprobes, fentry refused) or a
/// real-kernel guest, where `latency` also times madvise_cold_or_pageout_pte_range call by call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Host,
    Guest,
}

/// The sched tracepoints both tracers use to time wakeups, as bpftrace writes them.
macro_rules! bpftrace_wakeup_latency {
    () => {
        "tracepoint:sched:sched_wakeup { @ts[args->pid] = nsecs; } \
         tracepoint:sched:sched_switch /@ts[args->next_pid]/ { @us = hist((nsecs - @ts[args->next_pid]) / 1000); delete(@ts[args->next_pid]); }"
    };
}

/// Under emulation every instruction is 10-50x slower, so the guest's workloads are smaller.
const GUEST_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "hmm_range_fault walks in 2 MiB chunks beside an madvise(DONTNEED) storm (hmm_mirror, 32 MiB × 20) — retry-storm",
        workload: "hmm_storm",
        workload_args: &["--size", "32M", "--chunk", "2M", "--iterations", "20", "--mode", "dontneed"],
        mm_probe_args: &["retry-storm", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: "kprobe:hmm_range_fault { @entry[tid] = nsecs; } \
                   kretprobe:hmm_range_fault /@entry[tid]/ { @returns[retval] = count(); @walk_us = hist((nsecs - @entry[tid]) / 1000); delete(@entry[tid]); } \
                   kprobe:__mmu_notifier_invalidate_range_start { @invalidations = count(); }",
    },
    Scenario {
        name: "madvise(MADV_PAGEOUT) loop (64 MiB × 8) — latency, walk timed by fentry/fexit",
        workload: "fault_storm",
        workload_args: &["64", "8", "--pageout"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: concat!(
            bpftrace_wakeup_latency!(),
            " kprobe:madvise_cold_or_pageout_pte_range { @entry[tid] = nsecs; } \
             kretprobe:madvise_cold_or_pageout_pte_range /@entry[tid]/ { @walk_us = hist((nsecs - @entry[tid]) / 1000); delete(@entry[tid]); }"
        ),
    },
    Scenario {
        name: "pipe ping-pong (2k round trips) — latency --all-tasks",
        workload: "pingpong",
        workload_args: &["2000"],
        mm_probe_args: &["latency", "--all-tasks", "--threshold", "10ms", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: bpftrace_wakeup_latency!(),
    },
];

const HOST_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "page faults (256 MiB × 8, THP off) — thp-why",
        workload: "fault_storm",
        workload_args: &["256", "8"],
        mm_probe_args: &["thp-why", "{pid}", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::After(Duration::from_secs(3)),
        bpftrace: "tracepoint:exceptions:page_fault_user /pid == {pid}/ { @faults = count(); }",
    },
    Scenario {
        name: "madvise(MADV_PAGEOUT) loop (256 MiB × 8) — latency",
        workload: "fault_storm",
        workload_args: &["256", "8", "--pageout"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: bpftrace_wakeup_latency!(),
    },
    Scenario {
        name: "pipe ping-pong (100k round trips) — latency --all-tasks",
        workload: "pingpong",
        workload_args: &["100000"],
        mm_probe_args: &["latency", "--all-tasks", "--threshold", "10ms", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: bpftrace_wakeup_latency!(),
    },
    // The default selection: every switch still runs the program, but only real-time tasks'
    // wakeups are timed (the ping-pong's tasks are not real-time, as most of a machine is not).
    Scenario {
        name: "pipe ping-pong (100k round trips) — latency (real-time tasks, the default)",
        workload: "pingpong",
        workload_args: &["100000"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::Line("probe_plan", Duration::ZERO),
        bpftrace: "tracepoint:sched:sched_wakeup /args->prio < 100/ { @ts[args->pid] = nsecs; } \
                   tracepoint:sched:sched_switch /@ts[args->next_pid]/ { @us = hist((nsecs - @ts[args->next_pid]) / 1000); delete(@ts[args->next_pid]); }",
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Baseline,
    MmProbe,
    Bpftrace,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline",
            Variant::MmProbe => "mm-probe",
            Variant::Bpftrace => "bpftrace",
        }
    }
}

const VARIANTS: [Variant; 3] = [Variant::Baseline, Variant::MmProbe, Variant::Bpftrace];

/// bpftrace prints `Attaching` before it attaches; give it this long to finish.
const BPFTRACE_ATTACH_SETTLE: Duration = Duration::from_millis(500);

pub fn run(bins: &Binaries, rounds: usize, place: Place) -> Result<String> {
    let (scenarios, title) = match place {
        Place::Host => (HOST_SCENARIOS, "### Overhead on the traced workload (time with tracer ÷ without)\n\n".to_owned()),
        Place::Guest => {
            load_test_module("hmm_mirror")?;
            (GUEST_SCENARIOS, format!("### Overhead with function probes, in the {} guest under emulation\n\n", guest_kernel()))
        }
    };
    let mut out = title;
    out += "| workload — mm-probe command | baseline median | mm-probe ratio (min–max) | bpftrace ratio (min–max) |\n|---|---|---|---|\n";
    for scenario in scenarios {
        let mut times: [Vec<f64>; 3] = Default::default();
        for round in 0..rounds {
            for i in 0..VARIANTS.len() {
                let variant = VARIANTS[(i + round) % VARIANTS.len()];
                let index = VARIANTS.iter().position(|v| *v == variant).unwrap_or(0);
                let elapsed_ns = run_once(bins, scenario, variant)?;
                eprintln!("xtask bench: {} round {}: {} {:.1} ms", scenario.workload, round + 1, variant.name(), elapsed_ns / 1e6);
                times[index].push(elapsed_ns);
            }
        }
        let baseline = median_and_range(&mut times[0].clone()).0;
        let cell = |samples: &[f64]| -> String {
            let mut ratios: Vec<f64> = samples.iter().map(|t| t / baseline).collect();
            let (median, low, high) = median_and_range(&mut ratios);
            format!("{median:.3}× ({low:.3}–{high:.3})")
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} ms | {} | {} |",
            scenario.name,
            baseline / 1e6,
            cell(&times[1]),
            cell(&times[2])
        );
    }
    let _ = writeln!(out, "\n{rounds} rounds; ratios are each run's time over the baseline median.\n");
    Ok(out)
}

/// Loads one of the project's test modules (built by the vm harness for this kernel, named by
/// MM_PROBE_TEST_MODULES in the guest) unless it is loaded already.
fn load_test_module(name: &str) -> Result<()> {
    if std::path::Path::new("/sys/module").join(name).exists() {
        return Ok(());
    }
    let dir = std::env::var("MM_PROBE_TEST_MODULES")
        .map_err(|_| anyhow::anyhow!("MM_PROBE_TEST_MODULES is not set: the test modules were not built for this kernel"))?;
    crate::cmd::run(Command::new("insmod").arg(std::path::Path::new(&dir).join(format!("{name}.ko"))))
}

/// The guest's kernel release, for the table's title.
fn guest_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|r| r.trim().to_owned()).unwrap_or_default()
}

/// One timed run of the workload; returns its elapsed nanoseconds.
fn run_once(bins: &Binaries, scenario: &Scenario, variant: Variant) -> Result<f64> {
    let args: Vec<String> = scenario.workload_args.iter().map(|s| s.to_string()).collect();
    let workload = WaitingWorkload::start(&bins.workload(scenario.workload), &args)?;
    let pid = workload.pid.to_string();
    let tracer = match variant {
        Variant::Baseline => None,
        Variant::MmProbe => {
            let mut command = Command::new(&bins.mm_probe);
            command.args(scenario.mm_probe_args.iter().map(|a| a.replace("{pid}", &pid)));
            Some(Tracer::start(command, scenario.mm_probe_ready, Duration::from_secs(60))?)
        }
        Variant::Bpftrace => {
            let mut command = Command::new("bpftrace");
            command.arg("-e").arg(scenario.bpftrace.replace("{pid}", &pid));
            Some(Tracer::start(command, Ready::Line("Attaching", BPFTRACE_ATTACH_SETTLE), Duration::from_secs(60))?)
        }
    };
    let result = workload.go()?;
    if let Some(tracer) = tracer {
        tracer.stop()?;
    }
    result["elapsed_ns"].as_f64().ok_or_else(|| anyhow::anyhow!("workload printed no elapsed_ns: {result}"))
}
