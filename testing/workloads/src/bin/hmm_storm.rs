//! hmm_storm: a GPU-driver-style mirror under concurrent invalidations.
//!
//! Maps an anonymous region, asks the hmm_mirror test driver (/dev/hmm_mirror) to mirror it
//! `--iterations` times (each call: insert interval notifiers, hmm_range_fault() retry loop
//! per chunk, remove notifiers), while a thread named `madv-storm` invalidates small pieces of
//! the region in a loop. Prints the driver's own counters, summed over the calls, as one JSON
//! object on stdout, so tests can compare them with what mm-probe saw.
//!
//! `--piece` may list several sizes (`4K,64K,2M`): the storm cycles through them. The driver
//! can act as a device: `--flush-fixed-us` / `--flush-per-page-ns` make each invalidate callback
//! busy-wait like a device TLB flush, `--device-hold-us` makes a device thread hold the lock the
//! callback takes; its flush time, lock waits and holds are printed with the other counts.
//! `--stale-seq` makes the driver read the sequence once per chunk, outside its retry loop (a
//! driver bug): after the first -EBUSY every retry fails until the timeout.
//!
//! Modes that let the kernel's own mechanisms invalidate: `--mode fork` forks a child that
//! waits while the storm thread writes one byte per page of the piece (each write breaks
//! copy-on-write), then kills it; `--collapse` maps the region with small pages and then
//! madvises it MADV_HUGEPAGE, for khugepaged to collapse; `--mergeable` fills every page alike
//! and madvises the region MADV_MERGEABLE, for ksmd to merge. The JSON says how many pages the
//! storm thread wrote after a fork (`cow_writes`). `--mode migrate` moves each piece to the other
//! NUMA node with move_pages(2) (`moved_pages`); `--mode compact` has `sh` compact all memory once
//! the mirror walks, until a page of the region moved (`moved_pages` then counts the region's
//! pages whose frames changed, `compactions` the requests). `--hop-nodes-ms N` moves the mirroring thread
//! to a CPU of the next NUMA node every N ms, so NUMA balancing finds its pages misplaced
//! (`node_hops` in the JSON).
//!
//! Usage: hmm_storm [--size 64M] [--chunk 0|2M] [--notifier 0|2M] [--iterations 5]
//!                  [--duration-ms N] [--timeout-ms 1000]
//!                  [--mode dontneed|remap|mprotect|fork|migrate|compact|none]
//!                  [--piece 64K[,2M…]] [--interval-us 50] [--no-huge] [--device /dev/hmm_mirror]
//!                  [--flush-fixed-us 0] [--flush-per-page-ns 0] [--device-hold-us 0] [--wait]
//!                  [--stale-seq] [--collapse] [--mergeable] [--hop-nodes-ms N]

use std::{
    ffi::CString,
    fs::OpenOptions,
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The invalidating thread's name: tests look for it among the invalidators.
const STORM_COMM: &str = "madv-storm";

/// Mirrors `struct hmm_mirror_walk` of testing/kmod/hmm_mirror/hmm_mirror_uapi.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MirrorWalk {
    addr: u64,
    length: u64,
    chunk_bytes: u64,
    notifier_bytes: u64,
    timeout_ms: u32,
    flags: u32,
    walks: u64,
    busy_returns: u64,
    seq_retries: u64,
    timeouts: u64,
    seq_timeouts: u64,
    invalidations: u64,
    read_begins: u64,
    chunks: u64,
    pages_mirrored: u64,
    elapsed_ns: u64,
    result: i64,
    flush_fixed_us: u32,
    flush_per_page_ns: u32,
    device_hold_us: u32,
    pad: u32,
    flush_ns: u64,
    device_lock_waits: u64,
    device_holds: u64,
}

/// HMM_MIRROR_STALE_SEQ: the sequence is read once, before the retry loop.
const STALE_SEQ: u32 = 1;

