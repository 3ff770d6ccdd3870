//! The source replica routing of the live-transfer planner (issue 30): the
//! reference's routing (target DP rank `d` reads complete source replica
//! `R[d mod len(R)]`) puts every byte of a one-replica target on source replica 0;
//! `SourceRouting::SpreadTargets` (off by default) spreads the target participants over
//! every complete replica, deterministically, with every byte still covered once.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::{LogicalTransferPlan, SourceRouting};
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::StaticGuard;
use mooncake_weight_store::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

fn trainer(dp: u64) -> HostModel {
    let defs = model_tensors(2, 64, 4);
    HostModel::new(build_placement("trainer", Layout { tp: 4, pp: 1, ep: 1, dp }, &defs, 1), true, "trainer", 1)
}

fn server() -> HostModel {
    let defs = model_tensors(2, 64, 4);
    HostModel::new(build_placement("serving", Layout { tp: 2, pp: 1, ep: 2, dp: 1 }, &defs, 1), false, "serving", 1)
}

fn plan(src: &HostModel, dst: &HostModel, routing: SourceRouting) -> LogicalTransferPlan {
    LogicalTransferPlan::plan_routed(src.placement.clone(), dst.placement.clone(), PlanningLimits::default(), routing)
        .unwrap()
}

/// Target participant -> the source DP ranks it reads, and source DP rank -> bytes.
fn routes(p: &LogicalTransferPlan) -> (BTreeMap<String, BTreeSet<u64>>, BTreeMap<u64, u64>) {
    let mut reads: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut bytes: BTreeMap<u64, u64> = BTreeMap::new();
    for r in p.regions() {
        let dp = p.source_of(r).rank().dp;
        reads.entry(p.target_participant_of(r).to_string()).or_default().insert(dp);
        *bytes.entry(dp).or_default() += r.total_bytes();
    }
    (reads, bytes)
}

#[test]
fn the_reference_routing_reads_one_replica_and_spreading_reads_both() {
    let (src, dst) = (trainer(2), server());
    let reference =
        LogicalTransferPlan::plan(src.placement.clone(), dst.placement.clone(), PlanningLimits::default()).unwrap();
    assert_eq!(reference, plan(&src, &dst, SourceRouting::TargetDp));
    assert_eq!(reference.routing(), SourceRouting::TargetDp);
    let (_, ref_bytes) = routes(&reference);
    assert_eq!(ref_bytes.keys().copied().collect::<Vec<_>>(), vec![0], "the reference reads replica 0 only");

    let spread = plan(&src, &dst, SourceRouting::SpreadTargets);
    assert_eq!(spread.routing(), SourceRouting::SpreadTargets);
    assert_ne!(spread, reference);
    assert_eq!(spread.total_bytes(), reference.total_bytes(), "every target byte once, either way");
    let (reads, bytes) = routes(&spread);
    assert_eq!(bytes.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    // Each target reads ONE replica: target i (dp, pp, ep, tp order) reads replica i mod 2.
    let targets: Vec<_> = dst.placement.parts().iter().map(|p| (p.rank().order_key(), p.participant_id())).collect();
    let mut sorted = targets.clone();
    sorted.sort();
    for (i, (_, id)) in sorted.iter().enumerate() {
        assert_eq!(reads[*id], BTreeSet::from([i as u64 % 2]), "{id}");
    }
    // The two replicas carry equal loads here (symmetric targets).
    assert_eq!(bytes[&0], bytes[&1]);
    // Deterministic.
    assert_eq!(spread, plan(&src, &dst, SourceRouting::SpreadTargets));
    assert_eq!(spread.to_json(), plan(&src, &dst, SourceRouting::SpreadTargets).to_json());
}

#[test]
fn a_local_target_plan_routes_as_the_whole_plan() {
    let (src, dst) = (trainer(2), server());
    let whole = plan(&src, &dst, SourceRouting::SpreadTargets);
    for part in dst.placement.parts() {
        let id = part.participant_id();
        let local = LogicalTransferPlan::plan_local_routed(
            src.placement.clone(),
            dst.placement.clone(),
            Some(id),
            PlanningLimits::default(),
            SourceRouting::SpreadTargets,
        )
        .unwrap();
        let mine = |p: &LogicalTransferPlan| -> Vec<(String, String, u64)> {
            p.regions()
                .iter()
                .filter(|r| p.target_participant_of(r) == id)
                .map(|r| {
                    (p.source_of(r).placement_fragment_id().into(), p.target_of(r).placement_fragment_id().into(), {
                        r.total_bytes()
                    })
                })
                .collect()
        };
        assert_eq!(mine(&local), mine(&whole), "{id}");
        assert_eq!(local.routing(), SourceRouting::SpreadTargets);
    }
}

#[test]
fn one_source_replica_plans_the_same_either_way() {
    let (src, dst) = (trainer(1), server());
    let a = plan(&src, &dst, SourceRouting::TargetDp);
    let b = plan(&src, &dst, SourceRouting::SpreadTargets);
    assert_eq!(a.regions(), b.regions());
    assert_eq!(a.source_executors(), b.source_executors());
}

#[test]
fn the_routing_travels_in_the_plan_json_and_only_when_not_the_reference() {
    let (src, dst) = (trainer(2), server());
    let reference = plan(&src, &dst, SourceRouting::TargetDp);
    let doc: serde_json::Value = serde_json::from_str(&reference.to_json()).unwrap();
    assert!(doc.get("source_routing").is_none(), "the reference's document is unchanged");
    let spread = plan(&src, &dst, SourceRouting::SpreadTargets);
    let text = spread.to_json();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["source_routing"], "spread_targets");
    let back = LogicalTransferPlan::from_json(&text).unwrap();
    assert_eq!(back, spread);
    assert_eq!(back.routing(), SourceRouting::SpreadTargets);
    // Tampering with the routing is refused: unknown names, or a routing that does not
    // produce the shipped regions.
    let mut bad = doc.clone();
    bad["source_routing"] = serde_json::json!("round_robin");
    assert!(LogicalTransferPlan::from_json(&bad.to_string()).is_err());
    let mut bad = doc;
    bad.as_object_mut().unwrap().remove("source_routing");
    let err = LogicalTransferPlan::from_json(&bad.to_string()).unwrap_err();
    assert!(err.to_string().contains("differs"), "{err}");
    assert_eq!(SourceRouting::from_name("spread_targets").unwrap(), SourceRouting::SpreadTargets);
    assert!(SourceRouting::from_name("spread").is_err());
}

#[test]
fn a_spread_plan_moves_every_byte_in_reader_mode() {
    let (src, dst) = (trainer(2), server());
    let logical = plan(&src, &dst, SourceRouting::SpreadTargets);
    let plan = TransferPlan::bind(&logical, &dst.bindings, &src.bindings).unwrap();
    let engine = Arc::new(LocalEngine::new());
    for buf in &src.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer of the test and are unregistered below.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
    let leases: Vec<_> = src
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
    for b in &dst.bindings {
        // SAFETY: both models' buffers outlive the call; nothing else touches them.
        unsafe { ex.execute_reader(&plan, &src.placement, &src.bindings, &dst.placement, b, &args) }.unwrap();
    }
    assert_eq!(dst.verify().unwrap() as u64, plan.total_bytes());
    for buf in &src.buffers {
        assert_eq!(engine.unregister_memory(buf.as_ptr() as u64).unwrap(), 0);
    }
    let replicas: BTreeSet<u64> = plan.executors(Side::Source).iter().map(|e| e.rank.dp).collect();
    assert_eq!(replicas, BTreeSet::from([0, 1]), "both replicas send");
}
