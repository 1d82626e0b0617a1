//! remote_madvise: advice on another process's memory, as a process manager or a VMM's helper
//! gives it: process_madvise(2) on a pidfd of PID for [ADDR, ADDR + LEN).
//!
//! Prints `{"pid":…,"advised_bytes":…}` (its own pid, and what the kernel says it advised).
//! Needs CAP_SYS_NICE and ptrace access to PID (root).
//!
//! Usage: remote_madvise PID ADDR LEN collapse|cold|pageout|willneed

use anyhow::{Context as _, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: remote_madvise PID ADDR LEN collapse|cold|pageout|willneed";
    let [pid, addr, len, advice] = args.as_slice() else { bail!(usage) };
    let pid: i32 = pid.parse().context(usage)?;
    let addr = usize::from_str_radix(addr.trim_start_matches("0x"), 16).context("ADDR in hex")?;
    let len: usize = len.parse().context(usage)?;
    let advice = match advice.as_str() {
        "collapse" => libc::MADV_COLLAPSE,
        "cold" => libc::MADV_COLD,
        "pageout" => libc::MADV_PAGEOUT,
        "willneed" => libc::MADV_WILLNEED,
        other => bail!("{usage}: not {other}"),
    };
    // SAFETY: pidfd_open takes a pid and flags; the fd it returns is ours to close.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        bail!("pidfd_open({pid}): {}", std::io::Error::last_os_error());
    }
    let range = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    // SAFETY: one iovec describing the other process's range; the kernel reads only the iovec.
    let advised = unsafe { libc::syscall(libc::SYS_process_madvise, pidfd, &range, 1, advice, 0) };
    let error = std::io::Error::last_os_error();
    // SAFETY: closing the pidfd opened above.
    unsafe { libc::close(pidfd as i32) };
    if advised < 0 {
        bail!("process_madvise({pid}, {addr:#x}, {len}): {error}");
    }
    println!("{{\"pid\":{},\"advised_bytes\":{advised}}}", std::process::id());
    Ok(())
}
