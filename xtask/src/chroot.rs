//! Debian chroots in the cache (`<cache>/<suite>-chroot`), made once with debootstrap:
//!
//! - unstable (`sid-chroot`), where the test modules for unstable's kernels are built: those
//!   kernels come from a newer gcc (gcc-16 for 7.2, whose flags such as
//!   `-fmin-function-alignment` gcc-12 rejects), and kbuild's modpost and objtool from their
//!   headers package need a newer glibc (2.38) than the host's bookworm has. ~2 minutes,
//!   ~750 MB with make and kmod; each kernel's linux-headers (which pull in the kernel's
//!   compiler) are installed on first use.
//! - Debian 11 (`bullseye-chroot`), the oldest distribution the release packages are proven on:
//!   the .deb is installed, run and removed there (glibc 2.31, older than any the build used).
//!   The test modules for Debian 11's 5.10 kernels are built there too, by their own gcc-10,
//!   which no newer Debian ships; its sources include bullseye-security, where those kernels'
//!   newest builds and headers are.
//!
//! debootstrap itself is taken from unstable, since bookworm's may not know the newest suite's
//! scripts. Every command runs in a private mount namespace, so no /proc, /dev or /sys mount
//! outlives it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    apt::{ARCHIVE_KEYRING, Archive, DEBIAN_MIRROR, SECURITY_MIRROR},
    cmd,
};

/// Marks a chroot that debootstrap and the base packages finished.
const COMPLETE_MARKER: &str = ".mm-probe-complete";

/// A Debian release the harness keeps a chroot of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suite {
    /// Debian unstable: the build root of unstable's test modules.
    Sid,
    /// Debian 11: the oldest root the release packages install into.
    Bullseye,
}

impl Suite {
    fn codename(self) -> &'static str {
        match self {
            Suite::Sid => "sid",
            Suite::Bullseye => "bullseye",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Suite::Sid => "Debian unstable",
            Suite::Bullseye => "Debian 11",
        }
    }

    /// The chroot's sources.list: the suite, and for a stable release its security updates.
    fn sources_list(self) -> String {
        let line = |mirror: &str, suite: &str| format!("deb {mirror} {suite} main\n");
        match self {
            Suite::Sid => line(DEBIAN_MIRROR, "sid"),
            Suite::Bullseye => line(DEBIAN_MIRROR, "bullseye") + &line(SECURITY_MIRROR, "bullseye-security"),
        }
    }
}

/// Installed with a kernel's headers (which bring its gcc and binutils): what every module build
/// needs besides them. minbase already has dpkg for the package test.
const BUILD_PACKAGES: &[&str] = &["make", "kmod"];

/// The chroot's Release file may be past its Valid-Until when the mirror is a snapshot; the
/// archive keyring still authenticates it.
const APT_GET: &str = "apt-get -o Acquire::Check-Valid-Until=false";

pub struct DebianChroot {
    root: PathBuf,
    suite: Suite,
}

/// The cached chroot of `suite`, made first when missing (as root: debootstrap and chroot need
/// it).
pub fn ensure(suite: Suite) -> Result<DebianChroot> {
    let root = crate::paths::cache_dir()?.join(format!("{}-chroot", suite.codename()));
    if !root.join(COMPLETE_MARKER).exists() {
        create(suite, &root).with_context(|| format!("creating the {} chroot {}", suite.describe(), root.display()))?;
    }
    Ok(DebianChroot { root, suite })
}

