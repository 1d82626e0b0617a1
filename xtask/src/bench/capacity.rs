//! Event capacity and agent cost: one ring-buffer record per getppid(2) call of a workload, at
//! fixed rates and unpaced. Records received plus records the kernel could not reserve must
//! equal the calls made, exactly: loss is counted, never silent. The agent's CPU time and peak
//! RSS come from its own getrusage, the CPU time from the moment it attached (its start-up cost is
//! shown apart).

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::{Context as _, Result};

use super::{
    binaries::Binaries,
    process::{Ready, Tracer, WaitingWorkload},
};

const SECONDS: f64 = 3.0;
/// Calls per second; u64::MAX means as fast as one thread can call.
const RATES: [u64; 5] = [0, 10_000, 100_000, 1_000_000, u64::MAX];

struct Sample {
    calls: u64,
    elapsed_s: f64,
    received: u64,
    lost: u64,
    /// From attached to the end.
    cpu_s: f64,
    startup_cpu_s: f64,
    rss_mib: f64,
}

pub fn run(bins: &Binaries) -> Result<String> {
    let mut out = String::from("### Ring-buffer capacity and agent cost (mm-probe bench-ring)\n\n");
    out += "| target rate | achieved rate | received | lost | received + lost = calls | agent CPU (% of a core, from attached to the end) | agent peak RSS |\n|---|---|---|---|---|---|---|\n";
    let idle = measure(bins, 0, Reader::Running)?;
    for rate in RATES.into_iter().skip(1) {
        let s = measure(bins, rate, Reader::Running)?;
        let cpu_percent = 100.0 * s.cpu_s / s.elapsed_s;
        let _ = writeln!(
            out,
            "| {} | {:.0}/s | {} | {} | {} | {:.2} % | {:.1} MiB |",
            if rate == u64::MAX { "unpaced".to_string() } else { format!("{rate}/s") },
            s.calls as f64 / s.elapsed_s,
            s.received,
            s.lost,
            if s.received + s.lost == s.calls { "exact" } else { "MISMATCH" },
            cpu_percent,
            s.rss_mib,
        );
    }
    // Beyond capacity: the reader frozen for the whole run, so the ring fills and every later
    // record is refused by the kernel. Loss must be counted exactly, not hidden.
    let frozen = measure(bins, FROZEN_RATE, Reader::Frozen)?;
    let _ = writeln!(
        out,
        "| {FROZEN_RATE}/s, reader frozen (SIGSTOP) | {:.0}/s | {} | {} | {} | — | {:.1} MiB |",
        frozen.calls as f64 / frozen.elapsed_s,
        frozen.received,
        frozen.lost,
        if frozen.received + frozen.lost == frozen.calls { "exact" } else { "MISMATCH" },
        frozen.rss_mib,
    );
    let _ = writeln!(
        out,
        "\nEach run lasts {SECONDS} s; at rate 0: start-up {:.0} ms CPU, then {:.2} % of a core, {:.1} MiB RSS.\n",
        idle.startup_cpu_s * 1e3,
        100.0 * idle.cpu_s / idle.elapsed_s,
        idle.rss_mib
    );
    Ok(out)
}

/// The frozen-reader run's rate: far more records than the ring holds.
const FROZEN_RATE: u64 = 100_000;

#[derive(Clone, Copy, PartialEq)]
enum Reader {
    Running,
    /// Stopped while the workload runs, thawed before it is asked for its counts.
    Frozen,
}

/// One bench-ring run beside getppid_storm at `rate`.
fn measure(bins: &Binaries, rate: u64, reader: Reader) -> Result<Sample> {
    let workload = WaitingWorkload::start(&bins.workload("getppid_storm"), &[rate.to_string(), SECONDS.to_string()])?;
    let mut command = Command::new(&bins.mm_probe);
    command.args(["bench-ring", &workload.pid.to_string()]);
    let tracer = Tracer::start(command, Ready::on("attached"), Duration::from_secs(60))?;
    if reader == Reader::Frozen {
        tracer.freeze();
    }
    let result = workload.go();
    if reader == Reader::Frozen {
        tracer.thaw();
    }
    let result = result?;
    let lines = tracer.stop()?;
    let check: serde_json::Value = lines
        .iter()
        .find(|l| l.contains("ring_check"))
        .context("bench-ring printed no result")
        .and_then(|l| serde_json::from_str(l).context("bench-ring result is not JSON"))?;
    let number = |v: &serde_json::Value, k: &str| v[k].as_f64().with_context(|| format!("missing {k} in {v}"));
    Ok(Sample {
        calls: number(&result, "calls")? as u64,
        elapsed_s: number(&result, "elapsed_ns")? / 1e9,
        received: number(&check, "received")? as u64,
        lost: number(&check, "lost")? as u64,
        cpu_s: (number(&check, "cpu_user_ns")? + number(&check, "cpu_system_ns")?) / 1e9,
        startup_cpu_s: number(&check, "startup_cpu_ns")? / 1e9,
        rss_mib: number(&check, "max_rss_bytes")? / 1048576.0,
    })
}
