//! `cargo xtask vm-test`: the real-kernel test matrix. For each Debian kernel line it takes the
//! newest build (kernels.rs), builds the test kernel modules for it (crate::modules), generates
//! an initramfs that mounts the host root over 9p (initramfs.rs), boots it under qemu (qemu.rs),
//! runs every mm-probe integration-test executable inside (binaries.rs), and reports per kernel,
//! per test (report.rs).

mod bare;
pub mod binaries;
mod initramfs;
mod kernels;
mod qemu;
mod report;

pub use qemu::{Boot, Clock};

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use self::{
    binaries::{GuestProgram, GuestRun},
    kernels::{KernelBuild, KernelLine, LINES, Origin},
    qemu::{Accel, BootSpec, EMULATOR_BOOTS, Ended},
    report::{KernelRun, format_duration},
};

#[derive(clap::Args)]
pub struct VmTestArgs {
    /// Run only this kernel line (5.10, 5.10-rt, 6.1, 6.1-rt, 6.12, 6.12-rt, unstable, unstable-rt;
    /// the matrix is all but 5.10 and 5.10-rt); repeatable.
    /// Default: the six of the matrix.
    #[arg(long = "kernel", value_name = "LINE")]
    pub kernels: Vec<String>,
    /// Run only this integration-test executable of mm-probe (e.g. `foundation`); repeatable.
    #[arg(long = "test", value_name = "BINARY")]
    pub tests: Vec<String>,
    /// Kill a guest that has not powered off after this long (`480`, `300s`, `8m`).
    /// Default: 2 minutes to boot plus 3 per test executable.
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Accelerator: `auto` uses KVM only when a probe guest really boots with it.
    #[arg(long, value_enum, default_value_t)]
    pub accel: AccelChoice,
    /// Build the tool, workloads and tests unoptimised. Quicker to compile, but they run 3-5x
    /// slower in the TCG guests (measured: foundation 60-100 s against 11-20 s per kernel).
    #[arg(long)]
    pub debug: bool,
    /// Boot this many guests at a time (each uses 2 vCPUs and 2 GiB). Single-threaded tests leave
    /// one vCPU of each guest idle: on the shared 2-core host the matrix took 1m40s two at a
    /// time against 2m06s one at a time.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_JOBS)]
    pub jobs: usize,
    /// Passed to each test executable after `--test-threads=1` (a libtest name filter, `--exact`…).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "LIBTEST_ARGS")]
    pub libtest_args: Vec<String>,
}

impl Default for VmTestArgs {
    /// The whole matrix with the defaults of the command line (what `cargo xtask test` runs).
    fn default() -> Self {
        VmTestArgs {
            kernels: Vec::new(),
            tests: Vec::new(),
            timeout: None,
            accel: AccelChoice::Auto,
            debug: false,
            jobs: DEFAULT_JOBS,
            libtest_args: Vec::new(),
        }
    }
}

const DEFAULT_JOBS: usize = 2;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccelChoice {
    #[default]
    Auto,
    Tcg,
    Kvm,
}

/// Guest time allowances. Measured under TCG on the shared 2-core host: a Debian kernel reaches
/// the test script 4-7 s after boot, `foundation` takes 11-20 s optimised and 35-100 s with
/// --debug. `latency` is the slowest: its workloads run for seconds of guest time each, and on
/// Debian 6.1 beside a second guest it took about 7 minutes. The margins absorb a busy host; a
/// hang still ends in minutes.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(120);
const PER_BINARY_ALLOWANCE: Duration = Duration::from_secs(300);

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.trim() {
        t if t.ends_with('m') => (&t[..t.len() - 1], 60),
        t if t.ends_with('s') => (&t[..t.len() - 1], 1),
        t => (t, 1),
    };
    let value: u64 = number.trim().parse().map_err(|_| format!("{text:?} is not a duration like 480, 300s or 8m"))?;
    if value == 0 {
        return Err("the timeout must be positive".to_owned());
    }
    Ok(Duration::from_secs(value * scale))
}

