//! /proc/kallsyms, and finding the name a function really carries in this build.
//!
//! The compiler renames static functions it specialises or splits (`foo.isra.0`,
//! `foo.constprop.0`, `foo.part.0`, `foo.llvm.123`), and a kprobe must use the exact name. The
//! `.cold` halves are not entry points and are never chosen.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    sync::Arc,
};

use anyhow::{Context as _, Result};

/// Suffixes GCC and Clang append to function symbols they cloned or split.
const CLONE_SUFFIXES: [&str; 4] = [".isra.", ".constprop.", ".part.", ".llvm."];

/// The kernel's function symbols, held for the whole run (stacks are named with them): some
/// 120,000 on a distribution kernel, so each name is stored once and each module's name is
/// shared by its symbols.
#[derive(Debug, Default)]
pub struct Kallsyms {
    /// Every function symbol, by address; those whose address reads as zero (no privileges,
    /// kptr_restrict) first, and left out of the address index.
    symbols: Vec<Symbol>,
    /// Where the symbols with a readable address begin.
    addressed: usize,
    /// Indices into `symbols`, in the order of their names (for finding a name and its clones).
    by_name: Vec<u32>,
}

/// Room left for vmlinux's data and bss after its last function, where `_end` is not listed.
const IMAGE_DATA_ROOM: u64 = 256 << 20;

/// A function symbol with its address and, for module symbols, the module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    pub name: Box<str>,
    pub module: Option<Arc<str>>,
}

/// A code address resolved to the function holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub symbol: &'a Symbol,
    pub offset: u64,
}

impl std::fmt::Display for Resolved<'_> {
    /// `name+0x1f [module]`, as kernel stack traces print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{:#x}", self.symbol.name, self.offset)?;
        if let Some(module) = &self.symbol.module {
            write!(f, " [{module}]")?;
        }
        Ok(())
    }
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

/// Kallsyms as it is read, line by line.
#[derive(Default)]
struct Builder {
    symbols: Vec<Symbol>,
    modules: BTreeMap<String, Arc<str>>,
}

impl Builder {
    /// One line, `address type name [module]`: only text (function) symbols count.
    fn add(&mut self, line: &str) {
        let mut fields = line.split_whitespace();
        let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
            return;
        };
        if !matches!(kind, "t" | "T" | "w" | "W") {
            return;
        }
        let module = fields.next().map(|m| m.trim_matches(|c| c == '[' || c == ']')).map(|m| self.module(m));
        let address = u64::from_str_radix(address, 16).unwrap_or(0);
        self.symbols.push(Symbol { address, name: name.into(), module });
    }

    fn module(&mut self, name: &str) -> Arc<str> {
        self.modules.entry(name.to_string()).or_insert_with(|| name.into()).clone()
    }

    fn build(mut self) -> Kallsyms {
        // Nearly sorted already (vmlinux, then modules and BPF images); in place, with no scratch
        // buffer as large as the table.
        self.symbols.sort_unstable_by_key(|s| s.address);
        self.symbols.shrink_to_fit();
        let addressed = self.symbols.partition_point(|s| s.address == 0);
        let mut by_name: Vec<u32> = (0..self.symbols.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| self.symbols[a as usize].name.cmp(&self.symbols[b as usize].name));
        Kallsyms { symbols: self.symbols, addressed, by_name }
    }
}

impl Kallsyms {
    /// Reads /proc/kallsyms a line at a time (the text is larger than what is kept of it).
    pub fn read() -> Result<Self> {
        let file = std::fs::File::open("/proc/kallsyms").context("reading /proc/kallsyms")?;
        let mut reader = BufReader::with_capacity(64 << 10, file);
        let (mut builder, mut line) = (Builder::default(), String::new());
        while reader.read_line(&mut line).context("reading /proc/kallsyms")? > 0 {
            builder.add(&line);
            line.clear();
        }
        Ok(builder.build())
    }

    /// Parses kallsyms text: `address type name [module]`; only text (function) symbols count.
    /// Addresses read as zero (no privileges, kptr_restrict) are kept out of the address index.
    pub fn parse(text: &str) -> Self {
        let mut builder = Builder::default();
        text.lines().for_each(|line| builder.add(line));
        builder.build()
    }

