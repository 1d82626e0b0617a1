//! A check that the modules of xtask and of the agent (`mm-probe/src`) import one another without
//! cycles: each module may use only modules below it (shared pieces such as `paths::target_dir`
//! live low; a capability's judgement below the report built from it), so any part can be read
//! and changed without the ones that call it. And that nothing outside one of the agent's
//! capability folders reaches past the modules it shows the rest (its root, `probes`, `export`).
//! Read from the sources: `use` trees, `crate::` and `super::` paths, paths written through a
//! module a `use` named, and `mod` declarations (a module depends on the children it declares,
//! so a child must name a sibling's item through the sibling, not through a re-export of its
//! parent).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// Module path (`["vm", "qemu"]`; the crate root is `[]`) → the modules it refers to.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "main" {
        parts.push(stem.to_owned());
    }
    parts
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(Vec<String>, String)>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let source = fs::read_to_string(&path).unwrap();
            out.push((module_path(path.strip_prefix(root).unwrap()), source));
        }
    }
}

/// The code that is compiled into the binary: comments and `#[cfg(test)]` items (unit tests may
/// `use super::*`) left out, wherever in the file they stand.
fn non_test_code(source: &str) -> String {
    let code: String = source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut kept = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept += &rest[..at];
        rest = skip_item(&rest[at + "#[cfg(test)]".len()..]);
    }
    kept + rest
}

/// What follows the item at the start of `code`: past its `;`, or past the `}` that closes its
/// first `{`.
fn skip_item(code: &str) -> &str {
    let mut depth = 0;
    for (i, c) in code.char_indices() {
        match c {
            ';' if depth == 0 => return &code[i + 1..],
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[i + 1..];
                }
            }
            _ => {}
        }
    }
    ""
}

/// The tree of each `use` declaration, whitespace removed (`crate::{cmd,vm}`).
fn use_trees(code: &str) -> Vec<String> {
    let mut trees = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
        let before = code[line_start..at].trim();
        if before.is_empty() || before == "pub" || before == "pub(crate)" {
            let tree = code[at + 4..].split(';').next().unwrap_or_default();
            trees.push(tree.split_whitespace().collect());
        }
    }
    trees
}

/// Every path a `use` tree names: `a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand_use_tree(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or_default().trim().to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let nested = items.into_iter().filter(|i| !i.trim().is_empty()).flat_map(expand_use_tree);
    nested.map(|p| if prefix.is_empty() { p } else { format!("{prefix}::{p}") }).collect()
}

/// Paths written out in the code (`crate::vm::run_program(…)`, `super::initramfs::MARKER`).
fn qualified_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for keyword in ["crate::", "super::"] {
        for (at, _) in code.match_indices(keyword) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            if !rest[..end].ends_with("::") {
                found.push(rest[..end].to_owned());
            }
        }
    }
    found
}

/// The deepest module of `modules` that `path`, written inside `module`, lies in.
fn resolve(module: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segments = path.split("::").filter(|s| !s.is_empty()).peekable();
    let mut base: Vec<String> = match *segments.peek()? {
        "crate" => Vec::new(),
        "super" => module[..module.len().checked_sub(1)?].to_vec(),
        "self" => module.to_vec(),
        // A path starting with a child module's name (`use report::Verdict`).
        child if modules.contains(&[module, &[child.to_owned()]].concat()) => {
            return resolve(module, &format!("self::{path}"), modules);
        }
        _ => return None,
    };
    segments.next();
    for segment in segments {
        let deeper = [base.as_slice(), &[segment.to_owned()]].concat();
        if !modules.contains(&deeper) {
            break;
        }
        base = deeper;
    }
    Some(base)
}

fn declared_children(code: &str) -> Vec<String> {
    code.lines().filter_map(|l| child_declaration(l.trim())).map(str::to_owned).collect()
}

/// `mod name;` or `pub mod name;` → `name`.
fn child_declaration(line: &str) -> Option<&str> {
    line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod "))?.strip_suffix(';')
}

