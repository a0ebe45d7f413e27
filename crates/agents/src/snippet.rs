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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::catalog::Scope;
    use crate::definition::{RunnerKind, parse_definition};

    fn found(text: &str) -> Found {
        Found {
            definition: parse_definition(text, Path::new("/a/x.md"), RunnerKind::Pi).unwrap(),
            scope: Scope::Project,
        }
    }

    #[test]
    fn the_snippet_shows_how_to_delegate_and_lists_each_agent() {
        let agents = [
            found("---\nname: rev\ndescription: Reviews a diff\nrunner: claude\n---\n"),
            found("---\nname: solo\nrunner: codex\n---\n"),
        ];
        let text = delegation_snippet(&agents);
        assert!(text.starts_with("## Delegating to subagents\n\n"), "{text}");
        for usage in [
            "id=$(subagents run --agent NAME --task \"what to do\" --json | jq -r .runId)\n",
            "subagents wait \"$id\" --json",
            "subagents logs \"$id\"",
            "subagents resume \"$id\" --task \"a follow-up\" --json",
            "`--task-file FILE`",
        ] {
            assert!(text.contains(usage), "{usage}: {text}");
        }
        assert!(
            text.ends_with("\nAgents:\n\n- `rev` (claude): Reviews a diff\n- `solo` (codex)\n"),
            "{text}"
        );
        assert!(!text.contains("subagents agents list"), "{text}");
        // With no agent found it says where to list them instead.
        let text = delegation_snippet(&[]);
        assert!(text.starts_with("## Delegating to subagents\n"), "{text}");
        assert!(
            text.ends_with("```\n\nList the agents with `subagents agents list`.\n"),
            "{text}"
        );
        assert!(!text.contains("Agents:"), "{text}");
    }
}
