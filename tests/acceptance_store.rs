//! Acceptance tests, section D (store protocol), items 115–152 of `acceptance.md`,
//! over a recording, fault-injecting fake store.
//!
//! Mapping notes: the reference's scalar statuses become per-item failures (our
//! trait has no scalar batch result); "removed with force" is a plain `remove`
//! (removal is unconditional in our trait); an unregister that "raises" is an
//! unregister error whose message says so. Item 151 (the pre-registered
//! `StoreRegistrationLease`) has no counterpart; item 152 maps to the quarantine and
//! drain of a load's target registration.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use builders::*;
use fake_store::*;
use model::HostModel;
use mooncake_weight_store::protocol::{StaticGuard, TerminalState, UploadArgs, UploadReceipt, WeightStore};
use mooncake_weight_store::store::{ObjectStore, RecordType};
use mooncake_weight_store::*;
use std::collections::BTreeSet;
use std::sync::Arc;

fn plan_keys(plan: &UploadPlan) -> BTreeSet<String> {
    plan.operations().iter().map(|o| o.target().object_key().to_string()).collect()
}

fn payloads_present(fake: &FakeStore, plan: &UploadPlan) -> usize {
    plan_keys(plan).iter().filter(|k| fake.has(k)).count()
}

/// S(dp,tp) source, its weight store, plan (transaction `tx`) and fake store.
fn setup(dp: u64, tpn: u64, tx: &str) -> (Arc<FakeStore>, WeightStore, HostModel, UploadPlan) {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(dp, tpn, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts(tx)).unwrap();
    (fake, ws, src, plan)
}

fn upload_one(
    ws: &WeightStore,
    plan: &UploadPlan,
    src: &HostModel,
    i: usize,
    guard: &dyn protocol::GuardProvider,
) -> Result<Vec<UploadReceipt>> {
    let args = UploadArgs { guard: Some(guard), ..Default::default() };
    // SAFETY: the model's buffers outlive the call and are not written.
    unsafe { ws.upload(plan, &src.placement, &src.bindings[i], args) }
}

use mooncake_weight_store::protocol;

// ---------------------------------------------------------------------------
// D.1 Objects, groups, payloads
// ---------------------------------------------------------------------------

#[test]
fn acc_115_upload_deduplicates_dp_and_commits_manifest_last() {
    let (fake, ws, src, plan) = setup(2, 2, "tx115");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    assert_eq!(receipts.len(), 2);
    let m = plan.manifest();
    assert_eq!(fake.keys().len(), 2, "{:?}", fake.keys());
    assert!(!fake.has(m.manifest_key()));
    let committed = ws.commit(&plan, &receipts, None).unwrap();
    // Payloads, decision, manifest, and this library's integrity record (one extra
    // object in the revision's group, written before the decision) and, the fake
    // store being one that cannot list its keys, its revision index entry
    // (`protocol::revision_index`, also written before the decision).
    assert_eq!(fake.keys().len(), 6, "{:?}", fake.keys());
    let index = mooncake_weight_store::model::keys::resource_key_prefix("weights", m.namespace(), m.resource_id());
    let slot0 = protocol::revision_index::slot_key(&index.unwrap(), 0);
    assert!(fake.has(&slot0), "{slot0} in {:?}", fake.keys());
    assert!(fake.has(&mooncake_weight_store::plan::integrity::plan_integrity_key(&plan)));
    assert_eq!(&committed, m);
    assert_eq!(ws.load_manifest(m.manifest_key()).unwrap(), *m);
    for k in plan_keys(&plan) {
        assert_eq!(fake.inner.group_of(&k).unwrap().0, m.group_id());
    }
    assert_eq!(fake.inner.group_of(m.manifest_key()).unwrap().0, m.group_id());
    let decision_group = fake.inner.group_of(plan.control_key()).unwrap().0;
    assert_eq!(decision_group, plan.transaction_group_id());
    assert_ne!(decision_group, m.group_id());
    assert_eq!(fake.registrations().len(), 2);
    assert_eq!(fake.unregistrations().len(), 2);
    assert!(fake.still_registered().is_empty());
    // The manifest is the last object written.
    let last_put = fake.calls().into_iter().rev().find_map(|c| match c {
        Call::Put(k, ..) => Some(k),
        Call::BatchPut(k, ..) => Some(k[0].clone()),
        _ => None,
    });
    assert_eq!(last_put.as_deref(), Some(m.manifest_key()));
}

