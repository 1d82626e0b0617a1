use mm_probe::{
    cli::{self, Command},
    compare, doctor, error, exporter, generate, invalidations, latency, retry_storm, selftest, thp_why, triage,
};

/// The static build's allocator (see Cargo.toml); the glibc build keeps glibc's.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    end_quietly_on_a_closed_pipe();
    report_panics_as_internal_errors();
    let cli = cli::parse_or_exit();
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(&args),
        Command::ThpWhy(args) => thp_why::run(&args),
        Command::Latency(args) => latency::run(&args),
        Command::RetryStorm(args) => retry_storm::run(&args),
        Command::Invalidations(args) => invalidations::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Triage(args) => triage::run(&args),
        Command::Exporter(args) => exporter::run(&args),
        Command::BenchRing { pid } => selftest::run_ring_check(pid),
        Command::BenchHooks { tracepoints } => selftest::hold_noop_programs(&tracepoints),
        Command::GenerateDocs { out } => generate::run(&out),
    };
    if let Err(err) = result {
        eprintln!("mm-probe: {err:#}");
        std::process::exit(error::exit_code(&err));
    }
}

/// `mm-probe latency --json | head -1`: once the reader is gone, the next write ends the process
/// by SIGPIPE, as it ends `cat` or `ls`, instead of Rust's default (SIGPIPE ignored, then a
/// panic on the failed print). Nothing stays attached: the kernel detaches every program when
/// the process's descriptors close. The exporter's sockets are not affected: Rust writes to
/// sockets with MSG_NOSIGNAL.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: restoring the default disposition of one signal, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// A panic is mm-probe's own failure: one line and exit 2 (the documented code), not Rust's
/// backtrace banner and 101.
fn report_panics_as_internal_errors() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("mm-probe: internal error: {what}{place} (a bug in mm-probe; please report it)");
        std::process::exit(error::EXIT_INTERNAL);
    }));
}
