//! The launch contract and its digest binding, against real files.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use recovery::{
    ContractError, LaunchContract, RecoveryDescriptor, RunFanoutBudget, load_recovery,
    parse_launch_contract, persist_recovery, read_descriptor, read_launch_contract, sha256_hex,
};
use serde_json::json;

const TASK: &str = "Refactor the parser and keep the secret phrase purple-elephant-42";

fn descriptor() -> RecoveryDescriptor {
    serde_json::from_value(json!({
        "version": 1,
        "runFanoutBudget": {"version": 1, "rootRunId": "r1", "directory": "/b/r1", "limit": 64},
        "sourceRunId": "r1", "agent": "worker", "cwd": "/work",
        "systemPromptMode": "append", "inheritProjectContext": true, "inheritSkills": true,
        "outputMode": "inline", "maxSubagentDepth": 2, "share": false
    }))
    .unwrap()
}

fn contract() -> LaunchContract {
    LaunchContract {
        version: 1,
        run_id: "r1".into(),
        agent: "worker".into(),
        cwd: "/work".into(),
        command: vec!["pi".into(), "--task-file".into(), "{task_file}".into()],
        env: BTreeMap::from([("PI_MODEL".into(), "sonnet".into())]),
        timeout_ms: Some(1_800_000),
        session_id: Some("session-1".into()),
    }
}

#[test]
fn persisted_contract_reads_back_through_the_descriptor_digest() {
    let dir = tempfile::tempdir().unwrap();
    let mut desc = descriptor();
    let files = persist_recovery(dir.path(), &contract(), &mut desc, TASK).unwrap();
    assert_eq!(files.digest.len(), 64);
    assert!(
        files
            .digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(
        sha256_hex(&fs::read(&files.contract_path).unwrap()),
        files.digest
    );
    let read = read_descriptor(dir.path()).unwrap().unwrap();
    assert_eq!(
        read.launch_contract_digest.as_deref(),
        Some(files.digest.as_str())
    );
    assert_eq!(read_launch_contract(dir.path(), &read).unwrap(), contract());
    for path in [&files.contract_path, &files.descriptor_path] {
        assert_eq!(
            fs::metadata(path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let text = fs::read_to_string(path).unwrap();
        assert!(!text.contains("purple-elephant-42"), "{}", path.display());
        assert!(!text.ends_with('\n'));
    }
}

#[test]
fn load_recovery_reads_both_files_and_applies_the_budget_check() {
    let dir = tempfile::tempdir().unwrap();
    assert!(load_recovery(dir.path(), None).unwrap().is_none());
    let files = persist_recovery(dir.path(), &contract(), &mut descriptor(), TASK).unwrap();
    let loaded = load_recovery(dir.path(), None).unwrap().unwrap();
    assert_eq!(loaded.contract, contract());
    let missing =
        |_: &RunFanoutBudget| Err("Run fan-out budget directory is unavailable: ENOENT".to_owned());
    let err = load_recovery(dir.path(), Some(&missing)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Invalid async recovery descriptor '{}': Run fan-out budget directory is unavailable: ENOENT",
            files.descriptor_path.display()
        )
    );
}

#[test]
fn tampered_contract_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut desc = descriptor();
    let files = persist_recovery(dir.path(), &contract(), &mut desc, TASK).unwrap();
    let text = fs::read_to_string(&files.contract_path).unwrap();
    fs::write(&files.contract_path, text.replace("/work", "/tmp/evil")).unwrap();
    let err = read_launch_contract(dir.path(), &desc).unwrap_err();
    assert!(matches!(err, ContractError::DigestMismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&files.contract_path.display().to_string()),
        "{err}"
    );

    let mut undigested = desc.clone();
    undigested.launch_contract_digest = None;
    assert!(matches!(
        read_launch_contract(dir.path(), &undigested).unwrap_err(),
        ContractError::DigestMissing { .. }
    ));
}

#[test]
fn task_text_in_the_contract_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut leaky = contract();
    leaky.command.push(format!("--prompt={TASK}"));
    let err = persist_recovery(dir.path(), &leaky, &mut descriptor(), TASK).unwrap_err();
    assert!(matches!(err, ContractError::TaskText { .. }), "{err}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);

    let mut desc = descriptor();
    desc.system_prompt = Some(TASK.into());
    let err = persist_recovery(dir.path(), &contract(), &mut desc, TASK).unwrap_err();
    assert!(matches!(err, ContractError::TaskText { .. }), "{err}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn strict_reader_refuses_unknown_fields_and_wrong_types() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("launch-contract.json");
    let good = serde_json::to_value(contract()).unwrap();
    let cases = [
        ("task", json!("do it"), "unknown field 'task'."),
        (
            "timeoutMs",
            json!("30m"),
            "timeoutMs must be a positive integer.",
        ),
        (
            "command",
            json!([]),
            "command must be an array of strings with a non-empty program.",
        ),
        (
            "env",
            json!({"A": 1}),
            "env must map variable names (no '=') to strings.",
        ),
        ("version", json!(2), "version must be 1."),
    ];
    for (key, value, detail) in cases {
        let mut bad = good.clone();
        bad.as_object_mut().unwrap().insert(key.into(), value);
        fs::write(&path, serde_json::to_vec_pretty(&bad).unwrap()).unwrap();
        let err = parse_launch_contract(&fs::read(&path).unwrap(), &path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Invalid launch contract '{}': {detail}", path.display())
        );
    }
}

#[test]
fn a_contract_the_reader_refuses_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = contract();
    bad.command.clear();
    let err = persist_recovery(dir.path(), &bad, &mut descriptor(), "").unwrap_err();
    assert!(matches!(err, ContractError::Invalid { .. }), "{err}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}