#[test]
fn acc_116_stored_manifest_json_persists_weight_generation() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 17));
    let (plan, committed) = snapshot(&ws, &src, "tx116");
    let raw = String::from_utf8(fake.inner.get(committed.manifest_key()).unwrap()).unwrap();
    assert!(raw.contains("\"weight_generation\":17"), "{raw}");
    let decoded = StoredManifest::from_json(raw.as_bytes()).unwrap();
    assert_eq!(decoded, committed);
    assert_eq!(decoded, *plan.manifest());
}

#[test]
fn acc_117_weight_group_objects_are_typed() {
    let (fake, ws, src, _) = setup(1, 2, "tx117");
    let (plan, m) = snapshot(&ws, &src, "tx117");
    for k in plan_keys(&plan) {
        assert_eq!(fake.inner.group_of(&k).unwrap().1, RecordType::Payload);
    }
    assert_eq!(fake.inner.group_of(m.manifest_key()).unwrap().1, RecordType::Metadata);
    assert_eq!(fake.inner.group_of(plan.control_key()).unwrap().1, RecordType::Metadata);
    for c in fake.calls() {
        match c {
            Call::BatchPut(_, t, _) => assert_eq!(t, RecordType::Payload),
            Call::Put(_, t, _) => assert_eq!(t, RecordType::Metadata),
            _ => {}
        }
    }
}

#[test]
fn acc_118_upload_waits_for_complete_payload() {
    let (fake, ws, src, plan) = setup(1, 1, "tx118");
    fake.fault_put("/payload/", PutFault::Invisible(1), 1);
    let e = upload_all(&ws, &plan, &src, &StaticGuard);
    expect_err(e, ErrorKind::Store, "payload is not complete");
    assert!(fake.removes().is_empty());
}

#[test]
fn acc_119_payload_completion_queries_are_bounded() {
    let fake = FakeStore::new();
    let ws = ws_limited(&fake, 1, 64 << 20);
    let src = source(s_placement(1, 2, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx119")).unwrap();
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.clear_log();
    ws.commit(&plan, &receipts, None).unwrap();
    // Two payload checks of one key each before the decision, then the revision
    // index's probe of slot 0 (its batches bounded the same way), then the payload
    // checks after it.
    assert_eq!(fake.exists_batches(), vec![1, 1, 1, 1, 1]);
}

/// One participant with four 8-byte tensors.
fn four_tensor_placement() -> Placement {
    let ts: Vec<TensorDescriptor> = (0..4).map(|i| tensor(&format!("t{i}"), &[8], 1, &[])).collect();
    let fs = ts.iter().map(|t| whole(t, tp(0))).collect();
    flat(topo(1, 1, 1, 1, &[tp(0)]), ts, fs).unwrap()
}

#[test]
fn acc_120_upload_batches_payload_puts_by_range_limit() {
    let fake = FakeStore::new();
    let ws = ws_limited(&fake, 2, 64 << 20);
    let src = source(four_tensor_placement());
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx120")).unwrap();
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    let batches = fake.put_batches();
    assert!(batches.iter().all(|b| b.len() <= 2), "{batches:?}");
    let keys: Vec<String> = batches.concat();
    let planned: Vec<String> = plan.operations().iter().map(|o| o.target().object_key().to_string()).collect();
    assert_eq!(keys, planned);
    let got: Vec<&str> = receipts.iter().map(|r| r.object_key.as_str()).collect();
    assert_eq!(got, planned);
}

#[test]
fn acc_121_upload_routes_shared_worker_operations_by_participant() {
    let (_fake, ws, mut src, _) = setup(1, 2, "tx121");
    src.bindings = src
        .bindings
        .iter()
        .map(|b| rebind(b, |s| s.instance_id = "shared-instance".into(), |f| f.worker_id = "shared-worker".into()))
        .collect();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx121")).unwrap();
    let mut total = 0;
    for (i, b) in src.bindings.iter().enumerate() {
        let r = upload_one(&ws, &plan, &src, i, &StaticGuard).unwrap();
        let mine: Vec<&str> = plan
            .operations()
            .iter()
            .filter(|o| o.source_participant_id() == b.participant_id())
            .map(|o| o.target().fragment_id())
            .collect();
        let got: Vec<&str> = r.iter().map(|r| r.fragment_id.as_str()).collect();
        assert_eq!(got, mine);
        assert!(r.iter().all(|r| r.worker_id == "shared-worker"));
        total += r.len();
    }
    assert_eq!(total, 2);
}

#[test]
fn acc_122_payload_failure_does_not_publish_manifest() {
    let (fake, ws, src, plan) = setup(1, 2, "tx122");
    let second = plan.operations()[1].target().object_key().to_string();
    fake.fault_put(&second, PutFault::Fail("-1".into()), 1);
    let mut receipts = Vec::new();
    let mut failure = None;
    for i in 0..src.bindings.len() {
        match upload_one(&ws, &plan, &src, i, &StaticGuard) {
            Ok(r) => receipts.extend(r),
            Err(e) => failure = Some(e),
        }
    }
    let e = failure.expect("second payload failed");
    assert!(e.message().contains("batch_put_from"), "{e}");
    assert_eq!(receipts.len(), 1);
    ws.abort_upload(&plan, &receipts).unwrap();
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert_eq!(payloads_present(&fake, &plan), 0);
    let removed: BTreeSet<String> = fake.removes().into_iter().collect();
    assert_eq!(removed, plan_keys(&plan));
}

#[test]
fn acc_123_upload_surfaces_whole_batch_failures() {
    let (fake, ws, src, plan) = setup(1, 1, "tx123");
    fake.with_faults(|f| f.batch_put_scalar = Some("-17".into()));
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "batch_put_from failed");
    assert!(e.message().contains("-17"), "{e}");
    let (fake, ws, src, plan) = setup(1, 1, "tx123b");
    fake.with_faults(|f| f.batch_exists_scalar = Some("-18".into()));
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "existence check failed");
    assert!(e.message().contains("-18"), "{e}");
}

