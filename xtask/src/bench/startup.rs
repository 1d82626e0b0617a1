//! Time from starting the tool to its probe being attached: mm-probe ships its object prebuilt,
//! bpftrace compiles its script with LLVM at start. Both attach one tracepoint for one pid.

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::Result;

use super::{
    binaries::Binaries,
    process::{Ready, Tracer},
    stats::median_and_range,
};

/// bpftrace prints `Attaching` before it attaches; give it this long to finish.
const BPFTRACE_ATTACH_SETTLE: Duration = Duration::from_millis(500);

pub fn run(bins: &Binaries, rounds: usize) -> Result<String> {
    let pid = std::process::id().to_string();
    let mut mm_probe = Vec::new();
    let mut mm_probe_static = Vec::new();
    let mut bpftrace = Vec::new();
    for _ in 0..rounds {
        mm_probe.push(mm_probe_attach_ms(&bins.mm_probe, &pid)?);
        if let Some(binary) = &bins.mm_probe_static {
            mm_probe_static.push(mm_probe_attach_ms(binary, &pid)?);
        }
        let mut command = Command::new("bpftrace");
        command.arg("-e").arg(format!("tracepoint:syscalls:sys_enter_getppid /pid == {pid}/ {{ @calls = count(); }}"));
        let tracer =
            Tracer::start(command, Ready::on("Attaching").then_wait(BPFTRACE_ATTACH_SETTLE), Duration::from_secs(60))?;
        bpftrace.push(tracer.ready_after.as_secs_f64() * 1e3);
        tracer.stop()?;
    }
    let mut out =
        String::from("### Time to attached (start → probe in place)\n\n| tool | median | min–max |\n|---|---|---|\n");
    for (tool, times) in
        [("mm-probe", &mut mm_probe), ("mm-probe, static build", &mut mm_probe_static), ("bpftrace", &mut bpftrace)]
    {
        if !times.is_empty() {
            let (median, low, high) = median_and_range(times);
            let _ = writeln!(out, "| {tool} | {median:.0} ms | {low:.0}–{high:.0} ms |");
        }
    }
    let _ = writeln!(
        out,
        "\n{rounds} rounds. bpftrace is timed to its `Attaching` line, which it prints just before attaching. The \
         static build is the musl binary `cargo xtask dist` ships.\n"
    );
    Ok(out)
}

/// Milliseconds from starting `binary`'s ring benchmark on `pid` to its `attached` line.
fn mm_probe_attach_ms(binary: &std::path::Path, pid: &str) -> Result<f64> {
    let mut command = Command::new(binary);
    command.args(["bench-ring", pid]);
    let tracer = Tracer::start(command, Ready::on("attached"), Duration::from_secs(60))?;
    let ms = tracer.ready_after.as_secs_f64() * 1e3;
    tracer.stop()?;
    Ok(ms)
}
