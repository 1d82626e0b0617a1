//! Builds mm-probe-ebpf for bpfel-unknown-none with the nightly toolchain and bpf-linker, and
//! leaves the object in OUT_DIR for `include_bytes_aligned!`. `AYA_BUILD_SKIP=1` skips it (for
//! jobs such as clippy that do not need the object).
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|package| package.name.as_str() == "mm-probe-ebpf")
        .ok_or_else(|| anyhow!("mm-probe-ebpf is not in the workspace"))?;
    let root_dir =
        ebpf.manifest_path.parent().ok_or_else(|| anyhow!("mm-probe-ebpf has no manifest directory"))?.as_str();
    aya_build::build_ebpf([Package { name: ebpf.name.as_str(), root_dir, ..Default::default() }], Toolchain::default())
}
