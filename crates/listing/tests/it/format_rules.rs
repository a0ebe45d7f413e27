//! The run-list text, rule by rule: the activity column, ages, durations,
//! token counts, the progress label of chains with parallel groups, the
//! group filter, the outcome of a group and home shortening, each at its
//! edges.

use std::path::Path;

use listing::format::{
    ParallelGroup, format_duration, outcome, parallel_groups, run_lines, shorten,
};
use listing::list::RunSummary;
use serde_json::{Value, json};
use status::model::{Step, parse_status};

const NOW: u64 = 10_000_000;

fn summary(status: Value) -> RunSummary {
    let status = parse_status(Path::new("status.json"), &status.to_string()).unwrap();
    RunSummary {
        id: "r".into(),
        async_dir: "/runs/r".into(),
        status,
    }
}

/// The header line's columns after `- r`.
fn header(status: Value) -> Vec<String> {
    let lines = run_lines(&summary(status), NOW, Some(Path::new("/home/u")));
    lines[0].split(" | ").skip(1).map(str::to_owned).collect()
}

fn step(status: &str) -> Value {
    json!({"agent": "a", "status": status})
}

#[test]
fn a_running_run_shows_how_long_ago_it_was_active() {
    let at = |ago: u64| header(json!({"state": "running", "lastActivityAt": NOW - ago}));
    assert_eq!(at(0)[1], "active now");
    assert_eq!(at(999)[1], "active now");
    assert_eq!(at(1_000)[1], "active 1s ago");
    assert_eq!(at(59_999)[1], "active 59s ago");
    assert_eq!(at(60_000)[1], "active 1m ago");
    assert_eq!(at(150_000)[1], "active 2m ago");
}

#[test]
fn the_attention_state_names_the_activity() {
    let run = |state: &str, last: Option<u64>, attention: &str| {
        let mut s = json!({"state": state, "activityState": attention, "mode": "single"});
        if let Some(last) = last {
            s["lastActivityAt"] = json!(last);
        }
        header(s)
    };
    assert_eq!(
        run("running", Some(NOW - 4_000), "needs_attention")[1],
        "no activity for 4s"
    );
    assert_eq!(
        run("running", Some(NOW - 4_000), "active_long_running")[1],
        "active but long-running · last activity 4s ago"
    );
    assert_eq!(
        run("running", Some(NOW), "active_long_running")[1],
        "active but long-running · last activity now"
    );
    assert_eq!(
        run("running", None, "needs_attention")[1],
        "needs attention"
    );
    assert_eq!(
        run("running", None, "active_long_running")[1],
        "active but long-running"
    );
    // A finished run keeps the attention fact but shows no age.
    assert_eq!(
        run("failed", Some(NOW - 4_000), "needs_attention")[1],
        "needs attention"
    );
    // Another attention value on a running run: the plain age.
    assert_eq!(
        run("running", Some(NOW - 4_000), "idle")[1],
        "active 4s ago"
    );
    // No activity and no facts: no column at all.
    assert_eq!(run("running", None, "idle")[1], "single");
    assert_eq!(
        header(json!({"state": "complete", "lastActivityAt": NOW, "mode": "single"})),
        ["complete", "single", "steps 1", "/runs/r"]
    );
}

#[test]
fn steps_of_mixed_contexts_are_labelled_mixed() {
    let steps = json!([
        {"agent": "a", "status": "complete", "context": "fresh"},
        {"agent": "b", "status": "running", "context": "fork"}
    ]);
    let h = header(json!({"state": "running", "mode": "chain", "steps": steps, "currentStep": 1}));
    assert_eq!(h[1], "chain [mixed]");
}

/// Flat steps 0 | 1 2 (group, logical 1) | 3 | 4 5 6 (group, logical 3) | 7.
fn chain_with_groups(current: usize, states: [&str; 8]) -> Value {
    let steps: Vec<Value> = states.iter().map(|s| step(s)).collect();
    json!({
        "state": "running", "mode": "chain", "chainStepCount": 5, "currentStep": current,
        "parallelGroups": [
            {"start": 4, "count": 3, "stepIndex": 3},
            {"start": 1, "count": 2, "stepIndex": 1}
        ],
        "steps": steps
    })
}

#[test]
fn a_chain_counts_each_parallel_group_as_one_step() {
    let done = "complete";
    let progress = |current, states| header(chain_with_groups(current, states))[2].clone();
    let pending = ["pending"; 8];
    assert_eq!(progress(0, pending), "step 1/5");
    let mut states = [
        done, "running", "running", "pending", "pending", "pending", "pending", "pending",
    ];
    assert_eq!(
        progress(1, states),
        "step 2/5 · parallel group: 2 agents running · 0/2 done"
    );
    states[1] = done;
    assert_eq!(
        progress(2, states),
        "step 2/5 · parallel group: 1 agent running · 1/2 done"
    );
    // Just past the first group: it folds to one step.
    assert_eq!(progress(3, [done; 8]), "step 3/5");
    let mut states = [done; 8];
    states[6] = "failed";
    assert_eq!(
        progress(6, states),
        "step 4/5 · parallel group: 2/3 done · 1 failed"
    );
    // Past both groups: both fold.
    assert_eq!(progress(7, [done; 8]), "step 5/5");
}

