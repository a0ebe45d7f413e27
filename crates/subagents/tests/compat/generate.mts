// Fixture generator: runs pi-subagents 0.49.0's own writers and readers and
// records files and verdicts as JSON under crates/subagents/tests/compat/fixtures/.
//
//   node --import tsx generate.mts <fixtures dir> <repo root> <subagents binary>
//
// Environment: PI_SUBAGENTS_PKG (the installed package), TMPDIR (a scratch
// directory; the package's state root is $TMPDIR/pi-subagents-uid-<uid>).
// Run it through crates/subagents/tests/compat/generate.sh.
//
// Paths and times that differ between machines are written as placeholders
// that tests/compat_fixtures.rs substitutes: "${ROOT}" (the state root),
// "${LIVE_PID}" (a live process), "${DEAD_PID}" (an exited one) and
// "${AGO:<ms>}" (now minus <ms>), the last three as quoted strings standing
// for numbers.
import * as fs from "node:fs";
import * as path from "node:path";
import { execFileSync, spawnSync } from "node:child_process";
import { pathToFileURL } from "node:url";

const [fixturesDir, repoRoot, binary] = process.argv.slice(2);
const pkg = process.env.PI_SUBAGENTS_PKG!;
const load = (rel: string) => import(pathToFileURL(path.join(pkg, rel)).href);

const types = await load("src/shared/types.ts");
const budget = await load("src/runs/shared/run-fanout-budget.ts");
const resume = await load("src/runs/background/async-resume.ts");
const terminal = await load("src/runs/background/process-terminal.ts");
const capacity = await load("src/runs/background/active-async-capacity.ts");
const listing = await load("src/runs/background/async-status.ts");

const ROOT: string = types.TEMP_ROOT_DIR;
fs.mkdirSync(ROOT, { recursive: true, mode: 0o700 });
const NOW = Date.now();
const LIVE_PID = process.pid;
const DEAD_PID = (() => {
  const child = spawnSync("true");
  return child.pid!;
})();

/** Replaces machine-specific values by placeholders, recursively. */
function generalize(value: unknown): unknown {
  if (typeof value === "string") return value.split(ROOT).join("${ROOT}");
  if (Array.isArray(value)) return value.map(generalize);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, generalize(v)]));
  }
  return value;
}

/** A file's text with the root replaced. */
const text = (file: string) => fs.readFileSync(file, "utf-8").split(ROOT).join("${ROOT}");

/** Substitutes placeholders in a template (the generator's own inputs). */
function fill(template: string): string {
  return template
    .split("${ROOT}").join(ROOT)
    .split('"${LIVE_PID}"').join(String(LIVE_PID))
    .split('"${DEAD_PID}"').join(String(DEAD_PID))
    .replace(/"\$\{AGO:(\d+)\}"/g, (_, ms) => String(NOW - Number(ms)));
}

const message = (error: unknown) => (error instanceof Error ? error.message : String(error));

/** The verdict of a reader: valid, or the error with the file path removed. */
function verdict(read: () => unknown): { valid: boolean; error: string | null } {
  try {
    read();
    return { valid: true, error: null };
  } catch (error) {
    return { valid: false, error: message(error).split(ROOT).join("${ROOT}") };
  }
}

function write(name: string, value: unknown) {
  fs.mkdirSync(fixturesDir, { recursive: true });
  fs.writeFileSync(path.join(fixturesDir, name), `${JSON.stringify(value, null, 2)}\n`);
}

const header = { generatedBy: "pi-subagents@0.49.0", generator: "tests/compat/generate.mts" };

// ---------------------------------------------------------------- fan-out
const fixtureBudget = budget.createRunFanoutBudget("fixture-root", 3);
const claimed = budget.claimRunFanoutBatch(fixtureBudget, ["a", "b"]);
const snapshot = budget.getRunFanoutBudgetSnapshot(fixtureBudget);
const claimsDir = path.join(fixtureBudget.directory, "claims");
const claimFiles = Object.fromEntries(
  fs.readdirSync(claimsDir).sort().map((name) => [name, text(path.join(claimsDir, name))]),
);
const brokenBudget = budget.createRunFanoutBudget("broken-root", 2);
fs.writeFileSync(path.join(brokenBudget.directory, "manifest.json"), '{"version":2}\n');

