//! `status.json`: the run status and its steps.
//!
//! Known fields are typed; every other key is kept in `extra` and written
//! back unchanged, because several writers (runner, finalizer, reconciler,
//! reference tools) share the file.

use std::fs::File;
use std::path::Path;

use process_identity::ProcessIdentity;
use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::layout::files;
use crate::{Error, Result, io_err};

/// Status field (an extension the reference ignores) set by the monitor
/// once a run is over and its proof is final:
/// `{"frozenAt": ms, "fanoutClaimsDir": path}`. From then on a listing takes
/// `processTerminal` from the status as it is instead of re-validating the
/// proof sidecar, and `runFanoutBudget` too as long as no claim was added
/// since (claims are never released and take the lowest free slot, so with
/// `used` claims frozen, slot file `used` existing means more were made —
/// by a nested run still going); only then is the budget counted again.
pub const LISTING_FACTS: &str = "listingFacts";

/// The source text of this module, for caches of what it parses: the
/// listing index of `subagents-listing` fingerprints it, so a build whose
/// parsing differs never takes another build's rows.
// Not part of the crate's stable API: only the fingerprint's input.
#[doc(hidden)]
pub const SOURCE: &str = include_str!("model.rs");

/// State of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Written before the runner exists.
    Queued,
    /// The runner is working.
    Running,
    /// Every step succeeded.
    Complete,
    /// A step or the run failed, timed out, or the runner vanished.
    Failed,
    /// Interrupted; the reference's runner may still be alive.
    Paused,
    /// Stopped on request.
    Stopped,
    /// A checkpoint was rejected.
    Rejected,
}

impl RunState {
    /// `queued` and `running` are active; everything else is over for listing purposes.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    /// Whether a run in this state keeps its session's capacity slot:
    /// the active states and `paused`. Every capacity verdict asks this.
    // Why `paused` differs from `is_active`: in the reference (0.49.0) a
    // paused run is over for listings, waits and stale repair, but it is
    // one that can go on: its runner may still be alive waiting on a
    // checkpoint decision, and a resume takes over its slot (a transfer)
    // rather than charging a second one. So a paused run is not active yet
    // holds its slot ("Queued, running, paused, and needs-attention runs
    // retain capacity", the reference's configuration docs).
    pub fn holds_capacity(self) -> bool {
        self.is_active() || self == Self::Paused
    }

    /// The lower-case name used on disk.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Complete => "complete",
            Self::Failed => "failed",
            Self::Paused => "paused",
            Self::Stopped => "stopped",
            Self::Rejected => "rejected",
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The external process of a step (the command the runner started).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalProcess {
    /// Pid of the child, also its process group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When it was spawned (ms).
    pub started_at: u64,
    /// When its exit was observed (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// `ended_at - started_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Exit code, when it exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal name, when a signal ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_signal: Option<String>,
    /// Extension: the pid-reuse-safe identity of the child (its group leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<ProcessIdentity>,
    /// Its captured stdout.
    pub stdout_path: String,
    /// Its captured stderr.
    pub stderr_path: String,
}

/// One flat step of a run (`steps[i]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Agent label.
    pub agent: String,
    /// `pending`, `running`, `complete`, `failed`, `paused`, `stopped` or `rejected`.
    pub status: String,
    /// Always `[prompt redacted]` when the step has a task; never the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Start (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Duration (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Exit code (0 complete, the child's code, 1 for stop/timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Step error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Set when a timeout ended the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// Set when a stop ended the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    /// The external process, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_process: Option<ExternalProcess>,
    /// Per-step process-terminal projection (kept as written; sanitised on read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_terminal: Option<Value>,
    /// Every other key, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The whole `status.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// `3` once a runner wrote the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_artifact_version: Option<u32>,
    /// Run id (readers fall back to the directory name when empty).
    #[serde(default)]
    pub run_id: String,
    /// Owning session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `single`, `parallel`, `chain` or `workflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Run state.
    pub state: RunState,
    /// Hidden from listings since (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_dismissed_at: Option<u64>,
    /// Run-level error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Last observed activity (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity_at: Option<u64>,
    /// Runner start (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// End (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Last meaningful change (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<u64>,
    /// Wall-clock limit of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `started_at + timeout_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<u64>,
    /// Set when the run timed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// Set when the run was stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<bool>,
    /// Runner pid (never cleared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Runner working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Flat index of the step most recently started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<usize>,
    /// Number of logical steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_step_count: Option<usize>,
    /// Run-level process-terminal projection (kept as written; sanitised on read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_terminal: Option<Value>,
    /// Fan-out snapshot `{used, limit, remaining}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_fanout_budget: Option<Value>,
    /// Flat steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<Step>>,
    /// Output of the current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// Latest child session file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<String>,
    /// Extension: the runner's pid-reuse-safe identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_identity: Option<ProcessIdentity>,
    /// Extension: the identity of the monitor, the runner's waiting parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_identity: Option<ProcessIdentity>,
    /// Extension: the identity of the process that wrote the queued record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher_identity: Option<ProcessIdentity>,
    /// Extension: the runner's instance id (also inside `processTerminal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_process_instance_id: Option<String>,
    /// Extension: why a stop was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Every other key, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A map key, borrowed from the input when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a field name")
            }

            fn visit_borrowed_str<E: de::Error>(
                self,
                v: &'de str,
            ) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Straight from the map, field by field: `#[serde(flatten)]` would buffer
