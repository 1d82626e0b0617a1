//! kvm_storm: MMU-notifier invalidations of a KVM guest's memory, with or without the vCPU
//! faults and dirty logging that contend with them on kvm->mmu_lock.
//!
//! Creates a VM whose data memslot is `--size` of anonymous memory, then runs `--threads`
//! threads named `kvm-madv`, each pinned to its own CPU, that madvise(MADV_DONTNEED) the
//! memslot `--chunk` bytes at a time (thread t takes chunks t, t+N, …) for `--passes` passes.
//! Every such madvise is one invalidation of a range KVM maps, so one kvm_unmap_hva_range.
//! `--vcpus N` adds vCPU threads (`kvm-vcpu`) whose guest writes every page of the memslot in a
//! loop (each page the madvise took faults again, on mmu_lock), `--dirty-log` a thread
//! (`kvm-dirty`) fetching the memslot's dirty log in a loop. Prints its own counts as one JSON
//! object: {"pid", "madvise_calls", "madvise_bytes", "vcpu_passes", "dirty_log_calls",
//! "elapsed_ns"}.
//!
//! `--fifo` runs the invalidating threads and vCPUs SCHED_FIFO, so that they overlap on a busy
//! machine (give them no more threads than CPUs).
//!
//! `--call mprotect` invalidates with mprotect instead: each chunk made read-only, then writable
//! again (`mprotect_calls` counts both). mprotect only invalidates what is mapped, so the
//! memslot is written first. `--compact` then has another process (`sh`) write
//! /proc/sys/vm/compact_memory while the VM's memory is still mapped, until compaction has moved
//! a page of it (`compactions`, at most 5; `pages_moved` as /proc/self/pagemap's frames say):
//! each migration is an invalidation of the VM's memory made by that process.
//!
//! `--collapse` then makes the memslot eligible for huge pages (MADV_HUGEPAGE) and has another
//! process (`remote_madvise`, beside this binary) collapse it with process_madvise(2)
//! MADV_COLLAPSE, as a VMM's helper would: each collapse is an invalidation of the VM's memory
//! made by that process inside a syscall (`collapser_pid`, and `huge_bytes`: the memslot's
//! AnonHugePages after it).
//!
//! `--idle-ms N` leaves the VM idle for N ms, its memory mapped, before the storm (with
//! `--passes 0`, an idle VM and nothing else). `--hold` keeps the VM, its memory mapped, after
//! its counts are printed, until stdin closes: VMs that must all be alive at once stay so
//! however the machine schedules their storms.
//!
//! Usage: kvm_storm [--size 64M] [--chunk 4K] [--threads 1] [--passes 20] [--vcpus 0]
//!                  [--call madvise|mprotect] [--compact] [--collapse] [--dirty-log] [--fifo] [--wait]
//!                  [--idle-ms 0] [--hold]

