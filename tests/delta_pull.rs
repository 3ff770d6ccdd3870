//! Issue 47, pulled: sparse delta steps of prepared readers. The source side
//! publishes each generation (`DeltaPublisher`: the changes against what it
//! published before, and the checksums of the new bytes) into an outbox the readers
//! read; a delta-enabled reader pulls only the changes when it holds the base,
//! applies them and verifies its ranges against the publication before it reports
//! Updated; every target byte equals the source's. Full whenever in doubt: the first
//! step, a restarted reader, a skipped generation, a failed or torn step, a
//! publication without a delta (its slot too small); a reader that steps before the
//! publication of its generation is refused before any byte moves; a corrupted
//! target base and a source written after it published are caught as Torn, and the
//! next (full) step repairs them.

#[path = "common/delta_rig.rs"]
mod delta_rig;
#[path = "common/model.rs"]
mod model;

use delta_rig::*;
use model::*;
use mooncake_weight_store::engine::{MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::delta_pull::{self, PUBLICATION_HEADER_BYTES};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::*;
use std::sync::Arc;

/// Trainer TP2 x PP2 x DP2 published to a server TP4 x EP2 that pulls (bf16).
struct Rig {
    src: HostModel,
    dst: HostModel,
    plan: TransferPlan,
    engine: Arc<MailEngine>,
    loader: Loader,
    publishers: Vec<DeltaPublisher>,
    readers: Vec<PreparedTransfer>,
    rng: Rng,
}

impl Rig {
    /// `outbox_fraction`: each publisher's outbox as a fraction of its bytes.
    fn new(outbox_fraction: f64) -> Rig {
        let (src, dst, plan) = trainer_and_server();
        let engine = Arc::new(MailEngine::new());
        for b in &src.buffers {
            let region = MemoryRegion { address: b.as_ptr() as u64, len: b.len() as u64, kind: MemoryKind::Host };
            // SAFETY: the buffers outlive every transfer of the test.
            assert_eq!(unsafe { engine.register_memory(region) }.unwrap(), 0);
        }
        let publishers = plan
            .executors(Side::Source)
            .iter()
            .map(|e| {
                let ops = plan.operation_indices_for_executor(e).unwrap();
                let bytes: u64 = ops.iter().map(|&i| plan.regions()[i as usize].total_bytes()).sum();
                let least = delta_pull::min_outbox_capacity(&plan, (&e.participant_id, &e.worker_id));
                let capacity = ((bytes as f64 * outbox_fraction) as u64).max(least);
                DeltaPublisher::new(&plan, &e.participant_id, None, engine.clone(), capacity).unwrap()
            })
            .collect();
        let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
        let mut rig = Rig { src, dst, plan, engine, loader, publishers, readers: Vec::new(), rng: Rng(0x5eed) };
        rig.readers = (0..rig.dst.bindings.len()).map(|k| rig.reader(k)).collect();
        rig
    }
    /// A prepared, delta-enabled reader of target `k` (a fresh one: a restarted server).
    fn reader(&self, k: usize) -> PreparedTransfer {
        let b = &self.dst.bindings[k];
        // SAFETY: both models' buffers outlive every step.
        let p = unsafe {
            self.loader.prepare_live(
                &self.plan,
                &self.src.placement,
                &self.src.bindings,
                &self.dst.placement,
                b,
                &LiveArgs::default(),
            )
        }
        .unwrap();
        p.enable_delta_pull(&self.outboxes()).unwrap();
        p
    }
    fn outboxes(&self) -> Vec<SourceOutbox<'_>> {
        self.publishers
            .iter()
            .map(|p| {
                let (participant_id, worker_id) = p.executor();
                SourceOutbox { participant_id, worker_id, outbox: p.outbox() }
            })
            .collect()
    }
    /// Changes `per_million` of the source's bf16 elements (a new generation).
    fn change(&mut self, per_million: u64) {
        change(&mut self.src, &mut self.rng, per_million);
    }
    fn publish(&self, g: u64) -> Vec<DeltaReport> {
        // SAFETY: the source buffers are valid and unchanged during the call.
        self.publishers.iter().map(|p| unsafe { p.publish(g) }.unwrap()).collect()
    }
    fn pull(&self, k: usize, g: u64) -> std::result::Result<LiveReport, LiveError> {
        // SAFETY: both models' buffers outlive every step.
        unsafe { self.readers[k].step(&StepArgs { weight_generation: g, ..Default::default() }) }
    }
    /// Publishes `g`, then every reader pulls it (each must succeed).
    fn step(&self, g: u64) {
        self.publish(g);
        for k in 0..self.readers.len() {
            let r = self.pull(k, g).unwrap_or_else(|e| panic!("reader {k} at {g}: {}", e.error));
            assert_eq!(r.targets[0].outcome, TargetOutcome::Updated { weight_generation: g });
            assert_eq!(self.readers[k].held_generation(), Some(g));
        }
    }
    /// Every target byte equals the source byte the plan routes into it.
    fn targets_match_sources(&self) -> bool {
        targets_match_sources(&self.plan)
    }
    fn reports(&self) -> Vec<TargetDelta> {
        self.readers.iter().flat_map(|p| p.last_delta().unwrap().targets).collect()
    }
}

