//! The globals the invalidations programs are loaded with, and the kernel facts beside them:
//! KVM's callback address, the kernel image, this kernel's tracepoint field offsets, the
//! subscribers' ops tables; whether VMs' locks can be named and `struct kvm`'s members.

use mm_probe_common::{invalidations as names, layout as offsets};

use super::{callbacks, locks::KvmMembers, probes};
use crate::{
    cause::probes as cause,
    kernel::{Kernel, layout::Layout, tracefs},
    probes::GlobalValue,
};

/// Whether VMs' locks can be named: KVM's callback in kallsyms, `struct kvm` in BTF (vmlinux's,
/// or the kvm module's).
pub fn kvm_locks_nameable(kernel: &Kernel) -> bool {
    if kvm_range_start(kernel).is_none() {
        return false;
    }
    let Ok(btf) = kernel.btf() else { return false };
    Layout::offset_in(&btf, offsets::KVM_MMU_LOCK).is_some()
        && Layout::offset_in(&btf, offsets::KVM_MMU_NOTIFIER).is_some()
}

/// `struct kvm`'s members, to name the locks inside a VM (empty without KVM's BTF).
pub fn kvm_members(kernel: &Kernel) -> KvmMembers {
    let Ok(btf) = kernel.btf() else { return KvmMembers::default() };
    btf.struct_members("kvm")
        .or_else(|| btf.module("kvm")?.struct_members("kvm"))
        .map(|(size, members)| KvmMembers { size, members })
        .unwrap_or_default()
}

/// The kernel image's [_text, _end), where static locks live.
fn kernel_image(kernel: &Kernel) -> Option<(u64, u64)> {
    kernel.kallsyms().ok()?.kernel_image()
}

fn kvm_range_start(kernel: &Kernel) -> Option<u64> {
    kernel.kallsyms().ok().and_then(|k| k.address_of(probes::KVM_RANGE_START))
}

/// The syscalls that work on the memory of the process they name (a pid or pidfd): an
/// invalidation they make is that process's, not the caller's.
fn others_memory_syscalls() -> [u64; names::OTHERS_MEMORY_SYSCALLS] {
    let mut bits = [0u64; names::OTHERS_MEMORY_SYSCALLS];
    let calls = [
        libc::SYS_process_madvise,
        libc::SYS_process_mrelease,
        libc::SYS_process_vm_writev,
        libc::SYS_move_pages,
        libc::SYS_migrate_pages,
    ];
    for call in calls.map(|nr| nr as usize) {
        bits[call / 64] |= 1 << (call % 64);
    }
    bits
}

/// Globals: the -p filter, KVM's callback address, this kernel's tracepoint field offsets.
pub fn settings(kernel: &Kernel, pids: &[u32]) -> Vec<(&'static str, GlobalValue)> {
    let kvm_start = kvm_range_start(kernel);
    let image = kernel_image(kernel);
    let root = tracefs::root().ok();
    let offset = |category, event, field, default| {
        let found = root.as_deref().and_then(|r| tracefs::field_offset(r, category, event, field));
        GlobalValue::U32(found.unwrap_or(default))
    };
    let [notifier_ops, interval_ops, func_ip] = callbacks::settings(kernel);
    vec![
        (names::FILTER_TGIDS, GlobalValue::U32(u32::from(!pids.is_empty()))),
        (names::KVM_RANGE_START_FN, GlobalValue::U64(kvm_start.unwrap_or(0))),
        (names::KERNEL_TEXT, GlobalValue::U64(image.map_or(0, |i| i.0))),
        (names::KERNEL_END, GlobalValue::U64(image.map_or(0, |i| i.1))),
        (names::KVM_START_OFFSET, offset("kvm", "kvm_unmap_hva_range", "start", 8)),
        (names::KVM_END_OFFSET, offset("kvm", "kvm_unmap_hva_range", "end", 16)),
        notifier_ops,
        interval_ops,
        func_ip,
        (names::OTHERS_MEMORY_SYSCALLS_GLOBAL, GlobalValue::Bits(others_memory_syscalls())),
    ]
    .into_iter()
    .chain(cause::settings(kernel))
    .collect()
}
