//! `cargo xtask dist`: what a user installs, from one static build, under target/dist/:
//!
//! - `mm-probe-<version>-x86_64-linux.tar.gz`: the binary, man pages, shell completions, the
//!   DaemonSet, the dashboard and the systemd unit;
//! - `mm-probe_<version>-1_amd64.deb` and `mm-probe-<version>-1.x86_64.rpm`: the binary, man pages,
//!   completions and the exporter's systemd unit (installed, not enabled);
//! - `mm-probe-<version>-oci.tar`: an OCI image archive `FROM scratch` whose entrypoint is the
//!   exporter, named as the shipped DaemonSet names it;
//! - `SHA256SUMS`.
//!
//! The binary is built for x86_64-unknown-linux-musl: static, with no interpreter and no shared
//! library, so it runs on any x86-64 kernel mm-probe supports whatever its C library (the glibc
//! build needs glibc 2.34, which Debian 11, Ubuntu 20.04, RHEL 8 and Amazon Linux 2 lack). The
//! kernel programs are embedded in it, so it is all there is to install. The man pages come from
//! the binary itself (`mm-probe generate-docs`, hidden), so xtask needs no dependency on
//! mm-probe, whose build script needs the eBPF toolchain.
//!
//! `check` proves the products where users run them (see there).

pub mod check;
mod elf;
mod image;
mod packages;
mod release;

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, Result};

pub use self::release::Release;
use crate::{cmd, paths};

/// The target of the static build: Rust's musl target links musl's libc.a and starts as a
/// static PIE, with no loader to find.
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

pub fn run() -> Result<Release> {
    let start = Instant::now();
    let built = static_binary()?;
    let version = workspace_version()?;
    let dir = paths::target_dir()?.join("dist");
    // Products of an earlier version, or pages of commands that no longer exist, must not
    // survive into this one.
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let staging = dir.join("staging");
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let binary = staging.join("mm-probe");
    fs::copy(&built, &binary).with_context(|| format!("copying {}", built.display()))?;
    // The symbols are for debugging the build, not for users: a third of the size.
    cmd::run(Command::new("strip").arg("--strip-all").arg(&binary))?;
    cmd::output(Command::new(&binary).arg("generate-docs").arg("--out").arg(&staging))?;
    let payload = packages::Payload::gather(&staging, &version)?;
    let release = Release {
        tarball: packages::tarball(&payload, &dir)?,
        deb: packages::deb(&payload, &dir)?,
        rpm: packages::rpm(&payload, &dir)?,
        image: image::write(&payload, &dir)?,
        version,
        dir,
        binary,
    };
    write_sums(&release)?;
    eprintln!("xtask dist: {} in {:.0?}", release.summary()?, start.elapsed());
    Ok(release)
}

/// Builds the static binary (cargo's own cache makes a repeat cheap) and proves it static;
/// returns its path in the target directory.
pub fn static_binary() -> Result<PathBuf> {
    cmd::run(Command::new("cargo").args([
        "build",
        "--release",
        "--package",
        "mm-probe",
        "--bin",
        "mm-probe",
        "--target",
        STATIC_TARGET,
    ]))?;
    let binary = paths::target_dir()?.join(STATIC_TARGET).join("release/mm-probe");
    elf::require_static(&binary)?;
    Ok(binary)
}

/// The workspace's version (`[workspace.package] version`), which every package carries.
fn workspace_version() -> Result<String> {
    let metadata = cmd::output(Command::new("cargo").args(["metadata", "--format-version=1", "--no-deps"]))?;
    let value: serde_json::Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    let packages = value["packages"].as_array().context("cargo metadata lists no packages")?;
    let version = packages
        .iter()
        .find(|p| p["name"] == "mm-probe")
        .and_then(|p| p["version"].as_str())
        .context("cargo metadata has no mm-probe package")?;
    Ok(version.to_owned())
}

/// `SHA256SUMS` beside the products, in `sha256sum -c` format.
fn write_sums(release: &Release) -> Result<()> {
    let mut command = Command::new("sha256sum");
    command.current_dir(&release.dir);
    for product in release.products() {
        command.arg(product.file_name().context("a product has no file name")?);
    }
    let sums = cmd::output(&mut command)?;
    fs::write(release.dir.join("SHA256SUMS"), sums).context("writing SHA256SUMS")
}
