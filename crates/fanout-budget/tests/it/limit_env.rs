//! The limit override read from the process environment.
//!
//! Each case runs in a re-execution of this binary (`reexec`) given its
//! environment there: the test never changes its own process's environment,
//! which the other tests of the binary read meanwhile.

extern crate subagents_fanout_budget as fanout_budget;
use std::process::Command;

use fanout_budget::{LIMIT_ENV, LIMIT_ENV_ALIAS, limit_env_value};
use test_support::reexec;

/// The value the re-executed case must read.
const WANT: &str = "FANOUT_BUDGET_TEST_WANT";

fn set(command: &mut Command, name: &str, value: Option<&str>) {
    match value {
        Some(v) => command.env(name, v),
        None => command.env_remove(name),
    };
}

#[test]
fn the_first_non_empty_of_the_two_names_wins() {
    let test = reexec::test_name(module_path!(), "the_first_non_empty_of_the_two_names_wins");
    if reexec::is_rerun(&test) {
        let want = std::env::var(WANT).ok();
        assert_eq!(limit_env_value(), want);
        return;
    }
    for (ours, alias, want) in [
        (None, None, None),
        (None, Some("5"), Some("5")),
        (Some("7"), Some("5"), Some("7")),
        (Some(""), Some("5"), Some("5")),
        (Some(""), Some(""), None),
    ] {
        let mut case = reexec::rerun(&test);
        set(&mut case, LIMIT_ENV, ours);
        set(&mut case, LIMIT_ENV_ALIAS, alias);
        set(&mut case, WANT, want);
        let out = case.output().unwrap();
        assert!(
            reexec::passed_one(&out),
            "{LIMIT_ENV}={ours:?} {LIMIT_ENV_ALIAS}={alias:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
