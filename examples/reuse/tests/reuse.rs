//! The reuse check: a root made by the `subagents` binary, read and claimed
//! from by a tool that links only `subagents-status`, `subagents-listing`
//! and `subagents-fanout-budget`.
//!
//! The binary is `$SUBAGENTS_BIN` (CI points it at the release build), else
//! the workspace's `target/debug/subagents`, which `cargo test --workspace`
//! builds for the launcher's own tests. Without either the test fails and
//! says how to build it.

use std::path::PathBuf;
use std::process::Command;

fn subagents() -> PathBuf {
    if let Some(bin) = std::env::var_os("SUBAGENTS_BIN") {
        return PathBuf::from(bin);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug/subagents");
    assert!(
        bin.exists(),
        "no subagents binary at {}: run `cargo build -p subagents` or set SUBAGENTS_BIN",
        bin.display()
    );
    bin
}

fn output(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?} failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_tool_outside_the_workspace_lists_the_binarys_runs_and_claims_from_a_budget() {
    let root = tempfile::tempdir().unwrap();
    let binary = || {
        let mut command = Command::new(subagents());
        command
            .arg("--root")
            .arg(root.path())
            .env("XDG_CONFIG_HOME", root.path().join("no-config"))
            .env_remove("SUBAGENTS_RUN_ID")
            .env_remove("SUBAGENTS_RUN_FANOUT_BUDGET")
            .env_remove("PI_SUBAGENT_RUN_FANOUT_BUDGET");
        command
    };
    let ok = output(binary().args(["run", "--wait", "--", "true"]));
    let id = ok.split_whitespace().next().unwrap().to_owned();
    let failed = binary()
        .args(["run", "--wait", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    let failed_id = String::from_utf8(failed.stdout).unwrap();
    let failed_id = failed_id.split_whitespace().next().unwrap().to_owned();

    let check = env!("CARGO_BIN_EXE_subagents-reuse-check");
    let listed = output(Command::new(check).arg(root.path()).arg(&id));
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines.contains(&format!("{id} complete 1").as_str()),
        "{listed}"
    );
    assert!(
        lines.contains(&format!("{failed_id} failed 1").as_str()),
        "{listed}"
    );
    assert!(lines.contains(&"claimed 2/64"), "{listed}");

    // The binary sees the claim made through the crate.
    let status: serde_json::Value =
        serde_json::from_str(&output(binary().args(["status", &id, "--json"]))).unwrap();
    assert_eq!(status["runFanoutBudget"]["used"], 2, "{status}");
}
