//! The one run driver: every command that watches the kernel is a [`Capability`] run by
//! [`drive`], so the common options, the order of a run and its output are written once and a
//! capability cannot forget one of them.
//!
//! The order, for every capability:
//! 1. before anything loads: the capability checked its own options when it was built (thp-why:
//!    its target); here `--plot`'s file, the privileges, the kernel, the capability's checks
//!    against that kernel, and the `-p` processes (an unknown pid or a zombie is the user's
//!    error, said at once);
//! 2. inside the run skeleton (`run.rs`: its stop handlers are installed before anything
//!    attaches): load one object with the capability's globals, attach ([`Capability::attach`],
//!    which maps its rings before returning: mapping runs in the kernel without rescheduling),
//!    read what the end will be compared with ([`Session::before_watch`]), then print the plan;
//! 3. the watch: the capability's own sources ([`Session::turn`]), one `--interval` tick, and
//!    the end ([`Stopper::wait`]: a signal, `--duration`, or the targets' exit; or a failed turn
//!    the session keeps for its summary, [`Session::turn_failed`]);
//! 4. the end: the other end of the comparison, the programs still attached
//!    ([`Session::after_watch`]), what must be read while the programs are loaded
//!    ([`Session::before_detach`]), detach, drain what the rings and tables still hold, close the
//!    last interval (printed with `--interval`, however short, so the intervals add up to the
//!    summary), one note per target that exited, the summary, the capability's notes, and
//!    `--plot`'s figure.
//!
//! A capability whose kernel side is optional ([`KernelSide::Optional`]: thp-why, whose /proc and
//! sysfs facts tell most of the story) is not refused for want of privileges in 1. Without them,
//! with `--duration 0s`, or when its object does not load or attach in 2, it runs without its
//! programs ([`Capability::without_tracing`], told why): what it reads before the watch, no plan
//! and no watch, what it reads after, its summary ([`Session::untraced_summary`]) and its notes.
//!
//! Detaching before the drain is what makes the figures agree: once nothing more can arrive,
//! the counters read last and the records drained last describe the same events.

use anyhow::Result;
use aya::Ebpf;

use super::{
    clock::monotonic_ns,
    run::{self as skeleton, Limits, Stopper, Ticker},
    shutdown::Stop,
};
use crate::{
    capability::{CapabilityId as Id, Definition},
    cause,
    cli::RunArgs,
    error::UserError,
    kernel::{Kernel, privileges},
    probes::{GlobalValue, detach_all, load_object},
    report::{json, plot::PlotFile, text},
};

/// What a capability prints at one point of a run, in both forms: the driver prints the one
/// `--json` asks for. A form may hold several lines; an empty one prints nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Printout {
    pub json: String,
    pub text: String,
}

impl Printout {
    pub fn new(json: String, text: String) -> Self {
        Self { json, text }
    }
}

/// How a run ended, for the summary and the figure.
#[derive(Clone, Copy, Debug)]
pub struct End {
    pub stopped_by: Stop,
    /// CLOCK_MONOTONIC when the programs were detached and drained.
    pub end_ns: u64,
}

/// Whether a capability's run needs its kernel programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSide {
    /// Without them there is nothing to say: no privileges, or an object that does not load, is
    /// the run's error.
    Required,
    /// What user space reads tells most of the story: without the programs the run goes on, and
    /// says why they are missing ([`Capability::without_tracing`]).
    Optional,
}

/// Why a run goes on without its programs (only where its kernel side is optional).
#[derive(Debug)]
pub enum Untraced {
    /// `--duration 0s`: a watch of nothing, so nothing is loaded.
    NoWatch,
    /// Neither root nor CAP_BPF and CAP_PERFMON.
    NoPrivileges,
    /// The object did not load, or its programs did not attach.
    NotLoaded(anyhow::Error),
}

impl Untraced {
    /// What keeps the programs out before anything is tried to load.
    fn before_loading(args: &RunArgs) -> Option<Self> {
        if args.duration.is_some_and(|d| d.is_zero()) {
            Some(Self::NoWatch)
        } else if !privileges::can_trace(privileges::effective_caps()) {
            Some(Self::NoPrivileges)
        } else {
            None
        }
    }
}

