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

/// Byte offset of `field` in the record of tracepoint `category:name`, from its `format` file
/// (tracepoint programs read their context at these offsets; they moved between versions for
/// some events).
pub fn field_offset(root: &Path, category: &str, name: &str, field: &str) -> Option<u32> {
    let format = std::fs::read_to_string(root.join("events").join(category).join(name).join("format")).ok()?;
    parse_field_offset(&format, field)
}

/// Finds `field:<type> <field>; offset:N;` in a tracepoint format description.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';');
        let decl = parts.next()?.trim().strip_prefix("field:")?;
        let declared = decl.rsplit([' ', '*']).next()?;
        let declared = declared.split('[').next()?;
        if declared != field {
            return None;
        }
        parts.find_map(|p| p.trim().strip_prefix("offset:")).and_then(|o| o.trim().parse().ok())
    })
}

#[cfg(test)]
mod field_tests {
    use super::*;

    #[test]
    fn offsets_from_a_format_file() {
        // exceptions:page_fault_user and mmap_lock:mmap_lock_start_locking on 6.18.44.
        let format = "name: page_fault_user\nID: 190\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
            \tfield:unsigned long address;\toffset:8;\tsize:8;\tsigned:0;\n\
            \tfield:unsigned long error_code;\toffset:24;\tsize:8;\tsigned:0;\n\
            \tfield:struct mm_struct * mm;\toffset:8;\tsize:8;\tsigned:0;\n\
            \tfield:char comm[16];\toffset:40;\tsize:16;\tsigned:0;\n";
        assert_eq!(parse_field_offset(format, "address"), Some(8));
        assert_eq!(parse_field_offset(format, "error_code"), Some(24));
        assert_eq!(parse_field_offset(format, "mm"), Some(8));
        assert_eq!(parse_field_offset(format, "comm"), Some(40));
        assert_eq!(parse_field_offset(format, "common_pid"), Some(4));
        assert_eq!(parse_field_offset(format, "ip"), None);
    }
}
