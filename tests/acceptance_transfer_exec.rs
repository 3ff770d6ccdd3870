//! Acceptance items 323–383 and 387 of `acceptance-live-transfer.md`: the sink and
//! reader executors, lowering and batching, registration, completion tracking,
//! pending transfers, engine identity, quarantine and lifetime guards, against the
//! scripted fake engine of `tests/common/fake_engine.rs`; and the coordinator's
//! per-target verdict (§12.2).

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;

use builders::{pid, tp};
use fake_engine::*;
use mooncake_weight_store::engine::{CompletionStatus, Direction, TransferBatch, TransferBatchRange, TransferEngine};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::completion::drain_pending_transfers;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::*;
use std::sync::Arc;

const RESTART: &str = "COMPLETION_UNKNOWN_RESTART_REQUIRED";

/// A bound live plan with its placements, bindings, guards and leases.
struct Live {
    src: Arc<Placement>,
    dst: Arc<Placement>,
    sb: Vec<RuntimeBinding>,
    tb: Vec<RuntimeBinding>,
    plan: TransferPlan,
    log: ReleaseLog,
    guards: GuardProviders,
}

impl Live {
    fn new(src: Placement, sb: Vec<RuntimeBinding>, dst: Placement, tb: Vec<RuntimeBinding>) -> Live {
        let (src, dst) = (Arc::new(src), Arc::new(dst));
        let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), PlanningLimits::reference()).unwrap();
        let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
        let log = ReleaseLog::default();
        let guards = GuardProviders::all(RecordingGuard::new(&log));
        Live { src, dst, sb, tb, plan, log, guards }
    }
    /// `manifests(s, "source", 0x10000)` -> `manifests(t, "target", 0x40000)`.
    fn tp(s: u64, t: u64) -> Live {
        let (src, sb) = manifests(s, "source", 0x10000);
        let (dst, tb) = manifests(t, "target", 0x40000);
        Live::new(src, sb, dst, tb)
    }
    fn leases(bs: &[RuntimeBinding]) -> Vec<MemoryRegistrationLease> {
        bs.iter()
            .flat_map(|b| {
                b.fragments()
                    .iter()
                    .map(|f| MemoryRegistrationLease::from_fragment(f, b.lease_generation(), Some(b.lease_id())))
            })
            .collect()
    }
    fn target_leases(&self) -> Vec<MemoryRegistrationLease> {
        Self::leases(&self.tb)
    }
    fn source_leases(&self) -> Vec<MemoryRegistrationLease> {
        Self::leases(&self.sb)
    }
    fn sink_with(
        &self,
        ex: &TransferExecutor,
        source: &RuntimeBinding,
        targets: &[RuntimeBinding],
        leases: Option<&[MemoryRegistrationLease]>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let args = ExecuteArgs {
            remote_registrations: leases,
            source_guards: Some(&self.guards),
            target_guards: Some(&self.guards),
            ..Default::default()
        };
        // SAFETY: the fake engine never touches memory.
        unsafe { ex.execute_sink(&self.plan, &self.src, source, &self.dst, targets, &args) }
    }
    fn sink(&self, ex: &TransferExecutor, i: usize) -> TransferResult<Vec<TransferReceipt>> {
        let leases = self.target_leases();
        self.sink_with(ex, &self.sb[i], &self.tb, Some(&leases))
    }
    fn reader_with(
        &self,
        ex: &TransferExecutor,
        args: &ExecuteArgs<'_>,
        target: &RuntimeBinding,
    ) -> TransferResult<Vec<TransferReceipt>> {
        // SAFETY: the fake engine never touches memory.
        unsafe { ex.execute_reader(&self.plan, &self.src, &self.sb, &self.dst, target, args) }
    }
    fn reader(
        &self,
        ex: &TransferExecutor,
        i: usize,
        target_pre_registered: bool,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let sl = self.source_leases();
        let tl = self.target_leases();
        let args = ExecuteArgs {
            remote_registrations: Some(&sl),
            local_pre_registered: target_pre_registered,
            local_registrations: target_pre_registered.then_some(tl.as_slice()),
            source_guards: Some(&self.guards),
            target_guards: Some(&self.guards),
            ..Default::default()
        };
        self.reader_with(ex, &args, &self.tb[i])
    }
    fn releases(&self) -> Vec<(String, &'static str)> {
        self.log.lock().clone()
    }
}

fn exec(engine: &Arc<FakeEngine>) -> TransferExecutor {
    TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap()
}

fn exec_with(engine: &Arc<FakeEngine>, f: impl FnOnce(&mut ExecutorLimits)) -> TransferExecutor {
    let mut l = ExecutorLimits::default();
    f(&mut l);
    TransferExecutor::new(engine.clone(), l).unwrap()
}

#[track_caller]
fn err_has<T: std::fmt::Debug>(r: TransferResult<T>, needle: &str) -> TransferError {
    let e = r.expect_err("expected an error");
    assert!(e.message.contains(needle), "error {:?} does not contain {needle:?}", e.message);
    e
}

/// Rebuilds a binding with changes to its spec and its fragments' specs.
fn respec(
    b: &RuntimeBinding,
    f: impl Fn(&mut RuntimeBindingSpec),
    g: impl Fn(&mut RuntimeFragmentSpec),
) -> RuntimeBinding {
    let frags = b
        .fragments()
        .iter()
        .map(|x| {
            let mut s = RuntimeFragmentSpec {
                placement_fragment_id: x.placement_fragment_id().into(),
                fragment_id: x.fragment_id().into(),
                address: x.address(),
                nbytes: x.nbytes(),
                worker_id: x.worker_id().into(),
                endpoint: x.endpoint().into(),
                device: x.device().into(),
                itemsize: x.itemsize(),
                local_shape: x.local_shape().to_vec(),
                strides_bytes: x.strides_bytes().to_vec(),
                storage_address: x.storage_address(),
                storage_nbytes: x.storage_nbytes(),
                storage_offset_bytes: x.storage_offset_bytes(),
                memory: x.memory(),
            };
            g(&mut s);
            RuntimeFragment::new(s).unwrap()
        })
        .collect();
    let mut s = RuntimeBindingSpec {
        resource_id: b.resource_id().into(),
        placement_id: b.placement_id().into(),
        placement_digest: b.placement_digest().into(),
        instance_id: b.instance_id().into(),
        lease_generation: b.lease_generation(),
        lease_id: b.lease_id().into(),
        revision: b.revision().into(),
        participant_id: b.participant_id().into(),
        fragments: frags,
    };
    f(&mut s);
    RuntimeBinding::new(s).unwrap()
}

fn receipt(direction: Direction, worker: &str, endpoint: &str, ops: u64, nbytes: u64) -> TransferReceipt {
    TransferReceipt { direction, worker_id: worker.into(), endpoint: endpoint.into(), operation_count: ops, nbytes }
}

// ---------------------------------------------------------------------------
// Sink
// ---------------------------------------------------------------------------

