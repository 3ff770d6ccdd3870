//! Prepared live transfers on the embedded engine: prepare once, then every step
//! moves a new weight generation (new source bytes, every byte verified) in sink
//! and reader mode; and each refusal of stale prepared state (engine restart, new
//! instance, another placement, another lease or generation, moved buffers, freed
//! buffers, registrations held by a pending transfer, a closed transfer) happens
//! before any byte moves.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{
    CompletionStatus, EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket,
};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::guards::{weight_allocation_fence, AllocationFence};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::{GuardProvider, LifetimeToken, TerminalState};
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

fn models() -> (HostModel, HostModel, TransferPlan) {
    trainer_server_plan(
        &model_tensors(2, 64, 4),
        Layout { tp: 2, pp: 2, ep: 2, dp: 2 },
        Layout { tp: 4, pp: 1, ep: 1, dp: 1 },
    )
}

/// An engine whose identity can change (an engine restart) and whose ticketed
/// submissions can be made to fail with completion unknown.
struct TestEngine {
    inner: LocalEngine,
    identity: AtomicU64,
    unknown: AtomicBool,
    batches: AtomicUsize,
}

impl TestEngine {
    fn new() -> Arc<TestEngine> {
        let inner = LocalEngine::new();
        let id = inner.identity().unwrap();
        Arc::new(TestEngine {
            inner,
            identity: AtomicU64::new(id),
            unknown: AtomicBool::new(false),
            batches: AtomicUsize::new(0),
        })
    }
}

impl TransferEngine for TestEngine {
    fn identity(&self) -> std::result::Result<u64, String> {
        Ok(self.identity.load(Ordering::SeqCst))
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.register_memory(region) }
    }
    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        self.inner.unregister_memory(address)
    }
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.inner.batch_transfer_sync(batch)
    }
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        if self.unknown.load(Ordering::SeqCst) {
            return Some(Err(mooncake_weight_store::engine::EngineCallError::failed("lost")));
        }
        self.inner.submit_with_ticket(batch)
    }
    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        self.inner.registered_regions()
    }
}

fn register(engine: &dyn TransferEngine, m: &HostModel) {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test and are unregistered before drop.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

fn unregister(engine: &dyn TransferEngine, m: &HostModel) {
    for buf in &m.buffers {
        assert_eq!(engine.unregister_memory(buf.as_ptr() as u64).unwrap(), 0);
    }
}

/// Flips every byte of the source (a new weight generation in the same buffers).
fn next_generation(src: &mut HostModel) {
    for b in &mut src.buffers {
        for x in b.iter_mut() {
            *x ^= 0xFF;
        }
    }
}

/// Every target view holds its expected bytes XOR `mask`.
fn verify_masked(dst: &HostModel, mask: u8) {
    for v in &dst.views {
        let part = &dst.placement.parts()[v.0];
        let f = part.fragment(&v.1).unwrap();
        let t = dst.placement.tensor(f.tensor_id()).unwrap();
        let want: Vec<u8> =
            expected_bytes(t, f.global_offset(), f.local_shape()).into_iter().map(|b| b ^ mask).collect();
        assert_eq!(&dst.buffers[v.0][v.2..v.2 + v.3], &want[..], "{} {}", part.participant_id(), f.tensor_id());
    }
}

fn untouched(dst: &HostModel) -> bool {
    dst.buffers.iter().all(|b| b.iter().all(|&x| x == 0xA5))
}

fn reset(dst: &mut HostModel) {
    for b in &mut dst.buffers {
        b.fill(0xA5);
    }
}

fn step(g: u64) -> StepArgs<'static> {
    StepArgs { weight_generation: g, ..Default::default() }
}

#[test]
fn sink_prepared_once_moves_every_generation() {
    let (mut src, mut dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &dst);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let mut prepared = Vec::new();
    for b in &src.bindings {
        // SAFETY: both models' buffers outlive every step; nothing else touches them.
        let p = unsafe { sink.prepare(&plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default()) }
            .unwrap();
        let planned = plan.executors(Side::Source).iter().any(|e| e.participant_id == b.participant_id());
        assert_eq!(p.is_empty(), !planned, "an unselected DP replica prepares a transfer with nothing to do");
        let info = p.info();
        assert_eq!((info.empty, info.bytes), (p.is_empty(), p.total_bytes()));
        assert_eq!((info.batches, info.pinned_bindings), (p.batch_count() as u64, p.pinned_bindings() as u64));
        prepared.push(p);
    }
    assert!(untouched(&dst), "preparing moves no byte");
    let selected = prepared.iter().filter(|p| !p.is_empty()).count();
    let regions = engine.registered_regions().unwrap().len();
    assert_eq!(regions, dst.buffers.len() + selected, "the targets, and each selected source registered once");
    for g in 2..5u64 {
        let mask = if g % 2 == 0 { 0 } else { 0xFF };
        reset(&mut dst);
        let mut bytes = 0;
        for p in &prepared {
            // SAFETY: as above.
            let report = unsafe { p.step(&step(g)) }.unwrap();
            bytes += report.stats.bytes;
            for t in &report.targets {
                assert_eq!(t.outcome, TargetOutcome::Updated { weight_generation: g });
                assert_eq!(t.weight_generation, g);
            }
            assert_eq!(
                report.guard_release,
                if p.is_empty() { GuardRelease::NotPinned } else { GuardRelease::Completed }
            );
        }
        assert_eq!(bytes, plan.total_bytes());
        verify_masked(&dst, mask);
        assert!(sink.last_report().is_some(), "steps report through the sink");
        next_generation(&mut src);
    }
    assert_eq!(engine.registered_regions().unwrap().len(), regions, "steps register nothing");
    drop(prepared);
    unregister(&*engine, &dst);
    assert_eq!(engine.registered_regions().unwrap().len(), 0, "closing unregistered the sources");
}