const runDir = path.join(ROOT, "async-subagent-runs", "fixture-run");
fs.mkdirSync(runDir, { recursive: true });
budget.writeRunFanoutBudgetDescriptor(runDir, fixtureBudget);
const persistedByReference = text(path.join(runDir, "run-fanout-budget.json"));

const d = { ...fixtureBudget, directory: fixtureBudget.directory.split(ROOT).join("${ROOT}") };
const descriptorCases: Array<[string, unknown]> = [
  ["written-by-reference", JSON.parse(persistedByReference)],
  ["parent-path", { ...d, parentPath: "tasks[0]" }],
  ["version-2", { ...d, version: 2 }],
  ["empty-root-run-id", { ...d, rootRunId: "" }],
  ["limit-zero", { ...d, limit: 0 }],
  ["limit-fraction", { ...d, limit: 2.5 }],
  ["limit-string", { ...d, limit: "3" }],
  ["parent-path-number", { ...d, parentPath: 5 }],
  ["limit-not-manifest", { ...d, limit: 4 }],
  ["root-run-id-not-manifest", { ...d, rootRunId: "other" }],
  ["directory-missing", { ...d, directory: "${ROOT}/run-fanout-budgets/missing" }],
  ["directory-outside-root", { ...d, directory: "${ROOT}" }],
  ["manifest-invalid", { ...brokenBudget, directory: brokenBudget.directory.split(ROOT).join("${ROOT}") }],
  ["array", [1]],
];
const fanoutCases = descriptorCases.map(([name, value]) => {
  const content = JSON.stringify(value);
  fs.writeFileSync(path.join(runDir, "run-fanout-budget.json"), fill(content));
  return { name, content, ...verdict(() => budget.readRunFanoutBudgetDescriptor(runDir)) };
});
write("fanout.json", {
  ...header,
  kind: "fanout-descriptor",
  reader: "readRunFanoutBudgetDescriptor",
  budget: {
    directory: d.directory,
    manifest: text(path.join(fixtureBudget.directory, "manifest.json")),
    claims: claimFiles,
    claimSnapshot: claimed,
    snapshot,
  },
  brokenBudget: {
    directory: brokenBudget.directory.split(ROOT).join("${ROOT}"),
    manifest: text(path.join(brokenBudget.directory, "manifest.json")),
  },
  cases: fanoutCases,
});

// ---------------------------------------------------------------- recovery
const minimal = {
  version: 1,
  runFanoutBudget: d,
  sourceRunId: "fixture-run",
  agent: "worker",
  cwd: "/work",
  systemPromptMode: "append",
  inheritProjectContext: true,
  inheritSkills: true,
  outputMode: "inline",
  maxSubagentDepth: 2,
  share: false,
};
const recoveryCases: Array<[string, Record<string, unknown>]> = [
  ["minimal", minimal],
  ["turn-budget", { ...minimal, initialTurnBudget: { maxTurns: 4, graceTurns: 2 } }],
  ["grace-turns-null", { ...minimal, initialTurnBudget: { maxTurns: 4, graceTurns: null } }],
  ["grace-turns-absent", { ...minimal, initialTurnBudget: { maxTurns: 4 } }],
  ["grace-turns-negative", { ...minimal, initialTurnBudget: { maxTurns: 4, graceTurns: -1 } }],
  ["grace-turns-string", { ...minimal, initialTurnBudget: { maxTurns: 4, graceTurns: "1" } }],
  ["max-turns-zero", { ...minimal, initialTurnBudget: { maxTurns: 0 } }],
  ["turn-budget-unknown-key", { ...minimal, initialTurnBudget: { maxTurns: 4, extra: 1 } }],
  ["unknown-field", { ...minimal, token: "x" }],
  ["version-2", { ...minimal, version: 2 }],
  ["agent-missing", { ...minimal, agent: undefined }],
  ["share-string", { ...minimal, share: "no" }],
  ["tool-budget-soft-over-hard", { ...minimal, initialToolBudget: { hard: 3, soft: 4 } }],
  ["fanout-limit-not-manifest", { ...minimal, runFanoutBudget: { ...d, limit: 9 } }],
];
const recoveryDir = path.join(ROOT, "async-subagent-runs", "fixture-recovery");
fs.mkdirSync(recoveryDir, { recursive: true });
write("recovery.json", {
  ...header,
  kind: "recovery",
  reader: "readAsyncRecoveryDescriptor",
  budget: { directory: d.directory },
  cases: recoveryCases.map(([name, value]) => {
    const content = JSON.stringify(value);
    fs.writeFileSync(path.join(recoveryDir, "recovery-descriptor.json"), fill(content));
    return { name, content, ...verdict(() => resume.readAsyncRecoveryDescriptor(recoveryDir)) };
  }),
});

