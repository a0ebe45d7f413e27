//! The limit override read from the process environment.
//!
//! The only test in this binary: it changes the environment, which no other
//! thread of this process reads meanwhile.

extern crate subagents_fanout_budget as fanout_budget;
use fanout_budget::{LIMIT_ENV, LIMIT_ENV_ALIAS, limit_env_value};

fn set(name: &str, value: Option<&str>) {
    // SAFETY: this binary runs this one test on one thread (see above).
    unsafe {
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
}

#[test]
fn the_first_non_empty_of_the_two_names_wins() {
    for (ours, alias, want) in [
        (None, None, None),
        (None, Some("5"), Some("5")),
        (Some("7"), Some("5"), Some("7")),
        (Some(""), Some("5"), Some("5")),
        (Some(""), Some(""), None),
    ] {
        set(LIMIT_ENV, ours);
        set(LIMIT_ENV_ALIAS, alias);
        assert_eq!(
            limit_env_value().as_deref(),
            want,
            "{LIMIT_ENV}={ours:?} {LIMIT_ENV_ALIAS}={alias:?}"
        );
    }
}
