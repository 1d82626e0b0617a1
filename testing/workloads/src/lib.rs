//! Shared bits of the test workloads. Each workload is one binary under `src/bin/`, named for
//! what it makes the kernel do; the end-to-end tests find them next to their own executable.
pub mod kvm;
pub mod thp;

/// Times consecutive segments of a benchmark loop and keeps the fastest. Interference from the
/// rest of a shared machine only ever adds time (it varies whole runs by ±10 % on the
/// development VM), while a run's fastest segment of page faults varies by about 1 %: it shows
/// what the loop costs, with and without a tracer. Only for loops that run at one speed.
#[derive(Default)]
pub struct FastestSegment {
    fastest: Option<std::time::Duration>,
}

impl FastestSegment {
    pub fn time<R>(&mut self, segment: impl FnOnce() -> R) -> R {
        let started = std::time::Instant::now();
        let result = segment();
        let took = started.elapsed();
        self.fastest = Some(self.fastest.map_or(took, |f| f.min(took)));
        result
    }

    pub fn nanos(&self) -> u128 {
        self.fastest.unwrap_or_default().as_nanos()
    }
}

/// With `--wait` among the arguments: prints this process's pid and waits for a line on stdin,
/// so a benchmark can attach a tracer to a workload that has not started yet.
pub fn wait_for_go_if_asked(args: &[String]) {
    if args.iter().any(|a| a == "--wait") {
        println!("{}", std::process::id());
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
}

pub const PAGE: usize = 4096;

/// A fresh anonymous private mapping of `bytes` with THP off (MADV_NOHUGEPAGE): every 4 KiB
/// page faults on its own, and every 2 MiB is walked PTE by PTE.
pub fn map_small_pages(bytes: usize) -> anyhow::Result<*mut u8> {
    let addr = map_anonymous(bytes)?;
    // SAFETY: advice on the range just mapped.
    unsafe { libc::madvise(addr.cast(), bytes, libc::MADV_NOHUGEPAGE) };
    Ok(addr)
}

/// A fresh anonymous private read-write mapping of `bytes`, zeroed.
pub fn map_anonymous(bytes: usize) -> anyhow::Result<*mut u8> {
    // SAFETY: an anonymous mapping with no address hint; checked for MAP_FAILED.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    anyhow::ensure!(addr != libc::MAP_FAILED, "mmap {bytes} bytes: {}", std::io::Error::last_os_error());
    Ok(addr.cast())
}

/// Writes `value` to the first byte of every page of `base..base+bytes` (a fault for each page
/// not present).
///
/// # Safety
/// `base..base+bytes` must be a writable mapping of this process, such as one from
/// [`map_small_pages`].
pub unsafe fn touch_pages(base: *mut u8, bytes: usize, value: u8) {
    for offset in (0..bytes).step_by(PAGE) {
        // SAFETY: offset < bytes, inside the caller's mapping.
        unsafe { base.add(offset).write_volatile(value) };
    }
}

/// Pins the calling thread (and the threads it creates later) to one CPU.
pub fn pin_to_cpu(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: the cpu_set_t is zeroed then filled with CPU_SET; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            anyhow::bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `64M`, `2M`, `64K`, `4096`, `0`.
pub fn parse_bytes(text: &str) -> anyhow::Result<u64> {
    let (number, multiplier) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value: u64 = number.parse().map_err(|_| anyhow::anyhow!("{text:?} is not a size like 64M, 2M, 64K or 4096"))?;
    Ok(value * multiplier)
}

/// The page frame of each page of [addr, addr + bytes) (0 where not present), from
/// /proc/self/pagemap: 8 bytes per page, the frame in bits 0–54, bit 63 set when present (frames
/// need root). Comparing two readings tells which pages the kernel moved.
pub fn page_frames(addr: usize, bytes: usize) -> anyhow::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt as _;

    use anyhow::Context as _;
    let mut raw = vec![0u8; bytes / 4096 * 8];
    let pagemap = std::fs::File::open("/proc/self/pagemap").context("opening /proc/self/pagemap")?;
    pagemap.read_exact_at(&mut raw, (addr as u64 / 4096) * 8).context("reading /proc/self/pagemap")?;
    let entry = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
    Ok(raw.chunks(8).map(entry).map(|e| if e >> 63 == 1 { e & ((1 << 55) - 1) } else { 0 }).collect())
}

/// How many times compaction is asked for at most, until it has moved a page of the region.
pub const COMPACTIONS: u64 = 5;

/// Has `sh`, another process, compact all memory while [addr, addr + bytes) is mapped, again
/// until one of its pages moved (compaction picks its blocks; it may leave the region alone).
/// Returns the compactions asked for and the region's pages that moved, as their page frames say.
pub fn compact_from_another_process(addr: usize, bytes: usize) -> anyhow::Result<(u64, u64)> {
    use anyhow::Context as _;
    let mut moved = 0;
    for compaction in 1..=COMPACTIONS {
        let before = page_frames(addr, bytes)?;
        let status = std::process::Command::new("sh")
            .args(["-c", "echo 1 > /proc/sys/vm/compact_memory"])
            .status()
            .context("running sh to write /proc/sys/vm/compact_memory")?;
        if !status.success() {
            anyhow::bail!("writing /proc/sys/vm/compact_memory failed: {status}");
        }
        let after = page_frames(addr, bytes)?;
        moved += before.iter().zip(&after).filter(|(b, a)| b != a).count() as u64;
        if moved > 0 {
            return Ok((compaction, moved));
        }
    }
    Ok((COMPACTIONS, moved))
}
