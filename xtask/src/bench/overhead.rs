//! Overhead: a workload's run time with a tracer attached to it ÷ without, for mm-probe and for
//! the bpftrace script that counts the same events, and, where mm-probe hooks BTF tracepoints,
//! for programs that return at once on those same hooks: what the kernel's dispatch alone costs,
//! the floor under any tracer there. Rounds rotate the order of the runs so drift (thermal, page
//! cache) does not favour one of them.

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::Result;

use super::{
    binaries::Binaries,
    process::{Ready, Tracer, WaitingWorkload},
    stats::median_and_range,
};

struct Scenario {
    name: &'static str,
    workload: &'static str,
    workload_args: &'static [&'static str],
    /// mm-probe arguments; `{pid}` is replaced by the workload's pid.
    mm_probe_args: &'static [&'static str],
    /// How to tell mm-probe has attached: NDJSON commands print their `probe_plan` line then;
    /// thp-why says on stderr that it is watching.
    mm_probe_ready: Ready,
    /// The equivalent bpftrace program; `{pid}` as above. Empty where no script does the same
    /// (triage): the bpftrace run is left out.
    bpftrace: &'static str,
    /// The BTF tracepoints mm-probe's programs run on for this workload (the hooks-alone run);
    /// empty where its hooks are of other kinds.
    hooks: &'static [&'static str],
    /// What the workload's result line measures, each a row of the table.
    metrics: &'static [Metric],
}

/// One number the workload prints, and how the table names it.
struct Metric {
    key: &'static str,
    label: &'static str,
}

const WHOLE_RUN: Metric = Metric { key: "elapsed_ns", label: "" };
/// fault_storm's steadiest measure: the run's fastest segment (mm_probe_workloads::FastestSegment).
/// (The ping-pong has none: its round trips run at two speeds, both threads on one CPU or on two,
/// and its fastest segments show only the first.)
const FASTEST_FAULTS: Metric = Metric { key: "fastest_segment_ns", label: " · the run's fastest 4 MiB (1024 faults)" };

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

/// Lock contention as bpftrace writes it: each wait's time by lock and the waiter's stack, what
/// `invalidations` keeps (in the kernel too) to name the lock and the path that waited. The
/// maps are cleared at the end: printing thousands of stacks' histograms into the bench's pipe
/// would outlast its stop timeout, and only the workload's time is measured.
macro_rules! bpftrace_lock_waits {
    () => {
        "tracepoint:lock:contention_begin { @wait_start[tid] = nsecs; @wait_lock[tid] = args->lock_addr; } \
         tracepoint:lock:contention_end /@wait_start[tid]/ { @wait_ns[@wait_lock[tid], kstack(8)] = hist(nsecs - @wait_start[tid]); delete(@wait_start[tid]); delete(@wait_lock[tid]); } \
         END { clear(@wait_ns); clear(@wait_start); clear(@wait_lock); }"
    };
}

/// What most scenarios share: an NDJSON command (ready at its plan), the whole run timed, no
/// hooks-alone run. Each scenario names what differs and takes the rest from here.
const NDJSON_WHOLE_RUN: Scenario = Scenario {
    name: "",
    workload: "",
    workload_args: &[],
    mm_probe_args: &[],
    mm_probe_ready: Ready::on("probe_plan"),
    bpftrace: "",
    hooks: &[],
    metrics: &[WHOLE_RUN],
};

