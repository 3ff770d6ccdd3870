//! Issue 46, items 1 and 3: prepared pushes that notify, and content-verified flips.
//! A prepared sink's step tells each target what landed with the *step's* weight
//! generation; the target's acceptor follows the newest generation of its plan (an
//! older generation's message is stale, a replay never reports the new generation
//! updated); a router hands each message to the acceptor of its (plan, target).
//! Verified steps carry CRC-32C of the bytes sent per target, and a verifying
//! acceptor reads its target ranges before it reports Updated: a flipped byte in a
//! target, or a source corrupted after its checksum, is Torn with the ranges named.
//! A prepared reader's step reports its own outcome locally.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket};
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::notify::{decode, encode, NOTIFY_NAME};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The embedded engine with a notify mailbox per endpoint, and two faults: a byte
/// flipped in the destination after the next batch (DMA corruption), or in the
/// source before it (a source overwritten after its checksum).
struct MailEngine {
    inner: LocalEngine,
    mailbox: Mutex<BTreeMap<String, Vec<Vec<u8>>>>,
    /// Flip the first destination byte of the next batch after it copied.
    flip_destination: Mutex<bool>,
    /// Flip the first source byte of the next batch before it copies.
    flip_source: Mutex<bool>,
    fail_notify: Mutex<bool>,
}

impl MailEngine {
    fn new() -> Arc<MailEngine> {
        Arc::new(MailEngine {
            inner: LocalEngine::new(),
            mailbox: Mutex::new(BTreeMap::new()),
            flip_destination: Mutex::new(false),
            flip_source: Mutex::new(false),
            fail_notify: Mutex::new(false),
        })
    }
    fn take(&self, endpoint: &str) -> Vec<Vec<u8>> {
        self.mailbox.lock().remove(endpoint).unwrap_or_default()
    }
    fn faults(&self, batch: &TransferBatch, before: bool) {
        let (Some(&src), Some(&dst)) = (batch.source_addresses().first(), batch.target_addresses().first()) else {
            return;
        };
        if before && std::mem::take(&mut *self.flip_source.lock()) {
            // SAFETY: the test's source buffers are live; nothing else writes them now.
            unsafe { *(src as usize as *mut u8) ^= 0x01 };
        }
        if !before && std::mem::take(&mut *self.flip_destination.lock()) {
            // SAFETY: the test's target buffers are live; the copy finished.
            unsafe { *(dst as usize as *mut u8) ^= 0x80 };
        }
    }
}

impl TransferEngine for MailEngine {
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
        self.faults(batch, true);
        let r = self.inner.batch_transfer_sync(batch);
        self.faults(batch, false);
        r
    }
    fn submit_with_ticket(&self, _batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        None
    }
    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        self.inner.registered_regions()
    }
    fn send_notify(&self, endpoint: &str, name: &str, message: &[u8]) -> Option<EngineResult<i32>> {
        assert_eq!(name, NOTIFY_NAME);
        if *self.fail_notify.lock() {
            return Some(Ok(-1));
        }
        self.mailbox.lock().entry(endpoint.to_string()).or_default().push(message.to_vec());
        Some(Ok(0))
    }
}

/// Trainer TP2 x PP2 x EP2 x DP2 -> server TP4: every server participant is written
/// by several trainer sources.
fn models() -> (HostModel, HostModel, TransferPlan) {
    trainer_server_plan(
        &model_tensors(2, 64, 4),
        Layout { tp: 2, pp: 2, ep: 2, dp: 2 },
        Layout { tp: 4, pp: 1, ep: 1, dp: 1 },
    )
}

