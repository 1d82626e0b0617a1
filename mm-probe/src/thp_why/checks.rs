//! The kernel's THP allow-check, per version, stated as data: which function it is, how its
//! arguments say who is asking (page fault, smaps, khugepaged, MADV_COLLAPSE), and the order in
//! which it returns "no" (docs/kernel-facts.md#thp-check-order). The argument layout is read from the
//! function's BTF parameter names; the release number is only a fallback without BTF. The mm->flags
//! bits that disable THP (6.18 split them in two) are read the same way.

use serde::Serialize;

use crate::kernel::{Kernel, KernelBtf, Release, layout::ThpDisableBits};

/// Who asked: the allow-check is called from these paths with different arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    /// A page fault (in_pf / TVA_IN_PF / TVA_PAGEFAULT): size and alignment are checked later.
    PageFault,
    /// /proc/PID/smaps computing THPeligible.
    Smaps,
    /// khugepaged registering or scanning the mm (sysfs enforced).
    Khugepaged,
    /// MADV_COLLAPSE or collapse_pte_mapped_thp (sysfs not enforced).
    ForcedCollapse,
}

impl Call {
    pub fn in_pf(self) -> bool {
        self == Call::PageFault
    }

    pub fn smaps(self) -> bool {
        self == Call::Smaps
    }

    pub fn enforce_sysfs(self) -> bool {
        self != Call::ForcedCollapse
    }

    pub fn label(self) -> &'static str {
        match self {
            Call::PageFault => "page fault",
            Call::Smaps => "smaps",
            Call::Khugepaged => "khugepaged",
            Call::ForcedCollapse => "MADV_COLLAPSE",
        }
    }
}

/// How the function's arguments encode the caller; indexes are argument positions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallEncoding {
    /// 6.0–6.9: `bool smaps, bool in_pf, bool enforce_sysfs`.
    Bools { smaps: usize, in_pf: usize, enforce_sysfs: usize },
    /// 6.10–6.17: `unsigned long tva_flags` with TVA_SMAPS (1<<0), TVA_IN_PF (1<<1),
    /// TVA_ENFORCE_SYSFS (1<<2) (#defines in huge_mm.h, hence not in BTF).
    TvaFlags { index: usize },
    /// 6.18+: `enum tva_type type`; enumerator values come from BTF.
    TvaType { index: usize, smaps: u8, page_fault: u8, khugepaged: u8, forced_collapse: u8 },
}

const TVA_SMAPS: u8 = 1 << 0;
const TVA_IN_PF: u8 = 1 << 1;
const TVA_ENFORCE_SYSFS: u8 = 1 << 2;

impl CallEncoding {
    /// Argument positions the kernel program must copy (bit i = argument i).
    pub fn arg_mask(&self) -> u32 {
        match *self {
            CallEncoding::Bools { smaps, in_pf, enforce_sysfs } => (1 << smaps) | (1 << in_pf) | (1 << enforce_sysfs),
            CallEncoding::TvaFlags { index } | CallEncoding::TvaType { index, .. } => 1 << index,
        }
    }

    /// Decodes the low bytes of arguments 2..=5 as the kernel program copied them.
    pub fn decode(&self, call_args: [u8; 4]) -> Option<Call> {
        let arg = |index: usize| index.checked_sub(2).and_then(|i| call_args.get(i)).copied();
        match *self {
            CallEncoding::Bools { smaps, in_pf, enforce_sysfs } => Some(if arg(smaps)? != 0 {
                Call::Smaps
            } else if arg(in_pf)? != 0 {
                Call::PageFault
            } else if arg(enforce_sysfs)? != 0 {
                Call::Khugepaged
            } else {
                Call::ForcedCollapse
            }),
            CallEncoding::TvaFlags { index } => {
                let flags = arg(index)?;
                Some(if flags & TVA_SMAPS != 0 {
                    Call::Smaps
                } else if flags & TVA_IN_PF != 0 {
                    Call::PageFault
                } else if flags & TVA_ENFORCE_SYSFS != 0 {
                    Call::Khugepaged
                } else {
                    Call::ForcedCollapse
                })
            }
            CallEncoding::TvaType { index, smaps, page_fault, khugepaged, forced_collapse } => {
                let value = arg(index)?;
                [
                    (smaps, Call::Smaps),
                    (page_fault, Call::PageFault),
                    (khugepaged, Call::Khugepaged),
                    (forced_collapse, Call::ForcedCollapse),
                ]
                .into_iter()
                .find(|(v, _)| *v == value)
                .map(|(_, call)| call)
            }
        }
    }
}

