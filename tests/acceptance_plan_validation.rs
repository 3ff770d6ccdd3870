//! Acceptance items 172, 182 and 192 of `acceptance.md` (plan and load-plan
//! validation, replica detection), mapped onto this crate's plan types.
//!
//! Mapping. The reference builds a `WeightLoadPlan` from a separate transfer plan
//! and a manifest and validates their identities against each other; here a
//! [`LoadPlan`] is built only by planning from the manifest itself (its logical plan
//! holds the manifest), so a load plan whose transfer identity differs from its
//! manifest cannot be constructed. Item 172 checks every way of pairing a
//! transfer of one generation with a manifest of another that the API offers. The
//! reference's logical plan carries its own tensor catalogs and executor metadata;
//! ours carries both placements, and reconstruction re-plans from them and requires
//! the shipped document to be the re-planned one, so every forgery of item 182 is
//! refused with `logical transfer plan JSON differs from its placements` or by the
//! placement's own validation. Item 192 counts Python attribute reads, which Rust
//! cannot observe; the test checks replica detection over 64 tensors on a
//! placement that takes the fragment-scanning path (see the report).

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use builders::*;
use mooncake_weight_store::plan::load::{LogicalLoadPlan, PlanningLimits};
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::{LoadArgs, LoadPlan, StaticGuard};
use mooncake_weight_store::*;
use serde_json::Value as J;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

// ---------------------------------------------------------------------------
// 172
// ---------------------------------------------------------------------------

