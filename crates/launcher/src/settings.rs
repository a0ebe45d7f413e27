//! The user's defaults: `$XDG_CONFIG_HOME/subagents/config.toml` (else
//! `~/.config/subagents/config.toml`).
//!
//! Each key stands in for an environment variable that is not set, so the
//! order is always flag, then environment, then this file, then the
//! built-in default. The file is a flat list of `key = value` lines (TOML's
//! simple subset: strings in double quotes, integers, `#` comments).

use std::path::{Path, PathBuf};

use crate::api::{ConfigKey, ConfigOutcome};
use crate::error::{Error, Result};

/// The keys, the variable each one stands in for, and whether it is a number.
pub const KEYS: [(&str, &str, bool); 9] = [
    ("root", "SUBAGENTS_ROOT", false),
    ("session", "SUBAGENTS_SESSION_ID", false),
    ("max_active", "SUBAGENTS_MAX_ACTIVE", true),
    ("queue", crate::prepare::QUEUE_ENV, false),
    ("fanout_limit", fanout_budget::LIMIT_ENV, true),
    ("timeout", "SUBAGENTS_TIMEOUT", false),
    ("color", "SUBAGENTS_COLOR", false),
    ("idle_timeout", IDLE_TIMEOUT_ENV, false),
    ("executor", crate::executor::EXECUTOR_ENV, false),
];

pub use crate::prepare::IDLE_TIMEOUT_ENV;

/// Where the file is looked for.
pub fn path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| crate::root::home().map(|h| h.join(".config")))?;
    Some(base.join("subagents").join("config.toml"))
}

/// Parses the file's text: `(key, value)` pairs; errors name the line.
pub fn parse(text: &str) -> Result<Vec<(&'static str, String)>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |why: String| format!("line {}: {why}", n + 1);
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| fail("expected `key = value`".into()))?;
        let key = key.trim();
        let &(name, _, number) = KEYS.iter().find(|(k, _, _)| *k == key).ok_or_else(|| {
            fail(format!(
                "unknown key '{key}' (known: root, session, max_active, queue, fanout_limit, timeout, color, idle_timeout, executor)"
            ))
        })?;
        let value = strip_comment(value.trim());
        let value = if name == "queue" {
            queue_value(value)
                .ok_or_else(|| fail(format!("queue must be true or false, not '{value}'")))?
        } else if number {
            value
                .parse::<u64>()
                .map_err(|_| fail(format!("{key} must be a whole number, not '{value}'")))?
                .to_string()
        } else {
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .filter(|v| !v.contains('"') && !v.contains('\\'))
                .ok_or_else(|| fail(format!("{key} must be a plain \"quoted string\"")))?
                .to_owned()
        };
        check_value(name, &value).map_err(fail)?;
        out.push((name, value));
    }
    Ok(out)
}

/// The `queue` key: a TOML boolean (`true`, `false`), as the variable
/// it stands in for spells it.
fn queue_value(value: &str) -> Option<String> {
    match value {
        "true" | "false" => Some(value.to_owned()),
        _ => None,
    }
}

/// A bad default is reported against the file, not later against a flag
/// the user never typed.
fn check_value(key: &str, value: &str) -> Result<(), String> {
    match key {
        "timeout" | "idle_timeout" => crate::root::parse_duration(value)
            .map(|_| ())
            .map_err(|e| format!("{key}: {e}")),
        "executor" if crate::executor::ExecutorKind::parse(value).is_none() => Err(format!(
            "executor must be \"local\" or \"slurm\", not '{value}'"
        )),
        "color" if !["auto", "always", "never"].contains(&value) => Err(format!(
            "color must be \"auto\", \"always\" or \"never\", not '{value}'"
        )),
        _ => Ok(()),
    }
}

fn strip_comment(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('"') {
        // A `#` inside the quotes belongs to the string.
        match rest.find('"') {
            Some(end) => value[..end + 2].trim(),
            None => value,
        }
    } else {
        value.split('#').next().unwrap_or("").trim()
    }
}

/// The file's text; `None` when there is none. An error is the file's that
/// could not be checked (a parent that is not a directory or not
/// searchable, a FIFO in its place, another user's file).
fn text(path: &Path) -> Result<Option<String>> {
    match atomic_file::read::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Error::failed(format!("failed to read config: {e}"))),
    }
}

fn parse_file(path: &Path, text: &str) -> Result<Vec<(&'static str, String)>> {
    parse(text).map_err(|e| {
        Error::failed(format!(
            "failed to read config '{}': {e}",
            atomic_file::escape_path(path)
        ))
    })
}

fn read(path: &Path) -> Result<Vec<(&'static str, String)>> {
    match text(path)? {
        Some(text) => parse_file(path, &text),
        None => Ok(Vec::new()),
    }
}

