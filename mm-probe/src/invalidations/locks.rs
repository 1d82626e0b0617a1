//! Contended locks from the drained totals: each lock related to invalidations named from the
//! kernel's own structures, split by the code path that waited on it (from contention_begin's
//! flags and the waiter's kernel stack) and ranked; every other lock of the machine folded into
//! one section.

use std::collections::BTreeMap;

use mm_probe_common::invalidations::{DYNAMIC_LOCKS, LockClass, Relation, WaitKey, WaitStats};
use serde::Serialize;

use super::decoder::Tables;
use crate::{
    cause::{CauseName, Namer},
    kernel::process::comm_text,
    report::log2::log2_ns,
};

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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LockRow {
    pub address: String,
    /// "kvm->mmu_lock of VM pid 4242", "mmap_lock of pid 4242", or the address and caller.
    pub name: String,
    /// "kvm_mmu_lock", "mmap_lock", "kvm_lock" or "unknown".
    pub class: &'static str,
    /// How it relates to invalidations: "vm_lock", "in_invalidation", "subscribed_mm",
    /// "watched" or "unrelated".
    pub relation: &'static str,
    pub owner_tgid: Option<u32>,
    /// How it was taken, from contention_begin's flags of its most waited-on path.
    pub kind: &'static str,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// log2 buckets of ns per wait.
    #[serde(serialize_with = "log2_ns")]
    pub buckets: Vec<u64>,
    pub paths: Vec<PathRow>,
    /// The waits inside invalidations' callbacks by the cause of the invalidation that waited,
    /// most waited first.
    pub by_cause: Vec<LockCauseRow>,
}

/// One cause's waits on a lock inside invalidations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LockCauseRow {
    pub cause: CauseName,
    pub contended: u64,
    pub wait_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PathRow {
    pub path: WaitPath,
    pub name: &'static str,
    /// Waiting inside an invalidation's callbacks.
    pub in_notifier: bool,
    pub kind: &'static str,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_ns: u64,
    /// The waiting threads' names.
    pub waiters: Vec<String>,
    /// The first function outside the locking code on the most waited-on stack.
    pub caller: Option<String>,
    /// That stack, innermost first (a few frames).
    pub stack: Vec<String>,
}

/// Contention with no relation to invalidations (the rest of the machine), folded.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OtherContention {
    pub locks: usize,
    pub contended: u64,
    pub wait_ns: u64,
    /// The most waited-on of them (a few).
    pub top: Vec<LockRow>,
}

/// Frames of a path's stack kept in the report.
const STACK_FRAMES: usize = 8;

/// One kernel table row of waits on a lock: its path, key, stats and stack.
type Wait<'a> = (WaitPath, &'a WaitKey, &'a WaitStats, &'a [String]);

/// Contended locks: those related to invalidations ranked (a VM's lock first, then waits inside
/// invalidations, then subscribed mms' and watched processes'), each by wait; the rest folded.
pub fn locks(tables: &Tables, kvm_members: &KvmMembers, namer: &Namer) -> (Vec<LockRow>, OtherContention) {
    let mut by_lock: BTreeMap<(u64, u32), Vec<Wait<'_>>> = BTreeMap::new();
    for (key, stats) in &tables.waits {
        let stack = tables.stack(key.stack_id);
        let functions: Vec<&str> = stack.iter().map(String::as_str).collect();
        by_lock.entry((key.lock, key.relation)).or_default().push((wait_path(&functions), key, stats, stack));
    }
    let (mut related, mut unrelated): (Vec<LockRow>, Vec<LockRow>) = by_lock
        .into_iter()
        .map(|((lock, relation), waits)| LockRow {
            by_cause: by_cause(&waits, namer),
            ..lock_row(tables, kvm_members, lock, relation, &waits)
        })
        .partition(|row| row.relation != relation_name(Relation::Unrelated));
    related.sort_by_key(|r| (relation_rank(r.relation), std::cmp::Reverse(r.wait_ns)));
    unrelated.sort_by_key(|r| std::cmp::Reverse(r.wait_ns));
    let other = OtherContention {
        locks: unrelated.len(),
        contended: unrelated.iter().map(|l| l.contended).sum(),
        wait_ns: unrelated.iter().map(|l| l.wait_ns).sum(),
        top: unrelated.into_iter().take(OTHER_LOCKS_SHOWN).collect(),
    };
    (related, other)
}

/// Unrelated locks named in the folded section.
const OTHER_LOCKS_SHOWN: usize = 3;

const RELATIONS: [Relation; 5] =
    [Relation::VmLock, Relation::InInvalidation, Relation::SubscribedMm, Relation::Watched, Relation::Unrelated];

pub fn relation_name(relation: Relation) -> &'static str {
    match relation {
        Relation::VmLock => "vm_lock",
        Relation::InInvalidation => "in_invalidation",
        Relation::SubscribedMm => "subscribed_mm",
        Relation::Watched => "watched",
        Relation::Unrelated => "unrelated",
    }
}

