// Drives `subagents mcp` through the official MCP TypeScript SDK client:
// lists the tools, checks each one's title, annotations and schemas, calls
// every tool, and validates every result's structuredContent against the
// tool's outputSchema twice: in the SDK's own callTool (it refuses a result
// that does not match) and here with ajv's JSON Schema 2020-12 validator in
// strict mode. Also checks the error shape of arguments that do not fit.
//
// Usage: node check.mjs BIN ROOT WORK   (WORK holds .subagents/agents/echoer.md)
// Exits 0 and prints "mcp sdk check: N passed, 0 failed" when all is well.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import Ajv2020 from "ajv/dist/2020.js";

const [bin, root, work] = process.argv.slice(2);
if (!bin || !root || !work) {
  console.error("usage: node check.mjs BIN ROOT WORK");
  process.exit(2);
}

let passed = 0;
const failures = [];
function check(ok, what) {
  if (ok) {
    passed += 1;
  } else {
    failures.push(what);
    console.error(`FAIL: ${what}`);
  }
}

const env = { ...process.env };
for (const name of ["SUBAGENTS_SESSION_ID", "SUBAGENTS_MAX_ACTIVE", "SUBAGENTS_RUN_ID",
  "SUBAGENTS_RUN_FANOUT_BUDGET", "PI_SUBAGENT_RUN_FANOUT_BUDGET"]) {
  delete env[name];
}
const transport = new StdioClientTransport({
  command: bin,
  args: ["--root", root, "mcp", "--session", "sdk"],
  cwd: work,
  env,
  stderr: "inherit",
});
const client = new Client({ name: "subagents-sdk-check", version: "1.0.0" });
await client.connect(transport);

const { tools } = await client.listTools();
const ajv = new Ajv2020({ strict: true, allErrors: true });
const validators = new Map();
for (const tool of tools) {
  check(typeof tool.title === "string" && tool.title.length > 0, `${tool.name} has a title`);
  const a = tool.annotations ?? {};
  check(typeof a.readOnlyHint === "boolean", `${tool.name} has readOnlyHint`);
  check(typeof a.destructiveHint === "boolean", `${tool.name} has destructiveHint`);
  check(typeof a.idempotentHint === "boolean", `${tool.name} has idempotentHint`);
  check(typeof a.openWorldHint === "boolean", `${tool.name} has openWorldHint`);
  check(tool.outputSchema?.type === "object", `${tool.name} has an object outputSchema`);
  // No type union with null anywhere in what a client sends.
  const input = JSON.stringify(tool.inputSchema);
  check(!input.includes('"null"'), `${tool.name} inputSchema has no null type: ${input}`);
  try {
    ajv.compile(tool.inputSchema);
    validators.set(tool.name, ajv.compile(tool.outputSchema));
    passed += 1;
  } catch (e) {
    check(false, `${tool.name} schemas compile in strict ajv: ${e.message}`);
  }
}

const called = new Set();
/** Calls `name`, expects success, validates structuredContent; returns it. */
async function ok(name, args) {
  called.add(name);
  let result;
  try {
    // The SDK validates structuredContent against the outputSchema here.
    result = await client.callTool({ name, arguments: args });
  } catch (e) {
    check(false, `${name} ${JSON.stringify(args)}: the SDK refused the result: ${e.message}`);
    return {};
  }
  const text = result.content?.[0]?.text ?? "";
  check(!result.isError, `${name} ${JSON.stringify(args)} succeeds: ${text}`);
  const content = result.structuredContent;
  check(content !== undefined && content !== null && !Array.isArray(content),
    `${name} returns structuredContent as an object`);
  const validate = validators.get(name);
  if (validate && content) {
    const valid = validate(content);
    check(valid, `${name} ${JSON.stringify(args)} matches its outputSchema: ${ajv.errorsText(validate.errors)}`);
  }
  check(JSON.stringify(JSON.parse(text)) === JSON.stringify(content),
    `${name}: the text content is the structured content`);
  return content ?? {};
}

