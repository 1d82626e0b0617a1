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
    let mut bpftrace = Vec::new();
    for _ in 0..rounds {
        let mut command = Command::new(&bins.mm_probe);
        command.args(["bench-ring", &pid]);
        let tracer = Tracer::start(command, Ready::on("attached"), Duration::from_secs(60))?;
        mm_probe.push(tracer.ready_after.as_secs_f64() * 1e3);
        tracer.stop()?;
        let mut command = Command::new("bpftrace");
        command.arg("-e").arg(format!("tracepoint:syscalls:sys_enter_getppid /pid == {pid}/ {{ @calls = count(); }}"));
        let tracer =
            Tracer::start(command, Ready::on("Attaching").then_wait(BPFTRACE_ATTACH_SETTLE), Duration::from_secs(60))?;
        bpftrace.push(tracer.ready_after.as_secs_f64() * 1e3);
        tracer.stop()?;
    }
    let (m, m_low, m_high) = median_and_range(&mut mm_probe);
    let (b, b_low, b_high) = median_and_range(&mut bpftrace);
    let mut out =
        String::from("### Time to attached (start → probe in place)\n\n| tool | median | min–max |\n|---|---|---|\n");
    let _ = writeln!(out, "| mm-probe | {m:.0} ms | {m_low:.0}–{m_high:.0} ms |");
    let _ = writeln!(out, "| bpftrace | {b:.0} ms | {b_low:.0}–{b_high:.0} ms |");
    let _ = writeln!(
        out,
        "\n{rounds} rounds. bpftrace is timed to its `Attaching` line, which it prints just before attaching.\n"
    );
    Ok(out)
}
