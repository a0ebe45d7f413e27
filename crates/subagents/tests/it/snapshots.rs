//! Every golden snapshot in `xtask/snapshots/` passes `subagents validate`
//! for its kind, so no snapshot can record an artifact our readers refuse.
//! (Descriptors whose budget directory is the placeholder `<root>` are
//! checked by the crate readers in `cargo test -p xtask` instead.)

use crate::common;

use std::path::Path;

use common::Env;

/// The `--kind` of `validate` for a snapshot's recorded kind.
fn validate_kind(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "status" => "status",
        "candidate" => "terminal-candidate",
        "proof" => "process-terminal",
        "manifest" => "fanout-manifest",
        "startup" | "startup-ack" | "startup-proceed" => "startup",
        "capacity-owner" => "capacity-owner",
        "launch-contract" => "launch-contract",
        _ => return None,
    })
}

/// (kind, body) of an insta snapshot file, final newline restored.
fn parse(text: &str) -> (String, String) {
    let mut parts = text.splitn(3, "---\n");
    let _ = parts.next();
    let header = parts.next().unwrap_or_default();
    let mut body = parts
        .next()
        .unwrap_or_default()
        .trim_end_matches('\n')
        .to_owned();
    let field = |name: &str| {
        header
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    if field("endsWithNewline:") == "true" {
        body.push('\n');
    }
    (field("kind:"), body)
}

#[test]
fn every_snapshot_passes_validate_for_its_kind() {
    let env = Env::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../xtask/snapshots");
    let mut checked = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("snap") {
            continue;
        }
        let (kind, body) = parse(&std::fs::read_to_string(&path).unwrap());
        let Some(validate) = validate_kind(&kind) else {
            continue;
        };
        let file = Path::new(env.work())
            .join(path.file_name().unwrap())
            .with_extension("json");
        std::fs::write(&file, body).unwrap();
        let out = env.run(&["validate", "--kind", validate, file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{} ({kind}) refused: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
        kinds.insert(validate);
    }
    assert!(checked >= 30, "only {checked} snapshots checked");
    assert_eq!(
        kinds.len(),
        7,
        "every validate kind has a snapshot: {kinds:?}"
    );
}
