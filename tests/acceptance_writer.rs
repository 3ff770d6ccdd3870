//! Acceptance tests, section E (writer and upload freshness), items 153–162 of
//! `acceptance.md`.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use builders::*;
use fake_store::*;
use model::{HostAdapter, HostModel};
use mooncake_weight_store::protocol::{
    GuardProvider, SnapshotAdapter, SnapshotDescriptor, SnapshotSource, SnapshotWriter, StaticGuard, TerminalState,
    UploadArgs, UploadReceipt,
};
use mooncake_weight_store::*;
use std::sync::Arc;

/// (tensor id, participant id) of every plan operation.
fn items(plan: &UploadPlan) -> Vec<(String, String)> {
    plan.operations()
        .iter()
        .map(|o| (o.source_placement().tensor_id().to_string(), o.source_participant_id().to_string()))
        .collect()
}

fn write_all<A: SnapshotAdapter<Tensor = str>>(w: &mut SnapshotWriter<'_, A>) -> Result<()> {
    for (t, p) in items(w.plan()) {
        w.write_tensor(&t, &p)?;
    }
    Ok(())
}

fn payloads(fake: &FakeStore, plan: &UploadPlan) -> usize {
    plan.operations().iter().filter(|o| fake.has(o.target().object_key())).count()
}

#[test]
fn acc_153_snapshot_writer_commits_one_stored_manifest() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("production"), HostAdapter(&src)).unwrap();
    write_all(&mut w).unwrap();
    let m = w.commit().unwrap();
    assert_eq!(m.namespace(), "production");
    assert_eq!(m.weight_generation(), 7);
    let raw = String::from_utf8(fake.inner.get(m.manifest_key()).unwrap()).unwrap();
    for field in ["address", "lease_id", "instance_id"] {
        assert!(!raw.contains(field), "persisted manifest contains {field}");
    }
    assert_eq!(StoredManifest::from_json(raw.as_bytes()).unwrap(), m);
}

use mooncake_weight_store::store::ObjectStore;

#[test]
fn acc_154_writer_retries_manifest_publish_after_commit_decision() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("default"), HostAdapter(&src)).unwrap();
    write_all(&mut w).unwrap();
    let plan = w.plan().clone();
    fake.fault_put(plan.manifest().manifest_key(), PutFault::Fail("-1".into()), 1);
    expect_err(w.commit(), ErrorKind::Store, "manifest put failed");
    assert!(fake.has(plan.control_key()));
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert_eq!(payloads(&fake, &plan), 2);
    assert_eq!(w.commit().unwrap(), *plan.manifest());
}

#[test]
fn acc_155_scoped_writer_preserves_manifest_publish_retry() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut captured = None;
    let key =
        ws.plan_upload(&src.placement, &src.bindings, &opts("probe")).unwrap().manifest().manifest_key().to_string();
    fake.fault_put(&key, PutFault::Fail("-1".into()), 1);
    let r = ws.snapshot(&src.descriptor("default"), HostAdapter(&src), |w| {
        captured = Some(w.plan().clone());
        write_all(w)
    });
    expect_err(r, ErrorKind::Store, "manifest put failed");
    let plan = captured.unwrap();
    assert!(fake.has(plan.control_key()), "decision kept");
    assert_eq!(payloads(&fake, &plan), 2, "the scope did not abort");
    // The explicit writer's abort is refused in the same state...
    let fake2 = FakeStore::new();
    let ws2 = ws_of(&fake2);
    let mut w = ws2.begin_snapshot(&src.descriptor("default"), HostAdapter(&src)).unwrap();
    write_all(&mut w).unwrap();
    fake2.fault_put(w.plan().manifest().manifest_key(), PutFault::Fail("-1".into()), 1);
    expect_err(w.commit(), ErrorKind::Store, "manifest put failed");
    expect_err(w.abort(), ErrorKind::Conflict, "retry commit instead");
    assert_eq!(&w.commit().unwrap(), w.plan().manifest());
    // ...and the scoped snapshot's transaction is completed by a commit retry.
    assert_eq!(ws.commit(&plan, &UploadReceipt::all_for(&plan), None).unwrap(), *plan.manifest());
}

fn ws_of(fake: &Arc<FakeStore>) -> protocol::WeightStore {
    ws(fake)
}
use mooncake_weight_store::protocol;

#[test]
fn acc_156_writer_rejects_commit_with_missing_fragment() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("default"), HostAdapter(&src)).unwrap();
    let plan = w.plan().clone();
    let (t, p) = items(&plan)[0].clone();
    w.write_tensor(&t, &p).unwrap();
    expect_invalid(w.commit(), "missing required fragments");
    assert!(!fake.has(plan.manifest().manifest_key()));
    let group = format!("{}/payload/", plan.manifest().group_id());
    assert!(fake.keys().iter().all(|k| !k.starts_with(&group)), "{:?}", fake.keys());
    assert_eq!(ws.read_decision(&plan).unwrap().unwrap().0, Decision::Abort);
}