/// Under emulation every instruction is 10-50x slower, so the guest's workloads are smaller.
/// The invalidations rows' bpftrace scripts leave lock contention out: bpftrace with the lock
/// tracepoints did not exit within 90 s of SIGINT in the 6.12 guest (twice), and the host row
/// measures that part.
const GUEST_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "hmm_range_fault walks in 2 MiB chunks beside an madvise(DONTNEED) storm (hmm_mirror, 32 MiB × 20) — retry-storm",
        workload: "hmm_storm",
        workload_args: &["--size", "32M", "--chunk", "2M", "--iterations", "20", "--mode", "dontneed"],
        mm_probe_args: &["retry-storm", "--duration", "300s", "--json"],
        bpftrace: "kprobe:hmm_range_fault { @entry[tid] = nsecs; } \
                   kretprobe:hmm_range_fault /@entry[tid]/ { @returns[retval] = count(); @walk_us = hist((nsecs - @entry[tid]) / 1000); delete(@entry[tid]); } \
                   kprobe:__mmu_notifier_invalidate_range_start { @invalidations = count(); }",
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "the same walks and madvise storm — invalidations, every invalidation and mirror_invalidate timed",
        workload: "hmm_storm",
        workload_args: &["--size", "32M", "--chunk", "2M", "--iterations", "20", "--mode", "dontneed"],
        mm_probe_args: &["invalidations", "--duration", "300s", "--json"],
        bpftrace: "kprobe:__mmu_notifier_invalidate_range_start { @start[tid] = nsecs; @invalidations[comm] = count(); } \
             kprobe:__mmu_notifier_invalidate_range_end /@start[tid]/ { @range_us = hist((nsecs - @start[tid]) / 1000); delete(@start[tid]); } \
             kprobe:mirror_invalidate { @cb[tid] = nsecs; } \
             kretprobe:mirror_invalidate /@cb[tid]/ { @callback_ns = hist(nsecs - @cb[tid]); delete(@cb[tid]); }",
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "a VM (nested KVM, TDP MMU) with a vCPU, its 8 MiB memslot madvised in 4 KiB pieces (kvm_storm × 2) — invalidations, KVM's callbacks timed",
        workload: "kvm_storm",
        workload_args: &["--threads", "1", "--vcpus", "1", "--passes", "2", "--size", "8M"],
        mm_probe_args: &["invalidations", "-p", "{pid}", "--duration", "300s", "--json"],
        bpftrace: "tracepoint:kvm:kvm_unmap_hva_range { @unmaps[comm] = count(); } \
             kprobe:kvm_mmu_notifier_invalidate_range_start { @cb[tid] = nsecs; } \
             kretprobe:kvm_mmu_notifier_invalidate_range_start /@cb[tid]/ { @callback_ns = hist(nsecs - @cb[tid]); delete(@cb[tid]); }",
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "madvise(MADV_PAGEOUT) loop (64 MiB × 8) — latency, walk timed by fentry/fexit",
        workload: "fault_storm",
        workload_args: &["64", "8", "--pageout"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        bpftrace: concat!(
            bpftrace_wakeup_latency!(),
            " kprobe:madvise_cold_or_pageout_pte_range { @entry[tid] = nsecs; } \
             kretprobe:madvise_cold_or_pageout_pte_range /@entry[tid]/ { @walk_us = hist((nsecs - @entry[tid]) / 1000); delete(@entry[tid]); }"
        ),
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "pipe ping-pong (2k round trips) — latency --all-tasks",
        workload: "pingpong",
        workload_args: &["2000"],
        mm_probe_args: &["latency", "--all-tasks", "--threshold", "10ms", "--duration", "300s", "--json"],
        bpftrace: bpftrace_wakeup_latency!(),
        ..NDJSON_WHOLE_RUN
    },
];

/// Measured in the guest only when `--scenario` names them: with them the instruction-counted
/// run outlasted the guest's 10-minute limit for one program (2026-12-06).
const GUEST_ON_REQUEST: &[Scenario] = &[
    Scenario {
        name: "hmm_range_fault walks in 2 MiB chunks beside an madvise(DONTNEED) storm (hmm_mirror, 32 MiB × 20) — triage, every capability at once",
        workload: "hmm_storm",
        workload_args: &["--size", "32M", "--chunk", "2M", "--iterations", "20", "--mode", "dontneed"],
        ..TRIAGE
    },
    Scenario {
        name: "pipe ping-pong (2k round trips) — triage, every capability at once",
        workload: "pingpong",
        workload_args: &["2000"],
        ..TRIAGE
    },
];

/// `triage`: every capability attached at once, ready when it says so on stderr. No bpftrace
/// script does all of it.
const TRIAGE: Scenario = Scenario {
    mm_probe_args: &["triage", "--duration", "300s", "--json"],
    mm_probe_ready: Ready::on("triage watching"),
    ..NDJSON_WHOLE_RUN
};

/// The BTF tracepoints `latency` runs on at the host (its function probes need fentry).
const SCHED_HOOKS: &[&str] = &["sched_wakeup", "sched_wakeup_new", "sched_switch"];

