//! The programs the benchmarks run.

use std::path::PathBuf;

/// Binaries the benchmarks run, built in release mode: overhead is judged on optimised code.
pub struct Binaries {
    pub mm_probe: PathBuf,
    pub workloads: PathBuf,
}

impl Binaries {
    pub fn workload(&self, name: &str) -> PathBuf {
        self.workloads.join(name)
    }
}
