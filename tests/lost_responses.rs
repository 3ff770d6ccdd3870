//! Issue 4: lost and delayed store responses. A put that took effect but reported
//! failure, an `exists` that reports "not found" once, and a put that becomes
//! visible only later, on every write of the protocol; every retry path must end in
//! the committed revision (or a clean abort) without losing or leaking payloads.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use builders::*;
use fake_store::*;
use model::HostModel;
use mooncake_weight_store::protocol::{StaticGuard, UploadReceipt, WeightStore};
use mooncake_weight_store::store::ObjectStore;
use mooncake_weight_store::*;
use std::sync::Arc;

fn setup(tx: &str) -> (Arc<FakeStore>, WeightStore, HostModel, UploadPlan, Vec<UploadReceipt>) {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts(tx)).unwrap();
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    (fake, ws, src, plan, receipts)
}

fn payloads(fake: &FakeStore, plan: &UploadPlan) -> usize {
    plan.operations().iter().filter(|o| fake.has(o.target().object_key())).count()
}

/// The committed revision is complete and loads back byte-exact.
fn assert_committed(fake: &FakeStore, ws: &WeightStore, plan: &UploadPlan) {
    assert_eq!(ws.load_manifest(plan.manifest().manifest_key()).unwrap(), *plan.manifest());
    assert_eq!(ws.read_decision(plan).unwrap().unwrap().0, Decision::Commit);
    assert_eq!(payloads(fake, plan), plan.operations().len());
    ws.finalize(plan).unwrap();
    let dst = target(s_placement(1, 1, 1));
    let lp = plan_load(ws, plan.manifest(), &dst).unwrap();
    load_all(ws, &lp, &dst, &StaticGuard).unwrap();
    dst.verify().unwrap();
}

