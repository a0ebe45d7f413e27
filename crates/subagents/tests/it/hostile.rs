//! Hostile state roots: FIFOs, corrupt and oversize files, moved, read-only,
//! full and shared roots, control characters in ids.
//!
//! Every command runs as a child process with a deadline: a command that
//! hangs (the fault these tests guard against) is killed and fails its test
//! instead of hanging the suite. The deadline detects a hang; it is not a
//! timing assertion.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// Far above what any command here needs; only a hang gets near it.
const HANG: Duration = Duration::from_secs(60);

/// Runs `command`, killing it and failing the test when it does not finish.
fn finish(command: Command) -> Output {
    output_within(command, HANG)
}

fn at(env: &Env, root: &Path, args: &[&str]) -> Output {
    let mut command = env.command(args);
    // A later --root wins over the one `Env::command` put first.
    command.arg("--root").arg(root);
    finish(command)
}

fn sub(env: &Env, args: &[&str]) -> Output {
    finish(env.command(args))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit 1 and a single stderr line containing `needle`.
fn one_line_failure(out: &Output, needle: &str, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
    assert_eq!(err.lines().count(), 1, "{what}: one line: {err:?}");
    assert!(err.contains(needle), "{what}: {err:?}");
}

fn finished_run(env: &Env, script: &str) -> String {
    env.ok(&["run", "--wait", "--", "sh", "-c", script])
        .trim()
        .to_owned()
}

fn run_dir(root: &Path, id: &str) -> PathBuf {
    root.join("async-subagent-runs").join(id)
}

fn plant_fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// A run whose status says running while its runner pid is long gone: every
/// reading command wants to repair it.
fn stale_run(root: &Path, id: &str) {
    let dir = run_dir(root, id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let status = serde_json::json!({
        "runId": id, "state": "running", "pid": 2_147_483_646u32,
        "startedAt": 1, "lastUpdate": 2,
        "steps": [{"agent": "a", "status": "running"}]
    });
    std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
    let index = root.join("async-subagent-runs/.active-runs");
    std::fs::create_dir_all(&index).unwrap();
    std::fs::write(index.join(id), "").unwrap();
}

#[test]
fn a_fifo_status_json_never_hangs_and_never_hides_the_other_runs() {
    let env = Env::new();
    let good = finished_run(&env, "echo good");
    let bad = finished_run(&env, "echo bad");
    let status = run_dir(env.root(), &bad).join("status.json");
    plant_fifo(&status);
    // A marker too, so the active listing meets it.
    std::fs::write(env.marker(&bad), "").unwrap();

    for args in [vec!["list"], vec!["list", "--all"], vec!["reconcile"]] {
        let out = sub(&env, &args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        let text = stdout(&out);
        let row = format!("- {bad} | unreadable | ");
        assert!(text.contains(&row), "{args:?}: {text}");
        assert!(
            text.contains("not a regular file (FIFO)"),
            "{args:?}: {text}"
        );
        if args == ["list", "--all"] {
            assert!(text.contains(&format!("- {good} | complete")), "{text}");
        }
    }
    let all: Value = serde_json::from_str(&env.ok(&["list", "--all", "--json"])).unwrap();
    let rows = all.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{all}");
    let unreadable = rows.iter().find(|r| r["id"] == bad.as_str()).unwrap();
    assert_eq!(unreadable["state"], "unreadable");
    assert!(
        unreadable["error"]
            .as_str()
            .unwrap()
            .contains(&status.display().to_string()),
        "{unreadable}"
    );
    assert!(
        rows.iter()
            .any(|r| r["id"] == good.as_str() && r["state"] == "complete")
    );
    let reconciled: Value = serde_json::from_str(&env.ok(&["reconcile", "--json"])).unwrap();
    assert_eq!(
        reconciled["unreadable"][0]["id"],
        bad.as_str(),
        "{reconciled}"
    );

    let file = status.to_str().unwrap();
    for args in [
        vec!["status", bad.as_str()],
        vec!["status", bad.as_str(), "--json"],
        vec!["wait", bad.as_str()],
        vec!["stop", bad.as_str()],
        vec!["dismiss", bad.as_str()],
        vec!["logs", bad.as_str()],
        vec!["validate", "--kind", "status", file],
    ] {
        let out = sub(&env, &args);
        one_line_failure(&out, "not a regular file (FIFO)", &format!("{args:?}"));
    }
    // The healthy run still works end to end.
    assert_eq!(env.ok(&["logs", &good]), "good\n");
    assert_eq!(env.status_json(&good)["state"], "complete");
    let stopped = env.ok(&["stop", &good]);
    assert!(
        stopped.starts_with(&format!("{good} was already over (complete)")),
        "{stopped}"
    );
}

#[test]
fn a_fifo_launch_contract_or_lock_fails_resume_and_dismiss_at_once() {
    let env = Env::new();
    let id = finished_run(&env, "echo one");
    let dir = run_dir(env.root(), &id);
    assert!(dir.join("launch-contract.json").exists());
    plant_fifo(&dir.join("launch-contract.json"));
    let out = sub(&env, &["resume", &id, "--task", "again"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stderr(&out).lines().count(), 1, "{out:?}");
    assert!(stderr(&out).contains("not a regular file"), "{out:?}");
    let out = sub(&env, &["validate", "--kind", "launch-contract"])
        .status
        .code();
    assert_eq!(out, Some(2), "usage: the file is required");
    let contract = dir.join("launch-contract.json");
    let out = sub(
        &env,
        &[
            "validate",
            "--kind",
            "launch-contract",
            contract.to_str().unwrap(),
        ],
    );
    one_line_failure(&out, "not a regular file (FIFO)", "validate contract");
    // A FIFO in place of the status lock: dismiss (a writer) fails, not hangs.
    plant_fifo(&dir.join(".status.lock"));
    let out = sub(&env, &["dismiss", &id]);
    one_line_failure(&out, "not a regular file", "dismiss with a FIFO lock");
}

#[test]
fn one_corrupt_or_oversize_status_among_healthy_runs_lists_and_reconciles() {
    let env = Env::new();
    let good = finished_run(&env, "echo good");
    let corrupt = finished_run(&env, "echo corrupt");
    let big = finished_run(&env, "echo big");
    std::fs::write(
        run_dir(env.root(), &corrupt).join("status.json"),
        "{\"state\":",
    )
    .unwrap();
    let huge = run_dir(env.root(), &big).join("status.json");
    let file = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
    file.set_len(318 * 1024 * 1024).unwrap();

    let out = sub(&env, &["list", "--all"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains(&format!("- {good} | complete")), "{text}");
    assert!(
        text.contains(&format!(
            "- {corrupt} | unreadable | failed to parse async status file"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "- {big} | unreadable | failed to read '{}': 318 MiB exceeds the 16 MiB limit for state files",
            huge.display()
        )),
        "{text}"
    );
    let out = sub(&env, &["reconcile"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out).matches("| unreadable |").count(), 2, "{out:?}");
    one_line_failure(
        &sub(&env, &["status", &big]),
        "318 MiB exceeds the 16 MiB limit",
        "status of the oversize run",
    );
    one_line_failure(
        &sub(
            &env,
            &["validate", "--kind", "status", huge.to_str().unwrap()],
        ),
        "318 MiB exceeds the 16 MiB limit",
        "validate the oversize file",
    );
    one_line_failure(
        &sub(&env, &["status", &corrupt]),
        "failed to parse async status file",
        "status of the corrupt run",
    );
}

#[test]
fn a_moved_root_keeps_listing_showing_and_stopping_its_runs() {
    let env = Env::new();
    let id = finished_run(&env, "echo moved");
    let elsewhere = tempfile::tempdir().unwrap();
    let moved = elsewhere.path().join("moved-root");
    std::fs::rename(env.root(), &moved).unwrap();

    let out = at(&env, &moved, &["list", "--all"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("- {id} | complete")),
        "{out:?}"
    );
    assert!(stdout(&out).contains("Run fan-out: 1/64 used"), "{out:?}");
    let out = at(&env, &moved, &["status", &id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["runFanoutBudget"]["used"], 1, "{status}");
    let out = at(&env, &moved, &["stop", &id]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = at(&env, &moved, &["logs", &id]);
    assert_eq!(stdout(&out), "moved\n", "{out:?}");
    assert!(stderr(&out).is_empty(), "the output file is found: {out:?}");
    // Put it back so the TempDir cleans up.
    std::fs::rename(&moved, env.root()).unwrap();
}

/// Mounts `dir` read-only onto a new directory; `None` when not permitted.
fn read_only_bind(dir: &Path) -> Option<(tempfile::TempDir, PathBuf)> {
    let mount = tempfile::tempdir().unwrap();
    let target = mount.path().join("ro");
    std::fs::create_dir(&target).unwrap();
    let bind = Command::new("mount")
        .arg("--bind")
        .arg(dir)
        .arg(&target)
        .status();
    if !bind.is_ok_and(|s| s.success()) {
        return None;
    }
    let ro = Command::new("mount")
        .args(["-o", "remount,ro,bind"])
        .arg(&target)
        .status();
    if !ro.is_ok_and(|s| s.success()) {
        let _ = Command::new("umount").arg(&target).status();
        return None;
    }
    Some((mount, target))
}

fn unmount(target: &Path) {
    let _ = Command::new("umount").arg(target).status();
}

/// `list`, `list --all`, `status` and `reconcile` of a root whose repair of
/// the stale run `id` cannot be written: exit 0, one warning line, the run
/// shown as read.
fn reads_without_writing(env: &Env, root: &Path, id: &str, cause: &str) {
    for args in [
        vec!["list"],
        vec!["list", "--all"],
        vec!["status", id],
        vec!["reconcile"],
    ] {
        let out = at(env, root, &args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(
            err.starts_with(&format!(
                "subagents: warning: skipped the stale-run repair of '{id}': "
            )) && err.contains(cause),
            "{args:?}: {err:?}"
        );
        // `status` names the run's label after its id; `list` keeps the
        // reference's header.
        let header = match args[0] {
            "status" => format!("- {id} (a) | running"),
            _ => format!("- {id} | running"),
        };
        if args[0] != "reconcile" {
            assert!(stdout(&out).contains(&header), "{args:?}: {out:?}");
        }
    }
    let out = at(env, root, &["capacity"]);
    assert_eq!(out.status.code(), Some(0), "capacity: {out:?}");
}

#[test]
fn a_read_only_root_lists_and_shows_status() {
    let env = Env::new();
    let id = finished_run(&env, "echo ro");
    stale_run(env.root(), "stale1");
    let Some((_mount, ro)) = read_only_bind(env.root()) else {
        eprintln!("read-only bind mount not permitted here; see the lock-directory variant below");
        return;
    };
    let out = at(&env, &ro, &["list", "--all"]);
    unmount_on_failure(&ro, || {
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(
            stdout(&out).contains(&format!("- {id} | complete")),
            "{out:?}"
        );
        reads_without_writing(&env, &ro, "stale1", "Read-only file system");
        let out = at(&env, &ro, &["status", &id]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(at(&env, &ro, &["logs", &id]).stdout, b"ro\n");
        let out = at(&env, &ro, &["stop", &id]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "stop of a finished run: {out:?}"
        );
    });
    unmount(&ro);
    // Writable again: the repair happens.
    let status = env.status_json("stale1");
    assert_eq!(status["state"], "failed", "{status}");
}

fn unmount_on_failure(target: &Path, body: impl FnOnce()) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    if let Err(panic) = result {
        unmount(target);
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_full_disk_does_not_stop_reading_commands() {
    let env = Env::new();
    let mount = tempfile::tempdir().unwrap();
    let made = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs"])
        .arg(mount.path())
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("tmpfs mount not permitted here; see the lock-directory variant below");
        return;
    }
    let root = mount.path().join("root");
    unmount_on_failure(mount.path(), || {
        stale_run(&root, "stale1");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Fill the file system.
        let fill = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", mount.path().join("fill").display()))
            .arg("bs=64k")
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!fill.success(), "dd stops at ENOSPC");
        reads_without_writing(&env, &root, "stale1", "No space left on device");
    });
    unmount(mount.path());
}

#[test]
fn a_repair_that_cannot_be_written_is_reported_and_skipped() {
    // Works without privileges: the status lock is a directory, so the
    // repair's locked write fails while the status still reads.
    let env = Env::new();
    stale_run(env.root(), "stale1");
    std::fs::create_dir(run_dir(env.root(), "stale1").join(".status.lock")).unwrap();
    reads_without_writing(&env, env.root(), "stale1", ".status.lock");
}

#[test]
fn a_shared_root_is_refused_unless_allowed() {
    let env = Env::new();
    let id = finished_run(&env, "echo shared");
    let runs = env.root().join("async-subagent-runs");
    let allowed = |args: &[&str]| {
        let mut flagged = vec!["--allow-shared-root"];
        flagged.extend_from_slice(args);
        let out = sub(&env, &flagged);
        assert_eq!(out.status.code(), Some(0), "{flagged:?}: {out:?}");
        let mut by_env = env.command(args);
        by_env.env("SUBAGENTS_ALLOW_SHARED_ROOT", "1");
        let out = finish(by_env);
        assert_eq!(out.status.code(), Some(0), "{args:?} by env: {out:?}");
    };
    // The root and the runs directory: every command refuses the root.
    for dir in [env.root().to_path_buf(), runs.clone()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        for args in [
            vec!["list", "--all"],
            vec!["status", id.as_str()],
            vec!["reconcile"],
            vec!["run", "--", "true"],
        ] {
            one_line_failure(
                &sub(&env, &args),
                &format!(
                    "refusing state directory '{}': it is writable by group or others (mode 0777)",
                    dir.display()
                ),
                &format!("{} {args:?}", dir.display()),
            );
        }
        allowed(&["list", "--all"]);
        allowed(&["status", &id]);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    // One run directory: that run is refused, the root still lists.
    let dir = run_dir(env.root(), &id);
    let other = finished_run(&env, "echo other");
    let check_run_refused = |why: &str| {
        let out = sub(&env, &["list", "--all"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let text = stdout(&out);
        assert!(text.contains(&format!("- {other} | complete")), "{text}");
        assert!(
            text.contains(&format!("- {id} | unreadable | refusing state directory"))
                && text.contains(why),
            "{text}"
        );
        for args in [vec!["status", id.as_str()], vec!["dismiss", id.as_str()]] {
            one_line_failure(&sub(&env, &args), why, &format!("{args:?}"));
        }
        allowed(&["status", &id]);
    };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    check_run_refused("writable by group or others (mode 0770)");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Owned by another user (the tests run as root, where chown works).
    if std::os::unix::fs::chown(&dir, Some(4242), Some(4242)).is_ok() {
        check_run_refused("owned by uid 4242");
        std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
        // A planted budget manifest owned by another user is refused too.
        let persisted = std::fs::read_to_string(dir.join("run-fanout-budget.json")).unwrap();
        let persisted: Value = serde_json::from_str(&persisted).unwrap();
        let budget = PathBuf::from(persisted["directory"].as_str().unwrap());
        let manifest = budget.join("manifest.json");
        let before: Value =
            serde_json::from_slice(&sub(&env, &["status", &id, "--json"]).stdout).unwrap();
        std::os::unix::fs::chown(&manifest, Some(4242), Some(4242)).unwrap();
        // The finished run's counts were frozen into its status when it
        // ended; the planted manifest is not even read.
        let out = sub(&env, &["status", &id, "--json"]);
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(shown["listingFacts"]["frozenAt"].is_u64(), "{out:?}");
        assert_eq!(
            shown["runFanoutBudget"], before["runFanoutBudget"],
            "{out:?}"
        );
        assert!(shown.get("runFanoutBudgetUnavailable").is_none(), "{out:?}");
        // Without frozen facts the budget is read live, and its limit is not
        // trusted: the run shows its fan-out as unavailable.
        let status_file = dir.join("status.json");
        let mut raw: Value =
            serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
        raw.as_object_mut().unwrap().remove("listingFacts");
        std::fs::write(&status_file, serde_json::to_vec_pretty(&raw).unwrap()).unwrap();
        let out = sub(&env, &["status", &id, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        let why = shown["runFanoutBudgetUnavailable"]
            .as_str()
            .unwrap_or_default();
        assert!(why.contains("owned by uid 4242"), "{out:?}");
        assert!(shown.get("runFanoutBudget").is_none(), "{out:?}");
        allowed(&["status", &id]);
        std::os::unix::fs::chown(&manifest, Some(0), Some(0)).unwrap();
    }
    assert_eq!(sub(&env, &["list", "--all"]).status.code(), Some(0));
}

#[test]
fn control_characters_in_ids_stay_on_one_line() {
    let env = Env::new();
    for id in ["a\nb", "x\r\ny\u{1b}[2J"] {
        for args in [vec!["status", id], vec!["stop", id], vec!["wait", id]] {
            let out = sub(&env, &args);
            assert_eq!(out.status.code(), Some(4), "{args:?}: {out:?}");
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
            assert!(!err.contains('\u{1b}') && !err.contains('\r'), "{err:?}");
        }
    }
    let out = sub(&env, &["status", "a\nb"]);
    assert_eq!(stderr(&out), "subagents: no such run: 'a\\nb'\n");
    let out = sub(&env, &["run", "--id", "a\nb", "--", "true"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    // One message line, then the usage mistake's hint.
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[1].starts_with("  hint: "), "{out:?}");
}

/// A capacity slot another user could write into is no longer found by a
/// stat of every slot at start-up, but it is still refused, on one line
/// naming it, by every command that reads it: a launch into the full pool
/// and `capacity`. Fixed, the same launch is refused only by the limit.
#[test]
fn an_untrusted_capacity_slot_is_refused_when_it_is_read() {
    let env = Env::new();
    let session = ["--session", "trust", "--max-active", "1"];
    let mut hold = vec!["run"];
    hold.extend(session);
    hold.extend(["--", "sleep", "600"]);
    let held = env.ok(&hold).trim().to_owned();
    let capacity = env.root().join("session-active-async-capacity");
    let pool = std::fs::read_dir(&capacity)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let slot = pool.join("slot-0");
    std::fs::set_permissions(&slot, std::fs::Permissions::from_mode(0o770)).unwrap();
    let why = format!(
        "refusing state directory '{}': it is writable by group or others (mode 0770)",
        slot.display()
    );
    let mut launch = vec!["run"];
    launch.extend(session);
    launch.extend(["--", "true"]);
    let refused = sub(&env, &launch);
    let shown = sub(&env, &["capacity", "--session", "trust"]);
    std::fs::set_permissions(&slot, std::fs::Permissions::from_mode(0o700)).unwrap();
    let limited = sub(&env, &launch);
    env.ok(&["stop", &held]);
    one_line_failure(&refused, &why, "run into the full pool");
    one_line_failure(&shown, &why, "capacity");
    assert_eq!(limited.status.code(), Some(3), "{limited:?}");
}
