//! The self-test programs: one trivial program per program type, each counting the fsync(2)
//! calls of one process. `doctor` uses them to learn which program types really load and attach
//! here, and the end-to-end tests use the counts to prove events flow.

/// Global: the tgid whose fsync calls are counted.
pub const TARGET_TGID: &str = "SELFTEST_TGID";
/// Global: this architecture's fsync syscall number (for raw_syscalls:sys_enter).
pub const FSYNC_NR: &str = "SELFTEST_FSYNC_NR";
/// Per-CPU array of hit counters, indexed by [`Slot`].
pub const HITS_MAP: &str = "SELFTEST_HITS";
/// The kernel functions the function probes attach to, best first: fsync(2)'s own entry point,
/// which every call passes through on every generation (the syscall table calls it from another
/// file, so the compiler cannot inline it away), then the VFS helper older self-tests used.
/// vfs_fsync_range alone is not enough: on Debian's 7.2 build the kprobe, kretprobe, fentry and
/// fexit on it all attached and counted 0 of 3 calls: fsync(2) there does not pass through the
/// function the symbol names (most likely inlined into vfs_fsync, in the same file).
pub const FUNCTIONS: &[&str] = &["__x64_sys_fsync", "__arm64_sys_fsync", "vfs_fsync_range"];

/// One counter per program type.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Tracepoint = 0,
    RawTracepoint = 1,
    BtfTracepoint = 2,
    Kprobe = 3,
    Kretprobe = 4,
    Fentry = 5,
    Fexit = 6,
}

pub const SLOT_COUNT: u32 = 7;

/// Ring-buffer capacity check: one record per getppid(2) call of the target process, so the
/// number of calls a workload made equals records received plus records lost, exactly.
pub const RING_MAP: &str = "SELFTEST_EVENTS";
/// Per-CPU count of records the kernel side could not reserve (ring full).
pub const RING_LOST_MAP: &str = "SELFTEST_RING_LOST";
/// Ring size in bytes (power of two, multiple of the page size).
pub const RING_BYTES: u32 = 256 * 1024;
/// Wake user space only when this much is waiting (user space also drains on a timer).
pub const RING_WAKEUP_BYTES: u64 = crate::ring_wakeup_bytes(RING_BYTES);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RingRecord {
    pub timestamp_ns: u64,
    pub pid: u32,
    pub cpu: u32,
}

crate::user_pod!(RingRecord);