#[test]
fn decision_put_lost_response_commit_proceeds() {
    let (fake, ws, _src, plan, receipts) = setup("t1");
    fake.fault_put(plan.control_key(), PutFault::FailAfterWrite("-1 lost".into()), 1);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn decision_put_not_yet_visible_commit_retry() {
    let (fake, ws, _src, plan, receipts) = setup("t2");
    fake.fault_put(plan.control_key(), PutFault::Invisible(1), 1);
    let mut called = false;
    let mut cb = || called = true;
    expect_err(ws.commit(&plan, &receipts, Some(&mut cb)), ErrorKind::Store, "upload decision is not complete; retry");
    assert!(called, "the caller learns that the commit decision may exist");
    assert!(!fake.has(plan.manifest().manifest_key()));
    // Abort is now refused: the commit decision won.
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Conflict, "already chose commit");
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn manifest_put_failed_commit_retry() {
    let (fake, ws, _src, plan, receipts) = setup("t3");
    fake.fault_put(plan.manifest().manifest_key(), PutFault::Fail("-1".into()), 1);
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "manifest put failed");
    expect_err(ws.finalize(&plan), ErrorKind::Store, "committed upload transaction has no manifest");
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Conflict, "already chose commit");
    assert_eq!(payloads(&fake, &plan), 2);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn manifest_put_lost_response_commit_succeeds() {
    let (fake, ws, _src, plan, receipts) = setup("t4");
    fake.fault_put(plan.manifest().manifest_key(), PutFault::FailAfterWrite("-1 lost".into()), 1);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn manifest_put_delayed_then_retry_and_abort_refused_after_publication() {
    let (fake, ws, _src, plan, receipts) = setup("t5");
    fake.fault_put(plan.manifest().manifest_key(), PutFault::Invisible(1), 1);
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "manifest put failed");
    // Now visible: abort is refused, a retried commit returns the manifest.
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Conflict, "published weight revision");
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn manifest_exists_not_found_once_after_put() {
    let (fake, ws, _src, plan, receipts) = setup("t6");
    // Preflight read, then the post-put read reports "not found" once.
    let key = plan.manifest().manifest_key().to_string();
    let f2 = fake.clone();
    fake.hook(Trigger::BeforePut(key.clone()), move || {
        f2.with_faults(|f| f.exists_not_found_once.insert(key));
    });
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "manifest put failed");
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn payload_exists_not_found_once_commit_retry() {
    let (fake, ws, _src, plan, receipts) = setup("t7");
    fake.with_faults(|f| f.exists_not_found_once.insert(receipts[1].object_key.clone()));
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "payload is not complete");
    assert!(ws.read_decision(&plan).unwrap().is_none());
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn payload_exists_not_found_once_after_claim() {
    let (fake, ws, _src, plan, receipts) = setup("t7b");
    // The post-claim completeness check misses a payload once.
    let (f2, k) = (fake.clone(), receipts[0].object_key.clone());
    fake.hook(Trigger::BeforePut(plan.control_key().into()), move || {
        f2.with_faults(|f| f.exists_not_found_once.insert(k));
    });
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Store, "payload is not complete");
    assert_eq!(ws.read_decision(&plan).unwrap().unwrap().0, Decision::Commit);
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Conflict, "already chose commit");
    assert_eq!(payloads(&fake, &plan), 2);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn finalize_recovers_published_manifest_whose_decision_was_lost() {
    let (fake, ws, _src, plan, receipts) = setup("t8");
    ws.commit(&plan, &receipts, None).unwrap();
    fake.inner.remove(plan.control_key()).unwrap();
    // The re-created decision's response is lost too.
    fake.fault_put(plan.control_key(), PutFault::FailAfterWrite("-1 lost".into()), 1);
    ws.finalize(&plan).unwrap();
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn finalize_with_decision_put_not_yet_visible_is_retryable() {
    let (fake, ws, _src, plan, receipts) = setup("t9");
    ws.commit(&plan, &receipts, None).unwrap();
    fake.inner.remove(plan.control_key()).unwrap();
    fake.fault_put(plan.control_key(), PutFault::Invisible(1), 1);
    expect_err(ws.finalize(&plan), ErrorKind::Store, "terminal decision is incomplete");
    ws.finalize(&plan).unwrap();
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn abort_decision_lost_response_still_cleans() {
    let (fake, ws, _src, plan, receipts) = setup("t10");
    fake.fault_put(plan.control_key(), PutFault::FailAfterWrite("-1 lost".into()), 1);
    ws.abort_upload(&plan, &receipts).unwrap();
    assert_eq!(payloads(&fake, &plan), 0);
    assert!(!fake.has(plan.manifest().manifest_key()));
    ws.finalize(&plan).unwrap();
}

#[test]
fn abort_decision_delayed_then_retry_cleans() {
    let (fake, ws, _src, plan, receipts) = setup("t11");
    fake.fault_put(plan.control_key(), PutFault::Invisible(1), 1);
    expect_err(ws.abort_upload(&plan, &receipts), ErrorKind::Store, "upload decision is not complete; retry");
    assert_eq!(payloads(&fake, &plan), 2, "nothing removed before the decision is visible");
    ws.abort_upload(&plan, &receipts).unwrap();
    assert_eq!(payloads(&fake, &plan), 0);
    expect_err(ws.commit(&plan, &receipts, None), ErrorKind::Conflict, "already chose abort");
}

#[test]
fn payload_put_lost_response_then_abort_leaves_nothing() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("t12")).unwrap();
    fake.fault_put("/payload/", PutFault::FailAfterWrite("-1 lost".into()), 1);
    expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "batch_put_from failed");
    assert_eq!(payloads(&fake, &plan), 1, "the write took effect");
    ws.abort_upload(&plan, &[]).unwrap();
    assert_eq!(payloads(&fake, &plan), 0);
}

#[test]
fn payload_put_lost_response_commit_with_rebuilt_receipts() {
    // A coordinator that lost the upload response rebuilds the receipts from the plan.
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 2, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("t13")).unwrap();
    fake.fault_put("/payload/", PutFault::FailAfterWrite("-1 lost".into()), 1);
    assert!(upload_all(&ws, &plan, &src, &StaticGuard).is_err());
    // Upload the other participant (the first participant's payload already landed).
    let args = mooncake_weight_store::protocol::UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: the model's buffers outlive the call and are not written.
    unsafe { ws.upload(&plan, &src.placement, &src.bindings[1], args) }.unwrap();
    let receipts = UploadReceipt::all_for(&plan);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}

#[test]
fn payload_put_delayed_upload_fails_commit_after_visibility() {
    let fake = FakeStore::new();
    let ws = ws(&fake);
    let src = source(s_placement(1, 1, 1));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts("t14")).unwrap();
    fake.fault_put("/payload/", PutFault::Invisible(1), 1);
    expect_err(upload_all(&ws, &plan, &src, &StaticGuard), ErrorKind::Store, "payload is not complete");
    let receipts = UploadReceipt::all_for(&plan);
    assert_eq!(ws.commit(&plan, &receipts, None).unwrap(), *plan.manifest());
    assert_committed(&fake, &ws, &plan);
}
