//! Files that report size 0 and read short anywhere (`/proc`): read on to
//! their end, however many short reads that takes, and capped like any
//! other file.

use std::path::Path;

extern crate subagents_atomic_file as atomic_file;
use atomic_file::read::{ReadError, read_file, read_file_capped};

/// Megabytes long, its size reported as 0, read a page at a time by the
/// kernel; stable between two reads (no module loads during a test).
const MANY_PAGES: &str = "/proc/kallsyms";

#[test]
fn a_proc_file_of_many_pages_reads_to_its_end() {
    let path = Path::new(MANY_PAGES);
    let Ok(expected) = std::fs::read(path) else {
        eprintln!("skipped: {MANY_PAGES} is not readable here");
        return;
    };
    assert_eq!(
        std::fs::metadata(path).unwrap().len(),
        0,
        "size not reported as 0"
    );
    assert!(expected.len() > 64 * 1024, "only {} bytes", expected.len());
    let read = read_file(path).unwrap();
    assert_eq!(read.len(), expected.len());
    assert!(read == expected, "the contents differ");
}

#[test]
fn a_proc_file_longer_than_the_cap_is_refused() {
    let path = Path::new(MANY_PAGES);
    if std::fs::read(path).is_err() {
        eprintln!("skipped: {MANY_PAGES} is not readable here");
        return;
    }
    match read_file_capped(path, 10_000) {
        Err(ReadError::TooLarge { .. }) => {}
        other => panic!("expected too large, got {other:?}"),
    }
}