#[test]
fn pulled_deltas_move_only_the_changes_and_every_byte_matches() {
    let mut rig = Rig::new(0.25);
    let logical = rig.plan.total_bytes();
    // The first publication has no delta; the first pull is full.
    let published = rig.publish(2);
    assert!(published.iter().flat_map(|r| &r.targets).all(|t| t.base_generation.is_none()));
    for k in 0..rig.readers.len() {
        rig.pull(k, 2).unwrap();
    }
    assert!(rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none() && t.wire_bytes > t.logical_bytes));
    for (g, per_million) in [(3u64, 10_000u64), (4, 30_000), (5, 100), (6, 0)] {
        rig.change(per_million);
        let before = *rig.engine.moved.lock();
        rig.step(g);
        assert!(rig.targets_match_sources(), "every target byte equals the source's at {g}");
        let reports = rig.reports();
        assert!(reports.iter().all(|t| t.base_generation == Some(g - 1)), "{reports:?}");
        let wire: u64 = reports.iter().map(|t| t.wire_bytes).sum();
        assert_eq!(wire, *rig.engine.moved.lock() - before, "the engine moved exactly the headers and records");
        assert_eq!(reports.iter().map(|t| t.logical_bytes).sum::<u64>(), logical);
        println!("generation {g}: {per_million} changes per million, {wire} of {logical} bytes pulled");
        if per_million <= 10_000 {
            assert!(wire * 10 < logical, "at most 1% changed: under a tenth of the bytes ({wire} of {logical})");
        }
        if per_million == 0 {
            let headers = PUBLICATION_HEADER_BYTES * reports.len() as u64;
            assert!(wire <= headers * rig.publishers.len() as u64, "nothing changed: headers only ({wire})");
        }
    }
    // A started step pulls deltas too.
    rig.change(10_000);
    rig.publish(7);
    let readers: Vec<Arc<PreparedTransfer>> = std::mem::take(&mut rig.readers).into_iter().map(Arc::new).collect();
    for p in &readers {
        // SAFETY: the models outlive the step, which ends before the next.
        let h = unsafe { p.start_step(&StepArgs { weight_generation: 7, ..Default::default() }, None) };
        let r = h.wait(None).unwrap().unwrap();
        assert_eq!(r.targets[0].outcome, TargetOutcome::Updated { weight_generation: 7 });
        assert_eq!(p.last_delta().unwrap().targets[0].base_generation, Some(6));
    }
    assert!(rig.targets_match_sources());
}

#[test]
fn full_whenever_in_doubt() {
    let mut rig = Rig::new(0.25);
    rig.step(2);
    // A reader that restarted (a fresh prepared reader: it holds nothing): full for
    // it, delta for the others.
    rig.readers[0].close().unwrap();
    rig.readers[0] = rig.reader(0);
    assert_eq!(rig.readers[0].held_generation(), None);
    rig.change(10_000);
    rig.step(3);
    assert!(rig.targets_match_sources());
    let reports = rig.reports();
    for (k, t) in reports.iter().enumerate() {
        assert_eq!(t.base_generation.is_none(), k == 0, "{t:?}");
    }
    // A generation the readers skip (published, never pulled): the next
    // publication's base is the skipped one, the readers hold the one before: full.
    rig.change(10_000);
    rig.publish(4);
    rig.change(10_000);
    rig.step(5);
    assert!(rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none()), "{:?}", rig.reports());
    // A reader that steps before its generation is published: refused before any
    // target byte moves; it still holds what it held, and pulls a delta once the
    // generation is published.
    rig.change(10_000);
    let before = rig.dst.buffers.clone();
    let e = rig.pull(1, 6).unwrap_err();
    assert_eq!(e.error.error_kind, ErrorKind::Conflict, "{}", e.error);
    assert!(e.error.message.contains("published generation 5, not 6"), "{}", e.error);
    assert!(!e.report.submitted);
    assert_eq!(e.report.targets[0].outcome, TargetOutcome::Unchanged);
    assert_eq!(rig.dst.buffers, before, "no target byte moved");
    assert_eq!(rig.readers[1].held_generation(), Some(5));
    rig.step(6);
    assert!(rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation == Some(5)));
}