    /// The function holding `address` (the nearest symbol at or below it), or `None` below the
    /// first symbol or when addresses were unreadable.
    pub fn symbolize(&self, address: u64) -> Option<Resolved<'_>> {
        let by_address = &self.symbols[self.addressed..];
        let index = by_address.partition_point(|s| s.address <= address).checked_sub(1)?;
        let symbol = &by_address[index];
        Some(Resolved { symbol, offset: address - symbol.address })
    }

    /// The address of a function symbol; the first when several share the name (static
    /// functions of different files). `None` when absent or addresses are unreadable.
    pub fn address_of(&self, function: &str) -> Option<u64> {
        self.symbols[self.addressed..].iter().find(|s| &*s.name == function).map(|s| s.address)
    }

    /// Where the kernel image (vmlinux's text, data and bss) lies: [_text, _end). Without data
    /// symbols in kallsyms (no CONFIG_KALLSYMS_ALL) `_end` is absent, and the image is taken to
    /// end [`IMAGE_DATA_ROOM`] past vmlinux's last function: data and bss follow the text.
    pub fn kernel_image(&self) -> Option<(u64, u64)> {
        let text = self.address_of("_text")?;
        let end = self.address_of("_end").or_else(|| {
            let last = self.symbols[self.addressed..].iter().filter(|s| s.module.is_none()).map(|s| s.address).max()?;
            Some(last.saturating_add(IMAGE_DATA_ROOM))
        })?;
        (end > text).then_some((text, end))
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The names from the first at or after `from`, in order.
    fn names_from<'a>(&'a self, from: &str) -> impl Iterator<Item = &'a str> {
        let name = |i: &u32| &*self.symbols[*i as usize].name;
        let start = self.by_name.partition_point(|i| name(i) < from);
        self.by_name[start..].iter().map(name)
    }

    /// Finds `function`, exactly or as a compiler clone; never a `.cold` split.
    pub fn resolve(&self, function: &str) -> Option<SymbolMatch> {
        if self.names_from(function).next() == Some(function) {
            return Some(SymbolMatch::Exact(function.to_string()));
        }
        let prefix = format!("{function}.");
        self.names_from(&prefix)
            .take_while(|name| name.starts_with(&prefix))
            .find(|name| is_clone_of(name, function))
            .map(|name| SymbolMatch::Clone(name.to_string()))
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
        assert_eq!(k.resolve("shrink_folio_list"), Some(SymbolMatch::Clone("shrink_folio_list.constprop.0".into())));
        assert_eq!(k.resolve("zap_pte_range"), Some(SymbolMatch::Clone("zap_pte_range.isra.0.part.0".into())));
        assert_eq!(k.resolve("only"), None);
    }

    #[test]
    fn addresses_resolve_to_the_enclosing_function() {
        let k = Kallsyms::parse(SAMPLE);
        let r = k.symbolize(0xffffffff81002010).unwrap();
        assert_eq!(r.to_string(), "madvise_cold_or_pageout_pte_range+0x10");
        let r = k.symbolize(0xffffffff81007004).unwrap();
        assert_eq!(r.to_string(), "nfs_thing+0x4 [nfs]");
        assert_eq!(k.symbolize(0xffffffff81008000).unwrap().offset, 0);
        assert!(k.symbolize(0x1000).is_none(), "below every symbol");
        let hidden = Kallsyms::parse("0000000000000000 T hmm_range_fault\n");
        assert!(hidden.symbolize(0xffffffff81001000).is_none(), "zeroed addresses are not an index");
        assert!(hidden.resolve("hmm_range_fault").is_some(), "names still resolve");
    }

    #[test]
    fn a_modules_name_is_stored_once_for_all_its_symbols() {
        let k = Kallsyms::parse("ffffffffc0001000 t a_fn\t[kvm]\nffffffffc0002000 t b_fn\t[kvm]\n");
        let module = |address| k.symbolize(address).unwrap().symbol.module.clone().unwrap();
        assert_eq!(&*module(0xffffffffc0001000), "kvm");
        assert!(Arc::ptr_eq(&module(0xffffffffc0001000), &module(0xffffffffc0002000)));
        assert_eq!(k.len(), 2);
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
