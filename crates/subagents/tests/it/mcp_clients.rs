//! `subagents mcp` as real clients meet it: the official MCP TypeScript SDK
//! (every tool called, every result validated against its outputSchema),
//! `claude mcp list`, raw JSON-RPC lines on stdin (parse errors, invalid
//! requests), arguments that do not fit a tool's schema, and a cancelled
//! `wait` (the server's threads counted in `/proc/<pid>/task`).
use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use rmcp::model::{CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_subagents");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether `program --version` runs.
fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A work directory with one project agent, `echoer`.
fn with_echoer(env: &Env) -> PathBuf {
    let work = Path::new(env.work()).to_path_buf();
    let agents = work.join(".subagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("echoer.md"),
        "---\nrunner: command\ndescription: says it back\ncommand: [cat]\n---\n",
    )
    .unwrap();
    work
}

#[test]
fn the_typescript_sdk_validates_every_tool_result_against_its_output_schema() {
    if !runs("node") || !runs("npm") {
        eprintln!(
            "skipped: node or npm is not installed (the MCP TypeScript SDK check needs them)"
        );
        return;
    }
    let here = repo().join("crates/subagents/tests/mcp-sdk");
    let install = output_within(
        Command::new(here.join("install.sh")),
        Duration::from_secs(300),
    );
    assert!(install.status.success(), "install.sh failed: {install:?}");
    let sdk = PathBuf::from(String::from_utf8(install.stdout).unwrap().trim());
    let env = Env::new();
    let work = with_echoer(&env);
    let mut check = Command::new("node");
    // install.sh put the script beside the SDK: its imports resolve there.
    check
        .arg(sdk.join("check.mjs"))
        .arg(BIN)
        .arg(env.root())
        .arg(&work)
        .current_dir(&work);
    let out = output_within(check, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" 0 failed"),
        "the SDK check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn claude_mcp_list_shows_the_server_connected() {
    let claude = std::env::var_os("SUBAGENTS_CLAUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/mcp-clients/node_modules/.bin/claude"));
    if !claude.exists() || !runs("node") {
        eprintln!(
            "skipped: no Claude Code CLI at {} (crates/subagents/tests/mcp-sdk/install.sh --clients installs it)",
            claude.display()
        );
        return;
    }
    let env = Env::new();
    let home = Path::new(env.work()).join("home");
    let project = Path::new(env.work()).join("project");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    let claude_command = |args: &[&str]| {
        let mut command = Command::new(&claude);
        command
            .args(args)
            .current_dir(&project)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
        command
    };
    let root = env.root().to_str().unwrap();
    let added = output_within(
        claude_command(&["mcp", "add", "subagents", "--", BIN, "--root", root, "mcp"]),
        Duration::from_secs(120),
    );
    assert!(added.status.success(), "claude mcp add: {added:?}");
    let listed = output_within(claude_command(&["mcp", "list"]), Duration::from_secs(120));
    let text = String::from_utf8_lossy(&listed.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("subagents:"))
        .unwrap_or_else(|| panic!("no subagents line: {listed:?}"));
    assert!(line.ends_with("Connected"), "{line}");
}

/// The server's replies to `lines`, one JSON value per line, once it has
/// read them all and its stdin is closed.
fn exchange(env: &Env, lines: &[&str]) -> Vec<Value> {
    let mut child = Command::new(BIN)
        .arg("--root")
        .arg(env.root())
        .arg("mcp")
        .current_dir(env.work())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let replies: Vec<Value> = BufReader::new(stdout)
            .lines()
            .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
            .collect();
        let _ = tx.send(replies);
    });
    let replies = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server answered and exited within 60s");
    assert!(child.wait().unwrap().success());
    replies
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

fn reply(replies: &[Value], id: Value) -> &Value {
    replies
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no reply with id {id}: {replies:?}"))
}

#[test]
fn a_line_that_is_not_json_is_a_parse_error_and_an_invalid_request_keeps_its_id() {
    let env = Env::new();
    let replies = exchange(
        &env,
        &[
            INITIALIZE,
            INITIALIZED,
            "{not json",
            r#"{"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":5}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[]}}"#,
            "",
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"list","arguments":{}}}"#,
        ],
    );
    let parse: Vec<&Value> = replies
        .iter()
        .filter(|r| r["error"]["code"] == -32700)
        .collect();
    assert_eq!(parse.len(), 1, "{replies:?}");
    assert_eq!(parse[0]["id"], Value::Null, "{replies:?}");
    assert_eq!(parse[0]["jsonrpc"], "2.0");
    assert_eq!(reply(&replies, json!(7))["error"]["code"], -32600);
    assert_eq!(reply(&replies, json!("abc"))["error"]["code"], -32602);
    // The server goes on serving after each of them.
    let listed = reply(&replies, json!(9));
    assert_eq!(listed["result"]["structuredContent"], json!({"runs": []}));
    // One reply per request, none for the notifications or the blank line.
    assert_eq!(replies.len(), 5, "{replies:?}");
}

