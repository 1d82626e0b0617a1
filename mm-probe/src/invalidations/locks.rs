//! Naming a contended lock and the code path that waited on it, from what the kernel side
//! recorded: the lock's address, contention_begin's flags and the waiter's kernel stack.

use serde::Serialize;

/// contention_begin's flags (include/trace/events/lock.h, 5.19 → 7.2).
const LCB_F_SPIN: u32 = 1 << 0;
const LCB_F_READ: u32 = 1 << 1;
const LCB_F_WRITE: u32 = 1 << 2;
const LCB_F_RT: u32 = 1 << 3;
const LCB_F_PERCPU: u32 = 1 << 4;
const LCB_F_MUTEX: u32 = 1 << 5;

/// `struct kvm`'s members (from BTF), to name the other locks a VM's notifier takes
/// (mn_invalidate_lock, …) by where they sit inside the VM's `struct kvm`.
#[derive(Clone, Debug, Default)]
pub struct KvmMembers {
    pub size: u32,
    /// (offset, name), ascending.
    pub members: Vec<(u32, String)>,
}

impl KvmMembers {
    /// The member holding byte `offset` of the struct.
    pub fn name_at(&self, offset: u64) -> Option<&str> {
        if offset >= u64::from(self.size) {
            return None;
        }
        self.members.iter().rev().find(|(start, _)| u64::from(*start) <= offset).map(|(_, name)| name.as_str())
    }
}

/// How the lock was being taken, from the flags: "spin, write", "rwsem read", "mutex"...
pub fn lock_kind(flags: u32) -> &'static str {
    let spin = flags & LCB_F_SPIN != 0;
    if flags & LCB_F_PERCPU != 0 {
        return if flags & LCB_F_WRITE != 0 { "percpu-rwsem, write" } else { "percpu-rwsem, read" };
    }
    if flags & LCB_F_RT != 0 {
        return "rt-mutex";
    }
    if flags & LCB_F_MUTEX != 0 {
        return if spin { "mutex, spinning" } else { "mutex" };
    }
    match (spin, flags & LCB_F_READ != 0, flags & LCB_F_WRITE != 0) {
        (true, true, _) => "rwlock, read",
        (true, _, true) => "rwlock, write",
        (true, false, false) => "spinlock",
        (false, true, _) => "rwsem, read",
        (false, _, true) => "rwsem, write",
        (false, false, false) => "sleeping lock",
    }
}

/// The code path that waited, named by the first function on its stack that says what it was
/// doing. Checked in this order: an interrupt or softirq runs on top of whatever task it
/// interrupted (its wait is not that task's madvise), a notifier callback runs inside madvise
/// or munmap, and a vCPU's fault inside its KVM_RUN ioctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WaitPath {
    Interrupt,
    NotifierStart,
    NotifierEnd,
    NotifierAging,
    VcpuFault,
    DirtyLogging,
    MemslotUpdate,
    VcpuRun,
    PageFault,
    Madvise,
    Mmap,
    Other,
}

impl WaitPath {
    pub fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "interrupt or softirq",
            Self::NotifierStart => "notifier invalidate_range_start",
            Self::NotifierEnd => "notifier invalidate_range_end",
            Self::NotifierAging => "notifier aging (clear_young)",
            Self::VcpuFault => "vCPU page fault",
            Self::DirtyLogging => "dirty logging",
            Self::MemslotUpdate => "memslot update",
            Self::VcpuRun => "vCPU run (other)",
            Self::PageFault => "page fault",
            Self::Madvise => "madvise",
            Self::Mmap => "mmap/munmap/mprotect",
            Self::Other => "other",
        }
    }

    /// The snake_case label the JSON and the exporter use.
    pub fn label(self) -> &'static str {
        match self {
            Self::Interrupt => "interrupt",
            Self::NotifierStart => "notifier_start",
            Self::NotifierEnd => "notifier_end",
            Self::NotifierAging => "notifier_aging",
            Self::VcpuFault => "vcpu_fault",
            Self::DirtyLogging => "dirty_logging",
            Self::MemslotUpdate => "memslot_update",
            Self::VcpuRun => "vcpu_run",
            Self::PageFault => "page_fault",
            Self::Madvise => "madvise",
            Self::Mmap => "mmap",
            Self::Other => "other",
        }
    }

    /// Whether the waiter was inside an invalidation's callbacks.
    pub fn in_notifier(self) -> bool {
        matches!(self, Self::NotifierStart | Self::NotifierEnd | Self::NotifierAging)
    }
}

