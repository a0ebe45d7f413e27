//! Mixed use with the real pi-subagents 0.49.0 on one root.
//!
//! These tests run the package's own code with Node (`crates/subagents/tests/compat/*.mts`).
//! They need `node` and the package installed by `crates/subagents/tests/compat/install-ref.sh`
//! (into `$PI_SUBAGENTS_REF`, default `target/compat-ref`); without them each
//! test prints why and passes without checking anything.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::poll;

/// The installed reference: the scratch directory holding `node_modules`.
fn reference() -> Option<PathBuf> {
    let dir = std::env::var_os("PI_SUBAGENTS_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/compat-ref"));
    let pkg = dir.join("node_modules/pi-subagents/package.json");
    let node = Command::new("node").arg("--version").output();
    match (node, pkg.is_file() && dir.join("node_modules/tsx").is_dir()) {
        (Ok(out), true) if out.status.success() => Some(dir),
        (Ok(out), _) if out.status.success() => {
            eprintln!(
                "skipped: pi-subagents 0.49.0 is not installed in {} (run crates/subagents/tests/compat/install-ref.sh)",
                dir.display()
            );
            None
        }
        _ => {
            eprintln!("skipped: node is not installed");
            None
        }
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/compat")
        .join(name)
}

/// A temp dir standing for `$TMPDIR` and the state root inside it that the
/// reference uses as its own: `$TMPDIR/pi-subagents-uid-<uid>`.
struct SharedRoot {
    tmp: tempfile::TempDir,
    root: PathBuf,
}

impl SharedRoot {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let uid = unsafe { libc::getuid() };
        let root = tmp.path().join(format!("pi-subagents-uid-{uid}"));
        fs::create_dir_all(&root).unwrap();
        Self { tmp, root }
    }

    fn ours(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
        command
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .env_remove("SUBAGENTS_RUN_FANOUT_BUDGET")
            .env_remove("PI_SUBAGENT_RUN_FANOUT_BUDGET")
            .env_remove("SUBAGENTS_SESSION_ID");
        command
    }

    fn node(&self, reference: &Path, script_name: &str, args: &[&Path]) -> Command {
        let mut command = Command::new("node");
        command
            .current_dir(reference)
            .arg("--import")
            .arg("tsx")
            .arg(script(script_name))
            .args(args)
            .env("TMPDIR", self.tmp.path())
            .env(
                "PI_SUBAGENTS_PKG",
                reference.join("node_modules/pi-subagents"),
            );
        command
    }

    fn create_budget(&self, limit: u64) -> (PathBuf, PathBuf) {
        let out = self
            .ours(&[
                "budget",
                "create",
                "--root-run-id",
                "mixed",
                "--limit",
                &limit.to_string(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let descriptor: Value = serde_json::from_slice(&out.stdout).unwrap();
        let file = self.tmp.path().join("descriptor.json");
        fs::write(&file, &out.stdout).unwrap();
        let dir = PathBuf::from(descriptor["directory"].as_str().unwrap());
        (file, dir)
    }
}

fn slot_count(budget_dir: &Path) -> usize {
    fs::read_dir(budget_dir.join("claims")).unwrap().count()
}

fn ready_count(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("start.ready-"))
        })
        .count()
}

fn json_line(child: Child) -> (bool, Value) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON value ({e}): {text:?}; stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), value)
}