const HOST_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "page faults (256 MiB × 8, THP off) — thp-why",
        workload: "fault_storm",
        workload_args: &["256", "8"],
        mm_probe_args: &["thp-why", "{pid}", "--duration", "300s", "--json"],
        mm_probe_ready: Ready::on("watching pid"),
        bpftrace: "tracepoint:exceptions:page_fault_user /pid == {pid}/ { @faults = count(); }",
        hooks: &["page_fault_user"],
        metrics: &[WHOLE_RUN, FASTEST_FAULTS],
    },
    Scenario {
        name: "madvise(MADV_PAGEOUT) loop (256 MiB × 8) — latency",
        workload: "fault_storm",
        workload_args: &["256", "8", "--pageout"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        bpftrace: bpftrace_wakeup_latency!(),
        hooks: SCHED_HOOKS,
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "pipe ping-pong (100k round trips) — latency --all-tasks",
        workload: "pingpong",
        workload_args: &["100000"],
        mm_probe_args: &["latency", "--all-tasks", "--threshold", "10ms", "--duration", "300s", "--json"],
        bpftrace: bpftrace_wakeup_latency!(),
        hooks: SCHED_HOOKS,
        ..NDJSON_WHOLE_RUN
    },
    // The sampler's timer ticks on idle CPUs too, which changes how they idle (on this project's
    // virtual host it made the ping-pong faster than without any tracer): the same run without
    // it shows what the programs themselves cost.
    Scenario {
        name: "pipe ping-pong (100k round trips) — latency --all-tasks --no-samples",
        workload: "pingpong",
        workload_args: &["100000"],
        mm_probe_args: &[
            "latency",
            "--all-tasks",
            "--no-samples",
            "--threshold",
            "10ms",
            "--duration",
            "300s",
            "--json",
        ],
        bpftrace: bpftrace_wakeup_latency!(),
        hooks: SCHED_HOOKS,
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "a VM's 32 MiB memslot madvised away in 4 KiB pieces by 2 pinned threads (kvm_storm × 10) — invalidations",
        workload: "kvm_storm",
        workload_args: &["--threads", "2", "--passes", "10", "--size", "32M", "--fifo"],
        mm_probe_args: &["invalidations", "-p", "{pid}", "--duration", "300s", "--json"],
        bpftrace: concat!("tracepoint:kvm:kvm_unmap_hva_range { @unmaps[comm] = count(); } ", bpftrace_lock_waits!()),
        ..NDJSON_WHOLE_RUN
    },
    // The default selection: every switch still runs the program, but only real-time tasks'
    // wakeups are timed (the ping-pong's tasks are not real-time, as most of a machine is not).
    Scenario {
        name: "pipe ping-pong (100k round trips) — latency (real-time tasks, the default)",
        workload: "pingpong",
        workload_args: &["100000"],
        mm_probe_args: &["latency", "--threshold", "10ms", "--duration", "300s", "--json"],
        bpftrace: "tracepoint:sched:sched_wakeup /args->prio < 100/ { @ts[args->pid] = nsecs; } \
                   tracepoint:sched:sched_switch /@ts[args->next_pid]/ { @us = hist((nsecs - @ts[args->next_pid]) / 1000); delete(@ts[args->next_pid]); }",
        hooks: SCHED_HOOKS,
        ..NDJSON_WHOLE_RUN
    },
    Scenario {
        name: "pipe ping-pong (100k round trips) — triage, every capability at once",
        workload: "pingpong",
        workload_args: &["100000"],
        hooks: SCHED_HOOKS,
        ..TRIAGE
    },
    Scenario {
        name: "the VM's memslot storm (kvm_storm × 10, 2 pinned threads) — triage, every capability at once",
        workload: "kvm_storm",
        workload_args: &["--threads", "2", "--passes", "10", "--size", "32M", "--fifo"],
        ..TRIAGE
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Baseline,
    MmProbe,
    /// The same command from the static (musl) build.
    MmProbeStatic,
    Bpftrace,
    /// Programs that return at once on the scenario's hooks.
    Hooks,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline",
            Variant::MmProbe => "mm-probe",
            Variant::MmProbeStatic => "mm-probe static",
            Variant::Bpftrace => "bpftrace",
            Variant::Hooks => "hooks alone",
        }
    }

    /// The variants a scenario runs: the hooks-alone run only where it names its hooks, the
    /// static build's where there is one.
    fn of(scenario: &Scenario, bins: &Binaries) -> Vec<Variant> {
        let all = [Variant::Baseline, Variant::MmProbe, Variant::MmProbeStatic, Variant::Bpftrace, Variant::Hooks];
        all.into_iter()
            .filter(|v| *v != Variant::Hooks || !scenario.hooks.is_empty())
            .filter(|v| *v != Variant::MmProbeStatic || bins.mm_probe_static.is_some())
            .filter(|v| *v != Variant::Bpftrace || !scenario.bpftrace.is_empty())
            .collect()
    }
}