// ---------------------------------------------------------------- process terminal
const proofDir = path.join(ROOT, "async-subagent-runs", "fixture-proof");
fs.mkdirSync(proofDir, { recursive: true });
const close = { processInstanceId: "runner-1", pid: DEAD_PID, exitCode: 0, signal: null, closedAt: NOW };
let finalized: unknown;
let finalizeError: string | null = null;
try {
  finalized = terminal.finalizeProcessTerminal(proofDir, "fixture-proof", close);
} catch (error) {
  finalizeError = message(error);
}
const proofFile = path.join(proofDir, "process-terminal.json");
const writtenProof = fs.existsSync(proofFile) ? text(proofFile) : null;
const base = { version: 1, state: "unknown", runId: "fixture-proof", runnerProcessInstanceId: "runner-1", reason: "runner-candidate-missing" };
const proofCases: Array<[string, unknown]> = [
  ["written-by-finalize", writtenProof ? JSON.parse(writtenProof) : base],
  ["unknown-stale-repair", { ...base, reason: "stale-repair" }],
  ["state-bogus", { ...base, state: "bogus" }],
  ["version-2", { ...base, version: 2 }],
  ["run-id-number", { ...base, runId: 5 }],
  ["unknown-without-reason", { ...base, reason: undefined }],
  ["not-an-object", [1]],
];
write("process-terminal.json", {
  ...header,
  kind: "process-terminal",
  reader: "readProcessTerminal",
  finalize: { input: close, result: generalize(finalized ?? null), error: finalizeError, file: writtenProof },
  cases: proofCases.map(([name, value]) => {
    const content = JSON.stringify(value);
    fs.writeFileSync(proofFile, fill(content));
    const read = terminal.readProcessTerminal(proofDir, { runId: "fixture-proof", runnerProcessInstanceId: "runner-1" });
    // The reader never throws on bad content: it substitutes an unknown proof.
    const replaced = read?.reason === "proof-write-failed" && (value as { reason?: string })?.reason !== "proof-write-failed";
    const error = replaced ? String(read.diagnostic ?? "").split(ROOT).join("${ROOT}") : null;
    return { name, content, valid: !replaced, error };
  }),
});

// ---------------------------------------------------------------- capacity
const capacityRoot = path.join(ROOT, "session-active-async-capacity");
const ownerRunDir = path.join(ROOT, "async-subagent-runs", "fixture-capacity");
fs.mkdirSync(ownerRunDir, { recursive: true });
const handle = capacity.acquireActiveAsyncCapacity(
  { sessionId: "fixture-session", limit: 2, runId: "fixture-capacity", kind: "runner", asyncDir: ownerRunDir },
  { rootDir: capacityRoot },
);
const ownerFiles: Record<string, string> = {};
for (const dir of fs.readdirSync(capacityRoot, { recursive: true }) as string[]) {
  if (dir.endsWith("owner.json")) ownerFiles[dir] = text(path.join(capacityRoot, dir));
}
const inspection = capacity.inspectActiveAsyncCapacityOwner({ runId: "fixture-capacity", sessionId: "fixture-session" }, { rootDir: capacityRoot });
const capacitySnapshot = capacity.reconcileActiveAsyncCapacity("fixture-session", 2, { rootDir: capacityRoot });
write("capacity.json", {
  ...header,
  kind: "capacity-owner",
  writer: "acquireActiveAsyncCapacity",
  sessionKey: capacity.activeAsyncCapacitySessionKey("fixture-session"),
  owners: ownerFiles,
  release: generalize(inspection.release),
  snapshot: generalize({ used: capacitySnapshot.used, limit: capacitySnapshot.limit }),
  handle: handle ? true : false,
});