/// One "return no" of the allow-check, in the order the kernel tests them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// 6.8+: the inline wrapper `thp_vma_allowable_orders()` masks an anonymous VMA's orders with
    /// the per-size sysfs controls and returns 0 **before** calling the out-of-line function.
    WrapperAnonSysfs,
    /// `!vma->vm_mm`: the gate VMA ([vsyscall]).
    NoMm,
    /// `vm_flags & VM_NOHUGEPAGE`.
    NoHugepageFlag,
    /// MMF_DISABLE_THP (≤6.17), MMF_DISABLE_THP_COMPLETELY (6.18+).
    MmfDisable,
    /// 6.18+: MMF_DISABLE_THP_EXCEPT_ADVISED, unless VM_HUGEPAGE or a forced collapse.
    MmfExceptAdvised,
    /// `VM_NO_KHUGEPAGED` (IO, DONTEXPAND, PFNMAP, MIXEDMAP, HUGETLB) for every caller (≤6.7).
    SpecialAllCallers,
    /// The same, for khugepaged and collapse only (6.8+).
    SpecialKhugepagedOnly,
    /// Not for faults: an aligned window of some allowed size inside the VMA (and, for files,
    /// a file offset aligned to it).
    SizeAlignment,
    /// Not for faults: shmem/tmpfs decide by shmem_enabled and the mount's huge= option.
    Shmem,
    /// ≤6.7: the global sysfs mode for every non-shmem VMA (anonymous ones included).
    SysfsGlobal,
    /// ≤6.7: read-only file THP (CONFIG_READ_ONLY_THP_FOR_FS, VM_EXEC) allows file VMAs.
    FileThp,
    /// ≤6.7: any other non-anonymous VMA is refused.
    NotAnonymous,
    /// 6.8+: non-anonymous VMAs: the global sysfs mode, then ->huge_fault or read-only file
    /// THP, else refused.
    NonAnonymous,
    /// khugepaged and collapse skip a VMA that has never been faulted (no anon_vma).
    NoAnonVma,
}

/// 6.0–6.7 `hugepage_vma_check()` (v6.1.192 mm/huge_memory.c:77).
pub const HUGEPAGE_VMA_CHECK_ORDER: &[Step] = &[
    Step::NoMm,
    Step::NoHugepageFlag,
    Step::MmfDisable,
    Step::SpecialAllCallers,
    Step::SizeAlignment,
    Step::Shmem,
    Step::SysfsGlobal,
    Step::FileThp,
    Step::NotAnonymous,
    Step::NoAnonVma,
];

/// 6.8–6.17 `thp_vma_allowable_orders()` + `__thp_vma_allowable_orders()` (v6.12.0
/// mm/huge_memory.c:87).
pub const ALLOWABLE_ORDERS_ORDER: &[Step] = &[
    Step::WrapperAnonSysfs,
    Step::NoMm,
    Step::NoHugepageFlag,
    Step::MmfDisable,
    Step::SpecialKhugepagedOnly,
    Step::SizeAlignment,
    Step::Shmem,
    Step::NonAnonymous,
    Step::NoAnonVma,
];

/// 6.18+: as 6.8–6.17, with `vma_thp_disabled()` testing NOHUGEPAGE, COMPLETELY, then
/// EXCEPT_ADVISED unless VM_HUGEPAGE (6.18.2 huge_mm.h:331).
pub const ALLOWABLE_ORDERS_TVA_TYPE_ORDER: &[Step] = &[
    Step::WrapperAnonSysfs,
    Step::NoMm,
    Step::NoHugepageFlag,
    Step::MmfDisable,
    Step::MmfExceptAdvised,
    Step::SpecialKhugepagedOnly,
    Step::SizeAlignment,
    Step::Shmem,
    Step::NonAnonymous,
    Step::NoAnonVma,
];

/// Where the allow-check's layout was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedFrom {
    /// The function's prototype in this kernel's BTF.
    Btf,
    /// No BTF: guessed from the version number.
    Release,
}

/// The running kernel's allow-check.
#[derive(Clone, Debug, Serialize)]
pub struct AllowCheck {
    pub function: &'static str,
    /// Parameter names as BTF gives them (empty when decided from the release).
    pub params: Vec<String>,
    pub encoding: CallEncoding,
    #[serde(skip)]
    pub order: &'static [Step],
    pub decided_from: DecidedFrom,
}