#[test]
fn reader_prepared_once_moves_every_generation() {
    let (mut src, mut dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &src);
    let loader = Loader::new(engine.clone(), ExecutorLimits { max_batch_operations: 7, ..Default::default() }).unwrap();
    let prepared: Vec<PreparedTransfer> = dst
        .bindings
        .iter()
        .map(|b| {
            // SAFETY: both models' buffers outlive every step.
            unsafe {
                loader.prepare_live(&plan, &src.placement, &src.bindings, &dst.placement, b, &LiveArgs::default())
            }
            .unwrap()
        })
        .collect();
    assert!(prepared.iter().all(|p| p.batch_count() > 1), "small batches, lowered once");
    for g in [7u64, 8, 9] {
        reset(&mut dst);
        let before = engine.batches.load(Ordering::SeqCst);
        for (p, b) in prepared.iter().zip(&dst.bindings) {
            // SAFETY: as above.
            let report = unsafe { p.step(&step(g)) }.unwrap();
            assert_eq!(report.targets.len(), 1);
            assert_eq!(report.targets[0].participant_id, b.participant_id());
            assert_eq!(report.targets[0].outcome, TargetOutcome::Updated { weight_generation: g });
        }
        let batches: usize = prepared.iter().map(|p| p.batch_count()).sum();
        assert_eq!(engine.batches.load(Ordering::SeqCst) - before, batches);
        verify_masked(&dst, if g % 2 == 1 { 0 } else { 0xFF });
        next_generation(&mut src);
    }
    drop(prepared);
    unregister(&*engine, &src);
    assert_eq!(engine.registered_regions().unwrap().len(), 0);
}

/// A guard that reports what a test makes it observe (through `acquire`, so the
/// step checks the observed binding fragment by fragment).
#[derive(Default)]
struct ObservingGuard {
    /// (instance, participant) -> the binding observed under the pin from now on.
    observed: Mutex<Vec<(Key, RuntimeBinding)>>,
    /// (instance, participant) whose allocations are gone.
    freed: Mutex<Vec<Key>>,
    releases: Mutex<Vec<TerminalState>>,
    acquires: AtomicUsize,
}

type Key = (String, String);

fn key(b: &RuntimeBinding) -> Key {
    (b.instance_id().into(), b.participant_id().into())
}

struct Token(AllocationFence, Arc<ObservingGuard>);

impl LifetimeToken for Token {
    fn fence(&self) -> &AllocationFence {
        &self.0
    }
    fn release(&mut self, state: TerminalState) -> Result<()> {
        self.1.releases.lock().push(state);
        Ok(())
    }
}

struct GuardRef(Arc<ObservingGuard>);

impl GuardProvider for GuardRef {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        let g = &self.0;
        g.acquires.fetch_add(1, Ordering::SeqCst);
        if g.freed.lock().contains(&key(expected)) {
            return Err(Error::new(ErrorKind::StaleBinding, "allocation was freed"));
        }
        let fresh = g
            .observed
            .lock()
            .iter()
            .find(|(k, _)| *k == key(expected))
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| expected.clone());
        let fence = weight_allocation_fence(&fresh, required_ids, &format!("t-{transfer_id}"))?;
        Ok((fresh, Box::new(Token(fence, g.clone()))))
    }
}

