//! An append cut short (here by `RLIMIT_FSIZE`, as a full disk would) is
//! cut off again: the file keeps its earlier lines and no torn one. Alone
//! in a process of its own (`reexec::alone`) because the file-size limit
//! and the ignored `SIGXFSZ` are process-wide.

use test_support::reexec;
extern crate subagents_atomic_file as atomic_file;
use atomic_file::append_private;

fn set_file_size_limit(soft: libc::rlim_t) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid resource and struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
        limit.rlim_cur = soft;
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
}

#[test]
fn an_append_cut_short_leaves_no_torn_line() {
    if !reexec::alone(&reexec::test_name(
        module_path!(),
        "an_append_cut_short_leaves_no_torn_line",
    )) {
        return;
    }
    // SAFETY: ignoring a signal installs no handler code. A write past the
    // limit then fails with EFBIG instead of killing the process.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("events.jsonl");
    let earlier = format!("{}\n", "x".repeat(89));
    std::fs::write(&path, &earlier).unwrap();
    let line = format!("{}\n", "y".repeat(19));

    // Room for 10 of the 20 bytes: the first write is short, the next fails.
    set_file_size_limit(100);
    let cut = append_private(&path, line.as_bytes());
    // Room for the whole line.
    set_file_size_limit(110);
    let whole = append_private(&path, line.as_bytes());
    set_file_size_limit(libc::RLIM_INFINITY);

    let err = cut.unwrap_err();
    assert!(err.to_string().starts_with("failed to append to"), "{err}");
    whole.unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), earlier + &line);
}
