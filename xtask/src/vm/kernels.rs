//! The Debian kernels of the matrix: which packages make up each line, finding the newest build
//! of a line with apt, downloading and unpacking it into a cache outside the work tree, and
//! falling back to the newest cached build when the archive cannot be reached.

use std::{
    cmp::Ordering,
    fmt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{apt::Archive, chroot::Suite, cmd, modules::Toolchain};

/// One kernel line of the matrix: a family of Debian packages `<prefix><build><suffix>` whose
/// newest build is booted. Build numbers are never written down: Debian retires old ABIs from the
/// archive, so a pinned build would stop downloading within months.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelLine {
    /// What `--kernel` and MM_PROBE_VM_KERNEL call it.
    pub name: &'static str,
    package_prefix: &'static str,
    package_suffix: &'static str,
    packaging: Packaging,
    archive: Archive,
    /// What builds the test kernel modules for this line's kernels.
    pub toolchain: Toolchain,
    /// Whether the line also boots under instruction counting for the timing proofs
    /// (latency_field). Only where that proof says something the other lines do not: 6.1 (no
    /// reschedule point in the walk), 6.12 (one since 6.7) and 6.1-rt (the walk preempted
    /// although it has no reschedule point). 6.12-rt has both, and unstable's kernels take
    /// 6.12's and -rt's code paths; a second boot costs each line about 1.5 minutes.
    pub timing_proof: bool,
    /// Whether the line runs the `unix` executable: the command-line conventions (closed pipes,
    /// Ctrl-C while attaching, exit codes, terminal width). They are the tool's, not the kernel's,
    /// so the oldest line proves them for the matrix (with the host, on the newest kernel), and
    /// the others save its 1.5 to 2 minutes under emulation.
    pub unix_conventions: bool,
    /// Whether the line also boots the bare initramfs (crate::vm::bare): the static release
    /// binary where no C library exists. The kernels that bound the matrix (6.1 and unstable's
    /// newest) prove it; the binary is the same on every line.
    pub bare_boot: bool,
    /// Whether `vm-test` boots the line when no `--kernel` is named (the CI matrix). A line
    /// outside it runs only when named.
    pub in_matrix: bool,
}

/// The executable that only lines with `unix_conventions` run.
pub const UNIX_CONVENTIONS: &str = "unix";

/// How Debian packages one kernel build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packaging {
    /// One package is the whole kernel: `linux-image-<release>[-unsigned]` (bookworm), named by
    /// the line's prefix and suffix.
    Image,
    /// The split of Debian 14 (unstable since 7.x): the line's package is `linux-binary-<release>`
    /// (the image only), the modules are in `linux-modules-<release>`, and the config,
    /// modules.builtin and modules.order in `linux-base-<release>`.
    Split,
}

/// The packages of a [`Packaging::Split`] build, `<prefix><release>`, the line's own first.
const SPLIT_PREFIXES: &[&str] = &["linux-binary-", "linux-modules-", "linux-base-"];

impl Packaging {
    /// Every package of the build whose line package is `package`.
    pub fn packages(self, package: &str) -> Vec<String> {
        let release = match self {
            Packaging::Image => None,
            Packaging::Split => package.strip_prefix(SPLIT_PREFIXES[0]),
        };
        match release {
            Some(release) => SPLIT_PREFIXES.iter().map(|prefix| format!("{prefix}{release}")).collect(),
            None => vec![package.to_owned()],
        }
    }
}

