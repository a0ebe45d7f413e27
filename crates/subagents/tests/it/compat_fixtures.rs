//! Our readers against fixtures recorded from pi-subagents 0.49.0 itself
//! (`crates/subagents/tests/compat/generate.sh`): files its writers produced and the verdicts
//! of its readers. Each case must get the same verdict from us, and an
//! invalid one the same complaint. No Node needed: the fixtures are committed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use launcher::validate::{Kind, check};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/compat/fixtures")
        .join(name);
    serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap()
}

/// Placeholder values of this machine and moment.
struct Fill {
    root: PathBuf,
    live_pid: u32,
    dead_pid: u32,
    now: u64,
}

impl Fill {
    fn new(root: &Path) -> Self {
        let mut child = Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        Self {
            root: root.to_path_buf(),
            live_pid: std::process::id(),
            dead_pid,
            now: status::now_ms(),
        }
    }

    fn apply(&self, template: &str) -> String {
        let mut out = template
            .replace("${ROOT}", self.root.to_str().unwrap())
            .replace("\"${LIVE_PID}\"", &self.live_pid.to_string())
            .replace("\"${DEAD_PID}\"", &self.dead_pid.to_string());
        while let Some(start) = out.find("\"${AGO:") {
            let end = start + out[start..].find("}\"").unwrap();
            let ms: u64 = out[start + 7..end].parse().unwrap();
            out.replace_range(start..end + 2, &(self.now - ms).to_string());
        }
        out
    }
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// The reference's complaint without the file it names and without
/// platform detail: the text after the `'<file>': ` prefix, up to a detail.
fn complaint(error: &str) -> &str {
    let core = error.split_once("': ").map_or(error, |(_, rest)| rest);
    let core = core.split(" at '").next().unwrap();
    let core = core.split(" in '").next().unwrap();
    core.split(": ").next().unwrap()
}

/// Recreates the budget directories the reference wrote.
fn plant_budget(fill: &Fill, budget: &Value) {
    let dir = PathBuf::from(fill.apply(budget["directory"].as_str().unwrap()));
    write(
        &dir.join("manifest.json"),
        budget["manifest"].as_str().unwrap(),
    );
    fs::create_dir_all(dir.join("claims")).unwrap();
    if let Some(claims) = budget["claims"].as_object() {
        for (name, text) in claims {
            write(&dir.join("claims").join(name), text.as_str().unwrap());
        }
    }
}

fn assert_same_verdict(kind: Kind, fixture_name: &str, file_name: &str, setup: impl Fn(&Fill)) {
    let fixture = fixture(fixture_name);
    let tmp = tempfile::tempdir().unwrap();
    let fill = Fill::new(tmp.path());
    setup(&fill);
    let layout = status::Layout::new(tmp.path());
    let file = tmp
        .path()
        .join("async-subagent-runs/fixture")
        .join(file_name);
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() > 3);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        write(&file, &fill.apply(case["content"].as_str().unwrap()));
        let ours = check(&layout, kind, &file);
        let valid = case["valid"].as_bool().unwrap();
        assert_eq!(
            ours.is_ok(),
            valid,
            "{fixture_name} {name}: ours {ours:?}, reference {case}"
        );
        if let (Err(ours), Some(theirs)) = (&ours, case["error"].as_str()) {
            let expected = complaint(theirs);
            assert!(
                ours.contains(expected),
                "{fixture_name} {name}: ours {ours:?} lacks the reference's {expected:?}"
            );
        }
    }
}

#[test]
fn fanout_descriptors_get_the_reference_verdicts() {
    assert_same_verdict(
        Kind::FanoutDescriptor,
        "fanout.json",
        "run-fanout-budget.json",
        |fill| {
            let fixture = fixture("fanout.json");
            plant_budget(fill, &fixture["budget"]);
            plant_budget(fill, &fixture["brokenBudget"]);
        },
    );
}

#[test]
fn a_budget_written_by_the_reference_counts_the_same() {
    let fixture = fixture("fanout.json");
    let tmp = tempfile::tempdir().unwrap();
    let fill = Fill::new(tmp.path());
    plant_budget(&fill, &fixture["budget"]);
    let dir = PathBuf::from(fill.apply(fixture["budget"]["directory"].as_str().unwrap()));
    let manifest = fanout_budget::read_manifest(&dir).unwrap();
    let persisted = fill.apply(fixture["cases"][0]["content"].as_str().unwrap());
    let descriptor = fanout_budget::Descriptor::from_json(&persisted).unwrap();
    assert_eq!(manifest.limit, descriptor.limit);
    let budget =
        fanout_budget::OpenBudget::open(&tmp.path().join("run-fanout-budgets"), &descriptor)
            .unwrap();
    let snapshot = serde_json::to_value(budget.snapshot().unwrap()).unwrap();
    assert_eq!(snapshot, fixture["budget"]["snapshot"]);
}

#[test]
fn recovery_descriptors_get_the_reference_verdicts() {
    assert_same_verdict(
        Kind::Recovery,
        "recovery.json",
        "recovery-descriptor.json",
        |fill| plant_budget(fill, &fixture("fanout.json")["budget"]),
    );
}

#[test]
fn process_terminal_proofs_get_the_reference_verdicts() {
    assert_same_verdict(
        Kind::ProcessTerminal,
        "process-terminal.json",
        "process-terminal.json",
        |_| {},
    );
    // What the reference's finalizer wrote is a proof we read.
    let fixture = fixture("process-terminal.json");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("process-terminal.json");
    write(&file, fixture["finalize"]["file"].as_str().unwrap());
    let layout = status::Layout::new(tmp.path());
    check(&layout, Kind::ProcessTerminal, &file).unwrap();
}

