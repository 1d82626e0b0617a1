//! `mm-probe generate-docs --out DIR` (hidden; `cargo xtask dist` runs it): man pages and shell
//! completions generated from the clap definitions in cli.rs, so they can never disagree with
//! the options the binary really takes.
//!
//! Writes `DIR/man/mm-probe.1` and one page per command (`mm-probe-thp-why.1`, …), and
//! `DIR/completions/` for bash (`mm-probe.bash`), zsh (`_mm-probe`) and fish (`mm-probe.fish`).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use clap::{Command, CommandFactory as _};
use clap_complete::Shell;

use crate::{cli::Cli, error::UserError};

const BIN_NAME: &str = "mm-probe";
const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

pub fn run(out: &Path) -> Result<()> {
    for path in write_all(Cli::command(), out)? {
        println!("{}", path.display());
    }
    Ok(())
}

/// Writes the man pages and completions of `cmd` under `out`; returns the files written.
fn write_all(cmd: Command, out: &Path) -> Result<Vec<PathBuf>> {
    let man_dir = create_dir(&out.join("man"))?;
    let completions_dir = create_dir(&out.join("completions"))?;
    // One page per visible command: clap_mangen names each after its display name
    // (`mm-probe-thp-why`) and skips hidden ones itself.
    clap_mangen::generate_to(cmd.clone(), &man_dir)
        .with_context(|| format!("writing man pages to {}", man_dir.display()))?;
    let mut written = sorted_files(&man_dir)?;
    let mut visible = visible_commands(cmd);
    for shell in SHELLS {
        let path = clap_complete::generate_to(shell, &mut visible, BIN_NAME, &completions_dir)
            .with_context(|| format!("writing the {shell} completion to {}", completions_dir.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The command tree without its hidden commands: clap_complete offers hidden subcommands too,
/// and the benchmark hooks and this generator are not for users to tab into. Only the top level
/// has hidden commands, so only the root is rebuilt; each visible command is kept whole.
fn visible_commands(cmd: Command) -> Command {
    let visible: Vec<Command> = cmd.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned().collect();
    let mut root = Command::new(BIN_NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .args(cmd.get_arguments().cloned())
        .subcommands(visible)
        .subcommand_required(cmd.is_subcommand_required_set());
    if let Some(about) = cmd.get_about() {
        root = root.about(about.clone());
    }
    root
}

/// The out directory is the user's choice: failing to create it is bad input (exit 1).
fn create_dir(dir: &Path) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(|e| {
        UserError::new(format!("cannot create {}: {e}; give --out a writable directory", dir.display()))
    })?;
    Ok(dir.to_path_buf())
}

fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        files.push(entry?.path());
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory per test under the system temp directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("mm-probe-generate-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn visible_subcommand_names() -> Vec<String> {
        Cli::command().get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_owned()).collect()
    }

    fn read(path: PathBuf) -> String {
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn the_man_page_mentions_every_subcommand_and_each_has_its_own_page() {
        let scratch = Scratch::new("man");
        write_all(Cli::command(), &scratch.0).unwrap();
        let main_page = read(scratch.0.join("man/mm-probe.1"));
        let names = visible_subcommand_names();
        assert_eq!(
            names,
            ["doctor", "thp-why", "latency", "retry-storm", "invalidations", "compare", "triage", "exporter"]
        );
        for name in &names {
            assert!(main_page.contains(&format!("mm\\-probe\\-{}", name.replace('-', "\\-"))), "{name} missing");
            let page = read(scratch.0.join(format!("man/mm-probe-{name}.1")));
            assert!(page.contains(".SH OPTIONS"), "mm-probe-{name}.1 has no options section");
        }
    }

    #[test]
    fn bash_completion_offers_thp_why_and_its_options() {
        let scratch = Scratch::new("bash");
        write_all(Cli::command(), &scratch.0).unwrap();
        let bash = read(scratch.0.join("completions/mm-probe.bash"));
        assert!(bash.contains("thp-why"));
        assert!(bash.contains("--all-vmas"));
    }

    #[test]
    fn every_shell_gets_its_completion_file() {
        let scratch = Scratch::new("shells");
        let written = write_all(Cli::command(), &scratch.0).unwrap();
        for file in ["mm-probe.bash", "_mm-probe", "mm-probe.fish"] {
            let path = scratch.0.join("completions").join(file);
            assert!(written.contains(&path), "{file} not reported as written");
            assert!(read(path).contains("retry-storm"), "{file} does not complete retry-storm");
        }
    }

    #[test]
    fn hidden_hooks_are_in_neither_man_pages_nor_completions() {
        let scratch = Scratch::new("hidden");
        let written = write_all(Cli::command(), &scratch.0).unwrap();
        for path in written {
            let text = read(path.clone());
            for hidden in ["bench-ring", "bench-hooks", "generate-docs", "bench\\-ring", "generate\\-docs"] {
                assert!(!text.contains(hidden), "{} mentions {hidden}", path.display());
            }
        }
    }

    #[test]
    fn an_unwritable_out_directory_is_a_user_error() {
        let scratch = Scratch::new("unwritable");
        fs::write(&scratch.0, "a file, not a directory").unwrap();
        let err = write_all(Cli::command(), &scratch.0).unwrap_err();
        assert_eq!(crate::error::exit_code(&err), crate::error::EXIT_USAGE);
        assert!(err.to_string().contains("give --out a writable directory"), "{err}");
        fs::remove_file(&scratch.0).unwrap();
    }
}