#[test]
fn acc_323_sink_tp2_to_tp4_writes_two_endpoints() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec(&engine), 0).unwrap();
    assert_eq!(
        r,
        vec![
            receipt(Direction::Write, "source-t0", "target-t0:12345", 1, 2),
            receipt(Direction::Write, "source-t0", "target-t1:12345", 1, 2)
        ]
    );
    assert_eq!(r.iter().map(|x| x.nbytes).sum::<u64>(), 4);
    assert_eq!(
        engine.batches(),
        vec![
            ("target-t0:12345".to_string(), vec![0x10000], vec![0x40000], vec![2]),
            ("target-t1:12345".to_string(), vec![0x10002], vec![0x41000], vec![2]),
        ]
    );
    assert_eq!(engine.registers(), vec![(0x10000, 4)]);
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_324_sink_registers_the_whole_allocation_of_offset_views() {
    let (src, sb) = manifests(2, "source", 0x10000);
    let (dst, tb) = manifests(4, "target", 0x40000);
    let sb: Vec<_> = sb
        .iter()
        .map(|b| {
            respec(
                b,
                |_| {},
                |f| {
                    f.storage_address = f.address - 0x1000;
                    f.storage_nbytes = 0x2000;
                    f.storage_offset_bytes = 0x1000;
                },
            )
        })
        .collect();
    let tb: Vec<_> = tb
        .iter()
        .map(|b| {
            respec(
                b,
                |_| {},
                |f| {
                    f.storage_address = f.address - 0x800;
                    f.storage_nbytes = 0x1000;
                    f.storage_offset_bytes = 0x800;
                },
            )
        })
        .collect();
    let live = Live::new(src, sb, dst, tb);
    let engine = FakeEngine::legacy();
    live.sink(&exec(&engine), 0).unwrap();
    assert_eq!(engine.registers(), vec![(0xF000, 0x2000)]);
    assert_eq!(
        engine.batches(),
        vec![
            ("target-t0:12345".to_string(), vec![0x10000], vec![0x40000], vec![2]),
            ("target-t1:12345".to_string(), vec![0x10002], vec![0x41000], vec![2]),
        ]
    );
    assert_eq!(engine.unregisters(), vec![0xF000]);
}

#[test]
fn acc_325_sink_requires_matching_target_registrations() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    err_has(live.sink_with(&ex, &live.sb[0], &live.tb, None), "target registration");
    let mut leases = live.target_leases();
    leases.iter_mut().for_each(|l| l.lease_generation = 2);
    err_has(live.sink_with(&ex, &live.sb[0], &live.tb, Some(&leases)), "target registration");
    assert!(engine.calls().is_empty());
    // Every pin was released as aborted.
    assert!(live.releases().iter().all(|r| r.1 == "aborted"));
}

#[test]
fn acc_326_sink_failed_drained_ticket_is_a_known_failure() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    engine.set_submit("target-t1:12345", Submit::Ticket(FakeTicket::new(CompletionStatus::FailedDrained)));
    let e = err_has(live.sink(&exec(&engine), 0), "batch transfer to target-t1:12345 failed: FAILED_DRAINED");
    assert_eq!(e.kind, TransferErrorKind::CompletionFailed);
    assert_eq!(e.pending_transfer_id, None);
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_327_raising_legacy_write_is_restart_required() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    engine.set_legacy("target-t0:12345", Step::Raise("native boom".into()));
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert!(engine.unregisters().is_empty());
    assert_eq!(ex.pending_transfer_status(e.pending_transfer_id.as_deref().unwrap()).unwrap(), RESTART);
}

#[test]
fn acc_328_stale_source_binding_is_a_snapshot_mismatch() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let leases = live.target_leases();
    let g2 = respec(&live.sb[0], |s| s.lease_generation = 2, |_| {});
    err_has(live.sink_with(&ex, &g2, &live.tb, Some(&leases)), "source executor snapshot mismatch");
    let rolled = respec(
        &live.sb[0],
        |s| {
            s.lease_generation = 2;
            s.instance_id = "source-t0-restarted".into();
        },
        |f| {
            f.fragment_id = "source-t0-new".into();
            f.worker_id = "source-t0-new".into();
        },
    );
    err_has(live.sink_with(&ex, &rolled, &live.tb, Some(&leases)), "source executor snapshot mismatch");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_329_stale_target_binding_is_a_snapshot_mismatch() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let leases = live.target_leases();
    for change in [0, 1] {
        let mut tb = live.tb.clone();
        tb[0] = respec(
            &tb[0],
            |s| s.lease_generation = 2,
            |f| {
                if change == 0 {
                    f.address = 0x90000;
                    f.storage_address = 0x90000;
                } else {
                    f.fragment_id = "target-t0-new".into();
                }
            },
        );
        err_has(live.sink_with(&ex, &live.sb[0], &tb, Some(&leases)), "target executor snapshot mismatch");
    }
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_330_other_revision_is_a_revision_mismatch() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let leases = live.target_leases();
    let src43 = split_placement(&gate_up(), 2, 1, "step-43");
    let sb43 = live_binding(&src43, &pid(tp(0)), "source-t0", 0x10000, 1);
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    // SAFETY: fake engine.
    let r = unsafe { ex.execute_sink(&live.plan, &src43, &sb43, &live.dst, &live.tb, &args) };
    err_has(r, "revision mismatch");
    let dst43 = split_placement(&gate_up(), 4, 1, "step-43");
    let tb43: Vec<_> =
        (0..4).map(|i| live_binding(&dst43, &pid(tp(i)), &format!("target-t{i}"), 0x40000 + i * 0x1000, 1)).collect();
    // SAFETY: fake engine.
    let r = unsafe { ex.execute_sink(&live.plan, &live.src, &live.sb[0], &dst43, &tb43, &args) };
    err_has(r, "revision mismatch");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_331_receipt_names_the_worker_not_the_instance() {
    let (src, sb) = manifests(2, "source", 0x10000);
    let sb: Vec<_> = sb
        .iter()
        .map(|b| respec(b, |s| s.instance_id = format!("serving-instance-{}", s.participant_id), |_| {}))
        .collect();
    let (dst, tb) = manifests(4, "target", 0x40000);
    let live = Live::new(src, sb, dst, tb);
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec(&engine), 0).unwrap();
    assert!(r.iter().all(|x| x.worker_id == "source-t0"));
}

fn dp2_source() -> Live {
    use builders::*;
    let t = tensor("layers.0.mlp.gate_up", &[8], 1, &[split(Tp, 0), repl(Dp)]);
    let src = split_placement(&t, 2, 2, "step-42");
    let sb: Vec<_> = src
        .parts()
        .iter()
        .map(|p| {
            let r = p.rank();
            live_binding(
                &src,
                p.participant_id(),
                &format!("source-d{}-t{}", r.dp, r.tp),
                0x10000 + (r.dp * 2 + r.tp) * 0x1000,
                1,
            )
        })
        .collect();
    let (dst, tb) = manifests(4, "target", 0x40000);
    Live::new(src, sb, dst, tb)
}

#[test]
fn acc_332_unselected_dp_replica_returns_nothing() {
    let live = dp2_source();
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let leases = live.target_leases();
    let dp1 = live.sb.iter().find(|b| b.participant_id().starts_with("dp1")).unwrap().clone();
    let log = ReleaseLog::default();
    let guard = RecordingGuard::new(&log);
    let guards = GuardProviders::all(guard.clone());
    let stale = respec(
        &dp1,
        |s| s.lease_generation = 2,
        |f| {
            f.address += 0x100000;
            f.storage_address += 0x100000;
            f.endpoint = "elsewhere:1".into();
        },
    );
    for b in [dp1, stale] {
        let args = ExecuteArgs {
            remote_registrations: Some(&leases),
            source_guards: Some(&guards),
            target_guards: Some(&guards),
            ..Default::default()
        };
        // SAFETY: fake engine.
        let r = unsafe { ex.execute_sink(&live.plan, &live.src, &b, &live.dst, &live.tb, &args) }.unwrap();
        assert!(r.is_empty());
    }
    assert!(engine.calls().is_empty());
    assert_eq!(*guard.acquired.lock(), 0);
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

#[test]
fn acc_333_reader_pulls_with_pre_registered_target() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let r = live.reader(&exec(&engine), 1, true).unwrap();
    assert_eq!(r, vec![receipt(Direction::Read, "target-t1", "source-t0:12345", 1, 2)]);
    assert_eq!(engine.batches(), vec![("source-t0:12345".to_string(), vec![0x41000], vec![0x10002], vec![2])]);
    assert!(engine.registers().is_empty() && engine.unregisters().is_empty());
}