/// the whole object first, and listings parse thousands of these.
impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_map(StepVisitor { listed: false })
    }
}

/// `listed`: for a listing, which never shows a step's `processTerminal`:
/// it is checked as a [`Value`] would be (see [`AnyJson`]) but not kept.
struct StepVisitor {
    listed: bool,
}

impl<'de> Visitor<'de> for StepVisitor {
    type Value = Step;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct Step")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Step, A::Error> {
        let mut out = Step::default();
        let mut agent = None;
        let mut status = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "agent" => agent = Some(map.next_value()?),
                "status" => status = Some(map.next_value()?),
                "description" => out.description = map.next_value()?,
                "startedAt" => out.started_at = map.next_value()?,
                "endedAt" => out.ended_at = map.next_value()?,
                "durationMs" => out.duration_ms = map.next_value()?,
                "exitCode" => out.exit_code = map.next_value()?,
                "error" => out.error = map.next_value()?,
                "timedOut" => out.timed_out = map.next_value()?,
                "stopped" => out.stopped = map.next_value()?,
                "externalProcess" => out.external_process = map.next_value()?,
                "processTerminal" if self.listed => {
                    map.next_value::<Option<AnyJson>>()?;
                }
                "processTerminal" => out.process_terminal = map.next_value()?,
                _ => {
                    let value: Value = map.next_value()?;
                    out.extra.insert(key.0.into_owned(), value);
                }
            }
        }
        out.agent = agent.ok_or_else(|| de::Error::missing_field("agent"))?;
        out.status = status.ok_or_else(|| de::Error::missing_field("status"))?;
        Ok(out)
    }
}

/// Straight from the map, field by field: `#[serde(flatten)]` would buffer
/// the whole object first, and listings parse thousands of these.
impl<'de> Deserialize<'de> for RunStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_map(RunStatusVisitor { listed: false })
    }
}

/// `listed`: see [`StepVisitor`].
#[derive(Clone, Copy)]
struct RunStatusVisitor {
    listed: bool,
}

impl<'de> DeserializeSeed<'de> for RunStatusVisitor {
    type Value = RunStatus;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<RunStatus, D::Error> {
        d.deserialize_map(self)
    }
}

/// `Option<Vec<Step>>`, each step read by a [`StepVisitor`].
struct StepsSeed {
    listed: bool,
}