pub fn run(args: &VmTestArgs) -> Result<()> {
    let start = Instant::now();
    let lines = select_lines(&args.kernels)?;
    let bare_wanted = args.tests.is_empty() || args.tests.iter().any(|t| t == bare::NAME);
    let executables: Vec<String> = args.tests.iter().filter(|t| *t != bare::NAME).cloned().collect();
    // `--test static_binary` alone boots only the bare initramfs.
    let binaries = match args.tests.is_empty() || !executables.is_empty() {
        true => binaries::build(&executables, !args.debug)?,
        false => Vec::new(),
    };
    let static_binary = match bare_wanted && lines.iter().any(|l| l.bare_boot) {
        true => Some(crate::dist::static_binary()?),
        false => None,
    };
    let accel = OnceLock::new();
    match args.accel {
        AccelChoice::Auto => {}
        AccelChoice::Tcg => drop(accel.set(Accel::Tcg)),
        AccelChoice::Kvm => drop(accel.set(Accel::Kvm)),
    }
    let programs: Vec<GuestProgram> = binaries.iter().map(|b| b.in_guest(&args.libtest_args)).collect();
    let matrix = Matrix {
        programs: &programs,
        work_root: crate::paths::target_dir()?.join("vm-test"),
        timeout: args.timeout.unwrap_or(BOOT_ALLOWANCE + PER_BINARY_ALLOWANCE * binaries.len() as u32),
        accel,
        host_tools: Mutex::new(()),
        static_binary,
    };
    let runs = run_lines(&matrix, &lines, args.jobs);
    let total = start.elapsed();
    // The tables again, together and in matrix order: the first ones have scrolled away.
    if runs.len() > 1 {
        for run in &runs {
            println!("{}", report::render_kernel(run));
        }
    }
    print!("{}", report::render_summary(&runs, total));
    let failed: Vec<&str> = runs.iter().filter(|r| r.failed()).map(|r| r.line.as_str()).collect();
    if !failed.is_empty() {
        bail!("vm-test failed on {}", failed.join(", "));
    }
    Ok(())
}

/// Runs every line, `jobs` guests at a time; returns the runs in matrix order.
fn run_lines(matrix: &Matrix<'_>, lines: &[&'static KernelLine], jobs: usize) -> Vec<KernelRun> {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, lines.len().max(1)) {
            scope.spawn(|| {
                while let Some(&line) = lines.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let kernel_start = Instant::now();
                    let mut run = run_kernel_once(line, matrix);
                    run.elapsed = kernel_start.elapsed();
                    eprint!("{}", report::render_kernel(&run));
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(run);
                }
            });
        }
    });
    let mut runs = done.into_inner().unwrap_or_else(|e| e.into_inner());
    runs.sort_by_key(|r| LINES.iter().position(|l| l.name == r.line));
    runs
}

fn run_kernel_once(line: &'static KernelLine, matrix: &Matrix<'_>) -> KernelRun {
    run_kernel(line, matrix).unwrap_or_else(|error| KernelRun {
        line: line.name.to_owned(),
        description: "not run".to_owned(),
        notes: Vec::new(),
        binaries: Vec::new(),
        run_failures: vec![format!("{error:#}")],
        elapsed: Duration::ZERO,
    })
}

