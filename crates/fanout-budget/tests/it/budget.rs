//! Single-process behaviour of budgets on real files.

extern crate subagents_fanout_budget as fanout_budget;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use fanout_budget::{
    BUDGET_ROOT_DIR, BudgetsRoot, CLAIMS_DIR, Descriptor, Error, LOCK_FILE, MANIFEST_FILE,
    OpenBudget, PERSISTED_FILE, Snapshot, create_budget, decode_env, read_persisted,
    read_persisted_in, write_persisted,
};
use serde_json::Value;
use test_support::{epoch_ms, mode};

fn managed_root(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("state").join(BUDGET_ROOT_DIR)
}

fn slot_files(budget: &OpenBudget) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(budget.descriptor().directory.join(CLAIMS_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn claim_record(budget: &OpenBudget, name: &str) -> Value {
    let path = budget.descriptor().directory.join(CLAIMS_DIR).join(name);
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn create_writes_private_manifest_and_claims_dir() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "a/b", 5)?;
    let d = budget.descriptor();
    let name = d.directory.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("a_b-") && name.len() == 4 + 36, "{name}");
    assert_eq!(d.directory, fs::canonicalize(&d.directory)?);
    assert_eq!((d.version, d.root_run_id.as_str(), d.limit), (1, "a/b", 5));
    assert_eq!(d.parent_path, None);

    let manifest_path = d.directory.join(MANIFEST_FILE);
    let text = fs::read_to_string(&manifest_path)?;
    assert!(
        text.ends_with("}\n") && !text.contains("\n "),
        "compact + newline: {text:?}"
    );
    let manifest: Value = serde_json::from_str(&text)?;
    let keys: Vec<&str> = manifest
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["version", "rootRunId", "limit", "createdAt"]);
    assert_eq!(manifest["limit"], 5);

    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&d.directory), 0o700);
    assert_eq!(mode(&d.directory.join(CLAIMS_DIR)), 0o700);
    assert_eq!(mode(&manifest_path), 0o600);
    assert_eq!(budget.snapshot()?, Snapshot::new(0, 5));
    Ok(())
}

#[test]
fn create_refuses_bad_limits_and_ids() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let zero = create_budget(&root, "r", 0).unwrap_err();
    assert_eq!(
        zero.to_string(),
        "Run fan-out limit must be a positive integer."
    );
    assert!(matches!(
        create_budget(&root, "r", 1_000_001),
        Err(Error::LimitTooLarge(_))
    ));
    // The largest limit itself is allowed.
    assert_eq!(
        create_budget(&root, "r", 1_000_000)?.snapshot()?.limit,
        1_000_000
    );
    assert!(matches!(
        create_budget(&root, "", 1),
        Err(Error::EmptyRootRunId)
    ));
    Ok(())
}

#[test]
fn claims_up_to_the_cap_then_rejects_with_the_reference_object() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r1", 2)?;
    assert_eq!(
        budget.claim(&["tasks[0]", "tasks[1]"])?,
        Snapshot::new(2, 2)
    );
    assert_eq!(slot_files(&budget), ["000000.json", "000001.json"]);

    let record = claim_record(&budget, "000001.json");
    let keys: Vec<&str> = record
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["version", "claimId", "path", "claimedAt"]);
    assert_eq!(record["path"], "tasks[1]");
    let slot = budget
        .descriptor()
        .directory
        .join(CLAIMS_DIR)
        .join("000000.json");
    assert_eq!(mode(&slot), 0o600);
    assert_eq!(mode(&budget.descriptor().directory.join(LOCK_FILE)), 0o600);

    let err = budget.claim(&["tasks[2]"]).unwrap_err();
    let rejection = err.rejection().expect("a limit rejection");
    assert_eq!(
        serde_json::to_string(rejection)?,
        r#"{"code":"RUN_FANOUT_LIMIT","path":"tasks[2]","requested":1,"used":2,"limit":2,"remaining":0}"#
    );
    assert_eq!(rejection.snapshot, Snapshot::new(2, 2));
    assert_eq!(budget.snapshot()?, Snapshot::new(2, 2));
    Ok(())
}

