//! Runs every conformance fixture of `$MWS_CONFORMANCE_DIR` (default: the vendored
//! `tests/fixtures/conformance`): kinds `placement`, `upload`, `manifest` and `load`
//! (load cases fill the source objects by the fixture's byte rule, execute the
//! restore on the memory store and compare every target byte and every region).
//! Kind `transfer` (live placement -> placement reshards) is read from the `transfer/`
//! subfolder: rejections must be rejected, the logical and bound byte checks must
//! pass (plain memory copies routed through runtime fragment ids and relative
//! offsets), and regions, bound operations and executors must equal the reference's,
//! in order. Prints one line per case, per-kind counts and a final
//! `N passed, M failed` line over every kind; fails if any case fails or if no case ran.

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
            check(o.source_lease_generation() == e["source_generation"], "op generation")?;
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
                lease_generation: 1,
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

fn transfer_limits(inputs: &J) -> mooncake_weight_store::plan::load::PlanningLimits {
    let l = &inputs["planning_limits"];
    let get = |k: &str, d: u64| match l.get(k) {
        None => d,
        Some(v) => v.as_i64().map_or(0, |x| x.max(0) as u64),
    };
    mooncake_weight_store::plan::load::PlanningLimits {
        max_transfer_regions: get("max_transfer_regions", 1_000_000),
        max_segments_per_region: get("max_segments_per_region", 1_000_000),
        max_total_lowered_segments: get("max_total_lowered_segments", 10_000_000),
    }
}

/// Copies every segment of `r` from `src` at `s_off` to `dst` at `t_off`.
fn copy_region(
    r: &mooncake_weight_store::plan::load::TransferRegion,
    src: &[u8],
    s_off: u64,
    dst: &mut [u8],
    t_off: u64,
) {
    r.for_each_segment(u64::MAX, |s, t, n| {
        let (s, t, n) =
            ((s_off - r.source_base_offset + s) as usize, (t_off - r.target_base_offset + t) as usize, n as usize);
        dst[t..t + n].copy_from_slice(&src[s..s + n]);
    })
    .unwrap();
}

fn fill_fragment(p: &Placement, f: &PlacementFragment) -> Vec<u8> {
    let t = p.tensor(f.tensor_id()).unwrap();
    fill_box(f.tensor_id(), t.global_shape(), t.itemsize(), f.global_offset(), f.local_shape())
}