/** Calls `name`, expects a tool error; returns its JSON error object. */
async function error(name, args) {
  called.add(name);
  const result = await client.callTool({ name, arguments: args });
  check(result.isError === true, `${name} ${JSON.stringify(args)} is a tool error`);
  const text = result.content?.[0]?.text ?? "{}";
  return JSON.parse(text);
}

const launched = await ok("run", {
  command: ["sh", "-c", "echo hello-from-sdk; cat"],
  task: "the task",
  name: "sdk-run",
  timeout: "0",
});
const id = launched.runId;
check(typeof id === "string", "run returns a runId");
const waited = await ok("wait", { runs: [id], timeout: "0", tail: 5 });
check(waited.runs?.[0]?.state === "complete", `wait with timeout "0" waits: ${JSON.stringify(waited)}`);
check(JSON.stringify(waited.logs).includes("hello-from-sdk"), "wait returns the output tail");

const compact = await ok("status", { run: id });
const full = await ok("status", { run: id, detail: "full" });
check(compact.label === "sdk-run" && compact.state === "complete", "status is compact by default");
check(compact.monitorIdentity === undefined && full.monitorIdentity !== undefined,
  "only the full summary carries identities");
check(JSON.stringify(compact).length * 2 < JSON.stringify(full).length,
  `a compact summary is small: ${JSON.stringify(compact).length} vs ${JSON.stringify(full).length} bytes`);
const listed = await ok("list", { all: true });
check(listed.runs?.some((r) => r.id === id), "list wraps the runs in {runs}");
await ok("list", { all: true, detail: "full" });
await ok("logs", { run: id });
const resumed = await ok("resume", { run: id, task: "again" });
await ok("wait", { runs: [resumed.runId], detail: "full" });
await ok("stop", { run: id });
const stopped = await ok("stop", { runs: [id, resumed.runId] });
check(stopped.runs?.length === 2, "stop with runs returns {runs}");
await ok("budget", {});
await ok("budget", { run: id });
const descriptor = await ok("budget_create", { rootRunId: "sdk-root", limit: 2 });
const file = join(work, "descriptor.json");
writeFileSync(file, JSON.stringify(descriptor));
await ok("budget_claim", { descriptor: file, paths: ["a"] });
await ok("capacity", {});
await ok("reconcile", {});
await ok("dismiss", { run: id });
const dismissed = await ok("dismiss", { runs: [resumed.runId] });
check(dismissed.runs?.length === 1, "dismiss with runs returns {runs}");
await ok("prune", { olderThan: "1d", dryRun: true });
await ok("validate", { kind: "status", file: join(full.asyncDir, "status.json") });
const agents = await ok("agents", {});
const echoer = agents.agents?.find((a) => a.name === "echoer");
check(echoer?.description === "says it back" && echoer?.runner === "command",
  `agents lists name, description and runner: ${JSON.stringify(agents)}`);
await ok("agents", { action: "show", name: "echoer" });
await ok("agents", { action: "prompt" });
await ok("config", {});

// Arguments that do not fit the schema: the same error shape as any other.
const bad = await error("logs", { run: id, tail: "1" });
check(bad.error?.code === "USAGE" && bad.error?.exitCode === 2, `bad arguments are USAGE: ${JSON.stringify(bad)}`);
check(bad.error?.message?.includes("`tail`"), `the message names the field: ${JSON.stringify(bad)}`);
const noTask = await error("resume", { run: id });
check(noTask.error?.exitCode === 2 && !JSON.stringify(noTask).includes("--"),
  `a usage error names fields, not flags: ${JSON.stringify(noTask)}`);

for (const tool of tools) {
  check(called.has(tool.name), `${tool.name} was called`);
}
await client.close();
console.log(`mcp sdk check: ${passed} passed, ${failures.length} failed`);
process.exit(failures.length === 0 ? 0 : 1);