#[test]
fn created_at_and_claimed_at_are_epoch_milliseconds() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let before = epoch_ms();
    let budget = create_budget(&managed_root(&tmp), "r", 2)?;
    budget.claim(&["x"])?;
    let after = epoch_ms();
    let manifest: Value = serde_json::from_str(&fs::read_to_string(
        budget.descriptor().directory.join(MANIFEST_FILE),
    )?)?;
    let claim = claim_record(&budget, "000000.json");
    for stamp in [&manifest["createdAt"], &claim["claimedAt"]] {
        let ms = stamp.as_u64().expect("an integer");
        assert!(
            (before..=after).contains(&ms),
            "{ms} not in {before}..={after}"
        );
    }
    Ok(())
}

#[test]
fn a_batch_larger_than_what_remains_admits_nothing() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 3)?;
    budget.claim(&["chain[0]"])?;
    let err = budget.claim(&["a", "b", "c"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Run fan-out limit reached at c (1/3 used; 3 requested, 2 remaining). No children from this admission group were started. Start a new top-level run or raise config.maxSubagentSpawnsPerRun."
    );
    assert_eq!(slot_files(&budget), ["000000.json"]);
    assert_eq!(budget.snapshot()?, Snapshot::new(1, 3));
    Ok(())
}

#[test]
fn a_failed_commit_rolls_the_batch_back() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 4)?;
    budget.claim(&["first"])?;
    let err = budget
        .claim_with_commit(&["x", "y"], |after| {
            assert_eq!(*after, Snapshot::new(3, 4));
            Err::<(), _>("request could not be persisted".into())
        })
        .unwrap_err();
    assert!(matches!(err, Error::Commit(_)));
    assert_eq!(err.to_string(), "request could not be persisted");
    assert_eq!(slot_files(&budget), ["000000.json"]);
    let kept = budget.claim_with_commit(&["z"], |after| Ok(after.used))?;
    assert_eq!(kept, 2);
    Ok(())
}

#[test]
fn an_empty_batch_claims_nothing_and_still_commits() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 1)?;
    budget.claim(&["only"])?;
    let none: [&str; 0] = [];
    let seen = budget.claim_with_commit(&none, |s| Ok(*s))?;
    assert_eq!(seen, Snapshot::new(1, 1));
    assert_eq!(slot_files(&budget).len(), 1);
    Ok(())
}

#[test]
fn claims_are_qualified_with_the_parent_path() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let parent = create_budget(&root, "r", 4)?;
    let child = parent
        .descriptor()
        .child("tasks[0]")
        .with_parent_path("tasks[0]/1a2b3c4d");
    let nested = OpenBudget::open(&root, &child)?;
    nested.claim(&["single"])?;
    assert_eq!(
        claim_record(&nested, "000000.json")["path"],
        "tasks[0]/1a2b3c4d/single"
    );
    let err = nested.claim(&["a", "b", "c", "d"]).unwrap_err();
    assert_eq!(
        err.rejection().unwrap().rejection.path,
        "tasks[0]/1a2b3c4d/d"
    );
    Ok(())
}

#[test]
fn claims_directory_replaced_by_a_file_is_an_error_not_exhaustion() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 2)?;
    let claims = budget.descriptor().directory.join(CLAIMS_DIR);
    fs::remove_dir(&claims)?;
    fs::write(&claims, "not a directory")?;
    let err = budget.snapshot().unwrap_err();
    let text = err.to_string();
    let prefix = format!(
        "Run fan-out claims directory is unreadable at '{}': ",
        claims.display()
    );
    assert!(text.starts_with(&prefix), "{text}");
    assert!(
        text.contains("ENOTDIR") || text.contains("Not a directory"),
        "{text}"
    );
    assert!(
        budget
            .claim(&["x"])
            .unwrap_err()
            .to_string()
            .contains("claims directory is unreadable")
    );
    Ok(())
}

#[test]
fn a_symlink_in_place_of_the_admission_lock_is_refused_not_followed() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 2)?;
    let target = tmp.path().join("outside-lock");
    symlink(&target, budget.descriptor().directory.join(LOCK_FILE))?;
    let err = budget.claim(&["x"]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("failed to open admission lock '"),
        "{text}"
    );
    assert!(
        !target.exists(),
        "the link was followed: {target:?} created"
    );
    assert!(slot_files(&budget).is_empty());
    Ok(())
}