use std::{
    io::Read as _,
    sync::{
        Arc, Barrier,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use mm_probe_workloads::{kvm::Vm, parse_bytes, pin_to_cpu};

#[derive(Clone, Debug)]
struct Options {
    size_bytes: usize,
    chunk_bytes: usize,
    threads: usize,
    passes: u64,
    vcpus: u32,
    dirty_log: bool,
    /// Run the invalidating threads and the vCPUs SCHED_FIFO, each pinned to its own CPU: on a
    /// loaded machine they then still run at the same time, which contention needs.
    fifo: bool,
    call: Call,
    compact: bool,
    collapse: bool,
    idle: Duration,
    hold: bool,
}

/// The call that invalidates each chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Madvise,
    Mprotect,
}

/// How long the vCPUs' first pass may take (milliseconds on the host, seconds under nested
/// emulation) before the workload gives up rather than waits for ever.
const FIRST_PASS_LIMIT: Duration = Duration::from_secs(120);

fn main() -> Result<()> {
    let options = parse(std::env::args().skip(1).collect())?;
    let vm = Arc::new(Vm::create(options.size_bytes, options.dirty_log)?);
    if options.call == Call::Mprotect || options.compact || options.collapse || !options.idle.is_zero() {
        populate(&vm)?;
    }
    mm_probe_workloads::wait_for_go_if_asked(&std::env::args().collect::<Vec<_>>());
    thread::sleep(options.idle);
    let stop = Arc::new(AtomicBool::new(false));
    let vcpu_passes = Arc::new(AtomicU64::new(0));
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let dirty_log_calls = Arc::new(AtomicU64::new(0));
    let mut background = Vec::new();
    for id in 0..options.vcpus {
        let mut vcpu = vm.create_vcpu(id)?;
        let (stop, passes, fifo) = (stop.clone(), vcpu_passes.clone(), options.fifo);
        // vCPUs take the CPUs after the invalidating threads' (which take 0, 1, …).
        let cpu = (options.threads + id as usize) % cpus;
        background.push(thread::Builder::new().name("kvm-vcpu".into()).spawn(move || -> Result<()> {
            if fifo {
                pin_to_cpu(cpu)?;
                set_fifo()?;
            }
            while !stop.load(Ordering::Relaxed) {
                if vcpu.run_once()? {
                    passes.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        })?);
    }
    if options.dirty_log {
        let (vm, stop, calls) = (vm.clone(), stop.clone(), dirty_log_calls.clone());
        background.push(thread::Builder::new().name("kvm-dirty".into()).spawn(move || -> Result<()> {
            let mut bitmap = vec![0u64; vm.dirty_bitmap_words()];
            while !stop.load(Ordering::Relaxed) {
                vm.fetch_dirty_log(&mut bitmap)?;
                calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })?);
    }
    // With vCPUs, wait for the guest's first pass: every page is then mapped in KVM, so the
    // madvise threads meet a populated secondary MMU from their first call.
    let waiting_since = Instant::now();
    while options.vcpus > 0 && vcpu_passes.load(Ordering::Relaxed) == 0 {
        if background.iter().any(|t| t.is_finished()) {
            break;
        }
        if waiting_since.elapsed() > FIRST_PASS_LIMIT {
            bail!("the vCPUs made no pass over the memslot in {FIRST_PASS_LIMIT:?}: the guest does not run here");
        }
        thread::sleep(Duration::from_millis(1));
    }
    let started = Instant::now();
    // All start together: contention needs them to overlap, even on a loaded machine.
    let start_line = Arc::new(Barrier::new(options.threads));
    let invalidators: Vec<_> = (0..options.threads)
        .map(|index| {
            let (vm, options, start_line) = (vm.clone(), options.clone(), start_line.clone());
            thread::Builder::new()
                .name("kvm-madv".into())
                .spawn(move || invalidate(&vm, &options, index, index % cpus, &start_line))
                .context("starting an invalidating thread")
        })
        .collect::<Result<_>>()?;
    let mut calls = 0u64;
    for thread in invalidators {
        calls += thread.join().map_err(|_| anyhow::anyhow!("an invalidating thread panicked"))??;
    }
    let elapsed_ns = started.elapsed().as_nanos();
    let (compactions, pages_moved) = if options.compact {
        mm_probe_workloads::compact_from_another_process(vm.data as usize, vm.data_bytes)?
    } else {
        (0, 0)
    };
    let (collapser_pid, huge_bytes) = if options.collapse { collapse_by_another_process(&vm)? } else { (0, 0) };
    stop.store(true, Ordering::Relaxed);
    for thread in background {
        thread.join().map_err(|_| anyhow::anyhow!("a vCPU or dirty-log thread panicked"))??;
    }
    let (madvise_calls, mprotect_calls) = if options.call == Call::Madvise { (calls, 0) } else { (0, calls) };
    println!(
        "{{\"pid\":{},\"madvise_calls\":{madvise_calls},\"madvise_bytes\":{},\"mprotect_calls\":{mprotect_calls},\"compactions\":{compactions},\"pages_moved\":{pages_moved},\"collapser_pid\":{collapser_pid},\"huge_bytes\":{huge_bytes},\"vcpu_passes\":{},\"dirty_log_calls\":{},\"elapsed_ns\":{elapsed_ns}}}",
        std::process::id(),
        madvise_calls * options.chunk_bytes as u64,
        vcpu_passes.load(Ordering::Relaxed),
        dirty_log_calls.load(Ordering::Relaxed),
    );
    if options.hold {
        // Ends when the test closes our stdin; what it sends meanwhile is not read as anything.
        std::io::stdin().read_to_end(&mut Vec::new()).context("holding the VM until stdin closes")?;
    }
    Ok(())
}

/// One invalidating thread's passes over its share of the memslot; returns its madvise calls.
fn invalidate(vm: &Vm, options: &Options, index: usize, cpu: usize, start_line: &Barrier) -> Result<u64> {
    pin_to_cpu(cpu)?;
    if options.fifo {
        set_fifo()?;
    }
    start_line.wait();
    let chunks = vm.data_bytes / options.chunk_bytes;
    let mut calls = 0;
    for _ in 0..options.passes {
        for chunk in (index..chunks).step_by(options.threads) {
            // SAFETY: the chunk lies inside the data memslot's mapping, which lives until exit.
            let addr = unsafe { vm.data.add(chunk * options.chunk_bytes) };
            calls += invalidate_chunk(options.call, addr, options.chunk_bytes)?;
        }
    }
    Ok(calls)
}

/// Invalidates one chunk with `call`; returns the calls made.
fn invalidate_chunk(call: Call, addr: *mut u8, bytes: usize) -> Result<u64> {
    let check = |rc: i32, what: &str| {
        if rc != 0 {
            bail!("{what}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: [addr, addr + bytes) lies inside the data memslot's anonymous mapping.
    unsafe {
        match call {
            Call::Madvise => {
                check(libc::madvise(addr.cast(), bytes, libc::MADV_DONTNEED), "madvise(MADV_DONTNEED)")?;
                Ok(1)
            }
            Call::Mprotect => {
                check(libc::mprotect(addr.cast(), bytes, libc::PROT_READ), "mprotect(PROT_READ)")?;
                check(libc::mprotect(addr.cast(), bytes, libc::PROT_READ | libc::PROT_WRITE), "mprotect(PROT_WRITE)")?;
                Ok(2)
            }
        }
    }
}

/// Writes every page of the memslot, so that each is mapped (and movable) before the storm.
/// Each page is allocated next to a page of a filler mapping that is then unmapped: the VM's
/// pages end up among free holes, where compaction moves them (allocated alone, they could sit
/// in blocks compaction leaves in place, as in a 6.1 guest that migrated 320 pages, none the VM's).
fn populate(vm: &Vm) -> Result<()> {
    let filler = mm_probe_workloads::map_small_pages(vm.data_bytes)?;
    // SAFETY: advice on the memslot's own mapping: 4 KiB pages like the filler's, so they interleave.
    unsafe { libc::madvise(vm.data.cast(), vm.data_bytes, libc::MADV_NOHUGEPAGE) };
    for offset in (0..vm.data_bytes).step_by(4096) {
        // SAFETY: the offset lies inside both writable mappings.
        unsafe {
            vm.data.add(offset).write_volatile(1);
            filler.add(offset).write_volatile(1);
        }
    }
    // SAFETY: the filler was mapped above and is used no more.
    unsafe { libc::munmap(filler.cast(), vm.data_bytes) };
    Ok(())
}

/// Has `remote_madvise` collapse the memslot into huge pages from its own process; returns its
/// pid and the memslot's huge bytes after.
fn collapse_by_another_process(vm: &Vm) -> Result<(u64, u64)> {
    // SAFETY: advice on the memslot's own mapping; it undoes populate's MADV_NOHUGEPAGE, which
    // MADV_COLLAPSE refuses.
    if unsafe { libc::madvise(vm.data.cast(), vm.data_bytes, libc::MADV_HUGEPAGE) } != 0 {
        bail!("madvise(MADV_HUGEPAGE): {}", std::io::Error::last_os_error());
    }
    let helper = std::env::current_exe()?.with_file_name("remote_madvise");
    let out = std::process::Command::new(&helper)
        .args([std::process::id().to_string(), format!("{:#x}", vm.data as usize), vm.data_bytes.to_string()])
        .arg("collapse")
        .output()
        .with_context(|| format!("running {}", helper.display()))?;
    if !out.status.success() {
        bail!("remote_madvise: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let pid = text.split("\"pid\":").nth(1).and_then(|r| r.split(',').next()?.parse().ok()).unwrap_or(0);
    Ok((pid, anon_huge_bytes(vm.data as usize)?))
}

/// AnonHugePages of the mapping that holds `addr`, from /proc/self/smaps.
fn anon_huge_bytes(addr: usize) -> Result<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((start, end)) = range.split_once('-')
            && let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
        {
            inside = (start..end).contains(&addr);
        } else if inside && let Some(kib) = line.strip_prefix("AnonHugePages:") {
            return Ok(kib.trim().trim_end_matches("kB").trim().parse::<u64>()? * 1024);
        }
    }
    bail!("no mapping holds {addr:#x} in /proc/self/smaps")
}

/// SCHED_FIFO at the lowest real-time priority: ahead of every ordinary task, behind the
/// kernel's own real-time threads.
fn set_fifo() -> Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads one sched_param for the calling thread (pid 0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        bail!("SCHED_FIFO: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn parse(args: Vec<String>) -> Result<Options> {
    let mut options = Options {
        size_bytes: 64 << 20,
        chunk_bytes: 4 << 10,
        threads: 1,
        passes: 20,
        vcpus: 0,
        dirty_log: false,
        fifo: false,
        call: Call::Madvise,
        compact: false,
        collapse: false,
        idle: Duration::ZERO,
        hold: false,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--size" => options.size_bytes = parse_bytes(&value()?)? as usize,
            "--chunk" => options.chunk_bytes = parse_bytes(&value()?)? as usize,
            "--threads" => options.threads = value()?.parse()?,
            "--passes" => options.passes = value()?.parse()?,
            "--vcpus" => options.vcpus = value()?.parse()?,
            "--dirty-log" => options.dirty_log = true,
            "--fifo" => options.fifo = true,
            "--compact" => options.compact = true,
            "--collapse" => options.collapse = true,
            "--idle-ms" => options.idle = Duration::from_millis(value()?.parse()?),
            "--hold" => options.hold = true,
            "--call" => {
                options.call = match value()?.as_str() {
                    "madvise" => Call::Madvise,
                    "mprotect" => Call::Mprotect,
                    other => bail!("--call takes madvise or mprotect, not {other}"),
                }
            }
            "--wait" => {}
            other => bail!("unknown argument {other}; see the usage at the top of kvm_storm.rs"),
        }
    }
    if options.threads == 0 || options.chunk_bytes == 0 || !options.chunk_bytes.is_multiple_of(4096) {
        bail!("--threads must be at least 1 and --chunk a non-zero multiple of 4K");
    }
    if !options.size_bytes.is_multiple_of(options.chunk_bytes) {
        bail!("--size must be a multiple of --chunk");
    }
    Ok(options)
}
