//! Issue 16 item 3: live-transfer coalescing. Adjacent segments of one batch (same
//! pair of allocations, source and target both contiguous) are submitted as one
//! engine operation. Execution only: which bytes land where, the receipts (planned
//! segment counts) and the per-target outcome are the same as without it.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;

use builders::*;
use fake_engine::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{CompletionStatus, MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::StaticGuard;
use mooncake_weight_store::*;
use std::sync::Arc;
use AxisKind::Tp;

/// Tensors `a` (8x4), `b` (8x2), `c` (8x6) of u8, all split on dim 0 over TP.
fn tensors() -> Vec<TensorDescriptor> {
    [("a", 4), ("b", 2), ("c", 6)].iter().map(|&(id, cols)| tensor(id, &[8, cols], 1, &[split(Tp, 0)])).collect()
}

/// A TP-`n` placement of `tensors`, split on dim 0 (revision `step-42`).
fn rows_placement(defs: &[TensorDescriptor], n: u64) -> Placement {
    let ranks: Vec<_> = (0..n).map(tp).collect();
    let frags = ranks.iter().flat_map(|&r| defs.iter().map(move |t| rows(t, r.tp * (8 / n), 8 / n, r))).collect();
    flat_with(&live_ids("step-42"), topo(1, 1, 1, n, &ranks), defs.to_vec(), frags).unwrap()
}

/// The binding of `pid`: every fragment in one allocation at `base`, packed in the
/// participant's fragment order with `gap(k)` bytes before fragment `k`. Returns the
/// binding and the allocation size.
fn flat_binding(
    placement: &Placement,
    participant: &str,
    name: &str,
    base: u64,
    gap: &dyn Fn(usize) -> u64,
) -> (RuntimeBinding, u64) {
    let part = placement.part(participant).unwrap();
    let mut offsets = Vec::new();
    let mut off = 0;
    for (k, f) in part.fragments().iter().enumerate() {
        off += gap(k);
        offsets.push(off);
        off += f.nbytes();
    }
    let total = off.max(1);
    let frags = part
        .fragments()
        .iter()
        .zip(&offsets)
        .enumerate()
        .map(|(k, (f, &o))| {
            let t = placement.tensor(f.tensor_id()).unwrap();
            RuntimeFragment::new(RuntimeFragmentSpec {
                placement_fragment_id: f.placement_fragment_id().into(),
                fragment_id: format!("{name}-frag{k}"),
                address: base + o,
                nbytes: f.nbytes(),
                worker_id: name.into(),
                endpoint: format!("{name}:12345"),
                device: "cpu".into(),
                itemsize: t.itemsize(),
                local_shape: f.local_shape().to_vec(),
                strides_bytes: vec![f.local_shape()[1] * t.itemsize(), t.itemsize()],
                storage_address: base,
                storage_nbytes: total,
                storage_offset_bytes: o,
                memory: MemoryKind::Host,
            })
            .unwrap()
        })
        .collect();
    let b = RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: placement.resource_id().into(),
        placement_id: placement.placement_id().into(),
        placement_digest: placement.digest().into(),
        instance_id: name.into(),
        lease_generation: 1,
        lease_id: format!("{name}-runtime-lease"),
        revision: placement.revision().into(),
        participant_id: participant.into(),
        fragments: frags,
    })
    .unwrap();
    (b, total)
}

/// A bound TP`s` -> TP`t` live plan over flat allocations (bases from `sbase(i)` /
/// `tbase(i)`), target fragments with `tgap` padding.
struct Live {
    src: Placement,
    dst: Placement,
    sb: Vec<RuntimeBinding>,
    tb: Vec<RuntimeBinding>,
    sizes: (Vec<u64>, Vec<u64>),
    plan: TransferPlan,
    guards: GuardProviders,
}

