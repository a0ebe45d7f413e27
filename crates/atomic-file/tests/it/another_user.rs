//! The owner rule for a user other than root: its own files are trusted,
//! another user's are not. The suite runs as root, where every file a
//! test makes is root's and so trusted either way; this test becomes
//! `nobody` in a re-execution of this binary to tell the rules apart.
//! Skipped (with the reason printed) when not run as root, or when
//! `nobody` cannot run this binary (a private build directory).

use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;
use atomic_file::read::{ReadError, read_file, trusted_owner};

const NOBODY: u32 = 65534;
const DIR_ENV: &str = "ATOMIC_FILE_ANOTHER_USER_DIR";

#[test]
fn a_user_other_than_root_trusts_its_own_files_and_roots_only() {
    let name = "a_user_other_than_root_trusts_its_own_files_and_roots_only";
    let test = reexec::test_name(module_path!(), name);
    if reexec::is_rerun(&test) {
        let dir = PathBuf::from(std::env::var_os(DIR_ENV).unwrap());
        // SAFETY: geteuid has no failure modes.
        let me = unsafe { libc::geteuid() };
        assert_eq!(me, NOBODY);
        assert!(trusted_owner(me));
        assert!(trusted_owner(0));
        assert!(!trusted_owner(1000));
        let own = dir.join("own.json");
        atomic_file::write_private(&own, b"{\"mine\":true}").unwrap();
        assert_eq!(read_file(&own).unwrap(), b"{\"mine\":true}");
        // Root's file, readable by all: trusted.
        assert_eq!(read_file(&dir.join("roots.json")).unwrap(), b"{}");
        match read_file(&dir.join("daemons.json")) {
            Err(ReadError::ForeignOwner { uid: 1, .. }) => {}
            other => panic!("another user's file was not refused: {other:?}"),
        }
        std::fs::write(dir.join("done"), "").unwrap();
        return;
    }
    // SAFETY: geteuid has no failure modes.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: only root can become another user");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("home");
    std::fs::create_dir(&dir).unwrap();
    chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::write(dir.join("roots.json"), "{}").unwrap();
    let daemons = dir.join("daemons.json");
    std::fs::write(&daemons, "{}").unwrap();
    chown(&daemons, Some(1), Some(1)).unwrap();
    // The temp directory itself is root's and 0700: let nobody through.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let mut rerun = reexec::rerun(&test);
    rerun
        .env(DIR_ENV, &dir)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir(&dir);
    let out = match rerun.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            eprintln!("skipped: nobody cannot run this test binary: {e}");
            return;
        }
        Err(e) => panic!("failed to run the test as nobody: {e}"),
    };
    assert!(
        reexec::passed_one(&out) && dir.join("done").exists(),
        "the test failed as nobody: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