/// _IOWR('H', 0x01, struct hmm_mirror_walk)
const HMM_MIRROR_IOC_WALK: u64 = (3 << 30) | ((size_of::<MirrorWalk>() as u64) << 16) | ((b'H' as u64) << 8) | 0x01;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// madvise(MADV_DONTNEED): MMU_NOTIFY_CLEAR.
    DontNeed,
    /// mmap(MAP_FIXED) over a piece, replacing it atomically: MMU_NOTIFY_UNMAP without leaving
    /// a hole a walk could hit (a hole would make hmm_range_fault fail with -EFAULT).
    Remap,
    /// mprotect(PROT_READ) then back: MMU_NOTIFY_PROTECTION_VMA.
    Mprotect,
    /// fork, write every page of the piece while the child lives (copy-on-write), kill it.
    Fork,
    /// move_pages(2) every page of the piece to the other NUMA node (0 and 1): page migration.
    Migrate,
    /// Once the mirror walks, `sh` compacts all memory, again until a page of the whole region
    /// moved (at most 5 times); then nothing. The piece is ignored.
    Compact,
    None,
}

#[derive(Clone, Debug)]
struct Options {
    size_bytes: u64,
    chunk_bytes: u64,
    notifier_bytes: u64,
    iterations: u64,
    duration: Option<Duration>,
    timeout_ms: u32,
    mode: Mode,
    /// Sizes the storm cycles through.
    pieces: Vec<u64>,
    interval: Duration,
    flush_fixed_us: u32,
    flush_per_page_ns: u32,
    device_hold_us: u32,
    device: String,
    /// madvise(MADV_NOHUGEPAGE) the region: 4 KiB pages make every walk visit every PTE, as a
    /// driver mirroring a fragmented buffer does.
    no_huge: bool,
    stale_seq: bool,
    /// Small pages first, then MADV_HUGEPAGE: khugepaged's to collapse.
    collapse: bool,
    /// Every page alike, then MADV_MERGEABLE: ksmd's to merge.
    mergeable: bool,
    /// Move the mirroring thread to the next NUMA node this often.
    hop_nodes: Option<Duration>,
}

