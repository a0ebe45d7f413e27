//! End-to-end tests of `subagents mcp` with a real MCP client: rmcp's client
//! speaking JSON-RPC over the stdio of the built binary, runs of real
//! processes, a fresh state root per test.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_subagents");
const SECRET: &str = "the-secret-task-text-4711";

/// Records the progress notifications the server sends.
#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    first_progress: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
        if let Some(tx) = self.first_progress.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

/// A server process and the client connected to it.
struct Connection {
    child: tokio::process::Child,
    client: RunningService<RoleClient, Client>,
}

/// Starts `subagents --root ROOT mcp ARGS` with `vars` and connects.
async fn connect(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Connection {
    connect_with(env, args, vars, Client::default()).await
}

async fn connect_with(
    env: &Env,
    args: &[&str],
    vars: &[(&str, &str)],
    handler: Client,
) -> Connection {
    serve(server_command(env, args, vars), handler).await
}

/// The command [`connect`] starts.
fn server_command(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command
        .arg("--root")
        .arg(env.root())
        .arg("mcp")
        .args(args)
        .current_dir(env.work())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for name in [
        "SUBAGENTS_SESSION_ID",
        "SUBAGENTS_MAX_ACTIVE",
        "SUBAGENTS_RUN_ID",
        "SUBAGENTS_RUN_FANOUT_BUDGET",
        "PI_SUBAGENT_RUN_FANOUT_BUDGET",
        "SUBAGENTS_MAX_SPAWNS_PER_RUN",
        "PI_SUBAGENT_MAX_SPAWNS_PER_RUN",
    ] {
        command.env_remove(name);
    }
    for (name, value) in vars {
        command.env(name, value);
    }
    command
}

/// Starts `command` and connects to it.
async fn serve(mut command: tokio::process::Command, handler: Client) -> Connection {
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = within(handler.serve((stdout, stdin))).await.unwrap();
    Connection { child, client }
}

impl Connection {
    async fn call(&self, tool: &str, arguments: Value) -> CallToolResult {
        let Value::Object(arguments) = arguments else {
            panic!("arguments must be an object")
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        within(self.client.call_tool(params)).await.unwrap()
    }

    /// A successful call's JSON outcome.
    async fn ok(&self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments.clone()).await;
        assert_ne!(
            result.is_error,
            Some(true),
            "{tool} {arguments}: {result:?}"
        );
        outcome(&result)
    }

    /// A failed call's JSON error object (in its text: the structured
    /// content is kept for the outcome its output schema describes).
    async fn error(&self, tool: &str, arguments: Value) -> Value {
        let result = self.call(tool, arguments.clone()).await;
        assert_eq!(
            result.is_error,
            Some(true),
            "{tool} {arguments}: {result:?}"
        );
        assert!(result.structured_content.is_none(), "{result:?}");
        outcome(&result)
    }

    /// Closes the client's side (stdin EOF) and waits for the server to exit
    /// on its own; returns its exit code.
    async fn disconnect(self) -> Option<i32> {
        let Connection { mut child, client } = self;
        drop(client);
        let status = within(child.wait()).await.unwrap();
        status.code()
    }
}

/// The JSON of a tool result: its structured content, else its text.
fn outcome(result: &CallToolResult) -> Value {
    if let Some(value) = &result.structured_content {
        return value.clone();
    }
    let text = result.content[0]
        .as_text()
        .expect("a text content")
        .text
        .clone();
    serde_json::from_str(&text).unwrap()
}

/// Fails the test instead of hanging it.
async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("the MCP exchange did not finish within 60s")
}

/// The parent pid of `pid` (`/proc/<pid>/stat` field 4), while it exists.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// `sh -c` a command that blocks on a FIFO until the test releases it.
fn gated(gate: &Path, then: &str) -> Value {
    json!([
        "sh",
        "-c",
        format!("read line < '{}'; {then}", gate.display())
    ])
}

fn release(gate: PathBuf) {
    // Opening a FIFO for writing blocks until the run reads it: not on the runtime.
    std::thread::spawn(move || std::fs::write(gate, "go\n").unwrap());
}

/// No file of the run but its task file and the command's own output (which
/// echoes it here) holds the task text: not the status, the events, the
/// recovery files or the runner's logs.
fn assert_task_text_only_in_task_files(env: &Env, id: &str) {
    let dir = env.run_dir(id);
    let mut task_files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        if name.starts_with("task") && name.ends_with(".md") {
            task_files += 1;
            continue;
        }
        if name.starts_with("external-") || name.starts_with("output-") {
            continue;
        }
        assert!(!text.contains(SECRET), "{name} holds the task text: {text}");
    }
    assert_eq!(task_files, 1, "the task is in task.md");
    let status = env.status_json(id);
    assert_eq!(
        status["steps"][0]["description"], "[prompt redacted]",
        "{status}"
    );
}

