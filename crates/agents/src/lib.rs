#![doc = include_str!("../README.md")]
//!
//! Named agent definitions and the presets that run them.
//!
//! An agent definition is a markdown file whose YAML front matter names the
//! agent and how to run it, and whose body is its system prompt. The format
//! is a superset of the agent files of pi-subagents (`.pi/agents/*.md`) and
//! of Claude Code (`.claude/agents/*.md`) where their fields overlap:
//!
//! ```markdown
//! ---
//! name: reviewer
//! description: Reviews a diff
//! runner: claude          # pi | claude | codex | command
//! model: sonnet
//! thinking: high
//! tools: Read, Grep, Glob
//! timeout: 20m
//! ---
//! You review code. Report problems, do not edit files.
//! ```
//!
//! * [`definition`] parses one file; a bad file is an error naming the file
//!   and the line, and never hides the other files ([`catalog`]).
//! * [`catalog`] finds definitions in a project (`.subagents/agents/`, then
//!   `.pi/agents/` and `.claude/agents/`) and in the user's config
//!   directory; the project wins.
//! * [`preset`] renders the non-interactive invocation of a CLI from a
//!   definition, and the invocation that resumes the CLI's own session. The
//!   task never appears on an argv: every preset reads it from stdin.
//! * [`capture`] reads a CLI's structured output back: the final answer and
//!   the CLI's session id, and finds the CLI's session file.
//!
//! Everything here is a pure function of its inputs, except the directory
//! walks of [`catalog`] and [`capture::locate_session_file`].

#![warn(missing_docs)]

pub mod capture;
pub mod catalog;
pub mod definition;
pub mod preset;
pub mod snippet;

pub use catalog::{Catalog, Scope, SearchDir};
pub use definition::{AgentDefinition, DefinitionError, PromptMode, ResumePrompt, RunnerKind};
pub use preset::{Invocation, PresetError};

/// Environment variable a preset run carries (and hands to the agent CLI):
/// which runner rendered its command (`pi`, `claude`, `codex`, `command`).
pub const RUNNER_ENV: &str = "SUBAGENTS_AGENT_RUNNER";
/// Environment variable a preset run carries when the agent's session id is
/// chosen before the CLI starts (a new Claude session, or any resumed one).
pub const SESSION_ID_ENV: &str = "SUBAGENTS_AGENT_SESSION_ID";
/// Environment variable of a `command` run whose definition asks that a
/// resumed run's follow-up be wrapped in the reference's revival prompt.
pub const RESUME_PROMPT_ENV: &str = "SUBAGENTS_RESUME_PROMPT";
