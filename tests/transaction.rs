//! `protocol::Transaction`: the upload transaction state machine that the C handle
//! `mws_transaction` and the Python `Transaction` front (receipts collected per
//! upload and from other ranks, commit with decision-may-exist, abort, finalize).

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::protocol::*;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::*;
use std::sync::Arc;

fn setup(tp: u64) -> (Arc<WeightStore>, HostModel, UploadPlan) {
    let defs = model_tensors(1, 16, 0);
    let src = HostModel::new(build_placement("src", Layout { tp, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "trainer", 1);
    let ws = Arc::new(WeightStore::new(Arc::new(MemoryStore::new())));
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    (ws, src, plan)
}

fn upload(tx: &Transaction, src: &HostModel, i: usize) -> Result<()> {
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: src's buffers outlive the call and are not written during it.
    unsafe { tx.upload(&src.placement, &src.bindings[i], args) }
}

#[test]
fn receipts_from_uploads_and_other_ranks_commit_once() {
    let (ws, src, plan) = setup(2);
    let tx = Transaction::new(ws.clone(), plan.clone());
    assert_eq!(tx.state(), TransactionState::Open);
    upload(&tx, &src, 0).unwrap();
    let own = tx.receipts();
    assert!(!own.is_empty());
    // Rank 1 uploads through its own transaction over the same plan.
    let other = Transaction::new(ws.clone(), plan.clone());
    upload(&other, &src, 1).unwrap();
    // Committing without rank 1's receipts fails and leaves the transaction open.
    let e = tx.commit().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(tx.state(), TransactionState::Open);
    assert!(!tx.decision_may_exist());
    tx.add_receipts(&other.receipts()).unwrap();
    let m = tx.commit().unwrap();
    assert_eq!(tx.state(), TransactionState::Committed);
    assert!(tx.decision_may_exist());
    // Idempotent: the same manifest again, no I/O needed.
    assert!(Arc::ptr_eq(&m, &tx.commit().unwrap()));
    assert_eq!(ws.load_manifest(m.manifest_key()).unwrap(), *m);
    // Committed: no more uploads, receipts or abort.
    assert_eq!(upload(&tx, &src, 0).unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(tx.add_receipts(&own).unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(tx.abort().unwrap_err().kind(), ErrorKind::Conflict);
    tx.finalize().unwrap();
    assert_eq!(tx.state(), TransactionState::Committed);
}

#[test]
fn abort_removes_payloads_and_closes_the_transaction() {
    let (ws, src, plan) = setup(1);
    let tx = Transaction::new(ws.clone(), plan.clone());
    upload(&tx, &src, 0).unwrap();
    let keys: Vec<&str> = plan.operations().iter().map(|o| o.target().object_key()).collect();
    assert!(keys.iter().all(|k| ws.backend().exists(k).unwrap()));
    tx.abort().unwrap();
    assert_eq!(tx.state(), TransactionState::Aborted);
    assert!(keys.iter().all(|k| !ws.backend().exists(k).unwrap()), "payloads removed");
    assert_eq!(ws.current_decision(&plan).unwrap(), Some(Decision::Abort));
    tx.abort().unwrap(); // no-op
    assert_eq!(tx.commit().unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(upload(&tx, &src, 0).unwrap_err().kind(), ErrorKind::Conflict);
}

#[test]
fn failed_upload_adds_no_receipts() {
    let (ws, src, plan) = setup(1);
    let tx = Transaction::new(ws, plan);
    // A binding of a later generation is stale for this plan: refused before any I/O.
    let stale = src.make_bindings("trainer", 2);
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe { tx.upload(&src.placement, &stale[0], args) }.unwrap_err();
    assert!(tx.receipts().is_empty(), "{e}");
    assert_eq!(tx.state(), TransactionState::Open);
}
