//! End-to-end payload integrity (issue 12, item 4): a corrupted, truncated or
//! swapped payload in a directory store fails the restore with the fragment id;
//! strided partial reads verify whole blocks; a revision without an integrity
//! record (as the reference writes it) still loads.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::integrity::manifest_integrity_key;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, StoreLimits, WeightStore};
use mooncake_weight_store::store::{directory::DirectoryStore, ObjectStore};
use mooncake_weight_store::{ErrorKind, Result};
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

struct Fixture {
    dir: std::path::PathBuf,
    store: Arc<DirectoryStore>,
    ws: WeightStore,
    manifest: mooncake_weight_store::model::StoredManifest,
    defs: Vec<TensorDef>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("mws-integrity-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(DirectoryStore::open(&dir).unwrap());
    let ws = WeightStore::new(store.clone())
        .with_limits(StoreLimits { verify_integrity: true, ..StoreLimits::default() })
        .unwrap();
    // 1024 hidden, 2-byte items: objects of 1-4 MiB, so several 1 MiB blocks each.
    let defs = model_tensors(1, 1024, 0);
    let src = HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let manifest = src.snapshot_into(&ws).unwrap();
    Fixture { dir, store, ws, manifest, defs }
}

/// Restores into `target`; only the first `parts` bindings when given.
fn restore(ws: &WeightStore, key: &str, target: Layout, defs: &[TensorDef], parts: Option<usize>) -> Result<usize> {
    let manifest = Arc::new(ws.load_manifest(key)?);
    let mut dst = HostModel::new(build_placement("target", target, defs, 1), false, "serving", 1);
    dst.bindings = dst.make_bindings("serving", 1);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default())?;
    for b in dst.bindings.iter().take(parts.unwrap_or(usize::MAX)) {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        unsafe { ws.load(&plan, b, args) }?;
    }
    if parts.is_none() {
        dst.verify()
    } else {
        Ok(0)
    }
}

fn fragment<'a>(f: &'a Fixture, tensor: &str) -> &'a mooncake_weight_store::model::StoredFragment {
    f.manifest.fragments().iter().find(|s| s.tensor_id() == tensor).unwrap()
}

fn flip(f: &Fixture, key: &str, at: u64) {
    let path = f.store.object_path(key).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at as usize] ^= 0x01;
    // Objects are immutable hard links of a temp file: rewrite in place on purpose.
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&bytes[at as usize..at as usize + 1]).unwrap();
}

const ONE: Layout = Layout { tp: 1, pp: 1, ep: 1, dp: 1 };

#[test]
fn acc_124_clean_revision_restores_and_has_a_record() {
    let f = fixture("clean");
    let key = manifest_integrity_key(&f.manifest).unwrap();
    assert!(f.store.exists(&key).unwrap(), "integrity record {key} written");
    assert!(key.starts_with(f.manifest.group_id()));
    assert!(restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap() > 0);
    assert!(
        restore(&f.ws, f.manifest.manifest_key(), Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &f.defs, None).unwrap() > 0
    );
}

#[test]
fn acc_124_flipped_byte_fails_restore_with_fragment_id() {
    let f = fixture("flip");
    let frag = fragment(&f, "model.layers.0.mlp.up_proj.weight").clone();
    flip(&f, frag.object_key(), frag.nbytes() / 2 + 3);
    let e = restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(frag.fragment_id()), "{e}");
    // With verification off (the default) the corruption goes through, as in the reference.
    let off = WeightStore::new(f.store.clone())
        .with_limits(StoreLimits { verify_integrity: false, ..StoreLimits::default() })
        .unwrap();
    let e = restore(&off, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap_err();
    assert!(e.message().contains("target bytes differ"), "{e}");
}

#[test]
fn acc_124_truncated_payload_fails_with_fragment_id() {
    let f = fixture("trunc");
    let frag = fragment(&f, "model.layers.0.self_attn.o_proj.weight").clone();
    let path = f.store.object_path(frag.object_key()).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(frag.nbytes() - 1).unwrap();
    let e = restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(frag.fragment_id()), "{e}");
}

