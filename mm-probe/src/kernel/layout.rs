//! The layout table: every struct member a kernel program reads, stated once as data, resolved
//! from the running kernel's BTF and injected into the object as a global before load.
//!
//! Offsets move between builds (`mm_struct.flags` is at 904 on Debian 6.1, 1128 on Debian 6.12,
//! 1280 on a 6.18 build), and members move into anonymous unions (`vm_flags` since 6.3,
//! `vm_start` since 6.12), so nothing here is a number: only names.

use aya::EbpfLoader;
use mm_probe_common::layout::{self as names, OFFSET_UNKNOWN};

use super::btf::KernelBtf;

/// One member a kernel program reads.
#[derive(Debug)]
pub struct Member {
    /// The global the programs read the offset from.
    pub global: &'static str,
    pub struct_name: &'static str,
    /// Member paths to try in order, for kernels that renamed it.
    pub paths: &'static [&'static str],
    /// The module whose BTF has the struct when vmlinux's does not (`kvm` built as a module).
    pub module: Option<&'static str>,
    /// Kernels it holds for, and what changed: for `doctor` and for readers.
    pub note: &'static str,
}

impl Member {
    /// Its offset in this kernel: the first of its paths BTF knows, in vmlinux or else in its
    /// module (loaded).
    fn offset_in(&self, btf: &KernelBtf) -> Option<u32> {
        let vmlinux = self.paths.iter().find_map(|path| btf.member_offset(self.struct_name, path));
        vmlinux.or_else(|| {
            let module = btf.module(self.module?)?;
            self.paths.iter().find_map(|path| module.member_offset(self.struct_name, path))
        })
    }
}

/// One row of [`MEMBERS`]: `member!(GLOBAL => struct_name["path", "older path"], "note")`, or
/// `… struct_name["path"] in "module", …` for a struct a module may hold, so that each member
/// reads as one line of the table.
macro_rules! member {
    ($global:path => $struct_name:ident[$($path:literal),+], $note:literal) => {
        Member { global: $global, struct_name: stringify!($struct_name), paths: &[$($path),+], module: None, note: $note }
    };
    ($global:path => $struct_name:ident[$($path:literal),+] in $module:literal, $note:literal) => {
        Member {
            global: $global,
            struct_name: stringify!($struct_name),
            paths: &[$($path),+],
            module: Some($module),
            note: $note,
        }
    };
}

