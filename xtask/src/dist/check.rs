//! Proof that each product works where users put it (part of `cargo xtask test`):
//!
//! - the binary needs no loader and no library (its ELF headers);
//! - the .deb installs into a Debian 11 root made with debootstrap (glibc 2.31), runs
//!   `doctor --json` there, and purges without leaving a file;
//! - the .rpm installs with `rpm --root` into an empty root, runs `doctor --json` there, and
//!   erases cleanly;
//! - the image archive is a valid OCI layout (every blob's digest and size, the layer's diff_id,
//!   the entrypoint, the name the DaemonSet uses), and its entrypoint, run from its own unpacked
//!   layer, serves /metrics.
//!
//! The binary running where no C library exists at all is proven in the matrix guests' bare
//! boot (crate::vm::bare). Every command that mounts runs in a private mount namespace.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use super::{
    elf,
    image::{self, BINARY, CONFIG_TYPE, LAYER_TYPE, MANIFEST_TYPE, REF_NAME},
    packages::{PACKAGE, image_reference},
    release::Release,
};
use crate::{
    chroot::{self, Suite},
    cmd,
};

/// Mounts what doctor and the exporter read, in the root "$1", for a private mount namespace.
const MOUNT_KERNEL_FILES: &str = r#"mkdir -p "$1/proc" "$1/sys" "$1/dev" "$1/tmp" && mount -t proc proc "$1/proc" && mount -t sysfs sys "$1/sys" && mount -t tracefs tracefs "$1/sys/kernel/tracing" && mount --rbind /dev "$1/dev""#;

/// How long the image's exporter may take to serve its first /metrics.
const EXPORTER_START: Duration = Duration::from_secs(60);

pub fn run(release: &Release) -> Result<()> {
    elf::require_static(&release.binary)?;
    eprintln!("xtask dist check: the binary needs no loader and no shared library");
    deb_in_debian_11(release).context("the .deb in a Debian 11 root")?;
    rpm_in_an_empty_root(release).context("the .rpm in an empty root")?;
    image_serves_metrics(release).context("the OCI image")?;
    Ok(())
}

fn deb_in_debian_11(release: &Release) -> Result<()> {
    let root = chroot::ensure(Suite::Bullseye)?;
    let inside = "/tmp/mm-probe.deb";
    fs::copy(&release.deb, root.host_path(inside))?;
    // Every file the package installed must be gone once it is purged.
    let script = format!(
        "set -e; mount -t tracefs tracefs /sys/kernel/tracing; dpkg -i {inside} >/dev/null; \
         dpkg -L {PACKAGE} > /tmp/installed; mm-probe doctor --json > /tmp/doctor.json; \
         dpkg --purge {PACKAGE} >/dev/null; rm {inside}; \
         while read -r f; do if [ -f \"$f\" ]; then echo \"left behind: $f\"; exit 1; fi; done < /tmp/installed; \
         if dpkg -s {PACKAGE} >/dev/null 2>&1; then echo 'still registered'; exit 1; fi"
    );
    cmd::run(&mut root.command(&script))?;
    let doctor = fs::read_to_string(root.host_path("/tmp/doctor.json"))?;
    let installed = fs::read_to_string(root.host_path("/tmp/installed"))?;
    require_doctor_json(&doctor)?;
    ensure!(installed.contains("/usr/bin/mm-probe"), "dpkg -L lists no binary:\n{installed}");
    eprintln!("xtask dist check: the .deb installs, runs doctor and purges cleanly in Debian 11 (glibc 2.31)");
    Ok(())
}

fn rpm_in_an_empty_root(release: &Release) -> Result<()> {
    let root = fresh_dir(&release.dir.join("check-rpm-root"))?;
    let rpm = |args: &[&str]| {
        let mut command = Command::new("rpm");
        command.arg("--root").arg(&root).args(args);
        command
    };
    cmd::output(&mut rpm(&["--initdb"]))?;
    cmd::output(rpm(&["-i"]).arg(&release.rpm))?;
    let files = cmd::output(&mut rpm(&["-ql", PACKAGE]))?;
    let doctor = in_root(&root, &[BINARY, "doctor", "--json"]).output()?;
    ensure!(doctor.status.success(), "doctor failed in the rpm root: {}", String::from_utf8_lossy(&doctor.stderr));
    require_doctor_json(&String::from_utf8_lossy(&doctor.stdout))?;
    cmd::output(&mut rpm(&["-e", PACKAGE]))?;
    let left: Vec<&str> = files.lines().filter(|f| root.join(f.trim_start_matches('/')).is_file()).collect();
    ensure!(left.is_empty(), "rpm -e left {left:?}");
    fs::remove_dir_all(&root)?;
    eprintln!("xtask dist check: the .rpm installs into an empty root, runs doctor there and erases cleanly");
    Ok(())
}

