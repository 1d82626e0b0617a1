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

use crate::cmd;

/// One kernel line of the matrix: a family of Debian packages `<prefix><build><suffix>` whose
/// newest build is booted. Build numbers are never written down: Debian retires old ABIs from the
/// archive, so a pinned build would stop downloading within months.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelLine {
    /// What `--kernel` and MM_PROBE_VM_KERNEL call it.
    pub name: &'static str,
    package_prefix: &'static str,
    package_suffix: &'static str,
}

/// The matrix, the one place its packages are named. 6.1 has `hugepage_vma_check` and the
/// madvise_cold_or_pageout_pte_range without cond_resched(); 6.12 has
/// `__thp_vma_allowable_orders` and the 6.7+ cond_resched(); the -rt builds are PREEMPT_RT.
pub const LINES: &[KernelLine] = &[
    KernelLine { name: "6.1", package_prefix: "linux-image-6.1.0-", package_suffix: "-amd64-unsigned" },
    KernelLine { name: "6.1-rt", package_prefix: "linux-image-6.1.0-", package_suffix: "-rt-amd64-unsigned" },
    KernelLine { name: "6.12", package_prefix: "linux-image-6.12.", package_suffix: "+deb12-amd64-unsigned" },
    KernelLine { name: "6.12-rt", package_prefix: "linux-image-6.12.", package_suffix: "+deb12-rt-amd64-unsigned" },
];

impl KernelLine {
    pub fn by_name(name: &str) -> Result<&'static KernelLine> {
        LINES.iter().find(|l| l.name == name).with_context(|| {
            let known: Vec<&str> = LINES.iter().map(|l| l.name).collect();
            format!("no kernel line {name:?}; the matrix has {}", known.join(", "))
        })
    }

    /// The build number of `package` when it is a build of this line (`…6.1.0-57-amd64…` → 57).
    /// Other flavours of the same release (cloud, rt, dbg) do not match.
    fn build_of(&self, package: &str) -> Option<u32> {
        let build = package.strip_prefix(self.package_prefix)?.strip_suffix(self.package_suffix)?;
        if build.is_empty() || !build.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        build.parse().ok()
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
    /// The archive could not give the newest build; this is the newest cached one.
    Fallback { why: String },
}

/// A kernel build unpacked in the cache, ready to boot.
#[derive(Debug, Clone)]
pub struct KernelBuild {
    pub package: String,
    pub version: String,
    /// `uname -r` in the guest, e.g. `6.1.0-57-rt-amd64`.
    pub release: String,
    /// The unpacked package (`boot/`, `lib/modules/<release>/`).
    pub root: PathBuf,
    pub origin: Origin,
}

impl KernelBuild {
    pub fn vmlinuz(&self) -> PathBuf {
        self.root.join("boot").join(format!("vmlinuz-{}", self.release))
    }

