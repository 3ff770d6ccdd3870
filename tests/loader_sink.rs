//! The core's `Loader` and `Sink` (issue 25, item 2), through the Rust API alone: a
//! live reshard TP4 x PP2 x EP2 x DP2 -> TP2 x EP4 over the embedded engine in both
//! modes with a progress closure and the statistics, cancellation before a call and
//! in the middle of one (its report: submitted, guard release, per-target verdicts),
//! a stored restore through the loader, and the engine's resources afterwards (nothing
//! left registered by the library, nothing pending).

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::TransferEngine;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::{LoadArgs, Progress, ProgressPhase, StaticGuard, WeightStore};
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::sync::Arc;

fn models() -> (HostModel, HostModel, TransferPlan) {
    trainer_server_plan(
        &model_tensors(4, 64, 8),
        Layout { tp: 4, pp: 2, ep: 2, dp: 2 },
        Layout { tp: 2, pp: 1, ep: 4, dp: 1 },
    )
}

/// The owner's registration of every buffer of `m`.
fn register(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test and are unregistered below.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

fn unregister(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        assert_eq!(engine.unregister_memory(buf.as_ptr() as u64).unwrap(), 0);
    }
}

/// Collects progress reports.
fn recorder() -> (Arc<Mutex<Vec<Progress>>>, ProgressCallback) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (seen, Arc::new(move |p: &Progress| s.lock().push(*p)))
}

#[test]
fn sink_pushes_every_byte_with_progress_stats_and_a_report() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    register(&engine, &dst);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let (seen, cb) = recorder();
    sink.set_progress(Some(cb));
    let mut records = Vec::new();
    let mut bytes = 0;
    for b in &src.bindings {
        // SAFETY: both models' buffers outlive the call; nothing else touches them.
        let report =
            unsafe { sink.execute(&plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default()) }
                .unwrap();
        let planned = plan.executors(Side::Source).iter().find(|e| e.participant_id == b.participant_id());
        match planned {
            None => {
                assert!(report.receipts.is_empty() && report.targets.is_empty(), "an unselected replica sends nothing");
                assert!(!report.submitted);
                assert_eq!(report.guard_release, GuardRelease::NotPinned);
            }
            Some(e) => {
                assert!(report.submitted);
                assert_eq!(report.guard_release, GuardRelease::Completed);
                assert_eq!(report.stats, sink.stats());
                assert_eq!(report.stats.bytes, report.receipts.iter().map(|r| r.nbytes).sum::<u64>());
                assert_eq!(report.stats.regions, e.operation_indices.len() as u64);
                assert!(report.stats.engine_operations <= report.stats.operations);
                assert!(!report.targets.is_empty());
                for t in &report.targets {
                    assert_eq!(t.weight_generation, 1);
                    assert_eq!(t.outcome, TargetOutcome::Updated { weight_generation: 1 });
                }
                bytes += report.stats.bytes;
                records.push(CallRecord {
                    plan: plan.clone(),
                    participant_id: e.participant_id.clone(),
                    worker_id: e.worker_id.clone(),
                    result: Ok(report.receipts.clone()),
                });
            }
        }
        assert_eq!(sink.last_report().as_ref(), Some(&report));
    }
    assert_eq!(bytes, plan.total_bytes());
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    let verdict = target_outcomes(&plan, TransferMode::Sink, &records);
    assert!(verdict.values().all(|v| *v == TargetOutcome::Updated { weight_generation: 1 }), "{verdict:?}");
    let seen = seen.lock();
    assert!(seen.iter().all(|p| p.phase == ProgressPhase::Transfer && p.bytes_done <= p.bytes_total));
    assert!(seen.iter().any(|p| p.bytes_done == p.bytes_total && p.bytes_total > 0), "each call reports its end");
    unregister(&engine, &dst);
    let res = sink.executor().resources();
    assert_eq!(res.registered, Some(Vec::new()), "the sink unregistered its own source memory");
    assert!(res.pending.is_empty());
}

