//! `reconcile`: repairs stale runs and finalizes what the evidence allows,
//! then frees the capacity slots of the sessions it touched.

use listing::list::UnreadableRun;
use status::Layout;
use status::now_ms;
use status::reconcile::{self, Outcome};
use supervisor::observer;

use crate::admission;
use crate::api::{ReconcileOutcome, RunNote};
use crate::error::Result;
use crate::runs::observer_options;

/// Observes every active run, tidies every run's leftovers and repairs
/// stale statuses; one unreadable run never stops the others.
pub fn reconcile(layout: &Layout) -> Result<ReconcileOutcome> {
    let mut outcome = ReconcileOutcome::default();
    for (id, observation) in observer::observe_active(layout, &observer_options(layout)) {
        if let observer::Observation::Finalized {
            repaired: Some(message),
            ..
        } = &observation
        {
            outcome.repaired.push(RunNote::new(&id, message));
        }
        if let Some(line) = observation.line() {
            outcome.observed.push(RunNote::new(&id, &line));
        }
    }
    let mut names = listing::list::run_names(layout)?;
    names.extend(status::index::read_index(&layout.runs_dir())?);
    names.sort();
    names.dedup();
    let mut sessions = Vec::new();
    for id in names {
        let Some(dir) = status::layout::exact_run_dir(layout, &id) else {
            continue;
        };
        let tidied = crate::leftovers::tidy(layout, &dir, &id, now_ms());
        sessions.extend(tidied.session);
        if let Some(message) = tidied.finished {
            outcome.repaired.push(RunNote::new(&id, &message));
            continue;
        }
        // One unreadable run or one repair that cannot be written never stops the others.
        let repair = match reconcile::reconcile_run(&dir, reconcile::Options::at(now_ms())) {
            Ok(repair) => repair,
            Err(e) => {
                match status::model::read_status(&dir) {
                    Ok(_) => outcome.warnings.push(format!(
                        "skipped the stale-run repair of '{}': {}",
                        atomic_file::escape(&id),
                        atomic_file::escape(&e.to_string())
                    )),
                    Err(e) => {
                        // Its session's slot may be freed by the proof alone.
                        if let Ok(Some(record)) = status::processes::read(&dir) {
                            sessions.extend(record.session_id);
                        }
                        outcome.unreadable.push(UnreadableRun::new(&id, &dir, &e));
                    }
                }
                continue;
            }
        };
        if let Some(session) = repair.status().and_then(|s| s.session_id.clone()) {
            sessions.push(session);
        }
        if let Outcome::Repaired { message, status } = repair {
            // Runner and monitor are gone: nobody else will end the commands.
            supervisor::procs::kill_step_groups(&status);
            outcome.repaired.push(RunNote::new(&id, &message));
        }
    }
    admission::release_finished(layout, sessions.iter().map(String::as_str));
    Ok(outcome)
}
