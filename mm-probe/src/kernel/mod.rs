//! What the running kernel is: its release, its BTF (and the struct layouts resolved from it),
//! its symbols, tracefs, the privileges this process holds, and the processes it is asked to trace.

pub mod btf;
pub mod config;
pub mod kallsyms;
pub mod layout;
pub mod privileges;
pub mod process;
pub mod release;
pub mod stacks;
pub mod syscalls;
pub mod tracefs;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use anyhow::Result;

pub use btf::KernelBtf;
pub use kallsyms::Kallsyms;
pub use release::Release;

/// Everything mm-probe learns about the running kernel, gathered lazily and once (the BTF until
/// it is released).
pub struct Kernel {
    pub release: Release,
    btf: Mutex<Option<Result<Arc<KernelBtf>, String>>>,
    kallsyms: OnceLock<Result<Kallsyms, String>>,
}

impl Kernel {
    pub fn running() -> Result<Self> {
        Ok(Self { release: Release::running()?, btf: Mutex::default(), kallsyms: OnceLock::new() })
    }

    /// The kernel's own BTF, or why it is unavailable: parsed at the first use and kept until
    /// [`Kernel::release_btf`].
    pub fn btf(&self) -> Result<Arc<KernelBtf>, String> {
        let mut held = self.btf.lock().unwrap_or_else(PoisonError::into_inner);
        let parsed = || KernelBtf::from_sys_fs().map(Arc::new).map_err(|e| format!("{e:#}"));
        held.get_or_insert_with(parsed).clone()
    }

    /// Lets go of the parsed BTF once everything is attached: held twice over (aya's parse and
    /// the raw records), it is most of a run's memory, and only loading and attaching read it.
    /// A later use parses it again.
    pub fn release_btf(&self) {
        *self.btf.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Why a kernel program cannot read a task's syscall from its saved registers here (`None`
    /// when it can): see `syscalls::registers_unreadable`.
    pub fn registers_unreadable(&self) -> Option<String> {
        syscalls::registers_unreadable(self.btf().as_deref().map_err(String::as_str), &self.release)
    }

    /// The kernel's symbol table, or why it is unreadable.
    pub fn kallsyms(&self) -> Result<&Kallsyms, &str> {
        self.kallsyms.get_or_init(|| Kallsyms::read().map_err(|e| format!("{e:#}"))).as_ref().map_err(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_btf_is_parsed_again_at_the_next_use() {
        let Ok(kernel) = Kernel::running() else { return };
        let Ok(first) = kernel.btf() else { return };
        assert!(Arc::ptr_eq(&first, &kernel.btf().unwrap()), "kept between uses");
        kernel.release_btf();
        let again = kernel.btf().unwrap();
        assert!(!Arc::ptr_eq(&first, &again), "parsed anew");
        assert_eq!(again.member_offset("mm_struct", "mmap_base"), first.member_offset("mm_struct", "mmap_base"));
    }
}