/// Sets each configured variable that the environment does not already set.
/// Call before parsing the command line (clap reads these variables).
///
/// A file that cannot be checked is no failure of a command that does not
/// need it: its error comes back as a warning (`Ok(Some(..))`) and no
/// default is taken from it. A file that reads but does not parse fails.
pub fn apply() -> Result<Option<String>> {
    let Some(path) = path() else { return Ok(None) };
    let text = match text(&path) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(None),
        Err(e) => return Ok(Some(format!("{}; going on without it", e.message))),
    };
    for (key, value) in parse_file(&path, &text)? {
        let var = variable(key);
        if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
            // SAFETY: called at start-up, before this process starts any thread.
            unsafe { std::env::set_var(var, value) };
        }
    }
    Ok(None)
}

fn variable(key: &str) -> &'static str {
    KEYS.iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, v, _)| *v)
        .unwrap_or("")
}

/// The file, and each key's effective value and where it comes from; the
/// root is `layout`'s (the one commands use), and `root_flag` says that it
/// came from a flag (the caller's, e.g. the command line's `--root`).
pub fn config(layout: &status::Layout, root_flag: bool) -> Result<ConfigOutcome> {
    let path = path();
    let file = match &path {
        Some(p) => read(p)?,
        None => Vec::new(),
    };
    let mut keys = Vec::new();
    for (key, var, _) in KEYS {
        let from_file = file.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v);
        // `apply` already copied the file's values into unset variables.
        let env = std::env::var(var).ok().filter(|v| !v.is_empty());
        let (value, source) = match (env, from_file) {
            _ if key == "root" && root_flag => (None, "flag"),
            (Some(v), Some(f)) if &v == f => (Some(v), "config"),
            (Some(v), _) => (Some(v), "environment"),
            (None, _) => (None, "default"),
        };
        let value = match key {
            // The root commands really use: absolute, symbolic links resolved.
            "root" => Some(real_root(layout)),
            _ => value.or_else(|| Some(default_value(key))),
        };
        keys.push(ConfigKey {
            key: key.to_owned(),
            variable: var.to_owned(),
            value,
            source: source.to_owned(),
        });
    }
    Ok(ConfigOutcome {
        exists: path.as_ref().is_some_and(|p| p.exists()),
        path: path.as_ref().map(|p| p.display().to_string()),
        keys,
    })
}

/// A key's built-in default, as commands apply it.
fn default_value(key: &str) -> String {
    match key {
        "session" => crate::admission::session_id(None),
        "max_active" => "0".to_owned(),
        "fanout_limit" => fanout_budget::DEFAULT_LIMIT.to_string(),
        "timeout" => status::spell_duration(crate::prepare::DEFAULT_TIMEOUT_MS),
        "color" => "auto".to_owned(),
        _ => String::new(),
    }
}

fn real_root(layout: &status::Layout) -> String {
    let root = layout.root();
    std::fs::canonicalize(root)
        .unwrap_or_else(|_| root.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_keys_and_names_the_bad_line() {
        let text =
            "# defaults\nroot = \"/srv/state\" # here\nmax_active = 4\n\nsession = \"a#b\"\n";
        assert_eq!(
            parse(text).unwrap(),
            [
                ("root", "/srv/state".to_owned()),
                ("max_active", "4".to_owned()),
                ("session", "a#b".to_owned())
            ]
        );
        assert_eq!(
            parse("max_active = many").unwrap_err(),
            "line 1: max_active must be a whole number, not 'many'"
        );
        assert!(
            parse("\ncolour = \"never\"")
                .unwrap_err()
                .starts_with("line 2: unknown key 'colour'")
        );
        assert!(parse("root = /x").unwrap_err().contains("quoted string"));
        assert_eq!(
            parse("timeout = \"45m\"\ncolor = \"never\"").unwrap(),
            [("timeout", "45m".to_owned()), ("color", "never".to_owned())]
        );
        assert!(
            parse("timeout = \"soon\"")
                .unwrap_err()
                .starts_with("line 1: timeout: invalid duration 'soon'")
        );
        assert!(parse("color = \"red\"").unwrap_err().contains("not 'red'"));
        assert!(parse("just words").unwrap_err().contains("key = value"));
        assert_eq!(
            parse("queue = true").unwrap(),
            [("queue", "true".to_owned())]
        );
        assert_eq!(
            parse("\nqueue = yes").unwrap_err(),
            "line 2: queue must be true or false, not 'yes'"
        );
        assert!(
            parse("queue = \"true\"")
                .unwrap_err()
                .contains("not '\"true\"'")
        );
    }
}
