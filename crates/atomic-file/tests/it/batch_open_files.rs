//! A batch holds only a bounded number of its temp files open at once: a
//! launch of a plan with more steps than the process may open files still
//! writes every step's task file. Alone in a process of its own
//! (`reexec::alone`), since it lowers the process's open-file limit.

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;
use std::fs;

#[test]
fn a_batch_larger_than_the_open_file_limit_is_written() {
    if !reexec::alone(&reexec::test_name(
        module_path!(),
        "a_batch_larger_than_the_open_file_limit_is_written",
    )) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let limit = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on structures this test owns.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
    }
    let lowered = libc::rlimit {
        rlim_max: old.rlim_max,
        ..limit
    };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let mut batch = atomic_file::Batch::new();
    let files = 200;
    for i in 0..files {
        batch.add(tmp.path().join(format!("task-{i}.md")), format!("task {i}"));
    }
    let written = batch.commit();
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    written.unwrap();
    for i in 0..files {
        let text = fs::read_to_string(tmp.path().join(format!("task-{i}.md"))).unwrap();
        assert_eq!(text, format!("task {i}"));
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), files);
}