fn rebuilt(
    b: &RuntimeBinding,
    placement: Option<(&str, &str)>,
    instance: Option<&str>,
    lease: Option<(&str, u64)>,
    delta: u64,
) -> RuntimeBinding {
    let frags = b
        .fragments()
        .iter()
        .map(|f| {
            RuntimeFragment::new(RuntimeFragmentSpec {
                placement_fragment_id: f.placement_fragment_id().into(),
                fragment_id: f.fragment_id().into(),
                address: f.address() + delta,
                nbytes: f.nbytes(),
                worker_id: f.worker_id().into(),
                endpoint: f.endpoint().into(),
                device: f.device().into(),
                itemsize: f.itemsize(),
                local_shape: f.local_shape().to_vec(),
                strides_bytes: f.strides_bytes().to_vec(),
                storage_address: f.storage_address() + delta,
                storage_nbytes: f.storage_nbytes(),
                storage_offset_bytes: f.storage_offset_bytes(),
                memory: f.memory(),
            })
            .unwrap()
        })
        .collect();
    let (pid, digest) = placement.unwrap_or((b.placement_id(), b.placement_digest()));
    let (lease_id, generation) = lease.unwrap_or((b.lease_id(), b.lease_generation()));
    RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: b.resource_id().into(),
        placement_id: pid.into(),
        placement_digest: digest.into(),
        instance_id: instance.unwrap_or(b.instance_id()).into(),
        lease_generation: generation,
        lease_id: lease_id.into(),
        revision: b.revision().into(),
        participant_id: b.participant_id().into(),
        fragments: frags,
    })
    .unwrap()
}

/// Sink mode on one source worker, with an observing guard: one step works, then
/// each stale observation is refused before any byte moves, and the verdict says
/// the targets are unchanged.
#[test]
fn every_staleness_is_refused_before_a_byte_moves() {
    let (src, mut dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &dst);
    let guard = Arc::new(ObservingGuard::default());
    let args = LiveArgs { guard: Some(Arc::new(GuardRef(guard.clone()))), ..Default::default() };
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = src
        .bindings
        .iter()
        .find(|b| plan.executors(Side::Source).iter().any(|e| e.participant_id == b.participant_id()))
        .unwrap()
        .clone();
    // SAFETY: the models outlive the prepared transfer.
    let p = unsafe { sink.prepare(&plan, &src.placement, &local, &dst.placement, &dst.bindings, &args) }.unwrap();
    let pins = p.pinned_bindings();
    assert_eq!(pins, 1 + dst.bindings.len(), "the source and every planned target");
    let before = guard.acquires.load(Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { p.step(&step(2)) }.unwrap();
    assert_eq!(guard.acquires.load(Ordering::SeqCst) - before, pins, "one pin per binding per step");
    assert!(!untouched(&dst));
    let target = dst.bindings[1].clone();
    let other_placement = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let other_digest = "0000000000000000000000000000000000000000000000000000000000000000";
    type Case<'a> = (&'a str, Box<dyn Fn() + 'a>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "another placement",
            Box::new(|| {
                let b = rebuilt(&target, Some((other_placement, other_digest)), None, None, 0);
                guard.observed.lock().push((key(&target), b));
            }),
            "acquired runtime binding placement_id differs from plan",
        ),
        (
            "a new instance",
            Box::new(|| {
                let b = rebuilt(&target, None, Some("serving-restarted"), None, 0);
                guard.observed.lock().push((key(&target), b));
            }),
            "acquired runtime binding instance_id differs from plan",
        ),
        (
            "another lease",
            Box::new(|| {
                let b = rebuilt(&target, None, None, Some(("serving-lease-2", 2)), 0);
                guard.observed.lock().push((key(&target), b));
            }),
            "acquired runtime binding generation differs from plan",
        ),
        (
            "moved buffers",
            Box::new(|| {
                let b = rebuilt(&target, None, None, None, 4096);
                guard.observed.lock().push((key(&target), b));
            }),
            "acquired runtime binding address differs from plan",
        ),
        ("freed buffers", Box::new(|| guard.freed.lock().push(key(&target))), "allocation was freed"),
    ];
    for (what, make_stale, message) in cases {
        guard.observed.lock().clear();
        guard.freed.lock().clear();
        make_stale();
        reset(&mut dst);
        guard.releases.lock().clear();
        // SAFETY: as above (nothing runs).
        let e = unsafe { p.step(&step(3)) }.unwrap_err();
        assert_eq!(e.error.error_kind, ErrorKind::StaleBinding, "{what}: {}", e.error);
        assert!(e.error.message.starts_with("prepared transfer is stale: "), "{what}: {}", e.error);
        assert!(e.error.message.contains(message), "{what}: {}", e.error);
        assert!(e.error.message.ends_with("; prepare the transfer again"), "{what}: {}", e.error);
        assert!(e.error.message.contains(target.participant_id()), "{what}: {}", e.error);
        assert!(untouched(&dst), "{what}: no byte moved");
        assert!(!e.report.submitted, "{what}");
        assert_eq!(e.report.guard_release, GuardRelease::Aborted, "{what}");
        assert!(guard.releases.lock().iter().all(|s| *s == TerminalState::Aborted), "{what}");
        assert!(e.report.targets.iter().all(|t| t.outcome == TargetOutcome::Unchanged), "{what}");
    }
    // The observation back to normal: the same prepared transfer steps again.
    guard.observed.lock().clear();
    guard.freed.lock().clear();
    reset(&mut dst);
    // SAFETY: as above.
    unsafe { p.step(&step(4)) }.unwrap();
    assert!(!untouched(&dst));
}

