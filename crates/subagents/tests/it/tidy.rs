//! Tidy checks of the layers (in the spirit of rust-analyzer's tidy tests):
//! read `crates/launcher/src/*.rs` and `crates/subagents/src/*.rs`, collect
//! every `crate::<module>` reference outside comments and string literals,
//! and fail when
//!
//! * the `launcher` library depends on a front-end crate (clap, rmcp,
//!   ratatui, crossterm, tokio) or names clap: it takes typed requests, never
//!   parsed arguments, and prints nothing;
//! * clap is named anywhere in the binary but its CLI module (`cli.rs`);
//! * the modules of either crate import each other in a cycle: nothing
//!   below a command calls back up into it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules allowed to name clap.
const CLI_MODULES: &[&str] = &["cli"];

/// The crates whose layers these checks keep.
const LIBRARY: &str = "launcher";
const BINARY: &str = "subagents";

/// Front-end crates the library must not depend on.
const FRONT_ENDS: &[&str] = &[
    "clap",
    "clap_complete",
    "rmcp",
    "ratatui",
    "crossterm",
    "tokio",
];

fn crate_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// One crate's source files (`src/*.rs`): module name → code.
fn sources(crate_name: &str) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(crate_dir(crate_name).join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            files.insert(name, code_only(&text));
        }
    }
    files
}

/// `text` with comments removed and string and char literal contents
/// blanked, so only code is searched.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: '\n', '\'', '\u{..}'.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment of every `crate::` reference in `code`, including
/// each item of a `crate::{a, b::c}` group.
fn crate_references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(is_ident_char) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            for item in split_top_level(&group[..end]) {
                let ident: String = item
                    .trim()
                    .chars()
                    .take_while(|c| is_ident_char(*c))
                    .collect();
                if !ident.is_empty() {
                    found.insert(ident);
                }
            }
        } else {
            let ident: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
            if !ident.is_empty() {
                found.insert(ident);
            }
        }
    }
    found
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Module → the other modules it references (the crate root `lib` and
/// re-exports of other crates are not modules of this graph).
fn import_graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&String> = files
        .keys()
        .filter(|m| *m != "lib" && *m != "main")
        .collect();
    files
        .iter()
        .filter(|(name, _)| modules.contains(name))
        .map(|(name, code)| {
            let targets = crate_references(code)
                .into_iter()
                .filter(|t| t != name && modules.contains(t))
                .collect();
            (name.clone(), targets)
        })
        .collect()
}

/// Every cycle's modules (strongly connected components of more than one
/// module), by Tarjan's algorithm.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// Modules other than the CLI's that name clap.
fn clap_outside_cli(files: &BTreeMap<String, String>) -> Vec<String> {
    files
        .iter()
        .filter(|(name, _)| !CLI_MODULES.contains(&name.as_str()))
        .filter(|(_, code)| names_clap(code))
        .map(|(name, _)| name.clone())
        .collect()
}

/// True when code names the clap crate (`clap::`, `clap_complete`).
fn names_clap(code: &str) -> bool {
    code.match_indices("clap").any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + 4..].chars().next();
        !before.is_some_and(is_ident_char)
            && (after == Some(':') || code[at + 4..].starts_with("_complete"))
    })
}

/// The names of a manifest's `[dependencies]` (not dev- or build-).
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies && let Some((name, _)) = line.split_once('=') {
            names.push(name.trim().trim_end_matches(".workspace").to_owned());
        }
    }
    names
}

/// The front-end crates among a manifest's normal dependencies.
fn front_end_dependencies(manifest: &str) -> Vec<String> {
    normal_dependencies(manifest)
        .into_iter()
        .filter(|d| FRONT_ENDS.contains(&d.as_str()))
        .collect()
}