// ---------------------------------------------------------------- listing
// Status files in the shape the reference's runner writes, then the
// reference's own listing (which reconciles, and so may rewrite them).
const listRoot = path.join(ROOT, "list");
const runsDir = path.join(listRoot, "async-subagent-runs");
const resultsDir = path.join(listRoot, "async-subagent-results");
fs.mkdirSync(resultsDir, { recursive: true });
const step = (status: string) => ({ agent: "worker", status, startedAt: "${AGO:60000}" });
const run = (id: string, state: string, extra: Record<string, unknown> = {}) => ({
  runId: id,
  lifecycleArtifactVersion: 3,
  mode: "single",
  state,
  startedAt: "${AGO:60000}",
  lastUpdate: "${AGO:1000}",
  currentStep: 0,
  steps: [step(state === "queued" ? "pending" : state)],
  processTerminal: { version: 1, state: "pending", runId: id, runnerProcessInstanceId: `runner-${id}` },
  ...extra,
});
const listRuns: Array<{ id: string; status: Record<string, unknown>; result?: unknown }> = [
  { id: "queued-live-old", status: run("queued-live-old", "queued", { pid: "${LIVE_PID}", lastUpdate: "${AGO:172800000}" }) },
  { id: "queued-dead", status: run("queued-dead", "queued", { pid: "${DEAD_PID}" }) },
  { id: "queued-no-pid-old", status: run("queued-no-pid-old", "queued", { lastUpdate: "${AGO:172800000}" }) },
  { id: "running-no-pid", status: run("running-no-pid", "running", { lastUpdate: "${AGO:172800000}" }) },
  { id: "running-live-fresh", status: run("running-live-fresh", "running", { pid: "${LIVE_PID}" }) },
  { id: "running-live-old", status: run("running-live-old", "running", { pid: "${LIVE_PID}", lastUpdate: "${AGO:172800000}" }) },
  { id: "running-dead", status: run("running-dead", "running", { pid: "${DEAD_PID}" }) },
  { id: "running-result-success", status: run("running-result-success", "running", { pid: "${LIVE_PID}" }), result: { id: "running-result-success", success: true, state: "complete", exitCode: 0, results: [{ agent: "worker", success: true, model: "m:high" }] } },
  { id: "running-result-stopped", status: run("running-result-stopped", "running", { pid: "${DEAD_PID}" }), result: { id: "running-result-stopped", success: false, state: "stopped", exitCode: 1, results: [{ agent: "worker", error: "halted" }] } },
  { id: "queued-result-paused", status: run("queued-result-paused", "queued"), result: { id: "queued-result-paused", success: false, exitCode: 0 } },
  { id: "complete", status: run("complete", "complete", { endedAt: "${AGO:500}", processTerminal: undefined }) },
];
for (const r of listRuns) {
  const dir = path.join(runsDir, r.id);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "status.json"), fill(JSON.stringify(r.status)));
  if (r.result) fs.writeFileSync(path.join(resultsDir, `${r.id}.json`), fill(JSON.stringify(r.result)));
}
const before = new Map(listRuns.map((r) => [r.id, fs.readFileSync(path.join(runsDir, r.id, "status.json"), "utf-8")]));
const summaries = listing.listAsyncRuns(runsDir, { resultsDir });
const formatted = listing.formatAsyncRunList(summaries, "Async runs");
write("listing.json", {
  ...header,
  reader: "listAsyncRuns (reconciling) and formatAsyncRunList",
  runs: listRuns.map((r) => {
    const summary = summaries.find((s: { id: string }) => s.id === r.id);
    const after = fs.readFileSync(path.join(runsDir, r.id, "status.json"), "utf-8");
    const status = JSON.parse(after);
    const resultFile = path.join(resultsDir, `${r.id}.json`);
    return {
      id: r.id,
      status: JSON.stringify(r.status),
      result: r.result ? JSON.stringify(r.result) : null,
      expect: {
        state: summary?.state ?? null,
        rewritten: after !== before.get(r.id),
        stepStates: (status.steps ?? []).map((s: { status: string }) => s.status),
        proof: status.processTerminal ? { state: status.processTerminal.state, reason: status.processTerminal.reason ?? null } : null,
        resultFileWritten: !r.result && fs.existsSync(resultFile),
        resultFileState: fs.existsSync(resultFile) ? JSON.parse(fs.readFileSync(resultFile, "utf-8")).state ?? null : null,
      },
    };
  }),
  formatted: formatted.split(ROOT).join("${ROOT}"),
});