/// A rotated lease is accepted when the guard observes it, and refused when the
/// guard still observes the old one; a rotation that names a participant under
/// another instance is a new instance; one that names nothing is a contract error.
#[test]
fn lease_rotations() {
    let (src, mut dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &src);
    let guard = Arc::new(ObservingGuard::default());
    let args = LiveArgs { guard: Some(Arc::new(GuardRef(guard.clone()))), ..Default::default() };
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = dst.bindings[0].clone();
    // SAFETY: the models outlive the prepared transfer.
    let p =
        unsafe { loader.prepare_live(&plan, &src.placement, &src.bindings, &dst.placement, &local, &args) }.unwrap();
    let rotation = [LeaseRotation {
        instance_id: local.instance_id(),
        participant_id: local.participant_id(),
        lease_id: "serving-lease-9",
        lease_generation: 9,
    }];
    let with_rotation =
        StepArgs { weight_generation: 5, leases: &rotation, transfer_id: None, notify: None, delta: None };
    // The guard still sees the old lease: refused, and the rotation is not kept.
    guard.observed.lock().push((key(&local), local.clone()));
    // SAFETY: as above.
    let e = unsafe { p.step(&with_rotation) }.unwrap_err();
    assert!(e.error.message.contains("acquired runtime binding generation differs from plan"), "{}", e.error);
    assert!(untouched(&dst));
    // SAFETY: as above.
    unsafe { p.step(&step(5)) }.unwrap();
    guard.observed.lock().clear();
    // The owner rotated: the guard observes the new lease; the rotation holds for later steps.
    let rotated = local.with_lease("serving-lease-9", 9).unwrap();
    guard.observed.lock().push((key(&local), rotated));
    reset(&mut dst);
    // SAFETY: as above.
    unsafe { p.step(&with_rotation) }.unwrap();
    assert!(!untouched(&dst));
    // SAFETY: as above.
    unsafe { p.step(&step(6)) }.unwrap();
    // A rotation under another instance of a prepared participant: a new instance.
    let moved = [LeaseRotation { instance_id: "serving-2", ..rotation[0] }];
    reset(&mut dst);
    // SAFETY: as above.
    let e = unsafe {
        p.step(&StepArgs { weight_generation: 7, leases: &moved, transfer_id: None, notify: None, delta: None })
    }
    .unwrap_err();
    assert_eq!(e.error.error_kind, ErrorKind::StaleBinding);
    assert!(e.error.message.contains("now runs as instance serving-2"), "{}", e.error);
    assert!(e.error.message.ends_with("prepare the transfer again"), "{}", e.error);
    // A rotation naming nothing prepared.
    let unknown = [LeaseRotation { participant_id: "nobody", instance_id: "nowhere", ..rotation[0] }];
    // SAFETY: as above.
    let e = unsafe {
        p.step(&StepArgs { weight_generation: 7, leases: &unknown, transfer_id: None, notify: None, delta: None })
    }
    .unwrap_err();
    assert_eq!(e.error.kind, TransferErrorKind::Contract);
    assert!(e.error.message.contains("lease rotation names no binding"), "{}", e.error);
    assert!(untouched(&dst));
}

/// The static guard vouches for the prepared bindings in O(1): a rotation is taken
/// on the caller's word.
#[test]
fn static_guard_takes_a_rotation_on_the_callers_word() {
    let (src, dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &src);
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = dst.bindings[2].clone();
    // SAFETY: the models outlive the prepared transfer.
    let p = unsafe {
        loader.prepare_live(&plan, &src.placement, &src.bindings, &dst.placement, &local, &LiveArgs::default())
    }
    .unwrap();
    let rotation = [LeaseRotation {
        instance_id: src.bindings[0].instance_id(),
        participant_id: src.bindings[0].participant_id(),
        lease_id: "trainer-lease-2",
        lease_generation: 2,
    }];
    // SAFETY: as above.
    let r = unsafe {
        p.step(&StepArgs { weight_generation: 2, leases: &rotation, transfer_id: None, notify: None, delta: None })
    }
    .unwrap();
    assert_eq!(r.targets[0].outcome, TargetOutcome::Updated { weight_generation: 2 });
}

#[test]
fn an_engine_restart_is_refused_and_closing_after_it_unregisters_nothing() {
    let (src, dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &dst);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = src
        .bindings
        .iter()
        .find(|b| plan.executors(Side::Source).iter().any(|e| e.participant_id == b.participant_id()))
        .unwrap();
    // SAFETY: the models outlive the prepared transfer.
    let p = unsafe { sink.prepare(&plan, &src.placement, local, &dst.placement, &dst.bindings, &LiveArgs::default()) }
        .unwrap();
    let registered = engine.registered_regions().unwrap().len();
    assert_eq!(registered, dst.buffers.len() + 1);
    engine.identity.fetch_add(1000, Ordering::SeqCst);
    // SAFETY: as above.
    let e = unsafe { p.step(&step(2)) }.unwrap_err();
    assert_eq!(e.error.error_kind, ErrorKind::StaleBinding);
    assert!(e.error.message.contains("the transfer engine restarted since the transfer was prepared"), "{}", e.error);
    assert!(e.error.message.ends_with("; prepare the transfer again"));
    assert!(untouched(&dst));
    assert_eq!(engine.batches.load(Ordering::SeqCst), 0);
    p.close().unwrap();
    assert_eq!(
        engine.registered_regions().unwrap().len(),
        registered,
        "the restarted engine's registrations are not ours to unregister"
    );
}

