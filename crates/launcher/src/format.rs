//! The text forms of runs the front-ends print: `status`'s renderers,
//! re-exported one by one so the binary reaches no protocol crate itself.

/// Text cut to a number of characters, with `…` when it was longer.
pub use agents::capture::bounded;
pub use listing::format::{
    COMMAND_LABEL_KEY, NAME_KEY, command_label, fanout_line, format_duration, format_run_list,
    run_label, run_lines, shorten, state_label, step_label,
};
