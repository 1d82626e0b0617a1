//! The guest's initramfs: static busybox, the modules that mount the host root over virtio-9p
//! (taken from the kernel package itself, so they always match the kernel), and an /init that
//! mounts what the tests need, chroots into the host root and runs the test script.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use super::kernels::KernelBuild;

/// What mounting the host root needs, by module name; their dependencies (virtio core, netfs,
/// fscache where it still exists, 9pnet) come from modules.dep. Debian builds all of these as
/// modules today, but a name found in modules.builtin is simply already there.
const NINEP_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// Where the busybox-static package installs its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// 9p tags and guest paths shared with qemu.rs and the test script.
pub const HOST_ROOT_TAG: &str = "hostroot";
pub const RESULTS_TAG: &str = "results";
/// The writable results share, as the chrooted test script sees it.
pub const GUEST_RESULTS_DIR: &str = "/run/mm-probe-vm";
/// The test script inside the results share.
pub const TEST_SCRIPT: &str = "run-tests.sh";
/// Console lines from the harness's own scripts start with this; the host echoes them live.
pub const MARKER: &str = "mm-probe-vm:";
/// What /init prints every [`HEARTBEAT_PERIOD_S`] seconds of guest time while the tests run:
/// a kernel that can still run a shell loop is not wedged, whatever a test is doing.
pub const HEARTBEAT: &str = "alive";
/// Short, so that an instruction-counted guest, whose clock runs slower than the host's, still
/// beats well inside the host's silence limit.
pub const HEARTBEAT_PERIOD_S: u64 = 5;
/// Kernel command-line word that turns /init into a boot probe (see qemu::choose_accel).
pub const PROBE_ARG: &str = "mm_probe_vm.probe";

/// The module name of a modules.dep path (`kernel/net/9p/9pnet_virtio.ko.xz` → `9pnet_virtio`);
/// the kernel treats `-` and `_` in module names as the same character.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The modules.dep paths to insmod, dependencies first, so that `wanted` are all loaded.
/// Modules built into the kernel (modules.builtin) are skipped; a module in neither file is an
/// error, since the guest could not mount its root without it.
pub fn load_order(modules_dep: &str, modules_builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let mut deps: HashMap<String, (&str, Vec<&str>)> = HashMap::new();
    for line in modules_dep.lines() {
        let Some((path, rest)) = line.split_once(':') else {
            continue;
        };
        deps.insert(module_name(path), (path.trim(), rest.split_whitespace().collect()));
    }
    let builtin: HashSet<String> = modules_builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for name in wanted {
        visit(&module_name(name), &deps, &builtin, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    deps: &HashMap<String, (&str, Vec<&str>)>,
    builtin: &HashSet<String>,
    seen: &mut HashSet<String>,
    order: &mut Vec<String>,
) -> Result<()> {
    if !seen.insert(name.to_owned()) || builtin.contains(name) {
        return Ok(());
    }
    let Some((path, needs)) = deps.get(name) else {
        bail!("module {name} is neither in modules.dep nor built in");
    };
    for need in needs {
        visit(&module_name(need), deps, builtin, seen, order)?;
    }
    order.push((*path).to_owned());
    Ok(())
}

/// Writes `<work>/initramfs.cpio` for `kernel` and returns its path.
pub fn build(kernel: &KernelBuild, work: &Path) -> Result<PathBuf> {
    ensure_mount_point(Path::new(HOST_MODULES))?;
    let modules_dir = kernel.modules_dir();
    let read = |name: &str| {
        let path = modules_dir.join(name);
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let order = load_order(&read("modules.dep")?, &read("modules.builtin").unwrap_or_default(), NINEP_MODULES)
        .with_context(|| format!("{} {}", kernel.package, kernel.version))?;

    let staging = work.join("initramfs");
    let _ = fs::remove_dir_all(&staging);
    for dir in ["bin", "dev", "proc", "sys", "host", "modules"] {
        fs::create_dir_all(staging.join(dir))?;
    }
    fs::copy(BUSYBOX, staging.join("bin/busybox"))
        .with_context(|| format!("copying {BUSYBOX} (install busybox-static: `cargo xtask setup`)"))?;
    let mut files = Vec::new();
    for path in &order {
        let file = format!("{}.ko", module_name(path));
        write_uncompressed(&modules_dir.join(path), &staging.join("modules").join(&file))?;
        files.push(file);
    }
    let init = staging.join("init");
    fs::write(&init, init_script(&files, &kernel.boot_dir(), &kernel.modules_root(), &paths_to_keep()?))?;
    set_executable(&init)?;

    let cpio = work.join("initramfs.cpio");
    pack_newc(&staging, &cpio)?;
    Ok(cpio)
}

/// Busybox's insmod cannot be trusted with every compression Debian has used (.ko.xz since 6.x
/// point releases, .ko.zst proposed), so the host decompresses.
fn write_uncompressed(source: &Path, dest: &Path) -> Result<()> {
    let name = source.to_string_lossy();
    let decompressor = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match decompressor {
        None => {
            fs::copy(source, dest).with_context(|| format!("copying {}", source.display()))?;
        }
        Some(tool) => {
            let out = Command::new(tool)
                .args(["-d", "-c"])
                .arg(source)
                .stderr(Stdio::inherit())
                .output()
                .with_context(|| format!("running {tool} (install it: `cargo xtask setup`)"))?;
            if !out.status.success() {
                bail!("{tool} -d {} failed with {}", source.display(), out.status);
            }
            fs::write(dest, out.stdout)?;
        }
    }
    Ok(())
}

pub fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).with_context(|| format!("chmod {}", path.display()))
}

/// `find . | cpio -o -H newc` in `staging`, uncompressed: the kernel unpacks it without a
/// decompressor and it is only a few megabytes.
pub fn pack_newc(staging: &Path, cpio: &Path) -> Result<()> {
    let mut names = Vec::new();
    collect_paths(staging, staging, &mut names)?;
    names.sort();
    let out = fs::File::create(cpio).with_context(|| format!("creating {}", cpio.display()))?;
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(staging)
        .stdin(Stdio::piped())
        .stdout(out)
        .spawn()
        .context("running cpio (install it: `cargo xtask setup`)")?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().context("cpio stdin")?;
        stdin.write_all(names.join("\n").as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cpio failed with {status}");
    }
    Ok(())
}

fn collect_paths(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let relative = path.strip_prefix(base)?.to_string_lossy().into_owned();
        out.push(relative);
        if path.is_dir() {
            collect_paths(base, &path, out)?;
        }
    }
    Ok(())
}

