//! Error kinds callers branch on, removal, and directory syncs, against real
//! files (these killed the survivors of a cargo-mutants run).

extern crate subagents_atomic_file as atomic_file;
use atomic_file::{create_new_private, remove_if_exists, sync_dir};

#[test]
fn an_existing_file_is_already_exists_and_not_not_found() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("claim.json");
    create_new_private(&path, b"first").unwrap();
    let err = create_new_private(&path, b"second").unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    assert!(!err.is_not_found(), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"first", "never overwritten");
}

#[test]
fn a_missing_directory_is_not_found_and_not_already_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("missing-dir/claim.json");
    let err = create_new_private(&path, b"x").unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(!err.is_already_exists(), "{err}");
    assert!(err.to_string().contains("missing-dir"), "{err}");
}

#[test]
fn remove_if_exists_removes_and_tolerates_only_absence() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("marker");
    std::fs::write(&path, "").unwrap();
    remove_if_exists(&path).unwrap();
    assert!(!path.exists(), "the file is gone");
    remove_if_exists(&path).unwrap();
    // Anything but "not found" is an error: here, a directory in the way.
    let dir = tmp.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let err = remove_if_exists(&dir).unwrap_err();
    assert!(err.to_string().starts_with("failed to remove"), "{err}");
    assert!(dir.exists());
}

#[test]
fn syncing_a_missing_directory_fails() {
    let tmp = tempfile::tempdir().unwrap();
    sync_dir(tmp.path()).unwrap();
    let err = sync_dir(&tmp.path().join("gone")).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}
