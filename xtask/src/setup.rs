//! `cargo xtask setup`: everything a fresh Debian machine with rustup needs to build and test
//! mm-probe. Idempotent: each step checks before it acts.
//!
//! - the nightly toolchain's `rust-src` (the eBPF crate builds `core` for bpfel-unknown-none);
//! - the musl target of the toolchain that builds mm-probe (the static release binary);
//! - bpf-linker, built against the nightly's own libLLVM so the two LLVMs always match;
//! - the Debian packages the tests use (qemu, busybox, cpio, decompressors, gcc for the test
//!   kernel modules, stress-ng, rt-tests, bpftrace for the benchmark, prometheus: the server and
//!   promtool for the exporter's end-to-end test, promtool for the fleet dashboard's queries,
//!   rpm for the release's .rpm, musl-tools for its static binary's allocator);
//! - the fleet test's validators, under `~/.local/share/mm-probe/` (kept across sessions, unlike
//!   /tmp): kubernetes-validate in a Python venv, TypeScript and Grafana's `@grafana/schema`
//!   types in a Node package folder. `mm-probe/tests/fleet.rs` looks for them there.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// The bpf-linker release the pinned aya set is known to work with.
const BPF_LINKER_VERSION: &str = "0.13.0";

const DEBIAN_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    "zstd",
    "gcc-12",
    // What linux-kbuild depends on and the unpacked kbuild cannot bring along: modpost's BTF
    // step for the bookworm kernels' test modules runs pahole (a fresh machine failed there).
    "pahole",
    "make",
    "stress-ng",
    "rt-tests",
    "bpftrace",
    // The server and promtool (the exporter's end-to-end test; promtool parses the fleet
    // dashboard's PromQL). Where systemd runs, the package also starts a Prometheus on :9090.
    "prometheus",
    "python3-venv",
    // rpmbuild for `cargo xtask dist`, and rpm to install the package into an empty root.
    "rpm",
    // musl-gcc, which builds the static binary's allocator (jemalloc, C) against musl.
    "musl-tools",
];

/// kubernetes-validate bundles the Kubernetes OpenAPI schemas: it validates offline.
const KUBERNETES_VALIDATE: (&str, &str) = ("kubernetes-validate", "1.37.0");

/// npm packages, pinned: tsc type-checks the dashboard against Grafana's published types.
const NODE_PACKAGES: &[(&str, &str)] = &[("typescript", "5.9.3"), ("@grafana/schema", "13.2.3")];

pub fn run() -> Result<()> {
    ensure_nightly_rust_src()?;
    ensure_static_target()?;
    ensure_bpf_linker()?;
    ensure_debian_packages()?;
    ensure_fleet_validators()?;
    eprintln!("xtask setup: done");
    Ok(())
}

fn ensure_nightly_rust_src() -> Result<()> {
    let toolchains = cmd::output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        cmd::run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))?;
    }
    let components =
        cmd::output(Command::new("rustup").args(["component", "list", "--installed", "--toolchain", "nightly"]))?;
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        cmd::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    }
    Ok(())
}

/// The musl target's standard library for the toolchain that builds mm-probe: `cargo xtask dist`
/// builds the static binary with it (rustup's component brings musl's libc.a and start files,
/// so no musl package is needed).
fn ensure_static_target() -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|l| l.trim() == crate::dist::STATIC_TARGET) {
        cmd::run(Command::new("rustup").args(["target", "add", crate::dist::STATIC_TARGET]))?;
    }
    Ok(())
}

/// The LLVM major version of the nightly toolchain (`LLVM version: 22.1.4` → 22).
fn nightly_llvm_major() -> Result<u32> {
    let info = cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    parse_llvm_major(&info).context("rustc +nightly -vV printed no LLVM version")
}

fn parse_llvm_major(rustc_vv: &str) -> Option<u32> {
    let line = rustc_vv.lines().find_map(|l| l.strip_prefix("LLVM version: "))?;
    line.split('.').next()?.trim().parse().ok()
}

/// Where bpf-linker's LLVM_PREFIX lives: outside /tmp so it survives, keyed by LLVM major.
fn llvm_prefix(major: u32) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(Path::new(&home).join(format!(".local/share/mm-probe/llvm-{major}")))
}