#[test]
fn completion_unknown_hands_the_registrations_over_and_later_steps_are_refused() {
    let (src, dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &dst);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = src
        .bindings
        .iter()
        .find(|b| plan.executors(Side::Source).iter().any(|e| e.participant_id == b.participant_id()))
        .unwrap();
    // SAFETY: the models outlive the prepared transfer (and its pending transfer).
    let p = unsafe { sink.prepare(&plan, &src.placement, local, &dst.placement, &dst.bindings, &LiveArgs::default()) }
        .unwrap();
    engine.unknown.store(true, Ordering::SeqCst);
    // SAFETY: as above.
    let e = unsafe { p.step(&step(2)) }.unwrap_err();
    assert_eq!(e.error.kind, TransferErrorKind::CompletionUnknown);
    let id = e.report.pending_transfer_id.clone().unwrap();
    assert_eq!(e.report.guard_release, GuardRelease::Pending);
    assert!(e.report.targets.iter().all(|t| matches!(t.outcome, TargetOutcome::Torn { .. })));
    let held = sink.executor().resources().pending;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].registrations.len(), 1, "the prepared source registration went to the pending transfer");
    engine.unknown.store(false, Ordering::SeqCst);
    // SAFETY: as above.
    let e = unsafe { p.step(&step(3)) }.unwrap_err();
    assert_eq!(e.error.error_kind, ErrorKind::StaleBinding);
    assert!(e.error.message.contains(&format!("held by pending transfer {id}")), "{}", e.error);
    drop(p);
    // Restart-required (no ticket): the entry stays; nothing was unregistered twice.
    assert_eq!(sink.executor().pending_transfer_ids(), vec![id]);
}

#[test]
fn a_closed_transfer_refuses_steps_and_cancellation_stops_a_step() {
    let (src, dst, plan) = models();
    let engine = TestEngine::new();
    register(&*engine, &src);
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let local = dst.bindings[0].clone();
    // SAFETY: the models outlive the prepared transfer.
    let p = unsafe {
        loader.prepare_live(&plan, &src.placement, &src.bindings, &dst.placement, &local, &LiveArgs::default())
    }
    .unwrap();
    loader.cancel_token().cancel();
    // SAFETY: as above.
    let e = unsafe { p.step(&step(2)) }.unwrap_err();
    assert!(e.error.message.contains("cancelled"), "{}", e.error);
    assert!(!e.report.submitted);
    assert!(untouched(&dst));
    loader.cancel_token().reset();
    p.close().unwrap();
    // SAFETY: as above.
    let e = unsafe { p.step(&step(2)) }.unwrap_err();
    assert_eq!(e.error.message, "prepared transfer is closed");
    assert_eq!(engine.registered_regions().unwrap().len(), src.buffers.len(), "the target registration is gone");
}

