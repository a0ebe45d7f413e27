// Drive the reference implementation's listing (pi-subagents@0.49.0,
// src/runs/background/async-status.ts: listAsyncRuns + formatAsyncRunList)
// against a runs directory, the way its `subagent` status/list path does.
//
//   PI_SUBAGENTS_DIR=/tmp/pi-ref/node_modules/pi-subagents \
//     node bench/reference/list.mjs <root>/async-subagent-runs active|all [--repeat N]
//
// The package ships TypeScript sources only; they are loaded with the jiti
// that the package itself depends on (node 20 has no --experimental-strip-types).
// With --repeat N the listing is run N more times in this process and the
// per-call times (ms, listing + formatting, no process start or module load)
// are printed as JSON on stderr.
import { createRequire } from "node:module";
import * as path from "node:path";
import { pathToFileURL } from "node:url";

const refDir = process.env.PI_SUBAGENTS_DIR;
if (!refDir) {
    console.error("set PI_SUBAGENTS_DIR to the installed pi-subagents package directory");
    process.exit(2);
}
const [runsDir, mode = "active", flag, repeatArg] = process.argv.slice(2);
if (!runsDir || !["active", "all"].includes(mode)) {
    console.error("usage: list.mjs <runs-dir> active|all [--repeat N]");
    process.exit(2);
}
const require = createRequire(path.join(refDir, "package.json"));
const { createJiti } = await import(pathToFileURL(require.resolve("jiti")).href);
const jiti = createJiti(pathToFileURL(path.join(refDir, "package.json")).href);
const m = await jiti.import(path.join(refDir, "src/runs/background/async-status.ts"));

// Same calls the reference makes: active = states queued/running (served from
// the .active-runs index), all = full directory scan; reconcile on (default).
const once = () => {
    const runs = mode === "all"
        ? m.listAsyncRuns(runsDir, {})
        : m.listAsyncRuns(runsDir, { states: ["queued", "running"] });
    return m.formatAsyncRunList(runs, mode === "all" ? "Async runs" : "Active async runs");
};
process.stdout.write(once() + "\n");
if (flag === "--repeat") {
    const n = Number(repeatArg);
    const times = [];
    for (let i = 0; i < n; i++) {
        const t0 = performance.now();
        once();
        times.push(performance.now() - t0);
    }
    console.error(JSON.stringify({ mode, times }));
}
