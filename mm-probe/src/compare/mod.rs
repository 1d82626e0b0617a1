//! `mm-probe compare BEFORE AFTER`: two runs of one command, read from what they printed with
//! `--json`, set side by side — each metric's move between its bands, whether the verdict
//! improved, and one line that says so with the figures. Nothing is attached: it reads files.
//!
//! The data: `input` reads a run (and refuses what it cannot compare; `findings` reads triage's
//! line as a verdict) → `judge` decides each metric's move and the outcome → `report` is the
//! comparison → `render` prints it.

pub mod findings;
pub mod input;
pub mod judge;
pub mod render;
pub mod report;

use anyhow::Result;

use crate::{
    cli::CompareArgs,
    error::UserError,
    report::{json, text},
};

pub fn run(args: &CompareArgs) -> Result<()> {
    if args.before == "-" && args.after == "-" {
        return Err(UserError::new("only one of BEFORE and AFTER can be standard input (-)").into());
    }
    let before = input::read(&args.before)?;
    let after = input::read(&args.after)?;
    if before.command != after.command {
        return Err(UserError::new(format!(
            "{} is a {} run and {} a {} run: compare needs two runs of the same command",
            before.file, before.command, after.file, after.command
        ))
        .into());
    }
    let comparison = report::Comparison::of(&before, &after);
    if args.json {
        println!("{}", json::line(json::Line::Comparison, &comparison));
    } else {
        print!("{}", render::render(&comparison, text::width()));
    }
    Ok(())
}
