//! Issue 47: sparse delta steps of a prepared push. After a first full, verified
//! step, a step sends each target only the elements that changed since what it
//! verifiably holds (encoded into its inbox), the target applies them and verifies
//! the content before it reports Updated; every target byte equals the source's.
//! Full whenever in doubt: the first step, a target that holds no verified or
//! another generation (restarted, Torn, never confirmed), an inbox too small; a
//! delta the target cannot apply is refused and a corrupted target base is caught
//! as Torn, and the next full step repairs both.

#[path = "common/delta_rig.rs"]
mod delta_rig;
#[path = "common/model.rs"]
mod model;

use delta_rig::*;
use model::*;
use mooncake_weight_store::engine::{MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::notify::decode;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::*;
use std::sync::Arc;

const KEY: &[u8] = b"a delta key of at least 16 bytes";

/// Trainer TP2 x PP2 x DP2 pushing into a server TP4 x EP2 (bf16, 256 hidden).
struct Rig {
    src: HostModel,
    dst: HostModel,
    plan: TransferPlan,
    engine: Arc<MailEngine>,
    _sink: Sink,
    prepared: Vec<PreparedTransfer>,
    inboxes: Vec<Vec<u8>>,
    acceptors: Vec<NotifyAcceptor>,
    rng: Rng,
}

impl Rig {
    /// `inbox_fraction`: each target's inbox as a fraction of its bytes.
    fn new(inbox_fraction: f64) -> Rig {
        let (src, dst, plan) = trainer_and_server();
        let engine = Arc::new(MailEngine::new());
        let region =
            |b: &[u8]| MemoryRegion { address: b.as_ptr() as u64, len: b.len() as u64, kind: MemoryKind::Host };
        for b in &dst.buffers {
            // SAFETY: the buffers outlive every transfer of the test.
            assert_eq!(unsafe { engine.register_memory(region(b)) }.unwrap(), 0);
        }
        let inboxes: Vec<Vec<u8>> =
            dst.buffers.iter().map(|b| vec![0u8; ((b.len() as f64 * inbox_fraction) as usize).max(256)]).collect();
        for b in &inboxes {
            // SAFETY: as above.
            assert_eq!(unsafe { engine.register_memory(region(b)) }.unwrap(), 0);
        }
        let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
        let mut prepared = Vec::new();
        for b in &src.bindings {
            // SAFETY: both models' buffers outlive every step.
            let p =
                unsafe { sink.prepare(&plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default()) }
                    .unwrap();
            if !p.is_empty() {
                prepared.push(p);
            }
        }
        let mut rig =
            Rig { src, dst, plan, engine, _sink: sink, prepared, inboxes, acceptors: Vec::new(), rng: Rng(0x9e37) };
        rig.acceptors = (0..rig.targets().len()).map(|k| rig.acceptor(k)).collect();
        let inboxes = rig.inbox_map();
        let named: Vec<(&str, DeltaInbox)> = inboxes.iter().map(|(t, i)| (t.as_str(), *i)).collect();
        for p in &rig.prepared {
            p.enable_delta(&named).unwrap();
        }
        rig
    }
    fn targets(&self) -> Vec<String> {
        self.dst.bindings.iter().map(|b| b.participant_id().to_string()).collect()
    }
    fn inbox_map(&self) -> Vec<(String, DeltaInbox)> {
        self.targets()
            .into_iter()
            .zip(&self.inboxes)
            .map(|(t, b)| (t, DeltaInbox { address: b.as_ptr() as u64, capacity: b.len() as u64 }))
            .collect()
    }
    /// A verifying, delta-taking acceptor of target `k` (a fresh one: a restarted target).
    fn acceptor(&self, k: usize) -> NotifyAcceptor {
        let t = &self.targets()[k];
        let mut a = NotifyAcceptor::new(&self.plan, t, Some(KEY)).unwrap();
        // SAFETY: the target buffers and inboxes outlive the acceptor.
        unsafe { a.verify_content() }.unwrap();
        let b = &self.inboxes[k];
        // SAFETY: as above.
        unsafe { a.accept_deltas(DeltaInbox { address: b.as_ptr() as u64, capacity: b.len() as u64 }) }.unwrap();
        a
    }
    /// Changes `per_million` of the source's bf16 elements (a new generation).
    fn change(&mut self, per_million: u64) {
        change(&mut self.src, &mut self.rng, per_million);
    }
    /// What each acceptor says its target holds.
    fn held(&self) -> Vec<(String, u64)> {
        self.targets()
            .into_iter()
            .zip(&self.acceptors)
            .filter_map(|(t, a)| a.held_generation().map(|g| (t, g)))
            .collect()
    }
    /// One delta-capable step of every prepared sink for generation `g`, telling
    /// them `held`; then every message delivered. Returns the refusals.
    fn step(&mut self, g: u64, held: &[(String, u64)]) -> Vec<NotifyError> {
        let held: Vec<TargetHeld<'_>> =
            held.iter().map(|(t, g)| TargetHeld { participant_id: t, weight_generation: *g }).collect();
        for p in &self.prepared {
            let args = StepArgs {
                weight_generation: g,
                notify: Some(StepNotify { key: Some(KEY), verify_content: true }),
                delta: Some(&held),
                ..Default::default()
            };
            // SAFETY: the models' buffers outlive every step.
            let r = unsafe { p.step(&args) }.unwrap();
            assert!(r.targets.iter().all(|t| t.outcome == TargetOutcome::Updated { weight_generation: g }));
        }
        self.deliver()
    }
    fn deliver(&mut self) -> Vec<NotifyError> {
        let mut refused = Vec::new();
        for (k, t) in self.targets().iter().enumerate() {
            for m in self.engine.mailbox.lock().remove(&format!("{t}:17000")).unwrap_or_default() {
                if let Err(e) = self.acceptors[k].accept(&m) {
                    refused.push(e);
                }
            }
        }
        refused
    }
    /// Every target byte equals the source byte the plan routes into it.
    fn targets_match_sources(&self) -> bool {
        targets_match_sources(&self.plan)
    }
    fn reports(&self) -> Vec<TargetDelta> {
        self.prepared.iter().flat_map(|p| p.last_delta().unwrap().targets).collect()
    }
    fn outcomes(&self) -> Vec<TargetOutcome> {
        self.acceptors.iter().map(|a| a.outcome()).collect()
    }
}

fn all_updated(rig: &Rig, g: u64) -> bool {
    rig.outcomes().iter().all(|o| *o == TargetOutcome::Updated { weight_generation: g })
        && rig.acceptors.iter().all(|a| a.held_generation() == Some(g))
}

#[test]
fn delta_steps_move_only_the_changes_and_every_byte_matches() {
    let mut rig = Rig::new(0.25);
    let logical: u64 = rig.plan.total_bytes();
    // The first step is full: no base yet (and no target holds anything).
    assert!(rig.step(2, &[]).is_empty());
    assert!(all_updated(&rig, 2) && rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none() && t.wire_bytes == t.logical_bytes));
    for (g, per_million) in [(3u64, 10_000u64), (4, 30_000), (5, 100), (6, 0)] {
        rig.change(per_million);
        let before = *rig.engine.moved.lock();
        let held = rig.held();
        let refused = rig.step(g, &held);
        assert!(refused.is_empty(), "{refused:?}");
        assert!(all_updated(&rig, g), "{:?}", rig.outcomes());
        assert!(rig.targets_match_sources(), "every target byte equals the source's at {g}");
        let reports = rig.reports();
        assert!(reports.iter().all(|t| t.base_generation == Some(g - 1)), "{reports:?}");
        let wire: u64 = reports.iter().map(|t| t.wire_bytes).sum();
        assert_eq!(wire, *rig.engine.moved.lock() - before, "the engine moved exactly the encodings");
        let held_bytes: u64 = reports.iter().map(|t| t.logical_bytes).sum();
        assert_eq!(held_bytes, logical);
        println!("generation {g}: {per_million} changes per million, {wire} of {logical} bytes moved");
        if per_million <= 10_000 {
            assert!(wire * 10 < logical, "at most 1% changed: under a tenth of the bytes ({wire} of {logical})");
        }
        if per_million == 0 {
            assert_eq!(wire, 0, "nothing changed, nothing moved");
        }
    }
}