impl AllowCheck {
    /// Whether the raw return value a probe read means "allowed". `hugepage_vma_check` returns
    /// bool, which the x86-64 ABI passes in AL alone (the rest of RAX is undefined); the 6.8+
    /// function returns a bitmask of orders in the whole register.
    pub fn allowed(&self, ret: u64) -> bool {
        if self.function == "hugepage_vma_check" { ret & 0xff != 0 } else { ret != 0 }
    }

    pub fn has_wrapper(&self) -> bool {
        self.order.contains(&Step::WrapperAnonSysfs)
    }

    /// From the function's BTF prototype; `None` when BTF has neither function.
    pub fn from_btf(btf: &KernelBtf) -> Option<Self> {
        if let Some(params) = btf.function_params("__thp_vma_allowable_orders") {
            let enumerator = |name: &str, default: u8| btf.enumerator(name).map(|v| v as u8).unwrap_or(default);
            let (encoding, order) = if let Some(index) = position(&params, "type") {
                let encoding = CallEncoding::TvaType {
                    index,
                    smaps: enumerator("TVA_SMAPS", 0),
                    page_fault: enumerator("TVA_PAGEFAULT", 1),
                    khugepaged: enumerator("TVA_KHUGEPAGED", 2),
                    forced_collapse: enumerator("TVA_FORCED_COLLAPSE", 3),
                };
                (encoding, ALLOWABLE_ORDERS_TVA_TYPE_ORDER)
            } else if let Some(index) = position(&params, "tva_flags") {
                (CallEncoding::TvaFlags { index }, ALLOWABLE_ORDERS_ORDER)
            } else {
                (bools(&params)?, ALLOWABLE_ORDERS_ORDER)
            };
            return Some(Self {
                function: "__thp_vma_allowable_orders",
                params,
                encoding,
                order,
                decided_from: DecidedFrom::Btf,
            });
        }
        let params = btf.function_params("hugepage_vma_check")?;
        let encoding = bools(&params)?;
        Some(Self {
            function: "hugepage_vma_check",
            params,
            encoding,
            order: HUGEPAGE_VMA_CHECK_ORDER,
            decided_from: DecidedFrom::Btf,
        })
    }

    /// Without BTF: the layout each release line is known to have (docs/kernel-facts.md#thp-allow-check; whether
    /// tva_flags arrived in 6.10 or 6.11 is unverified).
    pub fn from_release(release: &Release) -> Self {
        let bools = CallEncoding::Bools { smaps: 2, in_pf: 3, enforce_sysfs: 4 };
        let (function, encoding, order) = if release.at_least(6, 18) {
            let encoding =
                CallEncoding::TvaType { index: 2, smaps: 0, page_fault: 1, khugepaged: 2, forced_collapse: 3 };
            ("__thp_vma_allowable_orders", encoding, ALLOWABLE_ORDERS_TVA_TYPE_ORDER)
        } else if release.at_least(6, 10) {
            ("__thp_vma_allowable_orders", CallEncoding::TvaFlags { index: 2 }, ALLOWABLE_ORDERS_ORDER)
        } else if release.at_least(6, 8) {
            ("__thp_vma_allowable_orders", bools, ALLOWABLE_ORDERS_ORDER)
        } else {
            ("hugepage_vma_check", bools, HUGEPAGE_VMA_CHECK_ORDER)
        };
        Self { function, params: Vec::new(), encoding, order, decided_from: DecidedFrom::Release }
    }
}

impl AllowCheck {
    /// The running kernel's allow-check: from BTF, else from the release number.
    pub fn of(kernel: &Kernel) -> Self {
        kernel.btf().ok().and_then(|btf| Self::from_btf(&btf)).unwrap_or_else(|| Self::from_release(&kernel.release))
    }

    /// Why this kernel's checks cannot be counted: before 6.0 no one out-of-line function takes
    /// the caller's arguments (the fault path and smaps use inline helpers, and 5.x's
    /// `hugepage_vma_check(vma, vm_flags)` is khugepaged's own). Told by BTF, which then has
    /// neither prototype, else by the release. The refusal order still models the judgement.
    pub fn uncountable(kernel: &Kernel) -> Option<String> {
        let countable = match kernel.btf() {
            Ok(btf) => Self::from_btf(&btf).is_some(),
            Err(_) => kernel.release.at_least(6, 0),
        };
        (!countable).then(|| {
            "this kernel has no single allow-check with its caller's arguments (6.0+; before, inline helpers and \
             khugepaged's own hugepage_vma_check): eligibility is derived from /proc and sysfs, not counted"
                .into()
        })
    }
}

