//! Contended locks from the totals: those related to invalidations named, split by the path
//! that waited and ranked; every other lock of the machine folded into one section.

use std::collections::BTreeMap;

use mm_probe_common::invalidations::{DYNAMIC_LOCKS, LockClass, Relation, WaitKey, WaitStats};

use super::{
    decoder::Tables,
    locks::{KvmMembers, WaitPath, caller, lock_kind, wait_path},
    report::{LockRow, OtherContention, PathRow},
};
use crate::kernel::process::comm_text;

/// Frames of a path's stack kept in the report.
const STACK_FRAMES: usize = 8;

/// One kernel table row of waits on a lock: its path, key, stats and stack.
type Wait<'a> = (WaitPath, &'a WaitKey, &'a WaitStats, &'a [String]);

/// Contended locks: those related to invalidations ranked (a VM's lock first, then waits inside
/// invalidations, then subscribed mms' and watched processes'), each by wait; the rest folded.
pub fn locks(tables: &Tables, kvm_members: &KvmMembers) -> (Vec<LockRow>, OtherContention) {
    let mut by_lock: BTreeMap<(u64, u32), Vec<Wait<'_>>> = BTreeMap::new();
    for (key, stats) in &tables.waits {
        let stack = tables.stack(key.stack_id);
        let functions: Vec<&str> = stack.iter().map(String::as_str).collect();
        by_lock.entry((key.lock, key.relation)).or_default().push((wait_path(&functions), key, stats, stack));
    }
    let (mut related, mut unrelated): (Vec<LockRow>, Vec<LockRow>) = by_lock
        .into_iter()
        .map(|((lock, relation), waits)| lock_row(tables, kvm_members, lock, relation, &waits))
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
    }
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

    fn wait(tables: &mut Tables, lock: u64, relation: Relation, comm: &str, count: u64) {
        let mut name = [0u8; 16];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        let key = WaitKey { lock, stack_id: -1, flags: 1, tgid: 7, class: 0, relation: relation as u32, comm: name };
        let stats = WaitStats { count, wait_ns: count * 1000, max_ns: 1000, buckets: [0; TIME_BUCKETS] };
        tables.waits.insert(key, stats);
    }

    #[test]
    fn a_vms_lock_ranks_first_however_much_more_the_rest_of_the_machine_waited() {
        let mut tables = Tables::default();
        wait(&mut tables, 0x1000, Relation::Unrelated, "", 1_000_000);
        wait(&mut tables, 0x2000, Relation::Unrelated, "", 500_000);
        wait(&mut tables, 0x3000, Relation::SubscribedMm, "qemu-kvm", 900);
        wait(&mut tables, 0x4000, Relation::VmLock, "kvm-madv", 10);
        let (related, other) = locks(&tables, &KvmMembers::default());
        let order: Vec<&str> = related.iter().map(|l| l.relation).collect();
        assert_eq!(order, ["vm_lock", "subscribed_mm"]);
        assert_eq!((other.locks, other.contended), (2, 1_500_000));
        assert_eq!(other.top.len(), 2);
        assert!(other.top.iter().all(|l| l.relation == "unrelated"));
    }
}
