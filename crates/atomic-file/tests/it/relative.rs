//! A bare file name (no directory part) is written relative to the current
//! directory, whose fsync must then target "." rather than "". Alone in a
//! process of its own (`reexec::alone`) because it changes the process's
//! current directory.

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;
#[test]
fn a_bare_file_name_is_written_in_the_current_directory() {
    if !reexec::alone(&reexec::test_name(
        module_path!(),
        "a_bare_file_name_is_written_in_the_current_directory",
    )) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::env::set_current_dir(tmp.path()).unwrap();
    atomic_file::create_new_private(std::path::Path::new("claim.json"), b"x").unwrap();
    atomic_file::write_private(std::path::Path::new("state.json"), b"y").unwrap();
    assert_eq!(std::fs::read(tmp.path().join("claim.json")).unwrap(), b"x");
    assert_eq!(std::fs::read(tmp.path().join("state.json")).unwrap(), b"y");
}