// ---------------------------------------------------------------- ours → reference
// Files written by our binary on this same root, fed to the reference's readers.
const ours = (...args: string[]) => execFileSync(binary, ["--root", ROOT, ...args], { encoding: "utf-8", env: { ...process.env, SUBAGENTS_SESSION_ID: "fixture-ours" } });
const accepted: Record<string, { accepted: boolean; detail: unknown }> = {};
const record = (kind: string, read: () => unknown) => {
  try {
    accepted[kind] = { accepted: true, detail: generalize(read() ?? null) };
  } catch (error) {
    accepted[kind] = { accepted: false, detail: message(error).split(ROOT).join("${ROOT}") };
  }
};
const ourDescriptor = JSON.parse(ours("budget", "create", "--root-run-id", "ours", "--limit", "4"));
ours("budget", "claim", "--path", "x", "--descriptor", writeTemp("ours-descriptor.json", JSON.stringify(ourDescriptor)));
record("fanout-descriptor", () => budget.validateRunFanoutBudgetDescriptor(ourDescriptor));
record("fanout-manifest-and-claims", () => budget.getRunFanoutBudgetSnapshot(ourDescriptor));
record("fanout-claim-after-ours", () => budget.claimRunFanoutBatch(ourDescriptor, ["reference-after-ours"]));
const launched = JSON.parse(ours("run", "--json", "--max-active", "2", "--", "sh", "-c", "exit 0"));
ours("wait", launched.runId);
const ourRunDir = path.join(ROOT, "async-subagent-runs", launched.runId);
record("run-fanout-budget.json", () => budget.readRunFanoutBudgetDescriptor(ourRunDir));
record("status.json", () => {
  const found = listing.listAsyncRuns(path.join(ROOT, "async-subagent-runs"), { runId: launched.runId });
  if (found.length !== 1 || found[0].state !== "complete") throw new Error(`listed as ${JSON.stringify(found.map((s: { state: string }) => s.state))}`);
  return { state: found[0].state };
});
record("process-terminal.json", () => {
  const proof = terminal.readProcessTerminal(ourRunDir, { runId: launched.runId });
  if (!proof || proof.reason === "proof-write-failed") throw new Error(String(proof?.diagnostic ?? "missing"));
  return { state: proof.state };
});
record("process-terminal-candidate.json", () => {
  const candidate = terminal.readProcessTerminalCandidate(ourRunDir);
  if (!candidate) throw new Error("missing");
  return { runId: candidate.runId === launched.runId };
});
// A capacity owner of ours: a run that is still going holds its slot.
const holding = JSON.parse(ours("run", "--json", "--max-active", "2", "--", "sh", "-c", "read x"));
record("capacity-owner", () => {
  const inspection = capacity.inspectActiveAsyncCapacityOwner({ runId: holding.runId, sessionId: "fixture-ours" });
  if (inspection.relation !== "current") throw new Error(`relation ${inspection.relation}`);
  return { relation: inspection.relation, release: inspection.release.state };
});
ours("stop", holding.runId);
// Our recovery descriptor (from a snapshot), pointed at a live budget of ours.
const recoverySnap = fs.readFileSync(path.join(repoRoot, "xtask/snapshots/runs__recovery-descriptor.snap"), "utf-8");
const recoveryBody = JSON.parse(recoverySnap.split(/^---$/m).slice(2).join("---"));
recoveryBody.runFanoutBudget = ourDescriptor;
const ourRecoveryDir = path.join(ROOT, "async-subagent-runs", "ours-recovery");
fs.mkdirSync(ourRecoveryDir, { recursive: true });
fs.writeFileSync(path.join(ourRecoveryDir, "recovery-descriptor.json"), JSON.stringify(recoveryBody, null, 2));
record("recovery-descriptor.json", () => {
  const read = resume.readAsyncRecoveryDescriptor(ourRecoveryDir);
  if (!read) throw new Error("missing");
  return { agent: read.agent };
});
write("ours-read-by-reference.json", { ...header, kinds: accepted });

function writeTemp(name: string, content: string): string {
  const file = path.join(process.env.TMPDIR!, name);
  fs.writeFileSync(file, content);
  return file;
}
console.log(`fixtures written to ${fixturesDir}`);
