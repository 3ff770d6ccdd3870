//! Issue 5: manifests read back from a store are untrusted. Every hostile manifest
//! or payload is refused with a clear error, nothing blows up, and target buffers
//! (filled with the sentinel 0xA5) are left untouched.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use builders::*;
use fake_store::*;
use model::HostModel;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{StaticGuard, WeightStore};
use mooncake_weight_store::store::{ObjectStore, RecordType, WriteConfig};
use mooncake_weight_store::*;
use serde_json::{json, Value as J};
use std::sync::Arc;

const SENTINEL: u8 = 0xA5;

struct Env {
    fake: Arc<FakeStore>,
    ws: WeightStore,
    manifest: StoredManifest,
}

/// A committed S(1,1) snapshot (one 8-byte payload).
fn env() -> Env {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 1, 1));
    let (_, manifest) = snapshot(&ws, &src, "good");
    Env { fake, ws, manifest }
}

fn upsert(fake: &FakeStore, key: &str, bytes: &[u8]) {
    fake.inner
        .upsert(key, bytes, &WriteConfig { group_ids: &["g".to_string()], record_type: RecordType::Metadata })
        .unwrap();
}

fn manifest_value(m: &StoredManifest) -> J {
    serde_json::from_str(&m.to_json()).unwrap()
}

/// Replaces the committed manifest with `edit`ed JSON.
fn tamper(e: &Env, edit: impl FnOnce(&mut J)) {
    let mut v = manifest_value(&e.manifest);
    edit(&mut v);
    upsert(&e.fake, e.manifest.manifest_key(), serde_json::to_string(&v).unwrap().as_bytes());
}

fn untouched(dst: &HostModel) {
    for b in &dst.buffers {
        assert!(b.iter().all(|&x| x == SENTINEL), "a target buffer was written");
    }
}

/// Loads the manifest at `key` into a fresh S(1,1) target.
fn attempt(ws: &WeightStore, key: &str, limits: PlanningLimits) -> (Result<()>, HostModel) {
    let dst = target(s_placement(1, 1, 1));
    let r = (|| {
        let m = Arc::new(ws.load_manifest(key)?);
        let plan = ws.plan_load(m, dst.placement.clone(), &dst.bindings, limits)?;
        load_all(ws, &plan, &dst, &StaticGuard).map(|_| ())
    })();
    (r, dst)
}

#[track_caller]
fn refused(e: &Env, needle: &str) -> Error {
    let (r, dst) = attempt(&e.ws, e.manifest.manifest_key(), PlanningLimits::default());
    let err = r.expect_err("hostile manifest accepted");
    assert!(err.message().contains(needle), "{err} does not contain {needle:?}");
    untouched(&dst);
    err
}

#[test]
fn baseline_loads() {
    let e = env();
    let (r, dst) = attempt(&e.ws, e.manifest.manifest_key(), PlanningLimits::default());
    r.unwrap();
    dst.verify().unwrap();
}

#[test]
fn object_shorter_than_manifest_claims() {
    let e = env();
    let key = e.manifest.fragments()[0].object_key().to_string();
    upsert(&e.fake, &key, &[1, 2, 3, 4]);
    let err = refused(&e, &key);
    assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
    assert!(err.message().contains("get_into_ranges failed"), "{err}");
}

#[test]
fn object_range_beyond_object() {
    let e = env();
    let key = e.manifest.fragments()[0].object_key().to_string();
    tamper(&e, |v| v["fragments"][0]["object_offset"] = json!(1u64 << 40));
    refused(&e, &key);
    tamper(&e, |v| v["fragments"][0]["object_offset"] = json!(4));
    refused(&e, &key);
}

#[test]
fn object_range_overflowing_u64() {
    let e = env();
    tamper(&e, |v| v["fragments"][0]["object_offset"] = json!(u64::MAX - 3));
    let (r, dst) = attempt(&e.ws, e.manifest.manifest_key(), PlanningLimits::default());
    assert!(r.is_err());
    untouched(&dst);
}

#[test]
fn coverage_hole_is_refused() {
    let e = env();
    tamper(&e, |v| {
        v["fragments"][0]["local_shape"] = json!([4]);
        v["fragments"][0]["nbytes"] = json!(4);
    });
    refused(&e, "invalid weight manifest");
}