fn relation_rank(name: &str) -> usize {
    RELATIONS.iter().position(|r| relation_name(*r) == name).unwrap_or(RELATIONS.len())
}

fn lock_row(tables: &Tables, kvm_members: &KvmMembers, lock: u64, relation: u32, waits: &[Wait<'_>]) -> LockRow {
    let mut paths: BTreeMap<WaitPath, PathRow> = BTreeMap::new();
    let mut heaviest: BTreeMap<WaitPath, u64> = BTreeMap::new();
    let mut buckets = vec![0u64; mm_probe_common::invalidations::TIME_BUCKETS];
    let mut mmap_owner = None;
    let mut mmap_lock = false;
    for (path, key, stats, stack) in waits {
        for (into, from) in buckets.iter_mut().zip(stats.buckets.iter()) {
            *into += from;
        }
        if key.class == LockClass::MmapLock as u32 {
            mmap_lock = true;
            mmap_owner = (key.tgid != 0).then_some(key.tgid);
        }
        let functions: Vec<&str> = stack.iter().map(String::as_str).collect();
        let row = paths.entry(*path).or_insert_with(|| PathRow {
            path: *path,
            name: path.name(),
            in_notifier: path.in_notifier(),
            kind: lock_kind(key.flags),
            contended: 0,
            wait_ns: 0,
            max_ns: 0,
            waiters: Vec::new(),
            caller: None,
            stack: Vec::new(),
        });
        row.contended += stats.count;
        row.wait_ns += stats.wait_ns;
        row.max_ns = row.max_ns.max(stats.max_ns);
        let waiter = comm_text(&key.comm);
        if !waiter.is_empty() && !row.waiters.contains(&waiter) {
            row.waiters.push(waiter);
        }
        let most = heaviest.entry(*path).or_default();
        if stats.wait_ns >= *most {
            *most = stats.wait_ns;
            row.kind = lock_kind(key.flags);
            row.caller = caller(&functions).map(str::to_string);
            row.stack = stack.iter().take(STACK_FRAMES).cloned().collect();
        }
    }
    let mut paths: Vec<PathRow> = paths.into_values().collect();
    paths.sort_by_key(|p| std::cmp::Reverse(p.wait_ns));
    let vm_lock = relation == Relation::VmLock as u32;
    let (name, class, owner) = lock_name(tables, kvm_members, (lock, vm_lock), mmap_lock, mmap_owner, &paths);
    let relation = RELATIONS.iter().copied().find(|r| *r as u32 == relation).unwrap_or(Relation::Unrelated);
    LockRow {
        address: format!("{lock:#x}"),
        name,
        class,
        relation: relation_name(relation),
        owner_tgid: owner,
        kind: paths.first().map_or("unknown", |p| p.kind),
        contended: paths.iter().map(|p| p.contended).sum(),
        wait_ns: paths.iter().map(|p| p.wait_ns).sum(),
        max_ns: paths.iter().map(|p| p.max_ns).max().unwrap_or(0),
        buckets,
        paths,
        // Filled by the caller, which has the namer.
        by_cause: Vec::new(),
    }
}

/// The waits inside an invalidation's callbacks (by the path their stack shows), grouped by the
/// cause the kernel program decided in the waiting thread, which is the invalidating one.
fn by_cause(waits: &[Wait<'_>], namer: &Namer) -> Vec<LockCauseRow> {
    let mut causes: BTreeMap<CauseName, (u64, u64)> = BTreeMap::new();
    for (_, key, stats, _) in waits.iter().filter(|(path, ..)| path.in_notifier()) {
        let total = causes.entry(namer.name(&key.cause, &comm_text(&key.comm), None)).or_default();
        total.0 += stats.count;
        total.1 += stats.wait_ns;
    }
    let mut rows: Vec<LockCauseRow> =
        causes.into_iter().map(|(cause, (contended, wait_ns))| LockCauseRow { cause, contended, wait_ns }).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.wait_ns));
    rows
}

