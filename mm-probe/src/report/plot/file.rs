//! The `--plot` target: checked before any probe attaches (a typo should not cost a long run),
//! written once at the end of the run.

use std::{
    ffi::OsStr,
    fs::OpenOptions,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{error::UserError, report::json};

/// A path that ends in `.svg` and could be written when it was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlotFile {
    path: PathBuf,
}

impl PlotFile {
    /// Accepts `path` only if it names an SVG file that can be created or overwritten.
    pub fn check(path: &Path) -> Result<Self, UserError> {
        let shown = path.display();
        let is_svg = path.extension().and_then(OsStr::to_str).is_some_and(|e| e.eq_ignore_ascii_case("svg"));
        if !is_svg {
            return Err(UserError::new(format!(
                "--plot {shown}: plots are drawn as SVG only; give a file name ending in .svg"
            )));
        }
        if path.is_dir() {
            return Err(UserError::new(format!("--plot {shown} is a directory; give a file name ending in .svg")));
        }
        let directory = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !directory.is_dir() {
            return Err(UserError::new(format!(
                "--plot {shown}: directory {} does not exist; create it or choose another path",
                directory.display()
            )));
        }
        Self::try_open(path).map_err(|e| UserError::new(format!("--plot {shown}: cannot write there ({e})")))?;
        Ok(Self { path: path.to_path_buf() })
    }

    /// Opens `path` for writing as the final write will (permissions, read-only file systems,
    /// a full inode table all show here), without truncating a file that is already there; a
    /// file created only to try is removed again.
    fn try_open(path: &Path) -> std::io::Result<()> {
        let existed = path.exists();
        OpenOptions::new().append(true).create(true).open(path)?;
        if !existed {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the figure. The diagnosis is already printed; failing here still says so (exit 1).
    pub fn write(&self, svg: &str) -> Result<(), UserError> {
        std::fs::write(&self.path, svg).map_err(|e| {
            UserError::new(format!(
                "writing the plot to {} failed ({e}); the results above are complete",
                self.path.display()
            ))
        })
    }

    /// Where the plot went: the `plot` NDJSON line of the command printing it (`Some`), or one
    /// line of text.
    pub fn written_line(&self, json: Option<json::Line>) -> String {
        #[derive(Serialize)]
        struct Written<'a> {
            path: &'a Path,
            format: &'static str,
        }
        match json {
            Some(line) => json::line(line, &Written { path: &self.path, format: "svg" }),
            None => format!("plot written to {}", self.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mm-probe-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn only_svg_file_names_are_accepted() {
        let dir = scratch("names");
        for good in ["a.svg", "b.SVG"] {
            assert!(PlotFile::check(&dir.join(good)).is_ok(), "{good}");
            assert!(!dir.join(good).exists(), "checking {good} must not leave a file behind");
        }
        for bad in ["a.png", "a", "a.svg.txt", "svg"] {
            let error = PlotFile::check(&dir.join(bad)).unwrap_err().to_string();
            assert!(error.contains("ending in .svg"), "{bad}: {error}");
            assert_eq!(error.lines().count(), 1, "{error}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn directories_and_missing_parents_are_refused_and_existing_files_kept() {
        let dir = scratch("paths");
        std::fs::create_dir_all(dir.join("d.svg")).unwrap();
        assert!(PlotFile::check(&dir.join("d.svg")).unwrap_err().to_string().contains("is a directory"));
        let error = PlotFile::check(&dir.join("missing/x.svg")).unwrap_err().to_string();
        assert!(error.contains("does not exist"), "{error}");
        let kept = dir.join("kept.svg");
        std::fs::write(&kept, "old").unwrap();
        let file = PlotFile::check(&kept).unwrap();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "old", "checking must not truncate");
        file.write("<svg/>").unwrap();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "<svg/>");
        assert_eq!(file.written_line(None), format!("plot written to {}", kept.display()));
        let text = file.written_line(Some(json::Line::LatencyPlot));
        let line = crate::report::schema_check::tool_line(&text);
        assert_eq!((line["type"].as_str(), line["path"].as_str()), (Some("plot"), kept.to_str()));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
