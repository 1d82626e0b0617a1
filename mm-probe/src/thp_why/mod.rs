//! `mm-probe thp-why <pid>`: why a process gets no transparent huge pages.
//!
//! The pipeline: `target` checks the process given, `procfs`/`sysfs` read what /proc and /sys say,
//! `ancestry` finds who set the prctl flag, `probes` + `live` attach the kernel programs
//! (allow-check, faults, prctl, mm flags) and read back their raw counts, `facts` is what the
//! allow-check looks at in one VMA, `checks` + `reasons` hold the kernel's order of checks per
//! version and judge those facts, `inputs` is everything gathered, which the judgement reads,
//! `decoder` turns the live keys into per-VMA counts, `judge` decides the mode, every VMA and the
//! verdict, `rank` orders the reasons and their fixes, `scan_result` + `collapse` explain
//! khugepaged's scans of the target, `verdict` says it in one line, `per_size` the per-size (mTHP)
//! policy, `report` is the JSON model, `render` (and `vma_table`) print it; `access` says why a
//! process's memory map may not be read; `export` is its slice of the exporter. `run` is the
//! capability as the run driver runs it: /proc and sysfs read before and after the watch, and the
//! report at the end, with or without the kernel programs.

pub mod access;
pub mod ancestry;
pub mod checks;
pub mod collapse;
pub mod decoder;
pub mod export;
pub mod facts;
pub mod inputs;
pub mod judge;
pub mod live;
pub mod per_size;
pub mod probes;
pub mod procfs;
pub mod rank;
pub mod reasons;
pub mod render;
pub mod report;
pub mod run;
pub mod scan_result;
pub mod sysfs;
pub mod target;
pub mod verdict;
pub mod vma_table;
pub mod words;

/// Which mm->flags bits a prctl sets (from BTF), and what /proc says about a process: `triage`
/// reads both for every process.
pub use self::{checks::disable_bits, procfs::Proc};
use crate::{cli::ThpWhyArgs, collect::driver};

pub fn run(args: &ThpWhyArgs) -> anyhow::Result<()> {
    driver::drive(&run::ThpWhy::from_args(args)?)
}
