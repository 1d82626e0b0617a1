//! Memory for khugepaged to collapse: `thp_collapse MIB EVERY` maps MIB MiB at a 2 MiB-aligned
//! address, madvise(MADV_NOHUGEPAGE)s it so that faults fill it with small pages, writes one byte
//! to every EVERY-th 4 KiB page (1: every page, a dense region; 8: 64 of each 2 MiB's 512 pages,
//! a sparse one), and prints `{"pid":…,"start":…,"len":…,"touched_pages":…}`.
//!
//! Then it reads commands from stdin, one per line, answering each with a JSON line:
//! - `advise`: madvise(MADV_HUGEPAGE) the region, which makes it eligible and puts the process
//!   on khugepaged's list (`{"advised":true}`, or false with the error on a kernel without THP).
//!
//! At the end of stdin it waits until killed.

use std::io::{BufRead as _, Write as _};

use mm_probe_workloads::thp::{MIB, map_aligned_2m, pause_forever};

const PAGE: usize = 4096;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: thp_collapse MIB EVERY";
    let mib: usize = args.next().and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    let every: usize = args.next().and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!(usage))?;
    anyhow::ensure!(mib >= 2 && mib.is_multiple_of(2) && every >= 1, "{usage}: MIB a multiple of 2, EVERY >= 1");
    let len = mib * MIB;
    let start = map_aligned_2m(len)?;
    madvise(start, len, libc::MADV_NOHUGEPAGE)?;
    let mut touched = 0;
    for page in (0..len).step_by(PAGE * every) {
        // SAFETY: inside the read-write mapping made above.
        unsafe { std::ptr::write_volatile((start + page) as *mut u8, 1) };
        touched += 1;
    }
    println!(r#"{{"pid":{},"start":{start},"len":{len},"touched_pages":{touched}}}"#, std::process::id());
    let _ = std::io::stdout().flush();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        match line.trim() {
            "advise" => {
                let result = madvise(start, len, libc::MADV_HUGEPAGE);
                let error = result.as_ref().err().map(|e| format!(r#","error":"{e}""#)).unwrap_or_default();
                println!(r#"{{"advised":{}{error}}}"#, result.is_ok());
            }
            other => println!(r#"{{"error":"unknown command {other}"}}"#),
        }
        let _ = std::io::stdout().flush();
    }
    pause_forever()
}

fn madvise(start: usize, len: usize, advice: libc::c_int) -> anyhow::Result<()> {
    // SAFETY: [start, start + len) lies inside a mapping of this process.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    anyhow::ensure!(rc == 0, "madvise({advice}): {}", std::io::Error::last_os_error());
    Ok(())
}