/// The stored source: a server prepared once restores, step after step, the weight
/// generation a trainer committed (same layout, new bytes), given only that
/// generation; a generation of another layout, one never committed, and freed
/// buffers are refused before any byte moves.
#[test]
fn stored_source_restores_every_generation_prepared_once() {
    use mooncake_weight_store::protocol::WeightStore;
    use mooncake_weight_store::store::memory::MemoryStore;
    let defs = model_tensors(2, 32, 0);
    let ws = Arc::new(WeightStore::new(Arc::new(MemoryStore::new())));
    let trainer = |generation: u64, flip: bool| {
        let layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
        let mut m = HostModel::new(build_placement("trainer", layout, &defs, generation), true, "trainer", 1);
        if flip {
            next_generation(&mut m);
        }
        m.snapshot_into(&ws).unwrap()
    };
    let first = Arc::new(trainer(1, false));
    let mut dst =
        HostModel::new(build_placement("serving", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    let plan = ws.plan_load(first, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let loader = Loader::new(Arc::new(LocalEngine::new()), ExecutorLimits::default()).unwrap();
    let guard = Arc::new(ObservingGuard::default());
    let args = StoredPrepareArgs { guard: Some(Arc::new(GuardRef(guard.clone()))), ..Default::default() };
    let p = loader.prepare_stored(ws.clone(), &plan, &dst.bindings[0], args).unwrap();
    let want = PreparedInfo { empty: false, batches: 0, pinned_bindings: 1, bytes: plan.total_bytes() };
    assert_eq!(p.info(), want);
    let step = |g: u64| StoredStepArgs { weight_generation: g, ..Default::default() };
    // SAFETY: dst's buffers outlive the prepared restore; nobody else touches them.
    let s = unsafe { p.step(&step(1)) }.unwrap();
    assert_eq!(s.bytes, plan.total_bytes());
    verify_masked(&dst, 0);
    for g in [2u64, 3] {
        trainer(g, g == 2);
        reset(&mut dst);
        // SAFETY: as above.
        let s = unsafe { p.step(&step(g)) }.unwrap();
        assert_eq!(s.bytes, plan.total_bytes());
        verify_masked(&dst, if g == 2 { 0xFF } else { 0 });
        assert_eq!(loader.stats().bytes, s.bytes);
    }
    // Never committed.
    reset(&mut dst);
    // SAFETY: as above.
    let e = unsafe { p.step(&step(9)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(untouched(&dst));
    // Another layout under the same resource: a revision of a bigger model.
    let other = model_tensors(3, 32, 0);
    let mut m =
        HostModel::new(build_placement("trainer", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &other, 4), true, "t", 1);
    next_generation(&mut m);
    m.snapshot_into(&ws).unwrap();
    // SAFETY: as above.
    let e = unsafe { p.step(&step(4)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleBinding);
    assert!(e.message().contains("holds another layout") && e.message().ends_with("prepare the transfer again"), "{e}");
    assert!(untouched(&dst));
    // Freed buffers, as the guard observes them.
    guard.freed.lock().push(key(&dst.bindings[0]));
    // SAFETY: as above.
    let e = unsafe { p.step(&step(3)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleBinding);
    assert!(e.message().contains("allocation was freed") && e.message().ends_with("prepare the transfer again"), "{e}");
    assert!(untouched(&dst));
    guard.freed.lock().clear();
    // Cancellation before a step.
    loader.cancel_token().cancel();
    // SAFETY: as above.
    assert!(unsafe { p.step(&step(3)) }.unwrap_err().message().contains("cancelled"));
    loader.cancel_token().reset();
    // SAFETY: as above.
    unsafe { p.step(&step(3)) }.unwrap();
    verify_masked(&dst, 0);
}

/// `check_fresh` over every path it takes: the same binding observed again (one
/// shared fragment list), an equal binding rebuilt fragment by fragment, and moved
/// buffers, each with the required ids sorted (as providers are handed them) and in
/// another order, for every fragment and for a subset.
#[test]
fn a_fresh_binding_is_compared_fragment_by_fragment_whatever_the_id_order() {
    use mooncake_weight_store::protocol::guards::check_fresh;
    let (_, dst, _) = models();
    let expected = dst.bindings[0].clone();
    let guard = Arc::new(ObservingGuard::default());
    let mut all: Vec<String> = expected.fragments().iter().map(|f| f.fragment_id().to_string()).collect();
    all.sort();
    assert!(all.len() >= 3, "the case needs a subset");
    let subset: Vec<String> = all[1..].to_vec();
    let check = |fresh: &RuntimeBinding, ids: &[String]| {
        let fence = weight_allocation_fence(fresh, ids, "token").unwrap();
        check_fresh("target", &expected, ids, fresh, &Token(fence, guard.clone())).map_err(|e| e.message().to_string())
    };
    let equal = rebuilt(&expected, None, None, None, 0);
    let moved = rebuilt(&expected, None, None, None, 4096);
    assert!(!equal.shares_fragments(&expected) && expected.clone().shares_fragments(&expected));
    for ids in [all.clone(), subset.clone()] {
        let mut reversed = ids.clone();
        reversed.reverse();
        for order in [&ids, &reversed] {
            assert_eq!(check(&expected.clone(), order), Ok(()));
            assert_eq!(check(&equal, order), Ok(()));
            assert_eq!(check(&moved, order), Err("acquired runtime binding address differs from plan".to_string()));
        }
    }
}

/// An engine whose ticketed batches report `CompletionUnknown` while `hold` is set
/// (their bytes land at submission), or that has no ticketed call at all.
struct HeldEngine {
    inner: LocalEngine,
    hold: Arc<AtomicBool>,
    ticketless: bool,
    submitted: AtomicUsize,
}

struct HeldTicket {
    status: CompletionStatus,
    hold: Arc<AtomicBool>,
}

impl TransferTicket for HeldTicket {
    fn status(&self) -> EngineResult<CompletionStatus> {
        Ok(if self.hold.load(Ordering::SeqCst) { CompletionStatus::CompletionUnknown } else { self.status.clone() })
    }
    fn drain(&self, timeout_ms: u64) -> EngineResult<CompletionStatus> {
        std::thread::sleep(std::time::Duration::from_millis(timeout_ms.min(5)));
        self.status()
    }
}

impl HeldEngine {
    fn new(ticketless: bool) -> Arc<HeldEngine> {
        Arc::new(HeldEngine {
            inner: LocalEngine::new(),
            hold: Arc::new(AtomicBool::new(false)),
            ticketless,
            submitted: AtomicUsize::new(0),
        })
    }
}

impl TransferEngine for HeldEngine {
    fn identity(&self) -> std::result::Result<u64, String> {
        self.inner.identity()
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.register_memory(region) }
    }
    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        self.inner.unregister_memory(address)
    }
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        while self.hold.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.inner.batch_transfer_sync(batch)
    }
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        if self.ticketless {
            return None;
        }
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let status = self.inner.submit_with_ticket(batch)?.ok()?.status().ok()?;
        Some(Ok(Box::new(HeldTicket { status, hold: self.hold.clone() })))
    }
    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        self.inner.registered_regions()
    }
}

/// The selected source replicas' prepared transfers of a sink on `engine` (in Arcs,
/// as started steps need).
fn prepared_sinks(
    engine: Arc<dyn TransferEngine>,
    limits: ExecutorLimits,
    src: &HostModel,
    dst: &HostModel,
    plan: &TransferPlan,
) -> (Sink, Vec<Arc<PreparedTransfer>>) {
    let sink = Sink::new(engine, limits).unwrap();
    let mut out = Vec::new();
    for b in &src.bindings {
        // SAFETY: the models outlive every step of the tests; nothing else touches them.
        let p = unsafe { sink.prepare(plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default()) }
            .unwrap();
        if !p.is_empty() {
            out.push(Arc::new(p));
        }
    }
    (sink, out)
}

const LONG: Option<std::time::Duration> = Some(std::time::Duration::from_secs(20));

/// Started steps move every generation as blocking steps do (same receipts, same
/// verdicts, every byte), run their callbacks once, and report through the sink;
/// on an engine without ticketed calls too.
#[test]
fn started_steps_move_every_generation_as_blocking_steps_do() {
    for ticketless in [false, true] {
        let (mut src, mut dst, plan) = models();
        let engine = HeldEngine::new(ticketless);
        register(&*engine, &dst);
        let (sink, prepared) = prepared_sinks(engine.clone(), ExecutorLimits::default(), &src, &dst, &plan);
        let calls = Arc::new(AtomicUsize::new(0));
        for g in 2..6u64 {
            let mask = if g % 2 == 0 { 0 } else { 0xFF };
            reset(&mut dst);
            let (mut bytes, mut handles) = (0, Vec::new());
            for p in &prepared {
                let seen = calls.clone();
                let callback: StepCallback = Box::new(move |r: &StepResult| {
                    assert!(r
                        .as_ref()
                        .unwrap()
                        .targets
                        .iter()
                        .all(|t| t.outcome == TargetOutcome::Updated { weight_generation: g }));
                    seen.fetch_add(1, Ordering::SeqCst);
                });
                // Steps on one engine are serialized by its fence: one at a time.
                // SAFETY: both models outlive the step, which ends before the next.
                let h = unsafe { p.start_step(&step(g), Some(callback)) };
                let report = h.wait(LONG).expect("the step ended").unwrap();
                assert!(h.is_finished());
                assert_eq!(h.poll().unwrap().unwrap(), report, "poll gives the same outcome");
                bytes += report.stats.bytes;
                assert_eq!(report.guard_release, GuardRelease::Completed);
                if g == 2 {
                    // The same step, blocking: the same receipts and verdicts.
                    // SAFETY: as above.
                    let blocking = unsafe { p.step(&step(g)) }.unwrap();
                    assert_eq!(
                        (blocking.receipts.clone(), blocking.targets.clone()),
                        (report.receipts, report.targets)
                    );
                }
                assert_eq!(sink.last_report().unwrap().targets[0].weight_generation, g, "reported through the sink");
                handles.push(h);
            }
            assert_eq!(bytes, plan.total_bytes());
            verify_masked(&dst, mask);
            next_generation(&mut src);
        }
        // A callback runs after its step's outcome is published: a wait may return first.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < 4 * prepared.len() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4 * prepared.len(), "each callback ran once");
        drop(prepared);
        unregister(&*engine, &dst);
        assert_eq!(engine.registered_regions().unwrap().len(), 0, "closing unregistered the sources");
    }
}

/// A started step follows its batch's ticket without blocking: poll and a short
/// wait say "running" while the engine holds the batch; a second step of the same
/// prepared transfer is refused; cancelling stops it before its next batch; a
/// blocking step waits for it; dropping the handle lets it run to its end.
#[test]
fn a_started_step_follows_the_engine_and_can_be_polled_cancelled_and_dropped() {
    let (src, dst, plan) = models();
    let engine = HeldEngine::new(false);
    register(&*engine, &dst);
    let (_sink, prepared) = prepared_sinks(engine.clone(), ExecutorLimits::default(), &src, &dst, &plan);
    let p = prepared.iter().find(|p| p.batch_count() >= 2).expect("a transfer of several batches").clone();
    engine.hold.store(true, Ordering::SeqCst);
    // SAFETY: the models outlive every step of the test.
    let h = unsafe { p.start_step(&step(7), None) };
    while engine.submitted.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    assert!(h.poll().is_none() && !h.is_finished(), "running while the engine holds its batch");
    assert!(h.wait(Some(std::time::Duration::from_millis(20))).is_none(), "a short wait times out");
    // SAFETY: as above.
    let second = unsafe { p.start_step(&step(8), None) }.wait(LONG).unwrap().unwrap_err();
    assert_eq!(second.error.kind, TransferErrorKind::Contract);
    assert!(second.error.message.contains("a step of this prepared transfer is running"), "{}", second.error);
    h.cancel();
    engine.hold.store(false, Ordering::SeqCst);
    let e = h.wait(LONG).unwrap().unwrap_err();
    assert!(e.error.message.contains("cancelled"), "{}", e.error);
    assert!(e.report.submitted);
    assert!(e.report.targets.iter().all(|t| matches!(t.outcome, TargetOutcome::Torn { .. })));
    assert_eq!(engine.submitted.load(Ordering::SeqCst), 1, "nothing was submitted after the cancellation");
    // A dropped handle's step runs to its end; a blocking step waits for it.
    engine.hold.store(true, Ordering::SeqCst);
    // SAFETY: as above.
    drop(unsafe { p.start_step(&step(9), None) });
    let release = {
        let hold = engine.hold.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            hold.store(false, Ordering::SeqCst);
        })
    };
    // SAFETY: as above.
    let report = unsafe { p.step(&step(10)) }.unwrap();
    release.join().unwrap();
    assert!(report.targets.iter().all(|t| t.outcome == TargetOutcome::Updated { weight_generation: 10 }));
    assert_eq!(engine.submitted.load(Ordering::SeqCst), 1 + 2 * p.batch_count(), "step 9 ran all its batches");
}