/// bpftrace prints `Attaching` before it attaches; give it this long to finish.
const BPFTRACE_ATTACH_SETTLE: Duration = Duration::from_millis(500);

pub fn run(bins: &Binaries, rounds: usize, place: Place, only: &[String]) -> Result<String> {
    let (scenarios, title) = match place {
        Place::Host => {
            (HOST_SCENARIOS, "### Overhead on the traced workload (time with tracer ÷ without)\n\n".to_owned())
        }
        Place::Guest => {
            load_test_module("hmm_mirror")?;
            (
                GUEST_SCENARIOS,
                format!(
                    "### Overhead with function probes, in the {} guest under emulation ({})\n\n",
                    guest_kernel(),
                    guest_clock()
                ),
            )
        }
    };
    let mut out = title;
    out += "| workload — mm-probe command | baseline median | mm-probe ratio (min–max) | static build ratio (min–max) | bpftrace ratio (min–max) | hooks alone: programs that return at once (min–max) | mm-probe ÷ hooks alone |\n|---|---|---|---|---|---|---|\n";
    let named = |s: &&Scenario| only.iter().any(|o| s.name.contains(o.as_str()) || s.workload == o);
    let on_request = if place == Place::Guest { GUEST_ON_REQUEST } else { &[] };
    let scenarios = scenarios.iter().filter(|s| only.is_empty() || named(s)).chain(on_request.iter().filter(named));
    // The VM workload needs /dev/kvm: the instruction-counted guest has no emulated SVM.
    let runnable = |s: &&Scenario| s.workload != "kvm_storm" || std::path::Path::new("/dev/kvm").exists();
    let mut left_out = Vec::new();
    for scenario in scenarios {
        if !runnable(&scenario) {
            left_out.push(scenario.name);
            continue;
        }
        let results = measure(bins, scenario, rounds)?;
        for metric in scenario.metrics {
            out += &table_row(scenario, metric, &results)?;
        }
    }
    for name in left_out {
        let _ = writeln!(out, "| {name} | not run: no /dev/kvm here | | | | | |");
    }
    let _ = writeln!(
        out,
        "\n{rounds} rounds; ratios are each run's time over the baseline median. Hooks alone: a program that \
         returns at once on each BTF tracepoint mm-probe uses for that workload, the kernel's cost of calling any \
         program there (— where mm-probe's hooks are of other kinds); mm-probe ÷ hooks alone, the ratio of their \
         medians, is what mm-probe's own programs add to that. Static build: the same command from the musl \
         binary `cargo xtask dist` ships (host only).\n"
    );
    Ok(out)
}

/// Every variant's result lines over `rounds` rounds, the order rotating each round.
fn measure(bins: &Binaries, scenario: &Scenario, rounds: usize) -> Result<Vec<(Variant, Vec<serde_json::Value>)>> {
    let variants = Variant::of(scenario, bins);
    let mut results: Vec<(Variant, Vec<serde_json::Value>)> = variants.iter().map(|v| (*v, Vec::new())).collect();
    for round in 0..rounds {
        for i in 0..variants.len() {
            let slot = (i + round) % variants.len();
            let result = run_once(bins, scenario, variants[slot])?;
            let elapsed_ms = result["elapsed_ns"].as_f64().unwrap_or(f64::NAN) / 1e6;
            eprintln!(
                "xtask bench: {} round {}: {} {elapsed_ms:.1} ms",
                scenario.workload,
                round + 1,
                variants[slot].name()
            );
            results[slot].1.push(result);
        }
    }
    Ok(results)
}

/// One line of the table: `metric` of each variant over the baseline's median.
fn table_row(scenario: &Scenario, metric: &Metric, results: &[(Variant, Vec<serde_json::Value>)]) -> Result<String> {
    let samples = |variant: Variant| -> Result<Vec<f64>> {
        let Some((_, lines)) = results.iter().find(|(v, _)| *v == variant) else { return Ok(Vec::new()) };
        lines
            .iter()
            .map(|line| {
                line[metric.key].as_f64().ok_or_else(|| anyhow::anyhow!("workload printed no {}: {line}", metric.key))
            })
            .collect()
    };
    let baseline = median_and_range(&mut samples(Variant::Baseline)?).0;
    let cell = |variant: Variant| -> Result<String> {
        let mut ratios: Vec<f64> = samples(variant)?.iter().map(|t| t / baseline).collect();
        if ratios.is_empty() {
            return Ok("—".to_owned());
        }
        let (median, low, high) = median_and_range(&mut ratios);
        Ok(format!("{median:.3}× ({low:.3}–{high:.3})"))
    };
    let beyond_hooks = match ratio_of_medians(&mut samples(Variant::MmProbe)?, &mut samples(Variant::Hooks)?) {
        Some(ratio) => format!("{ratio:.3}×"),
        None => "—".to_owned(),
    };
    Ok(format!(
        "| {}{} | {:.1} ms | {} | {} | {} | {} | {beyond_hooks} |\n",
        scenario.name,
        metric.label,
        baseline / 1e6,
        cell(Variant::MmProbe)?,
        cell(Variant::MmProbeStatic)?,
        cell(Variant::Bpftrace)?,
        cell(Variant::Hooks)?
    ))
}

