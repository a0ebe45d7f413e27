//! The MCP server's stdio: a line filter in front of `rmcp`.
//!
//! rmcp's own stdio transport answers a line that is not JSON with
//! `-32600` (not the `-32700` JSON-RPC asks for) and drops the id from the
//! `-32600` of a message it cannot read. So stdin is read here, one message
//! per line: a line that is not JSON is answered `-32700`, a JSON value that
//! is no JSON-RPC message `-32600` with the id it carries (`-32602` when it
//! is a well-formed request whose params do not fit its method), and only
//! the messages rmcp can read are passed on. One thread owns stdout and
//! writes whole lines, so the filter's replies never split one of rmcp's.

use std::io::{BufRead, Write};
use std::sync::mpsc;

use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcRequest};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, DuplexStream};

/// A line for stdout, or the end of the output.
enum Out {
    Line(Vec<u8>),
    End,
}

/// rmcp's transport: it reads the filtered messages from the first
/// stream and writes its own to the second.
pub type Transport = (DuplexStream, DuplexStream);

/// The threads and tasks that connect the transport to the process's stdin
/// and stdout.
pub struct Stdio {
    out: mpsc::Sender<Out>,
    writer: std::thread::JoinHandle<()>,
    drain: tokio::task::JoinHandle<()>,
}

/// Room for a few messages in each direction; a message is never cut.
const PIPE_BYTES: usize = 256 * 1024;

impl Stdio {
    /// Starts the stdin reader and stdout writer threads, and (on the
    /// current runtime) the tasks that feed rmcp and drain it.
    pub fn start() -> std::io::Result<(Transport, Self)> {
        let (out, lines) = mpsc::channel::<Out>();
        let writer = std::thread::Builder::new()
            .name("mcp-stdout".into())
            .spawn(move || write_lines(lines))?;
        let (mut feed, input) = tokio::io::duplex(PIPE_BYTES);
        let (output, from_server) = tokio::io::duplex(PIPE_BYTES);
        let (passed, mut to_server) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let replies = out.clone();
        std::thread::Builder::new()
            .name("mcp-stdin".into())
            .spawn(move || read_lines(passed, replies))?;
        tokio::spawn(async move {
            while let Some(line) = to_server.recv().await {
                if feed.write_all(&line).await.is_err() {
                    break;
                }
            }
            // Dropping `feed` is rmcp's end of input.
        });
        let drained = out.clone();
        let drain = tokio::spawn(async move {
            let mut from_server = tokio::io::BufReader::new(from_server);
            loop {
                let mut line = Vec::new();
                match from_server.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if drained.send(Out::Line(line)).is_err() => break,
                    Ok(_) => {}
                }
            }
        });
        let stdio = Self { out, writer, drain };
        Ok(((input, output), stdio))
    }

    /// Once rmcp is done: writes what it wrote last, then ends the writer.
    pub async fn finish(self) {
        let _ = self.drain.await;
        let _ = self.out.send(Out::End);
        let _ = tokio::task::spawn_blocking(move || self.writer.join()).await;
    }
}

fn write_lines(lines: mpsc::Receiver<Out>) {
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    while let Ok(Out::Line(line)) = lines.recv() {
        if stdout
            .write_all(&line)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            break;
        }
    }
}

fn read_lines(passed: tokio::sync::mpsc::UnboundedSender<Vec<u8>>, replies: mpsc::Sender<Out>) {
    let stdin = std::io::stdin();
    let mut stdin = stdin.lock();
    loop {
        let mut line = Vec::new();
        match stdin.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match screen(&line) {
            Screened::Pass => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                if passed.send(line).is_err() {
                    break;
                }
            }
            Screened::Reply(reply) => {
                let _ = replies.send(Out::Line(reply));
            }
            Screened::Skip => {}
        }
    }
}

/// What to do with one line of input.
#[derive(Debug, PartialEq)]
pub enum Screened {
    /// A message rmcp reads.
    Pass,
    /// Answer with this line (a JSON-RPC error), pass nothing on.
    Reply(Vec<u8>),
    /// Nothing to pass on and nobody to answer (blank, or a bad notification).
    Skip,
}

/// JSON-RPC's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

/// The requests of the protocol a client may send (rmcp takes any other
/// method as a custom request).
const STANDARD_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
];

/// Judges one line of input.
pub fn screen(line: &[u8]) -> Screened {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Screened::Skip;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => {
            return Screened::Reply(error_line(
                &Value::Null,
                PARSE_ERROR,
                &format!("Parse error: the line is not JSON: {e}"),
            ));
        }
    };
    let e = match serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        Ok(JsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CustomRequest(custom),
            id,
            ..
        })) if STANDARD_METHODS.contains(&custom.method.as_str()) => {
            // rmcp reads a standard method whose params do not fit as a
            // custom request and answers "method not found": they are
            // invalid params.
            let id = serde_json::to_value(id).unwrap_or(Value::Null);
            let message = format!("Invalid params for {}", custom.method);
            return Screened::Reply(error_line(&id, INVALID_PARAMS, &message));
        }
        Ok(_) => return Screened::Pass,
        Err(e) => e,
    };
    let id = value
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned();
    let request = value.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && value.get("method").is_some_and(Value::is_string);
    match (request, id) {
        // A notification is never answered, not even when it is wrong.
        (true, None) => Screened::Skip,
        (true, Some(id)) => Screened::Reply(error_line(
            &id,
            INVALID_PARAMS,
            &format!("Invalid params: {e}"),
        )),
        (false, id) => Screened::Reply(error_line(
            &id.unwrap_or(Value::Null),
            INVALID_REQUEST,
            &format!("Invalid request: not a JSON-RPC 2.0 message: {e}"),
        )),
    }
}

fn error_line(id: &Value, code: i64, message: &str) -> Vec<u8> {
    let reply = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    let mut line = reply.to_string().into_bytes();
    line.push(b'\n');
    line
}