#[test]
fn acc_334_register_failure_is_an_engine_error() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    *engine.register.lock() = Step::Raise("register exploded".into());
    let e = err_has(live.reader(&exec(&engine), 1, false), "register exploded");
    assert_eq!(e.kind, TransferErrorKind::Engine);
    assert!(!e.submitted);
    assert!(engine.batches().is_empty());
    assert!(live.releases().iter().all(|r| r.1 == "aborted"));
}

fn reader_with_source_leases(
    live: &Live,
    ex: &TransferExecutor,
    sl: Option<&[MemoryRegistrationLease]>,
) -> TransferResult<Vec<TransferReceipt>> {
    let tl = live.target_leases();
    let args = ExecuteArgs {
        remote_registrations: sl,
        local_pre_registered: true,
        local_registrations: Some(&tl),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    live.reader_with(ex, &args, &live.tb[1])
}

#[test]
fn acc_335_reader_requires_current_source_leases() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    err_has(reader_with_source_leases(&live, &ex, None), "source registration leases");
    let mut g2 = live.source_leases();
    g2.iter_mut().for_each(|l| l.lease_generation = 2);
    err_has(reader_with_source_leases(&live, &ex, Some(&g2)), "source registration lease mismatch");
    let mut stale = live.source_leases();
    stale.iter_mut().for_each(|l| l.runtime_lease_id = Some("stale-runtime-lease".into()));
    err_has(reader_with_source_leases(&live, &ex, Some(&stale)), "source registration lease mismatch");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_336_any_changed_lease_field_is_a_mismatch() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    type Change = Box<dyn Fn(&mut MemoryRegistrationLease)>;
    let changes: Vec<Change> = vec![
        Box::new(|l| {
            l.address = 0x90000;
            l.storage_address = 0x90000;
        }),
        Box::new(|l| l.nbytes = 1),
        Box::new(|l| l.lease_generation = 2),
        Box::new(|l| l.runtime_lease_id = Some("other-lease".into())),
    ];
    for change in changes {
        let mut leases = live.source_leases();
        leases.iter_mut().for_each(&change);
        err_has(reader_with_source_leases(&live, &ex, Some(&leases)), "source registration lease mismatch");
    }
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_337_leases_only_for_used_source_fragments_suffice() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let used: Vec<_> = live.source_leases().into_iter().filter(|l| l.worker_id == "source-t0").collect();
    let r = reader_with_source_leases(&live, &exec(&engine), Some(&used)).unwrap();
    assert_eq!(r.iter().map(|x| x.nbytes).sum::<u64>(), 2);
}

#[test]
fn acc_338_reader_needs_every_planned_source() {
    let live = Live::tp(2, 1);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let sl = live.source_leases();
    let args = ExecuteArgs {
        remote_registrations: Some(&sl),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    // SAFETY: fake engine.
    let r = unsafe { ex.execute_reader(&live.plan, &live.src, &live.sb[..1], &live.dst, &live.tb[0], &args) };
    err_has(r, "source executor set is incomplete");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_339_failed_read_names_the_source_endpoint() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    engine.set_submit("source-t0:12345", Submit::Ticket(FakeTicket::new(CompletionStatus::FailedDrained)));
    let e = err_has(live.reader(&exec(&engine), 1, true), "source-t0:12345");
    assert!(e.message.contains("batch transfer from source-t0:12345 failed: FAILED_DRAINED"));
    assert_eq!(e.kind, TransferErrorKind::CompletionFailed);
}

#[test]
fn acc_340_target_registrations_need_pre_registered_mode() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let sl = live.source_leases();
    let tl = live.target_leases();
    let args = ExecuteArgs {
        remote_registrations: Some(&sl),
        local_pre_registered: false,
        local_registrations: Some(&tl),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    err_has(live.reader_with(&exec(&engine), &args, &live.tb[1]), "target_pre_registered");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_341_legacy_read_minus_two_is_restart_required() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    engine.set_legacy("source-t0:12345", Step::Code(-2));
    let ex = exec(&engine);
    let e = live.reader(&ex, 1, false).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert!(e.message.contains("restart-required"));
    let id = e.pending_transfer_id.clone().unwrap();
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), RESTART);
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETION_UNKNOWN");
    assert!(engine.unregisters().is_empty());
}

// ---------------------------------------------------------------------------
// Lowering and batching
// ---------------------------------------------------------------------------

/// Tensor (4,6,8) uint8, source EP2 split on dim 0, target TP2 split on dim 2.
fn nd_fixture() -> Live {
    use builders::*;
    let ts = tensor("nd", &[4, 6, 8], 1, &[split(Ep, 0)]);
    let tt = tensor("nd", &[4, 6, 8], 1, &[split(Tp, 2)]);
    let sr = [rank(0, 0, 0, 0), rank(0, 0, 1, 0)];
    let src = flat_with(
        &live_ids("step-42"),
        topo(1, 1, 2, 1, &sr),
        vec![ts.clone()],
        vec![frag(&ts, &[0, 0, 0], &[2, 6, 8], sr[0]), frag(&ts, &[2, 0, 0], &[2, 6, 8], sr[1])],
    )
    .unwrap();
    let tr = [tp(0), tp(1)];
    let dst = flat_with(
        &live_ids("step-42"),
        topo(1, 1, 1, 2, &tr),
        vec![tt.clone()],
        vec![frag(&tt, &[0, 0, 0], &[4, 6, 4], tr[0]), frag(&tt, &[0, 0, 4], &[4, 6, 4], tr[1])],
    )
    .unwrap();
    let sb = (0..2)
        .map(|e| live_binding(&src, &pid(sr[e]), &format!("source-t{e}"), 0x10000 + e as u64 * 0x1000, 1))
        .collect();
    let tb = (0..2)
        .map(|t| live_binding(&dst, &pid(tr[t]), &format!("target-t{t}"), 0x40000 + t as u64 * 0x1000, 1))
        .collect();
    Live::new(src, sb, dst, tb)
}

#[test]
fn acc_342_nd_batches_respect_max_batch_operations() {
    let live = nd_fixture();
    let engine = FakeEngine::legacy();
    let ex = exec_with(&engine, |l| {
        l.max_batch_operations = 5;
        l.max_region_segments = 12;
    });
    let r = live.sink(&ex, 0).unwrap();
    assert_eq!(r.iter().map(|x| x.operation_count).collect::<Vec<_>>(), vec![12, 12]);
    assert_eq!(r.iter().map(|x| x.nbytes).collect::<Vec<_>>(), vec![48, 48]);
    assert_eq!(engine.batch_sizes(), vec![5, 5, 2, 5, 5, 2]);
    let engine = FakeEngine::legacy();
    let ex = exec_with(&engine, |l| {
        l.max_batch_operations = 5;
        l.max_region_segments = 12;
    });
    let r = live.reader(&ex, 1, true).unwrap();
    assert_eq!(r.iter().map(|x| x.operation_count).collect::<Vec<_>>(), vec![12, 12]);
    assert_eq!(r.iter().map(|x| x.nbytes).collect::<Vec<_>>(), vec![48, 48]);
    assert_eq!(engine.batch_sizes(), vec![5, 5, 2, 5, 5, 2]);
}