// ---------------------------------------------------------------------------
// D.2 Transactions
// ---------------------------------------------------------------------------

#[test]
fn acc_124_finalize_keeps_committed_revision() {
    let (fake, ws, src, _) = setup(1, 2, "tx124");
    let (plan, m) = snapshot(&ws, &src, "tx124");
    ws.finalize(&plan).unwrap();
    ws.finalize(&plan).unwrap();
    assert!(fake.has(plan.control_key()));
    assert!(fake.has(m.manifest_key()));
    assert_eq!(payloads_present(&fake, &plan), 2);
}

#[test]
fn acc_125_commit_rejects_incomplete_receipts() {
    let (fake, ws, src, plan) = setup(1, 2, "tx125");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    expect_invalid(ws.commit(&plan, &receipts[..1], None), "missing upload receipts");
    assert!(!fake.has(plan.manifest().manifest_key()));
}

#[test]
fn acc_126_commit_rechecks_every_payload() {
    let (fake, ws, src, plan) = setup(1, 2, "tx126");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.inner.remove(&receipts[0].object_key).unwrap();
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "payload is not complete");
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert!(ws.read_decision(&plan).unwrap().is_none(), "no commit decision was recorded");
    ws.abort_upload(&plan, &receipts).unwrap();
    assert_eq!(payloads_present(&fake, &plan), 0);
}

#[test]
fn acc_127_abort_cleans_whole_plan_when_a_receipt_was_lost() {
    let (fake, ws, src, plan) = setup(1, 2, "tx127");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.clear_log();
    ws.abort_upload(&plan, &receipts[..1]).unwrap();
    let removed: BTreeSet<String> = fake.removes().into_iter().collect();
    assert_eq!(removed, plan_keys(&plan));
    assert_eq!(payloads_present(&fake, &plan), 0);
}

#[test]
fn acc_128_abort_does_not_delete_while_decision_is_processing() {
    let (fake, ws, src, plan) = setup(1, 2, "tx128");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.fault_put(plan.control_key(), PutFault::Invisible(1), 1);
    fake.clear_log();
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Store, "not complete");
    assert_eq!(payloads_present(&fake, &plan), 2);
    assert!(fake.removes().is_empty());
}

#[test]
fn acc_129_abort_loses_after_commit_claims_plan() {
    let (fake, ws, src, plan) = setup(1, 2, "tx129");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.fault_put(plan.manifest().manifest_key(), PutFault::Invisible(2), 1);
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "manifest put failed");
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Conflict, "already chose commit");
    assert_eq!(payloads_present(&fake, &plan), 2);
}

