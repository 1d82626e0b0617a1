//! `mm-probe-<version>-oci.tar`: an OCI image layout in a tar archive (what `podman load` and
//! `skopeo copy oci-archive:` read), written here rather than by a container tool so that dist
//! needs none. `FROM scratch`: one layer with the static binary and an empty /tmp (doctor's
//! program-type self-test writes there), the exporter as its entrypoint.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::packages::{self, PACKAGE, Payload};
use crate::cmd;

pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation `podman load` names the image by.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Where the binary is in the image.
pub const BINARY: &str = "/usr/bin/mm-probe";
/// The exporter's default port (`exporter --listen`).
const PORT: u16 = 9479;

pub fn write(payload: &Payload, dist: &Path) -> Result<PathBuf> {
    let work = dist.join("oci-work");
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    let layer = layer(payload, &work)?;
    let (layer_digest, layer_size) = store(&blobs, &fs::read(&layer.compressed)?)?;
    let config = serde_json::to_vec(&config(payload, &layer.diff_id))?;
    let (config_digest, config_size) = store(&blobs, &config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": { "mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size },
        "layers": [{ "mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size }],
    });
    let (manifest_digest, manifest_size) = store(&blobs, &serde_json::to_vec(&manifest)?)?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": manifest_digest,
            "size": manifest_size,
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": { REF_NAME: packages::image_reference(&payload.version) },
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let archive = dist.join(format!("{PACKAGE}-{}-oci.tar", payload.version));
    packages::reproducible_tar(payload.epoch, &layout, &["blobs", "index.json", "oci-layout"], &archive, false)?;
    fs::remove_dir_all(&work)?;
    Ok(archive)
}

/// The image configuration: the exporter as entrypoint (arguments given to the container go
/// after `exporter`), its port, and the layer's uncompressed digest.
fn config(payload: &Payload, diff_id: &str) -> Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [BINARY, "exporter"],
            "ExposedPorts": { format!("{PORT}/tcp"): {} },
            "Env": ["PATH=/usr/bin"],
            "Labels": {
                "org.opencontainers.image.title": PACKAGE,
                "org.opencontainers.image.version": payload.version,
            },
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created_by": "cargo xtask dist" }],
    })
}

struct Layer {
    compressed: PathBuf,
    /// sha256 of the uncompressed tar: the config's diff_id.
    diff_id: String,
}

fn layer(payload: &Payload, work: &Path) -> Result<Layer> {
    use std::os::unix::fs::PermissionsExt as _;
    let root = work.join("rootfs");
    let binary = root.join(BINARY.trim_start_matches('/'));
    fs::create_dir_all(binary.parent().context("no parent")?)?;
    fs::copy(payload.binary(), &binary)?;
    fs::set_permissions(&binary, fs::Permissions::from_mode(0o755))?;
    fs::create_dir_all(root.join("tmp"))?;
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let tar = work.join("layer.tar");
    packages::reproducible_tar(payload.epoch, &root, &["tmp", "usr"], &tar, false)?;
    let diff_id = format!("sha256:{}", sha256(&tar)?);
    cmd::output(Command::new("gzip").args(["-9n", "--keep"]).arg(&tar))?;
    Ok(Layer { compressed: work.join("layer.tar.gz"), diff_id })
}

/// Writes `bytes` as a blob named by its digest; returns the digest and size.
fn store(blobs: &Path, bytes: &[u8]) -> Result<(String, usize)> {
    let staged = blobs.join("incoming");
    fs::write(&staged, bytes)?;
    let hex = sha256(&staged)?;
    fs::rename(&staged, blobs.join(&hex))?;
    Ok((format!("sha256:{hex}"), bytes.len()))
}

pub fn sha256(path: &Path) -> Result<String> {
    let out = cmd::output(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .with_context(|| format!("sha256sum printed nothing for {}", path.display()))
}