impl Serialize for WaitPath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.label())
    }
}

/// (path, functions that mark it), in the order they are looked for.
const PATHS: &[(WaitPath, &[&str])] = &[
    (
        WaitPath::Interrupt,
        &[
            "handle_softirqs",
            "__do_softirq",
            "do_softirq_own_stack",
            "__irq_exit_rcu",
            "irq_exit_rcu",
            "common_interrupt",
            "handle_irq_event",
        ],
    ),
    (
        WaitPath::NotifierStart,
        &[
            "kvm_mmu_notifier_invalidate_range_start",
            "__mmu_notifier_invalidate_range_start",
            "mn_itree_invalidate",
            "mn_hlist_invalidate_range_start",
        ],
    ),
    (WaitPath::NotifierEnd, &["kvm_mmu_notifier_invalidate_range_end", "__mmu_notifier_invalidate_range_end"]),
    (
        WaitPath::NotifierAging,
        &["kvm_mmu_notifier_clear_young", "kvm_mmu_notifier_clear_flush_young", "kvm_mmu_notifier_test_young"],
    ),
    (
        WaitPath::VcpuFault,
        &[
            "kvm_mmu_page_fault",
            "kvm_mmu_do_page_fault",
            "kvm_tdp_page_fault",
            "direct_page_fault",
            "kvm_tdp_mmu_page_fault",
            "kvm_handle_page_fault",
            "user_mem_abort",
        ],
    ),
    (
        WaitPath::DirtyLogging,
        &[
            "kvm_vm_ioctl_get_dirty_log",
            "kvm_get_dirty_log_protect",
            "kvm_vm_ioctl_clear_dirty_log",
            "kvm_dirty_ring_reset",
        ],
    ),
    (WaitPath::MemslotUpdate, &["kvm_set_memslot", "kvm_vm_ioctl_set_memory_region"]),
    (WaitPath::VcpuRun, &["kvm_arch_vcpu_ioctl_run", "kvm_vcpu_ioctl"]),
    (WaitPath::PageFault, &["handle_mm_fault", "do_user_addr_fault", "exc_page_fault"]),
    (WaitPath::Madvise, &["do_madvise", "madvise_do_behavior"]),
    (WaitPath::Mmap, &["do_vmi_munmap", "vm_mmap_pgoff", "do_mprotect_pkey", "__vm_munmap"]),
];

/// The path of a stack (function names, innermost first). Compiler clones (`foo.isra.0`,
/// `foo.constprop.0`) count as `foo`.
pub fn wait_path(functions: &[&str]) -> WaitPath {
    let base = |f: &str| f.split('.').next().unwrap_or(f).to_string();
    let stack: Vec<String> = functions.iter().map(|f| base(f)).collect();
    PATHS
        .iter()
        .find(|(_, marks)| stack.iter().any(|f| marks.contains(&f.as_str())))
        .map_or(WaitPath::Other, |(path, _)| *path)
}

/// Prefixes of the functions that take locks and of the tracing machinery, skipped to find who
/// asked for the lock.
const LOCKING: &[&str] = &[
    "queued_",
    "native_queued",
    "__pv_queued",
    "_raw_",
    "__raw_",
    "do_raw_",
    "rwsem_",
    "down_",
    "__down",
    "up_",
    "mutex_",
    "__mutex",
    "osq_",
    "rt_mutex",
    "rtlock",
    "rt_spin",
    "rt_read",
    "rt_write",
    "percpu_down",
    "__percpu_down",
    "bpf_",
    "__bpf",
    "trace_",
    "__trace",
    "perf_",
    "kvm_mmu_lock",
    "write_lock",
    "read_lock",
    "spin_lock",
];