#[tokio::test]
async fn a_client_lists_the_tools_with_schemas_from_the_request_types() {
    let env = Env::new();
    let server = connect(&env, &[], &[]).await;
    let info = server.client.peer_info().expect("initialized");
    assert_eq!(info.server_info.as_ref().unwrap().name, "subagents");
    assert!(info.capabilities.tools.is_some());
    let tools = within(server.client.list_all_tools()).await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "agents",
            "budget",
            "budget_claim",
            "budget_create",
            "capacity",
            "config",
            "dismiss",
            "list",
            "logs",
            "prune",
            "reconcile",
            "resume",
            "run",
            "status",
            "stop",
            "validate",
            "wait"
        ]
    );
    let schema = |name: &str| {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()));
        Value::Object((*tool.input_schema).clone())
    };
    let run = schema("run");
    assert_eq!(run["type"], "object");
    let properties: Vec<&String> = run["properties"].as_object().unwrap().keys().collect();
    for field in ["agent", "task", "cwd", "timeout", "id", "spec", "command"] {
        assert!(
            run["properties"].get(field).is_some(),
            "run lacks {field}: {run}"
        );
    }
    // Launch settings belong to the server: an agent cannot lift its limits.
    for field in [
        "session",
        "maxActive",
        "fanoutLimit",
        "taskFile",
        "specFile",
    ] {
        assert!(
            !properties.contains(&&field.to_owned()),
            "run has {field}: {run}"
        );
    }
    assert_eq!(run["additionalProperties"], false, "{run}");
    // No run named: the session's active runs.
    assert!(schema("wait")["properties"].get("runs").is_some());
    assert_eq!(schema("wait").get("required"), None);
    assert!(schema("wait")["properties"].get("timeout").is_some());
    assert!(schema("wait")["properties"].get("tail").is_some());
    for name in ["status", "resume", "logs"] {
        assert_eq!(schema(name)["required"], json!(["run"]), "{name}");
    }
    // `run` or `runs`.
    for name in ["stop", "dismiss"] {
        let properties = &schema(name)["properties"];
        assert!(
            properties.get("run").is_some() && properties.get("runs").is_some(),
            "{name}"
        );
    }
    assert!(schema("list")["properties"].get("all").is_some());
    assert!(schema("capacity")["properties"].get("session").is_some());
    assert_eq!(schema("validate")["required"], json!(["kind", "file"]));
    assert!(schema("prune")["properties"].get("olderThan").is_some());
    assert!(schema("agents")["properties"].get("action").is_some());

    // A malformed request is refused with the command's exit code and nothing starts.
    let error = server
        .error("run", json!({"command": ["true"], "timeout": "soon"}))
        .await;
    assert_eq!(error["error"]["code"], "USAGE", "{error}");
    assert_eq!(error["error"]["exitCode"], 2, "{error}");
    // The hint names the request's field, never a command-line flag.
    let hint = error["error"]["hint"].as_str().unwrap();
    assert!(hint.starts_with("`timeout` takes"), "{error}");
    assert!(!hint.contains("--"), "{error}");
    let error = server.error("status", json!({"run": "nope"})).await;
    assert_eq!(error["error"]["code"], "NOT_FOUND", "{error}");
    assert_eq!(error["error"]["exitCode"], 4, "{error}");
    assert_eq!(env.run_count(), 0);
    // No task is the same mistake, and the same code, as on the command line.
    let done = env.ok(&["run", "--wait", "--", "true"]).trim().to_owned();
    let error = server.error("resume", json!({"run": done})).await;
    assert_eq!(error["error"]["exitCode"], 2, "{error}");
    assert_eq!(error["error"]["hint"], "give the task in `task`", "{error}");
    assert_eq!(server.disconnect().await, Some(0));
}

#[tokio::test]
async fn a_descriptor_the_server_inherited_is_not_kept_by_the_monitors_it_starts() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    // The server inherits the write end of a pipe without close-on-exec, as
    // from a shell's `subagents mcp 7>pipe`; the reader must see its end once
    // the server is gone, though the run it started goes on.
    const INHERITED: i32 = 200;
    let env = Env::new();
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut command = server_command(&env, &[], &[]);
    let fd = writer.as_raw_fd();
    // SAFETY: dup2(2) only, between fork and exec; it clears close-on-exec
    // in the child, the parent's copy keeps it.
    unsafe {
        command.pre_exec(move || match libc::dup2(fd, INHERITED) {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
    let server = serve(command, Client::default()).await;
    drop(writer);
    let launched = server.ok("run", json!({"command": ["sleep", "120"]})).await;
    let id = launched["runId"].as_str().unwrap().to_owned();
    assert_eq!(server.disconnect().await, Some(0));
    let monitor = &env.status_json(&id)["monitorIdentity"]["pid"];
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = tx.send(reader.read_to_end(&mut rest).map(|_| rest));
    });
    let read = rx.recv_timeout(Duration::from_secs(30));
    assert!(
        matches!(&read, Ok(Ok(rest)) if rest.is_empty()),
        "the pipe's end did not come with the server's exit (monitor {monitor} still holds it?): {read:?}"
    );
    assert_eq!(env.status_json(&id)["state"], "running", "the run goes on");
    env.ok(&["stop", &id]);
    env.settled(&id);
}