/// The directories the tests run from: the workspace (sources, and usually the target dir) and
/// the target dir. The guest mounts fresh tmpfs on /tmp, /run and /dev/shm; a clone that lives
/// under one of them (CI may clone into /tmp) would vanish from the guest's view, so the init
/// script lays these back over the tmpfs at their own paths.
fn paths_to_keep() -> Result<Vec<PathBuf>> {
    let workspace =
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("xtask has no parent directory")?.to_path_buf();
    let target = crate::paths::target_dir()?;
    let mut keep = vec![workspace.clone()];
    if !target.starts_with(&workspace) {
        keep.push(target);
    }
    Ok(keep)
}

/// Shell lines that re-expose `keep` paths hidden by a tmpfs mounted on `volatile` (a guest path
/// such as /tmp): bind each aside before the tmpfs goes on, then back at its own path.
fn keep_under(volatile: &str, keep: &[PathBuf]) -> (String, String) {
    let (mut before, mut after) = (String::new(), String::new());
    for (i, path) in keep.iter().enumerate().filter(|(_, p)| p.starts_with(volatile)) {
        let path = path.display();
        before += &format!("$B mkdir -p /keep/{i} && $B mount --bind \"$H{path}\" /keep/{i} || fail \"keep {path}\"\n");
        after +=
            &format!("$B mkdir -p \"$H{path}\" && $B mount --bind /keep/{i} \"$H{path}\" || fail \"restore {path}\"\n");
    }
    (before, after)
}

/// Where the guest binds its kernel's modules over the host root it runs from.
const HOST_MODULES: &str = "/lib/modules";

/// The guest binds its kernel's /boot and /lib/modules over the host's, and the host root is
/// read-only in the guest, so the mount point must exist on the host. Every machine that ever
/// installed a kernel package has /lib/modules; a host without modules of its own (a fresh
/// virtual machine here) does not, and every boot then failed at "bind the kernel's
/// /lib/modules". The empty directory is made, and said.
fn ensure_mount_point(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    eprintln!(
        "xtask vm-test: making the empty directory {} (every kernel package makes it; the guests bind their kernel's modules over it)",
        dir.display()
    );
    fs::create_dir_all(dir).with_context(|| format!("creating {} (as root)", dir.display()))
}