/// Why a failed boot is the emulator's failure rather than mm-probe's, so that it is booted
/// once more (said in the report) for what it had not finished, and only it: the kernel's other
/// boots, which passed, stand; `None` for every other failure.
///
/// Two cases: the guest died before any test ran (seen: an int3 Oops in early jump-label
/// patching), and the kernel took an int3 Oops while tests ran with no test failed in a binary
/// that finished. Attaching a tracepoint rewrites kernel text through int3 breakpoints; under
/// TCG another vCPU can still execute a breakpoint the patching already removed, which real
/// CPUs (and KVM) exclude with the serializing IPIs text_poke_bp sends. The Oops kills the task
/// that hit it, often the mm-probe a test was running, so a test of the binary the kernel died
/// in may fail of it (seen on unstable: doctor_leaves_no_program_loaded, then the panic). A
/// failed test in a binary that finished stands: that run is never repeated. Nothing is hidden
/// by a repeat: each executable's one whole run is reported (the repeat's, or the one that
/// finished before the kernel died), and the notes name what the earlier boots failed.
fn emulator_failure(run: &BootOutcome, console: &str) -> Option<&'static str> {
    if run.run_failures.is_empty() {
        return None;
    }
    let reached_tests = console.contains(&format!("{} kernel ", initramfs::MARKER));
    if !reached_tests {
        return Some("the boot before failed before any test ran");
    }
    let a_finished_test_failed = run
        .binaries
        .iter()
        .filter(|b| b.status.is_some())
        .flat_map(|b| &b.tests)
        .any(|t| t.verdict == report::Verdict::Failed);
    if a_finished_test_failed {
        return None;
    }
    if console.contains("Oops: int3") {
        return Some(
            "the kernel before died of an int3 Oops at a text-patching site (TCG) with no test failed in a finished binary",
        );
    }
    if !stalled_in(console).is_empty() {
        return Some(
            "the kernel before reported only a soft lockup, recovered and finished its tests with none failed (TCG); the executable it stalled in runs again",
        );
    }
    // Seen once on 6.1-rt, two guests sharing the host's two cores: the guest went silent in
    // the middle of a test that passes in every other run, with nothing on the console (an RT
    // kernel of that age prints from a thread, so a wedged kernel says nothing). Booted again;
    // a hang our programs cause would come back and fail the run.
    run.run_failures
        .iter()
        .any(|f| f.starts_with(KILLED_AT_TIMEOUT))
        .then_some("the guest before was killed, silent or at its timeout, with no test failed")
}

/// The executables during which the kernel reported a soft lockup, when that is all it reported
/// and the guest went on to finish its tests; empty otherwise. Seen on 6.1 (kcompactd0, 22 s,
/// with an RCU stall, in the memory-pressure test) in a free-running guest beside another on
/// the host's two cores: under TCG a vCPU can spin in text patching's int3 handler, or go
/// unrun by the host, for as long as the watchdog allows. Such an executable runs again on a
/// fresh boot, like one an int3 Oops cut short: a lockup our programs cause comes back there,
/// and at the last boot it fails the run.
fn stalled_in(console: &str) -> Vec<String> {
    let reports: Vec<&str> = console.lines().filter(|l| qemu::kernel_failure(l)).collect();
    let finished = console.contains(&format!("{} tests finished", initramfs::MARKER));
    if !finished || reports.is_empty() || !reports.iter().all(|l| l.contains("BUG: soft lockup")) {
        return Vec::new();
    }
    let running = format!("{} running ", initramfs::MARKER);
    let mut current: Option<&str> = None;
    let mut stalled: Vec<String> = Vec::new();
    for line in console.lines() {
        if let Some(name) = line.split_once(&running).map(|(_, name)| name.trim()) {
            current = Some(name);
        } else if qemu::kernel_failure(line)
            && let Some(name) = current
            && !stalled.iter().any(|s| s == name)
        {
            stalled.push(name.to_string());
        }
    }
    stalled
}

/// What a boot that is repeated failed: its run failures and the tests that failed in it.
fn earlier_failures(run: &BootOutcome) -> Vec<String> {
    let tests = run.binaries.iter().flat_map(|b| {
        b.tests
            .iter()
            .filter(|t| t.verdict == report::Verdict::Failed)
            .map(move |t| format!("{} {} failed", b.binary, t.name))
    });
    run.run_failures.iter().cloned().chain(tests).collect()
}

/// The requested lines in matrix order; the matrix's when none is named.
fn select_lines(names: &[String]) -> Result<Vec<&'static KernelLine>> {
    if names.is_empty() {
        return Ok(LINES.iter().filter(|l| l.in_matrix).collect());
    }
    let requested: Vec<&'static KernelLine> = names.iter().map(|n| KernelLine::by_name(n)).collect::<Result<_>>()?;
    Ok(LINES.iter().filter(|l| requested.contains(l)).collect())
}

