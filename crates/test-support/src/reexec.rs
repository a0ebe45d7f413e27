//! Running one test of this test binary again, in a process of its own.
//!
//! Every crate's integration tests are one binary, so its tests share one
//! process: a test that changes what is process-wide (the current
//! directory, the environment, a global setting) runs its body in a
//! re-execution of the binary instead, where no other test runs.

use std::process::{Command, Output};
use std::time::Duration;

/// Marks the re-executed process with the name of the test it runs.
const RERUN: &str = "SUBAGENTS_TEST_RERUN";

/// The harness's name of test `name` declared in module `module_path`
/// (pass `module_path!()`): the module path without the crate's own first
/// segment, as `--exact` matches it (`lease::lease_worker`).
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// This test binary, set to run test `test` (a harness name, see
/// [`test_name`]) alone on one thread, with [`is_rerun`] true in it.
pub fn rerun(test: &str) -> Command {
    let exe = std::env::current_exe().expect("failed to find the test binary");
    let mut command = Command::new(exe);
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(RERUN, test);
    command
}

/// Whether this process is the re-execution [`rerun`] started for `test`.
pub fn is_rerun(test: &str) -> bool {
    std::env::var_os(RERUN).is_some_and(|v| v == test)
}

/// Whether `output` is that of a re-execution that ran exactly one test and
/// passed it (a wrong name runs no test and exits 0).
pub fn passed_one(output: &Output) -> bool {
    let stdout = String::from_utf8_lossy(&output.stdout);
    output.status.success() && stdout.contains("test result: ok. 1 passed")
}

/// For the test `test` whose body must run alone: true in the re-executed
/// process (run the body there); in the test's own process, re-executes the
/// binary, fails the test unless the body passed there, and returns false.
pub fn alone(test: &str) -> bool {
    if is_rerun(test) {
        return true;
    }
    let output = crate::output_within(rerun(test), Duration::from_secs(120));
    assert!(
        passed_one(&output),
        "{test} did not pass in a process of its own: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

/// Where the tests look for strace.
pub const STRACE: &str = "/usr/bin/strace";

/// Runs test `test` again (see [`rerun`]) under `strace -f -y -qq -e
/// trace=TRACE`, with `env` set, writing strace's log to `log`. Returns the
/// re-execution's output and the trace, or `None` (printing why) when
/// strace is missing or cannot trace here. The caller checks the output.
pub fn under_strace(
    test: &str,
    trace: &str,
    log: &std::path::Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> Option<(Output, String)> {
    if !std::path::Path::new(STRACE).exists() {
        eprintln!("skipped: {STRACE} is not installed");
        return None;
    }
    let rerun = rerun(test);
    let mut command = Command::new(STRACE);
    command
        .args(["-f", "-y", "-qq", "-e"])
        .arg(format!("trace={trace}"))
        .arg("-o")
        .arg(log)
        .arg(rerun.get_program())
        .args(rerun.get_args());
    for (key, value) in rerun.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().expect("failed to run strace");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if text.is_empty() && !out.status.success() && stderr.contains("strace:") {
        eprintln!("skipped: strace could not trace here: {}", stderr.trim());
        return None;
    }
    Some((out, text))
}
