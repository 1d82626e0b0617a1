//! A busy machine's background: thousands of short-lived processes, each with a name of its
//! own, each contending on locks nobody else shares (its own mmap_lock, taken by two threads
//! that map, fault and unmap at once) from several code paths. Lock-contention tools that key
//! their tables by process, name or stack fill them with this; the contention that matters
//! (a VM's mmu_lock) then arrives into a full table.
//!
//! Usage: churn [--processes N] [--duration-ms N] [--concurrency N]
//! Runs until N processes have run or the duration has passed, whichever comes first, with at
//! most --concurrency alive at once. Prints one JSON line: the processes run and their names'
//! distinct count.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

struct Args {
    processes: u64,
    duration: Duration,
    concurrency: u64,
}

fn parse() -> Result<Args> {
    let mut args = Args { processes: 100_000, duration: Duration::from_secs(10), concurrency: 8 };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words.next().with_context(|| format!("{flag} needs a value"))?;
        let number: u64 = value.parse().with_context(|| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--processes" => args.processes = number,
            "--duration-ms" => args.duration = Duration::from_millis(number),
            "--concurrency" => args.concurrency = number.max(1),
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(args)
}

/// One process's life: a name of its own, then two threads mapping, touching and unmapping
/// small regions of the one address space for a few milliseconds.
fn live(index: u64) -> ! {
    let name = format!("churn-{index:06}\0");
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
    let until = Instant::now() + Duration::from_millis(3);
    let other = std::thread::spawn(move || map_touch_unmap(until));
    map_touch_unmap(until);
    let _ = other.join();
    // SAFETY: leaving the child without running the parent's exit handlers.
    unsafe { libc::_exit(0) }
}

fn map_touch_unmap(until: Instant) {
    const BYTES: usize = 64 << 10;
    while Instant::now() < until {
        // SAFETY: a private anonymous mapping, touched within its bounds, then unmapped.
        unsafe {
            let region = libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if region == libc::MAP_FAILED {
                return;
            }
            for page in (0..BYTES).step_by(4096) {
                *(region as *mut u8).add(page) = 1;
            }
            libc::mprotect(region, BYTES, libc::PROT_READ);
            libc::munmap(region, BYTES);
        }
    }
}

fn main() -> Result<()> {
    let args = parse()?;
    let started = Instant::now();
    let (mut started_processes, mut alive) = (0u64, 0u64);
    while started_processes < args.processes && started.elapsed() < args.duration {
        if alive >= args.concurrency {
            // SAFETY: reaping any child.
            if unsafe { libc::wait(std::ptr::null_mut()) } > 0 {
                alive -= 1;
            }
            continue;
        }
        // SAFETY: the child only calls async-signal-safe functions and its own code before _exit.
        match unsafe { libc::fork() } {
            0 => live(started_processes),
            -1 => bail!("fork: {}", std::io::Error::last_os_error()),
            _ => {
                started_processes += 1;
                alive += 1;
            }
        }
    }
    // SAFETY: reaping the remaining children.
    while unsafe { libc::wait(std::ptr::null_mut()) } > 0 {}
    println!(r#"{{"processes":{started_processes},"distinct_names":{started_processes}}}"#);
    Ok(())
}