#[test]
fn full_whenever_in_doubt() {
    let mut rig = Rig::new(0.25);
    rig.step(2, &[]);
    assert!(all_updated(&rig, 2));
    // A target that restarted (a fresh acceptor: it holds nothing) and says so: full
    // for it, delta for the others.
    rig.acceptors[0] = rig.acceptor(0);
    rig.change(10_000);
    let held = rig.held();
    assert!(rig.step(3, &held).is_empty());
    assert!(all_updated(&rig, 3) && rig.targets_match_sources());
    let t0 = rig.targets()[0].clone();
    for t in rig.reports() {
        assert_eq!(t.base_generation.is_none(), t.participant_id == t0, "{t:?}");
    }
    // A caller that reports another generation than the base's: full.
    rig.change(10_000);
    let stale: Vec<(String, u64)> = rig.targets().into_iter().map(|t| (t, 2)).collect();
    assert!(rig.step(4, &stale).is_empty());
    assert!(all_updated(&rig, 4) && rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none()));
    // A caller that does not confirm a step (the step of 5 is not delivered): the
    // targets stay at 4, the sources' bases are at 5 -> full at 6.
    rig.change(10_000);
    let held = rig.held();
    let held_ref: Vec<TargetHeld<'_>> =
        held.iter().map(|(t, g)| TargetHeld { participant_id: t, weight_generation: *g }).collect();
    for p in &rig.prepared {
        let args = StepArgs {
            weight_generation: 5,
            notify: Some(StepNotify { key: Some(KEY), verify_content: true }),
            delta: Some(&held_ref),
            ..Default::default()
        };
        // SAFETY: as in Rig::step.
        unsafe { p.step(&args) }.unwrap();
    }
    rig.engine.mailbox.lock().clear();
    rig.change(10_000);
    let held = rig.held();
    assert!(held.iter().all(|(_, g)| *g == 4));
    assert!(rig.step(6, &held).is_empty());
    assert!(all_updated(&rig, 6) && rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none()), "bases at 5, targets at 4: full");
    // A delta the target cannot apply (its acceptor restarted, but the caller still
    // says it holds 6): refused, the target Torn; the next (full) step repairs it.
    rig.acceptors[1] = rig.acceptor(1);
    rig.change(10_000);
    let lie: Vec<(String, u64)> = rig.targets().into_iter().map(|t| (t, 6)).collect();
    let refused = rig.step(7, &lie);
    assert!(!refused.is_empty() && refused.iter().all(|e| e.refusal == NotifyRefusal::DeltaBase), "{refused:?}");
    assert!(refused[0].message.contains("no verified generation"), "{}", refused[0].message);
    assert!(matches!(rig.acceptors[1].outcome(), TargetOutcome::Torn { .. }));
    assert_eq!(rig.acceptors[1].held_generation(), None);
    let held = rig.held();
    assert!(rig.step(8, &held).is_empty());
    assert!(all_updated(&rig, 8) && rig.targets_match_sources());
}

