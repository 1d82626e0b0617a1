//! The agent's memory while it traces: each command started as a user starts it, its resident
//! set read from /proc once it has attached and watched for a few seconds, and its peak. The
//! peak is start-up's: the kernel's BTF parsed twice (by mm-probe and by aya's loader) and the
//! symbol table read, most of which the agent hands back once attached.

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::{Context as _, Result};

use super::{
    binaries::Binaries,
    process::{Ready, Tracer},
};

/// How long each command watches before its memory is read.
const WATCH: Duration = Duration::from_secs(3);

/// The command line after `mm-probe`, and the line it prints once attached. `{pid}` is this
/// benchmark's own pid (thp-why examines one process).
const COMMANDS: [(&[&str], &str); 5] = [
    (&["latency", "--json"], "probe_plan"),
    (&["retry-storm", "--json"], "probe_plan"),
    (&["invalidations", "--json"], "probe_plan"),
    (&["thp-why", "{pid}", "--duration", "60s"], "watching pid"),
    (&["exporter", "--listen", "127.0.0.1:0"], "listening on"),
];

pub fn run(bins: &Binaries) -> Result<String> {
    let mut out = String::from("### Agent memory while tracing (host)\n\n");
    out += "| command | build | resident | of it anonymous | mapped files and rings | peak (start-up) |\n\
            |---|---|---|---|---|---|\n";
    let pid = std::process::id().to_string();
    let builds = std::iter::once(("glibc", &bins.mm_probe)).chain(bins.mm_probe_static.iter().map(|b| ("static", b)));
    let builds: Vec<_> = builds.collect();
    for (args, ready) in COMMANDS {
        let args: Vec<&str> = args.iter().map(|a| if *a == "{pid}" { pid.as_str() } else { a }).collect();
        for (build, binary) in &builds {
            let status = status_while_tracing(binary, &args, ready)?;
            let kib = |field: &str| status_kib(&status, field).with_context(|| format!("no {field} in /proc status"));
            let mib = |field: &str| kib(field).map(|k| format!("{:.1} MiB", k as f64 / 1024.0));
            let _ = writeln!(
                out,
                "| `{}` | {build} | {} | {} | {} | {} |",
                args.join(" ").replace(&pid, "PID"),
                mib("VmRSS")?,
                mib("RssAnon")?,
                mib("RssFile")?,
                mib("VmHWM")?
            );
        }
    }
    out += "\nA BPF ring buffer's data pages are mapped twice in a row (a record that wraps reads as \
            one), so each ring counts twice in `mapped files and rings`: retry-storm's two rings \
            (2 MiB and 8 MiB) are 20 MiB of it, 10 MiB of memory. Static: the musl binary `cargo xtask \
            dist` ships.\n\n";
    Ok(out)
}

/// `binary args` started, attached and watching for [`WATCH`]: its /proc status then.
fn status_while_tracing(binary: &std::path::Path, args: &[&str], ready: &'static str) -> Result<String> {
    let mut command = Command::new(binary);
    command.args(args);
    let tracer = Tracer::start(command, Ready::on(ready).then_wait(WATCH), Duration::from_secs(60))?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", tracer.pid()));
    tracer.stop()?;
    status.context("reading the agent's /proc status")
}

/// A `Field:   123 kB` line of /proc/PID/status, in KiB.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.split(':').next() == Some(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "VmHWM:\t   49452 kB\nVmRSS:\t   25120 kB\nRssAnon:\t   12852 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(25120));
        assert_eq!(status_kib(status, "RssAnon"), Some(12852));
        assert_eq!(status_kib(status, "Rss"), None);
    }
}
