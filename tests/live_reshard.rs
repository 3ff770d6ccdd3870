//! End to end: a live reshard of a trainer layout TP4 x PP2 x EP2 x DP2 into a
//! serving layout TP2 x EP4 between two in-process "instances" through the embedded
//! `LocalEngine`, in both modes (sources push, targets pull), every byte verified,
//! and the coordinator's verdict computed from the receipts.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::StaticGuard;
use mooncake_weight_store::*;
use std::sync::Arc;

fn models() -> (HostModel, HostModel, TransferPlan) {
    trainer_server_plan(
        &model_tensors(4, 64, 8),
        Layout { tp: 4, pp: 2, ep: 2, dp: 2 },
        Layout { tp: 2, pp: 1, ep: 4, dp: 1 },
    )
}

/// Registers every allocation of `m` with `engine` (the owner's pre-registration)
/// and returns the matching evidence.
fn pre_register(engine: &LocalEngine, m: &HostModel) -> Vec<MemoryRegistrationLease> {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test and are unregistered below.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
    m.bindings
        .iter()
        .flat_map(|b| {
            b.fragments()
                .iter()
                .map(|f| MemoryRegistrationLease::from_fragment(f, b.lease_generation(), Some(b.lease_id())))
        })
        .collect()
}

fn unregister_all(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        assert_eq!(engine.unregister_memory(buf.as_ptr() as u64).unwrap(), 0);
    }
}

#[test]
fn live_reshard_sink_mode_every_byte() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    let leases = pre_register(&engine, &dst);
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let mut calls = Vec::new();
    let mut receipts = 0;
    for b in &src.bindings {
        // SAFETY: both models' buffers outlive the call; nothing else touches them.
        let r = unsafe { ex.execute_sink(&plan, &src.placement, b, &dst.placement, &dst.bindings, &args) };
        let r = r.unwrap();
        receipts += r.len();
        if plan.executors(Side::Source).iter().any(|e| e.participant_id == b.participant_id()) {
            calls.push(CallRecord {
                plan: plan.clone(),
                participant_id: b.participant_id().into(),
                worker_id: r.first().map(|x| x.worker_id.clone()).unwrap_or_else(|| b.participant_id().into()),
                result: Ok(r),
            });
        } else {
            assert!(r.is_empty(), "an unselected DP replica sends nothing");
        }
    }
    assert!(receipts > 0);
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    let verdict = target_outcomes(&plan, TransferMode::Sink, &calls);
    assert_eq!(verdict.len(), dst.bindings.len());
    assert!(verdict.values().all(|v| *v == TargetOutcome::Updated { weight_generation: 1 }), "{verdict:?}");
    unregister_all(&engine, &dst);
    assert_eq!(engine.registered_count(), 0, "the sink unregistered its own source memory");
}

#[test]
fn live_reshard_reader_mode_every_byte() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    let leases = pre_register(&engine, &src);
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let mut calls = Vec::new();
    for b in &dst.bindings {
        // SAFETY: both models' buffers outlive the call; nothing else touches them.
        let r = unsafe { ex.execute_reader(&plan, &src.placement, &src.bindings, &dst.placement, b, &args) }.unwrap();
        calls.push(CallRecord {
            plan: plan.clone(),
            participant_id: b.participant_id().into(),
            worker_id: b.participant_id().into(),
            result: Ok(r),
        });
    }
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    let verdict = target_outcomes(&plan, TransferMode::Reader, &calls);
    assert!(verdict.values().all(|v| *v == TargetOutcome::Updated { weight_generation: 1 }), "{verdict:?}");
    unregister_all(&engine, &src);
    assert_eq!(engine.registered_count(), 0);
}

#[test]
fn local_engine_refuses_unregistered_memory_and_device_memory_without_a_device_engine() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    // Targets not registered: the first batch is a known failure and nothing is written.
    let leases: Vec<_> = dst
        .bindings
        .iter()
        .flat_map(|b| {
            b.fragments()
                .iter()
                .map(|f| MemoryRegistrationLease::from_fragment(f, b.lease_generation(), Some(b.lease_id())))
        })
        .collect();
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let b = &src.bindings[0];
    // SAFETY: the buffers outlive the call.
    let e = unsafe { ex.execute_sink(&plan, &src.placement, b, &dst.placement, &dst.bindings, &args) }.unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionFailed);
    assert!(dst.buffers.iter().all(|buf| buf.iter().all(|&x| x == 0xA5)));
    assert_eq!(engine.registered_count(), 0, "own source registration released");
    // Device memory without a device engine is refused at registration, before any I/O.
    let r = MemoryRegion { address: 0x1000, len: 64, kind: MemoryKind::Device(0) };
    // SAFETY: refused; never touched.
    assert_ne!(unsafe { engine.register_memory(r) }.unwrap(), 0);
}

#[test]
fn live_reshard_threaded_local_engine_every_byte() {
    // Parallel copies (tiny threshold, large batches): same bytes as one thread.
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::with_threads(4, 1));
    let leases = pre_register(&engine, &dst);
    let limits = ExecutorLimits { max_batch_operations: 1 << 20, ..Default::default() };
    let ex = TransferExecutor::new(engine.clone(), limits).unwrap();
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    for b in &src.bindings {
        // SAFETY: both models' buffers outlive the call; nothing else touches them.
        unsafe { ex.execute_sink(&plan, &src.placement, b, &dst.placement, &dst.bindings, &args) }.unwrap();
    }
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    unregister_all(&engine, &dst);
}