#[test]
fn capacity_owners_written_by_the_reference_are_read_and_counted_the_same() {
    let fixture = fixture("capacity.json");
    let tmp = tempfile::tempdir().unwrap();
    let fill = Fill::new(tmp.path());
    let layout = status::Layout::new(tmp.path());
    let owners = fixture["owners"].as_object().unwrap();
    assert!(!owners.is_empty());
    for (relative, text) in owners {
        let file = layout.capacity_dir().join(relative);
        write(&file, &fill.apply(text.as_str().unwrap()));
        check(&layout, Kind::CapacityOwner, &file).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(tmp.path())
        .args([
            "capacity",
            "--session",
            "fixture-session",
            "--limit",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ours: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ours["used"], fixture["snapshot"]["used"], "{ours}");
    assert_eq!(ours["limit"], fixture["snapshot"]["limit"]);
    assert_eq!(
        ours["slots"][0]["release"]["state"], fixture["release"]["state"],
        "{ours}"
    );
}

/// `subagents --root <reference root> list --all --json` reports each run in
/// the state the reference's own listing reports, and rewrites (status and
/// result files) exactly what the reference rewrote.
#[test]
fn listing_a_reference_root_matches_the_reference_and_rewrites_only_what_it_does() {
    let fixture = fixture("listing.json");
    let tmp = tempfile::tempdir().unwrap();
    let fill = Fill::new(tmp.path());
    let runs = tmp.path().join("async-subagent-runs");
    let results = tmp.path().join("async-subagent-results");
    let cases = fixture["runs"].as_array().unwrap();
    for case in cases {
        let id = case["id"].as_str().unwrap();
        write(
            &runs.join(id).join("status.json"),
            &fill.apply(case["status"].as_str().unwrap()),
        );
        if let Some(result) = case["result"].as_str() {
            write(&results.join(format!("{id}.json")), &fill.apply(result));
        }
    }
    let before: Vec<Vec<u8>> = cases
        .iter()
        .map(|c| fs::read(runs.join(c["id"].as_str().unwrap()).join("status.json")).unwrap())
        .collect();

    let out = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(tmp.path())
        .args(["list", "--all", "--json"])
        .env_remove("SUBAGENTS_SESSION_ID")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();

    for (case, before) in cases.iter().zip(before) {
        let id = case["id"].as_str().unwrap();
        let expect = &case["expect"];
        let summary = listed
            .iter()
            .find(|s| s["id"] == id || s["runId"] == id)
            .unwrap_or_else(|| panic!("{id} not listed"));
        assert_eq!(summary["state"], expect["state"], "{id}: {summary}");
        let status_file = runs.join(id).join("status.json");
        let after = fs::read(&status_file).unwrap();
        assert_eq!(
            after != before,
            expect["rewritten"] == true,
            "{id} rewritten?"
        );
        let status: Value = serde_json::from_slice(&after).unwrap();
        let steps: Vec<&Value> = status["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["status"])
            .collect();
        let expected_steps: Vec<&Value> = expect["stepStates"].as_array().unwrap().iter().collect();
        assert_eq!(steps, expected_steps, "{id} steps");
        if expect["proof"].is_object() {
            assert_eq!(
                status["processTerminal"]["state"], expect["proof"]["state"],
                "{id}"
            );
            let reason = status["processTerminal"]
                .get("reason")
                .cloned()
                .unwrap_or(Value::Null);
            assert_eq!(reason, expect["proof"]["reason"], "{id}");
        }
        let result_file = results.join(format!("{id}.json"));
        let written = case["result"].is_null() && result_file.exists();
        assert_eq!(
            written,
            expect["resultFileWritten"] == true,
            "{id} result file written?"
        );
        let result_state = fs::read(&result_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map_or(Value::Null, |r| r["state"].clone());
        assert_eq!(result_state, expect["resultFileState"], "{id} result state");
    }
    // The text listing: the same blocks as the reference's formatter. Runs
    // repaired in the same listing tie on their sort time, and each side
    // breaks ties its own way, so blocks are compared as a set.
    let out = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("--root")
        .arg(tmp.path())
        .args(["list", "--all"])
        .env_remove("SUBAGENTS_SESSION_ID")
        .output()
        .unwrap();
    let ours =
        String::from_utf8_lossy(&out.stdout).replace(tmp.path().to_str().unwrap(), "${ROOT}/list");
    let blocks = |text: &str| {
        let mut blocks: Vec<String> = text.trim().split("\n\n").map(str::to_owned).collect();
        blocks.sort();
        blocks
    };
    assert_eq!(
        blocks(&ours),
        blocks(fixture["formatted"].as_str().unwrap())
    );
}

/// The generator fed files our crates wrote to the reference's readers; the
/// record must list every artifact kind as accepted.
#[test]
fn the_reference_accepts_every_kind_of_file_we_write() {
    let record = fixture("ours-read-by-reference.json");
    let kinds = record["kinds"].as_object().unwrap();
    for kind in [
        "fanout-descriptor",
        "fanout-manifest-and-claims",
        "fanout-claim-after-ours",
        "run-fanout-budget.json",
        "status.json",
        "process-terminal.json",
        "process-terminal-candidate.json",
        "capacity-owner",
        "recovery-descriptor.json",
    ] {
        let entry = kinds
            .get(kind)
            .unwrap_or_else(|| panic!("{kind} not recorded"));
        assert_eq!(entry["accepted"], true, "{kind}: {entry}");
    }
}
