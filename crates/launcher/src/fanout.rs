//! The run fan-out budget at launch: creating or inheriting the budget,
//! claiming a launch's static batch, and handing each child its descriptor.

use fanout_budget::Descriptor;

use crate::config::LaunchConfig;

/// The env value for step `i`'s child: the run's descriptor with the step's
/// claim label appended to `parentPath` (single runs hand it on unchanged).
pub fn child_env(config: &LaunchConfig, i: usize) -> Option<String> {
    let descriptor: Descriptor = serde_json::from_value(config.fanout_descriptor.clone()?).ok()?;
    let child = match config.steps.get(i).and_then(|s| s.fanout_label.as_deref()) {
        Some(label) => descriptor.child(label),
        None => descriptor,
    };
    Some(child.to_env_value())
}