#[test]
fn an_inbox_too_small_for_the_changes_sends_every_byte() {
    let mut rig = Rig::new(0.001);
    rig.step(2, &[]);
    rig.change(100_000); // 10%: the encodings exceed the small slots
    let held = rig.held();
    assert!(rig.step(3, &held).is_empty());
    assert!(all_updated(&rig, 3) && rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation.is_none()));
    rig.change(10); // a handful: fits
    let held = rig.held();
    assert!(rig.step(4, &held).is_empty());
    assert!(all_updated(&rig, 4) && rig.targets_match_sources());
    assert!(rig.reports().iter().any(|t| t.base_generation == Some(3)));
}

#[test]
fn a_corrupted_target_base_is_caught_as_torn_and_repaired_by_a_full_step() {
    let mut rig = Rig::new(0.25);
    rig.step(2, &[]);
    assert!(all_updated(&rig, 2));
    // Behind the acceptor's back, a byte of target 2 changes (a racing writer).
    rig.dst.buffers[2][17] ^= 0x40;
    rig.change(10_000);
    let held = rig.held();
    assert!(rig.step(3, &held).is_empty(), "authentic messages are accepted");
    assert!(rig.reports().iter().all(|t| t.base_generation == Some(2)));
    let torn = rig.outcomes();
    assert!(matches!(torn[2], TargetOutcome::Torn { .. }), "{:?}", torn[2]);
    let mm = rig.acceptors[2].mismatches();
    assert!(!mm.is_empty() && !mm[0].ranges.is_empty(), "the ranges are named");
    assert_eq!(rig.acceptors[2].held_generation(), None);
    for (k, o) in torn.iter().enumerate() {
        if k != 2 {
            assert_eq!(*o, TargetOutcome::Updated { weight_generation: 3 });
        }
    }
    // The next step: full for the torn target (it holds nothing), every byte right.
    rig.change(10_000);
    let held = rig.held();
    assert!(rig.step(4, &held).is_empty());
    assert!(all_updated(&rig, 4) && rig.targets_match_sources());
    let t2 = rig.targets()[2].clone();
    for t in rig.reports() {
        assert_eq!(t.base_generation.is_none(), t.participant_id == t2, "{t:?}");
    }
}