fn bpf_linker_works() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
}

fn ensure_bpf_linker() -> Result<()> {
    let major = nightly_llvm_major()?;
    // Always refresh the links: a nightly update changes the library file name, and a
    // bpf-linker whose RUNPATH points at a stale link no longer starts.
    let prefix = llvm_prefix(major)?;
    link_nightly_llvm(&prefix, major)?;
    if bpf_linker_works() {
        return Ok(());
    }
    cmd::run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--locked", "--version", BPF_LINKER_VERSION, "--no-default-features"])
            .args(["--features", &format!("llvm-{major}")])
            .env("LLVM_PREFIX", &prefix),
    )?;
    if !bpf_linker_works() {
        bail!("bpf-linker was installed but does not run; check {}", prefix.display());
    }
    Ok(())
}

/// Makes `<prefix>/lib` hold `libLLVM.so` and the soname file, both links to the nightly's own
/// `libLLVM.so.<major>.*-rust-*`.
fn link_nightly_llvm(prefix: &Path, major: u32) -> Result<()> {
    let sysroot = cmd::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let wanted = format!("libLLVM.so.{major}.");
    let library = std::fs::read_dir(&lib_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&wanted)))
        .with_context(|| format!("no {wanted}* in {}", lib_dir.display()))?;
    let links = prefix.join("lib");
    std::fs::create_dir_all(&links)?;
    let soname = library.file_name().context("library has no file name")?;
    for name in [Path::new("libLLVM.so"), Path::new(soname)] {
        let link = links.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&library, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

fn ensure_debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let sudo = !cmd::is_root();
    let apt = |args: &[&str]| {
        let mut c = if sudo { Command::new("sudo") } else { Command::new("apt-get") };
        if sudo {
            c.arg("apt-get");
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    cmd::run(&mut apt(&["update", "-qq"]))?;
    let mut install = apt(&["install", "-y", "-qq", "--no-install-recommends"]);
    install.args(&missing);
    cmd::run(&mut install)
}

/// `~/.local/share/mm-probe/<name>`: outside /tmp, so installs survive reboots and sessions.
fn data_dir(name: &str) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(Path::new(&home).join(".local/share/mm-probe").join(name))
}

fn ensure_fleet_validators() -> Result<()> {
    ensure_python_tool(&data_dir("venv")?, KUBERNETES_VALIDATE)?;
    ensure_node_packages(&data_dir("node")?, NODE_PACKAGES)
}

/// `venv/bin/<package>` at exactly `version`, in a venv of its own (Debian's python refuses
/// system-wide pip installs).
fn ensure_python_tool(venv: &Path, (package, version): (&str, &str)) -> Result<()> {
    let reports = |wanted: &str| {
        Command::new(venv.join("bin").join(package))
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(wanted))
    };
    if reports(version) {
        return Ok(());
    }
    if !venv.join("bin/python").exists() {
        cmd::run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    }
    cmd::run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", &format!("{package}=={version}")]))?;
    if !reports(version) {
        bail!("{package} {version} was installed in {} but does not report that version", venv.display());
    }
    Ok(())
}

/// `node_modules` under `dir` holding every package at its pinned version.
fn ensure_node_packages(dir: &Path, packages: &[(&str, &str)]) -> Result<()> {
    let installed = |name: &str| -> Option<String> {
        let text = std::fs::read_to_string(dir.join("node_modules").join(name).join("package.json")).ok()?;
        let manifest: serde_json::Value = serde_json::from_str(&text).ok()?;
        manifest["version"].as_str().map(str::to_owned)
    };
    let missing: Vec<String> = packages
        .iter()
        .filter(|(name, version)| installed(name).as_deref() != Some(*version))
        .map(|(name, version)| format!("{name}@{version}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    cmd::run(
        Command::new("npm")
            .args(["install", "--save-exact", "--no-audit", "--no-fund", "--prefix"])
            .arg(dir)
            .args(&missing),
    )
    .context("installing the fleet test's npm packages (Node.js and npm come with the machine)")
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_output() {
        let text = "rustc 1.97.0-nightly\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.4\n";
        assert_eq!(parse_llvm_major(text), Some(22));
        assert_eq!(parse_llvm_major("rustc 1.0"), None);
    }
}