fn run_transfer(inputs: &J, expected: &J) -> Outcome {
    use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
    use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
    use mooncake_weight_store::plan::transfer_json::{bound_operation_json, executor_json, rank_json, region_json};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    let has_bindings = inputs.get("source_bindings").is_some();
    let planned = (|| {
        let source = Arc::new(placement_from_fixture(inputs, "source_placement")?);
        let target = Arc::new(placement_from_fixture(inputs, "target_placement")?);
        let limits = transfer_limits(inputs);
        let logical = match inputs.get("target_participant_id").and_then(J::as_str) {
            Some(p) => LogicalTransferPlan::plan_local(source, target, Some(p), limits)?,
            None => LogicalTransferPlan::plan(source, target, limits)?,
        };
        let bound = if has_bindings {
            let parse =
                |k: &str| inputs[k].as_array().unwrap().iter().map(binding_from_fixture).collect::<Result<Vec<_>>>();
            let (sb, tb) = (parse("source_bindings")?, parse("target_bindings")?);
            Some((TransferPlan::bind(&logical, &tb, &sb)?, sb, tb))
        } else {
            None
        };
        Ok::<_, Error>((logical, bound))
    })();
    if let Some(want) = expected.get("error").and_then(J::as_str) {
        // The messages are the reference's: require the same text.
        return match planned {
            Err(e) if e.message().contains(want) => expect_rejection(Err::<(), _>(e)),
            Err(e) => Outcome::Fail(format!("rejected with another message: {e} (reference: {want})")),
            Ok(_) => Outcome::Fail("accepted an input the reference rejects".into()),
        };
    }
    let (logical, bound) = match planned {
        Ok(v) => v,
        Err(e) => return Outcome::Fail(format!("rejected: {e}")),
    };
    let res = (|| {
        check(logical.source_placement_id() == expected["source_placement_id"], "source_placement_id")?;
        check(logical.target_placement_id() == expected["target_placement_id"], "target_placement_id")?;
        check(logical.total_bytes() == expected["total_bytes"], "total_bytes")?;
        check(logical.regions().len() as u64 == expected["region_count"], "region_count")?;
        check(logical.total_segments() == expected["segment_count"], "segment_count")?;
        let regions: Vec<J> = logical.regions().iter().map(|r| region_json(&logical, r)).collect();
        let want = expected["regions"].as_array().ok_or("regions")?;
        check(regions.len() == want.len(), "region count")?;
        for (i, (a, b)) in regions.iter().zip(want).enumerate() {
            check(a == b, &format!("region {i}: ours {a} reference {b}"))?;
        }
        for (side, execs) in [("source", logical.source_executors()), ("target", logical.target_executors())] {
            let ours: Vec<J> = execs
                .iter()
                .map(|e| {
                    serde_json::json!({"participant_id": e.participant_id, "rank": rank_json(e.rank),
                        "placement_fragment_ids": e.placement_fragment_ids, "operation_indices": e.operation_indices})
                })
                .collect();
            check(J::Array(ours) == expected[format!("{side}_executors")], &format!("{side} executors"))?;
        }
        let routes: Vec<J> = logical
            .pipeline_routes()
            .iter()
            .map(|r| {
                serde_json::json!({"source_pp": r.source_pp, "source_pipeline_stage_id": r.source_pipeline_stage_id,
                    "target_pp": r.target_pp, "target_pipeline_stage_id": r.target_pipeline_stage_id,
                    "operation_indices": r.operation_indices})
            })
            .collect();
        check(J::Array(routes) == expected["pipeline_routes"], "pipeline_routes")?;
        // Logical byte check: one buffer per placement fragment, plain copies.
        let (source, target) = (logical.source(), logical.target());
        let bc = &expected["byte_check"];
        let mut src_bufs: BTreeMap<(&str, &str), Vec<u8>> = BTreeMap::new();
        for part in source.parts() {
            for f in part.fragments() {
                src_bufs.insert((part.participant_id(), f.placement_fragment_id()), fill_fragment(source, f));
            }
        }
        for e in bc["sources"].as_array().unwrap() {
            let b = src_bufs
                .get(&(e["participant_id"].as_str().unwrap(), e["placement_fragment_id"].as_str().unwrap()))
                .ok_or("source buffer missing")?;
            check(hex(&sha2::Sha256::digest(b)) == e["sha256"], "source fill")?;
        }
        let mut dst_bufs: BTreeMap<(&str, &str), Vec<u8>> = BTreeMap::new();
        for e in logical.target_executors() {
            let part = target.part(&e.participant_id).unwrap();
            for f in part.fragments() {
                dst_bufs.insert((part.participant_id(), f.placement_fragment_id()), vec![0xA5; f.nbytes() as usize]);
            }
        }
        for r in logical.regions() {
            let s = &src_bufs[&(logical.source_participant_of(r), logical.source_of(r).placement_fragment_id())];
            let d = dst_bufs
                .get_mut(&(logical.target_participant_of(r), logical.target_of(r).placement_fragment_id()))
                .unwrap();
            copy_region(r, s, r.source_base_offset, d, r.target_base_offset);
        }
        let targets = bc["targets"].as_array().unwrap();
        check(targets.len() == dst_bufs.len(), "byte_check target count")?;
        for e in targets {
            let b = dst_bufs
                .get(&(e["participant_id"].as_str().unwrap(), e["placement_fragment_id"].as_str().unwrap()))
                .ok_or("target buffer missing")?;
            check(hex(&sha2::Sha256::digest(b)) == e["sha256"], "logical target bytes")?;
        }
        let Some((plan, sb, tb)) = bound else {
            return check(expected.get("bound").is_none(), "bound expected but no bindings given");
        };
        let eb = &expected["bound"];
        let ops = eb["operations"].as_array().ok_or("bound operations")?;
        check(ops.len() == plan.regions().len(), "bound operation count")?;
        for (i, e) in ops.iter().enumerate() {
            let ours = bound_operation_json(&plan, i);
            check(ours == *e, &format!("bound operation {i}: ours {ours} reference {e}"))?;
        }
        for side in [Side::Source, Side::Target] {
            let want = eb[format!("{}_executors", side.as_str())].as_array().ok_or("bound executors")?;
            let ours = plan.executors(side);
            check(ours.len() == want.len(), "bound executor count")?;
            for (e, w) in ours.iter().zip(want) {
                let j = executor_json(e);
                for k in [
                    "participant_id",
                    "instance_id",
                    "lease_id",
                    "worker_id",
                    "rank",
                    "fragment_ids",
                    "operation_indices",
                ] {
                    check(j[k] == w[k], &format!("bound {} executor {k}", side.as_str()))?;
                }
            }
            // resolve_executor_plans for every binding that takes part.
            let (placement, bindings) = if side == Side::Source { (source, &sb) } else { (target, &tb) };
            for b in bindings {
                let planned = ours.iter().any(|e| e.participant_id == b.participant_id());
                if !planned {
                    continue;
                }
                let mine = plan.resolve_executors(side, placement, b).map_err(|e| e.to_string())?;
                check(mine.iter().all(|&i| ours[i].participant_id == b.participant_id()), "resolved executors")?;
            }
        }
        // Bound byte check: buffers per runtime fragment, copies at relative offsets.
        let mut rsrc: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
        for b in &sb {
            let part = source.part(b.participant_id()).unwrap();
            for f in b.fragments() {
                let pf = part.fragment(f.placement_fragment_id()).unwrap();
                rsrc.insert((b.participant_id().into(), f.fragment_id().into()), fill_fragment(source, pf));
            }
        }
        let mut rdst: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
        for i in 0..plan.regions().len() {
            let j = bound_operation_json(&plan, i);
            let key = |v: &J| {
                (v["participant_id"].as_str().unwrap().to_string(), v["fragment_id"].as_str().unwrap().to_string())
            };
            let (sk, tk) = (key(&j["source"]), key(&j["target"]));
            let (_, tf) = plan.operation_fragment(i, Side::Target);
            let d = rdst.entry(tk).or_insert_with(|| vec![0xA5; tf.nbytes() as usize]);
            let r = &plan.regions()[i];
            copy_region(
                r,
                &rsrc[&sk],
                j["source"]["address_offset"].as_u64().unwrap(),
                d,
                j["target"]["address_offset"].as_u64().unwrap(),
            );
        }
        let targets = eb["byte_check"]["targets"].as_array().ok_or("bound byte_check")?;
        check(targets.len() == rdst.len(), "bound byte_check target count")?;
        for e in targets {
            let k = (e["participant_id"].as_str().unwrap().to_string(), e["fragment_id"].as_str().unwrap().to_string());
            let b = rdst.get(&k).ok_or("bound target buffer missing")?;
            check(hex(&sha2::Sha256::digest(b)) == e["sha256"], "bound target bytes")?;
        }
        // Transport: the plan survives its JSON form with the same bindings.
        let back = TransferPlan::from_json(&plan.to_json(), &tb, &sb).map_err(|e| e.to_string())?;
        check(back == plan, "bound plan JSON round trip")?;
        Ok::<(), String>(())
    })();
    res.map_or_else(Outcome::Fail, |_| Outcome::Pass)
}

#[test]
fn conformance_fixtures() {
    let dir = conformance_dir();
    let list = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    if !dir.is_dir() {
        panic!("cannot read conformance dir {}", dir.display());
    }
    let mut files = list(&dir);
    files.extend(list(&dir.join("transfer")));
    let (mut passed, mut failed) = (0, 0);
    let mut per_kind: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
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
            "transfer" => run_transfer(inputs, expected),
            other => Outcome::Fail(format!("unknown kind {other}")),
        };
        let counts = per_kind.entry(kind.to_string()).or_default();
        match outcome {
            Outcome::Pass => {
                passed += 1;
                counts.0 += 1;
                println!("conformance {name} ({kind}) ... ok");
            }
            Outcome::Fail(why) => {
                failed += 1;
                counts.1 += 1;
                println!("conformance {name} ({kind}) ... FAILED: {why}");
            }
        }
    }
    for (kind, (p, f)) in &per_kind {
        println!("conformance kind {kind}: {p} passed, {f} failed");
    }
    println!("conformance: {passed} passed, {failed} failed");
    assert!(passed + failed > 0, "no conformance case ran in {}", dir.display());
    assert_eq!(failed, 0, "{failed} conformance case(s) failed");
}