impl<'de> DeserializeSeed<'de> for StepsSeed {
    type Value = Option<Vec<Step>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for StepsSeed {
    type Value = Option<Vec<Step>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        struct Steps {
            listed: bool,
        }
        impl<'de> Visitor<'de> for Steps {
            type Value = Vec<Step>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Vec<Step>, A::Error> {
                let mut steps = Vec::new();
                let step = StepSeed {
                    listed: self.listed,
                };
                while let Some(next) = seq.next_element_seed(step)? {
                    steps.push(next);
                }
                Ok(steps)
            }
        }
        d.deserialize_seq(Steps {
            listed: self.listed,
        })
        .map(Some)
    }
}

#[derive(Clone, Copy)]
struct StepSeed {
    listed: bool,
}

impl<'de> DeserializeSeed<'de> for StepSeed {
    type Value = Step;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Step, D::Error> {
        d.deserialize_map(StepVisitor {
            listed: self.listed,
        })
    }
}

/// A run's `processTerminal` for a listing: `Option<Value>`, accepted
/// exactly where one would be, but of an object only the keys a listing
/// reads kept (see [`LISTED_PROOF_KEYS`]).
struct ListedProof;

/// The keys of a run's `processTerminal` a listing reads: whether the
/// proof is observed, and whose it is (a fallback when the status does not
/// name its runner).
const LISTED_PROOF_KEYS: [&str; 3] = ["state", "runId", "runnerProcessInstanceId"];

impl<'de> DeserializeSeed<'de> for ListedProof {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ListedProof {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("option")
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_any(ListedProofValue).map(Some)
    }
}

/// A `processTerminal` value: anything but an object as a [`Value`]
/// reads it, an object with only [`LISTED_PROOF_KEYS`] kept.
struct ListedProofValue;

impl<'de> Visitor<'de> for ListedProofValue {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> std::result::Result<Value, A::Error> {
        Value::deserialize(de::value::SeqAccessDeserializer::new(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if LISTED_PROOF_KEYS.contains(&key.0.as_ref()) {
                let value: Value = map.next_value()?;
                kept.insert(key.0.into_owned(), value);
            } else {
                map.next_value::<AnyJson>()?;
            }
        }
        Ok(Value::Object(kept))
    }
}

/// Any JSON value, accepted exactly where a [`Value`] would be (the same
/// number, string and nesting checks) and dropped: nothing is allocated.
struct AnyJson;

impl<'de> Deserialize<'de> for AnyJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(AnyJson)
    }
}

impl<'de> Visitor<'de> for AnyJson {
    type Value = AnyJson;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_none<E: de::Error>(self) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<AnyJson, D::Error> {
        AnyJson::deserialize(d)
    }

