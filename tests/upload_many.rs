//! `WeightStore::upload_many` / `Transaction::upload_many` (issue 16): several local
//! participants in one upload call. Same receipts, manifest and stored bytes as one
//! upload per participant; every check of every binding before any store write;
//! a participant given twice is refused; leased and pinned bindings mix.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::integrity::block_checksums;
use mooncake_weight_store::protocol::guards::{weight_allocation_fence, AllocationFence};
use mooncake_weight_store::protocol::*;
use mooncake_weight_store::store::*;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A memory store that counts writes and tracks registrations.
#[derive(Default)]
struct Counting {
    inner: memory::MemoryStore,
    batch_puts: AtomicUsize,
    items_put: AtomicUsize,
    puts: AtomicUsize,
    registered: Mutex<BTreeSet<u64>>,
    registrations: AtomicUsize,
    fail_puts: AtomicBool,
}

impl Counting {
    fn writes(&self) -> usize {
        self.batch_puts.load(Ordering::SeqCst) + self.puts.load(Ordering::SeqCst)
    }
}

impl ObjectStore for Counting {
    fn put(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put(k, v, c)
    }
    fn upsert(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.upsert(k, v, c)
    }
    fn get(&self, k: &str) -> Result<Vec<u8>> {
        self.inner.get(k)
    }
    fn exists(&self, k: &str) -> Result<bool> {
        self.inner.exists(k)
    }
    fn remove(&self, k: &str) -> Result<()> {
        self.inner.remove(k)
    }
    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], c: &WriteConfig<'_>) -> Vec<Result<()>> {
        self.batch_puts.fetch_add(1, Ordering::SeqCst);
        self.items_put.fetch_add(items.len(), Ordering::SeqCst);
        assert_eq!(c.group_ids.len(), items.len(), "one group id per item");
        let reg = self.registered.lock();
        for i in items {
            let covered = reg.range(..=i.source.address).next_back().is_some();
            assert!(covered, "put from unregistered memory");
        }
        drop(reg);
        if self.fail_puts.load(Ordering::SeqCst) {
            return items.iter().map(|_| Err(Error::new(ErrorKind::Store, "injected put failure"))).collect();
        }
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.batch_put_from(items, c) }
    }
    unsafe fn get_into_ranges(&self, r: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.get_into_ranges(r) }
    }
    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        self.registrations.fetch_add(1, Ordering::SeqCst);
        assert!(self.registered.lock().insert(region.address), "double registration");
        Ok(())
    }
    fn unregister_buffer(&self, address: u64) -> Result<()> {
        assert!(self.registered.lock().remove(&address), "unregister of an unknown buffer");
        Ok(())
    }
}

/// A guard whose tokens record their releases; it refuses to pin `refuse`.
#[derive(Default)]
struct Recording {
    released: Arc<Mutex<Vec<TerminalState>>>,
    pinned: AtomicUsize,
    refuse: Option<String>,
}

struct Token(AllocationFence, Arc<Mutex<Vec<TerminalState>>>, bool);

impl LifetimeToken for Token {
    fn fence(&self) -> &AllocationFence {
        &self.0
    }
    fn release(&mut self, state: TerminalState) -> Result<()> {
        assert!(!self.2, "released twice");
        self.2 = true;
        self.1.lock().push(state);
        Ok(())
    }
}

impl GuardProvider for Recording {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        ids: &[String],
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        if self.refuse.as_deref() == Some(expected.participant_id()) {
            return Err(Error::new(ErrorKind::StaleBinding, "allocation moved"));
        }
        self.pinned.fetch_add(1, Ordering::SeqCst);
        let fence = weight_allocation_fence(expected, ids, transfer_id)?;
        Ok((expected.clone(), Box::new(Token(fence, self.released.clone(), false))))
    }
}

/// TP4: four participants, several MiB in all (the checksums then run alongside the puts).
fn model() -> HostModel {
    let defs = model_tensors(2, 512, 0);
    HostModel::new(build_placement("src", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "trainer", 1)
}

fn store() -> (Arc<Counting>, Arc<WeightStore>) {
    let backend = Arc::new(Counting::default());
    (backend.clone(), Arc::new(WeightStore::new(backend)))
}

fn sources(bindings: &[RuntimeBinding]) -> Vec<UploadSource<'_>> {
    bindings.iter().map(|b| UploadSource { binding: b, lease: None }).collect()
}

fn guarded(guard: &dyn GuardProvider) -> UploadArgs<'_> {
    UploadArgs { guard: Some(guard), ..Default::default() }
}