pub const MEMBERS: &[Member] = &[
    member!(names::TASK_STRUCT_MM => task_struct["mm"], "all"),
    member!(names::TASK_STRUCT_PID => task_struct["pid"], "all"),
    member!(names::TASK_STRUCT_TGID => task_struct["tgid"], "all"),
    member!(names::TASK_STRUCT_PRIO => task_struct["prio"], "all"),
    member!(names::TASK_STRUCT_COMM => task_struct["comm"], "all"),
    member!(names::TASK_STRUCT_CPU => task_struct["thread_info.cpu", "cpu"],
        "task_cpu(): thread_info.cpu with THREAD_INFO_IN_TASK (x86) since 5.16, task_struct.cpu before"),
    member!(names::TASK_STRUCT_EXEC_RUNTIME => task_struct["se.sum_exec_runtime"],
        "all; leaves out steal (paravirt time accounting) and interrupts (IRQ time accounting)"),
    member!(names::TASK_STRUCT_FLAGS => task_struct["flags"], "all; PF_KSWAPD and PF_KTHREAD say which kernel thread"),
    member!(names::MM_STRUCT_FLAGS => mm_struct["flags"],
        "unsigned long until 6.17; mm_flags_t (a one-word bitmap on 64-bit) from 6.18"),
    member!(names::VMA_VM_MM => vm_area_struct["vm_mm"], "all"),
    member!(names::VMA_VM_FLAGS => vm_area_struct["vm_flags"], "inside an anonymous union with __vm_flags from 6.3"),
    member!(names::VMA_VM_START => vm_area_struct["vm_start"], "inside an anonymous union with vm_freeptr from 6.12"),
    member!(names::VMA_VM_END => vm_area_struct["vm_end"], "as vm_start"),
    member!(names::NOTIFIER_RANGE_MM => mmu_notifier_range["mm"],
        "8 up to 6.5 (after the removed vma member), 0 from 6.6"),
    member!(names::NOTIFIER_RANGE_START => mmu_notifier_range["start"], "moved in 6.6"),
    member!(names::NOTIFIER_RANGE_END => mmu_notifier_range["end"], "moved in 6.6"),
    member!(names::NOTIFIER_RANGE_EVENT => mmu_notifier_range["event"], "moved in 6.6"),
    member!(names::NOTIFIER_RANGE_FLAGS => mmu_notifier_range["flags"], "bit 0 MMU_NOTIFIER_RANGE_BLOCKABLE; moved in 6.6"),
    member!(names::MM_NOTIFIER_SUBSCRIPTIONS => mm_struct["notifier_subscriptions"],
        "CONFIG_MMU_NOTIFIER; named mmu_notifier_mm before 5.7"),
    member!(names::MM_MMAP_LOCK => mm_struct["mmap_lock"], "an rw_semaphore; mmap_sem before 5.8"),
    member!(names::MM_OWNER => mm_struct["owner"],
        "CONFIG_MEMCG (the task whose memory cgroup charges the mm): whose memory an invalidation is"),
    member!(names::SUBSCRIPTIONS_LIST => mmu_notifier_subscriptions["list"],
        "hlist of struct mmu_notifier; stable since 5.7"),
    member!(names::SUBSCRIPTIONS_INVALIDATE_SEQ => mmu_notifier_subscriptions["invalidate_seq"],
        "odd while an invalidation of the mm's interval notifiers is in progress; stable since 5.7"),
    member!(names::MMU_NOTIFIER_HLIST => mmu_notifier["hlist"], "0 on every kernel read; resolved all the same"),
    member!(names::MMU_NOTIFIER_OPS => mmu_notifier["ops"], "stable"),
    member!(names::NOTIFIER_OPS_RANGE_START => mmu_notifier_ops["invalidate_range_start"], "moves as ops are added and removed (invalidate_range went in 6.6)"),
    member!(names::KVM_MMU_NOTIFIER => kvm["mmu_notifier"] in "kvm",
        "in vmlinux BTF when KVM is built in, in the kvm module's (loaded) otherwise"),
    member!(names::KVM_MMU_LOCK => kvm["mmu_lock"] in "kvm",
        "rwlock_t on x86-64 and arm64 (KVM_HAVE_MMU_RWLOCK), spinlock_t elsewhere; as mmu_notifier"),
    member!(names::KVM_MEMSLOTS => kvm["memslots"] in "kvm",
        "address space 0's struct kvm_memslots (RCU); an array of pointers since 5.x"),
    member!(names::KVM_MEMSLOTS_HVA_ROOT => kvm_memslots["hva_tree.rb_root.rb_node"] in "kvm",
        "interval tree of the memslots by host address, 5.17+: whose memory a VM's invalidation is"),
    member!(names::INTERVAL_NODE_RB => interval_tree_node["rb"], "0 on every kernel read"),
    member!(names::INTERVAL_NODE_START => interval_tree_node["start"], "stable"),
    member!(names::INTERVAL_NODE_LAST => interval_tree_node["last"], "inclusive; stable"),
    member!(names::INTERVAL_NODE_SUBTREE_LAST => interval_tree_node["__subtree_last"],
        "the largest last below the node: prunes the overlap search"),
    member!(names::RB_NODE_RIGHT => rb_node["rb_right"], "stable"),
    member!(names::RB_NODE_LEFT => rb_node["rb_left"], "stable"),
    member!(names::HMM_RANGE_NOTIFIER => hmm_range["notifier"], "stable since 5.8"),
    member!(names::HMM_RANGE_START => hmm_range["start"], "stable since 5.8"),
    member!(names::HMM_RANGE_END => hmm_range["end"], "stable since 5.8"),
    member!(names::HMM_RANGE_NOTIFIER_SEQ => hmm_range["notifier_seq"],
        "the sequence the driver's read_begin returned; stable since 5.8"),
    member!(names::INTERVAL_NOTIFIER_MM => mmu_interval_notifier["mm"], "stable since 5.10"),
    member!(names::INTERVAL_NOTIFIER_START => mmu_interval_notifier["interval_tree.start"],
        "stable since 5.10 (interval_tree_node at offset 0)"),
    member!(names::INTERVAL_NOTIFIER_LAST => mmu_interval_notifier["interval_tree.last"],
        "inclusive end of the interval; stable since 5.10"),
    member!(names::INTERVAL_NOTIFIER_OPS => mmu_interval_notifier["ops"], "stable since 5.10"),
    member!(names::INTERVAL_NOTIFIER_INVALIDATE_SEQ => mmu_interval_notifier["invalidate_seq"],
        "moved by the driver's callback (mmu_interval_set_seq); a walk whose sequence differs fails; stable since 5.10"),
    member!(names::INTERVAL_OPS_INVALIDATE => mmu_interval_notifier_ops["invalidate"],
        "the subscriber's callback: its symbol names the driver; stable since 5.10"),
    member!(names::HRTIMER_SOFTEXPIRES => hrtimer["_softexpires"],
        "the requested expiry, on the timer's clock base; the interrupt is programmed for the hard expiry (soft + slack)"),
    member!(names::HRTIMER_FUNCTION => hrtimer["function"], "the callback; a __private member (a sparse mark) from 6.15"),
    member!(names::HRTIMER_SLEEPER_TASK => hrtimer_sleeper["task"], "the task the sleeper wakes; NULL once woken"),
    member!(names::PT_REGS_ORIG_AX => pt_regs["orig_ax"], "x86-64; syscall number"),
    member!(names::PT_REGS_AX => pt_regs["ax"], "x86-64; -ENOSYS until the syscall returns"),
    member!(names::PT_REGS_DI => pt_regs["di"], "x86-64; 1st syscall argument"),
    member!(names::PT_REGS_SI => pt_regs["si"], "x86-64; 2nd syscall argument"),
    member!(names::PT_REGS_DX => pt_regs["dx"], "x86-64; 3rd syscall argument"),
    member!(names::PT_REGS_R10 => pt_regs["r10"], "x86-64; 4th syscall argument"),
];

