//! Issue 27: the notify hook. A sink tells every target, through the engine's own
//! notify channel, `begin` before it writes and `done` after its call returned; the
//! target's acceptor checks each message against its own bound plan and generation
//! and yields the per-target outcome. Forged, replayed, truncated, stale and
//! misrouted messages are refused and change nothing. (The same protocol over the
//! real Mooncake Transfer Engine: cpp_tests/mooncake.)

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;

use builders::*;
use fake_engine::*;
use mooncake_weight_store::engine::{
    CompletionStatus, EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket,
};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::notify::{decode, encode, plan_identity, NotifyMessage, NOTIFY_NAME};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::StaticGuard;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use AxisKind::Tp;

/// A fake engine with a notify channel: every delivered message lands in a mailbox
/// per endpoint; `fail_notify_at` makes the n-th notify (0-based) fail.
struct Notifying {
    inner: Arc<FakeEngine>,
    mailbox: Mutex<BTreeMap<String, Vec<Vec<u8>>>>,
    sent: Mutex<usize>,
    fail_notify_at: Mutex<Option<usize>>,
    notify_supported: bool,
}

impl Notifying {
    fn new(inner: Arc<FakeEngine>) -> Arc<Self> {
        Arc::new(Notifying {
            inner,
            mailbox: Mutex::new(BTreeMap::new()),
            sent: Mutex::new(0),
            fail_notify_at: Mutex::new(None),
            notify_supported: true,
        })
    }
    fn take(&self, endpoint: &str) -> Vec<Vec<u8>> {
        self.mailbox.lock().remove(endpoint).unwrap_or_default()
    }
}

impl TransferEngine for Notifying {
    fn identity(&self) -> std::result::Result<u64, String> {
        self.inner.identity()
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        // SAFETY: forwarded with the caller's contract.
        unsafe { self.inner.register_memory(region) }
    }
    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        self.inner.unregister_memory(address)
    }
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        self.inner.batch_transfer_sync(batch)
    }
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        self.inner.submit_with_ticket(batch)
    }
    fn send_notify(&self, endpoint: &str, name: &str, message: &[u8]) -> Option<EngineResult<i32>> {
        if !self.notify_supported {
            return None;
        }
        assert_eq!(name, NOTIFY_NAME);
        let mut n = self.sent.lock();
        let k = *n;
        *n += 1;
        if *self.fail_notify_at.lock() == Some(k) {
            return Some(Ok(-1));
        }
        self.mailbox.lock().entry(endpoint.to_string()).or_default().push(message.to_vec());
        Some(Ok(0))
    }
}

fn tensors() -> Vec<TensorDescriptor> {
    [("a", 4), ("b", 2)].iter().map(|&(id, cols)| tensor(id, &[8, cols], 1, &[split(Tp, 0)])).collect()
}

fn rows_placement(defs: &[TensorDescriptor], n: u64, generation: u64) -> Placement {
    let ranks: Vec<_> = (0..n).map(tp).collect();
    let frags = ranks.iter().flat_map(|&r| defs.iter().map(move |t| rows(t, r.tp * (8 / n), 8 / n, r))).collect();
    let mut ids = live_ids("step-42");
    ids.weight_generation = generation;
    flat_with(&ids, topo(1, 1, 1, n, &ranks), defs.to_vec(), frags).unwrap()
}

fn binding(placement: &Placement, participant: &str, name: &str, base: u64, generation: u64) -> RuntimeBinding {
    binding_in(placement, participant, name, base, generation, MemoryKind::Host)
}

