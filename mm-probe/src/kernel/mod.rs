//! What the running kernel is: its release, its BTF (and the struct layouts resolved from it),
//! its symbols, tracefs, the privileges this process holds, and the processes it is asked to trace.

pub mod btf;
pub mod config;
pub mod kallsyms;
pub mod layout;
pub mod privileges;
pub mod process;
pub mod release;
pub mod syscalls;
pub mod tracefs;

use std::sync::OnceLock;

use anyhow::Result;

pub use btf::KernelBtf;
pub use kallsyms::Kallsyms;
pub use release::Release;

/// Everything mm-probe learns about the running kernel, gathered lazily and once.
pub struct Kernel {
    pub release: Release,
    btf: OnceLock<Result<KernelBtf, String>>,
    kallsyms: OnceLock<Result<Kallsyms, String>>,
}

impl Kernel {
    pub fn running() -> Result<Self> {
        Ok(Self { release: Release::running()?, btf: OnceLock::new(), kallsyms: OnceLock::new() })
    }

    /// The kernel's own BTF, or why it is unavailable.
    pub fn btf(&self) -> Result<&KernelBtf, &str> {
        self.btf.get_or_init(|| KernelBtf::from_sys_fs().map_err(|e| format!("{e:#}"))).as_ref().map_err(String::as_str)
    }

    /// Why a kernel program cannot read a task's syscall from its saved registers here (`None`
    /// when it can): see `syscalls::registers_unreadable`.
    pub fn registers_unreadable(&self) -> Option<String> {
        syscalls::registers_unreadable(self.btf(), &self.release)
    }

    /// The kernel's symbol table, or why it is unreadable.
    pub fn kallsyms(&self) -> Result<&Kallsyms, &str> {
        self.kallsyms.get_or_init(|| Kallsyms::read().map_err(|e| format!("{e:#}"))).as_ref().map_err(String::as_str)
    }
}