#[test]
fn a_process_started_during_the_commit_inherits_no_budget_handle() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 2)?;
    // As the launcher does: start a long-lived process while the claim
    // still holds the admission lock.
    let mut child = budget.claim_with_commit(&["x"], |_| {
        Command::new("sleep")
            .arg("30")
            .spawn()
            .map_err(|e| e.to_string().into())
    })?;
    // Neither the lock nor the budget's directory handles.
    let dir = &budget.descriptor().directory;
    let inherited: Vec<PathBuf> = fs::read_dir(format!("/proc/{}/fd", child.id()))?
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect();
    child.kill()?;
    child.wait()?;
    assert!(inherited.is_empty(), "the child holds {inherited:?}");
    assert_eq!(budget.claim(&["y"])?, Snapshot::new(2, 2));
    Ok(())
}

#[test]
fn a_descriptor_disagreeing_with_its_manifest_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 2)?;
    let higher = Descriptor {
        limit: 3,
        ..budget.descriptor().clone()
    };
    let err = OpenBudget::open(&root, &higher).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Run fan-out budget descriptor does not match its manifest."
    );
    let other_root_run = Descriptor {
        root_run_id: "someone-else".into(),
        ..budget.descriptor().clone()
    };
    assert!(matches!(
        OpenBudget::open(&root, &other_root_run),
        Err(Error::ManifestMismatch)
    ));
    let version_two = Descriptor {
        version: 2,
        ..budget.descriptor().clone()
    };
    let err = OpenBudget::open(&root, &version_two).unwrap_err();
    assert_eq!(err.to_string(), "Run fan-out budget descriptor is invalid.");
    let empty_parent = Descriptor {
        parent_path: Some(String::new()),
        ..budget.descriptor().clone()
    };
    assert_eq!(
        OpenBudget::open(&root, &empty_parent)?.descriptor(),
        budget.descriptor()
    );
    Ok(())
}

#[test]
fn a_budget_directory_symlinked_out_of_the_root_is_refused() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let real = create_budget(&root, "r", 2)?;
    // A look-alike budget outside the root, with a valid manifest.
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join(CLAIMS_DIR))?;
    fs::copy(
        real.descriptor().directory.join(MANIFEST_FILE),
        outside.join(MANIFEST_FILE),
    )?;
    let link = root.join("r-link");
    symlink(&outside, &link)?;
    let forged = Descriptor {
        directory: link,
        ..real.descriptor().clone()
    };
    let err = OpenBudget::open(&root, &forged).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Run fan-out budget directory resolves outside the managed budget root."
    );
    let missing = Descriptor {
        directory: root.join("nope"),
        ..real.descriptor().clone()
    };
    let err = OpenBudget::open(&root, &missing).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Run fan-out budget directory is unavailable: "),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_descriptor_naming_a_regular_file_is_an_unavailable_directory() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let real = create_budget(&root, "r", 2)?;
    let file = root.join("r-file");
    fs::write(&file, "not a budget")?;
    let forged = Descriptor {
        directory: file,
        ..real.descriptor().clone()
    };
    let text = OpenBudget::open(&root, &forged).unwrap_err().to_string();
    assert!(
        text.starts_with("Run fan-out budget directory is unavailable: "),
        "{text}"
    );
    assert!(
        text.contains("ENOTDIR") || text.contains("Not a directory"),
        "{text}"
    );
    Ok(())
}

#[test]
fn an_opened_budget_names_its_real_directory() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let real = create_budget(&root, "r", 2)?;
    let name = real.descriptor().directory.file_name().unwrap().to_owned();
    let roundabout = Descriptor {
        directory: root.join(".").join("..").join(BUDGET_ROOT_DIR).join(name),
        ..real.descriptor().clone()
    };
    let opened = OpenBudget::open(&root, &roundabout)?;
    assert_eq!(opened.descriptor().directory, real.descriptor().directory);
    assert_eq!(
        opened.descriptor().directory,
        fs::canonicalize(&roundabout.directory)?
    );
    Ok(())
}

#[test]
fn claims_replaced_by_a_symlink_after_open_are_not_followed() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "r", 2)?;
    let outside = tmp.path().join("outside-claims");
    fs::create_dir(&outside)?;
    let claims = budget.descriptor().directory.join(CLAIMS_DIR);
    fs::remove_dir(&claims)?;
    symlink(&outside, &claims)?;
    let text = budget.claim(&["x"]).unwrap_err().to_string();
    assert!(
        text.starts_with("Run fan-out claims directory is unreadable at '"),
        "{text}"
    );
    assert_eq!(fs::read_dir(&outside)?.count(), 0);
    Ok(())
}