fn main() -> Result<()> {
    let options = parse(std::env::args().skip(1).collect())?;
    let page = page_size();
    if options.size_bytes % page != 0
        || options.pieces.iter().any(|&p| p == 0 || p % page != 0 || p > options.size_bytes)
    {
        bail!("--size and --piece must be multiples of the page size ({page}) and --piece <= --size");
    }
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&options.device)
        .with_context(|| format!("opening {} (load hmm_mirror.ko first: insmod hmm_mirror.ko)", options.device))?;
    let region = map_region(options.size_bytes)?;
    if options.no_huge || options.collapse {
        advise(region, options.size_bytes, libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE")?;
    }
    touch(region, options.size_bytes, page);
    if options.collapse {
        advise(region, options.size_bytes, libc::MADV_HUGEPAGE, "MADV_HUGEPAGE")?;
    }
    if options.mergeable {
        advise(region, options.size_bytes, libc::MADV_MERGEABLE, "MADV_MERGEABLE")?;
    }
    mm_probe_workloads::wait_for_go_if_asked(&std::env::args().collect::<Vec<_>>());

    let stop = Arc::new(AtomicBool::new(false));
    let storm_ops = Arc::new(AtomicU64::new(0));
    let storm = {
        let (stop, storm_ops, options) = (stop.clone(), storm_ops.clone(), options.clone());
        thread::Builder::new()
            .name(STORM_COMM.into())
            .spawn(move || invalidate_until(region, &options, &stop, &storm_ops))?
    };
    // Start mirroring only once the storm runs, so every call meets it.
    let waits_for_storm = !matches!(options.mode, Mode::None | Mode::Compact);
    while storm_ops.load(Ordering::Relaxed) == 0 && waits_for_storm && !storm.is_finished() {
        thread::yield_now();
    }

    let started = Instant::now();
    let mut hops = options.hop_nodes.map(NodeHops::new).transpose()?;
    let mut total = MirrorWalk::default();
    let mut calls = 0u64;
    let mut results = Vec::new();
    loop {
        if let Some(hops) = hops.as_mut() {
            hops.hop_when_due()?;
        }
        let mut walk = MirrorWalk {
            addr: region as u64,
            length: options.size_bytes,
            chunk_bytes: options.chunk_bytes,
            notifier_bytes: options.notifier_bytes,
            timeout_ms: options.timeout_ms,
            flags: if options.stale_seq { STALE_SEQ } else { 0 },
            flush_fixed_us: options.flush_fixed_us,
            flush_per_page_ns: options.flush_per_page_ns,
            device_hold_us: options.device_hold_us,
            ..MirrorWalk::default()
        };
        // SAFETY: the request is a valid MirrorWalk that lives across the call.
        let rc = unsafe { libc::ioctl(device.as_raw_fd(), HMM_MIRROR_IOC_WALK as _, &mut walk) };
        if rc != 0 {
            stop.store(true, Ordering::Relaxed);
            let err = std::io::Error::last_os_error();
            bail!("HMM_MIRROR_IOC_WALK failed: {err}");
        }
        eprintln!(
            "hmm_storm: call {calls}: walks {} busy {} seq_retries {} timeouts {} invalidations {} elapsed {:.1} ms result {}",
            walk.walks,
            walk.busy_returns,
            walk.seq_retries,
            walk.timeouts,
            walk.invalidations,
            walk.elapsed_ns as f64 / 1e6,
            walk.result
        );
        accumulate(&mut total, &walk);
        WALKING.store(true, Ordering::Relaxed);
        results.push(walk.result);
        calls += 1;
        let done = match options.duration {
            Some(limit) => started.elapsed() >= limit,
            None => calls >= options.iterations,
        };
        if done {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    storm.join().map_err(|_| anyhow::anyhow!("the {STORM_COMM} thread panicked"))??;

    let failed_calls = results.iter().filter(|&&r| r != 0).count();
    println!(
        "{{\"tgid\":{},\"storm_comm\":\"{STORM_COMM}\",\"mode\":\"{:?}\",\"size_bytes\":{},\"chunk_bytes\":{},\
\"notifier_bytes\":{},\"timeout_ms\":{},\"calls\":{calls},\"failed_calls\":{failed_calls},\"walks\":{},\
\"busy_returns\":{},\"seq_retries\":{},\"timeouts\":{},\"seq_timeouts\":{},\"invalidations\":{},\
\"read_begins\":{},\"chunks\":{},\"elapsed_ns\":{},\"storm_ops\":{},\"wall_ns\":{},\"flush_ns\":{},\
\"device_lock_waits\":{},\"device_holds\":{},\"stale_seq\":{},\"cow_writes\":{},\"node_hops\":{},\"moved_pages\":{},\"compactions\":{}}}",
        std::process::id(),
        options.mode,
        options.size_bytes,
        options.chunk_bytes,
        options.notifier_bytes,
        options.timeout_ms,
        total.walks,
        total.busy_returns,
        total.seq_retries,
        total.timeouts,
        total.seq_timeouts,
        total.invalidations,
        total.read_begins,
        total.chunks,
        total.elapsed_ns,
        storm_ops.load(Ordering::Relaxed),
        started.elapsed().as_nanos(),
        total.flush_ns,
        total.device_lock_waits,
        total.device_holds,
        options.stale_seq,
        COW_WRITES.load(Ordering::Relaxed),
        hops.map_or(0, |h| h.done),
        MOVED_PAGES.load(Ordering::Relaxed),
        COMPACTIONS.load(Ordering::Relaxed),
    );
    Ok(())
}

/// The mirroring thread's moves between NUMA nodes: one CPU per node that has any.
struct NodeHops {
    cpus: Vec<usize>,
    every: Duration,
    last: Option<Instant>,
    done: u64,
}

impl NodeHops {
    fn new(every: Duration) -> Result<Self> {
        let cpus = first_cpu_of_each_node()?;
        if cpus.len() < 2 {
            bail!("--hop-nodes-ms needs two NUMA nodes with CPUs; this machine has {}", cpus.len());
        }
        Ok(Self { cpus, every, last: None, done: 0 })
    }

    fn hop_when_due(&mut self) -> Result<()> {
        if self.last.is_some_and(|at| at.elapsed() < self.every) {
            return Ok(());
        }
        let cpu = self.cpus[self.done as usize % self.cpus.len()];
        mm_probe_workloads::pin_to_cpu(cpu)?;
        self.last = Some(Instant::now());
        self.done += 1;
        Ok(())
    }
}

/// From /sys/devices/system/node/node*/cpulist ("0-3,8"): the first CPU of each node.
fn first_cpu_of_each_node() -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for entry in std::fs::read_dir("/sys/devices/system/node").context("reading /sys/devices/system/node")? {
        let path = entry?.path().join("cpulist");
        let Ok(list) = std::fs::read_to_string(&path) else { continue };
        let first = list.trim().split([',', '-']).next().unwrap_or("");
        if let Ok(cpu) = first.parse() {
            cpus.push(cpu);
        }
    }
    cpus.sort_unstable();
    Ok(cpus)
}

fn accumulate(total: &mut MirrorWalk, walk: &MirrorWalk) {
    total.walks += walk.walks;
    total.busy_returns += walk.busy_returns;
    total.seq_retries += walk.seq_retries;
    total.timeouts += walk.timeouts;
    total.seq_timeouts += walk.seq_timeouts;
    total.invalidations += walk.invalidations;
    total.read_begins += walk.read_begins;
    total.chunks += walk.chunks;
    total.elapsed_ns += walk.elapsed_ns;
    total.flush_ns += walk.flush_ns;
    total.device_lock_waits += walk.device_lock_waits;
    total.device_holds += walk.device_holds;
}

/// The invalidating thread: one piece per step, spread over the region by a fixed LCG so
/// every run invalidates the same sequence of pieces.
fn invalidate_until(region: usize, options: &Options, stop: &AtomicBool, ops: &AtomicU64) -> Result<()> {
    set_comm(STORM_COMM)?;
    if options.mode == Mode::Compact {
        return compact_once_walking(region, options.size_bytes as usize, stop, ops);
    }
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    for step in 0.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let piece_bytes = options.pieces[step % options.pieces.len()];
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let piece = (state >> 33) % (options.size_bytes / piece_bytes);
        let addr = region + (piece * piece_bytes) as usize;
        invalidate(addr, piece_bytes as usize, options.mode)?;
        ops.fetch_add(1, Ordering::Relaxed);
        if !options.interval.is_zero() {
            thread::sleep(options.interval);
        }
    }
    Ok(())
}

