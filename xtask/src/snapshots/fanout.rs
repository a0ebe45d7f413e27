//! The fan-out budget: manifest, claim slots, descriptor, persisted
//! descriptor, environment encoding and a rejection.

use fanout_budget::{
    BUDGET_ROOT_DIR, CLAIMS_DIR, MANIFEST_FILE, PERSISTED_FILE, Sources, create_budget_with,
    write_persisted,
};

use super::{Artifact, Kind, Scratch, Ticks, Uuids};

const FAMILY: &str = "fanout";

/// Every fan-out artifact, from one budget of limit 3.
pub(super) fn artifacts() -> anyhow::Result<Vec<Artifact>> {
    let scratch = Scratch::new()?;
    let (uuids, ticks) = (Uuids::default(), Ticks::default());
    let (uuid, now_ms) = (|| uuids.next(), || ticks.now());
    let sources = Sources {
        now_ms: &now_ms,
        uuid: &uuid,
    };
    let root = scratch.path().join(BUDGET_ROOT_DIR);
    let budget = create_budget_with(&root, "run-7f3a", 3, &sources)?;
    let dir = budget.descriptor().directory.clone();
    let mut out = vec![
        scratch
            .record(FAMILY, "manifest", Kind::Manifest, &dir.join(MANIFEST_FILE))?
            .note("written by `create_budget_with` for root run `run-7f3a`, limit 3"),
    ];

    budget.claim_using(&["single"], &sources)?;
    let child = fanout_budget::OpenBudget::open(&root, &budget.descriptor().child("chain[0]"))?;
    child.claim_using(&["tasks[0]", "tasks[1]"], &sources)?;
    let claims = dir.join(CLAIMS_DIR);
    out.push(
        scratch
            .record(
                FAMILY,
                "claim-top-level",
                Kind::Claim,
                &claims.join("000000.json"),
            )?
            .note("slot 0, claimed by the root launch for `single`"),
    );
    out.push(
        scratch
            .record(
                FAMILY,
                "claim-qualified",
                Kind::Claim,
                &claims.join("000002.json"),
            )?
            .note("slot 2, claimed through a child descriptor (`parentPath` chain[0])"),
    );

    let rejected = child
        .claim_using(&["tasks[2]", "tasks[3]"], &sources)
        .err()
        .and_then(|e| e.rejection().cloned())
        .ok_or_else(|| anyhow::anyhow!("a full budget admitted a claim"))?;
    out.push(
        scratch
            .text(
                FAMILY,
                "rejection",
                Kind::Rejection,
                "rejection object",
                &serde_json::to_string(&rejected)?,
            )
            .note(format!(
                "compact JSON of the refused admission; its message: {rejected}"
            )),
    );

    let descriptor = budget.descriptor().child("chain[0]");
    out.push(
        scratch
            .text(
                FAMILY,
                "descriptor",
                Kind::Descriptor,
                "descriptor JSON",
                &descriptor.to_json(),
            )
            .note("`Descriptor::to_json` of the child descriptor for `chain[0]`"),
    );

    let run_dir = scratch.path().join("async-subagent-runs").join("run-7f3a");
    std::fs::create_dir_all(&run_dir)?;
    write_persisted(&run_dir, &root, &descriptor)?;
    out.push(
        scratch
            .record(
                FAMILY,
                "persisted-descriptor",
                Kind::PersistedDescriptor,
                &run_dir.join(PERSISTED_FILE),
            )?
            .note("written by `write_persisted` for the child descriptor"),
    );

    // base64 would hide the scratch path from normalisation, so the encoded
    // descriptor names its directory under `<root>` before encoding.
    let (directory, _) = scratch.normalise(&descriptor.directory.to_string_lossy());
    let pinned = fanout_budget::Descriptor {
        directory: directory.into(),
        ..descriptor
    };
    out.push(
        scratch
            .text(
                FAMILY,
                "env-encoding",
                Kind::EnvEncoding,
                fanout_budget::BUDGET_ENV,
                &pinned.to_env_value(),
            )
            .note(
                "`Descriptor::to_env_value` of the child descriptor, its directory under `<root>`",
            ),
    );
    Ok(out)
}
