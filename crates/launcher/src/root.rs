//! Resolving the state root and small shared helpers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use atomic_file::read::check_private_dir;
use status::Layout;

/// `--root`, else `$SUBAGENTS_ROOT`, else `$XDG_STATE_HOME/subagents`, else
/// `~/.local/state/subagents`.
pub fn state_root(flag: Option<PathBuf>) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let root = flag
        .or_else(|| env("SUBAGENTS_ROOT"))
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("subagents")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/subagents")))
        .unwrap_or_else(|| PathBuf::from(".subagents"));
    // The monitor and runner change directory; a relative root must not move with them.
    std::path::absolute(&root).unwrap_or(root)
}

/// Whether `--allow-shared-root` or `SUBAGENTS_ALLOW_SHARED_ROOT=1` asks to
/// trust a state root that other users can write into.
pub fn allow_shared_root(flag: bool) -> bool {
    flag || std::env::var("SUBAGENTS_ALLOW_SHARED_ROOT").is_ok_and(|v| v == "1")
}

/// Refuses a state root that another user could plant files in: the root and
/// the state directories inside it (the runs directory, the active index,
/// the fan-out budgets directory, the capacity directory, session leases)
/// must be owned by this user (or root) and not writable by group or
/// others. Run directories are checked when a run is read (listings show an
/// untrusted one as unreadable), a fan-out budget with its claims when it
/// is opened, a capacity pool and slot when it is read, and a session lease
/// when it is read (an untrusted one blocks its session as unreadable), so
/// this stays cheap for large roots (a launch does not stat every held slot
/// or lease). Missing
/// directories are fine; they are created 0700. The parent of the root is not
/// checked, so a root under a sticky `/tmp` is fine.
pub fn check_trusted(layout: &Layout) -> Result<(), String> {
    let check = |dir: &Path| check_private_dir(dir).map_err(|e| e.to_string());
    check(layout.root())?;
    check(&layout.runs_dir())?;
    check(&layout.active_index_dir())?;
    // One fan-out budget per root run: each is checked when it is opened,
    // so a command's cost does not grow with the history.
    check(&layout.fanout_budgets_dir())?;
    // Capacity pools and slots are checked by the capacity crate when read.
    check(&layout.capacity_dir())?;
    // Session leases are checked by the recovery crate when read.
    check(&layout.session_leases_dir())?;
    Ok(())
}

/// The home directory used to shorten paths in human output.
pub fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Parses `30m`, `90s`, `1500ms`, `2h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration '{text}'"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration '{text}': unit must be ms, s, m or h"
            ));
        }
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("invalid duration '{text}'"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("").is_err());
    }
}
