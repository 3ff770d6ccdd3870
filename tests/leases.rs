//! Registration leases (`store-protocol.md` §5.2; acceptance items 151 and 152):
//! register once, upload and load many times, close explicitly; failed
//! unregistration quarantines the pin until drained.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::guards::{weight_allocation_fence, AllocationFence};
use mooncake_weight_store::protocol::*;
use mooncake_weight_store::store::*;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A memory store that tracks registrations and can fail unregistration.
#[derive(Default)]
struct Tracking {
    inner: memory::MemoryStore,
    registered: Mutex<BTreeSet<u64>>,
    fail_unregister: AtomicBool,
}

impl ObjectStore for Tracking {
    fn put(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
        self.inner.put(k, v, c)
    }
    fn upsert(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
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
        let reg = self.registered.lock();
        assert!(items.iter().all(|i| reg.contains(&i.source.address)), "put from unregistered memory");
        drop(reg);
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.batch_put_from(items, c) }
    }
    unsafe fn get_into_ranges(&self, r: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.get_into_ranges(r) }
    }
    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        assert!(self.registered.lock().insert(region.address), "double registration");
        Ok(())
    }
    fn unregister_buffer(&self, address: u64) -> Result<()> {
        if self.fail_unregister.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Store, "unregister_buffer returned -9"));
        }
        assert!(self.registered.lock().remove(&address), "unregister of an unknown buffer");
        Ok(())
    }
}

/// A guard whose tokens record their releases.
#[derive(Default)]
struct Recording {
    released: Arc<Mutex<Vec<TerminalState>>>,
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
        let fence = weight_allocation_fence(expected, ids, transfer_id)?;
        Ok((expected.clone(), Box::new(Token(fence, self.released.clone(), false))))
    }
}

const ONE_RANK: Layout = Layout { tp: 1, pp: 1, ep: 1, dp: 1 };

/// A one-layer model held by one source rank.
fn one_rank_source() -> HostModel {
    HostModel::new(build_placement("src", ONE_RANK, &model_tensors(1, 16, 0), 1), true, "trainer", 1)
}

#[test]
fn acc_151_lease_keeps_pin_and_registration_across_uploads_until_close() {
    let src = one_rank_source();
    let backend = Arc::new(Tracking::default());
    let ws = WeightStore::new(backend.clone());
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let binding = &src.bindings[0];
    let guard = Recording::default();
    let ids: Vec<String> = plan.operations().iter().map(|o| o.source_snapshot().fragment_id().to_string()).collect();
    let mut lease = ws.register_weight_buffers(binding, &ids, &guard, "source", None).unwrap();
    assert_eq!(backend.registered.lock().len(), ids.len());
    for _ in 0..2 {
        let args = UploadArgs { lease: Some(&lease), ..Default::default() };
        // SAFETY: src.buffers outlive the call.
        let receipts = unsafe { ws.upload(&plan, &src.placement, binding, args) }.unwrap();
        assert_eq!(receipts.len(), ids.len());
        assert!(guard.released.lock().is_empty(), "the lease holds its pin");
        assert_eq!(backend.registered.lock().len(), ids.len(), "buffers stay registered");
    }
    ws.commit(&plan, &UploadReceipt::all_for(&plan), None).unwrap();
    ws.close_registration_lease(&mut lease, TerminalState::Completed).unwrap();
    assert_eq!(*guard.released.lock(), vec![TerminalState::Completed]);
    assert!(backend.registered.lock().is_empty());
    // A closed lease is refused, and closing again is a no-op.
    let args = UploadArgs { lease: Some(&lease), ..Default::default() };
    // SAFETY: as above.
    let err = unsafe { ws.upload(&plan, &src.placement, binding, args) }.unwrap_err();
    assert!(err.message().contains("lease is closed"), "{err}");
    ws.close_registration_lease(&mut lease, TerminalState::Completed).unwrap();
    assert_eq!(guard.released.lock().len(), 1);

    // Restore through a target lease as well.
    let manifest = Arc::new(ws.load_manifest(plan.manifest().manifest_key()).unwrap());
    let dst = HostModel::new(build_placement("dst", ONE_RANK, &model_tensors(1, 16, 0), 1), false, "serving", 1);
    let lp = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let tids: Vec<String> = dst.bindings[0].fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    let mut tlease = ws.register_weight_buffers(&dst.bindings[0], &tids, &guard, "target", None).unwrap();
    let args = LoadArgs { lease: Some(&tlease), ..Default::default() };
    // SAFETY: dst.buffers outlive the call.
    unsafe { ws.load(&lp, &dst.bindings[0], args) }.unwrap();
    dst.verify().unwrap();
    ws.close_registration_lease(&mut tlease, TerminalState::Completed).unwrap();
    assert!(backend.registered.lock().is_empty());
}

