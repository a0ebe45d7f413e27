//! When a pi-subagents 0.49 child would accept an inherited budget.
//!
//! Its reader of `PI_SUBAGENT_RUN_FANOUT_BUDGET` refuses (and fails the
//! child) a budget whose directory does not resolve inside its own managed
//! root `<os.tmpdir()>/pi-subagents-uid-<uid>/run-fanout-budgets`. So we hand
//! the budget on under that name only when it lies there, i.e. when our state
//! root is the reference's own root; otherwise the child starts its own budget.

use std::path::{Path, PathBuf};

/// Node's `os.tmpdir()` on Unix for an environment lookup: `$TMPDIR`, `$TMP`,
/// `$TEMP`, else `/tmp`; one trailing slash dropped.
pub fn node_tmpdir(lookup: impl Fn(&str) -> Option<String>) -> PathBuf {
    let dir = ["TMPDIR", "TMP", "TEMP"]
        .into_iter()
        .find_map(|key| lookup(key).filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "/tmp".to_owned());
    let trimmed = match dir.strip_suffix('/') {
        Some(rest) if !rest.is_empty() => rest.to_owned(),
        _ => dir,
    };
    PathBuf::from(trimmed)
}

/// The reference's state root for temp dir `tmpdir` and the current user.
pub fn reference_state_root(tmpdir: &Path) -> PathBuf {
    let uid = nix::unistd::getuid().as_raw();
    tmpdir.join(format!("pi-subagents-uid-{uid}"))
}

/// True when a 0.49 reader whose temp dir is `tmpdir` accepts a budget in
/// `directory` (both real paths compared, as it does).
pub fn reference_accepts(directory: &Path, tmpdir: &Path) -> bool {
    let root = reference_state_root(tmpdir).join(crate::BUDGET_ROOT_DIR);
    match (
        std::fs::canonicalize(directory),
        std::fs::canonicalize(root),
    ) {
        (Ok(dir), Ok(root)) => dir.starts_with(root),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_tmpdir_order_and_trailing_slash() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(node_tmpdir(env(&[])), PathBuf::from("/tmp"));
        // Compared as text: `Path` equality ignores a trailing slash, and
        // the reference's root is built from the trimmed string.
        assert_eq!(
            node_tmpdir(env(&[("TMP", "/a/"), ("TEMP", "/b")])).as_os_str(),
            "/a"
        );
        assert_eq!(
            node_tmpdir(env(&[("TMPDIR", ""), ("TEMP", "/b")])),
            PathBuf::from("/b")
        );
        assert_eq!(node_tmpdir(env(&[("TMPDIR", "/")])).as_os_str(), "/");
    }

    #[test]
    fn accepted_only_inside_the_reference_root() {
        let tmp = tempfile::tempdir().unwrap();
        let inside = reference_state_root(tmp.path()).join("run-fanout-budgets/r-1");
        std::fs::create_dir_all(&inside).unwrap();
        let outside = tmp.path().join("elsewhere/run-fanout-budgets/r-1");
        std::fs::create_dir_all(&outside).unwrap();
        assert!(reference_accepts(&inside, tmp.path()));
        assert!(!reference_accepts(&outside, tmp.path()));
        assert!(!reference_accepts(&inside, &tmp.path().join("other")));
    }
}