    pub fn modules_dir(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

/// The newest build of `line`: resolved with apt and downloaded when needed, else the newest
/// cached build (said so in `origin`). Fails only when neither exists.
pub fn obtain(line: &KernelLine) -> Result<KernelBuild> {
    let cache = cache_root()?;
    let fresh = resolve_newest(line).and_then(|(package, version)| ensure_unpacked(&cache, &package, &version));
    match fresh {
        Ok(build) => Ok(build),
        Err(error) => {
            let why = format!("{error:#}");
            let Some(build) = newest_cached(line, &cache)? else {
                bail!("kernel line {line}: {why}; and no cached build of it in {}", cache.display());
            };
            eprintln!(
                "xtask vm-test: {line}: {why}; using the newest cached build {} {}",
                build.package, build.version
            );
            Ok(KernelBuild { origin: Origin::Fallback { why }, ..build })
        }
    }
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/mm-probe/kernels`: outside the work tree so `cargo clean` or a
/// fresh clone does not download ~70 MB per kernel again.
fn cache_root() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?).join(".cache")
        }
    };
    Ok(base.join("mm-probe/kernels"))
}

/// Asks apt for the newest build of `line` and the version it would download.
fn resolve_newest(line: &KernelLine) -> Result<(String, String)> {
    let mut package = newest_package(line, &apt_cache(&["pkgnames", line.package_prefix])?);
    if package.is_none() {
        // A fresh machine (or container) has empty package lists until the first update.
        eprintln!("xtask vm-test: apt knows no {line} kernel package; running apt-get update");
        cmd::run(&mut as_root("apt-get", &["update", "-qq"]))?;
        package = newest_package(line, &apt_cache(&["pkgnames", line.package_prefix])?);
    }
    let package = package.with_context(|| {
        format!(
            "apt knows no package {}<N>{} (is the Debian archive in the apt sources?)",
            line.package_prefix, line.package_suffix
        )
    })?;
    let policy = apt_cache(&["policy", &package])?;
    let version = candidate_version(&policy).with_context(|| format!("apt has no installable version of {package}"))?;
    Ok((package, version))
}

fn apt_cache(args: &[&str]) -> Result<String> {
    cmd::output(Command::new("apt-cache").args(args))
}

fn as_root(program: &str, args: &[&str]) -> Command {
    let mut command = if cmd::is_root() {
        Command::new(program)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg(program);
        sudo
    };
    command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    command
}

/// The package of `line` with the highest build number among `apt-cache pkgnames` output.
pub fn newest_package(line: &KernelLine, pkgnames: &str) -> Option<String> {
    pkgnames
        .lines()
        .map(str::trim)
        .filter_map(|name| Some((line.build_of(name)?, name)))
        .max_by_key(|(build, _)| *build)
        .map(|(_, name)| name.to_owned())
}

/// The `Candidate:` of `apt-cache policy` output (`(none)` when nothing is installable).
pub fn candidate_version(policy: &str) -> Option<String> {
    let candidate = policy.lines().find_map(|l| l.trim().strip_prefix("Candidate:"))?.trim();
    (!candidate.is_empty() && candidate != "(none)").then(|| candidate.to_owned())
}

/// The cache directory of one package version; `.complete` marks a finished unpack.
fn entry_dir(cache: &Path, package: &str, version: &str) -> PathBuf {
    cache.join(format!("{package}_{version}"))
}

const COMPLETE_MARKER: &str = ".complete";

fn ensure_unpacked(cache: &Path, package: &str, version: &str) -> Result<KernelBuild> {
    let dir = entry_dir(cache, package, version);
    let origin = if dir.join(COMPLETE_MARKER).exists() {
        Origin::Cached
    } else {
        download_and_unpack(cache, package, version)?;
        Origin::Downloaded
    };
    build_at(dir, package, version, origin)
}

/// Downloads the .deb and unpacks it next to the final directory, then renames it into place, so
/// an interrupted run or a second harness running at the same time never sees half a kernel.
fn download_and_unpack(cache: &Path, package: &str, version: &str) -> Result<()> {
    let final_dir = entry_dir(cache, package, version);
    let staging = cache.join(format!(".staging-{package}_{version}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let result = (|| {
        eprintln!("xtask vm-test: downloading {package} {version}");
        cmd::output(
            Command::new("apt-get").args(["download", "-qq", &format!("{package}={version}")]).current_dir(&staging),
        )?;
        let deb = std::fs::read_dir(&staging)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", staging.display()))?;
        let root = staging.join("root");
        cmd::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        std::fs::remove_file(&deb)?;
        // Debian's package leaves modules.dep to its postinst (depmod); the initramfs needs it.
        let release = release_of(&root)?;
        cmd::output(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
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

/// The single `lib/modules/<release>` directory of an unpacked kernel package.
fn release_of(root: &Path) -> Result<String> {
    let modules = root.join("lib/modules");
    let mut releases: Vec<String> = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    match releases.len() {
        1 => Ok(releases.remove(0)),
        _ => bail!("{} holds {releases:?}, expected exactly one kernel release", modules.display()),
    }
}

fn build_at(root: PathBuf, package: &str, version: &str, origin: Origin) -> Result<KernelBuild> {
    let release = release_of(&root)?;
    let build = KernelBuild { package: package.to_owned(), version: version.to_owned(), release, root, origin };
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
        assert_eq!(newest_package(line, PKGNAMES_6_1).as_deref(), Some("linux-image-6.1.0-57-amd64-unsigned"));
        let rt = KernelLine::by_name("6.1-rt").unwrap();
        assert_eq!(newest_package(rt, PKGNAMES_6_1).as_deref(), Some("linux-image-6.1.0-59-rt-amd64-unsigned"));
    }

    #[test]
    fn stable_point_releases_compare_as_numbers() {
        let names = "linux-image-6.12.57+deb12-amd64-unsigned\nlinux-image-6.12.117+deb12-amd64-unsigned\n\
                     linux-image-6.12.120+deb12-rt-amd64-unsigned\nlinux-image-6.12.111+deb12-cloud-amd64-unsigned\n";
        let line = KernelLine::by_name("6.12").unwrap();
        assert_eq!(newest_package(line, names).as_deref(), Some("linux-image-6.12.117+deb12-amd64-unsigned"));
        let rt = KernelLine::by_name("6.12-rt").unwrap();
        assert_eq!(newest_package(rt, names).as_deref(), Some("linux-image-6.12.120+deb12-rt-amd64-unsigned"));
        assert_eq!(newest_package(line, ""), None);
    }

    #[test]
    fn candidate_version_from_apt_cache_policy() {
        let policy = "linux-image-6.1.0-57-amd64-unsigned:\n  Installed: (none)\n  Candidate: 6.1.192-3\n  \
                      Version table:\n     6.1.192-3 500\n        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\n";
        assert_eq!(candidate_version(policy).as_deref(), Some("6.1.192-3"));
        assert_eq!(candidate_version("x:\n  Installed: (none)\n  Candidate: (none)\n"), None);
        assert_eq!(candidate_version(""), None);
    }

    #[test]
    fn unknown_line_names_the_known_ones() {
        let error = KernelLine::by_name("5.10").unwrap_err().to_string();
        assert!(error.contains("6.1, 6.1-rt, 6.12, 6.12-rt"), "{error}");
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
}
