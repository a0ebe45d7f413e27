//! `dismiss`: hides a finished run from `list`; display-only, its
//! processes and its active-index marker stay.

use status::model::update_status;
use status::{Layout, now_ms};

use crate::admission;
use crate::api::{DismissOutcome, DismissRequest};
use crate::error::{Error, Exit, Result};
use crate::runs::{observe, resolve};

/// Marks the run dismissed. An active run is refused unless `force`: it
/// would vanish from `list` while still running.
pub fn dismiss(layout: &Layout, request: &DismissRequest) -> Result<DismissOutcome> {
    let id = resolve(layout, &request.run)?;
    observe(layout, &id);
    let dir = layout.run_dir(&id);
    let now = now_ms();
    if !request.force
        && let Some(current) = status::model::read_status(&dir)?
        && current.state.is_active()
    {
        let mut error = Error::new(
            Exit::Failed,
            format!("run '{id}' is still {}; not dismissed", current.state),
        );
        error.hint = Some(format!(
            "stop it first (`subagents stop {id}`), or hide it anyway with --force (`subagents list --all --dismissed` shows it)"
        ));
        return Err(error);
    }
    let dismissed = update_status(&dir, |s| {
        let mut s = s?;
        s.display_dismissed_at = Some(now);
        Some(s)
    })?
    .ok_or_else(|| Error::new(Exit::NotFound, format!("run '{id}' has no status.json")))?;
    admission::release_finished(layout, dismissed.session_id.as_deref());
    Ok(DismissOutcome {
        run_id: id,
        display_dismissed_at: now,
    })
}
