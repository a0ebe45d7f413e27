//! `children_of` for another process, asked by a caller without children.
//!
//! Alone in a process of its own (`reexec::alone`), so that no other test
//! has a child while it runs (a caller's own children decide a shortcut
//! that must not apply to other processes).

use test_support::reexec;
extern crate subagents_process_identity as process_identity;
#[test]
fn the_children_of_another_process_are_listed() {
    if !reexec::alone(&reexec::test_name(
        module_path!(),
        "the_children_of_another_process_are_listed",
    )) {
        return;
    }
    let parent = process_identity::read_stat(std::process::id())
        .unwrap()
        .ppid;
    let children = process_identity::children_of(parent).unwrap();
    assert!(children.contains(&std::process::id()), "{children:?}");
}
