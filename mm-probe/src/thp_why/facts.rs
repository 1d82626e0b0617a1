//! The facts of one VMA that the THP allow-check looks at (backing, size, alignment, flags),
//! from smaps or from a live allow-check key.

use serde::Serialize;

use super::procfs::{Mount, Vma};

/// vm_flags bits (include/linux/mm.h, identical 5.15–6.18).
pub mod vm_flags {
    pub const VM_EXEC: u64 = 0x4;
    pub const VM_SHARED: u64 = 0x8;
    pub const VM_GROWSDOWN: u64 = 0x100;
    pub const VM_PFNMAP: u64 = 0x400;
    pub const VM_IO: u64 = 0x4000;
    pub const VM_DONTEXPAND: u64 = 0x40000;
    pub const VM_HUGETLB: u64 = 0x40_0000;
    pub const VM_MIXEDMAP: u64 = 0x1000_0000;
    pub const VM_HUGEPAGE: u64 = 0x2000_0000;
    pub const VM_NOHUGEPAGE: u64 = 0x4000_0000;
    /// VM_SPECIAL | VM_HUGETLB.
    pub const VM_NO_KHUGEPAGED: u64 = VM_IO | VM_DONTEXPAND | VM_PFNMAP | VM_MIXEDMAP | VM_HUGETLB;
    /// What a live key keeps.
    pub const KEPT: u64 = VM_EXEC | VM_SHARED | VM_GROWSDOWN | VM_NO_KHUGEPAGED | VM_HUGEPAGE | VM_NOHUGEPAGE;

    /// smaps VmFlags mnemonics of the special bits (fs/proc/task_mmu.c).
    pub const SPECIAL_MNEMONICS: &[(&str, u64)] =
        &[("io", VM_IO), ("de", VM_DONTEXPAND), ("pf", VM_PFNMAP), ("mm", VM_MIXEDMAP), ("ht", VM_HUGETLB)];
}

/// What backs a VMA, as far as the allow-check cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VmaKind {
    /// vm_ops == NULL: heap, stack, private anonymous mmap.
    Anonymous,
    /// A regular file's page cache.
    File,
    /// shmem: shared anonymous memory, memfd, SysV shm (the internal mount, governed by
    /// shmem_enabled) or a file on a tmpfs mount (its huge= option).
    Shmem { internal: bool, tmpfs_huge: Option<String> },
    /// A driver's special mapping ([vdso], [vvar]…).
    Special { name: String },
    /// The gate VMA ([vsyscall]), which has no mm.
    Gate,
}

/// Everything the allow-check looks at, for one VMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaFacts {
    pub start: u64,
    pub end: u64,
    /// vm_pgoff: file offset in pages.
    pub pgoff: u64,
    pub kind: VmaKind,
    pub vm_hugepage: bool,
    pub vm_nohugepage: bool,
    /// Mnemonics of the VM_NO_KHUGEPAGED bits present (io, de, pf, mm, ht).
    pub special_flags: Vec<&'static str>,
    /// The VMA has been faulted (it has anonymous pages, hence an anon_vma).
    pub has_anon_vma: bool,
}

pub const PAGE_SHIFT: u32 = 12;

impl VmaFacts {
    /// From smaps, with the mounts of the process (to recognise tmpfs files).
    pub fn from_smaps(vma: &Vma, mounts: &[Mount]) -> Self {
        let special_flags =
            vm_flags::SPECIAL_MNEMONICS.iter().filter(|(m, _)| vma.has_flag(m)).map(|(m, _)| *m).collect();
        Self {
            start: vma.start,
            end: vma.end,
            pgoff: vma.offset >> PAGE_SHIFT,
            kind: classify(vma, mounts),
            vm_hugepage: vma.has_flag("hg"),
            vm_nohugepage: vma.has_flag("nh"),
            special_flags,
            has_anon_vma: vma.anonymous_kb > 0 || vma.anon_huge_kb > 0,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_anonymous(&self) -> bool {
        self.kind == VmaKind::Anonymous
    }

    /// `thp_vma_suitable_order(vma, vm_end - size, order)`: the last aligned window of this order
    /// lies inside the VMA, and a file's offset is aligned to it.
    pub fn fits_order(&self, order: u32) -> bool {
        let size = 1u64 << (PAGE_SHIFT + order);
        if !self.is_anonymous() && !(self.start >> PAGE_SHIFT).wrapping_sub(self.pgoff).is_multiple_of(1 << order) {
            return false;
        }
        let Some(last) = self.end.checked_sub(size) else { return false };
        let aligned = last & !(size - 1);
        aligned >= self.start && aligned + size <= self.end
    }
}

/// Anonymous, file, shmem or special, from the smaps header (name, device, sharing).
pub fn classify(vma: &Vma, mounts: &[Mount]) -> VmaKind {
    let name = vma.name.as_str();
    match name {
        "[vsyscall]" => return VmaKind::Gate,
        "[heap]" | "[stack]" => return VmaKind::Anonymous,
        _ => {}
    }
    if name.starts_with("[anon_shmem:") {
        return VmaKind::Shmem { internal: true, tmpfs_huge: None };
    }
    if name.starts_with("[anon:") {
        return VmaKind::Anonymous;
    }
    if name.starts_with('[') {
        return VmaKind::Special { name: name.to_string() };
    }
    // Shared anonymous memory shows as the deleted /dev/zero of the internal shmem mount.
    if name.starts_with("/memfd:") || name.starts_with("/SYSV") || (name == "/dev/zero (deleted)" && vma.is_shared()) {
        return VmaKind::Shmem { internal: true, tmpfs_huge: None };
    }
    if name.is_empty() || (name == "/dev/zero" && !vma.is_shared()) {
        // A private /dev/zero mapping is made anonymous by the driver.
        return VmaKind::Anonymous;
    }
    match mounts.iter().find(|m| m.dev == vma.dev && m.fs_type == "tmpfs") {
        Some(mount) => VmaKind::Shmem { internal: false, tmpfs_huge: Some(mount.tmpfs_huge().to_string()) },
        None => VmaKind::File,
    }
}

impl VmaFacts {
    /// Whether an aligned window of `order` fits, the file offset aside.
    pub fn fits_order_ignoring_offset(&self, order: u32) -> bool {
        let anonymous = Self { kind: VmaKind::Anonymous, ..self.clone() };
        anonymous.fits_order(order)
    }
}
