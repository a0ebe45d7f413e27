//! Where definitions are found, and which one wins a name.
//!
//! Searched in order (the first definition of a name wins):
//!
//! 1. the project's `.subagents/agents/` (runner defaults to `pi`),
//! 2. the project's `.pi/agents/` (runner `pi`),
//! 3. the project's `.claude/agents/` (runner `claude`),
//! 4. the user's `$XDG_CONFIG_HOME/subagents/agents` (default
//!    `~/.config/subagents/agents`; runner defaults to `pi`).
//!
//! The project is the nearest ancestor of the working directory holding
//! `.subagents`, `.pi`, `.claude` or `.git`. Directories are read
//! recursively; `*.chain.md` files (pi-subagents chains) are not agents.
//! Definitions are only read, never written.

use std::path::{Path, PathBuf};

use crate::definition::{AgentDefinition, DefinitionError, RunnerKind, read_definition};

/// Whose directory a definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The project (wins).
    Project,
    /// The user's config directory.
    User,
}

impl Scope {
    /// `project` or `user`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Project => "project",
            Scope::User => "user",
        }
    }
}

/// One directory searched for definitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDir {
    /// The directory.
    pub dir: PathBuf,
    /// Whose it is.
    pub scope: Scope,
    /// The runner of a definition that names none.
    pub default_runner: RunnerKind,
}

/// A definition and where it was found.
#[derive(Debug, Clone)]
pub struct Found {
    /// The definition.
    pub definition: AgentDefinition,
    /// Its scope.
    pub scope: Scope,
}

/// Every definition found, and every file that could not be used.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Usable definitions, first-found per name, sorted by name.
    pub agents: Vec<Found>,
    /// Files that could not be used (each names its file and line).
    pub errors: Vec<DefinitionError>,
}

/// The nearest ancestor of `cwd` (itself included) that looks like a project root.
pub fn project_root(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|dir| {
            [".subagents", ".pi", ".claude", ".git"]
                .iter()
                .any(|marker| dir.join(marker).exists())
        })
        .map(Path::to_path_buf)
}

/// The user's definitions directory from `$XDG_CONFIG_HOME` / `$HOME`.
pub fn user_dir(xdg_config_home: Option<&Path>, home: Option<&Path>) -> Option<PathBuf> {
    let base = xdg_config_home
        .filter(|p| p.is_absolute())
        .map(Path::to_path_buf)
        .or_else(|| home.map(|h| h.join(".config")))?;
    Some(base.join("subagents").join("agents"))
}

/// The directories searched, in precedence order.
pub fn search_dirs(project: Option<&Path>, user: Option<&Path>) -> Vec<SearchDir> {
    let mut dirs = Vec::new();
    if let Some(root) = project {
        for (sub, runner) in [
            (".subagents/agents", RunnerKind::Pi),
            (".pi/agents", RunnerKind::Pi),
            (".claude/agents", RunnerKind::Claude),
        ] {
            dirs.push(SearchDir {
                dir: root.join(sub),
                scope: Scope::Project,
                default_runner: runner,
            });
        }
    }
    if let Some(dir) = user {
        dirs.push(SearchDir {
            dir: dir.to_path_buf(),
            scope: Scope::User,
            default_runner: RunnerKind::Pi,
        });
    }
    dirs
}

impl Catalog {
    /// Reads every definition under `dirs`; a bad file is kept as an error
    /// and never hides the others.
    pub fn load(dirs: &[SearchDir]) -> Catalog {
        let mut catalog = Catalog::default();
        for dir in dirs {
            let mut files = Vec::new();
            collect_markdown(&dir.dir, 0, &mut files);
            files.sort();
            for file in files {
                match read_definition(&file, dir.default_runner) {
                    Ok(definition) => {
                        if catalog.find(&definition.name).is_none() {
                            catalog.agents.push(Found {
                                definition,
                                scope: dir.scope,
                            });
                        }
                    }
                    Err(e) => catalog.errors.push(e),
                }
            }
        }
        catalog
            .agents
            .sort_by(|a, b| a.definition.name.cmp(&b.definition.name));
        catalog
    }