fn register(engine: &dyn TransferEngine, m: &HostModel) {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

fn next_generation(src: &mut HostModel) {
    for b in &mut src.buffers {
        for x in b.iter_mut() {
            *x ^= 0xFF;
        }
    }
}

struct Rig {
    src: HostModel,
    dst: HostModel,
    plan: TransferPlan,
    engine: Arc<MailEngine>,
    _sink: Sink,
    prepared: Vec<PreparedTransfer>,
}

impl Rig {
    fn new() -> Rig {
        let (src, dst, plan) = models();
        let engine = MailEngine::new();
        register(&*engine, &dst);
        let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
        let prepared = src
            .bindings
            .iter()
            // SAFETY: both models' buffers outlive every step.
            .map(|b| unsafe {
                sink.prepare(&plan, &src.placement, b, &dst.placement, &dst.bindings, &LiveArgs::default())
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .unwrap();
        Rig { src, dst, plan, engine, _sink: sink, prepared }
    }
    fn targets(&self) -> Vec<String> {
        self.dst.bindings.iter().map(|b| b.participant_id().to_string()).collect()
    }
    fn endpoint(&self, t: &str) -> String {
        format!("{t}:17000")
    }
    /// Steps every prepared sink for generation `g`.
    fn step_all(&self, g: u64, key: Option<&[u8]>, verify: bool) {
        for p in &self.prepared {
            let args = StepArgs {
                weight_generation: g,
                notify: Some(StepNotify { key, verify_content: verify }),
                ..Default::default()
            };
            // SAFETY: the models' buffers outlive every step.
            let r = unsafe { p.step(&args) }.unwrap();
            for t in &r.targets {
                assert_eq!(t.outcome, TargetOutcome::Updated { weight_generation: g });
            }
        }
    }
    fn acceptors(&self, key: Option<&[u8]>, verify: bool) -> Vec<NotifyAcceptor> {
        self.targets()
            .iter()
            .map(|t| {
                let mut a = NotifyAcceptor::new(&self.plan, t, key).unwrap();
                if verify {
                    // SAFETY: the target buffers outlive the acceptor.
                    unsafe { a.verify_content() }.unwrap();
                }
                a
            })
            .collect()
    }
}

#[test]
fn prepared_steps_notify_each_generation_and_old_generations_are_stale() {
    let mut rig = Rig::new();
    let key = [0x42u8; 32];
    let mut acc = rig.acceptors(Some(&key), false);
    assert!(acc.iter().all(|a| a.weight_generation() == 1 && a.outcome() == TargetOutcome::Unchanged));
    let identity = rig.prepared.iter().find(|p| !p.is_empty()).unwrap().plan_identity();
    assert_eq!(identity, acc[0].plan_identity(), "both sides name the plan alike");
    let mut old: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for g in [5u64, 6, 9] {
        rig.step_all(g, Some(&key), false);
        for (a, t) in acc.iter_mut().zip(rig.targets()) {
            let msgs = rig.engine.take(&rig.endpoint(&t));
            assert!(msgs.len() >= 2, "begin and done from each writer");
            for m in &msgs {
                let d = decode(m, Some(&key)).unwrap();
                assert_eq!(d.generation, g, "the step's generation, not the plan's");
                assert_eq!(d.plan, identity);
                assert!(d.content.is_none(), "unverified: no content member");
                let r = a.accept(m).unwrap();
                assert_eq!(r.weight_generation, g);
                assert_eq!(r.content, ContentCheck::Absent);
            }
            assert_eq!(a.outcome(), TargetOutcome::Updated { weight_generation: g }, "{t} at {g}");
            assert_eq!(a.weight_generation(), g);
            // Replays of the current generation: refused, nothing changes.
            for m in &msgs {
                assert_eq!(a.accept(m).unwrap_err().refusal, NotifyRefusal::Replayed);
            }
            // Every older generation's message: stale, nothing changes.
            for m in old.get(&t).into_iter().flatten() {
                let e = a.accept(m).unwrap_err();
                assert_eq!(e.refusal, NotifyRefusal::Stale, "{e}");
            }
            assert_eq!(a.outcome(), TargetOutcome::Updated { weight_generation: g });
            old.entry(t).or_default().extend(msgs);
        }
        next_generation(&mut rig.src);
    }
    // A next step's begin moves the acceptor on: the target is Torn (being
    // overwritten) until every writer said done for the new generation.
    let t = rig.targets()[0].clone();
    let args = StepArgs {
        weight_generation: 10,
        notify: Some(StepNotify { key: Some(&key), verify_content: false }),
        ..Default::default()
    };
    for p in &rig.prepared {
        // SAFETY: as above.
        let r = unsafe { p.step(&args) }.unwrap();
        if r.targets.iter().any(|x| x.participant_id == t) {
            break;
        }
    }
    let msgs = rig.engine.take(&rig.endpoint(&t));
    assert_eq!(msgs.len(), 2, "begin and done of one writer");
    {
        acc[0].accept(&msgs[0]).unwrap();
        assert!(matches!(acc[0].outcome(), TargetOutcome::Torn { .. }), "{:?}", acc[0].outcome());
        assert_eq!(acc[0].weight_generation(), 10);
        // A replayed old done cannot complete the new generation.
        for m in old.get(&t).into_iter().flatten() {
            assert!(acc[0].accept(m).is_err());
        }
        assert!(matches!(acc[0].outcome(), TargetOutcome::Torn { .. }));
        acc[0].accept(&msgs[1]).unwrap();
    }
    // expect_generation: a floor; older is refused, later resets.
    let mut a = NotifyAcceptor::new(&rig.plan, &t, Some(&key)).unwrap();
    a.expect_generation(12).unwrap();
    assert_eq!(a.weight_generation(), 12);
    assert_eq!(a.expect_generation(11).unwrap_err().kind(), ErrorKind::StaleBinding);
    for m in old.get(&t).into_iter().flatten() {
        assert_eq!(a.accept(m).unwrap_err().refusal, NotifyRefusal::Stale);
    }
    assert_eq!(a.outcome(), TargetOutcome::Unchanged);
}

#[test]
fn a_later_done_without_its_begin_does_not_advance_the_acceptor() {
    let rig = Rig::new();
    rig.step_all(3, None, false);
    let t = rig.targets()[1].clone();
    let msgs = rig.engine.take(&rig.endpoint(&t));
    let mut a = NotifyAcceptor::new(&rig.plan, &t, None).unwrap();
    let done = msgs.iter().find(|m| decode(m, None).unwrap().kind == "done").unwrap();
    let e = a.accept(done).unwrap_err();
    assert_eq!(e.refusal, NotifyRefusal::OtherPlan, "{e}");
    assert_eq!(a.weight_generation(), 1);
    // A forged later begin (other ranges) does not move it either.
    let mut m = decode(&msgs[0], None).unwrap();
    m.ranges = "00".repeat(32);
    assert_eq!(a.accept(&encode(&m, None)).unwrap_err().refusal, NotifyRefusal::Forged);
    assert_eq!(a.weight_generation(), 1);
}

#[test]
fn a_router_hands_each_message_to_its_target_and_plan() {
    let rig = Rig::new();
    let router = NotifyRouter::new();
    let shared: Vec<SharedAcceptor> =
        rig.acceptors(None, false).into_iter().map(|a| Arc::new(parking_lot::Mutex::new(a))).collect();
    for a in &shared {
        router.insert(a.clone()).unwrap();
    }
    assert_eq!(router.len(), rig.targets().len());
    assert_eq!(router.insert(shared[0].clone()).unwrap_err().kind(), ErrorKind::Conflict);
    rig.step_all(4, None, false);
    // Every message of every endpoint, in one stream, as one notify poll returns them.
    let all: Vec<Vec<u8>> = rig.targets().iter().flat_map(|t| rig.engine.take(&rig.endpoint(t))).collect();
    for m in &all {
        let r = router.accept(m).unwrap();
        assert_eq!(r.acceptor.lock().participant(), decode(m, None).unwrap().target_participant);
    }
    for a in &shared {
        assert_eq!(a.lock().outcome(), TargetOutcome::Updated { weight_generation: 4 });
    }
    // Replays come back refused by the acceptor they name.
    let e = router.accept(&all[0]).unwrap_err();
    assert_eq!(e.error.refusal, NotifyRefusal::Replayed);
    assert!(e.acceptor.is_some());
    // A target the router does not host; another plan of a hosted target.
    assert!(router.remove_acceptor(&shared[0]));
    let t0 = shared[0].lock().participant().to_string();
    let m = all.iter().find(|m| decode(m, None).unwrap().target_participant == t0).unwrap();
    let e = router.accept(m).unwrap_err();
    assert_eq!(e.error.refusal, NotifyRefusal::Misrouted, "{}", e.error);
    let mut other = decode(&all[all.len() - 1], None).unwrap();
    other.plan = "ab".repeat(32);
    let e = router.accept(&encode(&other, None)).unwrap_err();
    assert_eq!(e.error.refusal, NotifyRefusal::OtherPlan, "{}", e.error);
    assert_eq!(router.accept(b"garbage").unwrap_err().error.refusal, NotifyRefusal::Malformed);
    // Every flipped body byte is forged, whatever it turned the body into (JSON that
    // does not parse, another target, another plan): no routed key authenticates it.
    let m = &all[all.len() - 1];
    let body_at = m.iter().position(|&b| b == b'\n').unwrap() + 1;
    for i in body_at..m.len() {
        let mut b = m.clone();
        b[i] ^= 0x01;
        let e = router.accept(&b).unwrap_err();
        assert_eq!(e.error.refusal, NotifyRefusal::Forged, "byte {i}: {}", e.error);
    }
}

fn feed_all(rig: &Rig, acc: &mut [NotifyAcceptor]) -> Vec<Vec<NotifyAccepted>> {
    acc.iter_mut()
        .zip(rig.targets())
        .map(|(a, t)| rig.engine.take(&rig.endpoint(&t)).iter().map(|m| a.accept(m).unwrap()).collect())
        .collect()
}

#[test]
fn verified_steps_catch_a_flipped_target_byte_and_a_corrupted_source() {
    let mut rig = Rig::new();
    let mut acc = rig.acceptors(None, true);
    // A clean verified step: every target verified and updated.
    rig.step_all(2, None, true);
    for (accepted, a) in feed_all(&rig, &mut acc).iter().zip(&acc) {
        assert!(accepted.iter().any(|r| r.content == ContentCheck::Verified));
        assert_eq!(a.outcome(), TargetOutcome::Updated { weight_generation: 2 });
        assert!(a.mismatches().is_empty());
    }
    rig.dst.verify().unwrap();
    // A byte flipped in a target after the copy (a NIC or DMA fault): the sink's
    // own report says Updated, the verifying acceptor says Torn and names the range.
    next_generation(&mut rig.src);
    *rig.engine.flip_destination.lock() = true;
    rig.step_all(3, None, true);
    let accepted = feed_all(&rig, &mut acc);
    let torn: Vec<_> = acc.iter().filter(|a| matches!(a.outcome(), TargetOutcome::Torn { .. })).collect();
    assert_eq!(torn.len(), 1, "exactly the target with the flipped byte");
    let mm = torn[0].mismatches();
    assert_eq!(mm.len(), 1);
    assert!(!mm[0].ranges.is_empty());
    assert!(mm[0].ranges.iter().all(|r| r.fragment_id.starts_with(torn[0].participant())), "{mm:?}");
    match torn[0].outcome() {
        TargetOutcome::Torn { incomplete } => {
            assert_eq!(incomplete, vec![(mm[0].source_participant.clone(), mm[0].source_worker.clone())])
        }
        o => panic!("{o:?}"),
    }
    assert!(accepted.iter().flatten().any(|r| matches!(r.content, ContentCheck::Mismatch(_))));
    // The next verified step repairs it: Updated again at the new generation.
    next_generation(&mut rig.src);
    rig.step_all(4, None, true);
    feed_all(&rig, &mut acc);
    assert!(acc.iter().all(|a| a.outcome() == TargetOutcome::Updated { weight_generation: 4 }));
    // A source byte changed after its checksum (a racing writer): Torn as well.
    next_generation(&mut rig.src);
    *rig.engine.flip_source.lock() = true;
    rig.step_all(5, None, true);
    feed_all(&rig, &mut acc);
    let torn = acc.iter().filter(|a| !a.mismatches().is_empty()).count();
    assert_eq!(torn, 1);
    // Without verification the same corruption goes unnoticed (what the flag buys).
    let mut plain = rig.acceptors(None, false);
    next_generation(&mut rig.src);
    *rig.engine.flip_destination.lock() = true;
    rig.step_all(6, None, true);
    let accepted = feed_all(&rig, &mut plain);
    assert!(accepted
        .iter()
        .flatten()
        .filter(|r| r.kind == NotifyKind::Done)
        .all(|r| r.content == ContentCheck::NotChecked));
    assert!(plain.iter().all(|a| a.outcome() == TargetOutcome::Updated { weight_generation: 6 }));
}

#[test]
fn a_verifying_acceptor_refuses_an_unverified_done_and_forged_checksums() {
    let rig = Rig::new();
    let mut acc = rig.acceptors(None, true);
    rig.step_all(2, None, false);
    let t = rig.targets()[0].clone();
    let msgs = rig.engine.take(&rig.endpoint(&t));
    let a = &mut acc[0];
    for m in &msgs {
        match decode(m, None).unwrap().kind.as_str() {
            "begin" => drop(a.accept(m).unwrap()),
            _ => {
                let e = a.accept(m).unwrap_err();
                assert_eq!(e.refusal, NotifyRefusal::Unverified, "{e}");
                assert_eq!(Error::from(e).kind(), ErrorKind::Integrity);
                // The wrong number of checksums is forged; the right number but
                // wrong values is a mismatch (Torn).
                let mut d = decode(m, None).unwrap();
                d.content = Some(notify::NotifyContent { crc32c: vec![] });
                assert_eq!(a.accept(&encode(&d, None)).unwrap_err().refusal, NotifyRefusal::Forged);
            }
        }
    }
    assert!(matches!(a.outcome(), TargetOutcome::Torn { .. }), "no done was accepted");
}

#[test]
fn notify_is_for_sink_steps_and_a_failed_begin_moves_nothing() {
    let rig = Rig::new();
    // A reader's step cannot notify; its own report is its outcome.
    let engine = MailEngine::new();
    register(&*engine, &rig.src);
    let loader = Loader::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let b = &rig.dst.bindings[0];
    // SAFETY: both models' buffers outlive the steps.
    let p = unsafe {
        loader.prepare_live(
            &rig.plan,
            &rig.src.placement,
            &rig.src.bindings,
            &rig.dst.placement,
            b,
            &LiveArgs::default(),
        )
    }
    .unwrap();
    let args = StepArgs { weight_generation: 3, notify: Some(StepNotify::default()), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe { p.step(&args) }.unwrap_err();
    assert!(e.error.message.contains("notifies no one"), "{}", e.error);
    assert!(!e.report.submitted);
    // SAFETY: as above.
    let r = unsafe { p.step(&StepArgs { weight_generation: 3, ..Default::default() }) }.unwrap();
    assert_eq!(r.targets.len(), 1);
    assert_eq!(r.targets[0].participant_id, b.participant_id());
    assert_eq!(r.targets[0].weight_generation, 3);
    assert_eq!(r.targets[0].outcome, TargetOutcome::Updated { weight_generation: 3 });
    // A short key is refused before anything moves.
    let sink = rig.prepared.iter().find(|p| !p.is_empty()).unwrap();
    let args = StepArgs {
        weight_generation: 3,
        notify: Some(StepNotify { key: Some(&[1u8; 8]), verify_content: true }),
        ..Default::default()
    };
    // SAFETY: as above.
    let e = unsafe { sink.step(&args) }.unwrap_err();
    assert!(e.error.message.contains("at least 16 bytes"), "{}", e.error);
    assert!(!e.report.submitted);
    // A failed begin moves nothing: the targets stay Unchanged.
    *rig.engine.fail_notify.lock() = true;
    let args = StepArgs { weight_generation: 3, notify: Some(StepNotify::default()), ..Default::default() };
    // SAFETY: as above.
    let e = unsafe { sink.step(&args) }.unwrap_err();
    assert!(!e.report.submitted && e.error.message.contains("notify begin"), "{}", e.error);
    assert!(e.report.targets.iter().all(|t| t.outcome == TargetOutcome::Unchanged));
}
