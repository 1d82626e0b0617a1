//! Maps anonymous regions that the THP allow-check judges differently, touches every page, and
//! waits. Each round maps five regions at 2 MiB-aligned places of a PROT_NONE reservation, with a
//! never-touched guard between them, so every 2 MiB range a region overlaps has no page table
//! before its first touch: the first fault there makes exactly one PMD-level allow-check.
//!
//!   advised    4 MiB, MADV_HUGEPAGE                  eligible
//!   plain      4 MiB, no advice                      eligible only if enabled=always
//!   nohuge     4 MiB, MADV_NOHUGEPAGE                refused (VM_NOHUGEPAGE)
//!   small      1 MiB, MADV_HUGEPAGE                  too small for a 2 MiB page
//!   unaligned  2.5 MiB at 1 MiB past 2 MiB, MADV_HUGEPAGE   no aligned 2 MiB window
//!
//! Prints one JSON line per round (`{"pid":…,"round":…,"regions":[…]}`), then reads commands
//! from stdin: `round` (map and touch another round), `prctl-disable`, `prctl-except-advised`,
//! `prctl-enable` (prctl(PR_SET_THP_DISABLE) on itself), `exit`. At end of input it waits until
//! killed.
//!
//! Options: `--prctl-disable` / `--prctl-except-advised` before the first round.
//!
//! On a kernel without THP (CONFIG_TRANSPARENT_HUGEPAGE off, as in Debian's PREEMPT_RT builds)
//! madvise(MADV_[NO]HUGEPAGE) fails with EINVAL; the region is still mapped and touched, and its
//! line says `"advised":false`.

use std::io::{BufRead as _, Write as _};

use mm_probe_workloads::thp::{MIB, PrctlMode, pause_forever, set_thp_disable};

const ROUND_BYTES: usize = 32 * MIB;
const MAX_ROUNDS: usize = 8;

struct Region {
    name: &'static str,
    offset: usize,
    len: usize,
    advice: Option<libc::c_int>,
}

/// One round's layout inside its 32 MiB block (offsets from a 2 MiB-aligned block start).
const LAYOUT: &[Region] = &[
    Region { name: "advised", offset: 2 * MIB, len: 4 * MIB, advice: Some(libc::MADV_HUGEPAGE) },
    Region { name: "plain", offset: 8 * MIB, len: 4 * MIB, advice: None },
    Region { name: "nohuge", offset: 14 * MIB, len: 4 * MIB, advice: Some(libc::MADV_NOHUGEPAGE) },
    Region { name: "small", offset: 20 * MIB, len: MIB, advice: Some(libc::MADV_HUGEPAGE) },
    Region { name: "unaligned", offset: 25 * MIB, len: 5 * MIB / 2, advice: Some(libc::MADV_HUGEPAGE) },
];

/// 2 MiB ranges [start, start+len) overlaps.
fn pmd_ranges(start: usize, len: usize) -> usize {
    let first = start / (2 * MIB);
    let last = (start + len - 1) / (2 * MIB);
    last - first + 1
}

fn reserve() -> anyhow::Result<usize> {
    let len = ROUND_BYTES * MAX_ROUNDS + 2 * MIB;
    // SAFETY: a fresh anonymous PROT_NONE mapping; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    anyhow::ensure!(base != libc::MAP_FAILED, "mmap reservation: {}", std::io::Error::last_os_error());
    Ok((base as usize + 2 * MIB - 1) & !(2 * MIB - 1))
}

fn map_round(block: usize) -> anyhow::Result<Vec<(usize, &'static Region, bool)>> {
    let mut mapped = Vec::new();
    for region in LAYOUT {
        let start = block + region.offset;
        // SAFETY: MAP_FIXED replaces part of this process's own PROT_NONE reservation.
        let addr = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                region.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        anyhow::ensure!(addr as usize == start, "mmap {}: {}", region.name, std::io::Error::last_os_error());
        let mut advised = false;
        if let Some(advice) = region.advice {
            // SAFETY: the range was just mapped.
            let rc = unsafe { libc::madvise(addr, region.len, advice) };
            let error = std::io::Error::last_os_error();
            let no_thp = rc != 0 && error.raw_os_error() == Some(libc::EINVAL);
            anyhow::ensure!(rc == 0 || no_thp, "madvise {}: {error}", region.name);
            advised = rc == 0;
        }
        mapped.push((start, region, advised));
    }
    // Touch after all are mapped and advised, one write per 4 KiB page.
    for &(start, region, _) in &mapped {
        for page in (0..region.len).step_by(4096) {
            // SAFETY: inside a read-write mapping of this process.
            unsafe { std::ptr::write_volatile((start + page) as *mut u8, 1) };
        }
    }
    Ok(mapped)
}

fn report(round: usize, mapped: &[(usize, &Region, bool)]) {
    let regions: Vec<String> = mapped
        .iter()
        .map(|(start, r, advised)| {
            format!(
                r#"{{"name":"{}","start":{},"len":{},"pmd_ranges":{},"advised":{}}}"#,
                r.name,
                start,
                r.len,
                pmd_ranges(*start, r.len),
                advised
            )
        })
        .collect();
    println!(r#"{{"pid":{},"round":{round},"regions":[{}]}}"#, std::process::id(), regions.join(","));
    let _ = std::io::stdout().flush();
}

fn main() -> anyhow::Result<()> {
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--prctl-disable" => set_thp_disable(PrctlMode::Disable)?,
            "--prctl-except-advised" => set_thp_disable(PrctlMode::ExceptAdvised)?,
            other => anyhow::bail!("unknown option {other}"),
        }
    }
    let base = reserve()?;
    let mut round = 0;
    report(round, &map_round(base)?);
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let reply = match line.trim() {
            "round" => {
                round += 1;
                anyhow::ensure!(round < MAX_ROUNDS, "only {MAX_ROUNDS} rounds fit in the reservation");
                report(round, &map_round(base + round * ROUND_BYTES)?);
                continue;
            }
            "prctl-disable" => set_thp_disable(PrctlMode::Disable),
            "prctl-except-advised" => set_thp_disable(PrctlMode::ExceptAdvised),
            "prctl-enable" => set_thp_disable(PrctlMode::Enable),
            "exit" => return Ok(()),
            "" => continue,
            other => Err(anyhow::anyhow!("unknown command {other}")),
        };
        match reply {
            Ok(()) => println!(r#"{{"pid":{},"done":"{}"}}"#, std::process::id(), line.trim()),
            Err(e) => println!(r#"{{"pid":{},"error":"{e}"}}"#, std::process::id()),
        }
        let _ = std::io::stdout().flush();
    }
    pause_forever()
}