/// A capability as the driver runs it: its definition (the row of `capability.rs`), its
/// options, its globals and its attach. Built from the command line with its own checks done.
pub trait Capability {
    /// What it keeps while watching, borrowing the kernel's facts (symbols, BTF) for the run.
    type Session<'k>: Session;
    /// The `plot` line its `--plot` prints with `--json`; `None` for a command without `--plot`
    /// (stated by each, so that a figure cannot be forgotten by default).
    const PLOT_LINE: Option<json::Line>;
    /// Whether the run needs its programs; see [`KernelSide`].
    const KERNEL_SIDE: KernelSide = KernelSide::Required;
    /// Its row in the capability table (`capability.rs`).
    const ID: Id;

    fn definition(&self) -> Definition {
        Self::ID.definition()
    }

    fn run_args(&self) -> &RunArgs;

    /// Checks against the running kernel before anything loads (a `--func` that does not exist
    /// is the user's error, not a probe that failed to attach).
    fn check(&self, _kernel: &Kernel) -> Result<()> {
        Ok(())
    }

    /// The object's globals for this run.
    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)>;

    /// Selects the processes, attaches its probes and maps its rings.
    fn attach<'k>(&self, kernel: &'k Kernel, ebpf: &mut Ebpf) -> Result<Self::Session<'k>>;

    /// The session of a run without programs, `why` saying what kept them out. Asked only where
    /// [`Self::KERNEL_SIDE`] is optional, which must implement it and
    /// [`Session::untraced_summary`].
    fn without_tracing<'k>(&self, _kernel: &'k Kernel, why: Untraced) -> Result<Self::Session<'k>> {
        unreachable!("{} needs its kernel programs, yet ran without them ({why:?})", self.definition().command)
    }
}

/// A capability while it watches: what the driver asks of it at each step of a run.
// The futures run on the run skeleton's one thread (a current-thread runtime), so they need
// not be Send, which is what the lint is about.
#[allow(async_fn_in_trait)]
pub trait Session {
    /// Once attached, before the plan (and without programs, at once): what the end of the run
    /// is compared with (thp-why's /proc and sysfs, the mm flags read through its programs).
    fn before_watch(&mut self) -> Result<()> {
        Ok(())
    }

    /// What attached and what cannot be seen (text on stderr, JSON on stdout; a plan without a
    /// JSON form is a line for whoever watches the terminal, on stderr with `--json` too).
    fn plan(&self) -> Printout;

    /// Waits for its own sources (rings, its own timers) and takes in what they bring. Must be
    /// cancel-safe: the driver drops it at an interval tick or at the end and calls it again.
    async fn turn(&mut self, ebpf: &mut Ebpf) -> Result<()>;

    /// A failed turn ends the run with its error, unless the session keeps it for its summary
    /// and returns `Ok`: then the watch ends there, stopped by [`Stop::SourceFailed`].
    fn turn_failed(&mut self, error: anyhow::Error) -> Result<()> {
        Err(error)
    }

    /// Closes the interval that ends at `now_ns` (at each tick and once at the end).
    fn interval(&mut self, ebpf: &mut Ebpf, now_ns: u64) -> Result<Printout>;

    /// After the watch, the programs still attached (and without programs, right after
    /// [`Self::before_watch`]): the other end of what that read.
    fn after_watch(&mut self) -> Result<()> {
        Ok(())
    }

    /// Reads what goes away with the programs (their fdinfo), just before the detach.
    fn before_detach(&mut self, _ebpf: &Ebpf) {}

    /// After the detach: takes in whatever the rings and tables still hold.
    fn drain(&mut self, ebpf: &mut Ebpf) -> Result<()>;

    /// The note on stderr, before the summary, for a `-p` process that exited during the run;
    /// `None` where the summary says it itself.
    fn target_exited(&self, pid: u32) -> Option<String> {
        Some(exit_note(pid))
    }

    /// The summary and its lost-events line.
    fn summary(&mut self, ebpf: &mut Ebpf, end: &End) -> Result<Printout>;

