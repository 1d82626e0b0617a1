//! A page-fault-heavy (or pageout-heavy) loop for overhead benchmarks: maps fresh anonymous
//! memory with THP off (MADV_NOHUGEPAGE), touches it page by page, and unmaps it, N times.
//! With `--pageout` it instead keeps one mapping and alternates touching it with
//! madvise(MADV_PAGEOUT), which drives madvise_cold_or_pageout_pte_range.
//!
//! Usage: fault_storm MIB ROUNDS [--pageout] [--wait]
//! Prints `{"elapsed_ns":…,"pages":…}`; the fault loop adds `fastest_segment_ns`, the shortest
//! time it took to fault in one 4 MiB segment (1024 faults; see `FastestSegment`). With --wait it first prints
//! its pid and waits for a line on stdin, so a tracer can attach before the timed part.

use std::time::Instant;

use mm_probe_workloads::{FastestSegment, PAGE, map_small_pages, touch_pages};

const SEGMENT: usize = 4 << 20;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: fault_storm MIB ROUNDS [--pageout] [--wait]";
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    let pageout = args.iter().any(|a| a == "--pageout");
    mm_probe_workloads::wait_for_go_if_asked(&args);
    let bytes = mib << 20;
    let start = Instant::now();
    if pageout {
        let pages = pageout_rounds(bytes, rounds)?;
        println!("{{\"elapsed_ns\":{},\"pages\":{pages}}}", start.elapsed().as_nanos());
    } else {
        let fastest = fault_rounds(bytes, rounds)?;
        let elapsed = start.elapsed();
        let pages = rounds * bytes / PAGE;
        println!(
            "{{\"elapsed_ns\":{},\"pages\":{pages},\"fastest_segment_ns\":{}}}",
            elapsed.as_nanos(),
            fastest.nanos()
        );
    }
    Ok(())
}

/// Maps, touches and unmaps `bytes`, `rounds` times, timing the touching 4 MiB at a time.
fn fault_rounds(bytes: usize, rounds: usize) -> anyhow::Result<FastestSegment> {
    let mut segments = FastestSegment::default();
    for _ in 0..rounds {
        let base = map_small_pages(bytes)?;
        for offset in (0..bytes).step_by(SEGMENT) {
            // SAFETY: offset < bytes, and the segment is clipped to the mapping.
            segments.time(|| unsafe { touch_pages(base.add(offset), SEGMENT.min(bytes - offset), 1) });
        }
        // SAFETY: unmapping exactly what map_small_pages() returned.
        unsafe { libc::munmap(base.cast(), bytes) };
    }
    Ok(segments)
}

fn pageout_rounds(bytes: usize, rounds: usize) -> anyhow::Result<usize> {
    let base = map_small_pages(bytes)?;
    for _ in 0..rounds {
        // SAFETY: the mapping just made, `bytes` long.
        unsafe { touch_pages(base, bytes, 1) };
        // SAFETY: advice on our own mapping. MADV_PAGEOUT = 21 (5.4+).
        unsafe { libc::madvise(base.cast(), bytes, 21) };
    }
    Ok(rounds * bytes / PAGE)
}