#[test]
fn acc_152_lease_close_failure_quarantines_until_drained() {
    let src = one_rank_source();
    let backend = Arc::new(Tracking::default());
    let ws = WeightStore::new(backend.clone());
    let guard = Recording::default();
    let binding = &src.bindings[0];
    let ids: Vec<String> = binding.fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    let mut lease = ws.register_weight_buffers(binding, &ids, &guard, "source", None).unwrap();
    backend.fail_unregister.store(true, Ordering::SeqCst);
    let err = ws.close_registration_lease(&mut lease, TerminalState::Completed).unwrap_err();
    assert!(err.message().contains("allocation lifetime is quarantined"), "{err}");
    assert!(lease.is_closed());
    let pending = ws.pending_registration_ids();
    assert_eq!(pending.len(), 1);
    assert!(guard.released.lock().is_empty(), "the pin stays held while quarantined");
    // New weight I/O is blocked while a registration is pending.
    let plan = ws.plan_upload(&src.placement, &src.bindings, &UploadOptions::default()).unwrap();
    let args = UploadArgs { guard: Some(&guard), ..Default::default() };
    // SAFETY: src.buffers outlive the call.
    let err = unsafe { ws.upload(&plan, &src.placement, binding, args) }.unwrap_err();
    assert!(err.message().contains("blocked by pending registration"), "{err}");
    assert!(ws.drain_pending_registration(&pending[0]).is_err());
    assert!(ws.drain_pending_registrations().is_err());
    assert_eq!(ws.pending_registration_ids(), pending);
    backend.fail_unregister.store(false, Ordering::SeqCst);
    ws.drain_pending_registrations().unwrap();
    // (The blocked upload failed before acquiring any pin.)
    assert_eq!(*guard.released.lock(), vec![TerminalState::Completed]);
    assert!(ws.pending_registration_ids().is_empty());
    assert!(backend.registered.lock().is_empty());
    ws.close_registration_lease(&mut lease, TerminalState::Completed).unwrap();
}

#[test]
fn shared_lease_is_refused_by_another_store_and_closed_when_dropped() {
    let src = one_rank_source();
    let backend = Arc::new(Tracking::default());
    let ws = Arc::new(WeightStore::new(backend.clone()));
    let guard = Recording::default();
    let binding = &src.bindings[0];
    let ids: Vec<String> = binding.fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    let lease =
        SharedLease::new(ws.clone(), ws.register_weight_buffers(binding, &ids, &guard, "source", None).unwrap());
    assert!(!backend.registered.lock().is_empty());
    assert!(lease.for_store(&ws).is_ok());
    let other = Arc::new(WeightStore::new(Arc::new(memory::MemoryStore::new())));
    let err = lease.for_store(&other).err().unwrap();
    assert_eq!(
        (err.kind(), err.message()),
        (ErrorKind::InvalidArgument, "the registration lease belongs to another store")
    );
    assert!(!lease.is_closed());
    drop(lease);
    assert!(backend.registered.lock().is_empty(), "dropping an open lease closes it");
    assert_eq!(*guard.released.lock(), vec![TerminalState::Aborted]);
    let closed =
        SharedLease::new(ws.clone(), ws.register_weight_buffers(binding, &ids, &guard, "source", None).unwrap());
    closed.close(TerminalState::Completed).unwrap();
    assert!(closed.is_closed());
    drop(closed);
    assert_eq!(*guard.released.lock(), vec![TerminalState::Aborted, TerminalState::Completed]);
}

#[test]
fn release_token_checks_the_observed_binding_and_aborts_a_failed_pin() {
    use mooncake_weight_store::protocol::guards::{ReleaseFn, ReleaseToken};
    let src = one_rank_source();
    let binding = &src.bindings[0];
    let ids: Vec<String> = binding.fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    let released: Arc<Mutex<Vec<TerminalState>>> = Arc::default();
    let release = || -> ReleaseFn {
        let r = released.clone();
        Box::new(move |state| {
            r.lock().push(state);
            Ok(())
        })
    };
    let (fresh, mut token) = ReleaseToken::checked(Ok(binding.clone()), &ids, "c-t1", release()).unwrap();
    assert_eq!(&fresh, binding);
    assert_eq!(*token.fence(), weight_allocation_fence(binding, &ids, "c-t1").unwrap());
    assert!(released.lock().is_empty());
    token.release(TerminalState::Completed).unwrap();
    assert_eq!(*released.lock(), vec![TerminalState::Completed]);
    // An observed binding without the guarded fragments: stale, and the pin is released.
    let missing = vec!["no-such-fragment".to_string()];
    let err = ReleaseToken::checked(Ok(binding.clone()), &missing, "c-t2", release()).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::StaleBinding);
    let err = ReleaseToken::checked(Err(Error::invalid("observed binding is invalid")), &ids, "c-t3", release());
    assert_eq!(err.err().unwrap().message(), "observed binding is invalid");
    assert_eq!(*released.lock(), vec![TerminalState::Completed, TerminalState::Aborted, TerminalState::Aborted]);
}

#[test]
fn subset_fences_are_cached_only_for_fragments_the_binding_holds() {
    let src = one_rank_source();
    let binding = &src.bindings[0];
    let mut ids: Vec<String> = binding.fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    ids.sort();
    assert!(ids.len() >= 2, "the source needs two fragments");
    let subset = ids[..ids.len() - 1].to_vec();
    let frags: Vec<&RuntimeFragment> =
        binding.fragments().iter().filter(|f| subset.iter().any(|i| i == f.fragment_id())).collect();
    let expected = mooncake_weight_store::runtime::fence_binding_digest(&frags);
    // First pin computes the digest, the second finds it kept: same fence.
    let first = weight_allocation_fence(binding, &subset, "t1").unwrap();
    assert_eq!(first.binding_digest, expected);
    assert_eq!(weight_allocation_fence(binding, &subset, "t1").unwrap(), first);
    // A subset with an id the binding lacks is an error, every time, even after a
    // caller asked for its digest directly (such a subset is never kept).
    let mut lacking = subset.clone();
    lacking.push("zz-no-such-fragment".to_string());
    for _ in 0..2 {
        let d = binding.fence_digest_subset(&lacking, || "0".repeat(64));
        assert_eq!(d, "0".repeat(64));
        let err = weight_allocation_fence(binding, &lacking, "t2").unwrap_err();
        assert!(err.message().contains("missing guarded fragments: zz-no-such-fragment"), "{}", err.message());
    }
}