impl Live {
    fn new(
        s: u64,
        t: u64,
        sbase: &dyn Fn(u64) -> u64,
        tbase: &dyn Fn(u64) -> u64,
        tgap: &dyn Fn(usize) -> u64,
    ) -> Live {
        let defs = tensors();
        let (src, dst) = (rows_placement(&defs, s), rows_placement(&defs, t));
        let (sb, ss): (Vec<_>, Vec<_>) =
            (0..s).map(|i| flat_binding(&src, &pid(tp(i)), &format!("source-t{i}"), sbase(i), &|_| 0)).unzip();
        let (tb, ts): (Vec<_>, Vec<_>) =
            (0..t).map(|i| flat_binding(&dst, &pid(tp(i)), &format!("target-t{i}"), tbase(i), tgap)).unzip();
        let logical =
            LogicalTransferPlan::plan(Arc::new(src.clone()), Arc::new(dst.clone()), PlanningLimits::reference())
                .unwrap();
        let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
        Live { src, dst, sb, tb, sizes: (ss, ts), plan, guards: GuardProviders::all(Arc::new(StaticGuard)) }
    }
    fn fake(s: u64, t: u64, tgap: &dyn Fn(usize) -> u64) -> Live {
        Live::new(s, t, &|i| 0x10000 + i * 0x1000, &|i| 0x40000 + i * 0x1000, tgap)
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
    fn sink(
        &self,
        ex: &TransferExecutor,
        i: usize,
        stats: Option<&ExecutionStats>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let leases = Self::leases(&self.tb);
        let args = ExecuteArgs {
            remote_registrations: Some(&leases),
            source_guards: Some(&self.guards),
            target_guards: Some(&self.guards),
            stats,
            ..Default::default()
        };
        // SAFETY: fake engines never touch memory; with the LocalEngine every
        // allocation is a live Vec that outlives the call (see `Buffers`).
        unsafe { ex.execute_sink(&self.plan, &self.src, &self.sb[i], &self.dst, &self.tb, &args) }
    }
    fn reader(
        &self,
        ex: &TransferExecutor,
        i: usize,
        stats: Option<&ExecutionStats>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let sl = Self::leases(&self.sb);
        let args = ExecuteArgs {
            remote_registrations: Some(&sl),
            source_guards: Some(&self.guards),
            target_guards: Some(&self.guards),
            stats,
            ..Default::default()
        };
        // SAFETY: as in `sink`.
        unsafe { ex.execute_reader(&self.plan, &self.src, &self.sb, &self.dst, &self.tb[i], &args) }
    }
    fn record(&self, i: usize, side: Side, r: TransferResult<Vec<TransferReceipt>>) -> CallRecord {
        let name = if side == Side::Source { "source" } else { "target" };
        CallRecord {
            plan: self.plan.clone(),
            participant_id: pid(tp(i as u64)),
            worker_id: format!("{name}-t{i}"),
            result: r,
        }
    }
}

fn exec(engine: Arc<dyn TransferEngine>, coalesce: bool, max_batch: u64) -> TransferExecutor {
    let limits = ExecutorLimits { coalesce_adjacent: coalesce, max_batch_operations: max_batch, ..Default::default() };
    TransferExecutor::new(engine, limits).unwrap()
}

fn total_ops(r: &[TransferReceipt]) -> u64 {
    r.iter().map(|x| x.operation_count).sum()
}

#[test]
fn coalescing_is_on_by_default() {
    assert!(ExecutorLimits::default().coalesce_adjacent);
}

#[test]
fn adjacent_segments_of_packed_tensors_merge_into_one_operation() {
    // TP2 -> TP2, both sides packed in the same order: a, b, c of one participant are
    // one contiguous run on both sides.
    let live = Live::fake(2, 2, &|_| 0);
    for i in 0..2 {
        let engine = FakeEngine::legacy();
        let stats = ExecutionStats::default();
        let r = live.sink(&exec(engine.clone(), true, 1024), i, Some(&stats)).unwrap();
        let b = engine.batches();
        assert_eq!(b.len(), 1);
        let base_s = 0x10000 + i as u64 * 0x1000;
        let base_t = 0x40000 + i as u64 * 0x1000;
        // One operation: 16 + 8 + 24 bytes of rows [4i, 4i+4) of a, b, c.
        assert_eq!(b[0], (format!("target-t{i}:12345"), vec![base_s], vec![base_t], vec![48]));
        // The receipt still counts the planned segments (one per region).
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].operation_count, r[0].nbytes), (3, 48));
        assert_eq!(stats.snapshot(), (3, 1, 1));
        // Without coalescing: the reference's pattern, three operations.
        let engine = FakeEngine::legacy();
        let stats = ExecutionStats::default();
        let plain = live.sink(&exec(engine.clone(), false, 1024), i, Some(&stats)).unwrap();
        assert_eq!(plain, r, "receipts do not depend on coalescing");
        let sizes = &engine.batches()[0].3;
        assert_eq!((sizes.len(), sizes.iter().sum::<u64>()), (3, 48));
        assert_eq!(stats.snapshot(), (3, 3, 1));
    }
}

