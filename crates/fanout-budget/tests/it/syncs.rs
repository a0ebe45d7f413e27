//! When a batch's claims become durable, counted by `strace -f -y` on a
//! re-execution of this test binary that claims: `claim` fsyncs the claims
//! directory once, after the admission lock is released; `claim_with_commit`
//! once, before its commit runs (the commit may announce the claim).
//! Skipped, with the reason printed, where strace is missing or cannot
//! trace.

extern crate subagents_fanout_budget as fanout_budget;
use std::path::{Path, PathBuf};

use fanout_budget::{BUDGET_ROOT_DIR, CLAIMS_DIR, create_budget};
use test_support::reexec;

const DIR_ENV: &str = "FANOUT_SYNCS_DIR";
/// Left by the re-executed test once its claims are done.
const DONE: &str = "done";
/// Opened by the commit of `claim_with_commit`: its place in the trace.
const COMMIT_MARK: &str = "commit-mark";

fn traced(name: &str, dir: &Path) -> Option<Vec<String>> {
    let test = reexec::test_name(module_path!(), name);
    let log = dir.join("strace.log");
    let env = [(DIR_ENV, dir.as_os_str())];
    let trace = "fsync,openat,rename,renameat2,rmdir,unlinkat";
    let (out, text) = reexec::under_strace(&test, trace, &log, &env)?;
    assert!(out.status.success(), "the traced claims failed: {out:?}");
    assert!(
        dir.join(DONE).exists(),
        "the traced test did not run: {out:?}"
    );
    Some(text.lines().map(str::to_owned).collect())
}

fn child_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR_ENV).expect("run by `traced`"))
}

/// Indexes of the trace lines that fsync the claims directory.
fn claims_syncs(lines: &[String]) -> Vec<usize> {
    let suffix = format!("/{CLAIMS_DIR}>)");
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("fsync(") && l.contains(&suffix))
        .map(|(i, _)| i)
        .collect()
}

/// The index of the last line that releases the admission lock: the
/// reference-compatible lock directory is moved aside, then removed.
fn lock_released(lines: &[String]) -> usize {
    lines
        .iter()
        .rposition(|l| {
            l.contains("admission.lock") && (l.contains("rename") || l.contains("rmdir"))
        })
        .expect("the admission lock was taken and released")
}

#[test]
fn a_claim_syncs_its_claims_once_after_the_lock_is_released() {
    let name = "a_claim_syncs_its_claims_once_after_the_lock_is_released";
    if reexec::is_rerun(&reexec::test_name(module_path!(), name)) {
        let dir = child_dir();
        let budget = create_budget(&dir.join(BUDGET_ROOT_DIR), "root", 8).unwrap();
        budget.claim(&["tasks[0]", "tasks[1]"]).unwrap();
        std::fs::write(dir.join(DONE), "").unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lines) = traced(name, tmp.path()) else {
        return;
    };
    let syncs = claims_syncs(&lines);
    // create_budget syncs the new claims directory's parent, not it; the
    // claim syncs it once.
    assert_eq!(syncs.len(), 1, "{lines:#?}");
    assert!(
        syncs[0] > lock_released(&lines),
        "synced under the lock: {lines:#?}"
    );
}

#[test]
fn a_claim_with_a_commit_syncs_its_claims_once_before_the_commit() {
    let name = "a_claim_with_a_commit_syncs_its_claims_once_before_the_commit";
    if reexec::is_rerun(&reexec::test_name(module_path!(), name)) {
        let dir = child_dir();
        let budget = create_budget(&dir.join(BUDGET_ROOT_DIR), "root", 8).unwrap();
        budget
            .claim_with_commit(&["tasks[0]"], |_| {
                std::fs::write(dir.join(COMMIT_MARK), "").unwrap();
                Ok(())
            })
            .unwrap();
        std::fs::write(dir.join(DONE), "").unwrap();
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(lines) = traced(name, tmp.path()) else {
        return;
    };
    let syncs = claims_syncs(&lines);
    assert_eq!(syncs.len(), 1, "{lines:#?}");
    let commit = lines
        .iter()
        .position(|l| l.contains(COMMIT_MARK))
        .expect("the commit ran");
    assert!(
        syncs[0] < commit,
        "the commit ran before the claims were durable: {lines:#?}"
    );
}