/// The guest's /init. Every mount failure is fatal and said on the console: a test run on a
/// half-mounted system would report confusing failures instead of the real cause.
/// `boot` and `modules_root` are the unpacked kernel's /boot and /lib/modules on the host, laid
/// over the host's, so that /boot/config-$(uname -r) and modprobe see the guest's kernel.
fn init_script(module_files: &[String], boot: &Path, modules_root: &Path, keep: &[PathBuf]) -> String {
    let modules = module_files.join(" ");
    let (boot, modules_root) = (boot.display(), modules_root.display());
    let mut keep_before = String::new();
    let mut keep_after = String::new();
    for volatile in ["/tmp", "/run", "/dev/shm"] {
        let (before, after) = keep_under(volatile, keep);
        keep_before += &before;
        keep_after += &after;
    }
    format!(
        r#"#!/bin/busybox sh
# Generated by `cargo xtask vm-test`.
B=/bin/busybox
fail() {{ echo "{MARKER} init failed: $*"; $B sync; $B poweroff -f; }}
$B mount -t proc proc /proc || fail "mount /proc"
$B mount -t devtmpfs devtmpfs /dev || fail "mount /dev"
if $B grep -q {PROBE_ARG} /proc/cmdline; then
    echo "{MARKER} probe booted"
    $B poweroff -f
fi
for m in {modules}; do
    $B insmod /modules/$m || fail "insmod $m"
done
H=/host
$B mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose {HOST_ROOT_TAG} $H || fail "mount host root"
$B mount -t proc proc $H/proc || fail "mount proc"
$B mount -t sysfs sysfs $H/sys || fail "mount sysfs"
$B mount -t devtmpfs devtmpfs $H/dev || fail "mount devtmpfs"
{keep_before}$B mkdir -p $H/dev/pts $H/dev/shm
$B mount -t devpts devpts $H/dev/pts || fail "mount devpts"
$B mount -t tmpfs tmpfs $H/dev/shm || fail "mount /dev/shm"
$B mount -t tmpfs tmpfs $H/tmp || fail "mount /tmp"
$B mount -t tmpfs tmpfs $H/run || fail "mount /run"
{keep_after}
$B mount --bind "$H{boot}" $H/boot || fail "bind the kernel's /boot"
$B mount --bind "$H{modules_root}" $H{HOST_MODULES} || fail "bind the kernel's {HOST_MODULES}"
$B mount -t tracefs tracefs $H/sys/kernel/tracing || fail "mount tracefs"
$B mount -t debugfs debugfs $H/sys/kernel/debug || fail "mount debugfs"
$B mount -t bpf bpf $H/sys/fs/bpf || fail "mount bpffs"
$B mkdir -p $H{GUEST_RESULTS_DIR}
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 {RESULTS_TAG} $H{GUEST_RESULTS_DIR} || fail "mount results"
echo "{MARKER} kernel $($B uname -r) up $($B cut -d' ' -f1 /proc/uptime)s"
( while $B sleep {HEARTBEAT_PERIOD_S}; do echo "{MARKER} {HEARTBEAT}"; done ) &
beat=$!
$B chroot $H /bin/sh {GUEST_RESULTS_DIR}/{TEST_SCRIPT}
status=$?
$B kill $beat
echo "{MARKER} tests finished with status $status at $($B cut -d' ' -f1 /proc/uptime)s"
$B dmesg > $H{GUEST_RESULTS_DIR}/dmesg.txt
$B sync
$B poweroff -f
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Abridged from Debian 6.1.0-57-amd64 (modules.dep as depmod writes it).
    const DEP_6_1: &str = "\
kernel/fs/netfs/netfs.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";

    fn names(order: &[String]) -> Vec<String> {
        order.iter().map(|p| module_name(p)).collect()
    }

    #[test]
    fn dependencies_load_before_their_users_and_once() {
        let order = load_order(DEP_6_1, "", NINEP_MODULES).unwrap();
        assert_eq!(
            names(&order),
            [
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "fscache",
                "9p"
            ]
        );
        assert_eq!(order[4], "kernel/drivers/virtio/virtio_pci.ko");
    }

    #[test]
    fn builtin_modules_are_not_loaded_and_compressed_names_match() {
        // 6.12: fscache merged into netfs, modules compressed, virtio built in.
        let dep = "kernel/fs/netfs/netfs.ko.xz:\n\
                   kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n\
                   kernel/net/9p/9pnet.ko.xz:\n\
                   kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz\n";
        let builtin = "kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_ring.ko\nkernel/drivers/virtio/virtio_pci.ko\n";
        let order = load_order(dep, builtin, NINEP_MODULES).unwrap();
        assert_eq!(names(&order), ["9pnet", "9pnet_virtio", "netfs", "9p"]);
        assert_eq!(order[3], "kernel/fs/9p/9p.ko.xz");
    }

    #[test]
    fn a_missing_module_is_an_error() {
        let error = load_order("kernel/fs/9p/9p.ko:\n", "", &["9p", "9pnet_virtio"]).unwrap_err();
        assert!(error.to_string().contains("9pnet_virtio"), "{error}");
    }

    #[test]
    fn dashes_and_underscores_name_the_same_module() {
        assert_eq!(module_name("kernel/drivers/char/hw_random/virtio-rng.ko.zst"), "virtio_rng");
    }
}