#[test]
fn a_gap_on_either_side_stops_the_merge() {
    // Target fragment 2 (`c`) starts 0x40 bytes after `b` ends: a + b merge, c does not.
    let live = Live::fake(2, 2, &|k| if k == 2 { 0x40 } else { 0 });
    let engine = FakeEngine::legacy();
    let stats = ExecutionStats::default();
    let r = live.reader(&exec(engine.clone(), true, 1024), 0, Some(&stats)).unwrap();
    let b = engine.batches();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].1, vec![0x40000, 0x40000 + 24 + 0x40], "local (target) addresses");
    assert_eq!(b[0].2, vec![0x10000, 0x10000 + 24], "remote (source) addresses");
    assert_eq!(b[0].3, vec![24, 24]);
    assert_eq!((total_ops(&r), r[0].nbytes), (3, 48));
    assert_eq!(stats.snapshot(), (3, 2, 1));
}

#[test]
fn source_contiguous_but_target_strided_is_not_merged() {
    // TP2 -> TP1 on dim 0: source t0 holds rows 0..4 of a, b, c back to back, but in
    // the target the rows 4..8 of `a` lie between them; and TP1 -> TP2 the other way
    // round. Nothing merges; the batches equal the uncoalesced ones.
    for (s, t) in [(2, 1), (1, 2)] {
        let live = Live::fake(s, t, &|_| 0);
        for i in 0..s as usize {
            let on = FakeEngine::legacy();
            let off = FakeEngine::legacy();
            let r_on = live.sink(&exec(on.clone(), true, 1024), i, None).unwrap();
            let r_off = live.sink(&exec(off.clone(), false, 1024), i, None).unwrap();
            assert_eq!(r_on, r_off);
            assert_eq!(on.batches(), off.batches(), "TP{s} -> TP{t}, source {i}");
            assert_eq!(on.batches().iter().map(|b| b.3.len()).sum::<usize>() as u64, total_ops(&r_on));
        }
    }
}

#[test]
fn column_split_rows_are_strided_and_never_merge() {
    // A [16, 8] tensor split on dim 1, TP2 -> TP1: every row of a source is one short
    // segment whose target rows are 8 bytes apart (strided): no merging.
    let w = tensor("w", &[16, 8], 1, &[split(Tp, 1)]);
    let mk = |n: u64| {
        let ranks: Vec<_> = (0..n).map(tp).collect();
        let frags = ranks.iter().map(|&r| frag(&w, &[0, r.tp * (8 / n)], &[16, 8 / n], r)).collect();
        flat_with(&live_ids("step-42"), topo(1, 1, 1, n, &ranks), vec![w.clone()], frags).unwrap()
    };
    let (src, dst) = (mk(2), mk(1));
    let bind = |p: &Placement, n: u64, name: &str, base: u64| -> Vec<RuntimeBinding> {
        (0..n)
            .map(|i| {
                let part = p.part(&pid(tp(i))).unwrap();
                let f = &part.fragments()[0];
                RuntimeBinding::new(RuntimeBindingSpec {
                    resource_id: p.resource_id().into(),
                    placement_id: p.placement_id().into(),
                    placement_digest: p.digest().into(),
                    instance_id: format!("{name}-t{i}"),
                    lease_generation: 1,
                    lease_id: format!("{name}-t{i}-runtime-lease"),
                    revision: p.revision().into(),
                    participant_id: pid(tp(i)),
                    fragments: vec![RuntimeFragment::new(RuntimeFragmentSpec {
                        placement_fragment_id: f.placement_fragment_id().into(),
                        fragment_id: format!("{name}-t{i}-frag0"),
                        address: base + i * 0x1000,
                        nbytes: f.nbytes(),
                        worker_id: format!("{name}-t{i}"),
                        endpoint: format!("{name}-t{i}:12345"),
                        device: "cpu".into(),
                        itemsize: 1,
                        local_shape: f.local_shape().to_vec(),
                        strides_bytes: vec![f.local_shape()[1], 1],
                        storage_address: base + i * 0x1000,
                        storage_nbytes: f.nbytes(),
                        storage_offset_bytes: 0,
                        memory: MemoryKind::Host,
                    })
                    .unwrap()],
                })
                .unwrap()
            })
            .collect()
    };
    let (sb, tb) = (bind(&src, 2, "source", 0x10000), bind(&dst, 1, "target", 0x40000));
    let logical =
        LogicalTransferPlan::plan(Arc::new(src.clone()), Arc::new(dst.clone()), PlanningLimits::reference()).unwrap();
    let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let sl = Live::leases(&sb);
    let stats = ExecutionStats::default();
    let args = ExecuteArgs {
        remote_registrations: Some(&sl),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        stats: Some(&stats),
        ..Default::default()
    };
    let engine = FakeEngine::legacy();
    let ex = exec(engine.clone(), true, 1024);
    // SAFETY: the fake engine never touches memory.
    let r = unsafe { ex.execute_reader(&plan, &src, &sb, &dst, &tb[0], &args) }.unwrap();
    assert_eq!(total_ops(&r), 32);
    assert_eq!(stats.snapshot(), (32, 32, 2));
    assert!(engine.batches().iter().all(|b| b.3 == vec![4; 16]));
}