    fn visit_unit<E: de::Error>(self) -> std::result::Result<AnyJson, E> {
        Ok(AnyJson)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<AnyJson, A::Error> {
        while seq.next_element::<AnyJson>()?.is_some() {}
        Ok(AnyJson)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<AnyJson, A::Error> {
        while map.next_key::<AnyJson>()?.is_some() {
            map.next_value::<AnyJson>()?;
        }
        Ok(AnyJson)
    }
}

impl<'de> Visitor<'de> for RunStatusVisitor {
    type Value = RunStatus;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct RunStatus")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RunStatus, A::Error> {
        let mut out = RunStatus::new(String::new(), RunState::Queued);
        let mut state = None;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.0.as_ref() {
                "lifecycleArtifactVersion" => out.lifecycle_artifact_version = map.next_value()?,
                "runId" => out.run_id = map.next_value()?,
                "sessionId" => out.session_id = map.next_value()?,
                "mode" => out.mode = map.next_value()?,
                "state" => state = Some(map.next_value()?),
                "displayDismissedAt" => out.display_dismissed_at = map.next_value()?,
                "error" => out.error = map.next_value()?,
                "lastActivityAt" => out.last_activity_at = map.next_value()?,
                "startedAt" => out.started_at = map.next_value()?,
                "endedAt" => out.ended_at = map.next_value()?,
                "lastUpdate" => out.last_update = map.next_value()?,
                "timeoutMs" => out.timeout_ms = map.next_value()?,
                "deadlineAt" => out.deadline_at = map.next_value()?,
                "timedOut" => out.timed_out = map.next_value()?,
                "stopped" => out.stopped = map.next_value()?,
                "pid" => out.pid = map.next_value()?,
                "cwd" => out.cwd = map.next_value()?,
                "currentStep" => out.current_step = map.next_value()?,
                "chainStepCount" => out.chain_step_count = map.next_value()?,
                "processTerminal" if self.listed => {
                    out.process_terminal = map.next_value_seed(ListedProof)?
                }
                "processTerminal" => out.process_terminal = map.next_value()?,
                "runFanoutBudget" => out.run_fanout_budget = map.next_value()?,
                "steps" => {
                    out.steps = map.next_value_seed(StepsSeed {
                        listed: self.listed,
                    })?
                }
                "outputFile" => out.output_file = map.next_value()?,
                "sessionFile" => out.session_file = map.next_value()?,
                "runnerIdentity" => out.runner_identity = map.next_value()?,
                "monitorIdentity" => out.monitor_identity = map.next_value()?,
                "launcherIdentity" => out.launcher_identity = map.next_value()?,
                "runnerProcessInstanceId" => out.runner_process_instance_id = map.next_value()?,
                "stopReason" => out.stop_reason = map.next_value()?,
                _ => {
                    let value: Value = map.next_value()?;
                    out.extra.insert(key.0.into_owned(), value);
                }
            }
        }
        out.state = state.ok_or_else(|| de::Error::missing_field("state"))?;
        Ok(out)
    }
}

impl Step {
    /// Whether a step in this status keeps its workflow's capacity slot:
    /// `pending`, `running` and `paused`, the step-level counterparts of
    /// [`RunState::holds_capacity`].
    pub fn holds_capacity(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "running" | "paused")
    }

    /// A string key the reference writes on workflow steps and this model
    /// keeps in `extra` (`workflowKey`, `runId`); `None` when absent or
    /// not a string.
    pub fn extra_str(&self, key: &str) -> Option<&str> {
        self.extra.get(key).and_then(Value::as_str)
    }

    /// A workflow step's `async` classification: whether it ran as a
    /// background run of its own; `None` when absent or not a boolean.
    pub fn is_async(&self) -> Option<bool> {
        self.extra.get("async").and_then(Value::as_bool)
    }
}

impl RunStatus {
    /// A string field of the run-level `processTerminal` projection as
    /// written (`state`, `runId`, `runnerProcessInstanceId`), not
    /// validated: callers that decide on it check `process-terminal.json`
    /// itself (see [`crate::proof::read_proof`]). `None` when there is no
    /// projection, or the field is absent or not a string.
    pub fn projected_proof_str(&self, key: &str) -> Option<&str> {
        self.process_terminal.as_ref()?.get(key)?.as_str()
    }

    /// A fresh status for `run_id` in `state`; everything else absent.
    pub fn new(run_id: impl Into<String>, state: RunState) -> Self {
        Self {
            lifecycle_artifact_version: None,
            run_id: run_id.into(),
            session_id: None,
            mode: None,
            state,
            display_dismissed_at: None,
            error: None,
            last_activity_at: None,
            started_at: None,
            ended_at: None,
            last_update: None,
            timeout_ms: None,
            deadline_at: None,
            timed_out: None,
            stopped: None,
            pid: None,
            cwd: None,
            current_step: None,
            chain_step_count: None,
            process_terminal: None,
            run_fanout_budget: None,
            steps: None,
            output_file: None,
            session_file: None,
            runner_identity: None,
            monitor_identity: None,
            launcher_identity: None,
            runner_process_instance_id: None,
            stop_reason: None,
            extra: Map::new(),
        }
    }