#[test]
fn acc_124_swapped_payloads_fail_with_fragment_id() {
    let f = fixture("swap");
    // The two TP shards of one tensor: equal sizes, different contents.
    let frags: Vec<_> = f
        .manifest
        .fragments()
        .iter()
        .filter(|s| s.tensor_id() == "model.layers.0.mlp.down_proj.weight")
        .cloned()
        .collect();
    assert_eq!(frags.len(), 2);
    assert_eq!(frags[0].nbytes(), frags[1].nbytes());
    let (a, b) =
        (f.store.object_path(frags[0].object_key()).unwrap(), f.store.object_path(frags[1].object_key()).unwrap());
    let tmp = a.with_extension("swap");
    std::fs::rename(&a, &tmp).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&tmp, &b).unwrap();
    let e = restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(frags.iter().any(|s| e.message().contains(s.fragment_id())), "{e}");
}

#[test]
fn acc_124_strided_partial_read_verifies_whole_blocks() {
    let f = fixture("strided");
    // o_proj is split on dim 1 (columns): with tp=4 each target reads half of every
    // source row, so every block is only partly read by one target.
    let frag = fragment(&f, "model.layers.0.self_attn.o_proj.weight").clone();
    let row = frag.local_shape()[1] * 2;
    // A byte in the second half of row 7: target 0 of the tp=4 layout never reads it.
    flip(&f, frag.object_key(), 7 * row + row - 1);
    let e =
        restore(&f.ws, f.manifest.manifest_key(), Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &f.defs, Some(1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(frag.fragment_id()), "{e}");
}

#[test]
fn acc_124_revision_without_record_still_loads() {
    let f = fixture("norecord");
    f.store.remove(&manifest_integrity_key(&f.manifest).unwrap()).unwrap();
    assert!(restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap() > 0);
}

#[test]
fn acc_124_corrupt_record_is_an_integrity_error() {
    let f = fixture("badrecord");
    let key = manifest_integrity_key(&f.manifest).unwrap();
    let cfg = mooncake_weight_store::store::WriteConfig {
        group_ids: &[],
        record_type: mooncake_weight_store::store::RecordType::Metadata,
    };
    f.store.upsert(&key, b"{not json", &cfg).unwrap();
    let e = restore(&f.ws, f.manifest.manifest_key(), ONE, &f.defs, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
}

/// `StoreLimits::write_integrity: false`: the snapshot computes no checksums and
/// writes no integrity record (the revision is what the reference writes); it
/// restores, a verifying restore loads it unverified (`verified_bytes` 0), and
/// `verify_revision` checks presence and sizes only.
#[test]
fn snapshot_without_integrity_record_restores_unverified() {
    let dir = std::env::temp_dir().join(format!("mws-integrity-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = Arc::new(DirectoryStore::open(&dir).unwrap());
    let writer = WeightStore::new(store.clone())
        .with_limits(StoreLimits { write_integrity: false, ..StoreLimits::default() })
        .unwrap();
    assert!(StoreLimits::default().write_integrity);
    let defs = model_tensors(1, 1024, 0);
    let src = HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let manifest = src.snapshot_into(&writer).unwrap();
    let key = manifest_integrity_key(&manifest).unwrap();
    assert!(!store.exists(&key).unwrap(), "no integrity record {key}");
    // A verifying store (the default) restores it, unverified.
    let reader = WeightStore::new(store.clone());
    assert!(reader.limits().verify_integrity);
    let m = Arc::new(reader.load_manifest(manifest.manifest_key()).unwrap());
    for target in [ONE, Layout { tp: 4, pp: 1, ep: 1, dp: 1 }] {
        let mut dst = HostModel::new(build_placement("target", target, &defs, 1), false, "serving", 1);
        dst.bindings = dst.make_bindings("serving", 1);
        let plan =
            reader.plan_load(m.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
        for b in &dst.bindings {
            let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
            // SAFETY: dst.buffers outlive the call and nobody else touches them.
            let stats = unsafe { reader.load(&plan, b, args) }.unwrap();
            assert!(stats.bytes > 0);
            assert_eq!(stats.verified_bytes, 0, "nothing to verify against");
            assert_eq!(stats.verify_read_bytes, 0);
        }
        assert!(dst.verify().unwrap() > 0);
    }
    // The offline check finds no record and no problem.
    let report = mooncake_weight_store::protocol::integrity::verify_revision(
        &*store,
        &manifest,
        StoreLimits::default().max_metadata_bytes,
        &mut |_| {},
    )
    .unwrap();
    assert!(!report.has_record);
    assert_eq!(report.bytes_verified, 0);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Receipts carry no checksums when the uploading store writes no record; a
/// committing store that writes records then writes none either (the revision is
/// unverified), and receipts with checksums committed through a store that writes
/// no record leave no record.
#[test]
fn record_needs_checksummed_receipts_and_a_recording_committer() {
    use mooncake_weight_store::plan::upload::UploadOptions;
    use mooncake_weight_store::protocol::{UploadArgs, UploadSource};
    let store = Arc::new(mooncake_weight_store::store::memory::MemoryStore::new());
    let on = WeightStore::new(store.clone());
    let off = WeightStore::new(store.clone())
        .with_limits(StoreLimits { write_integrity: false, ..StoreLimits::default() })
        .unwrap();
    let defs = model_tensors(1, 256, 0);
    for (namespace, uploader, committer) in [("a", &off, &on), ("b", &on, &off)] {
        let src =
            HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
        let options = UploadOptions { namespace: namespace.into(), ..UploadOptions::default() };
        let plan = uploader.plan_upload(&src.placement, &src.bindings, &options).unwrap();
        let sources: Vec<UploadSource> =
            src.bindings.iter().map(|b| UploadSource { binding: b, lease: None }).collect();
        let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: src.buffers outlive the call and are not written meanwhile.
        let receipts = unsafe { uploader.upload_many(&plan, &src.placement, &sources, args) }.unwrap();
        assert_eq!(
            receipts.iter().all(|r| r.block_checksums.is_some()),
            std::ptr::eq(uploader, &on),
            "checksums only from a store that writes records"
        );
        let manifest = committer.commit(&plan, &receipts, None).unwrap();
        let key = manifest_integrity_key(&manifest).unwrap();
        assert!(!store.exists(&key).unwrap(), "namespace {namespace}: no record");
    }
}

/// `load_many` loads the bindings on several threads: a corrupted payload still
/// fails the call with the fragment id, and a clean revision restores every byte with
/// the same verified bytes as the loads in turn.
#[test]
fn load_many_verifies_on_every_thread() {
    let f = fixture("many");
    let m = Arc::new(f.ws.load_manifest(f.manifest.manifest_key()).unwrap());
    let target = Layout { tp: 4, pp: 1, ep: 1, dp: 1 };
    let run = |ws: &WeightStore| -> Result<(u64, usize)> {
        let mut dst = HostModel::new(build_placement("target", target, &f.defs, 1), false, "serving", 1);
        dst.bindings = dst.make_bindings("serving", 1);
        let plan = ws.plan_load(m.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default())?;
        let bindings: Vec<&mooncake_weight_store::RuntimeBinding> = dst.bindings.iter().collect();
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        let stats = unsafe { ws.load_many(&plan, &bindings, args) }?;
        Ok((stats.iter().map(|s| s.verified_bytes).sum(), dst.verify()?))
    };
    let (verified, checked) = run(&f.ws).unwrap();
    assert!(verified > 0 && checked > 0);
    let frag = fragment(&f, "model.layers.0.mlp.up_proj.weight").clone();
    flip(&f, frag.object_key(), frag.nbytes() / 2 + 3);
    let e = run(&f.ws).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.message().contains(frag.fragment_id()), "{e}");
}