/// The first function on the stack outside the locking and tracing code: who wanted the lock.
pub fn caller<'a>(functions: &[&'a str]) -> Option<&'a str> {
    functions.iter().copied().find(|f| !LOCKING.iter().any(|p| f.starts_with(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_inside_struct_kvm_is_named_by_its_member() {
        let kvm = KvmMembers {
            size: 0x1000,
            members: vec![(0, "mmu_lock".into()), (8, "slots_lock".into()), (0x8d4, "mn_invalidate_lock".into())],
        };
        assert_eq!(kvm.name_at(0), Some("mmu_lock"));
        assert_eq!(kvm.name_at(0x8d4), Some("mn_invalidate_lock"));
        assert_eq!(kvm.name_at(0x8e8), Some("mn_invalidate_lock"), "inside the last member before it");
        assert_eq!(kvm.name_at(0x1000), None);
    }

    #[test]
    fn lock_kinds_follow_the_tracepoint_flags() {
        assert_eq!(lock_kind(LCB_F_SPIN | LCB_F_WRITE), "rwlock, write");
        assert_eq!(lock_kind(LCB_F_SPIN | LCB_F_READ), "rwlock, read");
        assert_eq!(lock_kind(LCB_F_SPIN), "spinlock");
        assert_eq!(lock_kind(LCB_F_READ), "rwsem, read");
        assert_eq!(lock_kind(LCB_F_WRITE), "rwsem, write");
        assert_eq!(lock_kind(LCB_F_MUTEX), "mutex");
        assert_eq!(lock_kind(LCB_F_MUTEX | LCB_F_SPIN), "mutex, spinning");
        assert_eq!(lock_kind(LCB_F_RT), "rt-mutex");
        assert_eq!(lock_kind(LCB_F_PERCPU | LCB_F_WRITE), "percpu-rwsem, write");
    }

    /// Stacks as the host's software KVM printed them (6.18, shadow MMU).
    #[test]
    fn the_notifier_is_found_before_the_madvise_that_called_it() {
        let notifier = [
            "queued_write_lock_slowpath",
            "kvm_mmu_notifier_invalidate_range_start",
            "__mmu_notifier_invalidate_range_start",
            "zap_page_range_single_batched",
            "madvise_vma_behavior",
            "do_madvise",
            "__x64_sys_madvise",
        ];
        assert_eq!(wait_path(&notifier), WaitPath::NotifierStart);
        assert!(wait_path(&notifier).in_notifier());
        assert_eq!(caller(&notifier), Some("kvm_mmu_notifier_invalidate_range_start"));
        let end = ["queued_write_lock_slowpath", "kvm_mmu_notifier_invalidate_range_end", "do_madvise"];
        assert_eq!(wait_path(&end), WaitPath::NotifierEnd);
    }

    #[test]
    fn a_vcpu_fault_is_a_fault_not_a_run_and_clones_count_as_their_function() {
        let fault = [
            "queued_write_lock_slowpath",
            "paging64_page_fault",
            "kvm_mmu_do_page_fault.constprop.0",
            "kvm_mmu_page_fault",
            "vcpu_enter_guest",
            "kvm_arch_vcpu_ioctl_run",
            "kvm_vcpu_ioctl",
        ];
        assert_eq!(wait_path(&fault), WaitPath::VcpuFault);
        assert!(!wait_path(&fault).in_notifier());
        assert_eq!(
            wait_path(&["queued_write_lock_slowpath", "vcpu_enter_guest", "kvm_arch_vcpu_ioctl_run"]),
            WaitPath::VcpuRun
        );
        assert_eq!(
            wait_path(&["queued_write_lock_slowpath", "kvm_get_dirty_log_protect", "kvm_vm_ioctl"]),
            WaitPath::DirtyLogging
        );
        assert_eq!(
            wait_path(&["osq_lock", "rwsem_down_read_slowpath", "lock_mm_and_find_vma", "do_user_addr_fault"]),
            WaitPath::PageFault
        );
        assert_eq!(wait_path(&["queued_spin_lock_slowpath", "somewhere_else"]), WaitPath::Other);
        // A softirq that interrupted a madvise waits for itself, not for the madvise.
        let softirq = [
            "queued_spin_lock_slowpath",
            "tcp_v4_rcv",
            "net_rx_action",
            "handle_softirqs",
            "irq_exit_rcu",
            "do_madvise",
        ];
        assert_eq!(wait_path(&softirq), WaitPath::Interrupt);
        assert_eq!(caller(&["queued_spin_lock_slowpath", "_raw_spin_lock", "somewhere_else"]), Some("somewhere_else"));
    }
}
