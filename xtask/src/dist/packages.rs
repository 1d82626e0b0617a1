//! The tarball, the .deb and the .rpm: one payload (the static binary and what `generate-docs`
//! and deploy/ hold), laid out for each.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

pub const PACKAGE: &str = "mm-probe";
/// The package's own revision: 1 until a package is rebuilt from the same version.
const REVISION: &str = "1";
const SUMMARY: &str = "Diagnose Linux memory-management performance problems with eBPF";
const DESCRIPTION: &str = "One command per problem (HMM retry storms, MMU-notifier invalidations, \
transparent huge pages, real-time wakeup latency), each ending in a verdict and a cause, and a \
Prometheus exporter. A static binary: its kernel programs are embedded.";
const MAINTAINER: &str = "mm-probe developers <mm-probe@localhost>";
const LICENSE: &str = "MIT OR Apache-2.0";
/// The image name the shipped DaemonSet names: `<IMAGE_NAME>:<version>`.
pub const IMAGE_NAME: &str = "mm-probe";

/// The files in the repository that ship as they are, by their path in it.
const DAEMONSET: &str = "deploy/kubernetes/mm-probe-daemonset.yaml";
const DASHBOARD: &str = "deploy/grafana/mm-probe-dashboard.json";
const UNIT: &str = "deploy/systemd/mm-probe-exporter.service";

/// What every product carries.
pub struct Payload {
    pub version: String,
    /// Where the binary, `man/` and `completions/` are (`generate-docs --out`).
    staging: PathBuf,
    repository: PathBuf,
    /// The DaemonSet naming this version's image.
    daemonset: String,
    /// Seconds since the epoch of the commit built: every archive's file times, so that two
    /// builds of one commit are the same bytes.
    pub epoch: u64,
}

/// Where a package manager's distributions look for zsh completions.
#[derive(Clone, Copy)]
enum Family {
    Deb,
    Rpm,
}

impl Payload {
    pub fn gather(staging: &Path, version: &str) -> Result<Payload> {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("xtask has no parent")?.to_path_buf();
        let text = fs::read_to_string(repository.join(DAEMONSET)).context("reading the DaemonSet")?;
        Ok(Payload {
            version: version.to_owned(),
            staging: staging.to_path_buf(),
            daemonset: name_image(&text, &image_reference(version))?,
            epoch: commit_epoch(&repository),
            repository,
        })
    }

    pub fn binary(&self) -> PathBuf {
        self.staging.join(PACKAGE)
    }

    /// (file on this machine, path it installs to, mode) for a package of `family`.
    fn installed(&self, family: Family) -> Result<Vec<(PathBuf, String, u32)>> {
        let zsh = match family {
            Family::Deb => "usr/share/zsh/vendor-completions",
            Family::Rpm => "usr/share/zsh/site-functions",
        };
        let completions = self.staging.join("completions");
        let mut files = vec![
            (self.binary(), format!("usr/bin/{PACKAGE}"), 0o755),
            (completions.join("mm-probe.bash"), "usr/share/bash-completion/completions/mm-probe".to_owned(), 0o644),
            (completions.join("_mm-probe"), format!("{zsh}/_mm-probe"), 0o644),
            (completions.join("mm-probe.fish"), "usr/share/fish/vendor_completions.d/mm-probe.fish".to_owned(), 0o644),
            (self.repository.join(UNIT), "usr/lib/systemd/system/mm-probe-exporter.service".to_owned(), 0o644),
        ];
        for page in sorted_entries(&self.staging.join("man"))? {
            let name = page.file_name().context("a man page has no name")?.to_string_lossy().into_owned();
            files.push((page, format!("usr/share/man/man1/{name}"), 0o644));
        }
        Ok(files)
    }
}

/// `mm-probe:<version>`: the image's own name and the DaemonSet's `image:`.
pub fn image_reference(version: &str) -> String {
    format!("{IMAGE_NAME}:{version}")
}

/// The DaemonSet with its one `image:` set to `reference`, whatever version the repository's
/// copy names, so that the manifest shipped and the image shipped always go together.
fn name_image(daemonset: &str, reference: &str) -> Result<String> {
    let mut found = 0;
    let lines: Vec<String> = daemonset
        .lines()
        .map(|line| match line.split_once("image: ") {
            Some((indent, _)) if indent.trim().is_empty() => {
                found += 1;
                format!("{indent}image: {reference}")
            }
            _ => line.to_owned(),
        })
        .collect();
    if found != 1 {
        bail!("{DAEMONSET} has {found} `image:` lines; dist names exactly one");
    }
    Ok(lines.join("\n") + "\n")
}

fn commit_epoch(repository: &Path) -> u64 {
    Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(repository)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// `mm-probe-<version>-x86_64-linux.tar.gz`: one directory of that name holding the binary,
/// `man/`, `completions/` and `deploy/` (DaemonSet, dashboard, systemd unit).
pub fn tarball(payload: &Payload, dist: &Path) -> Result<PathBuf> {
    let name = format!("{PACKAGE}-{}-x86_64-linux", payload.version);
    let top = dist.join(&name);
    copy_tree(&payload.staging.join("man"), &top.join("man"))?;
    copy_tree(&payload.staging.join("completions"), &top.join("completions"))?;
    install(&payload.binary(), &top.join(PACKAGE), 0o755)?;
    fs::create_dir_all(top.join("deploy/kubernetes"))?;
    fs::write(top.join(DAEMONSET), &payload.daemonset)?;
    for file in [DASHBOARD, UNIT] {
        install(&payload.repository.join(file), &top.join(file), 0o644)?;
    }
    let archive = dist.join(format!("{name}.tar.gz"));
    reproducible_tar(payload.epoch, dist, &[&name], &archive, true)?;
    fs::remove_dir_all(&top)?;
    Ok(archive)
}

/// `mm-probe_<version>-1_amd64.deb`, xz-compressed (Debian 11's dpkg reads no zstd).
pub fn deb(payload: &Payload, dist: &Path) -> Result<PathBuf> {
    let root = dist.join("deb-root");
    let installed_kib = lay_out(payload, Family::Deb, &root)?.div_ceil(1024);
    fs::create_dir_all(root.join("DEBIAN"))?;
    let control = format!(
        "Package: {PACKAGE}\nVersion: {}-{REVISION}\nArchitecture: amd64\nMaintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\nSection: admin\nPriority: optional\nDescription: {SUMMARY}\n {DESCRIPTION}\n",
        payload.version
    );
    fs::write(root.join("DEBIAN/control"), control)?;
    let deb = dist.join(format!("{PACKAGE}_{}-{REVISION}_amd64.deb", payload.version));
    cmd::output(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&root)
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", payload.epoch.to_string()),
    )?;
    fs::remove_dir_all(&root)?;
    Ok(deb)
}

