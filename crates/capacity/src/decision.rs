//! What to do with the reservation once `spawnRunner` returned
//! (docs/protocol/handshake.md §8).

/// The facts of a spawn attempt that decide the capacity action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpawnOutcome<'a> {
    /// The spawn threw or returned an error.
    pub failed: bool,
    /// Pid of the spawned runner, if one was spawned.
    pub pid: Option<u32>,
    /// The runner's process instance id, if known.
    pub runner_process_instance_id: Option<&'a str>,
    /// The startup handshake failed before `proceed` (the runner never started work).
    pub startup_did_not_proceed: bool,
    /// The runner was confirmed gone after being terminated.
    pub termination_observed: bool,
}

/// The capacity action for a spawn outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityAction {
    /// Free the reservation (or give a transferred slot back to its source).
    Rollback,
    /// Bind the reservation to this runner (`mark_started`).
    MarkStarted(String),
}

/// Rolls back when there is no runner identity, or when the runner provably
/// never proceeded and was provably terminated; otherwise binds the slot to
/// the runner, which may be running and must stay counted.
pub fn decide_after_spawn(outcome: &SpawnOutcome<'_>) -> CapacityAction {
    let runner = outcome
        .runner_process_instance_id
        .filter(|id| !id.is_empty());
    let (Some(_), Some(runner)) = (outcome.pid, runner) else {
        return CapacityAction::Rollback;
    };
    if outcome.failed && outcome.startup_did_not_proceed && outcome.termination_observed {
        return CapacityAction::Rollback;
    }
    CapacityAction::MarkStarted(runner.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawned(failed: bool, did_not_proceed: bool, terminated: bool) -> SpawnOutcome<'static> {
        SpawnOutcome {
            failed,
            pid: Some(42),
            runner_process_instance_id: Some("rid"),
            startup_did_not_proceed: did_not_proceed,
            termination_observed: terminated,
        }
    }

    #[test]
    fn follows_the_handshake_table() {
        let bind = CapacityAction::MarkStarted("rid".into());
        // Rows 1 and 2: no runner identity after a failure.
        let threw = SpawnOutcome {
            failed: true,
            ..SpawnOutcome::default()
        };
        assert_eq!(decide_after_spawn(&threw), CapacityAction::Rollback);
        // Row 3: did not proceed and terminated.
        assert_eq!(
            decide_after_spawn(&spawned(true, true, true)),
            CapacityAction::Rollback
        );
        // Row 4: termination not observed.
        assert_eq!(decide_after_spawn(&spawned(true, true, false)), bind);
        // Row 5: the startup proceeded.
        assert_eq!(decide_after_spawn(&spawned(true, false, true)), bind);
        // Row 6: success without identity.
        let anonymous = SpawnOutcome {
            pid: Some(42),
            runner_process_instance_id: Some(""),
            ..SpawnOutcome::default()
        };
        assert_eq!(decide_after_spawn(&anonymous), CapacityAction::Rollback);
        // Row 7: success.
        assert_eq!(decide_after_spawn(&spawned(false, false, false)), bind);
    }
}