#[test]
fn max_batch_operations_bounds_merged_operations() {
    // Three adjacent segments are one operation: a batch limit of 1 still needs one
    // batch; with the gap before `c`, two.
    let live = Live::fake(2, 2, &|_| 0);
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec(engine.clone(), true, 1), 0, None).unwrap();
    assert_eq!(engine.batch_sizes(), vec![1]);
    assert_eq!(total_ops(&r), 3);
    let live = Live::fake(2, 2, &|k| if k == 2 { 0x40 } else { 0 });
    let engine = FakeEngine::legacy();
    let r = live.sink(&exec(engine.clone(), true, 1), 0, None).unwrap();
    assert_eq!(engine.batches().iter().map(|b| b.3.clone()).collect::<Vec<_>>(), vec![vec![24], vec![24]]);
    assert_eq!(total_ops(&r), 3);
    // Without coalescing the reference splits three ways.
    let engine = FakeEngine::legacy();
    live.sink(&exec(engine.clone(), false, 1), 0, None).unwrap();
    assert_eq!(engine.batch_sizes(), vec![1, 1, 1]);
}

/// Host buffers for a [`Live`] built over real memory: every allocation a Vec.
struct Buffers {
    src: Vec<Vec<u8>>,
    dst: Vec<Vec<u8>>,
}

fn real(s: u64, t: u64, tgap: &dyn Fn(usize) -> u64) -> (Live, Buffers) {
    // Sizes first (the allocation sizes do not depend on the base addresses).
    let probe = Live::fake(s, t, tgap);
    let src: Vec<Vec<u8>> = probe
        .sizes
        .0
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8 * 101 + 7)).collect())
        .collect();
    let dst: Vec<Vec<u8>> = probe.sizes.1.iter().map(|&n| vec![0xA5; n as usize]).collect();
    let sp: Vec<u64> = src.iter().map(|v| v.as_ptr() as u64).collect();
    let dp: Vec<u64> = dst.iter().map(|v| v.as_ptr() as u64).collect();
    let live = Live::new(s, t, &|i| sp[i as usize], &|i| dp[i as usize], tgap);
    (live, Buffers { src, dst })
}

