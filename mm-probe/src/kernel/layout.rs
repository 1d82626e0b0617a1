//! The layout table: every struct member a kernel program reads, stated once as data, resolved
//! from the running kernel's BTF and injected into the object as a global before load.
//!
//! Offsets move between builds (`mm_struct.flags` is at 904 on Debian 6.1, 1128 on Debian 6.12,
//! 1280 on a 6.18 build), and members move into anonymous unions (`vm_flags` since 6.3,
//! `vm_start` since 6.12), so nothing here is a number: only names.

use aya::EbpfLoader;
use mm_probe_common::layout::{self as names, OFFSET_UNKNOWN};

use super::KernelBtf;

/// One member a kernel program reads.
#[derive(Debug)]
pub struct Member {
    /// The global the programs read the offset from.
    pub global: &'static str,
    pub struct_name: &'static str,
    /// Member paths to try in order, for kernels that renamed it.
    pub paths: &'static [&'static str],
    /// Kernels it holds for, and what changed: for `doctor` and for readers.
    pub note: &'static str,
}

impl Member {
    /// Its offset in this kernel: the first of its paths BTF knows.
    fn offset_in(&self, btf: &KernelBtf) -> Option<u32> {
        self.paths.iter().find_map(|path| btf.member_offset(self.struct_name, path))
    }
}

pub const MEMBERS: &[Member] = &[
    Member { global: names::TASK_STRUCT_MM, struct_name: "task_struct", paths: &["mm"], note: "all" },
    Member { global: names::TASK_STRUCT_PID, struct_name: "task_struct", paths: &["pid"], note: "all" },
    Member { global: names::TASK_STRUCT_TGID, struct_name: "task_struct", paths: &["tgid"], note: "all" },
    Member { global: names::TASK_STRUCT_PRIO, struct_name: "task_struct", paths: &["prio"], note: "all" },
    Member { global: names::TASK_STRUCT_COMM, struct_name: "task_struct", paths: &["comm"], note: "all" },
    Member {
        global: names::TASK_STRUCT_CPU,
        struct_name: "task_struct",
        paths: &["thread_info.cpu", "cpu"],
        note: "task_cpu(): thread_info.cpu with THREAD_INFO_IN_TASK (x86) since 5.16, task_struct.cpu before",
    },
    Member {
        global: names::MM_STRUCT_FLAGS,
        struct_name: "mm_struct",
        paths: &["flags"],
        note: "unsigned long until 6.17; mm_flags_t (a one-word bitmap on 64-bit) from 6.18",
    },
    Member { global: names::VMA_VM_MM, struct_name: "vm_area_struct", paths: &["vm_mm"], note: "all" },
    Member {
        global: names::VMA_VM_FLAGS,
        struct_name: "vm_area_struct",
        paths: &["vm_flags"],
        note: "inside an anonymous union with __vm_flags from 6.3",
    },
    Member {
        global: names::VMA_VM_START,
        struct_name: "vm_area_struct",
        paths: &["vm_start"],
        note: "inside an anonymous union with vm_freeptr from 6.12",
    },
    Member { global: names::VMA_VM_END, struct_name: "vm_area_struct", paths: &["vm_end"], note: "as vm_start" },
    Member {
        global: names::NOTIFIER_RANGE_MM,
        struct_name: "mmu_notifier_range",
        paths: &["mm"],
        note: "8 up to 6.5 (after the removed vma member), 0 from 6.6",
    },
    Member {
        global: names::NOTIFIER_RANGE_START,
        struct_name: "mmu_notifier_range",
        paths: &["start"],
        note: "moved in 6.6",
    },
    Member {
        global: names::NOTIFIER_RANGE_END,
        struct_name: "mmu_notifier_range",
        paths: &["end"],
        note: "moved in 6.6",
    },
    Member {
        global: names::NOTIFIER_RANGE_EVENT,
        struct_name: "mmu_notifier_range",
        paths: &["event"],
        note: "moved in 6.6",
    },
    Member {
        global: names::HMM_RANGE_NOTIFIER,
        struct_name: "hmm_range",
        paths: &["notifier"],
        note: "stable since 5.8",
    },
    Member { global: names::HMM_RANGE_START, struct_name: "hmm_range", paths: &["start"], note: "stable since 5.8" },
    Member { global: names::HMM_RANGE_END, struct_name: "hmm_range", paths: &["end"], note: "stable since 5.8" },
    Member {
        global: names::INTERVAL_NOTIFIER_MM,
        struct_name: "mmu_interval_notifier",
        paths: &["mm"],
        note: "stable since 5.10",
    },
    Member {
        global: names::INTERVAL_NOTIFIER_START,
        struct_name: "mmu_interval_notifier",
        paths: &["interval_tree.start"],
        note: "stable since 5.10 (interval_tree_node at offset 0)",
    },
    Member {
        global: names::INTERVAL_NOTIFIER_LAST,
        struct_name: "mmu_interval_notifier",
        paths: &["interval_tree.last"],
        note: "inclusive end of the interval; stable since 5.10",
    },
    Member {
        global: names::PT_REGS_ORIG_AX,
        struct_name: "pt_regs",
        paths: &["orig_ax"],
        note: "x86-64; syscall number",
    },
    Member {
        global: names::PT_REGS_AX,
        struct_name: "pt_regs",
        paths: &["ax"],
        note: "x86-64; -ENOSYS until the syscall returns",
    },
    Member { global: names::PT_REGS_DI, struct_name: "pt_regs", paths: &["di"], note: "x86-64; 1st syscall argument" },
    Member { global: names::PT_REGS_SI, struct_name: "pt_regs", paths: &["si"], note: "x86-64; 2nd syscall argument" },
    Member { global: names::PT_REGS_DX, struct_name: "pt_regs", paths: &["dx"], note: "x86-64; 3rd syscall argument" },
    Member {
        global: names::PT_REGS_R10,
        struct_name: "pt_regs",
        paths: &["r10"],
        note: "x86-64; 4th syscall argument",
    },
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
