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
//!   below a command calls back up into it;
//! * the library prints: it returns warnings inside its outcomes and the
//!   front-ends decide where they go (an MCP client never sees stderr);
//! * a CLI flag (read from the binary's `--help` pages) is named by no test
//!   under `crates/subagents/tests`, unless it is in the list of the flags
//!   untested when the check was written (`UNTESTED_FLAGS`), which may only
//!   shrink;
//! * an MCP tool argument (read from a real server's `tools/list`), a spec
//!   field (read from `crates/launcher/src/spec.rs`) or a config key and its
//!   variable (read from `subagents config --json`) is named by no test, with
//!   shrink-only lists of their own (all empty today).

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

/// What printing looks like in code: the print macros and the process's
/// own standard streams.
const PRINTS: &[&str] = &[
    "print!",
    "println!",
    "eprint!",
    "eprintln!",
    "stdout()",
    "stderr()",
    "io::stdout",
    "io::stderr",
];

/// `module: pattern` for every print in `files`.
fn prints(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for (name, code) in files {
        for pattern in PRINTS {
            let hit = code.match_indices(pattern).any(|(at, _)| {
                // `print!` inside `eprint!`/`println!` is counted once, as those.
                let before = code[..at].chars().next_back();
                !before.is_some_and(is_ident_char)
            });
            if hit {
                found.push(format!("{name}: {pattern}"));
            }
        }
    }
    found
}

#[test]
fn the_library_prints_nothing() {
    let found = prints(&sources(LIBRARY));
    assert!(
        found.is_empty(),
        "crates/{LIBRARY} prints ({found:?}): return the text or warning in the outcome and \
         let crates/{BINARY} print it"
    );
}

/// The protocol crates, by the names code uses for them.
const PROTOCOL_CRATES: &[&str] = &[
    "status",
    "supervisor",
    "capacity",
    "fanout_budget",
    "atomic_file",
    "recovery",
    "handshake",
    "agents",
    "process_identity",
];

/// The dependencies the binary may have: the library and front-end crates.
const BINARY_DEPENDENCIES: &[&str] = &[
    "launcher",
    "clap",
    "clap_complete",
    "rmcp",
    "tokio",
    "ratatui",
    "crossterm",
    "notify",
    "serde",
    "serde_json",
    "schemars",
    // The MCP server reads tool arguments with it (the field at fault).
    "serde_path_to_error",
    "libc",
    "nix",
    "anyhow",
];

/// `module: crate::` for every protocol crate path in `files` (a path
/// starts a word: `launcher::status::x` is no such path, `status::x` is).
fn protocol_paths(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    for (name, code) in files {
        for krate in PROTOCOL_CRATES {
            let path = format!("{krate}::");
            let hit = code.match_indices(&path).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                !before.is_some_and(|c| is_ident_char(c) || c == ':' || c == '.')
            });
            if hit {
                found.push(format!("{name}: {path}"));
            }
        }
    }
    found
}

#[test]
fn the_binary_reaches_protocol_crates_only_through_the_library() {
    let manifest = std::fs::read_to_string(crate_dir(BINARY).join("Cargo.toml")).unwrap();
    let stray: Vec<String> = normal_dependencies(&manifest)
        .into_iter()
        .filter(|d| !BINARY_DEPENDENCIES.contains(&d.as_str()))
        .collect();
    assert!(
        stray.is_empty(),
        "crates/{BINARY} depends on {stray:?}: reach them through `launcher` (re-export the \
         type or function it needs), or list a front-end crate in BINARY_DEPENDENCIES"
    );
    let found = protocol_paths(&sources(BINARY));
    assert!(
        found.is_empty(),
        "crates/{BINARY} names protocol crates ({found:?}): use what `launcher` re-exports"
    );
    let planted: BTreeMap<String, String> = [
        (
            "ok",
            "use launcher::{RunSummary, escape};\nlet s = self.status::x; a.status::y;",
        ),
        ("bad", "fn f() { let _ = status::model::read_status(d); }"),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_owned(), code_only(t)))
    .collect();
    assert_eq!(protocol_paths(&planted), ["bad: status::"]);
}

/// `Launcher`'s public methods that are no operation.
const ACCESSORS: &[&str] = &["new", "layout", "settings"];

/// Commands of the binary that are no `Launcher` operation, and why.
const CLI_ONLY: &[(&str, &str)] = &[
    (
        "completions",
        "prints the shell completion script of the parser",
    ),
    (
        "top",
        "a terminal dashboard over `list`, `capacity` and `stop`",
    ),
    ("mcp", "the MCP server itself"),
];