/// Runs one program (built on the host, e.g. `xtask bench --in-guest`) in a guest of kernel line
/// `line` under TCG or KVM as `vm-test` would, and returns what it printed; an Err when the
/// guest did not run it to a zero exit status.
pub fn run_program(line: &str, program: GuestProgram, timeout: Duration) -> Result<String> {
    let line = KernelLine::by_name(line)?;
    let name = program.name.clone();
    let programs = [program];
    let matrix = Matrix {
        programs: &programs,
        work_root: crate::paths::target_dir()?.join("vm-run"),
        timeout,
        accel: OnceLock::new(),
        host_tools: Mutex::new(()),
        static_binary: None,
    };
    let run = run_kernel_once(line, &matrix);
    let results = matrix.work_root.join(line.name).join("results");
    let output = fs::read_to_string(results.join(binaries::output_file(&name))).unwrap_or_default();
    let status = run.binaries.first().and_then(|b| b.status);
    if !run.run_failures.is_empty() || status != Some(0) {
        bail!(
            "{name} in the {line} guest: exit status {status:?}, {}\n{output}",
            if run.run_failures.is_empty() { "guest ran to the end".to_owned() } else { run.run_failures.join("; ") }
        );
    }
    Ok(output)
}

/// `cargo xtask vm-run`: for looking at one kernel line by hand (a start-up under strace, a
/// workload beside the tool). The guest sees the host's root, so any host program runs there.
#[derive(clap::Args)]
pub struct VmRunArgs {
    /// The kernel line (5.10, 5.10-rt, 6.1, 6.1-rt, 6.12, 6.12-rt, unstable, unstable-rt).
    #[arg(long = "kernel", value_name = "LINE")]
    pub kernel: String,
    /// Boot with instruction counting and one vCPU, as the timing proofs do.
    #[arg(long)]
    pub icount: bool,
    /// The command and its arguments, after `--` (e.g. `-- sh -c 'time target/release/mm-probe doctor'`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// Runs `args.command` in a guest and prints what it printed; an Err when it did not exit 0.
pub fn run_command(args: &VmRunArgs) -> Result<()> {
    let (program, rest) = args.command.split_first().context("no command given")?;
    let executable = crate::cmd::which(program)?;
    let clock = if args.icount { Clock::InstructionCounted } else { Clock::Free };
    let program = GuestProgram {
        name: "vm-run".to_owned(),
        executable,
        dir: std::env::current_dir()?,
        args: rest.to_vec(),
        boot: Boot { clock, two_nodes: false },
    };
    print!("{}", run_program(&args.kernel, program, BOOT_ALLOWANCE + PER_BINARY_ALLOWANCE)?);
    Ok(())
}

/// What every kernel's run shares.
struct Matrix<'a> {
    programs: &'a [GuestProgram],
    /// `target/vm-test`; each line works in `<line>/` (initramfs, console log, results share).
    work_root: PathBuf,
    timeout: Duration,
    /// Chosen once, by the first kernel ready to boot.
    accel: OnceLock<Accel>,
    /// Serialises apt (it holds a lock) and the module builds (one build tree per module) when
    /// guests run in parallel.
    host_tools: Mutex<()>,
    /// The static release binary, for the lines that boot the bare initramfs (None: not wanted).
    static_binary: Option<PathBuf>,
}

