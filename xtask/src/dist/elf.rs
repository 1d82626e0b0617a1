//! Whether an executable needs anything from the machine it runs on: a program interpreter
//! (PT_INTERP, the dynamic loader) or shared libraries (DT_NEEDED in PT_DYNAMIC). Read from the
//! ELF headers directly: `ldd` runs the loader and calls some loader-needing binaries static,
//! and `file` says "static-pie linked" for both kinds.

use std::{fs, path::Path};

use anyhow::{Context as _, Result, bail};

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// What the executable asks of the machine before its first instruction runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub interpreter: Option<String>,
    /// How many DT_NEEDED entries (shared libraries) the dynamic section names; a static binary
    /// has none.
    pub libraries: usize,
}

/// Fails unless `path` is an x86-64 executable that needs neither a loader nor a library.
pub fn require_static(path: &Path) -> Result<()> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let needs = needs(&bytes).with_context(|| format!("reading the ELF headers of {}", path.display()))?;
    if needs != Needs::default() {
        bail!(
            "{} is not static: interpreter {:?}, {} shared libraries needed",
            path.display(),
            needs.interpreter,
            needs.libraries
        );
    }
    Ok(())
}

/// The interpreter and library needs of a 64-bit little-endian ELF file.
pub fn needs(elf: &[u8]) -> Result<Needs> {
    if elf.get(..4) != Some(b"\x7fELF".as_slice()) || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let phoff = read_u64(elf, 0x20)? as usize;
    let phentsize = read_u16(elf, 0x36)? as usize;
    let phnum = read_u16(elf, 0x38)? as usize;
    let mut needs = Needs::default();
    for i in 0..phnum {
        let header = phoff + i * phentsize;
        let (offset, size) = (read_u64(elf, header + 8)? as usize, read_u64(elf, header + 0x20)? as usize);
        let contents = elf.get(offset..offset + size).context("a program header points past the file")?;
        match read_u32(elf, header)? {
            PT_INTERP => {
                let name = contents.split(|&b| b == 0).next().unwrap_or_default();
                needs.interpreter = Some(String::from_utf8_lossy(name).into_owned());
            }
            PT_DYNAMIC => needs.libraries = needed_entries(contents)?,
            _ => {}
        }
    }
    Ok(needs)
}

/// The DT_NEEDED entries among the dynamic section's (tag, value) pairs, up to DT_NULL.
fn needed_entries(dynamic: &[u8]) -> Result<usize> {
    let mut count = 0;
    for entry in dynamic.chunks_exact(16) {
        match read_u64(entry, 0)? {
            DT_NULL => break,
            DT_NEEDED => count += 1,
            _ => {}
        }
    }
    Ok(count)
}

fn read_u16(bytes: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(bytes.get(at..at + 2).context("truncated ELF file")?.try_into()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(bytes.get(at..at + 4).context("truncated ELF file")?.try_into()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(bytes.get(at..at + 8).context("truncated ELF file")?.try_into()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF: the header, then program headers of `segments` (type, contents), then
    /// the contents.
    fn elf_with(segments: &[(u32, Vec<u8>)]) -> Vec<u8> {
        let (phoff, phentsize) = (64usize, 56usize);
        let mut data_at = phoff + phentsize * segments.len();
        let mut elf = vec![0u8; data_at];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&(phoff as u64).to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&(phentsize as u16).to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&(segments.len() as u16).to_le_bytes());
        for (i, (kind, contents)) in segments.iter().enumerate() {
            let header = phoff + i * phentsize;
            elf[header..header + 4].copy_from_slice(&kind.to_le_bytes());
            elf[header + 8..header + 16].copy_from_slice(&(data_at as u64).to_le_bytes());
            elf[header + 0x20..header + 0x28].copy_from_slice(&(contents.len() as u64).to_le_bytes());
            data_at += contents.len();
        }
        for (_, contents) in segments {
            elf.extend_from_slice(contents);
        }
        elf
    }

    fn dynamic(tags: &[u64]) -> Vec<u8> {
        tags.iter().flat_map(|tag| [tag.to_le_bytes(), 0u64.to_le_bytes()].concat()).collect()
    }

    #[test]
    fn a_static_pie_needs_nothing_even_with_a_dynamic_section() {
        // A static PIE keeps PT_DYNAMIC for its own relocations, without DT_NEEDED.
        let elf = elf_with(&[(1, vec![0; 8]), (PT_DYNAMIC, dynamic(&[12, 13, DT_NULL, DT_NEEDED]))]);
        assert_eq!(needs(&elf).unwrap(), Needs::default());
    }

    #[test]
    fn a_loader_and_libraries_are_found() {
        let elf = elf_with(&[
            (PT_INTERP, b"/lib/ld-musl-x86_64.so.1\0".to_vec()),
            (PT_DYNAMIC, dynamic(&[DT_NEEDED, 12, DT_NEEDED, DT_NULL])),
        ]);
        let found = needs(&elf).unwrap();
        assert_eq!(found.interpreter.as_deref(), Some("/lib/ld-musl-x86_64.so.1"));
        assert_eq!(found.libraries, 2);
    }

    #[test]
    fn this_test_binary_is_dynamic_and_garbage_is_refused() {
        let own = fs::read(std::env::current_exe().unwrap()).unwrap();
        let found = needs(&own).unwrap();
        assert!(found.interpreter.is_some() && found.libraries > 0, "{found:?}");
        assert!(needs(b"#!/bin/sh\n").is_err());
        assert!(needs(&own[..0x30]).is_err());
    }
}