fn register(engine: &LocalEngine, bufs: &[Vec<u8>]) {
    for b in bufs {
        let r = MemoryRegion { address: b.as_ptr() as u64, len: b.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test and are unregistered after.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

fn unregister(engine: &LocalEngine, bufs: &[Vec<u8>]) {
    for b in bufs {
        assert_eq!(engine.unregister_memory(b.as_ptr() as u64).unwrap(), 0);
    }
}

#[test]
fn coalesced_transfers_move_the_same_bytes() {
    // Same layout (everything merges), a gap (partial merge), TP2 -> TP1 and TP1 -> TP2
    // (nothing merges): sink and reader, coalesced and not, byte for byte equal.
    type Gap = fn(usize) -> u64;
    let cases: [(u64, u64, Gap); 4] =
        [(2, 2, |_| 0), (2, 2, |k| if k == 2 { 0x40 } else { 0 }), (2, 1, |_| 0), (1, 2, |_| 0)];
    for (s, t, gap) in cases {
        let mut results = Vec::new();
        for coalesce in [true, false] {
            for reader in [false, true] {
                let (live, mut bufs) = real(s, t, &gap);
                let engine = Arc::new(LocalEngine::new());
                let ex = exec(engine.clone(), coalesce, 1024);
                let stats = ExecutionStats::default();
                if reader {
                    register(&engine, &bufs.src);
                    for i in 0..t as usize {
                        live.reader(&ex, i, Some(&stats)).unwrap();
                    }
                    unregister(&engine, &bufs.src);
                } else {
                    register(&engine, &bufs.dst);
                    for i in 0..s as usize {
                        live.sink(&ex, i, Some(&stats)).unwrap();
                    }
                    unregister(&engine, &bufs.dst);
                }
                let (planned, engine_ops, _) = stats.snapshot();
                assert!(engine_ops <= planned && planned > 0);
                if !coalesce {
                    assert_eq!(engine_ops, planned);
                }
                if s == t && gap(2) == 0 {
                    // Same layout, same packing: the targets equal the sources.
                    assert_eq!(bufs.dst, bufs.src);
                    if coalesce {
                        assert_eq!(engine_ops, t, "one operation per target");
                    }
                }
                // Padding bytes of the targets are never written.
                results.push((coalesce, std::mem::take(&mut bufs.dst)));
            }
        }
        let first = &results[0].1;
        assert!(first.iter().all(|b| b.iter().any(|&x| x != 0xA5)));
        for (c, r) in &results {
            assert_eq!(r, first, "TP{s} -> TP{t}, coalesce {c}");
        }
        if gap(2) != 0 {
            for b in first {
                assert!(b[24..24 + 0x40].iter().all(|&x| x == 0xA5), "the gap stays untouched");
            }
        }
    }
}

#[test]
fn a_failed_merged_operation_fails_every_covered_target() {
    // Sink TP2 -> TP2: source 0's one merged write covers a, b and c of target 0.
    let live = Live::fake(2, 2, &|_| 0);
    for status in [CompletionStatus::FailedDrained, CompletionStatus::CompletionUnknown] {
        let bad = FakeEngine::ticketed();
        bad.set_submit("target-t0:12345", Submit::Ticket(FakeTicket::new(status.clone())));
        let stats = ExecutionStats::default();
        let ex = TransferExecutor::new(
            bad.clone(),
            ExecutorLimits { max_completion_drain_attempts: 0, ..Default::default() },
        )
        .unwrap();
        let e = live.sink(&ex, 0, Some(&stats)).unwrap_err();
        assert!(e.submitted);
        assert_eq!(bad.batches().len(), 1);
        assert_eq!(bad.batches()[0].3, vec![48], "one merged operation");
        assert_eq!(stats.snapshot(), (0, 0, 0), "nothing counted as moved");
        let good = live.sink(&exec(FakeEngine::legacy(), true, 1024), 1, None);
        let calls = vec![live.record(0, Side::Source, Err(e)), live.record(1, Side::Source, good)];
        let v = target_outcomes(&live.plan, TransferMode::Sink, &calls);
        assert!(matches!(v[&pid(tp(0))], TargetOutcome::Torn { .. }), "{status:?}: {v:?}");
        assert_eq!(v[&pid(tp(1))], TargetOutcome::Updated { weight_generation: 1 });
        if let Some(id) = calls[0].result.as_ref().unwrap_err().pending_transfer_id.clone() {
            // Unknown completion: leave nothing pending behind the test.
            let _ = ex.drain_pending_transfer(&id, 0);
        }
    }
    // Reader TP2 -> TP1: target 0 reads from both sources; a failure toward one source
    // fails target 0 as a whole.
    let live = Live::fake(2, 1, &|_| 0);
    let bad = FakeEngine::ticketed();
    bad.set_submit("source-t1:12345", Submit::Ticket(FakeTicket::new(CompletionStatus::FailedDrained)));
    let e = live.reader(&exec(bad, true, 1024), 0, None).unwrap_err();
    let v = target_outcomes(&live.plan, TransferMode::Reader, &[live.record(0, Side::Target, Err(e))]);
    assert!(matches!(v[&pid(tp(0))], TargetOutcome::Torn { .. }), "{v:?}");
}

#[test]
fn coalesced_receipts_complete_every_target() {
    // Completion tracking accounts every planned operation: the coordinator's
    // prediction (planned segments) matches the coalesced calls' receipts.
    for (s, t, gap) in [(2u64, 2u64, 0u64), (2, 2, 0x40), (2, 1, 0), (1, 2, 0)] {
        let live = Live::fake(s, t, &move |k| if k == 2 { gap } else { 0 });
        let calls: Vec<_> = (0..s as usize)
            .map(|i| live.record(i, Side::Source, live.sink(&exec(FakeEngine::legacy(), true, 1024), i, None)))
            .collect();
        let v = target_outcomes(&live.plan, TransferMode::Sink, &calls);
        assert_eq!(v.len() as u64, t);
        assert!(v.values().all(|o| *o == TargetOutcome::Updated { weight_generation: 1 }), "TP{s} -> TP{t}: {v:?}");
        let calls: Vec<_> = (0..t as usize)
            .map(|i| live.record(i, Side::Target, live.reader(&exec(FakeEngine::legacy(), true, 1024), i, None)))
            .collect();
        let v = target_outcomes(&live.plan, TransferMode::Reader, &calls);
        assert!(v.values().all(|o| *o == TargetOutcome::Updated { weight_generation: 1 }), "TP{s} -> TP{t}: {v:?}");
    }
}