#[test]
fn overlapping_fragments_are_refused() {
    let e = env();
    tamper(&e, |v| {
        let mut extra = v["fragments"][0].clone();
        extra["fragment_id"] = json!("extra");
        extra["global_offset"] = json!([4]);
        extra["local_shape"] = json!([4]);
        extra["nbytes"] = json!(4);
        v["fragments"].as_array_mut().unwrap().push(extra);
    });
    refused(&e, "invalid weight manifest");
}

#[test]
fn absurd_shapes_are_refused_without_overflow() {
    // A (2^64-1)-byte tensor is a structurally valid manifest: it is refused by
    // planning (it does not match the target). The others overflow u64 byte counts.
    for (shape, local, nbytes, needle) in [
        (json!([u64::MAX]), json!([u64::MAX]), json!(u64::MAX), "tensor descriptor mismatch"),
        (json!([1u64 << 32, 1u64 << 32]), json!([1u64 << 32, 1u64 << 32]), json!(u64::MAX), "invalid weight manifest"),
        (json!([u64::MAX, 2]), json!([u64::MAX, 2]), json!(2), "invalid weight manifest"),
    ] {
        let e = env();
        tamper(&e, |v| {
            v["tensors"][0]["global_shape"] = shape.clone();
            v["fragments"][0]["global_offset"] = json!(vec![0; local.as_array().unwrap().len()]);
            v["fragments"][0]["local_shape"] = local.clone();
            v["fragments"][0]["nbytes"] = nbytes.clone();
        });
        refused(&e, needle);
    }
}

#[test]
fn wrong_nbytes_is_refused() {
    let e = env();
    tamper(&e, |v| v["fragments"][0]["nbytes"] = json!(9));
    refused(&e, "invalid weight manifest");
}

#[test]
fn manifest_at_another_key_is_refused() {
    let e = env();
    let other = format!("{}/elsewhere/manifest", e.manifest.group_id());
    upsert(&e.fake, &other, e.manifest.to_json().as_bytes());
    let (r, dst) = attempt(&e.ws, &other, PlanningLimits::default());
    let err = r.unwrap_err();
    assert!(err.message().contains("manifest key mismatch"), "{err}");
    assert_eq!(err.kind(), ErrorKind::InvalidManifest);
    untouched(&dst);
}

#[test]
fn payload_key_outside_group_is_refused() {
    let e = env();
    tamper(&e, |v| v["fragments"][0]["object_key"] = json!("elsewhere/payload/x"));
    refused(&e, "does not belong to manifest group");
}

#[test]
fn garbage_and_truncated_json_are_refused() {
    let e = env();
    upsert(&e.fake, e.manifest.manifest_key(), b"\x00\xffnot json");
    refused(&e, "invalid weight manifest");
    let text = e.manifest.to_json();
    upsert(&e.fake, e.manifest.manifest_key(), &text.as_bytes()[..text.len() / 2]);
    refused(&e, "invalid weight manifest");
    tamper(&e, |v| v["fragments"] = json!([]));
    refused(&e, "invalid weight manifest");
}