    /// The summary of a run without programs ([`Capability::without_tracing`]).
    fn untraced_summary(&mut self) -> Result<Printout> {
        unreachable!("a run without programs, of a capability that needs them")
    }

    /// Notes on stderr after the summary (records the object and this binary disagreed on).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// `--plot`'s figure as SVG, after the summary (asked only where there is a
    /// [`Capability::PLOT_LINE`]).
    fn plot(&self, _end: &End) -> Result<String> {
        unreachable!("a figure from a command without --plot")
    }
}

/// Runs `capability` from the checks to the figure.
pub fn drive<C: Capability>(capability: &C) -> Result<()> {
    let args = capability.run_args();
    let plot = plot_file(args)?;
    let untraced = match C::KERNEL_SIDE {
        KernelSide::Required => {
            privileges::require_tracing()?;
            None
        }
        KernelSide::Optional => Untraced::before_loading(args),
    };
    let kernel = Kernel::running()?;
    capability.check(&kernel)?;
    let limits = Limits::of_processes(args.duration, &args.pids)?;
    skeleton::run(limits, async |stopper| match untraced {
        Some(why) => without_programs(capability, &kernel, why),
        None => watch(capability, &kernel, plot, stopper).await,
    })
}

/// `--plot`'s file, refused before anything runs when it is not an .svg that can be written.
fn plot_file(args: &RunArgs) -> Result<Option<PlotFile>, UserError> {
    args.plot.as_deref().map(PlotFile::check).transpose()
}

async fn watch<C: Capability>(
    capability: &C,
    kernel: &Kernel,
    plot: Option<PlotFile>,
    stopper: &mut Stopper,
) -> Result<()> {
    let args = capability.run_args();
    let (mut ebpf, mut session) = match load_and_attach(capability, kernel) {
        Ok(loaded) => loaded,
        Err(error) if C::KERNEL_SIDE == KernelSide::Optional => {
            return without_programs(capability, kernel, Untraced::NotLoaded(error));
        }
        Err(error) => return Err(error),
    };
    session.before_watch()?;
    // A Ctrl-C while attaching, or reading the start, ends the run here, with its summary.
    let stopped_early = stopper.poll_now().await;
    print(args.json, Stream::Err, &session.plan());
    let stopped_by = match stopped_early {
        Some(stop) => stop,
        None => watch_until_stopped(&mut session, &mut ebpf, args, stopper).await?,
    };
    session.after_watch()?;
    session.before_detach(&ebpf);
    detach_all(&mut ebpf).await;
    session.drain(&mut ebpf)?;
    let end = End { stopped_by, end_ns: monotonic_ns() };
    let last = session.interval(&mut ebpf, end.end_ns)?;
    if args.interval.is_some() {
        print(args.json, Stream::Out, &last);
    }
    for note in stopper.exited_targets().into_iter().filter_map(|pid| session.target_exited(pid)) {
        text::eprintln(&format!("mm-probe: {note}"));
    }
    print(args.json, Stream::Out, &session.summary(&mut ebpf, &end)?);
    print_notes(&session);
    if let Some(file) = plot {
        file.write(&session.plot(&end)?)?;
        println!("{}", file.written_line(args.json.then_some(C::PLOT_LINE).flatten()));
    }
    Ok(())
}

/// Loads the object with the capability's globals and attaches it; the object is dropped, and
/// whatever attached with it, when the attach fails.
fn load_and_attach<'k, C: Capability>(capability: &C, kernel: &'k Kernel) -> Result<(Ebpf, C::Session<'k>)> {
    let mut ebpf = load_object(kernel, capability.definition().map_families, &capability.settings(kernel))?;
    let session = capability.attach(kernel, &mut ebpf)?;
    cause::probes::arm(&mut ebpf)?;
    super::memory::release_startup(kernel);
    Ok((ebpf, session))
}

/// A run without programs: what the capability reads before and after the watch that does not
/// happen, then its summary.
fn without_programs<C: Capability>(capability: &C, kernel: &Kernel, why: Untraced) -> Result<()> {
    let mut session = capability.without_tracing(kernel, why)?;
    session.before_watch()?;
    session.after_watch()?;
    print(capability.run_args().json, Stream::Out, &session.untraced_summary()?);
    print_notes(&session);
    Ok(())
}