/// Builds the chroot next to `root` and renames it into place, so that an interrupted run or a
/// second harness never uses half a chroot.
fn create(suite: Suite, root: &Path) -> Result<()> {
    if !cmd::is_root() {
        bail!("debootstrap needs root: run the task as root (`sudo -E cargo xtask …`)");
    }
    let parent = root.parent().context("the chroot directory has no parent")?;
    let staging = parent.join(format!(".staging-{}-chroot-{}", suite.codename(), std::process::id()));
    let tools = parent.join(format!(".staging-debootstrap-{}", std::process::id()));
    for dir in [&staging, &tools] {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let result = (|| {
        let debootstrap = unpack_debootstrap(&tools)?;
        let start = std::time::Instant::now();
        eprintln!("xtask: debootstrap of {} into {}", suite.describe(), staging.display());
        let mut command = in_private_mounts(&debootstrap.join("usr/sbin/debootstrap"));
        command
            .args(["--variant=minbase", &format!("--keyring={ARCHIVE_KEYRING}"), suite.codename()])
            .arg(&staging)
            .arg(DEBIAN_MIRROR)
            .env("DEBOOTSTRAP_DIR", debootstrap.join("usr/share/debootstrap"));
        cmd::run(&mut command)?;
        DebianChroot { root: staging.clone(), suite }.write_sources()?;
        fs::write(staging.join(COMPLETE_MARKER), "")?;
        eprintln!("xtask: the {} chroot took {:.0?}", suite.describe(), start.elapsed());
        match fs::rename(&staging, root) {
            Ok(()) => Ok(()),
            // Another harness finished its chroot first: theirs is as good as ours.
            Err(_) if root.join(COMPLETE_MARKER).exists() => Ok(()),
            Err(e) => Err(e).with_context(|| format!("moving the chroot into {}", root.display())),
        }
    })();
    let _ = fs::remove_dir_all(&tools);
    let _ = fs::remove_dir_all(&staging);
    result
}

/// Downloads unstable's debootstrap package and unpacks it in `dir`; returns the unpacked root.
fn unpack_debootstrap(dir: &Path) -> Result<PathBuf> {
    let archive = Archive::Sid;
    archive.ensure_lists()?;
    let version = archive.candidate("debootstrap")?;
    archive.download("debootstrap", &version, dir)?;
    let deb = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))?;
    let unpacked = dir.join("root");
    cmd::output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    Ok(unpacked)
}

/// `program` in a mount namespace of its own: whatever it mounts goes away with it.
fn in_private_mounts(program: &Path) -> Command {
    let mut command = Command::new("unshare");
    command.args(["--mount", "--propagation", "private"]).arg(program);
    command
}

impl DebianChroot {
    /// The host path of `inside`, an absolute path in the chroot.
    pub fn host_path(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }

    /// `sh -c script` inside the chroot, with /proc, /dev and /sys mounted for its lifetime only
    /// and a clean environment (the host's PATH and locale mean nothing in there).
    pub fn command(&self, script: &str) -> Command {
        let mut command = in_private_mounts(Path::new("sh"));
        command
            .arg("-c")
            .arg(concat!(
                r#"mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && mount -t sysfs sys "$1/sys" && "#,
                r#"exec chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "#,
                r#"DEBIAN_FRONTEND=noninteractive sh -c "$2""#
            ))
            .arg("sh")
            .arg(&self.root)
            .arg(script);
        command
    }

    /// Installs `linux-headers-<release>` and the build tools in the chroot when missing
    /// (refreshing its sources and lists once if they predate the kernel); returns the headers
    /// directory as the chroot sees it.
    pub fn ensure_headers(&self, release: &str) -> Result<String> {
        let headers = format!("/usr/src/linux-headers-{release}");
        if self.host_path(&headers).join("Makefile").exists() {
            return Ok(headers);
        }
        let package = format!("linux-headers-{release}");
        let install = || {
            let packages = format!("{package} {}", BUILD_PACKAGES.join(" "));
            cmd::run(&mut self.command(&format!("{APT_GET} install -y -qq --no-install-recommends {packages}")))
        };
        if install().is_err() {
            self.write_sources()?;
            cmd::run(&mut self.command(&format!("{APT_GET} update -qq")))?;
            install().with_context(|| format!("installing {package} in the {} build chroot", self.suite.describe()))?;
        }
        if !self.host_path(&headers).join("Makefile").exists() {
            bail!("{package} is installed in {} but {headers} has no Makefile", self.root.display());
        }
        Ok(headers)
    }

    /// Writes the suite's sources.list: a chroot made before a suite gained a source gets it too.
    fn write_sources(&self) -> Result<()> {
        let path = self.host_path("/etc/apt/sources.list");
        fs::write(&path, self.suite.sources_list()).with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chroot_paths_map_onto_the_host() {
        let chroot = DebianChroot { root: PathBuf::from("/c/sid-chroot"), suite: Suite::Sid };
        assert_eq!(
            chroot.host_path("/usr/src/linux-headers-7.2"),
            Path::new("/c/sid-chroot/usr/src/linux-headers-7.2")
        );
        let command = chroot.command("make");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(command.get_program(), "unshare");
        assert_eq!(&args[args.len() - 3..], ["sh", "/c/sid-chroot", "make"]);
    }

    #[test]
    fn debian_11_builds_from_its_security_updates() {
        assert_eq!(Suite::Sid.sources_list(), format!("deb {DEBIAN_MIRROR} sid main\n"));
        let bullseye = Suite::Bullseye.sources_list();
        assert!(bullseye.contains(&format!("deb {SECURITY_MIRROR} bullseye-security main")), "{bullseye}");
    }
}