fn binding_in(
    placement: &Placement,
    participant: &str,
    name: &str,
    base: u64,
    generation: u64,
    memory: MemoryKind,
) -> RuntimeBinding {
    let part = placement.part(participant).unwrap();
    let mut off = 0;
    let mut frags = Vec::new();
    let total: u64 = part.fragments().iter().map(|f| f.nbytes()).sum();
    for (k, f) in part.fragments().iter().enumerate() {
        let t = placement.tensor(f.tensor_id()).unwrap();
        frags.push(
            RuntimeFragment::new(RuntimeFragmentSpec {
                placement_fragment_id: f.placement_fragment_id().into(),
                fragment_id: format!("{name}-frag{k}"),
                address: base + off,
                nbytes: f.nbytes(),
                worker_id: name.into(),
                endpoint: format!("{name}:12345"),
                device: "cpu".into(),
                itemsize: t.itemsize(),
                local_shape: f.local_shape().to_vec(),
                strides_bytes: vec![f.local_shape()[1] * t.itemsize(), t.itemsize()],
                storage_address: base,
                storage_nbytes: total,
                storage_offset_bytes: off,
                memory,
            })
            .unwrap(),
        );
        off += f.nbytes();
    }
    RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: placement.resource_id().into(),
        placement_id: placement.placement_id().into(),
        placement_digest: placement.digest().into(),
        instance_id: name.into(),
        lease_generation: generation,
        lease_id: format!("{name}-lease-{generation}"),
        revision: placement.revision().into(),
        participant_id: participant.into(),
        fragments: frags,
    })
    .unwrap()
}

/// TP4 -> TP2 at `generation`: every target participant is written by two sources.
struct Live {
    src: Placement,
    dst: Placement,
    sb: Vec<RuntimeBinding>,
    tb: Vec<RuntimeBinding>,
    plan: TransferPlan,
    guards: GuardProviders,
}

impl Live {
    fn new(generation: u64) -> Live {
        let defs = tensors();
        let (src, dst) = (rows_placement(&defs, 4, generation), rows_placement(&defs, 2, generation));
        let sb: Vec<_> = (0..4)
            .map(|i| binding(&src, &pid(tp(i)), &format!("source-t{i}"), 0x10000 + i * 0x1000, generation))
            .collect();
        let tb: Vec<_> = (0..2)
            .map(|i| binding(&dst, &pid(tp(i)), &format!("target-t{i}"), 0x40000 + i * 0x1000, generation))
            .collect();
        let logical =
            LogicalTransferPlan::plan(Arc::new(src.clone()), Arc::new(dst.clone()), PlanningLimits::reference())
                .unwrap();
        let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
        Live { src, dst, sb, tb, plan, guards: GuardProviders::all(Arc::new(StaticGuard)) }
    }
    fn leases(&self) -> Vec<MemoryRegistrationLease> {
        self.tb
            .iter()
            .flat_map(|b| {
                b.fragments()
                    .iter()
                    .map(|f| MemoryRegistrationLease::from_fragment(f, b.lease_generation(), Some(b.lease_id())))
            })
            .collect()
    }
    fn push(
        &self,
        ex: &TransferExecutor,
        key: Option<&[u8]>,
        i: usize,
        src_placement: Option<&Placement>,
    ) -> TransferResult<NotifiedSink> {
        let leases = self.leases();
        let args = ExecuteArgs {
            remote_registrations: Some(&leases),
            source_guards: Some(&self.guards),
            target_guards: Some(&self.guards),
            ..Default::default()
        };
        // SAFETY: fake engines never touch memory.
        unsafe {
            execute_sink_notified(
                ex,
                key,
                &self.plan,
                src_placement.unwrap_or(&self.src),
                &self.sb[i],
                &self.dst,
                &self.tb,
                &args,
            )
        }
    }
    fn acceptor(&self, t: usize, key: Option<&[u8]>) -> NotifyAcceptor {
        NotifyAcceptor::new(&self.plan, &pid(tp(t as u64)), key).unwrap()
    }
}

fn endpoint(t: usize) -> String {
    format!("target-t{t}:12345")
}

fn feed(acc: &mut NotifyAcceptor, msgs: &[Vec<u8>]) {
    for m in msgs {
        acc.accept(m).unwrap();
    }
}