fn print_notes(session: &impl Session) {
    for note in session.notes() {
        text::eprintln(&format!("mm-probe: {note}"));
    }
}

/// What woke the watch.
enum Wake {
    Stopped(Stop),
    Turned(Result<()>),
    Tick,
}

async fn watch_until_stopped(
    session: &mut impl Session,
    ebpf: &mut Ebpf,
    args: &RunArgs,
    stopper: &mut Stopper,
) -> Result<Stop> {
    let mut ticker = Ticker::every(args.interval);
    loop {
        let wake = tokio::select! {
            stop = stopper.wait() => Wake::Stopped(stop),
            turned = session.turn(ebpf) => Wake::Turned(turned),
            () = ticker.tick() => Wake::Tick,
        };
        match wake {
            Wake::Stopped(stop) => return Ok(stop),
            Wake::Turned(Ok(())) => {}
            Wake::Turned(Err(error)) => return session.turn_failed(error).map(|()| Stop::SourceFailed),
            Wake::Tick => print(args.json, Stream::Out, &session.interval(ebpf, monotonic_ns())?),
        }
    }
}

/// The one note for a `-p` process that exited during the run: what follows covers only the
/// time it was alive.
pub fn exit_note(pid: u32) -> String {
    format!("process {pid} exited while being traced; partial results below")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    /// Text on stderr (the plan: what the run is about to watch, not its result); its JSON
    /// still goes to stdout, where a script reads every line. A plan with no JSON form says its
    /// text on stderr with `--json` too: that does not mix into the lines a script reads.
    Err,
}

/// Prints the form `json` asks for, each block ending in a newline, text fitted to the terminal.
fn print(json: bool, stream: Stream, printout: &Printout) {
    let as_json = json && !(stream == Stream::Err && printout.json.is_empty());
    let form = if as_json { &printout.json } else { &printout.text };
    if form.is_empty() {
        return;
    }
    let block = if form.ends_with('\n') { form.clone() } else { format!("{form}\n") };
    match (as_json, stream) {
        (true, _) => print!("{block}"),
        (false, Stream::Out) => text::print(&block),
        (false, Stream::Err) => text::eprint(&block),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn plot(command_line: &[&str]) -> Result<Option<PlotFile>, UserError> {
        let cli = Cli::try_parse_from(["mm-probe"].iter().chain(command_line)).unwrap();
        match cli.command {
            Command::Latency(a) => plot_file(&a.run),
            Command::RetryStorm(a) => plot_file(&a.run),
            Command::Invalidations(a) => plot_file(&a.run),
            _ => unreachable!("a watching command"),
        }
    }

    #[test]
    fn a_plot_must_be_an_svg_file_that_can_be_written() {
        for command in ["latency", "retry-storm", "invalidations"] {
            let error = anyhow::Error::from(plot(&[command, "--plot", "latency.png"]).unwrap_err());
            assert!(error.to_string().contains("ending in .svg"), "{error}");
            assert_eq!(crate::error::exit_code(&error), crate::error::EXIT_USAGE);
            let error = plot(&[command, "--plot", "/nonexistent-mm-probe-dir/latency.svg"]).unwrap_err();
            assert!(error.to_string().contains("does not exist"), "{error}");
            let target = std::env::temp_dir().join(format!("mm-probe-driver-{}.svg", std::process::id()));
            let file = plot(&[command, "--plot", target.to_str().unwrap()]).unwrap();
            assert_eq!(file.unwrap().path(), target);
        }
    }

    /// Only thp-why accepts `--duration 0s`; with it nothing is loaded, whatever the privileges.
    #[test]
    fn a_watch_of_zero_loads_nothing() {
        let args = RunArgs { duration: Some(std::time::Duration::ZERO), ..RunArgs::default() };
        assert!(matches!(Untraced::before_loading(&args), Some(Untraced::NoWatch)));
    }

    #[test]
    fn each_target_that_exited_gets_the_one_note() {
        assert_eq!(exit_note(42), "process 42 exited while being traced; partial results below");
    }
}
