//! Typed form of the version-1 recovery descriptor (docs/protocol/recovery.md §2).
//!
//! Field order is the order the reference writes. Nested objects for which
//! the reference accepts unknown keys keep them in `extra`, so a descriptor
//! written by pi-subagents survives a read → write round trip unchanged.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

/// File name of the descriptor inside a run directory.
pub const DESCRIPTOR_FILE: &str = "recovery-descriptor.json";

/// The version-1 async recovery descriptor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecoveryDescriptor {
    /// Schema version, always 1.
    pub version: u32,
    /// SHA-256 (64 lowercase hex chars) of the run's launch contract file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_contract_digest: Option<String>,
    /// The run's fan-out budget descriptor.
    pub run_fanout_budget: RunFanoutBudget,
    /// Run id of the run this descriptor belongs to.
    pub source_run_id: String,
    /// `{ "version": 1 }` when the launch carried an agent contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_contract: Option<AgentContract>,
    /// Agent name.
    pub agent: String,
    /// Launch-resolved child-extension projection (not validated, as in the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_resolved_extensions: Option<Value>,
    /// Child session file, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// Resolved child working directory.
    pub cwd: String,
    /// Resolved primary model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Fallback models of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_models: Option<Vec<String>>,
    /// Thinking level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// Tools of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Extensions of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<String>>,
    /// Extensions loaded only in subagents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_only_extensions: Option<Vec<String>>,
    /// Directly exposed MCP tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_direct_tools: Option<Vec<String>>,
    /// The agent's raw system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// How the system prompt combines with the default one.
    pub system_prompt_mode: SystemPromptMode,
    /// Whether project context files are inherited.
    pub inherit_project_context: bool,
    /// Whether skills are inherited.
    pub inherit_skills: bool,
    /// Skills resolved for the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<String>>,
    /// Skill search paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_path: Option<Vec<String>>,
    /// Path of the agent definition file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_file_path: Option<String>,
    /// Completion guard flag of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_guard: Option<bool>,
    /// Agent memory location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Resolved output file path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_path: Option<String>,
    /// Output mode.
    pub output_mode: OutputMode,
    /// JSON schema of structured output (content not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output_schema: Option<Map<String, Value>>,
    /// Public acceptance input: `false`, a level string or an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Value>,
    /// Resolved control config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_config: Option<ControlConfig>,
    /// Raw per-run intercom bridge override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intercom_bridge: Option<IntercomBridge>,
    /// Absolute deadline, ms since the epoch (kept as the number read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absolute_deadline_at: Option<Number>,
    /// Turn budget of the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_turn_budget: Option<TurnBudget>,
    /// Tool budget of the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_tool_budget: Option<ToolBudget>,
    /// Maximum nesting depth.
    pub max_subagent_depth: u64,
    /// Output truncation limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<MaxOutput>,
    /// Whether session sharing is enabled.
    pub share: bool,
    /// Session directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_dir: Option<String>,
    /// Artifacts directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts_dir: Option<String>,
    /// Artifact settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_config: Option<ArtifactConfig>,
    /// Effective capability ceiling (normalised).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_ceiling: Option<CapabilityCeiling>,
}

/// The fan-out budget descriptor (docs/protocol/fanout-budget.md §4), normalised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunFanoutBudget {
    /// Always 1.
    pub version: u32,
    /// Root run of the budget.
    pub root_run_id: String,
    /// Budget directory (its realpath once the live check ran).
    pub directory: String,
    /// Claim limit.
    pub limit: u64,
    /// Claim path of this run inside its parent, when nested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_path: Option<String>,
}

/// `{ "version": 1 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentContract {
    /// Always 1.
    pub version: u32,
}

/// `systemPromptMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemPromptMode {
    /// Appended to the default prompt.
    Append,
    /// Replaces the default prompt.
    Replace,
}

/// `outputMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputMode {
    /// Output returned inline.
    Inline,
    /// Output only written to the output file.
    FileOnly,
}

