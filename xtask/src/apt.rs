//! apt against one of the archives the kernel matrix draws from: the host's own sources, or
//! Debian unstable or Debian 11 through a private configuration in the cache, so that the host's
//! sources, package lists and installed packages stay exactly as they are.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// Where a kernel line's packages (and the tools that build for it) come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archive {
    /// The host's apt sources, as `cargo xtask setup` left them (bookworm and its updates).
    Host,
    /// Debian unstable through the private configuration under `<cache>/apt-unstable/`.
    Sid,
    /// Debian 11 and its security updates (where its newest kernels are) through the private
    /// configuration under `<cache>/apt-bullseye/`.
    Bullseye,
}

/// The Debian mirror and keyring: the private lists and every debootstrap of the build chroots.
pub const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Where a stable release's security updates are published.
pub const SECURITY_MIRROR: &str = "http://deb.debian.org/debian-security";
pub const ARCHIVE_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Unstable changes daily and retires kernel ABIs within weeks, and security updates replace a
/// stable release's kernel: private lists older than this are refreshed before a kernel is
/// chosen from them.
const PRIVATE_LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Written after each successful update of the private lists. apt dates the list files by the
/// archive's Last-Modified, not by when they were fetched, so their own times say nothing.
const UPDATED_STAMP: &str = "updated";

impl Archive {
    /// `program` (apt-get or apt-cache) reading this archive's lists.
    pub fn command(self, program: &str) -> Result<Command> {
        let mut command = Command::new(program);
        if let Some(dir) = self.private_dir()? {
            command.args(private_options(&dir));
        }
        command.env("DEBIAN_FRONTEND", "noninteractive");
        Ok(command)
    }

    /// Makes sure the lists can answer: private lists are fetched when missing or older than a
    /// day. The host's lists are left to the host (updated only when they lack a kernel).
    pub fn ensure_lists(self) -> Result<()> {
        let Some(dir) = self.private_dir()? else {
            return Ok(());
        };
        let fresh = fs::metadata(dir.join(UPDATED_STAMP))
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).is_ok_and(|age| age < PRIVATE_LISTS_MAX_AGE));
        if fresh { Ok(()) } else { self.update() }
    }

    /// `apt-get update` of this archive's lists (as root for the host's).
    pub fn update(self) -> Result<()> {
        let Some(dir) = self.private_dir()? else {
            return cmd::run(&mut as_root("apt-get", &["update", "-qq"]));
        };
        prepare_private_dir(&dir, &self.sources())?;
        eprintln!("xtask: updating the private package lists in {}", dir.display());
        cmd::run(self.command("apt-get")?.args(["update", "-qq"]))?;
        fs::write(dir.join(UPDATED_STAMP), "")?;
        Ok(())
    }

    /// `<cache>/apt-<name>`: sources.list, lists/ and cache/ of a private configuration; none for
    /// the host's own.
    fn private_dir(self) -> Result<Option<PathBuf>> {
        let name = match self {
            Archive::Host => return Ok(None),
            Archive::Sid => "apt-unstable",
            Archive::Bullseye => "apt-bullseye",
        };
        Ok(Some(crate::paths::cache_dir()?.join(name)))
    }

    /// The sources.list of a private configuration.
    fn sources(self) -> String {
        let line = |mirror: &str, suite: &str| format!("deb [signed-by={ARCHIVE_KEYRING}] {mirror} {suite} main\n");
        match self {
            Archive::Host => String::new(),
            Archive::Sid => line(DEBIAN_MIRROR, "sid"),
            Archive::Bullseye => line(DEBIAN_MIRROR, "bullseye") + &line(SECURITY_MIRROR, "bullseye-security"),
        }
    }

    /// What `apt-cache <args>` prints for this archive.
    pub fn cache(self, args: &[&str]) -> Result<String> {
        cmd::output(self.command("apt-cache")?.args(args))
    }

    /// The version apt would install of `package`.
    pub fn candidate(self, package: &str) -> Result<String> {
        let policy = self.cache(&["policy", package])?;
        candidate_version(&policy).with_context(|| format!("apt has no installable version of {package}"))
    }

    /// `apt-get download package=version` into `dir`; on failure, apt's errors (`E:` lines)
    /// without its warnings (as root it always warns that the download is unsandboxed).
    pub fn download(self, package: &str, version: &str, dir: &Path) -> Result<()> {
        let out = self
            .command("apt-get")?
            .args(["download", "-qq", &format!("{package}={version}")])
            .current_dir(dir)
            .output()
            .context("running apt-get download")?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("E:")).collect();
        let errors = if errors.is_empty() { stderr.trim().to_owned() } else { errors.join(" ") };
        bail!("apt-get download {package}={version} failed: {errors}")
    }
}

