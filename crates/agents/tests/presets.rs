//! Snapshots of the invocation each example definition renders (the README
//! shows the same lines), and of the invocation that resumes its session.

extern crate subagents_agents as agents;
use std::path::{Path, PathBuf};

use agents::definition::{RunnerKind, read_definition};
use agents::preset::{PLACEHOLDER_SESSION_ID, render, resume_argv, shell_words};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents")
}

fn rendered(name: &str) -> (RunnerKind, Vec<String>, String) {
    let def = read_definition(&examples().join(format!("{name}.md")), RunnerKind::Pi).unwrap();
    let invocation = render(&def, PLACEHOLDER_SESSION_ID).unwrap();
    let env: Vec<String> = invocation
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let text = format!(
        "{}\n# env: {}",
        shell_words(&invocation.argv),
        env.join(" ")
    );
    (def.runner, invocation.argv, text)
}

#[test]
fn claude_preset() {
    let (kind, argv, text) = rendered("reviewer");
    insta::assert_snapshot!("reviewer", text);
    let resumed = resume_argv(kind, &argv, "5a4b7c1e-0000-4000-8000-000000000001", None).unwrap();
    insta::assert_snapshot!("reviewer-resume", shell_words(&resumed));
}

#[test]
fn codex_preset() {
    let (kind, argv, text) = rendered("fixer");
    insta::assert_snapshot!("fixer", text);
    let resumed = resume_argv(kind, &argv, "01a22b26-b94d-7941-a97b-044129357545", None).unwrap();
    insta::assert_snapshot!("fixer-resume", shell_words(&resumed));
}

#[test]
fn pi_preset() {
    let (kind, argv, text) = rendered("scout");
    insta::assert_snapshot!("scout", text);
    let file = Path::new("/home/me/.pi/agent/sessions/--work--/2026-01-01T00-00-00-000Z_p1.jsonl");
    let resumed = resume_argv(kind, &argv, "p1", Some(file)).unwrap();
    insta::assert_snapshot!("scout-resume", shell_words(&resumed));
}

#[test]
fn command_preset() {
    let (_, argv, text) = rendered("summarize");
    insta::assert_snapshot!("summarize", text);
    assert_eq!(argv[0], "sh");
}

/// The README's "Named agents" section shows each example file as it is
/// and exactly the command it renders.
#[test]
fn readme_shows_the_rendered_commands() {
    let readme = std::fs::read_to_string(examples().join("../../README.md")).unwrap();
    for name in ["reviewer", "fixer", "scout", "summarize"] {
        let (_, argv, _) = rendered(name);
        let line = shell_words(&argv);
        assert!(
            readme.contains(&line),
            "README lacks the rendered command of {name}:\n{line}"
        );
        let file = std::fs::read_to_string(examples().join(format!("{name}.md"))).unwrap();
        assert!(
            readme.contains(&file),
            "README lacks examples/agents/{name}.md as it is"
        );
    }
}
