//! A scheduler-heavy loop for overhead benchmarks: two threads bounce a byte over a pair of
//! pipes N times, so every round trip is two wakeups and two context switches.
//!
//! Usage: pingpong ROUND_TRIPS [--wait]   (prints `{"elapsed_ns":…,"round_trips":…}`)

use std::time::Instant;

fn pipe() -> anyhow::Result<(i32, i32)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors pipe writes.
    anyhow::ensure!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe failed");
    Ok((fds[0], fds[1]))
}

/// Sends a byte and waits for it to come back, `times` times.
fn serve(write_fd: i32, read_fd: i32, times: u64) {
    let mut byte = [0u8; 1];
    for _ in 0..times {
        // SAFETY: one byte between a live buffer and open pipes.
        unsafe {
            libc::write(write_fd, byte.as_ptr().cast(), 1);
            libc::read(read_fd, byte.as_mut_ptr().cast(), 1);
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let trips: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("usage: pingpong ROUND_TRIPS [--wait]"))?;
    mm_probe_workloads::wait_for_go_if_asked(&args);
    let (ping_read, ping_write) = pipe()?;
    let (pong_read, pong_write) = pipe()?;
    let start = Instant::now();
    let echo = std::thread::spawn(move || {
        let mut byte = [0u8; 1];
        for _ in 0..trips {
            // SAFETY: one byte between a live buffer and open pipes.
            unsafe {
                libc::read(ping_read, byte.as_mut_ptr().cast(), 1);
                libc::write(pong_write, byte.as_ptr().cast(), 1);
            }
        }
    });
    serve(ping_write, pong_read, trips);
    echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    println!("{{\"elapsed_ns\":{},\"round_trips\":{trips}}}", start.elapsed().as_nanos());
    Ok(())
}