/// The matrix, the one place its packages are named. 6.1 has `hugepage_vma_check` and the
/// madvise_cold_or_pageout_pte_range without cond_resched(); 6.12 has
/// `__thp_vma_allowable_orders` and the 6.7+ cond_resched(); the -rt builds are PREEMPT_RT.
/// `unstable` is Debian unstable's newest kernel (7.2 when added), with the kernels mm-probe
/// will meet next; its `+deb14` names Debian 14, and becomes `+deb15` once Debian 14 is released.
///
/// `5.10` and `5.10-rt` are Debian 11's newest kernels (its security updates), the oldest
/// generation mm-probe is meant for; they run only when named until every test there passes
/// or says why it cannot.
pub const LINES: &[KernelLine] = &[
    KernelLine { in_matrix: false, ..bullseye("5.10", "-amd64-unsigned") },
    KernelLine { in_matrix: false, ..bullseye("5.10-rt", "-rt-amd64-unsigned") },
    KernelLine { unix_conventions: true, bare_boot: true, ..bookworm("6.1", "linux-image-6.1.0-", "-amd64-unsigned") },
    bookworm("6.1-rt", "linux-image-6.1.0-", "-rt-amd64-unsigned"),
    bookworm("6.12", "linux-image-6.12.", "+deb12-amd64-unsigned"),
    KernelLine { timing_proof: false, ..bookworm("6.12-rt", "linux-image-6.12.", "+deb12-rt-amd64-unsigned") },
    KernelLine { bare_boot: true, ..unstable("unstable", "+deb14-amd64") },
    unstable("unstable-rt", "+deb14-rt-amd64"),
];

/// A line of the host's own release: one image package, modules built by the host's compiler.
const fn bookworm(name: &'static str, package_prefix: &'static str, package_suffix: &'static str) -> KernelLine {
    KernelLine {
        name,
        package_prefix,
        package_suffix,
        packaging: Packaging::Image,
        archive: Archive::Host,
        toolchain: Toolchain::Host,
        timing_proof: true,
        unix_conventions: false,
        bare_boot: false,
        in_matrix: true,
    }
}

/// A line of Debian 11: one image package from the private bullseye lists (its newest builds are
/// in bullseye-security), modules built in the Debian 11 chroot by the kernel's own gcc-10.
const fn bullseye(name: &'static str, package_suffix: &'static str) -> KernelLine {
    KernelLine {
        name,
        package_prefix: "linux-image-5.10.0-",
        package_suffix,
        packaging: Packaging::Image,
        archive: Archive::Bullseye,
        toolchain: Toolchain::Chroot(Suite::Bullseye),
        timing_proof: false,
        unix_conventions: false,
        bare_boot: false,
        in_matrix: true,
    }
}

/// A line of Debian unstable: split packages from the private sid lists, and modules built in a
/// sid chroot, since its kernels are built by a newer compiler and kbuild than the host has.
const fn unstable(name: &'static str, package_suffix: &'static str) -> KernelLine {
    KernelLine {
        name,
        package_prefix: SPLIT_PREFIXES[0],
        package_suffix,
        packaging: Packaging::Split,
        archive: Archive::Sid,
        toolchain: Toolchain::Chroot(Suite::Sid),
        timing_proof: false,
        unix_conventions: false,
        bare_boot: false,
        in_matrix: true,
    }
}

impl KernelLine {
    pub fn by_name(name: &str) -> Result<&'static KernelLine> {
        LINES.iter().find(|l| l.name == name).with_context(|| {
            let known: Vec<&str> = LINES.iter().map(|l| l.name).collect();
            format!("no kernel line {name:?}; the matrix has {}", known.join(", "))
        })
    }

    /// The build of `package` as numeric components when it is a build of this line
    /// (`…6.1.0-57-amd64…` → [57], `linux-binary-7.2.13+deb14-amd64` → [7, 2, 13]); they order
    /// as numbers, component by component. Other flavours of the same release (cloud, rt, dbg,
    /// unsigned) do not match.
    fn build_of(&self, package: &str) -> Option<Vec<u32>> {
        let build = package.strip_prefix(self.package_prefix)?.strip_suffix(self.package_suffix)?;
        build
            .split('.')
            .map(|part| {
                let digits = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
                digits.then(|| part.parse().ok()).flatten()
            })
            .collect()
    }
}

impl fmt::Display for KernelLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Where a kernel came from, for the report.
#[derive(Debug, Clone)]
pub enum Origin {
    /// The archive's newest build, downloaded now.
    Downloaded,
    /// The archive's newest build, already in the cache.
    Cached,
    /// The archive could not give the newest build; this is an older one (the next newest it
    /// gave, or the newest cached).
    Fallback { why: String },
}