#[test]
fn acc_343_max_region_segments_refuses_before_any_call() {
    let live = nd_fixture();
    let engine = FakeEngine::legacy();
    let ex = exec_with(&engine, |l| l.max_region_segments = 11);
    err_has(live.sink(&ex, 0), "max_region_segments");
    err_has(live.reader(&ex, 1, false), "max_region_segments");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_344_tp1_to_tp1_is_one_batch() {
    let live = Live::tp(1, 1);
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec(&engine), 0).unwrap();
    assert_eq!(engine.batch_sizes(), vec![1]);
    assert_eq!(r, vec![receipt(Direction::Write, "source-t0", "target-t0:12345", 1, 8)]);
}

fn dim1_fixture(rows_: u64, s: u64, t: u64) -> Live {
    use builders::*;
    let ten = tensor("w", &[rows_, 8], 1, &[split(Tp, 1)]);
    let mk = |n: u64| {
        let ranks: Vec<_> = (0..n).map(tp).collect();
        let w = 8 / n;
        let frags = ranks.iter().map(|&r| frag(&ten, &[0, r.tp * w], &[rows_, w], r)).collect();
        flat_with(&live_ids("step-42"), topo(1, 1, 1, n, &ranks), vec![ten.clone()], frags).unwrap()
    };
    let (src, dst) = (mk(s), mk(t));
    let sb =
        (0..s).map(|i| live_binding(&src, &pid(tp(i)), &format!("source-t{i}"), 0x10000 + i * 0x10_0000, 1)).collect();
    let tb =
        (0..t).map(|i| live_binding(&dst, &pid(tp(i)), &format!("target-t{i}"), 0x40000 + i * 0x10_0000, 1)).collect();
    Live::new(src, sb, dst, tb)
}

#[test]
fn acc_345_dim1_split_batches_of_two() {
    let live = dim1_fixture(5, 2, 4);
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec_with(&engine, |l| l.max_batch_operations = 2), 0).unwrap();
    assert_eq!(engine.batch_sizes(), vec![2, 2, 1, 2, 2, 1]);
    assert_eq!(r.iter().map(|x| x.operation_count).sum::<u64>(), 10);
    assert_eq!(r.iter().map(|x| x.nbytes).sum::<u64>(), 20);
}

#[test]
fn acc_346_large_regions_stream_in_batches_of_1024() {
    let live = dim1_fixture(8192, 2, 1);
    let engine = FakeEngine::legacy();
    let r = live.reader(&exec(&engine), 0, true).unwrap();
    let b = engine.batches();
    assert_eq!(b.len(), 16);
    assert!(b[..8].iter().all(|x| x.0 == "source-t0:12345" && x.3.len() == 1024));
    assert!(b[8..].iter().all(|x| x.0 == "source-t1:12345" && x.3.len() == 1024));
    assert_eq!(r.iter().map(|x| (x.operation_count, x.nbytes)).collect::<Vec<_>>(), vec![(8192, 32768); 2]);
    assert_eq!(b[0].1[0], 0x40000);
    assert_eq!(*b[7].1.last().unwrap(), 0x40000 + 8191 * 8);
    assert_eq!(b[8].1[0], 0x40004);
}

#[test]
fn acc_347_ranges_are_allocation_relative() {
    let range = TransferBatchRange {
        source_base_address: 0x1000,
        source_capacity: 0x1000,
        target_base_address: 0x2000,
        target_capacity: 0x1000,
        source_offsets: vec![0x100 + 1, 0x100 + 4],
        target_offsets: vec![0x280 + 2, 0x280 + 8],
        sizes: vec![3, 2],
    };
    let b = TransferBatch::from_ranges("peer:1", Direction::Write, vec![range]).unwrap();
    assert_eq!(b.ranges().len(), 1);
    assert_eq!(b.ranges()[0].source_offsets, vec![0x101, 0x104]);
    assert_eq!(b.ranges()[0].target_offsets, vec![0x282, 0x288]);
    assert_eq!(b.source_addresses(), &[0x1100 + 1, 0x1100 + 4]);
    assert_eq!(b.target_addresses(), &[0x2280 + 2, 0x2280 + 8]);
    // And the executor lowers offset views the same way (item 324).
}

fn two_ranges(direction: Direction) -> TransferBatch {
    TransferBatch::from_ranges(
        "worker-1:12345",
        direction,
        vec![
            TransferBatchRange {
                source_base_address: 0x1000,
                source_capacity: 0x400,
                target_base_address: 0x3000,
                target_capacity: 0x800,
                source_offsets: vec![0x20, 0x100],
                target_offsets: vec![0x40, 0x200],
                sizes: vec![64, 128],
            },
            TransferBatchRange {
                source_base_address: 0x5000,
                source_capacity: 0x100,
                target_base_address: 0x7000,
                target_capacity: 0x100,
                source_offsets: vec![0],
                target_offsets: vec![0x20],
                sizes: vec![32],
            },
        ],
    )
    .unwrap()
}

#[test]
fn acc_348_legacy_read_flattens_ranges() {
    let engine = FakeEngine::legacy();
    assert_eq!(engine.batch_transfer_sync(&two_ranges(Direction::Read)).unwrap(), 0);
    assert_eq!(
        engine.batches(),
        vec![(
            "worker-1:12345".to_string(),
            vec![0x3040, 0x3200, 0x7020],
            vec![0x1020, 0x1100, 0x5000],
            vec![64, 128, 32]
        )]
    );
    let w = two_ranges(Direction::Write);
    assert_eq!(w.local_addresses(), &[0x1020, 0x1100, 0x5000]);
    assert_eq!((w.operation_count(), w.nbytes()), (3, 224));
}

#[test]
fn acc_349_scatter_engines_get_ranges_with_local_and_remote_swapped_by_direction() {
    let engine = FakeEngine::scatter();
    let ex = exec(&engine);
    // Through the executor (the preferred method is the scatter call): a read.
    let live = Live::tp(2, 4);
    let r = live.reader(&ex, 1, true).unwrap();
    assert_eq!(r.iter().map(|x| x.nbytes).sum::<u64>(), 2);
    assert!(engine.batches().is_empty(), "no flat batch call when scatter exists");
    let calls = engine.scatter.as_ref().unwrap().lock().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].direction, Direction::Read);
    assert_eq!((calls[0].local_bases.clone(), calls[0].remote_bases.clone()), (vec![0x41000], vec![0x10000]));
    assert_eq!((calls[0].local_offsets.clone(), calls[0].remote_offsets.clone()), (vec![vec![0]], vec![vec![2]]));
    // The reference's two-range batch: READ local = targets, WRITE swaps.
    let read = two_ranges(Direction::Read);
    let ranges: Vec<_> = read.local_ranges().collect();
    assert_eq!(ranges.iter().map(|r| r.local_base).collect::<Vec<_>>(), vec![0x3000, 0x7000]);
    assert_eq!(ranges.iter().map(|r| r.local_capacity).collect::<Vec<_>>(), vec![0x800, 0x100]);
    assert_eq!(ranges.iter().map(|r| r.remote_base).collect::<Vec<_>>(), vec![0x1000, 0x5000]);
    assert_eq!(ranges.iter().map(|r| r.remote_capacity).collect::<Vec<_>>(), vec![0x400, 0x100]);
    assert_eq!(
        ranges.iter().map(|r| r.local_offsets.to_vec()).collect::<Vec<_>>(),
        vec![vec![0x40, 0x200], vec![0x20]]
    );
    assert_eq!(ranges.iter().map(|r| r.remote_offsets.to_vec()).collect::<Vec<_>>(), vec![vec![0x20, 0x100], vec![0]]);
    assert_eq!(ranges.iter().map(|r| r.sizes.to_vec()).collect::<Vec<_>>(), vec![vec![64, 128], vec![32]]);
    assert_eq!((read.operation_count(), read.nbytes()), (3, 224));
    let write = two_ranges(Direction::Write);
    let w: Vec<_> = write.local_ranges().collect();
    assert_eq!(w.iter().map(|r| r.local_base).collect::<Vec<_>>(), vec![0x1000, 0x5000]);
    assert_eq!(w.iter().map(|r| r.remote_base).collect::<Vec<_>>(), vec![0x3000, 0x7000]);
}

