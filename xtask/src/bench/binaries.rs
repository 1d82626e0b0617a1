//! The programs the benchmarks run.

use std::path::PathBuf;

/// Binaries the benchmarks run, built in release mode: overhead is judged on optimised code.
pub struct Binaries {
    pub mm_probe: PathBuf,
    /// The static (musl) build users install from `cargo xtask dist`, measured beside the glibc
    /// one on the host; None in the guest, whose rows are about the kernel's probes.
    pub mm_probe_static: Option<PathBuf>,
    pub workloads: PathBuf,
}

impl Binaries {
    pub fn workload(&self, name: &str) -> PathBuf {
        self.workloads.join(name)
    }
}