fn invalidate(addr: usize, len: usize, mode: Mode) -> Result<()> {
    let ptr = addr as *mut libc::c_void;
    // SAFETY: [addr, addr+len) lies inside the region this process mapped and never unmaps
    // for good (remap replaces it in place).
    let rc = unsafe {
        match mode {
            Mode::DontNeed => libc::madvise(ptr, len, libc::MADV_DONTNEED),
            Mode::Remap => {
                let p = libc::mmap(
                    ptr,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED { -1 } else { 0 }
            }
            Mode::Mprotect => {
                let rc = libc::mprotect(ptr, len, libc::PROT_READ);
                if rc != 0 { rc } else { libc::mprotect(ptr, len, libc::PROT_READ | libc::PROT_WRITE) }
            }
            Mode::Fork => return write_while_forked(addr, len),
            Mode::Migrate => return move_to_the_other_node(addr, len),
            Mode::Compact => return Ok(()),
            Mode::None => 0,
        }
    };
    if rc != 0 {
        bail!("{mode:?} on {addr:#x}+{len}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn advise(region: usize, size: u64, advice: libc::c_int, name: &str) -> Result<()> {
    // SAFETY: the region was mapped with this length and is never unmapped.
    if unsafe { libc::madvise(region as *mut libc::c_void, size as usize, advice) } != 0 {
        bail!("madvise({name}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pages the storm thread moved to another node, or that compaction moved to another frame.
static MOVED_PAGES: AtomicU64 = AtomicU64::new(0);
/// Set once the mirror has walked: compaction waits for it, so that the tool watches the mm.
static WALKING: AtomicBool = AtomicBool::new(false);
/// Compactions `sh` was asked for.
static COMPACTIONS: AtomicU64 = AtomicU64::new(0);

/// Once the mirror walks, has another process compact all memory until a page of the region
/// moved (at most [`mm_probe_workloads::COMPACTIONS`] times).
fn compact_once_walking(region: usize, bytes: usize, stop: &AtomicBool, ops: &AtomicU64) -> Result<()> {
    while !WALKING.load(Ordering::Relaxed) {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(10));
    }
    let (asked, moved) = mm_probe_workloads::compact_from_another_process(region, bytes)?;
    COMPACTIONS.store(asked, Ordering::Relaxed);
    MOVED_PAGES.store(moved, Ordering::Relaxed);
    ops.fetch_add(asked, Ordering::Relaxed);
    Ok(())
}

/// Asks where the piece's pages are, then moves each page not on the other node (1 if its first
/// page is on 0, else 0) there with move_pages(2), counting the pages that arrived.
fn move_to_the_other_node(addr: usize, len: usize) -> Result<()> {
    let page = page_size() as usize;
    let pages: Vec<*mut libc::c_void> = (addr..addr + len).step_by(page).map(|a| a as *mut libc::c_void).collect();
    let mut before = vec![-1i32; pages.len()];
    move_pages(&pages, None, &mut before)?;
    let target = if before[0] == 0 { 1 } else { 0 };
    let mut after = vec![-1i32; pages.len()];
    move_pages(&pages, Some(&vec![target; pages.len()]), &mut after)?;
    let moved = before.iter().zip(&after).filter(|&(&b, &a)| b >= 0 && b != target && a == target).count();
    MOVED_PAGES.fetch_add(moved as u64, Ordering::Relaxed);
    Ok(())
}

/// include/uapi/linux/mempolicy.h: move the pages this process maps alone.
const MPOL_MF_MOVE: libc::c_int = 1 << 1;

/// move_pages(2) on this process: with `nodes`, moves `pages` there; without, only says where
/// they are. Per page, `status` is its node or a negative errno.
fn move_pages(pages: &[*mut libc::c_void], nodes: Option<&[i32]>, status: &mut [i32]) -> Result<()> {
    let nodes = nodes.map_or(std::ptr::null(), |n| n.as_ptr());
    // SAFETY: the arrays hold pages.len() entries each and outlive the call; pid 0 is this process.
    let rc = unsafe {
        libc::syscall(libc::SYS_move_pages, 0, pages.len(), pages.as_ptr(), nodes, status.as_mut_ptr(), MPOL_MF_MOVE)
    };
    if rc < 0 {
        bail!("move_pages: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pages the storm thread wrote while a child shared them: each write copied its page.
static COW_WRITES: AtomicU64 = AtomicU64::new(0);

/// Forks a child that only waits, writes one byte per page of [addr, addr+len) while the child
/// still maps them (each write breaks copy-on-write: the kernel copies the page and
/// invalidates the old one), then kills and reaps the child.
fn write_while_forked(addr: usize, len: usize) -> Result<()> {
    // SAFETY: the child calls only async-signal-safe functions (pause, _exit).
    let child = unsafe { libc::fork() };
    if child < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if child == 0 {
        loop {
            // SAFETY: pause has no preconditions; the parent kills this child.
            unsafe { libc::pause() };
        }
    }
    let page = page_size() as usize;
    for offset in (0..len).step_by(page) {
        // SAFETY: inside the region, which is writable.
        unsafe { std::ptr::write_volatile((addr + offset) as *mut u8, 2) };
        COW_WRITES.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: kill and waitpid on our own child.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    Ok(())
}

fn map_region(size: u64) -> Result<usize> {
    // SAFETY: a fresh anonymous mapping; the kernel picks the address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        bail!("mmap of {size} bytes: {}", std::io::Error::last_os_error());
    }
    Ok(ptr as usize)
}

/// Writes one byte per page so the first walk finds real pages, as a GPU driver usually does.
fn touch(region: usize, size: u64, page: u64) {
    for offset in (0..size).step_by(page as usize) {
        // SAFETY: inside the mapping just created, which is writable.
        unsafe { std::ptr::write_volatile((region + offset as usize) as *mut u8, 1) };
    }
}

fn set_comm(name: &str) -> Result<()> {
    let name = CString::new(name)?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) } != 0 {
        bail!("prctl(PR_SET_NAME): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

fn parse(args: Vec<String>) -> Result<Options> {
    let mut options = Options {
        size_bytes: 64 << 20,
        chunk_bytes: 0,
        notifier_bytes: 0,
        iterations: 5,
        duration: None,
        timeout_ms: 1000,
        mode: Mode::DontNeed,
        pieces: vec![64 << 10],
        interval: Duration::from_micros(50),
        flush_fixed_us: 0,
        flush_per_page_ns: 0,
        device_hold_us: 0,
        device: "/dev/hmm_mirror".into(),
        no_huge: false,
        stale_seq: false,
        collapse: false,
        mergeable: false,
        hop_nodes: None,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--size" => options.size_bytes = mm_probe_workloads::parse_bytes(&value()?)?,
            "--chunk" => options.chunk_bytes = mm_probe_workloads::parse_bytes(&value()?)?,
            "--notifier" => options.notifier_bytes = mm_probe_workloads::parse_bytes(&value()?)?,
            "--iterations" => options.iterations = value()?.parse()?,
            "--duration-ms" => options.duration = Some(Duration::from_millis(value()?.parse()?)),
            "--timeout-ms" => options.timeout_ms = value()?.parse()?,
            "--piece" => {
                options.pieces = value()?.split(',').map(mm_probe_workloads::parse_bytes).collect::<Result<Vec<_>>>()?
            }
            "--flush-fixed-us" => options.flush_fixed_us = value()?.parse()?,
            "--flush-per-page-ns" => options.flush_per_page_ns = value()?.parse()?,
            "--device-hold-us" => options.device_hold_us = value()?.parse()?,
            "--interval-us" => options.interval = Duration::from_micros(value()?.parse()?),
            "--device" => options.device = value()?,
            "--no-huge" => options.no_huge = true,
            "--stale-seq" => options.stale_seq = true,
            "--collapse" => options.collapse = true,
            "--mergeable" => options.mergeable = true,
            "--hop-nodes-ms" => options.hop_nodes = Some(Duration::from_millis(value()?.parse()?)),
            // Handled in main: pid first, then a line on stdin before any walk (benchmarks).
            "--wait" => {}
            "--mode" => {
                options.mode = match value()?.as_str() {
                    "dontneed" => Mode::DontNeed,
                    "remap" | "munmap" => Mode::Remap,
                    "mprotect" => Mode::Mprotect,
                    "fork" => Mode::Fork,
                    "migrate" => Mode::Migrate,
                    "compact" => Mode::Compact,
                    "none" => Mode::None,
                    other => {
                        bail!("unknown --mode {other}: use dontneed, remap, mprotect, fork, migrate, compact or none")
                    }
                }
            }
            other => bail!("unknown argument {other}; see the usage at the top of hmm_storm.rs"),
        }
    }
    if options.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    Ok(options)
}