#[test]
fn committed_manifest_swapped_after_planning_is_refused() {
    let e = env();
    let dst = target(s_placement(1, 1, 1));
    let m = Arc::new(e.ws.load_manifest(e.manifest.manifest_key()).unwrap());
    let plan = e.ws.plan_load(m, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    tamper(&e, |v| v["created_at"] = json!("forged"));
    let err = load_all(&e.ws, &plan, &dst, &StaticGuard).unwrap_err();
    assert!(err.message().contains("committed weight manifest differs from load plan"), "{err}");
    untouched(&dst);
    assert!(e.fake.range_calls().is_empty());
}

/// A tensor of `n` bytes stored as `n` one-byte fragments in one object.
fn tiny_fragments(n: u64) -> (Arc<FakeStore>, WeightStore, StoredManifest) {
    let t = tensor(F_TENSOR, &[n], 1, &[]);
    let group = "weights/default/m/r/1";
    let fragments = (0..n)
        .map(|i| {
            StoredFragment::new(StoredFragmentSpec {
                fragment_id: format!("f{i}"),
                tensor_id: F_TENSOR.into(),
                global_offset: vec![i],
                local_shape: vec![1],
                object_key: format!("{group}/payload/all"),
                object_offset: i,
                nbytes: 1,
                aliases: vec![],
            })
            .unwrap()
        })
        .collect();
    let m = StoredManifest::new(StoredManifestSpec {
        namespace: "default".into(),
        resource_id: "model".into(),
        revision: "revision".into(),
        weight_generation: 7,
        group_id: group.into(),
        manifest_key: format!("{group}/manifest"),
        tensors: vec![Arc::new(t)],
        fragments,
        created_at: "now".into(),
    })
    .unwrap();
    let fake = FakeStore::new();
    upsert(&fake, m.manifest_key(), m.to_json().as_bytes());
    let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
    upsert(&fake, &format!("{group}/payload/all"), &payload);
    let ws = ws(&fake);
    (fake, ws, m)
}

#[test]
fn many_tiny_fragments_within_limits_and_low_limits() {
    let n = 100_000u64;
    let (fake, ws, m) = tiny_fragments(n);
    let t = tensor(F_TENSOR, &[n], 1, &[]);
    let p = flat(topo(1, 1, 1, 1, &[tp(0)]), vec![t.clone()], vec![whole(&t, tp(0))]).unwrap();
    let start = std::time::Instant::now();
    let decoded = Arc::new(ws.load_manifest(m.manifest_key()).unwrap());
    // Limits set low: refused before any I/O.
    let dst = target(p.clone());
    let low = PlanningLimits { max_transfer_regions: 1000, ..PlanningLimits::default() };
    let e = ws.plan_load(decoded.clone(), dst.placement.clone(), &dst.bindings, low).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(e.message().contains("max_transfer_regions"), "{e}");
    let low = PlanningLimits { max_total_lowered_segments: 10, ..PlanningLimits::default() };
    let e = ws.plan_load(decoded.clone(), dst.placement.clone(), &dst.bindings, low).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    untouched(&dst);
    assert!(fake.range_calls().is_empty());
    // Within limits: planned and executed, every byte right.
    let plan = ws.plan_load(decoded, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    assert_eq!(plan.regions().len() as u64, n);
    load_all(&ws, &plan, &dst, &StaticGuard).unwrap();
    let expect: Vec<u8> = (0..n).map(|i| i as u8).collect();
    assert_eq!(&dst.buffers[0][..n as usize], &expect[..]);
    assert!(dst.buffers[0][n as usize..].iter().all(|&x| x == SENTINEL), "nothing written past the target view");
    println!("{n} fragments decoded, planned and loaded in {:?}", start.elapsed());
}

/// The committed-manifest check compares the stored bytes with the plan's canonical
/// JSON first; other bytes that decode to the same manifest (the reference writes
/// its own formatting) still load, through the strict decode.
#[test]
fn committed_manifest_in_other_formatting_still_loads() {
    let e = env();
    let mut dst = target(s_placement(1, 1, 1));
    let m = Arc::new(e.ws.load_manifest(e.manifest.manifest_key()).unwrap());
    let plan = e.ws.plan_load(m, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let pretty = serde_json::to_string_pretty(&manifest_value(&e.manifest)).unwrap();
    assert_ne!(pretty, e.manifest.to_json(), "the test needs non-canonical bytes");
    upsert(&e.fake, e.manifest.manifest_key(), pretty.as_bytes());
    load_all(&e.ws, &plan, &dst, &StaticGuard).unwrap();
    dst.verify().unwrap();
    // Non-canonical bytes of another manifest are still refused, before any read.
    for b in &mut dst.buffers {
        b.fill(SENTINEL);
    }
    let mut v = manifest_value(&e.manifest);
    v["created_at"] = json!("forged");
    upsert(&e.fake, e.manifest.manifest_key(), serde_json::to_string_pretty(&v).unwrap().as_bytes());
    let err = load_all(&e.ws, &plan, &dst, &StaticGuard).unwrap_err();
    assert!(err.message().contains("committed weight manifest differs from load plan"), "{err}");
    untouched(&dst);
}
