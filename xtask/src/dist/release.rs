//! What one `dist` run made, and how it is summed up.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// The products of one `dist` run.
pub struct Release {
    pub version: String,
    pub dir: PathBuf,
    /// The stripped static binary, as every package ships it.
    pub binary: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
    pub rpm: PathBuf,
    pub image: PathBuf,
}

impl Release {
    pub fn products(&self) -> [&Path; 4] {
        [&self.tarball, &self.deb, &self.rpm, &self.image]
    }

    /// "binary 9.1 MB, mm-probe-0.1.0-x86_64-linux.tar.gz 3.6 MB, …".
    pub fn summary(&self) -> Result<String> {
        let mut parts = Vec::new();
        for path in std::iter::once(self.binary.as_path()).chain(self.products()) {
            let size = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            parts.push(format!("{name} {:.1} MB", size as f64 / 1e6));
        }
        Ok(format!("{} (in {})", parts.join(", "), self.dir.display()))
    }
}
