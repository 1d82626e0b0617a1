//! Helpers of the THP workloads (thp_regions, thp_tree).

pub const MIB: usize = 1 << 20;

/// prctl option (uapi linux/prctl.h).
const PR_SET_THP_DISABLE: libc::c_int = 41;
/// 6.18+: disable THP except for MADV_HUGEPAGE regions (passed as arg3).
const PR_THP_DISABLE_EXCEPT_ADVISED: libc::c_ulong = 1 << 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrctlMode {
    Disable,
    ExceptAdvised,
    Enable,
}

/// prctl(PR_SET_THP_DISABLE, …) on the calling process (inherited by children across fork and
/// execve).
pub fn set_thp_disable(mode: PrctlMode) -> anyhow::Result<()> {
    let (arg2, arg3): (libc::c_ulong, libc::c_ulong) = match mode {
        PrctlMode::Disable => (1, 0),
        PrctlMode::ExceptAdvised => (1, PR_THP_DISABLE_EXCEPT_ADVISED),
        PrctlMode::Enable => (0, 0),
    };
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(PR_SET_THP_DISABLE, arg2, arg3, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    anyhow::ensure!(rc == 0, "prctl(PR_SET_THP_DISABLE, {arg2}, {arg3}): {}", std::io::Error::last_os_error());
    Ok(())
}

/// A fresh anonymous read-write mapping of `len` bytes starting on a 2 MiB boundary (2 MiB more
/// is mapped, so that an aligned start exists inside it), for regions that may be huge.
pub fn map_aligned_2m(len: usize) -> anyhow::Result<usize> {
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + 2 * MIB,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    anyhow::ensure!(base != libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    Ok((base as usize + 2 * MIB - 1) & !(2 * MIB - 1))
}

/// Sleeps until a signal ends the process.
pub fn pause_forever() -> ! {
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}