#[test]
fn acc_372_unknown_scatter_ticket_is_retained_then_drained() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::scatter();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 1);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert!(engine.unregisters().is_empty());
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(e.pending_transfer_id.as_deref().unwrap(), 0).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_350_batch_construction_validates_ranges() {
    let ok = || TransferBatchRange {
        source_base_address: 0x1000,
        source_capacity: 64,
        target_base_address: 0x2000,
        target_capacity: 64,
        source_offsets: vec![0],
        target_offsets: vec![0],
        sizes: vec![8],
    };
    let mut r = ok();
    r.sizes.push(1);
    assert!(r.validate().unwrap_err().message().contains("non-empty and aligned"));
    let mut r = ok();
    r.sizes[0] = 0;
    assert!(r.validate().unwrap_err().message().contains("size is invalid"));
    let mut r = ok();
    r.source_offsets[0] = 32;
    r.sizes[0] = 64;
    r.target_capacity = 0x1000;
    assert!(r.validate().unwrap_err().message().contains("source allocation bounds"));
    // Many segments: the first failing one names the error, wherever it is; offsets
    // near u64::MAX do not wrap into bounds.
    let many = || {
        let mut r = ok();
        r.source_offsets = (0..40).collect();
        r.target_offsets = (0..40).map(|i| 40 - i).collect();
        r.sizes = vec![8; 40];
        r
    };
    assert!(many().validate().is_ok());
    let mut r = many();
    r.target_offsets[17] = 57;
    r.sizes[30] = 0;
    assert!(r.validate().unwrap_err().message().contains("target allocation bounds"));
    let mut r = many();
    r.sizes[16] = 0;
    r.target_offsets[17] = 57;
    assert!(r.validate().unwrap_err().message().contains("size is invalid"));
    let mut r = many();
    r.source_offsets[39] = u64::MAX - 4;
    assert!(r.validate().unwrap_err().message().contains("source allocation bounds"));
    let b = TransferBatch::from_ranges("x:1", Direction::Write, vec![many(), many()]).unwrap();
    assert_eq!((b.operation_count(), b.nbytes()), (80, 640));
    assert!(TransferBatch::from_ranges("", Direction::Read, vec![ok()]).is_err());
    assert!(TransferBatch::from_ranges("x:1", Direction::Read, vec![]).is_err());
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

#[test]
fn acc_351_two_views_of_one_allocation_register_once() {
    use builders::*;
    let a = tensor("a", &[8], 1, &[repl(Tp)]);
    let b = tensor("b", &[8], 1, &[repl(Tp)]);
    let r0 = [tp(0)];
    let src = flat_with(
        &live_ids("step-42"),
        topo(1, 1, 1, 1, &r0),
        vec![a.clone(), b.clone()],
        vec![whole(&a, r0[0]), whole(&b, r0[0])],
    )
    .unwrap();
    let sb = live_binding(&src, &pid(r0[0]), "source-t0", 0x1000, 1);
    let sb = respec(
        &sb,
        |_| {},
        |f| {
            f.storage_offset_bytes = f.address - 0x1000;
            f.storage_address = 0x1000;
            f.storage_nbytes = 0x1000;
        },
    );
    let (dst, tb) = {
        let r = [tp(0), tp(1)];
        let dst = flat_with(
            &live_ids("step-42"),
            topo(1, 1, 1, 2, &r),
            vec![a.clone(), b.clone()],
            vec![whole(&a, r[0]), whole(&b, r[0]), whole(&a, r[1]), whole(&b, r[1])],
        )
        .unwrap();
        let tb =
            (0..2).map(|i| live_binding(&dst, &pid(tp(i)), &format!("target-t{i}"), 0x40000 + i * 0x1000, 1)).collect();
        (dst, tb)
    };
    let live = Live::new(src, vec![sb], dst, tb);
    let engine = FakeEngine::legacy();
    live.sink(&exec(&engine), 0).unwrap();
    assert_eq!(engine.registers(), vec![(0x1000, 0x1000)]);
    assert_eq!(engine.unregisters(), vec![0x1000]);
}

#[test]
fn acc_352_lease_ids_fence_before_any_native_call() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    // Sink with pre-registered source: a stale lease id in the registration lease.
    let tl = live.target_leases();
    let mut sl = live.source_leases();
    sl.iter_mut().for_each(|l| l.runtime_lease_id = Some("stale".into()));
    let args = ExecuteArgs {
        remote_registrations: Some(&tl),
        local_pre_registered: true,
        local_registrations: Some(&sl),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    // SAFETY: fake engine.
    let r = unsafe { ex.execute_sink(&live.plan, &live.src, &live.sb[0], &live.dst, &live.tb, &args) };
    err_has(r, "source registration lease mismatch");
    let mut tl2 = live.target_leases();
    tl2.iter_mut().for_each(|l| l.runtime_lease_id = Some("stale".into()));
    err_has(live.sink_with(&ex, &live.sb[0], &live.tb, Some(&tl2)), "target registration lease mismatch");
    // A rotated binding lease id: snapshot mismatch, on either side.
    let rotated = respec(&live.sb[0], |s| s.lease_id = "rotated".into(), |_| {});
    err_has(live.sink_with(&ex, &rotated, &live.tb, Some(&tl)), "source executor snapshot mismatch");
    let mut tb = live.tb.clone();
    tb[1] = respec(&tb[1], |s| s.lease_id = "rotated".into(), |_| {});
    let args = ExecuteArgs {
        remote_registrations: Some(&live.source_leases()),
        local_pre_registered: true,
        local_registrations: Some(&tl),
        source_guards: Some(&live.guards),
        target_guards: Some(&live.guards),
        ..Default::default()
    };
    err_has(live.reader_with(&ex, &args, &tb[1]), "target executor snapshot mismatch");
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_353_moved_storage_is_a_snapshot_mismatch() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    let moved = |b: &RuntimeBinding| {
        respec(
            b,
            |_| {},
            |f| {
                f.storage_address -= 1;
                f.storage_nbytes += 1;
                f.storage_offset_bytes = 1;
            },
        )
    };
    let tl = live.target_leases();
    err_has(live.sink_with(&ex, &moved(&live.sb[0]), &live.tb, Some(&tl)), "source executor snapshot mismatch");
    err_has(
        live.reader_with(
            &ex,
            &ExecuteArgs {
                remote_registrations: Some(&live.source_leases()),
                source_guards: Some(&live.guards),
                target_guards: Some(&live.guards),
                ..Default::default()
            },
            &moved(&live.tb[1]),
        ),
        "target executor snapshot mismatch",
    );
    assert!(engine.calls().is_empty());
}

#[test]
fn acc_354_failed_unregistration_is_quarantined_until_a_drain_succeeds() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    engine.unregister.lock().extend([Step::Code(-7), Step::Code(-8), Step::Code(-9)]);
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::RegistrationCleanupPending);
    let id = e.pending_transfer_id.clone().unwrap();
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETED");
    assert!(live.releases().is_empty(), "tokens are held");
    let d = ex.drain_pending_transfer(&id, 1000).unwrap_err();
    assert!(d.message.contains("registration cleanup failed"));
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    // Draining every pending transfer of the engine reports the same failure.
    let all = drain_pending_transfers(ex.engine_identity(), 1000).unwrap_err();
    assert!(all.message.contains("registration cleanup failed"), "{}", all.message);
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    assert!(live.releases().is_empty());
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert!(ex.pending_transfer_ids().is_empty());
    drain_pending_transfers(ex.engine_identity(), 1000).unwrap();
    assert_eq!(engine.unregisters(), vec![0x10000; 4]);
    assert!(!live.releases().is_empty() && live.releases().iter().all(|r| r.1 == "completed"));
}