/// Everything for one kernel line. An Err is a failure of the run (no kernel, no initramfs);
/// test failures are in the returned KernelRun.
fn run_kernel(line: &'static KernelLine, matrix: &Matrix<'_>) -> Result<KernelRun> {
    let work = matrix.work_root.join(line.name);
    let host_tools = matrix.host_tools.lock().unwrap_or_else(|e| e.into_inner());
    let kernel = kernels::obtain(line)?;
    let mut notes = Vec::new();
    if let Origin::Fallback { why } = &kernel.origin {
        notes.push(format!(
            "the archive's newest build was not available ({why}); ran {} {}",
            kernel.package, kernel.version
        ));
    }
    let _ = fs::remove_dir_all(&work);
    let results = work.join("results");
    fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;

    let module_dir = match crate::modules::build_for_release(&kernel.release, line.toolchain) {
        Ok(dir) => Some(dir),
        Err(error) => {
            eprintln!("xtask vm-test: {line}: test modules not built: {error:#}");
            notes.push(format!("test modules not built, MM_PROBE_TEST_MODULES unset: {error:#}"));
            None
        }
    };
    drop(host_tools);
    let initramfs = initramfs::build(&kernel, &work)?;
    let accel = *matrix.accel.get_or_init(|| qemu::choose_accel(&kernel.vmlinuz(), &initramfs, &work));

    let mut binaries = Vec::new();
    let mut boots = Vec::new();
    let mut run_failures = Vec::new();
    for boot in Boot::ALL {
        let clock = boot.clock;
        if clock == Clock::InstructionCounted && !line.timing_proof {
            let skipped: Vec<&str> =
                matrix.programs.iter().filter(|p| p.boot == boot).map(|p| p.name.as_str()).collect();
            if !skipped.is_empty() {
                notes.push(format!(
                    "{} not run: its timing proof needs an instruction-counted boot, which only the lines whose \
                     code paths differ get",
                    skipped.join(", ")
                ));
            }
            continue;
        }
        let (programs, skipped): (Vec<&GuestProgram>, Vec<&GuestProgram>) = matrix
            .programs
            .iter()
            .filter(|p| p.boot == boot)
            .partition(|p| line.unix_conventions || p.name != kernels::UNIX_CONVENTIONS);
        if !skipped.is_empty() {
            let proving: Vec<&str> = LINES.iter().filter(|l| l.unix_conventions).map(|l| l.name).collect();
            notes.push(format!(
                "{} not run: the command-line conventions are the tool's, proven on the host and {}",
                kernels::UNIX_CONVENTIONS,
                proving.join(", ")
            ));
        }
        if programs.is_empty() {
            continue;
        }
        let guest = GuestRun { kernel_line: line.name, module_dir: module_dir.as_deref(), clock };
        // Instruction counting needs TCG: KVM runs on the host's clock.
        let accel = if clock == Clock::Free { accel } else { Accel::Tcg };
        eprintln!(
            "xtask vm-test: booting {line}: {} {} under {}, {} (timeout {})",
            kernel.package,
            kernel.version,
            accel.name(),
            boot.name(),
            format_duration(matrix.timeout)
        );
        let label = format!("{line}{}", boot.label_suffix());
        let spec = BootSpec {
            accel,
            clock,
            vmlinuz: &kernel.vmlinuz(),
            initramfs: &initramfs,
            results: Some(&results),
            share_host_root: true,
            console_log: &work.join(boot.console_file()),
            extra_cmdline: "",
            two_nodes: boot.two_nodes,
            label: &label,
            echo_markers: true,
        };
        let outcome = boot_until_not_the_emulator(&spec, &programs, &guest, &results, matrix.timeout, &mut notes)?;
        boots.push(format!("{}, {} guest {}", accel.name(), boot.name(), format_duration(outcome.elapsed)));
        binaries.extend(outcome.binaries);
        run_failures.extend(outcome.run_failures);
    }
    if let Some(binary) = matrix.static_binary.as_deref().filter(|_| line.bare_boot) {
        eprintln!("xtask vm-test: booting {line} bare: busybox and the static mm-probe, no C library");
        let (run, repeated) = bare::run(&kernel, binary, &work, &format!("{line} bare"))?;
        boots.push(format!("tcg, one vCPU, bare guest {}", format_duration(run.elapsed.unwrap_or_default())));
        binaries.push(run);
        notes.extend(repeated);
    }
    Ok(KernelRun {
        line: line.name.to_owned(),
        description: describe(&kernel, &boots),
        notes,
        binaries,
        run_failures,
        elapsed: Duration::ZERO,
    })
}

/// What one boot gave: its test executables' runs and what went wrong with the guest itself.
struct BootOutcome {
    binaries: Vec<report::BinaryRun>,
    run_failures: Vec<String>,
    elapsed: Duration,
}