#[test]
fn every_target_is_updated_only_after_every_writer_said_done() {
    let live = Live::new(3);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let mut acc: Vec<_> = (0..2).map(|t| live.acceptor(t, None)).collect();
    assert_eq!(acc[0].outcome(), TargetOutcome::Unchanged);
    assert_eq!(acc[0].writers().len(), 2, "TP4 -> TP2: two sources write each target");
    for i in 0..4 {
        let r = live.push(&ex, None, i, None).unwrap();
        assert_eq!(r.delivered.len(), 2, "begin + done to the one target of source {i}");
        let t = i / 2;
        let msgs = engine.take(&endpoint(t));
        assert_eq!(msgs.len(), 2);
        feed(&mut acc[t], &msgs);
        let want = if i % 2 == 0 {
            // The first writer done, the second silent: its call is missing.
            TargetOutcome::Torn { incomplete: vec![(pid(tp(i as u64 + 1)), format!("source-t{}", i + 1))] }
        } else {
            TargetOutcome::Updated { weight_generation: 3 }
        };
        assert_eq!(acc[t].outcome(), want);
    }
    // Replaying any accepted message is refused and changes nothing.
    let r = live.push(&ex, None, 0, None).unwrap();
    let msgs = engine.take(&endpoint(0));
    feed(&mut acc[0], &msgs);
    assert_eq!(acc[0].outcome(), TargetOutcome::Updated { weight_generation: 3 }, "a re-run completes again");
    for m in &msgs {
        let e = acc[0].accept(m).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Replayed, "{e}");
    }
    assert_eq!(acc[0].outcome(), TargetOutcome::Updated { weight_generation: 3 });
    assert_eq!(r.delivered[0].kind, NotifyKind::Begin);
}

#[test]
fn a_writer_that_began_and_died_leaves_the_target_torn() {
    let live = Live::new(1);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    engine.inner.set_submit(&endpoint(0), Submit::Ticket(FakeTicket::new(CompletionStatus::FailedDrained)));
    let e = live.push(&ex, None, 0, None).unwrap_err();
    assert!(e.submitted, "{e}");
    let mut acc = live.acceptor(0, None);
    let msgs = engine.take(&endpoint(0));
    assert_eq!(msgs.len(), 1, "begin only");
    feed(&mut acc, &msgs);
    match acc.outcome() {
        TargetOutcome::Torn { incomplete } => assert!(incomplete.contains(&(pid(tp(0)), "source-t0".into()))),
        o => panic!("expected Torn, got {o:?}"),
    }
}

#[test]
fn stale_leases_and_generations_are_refused_before_any_engine_call() {
    let live = Live::new(2);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    // A source placement of another generation.
    let stale = rows_placement(&tensors(), 4, 1);
    let e = live.push(&ex, None, 0, Some(&stale)).unwrap_err();
    assert_eq!(e.error_kind, ErrorKind::StaleBinding, "{e:?}");
    assert!(e.message.contains("weight_generation mismatch"), "{e}");
    // A target binding whose lease changed since the plan was bound.
    let mut moved = Live::new(2);
    moved.tb[1] = binding(&moved.dst, &pid(tp(1)), "target-t1", 0x41000, 5);
    let e = moved.push(&ex, None, 3, None).unwrap_err();
    assert_eq!(e.error_kind, ErrorKind::StaleBinding, "{e:?}");
    assert!(engine.inner.calls().is_empty(), "no engine call: {:?}", engine.inner.calls());
    assert_eq!(*engine.sent.lock(), 0, "no notification sent");
}

#[test]
fn a_failed_begin_writes_nothing_and_a_failed_done_is_reported() {
    let live = Live::new(1);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    *engine.fail_notify_at.lock() = Some(0);
    let e = live.push(&ex, None, 0, None).unwrap_err();
    assert!(!e.submitted && e.message.contains("notify begin"), "{e:?}");
    assert!(engine.inner.batches().is_empty(), "nothing written after a failed begin");
    *engine.fail_notify_at.lock() = Some(2);
    let e = live.push(&ex, None, 0, None).unwrap_err();
    assert!(e.submitted && e.message.contains("completed but notify done"), "{e:?}");
    assert!(!engine.inner.batches().is_empty());
    // Without notify support: refused before any transfer.
    let plain = Arc::new(Notifying {
        inner: FakeEngine::ticketed(),
        mailbox: Mutex::new(BTreeMap::new()),
        sent: Mutex::new(0),
        fail_notify_at: Mutex::new(None),
        notify_supported: false,
    });
    let ex = TransferExecutor::new(plain.clone(), ExecutorLimits::default()).unwrap();
    let e = live.push(&ex, None, 0, None).unwrap_err();
    assert_eq!(e.error_kind, ErrorKind::Unsupported, "{e:?}");
    assert!(plain.inner.batches().is_empty());
}

