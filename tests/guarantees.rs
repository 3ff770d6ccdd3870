//! Guarantees beyond the reference: a truncated object is detected before any
//! target byte is written; plans made for another key prefix are refused; payload
//! byte ranges that overflow 64 bits are refused at decode.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, UploadArgs, UploadReceipt, WeightStore};
use mooncake_weight_store::store::{memory::MemoryStore, ObjectStore, RecordType, WriteConfig};
use mooncake_weight_store::*;
use std::sync::Arc;

fn committed(ws: &WeightStore, src: &HostModel) -> StoredManifest {
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let mut receipts: Vec<UploadReceipt> = Vec::new();
    for b in &src.bindings {
        let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: src.buffers outlive the call.
        receipts.extend(unsafe { ws.upload(&plan, &src.placement, b, args) }.unwrap());
    }
    ws.commit(&plan, &receipts, None).unwrap()
}

#[test]
fn truncated_object_is_refused_before_any_target_byte_is_written() {
    let defs = model_tensors(1, 16, 0);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "trainer", 1);
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone());
    let m = committed(&ws, &src);
    // Replace the last payload object by a shorter one.
    let victim = m.fragments().last().unwrap().object_key().to_string();
    let mut bytes = mem.get(&victim).unwrap();
    bytes.pop();
    let group = [m.group_id().to_string()];
    mem.upsert(&victim, &bytes, &WriteConfig { group_ids: &group, record_type: RecordType::Payload }).unwrap();

    let dst =
        HostModel::new(build_placement("dst", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "serving", 1);
    let plan = ws.plan_load(Arc::new(m), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: dst.buffers outlive the call.
    let err = unsafe { ws.load(&plan, &dst.bindings[0], args) }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity);
    assert!(err.message().contains(&victim), "{err}");
    assert!(dst.buffers.iter().all(|b| b.iter().all(|&x| x == 0xA5)), "a target byte was written");
}

#[test]
fn plans_for_another_key_prefix_are_refused() {
    let defs = model_tensors(1, 16, 0);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "trainer", 1);
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone()).with_key_prefix("/ckpt/");
    let foreign = plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: src.buffers outlive the call.
    let err = unsafe { ws.upload(&foreign, &src.placement, &src.bindings[0], args) }.unwrap_err();
    assert!(err.message().contains("key prefix"), "{err}");
    assert!(ws.commit(&foreign, &UploadReceipt::all_for(&foreign), None).unwrap_err().message().contains("key prefix"));
    assert!(ws.finalize(&foreign).unwrap_err().message().contains("key prefix"));
    assert!(mem.is_empty(), "nothing may be written");
    // The store's own plans live under its prefix.
    let own = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    assert!(own.manifest().group_id().starts_with("ckpt/"));
}

#[test]
fn payload_ranges_beyond_64_bits_are_refused_at_decode() {
    let json = r#"{"created_at":"c","fragments":[{"aliases":[],"fragment_id":"a","global_offset":[0],"local_shape":[8],"nbytes":8,"object_key":"g/payload/x","object_offset":18446744073709551610,"tensor_id":"w"}],"group_id":"g","manifest_key":"g/manifest","namespace":"n","resource_id":"r","resource_kind":"model_weight","revision":"v","tensors":[{"dtype":"uint8","expert_id":null,"global_shape":[8],"itemsize":1,"layer_id":null,"layout_fingerprint":"f","parallel_axes":[],"shard_dims":[],"tensor_id":"w"}],"weight_generation":1}"#;
    let err = StoredManifest::from_json(json.as_bytes()).unwrap_err();
    assert!(err.message().contains("64-bit"), "{err}");
    let ok = json.replace("18446744073709551610", "0");
    assert!(StoredManifest::from_json(ok.as_bytes()).is_ok());
}