#[tokio::test]
async fn the_run_tool_takes_a_name_that_status_and_list_show() {
    let env = Env::new();
    let server = connect(&env, &[], &[]).await;
    let tools = within(server.client.list_all_tools()).await.unwrap();
    let run = tools.iter().find(|t| t.name == "run").unwrap();
    assert!(run.input_schema["properties"].get("name").is_some());
    let launched = server
        .ok(
            "run",
            json!({"command": ["sleep", "30"], "name": "from mcp"}),
        )
        .await;
    let id = launched["runId"].as_str().unwrap().to_owned();
    let status = server.ok("status", json!({"run": id})).await;
    assert_eq!(status["name"], "from mcp", "{status}");
    assert_eq!(status["label"], "from mcp", "{status}");
    // A flag the run does not have yet is left out, not given as false.
    assert_eq!(status.get("answerTruncated"), None, "{status}");
    assert_eq!(status["steps"][0].get("answerTruncated"), None, "{status}");
    let listed = server.ok("list", json!({})).await;
    assert!(
        listed.to_string().contains(r#""label":"from mcp""#),
        "{listed}"
    );
    let error = server
        .error("run", json!({"command": ["true"], "name": "a\u{7}b"}))
        .await;
    assert_eq!(error["error"]["exitCode"], 2, "{error}");
    let hint = error["error"]["hint"].as_str().unwrap();
    assert!(hint.starts_with("`name` takes"), "{error}");
    assert_eq!(env.run_count(), 1);
    server.ok("stop", json!({"run": id})).await;
    assert_eq!(server.disconnect().await, Some(0));
}

/// The maintenance tools on a real root: reconcile, dismiss, prune,
/// validate, agents, config and the budget's create and claim, each
/// answering with the outcome `--json` prints.
#[tokio::test]
async fn the_maintenance_tools_answer_on_a_real_root() {
    let env = Env::new();
    let work = Path::new(env.work());
    let config = work.join("config");
    std::fs::create_dir_all(config.join("subagents")).unwrap();
    std::fs::write(config.join("subagents/config.toml"), "max_active = 7\n").unwrap();
    let agents = work.join(".subagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("echoer.md"),
        "---\nrunner: command\ndescription: says it back\ncommand: [cat]\n---\n",
    )
    .unwrap();
    let home = work.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let vars = [
        ("XDG_CONFIG_HOME", config.to_str().unwrap()),
        ("HOME", home.to_str().unwrap()),
    ];
    let id = env.ok(&["run", "--", "true"]).trim().to_owned();
    env.settled(&id);
    let server = connect(&env, &[], &vars).await;

    let reconciled = server.ok("reconcile", json!({})).await;
    assert_eq!(
        reconciled,
        json!({"repaired": [], "observed": [], "unreadable": []})
    );

    let dismissed = server.ok("dismiss", json!({"run": id})).await;
    assert_eq!(dismissed["runId"], id.as_str(), "{dismissed}");
    let at = dismissed["displayDismissedAt"].as_u64().expect("a time");
    assert_eq!(env.status_json(&id)["displayDismissedAt"], at);
    let error = server.error("dismiss", json!({"run": "nope"})).await;
    assert_eq!(error["error"]["code"], "NOT_FOUND", "{error}");

    let status_file = env.run_dir(&id).join("status.json");
    let valid = server
        .ok("validate", json!({"kind": "status", "file": status_file}))
        .await;
    assert_eq!(valid, json!({"valid": true, "error": null}));
    let garbage = work.join("garbage.json");
    std::fs::write(&garbage, "{not json").unwrap();
    let invalid = server
        .ok("validate", json!({"kind": "status", "file": garbage}))
        .await;
    assert_eq!(invalid["valid"], false, "{invalid}");
    assert!(
        invalid["error"].as_str().unwrap().contains("garbage.json"),
        "{invalid}"
    );
    let error = server
        .error("validate", json!({"kind": "nonsense", "file": garbage}))
        .await;
    assert_eq!(error["error"]["code"], "USAGE", "{error}");

    let listed = server.ok("agents", json!({})).await;
    let names: Vec<&str> = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(names.contains(&"echoer"), "{listed}");
    assert_eq!(listed["errors"], json!([]), "{listed}");
    let shown = server
        .ok("agents", json!({"action": "show", "name": "echoer"}))
        .await;
    assert_eq!(shown["description"], "says it back", "{shown}");
    assert_eq!(shown["argv"], json!(["cat"]), "{shown}");
    let prompt = server.ok("agents", json!({"action": "prompt"})).await;
    assert!(
        prompt["snippet"].as_str().unwrap().contains("echoer"),
        "{prompt}"
    );

    let configured = server.ok("config", json!({})).await;
    assert_eq!(configured["exists"], true, "{configured}");
    let max_active = configured["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "max_active")
        .cloned()
        .unwrap();
    assert_eq!(max_active["value"], "7", "{configured}");
    assert_eq!(max_active["source"], "config", "{configured}");

    let descriptor = server
        .ok("budget_create", json!({"rootRunId": "root-7", "limit": 2}))
        .await;
    assert_eq!(descriptor["rootRunId"], "root-7", "{descriptor}");
    let file = work.join("descriptor.json");
    std::fs::write(&file, descriptor.to_string()).unwrap();
    let claimed = server
        .ok(
            "budget_claim",
            json!({"descriptor": file, "paths": ["a", "b"]}),
        )
        .await;
    assert_eq!(claimed, json!({"used": 2, "limit": 2, "remaining": 0}));
    let error = server
        .error("budget_claim", json!({"descriptor": file, "paths": ["c"]}))
        .await;
    assert_eq!(error["error"]["code"], "LIMIT", "{error}");

    let dry = server
        .ok("prune", json!({"olderThan": "0s", "dryRun": true}))
        .await;
    assert_eq!(dry["dryRun"], true, "{dry}");
    assert_eq!(dry["pruned"][0]["runId"], id.as_str(), "{dry}");
    assert!(env.run_dir(&id).exists());
    let pruned = server.ok("prune", json!({"olderThan": "0s"})).await;
    assert_eq!(pruned["pruned"][0]["runId"], id.as_str(), "{pruned}");
    assert_eq!(pruned["olderThanMs"], 0, "{pruned}");
    assert!(!env.run_dir(&id).exists());
    assert_eq!(server.disconnect().await, Some(0));
}

#[tokio::test]
async fn a_run_outlives_the_connection_and_is_collected_after_reconnecting() {
    let env = Env::new();
    let gate = env.fifo("gate");
    let first = connect(&env, &[], &[]).await;
    let launched = first
        .ok(
            "run",
            json!({"command": gated(&gate, "echo task=$(cat); echo finished-output"), "task": SECRET}),
        )
        .await;
    let id = launched["runId"].as_str().unwrap().to_owned();
    assert!(launched["pid"].as_u64().is_some(), "{launched}");
    assert_eq!(
        first.disconnect().await,
        Some(0),
        "the server ends with its client"
    );

    // The run goes on without the server, and is visible to the command line.
    let status = env.status_json(&id);
    assert_eq!(status["state"], "running", "{status}");
    assert!(alive(launched["pid"].as_u64().unwrap() as u32));

    let client = Client::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    *client.first_progress.lock().unwrap() = Some(tx);
    let second = connect_with(&env, &[], &[], client.clone()).await;
    let listed = second.ok("list", json!({})).await;
    assert_eq!(listed["runs"][0]["id"], id.as_str(), "{listed}");
    // Release the run only once the wait is blocked and reporting progress.
    let release_on_progress = tokio::spawn(async move {
        rx.await.unwrap();
        release(gate);
    });
    let waited = second
        .ok("wait", json!({"runs": [&id], "timeout": "0"}))
        .await;
    release_on_progress.await.unwrap();
    assert_eq!(waited["runs"][0]["id"], id.as_str(), "{waited}");
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    let tail = &waited["logs"][0];
    assert_eq!(tail["runId"], id.as_str());
    let text: String = tail["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert!(text.contains("finished-output"), "{waited}");
    let progress = client.progress.lock().unwrap().clone();
    assert!(!progress.is_empty());
    assert!(
        progress[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&id)),
        "{progress:?}"
    );

    let logs = second.ok("logs", json!({"run": &id, "tail": 1})).await;
    assert_eq!(logs["state"], "complete");
    assert_eq!(logs["logs"][0]["name"], "output", "{logs}");
    assert_eq!(logs["logs"][0]["text"], "finished-output\n", "{logs}");
    let status = second
        .ok("status", json!({"run": &id, "detail": "full"}))
        .await;
    assert_eq!(status["processTerminal"]["state"], "observed", "{status}");
    // The task reached the command, and no status, event or log.
    let full = second.ok("logs", json!({"run": &id})).await;
    assert!(
        full["logs"][0]["text"]
            .as_str()
            .unwrap()
            .contains(&format!("task={SECRET}")),
        "{full}"
    );
    assert_task_text_only_in_task_files(&env, &id);
    assert_eq!(second.disconnect().await, Some(0));
    env.settled(&id);
}

#[tokio::test]
async fn a_fanout_refusal_carries_the_rejection_and_the_budget() {
    let env = Env::new();
    // A server started inside a run: its launches claim from that run's budget.
    let descriptor = env.ok(&[
        "budget",
        "create",
        "--root-run-id",
        "parent",
        "--limit",
        "1",
    ]);
    let descriptor = fanout_budget::Descriptor::from_json(descriptor.trim()).unwrap();
    let encoded = descriptor.to_env_value();
    let server = connect(
        &env,
        &[],
        &[
            ("SUBAGENTS_RUN_FANOUT_BUDGET", &encoded),
            ("SUBAGENTS_RUN_ID", "parent"),
        ],
    )
    .await;
    let budget = server.ok("budget", json!({})).await;
    assert_eq!(budget["nested"], true, "{budget}");
    assert_eq!(budget["inherited"]["rootRunId"], "parent", "{budget}");
    assert_eq!(budget["inherited"]["remaining"], 1, "{budget}");

    let first = server.ok("run", json!({"command": ["true"]})).await;
    let id = first["runId"].as_str().unwrap().to_owned();
    let error = server.error("run", json!({"command": ["true"]})).await;
    assert_eq!(error["error"]["code"], "LIMIT", "{error}");
    assert_eq!(error["error"]["exitCode"], 3, "{error}");
    assert!(
        error["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("root run 'parent'"),
        "{error}"
    );
    let rejection = &error["runFanoutRejection"];
    assert_eq!(rejection["code"], "RUN_FANOUT_LIMIT", "{error}");
    assert_eq!(rejection["limit"], 1, "{error}");
    assert_eq!(rejection["used"], 1, "{error}");
    assert_eq!(rejection["requested"], 1, "{error}");
    assert_eq!(error["runFanoutBudget"]["remaining"], 0, "{error}");
    assert_eq!(env.run_count(), 1, "the refused run was not started");

    // The same refusal as the command line's `--json` error object.
    let mut cli = env.command(&["run", "--json", "--", "true"]);
    cli.env("SUBAGENTS_RUN_FANOUT_BUDGET", &encoded);
    let out = output_within(cli, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let cli_error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli_error["error"]["code"], error["error"]["code"]);
    assert_eq!(cli_error["error"]["exitCode"], error["error"]["exitCode"]);
    for field in ["code", "requested", "used", "limit", "remaining"] {
        assert_eq!(
            cli_error["runFanoutRejection"][field],
            error["runFanoutRejection"][field]
        );
    }
    assert_eq!(cli_error["runFanoutBudget"], error["runFanoutBudget"]);

    let waited = server.ok("wait", json!({"runs": [&id]})).await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&id);
}

#[tokio::test]
async fn a_capacity_refusal_carries_the_sessions_snapshot() {
    let env = Env::new();
    let gate = env.fifo("gate");
    let server = connect(&env, &["--session", "s1", "--max-active", "1"], &[]).await;
    let held = server
        .ok("run", json!({"command": gated(&gate, "true")}))
        .await;
    let held = held["runId"].as_str().unwrap().to_owned();
    let error = server.error("run", json!({"command": ["true"]})).await;
    assert_eq!(error["error"]["code"], "LIMIT", "{error}");
    assert_eq!(error["error"]["exitCode"], 3, "{error}");
    assert!(
        error["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("$SUBAGENTS_MAX_ACTIVE"),
        "{error}"
    );
    assert_eq!(error["capacity"]["used"], 1, "{error}");
    assert_eq!(error["capacity"]["limit"], 1, "{error}");
    assert_eq!(
        error["capacity"]["slots"][0]["runId"],
        held.as_str(),
        "{error}"
    );

    let capacity = server.ok("capacity", json!({})).await;
    assert_eq!(capacity["session"], "s1", "{capacity}");
    assert_eq!(capacity["used"], 1, "{capacity}");
    assert_eq!(
        capacity["slots"][0]["slot"]["runId"],
        held.as_str(),
        "{capacity}"
    );

    // Stopping the holder frees its slot for the next launch, once its
    // exit is observed (`wait` returns then).
    let stopped = server.ok("stop", json!({"run": &held})).await;
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    let waited = server.ok("wait", json!({"runs": [&held]})).await;
    assert_eq!(waited["runs"][0]["state"], "stopped", "{waited}");
    let next = server.ok("run", json!({"command": ["true"]})).await;
    let next = next["runId"].as_str().unwrap().to_owned();
    let waited = server.ok("wait", json!({"runs": [&next]})).await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&held);
    env.settled(&next);
}

/// `last` is the newest run of the server's session, timeouts take
/// compound forms, `wait` without runs waits for the session's active runs,
/// and `stop` takes `runs`.
#[tokio::test]
async fn last_and_compound_durations_through_the_server() {
    let env = Env::new();
    let server = connect(&env, &["--session", "m1"], &[]).await;
    let gate = env.fifo("gate");
    let mine = server
        .ok(
            "run",
            json!({"command": gated(&gate, "true"), "timeout": "1h30m"}),
        )
        .await;
    let mine = mine["runId"].as_str().unwrap().to_owned();
    // A newer run of another session is not this server's `last`.
    let never = format!("while [ ! -e '{}/never' ]; do sleep 0.05; done", env.work());
    let other = env.ok(&["run", "--", "sh", "-c", &never]).trim().to_owned();
    let status = server.ok("status", json!({"run": "last"})).await;
    assert_eq!(status["id"], mine.as_str(), "{status}");
    assert_eq!(status["timeoutMs"], 5_400_000, "{status}");
    let error = server
        .error("run", json!({"command": ["true"], "timeout": "90"}))
        .await;
    assert_eq!(error["error"]["exitCode"], 2, "{error}");
    assert!(
        error["error"]["hint"].as_str().unwrap().contains("1h30m"),
        "{error}"
    );
    release(gate);
    let waited = server.ok("wait", json!({"timeout": "1m30s"})).await;
    assert_eq!(waited["runs"][0]["id"], mine.as_str(), "{waited}");
    assert_eq!(waited["runs"].as_array().unwrap().len(), 1, "{waited}");
    let stopped = server.ok("stop", json!({"runs": [&other, "last"]})).await;
    let stopped = &stopped["runs"];
    assert_eq!(stopped[0]["id"], other.as_str(), "{stopped}");
    assert_eq!(stopped[0]["state"], "stopped", "{stopped}");
    assert_eq!(stopped[1]["id"], mine.as_str(), "{stopped}");
    assert_eq!(stopped[1]["state"], "complete", "{stopped}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&other);
}

#[tokio::test]
async fn a_finished_run_is_resumed_with_a_follow_up() {
    let env = Env::new();
    let server = connect(&env, &[], &[]).await;
    let script = r#"echo "task: $(cat)"; echo "from: ${SUBAGENTS_RESUMED_FROM:-none}""#;
    let source = server
        .ok(
            "run",
            json!({"command": ["sh", "-c", script], "task": "first"}),
        )
        .await;
    let source = source["runId"].as_str().unwrap().to_owned();
    let waited = server.ok("wait", json!({"runs": [&source]})).await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");

    let resumed = server
        .ok("resume", json!({"run": &source, "task": "continue"}))
        .await;
    assert_eq!(resumed["sourceRunId"], source.as_str(), "{resumed}");
    let revived = resumed["runId"].as_str().unwrap().to_owned();
    assert_ne!(revived, source);
    let waited = server
        .ok("wait", json!({"runs": [&revived], "tail": 5}))
        .await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    assert_eq!(
        waited["runs"][0]["resumedFrom"],
        source.as_str(),
        "{waited}"
    );
    let logs = server.ok("logs", json!({"run": &revived})).await;
    let text = logs["logs"][0]["text"].as_str().unwrap();
    assert!(text.contains("task: continue\n"), "{logs}");
    assert!(text.contains(&format!("from: {source}")), "{logs}");

    // A run still going cannot be resumed; an unknown one is not found.
    let error = server
        .error("resume", json!({"run": "nope", "task": "x"}))
        .await;
    assert_eq!(error["error"]["exitCode"], 4, "{error}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&source);
    env.settled(&revived);
}

#[tokio::test]
async fn two_tasks_delegated_in_parallel_are_collected_together() {
    let env = Env::new();
    let server = connect(&env, &[], &[]).await;
    // Two runs side by side, and one composite run of two parallel tasks.
    let a = server
        .ok(
            "run",
            json!({"command": ["sh", "-c", "echo answer-a: $(cat)"], "task": "question a"}),
        )
        .await;
    let b = server
        .ok(
            "run",
            json!({"agent": "b", "command": ["sh", "-c", "echo answer-b"]}),
        )
        .await;
    let spec = json!({
        "mode": "parallel",
        "tasks": [
            {"agent": "left", "command": ["sh", "-c", "echo left: $(cat)"], "task": "part one"},
            {"agent": "right", "command": ["sh", "-c", "echo right: $(cat)"], "task": "part two"}
        ]
    });
    let composite = server.ok("run", json!({"spec": spec})).await;
    let ids: Vec<String> = [&a, &b, &composite]
        .iter()
        .map(|l| l["runId"].as_str().unwrap().to_owned())
        .collect();
    let waited = server
        .ok(
            "wait",
            json!({"runs": &ids, "timeout": "60s", "tail": 5, "detail": "full"}),
        )
        .await;
    let runs = waited["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{waited}");
    for (run, id) in runs.iter().zip(&ids) {
        assert_eq!(run["id"], id.as_str(), "in request order: {waited}");
        assert_eq!(run["state"], "complete", "{waited}");
    }
    assert_eq!(runs[2]["steps"].as_array().unwrap().len(), 2, "{waited}");
    let texts = |outcome: &Value| -> String {
        outcome["logs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["text"].as_str().unwrap())
            .collect()
    };
    assert!(
        texts(&waited["logs"][0]).contains("answer-a: question a"),
        "{waited}"
    );
    assert!(texts(&waited["logs"][1]).contains("answer-b"), "{waited}");
    let both = texts(&waited["logs"][2]);
    assert!(
        both.contains("left: part one") && both.contains("right: part two"),
        "{waited}"
    );
    // The server started each run's monitor and reaps it once it exits: no
    // zombie child is left while the server lives on.
    let server_pid = server.child.id().unwrap();
    for run in runs {
        let monitor = run["monitorIdentity"]["pid"].as_u64().unwrap() as u32;
        poll(Duration::from_secs(30), || {
            parent_of(monitor) != Some(server_pid)
        });
    }
    let step = server.ok("logs", json!({"run": &ids[2], "step": 2})).await;
    assert_eq!(step["logs"][0]["name"], "step 2 stdout", "{step}");
    assert_eq!(step["logs"][0]["text"], "right: part two\n", "{step}");

    // A spec with a command beside it is a usage mistake; a bad spec names the field.
    let error = server
        .error(
            "run",
            json!({"spec": {"mode": "parallel", "tasks": []}, "command": ["true"]}),
        )
        .await;
    assert_eq!(error["error"]["code"], "USAGE", "{error}");
    let error = server
        .error(
            "run",
            json!({"spec": {"mode": "parallel", "tasks": [{"agent": "x", "command": []}]}}),
        )
        .await;
    assert_eq!(error["error"]["exitCode"], 2, "{error}");
    assert!(
        error["error"]["hint"].as_str().unwrap().contains("`spec`"),
        "{error}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("command"),
        "{error}"
    );
    assert_eq!(server.disconnect().await, Some(0));
    for id in &ids {
        env.settled(id);
    }
}

#[test]
fn a_wait_whose_reporter_gives_up_returns_at_once() {
    use launcher::wait::{Keep, WaitEvent};
    let env = Env::new();
    let gate = env.fifo("gate");
    let script = format!("read line < '{}'", gate.display());
    let id = env
        .ok(&["run", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let layout = status::Layout::new(env.root());
    let request = launcher::WaitRequest {
        runs: vec![id.clone()],
        timeout: Some("10m".into()),
        tail: None,
        cancel: Default::default(),
    };
    let mut looks = 0;
    let error = launcher::wait::wait(&layout, &request, &mut |event| {
        assert!(
            matches!(event, WaitEvent::Pending(..)),
            "the run is still going"
        );
        looks += 1;
        Keep::Break(())
    })
    .unwrap_err();
    assert_eq!(looks, 1);
    assert_eq!(error.exit(), launcher::Exit::Failed);
    assert_eq!(error.kind, launcher::ErrorKind::WaitCancelled);
    assert!(error.message.contains("cancelled"), "{}", error.message);
    release(gate);
    env.settled(&id);
}

#[test]
fn a_wait_cancelled_from_another_thread_returns_while_its_run_goes_on() {
    use launcher::wait::{Cancel, Keep, WaitEvent};
    let env = Env::new();
    let gate = env.fifo("gate");
    let script = format!("read line < '{}'", gate.display());
    let id = env
        .ok(&["run", "--", "sh", "-c", &script])
        .trim()
        .to_owned();
    let layout = status::Layout::new(env.root());
    let cancel = Cancel::default();
    let request = launcher::WaitRequest {
        runs: vec![id.clone()],
        timeout: Some("0".into()),
        tail: None,
        cancel: cancel.clone(),
    };
    let (looked, first_look) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        launcher::wait::wait(&layout, &request, &mut |event| {
            if matches!(event, WaitEvent::Pending(..)) {
                let _ = looked.send(());
            }
            Keep::Continue(())
        })
    });
    // Blocked (no deadline): only the cancel can end it.
    first_look.recv_timeout(Duration::from_secs(30)).unwrap();
    cancel.cancel();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(waiter.join().unwrap()).unwrap());
    let error = ended
        .recv_timeout(Duration::from_secs(30))
        .expect("the cancelled wait returned")
        .unwrap_err();
    assert_eq!(error.kind, launcher::ErrorKind::WaitCancelled);
    assert_eq!(env.status_json(&id)["state"], "running");
    release(gate);
    env.settled(&id);
}

/// An agent run through MCP: `wait`'s progress says what the agent is
/// doing while it runs, and `wait` and `status` return its whole answer
/// (5,000 lines) with `answerPath` and `answerTruncated`.
#[tokio::test]
async fn an_agent_runs_answer_and_activity_come_back_through_mcp() {
    let env = Env::new();
    let home = tempfile::tempdir().unwrap();
    let gate = home.path().join("gate");
    let agents = Path::new(env.work()).join(".subagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    let definition = format!(
        "---\nrunner: codex\nenv:\n  FAKE_SCENARIO: long\n  FAKE_GATE: \"{}\"\n---\nYou fix.\n",
        gate.display()
    );
    std::fs::write(agents.join("fixer.md"), definition).unwrap();
    let path = format!(
        "{}:{}",
        fakes_dir().canonicalize().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let home_dir = home.path().display().to_string();
    let vars = [
        ("PATH", path.as_str()),
        ("HOME", home_dir.as_str()),
        ("FAKE_RECORD_DIR", home_dir.as_str()),
    ];
    let client = Client::default();
    let server = connect_with(&env, &[], &vars, client.clone()).await;
    let launched = server
        .ok("run", json!({"agent": "fixer", "task": SECRET}))
        .await;
    let id = launched["runId"].as_str().unwrap().to_owned();
    // Open the gate once a progress notification names the agent's activity.
    let seen = client.progress.clone();
    let opener = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let doing = seen.lock().unwrap().iter().any(|p| {
                p.message.as_deref().is_some_and(|m| {
                    m.contains("doing: $ bash -lc ls") && m.contains("last output")
                })
            });
            if doing || tokio::time::Instant::now() > deadline {
                std::fs::write(&gate, "").unwrap();
                return doing;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let waited = server
        .ok("wait", json!({"runs": [&id], "timeout": "90s"}))
        .await;
    assert!(
        opener.await.unwrap(),
        "{:?}",
        client.progress.lock().unwrap()
    );
    let expected: String = (1..=5000)
        .map(|i| format!("line {i} of the long answer"))
        .collect::<Vec<_>>()
        .join("\n");
    let run = &waited["runs"][0];
    assert_eq!(run["state"], "complete", "{run}");
    assert_eq!(run["answer"], expected.as_str());
    assert_eq!(run["answerTruncated"], false);
    let answer_path = env.run_dir(&id).join("answer.md").display().to_string();
    assert_eq!(run["answerPath"], answer_path.as_str());
    let status = server.ok("status", json!({"run": &id})).await;
    assert_eq!(status["answer"], expected.as_str());
    assert_eq!(status["steps"][0]["answerPath"], answer_path.as_str());
    // The progress lines never carry the task.
    for p in client.progress.lock().unwrap().iter() {
        assert!(
            !p.message.as_deref().unwrap_or("").contains(SECRET),
            "{p:?}"
        );
    }
}

/// A config home with no config file: the developer's defaults stay out.
fn no_config(env: &Env) -> String {
    Path::new(env.work())
        .join("no-config")
        .display()
        .to_string()
}

/// The server's own flags (`subagents mcp --session-dir --fanout-limit`,
/// and `$SUBAGENTS_MAX_ACTIVE`) set every run it starts; `queue` waits over the limit
/// instead of being refused; `capacity` reports any session against any limit.
#[tokio::test]
async fn the_servers_flags_set_the_runs_it_starts_and_queue_waits_for_a_slot() {
    let env = Env::new();
    let session_dir = Path::new(env.work()).join("session-home");
    std::fs::create_dir_all(&session_dir).unwrap();
    let config = no_config(&env);
    let dir = session_dir.to_str().unwrap();
    let server = connect(
        &env,
        &["--session-dir", dir, "--fanout-limit", "3"],
        &[
            ("XDG_CONFIG_HOME", &config),
            ("SUBAGENTS_SESSION_ID", "flagged"),
            // `--max-active` itself: a_capacity_refusal_carries_the_sessions_snapshot.
            ("SUBAGENTS_MAX_ACTIVE", "1"),
        ],
    )
    .await;
    let gate = env.fifo("gate");
    let held = server
        .ok("run", json!({"command": gated(&gate, "true")}))
        .await;
    let held = held["runId"].as_str().unwrap().to_owned();
    let status = env.status_json(&held);
    assert_eq!(status["sessionId"], "flagged", "{status}");
    assert_eq!(
        status["sessionRoot"],
        session_dir.to_str().unwrap(),
        "{status}"
    );
    let budget = server.ok("budget", json!({"run": &held})).await;
    assert_eq!(budget["limit"], 3, "{budget}");
    assert_eq!(budget["used"], 1, "{budget}");

    // Over --max-active: refused, or queued with `queue`.
    let refused = server.error("run", json!({"command": ["true"]})).await;
    assert_eq!(refused["error"]["code"], "LIMIT", "{refused}");
    let queued = server
        .ok("run", json!({"command": ["true"], "queue": true}))
        .await;
    assert!(queued["queuedForSlot"].is_object(), "{queued}");
    let queued = queued["runId"].as_str().unwrap().to_owned();
    assert_eq!(env.status_json(&queued)["state"], "queued");

    let mine = server.ok("capacity", json!({})).await;
    assert_eq!(
        (mine["session"].as_str(), mine["used"].as_u64()),
        (Some("flagged"), Some(1)),
        "{mine}"
    );
    let other = server
        .ok("capacity", json!({"session": "elsewhere", "limit": 5}))
        .await;
    assert_eq!(other["session"], "elsewhere", "{other}");
    assert_eq!(other["used"], 0, "{other}");
    assert_eq!(other["limit"], 5, "{other}");

    release(gate);
    let waited = server.ok("wait", json!({"runs": [&held, &queued]})).await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    assert_eq!(waited["runs"][1]["state"], "complete", "{waited}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&held);
    env.settled(&queued);
}

fn ids(listed: &Value) -> Vec<String> {
    listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

/// `list`'s filters and order, `dismiss` of several runs and of an active
/// one (`force`), `stop`'s reason and full summary.
#[tokio::test]
async fn list_dismiss_and_stop_take_their_arguments() {
    let env = Env::new();
    let config = no_config(&env);
    let server = connect(
        &env,
        &["--session", "lister"],
        &[("XDG_CONFIG_HOME", &config)],
    )
    .await;
    let gate = env.fifo("gate");
    // Started first, still running: first by state, last by start.
    let live = server
        .ok("run", json!({"command": gated(&gate, "true")}))
        .await;
    let live = live["runId"].as_str().unwrap().to_owned();
    let older = env
        .ok(&["run", "--session", "s1", "--wait", "--", "true"])
        .trim()
        .to_owned();
    let newer = env
        .ok(&["run", "--session", "s2", "--wait", "--", "true"])
        .trim()
        .to_owned();
    env.settled(&older);
    env.settled(&newer);

    let active = server.ok("list", json!({})).await;
    assert_eq!(ids(&active), [live.as_str()], "{active}");
    let every = server.ok("list", json!({"all": true})).await;
    assert_eq!(ids(&every), [live.as_str(), &newer, &older], "{every}");
    let by_start = server
        .ok("list", json!({"all": true, "sort": "started"}))
        .await;
    assert_eq!(
        ids(&by_start),
        [newer.as_str(), &older, &live],
        "{by_start}"
    );
    let first = server.ok("list", json!({"all": true, "limit": 1})).await;
    assert_eq!(ids(&first), [live.as_str()], "{first}");
    let s2 = server
        .ok("list", json!({"all": true, "session": "s2"}))
        .await;
    assert_eq!(ids(&s2), [newer.as_str()], "{s2}");

    let dismissed = server
        .ok("dismiss", json!({"runs": [&older, &newer]}))
        .await;
    assert_eq!(
        dismissed["runs"].as_array().unwrap().len(),
        2,
        "{dismissed}"
    );
    let hidden = server
        .ok("list", json!({"all": true, "dismissed": true}))
        .await;
    assert_eq!(ids(&hidden), [newer.as_str(), &older], "{hidden}");
    let shown = server.ok("list", json!({"all": true})).await;
    assert_eq!(ids(&shown), [live.as_str()], "{shown}");
    // An active run is dismissed only with `force`.
    server.error("dismiss", json!({"run": &live})).await;
    let forced = server
        .ok("dismiss", json!({"run": &live, "force": true}))
        .await;
    assert_eq!(forced["runId"], live.as_str(), "{forced}");

    let compact = server.ok("status", json!({"run": &live})).await;
    assert!(
        compact.get("runnerProcessInstanceId").is_none(),
        "{compact}"
    );
    let stopped = server
        .ok(
            "stop",
            json!({"run": &live, "reason": "enough of it", "detail": "full"}),
        )
        .await;
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    assert_eq!(stopped["stopReason"], "enough of it", "{stopped}");
    assert!(stopped["runnerProcessInstanceId"].is_string(), "{stopped}");
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&live);
}

/// `run`'s `cwd`, `idleTimeout` and Slurm arguments, `logs`' `stderr`,
/// `resume`'s `timeout`, `budget` of a descriptor file.
#[tokio::test]
async fn run_logs_resume_and_budget_take_their_arguments() {
    let env = Env::new();
    let config = no_config(&env);
    let server = connect(&env, &[], &[("XDG_CONFIG_HOME", &config)]).await;
    let dir = Path::new(env.work()).join("elsewhere");
    std::fs::create_dir_all(&dir).unwrap();
    let script = "pwd; echo to-err >&2";
    let launched = server
        .ok("run", json!({"command": ["sh", "-c", script], "cwd": &dir}))
        .await;
    let id = launched["runId"].as_str().unwrap().to_owned();
    let waited = server.ok("wait", json!({"runs": [&id]})).await;
    assert_eq!(waited["runs"][0]["state"], "complete", "{waited}");
    let logs = server.ok("logs", json!({"run": &id})).await;
    let out = logs["logs"][0]["text"].as_str().unwrap();
    assert_eq!(
        Path::new(out.trim()).canonicalize().unwrap(),
        dir.canonicalize().unwrap(),
        "{logs}"
    );
    let errors = server.ok("logs", json!({"run": &id, "stderr": true})).await;
    let all: String = errors["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["text"].as_str().unwrap())
        .collect();
    assert_eq!(all.trim(), "to-err", "{errors}");

    // The revival's own deadline, not the source's 30 minutes.
    let resumed = server
        .ok(
            "resume",
            json!({"run": &id, "task": "again", "timeout": "1h"}),
        )
        .await;
    let revived = resumed["runId"].as_str().unwrap().to_owned();
    assert_eq!(env.status_json(&revived)["timeoutMs"], 3_600_000);
    assert_eq!(env.status_json(&id)["timeoutMs"], 1_800_000);
    server.ok("wait", json!({"runs": [&revived]})).await;

    let silent = server
        .ok(
            "run",
            json!({"command": ["sleep", "600"], "idleTimeout": "1s"}),
        )
        .await;
    let silent = silent["runId"].as_str().unwrap().to_owned();
    let waited = server.ok("wait", json!({"runs": [&silent]})).await;
    assert_eq!(waited["runs"][0]["state"], "failed", "{waited}");
    assert_eq!(waited["runs"][0]["error"], "no output for 1s", "{waited}");

    let descriptor = server
        .ok("budget_create", json!({"rootRunId": "root-9", "limit": 4}))
        .await;
    let file = Path::new(env.work()).join("descriptor.json");
    std::fs::write(&file, descriptor.to_string()).unwrap();
    let budget = server.ok("budget", json!({"descriptor": &file})).await;
    assert_eq!(budget, json!({"used": 0, "limit": 4, "remaining": 4}));

    // The Slurm arguments are read (and refused here before anything is
    // submitted): a partition needs the Slurm executor, which takes no
    // `queue` and no sbatch option we set ourselves.
    let before = env.run_count();
    let error = server
        .error(
            "run",
            json!({"command": ["true"], "slurmPartition": "main"}),
        )
        .await;
    assert_eq!(error["error"]["code"], "USAGE", "{error}");
    let error = server
        .error(
            "run",
            json!({"command": ["true"], "executor": "slurm", "queue": true}),
        )
        .await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`queue` does not apply to a Slurm run"),
        "{error}"
    );
    let error = server
        .error(
            "run",
            json!({"command": ["true"], "executor": "slurm", "slurmArgs": ["--output=x"]}),
        )
        .await;
    assert!(error.to_string().contains("not allowed"), "{error}");
    assert_eq!(env.run_count(), before);
    assert_eq!(server.disconnect().await, Some(0));
    env.settled(&id);
    env.settled(&revived);
    env.settled(&silent);
}