/// Resolves every tensor id to the fragments of the model's first tensor.
struct WrongTensor<'a>(HostAdapter<'a>);

// SAFETY: the type's callbacks and pointers are only used under the test's own synchronization.
unsafe impl SnapshotAdapter for WrongTensor<'_> {
    type Tensor = str;
    fn export_source(&self, d: &SnapshotDescriptor) -> Result<SnapshotSource> {
        self.0.export_source(d)
    }
    fn resolve_fragment_ids(
        &self,
        _tensor_id: &str,
        participant: &str,
        source: &SnapshotSource,
    ) -> Result<Vec<String>> {
        self.0.resolve_fragment_ids(F_TENSOR, participant, source)
    }
    fn source_allocation_guards(&self, b: &RuntimeBinding) -> Result<Arc<dyn GuardProvider>> {
        self.0.source_allocation_guards(b)
    }
}

#[test]
fn acc_157_writer_rejects_fragment_for_another_tensor() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("default"), WrongTensor(HostAdapter(&src))).unwrap();
    let p = items(w.plan())[0].1.clone();
    expect_invalid(w.write_tensor("wrong-tensor", &p), "another tensor");
}

#[test]
fn acc_158_scoped_writer_commits_on_exit() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let m = ws.snapshot(&src.descriptor("default"), HostAdapter(&src), write_all).unwrap();
    assert_eq!(ws.load_manifest(m.manifest_key()).unwrap(), m);
}

fn upload(
    ws: &protocol::WeightStore,
    plan: &UploadPlan,
    p: &Placement,
    b: &RuntimeBinding,
) -> Result<Vec<UploadReceipt>> {
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: every address is either a live model buffer or refused before I/O.
    unsafe { ws.upload(plan, p, b, args) }
}

fn plan_of(ws: &protocol::WeightStore, src: &HostModel) -> UploadPlan {
    ws.plan_upload(&src.placement, &src.bindings, &opts("fresh")).unwrap()
}

#[test]
fn acc_159_upload_rejects_stale_runtime_binding_fragment() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 1, 7));
    let plan = plan_of(&ws, &src);
    let moved = rebind(
        &src.bindings[0],
        |_| {},
        |f| {
            f.address += 1;
            f.storage_address += 1;
        },
    );
    expect_err(upload(&ws, &plan, &src.placement, &moved), ErrorKind::StaleBinding, "stale source fragment");
    assert_eq!(fake.mutations(), 0);
}

#[test]
fn acc_160_upload_rejects_weight_generation_rollover_before_store_io() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 1, 7));
    let plan = plan_of(&ws, &src);
    let p8 = s_placement(1, 1, 8);
    let b8 = rebind(
        &src.bindings[0],
        |s| {
            s.placement_id = p8.placement_id().into();
            s.placement_digest = p8.digest().into();
        },
        |_| {},
    );
    expect_err(upload(&ws, &plan, &p8, &b8), ErrorKind::StaleBinding, "weight generation mismatch");
    assert!(fake.calls().is_empty(), "no Store call at all");
}

#[test]
fn acc_161_upload_rejects_lease_rollover_before_store_io() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let mut src = source(s_placement(1, 1, 7));
    src.bindings = src.bindings.iter().map(|b| rebind(b, |s| s.lease_id = "source-lease-1".into(), |_| {})).collect();
    let plan = plan_of(&ws, &src);
    let b = rebind(&src.bindings[0], |s| s.lease_id = "source-lease-2".into(), |_| {});
    expect_err(upload(&ws, &plan, &src.placement, &b), ErrorKind::StaleBinding, "stale source lease");
    assert!(fake.calls().is_empty(), "no Store call at all");
}

#[test]
fn acc_162_upload_rejects_generation_scoped_fragment_id_rollover() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 1, 7));
    let plan = plan_of(&ws, &src);
    let b = rebind(&src.bindings[0], |s| s.lease_generation = 2, |f| f.fragment_id = format!("{}-gen2", f.fragment_id));
    expect_err(upload(&ws, &plan, &src.placement, &b), ErrorKind::StaleBinding, "missing planned source fragment");
    assert_eq!(fake.mutations(), 0);
}

/// A writer adapter whose tensors resolve to their fragments on every participant,
/// each pinned by its own recording guard: one `write_tensor` of the last tensor
/// completes every participant at once.
struct AllRanks<'a> {
    src: &'a HostModel,
    guards: Vec<(String, RecordingGuard)>,
}