/// A kernel build unpacked in the cache, ready to boot.
#[derive(Debug, Clone)]
pub struct KernelBuild {
    pub package: String,
    pub version: String,
    /// `uname -r` in the guest, e.g. `6.1.0-57-rt-amd64`.
    pub release: String,
    /// The unpacked packages (see [`Layout`]), plus `boot/config-<release>`.
    pub root: PathBuf,
    pub layout: Layout,
    pub origin: Origin,
}

/// Where the packages of a build put the kernel image and modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `boot/vmlinuz-<release>` and `lib/modules/<release>/` (bookworm's linux-image packages).
    Boot,
    /// `usr/lib/modules/<release>/`, holding `vmlinuz` too (Debian 14's split packages, which
    /// install into /usr only and leave /boot to the boot loader's hooks).
    UsrLib,
}

impl Layout {
    /// The directory holding `modules/<release>/` for this layout, relative to the unpacked root.
    fn lib_dir(self) -> &'static str {
        match self {
            Layout::Boot => "lib",
            Layout::UsrLib => "usr/lib",
        }
    }
}

impl KernelBuild {
    /// This build, run because the newest could not be had (`why`), when there is a why.
    fn instead_of(self, why: Option<String>) -> KernelBuild {
        match why {
            Some(why) => KernelBuild { origin: Origin::Fallback { why }, ..self },
            None => self,
        }
    }

    pub fn vmlinuz(&self) -> PathBuf {
        match self.layout {
            Layout::Boot => self.boot_dir().join(format!("vmlinuz-{}", self.release)),
            Layout::UsrLib => self.modules_dir().join("vmlinuz"),
        }
    }

    /// `lib/modules/<release>` or `usr/lib/modules/<release>`: modules.dep and the modules.
    pub fn modules_dir(&self) -> PathBuf {
        self.modules_root().join(&self.release)
    }

    /// What the guest sees as /lib/modules.
    pub fn modules_root(&self) -> PathBuf {
        self.root.join(self.layout.lib_dir()).join("modules")
    }

    /// What the guest sees as /boot: `config-<release>` (read by mm-probe) is always there.
    pub fn boot_dir(&self) -> PathBuf {
        self.root.join("boot")
    }
}

/// The newest build of `line` the archive gives: resolved with apt and downloaded when needed.
/// A mirror may list builds whose files it does not serve (yet, or any more): then the newest
/// listed build it does serve (a refused download costs one request), else the newest cached
/// build, each said so in `origin`. Fails only when none of them exists.
pub fn obtain(line: &KernelLine) -> Result<KernelBuild> {
    let cache = cache_root()?;
    let mut newest_failure = None;
    match resolve_newest(line) {
        Ok(listed) => {
            for (package, version) in listed {
                match ensure_unpacked(line, &cache, &package, &version) {
                    Ok(build) => return Ok(build.instead_of(newest_failure)),
                    Err(error) => {
                        newest_failure.get_or_insert_with(|| format!("{error:#}"));
                    }
                }
            }
        }
        Err(error) => newest_failure = Some(format!("{error:#}")),
    }
    let why = newest_failure.unwrap_or_else(|| "no build listed".to_owned());
    let Some(build) = newest_cached(line, &cache)? else {
        bail!("kernel line {line}: {why}; and no cached build of it in {}", cache.display());
    };
    eprintln!("xtask vm-test: {line}: {why}; using the newest cached build {} {}", build.package, build.version);
    Ok(build.instead_of(Some(why)))
}

/// `<cache>/kernels`: outside the work tree so `cargo clean` or a fresh clone does not download
/// ~70 MB per kernel again.
fn cache_root() -> Result<PathBuf> {
    Ok(crate::paths::cache_dir()?.join("kernels"))
}

/// Asks apt for the builds of `line`, newest first, and the version it would download of each.
fn resolve_newest(line: &KernelLine) -> Result<Vec<(String, String)>> {
    let archive = line.archive;
    archive.ensure_lists()?;
    let mut packages = newest_packages(line, &archive.cache(&["pkgnames", line.package_prefix])?);
    if packages.is_empty() {
        // A fresh machine (or container) has empty package lists until the first update.
        eprintln!("xtask vm-test: apt knows no {line} kernel package; running apt-get update");
        archive.update()?;
        packages = newest_packages(line, &archive.cache(&["pkgnames", line.package_prefix])?);
    }
    if packages.is_empty() {
        bail!(
            "apt knows no package {}<N>{} (is the Debian archive in the apt sources?)",
            line.package_prefix,
            line.package_suffix
        );
    }
    packages
        .into_iter()
        .map(|package| {
            let version = archive.candidate(&package)?;
            Ok((package, version))
        })
        .collect()
}

