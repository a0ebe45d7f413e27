//! The text forms of runs the front-ends print: `status`'s renderers,
//! re-exported one by one so the binary reaches no protocol crate itself.

pub use listing::format::{
    COMMAND_LABEL_KEY, NAME_KEY, command_label, fanout_line, format_duration, format_run_list,
    queue_label, run_label, run_lines, shorten, state_label, state_with_queue, step_label,
};
