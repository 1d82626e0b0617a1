//! Loading the embedded eBPF object with this kernel's layout and a capability's settings.

use anyhow::{Context as _, Result};
use aya::{Ebpf, EbpfLoader};

use crate::kernel::{Kernel, layout::Layout};

/// The object mm-probe-ebpf builds, embedded at compile time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mm-probe-ebpf"));

/// A capability's setting handed to its programs as a global (read-only once loaded).
#[derive(Clone, Copy, Debug)]
pub enum GlobalValue {
    U32(u32),
    U64(u64),
}

/// Loads the object (creating its maps; programs load later, when the planner attaches them),
/// with struct offsets from this kernel's BTF and the given settings. Without BTF every offset is
/// unknown and the programs that need one stay silent; the plan says so.
pub fn load_object(kernel: &Kernel, settings: &[(&'static str, GlobalValue)]) -> Result<Ebpf> {
    let layout = kernel.btf().map(Layout::resolve).unwrap_or_else(|_| Layout::unknown());
    let offsets = layout.values();
    let mut loader = EbpfLoader::new();
    layout.apply(&mut loader, &offsets);
    for (name, value) in settings {
        match value {
            GlobalValue::U32(v) => loader.override_global(name, v, true),
            GlobalValue::U64(v) => loader.override_global(name, v, true),
        };
    }
    loader.load(OBJECT).context("loading mm-probe's eBPF object (creating its maps)")
}
