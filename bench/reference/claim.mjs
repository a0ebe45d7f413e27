// One claim of the reference's fan-out budget (pi-subagents@0.49.0,
// src/runs/shared/run-fanout-budget.ts: claimRunFanoutBatch), for the race
// in bench/race.py:
//
//   PI_SUBAGENTS_DIR=... node bench/reference/claim.mjs create <rootRunId> <limit>
//       prints the descriptor JSON
//   PI_SUBAGENTS_DIR=... node bench/reference/claim.mjs claim <descriptor.json> <path> <go-file>
//       waits until <go-file> exists, claims one path; exit 0 admitted, 3 refused
//
// The budget lives under the reference's temp root ($TMPDIR/pi-subagents-uid-<uid>).
import { createRequire } from "node:module";
import * as fs from "node:fs";
import * as path from "node:path";
import { pathToFileURL } from "node:url";

const refDir = process.env.PI_SUBAGENTS_DIR;
if (!refDir) {
    console.error("set PI_SUBAGENTS_DIR to the installed pi-subagents package directory");
    process.exit(2);
}
const require = createRequire(path.join(refDir, "package.json"));
const { createJiti } = await import(pathToFileURL(require.resolve("jiti")).href);
const jiti = createJiti(pathToFileURL(path.join(refDir, "package.json")).href);
const m = await jiti.import(path.join(refDir, "src/runs/shared/run-fanout-budget.ts"));

const [op, a, b, c] = process.argv.slice(2);
if (op === "create") {
    process.stdout.write(JSON.stringify(m.createRunFanoutBudget(a, Number(b))) + "\n");
} else if (op === "claim") {
    const descriptor = JSON.parse(fs.readFileSync(a, "utf8"));
    // Module loading is done; start together with the other claimants.
    while (!fs.existsSync(c)) await new Promise((r) => setTimeout(r, 1));
    try {
        m.claimRunFanoutBatch(descriptor, [b]);
        process.exit(0);
    } catch (e) {
        console.error(String(e && e.message || e));
        process.exit(3);
    }
} else {
    console.error("usage: claim.mjs create <rootRunId> <limit> | claim <descriptor.json> <path> <go-file>");
    process.exit(2);
}
