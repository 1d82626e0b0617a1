//! Out-of-tree test kernel modules (each under testing/kmod/<name>/), built against Debian's
//! linux-headers package for each kernel of the matrix (unpacked into the cache by
//! crate::headers, or installed in a Debian chroot), by the [`Toolchain`] of its line.
//!
//! Layout under the target directory (outside the source tree, so kbuild's objects never
//! land next to the sources):
//!   kmod/<release>/build/<name>/   a copy of testing/kmod/<name>/ that kbuild builds in
//!                                  (in a build chroot: <chroot>/build/<release>/<name>/)
//!   kmod/<release>/modules/        every <name>.ko, plus the fingerprint of what built them

use std::{
    collections::BTreeMap,
    fs,
    hash::{DefaultHasher, Hasher as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::chroot::{DebianChroot, Suite};

/// The compiler Debian's bookworm kernels were built with; kbuild warns (and some configs
/// refuse) when a module is built with another.
const KERNEL_CC: &str = "gcc-12";
const FINGERPRINT_FILE: &str = ".fingerprint";

/// What builds the test modules of a kernel line. kbuild wants the compiler the kernel was built
/// with, and runs tools from the headers package (modpost, objtool) on the build machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toolchain {
    /// The host's gcc-12, as bookworm's kernels need, and their headers unpacked into the cache.
    Host,
    /// A Debian chroot of crate::chroot (unstable's, or Debian 11's), with the headers and the
    /// kernel's own compiler installed in it.
    Chroot(Suite),
}

impl Toolchain {
    /// Part of the fingerprint: modules built by one toolchain are not those of another.
    fn identity(self) -> &'static str {
        match self {
            Toolchain::Host => KERNEL_CC,
            Toolchain::Chroot(Suite::Sid) => "sid-chroot",
            Toolchain::Chroot(Suite::Bullseye) => "bullseye-chroot",
        }
    }
}

/// A toolchain made ready for one kernel release: its headers are there.
enum Builder {
    Host { headers: PathBuf },
    Chroot { chroot: DebianChroot, headers: String },
}

impl Builder {
    fn prepare(toolchain: Toolchain, release: &str) -> Result<Builder> {
        Ok(match toolchain {
            Toolchain::Host => Builder::Host { headers: crate::headers::ensure(release)? },
            Toolchain::Chroot(suite) => {
                let chroot = crate::chroot::ensure(suite)?;
                let headers = chroot.ensure_headers(release)?;
                Builder::Chroot { chroot, headers }
            }
        })
    }

    /// The headers directory as the host sees it.
    fn headers_on_host(&self) -> PathBuf {
        match self {
            Builder::Host { headers } => headers.clone(),
            Builder::Chroot { chroot, headers } => chroot.host_path(headers),
        }
    }

    /// Where the copy of module `name` is built, as the host sees it (`build_root` is
    /// `kmod/<release>/build` in the target directory).
    fn build_dir(&self, build_root: &Path, release: &str, name: &str) -> PathBuf {
        match self {
            Builder::Host { .. } => build_root.join(name),
            Builder::Chroot { chroot, .. } => chroot.host_path(&chroot_build_dir(release, name)),
        }
    }

    /// The kbuild command for the module copied to `build_dir`.
    fn make(&self, release: &str, name: &str, build_dir: &Path) -> Command {
        match self {
            Builder::Host { headers } => {
                let mut make = Command::new("make");
                make.arg("-C").arg(headers).arg(format!("M={}", build_dir.display())).arg(format!("CC={KERNEL_CC}"));
                make
            }
            // The headers' own Makefile names the compiler the kernel was built with.
            Builder::Chroot { chroot, headers } => {
                chroot.command(&format!("make -C '{headers}' M='{}' modules", chroot_build_dir(release, name)))
            }
        }
    }
}

/// A module's build directory inside a build chroot.
fn chroot_build_dir(release: &str, name: &str) -> String {
    format!("/build/{release}/{name}")
}