/// Which bits of mm->flags mean what: from BTF, else from the release (6.18 split them).
pub fn disable_bits(kernel: &Kernel) -> ThpDisableBits {
    match kernel.btf() {
        Ok(btf) => ThpDisableBits::from_btf(&btf),
        Err(_) if kernel.release.at_least(6, 18) => ThpDisableBits::Split { completely: 24, except_advised: 23 },
        Err(_) => ThpDisableBits::Single { disable: 24 },
    }
}

fn position(params: &[String], name: &str) -> Option<usize> {
    params.iter().position(|p| p == name)
}

fn bools(params: &[String]) -> Option<CallEncoding> {
    Some(CallEncoding::Bools {
        smaps: position(params, "smaps")?,
        in_pf: position(params, "in_pf")?,
        enforce_sysfs: position(params, "enforce_sysfs")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bools_of_6_1_decode_every_caller() {
        let e = bools(&names(&["vma", "vm_flags", "smaps", "in_pf", "enforce_sysfs"])).unwrap();
        assert_eq!(e.arg_mask(), 0b11100);
        // Argument bytes are args 2..=5: (smaps, in_pf, enforce_sysfs, -).
        assert_eq!(e.decode([0, 1, 1, 0]), Some(Call::PageFault));
        assert_eq!(e.decode([1, 0, 1, 0]), Some(Call::Smaps));
        assert_eq!(e.decode([0, 0, 1, 0]), Some(Call::Khugepaged));
        assert_eq!(e.decode([0, 0, 0, 0]), Some(Call::ForcedCollapse));
    }

    #[test]
    fn tva_flags_of_6_12() {
        let e = CallEncoding::TvaFlags { index: 2 };
        assert_eq!(e.arg_mask(), 0b100);
        assert_eq!(e.decode([TVA_IN_PF | TVA_ENFORCE_SYSFS, 0, 0, 0]), Some(Call::PageFault));
        assert_eq!(e.decode([TVA_SMAPS | TVA_ENFORCE_SYSFS, 0, 0, 0]), Some(Call::Smaps));
        assert_eq!(e.decode([TVA_ENFORCE_SYSFS, 0, 0, 0]), Some(Call::Khugepaged));
        assert_eq!(e.decode([0, 0, 0, 0]), Some(Call::ForcedCollapse));
    }

    #[test]
    fn tva_type_of_6_18() {
        let e = CallEncoding::TvaType { index: 2, smaps: 0, page_fault: 1, khugepaged: 2, forced_collapse: 3 };
        assert_eq!(e.decode([1, 0, 0, 0]), Some(Call::PageFault));
        assert_eq!(e.decode([3, 0, 0, 0]), Some(Call::ForcedCollapse));
        assert_eq!(e.decode([9, 0, 0, 0]), None, "an unknown enumerator is not guessed");
    }

    #[test]
    fn release_fallback_matches_the_known_lines() {
        let r = |text: &str| Release::parse(text, "");
        let check = AllowCheck::from_release(&r("6.1.0-57-amd64"));
        assert_eq!((check.function, check.has_wrapper()), ("hugepage_vma_check", false));
        let check = AllowCheck::from_release(&r("6.12.117+deb12-amd64"));
        assert_eq!(check.encoding, CallEncoding::TvaFlags { index: 2 });
        assert!(check.has_wrapper());
        let check = AllowCheck::from_release(&r("6.18.44-fc"));
        assert!(check.order.contains(&Step::MmfExceptAdvised));
        let check = AllowCheck::from_release(&r("6.8.0-31-generic"));
        assert!(matches!(check.encoding, CallEncoding::Bools { .. }));
    }

    #[test]
    fn a_bool_return_is_read_from_its_low_byte() {
        let r = |text: &str| Release::parse(text, "");
        let hvc = AllowCheck::from_release(&r("6.1.0-57-amd64"));
        assert!(!hvc.allowed(0xdead_0000_0000_0000), "upper bits of RAX are not the bool");
        assert!(hvc.allowed(1));
        let orders = AllowCheck::from_release(&r("6.12.117+deb12-amd64"));
        assert!(orders.allowed(1 << 9), "PMD order");
        assert!(!orders.allowed(0));
    }

    #[test]
    fn every_order_starts_with_the_wrapper_only_on_6_8_and_later() {
        assert_ne!(HUGEPAGE_VMA_CHECK_ORDER[0], Step::WrapperAnonSysfs);
        assert_eq!(ALLOWABLE_ORDERS_ORDER[0], Step::WrapperAnonSysfs);
        assert_eq!(ALLOWABLE_ORDERS_TVA_TYPE_ORDER[0], Step::WrapperAnonSysfs);
    }
}
