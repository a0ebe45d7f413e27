//! The text forms of runs the front-ends print: `status`'s renderers,
//! re-exported one by one so the binary reaches no protocol crate itself.

/// Text cut to a number of characters, with `…` when it was longer.
pub use agents::capture::bounded;
pub use listing::format::{
    COMMAND_LABEL_KEY, NAME_KEY, command_label, dispatch_line, fanout_line, format_duration,
    format_run_list, progress_label, queue_label, run_label, run_lines, shorten, state_label,
    state_with_queue, step_label, step_number, step_state,
};
/// How our own views spell a duration (`format_duration` is the
/// reference's, kept for the list text scripts parse).
pub use status::spell_duration;