/// A started step whose batch never completes ends as a blocking step does once
/// the drain budget is spent: completion unknown, a pending transfer holding the
/// registrations, Torn targets.
#[test]
fn a_started_step_that_never_completes_hands_over_to_a_pending_transfer() {
    let (src, dst, plan) = models();
    let engine = HeldEngine::new(false);
    register(&*engine, &dst);
    let limits =
        ExecutorLimits { max_completion_drain_attempts: 2, completion_drain_timeout_ms: 10, ..Default::default() };
    let (sink, prepared) = prepared_sinks(engine.clone(), limits, &src, &dst, &plan);
    engine.hold.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    // SAFETY: the models outlive the step and its pending transfer.
    let e = unsafe { prepared[0].start_step(&step(3), None) }.wait(LONG).unwrap().unwrap_err();
    assert!(started.elapsed() >= std::time::Duration::from_millis(20), "the drain budget was waited for");
    assert_eq!(e.error.kind, TransferErrorKind::CompletionUnknown);
    assert_eq!(e.report.guard_release, GuardRelease::Pending);
    assert!(e.report.targets.iter().all(|t| matches!(t.outcome, TargetOutcome::Torn { .. })));
    assert_eq!(sink.executor().pending_transfer_ids(), vec![e.report.pending_transfer_id.clone().unwrap()]);
    engine.hold.store(false, Ordering::SeqCst);
}