#[test]
fn forged_truncated_stale_and_misrouted_messages_change_nothing() {
    let key = [0x5au8; 32];
    let live = Live::new(4);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    live.push(&ex, Some(&key), 0, None).unwrap();
    let msgs = engine.take(&endpoint(0));
    let mut acc = live.acceptor(0, Some(&key));
    let before = acc.outcome();
    let refuse = |acc: &mut NotifyAcceptor, m: &[u8], want: NotifyRefusal, text: &str| {
        let e = acc.accept(m).unwrap_err();
        assert_eq!(e.refusal, want, "{e}");
        assert!(e.message.contains(text), "{text}: {e}");
    };
    let body = |m: &[u8]| decode(m, Some(&key)).unwrap();
    let done = body(&msgs[1]);
    // Truncated anywhere.
    for n in [1, 20, msgs[1].len() - 1] {
        let e = acc.accept(&msgs[1][..n]).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Truncated, "{n}: {e}");
    }
    // Without the key, or with another key: forged.
    refuse(&mut acc, &encode(&done, None), NotifyRefusal::Forged, "requires \"hmac-sha256\"");
    refuse(&mut acc, &encode(&done, Some(&[1u8; 32])), NotifyRefusal::Forged, "authentication failed");
    // Signed, but claims what the plan does not say.
    let mut m = done.clone();
    m.ranges = "00".repeat(32);
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::Forged, "other target ranges");
    let mut m = done.clone();
    m.source_participant = pid(tp(3));
    m.source_worker = "source-t3".into();
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::Forged, "does not write");
    // Done without begin.
    refuse(&mut acc, &msgs[1], NotifyRefusal::Forged, "done without begin");
    // Older generation, later generation, other plan, other target.
    let mut m = done.clone();
    m.generation = 3;
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::Stale, "older than the bound generation 4");
    m.generation = 5;
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::OtherPlan, "bound to generation 4");
    let mut m = done.clone();
    m.plan = "ff".repeat(32);
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::OtherPlan, "another plan");
    let mut m = done.clone();
    m.target_participant = pid(tp(1));
    refuse(&mut acc, &encode(&m, Some(&key)), NotifyRefusal::Misrouted, "this acceptor is for");
    assert_eq!(acc.outcome(), before, "refused messages change nothing");
    // The genuine pair is accepted, then replays are refused.
    feed(&mut acc, &msgs);
    refuse(&mut acc, &msgs[0], NotifyRefusal::Replayed, "replayed");
    refuse(&mut acc, &msgs[1], NotifyRefusal::Replayed, "replayed");
    // A superseded transfer's done is stale.
    live.push(&ex, Some(&key), 0, None).unwrap();
    let second = engine.take(&endpoint(0));
    let mut acc2 = live.acceptor(0, Some(&key));
    acc2.accept(&msgs[0]).unwrap();
    acc2.accept(&second[0]).unwrap();
    refuse(&mut acc2, &msgs[1], NotifyRefusal::Stale, "superseded");
}

