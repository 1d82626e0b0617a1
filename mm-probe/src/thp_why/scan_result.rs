//! khugepaged's scan results (`enum scan_result` in mm/khugepaged.c): their names on the running
//! kernel and what each one means for the process.
//!
//! The numbering moves between versions (6.1 added SCAN_PMD_NONE, SCAN_PMD_MAPPED and
//! SCAN_PTE_MAPPED_HUGEPAGE and had dropped 5.10's SCAN_SWAP_CACHE_PAGE; 6.18 removed
//! SCAN_PAGE_RO and shifted every later value; 7.2 merged SCAN_PMD_NULL and SCAN_PMD_NONE and
//! added two), so a raw result is never decoded by number: the names come from the kernel's BTF
//! (`enum scan_result`), else from the scan tracepoint's own `__print_symbolic` table in tracefs.
//! The meanings below are keyed by name and were read from mm/khugepaged.c of 5.10, 6.1, 6.12
//! and 6.18 and the 7.2 build's BTF (docs/kernel-facts.md#khugepaged).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::kernel::KernelBtf;

/// Where this kernel's result names came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NamesFrom {
    /// `enum scan_result` in the kernel's BTF.
    Btf,
    /// The scan tracepoint's format file.
    Tracefs,
    /// Neither: results are shown by number.
    Unknown,
}

/// This kernel's scan result names, by raw value.
#[derive(Clone, Debug)]
pub struct ScanResults {
    names: BTreeMap<u32, String>,
    pub from: NamesFrom,
}

impl ScanResults {
    /// `SCAN_EXCEED_NONE_PTE` → `exceed_none_pte`, for every enumerator of `enum scan_result`.
    pub fn from_btf(btf: &KernelBtf) -> Option<Self> {
        let values = btf.enum_values("scan_result")?;
        let names = values
            .into_iter()
            .filter_map(|(name, value)| {
                let short = name.strip_prefix("SCAN_").unwrap_or(&name).to_ascii_lowercase();
                Some((u32::try_from(value).ok()?, short))
            })
            .collect();
        Some(Self { names, from: NamesFrom::Btf })
    }

    /// The tracepoint's printed names, mapped to the BTF spelling where they differ
    /// (`page_locked` → `page_lock`), so that the meanings below apply to either source.
    pub fn from_tracefs(symbols: &[(i64, String)]) -> Self {
        let names = symbols
            .iter()
            .filter_map(|(value, printed)| {
                let name = MEANINGS.iter().find(|m| m.printed == printed).map_or(printed.as_str(), |m| m.name);
                Some((u32::try_from(*value).ok()?, name.to_string()))
            })
            .collect();
        Self { names, from: NamesFrom::Tracefs }
    }

    pub fn unknown() -> Self {
        Self { names: BTreeMap::new(), from: NamesFrom::Unknown }
    }

    /// The name of a raw result; `result_<n>` when this kernel did not say.
    pub fn name(&self, raw: u32) -> String {
        self.names.get(&raw).cloned().unwrap_or_else(|| format!("result_{raw}"))
    }
}

/// What a scan's result says about the range it scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The range was collapsed into a huge page.
    Collapsed,
    /// The range already is a huge page (PMD-mapped): nothing to do.
    AlreadyHuge,
    /// Nothing is mapped there yet (no page table): nothing to collapse.
    Empty,
    /// The range stays in small pages.
    Failed,
}

/// One result's meaning: the limit or fact behind it and what would change it.
#[derive(Clone, Copy, Debug)]
pub struct Meaning {
    /// The BTF enumerator without `SCAN_`, lower case.
    pub name: &'static str,
    /// The tracepoint's printed name.
    pub printed: &'static str,
    pub outcome: Outcome,
    /// The khugepaged sysfs knob whose limit this result is, if any.
    pub knob: Option<&'static str>,
    pub why: &'static str,
    pub fix: &'static str,
}

const fn failed(name: &'static str, printed: &'static str, why: &'static str, fix: &'static str) -> Meaning {
    Meaning { name, printed, outcome: Outcome::Failed, knob: None, why, fix }
}

const fn limit(name: &'static str, knob: &'static str, why: &'static str, fix: &'static str) -> Meaning {
    Meaning { name, printed: name, outcome: Outcome::Failed, knob: Some(knob), why, fix }
}

const COLLAPSE_ANYWAY: &str = "madvise(MADV_COLLAPSE) (6.1+) collapses the range synchronously and ignores \
                               khugepaged's max_ptes_* limits and reference test";