// SAFETY: the bindings are HostAdapter's (the model's buffers, alive and unchanged
// while the writer lives).
unsafe impl SnapshotAdapter for AllRanks<'_> {
    type Tensor = str;
    fn export_source(&self, d: &SnapshotDescriptor) -> Result<SnapshotSource> {
        HostAdapter(self.src).export_source(d)
    }
    fn resolve_fragment_ids(&self, tensor_id: &str, _t: &str, source: &SnapshotSource) -> Result<Vec<String>> {
        Ok(source
            .placement
            .parts()
            .iter()
            .flat_map(|p| p.fragments())
            .filter(|f| f.tensor_id() == tensor_id)
            .map(|f| f.placement_fragment_id().to_string())
            .collect())
    }
    fn source_allocation_guards(&self, b: &RuntimeBinding) -> Result<Arc<dyn GuardProvider>> {
        let g = self.guards.iter().find(|(p, _)| p == b.participant_id()).expect("a guard per participant");
        Ok(Arc::new(g.1.clone()))
    }
}

fn all_ranks(src: &HostModel) -> AllRanks<'_> {
    let guards = src.bindings.iter().map(|b| (b.participant_id().to_string(), RecordingGuard::default())).collect();
    AllRanks { src, guards }
}

#[test]
fn writer_uploads_participants_one_call_completes_in_one_upload() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 4, 7));
    let adapter = all_ranks(&src);
    let guards: Vec<RecordingGuard> = adapter.guards.iter().map(|g| g.1.clone()).collect();
    let mut w = ws.begin_snapshot(&src.descriptor("default"), adapter).unwrap();
    let plan = w.plan().clone();
    fake.clear_log();
    let receipts = w.write_tensor(plan.operations()[0].source_placement().tensor_id(), "").unwrap();
    // Every participant completed by this call, in one batch_put_from, with one pin per
    // participant, each released as completed.
    assert_eq!(receipts.len(), plan.operations().len());
    assert_eq!(fake.put_batches().len(), 1, "{:?}", fake.put_batches());
    assert_eq!(fake.put_batches()[0].len(), plan.operations().len());
    for g in &guards {
        assert_eq!(g.acquired(), 1);
        assert_eq!(g.released(), vec![TerminalState::Completed]);
    }
    let m = w.commit().unwrap();
    let dst = target(s_placement(1, 2, 7));
    let lp = plan_load(&ws, &m, &dst).unwrap();
    load_all(&ws, &lp, &dst, &StaticGuard).unwrap();
    dst.verify().unwrap();
}

#[test]
fn writer_with_deferred_uploads_uploads_everything_at_commit() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(2, 4, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("default"), HostAdapter(&src)).unwrap();
    assert!(!w.uploads_deferred());
    w.defer_uploads(true).unwrap();
    assert!(w.uploads_deferred());
    let plan = w.plan().clone();
    fake.clear_log();
    for (t, p) in items(&plan) {
        assert!(w.write_tensor(&t, &p).unwrap().is_empty(), "deferred: no receipts from write_tensor");
    }
    assert!(fake.calls().is_empty(), "no store call before commit: {:?}", fake.calls());
    assert!(w.receipts().is_empty());
    let m = w.commit().unwrap();
    // One batch_put_from for the 4 participants (the DP replica the plan stores).
    assert_eq!(fake.put_batches().len(), 1, "{:?}", fake.put_batches());
    assert_eq!(payloads(&fake, &plan), plan.operations().len());
    assert_eq!(w.receipts().len(), plan.operations().len());
    let dst = target(s_placement(1, 2, 7));
    let lp = plan_load(&ws, &m, &dst).unwrap();
    load_all(&ws, &lp, &dst, &StaticGuard).unwrap();
    dst.verify().unwrap();
    assert!(w.defer_uploads(false).is_err(), "closed");
}

#[test]
fn writer_with_deferred_uploads_aborts_when_the_commit_upload_fails() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 7));
    let mut w = ws.begin_snapshot(&src.descriptor("default"), HostAdapter(&src)).unwrap();
    w.defer_uploads(true).unwrap();
    let plan = w.plan().clone();
    write_all(&mut w).unwrap();
    let victim = plan.operations()[1].target().object_key().to_string();
    fake.fault_put(&victim, PutFault::Fail("-1".into()), 1);
    let e = w.commit().unwrap_err();
    assert!(e.message().contains("batch_put_from failed"), "{e}");
    // As a failed upload in write_tensor: the writer aborted, nothing of the plan left
    // but its abort decision.
    assert!(w.is_closed() && !w.is_committed());
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert_eq!(payloads(&fake, &plan), 0);
    let decision = String::from_utf8(fake.inner.get(plan.control_key()).unwrap()).unwrap();
    assert!(decision.contains("abort"), "{decision}");
}