#[test]
fn the_library_depends_on_no_front_end() {
    let manifest = std::fs::read_to_string(crate_dir(LIBRARY).join("Cargo.toml")).unwrap();
    let found = front_end_dependencies(&manifest);
    assert!(
        found.is_empty(),
        "crates/{LIBRARY} depends on front-end crates {found:?}: they belong to crates/{BINARY}"
    );
    let named: Vec<String> = sources(LIBRARY)
        .into_iter()
        .filter(|(_, code)| names_clap(code))
        .map(|(name, _)| name)
        .collect();
    assert!(named.is_empty(), "crates/{LIBRARY} names clap in {named:?}");
}

#[test]
fn no_module_but_the_cli_names_clap() {
    let offenders = clap_outside_cli(&sources(BINARY));
    assert!(
        offenders.is_empty(),
        "clap is named outside the CLI module ({CLI_MODULES:?}) in: {offenders:?}; convert \
         arguments into the API's requests in `cli` instead"
    );
}

/// Fails when a crate's modules import each other in a cycle; `expected`
/// are edges the parser must see (else the check proves nothing).
fn assert_no_cycle(crate_name: &str, expected: &[(&str, &str)]) {
    let graph = import_graph(&sources(crate_name));
    for (from, to) in expected {
        assert!(
            graph.get(*from).is_some_and(|t| t.contains(*to)),
            "expected {from} -> {to} in {graph:?}"
        );
    }
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "the modules of crates/{crate_name} import each other in cycles: {found:?}\n(graph: {graph:?})"
    );
}

#[test]
fn the_launchers_modules_import_each_other_in_no_cycle() {
    assert_no_cycle(LIBRARY, &[("service", "wait"), ("service", "runs")]);
}

#[test]
fn the_binarys_modules_import_each_other_in_no_cycle() {
    assert_no_cycle(BINARY, &[("cli", "commands"), ("commands", "table")]);
}

#[test]
fn the_checks_catch_a_cycle_and_a_stray_clap() {
    let files: BTreeMap<String, String> = [
        ("a", "use crate::{b::X, error};\nfn f() { crate::c::g(); }"),
        ("b", "// use crate::c;\nuse crate::c::Y;"),
        ("c", "fn h() { let s = \"crate::d\"; crate::a::f(); }"),
        ("d", "use clap::Parser;"),
        ("error", "// clap::Parser in a comment"),
        ("cli", "use clap::Parser; use crate::a;"),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_owned(), code_only(t)))
    .collect();
    let graph = import_graph(&files);
    assert_eq!(
        graph["a"],
        ["b", "c", "error"].map(String::from).into(),
        "{graph:?}"
    );
    assert_eq!(graph["c"], ["a"].map(String::from).into(), "{graph:?}");
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    assert_eq!(clap_outside_cli(&files), vec!["d".to_owned()]);
    let manifest = "[dependencies]\nserde.workspace = true\nclap = \"4\"\n\n[dev-dependencies]\ntokio = \"1\"\n";
    assert_eq!(front_end_dependencies(manifest), vec!["clap".to_owned()]);
}

/// The manifests of the workspace's crates that name `subagents-test-support`
/// among their normal dependencies.
fn test_support_users(crates: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(crates).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if normal_dependencies(&text)
            .iter()
            .any(|d| d == "test-support")
        {
            found.push(manifest.display().to_string());
        }
    }
    found
}

#[test]
fn the_test_support_crate_is_a_dev_dependency_only() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = test_support_users(&crates);
    assert!(
        found.is_empty(),
        "subagents-test-support is a normal dependency of {found:?}: only tests may use it"
    );
    // The check sees a normal dependency on it, and passes a dev-dependency.
    let scratch = tempfile::tempdir().unwrap();
    for (name, manifest) in [
        ("lib", "[dependencies]\ntest-support.workspace = true\n"),
        (
            "tested",
            "[dev-dependencies]\ntest-support.workspace = true\n",
        ),
    ] {
        std::fs::create_dir(scratch.path().join(name)).unwrap();
        std::fs::write(scratch.path().join(name).join("Cargo.toml"), manifest).unwrap();
    }
    let found = test_support_users(scratch.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with("lib/Cargo.toml"), "{found:?}");
}