#[test]
fn acc_130_upload_fails_and_cleans_up_when_abort_wins_after_complete_check() {
    let (fake, ws, src, plan) = setup(1, 1, "tx130");
    let (f2, p2) = (fake.clone(), plan.clone());
    fake.hook(Trigger::AfterBatchExists("/payload/".into()), move || {
        WeightStore::new(f2).abort_upload(&p2, &[]).unwrap();
    });
    expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Conflict, "already chose abort");
    assert_eq!(payloads_present(&fake, &plan), 0);
}

#[test]
fn acc_131_commit_is_idempotent() {
    let (fake, ws, src, plan) = setup(1, 2, "tx131");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    let a = ws.commit(&plan, &receipts, None).unwrap();
    let b = ws.commit(&plan, &receipts, None).unwrap();
    assert_eq!(a, b);
    assert_eq!(payloads_present(&fake, &plan), 2);
}

/// Winner and loser plans of one source; both uploaded, the winner committed.
fn winner_and_loser(fake: &Arc<FakeStore>) -> (WeightStore, HostModel, UploadPlan, UploadPlan, Vec<UploadReceipt>) {
    let ws = ws(fake);
    let src = source(s_placement(1, 2, 1));
    let winner = ws.plan_upload(&src.placement, &src.bindings, &opts("winner")).unwrap();
    let loser = ws.plan_upload(&src.placement, &src.bindings, &opts("loser")).unwrap();
    let rw = upload_all(&ws, &winner, &src, &StaticGuard).unwrap();
    let rl = upload_all(&ws, &loser, &src, &StaticGuard).unwrap();
    ws.commit(&winner, &rw, None).unwrap();
    (ws, src, winner, loser, rl)
}

fn winner_loads(ws: &WeightStore, m: &StoredManifest) {
    let dst = target(s_placement(1, 1, 1));
    let plan = plan_load(ws, m, &dst).unwrap();
    load_all(ws, &plan, &dst, &StaticGuard).unwrap();
    dst.verify().unwrap();
}

#[test]
fn acc_132_commit_conflict_keeps_winner_and_cleans_loser_payloads() {
    let fake = FakeStore::new();
    let (ws, _src, winner, loser, rl) = winner_and_loser(&fake);
    expect_err(ws.commit(&loser, &rl, None), ErrorKind::Conflict, "conflicting weight revision");
    assert_eq!(ws.load_manifest(winner.manifest().manifest_key()).unwrap(), *winner.manifest());
    winner_loads(&ws, winner.manifest());
    assert_eq!(payloads_present(&fake, &loser), 0);
    let removed: BTreeSet<String> = fake.removes().into_iter().collect();
    // The loser's payloads and the integrity record it wrote before its claim.
    let mut expected = plan_keys(&loser);
    expected.insert(mooncake_weight_store::plan::integrity::plan_integrity_key(&loser));
    assert_eq!(removed, expected);
}

#[test]
fn acc_133_finalize_conflicting_commit_keeps_terminal_decision() {
    let fake = FakeStore::new();
    let (ws, _src, winner, loser, rl) = winner_and_loser(&fake);
    expect_err(ws.commit(&loser, &rl, None), ErrorKind::Conflict, "conflicting weight revision");
    assert!(fake.has(loser.control_key()));
    ws.finalize(&loser).unwrap();
    assert!(fake.has(loser.control_key()));
    assert_eq!(ws.load_manifest(winner.manifest().manifest_key()).unwrap(), *winner.manifest());
    assert_eq!(payloads_present(&fake, &winner), 2);
}

#[test]
fn acc_134_conflict_cleanup_preserves_payloads_referenced_by_winner() {
    let (fake, ws, src, plan) = setup(1, 2, "tx134");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    let mut other_opts = opts("tx134");
    other_opts.created_at = Some("1999-12-31T23:59:59Z".into());
    let other = ws.plan_upload(&src.placement, &src.bindings, &other_opts).unwrap();
    assert_eq!(plan_keys(&other), plan_keys(&plan));
    assert_ne!(other.manifest(), plan.manifest());
    fake.inner
        .put(
            other.manifest().manifest_key(),
            other.manifest().to_json().as_bytes(),
            &store::WriteConfig {
                group_ids: &[other.manifest().group_id().to_string()],
                record_type: RecordType::Metadata,
            },
        )
        .unwrap();
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Conflict, "conflicting weight revision");
    ws.finalize(&plan).unwrap();
    assert_eq!(payloads_present(&fake, &plan), 2);
    assert!(fake.has(plan.control_key()));
    assert_eq!(ws.load_manifest(plan.manifest().manifest_key()).unwrap(), *other.manifest());
}

