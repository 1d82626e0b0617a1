//! One anonymous region that should be entirely in huge pages: `thp_huge MIB` maps MIB MiB at a
//! 2 MiB-aligned address, madvise(MADV_HUGEPAGE)s it (eligible under enabled=madvise and
//! enabled=always), touches every 4 KiB page, prints `{"pid":…,"start":…,"len":…,"advised":…}`
//! and waits until killed.
//!
//! On a kernel without THP madvise(MADV_HUGEPAGE) fails with EINVAL: the region is still mapped
//! and touched, and the line says `"advised":false`.

use std::io::Write as _;

use mm_probe_workloads::thp::{MIB, map_aligned_2m, pause_forever};

fn main() -> anyhow::Result<()> {
    let mib: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse().map_err(|_| anyhow::anyhow!("usage: thp_huge MIB (got {arg})"))?,
        None => 64,
    };
    anyhow::ensure!(mib >= 2 && mib.is_multiple_of(2), "thp_huge: the size must be a positive multiple of 2 MiB");
    let len = mib * MIB;
    let start = map_aligned_2m(len)?;
    // SAFETY: [start, start + len) lies inside the mapping just made.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    let error = std::io::Error::last_os_error();
    anyhow::ensure!(rc == 0 || error.raw_os_error() == Some(libc::EINVAL), "madvise: {error}");
    for page in (0..len).step_by(4096) {
        // SAFETY: inside a read-write mapping of this process.
        unsafe { std::ptr::write_volatile((start + page) as *mut u8, 1) };
    }
    println!(r#"{{"pid":{},"start":{start},"len":{len},"advised":{}}}"#, std::process::id(), rc == 0);
    let _ = std::io::stdout().flush();
    pause_forever()
}