    /// The steps, or an empty slice.
    pub fn steps(&self) -> &[Step] {
        self.steps.as_deref().unwrap_or(&[])
    }

    /// `lastUpdate ?? endedAt ?? startedAt`, the listing's sort key.
    pub fn sort_time(&self) -> u64 {
        self.last_update
            .or(self.ended_at)
            .or(self.started_at)
            .unwrap_or(0)
    }

    /// Every process identity the status records: monitor, runner,
    /// launcher and each step's COMMAND.
    pub fn identities(&self) -> impl Iterator<Item = &ProcessIdentity> {
        let run = [
            &self.monitor_identity,
            &self.runner_identity,
            &self.launcher_identity,
        ];
        let steps = self
            .steps()
            .iter()
            .filter_map(|s| s.external_process.as_ref()?.identity.as_ref());
        run.into_iter().flatten().chain(steps)
    }

    /// Whether every recorded identity is of this boot of this machine, so
    /// that the run's pid, group and session numbers (the bare `pid` and
    /// the steps' groups included) may name its processes here.
    pub fn recorded_in_this_boot(&self) -> bool {
        self.identities().all(ProcessIdentity::is_of_this_boot)
    }

    /// The other machine the run's processes were recorded on (its host
    /// name, else its machine id), when they were.
    pub fn foreign_host(&self) -> Option<&str> {
        self.identities().find_map(ProcessIdentity::foreign_host)
    }
}

/// Parses status text; `path` names the file in errors.
pub fn parse_status(path: &Path, text: &str) -> Result<RunStatus> {
    parse_status_as(path, text, RunStatusVisitor { listed: false })
}

/// [`parse_status`] for a text listing: the same checks, but of the
/// proofs (which a text listing does not show) only what it reads is
/// kept: nothing of the steps' `processTerminal`, and of the run's only
/// `state`, `runId` and `runnerProcessInstanceId`. Never write back or
/// show a status parsed so.
pub fn parse_listed_status(path: &Path, text: &str) -> Result<RunStatus> {
    parse_status_as(path, text, RunStatusVisitor { listed: true })
}

fn parse_status_as(path: &Path, text: &str, visitor: RunStatusVisitor) -> Result<RunStatus> {
    // Straight into the typed struct: listings parse thousands of these.
    // Only a file that fails is parsed again, generically, to name the
    // offending field.
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = visitor
        .deserialize(&mut de)
        .and_then(|s| de.end().map(|()| s));
    match parsed {
        Ok(status) if status_session_ok(text, &status) => Ok(status),
        _ => parse_status_explained(path, text),
    }
}

/// A `sessionId` key that is present must have been a string: `null`
/// deserialises to `None` like an absent key, so look at the text.
fn status_session_ok(text: &str, status: &RunStatus) -> bool {
    status.session_id.is_some() || !text.contains("\"sessionId\"")
}

fn parse_status_explained(path: &Path, text: &str) -> Result<RunStatus> {
    let value: Value = serde_json::from_str(text).map_err(|e| invalid(path, e.to_string()))?;
    if let Some(session) = value.get("sessionId")
        && !session.is_string()
    {
        return Err(invalid(path, "sessionId must be a string".into()));
    }
    // The error names the JSON path of the offending field (`steps[0].status: ...`).
    serde_path_to_error::deserialize(value)
        .map_err(|e| invalid(path, format!("{}: {}", e.path(), e.inner())))
}

fn invalid(path: &Path, reason: String) -> Error {
    Error::Invalid {
        what: "async status file",
        path: atomic_file::escape_path(path),
        reason,
    }
}

