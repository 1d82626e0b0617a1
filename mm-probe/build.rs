//! Builds mm-probe-ebpf for bpf{el,eb}-unknown-none with the nightly toolchain and bpf-linker, and
//! leaves the object in OUT_DIR for `include_bytes_aligned!`. `AYA_BUILD_SKIP=1` skips it (for
//! jobs such as clippy that do not need the object).
//!
//! The nested cargo's output is kept, not relayed: on success the build shows nothing but the
//! eBPF crate's own compiler warnings (cargo's progress bar covers the wait), and on failure all
//! of it goes to stderr, which cargo prints under the failing build script.

use std::{
    env,
    ffi::OsString,
    fs,
    io::{BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::{Artifact, CompilerMessage, Message, diagnostic::DiagnosticLevel};

const EBPF_PACKAGE: &str = "mm-probe-ebpf";
const SKIP: &str = "AYA_BUILD_SKIP";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed={SKIP}");
    if env::var(SKIP).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        // Said out loud: a binary built this way embeds no fresh kernel programs.
        println!("cargo:warning={SKIP} is set: the eBPF programs were not rebuilt");
        return Ok(());
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let root_dir = ebpf_root_dir()?;
    // The build-dependency on the eBPF crate rebuilds this script when its library changes; the
    // programs are its binaries, so their sources are watched here.
    println!("cargo:rerun-if-changed={}", root_dir.display());
    let build = NestedBuild::run(nested_cargo(&out_dir)?)?;
    if !build.succeeded {
        eprint!("{}", build.output);
        bail!(
            "building the eBPF programs ({EBPF_PACKAGE}) failed, output above; if the nightly toolchain, its \
             rust-src or bpf-linker is missing, run `cargo xtask setup`"
        );
    }
    for warning in &build.warnings {
        for line in warning.lines() {
            println!("cargo:warning={line}");
        }
    }
    for (name, binary) in build.executables {
        let dest = out_dir.join(name);
        fs::copy(&binary, &dest).with_context(|| format!("copying {} to {}", binary.display(), dest.display()))?;
    }
    Ok(())
}

fn ebpf_root_dir() -> anyhow::Result<PathBuf> {
    let metadata = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|package| package.name.as_str() == EBPF_PACKAGE)
        .ok_or_else(|| anyhow!("{EBPF_PACKAGE} is not in the workspace"))?;
    let manifest = ebpf.manifest_path.into_std_path_buf();
    manifest.parent().map(Path::to_path_buf).ok_or_else(|| anyhow!("{EBPF_PACKAGE} has no manifest directory"))
}

/// `rustup run nightly cargo build` of the eBPF binaries: nightly because `core` is built from
/// source for the BPF target (`-Z build-std`), which no stable toolchain offers.
fn nested_cargo(out_dir: &Path) -> anyhow::Result<Command> {
    let endian = env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN not set")?;
    let target = match endian.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("no BPF target for endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let mut command = Command::new("rustup");
    command.args(["run", "nightly", "cargo", "build", "--package", EBPF_PACKAGE, "--bins", "--release"]);
    command.args(["--message-format=json", "--target", target, "-Z", "build-std=core"]);
    // Apart from OUT_DIR's artifacts, and never the outer build's target directory: cargo would
    // wait for its own lock.
    command.arg("--target-dir").arg(out_dir.join("ebpf-target"));
    // The programs read pt_regs per architecture (bpf_target_arch), and the loader needs BTF.
    let mut rustflags = OsString::new();
    for flag in [format!("--cfg=bpf_target_arch=\"{arch}\""), "-Cdebuginfo=2".into(), "-Clink-arg=--btf".into()] {
        if !rustflags.is_empty() {
            rustflags.push("\x1f");
        }
        rustflags.push(flag);
    }
    command.env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    // The outer build's compiler is a stable one; the nested build must use the nightly's.
    command.env_remove("RUSTC").env_remove("RUSTC_WORKSPACE_WRAPPER");
    Ok(command)
}

/// What the nested build said and produced.
struct NestedBuild {
    succeeded: bool,
    /// Its compiler warnings, rendered as rustc prints them.
    warnings: Vec<String>,
    /// Everything it printed (progress, diagnostics), for when it fails.
    output: String,
    /// (binary name, path) of each program object.
    executables: Vec<(String, PathBuf)>,
}

impl NestedBuild {
    fn run(mut command: Command) -> anyhow::Result<NestedBuild> {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().with_context(|| {
            format!("starting {command:?} (the eBPF programs build with rustup's nightly: run `cargo xtask setup`)")
        })?;
        let mut stderr = child.stderr.take().context("nested cargo has no stderr")?;
        // Read apart from stdout: a full stderr pipe would block the nested cargo.
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).map(|_| text)
        });
        let stdout = BufReader::new(child.stdout.take().context("nested cargo has no stdout")?);
        let mut build =
            NestedBuild { succeeded: false, warnings: Vec::new(), output: String::new(), executables: Vec::new() };
        let mut messages = String::new();
        for message in Message::parse_stream(stdout) {
            match message.context("nested cargo printed a line that is not JSON")? {
                Message::CompilerArtifact(Artifact { executable: Some(executable), target, .. }) => {
                    build.executables.push((target.name, executable.into_std_path_buf()));
                }
                Message::CompilerMessage(CompilerMessage { message, .. }) => {
                    let rendered = message.rendered.unwrap_or(message.message);
                    if message.level == DiagnosticLevel::Warning {
                        build.warnings.push(rendered.clone());
                    }
                    messages.push_str(&rendered);
                }
                Message::TextLine(line) => {
                    messages.push_str(&line);
                    messages.push('\n');
                }
                _ => {}
            }
        }
        let status = child.wait().context("waiting for the nested cargo")?;
        let stderr = stderr.join().map_err(|_| anyhow!("reading the nested cargo's stderr panicked"))??;
        build.succeeded = status.success();
        build.output = format!("{messages}{stderr}");
        Ok(build)
    }
}