#[test]
fn upload_many_equals_one_upload_per_participant() {
    let src = model();
    let total: u64 = src.bindings.iter().flat_map(|b| b.fragments()).map(|f| f.nbytes()).sum();
    assert!(total >= 8 << 20, "the model must be large enough for the overlapped checksums: {total}");
    let (b1, ws1) = store();
    let (b2, ws2) = store();
    let plan = ws1.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();

    let many = Transaction::new(ws1.clone(), plan.clone());
    // SAFETY: src's buffers outlive the call and are not written during it.
    unsafe { many.upload_many(&src.placement, &sources(&src.bindings), guarded(&StaticGuard)) }.unwrap();
    let one = Transaction::new(ws2.clone(), plan.clone());
    for b in &src.bindings {
        // SAFETY: as above.
        unsafe { one.upload(&src.placement, b, guarded(&StaticGuard)) }.unwrap();
    }
    assert_eq!(many.receipts(), one.receipts(), "identical receipts, in the same order");
    assert_eq!(many.receipts().len(), plan.operations().len());
    // One put batch for the whole call (fewer operations than max_ranges_per_request),
    // one per participant otherwise.
    assert_eq!(b1.batch_puts.load(Ordering::SeqCst), 1);
    assert_eq!(b2.batch_puts.load(Ordering::SeqCst), src.bindings.len());
    assert_eq!(b1.items_put.load(Ordering::SeqCst), plan.operations().len());
    for r in many.receipts() {
        let stored = ws1.backend().get(&r.object_key).unwrap();
        assert_eq!(stored, ws2.backend().get(&r.object_key).unwrap());
        assert_eq!(r.block_checksums.as_deref(), Some(&block_checksums(&stored)[..]), "{}", r.object_key);
    }
    let m1 = many.commit().unwrap();
    let m2 = one.commit().unwrap();
    assert_eq!(*m1, *m2);
    assert!(b1.registered.lock().is_empty() && b2.registered.lock().is_empty(), "registrations released");
    // Committed: refused, nothing written.
    let writes = b1.writes();
    // SAFETY: as above.
    let e = unsafe { many.upload_many(&src.placement, &sources(&src.bindings), guarded(&StaticGuard)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(b1.writes(), writes);
}

#[test]
fn upload_many_splits_batches_at_max_ranges_per_request() {
    let src = model();
    let backend = Arc::new(Counting::default());
    let limits = StoreLimits { max_ranges_per_request: 5, ..Default::default() };
    let ws = WeightStore::new(backend.clone()).with_limits(limits).unwrap();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let n = plan.operations().len();
    // SAFETY: src's buffers outlive the call and are not written during it.
    let r = unsafe { ws.upload_many(&plan, &src.placement, &sources(&src.bindings), guarded(&StaticGuard)) }.unwrap();
    assert_eq!(r.len(), n);
    assert_eq!(backend.batch_puts.load(Ordering::SeqCst), n.div_ceil(5), "batches span participants");
    ws.commit(&plan, &r, None).unwrap();
}

#[test]
fn a_stale_binding_among_several_fails_before_any_write() {
    let src = model();
    let (backend, ws) = store();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let stale = src.make_bindings("trainer", 2);
    let mut mixed = src.bindings.clone();
    mixed[2] = stale[2].clone();
    let guard = Recording::default();
    let tx = Transaction::new(ws.clone(), plan.clone());
    // SAFETY: src's buffers outlive the call and are not written during it.
    let e = unsafe { tx.upload_many(&src.placement, &sources(&mixed), guarded(&guard)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleBinding, "{e}");
    assert!(e.message().contains("stale source lease"), "{e}");
    assert_eq!(backend.writes(), 0, "no store write");
    assert_eq!(backend.registrations.load(Ordering::SeqCst), 0, "nothing registered");
    assert_eq!(guard.pinned.load(Ordering::SeqCst), 0, "checks run before any pin");
    assert!(tx.receipts().is_empty());
    assert_eq!(tx.state(), TransactionState::Open);
    // A later guard refusal releases the pins already taken, before any write.
    let refusing = Recording { refuse: Some(src.bindings[3].participant_id().to_string()), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe { tx.upload_many(&src.placement, &sources(&src.bindings), guarded(&refusing)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleBinding, "{e}");
    assert_eq!(refusing.pinned.load(Ordering::SeqCst), 3);
    assert_eq!(*refusing.released.lock(), vec![TerminalState::Aborted; 3]);
    assert_eq!(backend.writes(), 0);
    assert!(tx.receipts().is_empty());
    // The fresh bindings still upload and commit through the same transaction.
    // SAFETY: as above.
    unsafe { tx.upload_many(&src.placement, &sources(&src.bindings), guarded(&guard)) }.unwrap();
    assert_eq!(*guard.released.lock(), vec![TerminalState::Completed; 4]);
    tx.commit().unwrap();
}

#[test]
fn a_failed_put_deletes_nothing_and_drains_the_pins() {
    let src = model();
    let (backend, ws) = store();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    // One participant already uploaded: its payloads must survive the failed call.
    // SAFETY: src's buffers outlive the call and are not written during it.
    let first = unsafe { ws.upload(&plan, &src.placement, &src.bindings[0], guarded(&StaticGuard)) }.unwrap();
    backend.fail_puts.store(true, Ordering::SeqCst);
    let guard = Recording::default();
    // SAFETY: as above.
    let e =
        unsafe { ws.upload_many(&plan, &src.placement, &sources(&src.bindings[1..]), guarded(&guard)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    assert!(e.message().contains("injected put failure"), "{e}");
    assert_eq!(*guard.released.lock(), vec![TerminalState::FailedDrained; 3]);
    assert!(first.iter().all(|r| ws.backend().exists(&r.object_key).unwrap()), "nothing deleted");
    assert!(backend.registered.lock().is_empty());
}

#[test]
fn a_participant_given_twice_or_a_call_lease_is_refused() {
    let src = model();
    let (backend, ws) = store();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let twice = vec![src.bindings[0].clone(), src.bindings[1].clone(), src.bindings[0].clone()];
    // SAFETY: src's buffers outlive the call and are not written during it.
    let e = unsafe { ws.upload_many(&plan, &src.placement, &sources(&twice), guarded(&StaticGuard)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("given twice"), "{e}");
    let ids: Vec<String> = plan
        .operations()
        .iter()
        .filter(|o| o.source_participant_id() == src.bindings[0].participant_id())
        .map(|o| o.source_snapshot().fragment_id().to_string())
        .collect();
    let lease = ws.register_weight_buffers(&src.bindings[0], &ids, &StaticGuard, "source", None).unwrap();
    let args = UploadArgs { lease: Some(&lease), ..guarded(&StaticGuard) };
    // SAFETY: as above.
    let e = unsafe { ws.upload_many(&plan, &src.placement, &sources(&src.bindings[..1]), args) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(backend.writes(), 0);
    // Nothing to upload: no sources at all.
    // SAFETY: as above.
    let r = unsafe { ws.upload_many(&plan, &src.placement, &[], guarded(&StaticGuard)) }.unwrap();
    assert!(r.is_empty());
}

#[test]
fn leased_and_pinned_bindings_mix() {
    let src = model();
    let (backend, ws) = store();
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let ids_of = |b: &RuntimeBinding| -> Vec<String> {
        plan.operations()
            .iter()
            .filter(|o| o.source_participant_id() == b.participant_id())
            .map(|o| o.source_snapshot().fragment_id().to_string())
            .collect()
    };
    let mut l0 =
        ws.register_weight_buffers(&src.bindings[0], &ids_of(&src.bindings[0]), &StaticGuard, "source", None).unwrap();
    let mut l2 =
        ws.register_weight_buffers(&src.bindings[2], &ids_of(&src.bindings[2]), &StaticGuard, "source", None).unwrap();
    let leased = backend.registered.lock().clone();
    let guard = Recording::default();
    let srcs = vec![
        UploadSource { binding: &src.bindings[0], lease: Some(&l0) },
        UploadSource { binding: &src.bindings[1], lease: None },
        UploadSource { binding: &src.bindings[2], lease: Some(&l2) },
        UploadSource { binding: &src.bindings[3], lease: None },
    ];
    let tx = Transaction::new(ws.clone(), plan.clone());
    // SAFETY: src's buffers outlive the call and are not written during it.
    unsafe { tx.upload_many(&src.placement, &srcs, guarded(&guard)) }.unwrap();
    assert_eq!(guard.pinned.load(Ordering::SeqCst), 2, "only the bindings without a lease are pinned");
    assert_eq!(*guard.released.lock(), vec![TerminalState::Completed; 2]);
    assert_eq!(*backend.registered.lock(), leased, "the call's registrations are gone, the leases' stay");
    assert_eq!(backend.batch_puts.load(Ordering::SeqCst), 1);
    // A lease over another binding's fragments is refused before any write.
    let writes = backend.writes();
    let wrong = vec![UploadSource { binding: &src.bindings[1], lease: Some(&l0) }];
    let tx2 = Transaction::new(ws.clone(), plan.clone());
    // SAFETY: as above.
    let e = unsafe { tx2.upload_many(&src.placement, &wrong, guarded(&guard)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleBinding, "{e}");
    assert_eq!(backend.writes(), writes);
    let m = tx.commit().unwrap();
    assert_eq!(m.fragments().len(), plan.operations().len());
    ws.close_registration_lease(&mut l0, TerminalState::Completed).unwrap();
    ws.close_registration_lease(&mut l2, TerminalState::Completed).unwrap();
}