/// The block after the first `{` at or after `at`, without its braces.
fn block_after(code: &str, at: usize) -> &str {
    let rest = &code[at + code[at..].find('{').unwrap() + 1..];
    &rest[..matching_brace(rest)]
}

/// The names of the `pub fn`s in `impl NAME {...}`.
fn public_methods(code: &str, name: &str) -> Vec<String> {
    let at = code.find(&format!("impl {name} {{")).unwrap();
    let body = block_after(code, at);
    body.match_indices("pub fn ")
        .map(|(i, m)| {
            body[i + m.len()..]
                .chars()
                .take_while(|c| is_ident_char(*c))
                .collect()
        })
        .collect()
}

/// The variant names of `pub enum NAME {...}`, in snake case; each
/// variant's first identifier at brace depth 0 (doc comments and
/// attributes are gone with `code_only` or skipped).
fn variants(code: &str, name: &str) -> Vec<String> {
    let Some(at) = code.find(&format!("pub enum {name} {{")) else {
        return Vec::new();
    };
    let body = block_after(code, at);
    let mut names = Vec::new();
    for part in split_outside_brackets(body) {
        let mut rest = part.trim();
        // `#[...]` attributes before the variant.
        while let Some(after) = rest.strip_prefix("#[") {
            let close = after.find(']').unwrap();
            rest = after[close + 1..].trim_start();
        }
        let ident: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
        if !ident.is_empty() {
            names.push(snake_case(&ident));
        }
    }
    names
}

