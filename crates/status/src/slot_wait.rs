//! `queuedForSlot`, our key in `status.json` of a run launched with
//! `--queue` that waits for a slot of its session's capacity pool
//! (docs/protocol/capacity.md, "The queue").
//!
//! The run's state stays the reference's `queued`, so every reader of the
//! reference sees a run that is about to start; the key says why it has not
//! started yet. It is written with the queued status and removed by the
//! run's monitor when it takes the slot, which then records `slotWait`
//! (`since` and `admittedAt`). Readers that show the queue add the run's
//! 1-based `position` to the object in memory; it is never written.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RunStatus;

/// The key of a run waiting for a capacity slot.
pub const QUEUED_FOR_SLOT_KEY: &str = "queuedForSlot";

/// The key a run keeps once its wait is over.
pub const SLOT_WAIT_KEY: &str = "slotWait";

/// The value of `queuedForSlot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedForSlot {
    /// When the run joined the queue (ms since the epoch): with the run id,
    /// its place in the line.
    pub since: u64,
    /// 1-based place in the session's line, filled in by readers that show
    /// it; never on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

/// The run's wait, when it is queued for a slot: state `queued` and a
/// `queuedForSlot` object with a `since` (anything else is no wait).
pub fn queued_for_slot(status: &RunStatus) -> Option<QueuedForSlot> {
    if status.state != crate::RunState::Queued {
        return None;
    }
    let value = status.extra.get(QUEUED_FOR_SLOT_KEY)?;
    serde_json::from_value(value.clone()).ok()
}

/// Records the wait in a queued status.
pub fn set_queued_for_slot(status: &mut RunStatus, since: u64) {
    let value = QueuedForSlot {
        since,
        position: None,
    };
    status.extra.insert(
        QUEUED_FOR_SLOT_KEY.into(),
        serde_json::to_value(value).unwrap_or(Value::Null),
    );
}

/// Ends the wait: `queuedForSlot` goes, `slotWait: {since, admittedAt}`
/// stays as a record of it.
pub fn end_wait(status: &mut RunStatus, admitted_at: u64) {
    let Some(wait) = status.extra.remove(QUEUED_FOR_SLOT_KEY) else {
        return;
    };
    let since = wait.get("since").cloned().unwrap_or(Value::Null);
    status.extra.insert(
        SLOT_WAIT_KEY.into(),
        serde_json::json!({"since": since, "admittedAt": admitted_at}),
    );
}

/// Shows `position` in the status's `queuedForSlot` (in memory only).
pub fn show_position(status: &mut RunStatus, position: usize) {
    if let Some(Value::Object(wait)) = status.extra.get_mut(QUEUED_FOR_SLOT_KEY) {
        wait.insert("position".into(), Value::from(position));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunState;

    #[test]
    fn only_a_queued_run_with_a_since_waits() {
        let mut status = RunStatus::new("r", RunState::Queued);
        assert_eq!(queued_for_slot(&status), None);
        set_queued_for_slot(&mut status, 7);
        assert_eq!(queued_for_slot(&status).map(|w| w.since), Some(7));
        show_position(&mut status, 3);
        assert_eq!(queued_for_slot(&status).and_then(|w| w.position), Some(3));
        status.state = RunState::Running;
        assert_eq!(queued_for_slot(&status), None);
        status.state = RunState::Queued;
        status
            .extra
            .insert(QUEUED_FOR_SLOT_KEY.into(), Value::from("soon"));
        assert_eq!(queued_for_slot(&status), None);
    }

    #[test]
    fn the_end_of_a_wait_keeps_its_start() {
        let mut status = RunStatus::new("r", RunState::Queued);
        set_queued_for_slot(&mut status, 7);
        end_wait(&mut status, 9);
        assert!(!status.extra.contains_key(QUEUED_FOR_SLOT_KEY));
        assert_eq!(
            status.extra[SLOT_WAIT_KEY],
            serde_json::json!({"since": 7, "admittedAt": 9})
        );
    }
}