fn image_serves_metrics(release: &Release) -> Result<()> {
    let work = fresh_dir(&release.dir.join("check-image"))?;
    cmd::output(Command::new("tar").arg("-xf").arg(&release.image).arg("-C").arg(&work))?;
    let (config, layer) = verified_layout(&work, &release.version)?;
    let entrypoint: Vec<String> = serde_json::from_value(config["config"]["Entrypoint"].clone())
        .context("the image configuration has no Entrypoint")?;
    ensure!(entrypoint == [BINARY, "exporter"], "entrypoint {entrypoint:?}");
    let rootfs = fresh_dir(&work.join("rootfs"))?;
    cmd::output(Command::new("tar").arg("-xzf").arg(&layer).arg("-C").arg(&rootfs))?;
    let port = free_port()?;
    let mut argv: Vec<String> = entrypoint;
    argv.extend(["--listen".to_owned(), format!("127.0.0.1:{port}")]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut exporter = in_root(&rootfs, &argv).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let scraped = scrape_when_up(port, &mut exporter);
    // SIGTERM: the exporter detaches every probe and exits 0.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(exporter.id() as i32, libc::SIGTERM) };
    let output = exporter.wait_with_output()?;
    let body = scraped?;
    ensure!(body.contains("\nmm_probe_"), "/metrics served no mm_probe_ series:\n{body}");
    ensure!(
        output.status.success(),
        "the exporter exited with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    fs::remove_dir_all(&work)?;
    eprintln!(
        "xtask dist check: the image is a valid OCI layout named {}, and its entrypoint serves /metrics",
        image_reference(&release.version)
    );
    Ok(())
}

/// Checks the unpacked layout in `dir` as a runtime would (digests, sizes, media types, the
/// diff_id, the reference name); returns the configuration and the layer's path.
fn verified_layout(dir: &Path, version: &str) -> Result<(Value, PathBuf)> {
    let index: Value = serde_json::from_slice(&fs::read(dir.join("index.json"))?)?;
    let descriptor = &index["manifests"][0];
    ensure!(
        descriptor["annotations"][REF_NAME] == image_reference(version),
        "index names {}",
        descriptor["annotations"]
    );
    let manifest: Value = serde_json::from_slice(&blob(dir, descriptor, MANIFEST_TYPE)?)?;
    let config: Value = serde_json::from_slice(&blob(dir, &manifest["config"], CONFIG_TYPE)?)?;
    let layers = manifest["layers"].as_array().context("the manifest has no layers")?;
    ensure!(layers.len() == 1, "{} layers, one expected", layers.len());
    blob(dir, &layers[0], LAYER_TYPE)?;
    let layer = blob_path(dir, &layers[0])?;
    let uncompressed = dir.join("layer.tar");
    let out = Command::new("gzip").arg("-dc").arg(&layer).output()?;
    ensure!(out.status.success(), "the layer is not gzip");
    fs::write(&uncompressed, out.stdout)?;
    let diff_id = format!("sha256:{}", image::sha256(&uncompressed)?);
    ensure!(
        config["rootfs"]["diff_ids"][0] == diff_id.as_str(),
        "diff_id {} != {diff_id}",
        config["rootfs"]["diff_ids"]
    );
    ensure!(config["config"]["Labels"]["org.opencontainers.image.version"] == version, "version label");
    Ok((config, layer))
}

/// The blob `descriptor` points at, after checking its media type, size and digest.
fn blob(dir: &Path, descriptor: &Value, media_type: &str) -> Result<Vec<u8>> {
    ensure!(
        descriptor["mediaType"] == media_type,
        "media type {} where {media_type} was expected",
        descriptor["mediaType"]
    );
    let path = blob_path(dir, descriptor)?;
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        descriptor["size"] == bytes.len(),
        "{} is {} bytes, its descriptor says {}",
        path.display(),
        bytes.len(),
        descriptor["size"]
    );
    let digest = format!("sha256:{}", image::sha256(&path)?);
    ensure!(descriptor["digest"] == digest.as_str(), "{} has digest {digest}", path.display());
    Ok(bytes)
}

fn blob_path(dir: &Path, descriptor: &Value) -> Result<PathBuf> {
    let digest = descriptor["digest"].as_str().context("a descriptor has no digest")?;
    let hex = digest.strip_prefix("sha256:").context("a digest that is not sha256")?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// `argv` run in `root` with /proc, /sys, tracefs and /dev mounted for it alone; the process
/// that `exec`s into argv[0] is the child, so signals reach it directly.
fn in_root(root: &Path, argv: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(r#"{MOUNT_KERNEL_FILES} && shift && exec chroot "$@""#))
        .arg("sh")
        .arg(root)
        .arg(root)
        .args(argv);
    command
}

/// GET /metrics on 127.0.0.1:`port` once the exporter answers; an error when it exits first or
/// does not answer in [`EXPORTER_START`].
fn scrape_when_up(port: u16, exporter: &mut std::process::Child) -> Result<String> {
    let deadline = Instant::now() + EXPORTER_START;
    while Instant::now() < deadline {
        if let Some(status) = exporter.try_wait()? {
            bail!("the exporter exited with {status} before serving");
        }
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            ensure!(response.starts_with("HTTP/1.") && response.contains(" 200 "), "answered {response:.200}");
            return Ok(response);
        }
        thread::sleep(Duration::from_millis(200));
    }
    bail!("nothing served /metrics within {EXPORTER_START:?}")
}

fn require_doctor_json(text: &str) -> Result<()> {
    let first = text.lines().next().context("doctor --json printed nothing")?;
    let value: Value = serde_json::from_str(first).with_context(|| format!("doctor --json printed {first:.200}"))?;
    ensure!(value.is_object(), "doctor --json printed {first:.200}");
    Ok(())
}

fn fresh_dir(dir: &Path) -> Result<PathBuf> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}