pub const MEANINGS: &[Meaning] = &[
    Meaning {
        name: "succeed",
        printed: "succeeded",
        outcome: Outcome::Collapsed,
        knob: None,
        why: "collapsed into a huge page",
        fix: "",
    },
    Meaning {
        name: "pmd_mapped",
        printed: "page_pmd_mapped",
        outcome: Outcome::AlreadyHuge,
        knob: None,
        why: "already a huge page",
        fix: "",
    },
    Meaning {
        name: "pmd_null",
        printed: "pmd_null",
        outcome: Outcome::Empty,
        knob: None,
        why: "nothing mapped in the range yet (no page table)",
        fix: "",
    },
    Meaning {
        name: "pmd_none",
        printed: "pmd_none",
        outcome: Outcome::Empty,
        knob: None,
        why: "nothing mapped in the range yet (empty page-table entry)",
        fix: "",
    },
    Meaning {
        name: "no_pte_table",
        printed: "no_pte_table",
        outcome: Outcome::Empty,
        knob: None,
        why: "nothing mapped in the range yet (no page table; 7.2 merged pmd_null and pmd_none into this)",
        fix: "",
    },
    limit(
        "exceed_none_pte",
        "max_ptes_none",
        "more of the range's 512 PTEs are empty than max_ptes_none allows: the region is sparsely touched",
        "touch the region densely before khugepaged comes, or raise khugepaged/max_ptes_none (each empty \
         PTE then becomes resident memory)",
    ),
    limit(
        "exceed_swap_pte",
        "max_ptes_swap",
        "more of the range's pages are swapped out than max_ptes_swap allows",
        "keep the region resident (memory.low, less pressure) or raise khugepaged/max_ptes_swap (khugepaged \
         then swaps them in)",
    ),
    limit(
        "exceed_shared_pte",
        "max_ptes_shared",
        "more of the range's pages are shared with another process (after fork) than max_ptes_shared allows",
        "collapse before forking, or raise khugepaged/max_ptes_shared",
    ),
    failed(
        "pte_non_present",
        "pte_non_present",
        "a PTE holds a migration or device entry, not a page",
        "transient while pages migrate; persistent for device-private memory",
    ),
    failed(
        "pte_uffd_wp",
        "pte_uffd_wp",
        "userfaultfd write-protects PTEs in the range; khugepaged leaves such ranges alone",
        "none while the userfaultfd write-protection is armed",
    ),
    failed(
        "pte_mapped_hugepage",
        "pte_mapped_hugepage",
        "the range already holds a huge folio mapped by PTEs; the kernel remaps it in place",
        "",
    ),
    failed(
        "page_ro",
        "no_writable_page",
        "no page in the range is mapped writable (kernels before 6.18 collapse only ranges with one)",
        "write to the region once, or use MADV_COLLAPSE",
    ),
    failed(
        "lack_referenced_page",
        "lack_referenced_page",
        "no page in the range was referenced since the last scan: khugepaged collapses only memory in use",
        COLLAPSE_ANYWAY,
    ),
    failed("page_null", "page_null", "a PTE maps a special or zone-device page", "none: such pages never collapse"),
    failed(
        "scan_abort",
        "scan_aborted",
        "the scan stopped: the process was exiting or its THP was disabled meanwhile",
        "",
    ),
    failed(
        "page_count",
        "not_suitable_page_count",
        "a page holds more references than its mappings: pinned (GUP: RDMA, VFIO, io_uring buffers) or \
         under I/O",
        "pin the memory after it is huge (MADV_COLLAPSE before registering it), or pin less of it",
    ),
    failed(
        "page_lru",
        "page_not_in_lru",
        "a page is off the LRU lists (being migrated, reclaimed or isolated)",
        "transient: a later scan usually succeeds",
    ),
    failed("page_lock", "page_locked", "a page was locked by someone else", "transient: a later scan usually succeeds"),
    failed("page_anon", "page_not_anon", "a page in an anonymous range is not anonymous", ""),
    failed(
        "page_lazyfree",
        "page_lazyfree",
        "a page was freed lazily (madvise(MADV_FREE)) and may be reclaimed at any time",
        "do not MADV_FREE memory that should become huge",
    ),
    failed("page_compound", "page_compound", "a page is already part of a large folio", ""),
    failed("any_process", "no_process_for_page", "no process maps the page any more (it is being freed)", ""),
    failed("vma_null", "vma_null", "the region was unmapped during the scan", ""),
    failed(
        "vma_check",
        "vma_check_failed",
        "the region was not eligible when khugepaged rechecked it (madvise, prctl or sysfs policy changed, \
         or the VMA is not huge-page capable)",
        "see the region's reason above: what refuses the fault path refuses the collapse too",
    ),
    failed(
        "address_range",
        "not_suitable_address_range",
        "the 2 MiB-aligned range does not fit inside the region",
        "align the region to 2 MiB and make it at least 2 MiB",
    ),
    failed(
        "swap_cache_page",
        "page_swap_cache",
        "a page mapped read-only is still in the swap cache and in use there (5.x kernels)",
        "transient after swap-in: writing to the region, or less memory pressure, lets a later scan collapse it",
    ),
    failed("del_page_lru", "could_not_delete_page_from_lru", "a page could not be taken off its LRU list", ""),
    failed(
        "alloc_huge_page_fail",
        "alloc_huge_page_failed",
        "no free 2 MiB block to copy the range into: memory is fragmented",
        "compact memory (echo 1 > /proc/sys/vm/compact_memory) or let khugepaged compact (khugepaged/defrag 1); \
         it waits alloc_sleep_millisecs before trying again",
    ),
    failed(
        "cgroup_charge_fail",
        "ccgroup_charge_failed",
        "the cgroup's memory limit refused the huge page's charge",
        "leave the cgroup headroom above its usage (memory.max)",
    ),
    failed("truncated", "truncated", "the file was truncated during the collapse", ""),
    failed("page_has_private", "page_has_private", "a page-cache page has private data that could not be dropped", ""),
    failed("store_failed", "store_failed", "the page cache could not take the huge page", ""),
    failed("copy_mc", "copy_poisoned_page", "a page had a memory error during the copy", ""),
    failed("page_filled", "page_filled", "the page cache already holds a large folio there", ""),
    failed(
        "page_dirty_or_writeback",
        "page_dirty_or_writeback",
        "a file page is dirty or under writeback",
        "transient: a scan after writeback usually succeeds",
    ),
    failed("fail", "failed", "the collapse failed for a reason the kernel does not name", ""),
];

