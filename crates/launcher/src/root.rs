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

/// Parses a duration: `500ms`, `90s`, `30m`, `2h`, `1d`, or units in
/// descending order without repeats (`1h30m`, `1d2h`, `2m30s`). `0` alone is
/// zero (which every timeout reads as "no deadline"); any other bare number
/// is refused, so `10` is never silently ten seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("invalid duration '{text}': {why}");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut rest = text;
    let mut total: u64 = 0;
    // Each unit's rank: a later part must have a smaller unit than the last.
    let mut last_rank = usize::MAX;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let (number, tail) = rest.split_at(digits);
        let letters = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(letters);
        let (rank, unit_ms) = match unit {
            "d" => (4, 86_400_000),
            "h" => (3, 3_600_000),
            "m" => (2, 60_000),
            "s" => (1, 1_000),
            "ms" => (0, 1),
            "" => return Err(bad("a number needs a unit (ms, s, m, h or d)")),
            _ => return Err(bad("unit must be ms, s, m, h or d")),
        };
        if rank >= last_rank {
            return Err(bad("units go from largest to smallest, each once"));
        }
        last_rank = rank;
        let part = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit_ms))
            .ok_or_else(|| bad("too large"))?;
        total = total.checked_add(part).ok_or_else(|| bad("too large"))?;
        rest = next;
    }
    Ok(Duration::from_millis(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u128 {
        parse_duration(text).unwrap().as_millis()
    }

    #[test]
    fn durations_of_one_unit() {
        assert_eq!(ms("500ms"), 500);
        assert_eq!(ms("90s"), 90_000);
        assert_eq!(ms("30m"), 1_800_000);
        assert_eq!(ms("2h"), 7_200_000);
        assert_eq!(ms("1d"), 86_400_000);
        assert_eq!(ms("0"), 0);
        assert_eq!(ms("0s"), 0);
    }

    #[test]
    fn compound_durations() {
        assert_eq!(ms("1h30m"), 5_400_000);
        assert_eq!(ms("1d2h"), 93_600_000);
        assert_eq!(ms("2m30s"), 150_000);
        assert_eq!(ms("1s500ms"), 1_500);
        assert_eq!(ms("1d1h1m1s1ms"), 90_061_001);
    }

    #[test]
    fn refused_durations() {
        for text in [
            "",
            "10",
            "2.5",
            "1h1h",
            "30m1h",
            "1s1d",
            "-5s",
            "-0",
            "5y",
            "1 h",
            " 5s",
            "5s ",
            "1h 30m",
            "h",
            "ms",
            "1h30",
            "18446744073709551615d",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn a_bare_number_asks_for_a_unit() {
        let e = parse_duration("10").unwrap_err();
        assert!(e.contains("needs a unit"), "{e}");
        let e = parse_duration("5y").unwrap_err();
        assert!(e.contains("ms, s, m, h or d"), "{e}");
    }
}
