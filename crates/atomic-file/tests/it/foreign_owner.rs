//! `--allow-shared-root`: once trusted, other users' files and shared
//! directories are accepted. Alone in a process of its own
//! (`reexec::alone`) because the setting is process-wide.

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;
use std::os::unix::fs::PermissionsExt;

use atomic_file::read::{
    allow_foreign_owner, check_private_dir, set_allow_foreign_owner, trusted_owner,
};

#[test]
fn allowing_foreign_owners_trusts_shared_directories_and_other_users() {
    if !reexec::alone(&reexec::test_name(
        module_path!(),
        "allowing_foreign_owners_trusts_shared_directories_and_other_users",
    )) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    // SAFETY: geteuid has no failure modes and no memory effects.
    let other = if unsafe { libc::geteuid() } == 4242 {
        4243
    } else {
        4242
    };
    assert!(!allow_foreign_owner());
    assert!(check_private_dir(&dir).is_err());
    assert!(!trusted_owner(other));

    set_allow_foreign_owner(true);
    assert!(allow_foreign_owner());
    assert!(check_private_dir(&dir).is_ok());
    assert!(trusted_owner(other));

    set_allow_foreign_owner(false);
    assert!(!allow_foreign_owner());
    assert!(check_private_dir(&dir).is_err());
}