/// Issue 43: the acceptor's replay memory is bounded. 100,000 distinct `begin`
/// messages of one writer used to be remembered (+33 MiB); now a writer may begin
/// `MAX_TRANSFERS_PER_WRITER` transfers under one acceptor, later ones are refused
/// (`TooMany`) and change nothing, and the genuine transfer is still accepted.
#[test]
fn the_replay_memory_of_an_acceptor_is_bounded_per_writer() {
    use mooncake_weight_store::protocol::transfer::notify::MAX_TRANSFERS_PER_WRITER;
    let key = [0x5au8; 32];
    let live = Live::new(4);
    let engine = Notifying::new(FakeEngine::ticketed());
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    live.push(&ex, Some(&key), 0, None).unwrap();
    let msgs = engine.take(&endpoint(0));
    let begin = decode(&msgs[0], Some(&key)).unwrap();
    let mut acc = live.acceptor(0, Some(&key));
    let mut m = begin.clone();
    for i in 0..MAX_TRANSFERS_PER_WRITER - 1 {
        m.transfer_id = format!("flood-{i}");
        acc.accept(&encode(&m, Some(&key))).unwrap();
    }
    acc.accept(&msgs[0]).unwrap(); // the last one it remembers: the genuine begin
    let torn = acc.outcome();
    for i in 0..2000 {
        m.transfer_id = format!("more-{i}");
        let e = acc.accept(&encode(&m, Some(&key))).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::TooMany, "{e}");
        assert!(e.message.contains("bind a new acceptor"), "{e}");
        assert_eq!(mooncake_weight_store::Error::from(e).kind(), mooncake_weight_store::ErrorKind::LimitExceeded);
    }
    assert_eq!(acc.outcome(), torn, "refused begins change nothing");
    acc.accept(&msgs[1]).unwrap(); // done of the genuine transfer: still accepted
    let e = acc.accept(&msgs[0]).unwrap_err();
    assert_eq!(e.refusal, NotifyRefusal::Replayed, "and its replay still refused: {e}");
}

#[test]
fn both_sides_compute_the_same_plan_identity_from_json() {
    let live = Live::new(1);
    let json = live.plan.to_json();
    let again = TransferPlan::from_json(&json, &live.tb, &live.sb).unwrap();
    assert_eq!(plan_identity(&again), plan_identity(&live.plan));
    let other = Live::new(2);
    assert_ne!(plan_identity(&other.plan), plan_identity(&live.plan));
    let m: NotifyMessage = serde_json::from_str(
        r#"{"kind":"begin","plan":"","generation":1,"resource_id":"","source_participant":"","source_worker":"","target_participant":"","transfer_id":"","operations":0,"bytes":0,"ranges":""}"#,
    )
    .unwrap();
    assert_eq!(decode(&encode(&m, None), None).unwrap(), m);
    assert!(NotifyAcceptor::new(&live.plan, "nobody", None)
        .unwrap_err()
        .message()
        .contains("not a target participant"));
    let _ = Side::Source;
}

/// Content checksums read device memory only through a device engine. Without one,
/// a source fragment in device memory refuses them, and so does an acceptor asked to
/// verify a device target, both before any byte is read (with one:
/// tests/device_memory.rs).
#[test]
fn content_checksums_refuse_device_memory() {
    use mooncake_weight_store::protocol::transfer::notify::{content_checksums, operations_into};
    let defs = tensors();
    let (src, dst) = (rows_placement(&defs, 4, 1), rows_placement(&defs, 2, 1));
    let device = MemoryKind::Device(0);
    let sb: Vec<_> = (0..4)
        .map(|i| binding_in(&src, &pid(tp(i)), &format!("source-t{i}"), 0x10000 + i * 0x1000, 1, device))
        .collect();
    let tb: Vec<_> = (0..2)
        .map(|i| binding_in(&dst, &pid(tp(i)), &format!("target-t{i}"), 0x40000 + i * 0x1000, 1, device))
        .collect();
    let logical =
        LogicalTransferPlan::plan(Arc::new(src.clone()), Arc::new(dst.clone()), PlanningLimits::reference()).unwrap();
    let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
    let e = &plan.executors(Side::Source)[0];
    let t = plan.operation_fragment(e.operation_indices[0] as usize, Side::Target).0.participant_id().to_string();
    let ops = operations_into(&plan, e, &t);
    // SAFETY: refused before any read (the addresses are not mapped).
    let err = unsafe { content_checksums(&plan, &ops, Side::Source, None) }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.message().contains("device memory") && err.message().contains("needs a device engine"), "{err}");
    let mut acc = NotifyAcceptor::new(&plan, &t, None).unwrap();
    // SAFETY: as above.
    let err = unsafe { acc.verify_content() }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.message().contains("target fragment") && err.message().contains("needs a device engine"), "{err}");
    assert!(!acc.verifies_content());
}
