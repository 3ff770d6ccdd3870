//! Issue 29: the committed revisions of a resource and the newest one
//! (`WeightStore::revisions`, `WeightStore::latest_revision`), without hand-built
//! keys; namespaces and key prefixes respected, the newest by generation with a
//! deterministic tie-break.

#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::model::KeyLayout;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{revision_index, LoadArgs, RevisionInfo, StaticGuard, WeightStore};
use mooncake_weight_store::store::{
    directory::DirectoryStore, memory::MemoryStore, ObjectStore, RecordType, WriteConfig,
};
use mooncake_weight_store::{ErrorKind, StoredManifest, StoredManifestSpec};
use std::sync::Arc;

const CFG: WriteConfig<'static> = WriteConfig { group_ids: &[], record_type: RecordType::Metadata };

/// Publishes an (empty) manifest of `(ns, resource, revision, generation)` under
/// `prefix`, as a commit would: what a listing needs is the manifest alone.
fn publish(
    s: &dyn ObjectStore,
    prefix: &str,
    ns: &str,
    resource: &str,
    revision: &str,
    generation: u64,
    created_at: &str,
) -> StoredManifest {
    let k = KeyLayout::new(prefix, ns, resource, revision, generation).unwrap();
    let m = StoredManifest::new(StoredManifestSpec {
        namespace: ns.into(),
        resource_id: resource.into(),
        revision: revision.into(),
        weight_generation: generation,
        group_id: k.group_id().into(),
        manifest_key: k.manifest_key(),
        created_at: created_at.into(),
        ..Default::default()
    })
    .unwrap();
    s.put(m.manifest_key(), m.to_json().as_bytes(), &CFG).unwrap();
    m
}

fn names(v: &[RevisionInfo]) -> Vec<(&str, u64)> {
    v.iter().map(|r| (r.revision.as_str(), r.weight_generation)).collect()
}

#[test]
fn revisions_are_listed_oldest_first_and_the_newest_is_deterministic() {
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone());
    assert!(ws.revisions("default", "m").unwrap().is_empty());
    assert_eq!(ws.latest_revision("default", "m").unwrap(), None);

    let t1 = "2026-01-01T00:00:00Z";
    let t2 = "2026-01-02T00:00:00Z";
    let first = publish(&*mem, "weights", "default", "m", "step-1", 1, t1);
    publish(&*mem, "weights", "default", "m", "step-2", 1, t2);
    publish(&*mem, "weights", "default", "m", "b", 2, t1);
    publish(&*mem, "weights", "default", "m", "a", 2, t1);
    publish(&*mem, "weights", "default", "m", "step-0", 0, t2);
    // Neighbours that must not be listed: another namespace, a resource whose id
    // starts with "m", another key prefix, and keys of other layouts.
    publish(&*mem, "weights", "other", "m", "z", 9, t2);
    publish(&*mem, "weights", "default", "mx", "z", 9, t2);
    publish(&*mem, "ckpt", "default", "m", "z", 9, t2);
    mem.put("weights/default/m/step-1/1/payload/0123/abc", b"xx", &CFG).unwrap();
    mem.put("weights/default/m/step-1/1/transactions/0123/decision", b"{}", &CFG).unwrap();
    mem.put("weights/default/m/step-9/09/manifest", b"not a revision's key", &CFG).unwrap();
    mem.put("weights/default/m/README", b"foreign", &CFG).unwrap();

    let all = ws.revisions("default", "m").unwrap();
    // Generation first, then created_at, then the revision name (code-point order).
    assert_eq!(names(&all), [("step-0", 0), ("step-1", 1), ("step-2", 1), ("a", 2), ("b", 2)]);
    let latest = ws.latest_revision("default", "m").unwrap().unwrap();
    assert_eq!(&latest, all.last().unwrap());
    assert_eq!(latest.revision, "b");
    // Every field comes from the committed manifest.
    assert_eq!(all[1], RevisionInfo::of(&first));
    assert_eq!(all[1].manifest_key, "weights/default/m/step-1/1/manifest");
    assert_eq!(all[1].manifest_digest, first.manifest_digest());
    assert_eq!(all[1].created_at, t1);
    assert_eq!((all[1].namespace.as_str(), all[1].resource_id.as_str()), ("default", "m"));
    // What a restore takes, without a hand-built key.
    assert_eq!(ws.load_manifest(&latest.manifest_key).unwrap().revision(), "b");

    // Namespaces and key prefixes are respected.
    assert_eq!(names(&ws.revisions("other", "m").unwrap()), [("z", 9)]);
    assert_eq!(names(&ws.revisions("default", "mx").unwrap()), [("z", 9)]);
    let ckpt = WeightStore::new(mem.clone()).with_key_prefix("/ckpt/");
    assert_eq!(names(&ckpt.revisions("default", "m").unwrap()), [("z", 9)]);
    assert_eq!(ckpt.latest_revision("default", "nothing").unwrap(), None);
}