use mooncake_weight_store::store;

#[test]
fn acc_135_commit_finalize_rejects_late_abort() {
    let (fake, ws, src, _) = setup(1, 2, "tx135");
    let (plan, m) = snapshot(&ws, &src, "tx135");
    ws.finalize(&plan).unwrap();
    expect_err(
        ws.abort_upload(&plan, &UploadReceipt::all_for(&plan)),
        ErrorKind::Conflict,
        "published weight revision",
    );
    assert!(fake.has(m.manifest_key()));
    assert_eq!(payloads_present(&fake, &plan), 2);
}

#[test]
fn acc_136_abort_finalize_rejects_late_upload_and_commit() {
    let (fake, ws, src, plan) = setup(1, 2, "tx136");
    ws.abort_upload(&plan, &[]).unwrap();
    ws.finalize(&plan).unwrap();
    expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Conflict, "already chose abort");
    expect_err(ws.commit(&plan, &UploadReceipt::all_for(&plan), None), ErrorKind::Conflict, "already chose abort");
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert_eq!(payloads_present(&fake, &plan), 0);
    assert!(fake.has(plan.control_key()));
}

#[test]
fn acc_137_abort_checks_ready_manifest_when_decision_was_lost() {
    let (fake, ws, src, _) = setup(1, 2, "tx137");
    let (plan, m) = snapshot(&ws, &src, "tx137");
    fake.inner.remove(plan.control_key()).unwrap();
    expect_err(ws.abort_upload(&plan, &[]), ErrorKind::Conflict, "published weight revision");
    assert!(fake.has(m.manifest_key()));
    assert_eq!(payloads_present(&fake, &plan), 2);
}

#[test]
fn acc_138_commit_detects_concurrent_winner_after_manifest_preflight() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 1));
    let winner = ws.plan_upload(&src.placement, &src.bindings, &opts("winner")).unwrap();
    let loser = ws.plan_upload(&src.placement, &src.bindings, &opts("loser")).unwrap();
    let rw = upload_all(&ws, &winner, &src, &StaticGuard).unwrap();
    let rl = upload_all(&ws, &loser, &src, &StaticGuard).unwrap();
    let (f2, w2) = (fake.clone(), winner.clone());
    fake.hook(Trigger::BeforePut(loser.manifest().manifest_key().into()), move || {
        WeightStore::new(f2).commit(&w2, &rw, None).unwrap();
    });
    expect_err(ws.commit(&loser, &rl, None), ErrorKind::Conflict, "conflicting weight revision");
    assert_eq!(ws.load_manifest(winner.manifest().manifest_key()).unwrap(), *winner.manifest());
    assert_eq!(payloads_present(&fake, &winner), 2);
    assert_eq!(payloads_present(&fake, &loser), 0);
    winner_loads(&ws, winner.manifest());
}

#[test]
fn acc_139_commit_rejects_duplicate_or_forged_receipts() {
    let (_fake, ws, src, plan) = setup(1, 2, "tx139");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    let mut dup = receipts.clone();
    dup.push(receipts[0].clone());
    expect_invalid(ws.commit(&plan, &dup, None), "duplicate upload receipt");
    let mut forged = receipts.clone();
    forged[0].object_key = format!("{}/payload/forged", plan.manifest().group_id());
    expect_invalid(ws.commit(&plan, &forged, None), "invalid upload receipt");
}

#[test]
fn acc_140_manifest_put_failure_keeps_payloads_for_retry() {
    let (fake, ws, src, plan) = setup(1, 2, "tx140");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.fault_put(plan.manifest().manifest_key(), PutFault::Fail("-1".into()), 1);
    let e = expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "manifest put failed");
    assert!(e.message().contains("-1"), "{e}");
    assert_eq!(payloads_present(&fake, &plan), 2);
    assert!(!fake.has(plan.manifest().manifest_key()));
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
}

#[test]
fn acc_141_commit_recovers_when_manifest_response_is_lost() {
    let (fake, ws, src, plan) = setup(1, 2, "tx141");
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    fake.fault_put(plan.manifest().manifest_key(), PutFault::FailAfterWrite("-1".into()), 1);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_eq!(ws.load_manifest(plan.manifest().manifest_key()).unwrap(), *plan.manifest());
    assert_eq!(payloads_present(&fake, &plan), 2);
}

