//! `mm-probe triage`: the whole machine for a bounded watch, every capability at once, then the
//! problems ranked, each with its figures and the command that looks closer; what was healthy;
//! what had nothing to judge; and what could not be observed, and why.
//!
//! The data: `watch` runs every watching command at once (each through its own run driver, as
//! this executable) → `thp` scans the processes whose THP a prctl disabled and has thp-why
//! examine them → `kmsg` reads the kernel log of the window → `judge` turns the verdicts into
//! findings and lists → `report` is the triage → `render` prints it.

pub mod judge;
pub mod kmsg;
pub mod render;
pub mod report;
pub mod thp;
pub mod watch;

use std::{collections::BTreeSet, time::Instant};

use anyhow::Result;

use crate::{
    cli::TriageArgs,
    error::EXIT_CRIT_FOUND,
    kernel::{Kernel, layout::ThpDisableBits, privileges, process},
    report::{json, text, verdict::Level},
};

pub fn run(args: &TriageArgs) -> Result<()> {
    privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    let log = kmsg::KernelLog::open_at_end();
    let start = Instant::now();
    let watches = watch::watch_all(args.duration)?;
    let duration_ns = start.elapsed().as_nanos() as u64;
    // After the watch: a process started during it is scanned too.
    let thp = thp::scan().map_err(|e| format!("{e:#}"));
    let log = log.map(kmsg::KernelLog::read_window);
    let seen = judge::Seen {
        kernel: kernel.release.text.clone(),
        duration_ns,
        watches: &watches,
        thp: &thp,
        log: &log,
        // The kernel's own layout says whether a prctl may leave advised regions huge.
        except_advised_mode: matches!(crate::thp_why::disable_bits(&kernel), ThpDisableBits::Split { .. }),
        kernel_threads: kernel_threads(&watches),
    };
    let triage = judge::triage(&seen);
    if args.json {
        println!("{}", json::line(json::Line::TriageFindings, &triage));
    } else {
        text::print(&render::render(&triage, text::width()));
    }
    if args.check && triage.level == Level::Crit {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        std::process::exit(EXIT_CRIT_FOUND);
    }
    Ok(())
}

/// Which processes the watches' focus lists name are kernel threads, asked of the kernel
/// (PF_KTHREAD) right after the watch, while they still run.
fn kernel_threads(watches: &[watch::Watch]) -> BTreeSet<u64> {
    let named = watches.iter().filter_map(|w| match (&w.outcome, w.capability.definition().focus) {
        (watch::Outcome::Ran(run), Some(focus)) => Some(judge::focus_pids(&run.summary, focus.list, focus.pid)),
        _ => None,
    });
    named.flatten().filter(|&pid| u32::try_from(pid).is_ok_and(process::is_kernel_thread)).collect()
}