#[test]
fn a_mixed_race_on_one_budget_admits_exactly_the_limit_without_timeouts() {
    let Some(reference) = reference() else { return };
    const EACH: usize = 5;
    const LIMIT: u64 = 6;
    let shared = SharedRoot::new();
    let (descriptor, budget_dir) = shared.create_budget(LIMIT);
    let start = shared.tmp.path().join("start");

    let theirs: Vec<Child> = (0..EACH)
        .map(|i| {
            let label = PathBuf::from(format!("ref-{i}"));
            shared
                .node(&reference, "claim.mts", &[&descriptor, &label, &start])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Every reference claimer has loaded the package and waits for the start file.
    poll(Duration::from_secs(120), || {
        ready_count(shared.tmp.path()) == EACH
    });
    fs::write(&start, "").unwrap();
    let ours: Vec<Child> = (0..EACH)
        .map(|i| {
            let label = format!("ours-{i}");
            shared
                .ours(&["budget", "claim", "--descriptor"])
                .arg(&descriptor)
                .args(["--path", &label, "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();

    let mut admitted = 0;
    for child in theirs {
        let (_, line) = json_line(child);
        if line["ok"] == true {
            admitted += 1;
        } else {
            assert_eq!(line["rejection"]["code"], "RUN_FANOUT_LIMIT", "{line}");
        }
        eprintln!("reference claim: {line}");
    }
    for child in ours {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        match out.status.code() {
            Some(0) => admitted += 1,
            Some(3) => assert_eq!(line["code"], "RUN_FANOUT_LIMIT", "{line}"),
            other => panic!("our claim exited {other:?}: {line} {out:?}"),
        }
    }
    assert_eq!(admitted, LIMIT as usize);
    assert_eq!(slot_count(&budget_dir), LIMIT as usize);
    assert!(!budget_dir.join("admission.lock").exists(), "no lock left");
}

#[test]
fn the_reference_claims_at_once_after_ours() {
    let Some(reference) = reference() else { return };
    let shared = SharedRoot::new();
    let (descriptor, budget_dir) = shared.create_budget(4);
    let out = shared
        .ours(&["budget", "claim", "--path", "ours", "--descriptor"])
        .arg(&descriptor)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!budget_dir.join("admission.lock").exists());

    let label = PathBuf::from("theirs");
    let child = shared
        .node(&reference, "claim.mts", &[&descriptor, &label])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, line) = json_line(child);
    eprintln!("reference claim after ours: {line}");
    assert_eq!(line["ok"], true, "{line}");
    assert_eq!(line["snapshot"]["used"], 2);
    assert_eq!(slot_count(&budget_dir), 2);
}

/// Runs `child.mts` as the COMMAND of one of our runs on `root` (with
/// `TMPDIR` = `tmpdir` for us and the child); returns its JSON line and the
/// run's budget snapshot.
fn pi_child_in_our_run(reference: &Path, root: &Path, tmpdir: &Path) -> (Value, Value) {
    let pkg = reference.join("node_modules/pi-subagents");
    let out = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(root)
        .args(["run", "--json", "--wait", "--cwd"])
        .arg(reference)
        .args(["--", "node", "--import", "tsx"])
        .arg(script("child.mts"))
        .env("TMPDIR", tmpdir)
        .env("PI_SUBAGENTS_PKG", &pkg)
        .env_remove("SUBAGENTS_RUN_FANOUT_BUDGET")
        .env_remove("PI_SUBAGENT_RUN_FANOUT_BUDGET")
        .env_remove("SUBAGENTS_SESSION_ID")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let run_id = text
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["runId"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no run id: {out:?}"));
    let run_dir = root.join("async-subagent-runs").join(&run_id);
    let output = fs::read_to_string(run_dir.join("output-0.log"))
        .or_else(|_| fs::read_to_string(run_dir.join("external-0.stdout.log")))
        .unwrap();
    let line: Value = serde_json::from_str(output.trim().lines().last().unwrap()).unwrap();
    let show = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(root)
        .args(["budget", "show", &run_id, "--json"])
        .output()
        .unwrap();
    assert!(show.status.success(), "{show:?}");
    (line, serde_json::from_slice(&show.stdout).unwrap())
}

#[test]
fn a_pi_child_in_a_run_on_the_reference_root_counts_against_the_run_budget() {
    let Some(reference) = reference() else { return };
    let shared = SharedRoot::new();
    let (line, snapshot) = pi_child_in_our_run(&reference, &shared.root, shared.tmp.path());
    eprintln!("pi child: {line}; run budget after: {snapshot}");
    assert_eq!(line["hasEnv"], true, "{line}");
    assert!(line.get("error").is_none(), "{line}");
    // The child's claim is on the run's own budget: it sees the same count.
    assert_eq!(
        line["snapshot"]["used"], snapshot["used"],
        "{line} {snapshot}"
    );
    assert_eq!(line["snapshot"]["limit"], snapshot["limit"]);
}

#[test]
fn a_pi_child_in_a_run_elsewhere_gets_no_reference_budget_and_still_starts() {
    let Some(reference) = reference() else { return };
    let shared = SharedRoot::new();
    let elsewhere = shared.tmp.path().join("our-own-root");
    let (line, _) = pi_child_in_our_run(&reference, &elsewhere, shared.tmp.path());
    eprintln!("pi child: {line}");
    // Exported there, the package would refuse it ("outside the managed
    // budget root") and the child would fail.
    assert_eq!(line["hasEnv"], false, "{line}");
    assert!(line.get("error").is_none(), "{line}");
}