/// Paths written out from a module a `use` brought in by name (`use crate::latency;` then
/// `latency::aggregator::Distribution`), rewritten from the crate root so that they resolve to
/// the module they reach into. They add no cycle (the module named is already imported, and
/// it declares what the path reaches), but they do reach past a capability's faces. A module
/// renamed with `as` is not followed.
fn paths_through_used_modules(
    module: &[String],
    used: &[String],
    code: &str,
    modules: &BTreeSet<Vec<String>>,
) -> Vec<String> {
    let mut found = Vec::new();
    for path in used {
        let Some(target) = resolve(module, path, modules) else { continue };
        // `a::b::self` and `a::b` both name module `b`; a path to an item inside it names none.
        let segments: Vec<&str> = path.split("::").filter(|s| *s != "self").collect();
        let Some(&name) = segments.last() else { continue };
        if target.last().is_none_or(|last| last != name) {
            continue;
        }
        let written = format!("{name}::");
        for (at, _) in code.match_indices(&written) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + written.len()..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            found.push(format!("crate::{}::{}", target.join("::"), &rest[..end]));
        }
    }
    found
}

fn graph(files: &[(Vec<String>, String)]) -> Graph {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (module, source) in files {
        let code = non_test_code(source);
        let mut paths: Vec<String> = use_trees(&code).iter().flat_map(|tree| expand_use_tree(tree)).collect();
        let through_used = paths_through_used_modules(module, &paths, &code, &modules);
        paths.extend(through_used);
        paths.extend(qualified_paths(&code));
        paths.extend(declared_children(&code).into_iter().map(|c| format!("self::{c}")));
        let edges = graph.entry(module.clone()).or_default();
        for target in paths.iter().filter_map(|p| resolve(module, p, &modules)) {
            if &target != module {
                edges.insert(target);
            }
        }
    }
    graph
}

/// Every cycle: each group of modules that reach one another (a strongly connected component of
/// more than one module), as `crate::` paths, sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&Vec<String>> = graph.keys().collect();
    let reaches = |from: &Vec<String>| -> BTreeSet<Vec<String>> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> = nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for node in &nodes {
        let group: Vec<String> = nodes
            .iter()
            .filter(|other| reach[*node].contains(**other) && reach[**other].contains(*node))
            .map(|m| format!("crate::{}", m.join("::")))
            .collect();
        if group.len() > 1 {
            found.insert(group);
        }
    }
    found.into_iter().collect()
}

/// The modules of the crate whose sources are in `src` (relative to xtask's manifest).
fn graph_of(src: &str) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    graph(&files)
}

/// Fails with each cycle's imports (`a -> b`) inside it, the edges one of which must go.
fn assert_no_cycles(graph: &Graph) {
    let found = cycles(graph);
    let mut told = String::new();
    for group in &found {
        let inside: BTreeSet<Vec<String>> = group.iter().map(|m| module(m.trim_start_matches("crate"))).collect();
        told += "cycle:\n";
        for from in &inside {
            for to in graph[from].iter().filter(|to| inside.contains(*to)) {
                told += &format!("  crate::{} -> crate::{}\n", from.join("::"), to.join("::"));
            }
        }
    }
    assert!(found.is_empty(), "modules that import one another:\n{told}");
}