    /// The definition named `name`.
    pub fn find(&self, name: &str) -> Option<&Found> {
        self.agents.iter().find(|f| f.definition.name == name)
    }
}

/// `.md` files under `dir` (not `.chain.md`), at most 8 levels deep.
fn collect_markdown(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        // Follows symlinks: agent directories are often linked from dotfiles.
        if path.is_dir() {
            if depth < 8 {
                collect_markdown(&path, depth + 1, out);
            }
        } else if name.ends_with(".md") && !name.ends_with(".chain.md") {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn project_wins_and_a_bad_file_hides_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let project = tmp.path().join("p");
        let user = tmp.path().join("u");
        write(
            &project.join(".claude/agents/rev.md"),
            "---\nname: rev\n---\nproject",
        );
        write(&project.join(".pi/agents/broken.md"), "---\nname: [\n---\n");
        write(&project.join(".pi/agents/x.chain.md"), "not an agent");
        write(
            &user.join("rev.md"),
            "---\nname: rev\nrunner: codex\n---\nuser",
        );
        write(&user.join("nested/solo.md"), "---\nrunner: codex\n---\n");
        let catalog = Catalog::load(&search_dirs(Some(&project), Some(&user)));
        let names: Vec<&str> = catalog
            .agents
            .iter()
            .map(|f| f.definition.name.as_str())
            .collect();
        assert_eq!(names, ["rev", "solo"]);
        let rev = catalog.find("rev").unwrap();
        assert_eq!(rev.definition.runner, RunnerKind::Claude);
        assert_eq!(rev.scope, Scope::Project);
        assert_eq!(catalog.errors.len(), 1);
        assert!(
            catalog.errors[0].to_string().contains("broken.md:2:"),
            "{}",
            catalog.errors[0]
        );
    }

    #[test]
    fn user_dir_prefers_xdg() {
        assert_eq!(
            user_dir(Some(Path::new("/x")), Some(Path::new("/h"))),
            Some(PathBuf::from("/x/subagents/agents"))
        );
        assert_eq!(
            user_dir(None, Some(Path::new("/h"))),
            Some(PathBuf::from("/h/.config/subagents/agents"))
        );
    }

    #[test]
    fn the_project_is_the_nearest_ancestor_with_a_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let outer = tmp.path().join("outer");
        let inner = outer.join("a/inner");
        std::fs::create_dir_all(outer.join(".git")).unwrap();
        std::fs::create_dir_all(inner.join("src/deep")).unwrap();
        assert_eq!(project_root(&inner.join("src/deep")), Some(outer.clone()));
        for marker in [".subagents", ".pi", ".claude"] {
            let marked = inner.join(marker);
            std::fs::create_dir(&marked).unwrap();
            assert_eq!(project_root(&inner.join("src/deep")), Some(inner.clone()));
            // The working directory itself counts.
            assert_eq!(project_root(&inner), Some(inner.clone()), "{marker}");
            std::fs::remove_dir(&marked).unwrap();
        }
    }

    #[test]
    fn scopes_are_named_project_and_user() {
        assert_eq!(Scope::Project.as_str(), "project");
        assert_eq!(Scope::User.as_str(), "user");
    }

    #[test]
    fn definitions_are_found_eight_directories_deep_and_no_deeper() {
        let tmp = tempfile::tempdir().unwrap();
        let eight = tmp.path().join("1/2/3/4/5/6/7/8");
        write(&eight.join("deep.md"), "---\nname: deep\n---\n");
        write(
            &eight.join("9").join("deeper.md"),
            "---\nname: deeper\n---\n",
        );
        let catalog = Catalog::load(&search_dirs(None, Some(tmp.path())));
        let names: Vec<&str> = catalog
            .agents
            .iter()
            .map(|f| f.definition.name.as_str())
            .collect();
        assert_eq!(names, ["deep"]);
        assert_eq!(catalog.agents[0].scope, Scope::User);
    }
}
