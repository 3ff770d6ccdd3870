//! Runs every conformance fixture of `$MWS_CONFORMANCE_DIR` (default: the vendored
//! `tests/fixtures/conformance`): kinds `placement`, `upload`, `manifest` and `load`
//! (load cases fill the source objects by the fixture's byte rule, execute the
//! restore on the memory store and compare every target byte and every region).
//! Prints one line per case and a final `N passed, M failed` line; fails if any case
//! fails or if no case ran.

mod common;

use common::*;
use mooncake_weight_store::*;
use serde_json::Value as J;
use sha2::Digest;

enum Outcome {
    Pass,
    Fail(String),
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
        Err(e) => {
            println!("  rejected as expected: {e}");
            Outcome::Pass
        }
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
            check(
                ids.get(f.placement_fragment_id()).and_then(J::as_str) == Some(&f.canonical_id()),
                "canonical fragment id",
            )?;
        }
        Ok::<(), String>(())
    })();
    res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
}

fn run_upload(inputs: &J, expected: &J) -> Outcome {
    let r = (|| {
        let placement = placement_from_fixture(inputs, "placement")?;
        let bindings =
            inputs["bindings"].as_array().unwrap().iter().map(binding_from_fixture).collect::<Result<Vec<_>>>()?;
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
            check(
                o.source_placement().placement_fragment_id() == e["source_placement_fragment_id"],
                "op placement fragment",
            )?;
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

/// Fill rule `sha256-linear-v1`: the bytes of `shape`-box at `offset` of a tensor.
fn fill_box(tensor_id: &str, global_shape: &[u64], itemsize: u64, offset: &[u64], shape: &[u64]) -> Vec<u8> {
    let n = shape.len();
    let count: u64 = shape.iter().product();
    let mut out = Vec::with_capacity((count * itemsize) as usize);
    let mut idx = vec![0u64; n];
    for _ in 0..count {
        let mut linear = 0u64;
        for d in 0..n {
            linear = linear * global_shape[d] + offset[d] + idx[d];
        }
        let digest = sha2::Sha256::digest(format!("{tensor_id}:{linear}").as_bytes());
        out.extend_from_slice(&digest[..itemsize as usize]);
        for d in (0..n).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn run_load(inputs: &J, expected: &J) -> Outcome {
    use mooncake_weight_store::plan::load::PlanningLimits;
    use mooncake_weight_store::protocol::{LoadArgs, LoadPlan, StaticGuard, WeightStore};
    use mooncake_weight_store::store::{memory::MemoryStore, ObjectStore, RecordType, WriteConfig};
    use std::sync::Arc;

    let text = inputs["stored_manifest"].as_str().expect("stored_manifest string");
    let parsed = StoredManifest::from_json(text.as_bytes())
        .and_then(|m| Ok((m, placement_from_fixture(inputs, "target_placement")?)));
    let (manifest, target) = match parsed {
        Ok(v) => v,
        Err(e) if expected.get("error").is_some() => {
            println!("  rejected as expected: {e}");
            return Outcome::Pass;
        }
        Err(e) => return Outcome::Fail(format!("rejected: {e}")),
    };
    let manifest = Arc::new(manifest);
    let target = Arc::new(target);
    // Target buffers (sentinel 0xA5) and bindings for every non-empty participant.
    let mut buffers: Vec<(String, String, Vec<u8>)> = Vec::new();
    for part in target.parts() {
        for f in part.fragments() {
            buffers.push((
                part.participant_id().to_string(),
                f.placement_fragment_id().to_string(),
                vec![0xA5; f.nbytes() as usize],
            ));
        }
    }
    let mut bindings = Vec::new();
    let mut next = 0;
    for part in target.parts() {
        if part.fragments().is_empty() {
            continue;
        }
        let mut frags = Vec::new();
        for (fi, f) in part.fragments().iter().enumerate() {
            let buf = &mut buffers[next];
            next += 1;
            let t = target.tensor(f.tensor_id()).unwrap();
            let address = buf.2.as_mut_ptr() as u64;
            frags.push(
                RuntimeFragment::new(RuntimeFragmentSpec {
                    placement_fragment_id: f.placement_fragment_id().into(),
                    fragment_id: format!("{}:rt{fi}", part.participant_id()),
                    address,
                    nbytes: f.nbytes(),
                    worker_id: part.participant_id().into(),
                    endpoint: "local".into(),
                    device: "cpu".into(),
                    itemsize: t.itemsize(),
                    local_shape: f.local_shape().to_vec(),
                    strides_bytes: model::canonical_strides(f.local_shape(), t.itemsize()),
                    storage_address: address,
                    storage_nbytes: f.nbytes(),
                    storage_offset_bytes: 0,
                    memory: MemoryKind::Host,
                })
                .unwrap(),
            );
        }
        bindings.push(
            RuntimeBinding::new(RuntimeBindingSpec {
                resource_id: target.resource_id().into(),
                placement_id: target.placement_id().into(),
                placement_digest: target.digest().into(),
                instance_id: "instance".into(),
                generation: 1,
                lease_id: "lease".into(),
                revision: target.revision().into(),
                participant_id: part.participant_id().into(),
                fragments: frags,
            })
            .unwrap(),
        );
    }
    let planned = LoadPlan::plan(manifest.clone(), target.clone(), &bindings, PlanningLimits::default());
    if expected.get("error").is_some() {
        let untouched = buffers.iter().all(|b| b.2.iter().all(|&x| x == 0xA5));
        return match planned {
            Err(e) if untouched => {
                println!("  rejected as expected: {e}");
                Outcome::Pass
            }
            Err(_) => Outcome::Fail("rejected but a target buffer was written".into()),
            Ok(_) => Outcome::Fail("accepted an input the reference rejects".into()),
        };
    }
    let plan = match planned {
        Ok(p) => p,
        Err(e) => return Outcome::Fail(format!("rejected: {e}")),
    };
    let res = (|| {
        let logical = plan.logical();
        check(manifest.manifest_digest() == expected["source_manifest_digest"], "source_manifest_digest")?;
        check(target.placement_id() == expected["target_placement_id"], "target_placement_id")?;
        check(logical.total_bytes() == expected["total_bytes"], "total_bytes")?;
        let regions = expected["regions"].as_array().ok_or("regions")?;
        check(regions.len() == logical.regions().len(), "region count")?;
        for (r, e) in logical.regions().iter().zip(regions) {
            let ua = |v: &J| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<_>>();
            check(logical.source_of(r).fragment_id() == e["source"]["fragment_id"], "region source")?;
            check(
                logical.target_of(r).placement_fragment_id() == e["target"]["placement_fragment_id"],
                "region target",
            )?;
            check(logical.target_participant_of(r) == e["target"]["participant_id"], "region target participant")?;
            check(
                r.overlap_offset == ua(&e["overlap_offset"]) && r.overlap_shape == ua(&e["overlap_shape"]),
                "region overlap",
            )?;
            check(
                r.source_base_offset == e["source_base_offset"] && r.target_base_offset == e["target_base_offset"],
                "region bases",
            )?;
            check(
                r.inner_bytes == e["inner_bytes"] && r.outer_loop_counts == ua(&e["outer_loop_counts"]),
                "region loops",
            )?;
            check(
                r.source_strides == ua(&e["source_strides"]) && r.target_strides == ua(&e["target_strides"]),
                "region strides",
            )?;
            check(r.segment_count() == e["segment_count"] && r.total_bytes() == e["total_bytes"], "region counts")?;
        }
        let execs = expected["target_executors"].as_array().ok_or("target_executors")?;
        let ours: Vec<_> = logical.target_executors().collect();
        check(ours.len() == execs.len(), "executor count")?;
        for ((pid, _, ops), e) in ours.iter().zip(execs) {
            check(*pid == e["participant_id"], "executor participant")?;
            let eops: Vec<u64> =
                e["operation_indices"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            check(ops.iter().map(|&x| x as u64).collect::<Vec<_>>() == eops, "executor operations")?;
        }
        // Byte check: source objects by the fill rule, then execute on the memory store.
        let backend = Arc::new(MemoryStore::new());
        let store = &*backend;
        let mut objects: std::collections::BTreeMap<&str, Vec<u8>> = Default::default();
        for f in manifest.fragments() {
            let t = manifest.tensors().iter().find(|t| t.tensor_id() == f.tensor_id()).unwrap();
            let bytes = fill_box(f.tensor_id(), t.global_shape(), t.itemsize(), f.global_offset(), f.local_shape());
            let obj = objects.entry(f.object_key()).or_default();
            let end = (f.object_offset() + f.nbytes()) as usize;
            if obj.len() < end {
                obj.resize(end, 0);
            }
            obj[f.object_offset() as usize..end].copy_from_slice(&bytes);
        }
        let bc = &expected["byte_check"];
        for o in bc["objects"].as_array().unwrap() {
            let ours = objects.get(o["object_key"].as_str().unwrap()).ok_or("object missing")?;
            check(
                ours.len() as u64 == o["size"] && hex(&sha2::Sha256::digest(ours)) == o["sha256"],
                "source object bytes",
            )?;
        }
        let group = [manifest.group_id().to_string()];
        let cfg = WriteConfig { group_ids: &group, record_type: RecordType::Payload };
        for (k, v) in &objects {
            store.put(k, v, &cfg).map_err(|e| e.to_string())?;
        }
        store.put(manifest.manifest_key(), manifest.to_json().as_bytes(), &cfg).map_err(|e| e.to_string())?;
        let ws = WeightStore::new(backend.clone());
        for b in &bindings {
            let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
            // SAFETY: the target buffers live in `buffers`, untouched during the call.
            unsafe { ws.load(&plan, b, args) }.map_err(|e| e.to_string())?;
        }
        for t in bc["targets"].as_array().unwrap() {
            let buf = buffers
                .iter()
                .find(|b| t["participant_id"] == b.0.as_str() && t["placement_fragment_id"] == b.1.as_str())
                .ok_or("target buffer missing")?;
            check(buf.2.len() as u64 == t["nbytes"], "target size")?;
            check(hex(&sha2::Sha256::digest(&buf.2)) == t["sha256"], "target bytes")?;
        }
        Ok::<(), String>(())
    })();
    res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
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
    let (mut passed, mut failed) = (0, 0);
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case: J = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let (inputs, expected) = (&case["inputs"], &case["expected"]);
        let kind = case["kind"].as_str().unwrap_or("");
        let outcome = match kind {
            "placement" => run_placement(inputs, expected),
            "upload" => run_upload(inputs, expected),
            "manifest" => run_manifest(inputs, expected),
            "load" => run_load(inputs, expected),
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
        }
    }
    println!("conformance: {passed} passed, {failed} failed");
    assert!(passed + failed > 0, "no conformance case ran in {}", dir.display());
    assert_eq!(failed, 0, "{failed} conformance case(s) failed");
}