fn module(path: &str) -> Vec<String> {
    path.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

#[test]
fn no_xtask_module_imports_one_that_imports_it_back() {
    let graph = graph_of("src");
    // The reader must see the edges that made cycles before: a blind parser would pass too.
    assert!(graph[&module("vm")].contains(&module("paths")));
    assert!(graph[&module("vm::qemu")].contains(&module("vm::initramfs")));
    assert!(graph[&module("test")].contains(&module("vm")));
    assert!(graph[&module("bench::overhead")].contains(&module("bench::stats")));
    assert_no_cycles(&graph);
}

#[test]
fn no_agent_module_imports_one_that_imports_it_back() {
    let graph = graph_of("../mm-probe/src");
    assert!(graph[&module("invalidations::judge")].contains(&module("report::verdict")));
    assert!(graph[&module("exporter")].contains(&module("exporter::scrape")));
    assert_no_cycles(&graph);
}

#[test]
fn a_child_that_uses_its_parent_is_a_cycle() {
    let files = [
        (module(""), "mod bench;".to_owned()),
        (module("bench"), "mod overhead;\nuse self::overhead::Place;".to_owned()),
        (module("bench::overhead"), "use super::{Binaries, process::Tracer};".to_owned()),
    ];
    assert_eq!(cycles(&graph(&files)), vec![["crate::bench", "crate::bench::overhead"].map(String::from).to_vec()]);
}

#[test]
fn only_test_items_are_left_out() {
    let code = non_test_code(
        "use a::b;\n#[cfg(test)]\nmod tests { fn f() { use crate::x; } }\nuse c::d;\n#[cfg(test)]\nuse e::f;\nuse g::h;",
    );
    assert_eq!(use_trees(&code), ["a::b", "c::d", "g::h"]);
}

#[test]
fn qualified_paths_count_as_imports() {
    let files = [
        (module(""), "mod cmd;\nmod test;\nmod vm;".to_owned()),
        (module("cmd"), String::new()),
        (module("test"), "use crate::{cmd, vm};".to_owned()),
        (module("vm"), "fn f() { crate::test::target_dir(); }".to_owned()),
    ];
    assert_eq!(cycles(&graph(&files)), vec![["crate::test", "crate::vm"].map(String::from).to_vec()]);
}

/// The capability folders of the agent: each is read from outside only through its root module
/// (the subcommand), `probes` (its catalog, for `doctor` and the registry) and `export` (its
/// slice of the exporter), so its other stages can change without anything outside noticing.
const CAPABILITY_FOLDERS: &[&str] = &["retry_storm", "invalidations", "latency", "thp_why"];

/// The modules of a capability folder that other modules may import.
const CAPABILITY_FACES: &[&str] = &["probes", "export"];

/// Every import `a -> b` from outside a capability folder into a module inside it that is not
/// one of its faces, as `crate::` paths.
fn reaches_into_capabilities(graph: &Graph) -> Vec<String> {
    let folder_of = |m: &[String]| m.first().filter(|f| CAPABILITY_FOLDERS.contains(&f.as_str())).cloned();
    let mut found = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            let Some(folder) = folder_of(to) else { continue };
            let inside_face = to.len() == 1 || (to.len() == 2 && CAPABILITY_FACES.contains(&to[1].as_str()));
            if folder_of(from).as_ref() != Some(&folder) && !inside_face {
                found.push(format!("crate::{} -> crate::{}", from.join("::"), to.join("::")));
            }
        }
    }
    found
}

#[test]
fn nothing_outside_a_capability_reaches_past_its_faces() {
    let graph = graph_of("../mm-probe/src");
    // The reader must see the faces used from outside: a blind parser would pass too.
    assert!(graph[&module("exporter")].contains(&module("latency::export")));
    assert!(graph[&module("capability")].contains(&module("thp_why::probes")));
    let found = reaches_into_capabilities(&graph);
    assert!(found.is_empty(), "imports past a capability's root, probes and export:\n  {}", found.join("\n  "));
}

#[test]
fn a_path_through_a_used_module_reaches_into_it() {
    let files = [
        (module(""), "mod exporter;\nmod latency;\nmod thp_why;".to_owned()),
        (
            module("exporter"),
            "use crate::latency;\nfn f() { latency::aggregator::read(); latency::export::slice(); }".to_owned(),
        ),
        (module("latency"), "pub mod aggregator;\npub mod export;".to_owned()),
        (module("latency::aggregator"), String::new()),
        (
            module("latency::export"),
            "use super::aggregator::Distribution;\nuse crate::thp_why::{self, checks};".to_owned(),
        ),
        (module("thp_why"), "pub mod checks;".to_owned()),
        (module("thp_why::checks"), String::new()),
    ];
    let found = reaches_into_capabilities(&graph(&files));
    assert_eq!(
        found,
        ["crate::exporter -> crate::latency::aggregator", "crate::latency::export -> crate::thp_why::checks"]
    );
}