#[test]
fn loader_pulls_every_byte_and_cancellation_before_a_call_writes_nothing() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    register(&engine, &src);
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let (seen, cb) = recorder();
    loader.set_progress(Some(cb));

    // Cancelled before it starts: nothing submitted, every target of the call unchanged.
    loader.cancel_token().cancel();
    let first = &dst.bindings[0];
    // SAFETY: both models' buffers outlive the call; nothing else touches them.
    let err =
        unsafe { loader.load_live(&plan, &src.placement, &src.bindings, &dst.placement, first, &LiveArgs::default()) }
            .unwrap_err();
    assert!(err.error.message.contains("cancelled"), "{}", err.error.message);
    assert!(!err.report.submitted);
    assert_eq!(err.report.guard_release, GuardRelease::Aborted);
    assert_eq!(err.report.targets.len(), 1);
    assert_eq!(err.report.targets[0].participant_id, first.participant_id());
    assert_eq!(err.report.targets[0].outcome, TargetOutcome::Unchanged);
    assert_eq!(loader.stats(), TransferStats::default(), "a failed call records no statistics");
    assert!(dst.buffers.iter().all(|b| b.iter().all(|&x| x == 0xA5)), "nothing was written");

    loader.cancel_token().reset();
    let mut total = 0;
    for b in &dst.bindings {
        let args = LiveArgs { guard: Some(Arc::new(StaticGuard)), ..Default::default() };
        // SAFETY: as above.
        let report =
            unsafe { loader.load_live(&plan, &src.placement, &src.bindings, &dst.placement, b, &args) }.unwrap();
        assert!(report.submitted);
        assert_eq!(report.guard_release, GuardRelease::Completed);
        assert_eq!(report.targets.len(), 1);
        assert_eq!(report.targets[0].outcome, TargetOutcome::Updated { weight_generation: 1 });
        assert_eq!(loader.stats(), report.stats);
        total += report.stats.bytes;
    }
    assert_eq!(total, plan.total_bytes());
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    assert!(!seen.lock().is_empty());
    unregister(&engine, &src);
    let res = loader.executor().resources();
    assert_eq!(res.registered, Some(Vec::new()));
    assert!(res.pending.is_empty());
}

#[test]
fn cancellation_in_the_middle_of_a_call_reports_the_target_torn() {
    let (src, dst, plan) = models();
    let engine = Arc::new(LocalEngine::new());
    register(&engine, &src);
    // One engine operation per batch, so the call has many batches.
    let limits = ExecutorLimits { max_batch_operations: 1, ..Default::default() };
    let loader = Arc::new(Loader::new(engine.clone(), limits).unwrap());
    // The progress callback cancels after the first completed batch.
    let token = loader.cancel_token().clone();
    loader.set_progress(Some(Arc::new(move |p: &Progress| {
        if p.bytes_done > 0 {
            token.cancel();
        }
    })));
    let target = &dst.bindings[0];
    // SAFETY: both models' buffers outlive the call; nothing else touches them.
    let err =
        unsafe { loader.load_live(&plan, &src.placement, &src.bindings, &dst.placement, target, &LiveArgs::default()) }
            .unwrap_err();
    assert!(err.error.message.contains("cancelled"), "{}", err.error.message);
    assert!(err.error.submitted && err.report.submitted);
    assert_eq!(err.report.guard_release, GuardRelease::FailedDrained);
    assert!(err.report.pending_transfer_id.is_none());
    assert_eq!(err.report.targets.len(), 1);
    assert!(matches!(err.report.targets[0].outcome, TargetOutcome::Torn { .. }), "{:?}", err.report.targets);
    assert_eq!(loader.last_report().as_ref(), Some(&*err.report));
    assert!(dst.verify().is_err(), "the target is not complete");
    assert!(dst.buffers.iter().any(|b| b.iter().any(|&x| x != 0xA5)), "part of it was written before the cancellation");

    // Reset: the same call under the same plan now completes.
    loader.cancel_token().reset();
    loader.set_progress(None);
    // SAFETY: as above.
    let report =
        unsafe { loader.load_live(&plan, &src.placement, &src.bindings, &dst.placement, target, &LiveArgs::default()) }
            .unwrap();
    assert_eq!(report.targets[0].outcome, TargetOutcome::Updated { weight_generation: 1 });
    unregister(&engine, &src);
    assert_eq!(loader.executor().resources(), EngineResources { registered: Some(Vec::new()), pending: Vec::new() });
}

#[test]
fn loader_restores_from_a_store_with_cancellation_progress_and_stats() {
    let defs = model_tensors(2, 32, 0);
    let src = HostModel::new(build_placement("s", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let ws = WeightStore::new(Arc::new(MemoryStore::new()));
    let manifest = Arc::new(src.snapshot_into(&ws).unwrap());
    let dst = HostModel::new(build_placement("d", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let loader = Loader::new(Arc::new(LocalEngine::new()), ExecutorLimits::default()).unwrap();
    let (seen, cb) = recorder();
    loader.set_progress(Some(cb));
    let args = || LoadArgs { guard: Some(&StaticGuard), ..Default::default() };

    loader.cancel_token().cancel();
    // SAFETY: dst's buffers outlive the call and nobody else touches them.
    let e = unsafe { loader.load_stored(&ws, &plan, &dst.bindings[0], args()) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store);
    assert!(e.message().contains("cancelled"));
    assert!(seen.lock().is_empty(), "a cancelled restore does not start");

    loader.cancel_token().reset();
    // SAFETY: as above.
    let s = unsafe { loader.load_stored(&ws, &plan, &dst.bindings[0], args()) }.unwrap();
    assert_eq!(dst.verify().unwrap() as u64, s.bytes);
    let stats = loader.stats();
    assert_eq!((stats.bytes, stats.regions, stats.operations), (s.bytes, s.regions, s.ranges));
    assert!(seen.lock().iter().all(|p| p.phase == ProgressPhase::Restore));
    assert!(!seen.lock().is_empty());
}