#[test]
fn acc_355_interrupted_wait_unregisters_own_memory_only_at_the_drain() {
    let live = Live::tp(2, 4);
    // Sink (own source, pre-registered targets) and reader (own target, pre-registered sources).
    for reader in [false, true] {
        let engine = FakeEngine::ticketed();
        let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
        ticket.drain_script.lock().push_back(TicketStep::Interrupt("KeyboardInterrupt".into()));
        let ep = if reader { "source-t0:12345" } else { "target-t0:12345" };
        engine.set_submit(ep, Submit::Ticket(ticket.clone()));
        let ex = exec(&engine);
        let e = if reader { live.reader(&ex, 0, false) } else { live.sink(&ex, 0) }.unwrap_err();
        assert_eq!(e.kind, TransferErrorKind::Interrupted);
        assert!(engine.unregisters().is_empty());
        ticket.set(CompletionStatus::Completed);
        assert_eq!(ex.drain_pending_transfer(e.pending_transfer_id.as_deref().unwrap(), 1000).unwrap(), "COMPLETED");
        assert_eq!(engine.unregisters(), vec![if reader { 0x40000 } else { 0x10000 }]);
    }
}

// ---------------------------------------------------------------------------
// Completion, pending transfers, engine identity
// ---------------------------------------------------------------------------

fn unknown_then(terminal: CompletionStatus) -> Arc<FakeTicket> {
    let t = FakeTicket::new(terminal);
    t.status_script.lock().push_back(TicketStep::Status(CompletionStatus::CompletionUnknown));
    t.drain_script.lock().push_back(TicketStep::Status(CompletionStatus::CompletionUnknown));
    t
}

#[test]
fn acc_359_inline_drains_reach_a_terminal_status() {
    let live = Live::tp(2, 4);
    for reader in [false, true] {
        let engine = FakeEngine::ticketed();
        let ticket = unknown_then(CompletionStatus::Completed);
        let ep = if reader { "source-t0:12345" } else { "target-t0:12345" };
        engine.set_submit(ep, Submit::Ticket(ticket.clone()));
        let ex = exec(&engine);
        if reader { live.reader(&ex, 0, false) } else { live.sink(&ex, 0) }.unwrap();
        assert_eq!(ticket.drains(), vec![1000, 1000]);
        assert_eq!(engine.unregisters(), vec![if reader { 0x40000 } else { 0x10000 }]);
        // With a failed terminal status.
        let engine = FakeEngine::ticketed();
        engine.set_submit(ep, Submit::Ticket(unknown_then(CompletionStatus::FailedDrained)));
        let ex = exec(&engine);
        err_has(if reader { live.reader(&ex, 0, false) } else { live.sink(&ex, 0) }, "FAILED_DRAINED");
    }
}

#[test]
fn acc_360_legacy_minus_one_is_restart_required_and_blocks() {
    let live = Live::tp(2, 4);
    for reader in [false, true] {
        let engine = FakeEngine::legacy();
        engine.set_legacy(if reader { "source-t0:12345" } else { "target-t0:12345" }, Step::Code(-1));
        let ex = exec(&engine);
        let run = || if reader { live.reader(&ex, 0, false) } else { live.sink(&ex, 0) };
        let e = run().unwrap_err();
        assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
        assert!(engine.unregisters().is_empty());
        assert_eq!(ex.pending_transfer_status(e.pending_transfer_id.as_deref().unwrap()).unwrap(), RESTART);
        err_has(run(), "restart-required");
    }
    assert!(live.releases().is_empty(), "no token released");
}

#[test]
fn acc_361_always_unknown_ticket_is_drainable_later() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 2);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert_eq!(ticket.drains(), vec![1000, 1000]);
    let id = e.pending_transfer_id.unwrap();
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
    assert!(ex.pending_transfer_ids().is_empty());
}

#[test]
fn acc_362_interrupted_inline_drain_retains_everything() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    ticket.drain_script.lock().push_back(TicketStep::Interrupt("SystemExit: stop".into()));
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::Interrupted);
    assert_eq!(e.cause.as_deref(), Some("SystemExit: stop"));
    assert!(e.message.contains("SystemExit: stop"));
    let id = e.pending_transfer_id.unwrap();
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    assert!(engine.unregisters().is_empty() && live.releases().is_empty());
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_363_interrupted_submission_is_restart_required() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    engine.set_submit("target-t0:12345", Submit::Interrupt("KeyboardInterrupt".into()));
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::Interrupted);
    assert_eq!(ex.pending_transfer_status(e.pending_transfer_id.as_deref().unwrap()).unwrap(), RESTART);
    err_has(live.sink(&ex, 0), "restart-required");
}

#[test]
fn acc_364_raising_drains_count_as_attempts() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    ticket.drain_script.lock().extend((0..3).map(|_| TicketStep::Raise("backend unavailable".into())));
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 2);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert_eq!(ticket.drains(), vec![1000, 1000]);
    let id = e.pending_transfer_id.unwrap();
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETION_UNKNOWN");
    assert!(engine.unregisters().is_empty());
    ticket.set(CompletionStatus::FailedDrained);
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "FAILED_DRAINED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
    assert!(live.releases().iter().all(|r| r.1 == "failed_drained"));
}

#[test]
fn acc_365_other_engines_are_unaffected() {
    let live = Live::tp(2, 4);
    let bad = FakeEngine::legacy();
    bad.set_legacy("target-t0:12345", Step::Code(-2));
    live.sink(&exec(&bad), 0).unwrap_err();
    let good = FakeEngine::legacy();
    assert_eq!(live.sink(&exec(&good), 1).unwrap().len(), 2);
    assert_eq!(live.reader(&exec(&good), 1, true).unwrap().len(), 1);
}

#[test]
fn acc_366_pending_transfer_blocks_until_drained() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 0);
    let id = live.sink(&ex, 0).unwrap_err().pending_transfer_id.unwrap();
    err_has(live.sink(&ex, 0), "drain_pending_transfer");
    err_has(live.reader(&ex, 1, true), "drain_pending_transfer");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert!(ex.pending_transfer_ids().is_empty());
    engine.set_submit("target-t0:12345", Submit::Ticket(FakeTicket::new(CompletionStatus::Completed)));
    live.sink(&ex, 0).unwrap();
}