/// The meaning of a named result; results this table does not know are failures without a stated
/// cause (the name is still shown).
pub fn meaning(name: &str) -> Option<&'static Meaning> {
    MEANINGS.iter().find(|m| m.name == name)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel::btf::tests::btf_with_enum;

    /// `enum scan_result` as each generation declares it (mm/khugepaged.c). 6.1 is Debian's
    /// 6.1.192, whose tracefs table the matrix printed: it has a later kernel's SCAN_STORE_FAILED
    /// backported.
    pub(crate) const SCAN_RESULT_6_1: &[&str] = &[
        "SCAN_FAIL",
        "SCAN_SUCCEED",
        "SCAN_PMD_NULL",
        "SCAN_PMD_NONE",
        "SCAN_PMD_MAPPED",
        "SCAN_EXCEED_NONE_PTE",
        "SCAN_EXCEED_SWAP_PTE",
        "SCAN_EXCEED_SHARED_PTE",
        "SCAN_PTE_NON_PRESENT",
        "SCAN_PTE_UFFD_WP",
        "SCAN_PTE_MAPPED_HUGEPAGE",
        "SCAN_PAGE_RO",
        "SCAN_LACK_REFERENCED_PAGE",
        "SCAN_PAGE_NULL",
        "SCAN_SCAN_ABORT",
        "SCAN_PAGE_COUNT",
        "SCAN_PAGE_LRU",
        "SCAN_PAGE_LOCK",
        "SCAN_PAGE_ANON",
        "SCAN_PAGE_COMPOUND",
        "SCAN_ANY_PROCESS",
        "SCAN_VMA_NULL",
        "SCAN_VMA_CHECK",
        "SCAN_ADDRESS_RANGE",
        "SCAN_DEL_PAGE_LRU",
        "SCAN_ALLOC_HUGE_PAGE_FAIL",
        "SCAN_CGROUP_CHARGE_FAIL",
        "SCAN_TRUNCATED",
        "SCAN_PAGE_HAS_PRIVATE",
        "SCAN_STORE_FAILED",
    ];
    /// 5.10.262 (Debian 11, BTF of its build): no SCAN_PMD_NONE, SCAN_PMD_MAPPED,
    /// SCAN_PTE_MAPPED_HUGEPAGE or SCAN_STORE_FAILED; SCAN_SWAP_CACHE_PAGE after
    /// SCAN_ADDRESS_RANGE.
    pub(crate) fn scan_result_5_10() -> Vec<&'static str> {
        let newer = ["SCAN_PMD_NONE", "SCAN_PMD_MAPPED", "SCAN_PTE_MAPPED_HUGEPAGE", "SCAN_STORE_FAILED"];
        let mut names: Vec<&str> = Vec::new();
        for &name in SCAN_RESULT_6_1.iter().filter(|name| !newer.contains(name)) {
            names.push(name);
            if name == "SCAN_ADDRESS_RANGE" {
                names.push("SCAN_SWAP_CACHE_PAGE");
            }
        }
        names
    }

    /// 6.12.118: 6.1's, then SCAN_COPY_MC and SCAN_PAGE_FILLED.
    pub(crate) fn scan_result_6_12() -> Vec<&'static str> {
        [SCAN_RESULT_6_1, &["SCAN_COPY_MC", "SCAN_PAGE_FILLED"]].concat()
    }

    /// 6.18: 6.12's without SCAN_PAGE_RO, every later value one lower.
    pub(crate) fn scan_result_6_18() -> Vec<&'static str> {
        scan_result_6_12().into_iter().filter(|&name| name != "SCAN_PAGE_RO").collect()
    }

    /// 7.2.13 (Debian unstable, BTF of its build): SCAN_PMD_NULL and SCAN_PMD_NONE became
    /// SCAN_NO_PTE_TABLE, SCAN_PAGE_LAZYFREE came after SCAN_PAGE_ANON, SCAN_PAGE_DIRTY_OR_WRITEBACK
    /// at the end.
    pub(crate) fn scan_result_7_2() -> Vec<&'static str> {
        let mut names: Vec<&str> = Vec::new();
        for name in scan_result_6_18() {
            match name {
                "SCAN_PMD_NULL" => names.push("SCAN_NO_PTE_TABLE"),
                "SCAN_PMD_NONE" => {}
                "SCAN_PAGE_ANON" => names.extend(["SCAN_PAGE_ANON", "SCAN_PAGE_LAZYFREE"]),
                other => names.push(other),
            }
        }
        names.push("SCAN_PAGE_DIRTY_OR_WRITEBACK");
        names
    }

    fn names_of(declared: &[&str]) -> ScanResults {
        let btf = KernelBtf::from_bytes(btf_with_enum("scan_result", declared)).unwrap();
        ScanResults::from_btf(&btf).unwrap()
    }

    /// The same number means different results across generations; the names follow BTF.
    #[test]
    fn scan_results_are_named_from_btf_on_every_generation() {
        let (v6_1, v6_12, v6_18) =
            (names_of(SCAN_RESULT_6_1), names_of(&scan_result_6_12()), names_of(&scan_result_6_18()));
        for names in [&v6_1, &v6_12, &v6_18] {
            assert_eq!(names.from, NamesFrom::Btf);
            assert_eq!((names.name(1).as_str(), names.name(5).as_str()), ("succeed", "exceed_none_pte"));
        }
        assert_eq!(v6_1.name(11), "page_ro");
        assert_eq!(v6_1.name(25), "alloc_huge_page_fail");
        assert_eq!(v6_1.name(29), "store_failed");
        assert_eq!(v6_1.name(30), "result_30", "6.1 ends at store_failed (29)");
        assert_eq!(v6_12.name(11), "page_ro");
        assert_eq!(v6_12.name(31), "page_filled");
        // 6.18 dropped SCAN_PAGE_RO: 11 is the next result, and every later one moved down.
        assert_eq!(v6_18.name(11), "lack_referenced_page");
        assert_eq!(v6_18.name(24), "alloc_huge_page_fail");
        assert_eq!(v6_18.name(30), "page_filled");
        // 7.2 merged the two empty-range results: exceed_none_pte moved down to 4.
        let v7_2 = names_of(&scan_result_7_2());
        assert_eq!([1, 2, 3, 4].map(|v| v7_2.name(v)), ["succeed", "no_pte_table", "pmd_mapped", "exceed_none_pte"]);
        assert_eq!((v7_2.name(17).as_str(), v7_2.name(24).as_str()), ("page_lazyfree", "alloc_huge_page_fail"));
        assert_eq!(v7_2.name(31), "page_dirty_or_writeback");
        // 5.10 numbers the PTE checks lower and has the swap cache result 6.1 dropped.
        let v5_10 = names_of(&scan_result_5_10());
        assert_eq!(
            [3, 8, 21, 26].map(|v| v5_10.name(v)),
            ["exceed_none_pte", "page_ro", "swap_cache_page", "page_has_private"]
        );
    }

    /// Every result any generation declares has a meaning, and the tracefs spelling maps onto it.
    #[test]
    fn every_declared_result_has_a_meaning_under_either_spelling() {
        let generations =
            [scan_result_5_10(), SCAN_RESULT_6_1.to_vec(), scan_result_6_12(), scan_result_6_18(), scan_result_7_2()];
        for declared in generations {
            for name in declared {
                let short = name.strip_prefix("SCAN_").unwrap().to_ascii_lowercase();
                assert!(meaning(&short).is_some(), "{name} has no meaning");
            }
        }
        // 6.18's tracefs table, abridged: printed names differ from BTF's for some.
        let printed = [(1, "succeeded"), (4, "page_pmd_mapped"), (5, "exceed_none_pte"), (16, "page_locked")];
        let symbols: Vec<(i64, String)> = printed.iter().map(|&(v, n)| (v, n.to_string())).collect();
        let names = ScanResults::from_tracefs(&symbols);
        assert_eq!(names.from, NamesFrom::Tracefs);
        assert_eq!([1, 4, 5, 16].map(|v| names.name(v)), ["succeed", "pmd_mapped", "exceed_none_pte", "page_lock"]);
    }
}