#[test]
fn only_a_chain_with_groups_folds_its_steps() {
    // No groups: the flat count, whatever chainStepCount says.
    for mode in ["chain", "single"] {
        let h = header(json!({
            "state": "running", "mode": mode, "chainStepCount": 5, "currentStep": 1,
            "parallelGroups": [], "steps": [step("complete"), step("running")]
        }));
        assert_eq!(h[2], "step 2/2", "{mode}");
    }
    // Groups outside a chain (a workflow) fold nothing either.
    let mut run = chain_with_groups(7, ["complete"; 8]);
    run["mode"] = json!("workflow");
    assert_eq!(header(run)[2], "step 8/8");
    let none = header(json!({"state": "queued", "mode": "chain"}));
    assert_eq!(none[1..3], ["chain".to_owned(), "steps 1".to_owned()]);
}

#[test]
fn a_parallel_run_shows_its_outcome() {
    let run = |current: Option<usize>, groups: Value| {
        let mut s = json!({
            "state": "running", "mode": "parallel", "parallelGroups": groups,
            "steps": [step("running"), step("complete"), step("stopped")]
        });
        if let Some(c) = current {
            s["currentStep"] = json!(c);
        }
        header(s)[2].clone()
    };
    let want = "1 agent running · 1/3 done · 1 stopped";
    assert_eq!(run(None, json!([])), want);
    assert_eq!(
        run(Some(0), json!([{"start": 0, "count": 3, "stepIndex": 0}])),
        want
    );
}

#[test]
fn the_outcome_counts_each_state() {
    let steps: Vec<Step> = ["running", "running", "completed", "paused", "pending"]
        .iter()
        .map(|s| Step {
            agent: "a".into(),
            status: (*s).into(),
            ..Default::default()
        })
        .collect();
    assert_eq!(
        outcome(&steps, "running", 5),
        "2 agents running · 1/5 done · 1 paused"
    );
    // Running steps of a run that is over are not "running".
    assert_eq!(outcome(&steps, "failed", 5), "1/5 done · 1 paused");
    assert_eq!(outcome(&steps[2..], "running", 3), "1/3 done · 1 paused");
    assert_eq!(outcome(&steps[4..], "running", 1), "0/1 done");
}

#[test]
fn parallel_groups_keep_only_entries_in_range() {
    let group =
        |start, count, step_index| json!({"start": start, "count": count, "stepIndex": step_index});
    let value = json!([
        group(2, 2, 1), // ends at the last step: kept
        group(0, 1, 0),
        group(3, 0, 2), // empty
        group(0, 1, 3), // logical step past the chain
        group(3, 2, 2), // ends past the last step
        {"start": 1, "count": 1},
        {"start": 1, "count": "1", "stepIndex": 2},
    ]);
    let groups = parallel_groups(Some(&value), 4, 3);
    let want = [
        ParallelGroup {
            start: 0,
            count: 1,
            step_index: 0,
        },
        ParallelGroup {
            start: 2,
            count: 2,
            step_index: 1,
        },
    ];
    assert_eq!(groups, want);
    // 0 * 3 would fit in two steps; 0 + 3 does not.
    assert!(parallel_groups(Some(&json!([group(0, 3, 0)])), 2, 3).is_empty());
    assert!(parallel_groups(Some(&json!({"start": 0})), 4, 3).is_empty());
    assert!(parallel_groups(None, 4, 3).is_empty());
}

#[test]
fn durations_and_token_counts_change_unit_at_their_edges() {
    assert_eq!(format_duration(0), "0ms");
    assert_eq!(format_duration(999), "999ms");
    assert_eq!(format_duration(1_000), "1.0s");
    assert_eq!(format_duration(59_999), "60.0s");
    assert_eq!(format_duration(60_000), "1m0s");
    let tokens = |total: u64| {
        let run = summary(json!({"state": "complete", "steps": [
            {"agent": "a", "status": "complete", "tokens": {"total": total}}
        ]}));
        run_lines(&run, NOW, None)[1].clone()
    };
    assert_eq!(tokens(999), "  1. a | complete | 999 tok");
    assert_eq!(tokens(1_000), "  1. a | complete | 1.0k tok");
    assert_eq!(tokens(9_999), "  1. a | complete | 10.0k tok");
    assert_eq!(tokens(10_000), "  1. a | complete | 10k tok");
    assert_eq!(tokens(12_500), "  1. a | complete | 13k tok");
}

#[test]
fn the_home_directory_itself_is_a_tilde() {
    let home = Some(Path::new("/home/u"));
    assert_eq!(shorten(Path::new("/home/u"), home), "~");
    assert_eq!(shorten(Path::new("/home/u/p"), home), "~/p");
    assert_eq!(shorten(Path::new("/home/u/p"), None), "/home/u/p");
}

#[test]
fn a_model_without_a_thinking_suffix_and_a_bare_thinking_level() {
    let line = |extra: Value| {
        let mut s = json!({"agent": "a", "status": "complete"});
        s.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let run = summary(json!({"state": "complete", "steps": [s]}));
        run_lines(&run, NOW, None)[1].clone()
    };
    assert_eq!(
        line(json!({"thinking": "low"})),
        "  1. a | complete | thinking low"
    );
    assert_eq!(
        line(json!({"model": "p/m:7b", "thinking": "high"})),
        "  1. a | complete | m:7b · thinking high"
    );
    assert_eq!(line(json!({"thinking": "loud"})), "  1. a | complete");
}