/// Builds every test module for the kernel `release` (as `uname -r` prints it in the guest,
/// e.g. `6.1.0-57-rt-amd64`) with `toolchain` and returns the directory holding the `.ko` files.
pub fn build_for_release(release: &str, toolchain: Toolchain) -> Result<PathBuf> {
    let sources = module_sources()?;
    let builder = Builder::prepare(toolchain, release)?;
    let root = crate::paths::target_dir()?.join("kmod").join(release);
    let out_dir = root.join("modules");
    let fingerprint = fingerprint(&sources, &builder.headers_on_host(), toolchain)?;
    if fs::read_to_string(out_dir.join(FINGERPRINT_FILE)).is_ok_and(|f| f == fingerprint) {
        eprintln!("xtask: test modules for {release} are up to date in {}", out_dir.display());
        return Ok(out_dir);
    }
    if out_dir.exists() {
        fs::remove_dir_all(&out_dir).with_context(|| format!("clearing {}", out_dir.display()))?;
    }
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for (name, files) in &sources {
        let build_dir = builder.build_dir(&root.join("build"), release, name);
        copy_sources(files, &build_dir)?;
        for ko in build_module(&builder, release, name, &build_dir)? {
            let dest = out_dir.join(ko.file_name().context("module without a file name")?);
            fs::copy(&ko, &dest).with_context(|| format!("copying {} to {}", ko.display(), dest.display()))?;
        }
    }
    fs::write(out_dir.join(FINGERPRINT_FILE), fingerprint)?;
    Ok(out_dir)
}

/// Every module directory under testing/kmod/, with its regular files (sorted: the
/// fingerprint must not depend on readdir order).
fn module_sources() -> Result<BTreeMap<String, Vec<PathBuf>>> {
    let kmod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testing/kmod");
    let kmod = kmod.canonicalize().with_context(|| format!("no test module directory {}", kmod.display()))?;
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(&kmod).with_context(|| format!("reading {}", kmod.display()))? {
        let dir = entry?.path();
        if !dir.is_dir() {
            continue;
        }
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
        files.retain(|f| f.is_file());
        files.sort();
        if !files.iter().any(|f| f.file_name().is_some_and(|n| n == "Makefile" || n == "Kbuild")) {
            bail!("{} has no Makefile or Kbuild: every testing/kmod/<name>/ must be a kbuild module", dir.display());
        }
        let name = dir.file_name().and_then(|n| n.to_str()).context("module directory name is not UTF-8")?;
        modules.insert(name.to_string(), files);
    }
    if modules.is_empty() {
        bail!("no test modules under {}", kmod.display());
    }
    Ok(modules)
}

/// A digest of the module sources, of the exact headers build (kernel.release and the config the
/// package shipped) and of the toolchain, so new sources, a new headers package or another
/// toolchain rebuild the modules.
fn fingerprint(sources: &BTreeMap<String, Vec<PathBuf>>, headers: &Path, toolchain: Toolchain) -> Result<String> {
    let mut hasher = DefaultHasher::new();
    for (name, files) in sources {
        hasher.write(name.as_bytes());
        for file in files {
            hasher.write(file.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
            hasher.write(&fs::read(file).with_context(|| format!("reading {}", file.display()))?);
        }
    }
    for stamp in ["include/config/kernel.release", ".config"] {
        hasher.write(&fs::read(headers.join(stamp)).unwrap_or_default());
    }
    hasher.write(toolchain.identity().as_bytes());
    Ok(format!("{:016x}\n", hasher.finish()))
}

fn copy_sources(files: &[PathBuf], build_dir: &Path) -> Result<()> {
    if build_dir.exists() {
        fs::remove_dir_all(build_dir).with_context(|| format!("clearing {}", build_dir.display()))?;
    }
    fs::create_dir_all(build_dir).with_context(|| format!("creating {}", build_dir.display()))?;
    for file in files {
        let dest = build_dir.join(file.file_name().context("source file without a name")?);
        fs::copy(file, &dest).with_context(|| format!("copying {} to {}", file.display(), dest.display()))?;
    }
    Ok(())
}

/// Runs kbuild for one module directory and returns the `.ko` files it made; on failure the
/// error carries the compiler's output.
fn build_module(builder: &Builder, release: &str, name: &str, build_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut make = builder.make(release, name, build_dir);
    eprintln!("xtask: building test module {name} for {release}");
    let out = make.output().with_context(|| format!("starting make (is `make` installed?) for module {name}"))?;
    let mut modules: Vec<PathBuf> = fs::read_dir(build_dir)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    modules.retain(|p| p.extension().is_some_and(|e| e == "ko"));
    if !out.status.success() || modules.is_empty() {
        bail!(
            "building test module {name} for kernel {release} failed ({}); {make:?} printed:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A warning from a module is worth seeing even when the build succeeded.
    for warning in String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains("warning:")) {
        eprintln!("xtask: {name}: {warning}");
    }
    Ok(modules)
}
