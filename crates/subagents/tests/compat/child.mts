// A pi-subagents 0.49 child inside one of our runs: reads the inherited
// budget the way the package does (PI_SUBAGENT_RUN_FANOUT_BUDGET) and, when
// there is one, claims one path on it. Prints one JSON line.
// PI_SUBAGENTS_PKG is the installed package directory.
import * as path from "node:path";
import { pathToFileURL } from "node:url";

const pkg = process.env.PI_SUBAGENTS_PKG!;
const budget = await import(pathToFileURL(path.join(pkg, "src/runs/shared/run-fanout-budget.ts")).href);
const raw = process.env[budget.RUN_FANOUT_BUDGET_ENV];
const out: Record<string, unknown> = { hasEnv: raw !== undefined };
try {
  const descriptor = budget.decodeRunFanoutBudgetDescriptor(raw);
  if (descriptor) out.snapshot = budget.claimRunFanoutBatch(descriptor, ["pi-child"]);
} catch (error) {
  out.error = error instanceof Error ? error.message : String(error);
}
console.log(JSON.stringify(out));
