//! Calls getppid(2) at a steady rate for a while, then prints how many calls it made, so a
//! ring-buffer benchmark can check received + lost == calls exactly.
//!
//! Usage: getppid_storm RATE_PER_SECOND SECONDS [--wait]
//! With --wait it prints its pid and waits for a line on stdin before starting (so the tracer
//! can attach first).

use std::{
    io::BufRead as _,
    time::{Duration, Instant},
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: getppid_storm RATE_PER_SECOND SECONDS [--wait]";
    let rate: u64 = args.get(1).and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    let seconds: f64 = args.get(2).and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    if args.iter().any(|a| a == "--wait") {
        println!("{}", std::process::id());
        std::io::stdin().lock().lines().next();
    }
    let (calls, elapsed) = call_at_rate(rate, Duration::from_secs_f64(seconds));
    println!("{{\"calls\":{calls},\"elapsed_ns\":{}}}", elapsed.as_nanos());
    Ok(())
}

/// Issues getppid calls so that after t seconds about rate*t have been made; returns the count.
fn call_at_rate(rate: u64, duration: Duration) -> (u64, Duration) {
    let start = Instant::now();
    let mut calls = 0u64;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            return (calls, elapsed);
        }
        let due = (rate as u128 * elapsed.as_nanos() / 1_000_000_000) as u64;
        if calls >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        // At most 10k calls between clock reads, so a burst cannot overshoot the duration.
        let burst = (due - calls).min(10_000);
        for _ in 0..burst {
            // SAFETY: getppid has no preconditions.
            unsafe { libc::getppid() };
        }
        calls += burst;
    }
}