#[test]
fn acc_172_load_plan_transfer_generation_must_be_the_manifests() {
    let fake = fake_store::FakeStore::new();
    let ws = fake_store::ws(&fake);
    let (_, m7) = fake_store::snapshot(&ws, &fake_store::source(s_placement(1, 1, 7)), "tx");
    let m7 = Arc::new(m7);
    fake.clear_log();
    let d7 = fake_store::target(s_placement(1, 1, 7));
    let d8 = fake_store::target(s_placement(1, 1, 8));
    // The transfer (logical plan) takes its identity from the manifest: a generation-8
    // transfer over the generation-7 manifest cannot be planned ...
    expect_invalid(
        LogicalLoadPlan::plan(m7.clone(), d8.placement.clone(), PlanningLimits::default()),
        "source and target weight_generation differ",
    );
    expect_invalid(
        ws.plan_load(m7.clone(), d8.placement.clone(), &d8.bindings, PlanningLimits::default()),
        "target placement revision mismatch",
    );
    // ... nor rebuilt by binding a generation-7 transfer to generation-8 bindings.
    let l7 = LogicalLoadPlan::plan(m7.clone(), d7.placement.clone(), PlanningLimits::default()).unwrap();
    assert_eq!(l7.manifest().weight_generation(), 7);
    assert_eq!(l7.target().weight_generation(), 7);
    expect_invalid(LoadPlan::bind(l7.clone(), &d8.bindings), "placement_id and runtime binding placement_id differ");
    let ok = LoadPlan::bind(l7, &d7.bindings).unwrap();
    assert_eq!(ok.manifest().weight_generation(), 7);
    // A plan built from a manifest whose generation was altered (same key) is not the
    // committed one: the load refuses it before any read.
    let mut v: J = serde_json::from_str(&m7.to_json()).unwrap();
    v["weight_generation"] = J::from(8);
    let m8 = Arc::new(StoredManifest::from_json(v.to_string().as_bytes()).unwrap());
    assert_eq!(m8.manifest_key(), m7.manifest_key());
    let p8 = ws.plan_load(m8, d8.placement.clone(), &d8.bindings, PlanningLimits::default()).unwrap();
    let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: the target buffers of `d8` outlive the call.
    let e = unsafe { ws.load(&p8, &d8.bindings[0], args) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(e.message().contains("committed weight manifest differs from load plan"), "{e}");
    assert!(fake.range_calls().is_empty());
    assert!(d8.verify().is_err(), "the target buffers still hold the sentinel");
}

// ---------------------------------------------------------------------------
// 182
// ---------------------------------------------------------------------------

const DIFFERS: &str = "logical transfer plan JSON differs from its placements";

#[test]
fn acc_182_forged_source_provenance_and_catalogs_are_rejected_on_reconstruction() {
    let (src, sb) = fake_engine::manifests(2, "source", 0x10000);
    let (dst, tb) = fake_engine::manifests(4, "target", 0x40000);
    let logical = LogicalTransferPlan::plan(Arc::new(src), Arc::new(dst), PlanningLimits::reference()).unwrap();
    let v: J = serde_json::from_str(&logical.to_json()).unwrap();
    assert_eq!(LogicalTransferPlan::from_json(&v.to_string()).unwrap().to_json(), logical.to_json());
    let bound = TransferPlan::bind(&logical, &tb, &sb).unwrap();
    let b: J = serde_json::from_str(&bound.to_json()).unwrap();
    assert_eq!(TransferPlan::from_json(&b.to_string(), &tb, &sb).unwrap(), bound);
    // A forged source rank: on a region's source fragment, or on a source executor.
    let region_rank = |w: &mut J| w["regions"][0]["source"]["rank"]["tp"] = J::from(1);
    let executor_rank = |w: &mut J| w["source_executors"][0]["rank"]["tp"] = J::from(1);
    // No source executors.
    let no_executors = |w: &mut J| w["source_executors"] = J::Array(vec![]);
    for forge in [&region_rank as &dyn Fn(&mut J), &executor_rank, &no_executors] {
        let mut w = v.clone();
        forge(&mut w);
        expect_invalid(LogicalTransferPlan::from_json(&w.to_string()), DIFFERS);
        // The same forgery inside a bound plan's logical part.
        let mut w = b.clone();
        forge(&mut w["logical"]);
        expect_invalid(TransferPlan::from_json(&w.to_string(), &tb, &sb), DIFFERS);
    }
    // Empty source / target tensor catalogs (the placements' tensor lists).
    for side in ["source", "target"] {
        let mut w = v.clone();
        w[format!("{side}_placement")]["tensors"] = J::Array(vec![]);
        expect_invalid(
            LogicalTransferPlan::from_json(&w.to_string()),
            "unknown tensor_id in placement part: layers.0.mlp.gate_up",
        );
        // A catalog emptied together with every fragment describes another placement.
        let mut w = v.clone();
        w[format!("{side}_placement")]["tensors"] = J::Array(vec![]);
        for part in w[format!("{side}_placement")]["parts"].as_array_mut().unwrap() {
            part["fragments"] = J::Array(vec![]);
        }
        assert!(LogicalTransferPlan::from_json(&w.to_string()).is_err(), "{side} catalog and fragments emptied");
    }
}

// ---------------------------------------------------------------------------
// 192
// ---------------------------------------------------------------------------

/// `n` tensors `layers.<i>.w`, (8,) uint8, `[Replicated(dp), Split(tp, 0)]`.
fn tensors(n: usize) -> Vec<TensorDescriptor> {
    (0..n).map(|i| tensor(&format!("layers.{i}.w"), &[8], 1, &[repl(Dp), split(Tp, 0)])).collect()
}

/// DP `dp` x TP `tpn` over `tensors`, without the participants of DP rank `absent`.
fn placement(ts: &[TensorDescriptor], dp: u64, tpn: u64, absent: Option<u64>) -> Placement {
    let ranks: Vec<ParallelRank> = grid(dp, 1, 1, tpn).into_iter().filter(|r| Some(r.dp) != absent).collect();
    let shard = 8 / tpn;
    let frags = ts.iter().flat_map(|t| ranks.iter().map(move |&r| rows(t, r.tp * shard, shard, r))).collect();
    flat(topo(dp, 1, 1, tpn, &ranks), ts.to_vec(), frags).unwrap()
}

#[test]
fn acc_192_replica_detection_over_64_tensors() {
    // Source DP3 x TP2 with DP rank 1 absent (not a full grid, so replica detection
    // scans the fragments): the complete replicas are R = [0, 2]; target DP ranks
    // 0, 1, 2 read R[d mod 2] = 0, 2, 0, every one of the 64 tensors from both TP
    // shards of that one replica.
    let ts = tensors(64);
    let src = placement(&ts, 3, 2, Some(1));
    let dst = placement(&ts, 3, 1, None);
    let p = LogicalTransferPlan::plan(Arc::new(src), Arc::new(dst), PlanningLimits::reference()).unwrap();
    assert_eq!(p.regions().len(), 64 * 3 * 2);
    let mut read: BTreeMap<(String, u64), BTreeSet<(u64, u64)>> = BTreeMap::new();
    for r in p.regions() {
        let (s, t) = (p.source_of(r), p.target_of(r));
        assert_eq!(s.tensor_id(), t.tensor_id());
        read.entry((t.tensor_id().to_string(), t.rank().dp)).or_default().insert((s.rank().dp, s.rank().tp));
    }
    assert_eq!(read.len(), 64 * 3);
    for ((tensor, dp), sources) in &read {
        let want = [0, 2, 0][*dp as usize];
        assert_eq!(*sources, BTreeSet::from([(want, 0), (want, 1)]), "{tensor} at target dp {dp}");
    }
    let executor_dps: BTreeSet<u64> = p.source_executors().iter().map(|e| e.rank.dp).collect();
    assert_eq!(executor_dps, BTreeSet::from([0, 2]), "only complete replicas have source executors");
    // With a full grid (the fast path) the same tensors read R = [0, 1, 2] round robin.
    let full = LogicalTransferPlan::plan(
        Arc::new(placement(&ts, 3, 2, None)),
        Arc::new(placement(&ts, 3, 1, None)),
        PlanningLimits::reference(),
    )
    .unwrap();
    assert!(full.regions().iter().all(|r| full.source_of(r).rank().dp == full.target_of(r).rank().dp));
}