/// Plain calls start without blocking too: a sink's execute and a reader's
/// load_live, each prepared on the caller and stepped once on the step driver, move
/// every byte, report the plan's generation, and leave no registration behind.
#[test]
fn plain_calls_start_without_blocking() {
    let (src, mut dst, plan) = models();
    let engine = HeldEngine::new(false);
    register(&*engine, &dst);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    for b in &src.bindings {
        // SAFETY: the models outlive the call, which ends before the next.
        let h = unsafe {
            sink.start_execute(&plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default(), None)
        }
        .unwrap();
        let report = h.wait(LONG).unwrap().unwrap();
        let g = plan.weight_generation();
        assert!(report.targets.iter().all(|t| t.outcome == TargetOutcome::Updated { weight_generation: g }));
    }
    verify_masked(&dst, 0);
    assert_eq!(engine.registered_regions().unwrap().len(), dst.buffers.len(), "the sources were unregistered");
    unregister(&*engine, &dst);
    reset(&mut dst);
    register(&*engine, &src);
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    for b in &dst.bindings {
        // SAFETY: as above.
        let h = unsafe {
            loader.start_load_live(&plan, &src.placement, &src.bindings, &dst.placement, b, &LiveArgs::default(), None)
        }
        .unwrap();
        h.wait(LONG).unwrap().unwrap();
    }
    verify_masked(&dst, 0);
    assert_eq!(engine.registered_regions().unwrap().len(), src.buffers.len(), "the targets were unregistered");
    // A refused preparation starts nothing.
    let bad = LiveArgs { worker_id: Some("no such worker"), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe {
        loader.start_load_live(&plan, &src.placement, &src.bindings, &dst.placement, &dst.bindings[0], &bad, None)
    };
    assert!(e.is_err());
    unregister(&*engine, &src);
}