/// `mm-probe-<version>-1.x86_64.rpm`, built by rpmbuild from the laid-out tree: no automatic
/// dependencies (the binary has none), no debuginfo, no post-install rewriting, an xz payload
/// that the rpm of RHEL 8 and Amazon Linux 2 reads.
pub fn rpm(payload: &Payload, dist: &Path) -> Result<PathBuf> {
    let top = dist.join("rpmbuild");
    let tree = top.join("tree");
    lay_out(payload, Family::Rpm, &tree)?;
    let files: Vec<String> =
        payload.installed(Family::Rpm)?.into_iter().map(|(_, path, _)| format!("/{path}")).collect();
    let spec = format!(
        "Name: {PACKAGE}\nVersion: {version}\nRelease: {REVISION}\nSummary: {SUMMARY}\nLicense: {LICENSE}\n\
         BuildArch: x86_64\nAutoReqProv: no\n%global debug_package %{{nil}}\n%global __os_install_post %{{nil}}\n\
         %global _build_id_links none\n\n%description\n{DESCRIPTION}\n\n%install\ncp -a {tree}/. %{{buildroot}}/\n\n\
         %files\n%defattr(-,root,root,-)\n{files}\n",
        version = payload.version,
        tree = tree.display(),
        files = files.join("\n"),
    );
    let spec_file = top.join(format!("{PACKAGE}.spec"));
    fs::write(&spec_file, spec)?;
    cmd::output(
        Command::new("rpmbuild")
            .arg("-bb")
            .arg("--define")
            .arg(format!("_topdir {}", top.display()))
            .args(["--define", "_binary_payload w9.xzdio", "--define", "use_source_date_epoch_as_buildtime 1"])
            .args(["--define", "clamp_mtime_to_source_date_epoch 1"])
            .arg(&spec_file)
            .env("SOURCE_DATE_EPOCH", payload.epoch.to_string()),
    )
    .context("building the .rpm (rpmbuild comes from the rpm package: `cargo xtask setup`)")?;
    let name = format!("{PACKAGE}-{}-{REVISION}.x86_64.rpm", payload.version);
    let rpm = dist.join(&name);
    fs::rename(top.join("RPMS/x86_64").join(&name), &rpm).context("rpmbuild left no package where expected")?;
    fs::remove_dir_all(&top)?;
    Ok(rpm)
}

/// Copies the payload into `root` at its installed paths; returns the bytes installed.
fn lay_out(payload: &Payload, family: Family, root: &Path) -> Result<u64> {
    let mut bytes = 0;
    for (source, path, mode) in payload.installed(family)? {
        install(&source, &root.join(path), mode)?;
        bytes += fs::metadata(&source)?.len();
    }
    Ok(bytes)
}

fn install(source: &Path, dest: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    fs::copy(source, dest).with_context(|| format!("copying {} to {}", source.display(), dest.display()))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", dest.display()))
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for file in sorted_entries(from)? {
        install(&file, &to.join(file.file_name().context("no file name")?), 0o644)?;
    }
    Ok(())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        entries.push(entry?.path());
    }
    entries.sort();
    Ok(entries)
}

/// A tar of `members` (relative to `dir`) whose bytes depend on nothing but their contents and
/// modes: names sorted, root-owned, every time `epoch`; gzip without a name or time.
pub fn reproducible_tar(epoch: u64, dir: &Path, members: &[&str], archive: &Path, gzip: bool) -> Result<()> {
    let mut command = Command::new("tar");
    command
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--format=gnu"])
        .arg(format!("--mtime=@{epoch}"))
        .arg("-C")
        .arg(dir);
    if gzip {
        command.arg("--use-compress-program=gzip -9n");
    }
    command.arg("-cf").arg(archive).args(members);
    cmd::output(&mut command).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_daemonset_names_the_shipped_image() {
        let text = "spec:\n      containers:\n        - name: exporter\n          image: mm-probe:0.0.9\n";
        let named = name_image(text, "mm-probe:1.2.3").unwrap();
        assert!(named.contains("          image: mm-probe:1.2.3\n"), "{named}");
        assert!(!named.contains("0.0.9"));
        // A comment that mentions an image is not the field, and two fields are an error.
        assert!(name_image("# image: x\n", "y").is_err());
        assert!(name_image("  image: a\n  image: b\n", "y").is_err());
    }

    #[test]
    fn the_repositorys_daemonset_names_this_versions_image() {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let text = fs::read_to_string(repository.join(DAEMONSET)).unwrap();
        let wanted = format!("image: {}", image_reference(env!("CARGO_PKG_VERSION")));
        assert!(text.lines().any(|l| l.trim() == wanted), "{DAEMONSET} should say `{wanted}`");
    }
}