/// A lock's name, class and owner: a VM's mmu_lock or another member of its `struct kvm`, an
/// mm's mmap_lock, or its address and the function that took it.
fn lock_name(
    tables: &Tables,
    kvm_members: &KvmMembers,
    (lock, vm_lock): (u64, bool),
    mmap_lock: bool,
    mmap_owner: Option<u32>,
    paths: &[PathRow],
) -> (String, &'static str, Option<u32>) {
    // Only a wait the kernel related to the VM: after the VM exits its address may be reused.
    if let Some(kvm) = tables.kvm_lock(lock).filter(|_| vm_lock) {
        return (format!("kvm->mmu_lock of VM pid {}", kvm.tgid), "kvm_mmu_lock", Some(kvm.tgid));
    }
    match (mmap_lock, mmap_owner) {
        (true, Some(tgid)) => return (format!("mmap_lock of pid {tgid}"), "mmap_lock", Some(tgid)),
        (true, None) => return ("other processes' own mmap_locks".into(), "mmap_lock", None),
        _ if lock == DYNAMIC_LOCKS => return ("per-object locks (page tables, inodes, …)".into(), "unknown", None),
        _ => {}
    }
    let inside_kvm = tables.kvm_locks.iter().find_map(|(_, vm)| {
        let member = kvm_members.name_at(lock.checked_sub(vm.kvm)?)?;
        Some((format!("kvm->{member} of VM pid {}", vm.tgid), vm.tgid))
    });
    if let Some((name, tgid)) = inside_kvm {
        return (name, "kvm_lock", Some(tgid));
    }
    let from = paths.first().and_then(|p| p.caller.clone());
    let name = match (lock, from) {
        (u64::MAX, _) => "other locks (past the tool's bound)".to_string(),
        (_, Some(from)) => format!("lock {lock:#x} (taken in {from})"),
        (_, None) => format!("lock {lock:#x}"),
    };
    (name, "unknown", None)
}

#[cfg(test)]
mod tests {
    use mm_probe_common::invalidations::TIME_BUCKETS;

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

    fn wait(tables: &mut Tables, lock: u64, relation: Relation, comm: &str, count: u64) {
        let mut name = [0u8; 16];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        let relation = relation as u32;
        let key = WaitKey {
            lock,
            stack_id: -1,
            flags: 1,
            tgid: 7,
            class: 0,
            relation,
            comm: name,
            cause: Default::default(),
        };
        let stats = WaitStats { count, wait_ns: count * 1000, max_ns: 1000, buckets: [0; TIME_BUCKETS] };
        tables.waits.insert(key, stats);
    }

    /// Only the waits inside the notifier count for a cause, each under the cause the kernel
    /// decided in the waiting (invalidating) thread; a vCPU's fault on the same lock is no
    /// invalidation's.
    #[test]
    fn waits_inside_invalidations_are_split_by_their_cause_and_faults_are_left_out() {
        use mm_probe_common::cause::{Cause, CauseClass};
        let stacks = vec![
            ["queued_write_lock_slowpath", "kvm_mmu_notifier_invalidate_range_start"].map(String::from).into(),
            ["queued_write_lock_slowpath", "paging64_page_fault", "kvm_mmu_page_fault"].map(String::from).into(),
        ];
        let mut tables = Tables { stacks, ..Tables::default() };
        let mut wait = |stack_id: i64, class: CauseClass, comm: &[u8], count: u64| {
            let mut name = [0u8; 16];
            name[..comm.len()].copy_from_slice(comm);
            let cause = Cause { class: class as u32, ..Cause::default() };
            let (relation, stats) = (
                Relation::VmLock as u32,
                WaitStats { count, wait_ns: count * 1000, max_ns: 1000, buckets: [0; TIME_BUCKETS] },
            );
            let key = WaitKey { lock: 0x4000, stack_id, flags: 1, tgid: 7, class: 0, relation, comm: name, cause };
            tables.waits.insert(key, stats);
        };
        wait(0, CauseClass::Compaction, b"sh", 5);
        wait(0, CauseClass::Kswapd, b"kswapd0", 2);
        wait(0, CauseClass::Compaction, b"kcompactd0", 1);
        wait(1, CauseClass::UserContext, b"kvm-vcpu", 50);
        let (related, _) = locks(&tables, &KvmMembers::default(), &Namer::default());
        let causes: Vec<(String, u64)> = related[0].by_cause.iter().map(|c| (c.cause.to_string(), c.wait_ns)).collect();
        let expected = [("compaction in sh", 5000), ("kswapd", 2000), ("compaction in kcompactd0", 1000)];
        assert_eq!(causes, expected.map(|(c, w)| (c.to_string(), w)));
        assert_eq!(related[0].contended, 58, "the lock's own totals keep every wait");
    }

    #[test]
    fn a_vms_lock_ranks_first_however_much_more_the_rest_of_the_machine_waited() {
        let mut tables = Tables::default();
        wait(&mut tables, 0x1000, Relation::Unrelated, "", 1_000_000);
        wait(&mut tables, 0x2000, Relation::Unrelated, "", 500_000);
        wait(&mut tables, 0x3000, Relation::SubscribedMm, "qemu-kvm", 900);
        wait(&mut tables, 0x4000, Relation::VmLock, "kvm-madv", 10);
        let (related, other) = locks(&tables, &KvmMembers::default(), &Namer::default());
        let order: Vec<&str> = related.iter().map(|l| l.relation).collect();
        assert_eq!(order, ["vm_lock", "subscribed_mm"]);
        assert_eq!((other.locks, other.contended), (2, 1_500_000));
        assert_eq!(other.top.len(), 2);
        assert!(other.top.iter().all(|l| l.relation == "unrelated"));
    }
}