/// The median of `over` divided by the median of `under`; None when either has no samples.
fn ratio_of_medians(over: &mut [f64], under: &mut [f64]) -> Option<f64> {
    if over.is_empty() || under.is_empty() {
        return None;
    }
    Some(median_and_range(over).0 / median_and_range(under).0)
}

/// Loads one of the project's test modules (built by the vm harness for this kernel, named by
/// MM_PROBE_TEST_MODULES in the guest) unless it is loaded already.
fn load_test_module(name: &str) -> Result<()> {
    if std::path::Path::new("/sys/module").join(name).exists() {
        return Ok(());
    }
    let dir = std::env::var("MM_PROBE_TEST_MODULES").map_err(|_| {
        anyhow::anyhow!("MM_PROBE_TEST_MODULES is not set: the test modules were not built for this kernel")
    })?;
    crate::cmd::run(Command::new("insmod").arg(std::path::Path::new(&dir).join(format!("{name}.ko"))))
}

/// The guest's kernel release, for the table's title.
/// How the guest's time passed (the harness says): instruction-counted ratios repeat, while
/// free-running ones vary with the host's load.
fn guest_clock() -> String {
    match std::env::var("MM_PROBE_VM_CLOCK").as_deref() {
        Ok("instruction-counted") => "instruction-counted: guest time is instructions × 4 ns".to_owned(),
        Ok(other) => format!("{other} clock, multi-threaded TCG"),
        Err(_) => "clock not said".to_owned(),
    }
}

fn guest_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|r| r.trim().to_owned()).unwrap_or_default()
}

/// One timed run of the workload; returns its result line.
fn run_once(bins: &Binaries, scenario: &Scenario, variant: Variant) -> Result<serde_json::Value> {
    let args: Vec<String> = scenario.workload_args.iter().map(|s| s.to_string()).collect();
    let workload = WaitingWorkload::start(&bins.workload(scenario.workload), &args)?;
    let pid = workload.pid.to_string();
    let tracer = match variant {
        Variant::Baseline => None,
        Variant::MmProbe | Variant::MmProbeStatic => {
            let binary = match variant {
                Variant::MmProbeStatic => bins.mm_probe_static.as_ref().unwrap_or(&bins.mm_probe),
                _ => &bins.mm_probe,
            };
            let mut command = Command::new(binary);
            command.args(scenario.mm_probe_args.iter().map(|a| a.replace("{pid}", &pid)));
            // triage attaches three commands' programs, one after the other, under emulation.
            Some(Tracer::start(command, scenario.mm_probe_ready, Duration::from_secs(180))?)
        }
        Variant::Bpftrace => {
            let mut command = Command::new("bpftrace");
            command.arg("-e").arg(scenario.bpftrace.replace("{pid}", &pid));
            Some(Tracer::start(
                command,
                Ready::on("Attaching").then_wait(BPFTRACE_ATTACH_SETTLE),
                Duration::from_secs(60),
            )?)
        }
        Variant::Hooks => {
            let mut command = Command::new(&bins.mm_probe);
            command.arg("bench-hooks");
            for hook in scenario.hooks {
                command.args(["--btf-tracepoint", hook]);
            }
            Some(Tracer::start(command, Ready::on("attached"), Duration::from_secs(60))?)
        }
    };
    let result = workload.go()?;
    if let Some(tracer) = tracer {
        tracer.stop()?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_mm_probe_adds_beyond_the_hooks_is_a_ratio_of_medians() {
        let ratio = ratio_of_medians(&mut [106.0, 104.0, 150.0], &mut [103.0, 104.0, 100.0, 130.0]).unwrap();
        assert!((ratio - 106.0 / 103.5).abs() < 1e-12);
        assert_eq!(ratio_of_medians(&mut [1.0], &mut []), None);
    }
}