#[test]
fn acc_367_one_submission_per_engine_at_a_time() {
    let live = Arc::new(Live::tp(2, 4));
    let engine = FakeEngine::with_identity(0x51_0000_0367, false);
    engine.set_legacy("target-t0:12345", Step::Code(-2));
    let gate = Gate::new();
    *engine.gate.lock() = Some(gate.clone());
    let first = exec(&engine);
    let second = exec(&FakeEngine::with_identity(0x51_0000_0367, false));
    let (l, f) = (live.clone(), first.clone());
    let h = std::thread::spawn(move || l.sink(&f, 0));
    gate.wait_entered();
    let before = engine.calls().len();
    err_has(live.sink(&second, 1), "active resource transfer submission");
    assert_eq!(engine.calls().len(), before);
    gate.open();
    let e = h.join().unwrap().unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    let id = e.pending_transfer_id.unwrap();
    assert_eq!(second.pending_transfer_ids(), vec![id.clone()]);
    assert_eq!(second.drain_pending_transfer(&id, 0).unwrap(), "COMPLETION_UNKNOWN");
}

#[test]
fn acc_368_concurrent_drains_of_one_id() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 0);
    let id = live.sink(&ex, 0).unwrap_err().pending_transfer_id.unwrap();
    ticket.set(CompletionStatus::Completed);
    let gate = Gate::new();
    *ticket.gate.lock() = Some(gate.clone());
    let (ex2, id2) = (ex.clone(), id.clone());
    let h = std::thread::spawn(move || ex2.drain_pending_transfer(&id2, 1000));
    gate.wait_entered();
    err_has(ex.drain_pending_transfer(&id, 1000), "already being drained");
    gate.open();
    assert_eq!(h.join().unwrap().unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_369_restart_required_reader_blocks_sink_and_reader() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    engine.set_legacy("source-t0:12345", Step::Code(-2));
    let ex = exec(&engine);
    live.reader(&ex, 0, false).unwrap_err();
    let n = engine.calls().len();
    err_has(live.sink(&ex, 0), "restart-required");
    err_has(live.reader(&ex, 1, false), "restart-required");
    assert_eq!(engine.calls().len(), n);
}

#[test]
fn acc_370_engine_identity_failure_refuses_construction() {
    let engine = FakeEngine::legacy();
    *engine.identity_error.lock() = Some("getter exploded".into());
    let e = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap_err();
    assert!(e.message.contains("canonical engine identity"), "{}", e.message);
    *engine.identity_error.lock() = None;
    engine.identity.store(0, std::sync::atomic::Ordering::Relaxed);
    let e = TransferExecutor::new(engine, ExecutorLimits::default()).unwrap_err();
    assert!(e.message.contains("invalid canonical engine identity"));
}

#[test]
fn restarted_engine_is_refused() {
    // The engine behind an executor restarted (new identity): the executor refuses
    // to submit anything and its old identity's pending entries stay blocked.
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let ex = exec(&engine);
    engine.restart();
    err_has(live.sink(&ex, 0), "engine restarted");
    assert!(engine.calls().is_empty());
    live.sink(&exec(&engine), 0).unwrap();
}

#[test]
fn acc_371_wrappers_of_one_native_engine_share_fences() {
    let live = Live::tp(2, 4);
    let a = FakeEngine::with_identity(0xCAFE, true);
    let b = FakeEngine::with_identity(0xCAFE, true);
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    a.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let (ea, eb) = (exec_with(&a, |l| l.max_completion_drain_attempts = 0), exec(&b));
    let id = live.sink(&ea, 0).unwrap_err().pending_transfer_id.unwrap();
    err_has(live.sink(&eb, 0), "transfer engine has pending transfer");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ea.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    let r = live.sink(&eb, 0).unwrap();
    assert_eq!(r.iter().map(|x| x.operation_count).sum::<u64>(), 2);
}

#[test]
fn acc_372_unreadable_first_status_is_unknown_then_drainable() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::Completed);
    ticket.status_script.lock().push_back(TicketStep::Raise("status unreadable".into()));
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket));
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    assert!(!e.restart_required);
    assert_eq!(ex.drain_pending_transfer(e.pending_transfer_id.as_deref().unwrap(), 1000).unwrap(), "COMPLETED");
}

#[test]
fn acc_373_ticket_engines_use_the_ticket_methods() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let r = live.reader(&exec(&engine), 1, true).unwrap();
    let w = live.sink(&exec(&engine), 0).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(w.len(), 2);
    let calls = engine.calls();
    let batches: Vec<_> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Batch { direction, ticket, .. } => Some((*direction, *ticket)),
            _ => None,
        })
        .collect();
    assert_eq!(batches, vec![(Direction::Read, true), (Direction::Write, true), (Direction::Write, true)]);
}

// ---------------------------------------------------------------------------
// Quarantine and resource retention
// ---------------------------------------------------------------------------

/// A reader on target tp0 whose ticket stays unknown; the guard's tokens hold
/// `owner`. Returns the pending id.
fn pending_reader(live: &Live, engine: &Arc<FakeEngine>, ticket: &Arc<FakeTicket>, owner: &Arc<String>) -> String {
    engine.set_submit("source-t0:12345", Submit::Ticket(ticket.clone()));
    let log = ReleaseLog::default();
    let guards = GuardProviders::all(RecordingGuard::with_owner(&log, owner.clone()));
    let sl = live.source_leases();
    let args = ExecuteArgs {
        remote_registrations: Some(&sl),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let ex = exec_with(engine, |l| l.max_completion_drain_attempts = 0);
    // SAFETY: fake engine.
    let e = unsafe { ex.execute_reader(&live.plan, &live.src, &live.sb, &live.dst, &live.tb[0], &args) }.unwrap_err();
    e.pending_transfer_id.unwrap()
}

#[test]
fn acc_375_pending_reader_keeps_the_owner_alive_until_the_drain() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    let owner = Arc::new("target allocation".to_string());
    let id = pending_reader(&live, &engine, &ticket, &owner);
    assert!(Arc::strong_count(&owner) > 1, "the pending entry keeps the owner alive");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(exec(&engine).drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(Arc::strong_count(&owner), 1, "released after the drain");
}

#[test]
fn acc_376_a_new_executor_sees_and_drains_the_pending_transfer() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    let owner = Arc::new("target allocation".to_string());
    // The executor that created the entry is dropped inside `pending_reader`.
    let id = pending_reader(&live, &engine, &ticket, &owner);
    let ex = exec(&engine);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x40000]);
    assert_eq!(Arc::strong_count(&owner), 1);
}

#[test]
fn acc_377_pre_registered_memory_is_never_unregistered_by_the_library() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("source-t0:12345", Submit::Ticket(ticket.clone()));
    let owner = Arc::new("external".to_string());
    let log = ReleaseLog::default();
    let guards = GuardProviders::all(RecordingGuard::with_owner(&log, owner.clone()));
    let (sl, tl) = (live.source_leases(), live.target_leases());
    let args = ExecuteArgs {
        remote_registrations: Some(&sl),
        local_pre_registered: true,
        local_registrations: Some(&tl),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 0);
    // SAFETY: fake engine.
    let e = unsafe { ex.execute_reader(&live.plan, &live.src, &live.sb, &live.dst, &live.tb[0], &args) }.unwrap_err();
    drop(guards);
    assert!(Arc::strong_count(&owner) > 1);
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(e.pending_transfer_id.as_deref().unwrap(), 0).unwrap(), "COMPLETED");
    assert!(engine.unregisters().is_empty());
    assert_eq!(Arc::strong_count(&owner), 1);
    // The caller's own unregistration still works.
    assert_eq!(engine.unregister_memory(0x40000).unwrap(), 0);
}

// ---------------------------------------------------------------------------
// Lifetime guards
// ---------------------------------------------------------------------------

