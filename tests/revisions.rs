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
use mooncake_weight_store::protocol::{RevisionInfo, WeightStore};
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
fn a_store_that_cannot_list_says_so_and_names_the_resource() {
    let ws = WeightStore::new(fake_store::FakeStore::new());
    let e = ws.revisions("default", "my-model").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("'my-model'") && e.message().contains("manifest key"), "{e}");
    assert_eq!(ws.latest_revision("default", "my-model").unwrap_err().kind(), ErrorKind::Unsupported);
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