#[test]
fn an_outbox_too_small_for_the_changes_sends_every_byte() {
    let mut rig = Rig::new(0.002);
    rig.step(2);
    rig.change(100_000); // 10%: the encodings exceed the small slots
    let published = rig.publish(3);
    assert!(published.iter().flat_map(|r| &r.targets).all(|t| t.base_generation.is_none()));
    for k in 0..rig.readers.len() {
        rig.pull(k, 3).unwrap();
    }
    assert!(rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none()));
    rig.change(10); // a handful: fits
    rig.step(4);
    assert!(rig.targets_match_sources());
    assert!(rig.reports().iter().any(|t| t.base_generation == Some(3)));
}

#[test]
fn a_corrupted_target_base_is_caught_as_torn_and_repaired_by_a_full_step() {
    let mut rig = Rig::new(0.25);
    rig.step(2);
    // Behind the reader's back, a byte of target 2 changes (a racing writer).
    rig.dst.buffers[2][17] ^= 0x40;
    rig.change(10_000);
    rig.publish(3);
    for k in 0..rig.readers.len() {
        let r = rig.pull(k, 3);
        if k != 2 {
            assert_eq!(r.unwrap().targets[0].outcome, TargetOutcome::Updated { weight_generation: 3 });
            continue;
        }
        let e = r.unwrap_err();
        assert_eq!(e.error.error_kind, ErrorKind::Integrity, "{}", e.error);
        assert!(e.error.message.contains("does not match their publication of generation 3"), "{}", e.error);
        assert!(matches!(e.report.targets[0].outcome, TargetOutcome::Torn { .. }), "{:?}", e.report.targets);
        assert_eq!(rig.readers[2].held_generation(), None);
    }
    // The next step: full for the torn reader, every byte right.
    rig.change(10_000);
    rig.step(4);
    assert!(rig.targets_match_sources());
    for (k, t) in rig.reports().iter().enumerate() {
        assert_eq!(t.base_generation.is_none(), k == 2, "{t:?}");
    }
}

#[test]
fn a_source_written_after_it_published_is_caught_on_a_full_pull() {
    let mut rig = Rig::new(0.25);
    rig.publish(2);
    // The trainer writes its buffers after publishing: a full pull reads other bytes
    // than the publication's checksums say.
    rig.change(1_000);
    for k in 0..rig.readers.len() {
        let e = rig.pull(k, 2).unwrap_err();
        assert_eq!(e.error.error_kind, ErrorKind::Integrity, "{}", e.error);
        assert!(matches!(e.report.targets[0].outcome, TargetOutcome::Torn { .. }));
        assert_eq!(rig.readers[k].held_generation(), None);
    }
    rig.step(3);
    assert!(rig.targets_match_sources());
}

#[test]
fn misuse_is_refused_with_a_precise_error() {
    let rig = Rig::new(0.25);
    // A publisher of a participant that is not a source executor, or with an outbox
    // too small to hold a slot per target executor.
    let e = DeltaPublisher::new(&rig.plan, "nobody", None, rig.engine.clone(), 1 << 20).unwrap_err();
    assert!(e.message().contains("nobody is not a source participant"), "{e}");
    let source = rig.plan.executors(Side::Source)[0].participant_id.clone();
    let e = DeltaPublisher::new(&rig.plan, &source, None, rig.engine.clone(), 100).unwrap_err();
    assert!(e.message().contains("is too small") && e.message().contains("needs at least"), "{e}");
    let e = DeltaPublisher::new(&rig.plan, &source, None, rig.engine.clone(), u64::MAX).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    let e = DeltaPublisher::new(&rig.plan, &source, Some("no-such-worker"), rig.engine.clone(), 1 << 20).unwrap_err();
    assert!(e.message().contains("no source executor of worker no-such-worker"), "{e}");
    // A reader without every source's outbox, or with one twice.
    let outboxes = rig.outboxes();
    let e = rig.readers[0].enable_delta_pull(&outboxes[1..]).unwrap_err();
    assert!(e.message().contains("no delta outbox for source executor"), "{e}");
    let twice: Vec<SourceOutbox<'_>> = outboxes.iter().chain(outboxes.iter().take(1)).copied().collect();
    let e = rig.readers[0].enable_delta_pull(&twice).unwrap_err();
    assert!(e.message().contains("given twice"), "{e}");
    // A sink cannot pull, a reader's step takes no held generations.
    let sink = Sink::new(rig.engine.clone(), ExecutorLimits::default()).unwrap();
    // SAFETY: the models outlive the prepared sink.
    let s = unsafe {
        sink.prepare(
            &rig.plan,
            &rig.src.placement,
            &rig.src.bindings[0],
            &rig.dst.placement,
            &rig.dst.bindings,
            &LiveArgs { local_pre_registered: true, ..Default::default() },
        )
    }
    .unwrap();
    let e = s.enable_delta_pull(&outboxes).unwrap_err();
    assert!(e.message().contains("for prepared readers"), "{e}");
    let held: Vec<TargetHeld<'_>> = Vec::new();
    // SAFETY: as above.
    let e =
        unsafe { rig.readers[0].step(&StepArgs { weight_generation: 2, delta: Some(&held), ..Default::default() }) }
            .unwrap_err();
    assert!(e.error.message.contains("StepArgs::delta is for sinks"), "{}", e.error);
    // Before any publication: refused, nothing moved.
    let e = rig.pull(0, 2).unwrap_err();
    assert!(e.error.message.contains("no readable publication"), "{}", e.error);
    assert!(!e.report.submitted);
    // A closed publisher refuses to publish; its readers then fail (its outbox is
    // unregistered).
    rig.publishers[0].close();
    // SAFETY: the sources are valid.
    let e = unsafe { rig.publishers[0].publish(2) }.unwrap_err();
    assert!(e.message().contains("closed"), "{e}");
}