/// Every member's offset on this kernel.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub resolved: Vec<(&'static Member, Option<u32>)>,
}

impl Layout {
    pub fn resolve(btf: &KernelBtf) -> Self {
        Self { resolved: MEMBERS.iter().map(|m| (m, m.offset_in(btf))).collect() }
    }

    /// One member's offset, found by its global's name, without resolving the whole table.
    pub fn offset_in(btf: &KernelBtf, global: &str) -> Option<u32> {
        MEMBERS.iter().find(|m| m.global == global)?.offset_in(btf)
    }

    /// A layout in which nothing is known: programs that need members stay silent.
    pub fn unknown() -> Self {
        Self { resolved: MEMBERS.iter().map(|m| (m, None)).collect() }
    }

    pub fn offset(&self, global: &str) -> Option<u32> {
        self.resolved.iter().find(|(m, _)| m.global == global).and_then(|(_, off)| *off)
    }

    /// Members this kernel lacks (e.g. `hmm_range` on a kernel without HMM).
    pub fn missing(&self) -> impl Iterator<Item = &'static Member> + '_ {
        self.resolved.iter().filter(|(_, off)| off.is_none()).map(|(m, _)| *m)
    }

    /// Hands every offset to the object about to be loaded; unknown ones as `OFFSET_UNKNOWN`,
    /// which the programs check before reading.
    pub fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>, storage: &'a [u32]) {
        for ((member, _), value) in self.resolved.iter().zip(storage) {
            loader.override_global(member.global, value, true);
        }
    }

    /// The values `apply` injects, in table order (kept alive by the caller for the loader).
    pub fn values(&self) -> Vec<u32> {
        self.resolved.iter().map(|(_, off)| off.unwrap_or(OFFSET_UNKNOWN)).collect()
    }
}

/// What the THP-disable bits of `mm_struct.flags` mean on this kernel. Decided from BTF, never
/// from the version number: 6.18 split MMF_DISABLE_THP into COMPLETELY (24) and EXCEPT_ADVISED
/// (23), and bit 23 meant MMF_HUGE_ZERO_PAGE before that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpDisableBits {
    /// Up to 6.17: bit 24 is MMF_DISABLE_THP; bit 23 is unrelated.
    Single { disable: u32 },
    /// 6.18+: bit 24 is MMF_DISABLE_THP_COMPLETELY, bit 23 MMF_DISABLE_THP_EXCEPT_ADVISED.
    Split { completely: u32, except_advised: u32 },
}

impl ThpDisableBits {
    pub fn from_btf(btf: &KernelBtf) -> Self {
        // mm_flags_t and enum tva_type arrived together with the split in 6.18.
        if btf.has_type("mm_flags_t") || btf.enumerator("TVA_FORCED_COLLAPSE").is_some() {
            Self::Split { completely: 24, except_advised: 23 }
        } else {
            Self::Single { disable: 24 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::tests::sample_btf;

    #[test]
    fn resolves_what_the_sample_has_and_marks_the_rest_unknown() {
        let btf = KernelBtf::from_bytes(sample_btf()).unwrap();
        let layout = Layout::resolve(&btf);
        assert_eq!(layout.offset(names::VMA_VM_FLAGS), Some(24));
        assert_eq!(layout.offset(names::VMA_VM_MM), Some(16));
        assert_eq!(layout.offset(names::MM_STRUCT_FLAGS), Some(8));
        assert_eq!(layout.offset(names::TASK_STRUCT_PID), None);
        assert!(layout.missing().any(|m| m.struct_name == "hmm_range"));
        let values = layout.values();
        assert_eq!(values.len(), MEMBERS.len());
        assert!(values.contains(&OFFSET_UNKNOWN));
    }

    #[test]
    fn thp_bits_follow_btf_not_version() {
        let btf = KernelBtf::from_bytes(sample_btf()).unwrap();
        // The sample has enum tva_type but not TVA_FORCED_COLLAPSE nor mm_flags_t: pre-6.18.
        assert_eq!(ThpDisableBits::from_btf(&btf), ThpDisableBits::Single { disable: 24 });
    }
}
