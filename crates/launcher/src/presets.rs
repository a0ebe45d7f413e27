//! Named agents: `subagents agents [list|show|prompt]`, and the preset a
//! `run --agent NAME` (without COMMAND) launches. Definitions, lookup and
//! rendering live in the `agents` crate; this module only wires them.

use std::path::{Path, PathBuf};

use agents::catalog::{self, Catalog, Found};
use agents::{AgentDefinition, Invocation, RunnerKind};
use serde_json::{Map, Value, json};

use crate::api::{AgentList, AgentPrompt, AgentView, AgentsAction, AgentsOutcome, AgentsRequest};
use crate::error::{Error, ErrorKind, Result};

/// What `run --agent NAME` launches, and what its recovery descriptor records.
pub struct Preset {
    /// The definition.
    pub definition: AgentDefinition,
    /// The rendered command and environment.
    pub invocation: Invocation,
}

/// The descriptor fields a preset run fills (version-1 names, docs/protocol/recovery.md §2.1).
#[derive(Debug, Clone, Default)]
pub struct PresetRecord {
    /// `model`.
    pub model: Option<String>,
    /// `thinking` (a known level only).
    pub thinking: Option<String>,
    /// `tools`.
    pub tools: Option<Vec<String>>,
    /// `systemPromptMode` (`append` / `replace`).
    pub system_prompt_mode: String,
    /// `agentFilePath`.
    pub agent_file_path: Option<String>,
    /// `sessionFile`, when known at launch (a revival's leased file).
    pub session_file: Option<PathBuf>,
    /// Run by pi, claude or codex, whose session file is their own (not
    /// the run's output log, as for a `command`).
    pub agent_cli: bool,
}

impl Preset {
    /// The descriptor fields of this preset.
    pub fn record(&self) -> PresetRecord {
        let def = &self.definition;
        // docs/protocol/recovery.md §2.3: the model's `:<level>` suffix wins over `thinking`.
        let suffix = def
            .model
            .as_deref()
            .and_then(|m| m.rsplit_once(':'))
            .map(|(_, level)| level.to_owned())
            .filter(|level| agents::definition::THINKING_LEVELS.contains(&level.as_str()));
        PresetRecord {
            model: def.model.clone(),
            thinking: suffix.or_else(|| def.thinking.clone()),
            tools: (!def.tools.is_empty()).then(|| def.tools.clone()),
            system_prompt_mode: def.system_prompt_mode.as_str().into(),
            agent_file_path: Some(def.path.display().to_string()),
            session_file: None,
            agent_cli: def.runner.is_agent_cli(),
        }
    }
}

/// The catalog seen from `cwd`: its project, then the user's config dir.
pub fn catalog(cwd: &Path) -> Catalog {
    let env_path = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let project = catalog::project_root(cwd);
    let user = catalog::user_dir(
        env_path("XDG_CONFIG_HOME").as_deref(),
        env_path("HOME").as_deref(),
    );
    Catalog::load(&catalog::search_dirs(project.as_deref(), user.as_deref()))
}

/// Finds `name` from `cwd` and renders its invocation.
pub fn resolve(name: &str, cwd: &Path) -> Result<Preset> {
    resolve_in(&catalog(cwd), name, "failed to launch run")
}

/// Finds `name` in `catalog` and renders its invocation; an unknown name's
/// error starts with `context` (the spec step's field, for a spec).
pub fn resolve_in(catalog: &Catalog, name: &str, context: &str) -> Result<Preset> {
    let Some(found) = catalog.find(name) else {
        let mut error = Error::of(
            ErrorKind::UnknownAgent,
            format!("{context}: no agent named '{name}'"),
        );
        error.notes = catalog.errors.iter().map(ToString::to_string).collect();
        return Err(error);
    };
    let session_id = uuid::Uuid::new_v4().to_string();
    let invocation = agents::preset::render(&found.definition, &session_id)
        .map_err(|e| Error::failed(e.to_string()))?;
    Ok(Preset {
        definition: found.definition.clone(),
        invocation,
    })
}

