//! The system's THP policy as /sys/kernel/mm/transparent_hugepage states it: the global
//! `enabled`, `defrag` and `shmem_enabled` choices, the per-size (mTHP, 6.8+) controls under
//! `hugepages-<size>kB/`, and khugepaged's settings.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::Serialize;

pub const SYSFS_THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// `enabled`: the global THP mode for anonymous memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GlobalMode {
    Always,
    Madvise,
    Never,
}

/// A per-size `enabled` control (6.8+): `inherit` follows the global mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SizeMode {
    Always,
    Inherit,
    Madvise,
    Never,
}

#[derive(Clone, Debug, Serialize)]
pub struct SizeControl {
    /// The size named by the directory (`hugepages-64kB` → 65536).
    pub size_bytes: u64,
    /// Page order of this size (log2 of size / 4 KiB).
    pub order: u32,
    /// Anonymous memory (`enabled`); absent for sizes only shmem may use.
    pub enabled: Option<SizeMode>,
    /// shmem (`shmem_enabled`, 6.11+).
    pub shmem_enabled: Option<String>,
    /// The size's event counters (`stats/`, 6.10+; empty before): system-wide, so the report
    /// shows their change over the run, not these values.
    #[serde(skip)]
    pub stats: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemPolicy {
    /// The transparent_hugepage directory exists: the kernel has THP (CONFIG_TRANSPARENT_HUGEPAGE;
    /// Debian's PREEMPT_RT kernels are built without it).
    pub thp_built_in: bool,
    /// Null when the kernel has no THP.
    pub enabled: Option<GlobalMode>,
    pub defrag: Option<String>,
    pub shmem_enabled: Option<String>,
    pub hpage_pmd_size_bytes: u64,
    /// Per-size controls, smallest first; empty before 6.8.
    pub sizes: Vec<SizeControl>,
    pub khugepaged: BTreeMap<String, u64>,
}

/// The bracketed choice of a sysfs selector: `always [madvise] never` → `madvise`.
pub fn parse_choice(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

fn parse_global(choice: &str) -> Option<GlobalMode> {
    match choice {
        "always" => Some(GlobalMode::Always),
        "madvise" => Some(GlobalMode::Madvise),
        "never" => Some(GlobalMode::Never),
        _ => None,
    }
}

fn parse_size_mode(choice: &str) -> Option<SizeMode> {
    match choice {
        "always" => Some(SizeMode::Always),
        "inherit" => Some(SizeMode::Inherit),
        "madvise" => Some(SizeMode::Madvise),
        "never" => Some(SizeMode::Never),
        _ => None,
    }
}

/// Every file of `dir` that holds one number, by name (empty when `dir` is absent).
fn read_numbers(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let value = std::fs::read_to_string(entry.path()).ok()?.trim().parse().ok()?;
            Some((entry.file_name().to_string_lossy().into_owned(), value))
        })
        .collect()
}

impl SystemPolicy {
    pub fn read() -> Self {
        Self::read_from(Path::new(SYSFS_THP))
    }