// ---------------------------------------------------------------------------
// D.3 Registration and lifetime
// ---------------------------------------------------------------------------

#[test]
fn acc_142_register_failure_is_not_already_registered() {
    let (fake, ws, src, plan) = setup(1, 1, "tx142");
    fake.with_faults(|f| f.register_status = Some("-600".into()));
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "register_buffer failed");
    assert!(e.message().contains("-600"));
    assert!(fake.put_batches().is_empty());
}

#[test]
fn acc_143_registration_deduplicates_exact_aliases() {
    let group = ["embed.weight", "head.weight"];
    let mk_t = |id: &str| tensor(id, &[8], 1, &[]);
    let (te, th) = (mk_t("embed.weight"), mk_t("head.weight"));
    let mk_f = |t: &TensorDescriptor| {
        PlacementFragment::new(PlacementFragmentSpec {
            aliases: group.iter().map(|s| s.to_string()).collect(),
            ..frag_spec(t, &[0], &[8], tp(0))
        })
        .unwrap()
    };
    let (fe, fh) = (mk_f(&te), mk_f(&th));
    let p = flat(topo(1, 1, 1, 1, &[tp(0)]), vec![te, th], vec![fe.clone(), fh.clone()]).unwrap();
    let buf: Vec<u8> = (0..8).collect();
    let addr = buf.as_ptr() as u64;
    let frags = [(&fe, "rt-e"), (&fh, "rt-h")]
        .iter()
        .map(|(f, id)| {
            RuntimeFragment::new(rt_spec(f.placement_fragment_id(), id, addr, 8, "worker-0", &[8], 1)).unwrap()
        })
        .collect();
    let b = RuntimeBinding::new(binding_spec(&p, &pid(tp(0)), "inst", 1, frags)).unwrap();
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let plan = ws.plan_upload(&p, std::slice::from_ref(&b), &opts("tx143")).unwrap();
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: `buf` outlives the call and is not written.
    let r = unsafe { ws.upload(&plan, &p, &b, args) }.unwrap();
    assert!(!r.is_empty());
    assert_eq!(fake.registrations(), vec![(addr, 8)]);
    assert!(fake.still_registered().is_empty());
}

/// One participant with 2 tensors (two buffers).
fn two_buffer_source() -> HostModel {
    let ts: Vec<TensorDescriptor> = (0..2).map(|i| tensor(&format!("t{i}"), &[8], 1, &[])).collect();
    let fs = ts.iter().map(|t| whole(t, tp(0))).collect();
    source(flat(topo(1, 1, 1, 1, &[tp(0)]), ts, fs).unwrap())
}

#[test]
fn acc_144_upload_unregisters_every_buffer_without_deleting_payloads() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = two_buffer_source();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx144")).unwrap();
    let first = src.bindings[0].fragments()[0].address();
    fake.with_faults(|f| f.unregister_status.insert(first, "-9".into()));
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "unregister_buffer failed");
    assert!(e.message().contains("-9"));
    assert_eq!(fake.registrations().len(), 2);
    assert_eq!(fake.unregistrations().len(), 2);
    assert_eq!(payloads_present(&fake, &plan), 2);
    assert!(fake.removes().is_empty());
}

#[test]
fn acc_145_unregister_failure_does_not_mask_payload_failure() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = two_buffer_source();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx145")).unwrap();
    let first = src.bindings[0].fragments()[0].address();
    fake.with_faults(|f| f.unregister_status.insert(first, "-9".into()));
    fake.fault_put(plan.operations()[1].target().object_key(), PutFault::Fail("-1".into()), 1);
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "batch_put_from failed");
    assert!(e.message().contains("unregister_buffer failed"), "{e}");
    assert_eq!(fake.unregistrations().len(), 2);
    assert!(fake.has(plan.operations()[0].target().object_key()));
    assert!(fake.removes().is_empty());
}

#[test]
fn acc_146_unregister_attempts_every_buffer_in_reverse_order() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = two_buffer_source();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("tx146")).unwrap();
    let (a, b) = (src.bindings[0].fragments()[0].address(), src.bindings[0].fragments()[1].address());
    fake.with_faults(|f| {
        f.unregister_status.insert(a, "unregister exploded".into());
        f.unregister_status.insert(b, "-9".into());
    });
    fake.fault_put(plan.operations()[1].target().object_key(), PutFault::Fail("-1".into()), 1);
    let e = expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "batch_put_from failed");
    assert!(e.message().contains("unregister exploded") && e.message().contains("-9"), "{e}");
    let regs: Vec<u64> = fake.registrations().iter().map(|r| r.0).collect();
    let mut rev = regs.clone();
    rev.reverse();
    assert_eq!(fake.unregistrations(), rev);
}