#[test]
fn a_manifest_replaced_by_a_symlink_or_a_fifo_is_unreadable() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 2)?;
    let manifest = budget.descriptor().directory.join(MANIFEST_FILE);
    let copy = tmp.path().join("manifest-copy.json");
    fs::copy(&manifest, &copy)?;
    fs::remove_file(&manifest)?;
    symlink(&copy, &manifest)?;
    let text = OpenBudget::open(&root, budget.descriptor())
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("Run fan-out budget manifest is unreadable at '"),
        "{text}"
    );

    fs::remove_file(&manifest)?;
    assert!(Command::new("mkfifo").arg(&manifest).status()?.success());
    // Opening a FIFO for reading would wait for a writer that never comes:
    // the open runs on a thread so that a regression fails here, not hangs.
    let (tx, rx) = std::sync::mpsc::channel();
    let (root2, descriptor) = (root.clone(), budget.descriptor().clone());
    std::thread::spawn(move || {
        let _ = tx.send(OpenBudget::open(&root2, &descriptor).map(|_| ()));
    });
    let outcome = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("opening a budget whose manifest is a FIFO must not block");
    let text = outcome.unwrap_err().to_string();
    assert!(
        text.starts_with("Run fan-out budget manifest is unreadable at '"),
        "{text}"
    );
    Ok(())
}

#[test]
fn a_budget_directory_that_cannot_be_made_is_an_error_not_a_retry() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let calls = std::cell::Cell::new(0);
    // The first name is too long for the file system (ENAMETOOLONG); only a
    // retry would reach the second.
    let uuid = || {
        calls.set(calls.get() + 1);
        if calls.get() == 1 {
            "x".repeat(300)
        } else {
            format!("id-{}", calls.get())
        }
    };
    let sources = fanout_budget::Sources {
        now_ms: &|| 1,
        uuid: &uuid,
    };
    let err = fanout_budget::create_budget_with(&root, "r", 2, &sources).unwrap_err();
    assert!(
        err.to_string().starts_with("failed to create directory '"),
        "{err}"
    );
    assert_eq!(fs::read_dir(&root)?.count(), 0);
    Ok(())
}

#[test]
fn a_path_swapped_after_open_does_not_redirect_claims() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 2)?;
    let dir = budget.descriptor().directory.clone();
    let moved = tmp.path().join("moved-away");
    fs::rename(&dir, &moved)?;
    let decoy = tmp.path().join("decoy");
    fs::create_dir_all(decoy.join(CLAIMS_DIR))?;
    symlink(&decoy, &dir)?;
    budget.claim(&["x"])?;
    assert_eq!(fs::read_dir(decoy.join(CLAIMS_DIR))?.count(), 0);
    assert!(moved.join(CLAIMS_DIR).join("000000.json").exists());
    Ok(())
}

#[test]
fn env_encoding_round_trips_and_reports_bad_values() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 2)?;
    budget.claim(&["tasks[0]"])?;
    let child = budget.descriptor().child("tasks[0]");
    let value = child.to_env_value();
    assert!(
        !value.contains('=') && !value.contains('+') && !value.contains('/'),
        "{value}"
    );
    let decoded = decode_env(Some(&value), &root)?.expect("a descriptor");
    assert_eq!(decoded.descriptor(), &child);
    assert_eq!(decoded.snapshot()?, budget.snapshot()?);

    assert!(decode_env(None, &root)?.is_none());
    assert!(decode_env(Some(""), &root)?.is_none());
    let garbage = decode_env(Some("bm90IGpzb24"), &root).unwrap_err();
    assert!(
        garbage
            .to_string()
            .starts_with("Invalid inherited run fan-out budget: "),
        "{garbage}"
    );
    let other_root = tmp.path().join("other").join(BUDGET_ROOT_DIR);
    fs::create_dir_all(&other_root)?;
    let outside = decode_env(Some(&value), &other_root).unwrap_err();
    assert_eq!(
        outside.to_string(),
        "Invalid inherited run fan-out budget: Run fan-out budget directory resolves outside the managed budget root."
    );
    Ok(())
}

