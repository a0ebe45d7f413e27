//! `processes_with_env` against real processes: only an exact `name=value`
//! entry of a process's initial environment matches.

extern crate subagents_process_identity as process_identity;
use std::process::{Child, Command, Stdio};

/// A `cat` that lives until its stdin is closed, with one extra variable.
fn holder(name: &str, value: &str) -> Child {
    Command::new("cat")
        .env(name, value)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn end(mut child: Child) {
    drop(child.stdin.take());
    child.wait().unwrap();
}

#[test]
fn only_processes_with_exactly_that_variable_are_found() {
    let name = "PROCESS_IDENTITY_TEST_TAG";
    let value = format!("run-{}", std::process::id());
    let tagged = holder(name, &value);
    let longer = holder(name, &format!("{value}0"));
    let other_name = holder(&format!("{name}_OTHER"), &value);
    let expected = vec![tagged.id()];
    // Until `cat` has finished its exec, /proc shows no environment for it:
    // wait (10 s at most) for the tagged one, then check nothing else matched.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let found = loop {
        let found = process_identity::processes_with_env(name, &value);
        let seen = found.as_ref().is_ok_and(|f| f.contains(&expected[0]));
        if seen || std::time::Instant::now() > deadline {
            break found;
        }
        std::thread::yield_now();
    };
    for child in [tagged, longer, other_name] {
        end(child);
    }
    assert_eq!(found.unwrap(), expected);
    // Once it has exited, nothing carries the variable.
    assert_eq!(
        process_identity::processes_with_env(name, &value).unwrap(),
        Vec::<u32>::new()
    );
}