/// A definition's `idleTimeout` in ms (`Some(0)`: off), parsed with the
/// one duration syntax; an error names the file and the field.
pub fn idle_timeout_ms(def: &AgentDefinition) -> Result<Option<u64>> {
    let Some(text) = &def.idle_timeout else {
        return Ok(None);
    };
    crate::spec::duration_ms(text).map(Some).map_err(|e| {
        Error::failed(format!(
            "failed to launch run: agent definition {}: idleTimeout: {e}",
            atomic_file::escape_path(&def.path)
        ))
    })
}

/// The agents of the current directory's project and of the user.
pub fn agents(request: &AgentsRequest) -> Result<AgentsOutcome> {
    let cwd = std::env::current_dir()
        .map_err(|e| Error::failed(format!("failed to read current directory: {e}")))?;
    let catalog = catalog(&cwd);
    let warnings: Vec<String> = catalog.errors.iter().map(ToString::to_string).collect();
    Ok(match request.action {
        AgentsAction::List => AgentsOutcome::List(AgentList {
            agents: catalog.agents.iter().map(summary).collect(),
            errors: catalog.errors.iter().map(error_json).collect(),
            warnings,
        }),
        AgentsAction::Show => {
            let name = request
                .name
                .as_deref()
                .ok_or_else(|| Error::usage("failed to show agent: give the agent's name"))?;
            let mut view = show(&catalog, name)?;
            view.warnings = warnings;
            AgentsOutcome::Show(view)
        }
        AgentsAction::Prompt => AgentsOutcome::Prompt(AgentPrompt {
            snippet: agents::snippet::delegation_snippet(&catalog.agents),
            warnings,
        }),
    })
}

fn show(catalog: &Catalog, name: &str) -> Result<AgentView> {
    let found = catalog.find(name).ok_or_else(|| {
        Error::of(
            ErrorKind::UnknownAgent,
            format!("failed to show agent: no agent named '{name}'"),
        )
    })?;
    let def = &found.definition;
    // The session id is a placeholder here: `run` picks a fresh one.
    let placeholder = agents::preset::PLACEHOLDER_SESSION_ID;
    let invocation =
        agents::preset::render(def, placeholder).map_err(|e| Error::failed(e.to_string()))?;
    let mut agent = summary(found);
    agent.insert("systemPrompt".into(), json!(def.system_prompt));
    agent.insert("argv".into(), json!(invocation.argv));
    agent.insert("env".into(), json!(invocation.env));
    Ok(AgentView {
        agent,
        command: agents::preset::shell_words(&invocation.argv),
        task_on_stdin: def.runner != RunnerKind::Command,
        warnings: Vec::new(),
    })
}