/// `text` split at the commas outside any bracket (an attribute's
/// arguments, a variant's fields).
fn split_outside_brackets(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' | '(' | '[' | '<' => depth += 1,
            '}' | ')' | ']' | '>' => depth -= 1,
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

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The names of the `async fn`s after `#[tool(` attributes.
fn tool_names(code: &str) -> Vec<String> {
    code.match_indices("#[tool(")
        .filter_map(|(i, _)| {
            let after = &code[i..];
            let f = after.find("async fn ")? + "async fn ".len();
            Some(
                after[f..]
                    .chars()
                    .take_while(|c| is_ident_char(*c))
                    .collect(),
            )
        })
        .collect()
}

/// The library's `OPERATIONS` list.
fn operations(code: &str) -> Vec<String> {
    let at = code.find("pub const OPERATIONS").unwrap();
    let list = &code[at..];
    let list = &list[list.find("= &[").unwrap() + 4..list.find("];").unwrap()];
    // `code_only` blanks string contents: read the names from the source text.
    list.split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// What is missing: operations without a method, a command or a tool;
/// methods that are no operation; commands that are neither.
fn operation_gaps(service: &str, service_text: &str, cli: &str, mcp: &str) -> Vec<String> {
    let ops = operations(service_text);
    let methods = public_methods(service, "Launcher");
    let commands = variants(cli, "Command");
    let tools = tool_names(mcp);
    let mut gaps = Vec::new();
    for method in &methods {
        let op = method.strip_suffix("_each").unwrap_or(method);
        if !ops.iter().any(|o| o == op) && !ACCESSORS.contains(&method.as_str()) {
            gaps.push(format!(
                "method {method} is no operation (add it to OPERATIONS)"
            ));
        }
    }
    for op in &ops {
        if !methods.contains(op) {
            gaps.push(format!("operation {op} has no Launcher method"));
        }
        let command = match op.split_once('_') {
            // `budget_create` is the `create` action of `budget`.
            Some((parent, action)) => {
                let parent_type = format!("{}Action", upper_first(parent));
                commands.iter().any(|c| c == parent)
                    && variants(cli, &parent_type).iter().any(|a| a == action)
            }
            None => commands.contains(op),
        };
        if !command {
            gaps.push(format!("operation {op} has no command"));
        }
        if !tools.contains(op) {
            gaps.push(format!("operation {op} has no MCP tool"));
        }
    }
    for command in &commands {
        let only = CLI_ONLY.iter().any(|(c, _)| c == command);
        if !ops.contains(command) && !only {
            gaps.push(format!(
                "command {command} is no operation (or list it in CLI_ONLY with a reason)"
            ));
        }
    }
    gaps
}

fn upper_first(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[test]
fn every_operation_has_a_command_and_a_tool() {
    let read = |krate: &str, file: &str| {
        std::fs::read_to_string(crate_dir(krate).join("src").join(file)).unwrap()
    };
    let service_text = read(LIBRARY, "service.rs");
    let gaps = operation_gaps(
        &code_only(&service_text),
        &service_text,
        &code_only(&read(BINARY, "cli.rs")),
        &code_only(&read(BINARY, "mcp.rs")),
    );
    assert!(gaps.is_empty(), "{gaps:#?}");
    // The parsers see what they must, else the check proves nothing.
    assert!(operations(&service_text).len() >= 15);
    assert!(variants(&code_only(&read(BINARY, "cli.rs")), "Command").contains(&"top".to_owned()));
}

#[test]
fn the_operation_check_catches_a_missing_tool_and_a_stray_method() {
    let service_text = "pub const OPERATIONS: &[&str] = &[\"run\", \"budget_claim\"];\n\
        impl Launcher {\n pub fn new() {}\n pub fn run(&self) { if x { y } }\n\
        pub fn budget_claim(&self) {}\n pub fn sneak(&self) {}\n}";
    let cli = "pub enum Command {\n /// Run.\n Run(RunArgs),\n #[cfg(feature = \"top\")]\n Top,\n \
        Budget { action: Option<BudgetAction> },\n Extra,\n}\n\
        pub enum BudgetAction {\n Claim { paths: Vec<String> },\n}";
    let mcp = "#[tool(description = \"x\")]\n async fn run(&self) {}\n";
    let gaps = operation_gaps(
        &code_only(service_text),
        service_text,
        &code_only(cli),
        &code_only(mcp),
    );
    assert_eq!(
        gaps,
        [
            "method sneak is no operation (add it to OPERATIONS)",
            "operation budget_claim has no MCP tool",
            "command budget is no operation (or list it in CLI_ONLY with a reason)",
            "command extra is no operation (or list it in CLI_ONLY with a reason)",
        ]
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
    let printing: BTreeMap<String, String> = [
        (
            "quiet",
            "// println!(\"x\");\nlet s = \"eprintln!\"; reprint!(x);",
        ),
        (
            "loud",
            "fn f() { eprintln!(\"x\"); let _ = std::io::stdout(); }",
        ),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_owned(), code_only(t)))
    .collect();
    assert_eq!(
        prints(&printing),
        ["loud: eprintln!", "loud: stdout()", "loud: io::stdout"].map(String::from)
    );
    let manifest = "[dependencies]\nserde.workspace = true\nclap = \"4\"\n\n[dev-dependencies]\ntokio = \"1\"\n";
    assert_eq!(front_end_dependencies(manifest), vec!["clap".to_owned()]);
}

/// Run-file and fixture names that look like citations but name files a run
/// or a test creates, never a document of the repository.
const CITATION_ALLOWLIST: &[&str] = &[
    // A run's task files (`task.md`, `task-<i>.md`).
    "task.md",
    "task-<i>.md",
    // Agent definition files the agents tests write.
    "nested/solo.md",
    // The instruction files of a user's project that `agents prompt` writes for.
    "CLAUDE.md",
    "AGENTS.md",
];

/// The repository root: the first ancestor of this package holding the
/// workspace's `Cargo.lock`.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .expect("a workspace root with Cargo.lock above the package")
        .to_path_buf()
}

/// The files whose text may cite documents: `*.rs`, `*.md`, `*.sh`,
/// `*.toml` and `.ci/run`, outside build output and hidden directories
/// (but `.ci` and `.cargo`).
fn citing_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                let hidden = name.starts_with('.') && name != ".ci" && name != ".cargo";
                let skipped = name == "target" || hidden;
                if !skipped {
                    dirs.push(path);
                }
            } else if kind.is_file() {
                let cites = [".rs", ".md", ".sh", ".toml"]
                    .iter()
                    .any(|ext| name.ends_with(ext))
                    || path.ends_with(".ci/run");
                if cites {
                    found.push(path);
                }
            }
        }
    }
    found.sort();
    found
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '<' | '>')
}

