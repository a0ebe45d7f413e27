//! The instructions a user pastes into `CLAUDE.md` / `AGENTS.md` so an agent
//! can delegate to named agents through `subagents` itself.

use crate::catalog::Found;

/// The snippet, listing the agents `found` (name and description).
pub fn delegation_snippet(found: &[Found]) -> String {
    let mut text = String::from(
        "## Delegating to subagents\n\
         \n\
         Long or parallel work can be delegated to a named background agent with the\n\
         `subagents` command. Give the task with `--task TEXT` or `--task-file FILE`;\n\
         the agent reads it on stdin, never from its command line.\n\
         \n\
         ```sh\n\
         id=$(subagents run --agent NAME --task \"what to do\" --json | jq -r .runId)\n\
         subagents wait \"$id\" --json      # blocks; exit 0 when the run completed\n\
         subagents logs \"$id\"             # the agent's final answer and its logs\n\
         subagents resume \"$id\" --task \"a follow-up\" --json   # continue its session\n\
         ```\n",
    );
    if found.is_empty() {
        text.push_str("\nList the agents with `subagents agents list`.\n");
        return text;
    }
    text.push_str("\nAgents:\n\n");
    for agent in found {
        let def = &agent.definition;
        match &def.description {
            Some(description) => text.push_str(&format!(
                "- `{}` ({}): {description}\n",
                def.name, def.runner
            )),
            None => text.push_str(&format!("- `{}` ({})\n", def.name, def.runner)),
        }
    }
    text
}