fn summary(found: &Found) -> Map<String, Value> {
    let def = &found.definition;
    let value = json!({
        "name": def.name,
        "description": def.description,
        "runner": def.runner.as_str(),
        "model": def.model,
        "thinking": def.thinking,
        "tools": def.tools,
        "cwd": def.cwd,
        "timeoutMs": def.timeout_ms,
        "idleTimeout": def.idle_timeout,
        "systemPromptMode": def.system_prompt_mode.as_str(),
        "scope": found.scope.as_str(),
        "path": def.path,
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn error_json(error: &agents::DefinitionError) -> Value {
    match error {
        agents::DefinitionError::Invalid {
            path,
            line,
            message,
        } => {
            json!({"path": path, "line": line, "message": message})
        }
        agents::DefinitionError::Read { path, source } => {
            json!({"path": path, "line": null, "message": source.to_string()})
        }
        other => json!({"path": null, "line": null, "message": other.to_string()}),
    }
}

/// Adds a preset's fields to a recovery descriptor being written; the
/// session file is the agent's own (known for a revival), never an output log.
pub fn fill_descriptor(descriptor: &mut Value, preset: Option<&PresetRecord>) {
    let Some(preset) = preset else { return };
    let fields = [
        ("model", json!(preset.model)),
        (
            "thinking",
            json!(
                preset
                    .thinking
                    .as_ref()
                    .filter(|t| agents::definition::THINKING_LEVELS.contains(&t.as_str()))
            ),
        ),
        ("tools", json!(preset.tools)),
        ("agentFilePath", json!(preset.agent_file_path)),
    ];
    for (key, value) in fields {
        match value {
            Value::Null => {
                descriptor.as_object_mut().map(|o| o.remove(key));
            }
            value => descriptor[key] = value,
        }
    }
    descriptor["systemPromptMode"] = json!(preset.system_prompt_mode);
    if preset.agent_cli {
        match &preset.session_file {
            Some(file) => descriptor["sessionFile"] = json!(file),
            None => {
                descriptor.as_object_mut().map(|o| o.remove("sessionFile"));
            }
        }
    }
}

/// How a preset run is resumed: the CLI's own session, the follow-up as
/// the new user turn.
pub struct Continuation {
    /// The argv that resumes the session.
    pub command: Vec<String>,
    /// The agent's session file (leased for the revival).
    pub session_file: PathBuf,
    /// The contract's environment plus the session id.
    pub env: std::collections::BTreeMap<String, String>,
    /// The descriptor fields of the revival.
    pub record: PresetRecord,
}

/// The preset a run was launched with, from its (digest-verified) contract.
pub fn preset_of(contract: &recovery::LaunchContract) -> Option<RunnerKind> {
    let kind = RunnerKind::parse(contract.env.get(agents::RUNNER_ENV)?)?;
    kind.is_agent_cli().then_some(kind)
}

/// Whether a `command` run's definition asked for the revival wording.
pub fn wants_revival_prompt(contract: &recovery::LaunchContract) -> bool {
    contract
        .env
        .get(agents::RESUME_PROMPT_ENV)
        .map(String::as_str)
        == Some("revival")
}

/// Continues the session a preset run recorded in its status.
pub fn continue_session(
    kind: RunnerKind,
    source: &str,
    status: &status::RunStatus,
    descriptor: &recovery::RecoveryDescriptor,
    contract: &recovery::LaunchContract,
) -> Result<Continuation, String> {
    let id = status
        .extra
        .get("agentSessionId")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            format!("run '{source}' recorded no {kind} session id to resume (the agent ended before it started a session)")
        })?;
    let session_file = status
        .session_file
        .as_deref()
        .map(PathBuf::from)
        .filter(|f| f.is_file())
        .ok_or_else(|| {
            format!("run '{source}' has no {kind} session file for session '{id}' to resume")
        })?;
    let command = agents::preset::resume_argv(kind, &contract.command, id, Some(&session_file))
        .map_err(|e| e.to_string())?;
    let mut env = contract.env.clone();
    env.insert(agents::SESSION_ID_ENV.into(), id.into());
    let mode = serde_json::to_value(descriptor.system_prompt_mode).unwrap_or_default();
    let record = PresetRecord {
        model: descriptor.model.clone(),
        thinking: descriptor.thinking.clone(),
        tools: descriptor.tools.clone(),
        system_prompt_mode: mode.as_str().unwrap_or("replace").to_owned(),
        agent_file_path: descriptor.agent_file_path.clone(),
        session_file: Some(session_file.clone()),
        agent_cli: true,
    };
    Ok(Continuation {
        command,
        session_file,
        env,
        record,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(front: &str) -> Preset {
        let text = format!("---\n{front}\n---\nPrompt.\n");
        let path = Path::new("/p/.subagents/agents/a.md");
        let definition = agents::definition::parse_definition(&text, path, RunnerKind::Pi).unwrap();
        let invocation = agents::preset::render(&definition, "x").unwrap();
        Preset {
            definition,
            invocation,
        }
    }

    #[test]
    fn the_model_suffix_is_the_recorded_thinking() {
        let record = preset("model: sonnet:high\nthinking: low").record();
        assert_eq!(record.thinking.as_deref(), Some("high"));
        let record = preset("model: openai/gpt-5\nthinking: low").record();
        assert_eq!(record.thinking.as_deref(), Some("low"));
    }

    #[test]
    fn a_preset_descriptor_drops_the_output_log_as_session_file() {
        let mut descriptor =
            json!({"sessionFile": "/r/output-0.log", "systemPromptMode": "append", "model": "m"});
        let record = preset("tools: read").record();
        fill_descriptor(&mut descriptor, Some(&record));
        assert_eq!(
            descriptor,
            json!({"systemPromptMode": "replace", "tools": ["read"], "agentFilePath": "/p/.subagents/agents/a.md"})
        );
        let mut descriptor = json!({"sessionFile": "/r/output-0.log"});
        let record = preset("runner: command\ncommand: [cat]").record();
        fill_descriptor(&mut descriptor, Some(&record));
        assert_eq!(descriptor["sessionFile"], "/r/output-0.log");
    }
}