/// The documents `line` cites: `*.md` names with a directory
/// (`docs/protocol/status.md`), bare names followed by a section
/// (`status.md §2`, also with the name in backticks), and bare names
/// written in capitals (`DEVELOPERS.md`). Absolute paths are examples, not
/// citations.
fn citations(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in line.match_indices(".md") {
        let end = at + ".md".len();
        if line[end..].chars().next().is_some_and(is_ident_char) {
            continue;
        }
        let start = line[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_path_char(*c))
            .last()
            .map_or(at, |(i, _)| i);
        let name = line[start..end].trim_start_matches("./");
        let stem = &name[..name.len() - ".md".len()];
        // Absolute paths and paths in a user's hidden project directories
        // (`.subagents/agents/x.md`) are examples, not documents.
        let hidden = name.starts_with('.') && !name.starts_with("../");
        let example = name.starts_with('/') || hidden || line[..start].ends_with(['~', '$']);
        if stem.is_empty() || stem.ends_with('/') || example {
            continue;
        }
        let after = line[end..].trim_start_matches(['`', '"', '\'']);
        let with_section = after.starts_with(" §")
            || after
                .strip_prefix(' ')
                .is_some_and(|a| a.starts_with(|c: char| c.is_ascii_digit()));
        let capitals = stem.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        if name.contains('/') || with_section || capitals {
            found.push(name.to_owned());
        }
    }
    found
}

/// Whether `cited` names a file of the repository: relative to the root,
/// to `docs/`, or to the citing file's directory or one above it.
fn resolves(root: &Path, citing: &Path, cited: &str) -> bool {
    // The citing file's directory and those above it up to the root, for
    // paths a package writes relative to its own directory.
    let mut bases = vec![root.join("docs")];
    bases.extend(
        citing
            .ancestors()
            .skip(1)
            .take_while(|dir| dir.starts_with(root))
            .map(Path::to_path_buf),
    );
    bases.iter().any(|base| base.join(cited).is_file())
}

/// Every unresolved citation as `file:line: name`.
fn unresolved_citations(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut missing = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file.strip_prefix(root).unwrap_or(file).display();
        for (number, line) in text.lines().enumerate() {
            for cited in citations(line) {
                let allowed = CITATION_ALLOWLIST
                    .iter()
                    .any(|a| cited == *a || cited.ends_with(&format!("/{a}")));
                if !allowed && !resolves(root, file, &cited) {
                    missing.push(format!("{shown}:{}: {cited}", number + 1));
                }
            }
        }
    }
    missing
}

#[test]
fn every_cited_document_exists() {
    let root = repo_root();
    let this_file = root.join("crates/subagents/tests/it/tidy.rs");
    // This file's own fixtures below are citations by design.
    let files: Vec<PathBuf> = citing_files(&root)
        .into_iter()
        .filter(|f| *f != this_file)
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("ARCHITECTURE.md"))
            && files.iter().any(|f| f.ends_with(".ci/run"))
            && files.iter().any(|f| f.ends_with(".cargo/mutants.toml")),
        "the scan misses the repository's files: {files:?}"
    );
    let missing = unresolved_citations(&root, &files);
    assert!(
        missing.is_empty(),
        "cited documents that are not in the repository (cite a file under docs/, \
         e.g. docs/protocol/status.md §2):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_citation_scan_finds_what_it_must() {
    let found = |line: &str| citations(line);
    assert_eq!(found("see handshake.md §6 and §9"), ["handshake.md"]);
    assert_eq!(found("(spec `status.md` §5)"), ["status.md"]);
    assert_eq!(found("repair (status.md 4.3) of"), ["status.md"]);
    assert_eq!(
        found("see docs/protocol/status.md §2."),
        ["docs/protocol/status.md"]
    );
    assert_eq!(
        found("# entry point (see DEVELOPERS.md)."),
        ["DEVELOPERS.md"]
    );
    assert_eq!(
        found("[compat](../docs/compat.md#x)"),
        ["../docs/compat.md"]
    );
    // Run files, fixtures by absolute path, and bare names without a section
    // are not citations.
    assert!(found("writes task.md and answer.md").is_empty());
    assert!(found("let f = \"/tmp/out.md\"; ~/x/a.md $HOME/b.md").is_empty());
    assert!(found("parse reviewer.md, skip *.chain.md, the .mdx file").is_empty());
    let root = repo_root();
    let citing = root.join("crates/status/README.md");
    assert!(resolves(&root, &citing, "../README.md"));
    assert!(resolves(&root, &citing, "compat.md"));
    assert!(!resolves(&root, &citing, "nowhere.md"));
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

// Every CLI flag named by a test: the list is read from the binary's own
// `--help` pages, the tests from the text of `crates/subagents/tests`.

/// Every `--flag` of every command, read from the binary's own `--help`
/// (clap renders the `Command` tree there), as `(command path, flag)`. A
/// global flag (listed at the top level too) is counted once, at the top.
fn cli_flags() -> BTreeSet<(String, String)> {
    let mut flags = BTreeSet::new();
    let mut global = BTreeSet::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(path) = pending.pop() {
        let help = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .args(&path)
            .arg("--help")
            .output()
            .unwrap();
        assert!(help.status.success(), "{path:?} --help: {help:?}");
        let text = String::from_utf8(help.stdout).unwrap();
        let (subcommands, options) = help_sections(&text);
        for flag in options {
            if flag == "--help" || flag == "--version" || global.contains(&flag) {
                continue;
            }
            if path.is_empty() {
                global.insert(flag.clone());
            }
            flags.insert((path.join(" "), flag));
        }
        for sub in subcommands {
            let mut next = path.clone();
            next.push(sub);
            pending.push(next);
        }
    }
    flags
}

/// (subcommands, long flags) of one `--help` text.
fn help_sections(text: &str) -> (Vec<String>, Vec<String>) {
    let mut subcommands = Vec::new();
    let mut flags = Vec::new();
    let mut in_commands = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            in_commands = line.trim_end() == "Commands:";
            continue;
        }
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if in_commands && indent == 2 {
            let name = trimmed.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                subcommands.push(name.to_owned());
            }
        } else if trimmed.starts_with('-') && indent <= 6 {
            let long = trimmed
                .split([',', ' ', '='])
                .find(|t| t.starts_with("--") && t.len() > 2);
            if let Some(long) = long {
                flags.push(long.trim_end_matches(['.', ':']).to_owned());
            }
        }
    }
    (subcommands, flags)
}

