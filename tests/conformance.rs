//! Runs every conformance fixture of `$MWS_CONFORMANCE_DIR` (default
//! `../shared/conformance`): kinds `placement`, `upload`, `manifest` and `load`.
//! Prints one line per case and a final `N passed, M failed` line; fails if any case
//! fails or if no case ran.

mod common;

use common::*;
use mooncake_weight_store::*;
use serde_json::Value as J;

enum Outcome {
    Pass,
    Fail(String),
    NotRun(&'static str),
}

fn check(cond: bool, what: &str) -> std::result::Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(format!("mismatch: {what}"))
    }
}

fn expect_rejection<T>(r: Result<T>) -> Outcome {
    match r {
        Err(_) => Outcome::Pass,
        Ok(_) => Outcome::Fail("accepted an input the reference rejects".into()),
    }
}

fn run_placement(inputs: &J, expected: &J) -> Outcome {
    let key = if inputs.get("placement_json").is_some() { "placement_json" } else { "placement" };
    let r = placement_from_fixture(inputs, key);
    if expected.get("error").is_some() {
        return expect_rejection(r);
    }
    let p = match r {
        Ok(p) => p,
        Err(e) => return Outcome::Fail(format!("rejected: {e}")),
    };
    let res = (|| {
        check(p.placement_id() == expected["placement_id"], "placement_id")?;
        check(p.digest() == expected["digest"], "digest")?;
        check(p.topology().topology_id() == expected["topology_id"], "topology_id")?;
        check(p.to_json() == expected["canonical_json"], "canonical_json")?;
        let ids = expected["canonical_fragment_ids"].as_object().ok_or("canonical_fragment_ids")?;
        check(ids.len() == p.fragment_count(), "fragment count")?;
        for f in p.fragments() {
            check(ids.get(f.placement_fragment_id()).and_then(J::as_str) == Some(&f.canonical_id()), "canonical fragment id")?;
        }
        Ok::<(), String>(())
    })();
    res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
}

fn run_upload(inputs: &J, expected: &J) -> Outcome {
    let r = (|| {
        let placement = placement_from_fixture(inputs, "placement")?;
        let bindings = inputs["bindings"].as_array().unwrap().iter().map(binding_from_fixture).collect::<Result<Vec<_>>>()?;
        let options = UploadOptions {
            namespace: inputs["namespace"].as_str().unwrap().into(),
            key_prefix: inputs["key_prefix"].as_str().unwrap().into(),
            transaction_id: Some(inputs["transaction_id"].as_str().unwrap().into()),
            created_at: Some(inputs["created_at"].as_str().unwrap().into()),
        };
        plan_upload(&placement, &bindings, &options)
    })();
    if expected.get("error").is_some() {
        return expect_rejection(r);
    }
    let plan = match r {
        Ok(p) => p,
        Err(e) => return Outcome::Fail(format!("rejected: {e}")),
    };
    let res = (|| {
        let m = plan.manifest();
        check(m.to_json() == expected["manifest_json"], "manifest_json")?;
        check(m.manifest_digest() == expected["manifest_digest"], "manifest_digest")?;
        check(m.group_id() == expected["group_id"], "group_id")?;
        check(m.manifest_key() == expected["manifest_key"], "manifest_key")?;
        check(plan.transaction_group_id() == expected["transaction_group_id"], "transaction_group_id")?;
        check(plan.control_key() == expected["control_key"], "control_key")?;
        check(plan.source_placement_id() == expected["source_placement_id"], "source_placement_id")?;
        check(plan.source_placement_digest() == expected["source_placement_digest"], "source_placement_digest")?;
        check(plan.decision_record(Decision::Commit) == expected["decision_commit_record"], "decision record")?;
        let ops = expected["operations"].as_array().ok_or("operations")?;
        check(ops.len() == plan.operations().len(), "operation count")?;
        for (o, e) in plan.operations().iter().zip(ops) {
            check(o.source_participant_id() == e["source_participant_id"], "op participant")?;
            check(o.source_instance_id() == e["source_instance_id"], "op instance")?;
            check(o.source_lease_id() == e["source_lease_id"], "op lease")?;
            check(o.source_generation() == e["source_generation"], "op generation")?;
            check(o.source_snapshot().fragment_id() == e["source_fragment_id"], "op runtime fragment")?;
            check(o.source_snapshot().worker_id() == e["source_worker_id"], "op worker")?;
            check(o.source_placement().placement_fragment_id() == e["source_placement_fragment_id"], "op placement fragment")?;
            check(o.target().fragment_id() == e["target_fragment_id"], "op target fragment")?;
            check(o.target().object_key() == e["object_key"], "op object key")?;
            check(o.target().nbytes() == e["nbytes"], "op nbytes")?;
        }
        Ok::<(), String>(())
    })();
    res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
}

fn run_manifest(inputs: &J, expected: &J) -> Outcome {
    let text = inputs["stored_manifest"].as_str().expect("stored_manifest string");
    let r = StoredManifest::from_json(text.as_bytes());
    if expected["valid"] == J::Bool(false) {
        return expect_rejection(r);
    }
    match r {
        Err(e) => Outcome::Fail(format!("rejected: {e}")),
        Ok(m) => {
            let res = check(m.manifest_digest() == expected["manifest_digest"], "manifest_digest")
                .and_then(|_| check(m.to_json() == expected["canonical_json"], "canonical_json"));
            res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
        }
    }
}

#[test]
fn conformance_fixtures() {
    let dir = conformance_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read conformance dir {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let (mut passed, mut failed, mut not_run) = (0, 0, 0);
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case: J = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let (inputs, expected) = (&case["inputs"], &case["expected"]);
        let kind = case["kind"].as_str().unwrap_or("");
        let outcome = match kind {
            "placement" => run_placement(inputs, expected),
            "upload" => run_upload(inputs, expected),
            "manifest" => run_manifest(inputs, expected),
            "load" => Outcome::NotRun("load path not implemented yet"),
            other => Outcome::Fail(format!("unknown kind {other}")),
        };
        match outcome {
            Outcome::Pass => {
                passed += 1;
                println!("conformance {name} ({kind}) ... ok");
            }
            Outcome::Fail(why) => {
                failed += 1;
                println!("conformance {name} ({kind}) ... FAILED: {why}");
            }
            Outcome::NotRun(why) => {
                not_run += 1;
                println!("conformance {name} ({kind}) ... not yet run: {why}");
            }
        }
    }
    println!("conformance: {passed} passed, {failed} failed, {not_run} not yet run");
    assert!(passed + failed > 0, "no conformance case ran in {}", dir.display());
    assert_eq!(failed, 0, "{failed} conformance case(s) failed");
}