#[test]
fn encoded_names_round_trip_through_their_keys() {
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone()).with_key_prefix("ckpt/weights");
    publish(&*mem, "ckpt/weights", "prod/eu", "Qwen3.5 0.8B", "step-42+ü", 3, "c");
    let all = ws.revisions("prod/eu", "Qwen3.5 0.8B").unwrap();
    assert_eq!(names(&all), [("step-42+ü", 3)]);
    assert_eq!(all[0].manifest_key, "ckpt/weights/prod%2Feu/Qwen3.5%200.8B/step-42%2B%C3%BC/3/manifest");
    assert!(ws.revisions("prod", "eu/Qwen3.5 0.8B").unwrap().is_empty());
}

#[test]
fn invalid_manifests_and_arguments_are_named() {
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone());
    let e = ws.revisions("default", "").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("resource_id"), "{e}");
    let e = ws.revisions("", "m").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("namespace"), "{e}");

    // A manifest of another revision copied to this key.
    let other = publish(&*mem, "weights", "default", "m", "real", 1, "c");
    mem.put("weights/default/m/fake/1/manifest", other.to_json().as_bytes(), &CFG).unwrap();
    let e = ws.revisions("default", "m").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidManifest);
    assert!(e.message().contains("'m'") && e.message().contains("weights/default/m/fake/1/manifest"), "{e}");
    mem.remove("weights/default/m/fake/1/manifest").unwrap();

    // A manifest that does not decode.
    mem.put("weights/default/m/broken/1/manifest", b"{", &CFG).unwrap();
    let e = ws.revisions("default", "m").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidManifest);
    assert!(e.message().contains("weights/default/m/broken/1/manifest"), "{e}");
    // `latest_revision` reads only the highest generation's manifests.
    publish(&*mem, "weights", "default", "m", "next", 2, "c");
    assert_eq!(ws.latest_revision("default", "m").unwrap().unwrap().revision, "next");
    mem.put("weights/default/m/broken2/2/manifest", b"{", &CFG).unwrap();
    assert_eq!(ws.latest_revision("default", "m").unwrap_err().kind(), ErrorKind::InvalidManifest);
}

#[test]
fn a_store_that_cannot_list_finds_no_revision_before_the_first_commit() {
    let ws = WeightStore::new(fake_store::FakeStore::new());
    assert!(ws.revisions("default", "my-model").unwrap().is_empty());
    assert_eq!(ws.latest_revision("default", "my-model").unwrap(), None);
    let e = ws.revisions("default", "").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

/// Restores `key` into TP1 and checks every byte.
fn restore(ws: &WeightStore, key: &str, defs: &[TensorDef], generation: u64) -> usize {
    let manifest = Arc::new(ws.load_manifest(key).unwrap());
    let layout = Layout { tp: 1, pp: 1, ep: 1, dp: 1 };
    let mut dst = HostModel::new(build_placement("target", layout, defs, generation), false, "serving", 1);
    dst.bindings = dst.make_bindings("serving", 1);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        unsafe { ws.load(&plan, b, args) }.unwrap();
    }
    dst.verify().unwrap()
}