/// The `Candidate:` of `apt-cache policy` output (`(none)` when nothing is installable).
fn candidate_version(policy: &str) -> Option<String> {
    let candidate = policy.lines().find_map(|l| l.trim().strip_prefix("Candidate:"))?.trim();
    (!candidate.is_empty() && candidate != "(none)").then(|| candidate.to_owned())
}

/// apt options that read sources, lists and cache from `dir` only. List-Cleanup=0 keeps apt from
/// deleting lists it does not know (it would consult the host's sources.list.d otherwise).
fn private_options(dir: &Path) -> Vec<String> {
    [
        format!("Dir::Etc::sourcelist={}", dir.join("sources.list").display()),
        "Dir::Etc::sourceparts=-".to_owned(),
        format!("Dir::State::Lists={}", dir.join("lists").display()),
        format!("Dir::Cache={}", dir.join("cache").display()),
        "APT::Get::List-Cleanup=0".to_owned(),
    ]
    .into_iter()
    .flat_map(|option| ["-o".to_owned(), option])
    .collect()
}

fn prepare_private_dir(dir: &Path, sources: &str) -> Result<()> {
    for sub in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    fs::write(dir.join("sources.list"), sources)?;
    Ok(())
}

/// `program args` as root: directly when root already, else through sudo.
pub fn as_root(program: &str, args: &[&str]) -> Command {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_version_from_apt_cache_policy() {
        let policy = "linux-image-6.1.0-57-amd64-unsigned:\n  Installed: (none)\n  Candidate: 6.1.192-3\n  \
                      Version table:\n     6.1.192-3 500\n        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages\n";
        assert_eq!(candidate_version(policy).as_deref(), Some("6.1.192-3"));
        assert_eq!(candidate_version("x:\n  Installed: (none)\n  Candidate: (none)\n"), None);
        assert_eq!(candidate_version(""), None);
    }

    #[test]
    fn private_options_keep_apt_inside_its_directory() {
        let options = private_options(Path::new("/c/apt-unstable"));
        let pairs: Vec<&str> = options.chunks(2).map(|pair| pair[1].as_str()).collect();
        assert!(options.chunks(2).all(|pair| pair[0] == "-o"), "{options:?}");
        assert_eq!(
            pairs,
            [
                "Dir::Etc::sourcelist=/c/apt-unstable/sources.list",
                "Dir::Etc::sourceparts=-",
                "Dir::State::Lists=/c/apt-unstable/lists",
                "Dir::Cache=/c/apt-unstable/cache",
                "APT::Get::List-Cleanup=0",
            ]
        );
    }

    #[test]
    fn debian_11_lists_carry_its_security_updates() {
        let sources = Archive::Bullseye.sources();
        let suites: Vec<&str> = sources.lines().filter_map(|l| l.split_whitespace().nth(3)).collect();
        assert_eq!(suites, ["bullseye", "bullseye-security"], "{sources}");
        assert!(sources.contains(SECURITY_MIRROR), "{sources}");
        assert_eq!(Archive::Sid.sources().lines().count(), 1);
    }
}
