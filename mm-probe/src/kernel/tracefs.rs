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
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
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

/// The byte offset of every field of the tracepoint `category:name`, from its `format` file.
/// Classic tracepoint programs read the record at these offsets; reading them instead of
/// assuming them keeps programs right on builds whose common header differs (real-time patch
/// sets have added common fields).
pub fn field_offsets(root: &Path, category: &str, name: &str) -> Result<Vec<(String, u32)>> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    Ok(parse_format(&text))
}

/// Parses `field:<type> <name>[<n>];\toffset:<o>;\tsize:<s>;…` lines into (name, offset).
pub fn parse_format(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let declaration = line.strip_prefix("field:")?.split(';').next()?;
            let name = declaration.split_whitespace().last()?;
            let name = name.split('[').next()?.to_string();
            let offset = line.split(';').find_map(|part| part.trim().strip_prefix("offset:"))?;
            Some((name, offset.trim().parse().ok()?))
        })
        .collect()
}

/// Byte offset of one field of the tracepoint `category:name`, or `None` if it has no such field.
pub fn field_offset(root: &Path, category: &str, name: &str, field: &str) -> Option<u32> {
    let offsets = field_offsets(root, category, name).ok()?;
    offsets.into_iter().find(|(n, _)| n == field).map(|(_, offset)| offset)
}

/// The names a tracepoint prints for the values of `field`, from the
/// `__print_symbolic(REC->field, {0, "failed"}, {1, "succeeded"}, …)` of its format file: the
/// kernel's own table for an enum whose numbering moves between versions.
pub fn print_symbols(root: &Path, category: &str, name: &str, field: &str) -> Option<Vec<(i64, String)>> {
    let path = root.join("events").join(category).join(name).join("format");
    let symbols = parse_print_symbols(&std::fs::read_to_string(path).ok()?, field);
    (!symbols.is_empty()).then_some(symbols)
}

/// Parses the `{value, "name"}` pairs of the `__print_symbolic` call on `REC->field`.
pub fn parse_print_symbols(format: &str, field: &str) -> Vec<(i64, String)> {
    let call = format!("__print_symbolic(REC->{field},");
    let Some(start) = format.find(&call) else { return Vec::new() };
    let rest = &format[start + call.len()..];
    let body = &rest[..rest.find("})").map_or(rest.len(), |end| end + 1)];
    body.split('{')
        .filter_map(|pair| {
            let (value, name) = pair.split_once(',')?;
            let name = name.split('"').nth(1)?;
            Some((value.trim().parse().ok()?, name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_names_of_a_symbolic_field() {
        let format = "print fmt: \"mm=%p, status=%s, unmapped=%d\", REC->mm, \
            __print_symbolic(REC->status, {0, \"failed\"}, {1, \"succeeded\"}, {5, \"exceed_none_pte\"}), REC->unmapped";
        assert_eq!(
            parse_print_symbols(format, "status"),
            [(0, "failed".to_string()), (1, "succeeded".to_string()), (5, "exceed_none_pte".to_string())]
        );
        assert!(parse_print_symbols(format, "result").is_empty());
    }

    #[test]
    fn parses_field_offsets_from_a_format_file() {
        let format = "name: sched_switch\nID: 372\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
            \tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
            \tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
            \tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n\n\
            print fmt: \"prev_comm=%s\", REC->prev_comm\n";
        let fields = parse_format(format);
        assert_eq!(
            fields,
            [
                ("common_type".to_string(), 0),
                ("common_pid".to_string(), 4),
                ("prev_comm".to_string(), 8),
                ("prev_pid".to_string(), 24),
                ("args".to_string(), 16)
            ]
        );
    }
}
