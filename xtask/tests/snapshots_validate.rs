//! Every recorded snapshot must pass the reader of its kind, so a snapshot
//! can never record an artifact our own readers refuse. (To be switched to
//! `subagents validate` once that command exists.)

use std::collections::BTreeSet;

use xtask::snapshots::{Kind, read_snapshot, snapshot_dir, validate};

#[test]
fn every_snapshot_passes_the_reader_of_its_kind() {
    let dir = snapshot_dir();
    let mut failures = Vec::new();
    let mut kinds = BTreeSet::new();
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("the snapshot folder exists") {
        let path = entry.expect("readable folder").path();
        if path.extension().and_then(|e| e.to_str()) != Some("snap") {
            continue;
        }
        count += 1;
        match read_snapshot(&path) {
            Ok((kind, text)) => {
                kinds.insert(kind);
                if let Err(reason) = validate(kind, &text) {
                    failures.push(format!(
                        "{}: {} refused: {reason}",
                        path.display(),
                        kind.name()
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: {e:#}", path.display())),
        }
    }
    assert!(count > 0, "no snapshots under {}", dir.display());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let missing: Vec<_> = Kind::ALL
        .into_iter()
        .filter(|k| !kinds.contains(k))
        .map(Kind::name)
        .collect();
    assert!(missing.is_empty(), "no snapshot of kind {missing:?}");
}

#[test]
fn every_reader_refuses_an_empty_object() {
    for kind in Kind::ALL {
        assert!(
            validate(kind, "{}").is_err(),
            "the {} reader accepts anything",
            kind.name()
        );
    }
}

#[test]
fn kinds_round_trip_through_their_names() {
    for kind in Kind::ALL {
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
    }
}
