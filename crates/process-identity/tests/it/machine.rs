//! The names this machine goes by: read from the files the kernel and the
//! system keep, or from `SUBAGENTS_MACHINE_ID`, never made up.

use std::process::Command;

use subagents_process_identity::{MACHINE_ID_ENV, host_name, machine_id};

/// Set in the child run by `the_variable_names_the_machine_before_the_file`.
const CHILD: &str = "PROCESS_IDENTITY_TEST_PRINT_MACHINE_ID";

fn trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[test]
fn the_host_name_is_the_kernels() {
    let expected = trimmed("/proc/sys/kernel/hostname");
    assert!(
        expected.is_some(),
        "this machine has no host name to compare"
    );
    assert_eq!(host_name(), expected);
}

#[test]
fn the_machine_id_is_the_variable_or_the_file_or_the_host_name() {
    let named = std::env::var(MACHINE_ID_ENV)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let expected = named
        .or_else(|| trimmed("/etc/machine-id"))
        .or_else(|| trimmed("/proc/sys/kernel/hostname"));
    assert!(expected.is_some(), "nothing names this machine");
    assert_eq!(machine_id(), expected);
}

#[test]
fn the_variable_names_the_machine_before_the_file() {
    if std::env::var_os(CHILD).is_some() {
        println!("machine id: {:?}", machine_id());
        return;
    }
    // The value is read once per process: a child of our own test binary
    // reads it with the variable set, padded to show it is trimmed.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "machine::the_variable_names_the_machine_before_the_file",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env(MACHINE_ID_ENV, "  lab-node-7 \n")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(r#"machine id: Some("lab-node-7")"#),
        "the child printed: {text}"
    );
}