#[test]
fn integral_floats_are_integers_as_in_javascript() -> Result<()> {
    let with = |version: &str, limit: &str| {
        Descriptor::from_json(&format!(
            r#"{{"version":{version},"rootRunId":"r","directory":"/d","limit":{limit}}}"#
        ))
    };
    let parsed = with("1.0", "2.0").map_err(anyhow::Error::msg)?;
    assert_eq!((parsed.version, parsed.limit), (1, 2));
    for (version, limit) in [
        ("1", "2.5"),
        ("1", "-1"),
        ("1", "-1.0"),
        ("1", "1e300"),
        ("-1.0", "2"),
    ] {
        assert!(
            with(version, limit).is_err(),
            "version {version}, limit {limit}"
        );
    }
    let manifest = fanout_budget::Manifest::parse(
        r#"{"version":1.0,"rootRunId":"r","limit":3.0,"createdAt":5}"#,
        Path::new("/b"),
    )?;
    assert_eq!(manifest.limit, 3);
    Ok(())
}

#[test]
fn persisted_descriptor_round_trips_compact_with_newline() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 3)?;
    let run_dir = tmp.path().join("state/async-subagent-runs/run-1");
    assert!(read_persisted(&run_dir, &root)?.is_none(), "no run dir");
    let with_parent = budget.descriptor().with_parent_path("chain[0]");
    write_persisted(&run_dir, &root, &with_parent)?;
    let file = run_dir.join(PERSISTED_FILE);
    assert_eq!(
        fs::read_to_string(&file)?,
        format!("{}\n", with_parent.to_json())
    );
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&run_dir), 0o700);
    let read = read_persisted(&run_dir, &root)?.expect("persisted");
    assert_eq!(read.descriptor(), &with_parent);

    // A pretty-printed copy (our atomic-file style) reads the same.
    fs::write(&file, serde_json::to_string_pretty(&with_parent)?)?;
    assert_eq!(
        read_persisted(&run_dir, &root)?.unwrap().descriptor(),
        &with_parent
    );

    fs::write(&file, "{")?;
    let err = read_persisted(&run_dir, &root).unwrap_err();
    let prefix = format!(
        "Invalid persisted run fan-out budget '{}': ",
        file.display()
    );
    assert!(err.to_string().starts_with(&prefix), "{err}");
    Ok(())
}

#[test]
fn injected_sources_pin_the_directory_manifest_and_claims() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let ids = std::cell::Cell::new(0);
    let uuid = || {
        ids.set(ids.get() + 1);
        format!("id-{}", ids.get())
    };
    let sources = fanout_budget::Sources {
        now_ms: &|| 1234,
        uuid: &uuid,
    };
    // The first name is taken, so the next id is tried.
    fs::create_dir_all(root.join("r-id-1"))?;
    let budget = fanout_budget::create_budget_with(&root, "r", 2, &sources)?;
    assert_eq!(budget.descriptor().directory.file_name().unwrap(), "r-id-2");
    let manifest = fs::read_to_string(budget.descriptor().directory.join(MANIFEST_FILE))?;
    assert_eq!(
        manifest,
        "{\"version\":1,\"rootRunId\":\"r\",\"limit\":2,\"createdAt\":1234}\n"
    );
    budget.claim_using(&["single"], &sources)?;
    assert_eq!(
        claim_record(&budget, "000000.json"),
        serde_json::json!({"version": 1, "claimId": "id-3", "path": "single", "claimedAt": 1234})
    );
    Ok(())
}

