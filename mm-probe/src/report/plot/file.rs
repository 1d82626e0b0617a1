//! The `--plot` target: checked before any probe attaches (a typo should not cost a long run),
//! written once at the end of the run.
//!
//! mm-probe runs as root, so it never writes through a symbolic link (a link planted at the
//! plot's path would otherwise let whoever can write that directory have root overwrite any
//! file): a path that is a link is refused, and the plot is written to a new file next to the
//! target and renamed over it, which replaces a link made in between, never what it points at.

use std::{
    ffi::OsStr,
    fs::OpenOptions,
    io::Write as _,
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
        if let Ok(metadata) = path.symlink_metadata() {
            let kind = metadata.file_type();
            if kind.is_symlink() {
                return Err(UserError::new(format!(
                    "--plot {shown} is a symbolic link; mm-probe writes no file through a link: give the path itself"
                )));
            }
            if kind.is_dir() {
                return Err(UserError::new(format!("--plot {shown} is a directory; give a file name ending in .svg")));
            }
            if !kind.is_file() {
                return Err(UserError::new(format!("--plot {shown} is not a regular file; give another path")));
            }
        }
        let directory = directory_of(path);
        if !directory.is_dir() {
            return Err(UserError::new(format!(
                "--plot {shown}: directory {} does not exist; create it or choose another path",
                directory.display()
            )));
        }
        let plot = Self { path: path.to_path_buf() };
        // The final write creates a file in that directory: try it now (permissions, read-only
        // file systems, a full inode table all show here), leaving the target as it is.
        plot.create_temporary()
            .and_then(|(temporary, _)| std::fs::remove_file(temporary))
            .map_err(|e| UserError::new(format!("--plot {shown}: cannot write there ({e})")))?;
        Ok(plot)
    }

    /// A new file next to the target (`O_EXCL`: never an existing file, never through a link).
    fn create_temporary(&self) -> std::io::Result<(PathBuf, std::fs::File)> {
        let name = self.path.file_name().unwrap_or(OsStr::new("plot.svg")).to_string_lossy();
        let temporary = directory_of(&self.path).join(format!(".{name}.{}.tmp", std::process::id()));
        let file = OpenOptions::new().write(true).create_new(true).open(&temporary)?;
        Ok((temporary, file))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the figure. The diagnosis is already printed; failing here still says so (exit 1).
    pub fn write(&self, svg: &str) -> Result<(), UserError> {
        self.replace_with(svg).map_err(|e| {
            UserError::new(format!(
                "writing the plot to {} failed ({e}); the results above are complete",
                self.path.display()
            ))
        })
    }

    /// Writes a temporary file, then renames it over the target: readers see the old plot or
    /// the new one, and a link at the target is replaced, not followed.
    fn replace_with(&self, svg: &str) -> std::io::Result<()> {
        let (temporary, mut file) = self.create_temporary()?;
        let written = file.write_all(svg.as_bytes()).and_then(|()| std::fs::rename(&temporary, &self.path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
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

/// The directory a path's file is in (`.` for a bare file name).
fn directory_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mm-probe-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A scratch directory holding a file a symlinked plot path must never touch.
    fn scratch_with_precious_file(name: &str) -> (PathBuf, PathBuf) {
        let dir = scratch(name);
        let outside = dir.join("outside.txt");
        std::fs::write(&outside, "precious").unwrap();
        (dir, outside)
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

    #[test]
    fn a_symlink_at_the_plot_path_is_refused_and_its_target_left_alone() {
        let (dir, outside) = scratch_with_precious_file("link");
        let link = dir.join("plot.svg");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let error = PlotFile::check(&link).unwrap_err().to_string();
        assert!(error.contains("is a symbolic link") && !error.contains('\n'), "{error}");
        let dangling = dir.join("dangling.svg");
        std::os::unix::fs::symlink(dir.join("created-through-the-link"), &dangling).unwrap();
        assert!(PlotFile::check(&dangling).is_err());
        assert!(!dir.join("created-through-the-link").exists(), "checking must not create the link's target");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_symlink_made_after_the_check_is_replaced_not_written_through() {
        let (dir, outside) = scratch_with_precious_file("late-link");
        let target = dir.join("plot.svg");
        let file = PlotFile::check(&target).unwrap();
        std::os::unix::fs::symlink(&outside, &target).unwrap();
        file.write("<svg/>").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious", "the link's target is untouched");
        assert!(!target.symlink_metadata().unwrap().file_type().is_symlink(), "the link itself was replaced");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "<svg/>");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file is left behind: {left:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