/// The index slots of `resource` that hold an object.
fn slots(mem: &MemoryStore, resource: &str) -> Vec<u64> {
    let prefix = format!("weights/default/{resource}/");
    (0..64).filter(|&n| mem.exists(&revision_index::slot_key(&prefix, n)).unwrap()).collect()
}

#[test]
fn a_store_without_listing_lists_its_revisions_through_the_index() {
    let mem = Arc::new(MemoryStore::without_listing());
    assert!(!mem.supports_list());
    assert_eq!(mem.list("", &mut |_, _| true).unwrap_err().kind(), ErrorKind::Unsupported);
    let ws = WeightStore::new(mem.clone());
    let defs = model_tensors(1, 64, 0);
    let layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
    let g1 = HostModel::new(build_placement("s", layout, &defs, 1), true, "t", 1).snapshot_into(&ws).unwrap();
    let g2 = HostModel::new(build_placement("s", layout, &defs, 2), true, "t", 1).snapshot_into(&ws).unwrap();
    let res = g1.resource_id();
    assert_eq!(slots(&mem, res), [0, 1], "one index entry per commit, in the first free slots");
    let all = ws.revisions("default", res).unwrap();
    assert_eq!(all, [RevisionInfo::of(&g1), RevisionInfo::of(&g2)]);
    assert_eq!(ws.latest_revision("default", res).unwrap(), Some(RevisionInfo::of(&g2)));
    assert!(ws.revisions("other", res).unwrap().is_empty(), "another namespace has no index");
    // The older revision, found by listing, restores.
    assert!(restore(&ws, &all[0].manifest_key, &defs, 1) > 0);
    // A listing store writes no index object.
    let listed = Arc::new(MemoryStore::new());
    let lws = WeightStore::new(listed.clone());
    HostModel::new(build_placement("s", layout, &defs, 1), true, "t", 1).snapshot_into(&lws).unwrap();
    let keys = mooncake_weight_store::store::list_sorted(&*listed, "").unwrap();
    assert!(!keys.is_empty() && keys.iter().all(|o| !o.key.contains(revision_index::INDEX_SEGMENT)), "{keys:?}");
}