/// Boots `spec` to run `programs`, and boots it again (EMULATOR_BOOTS in all, at most) while it
/// failed by the emulator's fault; each repeat is a note with what the boot before failed. A
/// repeat runs only the executables that had not finished, cleanly, before the kernel died:
/// those that had ran whole on this kernel and stand, as the kernel's other boots do.
fn boot_until_not_the_emulator(
    spec: &BootSpec<'_>,
    programs: &[&GuestProgram],
    guest: &GuestRun<'_>,
    results: &Path,
    timeout: Duration,
    notes: &mut Vec<String>,
) -> Result<BootOutcome> {
    let mut stand: Vec<report::BinaryRun> = Vec::new();
    let mut to_run: Vec<&GuestProgram> = programs.to_vec();
    let mut elapsed = Duration::ZERO;
    let mut boot = 1;
    loop {
        let outcome = boot_once(spec, &to_run, guest, results, timeout)?;
        elapsed += outcome.elapsed;
        let console = fs::read_to_string(spec.console_log).unwrap_or_default();
        match emulator_failure(&outcome, &console) {
            Some(why) if boot < EMULATOR_BOOTS => {
                // The repeat writes the same console file: the failed boot's is kept beside it,
                // and the note points there (a silent guest's last lines are the only evidence).
                let kept = kept_console(spec.console_log, boot);
                let shown = spec.console_log.display().to_string();
                let failures = match fs::rename(spec.console_log, &kept) {
                    Ok(()) => earlier_failures(&outcome).join("; ").replace(&shown, &kept.display().to_string()),
                    Err(_) => earlier_failures(&outcome).join("; "),
                };
                boot += 1;
                let (done, again) = finished_cleanly(outcome.binaries, &stalled_in(&console));
                let again: Vec<String> = again.into_iter().map(|b| b.binary).collect();
                notes.push(format!("{} boot {boot}: {why}; {} run again ({failures})", spec.label, again.join(", ")));
                to_run.retain(|p| again.contains(&p.name));
                stand.extend(done);
            }
            _ => {
                stand.extend(outcome.binaries);
                // In the order the boot runs them, as a boot that never failed reports them.
                stand.sort_by_key(|b| programs.iter().position(|p| p.name == b.binary));
                return Ok(BootOutcome { binaries: stand, run_failures: outcome.run_failures, elapsed });
            }
        }
    }
}

/// Where the console of failed boot `boot` is kept: `console.log` → `console-boot1.log`.
fn kept_console(console: &Path, boot: usize) -> PathBuf {
    let stem = console.file_stem().map_or_else(|| "console".into(), |s| s.to_string_lossy().into_owned());
    console.with_file_name(format!("{stem}-boot{boot}.log"))
}

/// The executables of a boot the emulator failed that finished with every test passed (they
/// stand), and the others (they run again): unfinished, killed on the way out, or one the
/// kernel stalled in (`stalled`).
fn finished_cleanly(
    binaries: Vec<report::BinaryRun>,
    stalled: &[String],
) -> (Vec<report::BinaryRun>, Vec<report::BinaryRun>) {
    binaries.into_iter().partition(|b| b.status.is_some() && !b.failed() && !stalled.contains(&b.binary))
}

/// One boot running `programs`, from a results share without what an earlier boot left of them
/// (a repeat must not read the files of an executable it never reached).
fn boot_once(
    spec: &BootSpec<'_>,
    programs: &[&GuestProgram],
    guest: &GuestRun<'_>,
    results: &Path,
    timeout: Duration,
) -> Result<BootOutcome> {
    for program in programs {
        for file in [
            binaries::output_file(&program.name),
            binaries::status_file(&program.name),
            binaries::elapsed_file(&program.name),
        ] {
            let _ = fs::remove_file(results.join(file));
        }
    }
    fs::write(results.join(initramfs::TEST_SCRIPT), binaries::guest_script(programs, guest))?;
    let booted = qemu::boot(spec, timeout, GUEST_SILENCE)?;
    Ok(BootOutcome {
        binaries: programs.iter().map(|p| read_run(results, &p.name)).collect(),
        run_failures: boot_failures(&booted, timeout),
        elapsed: booted.elapsed,
    })
}

fn read_run(results: &Path, name: &str) -> report::BinaryRun {
    report::read_binary_run(
        results,
        name,
        &binaries::output_file(name),
        &binaries::status_file(name),
        &binaries::elapsed_file(name),
    )
}

fn describe(kernel: &KernelBuild, boots: &[String]) -> String {
    let origin = match kernel.origin {
        Origin::Downloaded => "downloaded",
        Origin::Cached => "cached",
        Origin::Fallback { .. } => "fallback",
    };
    format!("{} {} [{origin}], release {}, {}", kernel.package, kernel.version, kernel.release, boots.join("; "))
}

