//! tracefs: where it is mounted, mounting it when nobody has, and which events exist.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs root, mounting it at /sys/kernel/tracing if it is not mounted yet (classic
/// tracepoints are attached by the id file under `events/`).
pub fn root() -> Result<PathBuf> {
    if let Some(found) = mounted() {
        return Ok(found);
    }
    mount_tracefs(CANDIDATES[0])?;
    mounted().ok_or_else(|| anyhow::anyhow!("tracefs mounted but has no events/ directory"))
}

fn mounted() -> Option<PathBuf> {
    CANDIDATES.iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

fn mount_tracefs(at: &str) -> Result<()> {
    let target = std::ffi::CString::new(at)?;
    let fstype = c"tracefs";
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        bail!(
            "tracefs is not mounted and mounting it at {at} failed ({}); mount it with \
             `mount -t tracefs nodev {at}`",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Whether the tracepoint `category:name` exists on this kernel.
pub fn event_exists(root: &Path, category: &str, name: &str) -> bool {
    root.join("events").join(category).join(name).join("id").exists()
}
