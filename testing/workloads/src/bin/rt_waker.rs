//! A periodic SCHED_FIFO waker, like cyclictest: sleeps to absolute deadlines with
//! clock_nanosleep(TIMER_ABSTIME) and measures how late it woke, so every loop is exactly one
//! wakeup for the kernel's sched_wakeup → sched_switch path.
//!
//! Usage: rt_waker [--prio N] [--period-us N] [--loops N] [--cpu N] [--start-after-ms N] [--go-on-stdin]
//! With --go-on-stdin it prints `ready pid=<pid>` once it is a SCHED_FIFO task, then waits for a
//! line on stdin before its first loop, so a test can start tracing in between; after its report
//! it waits for stdin to close before exiting, so a test can stop tracing first.
//! Prints one line: `rt_waker pid=<pid> loops=<n> slept=<s> blocked=<b> max_late_us=<m> avg_late_us=<a>`.
//! `slept` leaves out the loops whose deadline had already passed when checked (clock_nanosleep
//! then returns at once). `blocked` is what the kernel says: this thread's voluntary context
//! switches from just before it waits (for the go line, or for its first deadline) to its last
//! loop — every one of them ends in exactly one wakeup, which is what a tracer must count.

use std::{
    io::{Read as _, Write as _},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

struct Args {
    prio: i32,
    period: Duration,
    loops: u64,
    cpu: Option<usize>,
    start_after: Duration,
    go_on_stdin: bool,
}

fn parse() -> Result<Args> {
    let mut args = Args {
        prio: 80,
        period: Duration::from_millis(1),
        loops: 1000,
        cpu: None,
        start_after: Duration::ZERO,
        go_on_stdin: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--prio" => args.prio = value()?.parse()?,
            "--period-us" => args.period = Duration::from_micros(value()?.parse()?),
            "--loops" => args.loops = value()?.parse()?,
            "--cpu" => args.cpu = Some(value()?.parse()?),
            "--start-after-ms" => args.start_after = Duration::from_millis(value()?.parse()?),
            "--go-on-stdin" => args.go_on_stdin = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

fn now() -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts
}

fn add(ts: &mut libc::timespec, d: Duration) {
    ts.tv_nsec += d.subsec_nanos() as libc::c_long;
    ts.tv_sec += d.as_secs() as libc::time_t + (ts.tv_nsec / 1_000_000_000) as libc::time_t;
    ts.tv_nsec %= 1_000_000_000;
}

/// This thread's voluntary context switches so far.
fn voluntary_switches() -> i64 {
    // SAFETY: getrusage fills the zeroed struct.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        usage.ru_nvcsw
    }
}

fn nanos(ts: &libc::timespec) -> i64 {
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn main() -> Result<()> {
    let args = parse()?;
    if let Some(cpu) = args.cpu {
        mm_probe_workloads::pin_to_cpu(cpu)?;
    }
    // SAFETY: plain syscalls on this process with valid arguments.
    unsafe {
        libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE);
        let param = libc::sched_param { sched_priority: args.prio };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            bail!("sched_setscheduler(SCHED_FIFO, {}): {} (run as root)", args.prio, std::io::Error::last_os_error());
        }
    }
    if args.go_on_stdin {
        println!("ready pid={}", std::process::id());
        std::io::stdout().flush()?;
    }
    let switches_before = voluntary_switches();
    if args.go_on_stdin {
        std::io::stdin().read_line(&mut String::new())?;
    }
    std::thread::sleep(args.start_after);
    let mut next = now();
    let (mut max_late, mut sum_late, mut overruns) = (0i64, 0i64, 0u64);
    for _ in 0..args.loops {
        add(&mut next, args.period);
        if nanos(&now()) >= nanos(&next) {
            overruns += 1;
        }
        // SAFETY: next is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &next, std::ptr::null_mut()) };
        if rc != 0 {
            bail!("clock_nanosleep: {}", std::io::Error::from_raw_os_error(rc));
        }
        let late = (nanos(&now()) - nanos(&next)).max(0);
        max_late = max_late.max(late);
        sum_late += late;
    }
    let blocked = voluntary_switches() - switches_before;
    println!(
        "rt_waker pid={} loops={} slept={} blocked={} max_late_us={} avg_late_us={}",
        std::process::id(),
        args.loops,
        args.loops - overruns,
        blocked,
        max_late / 1000,
        sum_late / 1000 / args.loops.max(1) as i64
    );
    if args.go_on_stdin {
        std::io::stdout().flush()?;
        std::io::stdin().read_to_end(&mut Vec::new())?;
    }
    Ok(())
}