/// How long a guest may print no harness line, not even /init's heartbeat, before its kernel
/// counts as wedged. A test that hangs with the kernel alive is the guest's to kill (at
/// `binaries::PROGRAM_LIMIT`, reported as hung); a wedged kernel runs no shell loop at all. Seen
/// on 6.1 under TCG: every CPU in a soft lockup inside text patching, or nothing printed at all,
/// for as long as the guest was left (11 minutes before the heartbeat).
const GUEST_SILENCE: Duration = Duration::from_secs(180);

/// How a run failure for a guest killed at the timeout begins.
const KILLED_AT_TIMEOUT: &str = "guest killed after";

/// What went wrong with the guest itself, followed by the console excerpt that shows it.
fn boot_failures(boot: &qemu::BootRun, timeout: Duration) -> Vec<String> {
    const EXCERPT_LINES: usize = 40;
    let mut reasons = Vec::new();
    match boot.ended {
        Ended::Exited => {}
        Ended::TimedOut => reasons.push(format!("{KILLED_AT_TIMEOUT} {}", format_duration(timeout))),
        Ended::Silent(quiet) => reasons.push(format!(
            "{KILLED_AT_TIMEOUT} {} with nothing from the harness for {} (last: {})",
            format_duration(boot.elapsed),
            format_duration(quiet),
            boot.markers.last().map_or("nothing", String::as_str)
        )),
    }
    if !boot.kernel_failures.is_empty() {
        reasons.push(format!("the kernel reported: {}", boot.kernel_failures.join(" | ")));
    }
    if let Some(init_failure) = boot.markers.iter().find(|m| m.starts_with("init failed")) {
        reasons.push(format!("guest {init_failure}"));
    } else if boot.ended == Ended::Exited && !boot.saw_marker("tests finished") {
        reasons.push("the guest stopped before the tests finished".to_owned());
    }
    if reasons.is_empty() {
        return reasons;
    }
    let excerpt = boot.console_excerpt(EXCERPT_LINES);
    vec![format!("{}; console ({}):\n{excerpt}", reasons.join("; "), boot.console_log.display())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_accept_seconds_and_minutes() {
        assert_eq!(parse_timeout("480"), Ok(Duration::from_secs(480)));
        assert_eq!(parse_timeout("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_timeout("8m"), Ok(Duration::from_secs(480)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("soon").is_err());
    }

    #[test]
    fn lines_run_in_matrix_order_and_unknown_ones_are_errors() {
        let names: Vec<&str> =
            select_lines(&["6.12-rt".into(), "6.1".into()]).unwrap().iter().map(|l| l.name).collect();
        assert_eq!(names, ["6.1", "6.12-rt"]);
        assert_eq!(select_lines(&[]).unwrap().len(), 6);
        assert!(select_lines(&["6.6".into()]).is_err());
    }

    fn run_with(failures: &[&str], verdicts: &[report::Verdict]) -> BootOutcome {
        let tests = verdicts
            .iter()
            .enumerate()
            .map(|(i, &verdict)| report::TestResult { name: format!("t{i}"), verdict, elapsed: None })
            .collect();
        let binary = report::BinaryRun {
            binary: "latency".into(),
            tests,
            status: None,
            elapsed: None,
            failure_details: String::new(),
        };
        BootOutcome {
            binaries: vec![binary],
            run_failures: failures.iter().map(|f| f.to_string()).collect(),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn only_emulator_deaths_with_no_failed_test_boot_again() {
        use report::Verdict::{Failed, Passed, Unfinished};
        let tests_started =
            format!("{} kernel 6.12 up 4s\n[ 98.4] Oops: int3: 0000 [#1] PREEMPT_RT SMP", initramfs::MARKER);
        let panic = "the kernel reported: Oops: int3";
        assert!(emulator_failure(&run_with(&[], &[Passed]), &tests_started).is_none(), "a green run stands");
        assert!(emulator_failure(&run_with(&[panic], &[Passed, Unfinished]), &tests_started).is_some());
        assert!(
            emulator_failure(&run_with(&[panic], &[Failed, Unfinished]), &tests_started).is_some(),
            "the Oops killed the program a test of the unfinished binary ran"
        );
        let mut finished_failure = run_with(&[panic], &[Failed, Unfinished]);
        finished_failure.binaries[0].status = Some(101);
        assert!(
            emulator_failure(&finished_failure, &tests_started).is_none(),
            "a failed test in a binary that finished is never run again"
        );
        assert_eq!(earlier_failures(&finished_failure), ["the kernel reported: Oops: int3", "latency t0 failed"]);
        let other_death =
            format!("{} kernel 6.12 up 4s\n[ 98.4] BUG: kernel NULL pointer dereference", initramfs::MARKER);
        assert!(emulator_failure(&run_with(&["panic"], &[Passed, Unfinished]), &other_death).is_none());
        assert!(
            emulator_failure(&run_with(&["timeout"], &[]), "[ 1.0] Oops: int3 in early boot").is_some(),
            "died before the tests"
        );
        let killed = format!("{} after 7m00.0s; console", KILLED_AT_TIMEOUT);
        assert!(emulator_failure(&run_with(&[&killed], &[Passed, Unfinished]), &tests_started).is_some());
        let mut killed_after_failure = run_with(&[&killed], &[Failed, Unfinished]);
        killed_after_failure.binaries[0].status = Some(101);
        assert!(emulator_failure(&killed_after_failure, &tests_started).is_none());
    }

    #[test]
    fn a_failed_boots_console_is_kept_beside_the_next() {
        let kept = kept_console(Path::new("/t/vm-test/6.1-rt/console-two-nodes.log"), 2);
        assert_eq!(kept, Path::new("/t/vm-test/6.1-rt/console-two-nodes-boot2.log"));
    }

    #[test]
    fn a_repeat_runs_what_had_not_finished_cleanly_before_the_kernel_died() {
        use report::Verdict::{Passed, Unfinished};
        let binary = |name: &str, status: Option<i32>, verdicts: &[report::Verdict]| {
            let mut run = run_with(&[], verdicts).binaries.remove(0);
            run.binary = name.into();
            run.status = status;
            run
        };
        let boot = || {
            vec![
                binary("compare", Some(0), &[Passed, Passed]),
                binary("exporter", Some(137), &[Passed]),
                binary("invalidations", None, &[Passed, Unfinished]),
                binary("latency", None, &[]),
            ]
        };
        let (stand, again) = finished_cleanly(boot(), &[]);
        let names = |runs: &[report::BinaryRun]| runs.iter().map(|b| b.binary.clone()).collect::<Vec<_>>();
        assert_eq!(names(&stand), ["compare"]);
        assert_eq!(names(&again), ["exporter", "invalidations", "latency"], "killed on the way out runs again too");
        let (stand, _) = finished_cleanly(boot(), &["compare".into()]);
        assert!(stand.is_empty(), "the executable the kernel stalled in runs again");
    }

    #[test]
    fn a_soft_lockup_the_guest_recovered_from_reruns_the_executable_it_came_in() {
        use report::Verdict::Passed;
        let console = |report: &str, end: &str| {
            let m = initramfs::MARKER;
            format!(
                "{m} kernel 6.1 up 4s\n{m} running thp_why\n{m} thp_why exited with status 0\n\
                 {m} running retry_storm_field\n{m} alive\n{report}\n[ 458.7] rcu: INFO: rcu_preempt detected stalls\n\
                 {m} retry_storm_field exited with status 0\n{m} running unix\n{end}"
            )
        };
        let lockup = "[ 457.0] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [kcompactd0:33]";
        let finished = format!("{} tests finished with status 0 at 700s", initramfs::MARKER);
        let reported = ["the kernel reported: [ 457.0] watchdog: BUG: soft lockup"];
        let recovered = console(lockup, &finished);
        assert_eq!(stalled_in(&recovered), ["retry_storm_field"]);
        let mut finished_run = run_with(&reported, &[Passed]);
        finished_run.binaries[0].status = Some(0);
        assert!(emulator_failure(&finished_run, &recovered).is_some());
        assert!(stalled_in(&console(lockup, "")).is_empty(), "a guest that did not finish is not this case");
        let null = "[ 457.0] BUG: kernel NULL pointer dereference, address: 0000000000000008";
        assert!(stalled_in(&console(&format!("{lockup}\n{null}"), &finished)).is_empty(), "only lockups");
        assert!(emulator_failure(&finished_run, &console(null, &finished)).is_none());
    }
}