#[test]
fn closing_releases_every_registration() {
    let rig = Rig::new(0.25);
    rig.step(2);
    let with = rig.engine.registered_regions().unwrap().len();
    let (publishers, readers) = (rig.publishers.len(), rig.readers.len());
    let Rig { readers: r, publishers: p, engine, .. } = rig;
    drop(r);
    drop(p);
    // The source buffers stay (the test registered them); the outboxes, the
    // readers' staging and target registrations are gone.
    let left = engine.registered_regions().unwrap().len();
    assert!(with >= left + publishers + 2 * readers, "{with} -> {left}");
}

#[test]
fn a_header_read_whose_completion_is_unknown_hands_the_staging_to_a_pending_transfer() {
    let rig = Rig::new(0.25);
    rig.step(2);
    rig.publish(3);
    let before = rig.dst.buffers.clone();
    // The first batch of the step (a header read) errs: completion unknown.
    *rig.engine.fail.lock() = Some(Box::new(|_| true));
    let e = rig.pull(0, 3).unwrap_err();
    assert_eq!(e.error.kind, TransferErrorKind::CompletionUnknown, "{}", e.error);
    assert!(e.error.message.contains("reading the sources' delta publications"), "{}", e.error);
    assert!(e.error.pending_transfer_id.is_some());
    assert_eq!(rig.dst.buffers, before, "a header read writes only the staging buffer");
    // The prepared reader cannot step again: its registrations (the staging among
    // them) belong to the pending transfer.
    let e = rig.pull(0, 3).unwrap_err();
    assert!(e.error.message.contains("pending transfer"), "{}", e.error);
    let staging_kept = rig.engine.registered_regions().unwrap().len();
    rig.readers[0].close().unwrap();
    assert_eq!(rig.engine.registered_regions().unwrap().len(), staging_kept, "nothing unregistered under DMA");
}

#[test]
fn a_records_read_whose_completion_is_unknown_leaves_the_target_torn() {
    let mut rig = Rig::new(0.25);
    rig.step(2);
    rig.change(10_000);
    rig.publish(3);
    // A batch larger than the headers (the records of a delta) errs.
    *rig.engine.fail.lock() = Some(Box::new(|b| b.nbytes() > 4 * PUBLICATION_HEADER_BYTES));
    let e = rig.pull(1, 3).unwrap_err();
    assert_eq!(e.error.kind, TransferErrorKind::CompletionUnknown, "{}", e.error);
    assert!(e.report.submitted);
    assert!(matches!(e.report.targets[0].outcome, TargetOutcome::Torn { .. }), "{:?}", e.report.targets);
    assert_eq!(rig.readers[1].held_generation(), None, "a step under way holds nothing");
    // A submission that erred leaves the engine restart-required: nothing else moves
    // on it, and the other readers still hold what they held.
    let e = rig.pull(0, 3).unwrap_err();
    assert!(e.error.message.contains("restart-required"), "{}", e.error);
    assert!(!e.report.submitted);
    assert_eq!(rig.readers[0].held_generation(), Some(2));
}