/// A connected rmcp client and its server process.
struct Connection {
    child: tokio::process::Child,
    client: RunningService<RoleClient, ()>,
}

async fn connect(env: &Env) -> Connection {
    let mut child = tokio::process::Command::new(BIN)
        .arg("--root")
        .arg(env.root())
        .arg("mcp")
        .current_dir(env.work())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = within(().serve((stdout, stdin))).await.unwrap();
    Connection { child, client }
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("the MCP exchange did not finish within 60s")
}

fn params(tool: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments)
}

impl Connection {
    /// A failed call's JSON error object (its text: errors carry no
    /// structured content, which the output schema keeps for successes).
    async fn error(&self, tool: &str, arguments: Value) -> Value {
        let result: CallToolResult = within(self.client.call_tool(params(tool, arguments)))
            .await
            .unwrap();
        assert_eq!(result.is_error, Some(true), "{result:?}");
        assert!(result.structured_content.is_none(), "{result:?}");
        let text = &result.content[0].as_text().unwrap().text;
        serde_json::from_str(text).unwrap()
    }
}

#[tokio::test]
async fn arguments_that_do_not_fit_are_usage_errors_that_name_fields() {
    let env = Env::new();
    let server = connect(&env).await;
    let e = server.error("logs", json!({"run": "x", "tail": "1"})).await;
    assert_eq!(e["error"]["code"], "USAGE", "{e}");
    assert_eq!(e["error"]["exitCode"], 2, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("`tail`"), "{e}");
    assert_eq!(
        e["error"]["hint"], "check `tail` against the tool's input schema",
        "{e}"
    );
    let e = server
        .error("run", json!({"command": ["true"], "taskFile": "/x"}))
        .await;
    assert_eq!(e["error"]["code"], "USAGE", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `taskFile`"),
        "{e}"
    );
    let e = server.error("status", json!({"run": 5})).await;
    assert_eq!(e["error"]["exitCode"], 2, "{e}");
    let e = server.error("list", json!({"detail": "everything"})).await;
    assert_eq!(e["error"]["exitCode"], 2, "{e}");
    // The launcher's own messages name request fields, not flags.
    let e = server
        .error("run", json!({"command": ["true"], "timeout": "soon"}))
        .await;
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("`timeout`"), "{e}");
    let e = server
        .error("run", json!({"command": ["true"], "id": "last"}))
        .await;
    assert_eq!(e["error"]["exitCode"], 2, "{e}");
    assert!(e["error"]["hint"].as_str().unwrap().contains("`id`"), "{e}");
    assert!(!e.to_string().contains("--"), "a flag in {e}");
    assert_eq!(env.run_count(), 0);
    drop(server);
}

/// The threads of process `pid` now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_cancelled_wait_ends_its_threads_at_once() {
    let env = Env::new();
    let gate = env.fifo("gate");
    let script = format!("read line < '{}'", gate.display());
    let id = env
        .ok(&["run", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let server = connect(&env).await;
    let pid = server.child.id().unwrap();
    // Warm up: the threads an idle server keeps.
    let _ = within(server.client.call_tool(params("list", json!({})))).await;
    let idle = threads(pid);
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params(
        "wait",
        json!({"runs": [&id], "timeout": "10m"}),
    )));
    let handle = within(
        server
            .client
            .send_cancellable_request(request, PeerRequestOptions::no_options()),
    )
    .await
    .unwrap();
    // The wait is blocked: it has threads of its own (the waiter, the
    // watchers of the run's directory and monitor).
    tokio::task::spawn_blocking(move || poll(Duration::from_secs(30), || threads(pid) > idle))
        .await
        .unwrap();
    within(handle.cancel(None)).await.unwrap();
    // Cancelled, they end: the run goes on, nothing waits for it.
    tokio::task::spawn_blocking(move || poll(Duration::from_secs(10), || threads(pid) <= idle))
        .await
        .unwrap();
    assert_eq!(env.status_json(&id)["state"], "running");
    let gate_release = gate.clone();
    std::thread::spawn(move || std::fs::write(gate_release, "go\n").unwrap());
    env.settled(&id);
    drop(server);
}
