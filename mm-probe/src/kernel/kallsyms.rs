//! /proc/kallsyms, and finding the name a function really carries in this build.
//!
//! The compiler renames static functions it specialises or splits (`foo.isra.0`,
//! `foo.constprop.0`, `foo.part.0`, `foo.llvm.123`), and a kprobe must use the exact name. The
//! `.cold` halves are not entry points and are never chosen.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};

/// Suffixes GCC and Clang append to function symbols they cloned or split.
const CLONE_SUFFIXES: [&str; 4] = [".isra.", ".constprop.", ".part.", ".llvm."];

#[derive(Debug, Default)]
pub struct Kallsyms {
    names: BTreeSet<String>,
}

/// How a logical function name was found among the kernel's symbols.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SymbolMatch {
    /// The function exists under exactly its own name.
    Exact(String),
    /// Only a compiler clone exists (e.g. `foo.isra.0`); probing it misses inlined call sites.
    Clone(String),
}

impl SymbolMatch {
    pub fn name(&self) -> &str {
        match self {
            SymbolMatch::Exact(name) | SymbolMatch::Clone(name) => name,
        }
    }
}

impl Kallsyms {
    pub fn read() -> Result<Self> {
        let text = std::fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
        Ok(Self::parse(&text))
    }

    /// Parses kallsyms text: `address type name [module]`; only text (function) symbols count.
    pub fn parse(text: &str) -> Self {
        let names = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (_addr, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
                matches!(kind, "t" | "T" | "w" | "W").then(|| name.to_string())
            })
            .collect();
        Self { names }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Finds `function`, exactly or as a compiler clone; never a `.cold` split.
    pub fn resolve(&self, function: &str) -> Option<SymbolMatch> {
        if self.names.contains(function) {
            return Some(SymbolMatch::Exact(function.to_string()));
        }
        let prefix = format!("{function}.");
        self.names
            .range(prefix.clone()..)
            .take_while(|name| name.starts_with(&prefix))
            .find(|name| is_clone_of(name, function))
            .map(|name| SymbolMatch::Clone(name.clone()))
    }
}

/// True when `symbol` is `function` plus only clone suffixes (`.isra.0`, `.constprop.1.isra.0`).
fn is_clone_of(symbol: &str, function: &str) -> bool {
    let Some(mut rest) = symbol.strip_prefix(function) else { return false };
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let Some(suffix) = CLONE_SUFFIXES.iter().find(|s| rest.starts_with(**s)) else {
            return false;
        };
        rest = &rest[suffix.len()..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffff81001000 T hmm_range_fault
ffffffff81002000 t madvise_cold_or_pageout_pte_range
ffffffff81002800 t madvise_cold_or_pageout_pte_range.cold
ffffffff81003000 t shrink_folio_list.constprop.0
ffffffff81003100 t shrink_folio_list.cold
ffffffff81004000 t zap_pte_range.isra.0.part.0
ffffffff81005000 t only.cold
ffffffff81006000 d some_data
ffffffff81007000 t nfs_thing\t[nfs]
ffffffff81008000 t foo_bar
";

    #[test]
    fn exact_name_wins() {
        let k = Kallsyms::parse(SAMPLE);
        assert_eq!(k.resolve("hmm_range_fault"), Some(SymbolMatch::Exact("hmm_range_fault".into())));
        assert_eq!(
            k.resolve("madvise_cold_or_pageout_pte_range"),
            Some(SymbolMatch::Exact("madvise_cold_or_pageout_pte_range".into()))
        );
    }

    #[test]
    fn clones_are_found_and_cold_parts_are_not() {
        let k = Kallsyms::parse(SAMPLE);
        assert_eq!(
            k.resolve("shrink_folio_list"),
            Some(SymbolMatch::Clone("shrink_folio_list.constprop.0".into()))
        );
        assert_eq!(
            k.resolve("zap_pte_range"),
            Some(SymbolMatch::Clone("zap_pte_range.isra.0.part.0".into()))
        );
        assert_eq!(k.resolve("only"), None);
    }

    #[test]
    fn absent_symbols_and_prefixes_do_not_match() {
        let k = Kallsyms::parse(SAMPLE);
        assert_eq!(k.resolve("hugepage_vma_check"), None);
        assert_eq!(k.resolve("foo"), None, "foo_bar is another function, not a clone of foo");
        assert_eq!(k.resolve("some_data"), None, "data symbols are not functions");
        assert_eq!(k.resolve("nfs_thing").map(|m| m.name().to_string()), Some("nfs_thing".into()));
    }
}
