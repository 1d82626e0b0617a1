//! An madvise(MADV_PAGEOUT) / MADV_COLD storm over large anonymous memory, optionally beside a
//! thread that keeps other memory hot (memory pressure, like `stress-ng --vm`).
//!
//! Each storm thread maps its region with 4 KiB pages (MADV_NOHUGEPAGE, so every 2 MiB is one
//! madvise_cold_or_pageout_pte_range() call walking 512 PTEs), then loops: write every page,
//! madvise the whole region. Without swap the anonymous pages cannot be written out, but the
//! walk still isolates every page and hands the list to reclaim, which is the work that holds
//! the CPU.
//!
//! Every region is faulted in before the storm starts (first touches are page faults, which in
//! an emulated guest would otherwise fill the whole run). With --go-on-stdin it then prints
//! `ready pid=<pid>` and waits for a line on stdin, so a test can start tracing in between.
//!
//! Usage: pageout_storm [--bytes N(M|G)] [--threads N] [--duration-ms N] [--advice pageout|cold|none]
//!                      [--cpu N (the storm threads)] [--pressure-bytes N(M|G)] [--go-on-stdin]
//! Prints one JSON line: calls, bytes per call, total and worst madvise time, the page faults
//! taken during the storm, and the swap the kernel had (without swap, MADV_PAGEOUT cannot free
//! anonymous pages: the walk isolates them and reclaim puts them back).

use std::{
    io::Write as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use mm_probe_workloads::{map_small_pages, touch_pages};

struct Args {
    bytes: usize,
    threads: usize,
    duration: Duration,
    advice: libc::c_int,
    cpu: Option<usize>,
    pressure_bytes: usize,
    go_on_stdin: bool,
}

/// `--advice none`: touch the region in a loop and never call madvise.
const NO_ADVICE: libc::c_int = -1;

fn size(text: &str) -> Result<usize> {
    let (number, scale) = match text.chars().last() {
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('K' | 'k') => (&text[..text.len() - 1], 1 << 10),
        _ => (text, 1),
    };
    Ok(number.parse::<usize>().with_context(|| format!("bad size {text}"))? * scale)
}

fn parse() -> Result<Args> {
    let mut args = Args {
        bytes: 256 << 20,
        threads: 1,
        duration: Duration::from_secs(3),
        advice: libc::MADV_PAGEOUT,
        cpu: None,
        pressure_bytes: 0,
        go_on_stdin: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bytes" => args.bytes = size(&value()?)?,
            "--threads" => args.threads = value()?.parse()?,
            "--duration-ms" => args.duration = Duration::from_millis(value()?.parse()?),
            "--advice" => {
                args.advice = match value()?.as_str() {
                    "pageout" => libc::MADV_PAGEOUT,
                    "cold" => libc::MADV_COLD,
                    // A control: the same touching, no madvise (user space, preemptible anywhere).
                    "none" => NO_ADVICE,
                    other => bail!("--advice {other}: use pageout, cold or none"),
                }
            }
            "--cpu" => args.cpu = Some(value()?.parse()?),
            "--pressure-bytes" => args.pressure_bytes = size(&value()?)?,
            "--go-on-stdin" => args.go_on_stdin = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

#[derive(Default)]
struct Tally {
    calls: u64,
    total: Duration,
    worst: Duration,
}

fn storm(args: &Args, base: usize, stop: &AtomicBool) -> Result<Tally> {
    let base = base as *mut u8;
    let mut tally = Tally::default();
    let mut round = 0u8;
    while !stop.load(Ordering::Relaxed) {
        round = round.wrapping_add(1);
        // SAFETY: `base` is a region `prepared` mapped, `args.bytes` long, never unmapped.
        unsafe { touch_pages(base, args.bytes, round) };
        if args.advice == NO_ADVICE {
            continue;
        }
        let started = Instant::now();
        // SAFETY: madvise on our own mapping.
        let rc = unsafe { libc::madvise(base.cast(), args.bytes, args.advice) };
        let took = started.elapsed();
        if rc != 0 {
            bail!("madvise: {}", std::io::Error::last_os_error());
        }
        tally.calls += 1;
        tally.total += took;
        tally.worst = tally.worst.max(took);
    }
    Ok(tally)
}

/// An address that can cross to a thread (the mapping outlives every thread using it).
fn prepared(bytes: usize) -> Result<usize> {
    let base = map_small_pages(bytes)?;
    // SAFETY: the mapping just made, `bytes` long.
    unsafe { touch_pages(base, bytes, 0xff) };
    Ok(base as usize)
}

fn swap_total_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("SwapTotal:")?.split_whitespace().next()?.parse().ok()))
        .unwrap_or(0)
}

/// Minor and major page faults of this process so far.
fn faults() -> (i64, i64) {
    // SAFETY: getrusage fills the zeroed struct.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        (usage.ru_minflt, usage.ru_majflt)
    }
}

fn main() -> Result<()> {
    let args = Arc::new(parse()?);
    let regions: Vec<usize> = (0..args.threads).map(|_| prepared(args.bytes)).collect::<Result<_>>()?;
    let pressure_region = (args.pressure_bytes > 0).then(|| prepared(args.pressure_bytes)).transpose()?;
    if args.go_on_stdin {
        println!("ready pid={}", std::process::id());
        std::io::stdout().flush()?;
        std::io::stdin().read_line(&mut String::new())?;
    }
    let faults_before = faults();
    let stop = Arc::new(AtomicBool::new(false));
    let pressure = pressure_region.map(|base| {
        let (bytes, stop) = (args.pressure_bytes, stop.clone());
        std::thread::spawn(move || {
            let mut round = 0u8;
            while !stop.load(Ordering::Relaxed) {
                round = round.wrapping_add(1);
                // SAFETY: the pressure region, `bytes` long, never unmapped.
                unsafe { touch_pages(base as *mut u8, bytes, round) };
            }
        })
    });
    let storms: Vec<_> = regions
        .into_iter()
        .map(|base| {
            let (args, stop) = (args.clone(), stop.clone());
            std::thread::spawn(move || {
                // Only the storm threads are pinned; the pressure thread runs where it can.
                if let Some(cpu) = args.cpu {
                    mm_probe_workloads::pin_to_cpu(cpu)?;
                }
                storm(&args, base, &stop)
            })
        })
        .collect();
    std::thread::sleep(args.duration);
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for handle in storms {
        let t = handle.join().map_err(|_| anyhow::anyhow!("storm thread panicked"))??;
        tally.calls += t.calls;
        tally.total += t.total;
        tally.worst = tally.worst.max(t.worst);
    }
    if let Some(handle) = pressure {
        handle.join().map_err(|_| anyhow::anyhow!("pressure thread panicked"))?;
    }
    let faults_after = faults();
    println!(
        "{{\"pid\":{},\"advice\":{},\"bytes_per_call\":{},\"calls\":{},\"total_madvise_us\":{},\"worst_madvise_us\":{},\
         \"minor_faults\":{},\"major_faults\":{},\"swap_total_kib\":{}}}",
        std::process::id(),
        args.advice,
        args.bytes,
        tally.calls,
        tally.total.as_micros(),
        tally.worst.as_micros(),
        faults_after.0 - faults_before.0,
        faults_after.1 - faults_before.1,
        swap_total_kib()
    );
    Ok(())
}
