// One pi-subagents 0.49 claimer: waits for a start file, then claims one path
// on a run fan-out budget with the package's own claimRunFanoutBatch and
// prints one JSON line {ok, ms, snapshot | error}.
// Usage: node --import tsx claim.mts <descriptor.json> <path> [<start file>]
// PI_SUBAGENTS_PKG is the installed package directory; TMPDIR must make the
// package's temp root contain the budget directory.
import * as fs from "node:fs";
import * as path from "node:path";
import { pathToFileURL } from "node:url";

const pkg = process.env.PI_SUBAGENTS_PKG!;
const { claimRunFanoutBatch } = await import(
  pathToFileURL(path.join(pkg, "src/runs/shared/run-fanout-budget.ts")).href
);

const [descriptorFile, claimPath, startFile] = process.argv.slice(2);
const descriptor = JSON.parse(fs.readFileSync(descriptorFile, "utf-8"));
if (startFile) {
  fs.writeFileSync(`${startFile}.ready-${process.pid}`, "");
  const view = new Int32Array(new SharedArrayBuffer(4));
  while (!fs.existsSync(startFile)) Atomics.wait(view, 0, 0, 2);
}
const started = performance.now();
try {
  const snapshot = claimRunFanoutBatch(descriptor, [claimPath]);
  const ms = performance.now() - started;
  console.log(JSON.stringify({ ok: true, ms, snapshot }));
} catch (error) {
  const ms = performance.now() - started;
  const e = error as Error & { rejection?: unknown };
  console.log(JSON.stringify({ ok: false, ms, name: e.name, error: e.message, rejection: e.rejection ?? null }));
}
