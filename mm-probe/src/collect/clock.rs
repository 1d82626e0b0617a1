//! The clock every timestamp of a run is read from.

/// CLOCK_MONOTONIC in nanoseconds: the clock bpf_ktime_get_ns() reads, so user-space times line
/// up with kernel timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which lives on this stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