#[test]
fn delta_messages_carry_their_base_and_started_steps_send_deltas() {
    let mut rig = Rig::new(0.25);
    rig.step(2, &[]);
    rig.change(10_000);
    let held = rig.held();
    let held_ref: Vec<TargetHeld<'_>> =
        held.iter().map(|(t, g)| TargetHeld { participant_id: t, weight_generation: *g }).collect();
    let prepared: Vec<Arc<PreparedTransfer>> = std::mem::take(&mut rig.prepared).into_iter().map(Arc::new).collect();
    for p in &prepared {
        let args = StepArgs {
            weight_generation: 3,
            notify: Some(StepNotify { key: Some(KEY), verify_content: true }),
            delta: Some(&held_ref),
            ..Default::default()
        };
        // SAFETY: the models outlive the step, which ends before the next.
        let h = unsafe { p.start_step(&args, None) };
        h.wait(None).unwrap().unwrap();
    }
    let t0 = rig.targets()[0].clone();
    let msgs = rig.engine.mailbox.lock().get(&format!("{t0}:17000")).cloned().unwrap_or_default();
    assert!(!msgs.is_empty());
    for m in &msgs {
        let d = decode(m, Some(KEY)).unwrap();
        assert_eq!(d.delta.map(|d| d.base), Some(2), "begin and done name the base");
    }
    assert!(rig.deliver().is_empty());
    assert!(all_updated(&rig, 3) && rig.targets_match_sources());
    // A delta step needs a notified, verified step and enable_delta.
    let held_ref: Vec<TargetHeld<'_>> = vec![];
    let args = StepArgs { weight_generation: 4, delta: Some(&held_ref), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe { prepared[0].step(&args) }.unwrap_err();
    assert!(e.error.message.contains("notified and content-verified"), "{}", e.error);
    assert!(!e.report.submitted);
}

#[test]
fn an_inbox_too_large_to_mirror_is_refused_not_allocated() {
    let rig = Rig::new(0.25);
    let huge: Vec<(String, DeltaInbox)> =
        rig.targets().into_iter().map(|t| (t, DeltaInbox { address: 4096, capacity: u64::MAX })).collect();
    let named: Vec<(&str, DeltaInbox)> = huge.iter().map(|(t, i)| (t.as_str(), *i)).collect();
    let e = rig.prepared[0].enable_delta(&named).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(e.message().contains("cannot be allocated"), "{e}");
    // Nothing changed: the inboxes enabled before still take delta steps.
    let mut rig = rig;
    assert!(rig.step(2, &[]).is_empty());
    rig.change(10_000);
    let held = rig.held();
    assert!(rig.step(3, &held).is_empty());
    assert!(all_updated(&rig, 3) && rig.targets_match_sources());
    assert!(rig.reports().iter().all(|t| t.base_generation == Some(2)));
}