/// `memory`: `{scope, path}`; other keys are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Memory scope.
    pub scope: MemoryScope,
    /// Memory path.
    pub path: String,
    /// Keys the reference tolerates and this crate passes through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `memory.scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryScope {
    /// Per project.
    Project,
    /// Per user.
    User,
}

/// `initialTurnBudget`, normalised to `{maxTurns, graceTurns}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnBudget {
    /// Soft turn limit (>= 1).
    pub max_turns: u64,
    /// Extra turns after the soft limit (>= 0).
    pub grace_turns: u64,
}

/// `initialToolBudget` (raw; unknown keys kept as the reference keeps them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolBudget {
    /// Hard limit of tool calls (>= 1).
    pub hard: u64,
    /// Soft limit (1..=hard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft: Option<u64>,
    /// Tools blocked once the budget is exhausted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<ToolBlock>,
    /// Keys the reference tolerates and this crate passes through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `initialToolBudget.block`: `"*"` or a non-empty list of tool names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolBlock {
    /// `"*"`: every tool.
    All,
    /// The named tools.
    Tools(Vec<String>),
}

impl Serialize for ToolBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ToolBlock::All => serializer.serialize_str("*"),
            ToolBlock::Tools(tools) => tools.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ToolBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) if s == "*" => Ok(ToolBlock::All),
            other => Vec::<String>::deserialize(other)
                .map(ToolBlock::Tools)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// `maxOutput`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaxOutput {
    /// Byte limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Line limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// Keys the reference tolerates and this crate passes through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `artifactConfig`; `dir` and other keys are kept in `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactConfig {
    /// Artifacts enabled.
    pub enabled: bool,
    /// Save the input.
    pub include_input: bool,
    /// Save the output.
    pub include_output: bool,
    /// Save the JSONL event stream.
    pub include_jsonl: bool,
    /// Save metadata.
    pub include_metadata: bool,
    /// Save the transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_transcript: Option<bool>,
    /// Age in days after which artifacts are cleaned up.
    pub cleanup_days: u64,
    /// Keys the reference tolerates (notably `dir`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `intercomBridge` (no other keys allowed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntercomBridge {
    /// Bridge mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BridgeMode>,
    /// Instruction file (may be empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction_file: Option<String>,
    /// Deliver results through the bridge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_delivery: Option<bool>,
}

/// `intercomBridge.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BridgeMode {
    /// No bridge.
    Off,
    /// Only for forked runs.
    ForkOnly,
    /// Always.
    Always,
}

/// `controlConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlConfig {
    /// Control notices enabled.
    pub enabled: bool,
    /// Needs-attention threshold, ms.
    pub needs_attention_after_ms: u64,
    /// Active-notice threshold, ms.
    pub active_notice_after_ms: u64,
    /// Failed tool attempts before attention.
    pub failed_tool_attempts_before_attention: u64,
    /// Active-notice threshold, turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_notice_after_turns: Option<u64>,
    /// Active-notice threshold, tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_notice_after_tokens: Option<u64>,
    /// Events that notify.
    pub notify_on: Vec<NotifyOn>,
    /// Channels notified.
    pub notify_channels: Vec<NotifyChannel>,
    /// Keys the reference tolerates and this crate passes through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `controlConfig.notifyOn` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyOn {
    /// A long-running active child.
    ActiveLongRunning,
    /// A child that needs attention.
    NeedsAttention,
}

/// `controlConfig.notifyChannels` item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyChannel {
    /// Event stream.
    Event,
    /// Async notification.
    Async,
    /// Intercom message.
    Intercom,
}

/// Normalised capability ceiling (docs/protocol/recovery.md §4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityCeiling {
    /// Always 1.
    pub version: u32,
    /// Allowed tools (sorted, unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// Allowed agents (sorted, unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_agents: Option<Vec<String>>,
    /// `Some(true)` when extensions are denied; never `Some(false)` after a read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_extensions: Option<bool>,
    /// Where the ceiling came from (sorted, unique).
    pub sources: Vec<String>,
}