    /// Reads a transparent_hugepage directory (a test passes a copy).
    pub fn read_from(root: &Path) -> Self {
        let read = |p: PathBuf| std::fs::read_to_string(p).ok();
        let choice = |name: &str| read(root.join(name)).and_then(|t| parse_choice(&t));
        let mut sizes: Vec<SizeControl> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let size_kb: u64 = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
                let dir = entry.path();
                Some(SizeControl {
                    size_bytes: size_kb * 1024,
                    order: (size_kb / 4).max(1).ilog2(),
                    enabled: read(dir.join("enabled")).and_then(|t| parse_choice(&t)).and_then(|c| parse_size_mode(&c)),
                    shmem_enabled: read(dir.join("shmem_enabled")).and_then(|t| parse_choice(&t)),
                    stats: read_numbers(&dir.join("stats")),
                })
            })
            .collect();
        sizes.sort_by_key(|s| s.size_bytes);
        let khugepaged = read_numbers(&root.join("khugepaged"));
        Self {
            thp_built_in: root.is_dir(),
            enabled: choice("enabled").and_then(|c| parse_global(&c)),
            defrag: choice("defrag"),
            shmem_enabled: choice("shmem_enabled"),
            hpage_pmd_size_bytes: read(root.join("hpage_pmd_size"))
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(2 << 20),
            sizes,
            khugepaged,
        }
    }

    pub fn pmd_order(&self) -> u32 {
        (self.hpage_pmd_size_bytes / 4096).max(1).ilog2()
    }

    /// Whether the kernel has per-size controls (6.8+); before that only the PMD size exists
    /// and it follows the global mode.
    pub fn has_size_controls(&self) -> bool {
        self.sizes.iter().any(|s| s.enabled.is_some())
    }

    /// The anonymous per-size mode of `order`: the control where present, else the PMD size
    /// inherits the global mode and no other size exists.
    pub fn anon_size_mode(&self, order: u32) -> SizeMode {
        if !self.has_size_controls() {
            return if order == self.pmd_order() { SizeMode::Inherit } else { SizeMode::Never };
        }
        self.sizes.iter().find(|s| s.order == order).and_then(|s| s.enabled).unwrap_or(SizeMode::Never)
    }

    /// Orders with an anonymous control (PMD order alone before 6.8), smallest first.
    pub fn anon_orders(&self) -> Vec<u32> {
        if !self.has_size_controls() {
            return vec![self.pmd_order()];
        }
        self.sizes.iter().filter(|s| s.enabled.is_some()).map(|s| s.order).collect()
    }

    /// The mask the 6.8+ inline wrapper `thp_vma_allowable_orders()` applies to anonymous VMAs:
    /// sizes set to always, plus madvise sizes when VM_HUGEPAGE, plus inherit sizes when the
    /// global mode is always (or madvise with VM_HUGEPAGE). Also right for ≤6.7, where the PMD
    /// size "inherits" the global mode.
    pub fn anon_orders_allowed(&self, vm_hugepage: bool) -> Vec<u32> {
        let global = self.enabled.unwrap_or(GlobalMode::Never);
        let inherit = global == GlobalMode::Always || (vm_hugepage && global != GlobalMode::Never);
        self.anon_orders()
            .into_iter()
            .filter(|&order| match self.anon_size_mode(order) {
                SizeMode::Always => true,
                SizeMode::Madvise => vm_hugepage,
                SizeMode::Inherit => inherit,
                SizeMode::Never => false,
            })
            .collect()
    }

    /// The shmem per-size choice for the PMD size, when the kernel has one and it is not
    /// `inherit` (6.11+); else the global `shmem_enabled`.
    pub fn shmem_pmd_choice(&self) -> Option<String> {
        let per_size =
            self.sizes.iter().find(|s| s.size_bytes == self.hpage_pmd_size_bytes).and_then(|s| s.shmem_enabled.clone());
        match per_size {
            Some(choice) if choice != "inherit" => Some(choice),
            _ => self.shmem_enabled.clone(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a transparent_hugepage tree like the one of the 6.18.44 development machine.
    pub fn sample_tree(enabled: &str, pmd_size_mode: &str, small_size_mode: &str) -> tempdir::TempTree {
        let tree = tempdir::TempTree::new();
        tree.write("enabled", &format!("{enabled}\n"));
        tree.write("defrag", "always defer defer+madvise [madvise] never\n");
        tree.write("shmem_enabled", "always within_size advise [never] deny force\n");
        tree.write("hpage_pmd_size", "2097152\n");
        tree.write("hugepages-2048kB/enabled", &format!("{pmd_size_mode}\n"));
        tree.write("hugepages-2048kB/shmem_enabled", "always [inherit] within_size advise never\n");
        tree.write("hugepages-64kB/enabled", &format!("{small_size_mode}\n"));
        tree.write("hugepages-8kB/shmem_enabled", "always [inherit] within_size advise never\n");
        tree.write("khugepaged/pages_to_scan", "4096\n");
        tree.write("khugepaged/scan_sleep_millisecs", "10000\n");
        tree
    }

    /// A throwaway directory (no crate for it in this workspace).
    pub mod tempdir {
        use std::path::{Path, PathBuf};

        pub struct TempTree(pub PathBuf);

        impl TempTree {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let dir = std::env::temp_dir().join(format!(
                    "mm-probe-thp-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&dir).unwrap();
                Self(dir)
            }

            pub fn write(&self, rel: &str, text: &str) {
                let path = self.0.join(rel);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }

            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for TempTree {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn choices() {
        assert_eq!(parse_choice("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(parse_choice("[always] madvise never").as_deref(), Some("always"));
        assert_eq!(parse_choice("no brackets"), None);
    }

    #[test]
    fn reads_the_tree_with_per_size_controls() {
        let tree =
            sample_tree("always [madvise] never", "always [inherit] madvise never", "always inherit madvise [never]");
        let p = SystemPolicy::read_from(tree.path());
        assert!(p.thp_built_in);
        assert_eq!(p.enabled, Some(GlobalMode::Madvise));
        assert_eq!(p.defrag.as_deref(), Some("madvise"));
        assert_eq!(p.shmem_enabled.as_deref(), Some("never"));
        assert_eq!(p.pmd_order(), 9);
        assert_eq!(p.sizes.iter().map(|s| s.size_bytes / 1024).collect::<Vec<_>>(), [8, 64, 2048]);
        assert_eq!(p.sizes[0].enabled, None, "8kB is a shmem-only size");
        assert_eq!(p.sizes[1].order, 4);
        assert_eq!(p.anon_orders(), [4, 9]);
        assert_eq!(p.khugepaged["pages_to_scan"], 4096);
        assert_eq!(p.shmem_pmd_choice().as_deref(), Some("never"), "inherit falls back to the global");
    }

    #[test]
    fn wrapper_mask_follows_global_and_per_size_modes() {
        let tree =
            sample_tree("always [madvise] never", "always [inherit] madvise never", "always inherit madvise [never]");
        let p = SystemPolicy::read_from(tree.path());
        assert!(p.anon_orders_allowed(false).is_empty(), "madvise mode without VM_HUGEPAGE");
        assert_eq!(p.anon_orders_allowed(true), [9]);

        let tree =
            sample_tree("[always] madvise never", "always [inherit] madvise never", "[always] inherit madvise never");
        let p = SystemPolicy::read_from(tree.path());
        assert_eq!(p.anon_orders_allowed(false), [4, 9]);

        let tree =
            sample_tree("always madvise [never]", "always [inherit] madvise never", "always inherit [madvise] never");
        let p = SystemPolicy::read_from(tree.path());
        assert!(p.anon_orders_allowed(false).is_empty());
        assert_eq!(p.anon_orders_allowed(true), [4], "never stops inherit, not a per-size madvise");
    }

    #[test]
    fn before_per_size_controls_the_pmd_size_inherits() {
        let tree = tempdir::TempTree::new();
        tree.write("enabled", "[always] madvise never\n");
        let p = SystemPolicy::read_from(tree.path());
        assert!(!p.has_size_controls());
        assert_eq!(p.anon_orders(), [9]);
        assert_eq!(p.anon_orders_allowed(false), [9]);
        assert_eq!(p.hpage_pmd_size_bytes, 2 << 20, "default when the file is missing");
    }

    #[test]
    fn without_thp_everything_is_absent() {
        let p = SystemPolicy::read_from(Path::new("/nonexistent/transparent_hugepage"));
        assert!(!p.thp_built_in);
        assert_eq!(p.enabled, None);
        assert!(p.anon_orders_allowed(true).is_empty());
    }
}