#[test]
fn acc_147_store_rejects_raw_addresses_without_guards() {
    let (fake, ws, src, plan) = setup(1, 1, "tx147");
    let args = UploadArgs::default();
    // SAFETY: the model's buffers outlive the call.
    let r = unsafe { ws.upload(&plan, &src.placement, &src.bindings[0], args) };
    expect_invalid(r, "source allocation guard providers");
    assert!(fake.registrations().is_empty());
    assert!(fake.put_batches().is_empty());
}

#[test]
fn acc_148_upload_releases_pin_after_completion() {
    let (fake, ws, src, plan) = setup(1, 1, "tx148");
    let guard = RecordingGuard::default();
    upload_all(&ws, &plan, &src, &guard).unwrap();
    assert_eq!(guard.acquired(), 1);
    assert_eq!(guard.released(), vec![TerminalState::Completed]);
    assert!(fake.still_registered().is_empty());
}

#[test]
fn acc_149_quarantines_pin_until_unregister_cleanup_succeeds() {
    let (fake, ws, src, plan) = setup(1, 1, "tx149");
    let guard = RecordingGuard::default();
    let addr = src.bindings[0].fragments()[0].address();
    fake.with_faults(|f| f.unregister_status.insert(addr, "-9".into()));
    expect_err(upload_all(&ws, &plan, &src, &guard), ErrorKind::Store, "allocation lifetime is quarantined");
    assert!(guard.released().is_empty());
    let pending = ws.pending_registration_ids();
    assert_eq!(pending.len(), 1);
    let other = ws.plan_upload(&src.placement, &src.bindings, &opts("tx149b")).unwrap();
    expect_err(upload_all(&ws, &other, &src, &guard), ErrorKind::Store, "blocked by pending registration");
    fake.with_faults(|f| f.unregister_status.clear());
    ws.drain_pending_registration(&pending[0]).unwrap();
    assert_eq!(guard.released(), vec![TerminalState::Completed]);
    assert!(ws.pending_registration_ids().is_empty());
    assert!(fake.still_registered().is_empty());
}

#[test]
fn acc_150_load_holds_target_pin_through_ranged_read() {
    let (fake, ws, src, _) = setup(1, 2, "tx150");
    let (_, m) = snapshot(&ws, &src, "tx150");
    let dst = target(s_placement(1, 2, 1));
    let plan = plan_load(&ws, &m, &dst).unwrap();
    let guard = RecordingGuard::default();
    load_all(&ws, &plan, &dst, &guard).unwrap();
    dst.verify().unwrap();
    assert_eq!(guard.released(), vec![TerminalState::Completed; 2]);
    assert!(fake.still_registered().is_empty());
}

/// Item 152 mapped: no lease object exists; the closest behaviour is a load whose
/// target unregister fails: quarantined, drained, released once; a second drain is
/// refused (nothing left to close).
#[test]
fn acc_152_cleanup_failure_quarantines_and_drains_once() {
    let (fake, ws, src, _) = setup(1, 1, "tx152");
    let (_, m) = snapshot(&ws, &src, "tx152");
    let dst = target(s_placement(1, 1, 1));
    let plan = plan_load(&ws, &m, &dst).unwrap();
    let guard = RecordingGuard::default();
    let addr = dst.bindings[0].fragments()[0].address();
    fake.with_faults(|f| f.unregister_status.insert(addr, "-9".into()));
    expect_err(load_all(&ws, &plan, &dst, &guard), ErrorKind::Store, "allocation lifetime is quarantined");
    assert!(guard.released().is_empty());
    let pending = ws.pending_registration_ids();
    assert_eq!(pending.len(), 1);
    fake.with_faults(|f| f.unregister_status.clear());
    ws.drain_pending_registration(&pending[0]).unwrap();
    assert_eq!(guard.released(), vec![TerminalState::Completed]);
    expect_err(ws.drain_pending_registration(&pending[0]), ErrorKind::NotFound, "does not exist");
    assert_eq!(guard.released().len(), 1);
    assert!(fake.still_registered().is_empty());
}