#[test]
fn the_index_is_a_hint_and_the_records_decide() {
    let mem = Arc::new(MemoryStore::without_listing());
    let ws = WeightStore::new(mem.clone());
    let defs = model_tensors(1, 64, 0);
    let layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
    let g1 = HostModel::new(build_placement("s", layout, &defs, 1), true, "t", 1).snapshot_into(&ws).unwrap();
    let g2 = HostModel::new(build_placement("s", layout, &defs, 2), true, "t", 1).snapshot_into(&ws).unwrap();
    let res = g1.resource_id().to_string();
    let prefix = format!("weights/default/{res}/");
    let slot = |n| revision_index::slot_key(&prefix, n);
    // A committer that crashed after its entry and before its decision: no manifest.
    mem.put(&slot(2), revision_index::entry_json("crashed", 9).as_bytes(), &CFG).unwrap();
    // An entry that does not decode, and a duplicate of g1's.
    mem.put(&slot(3), b"{not an entry", &CFG).unwrap();
    mem.put(&slot(4), revision_index::entry_json(g1.revision(), 1).as_bytes(), &CFG).unwrap();
    // A manifest published at a revision's key without any decision (no payloads,
    // so no transaction): not a commit of this protocol.
    let forged = publish(&*mem, "weights", "default", &res, "forged", 3, "2026-01-01T00:00:00Z");
    mem.put(&slot(5), revision_index::entry_json("forged", 3).as_bytes(), &CFG).unwrap();
    assert!(mem.exists(forged.manifest_key()).unwrap());
    let all = ws.revisions("default", &res).unwrap();
    assert_eq!(all, [RevisionInfo::of(&g1), RevisionInfo::of(&g2)]);
    assert_eq!(ws.latest_revision("default", &res).unwrap(), Some(RevisionInfo::of(&g2)));
    // A gap (a slot whose put was abandoned) hides nothing after it.
    mem.remove(&slot(0)).unwrap();
    mem.remove(&slot(2)).unwrap();
    mem.remove(&slot(3)).unwrap();
    assert_eq!(names(&ws.revisions("default", &res).unwrap()), [(g1.revision(), 1), (g2.revision(), 2)]);
    // The next commit fills the lowest free slot.
    let g6 = HostModel::new(build_placement("s", layout, &defs, 6), true, "t", 1).snapshot_into(&ws).unwrap();
    assert!(mem.exists(&slot(0)).unwrap());
    assert_eq!(ws.latest_revision("default", &res).unwrap(), Some(RevisionInfo::of(&g6)));
    // g2's decision turned into an abort: g2 is no longer listed.
    let tx = g2.fragments()[0].object_key().split('/').nth_back(1).unwrap().to_string();
    let layout2 = KeyLayout::new("weights", "default", &res, g2.revision(), 2).unwrap();
    let control = layout2.control_key(&tx);
    let record = String::from_utf8(mem.get(&control).unwrap()).unwrap();
    mem.upsert(&control, record.replace("\"commit\"", "\"abort\"").as_bytes(), &CFG).unwrap();
    assert_eq!(names(&ws.revisions("default", &res).unwrap()), [(g1.revision(), 1), (g6.revision(), 6)]);
    // A decision record that does not decode is an error naming it.
    mem.upsert(&control, b"{", &CFG).unwrap();
    let e = ws.revisions("default", &res).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidManifest);
    assert!(e.message().contains(&control), "{e}");
}

#[test]
fn racing_committers_each_get_a_slot_and_all_are_listed() {
    let mem = Arc::new(MemoryStore::without_listing());
    let ws = Arc::new(WeightStore::new(mem.clone()));
    let defs = model_tensors(1, 64, 0);
    let layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
    let barrier = Arc::new(std::sync::Barrier::new(6));
    let committed: Vec<StoredManifest> = std::thread::scope(|s| {
        let hs: Vec<_> = (1..=6u64)
            .map(|g| {
                let (ws, defs, barrier) = (ws.clone(), defs.clone(), barrier.clone());
                s.spawn(move || {
                    let model = HostModel::new(build_placement("s", layout, &defs, g), true, "t", 1);
                    barrier.wait();
                    model.snapshot_into(&ws).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let res = committed[0].resource_id();
    assert_eq!(slots(&mem, res), [0, 1, 2, 3, 4, 5]);
    let want: Vec<RevisionInfo> = committed.iter().map(RevisionInfo::of).collect();
    assert_eq!(ws.revisions("default", res).unwrap(), want);
}

#[test]
fn committed_snapshots_are_listed_from_a_directory_store() {
    let dir = std::env::temp_dir().join(format!("mws-revisions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ws = WeightStore::new(Arc::new(DirectoryStore::open(&dir).unwrap()));
    let defs = model_tensors(1, 64, 0);
    let layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
    let g1 = HostModel::new(build_placement("s", layout, &defs, 1), true, "t", 1).snapshot_into(&ws).unwrap();
    let g2 = HostModel::new(build_placement("s", layout, &defs, 2), true, "t", 1).snapshot_into(&ws).unwrap();
    let all = ws.revisions("default", g1.resource_id()).unwrap();
    assert_eq!(all, [RevisionInfo::of(&g1), RevisionInfo::of(&g2)]);
    let latest = ws.latest_revision("default", g1.resource_id()).unwrap().unwrap();
    assert_eq!(ws.load_manifest(&latest.manifest_key).unwrap(), g2);
    std::fs::remove_dir_all(&dir).unwrap();
}