/// Every line of every file under `crates/subagents/tests`.
fn test_lines() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut lines = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name() != Some("tidy.rs".as_ref())
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                lines.extend(text.lines().map(str::to_owned));
            }
        }
    }
    lines
}

/// Whether `line` names `flag` as a whole word (`--limit`, not `--limits`).
fn mentions(line: &str, flag: &str) -> bool {
    line.match_indices(flag).any(|(at, _)| {
        line[at + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

/// Commands a test starts through a helper rather than by name: `mcp.rs`
/// starts `subagents mcp ARGS` with `connect(&env, ARGS, ..)`.
const COMMAND_HELPERS: &[(&str, &[&str])] = &[("mcp", &["connect(", "connect_with("])];

/// A flag of a command is tested when some test line names it within two
/// lines of the command's name as a string literal (`&["list", "--limit",
/// "2"]`, or a helper of [`COMMAND_HELPERS`]); a flag of the top level
/// counts wherever it is named.
fn tested(lines: &[String], command: &str, flag: &str) -> bool {
    let last = command.rsplit(' ').next().unwrap_or_default();
    let mut anchors = vec![format!("\"{last}\"")];
    for (name, helpers) in COMMAND_HELPERS {
        if *name == command {
            anchors.extend(helpers.iter().map(|h| (*h).to_owned()));
        }
    }
    lines.iter().enumerate().any(|(i, line)| {
        mentions(line, flag)
            && (command.is_empty()
                || lines[i.saturating_sub(2)..(i + 3).min(lines.len())]
                    .iter()
                    .any(|l| anchors.iter().any(|a| l.contains(a.as_str()))))
    })
}

/// The flags no test named when this check was written. A new flag must
/// come with a test; a flag that gets one must leave this list.
const UNTESTED_FLAGS: &[(&str, &str)] = &[];

#[test]
fn every_cli_flag_is_named_by_some_test() {
    let lines = test_lines();
    let flags = cli_flags();
    assert!(flags.len() > 20, "too few flags read: {flags:?}");
    let untested: Vec<(String, String)> = flags
        .iter()
        .filter(|(command, flag)| !tested(&lines, command, flag))
        .cloned()
        .collect();
    let allowed: BTreeSet<(String, String)> = UNTESTED_FLAGS
        .iter()
        .map(|(c, f)| ((*c).to_owned(), (*f).to_owned()))
        .collect();
    let new: Vec<_> = untested.iter().filter(|f| !allowed.contains(*f)).collect();
    let listing = |list: &[&(String, String)]| {
        list.iter()
            .map(|(c, f)| format!("    (\"{c}\", \"{f}\"),"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        new.is_empty(),
        "flags no test names (add a test, or for today's list, UNTESTED_FLAGS):\n{}",
        listing(&new)
    );
    let stale: Vec<_> = allowed.iter().filter(|f| !untested.contains(*f)).collect();
    assert!(
        stale.is_empty(),
        "flags in UNTESTED_FLAGS that are tested now or gone (remove them):\n{}",
        listing(&stale)
    );
}

#[test]
fn the_flag_check_catches_an_unnamed_flag() {
    let lines: Vec<String> = [
        "env.ok(&[\"list\", \"--limit\", \"2\"]);",
        "",
        "",
        "let x = \"--limits\";",
        "",
        "env.ok(&[\"status\", &id, \"--json\"]);",
        "let server = connect(&env, &[\"--max-active\", \"1\"], &[]).await;",
    ]
    .map(String::from)
    .into();
    assert!(tested(&lines, "list", "--limit"));
    // Named, but as a longer flag or not near the command's name.
    assert!(!tested(&lines, "budget", "--limits"));
    assert!(!tested(&lines, "list", "--json"));
    assert!(tested(&lines, "", "--json"));
    // `connect(` starts `subagents mcp`, and nothing else.
    assert!(tested(&lines, "mcp", "--max-active"));
    assert!(!tested(&lines, "run", "--max-active"));
}

// Every MCP tool argument, spec field and config key named by a test, read
// from their definitions as the flags are: the tools' input schemas from a
// real server's `tools/list`, the spec's keys from `spec.rs`, the config keys
// from `subagents config --json`.

/// Whether a test line names `key` as a JSON object key: `"key":` in
/// `json!` or a raw string, `\"key\":` inside an escaped one.
fn names_key(line: &str, key: &str) -> bool {
    line.contains(&format!("\"{key}\":")) || line.contains(&format!("\\\"{key}\\\":"))
}

/// Whether some line of `lines` satisfies `named` and has a line within
/// `before` lines above it or `after` lines below it that satisfies `anchor`.
fn named_near(
    lines: &[String],
    named: impl Fn(&str) -> bool,
    anchor: impl Fn(&str) -> bool,
    before: usize,
    after: usize,
) -> bool {
    lines.iter().enumerate().any(|(i, line)| {
        named(line)
            && lines[i.saturating_sub(before)..(i + after + 1).min(lines.len())]
                .iter()
                .any(|l| anchor(l))
    })
}

/// Every `(tool, argument)` of the MCP server's tools, from the input
/// schemas a real `subagents mcp` lists.
fn mcp_arguments() -> BTreeSet<(String, String)> {
    use std::io::{BufRead, Write};
    let root = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(root.path())
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"tidy","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ];
    for request in requests {
        writeln!(stdin, "{request}").unwrap();
    }
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut found = BTreeSet::new();
    for line in stdout.lines() {
        let message: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if message["id"] != 2 {
            continue;
        }
        for tool in message["result"]["tools"].as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            let properties = tool["inputSchema"]["properties"].as_object();
            for argument in properties.into_iter().flat_map(|p| p.keys()) {
                found.insert((name.to_owned(), argument.clone()));
            }
        }
        break;
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
    found
}

/// The `(tool, argument)` pairs no test line names: the argument as a JSON
/// key (`"tail":`) within two lines of the tool's name as a string literal
/// (`server.ok("wait", json!({"runs": [id], "tail": 5}))`).
fn untested_mcp_arguments(arguments: &BTreeSet<(String, String)>, lines: &[String]) -> Vec<String> {
    arguments
        .iter()
        .filter(|(tool, argument)| {
            let quoted = format!("\"{tool}\"");
            !named_near(
                lines,
                |l| names_key(l, argument),
                |l| l.contains(&quoted),
                2,
                2,
            )
        })
        .map(|(tool, argument)| format!("{tool}.{argument}"))
        .collect()
}

/// The MCP arguments no test named when this check was written. A new
/// argument must come with a test; one that gets a test must leave this list.
const UNTESTED_MCP_ARGUMENTS: &[&str] = &[];

/// Fails on a name missing from `allowed` among `untested`, and on a stale
/// entry of `allowed` (tested now, or gone).
fn assert_only_allowed(what: &str, untested: &[String], allowed: &[&str], list: &str) {
    let new: Vec<&String> = untested
        .iter()
        .filter(|u| !allowed.contains(&u.as_str()))
        .collect();
    assert!(
        new.is_empty(),
        "{what} no test names (add a test):\n{}",
        new.iter()
            .map(|n| format!("    \"{n}\","))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let stale: Vec<&&str> = allowed
        .iter()
        .filter(|a| !untested.iter().any(|u| u == **a))
        .collect();
    assert!(
        stale.is_empty(),
        "entries of {list} that are tested now or gone (remove them): {stale:?}"
    );
}

#[test]
fn every_mcp_argument_is_named_by_some_test() {
    let arguments = mcp_arguments();
    assert!(
        arguments.contains(&("run".to_owned(), "idleTimeout".to_owned()))
            && arguments.contains(&("wait".to_owned(), "tail".to_owned()))
            && arguments.len() > 30,
        "too few arguments read: {arguments:?}"
    );
    let untested = untested_mcp_arguments(&arguments, &test_lines());
    assert_only_allowed(
        "MCP arguments",
        &untested,
        UNTESTED_MCP_ARGUMENTS,
        "UNTESTED_MCP_ARGUMENTS",
    );
}

#[test]
fn the_mcp_argument_check_catches_an_unnamed_argument() {
    let arguments: BTreeSet<(String, String)> =
        [("wait", "tail"), ("wait", "timeout"), ("logs", "tail")]
            .into_iter()
            .map(|(t, a)| (t.to_owned(), a.to_owned()))
            .collect();
    let lines: Vec<String> = [
        "let out = server",
        "    .ok(\"wait\", json!({\"runs\": [id], \"tail\": 5}))",
        "    .await;",
        "",
        "",
        "let timeout = \"timeout\"; // no key, and \"logs\" is far from any",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        untested_mcp_arguments(&arguments, &lines),
        ["logs.tail", "wait.timeout"]
    );
}

/// The fields of a spec file as `scope.key`, read from the source of
/// `spec.rs`: each `only_keys(..., &[...])` list of the top level and of a
/// chain's parallel group (`spec.` and `group.`; `parallel` is the group's
/// own key), and the serde fields of `StepSpec` (`step.`; camel case, but
/// `#[serde(skip)]` fields, which no file holds).
fn spec_fields(source: &str) -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    for (at, _) in source.match_indices("only_keys(") {
        let rest = &source[at..];
        let Some(open) = rest.find("&[") else {
            continue;
        };
        let list = &rest[open + 2..open + 2 + rest[open + 2..].find(']').unwrap()];
        let keys: Vec<&str> = list
            .split(',')
            .map(|k| k.trim().trim_matches('"'))
            .filter(|k| !k.is_empty() && !k.starts_with('&'))
            .collect();
        let scope = if keys.contains(&"parallel") {
            "group"
        } else {
            "spec"
        };
        fields.extend(keys.iter().map(|k| format!("{scope}.{k}")));
    }
    let at = source.find("pub struct StepSpec {").unwrap();
    let mut skip = false;
    for line in block_after(source, at).lines().map(str::trim) {
        if line.starts_with("#[serde(skip") {
            skip = true;
        } else if let Some(field) = line.strip_prefix("pub ") {
            let name: String = field.chars().take_while(|c| is_ident_char(*c)).collect();
            if !skip {
                fields.insert(format!("step.{}", camel_case(&name)));
            }
            skip = false;
        }
    }
    fields
}

fn camel_case(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a line opens a spec: a `"mode"` key of a spec's mode (a
/// status file's `"mode": "single"` is no spec).
fn opens_spec(line: &str) -> bool {
    names_key(line, "mode") && (line.contains("parallel") || line.contains("chain"))
}

/// The spec fields no test line names: the key as a JSON key in a spec,
/// a line within eight lines below the spec's `"mode"`.
fn untested_spec_fields(fields: &BTreeSet<String>, lines: &[String]) -> Vec<String> {
    fields
        .iter()
        .filter(|field| {
            let key = field.split_once('.').map_or(field.as_str(), |(_, k)| k);
            !named_near(lines, |l| names_key(l, key), opens_spec, 8, 0)
        })
        .cloned()
        .collect()
}

/// The spec fields no test named when this check was written (shrink only).
const UNTESTED_SPEC_FIELDS: &[&str] = &[];

#[test]
fn every_spec_field_is_named_by_some_test() {
    let source = std::fs::read_to_string(crate_dir(LIBRARY).join("src/spec.rs")).unwrap();
    let fields = spec_fields(&source);
    for expected in [
        "spec.mode",
        "spec.tasks",
        "spec.steps",
        "spec.queue",
        "group.parallel",
        "group.failFast",
        "step.taskFile",
        "step.idleTimeout",
    ] {
        assert!(fields.contains(expected), "{expected} not read: {fields:?}");
    }
    assert!(!fields.contains("step.commandLabel"), "{fields:?}");
    let untested = untested_spec_fields(&fields, &test_lines());
    assert_only_allowed(
        "spec fields",
        &untested,
        UNTESTED_SPEC_FIELDS,
        "UNTESTED_SPEC_FIELDS",
    );
}

#[test]
fn the_spec_field_check_catches_an_unnamed_field() {
    let source = "only_keys(obj, &[\"mode\", \"tasks\"], \"\")?;\n\
        only_keys(inner, &[\"parallel\", \"failFast\"], &at)?;\n\
        fn only_keys(obj: &Map<String, Value>, allowed: &[&str], at: &str) {}\n\
        pub struct StepSpec {\n    /// Label.\n    pub agent: String,\n    #[serde(skip)]\n    \
        pub command_label: Option<String>,\n    #[serde(default)]\n    pub idle_timeout: Option<String>,\n}";
    let fields = spec_fields(source);
    assert_eq!(
        fields,
        [
            "group.failFast",
            "group.parallel",
            "spec.mode",
            "spec.tasks",
            "step.agent",
            "step.idleTimeout",
        ]
        .map(String::from)
        .into()
    );
    let lines: Vec<String> = [
        "let spec = json!({\"mode\": \"parallel\", \"tasks\": [",
        "    {\"agent\": \"a\", \"command\": [\"true\"]},",
        "]});",
        "let failFast = \"failFast\"; // no key",
        "status[\"idleTimeout\"] // no key, and the group's key far below",
        "",
        "",
        "",
        "",
        "",
        "",
        "{\"parallel\": []}",
        "let status = json!({\"mode\": \"single\", \"failFast\": true});",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        untested_spec_fields(&fields, &lines),
        ["group.failFast", "group.parallel", "step.idleTimeout"]
    );
}

/// Every config key and its variable, from the binary's `config --json`.
fn config_keys() -> Vec<(String, String)> {
    let root = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(root.path())
        .args(["config", "--json"])
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let field = |name: &str| k[name].as_str().unwrap().to_owned();
            (field("key"), field("variable"))
        })
        .collect()
}

/// The config keys no test writes into a config file (`key = ` at the
/// start of a string or after `\n`) and the variables no test names
/// (as a whole word).
fn untested_config_keys(keys: &[(String, String)], lines: &[String]) -> Vec<String> {
    let mut untested = Vec::new();
    for (key, variable) in keys {
        let in_file = [format!("\"{key} = "), format!("\\n{key} = ")];
        if !lines
            .iter()
            .any(|l| in_file.iter().any(|p| l.contains(p.as_str())))
        {
            untested.push(format!("config.toml {key}"));
        }
        let named = lines.iter().any(|l| {
            l.match_indices(variable.as_str()).any(|(at, _)| {
                l[at + variable.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !is_ident_char(c))
            })
        });
        if !named {
            untested.push(format!("${variable}"));
        }
    }
    untested
}

/// The config keys no test set when this check was written (shrink only).
const UNTESTED_CONFIG_KEYS: &[&str] = &[];

#[test]
fn every_config_key_is_named_by_some_test() {
    let keys = config_keys();
    assert!(
        keys.iter()
            .any(|(k, v)| k == "max_active" && v == "SUBAGENTS_MAX_ACTIVE")
            && keys.len() >= 9,
        "too few keys read: {keys:?}"
    );
    let untested = untested_config_keys(&keys, &test_lines());
    assert_only_allowed(
        "config keys",
        &untested,
        UNTESTED_CONFIG_KEYS,
        "UNTESTED_CONFIG_KEYS",
    );
}

#[test]
fn the_config_key_check_catches_an_unnamed_key() {
    let keys: Vec<(String, String)> = [
        ("max_active", "SUBAGENTS_MAX_ACTIVE"),
        ("timeout", "SUBAGENTS_TIMEOUT"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    let lines: Vec<String> = [
        "config_file(\"# mine\\nmax_active = 1\\n\");",
        "let t = \"timeout: 1s\"; // SUBAGENTS_TIMEOUTS, SUBAGENTS_MAX_ACTIVE",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        untested_config_keys(&keys, &lines),
        ["config.toml timeout", "$SUBAGENTS_TIMEOUT"]
    );
}