#[test]
fn a_persisted_budget_of_a_moved_or_copied_root_resolves_under_the_new_root() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 3)?;
    let run_dir = tmp.path().join("state/async-subagent-runs/r");
    fs::create_dir_all(&run_dir)?;
    write_persisted(&run_dir, &root, budget.descriptor())?;
    let copy = tmp.path().join("copy");
    let copied = std::process::Command::new("cp")
        .args(["-a"])
        .arg(tmp.path().join("state"))
        .arg(&copy)
        .status()?;
    assert!(copied.success());
    let new_root = copy.join(BUDGET_ROOT_DIR);
    let new_run = copy.join("async-subagent-runs/r");
    let read = read_persisted(&new_run, &new_root)?.expect("persisted");
    assert!(
        read.descriptor()
            .directory
            .starts_with(fs::canonicalize(&new_root)?),
        "{:?}",
        read.descriptor().directory
    );
    // Moved: the old root is gone.
    fs::remove_dir_all(tmp.path().join("state"))?;
    assert!(read_persisted(&new_run, &new_root)?.is_some());
    // A same-named budget that is a symlink out of the new root stays refused.
    let name = budget
        .descriptor()
        .directory
        .file_name()
        .unwrap()
        .to_owned();
    let outside = tmp.path().join("outside");
    fs::rename(new_root.join(&name), &outside)?;
    symlink(&outside, new_root.join(&name))?;
    let err = read_persisted(&new_run, &new_root).unwrap_err();
    assert!(
        err.to_string()
            .contains("resolves outside the managed budget root"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_persisted_budget_recorded_under_another_layout_is_not_rebased() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let budget = create_budget(&root, "r", 3)?;
    let name = budget.descriptor().directory.file_name().unwrap();
    // Recorded under a directory that is not a budget root: only a budget
    // root's own layout is moved along with it.
    let recorded = Descriptor {
        directory: tmp.path().join("elsewhere").join(name),
        ..budget.descriptor().clone()
    };
    let run_dir = tmp.path().join("run");
    fs::create_dir_all(&run_dir)?;
    fs::write(
        run_dir.join(PERSISTED_FILE),
        format!("{}\n", recorded.to_json()),
    )?;
    let err = read_persisted(&run_dir, &root).unwrap_err();
    assert!(
        err.to_string()
            .contains("Run fan-out budget directory is unavailable"),
        "{err}"
    );
    // Recorded under another budget root's layout, outside this root, with
    // no budget of that name here: refused for where it is, not for a
    // missing look-alike.
    let other_root = tmp.path().join("other").join(BUDGET_ROOT_DIR);
    fs::create_dir_all(&other_root)?;
    let elsewhere = create_budget(&other_root, "r", 3)?;
    fs::write(
        run_dir.join(PERSISTED_FILE),
        format!("{}\n", elsewhere.descriptor().to_json()),
    )?;
    let err = read_persisted(&run_dir, &root).unwrap_err();
    assert!(
        err.to_string()
            .contains("resolves outside the managed budget root"),
        "{err}"
    );
    Ok(())
}

#[test]
fn an_unreadable_persisted_descriptor_is_an_error_not_absent() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    create_budget(&root, "r", 3)?;
    let run_dir = tmp.path().join("run");
    fs::create_dir_all(run_dir.join(PERSISTED_FILE))?;
    let err = read_persisted(&run_dir, &root).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Invalid persisted run fan-out budget '"),
        "{err}"
    );
    // Only a missing file (or run directory) means "none".
    assert!(read_persisted(&tmp.path().join("no-run"), &root)?.is_none());
    Ok(())
}

#[test]
fn a_budgets_root_resolved_once_opens_each_budget_and_a_missing_one_opens_none() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let root = managed_root(&tmp);
    let first = create_budget(&root, "r1", 2)?;
    let second = create_budget(&root, "r2", 3)?;
    let resolved = BudgetsRoot::resolve(&root);
    assert_eq!(resolved.path(), root.as_path());
    for budget in [&first, &second] {
        let opened = OpenBudget::open_in(&resolved, budget.descriptor())?;
        assert_eq!(opened.descriptor(), budget.descriptor());
    }
    let run_dir = tmp.path().join("run");
    fs::create_dir_all(&run_dir)?;
    write_persisted(&run_dir, &root, second.descriptor())?;
    let read = read_persisted_in(&run_dir, &resolved)?.expect("persisted");
    assert_eq!(read.descriptor().limit, 3);
    // A root that does not resolve refuses every budget, naming why.
    let missing = BudgetsRoot::resolve(&tmp.path().join("nowhere"));
    let err = OpenBudget::open_in(&missing, first.descriptor()).unwrap_err();
    // The OS's own words, as when the root was resolved per budget.
    let why = fs::canonicalize(tmp.path().join("nowhere")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Run fan-out budget directory is unavailable: {why}")
    );
    Ok(())
}

#[test]
fn a_claims_path_that_is_not_a_directory_is_refused_as_unreadable() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let budget = create_budget(&managed_root(&tmp), "root", 4)?;
    let claims = budget.descriptor().directory.join(CLAIMS_DIR);
    fs::remove_dir(&claims)?;
    fs::write(&claims, "{}")?;
    match budget.claim(&["tasks[0]"]) {
        Err(Error::ClaimsUnreadable { path, .. }) => assert_eq!(path, claims),
        other => panic!("expected the claims directory refused, got {other:?}"),
    }
    Ok(())
}
