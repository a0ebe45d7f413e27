//! Shell completion from the binary itself: the script `completions SHELL`
//! prints is loaded into the real bash, zsh and fish, and their completion
//! function is called for `subagents status <TAB>` (run ids, active first)
//! and `subagents run --agent <TAB>` (agent names) on a root with runs.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A root with an active run and a newer finished one, and a project directory
/// holding the example agents.
struct Fixture {
    env: Env,
    project: tempfile::TempDir,
    finished: String,
    active: String,
}

impl Fixture {
    fn new() -> Self {
        let env = Env::new();
        // The active run starts first: offered first for being active, not
        // for being the newest.
        let active = env.ok(&["run", "--name", "busy", "--", "sleep", "60"]);
        let finished = env.ok(&["run", "--name", "done", "--", "true"]);
        let finished = finished.trim().to_owned();
        env.settled(&finished);
        let project = tempfile::tempdir().unwrap();
        let agents = project.path().join(".subagents/agents");
        std::fs::create_dir_all(&agents).unwrap();
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
        for entry in std::fs::read_dir(examples).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, agents.join(path.file_name().unwrap())).unwrap();
        }
        Self {
            env,
            project,
            finished,
            active: active.trim().to_owned(),
        }
    }

    fn root(&self) -> &str {
        self.env.root().to_str().unwrap()
    }

    /// The registration script for `shell`, in a file.
    fn script(&self, shell: &str) -> PathBuf {
        let text = self.env.ok(&["completions", shell]);
        let path = Path::new(self.env.work()).join(format!("completion.{shell}"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `shell -c code` in the project directory, without the developer's
    /// settings; its stdout lines.
    fn shell(&self, shell: &str, args: &[&str]) -> Vec<String> {
        let mut command = Command::new(shell);
        command
            .args(args)
            .current_dir(self.project.path())
            .env("HOME", self.project.path())
            .env("XDG_CONFIG_HOME", self.project.path().join("no-config"))
            .env_remove("SUBAGENTS_SESSION_ID")
            .env_remove("SUBAGENTS_ROOT");
        let out = output_within(command, std::time::Duration::from_secs(60));
        assert!(out.status.success(), "{shell} failed: {out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.split(['\t', ':']).next().unwrap_or("").to_owned())
            .collect()
    }

    /// bash: `_clap_complete_subagents` with COMP_WORDS as bash sets them.
    fn bash(&self, words: &[&str]) -> Vec<String> {
        let code = r#"source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_TYPE=9
            _clap_complete_subagents subagents "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
            printf '%s\n' "${COMPREPLY[@]}""#;
        let script = self.script("bash");
        let mut args = vec!["--norc", "-c", code, "bash", script.to_str().unwrap()];
        args.extend(words);
        self.shell("bash", &args)
    }

    /// zsh: the script's completer function, with the completion system's
    /// `compdef` and `_describe` standing in to print what would be offered.
    fn zsh(&self, words: &[&str]) -> Vec<String> {
        let code = r#"compdef() { :; }; _describe() { shift 2; print -rl -- "${(@P)1}"; }
            source "$1"; shift; words=("$@"); CURRENT=$#
            _clap_dynamic_completer_subagents"#;
        let script = self.script("zsh");
        let mut args = vec!["-f", "-c", code, "zsh", script.to_str().unwrap()];
        args.extend(words);
        self.shell("zsh", &args)
    }

    /// fish: `complete -C` of the command line, after loading the script.
    fn fish(&self, line: &str) -> Vec<String> {
        let script = self.script("fish");
        let code = format!("source {}; complete -C '{line}'", script.display());
        self.shell("fish", &["--no-config", "-c", &code])
    }

    /// The run ids of `offered`, in order.
    fn ids(&self, offered: &[String]) -> Vec<String> {
        offered
            .iter()
            .filter(|c| **c == self.active || **c == self.finished)
            .cloned()
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.env.run(&["stop", &self.active]);
    }
}

fn installed(shell: &str) -> bool {
    let found = Command::new(shell)
        .arg("-c")
        .arg("exit 0")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: {shell} is not installed");
    }
    found
}

fn agents(offered: &[String]) -> Vec<&str> {
    let mut names: Vec<&str> = offered
        .iter()
        .map(String::as_str)
        .filter(|c| ["fixer", "reviewer", "scout", "summarize"].contains(c))
        .collect();
    names.sort();
    names
}

const AGENTS: [&str; 4] = ["fixer", "reviewer", "scout", "summarize"];

#[test]
fn bash_completes_run_ids_active_first_and_agent_names() {
    let f = Fixture::new();
    let offered = f.bash(&["subagents", "--root", f.root(), "status", ""]);
    assert_eq!(
        f.ids(&offered),
        [f.active.clone(), f.finished.clone()],
        "{offered:?}"
    );
    assert!(offered.contains(&"last".to_owned()), "{offered:?}");
    // A prefix narrows the ids.
    let prefix = &f.finished[..4];
    let offered = f.bash(&["subagents", "--root", f.root(), "logs", prefix]);
    assert!(offered.contains(&f.finished), "{offered:?}");
    assert!(offered.iter().all(|c| c.starts_with(prefix)), "{offered:?}");
    let offered = f.bash(&["subagents", "--root", f.root(), "run", "--agent", ""]);
    assert_eq!(agents(&offered), AGENTS, "{offered:?}");
}

#[test]
fn zsh_completes_run_ids_active_first_and_agent_names() {
    if !installed("zsh") {
        return;
    }
    let f = Fixture::new();
    let offered = f.zsh(&["subagents", "--root", f.root(), "stop", ""]);
    assert_eq!(
        f.ids(&offered),
        [f.active.clone(), f.finished.clone()],
        "{offered:?}"
    );
    let offered = f.zsh(&["subagents", "run", "--agent", ""]);
    assert_eq!(agents(&offered), AGENTS, "{offered:?}");
}

#[test]
fn fish_completes_run_ids_active_first_and_agent_names() {
    if !installed("fish") {
        return;
    }
    let f = Fixture::new();
    let offered = f.fish(&format!("subagents --root {} status ", f.root()));
    assert_eq!(
        f.ids(&offered),
        [f.active.clone(), f.finished.clone()],
        "{offered:?}"
    );
    let offered = f.fish("subagents agents show ");
    assert_eq!(agents(&offered), AGENTS, "{offered:?}");
}
