//! A kernel's build headers unpacked into the cache, never installed on the machine: Debian's
//! `linux-headers-<release>` depends on the kernel image itself, so installing it pulls in the
//! image, initramfs-tools and udev, and can upgrade systemd on a developer's workstation.
//!
//! Layout: `<cache>/headers/<release>/` holds the unpacked packages (usr/src/linux-headers-*,
//! usr/lib/linux-kbuild-*) and `.complete` once they are whole.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{apt::Archive, cmd};

const COMPLETE_MARKER: &str = ".complete";

/// The headers directory of kernel `release` (as `uname -r` prints it), unpacked from the host's
/// archive into the cache on first use.
pub fn ensure(release: &str) -> Result<PathBuf> {
    let root = crate::paths::cache_dir()?.join("headers").join(release);
    let headers = root.join(format!("usr/src/linux-headers-{release}"));
    if !root.join(COMPLETE_MARKER).exists() {
        unpack(release, &root).with_context(|| format!("unpacking the headers of kernel {release} into the cache"))?;
    }
    Ok(headers)
}

/// The headers package and the packages its kbuild reads from: the shared headers and the
/// kbuild tools (its other dependencies are the image and the compiler, which it does not need).
fn packages(release: &str) -> Result<Vec<String>> {
    let package = format!("linux-headers-{release}");
    let mut depends = Archive::Host.cache(&["depends", &package]);
    if depends.as_deref().map_or(true, |d| d.trim().is_empty()) {
        // The package lists may predate this kernel's ABI; refresh them once.
        Archive::Host.update()?;
        depends = Archive::Host.cache(&["depends", &package]);
    }
    let depends = depends.with_context(|| format!("apt knows no {package}"))?;
    let mut packages = vec![package];
    packages.extend(build_dependencies(&depends));
    Ok(packages)
}

/// The `linux-headers-*` and `linux-kbuild-*` names among `apt-cache depends` output; an
/// alternative (`|Depends:`) is never one of them.
fn build_dependencies(depends: &str) -> Vec<String> {
    depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .filter(|name| name.starts_with("linux-headers-") || name.starts_with("linux-kbuild-"))
        .map(str::to_owned)
        .collect()
}

/// Downloads and unpacks next to `root`, then renames into place, so an interrupted run never
/// leaves half the headers where a build would find them.
fn unpack(release: &str, root: &Path) -> Result<()> {
    let parent = root.parent().context("the headers cache has no parent")?;
    let staging = parent.join(format!(".staging-{release}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let result = (|| {
        let unpacked = staging.join("root");
        for package in packages(release)? {
            let version = Archive::Host.candidate(&package)?;
            eprintln!("xtask: downloading {package} {version} (unpacked into the cache, not installed)");
            Archive::Host.download(&package, &version, &staging)?;
        }
        for deb in fs::read_dir(&staging)?.filter_map(|e| e.ok().map(|e| e.path())) {
            if deb.extension().is_some_and(|x| x == "deb") {
                cmd::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            }
        }
        point_makefile_at(&unpacked, root, release)?;
        fs::write(unpacked.join(COMPLETE_MARKER), format!("{release}\n"))?;
        match fs::rename(&unpacked, root) {
            Ok(()) => Ok(()),
            // Another harness unpacked the same headers first: theirs are as good as ours.
            Err(_) if root.join(COMPLETE_MARKER).exists() => Ok(()),
            Err(e) => Err(e).with_context(|| format!("moving the headers into {}", root.display())),
        }
    })();
    let _ = fs::remove_dir_all(&staging);
    result
}

/// The flavour's Makefile includes the shared headers' Makefile by its absolute path under
/// /usr/src; it must name the copy under `root` (where the tree will be once renamed). Every other
/// link in the packages is relative.
fn point_makefile_at(unpacked: &Path, root: &Path, release: &str) -> Result<()> {
    let makefile = unpacked.join(format!("usr/src/linux-headers-{release}/Makefile"));
    let text = fs::read_to_string(&makefile).with_context(|| format!("reading {}", makefile.display()))?;
    let rewritten = rebase_includes(&text, root);
    if rewritten == text {
        bail!("{} includes nothing under /usr/src/: a new headers layout", makefile.display());
    }
    fs::write(&makefile, rewritten).with_context(|| format!("writing {}", makefile.display()))
}

/// `include /usr/src/…` lines of a Makefile made to include the same file under `root`.
fn rebase_includes(makefile: &str, root: &Path) -> String {
    makefile
        .lines()
        .map(|line| match line.strip_prefix("include /usr/src/") {
            Some(rest) => format!("include {}/usr/src/{rest}\n", root.display()),
            None => format!("{line}\n"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_headers_and_kbuild_dependencies_are_fetched() {
        let depends = "linux-headers-6.12.118+deb12-amd64\n  Depends: linux-base\n  Depends: \
                       linux-headers-6.12.118+deb12-common\n |Depends: linux-image-6.12.118+deb12-amd64\n  \
                       Depends: linux-image-6.12.118+deb12-amd64-unsigned\n  Depends: \
                       linux-kbuild-6.12.118+deb12\n  Depends: gcc-12\n";
        assert_eq!(build_dependencies(depends), ["linux-headers-6.12.118+deb12-common", "linux-kbuild-6.12.118+deb12"]);
    }

    #[test]
    fn the_shared_makefile_is_included_from_the_cache() {
        let makefile = "include /usr/src/linux-headers-6.1.0-57-common/Makefile\n";
        let root = Path::new("/root/.cache/mm-probe/headers/6.1.0-57-amd64");
        assert_eq!(
            rebase_includes(makefile, root),
            "include /root/.cache/mm-probe/headers/6.1.0-57-amd64/usr/src/linux-headers-6.1.0-57-common/Makefile\n"
        );
    }
}
