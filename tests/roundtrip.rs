//! Snapshot a model from host buffers with the snapshot writer, then restore it
//! into different layouts, on the memory and the directory store; every byte
//! verified.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, WeightStore};
use mooncake_weight_store::store::{directory::DirectoryStore, memory::MemoryStore, ObjectStore};
use std::sync::Arc;

fn restore(ws: &WeightStore, manifest_key: &str, target: Layout, defs: &[TensorDef]) -> (usize, u64) {
    let manifest = Arc::new(ws.load_manifest(manifest_key).unwrap());
    let mut dst = HostModel::new(build_placement("target", target, defs, 1), false, "serving", 1);
    dst.bindings = dst.make_bindings("serving", 1);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let mut bytes = 0;
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        bytes += unsafe { ws.load(&plan, b, args) }.unwrap().bytes;
    }
    assert_eq!(bytes, plan.total_bytes());
    (dst.verify().unwrap(), bytes)
}

fn round_trip(backend: Arc<dyn ObjectStore>) {
    let defs = model_tensors(2, 64, 4);
    let src =
        HostModel::new(build_placement("source", Layout { tp: 4, pp: 2, ep: 2, dp: 2 }, &defs, 1), true, "trainer", 3);
    let ws = WeightStore::new(backend);
    let m = src.snapshot_into(&ws).unwrap();
    assert_eq!(m.manifest_key(), "weights/default/test-model/rev-1/1/manifest");
    assert!(!m.to_json().contains("address"));
    for target in [
        Layout { tp: 2, pp: 1, ep: 4, dp: 1 },
        Layout { tp: 8, pp: 2, ep: 1, dp: 2 },
        Layout { tp: 1, pp: 1, ep: 1, dp: 1 },
    ] {
        let (checked, bytes) = restore(&ws, m.manifest_key(), target, &defs);
        assert!(checked > 0 && bytes > 0);
    }
}

#[test]
fn snapshot_and_reshard_restore_memory_store() {
    round_trip(Arc::new(MemoryStore::new()));
}

#[test]
fn snapshot_and_reshard_restore_directory_store() {
    let dir = std::env::temp_dir().join(format!("mws-roundtrip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    round_trip(Arc::new(DirectoryStore::open(&dir).unwrap()));
    std::fs::remove_dir_all(&dir).unwrap();
}