#[test]
fn acc_378_guard_providers_are_required() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    let tl = live.target_leases();
    let args = ExecuteArgs { remote_registrations: Some(&tl), ..Default::default() };
    // SAFETY: fake engine.
    let r = unsafe { exec(&engine).execute_sink(&live.plan, &live.src, &live.sb[0], &live.dst, &live.tb, &args) };
    let e = err_has(r, "source allocation guard providers");
    assert_eq!(e.kind, TransferErrorKind::Contract);
}

#[test]
fn acc_379_success_releases_every_token_once_completed() {
    let live = Live::tp(2, 4);
    live.sink(&exec(&FakeEngine::legacy()), 0).unwrap();
    let mut got = live.releases();
    got.sort();
    // The source tp0 pin and the pins of every planned target participant.
    let mut want: Vec<(String, &str)> = vec![(pid(tp(0)), "completed")];
    want.extend((0..4).map(|i| (pid(tp(i)), "completed")));
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn acc_380_unknown_ticket_releases_nothing_until_drained() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t1:12345", Submit::Ticket(ticket.clone()));
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 1);
    let e = live.sink(&ex, 0).unwrap_err();
    assert!(live.releases().is_empty());
    assert!(engine.unregisters().is_empty());
    let id = e.pending_transfer_id.unwrap();
    assert!(completion::pending_transfer_holds_resources(ex.engine_identity(), &id));
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
    assert_eq!(live.releases().len(), 5);
    assert!(live.releases().iter().all(|r| r.1 == "completed"));
}

#[test]
fn acc_381_known_failure_releases_failed_drained() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    engine.set_submit("target-t0:12345", Submit::Ticket(FakeTicket::new(CompletionStatus::FailedDrained)));
    let e = err_has(live.sink(&exec(&engine), 0), "target-t0:12345");
    assert_eq!(e.kind, TransferErrorKind::CompletionFailed);
    assert_eq!(live.releases().len(), 5);
    assert!(live.releases().iter().all(|r| r.1 == "failed_drained"));
    assert_eq!(engine.unregisters(), vec![0x10000]);
}

#[test]
fn acc_382_raising_legacy_write_releases_nothing() {
    let live = Live::tp(2, 4);
    let engine = FakeEngine::legacy();
    engine.set_legacy("target-t0:12345", Step::Raise("native submission raised".into()));
    let ex = exec(&engine);
    let e = live.sink(&ex, 0).unwrap_err();
    assert_eq!(ex.pending_transfer_status(e.pending_transfer_id.as_deref().unwrap()).unwrap(), RESTART);
    assert!(live.releases().is_empty());
}

// ---------------------------------------------------------------------------
// Coordinator rule
// ---------------------------------------------------------------------------

fn record(live: &Live, i: usize, r: TransferResult<Vec<TransferReceipt>>) -> CallRecord {
    CallRecord {
        plan: live.plan.clone(),
        participant_id: pid(tp(i as u64)),
        worker_id: format!("source-t{i}"),
        result: r,
    }
}

#[test]
fn acc_387_coordinator_reports_only_fully_written_targets() {
    let live = Live::tp(2, 4);
    for unknown in [false, true] {
        let good = FakeEngine::legacy();
        let bad = FakeEngine::ticketed();
        let ticket = FakeTicket::new(if unknown {
            CompletionStatus::CompletionUnknown
        } else {
            CompletionStatus::FailedDrained
        });
        bad.set_submit("target-t2:12345", Submit::Ticket(ticket.clone()));
        let bad_ex = exec_with(&bad, |l| l.max_completion_drain_attempts = 0);
        let r0 = live.sink(&exec(&good), 0);
        assert_eq!(
            r0.as_ref().unwrap().iter().map(|r| (r.operation_count, r.nbytes)).collect::<Vec<_>>(),
            vec![(1, 2); 2]
        );
        let r1 = live.sink(&bad_ex, 1);
        assert!(r1.is_err());
        let mut calls = vec![record(&live, 0, r0), record(&live, 1, r1)];
        let v = target_outcomes(&live.plan, TransferMode::Sink, &calls);
        let updated = TargetOutcome::Updated { weight_generation: 1 };
        assert_eq!(v[&pid(tp(0))], updated);
        assert_eq!(v[&pid(tp(1))], updated);
        assert!(matches!(v[&pid(tp(2))], TargetOutcome::Torn { .. }));
        assert!(matches!(v[&pid(tp(3))], TargetOutcome::Torn { .. }));
        if unknown {
            // A later COMPLETED drain does not make the failed call complete.
            let id = calls[1].result.as_ref().unwrap_err().pending_transfer_id.clone().unwrap();
            ticket.set(CompletionStatus::Completed);
            assert_eq!(bad_ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
            assert!(matches!(
                target_outcomes(&live.plan, TransferMode::Sink, &calls)[&pid(tp(2))],
                TargetOutcome::Torn { .. }
            ));
        }
        // Re-running the failed call under the same plan completes the targets.
        let rerun = live.sink(&exec(&FakeEngine::legacy()), 1);
        calls.push(record(&live, 1, rerun));
        let v = target_outcomes(&live.plan, TransferMode::Sink, &calls);
        assert!(v.values().all(|o| *o == updated), "{v:?}");
    }
    // `()` where receipts were predicted, or wrong counts, are incomplete.
    let ok = live.sink(&exec(&FakeEngine::legacy()), 0).unwrap();
    let mut wrong = ok.clone();
    wrong[0].nbytes += 1;
    for bad in [Vec::new(), wrong] {
        let calls = vec![record(&live, 0, Ok(bad)), record(&live, 1, live.sink(&exec(&FakeEngine::legacy()), 1))];
        let v = target_outcomes(&live.plan, TransferMode::Sink, &calls);
        assert!(matches!(v[&pid(tp(0))], TargetOutcome::Torn { .. }));
        assert_eq!(v[&pid(tp(2))], TargetOutcome::Updated { weight_generation: 1 });
    }
    // A call that failed before any batch leaves its targets unchanged.
    let e = live.sink_with(&exec(&FakeEngine::legacy()), &live.sb[1], &live.tb, None).unwrap_err();
    assert!(!e.submitted);
    let v = target_outcomes(&live.plan, TransferMode::Sink, &[record(&live, 1, Err(e))]);
    assert_eq!(v[&pid(tp(2))], TargetOutcome::Unchanged);
}

#[test]
fn acc_383_unknown_completion_hands_tokens_and_resources_to_the_drain() {
    // The registration scope of one call: own source registration, the token set of
    // both sides and the resources move into the pending entry together.
    let live = Live::tp(2, 4);
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    let owner = Arc::new("source allocation".to_string());
    let log = ReleaseLog::default();
    let guards = GuardProviders::all(RecordingGuard::with_owner(&log, owner.clone()));
    let tl = live.target_leases();
    let args = ExecuteArgs {
        remote_registrations: Some(&tl),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let ex = exec_with(&engine, |l| l.max_completion_drain_attempts = 0);
    // SAFETY: fake engine.
    let e = unsafe { ex.execute_sink(&live.plan, &live.src, &live.sb[0], &live.dst, &live.tb, &args) }.unwrap_err();
    drop(guards);
    let id = e.pending_transfer_id.unwrap();
    assert!(log.lock().is_empty() && engine.unregisters().is_empty());
    assert!(Arc::strong_count(&owner) > 1);
    assert!(completion::pending_transfer_holds_resources(ex.engine_identity(), &id));
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![0x10000]);
    assert_eq!(log.lock().len(), 5);
    assert!(log.lock().iter().all(|r| r.1 == "completed"));
    assert_eq!(Arc::strong_count(&owner), 1);
}