/// The packages of `line` among `apt-cache pkgnames` output, highest build number first.
pub fn newest_packages(line: &KernelLine, pkgnames: &str) -> Vec<String> {
    let mut builds: Vec<(Vec<u32>, &str)> =
        pkgnames.lines().map(str::trim).filter_map(|name| Some((line.build_of(name)?, name))).collect();
    builds.sort_by(|a, b| b.0.cmp(&a.0));
    builds.dedup_by(|a, b| a.1 == b.1);
    builds.into_iter().map(|(_, name)| name.to_owned()).collect()
}

/// The cache directory of one package version; `.complete` marks a finished unpack.
fn entry_dir(cache: &Path, package: &str, version: &str) -> PathBuf {
    cache.join(format!("{package}_{version}"))
}

const COMPLETE_MARKER: &str = ".complete";

fn ensure_unpacked(line: &KernelLine, cache: &Path, package: &str, version: &str) -> Result<KernelBuild> {
    let dir = entry_dir(cache, package, version);
    let origin = if dir.join(COMPLETE_MARKER).exists() {
        Origin::Cached
    } else {
        download_and_unpack(line, cache, package, version)?;
        Origin::Downloaded
    };
    build_at(dir, package, version, origin)
}

/// Downloads the build's .debs and unpacks them next to the final directory, then renames it into
/// place, so an interrupted run or a second harness running at the same time never sees half a
/// kernel.
fn download_and_unpack(line: &KernelLine, cache: &Path, package: &str, version: &str) -> Result<()> {
    let final_dir = entry_dir(cache, package, version);
    let staging = cache.join(format!(".staging-{package}_{version}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let result = (|| {
        let root = staging.join("root");
        // The packages of one build come from one source package: they share its version.
        for part in line.packaging.packages(package) {
            eprintln!("xtask vm-test: downloading {part} {version}");
            line.archive.download(&part, version, &staging)?;
        }
        let debs: Vec<PathBuf> = std::fs::read_dir(&staging)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        if debs.is_empty() {
            bail!("apt-get download left no .deb in {}", staging.display());
        }
        for deb in debs {
            cmd::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
            std::fs::remove_file(&deb)?;
        }
        let (layout, release) = detect_layout(&root)?;
        configure(&root, layout, &release)?;
        std::fs::write(root.join(COMPLETE_MARKER), format!("{package} {version}\n"))?;
        match std::fs::rename(&root, &final_dir) {
            Ok(()) => Ok(()),
            // Another harness finished the same build first: theirs is as good as ours.
            Err(_) if final_dir.join(COMPLETE_MARKER).exists() => Ok(()),
            Err(e) => Err(e).with_context(|| format!("moving the kernel into {}", final_dir.display())),
        }
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// What the packages' maintainer scripts would do on a real system, as far as the guest needs it:
/// modules.dep (Debian leaves it to depmod in the postinst; the initramfs needs it) and
/// /boot/config-<release>, which the split packages ship only as modules/<release>/config.
fn configure(root: &Path, layout: Layout, release: &str) -> Result<()> {
    if layout == Layout::UsrLib {
        // The host's depmod (kmod 30) reads <base>/lib/modules only; a merged-/usr system has
        // /lib pointing at usr/lib, so the unpacked root gets the same.
        if !root.join("lib").exists() {
            std::os::unix::fs::symlink("usr/lib", root.join("lib")).context("linking lib to usr/lib")?;
        }
        let modules = root.join(layout.lib_dir()).join("modules").join(release);
        let boot = root.join("boot");
        std::fs::create_dir_all(&boot)?;
        std::fs::copy(modules.join("config"), boot.join(format!("config-{release}")))
            .with_context(|| format!("copying the kernel config of {release} (linux-base) to /boot"))?;
    }
    cmd::output(Command::new("depmod").arg("-b").arg(root).arg(release))?;
    Ok(())
}

/// The layout of an unpacked build and its single release directory. `usr/lib/modules` comes
/// first: a split build also gets `lib` as a link to it (see [`configure`]).
fn detect_layout(root: &Path) -> Result<(Layout, String)> {
    let layout = if root.join("usr/lib/modules").is_dir() { Layout::UsrLib } else { Layout::Boot };
    let modules = root.join(layout.lib_dir()).join("modules");
    let mut releases: Vec<String> = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    match releases.len() {
        1 => Ok((layout, releases.remove(0))),
        _ => bail!("{} holds {releases:?}, expected exactly one kernel release", modules.display()),
    }
}

fn build_at(root: PathBuf, package: &str, version: &str, origin: Origin) -> Result<KernelBuild> {
    let (layout, release) = detect_layout(&root)?;
    let build = KernelBuild { package: package.to_owned(), version: version.to_owned(), release, root, layout, origin };
    if !build.vmlinuz().exists() {
        bail!("{} has no kernel image {}", package, build.vmlinuz().display());
    }
    Ok(build)
}

/// The newest completely unpacked build of `line` in the cache, if any.
fn newest_cached(line: &KernelLine, cache: &Path) -> Result<Option<KernelBuild>> {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return Ok(None);
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join(COMPLETE_MARKER).exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let Some((package, version)) = newest_cached_entry(line, &names) else {
        return Ok(None);
    };
    let root = entry_dir(cache, &package, &version);
    build_at(root, &package, &version, Origin::Cached).map(Some)
}

/// Picks the newest `<package>_<version>` cache entry of `line`: highest build, then highest
/// package version (a rebuild of the same ABI).
pub fn newest_cached_entry(line: &KernelLine, entry_names: &[String]) -> Option<(String, String)> {
    entry_names
        .iter()
        .filter_map(|name| {
            let (package, version) = name.split_once('_')?;
            Some((line.build_of(package)?, package, version))
        })
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| compare_versions(a.2, b.2)))
        .map(|(_, package, version)| (package.to_owned(), version.to_owned()))
}

/// Orders version strings with digit runs compared as numbers (`6.1.192-10` > `6.1.192-3`);
/// enough for Debian kernel versions, which carry no epochs or tildes.
fn compare_versions(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((digits_a, x), (digits_b, y)) in ca.iter().zip(cb.iter()) {
        let ordering = if *digits_a && *digits_b {
            x.parse::<u64>().unwrap_or(0).cmp(&y.parse::<u64>().unwrap_or(0))
        } else {
            x.cmp(y)
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    ca.len().cmp(&cb.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newest(line: &KernelLine, pkgnames: &str) -> Option<String> {
        newest_packages(line, pkgnames).into_iter().next()
    }

    const PKGNAMES_6_1: &str = "\
linux-image-6.1.0-57-amd64-unsigned
linux-image-6.1.0-9-amd64-unsigned
linux-image-6.1.0-57-rt-amd64-unsigned
linux-image-6.1.0-58-cloud-amd64-unsigned
linux-image-6.1.0-60-amd64-dbg
linux-image-6.1.0-59-rt-amd64-unsigned
linux-image-6.1.0-56-amd64-unsigned
linux-image-6.1.0-61-amd64
";

    #[test]
    fn newest_build_is_the_highest_number_of_the_same_flavour() {
        let line = KernelLine::by_name("6.1").unwrap();
        assert_eq!(newest(line, PKGNAMES_6_1).as_deref(), Some("linux-image-6.1.0-57-amd64-unsigned"));
        let rt = KernelLine::by_name("6.1-rt").unwrap();
        assert_eq!(newest(rt, PKGNAMES_6_1).as_deref(), Some("linux-image-6.1.0-59-rt-amd64-unsigned"));
    }

    #[test]
    fn stable_point_releases_compare_as_numbers() {
        let names = "linux-image-6.12.57+deb12-amd64-unsigned\nlinux-image-6.12.117+deb12-amd64-unsigned\n\
                     linux-image-6.12.120+deb12-rt-amd64-unsigned\nlinux-image-6.12.111+deb12-cloud-amd64-unsigned\n";
        let line = KernelLine::by_name("6.12").unwrap();
        assert_eq!(newest(line, names).as_deref(), Some("linux-image-6.12.117+deb12-amd64-unsigned"));
        let rt = KernelLine::by_name("6.12-rt").unwrap();
        assert_eq!(newest(rt, names).as_deref(), Some("linux-image-6.12.120+deb12-rt-amd64-unsigned"));
        assert_eq!(newest(line, ""), None);
    }

    #[test]
    fn debian_11_lines_pick_their_own_flavour() {
        let names = "linux-image-5.10.0-45-amd64-unsigned\nlinux-image-5.10.0-46-amd64-unsigned\n\
                     linux-image-5.10.0-46-rt-amd64-unsigned\nlinux-image-5.10.0-46-cloud-amd64-unsigned\n\
                     linux-image-5.10.0-47-amd64-dbg\n";
        let line = KernelLine::by_name("5.10").unwrap();
        assert_eq!(newest(line, names).as_deref(), Some("linux-image-5.10.0-46-amd64-unsigned"));
        let rt = KernelLine::by_name("5.10-rt").unwrap();
        assert_eq!(newest(rt, names).as_deref(), Some("linux-image-5.10.0-46-rt-amd64-unsigned"));
        assert!(!line.in_matrix && !rt.in_matrix);
        assert_eq!(
            newest_packages(line, &format!("{names}linux-image-5.10.0-9-amd64-unsigned\n{names}")),
            [
                "linux-image-5.10.0-46-amd64-unsigned",
                "linux-image-5.10.0-45-amd64-unsigned",
                "linux-image-5.10.0-9-amd64-unsigned"
            ]
        );
    }

    #[test]
    fn unknown_line_names_the_known_ones() {
        let error = KernelLine::by_name("4.19").unwrap_err().to_string();
        assert!(error.contains("5.10, 5.10-rt, 6.1, 6.1-rt, 6.12, 6.12-rt, unstable, unstable-rt"), "{error}");
    }

    #[test]
    fn newest_cached_entry_prefers_build_then_version() {
        let names: Vec<String> = [
            "linux-image-6.1.0-56-amd64-unsigned_6.1.190-1",
            "linux-image-6.1.0-57-amd64-unsigned_6.1.192-3",
            "linux-image-6.1.0-57-amd64-unsigned_6.1.192-10",
            "linux-image-6.1.0-58-rt-amd64-unsigned_6.1.193-1",
            ".staging-linux-image-6.1.0-59-amd64-unsigned_6.1.194-1-123",
        ]
        .map(String::from)
        .to_vec();
        let line = KernelLine::by_name("6.1").unwrap();
        assert_eq!(
            newest_cached_entry(line, &names),
            Some(("linux-image-6.1.0-57-amd64-unsigned".to_owned(), "6.1.192-10".to_owned()))
        );
        assert_eq!(newest_cached_entry(KernelLine::by_name("6.12").unwrap(), &names), None);
    }

    // Abridged from `apt-cache pkgnames linux-binary-` on Debian unstable.
    const PKGNAMES_UNSTABLE: &str = "\
linux-binary-7.2.9+deb14-amd64
linux-binary-7.2.13+deb14-amd64
linux-binary-7.2.13+deb14-rt-amd64
linux-binary-7.2.13+deb14-cloud-amd64
linux-binary-unsigned-7.2.13+deb14-amd64
linux-binary-7.10.1+deb14-rt-amd64
linux-binary-7.2.13+deb14-amd64-dbg
linux-binary-7..2+deb14-amd64
";

    #[test]
    fn unstable_versions_order_by_numeric_components() {
        let line = KernelLine::by_name("unstable").unwrap();
        assert_eq!(newest(line, PKGNAMES_UNSTABLE).as_deref(), Some("linux-binary-7.2.13+deb14-amd64"));
        let rt = KernelLine::by_name("unstable-rt").unwrap();
        assert_eq!(newest(rt, PKGNAMES_UNSTABLE).as_deref(), Some("linux-binary-7.10.1+deb14-rt-amd64"));
        assert_eq!(line.build_of("linux-binary-7.2.13+deb14-amd64"), Some(vec![7, 2, 13]));
        assert_eq!(line.build_of("linux-binary-7..2+deb14-amd64"), None);
        assert_eq!(line.build_of("linux-binary-unsigned-7.2.13+deb14-amd64"), None);
        assert_eq!(KernelLine::by_name("6.1").unwrap().build_of("linux-image-6.1.0-57-amd64-unsigned"), Some(vec![57]));
    }

    #[test]
    fn newest_cached_unstable_entry_compares_components_not_text() {
        let names: Vec<String> = ["linux-binary-7.2.9+deb14-amd64_7.2.9-1", "linux-binary-7.2.13+deb14-amd64_7.2.13-1"]
            .map(String::from)
            .to_vec();
        let line = KernelLine::by_name("unstable").unwrap();
        assert_eq!(
            newest_cached_entry(line, &names),
            Some(("linux-binary-7.2.13+deb14-amd64".to_owned(), "7.2.13-1".to_owned()))
        );
    }

    #[test]
    fn split_builds_are_three_packages_and_images_one() {
        assert_eq!(
            Packaging::Split.packages("linux-binary-7.2.13+deb14-rt-amd64"),
            [
                "linux-binary-7.2.13+deb14-rt-amd64",
                "linux-modules-7.2.13+deb14-rt-amd64",
                "linux-base-7.2.13+deb14-rt-amd64"
            ]
        );
        assert_eq!(
            Packaging::Image.packages("linux-image-6.1.0-57-amd64-unsigned"),
            ["linux-image-6.1.0-57-amd64-unsigned"]
        );
        assert!(LINES.iter().all(|l| {
            l.packaging.packages(&format!("{}1{}", l.package_prefix, l.package_suffix))[0].starts_with(l.package_prefix)
        }));
    }

    /// A scratch directory under the system's temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("xtask-kernels-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn file(&self, path: &str) {
            let path = self.0.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn bookworm_images_keep_the_kernel_in_boot() {
        let root = Scratch::new("boot");
        root.file("boot/vmlinuz-6.1.0-57-amd64");
        root.file("lib/modules/6.1.0-57-amd64/modules.dep");
        root.file("usr/share/doc/linux-image-6.1.0-57-amd64/changelog.Debian.gz");
        let build =
            build_at(root.0.clone(), "linux-image-6.1.0-57-amd64-unsigned", "6.1.192-3", Origin::Cached).unwrap();
        assert_eq!((build.layout, build.release.as_str()), (Layout::Boot, "6.1.0-57-amd64"));
        assert_eq!(build.vmlinuz(), root.0.join("boot/vmlinuz-6.1.0-57-amd64"));
        assert_eq!(build.modules_dir(), root.0.join("lib/modules/6.1.0-57-amd64"));
        assert_eq!(build.boot_dir(), root.0.join("boot"));
    }

    #[test]
    fn split_builds_keep_the_kernel_beside_their_modules_in_usr() {
        let root = Scratch::new("usrlib");
        root.file("usr/lib/modules/7.2.13+deb14-amd64/vmlinuz");
        root.file("usr/lib/modules/7.2.13+deb14-amd64/config");
        std::os::unix::fs::symlink("usr/lib", root.0.join("lib")).unwrap();
        let build = build_at(root.0.clone(), "linux-binary-7.2.13+deb14-amd64", "7.2.13-1", Origin::Cached).unwrap();
        assert_eq!((build.layout, build.release.as_str()), (Layout::UsrLib, "7.2.13+deb14-amd64"));
        assert_eq!(build.vmlinuz(), root.0.join("usr/lib/modules/7.2.13+deb14-amd64/vmlinuz"));
        assert_eq!(build.modules_root(), root.0.join("usr/lib/modules"));
    }

    #[test]
    fn a_root_without_one_release_is_an_error() {
        let root = Scratch::new("two");
        root.file("usr/lib/modules/7.2.13+deb14-amd64/vmlinuz");
        root.file("usr/lib/modules/7.2.9+deb14-amd64/vmlinuz");
        let error = detect_layout(&root.0).unwrap_err().to_string();
        assert!(error.contains("expected exactly one kernel release"), "{error}");
        assert!(detect_layout(&root.0.join("nothing")).is_err());
    }
}