/// Reads `<run_dir>/status.json`; `Ok(None)` when it does not exist.
pub fn read_status(run_dir: &Path) -> Result<Option<RunStatus>> {
    let path = run_dir.join(files::STATUS);
    match atomic_file::read::read_to_string(&path) {
        Ok(text) => parse_status(&path, &text).map(Some),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `<run_dir>/status.json` atomically (0600). Callers that read first
/// hold [`lock_status`] around the read and the write.
pub fn write_status(run_dir: &Path, status: &RunStatus) -> Result<()> {
    let bytes = atomic_file::to_pretty_json(status);
    atomic_file::write_private_with(&run_dir.join(files::STATUS), &bytes, || {
        crate::fault_point("mid-status-write")
    })?;
    Ok(())
}

/// [`write_status`] as the last file of `earlier`: every file of the batch
/// is written and fsynced before any is renamed, and `status.json` is
/// renamed last, so a reader that finds the status finds the batch's other
/// files complete (see [`atomic_file::Batch`]).
pub fn write_status_after(
    mut earlier: atomic_file::Batch,
    run_dir: &Path,
    status: &RunStatus,
) -> Result<()> {
    earlier.add_json(run_dir.join(files::STATUS), status);
    earlier.commit_with(|| crate::fault_point("mid-status-write"))?;
    Ok(())
}

/// An exclusive advisory lock on the run's status; released on drop or when
/// the holder dies.
pub struct StatusLock {
    _file: File,
}

/// Takes the run's status lock, blocking until it is free.
pub fn lock_status(run_dir: &Path) -> Result<StatusLock> {
    let path = run_dir.join(files::STATUS_LOCK);
    // Never blocks on a FIFO planted in place of the lock file.
    let file = atomic_file::read::open_lock_file(&path)?;
    file.lock().map_err(|e| io_err("lock", &path, e))?;
    Ok(StatusLock { _file: file })
}

/// Read-modify-write of `status.json` under the status lock. `change` gets
/// `None` when there is no status yet; returning `None` writes nothing.
pub fn update_status(
    run_dir: &Path,
    change: impl FnOnce(Option<RunStatus>) -> Option<RunStatus>,
) -> Result<Option<RunStatus>> {
    let _lock = lock_status(run_dir)?;
    let current = read_status(run_dir)?;
    match change(current) {
        Some(next) => {
            write_status(run_dir, &next)?;
            Ok(Some(next))
        }
        None => Ok(None),
    }
}

/// [`update_status`] for the status's owner, the runner, which keeps a copy
/// of what it last wrote (`last`). A status that exists but cannot be read
/// (unparsable, wrong types, oversize, a FIFO, directory or symlink in its
/// place) is moved aside to `status.json.damaged-<ms>` (kept as evidence; a
/// directory could not be replaced otherwise) and `change` gets `last`
/// instead: the runner's own record of the run wins over a damaged file,
/// whose other writers' changes (a stop request) are lost with it.
/// `sync_dir`: as [`update_status`] when true, as
/// [`update_status_unsynced_dir`] when false. Returns the new status and,
/// when the file was damaged, why.
pub fn update_status_owned(
    run_dir: &Path,
    last: Option<&RunStatus>,
    sync_dir: bool,
    change: impl FnOnce(Option<RunStatus>) -> Option<RunStatus>,
) -> Result<(Option<RunStatus>, Option<String>)> {
    let _lock = lock_status(run_dir)?;
    let (current, damage) = match read_status(run_dir) {
        Ok(current) => (current, None),
        Err(e @ (Error::Invalid { .. } | Error::Read(_))) => {
            let aside = run_dir.join(format!("{}.damaged-{}", files::STATUS, crate::now_ms()));
            let status = run_dir.join(files::STATUS);
            std::fs::rename(&status, &aside).map_err(|e| io_err("move aside", &status, e))?;
            let why = format!("{e}; moved aside to '{}'", atomic_file::escape_path(&aside));
            (last.cloned(), Some(why))
        }
        Err(e) => return Err(e),
    };
    let Some(next) = change(current) else {
        return Ok((None, damage));
    };
    if sync_dir {
        write_status(run_dir, &next)?;
    } else {
        let bytes = atomic_file::to_pretty_json(&next);
        atomic_file::replace_private_with(&run_dir.join(files::STATUS), &bytes, || {
            crate::fault_point("mid-status-write")
        })?;
    }
    Ok((Some(next), damage))
}

/// [`update_status`] whose write fsyncs the new status but not the run
/// directory: a crash may bring back the previous (durable, complete)
/// status. Only for a change whose loss in a crash leaves a state the
/// observer handles, such as the monitor's registration in the queued
/// status (lost, the queued run has a dead launcher and no monitor: it
/// never started, which is true), or the runner's step records, which the
/// run's final status write (a full one) makes durable along with itself.
pub fn update_status_unsynced_dir(
    run_dir: &Path,
    change: impl FnOnce(Option<RunStatus>) -> Option<RunStatus>,
) -> Result<Option<RunStatus>> {
    let _lock = lock_status(run_dir)?;
    let current = read_status(run_dir)?;
    match change(current) {
        Some(next) => {
            let bytes = atomic_file::to_pretty_json(&next);
            atomic_file::replace_private_with(&run_dir.join(files::STATUS), &bytes, || {
                crate::fault_point("mid-status-write")
            })?;
            Ok(Some(next))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_survive_a_round_trip() {
        let text = r#"{"runId":"r1","state":"running","steering":{"requested":0},"steps":[{"agent":"a","status":"pending","model":"m"}]}"#;
        let status = parse_status(Path::new("s.json"), text).unwrap();
        assert_eq!(status.state, RunState::Running);
        let back: Value = serde_json::to_value(&status).unwrap();
        assert_eq!(back["steering"]["requested"], 0);
        assert_eq!(back["steps"][0]["model"], "m");
    }

    #[test]
    fn the_field_by_field_parse_matches_a_generic_one() {
        // Escaped keys, nulls, unknown keys in their order, nested steps.
        let text = r#"{"z":1,"run\u0049d":"r1","state":"failed","error":null,"a":[1],
            "steps":[{"agent":"a","status":"failed","exitCode":2,"x":{"y":null},"error":null}],
            "runFanoutBudget":{"used":1,"limit":2,"remaining":1}}"#;
        let status = parse_status(Path::new("s.json"), text).unwrap();
        assert_eq!(status.run_id, "r1");
        assert_eq!(status.error, None);
        assert_eq!(status.steps()[0].exit_code, Some(2));
        let keys: Vec<&str> = status.extra.keys().map(String::as_str).collect();
        assert_eq!(keys, ["z", "a"]);
        let generic: Value = serde_json::from_str(text).unwrap();
        let mut back = serde_json::to_value(&status).unwrap();
        back.as_object_mut()
            .unwrap()
            .insert("error".into(), Value::Null);
        back["steps"][0]
            .as_object_mut()
            .unwrap()
            .insert("error".into(), Value::Null);
        assert_eq!(back, generic);
    }

    #[test]
    fn required_fields_are_named_when_missing() {
        for (text, field) in [
            (r#"{"runId":"r1"}"#, "state"),
            (
                r#"{"state":"running","steps":[{"status":"pending"}]}"#,
                "agent",
            ),
            (r#"{"state":"running","steps":[{"agent":"a"}]}"#, "status"),
        ] {
            let err = parse_status(Path::new("s.json"), text).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("missing field `{field}`")),
                "{err}"
            );
        }
        let err =
            parse_status(Path::new("s.json"), r#"{"state":"running","steps":[1]}"#).unwrap_err();
        assert!(err.to_string().contains("steps[0]"), "{err}");
    }

    #[test]
    fn non_string_session_id_is_refused() {
        let err = parse_status(
            Path::new("/x/status.json"),
            r#"{"state":"running","sessionId":1}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("sessionId must be a string"),
            "{err}"
        );
    }

    #[test]
    fn a_listed_status_is_the_status_with_only_the_proof_facts_a_listing_reads() {
        let path = Path::new("s.json");
        let deep = format!("{}1{}", "[".repeat(140), "]".repeat(140));
        let proofs = [
            r#"{"state":"observed","runId":"r","instances":[{"kind":"runner","exitCode":0}],"runnerProcessInstanceId":"i"}"#,
            "null",
            "[1, -0, 2.5e-3, 18446744073709551615, -9223372036854775808, true, \"\\u00e9\"]",
            "1e400",
            "-1e400",
            deep.as_str(),
            "\"\\ud800\"",
            "\"\\x\"",
            "\"tab\there\"",
            "{\"a\":1,}",
            "[1,]",
            "01",
            "{\"k\":1,\"k\":2}",
            "{\"state\":\"failed\",\"x\":[{}],\"state\":\"observed\"}",
        ];
        let mut refused = Vec::new();
        for proof in proofs {
            let text = format!(
                r#"{{"runId":"r","state":"complete","processTerminal":{proof},"steps":[{{"agent":"a","status":"complete","processTerminal":{proof},"label":"l"}}]}}"#
            );
            let full = parse_status(path, &text);
            let listed = parse_listed_status(path, &text);
            match (full, listed) {
                (Ok(mut full), Ok(listed)) => {
                    full.steps.as_mut().unwrap()[0].process_terminal = None;
                    if let Some(Value::Object(proof)) = &mut full.process_terminal {
                        proof.retain(|k, _| LISTED_PROOF_KEYS.contains(&k.as_str()));
                    }
                    assert_eq!(full, listed, "{proof}");
                }
                (Err(full), Err(listed)) => {
                    assert_eq!(full.to_string(), listed.to_string(), "{proof}");
                    refused.push(proof);
                }
                (full, listed) => panic!("{proof}: {full:?} against {listed:?}"),
            }
        }
        // A value would refuse these (out of range, too deep, bad text).
        assert_eq!(refused, &proofs[3..12], "refused");
    }

    #[test]
    fn malformed_json_names_the_file() {
        let err = parse_status(Path::new("/x/status.json"), "{").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("failed to parse async status file '/x/status.json'")
        );
    }

    #[test]
    fn update_reads_and_writes_under_lock() {
        let dir = tempfile::tempdir().unwrap();
        write_status(dir.path(), &RunStatus::new("r", RunState::Queued)).unwrap();
        update_status(dir.path(), |s| {
            let mut s = s.unwrap();
            s.state = RunState::Running;
            Some(s)
        })
        .unwrap();
        assert_eq!(
            read_status(dir.path()).unwrap().unwrap().state,
            RunState::Running
        );
    }

    #[test]
    fn the_owner_writes_a_damaged_status_from_its_last_write_and_keeps_the_damage_aside() {
        let last = RunStatus::new("owned", RunState::Running);
        for damage in ["wrong types", "directory", "fifo"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(files::STATUS);
            match damage {
                "wrong types" => std::fs::write(&path, r#"{"state": 5}"#).unwrap(),
                "directory" => std::fs::create_dir(&path).unwrap(),
                _ => assert!(
                    std::process::Command::new("mkfifo")
                        .arg(&path)
                        .status()
                        .unwrap()
                        .success()
                ),
            }
            assert!(update_status(dir.path(), |s| s).is_err(), "{damage}");
            let (next, why) = update_status_owned(dir.path(), Some(&last), false, |s| {
                let mut s = s?;
                s.state = RunState::Complete;
                Some(s)
            })
            .unwrap();
            assert_eq!(next.unwrap().run_id, "owned", "{damage}");
            assert!(why.unwrap().contains("moved aside to"), "{damage}");
            assert_eq!(
                read_status(dir.path()).unwrap().unwrap().state,
                RunState::Complete
            );
            let aside = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("status.json.damaged-")
                });
            assert_eq!(aside.count(), 1, "{damage}");
            // A readable status is the owner's to change as it is.
            let (next, why) = update_status_owned(dir.path(), None, true, |s| s).unwrap();
            assert_eq!((next.unwrap().state, why), (RunState::Complete, None));
        }
    }
}
