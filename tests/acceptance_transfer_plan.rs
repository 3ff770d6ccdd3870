//! Acceptance items 301–322 of `acceptance-live-transfer.md`: the placement ->
//! placement planner, binding to source and target runtime bindings, executor
//! plans, physical-range validation and the JSON transport.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;

use builders::*;
use fake_engine::*;
use mooncake_weight_store::plan::load::{PlanningLimits, TransferRegion};
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{validate_target_physical_ranges, Side, TargetWrite, TransferPlan};
use mooncake_weight_store::*;
use serde_json::Value as J;
use std::sync::Arc;

fn lim() -> PlanningLimits {
    PlanningLimits::reference()
}

fn json_keys(v: &J, out: &mut Vec<String>) {
    match v {
        J::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                json_keys(x, out);
            }
        }
        J::Array(a) => a.iter().for_each(|x| json_keys(x, out)),
        _ => {}
    }
}

fn keys_of(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    json_keys(&serde_json::from_str(text).unwrap(), &mut keys);
    keys
}

const FORBIDDEN: [&str; 6] = ["address", "endpoint", "worker_id", "instance_id", "lease", "owner"];

fn tp_placement(n: u64) -> Arc<Placement> {
    Arc::new(split_placement(&gate_up(), n, 1, "step-42"))
}

/// TP1 source (binding at 0x1000, generation 3) and TP2 target; target tp1 bound at 0x9000.
fn local_fixture() -> (Arc<Placement>, Arc<Placement>, RuntimeBinding, RuntimeBinding, LogicalTransferPlan) {
    let (src, dst) = (tp_placement(1), tp_placement(2));
    let logical = LogicalTransferPlan::plan_local(src.clone(), dst.clone(), Some(&pid(tp(1))), lim()).unwrap();
    let sb = live_binding(&src, &pid(tp(0)), "source-t0", 0x1000, 3);
    let tb = live_binding(&dst, &pid(tp(1)), "target-t1", 0x9000, 1);
    (src, dst, sb, tb, logical)
}

#[test]
fn acc_301_local_target_plan_is_address_free_and_binds_both_sides() {
    let (src, dst, sb, tb, logical) = local_fixture();
    assert_eq!(logical.source_placement_id(), src.placement_id());
    assert_eq!(logical.target_placement_id(), dst.placement_id());
    for r in logical.regions() {
        assert!(src.fragments().any(|f| f == logical.source_of(r)));
        assert!(dst.fragments().any(|f| f == logical.target_of(r)));
    }
    let keys = keys_of(&logical.to_json());
    for bad in FORBIDDEN {
        assert!(!keys.iter().any(|k| k.contains(bad)), "logical plan JSON has a key containing {bad}");
    }
    let plan = TransferPlan::bind(&logical, &[tb], &[sb]).unwrap();
    let (_, s) = plan.operation_fragment(0, Side::Source);
    let (_, t) = plan.operation_fragment(0, Side::Target);
    assert_eq!((s.address(), t.address()), (0x1000, 0x9000));
    let se = &plan.executors(Side::Source)[0];
    assert_eq!(se.rank, tp(0));
    assert_eq!(plan.executors(Side::Target)[0].rank, tp(1));
    assert_eq!(plan.executor_snapshot(se, 0).lease_generation(), 3);
}

#[test]
fn acc_302_binding_requires_matching_source_bindings() {
    let (_, _, sb, tb, logical) = local_fixture();
    expect_invalid(TransferPlan::bind(&logical, std::slice::from_ref(&tb), &[]), "requires source runtime bindings");
    expect_invalid(
        TransferPlan::bind(&logical, std::slice::from_ref(&tb), std::slice::from_ref(&tb)),
        "source placement IDs differ",
    );
    let wrong = RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: sb.resource_id().into(),
        placement_id: sb.placement_id().into(),
        placement_digest: sb.placement_digest().into(),
        instance_id: sb.instance_id().into(),
        lease_generation: 3,
        lease_id: sb.lease_id().into(),
        revision: sb.revision().into(),
        participant_id: sb.participant_id().into(),
        fragments: vec![RuntimeFragment::new(RuntimeFragmentSpec {
            nbytes: 4,
            local_shape: vec![4],
            storage_nbytes: 4,
            ..rt_spec(sb.fragments()[0].placement_fragment_id(), "rt", 0x1000, 4, "source-t0", &[4], 1)
        })
        .unwrap()],
    })
    .unwrap();
    expect_invalid(TransferPlan::bind(&logical, &[tb], &[wrong]), "byte size");
}

#[test]
fn acc_303_non_canonical_stride_is_refused() {
    let (_, dst, sb, _, logical) = local_fixture();
    let f = &dst.part(&pid(tp(1))).unwrap().fragments()[0];
    let spec = RuntimeFragmentSpec {
        strides_bytes: vec![2],
        storage_nbytes: 8,
        ..rt_spec(f.placement_fragment_id(), "rt", 0x9000, 4, "target-t1", &[4], 1)
    };
    let tb =
        RuntimeBinding::new(binding_spec(&dst, &pid(tp(1)), "target-t1", 1, vec![RuntimeFragment::new(spec).unwrap()]))
            .unwrap();
    expect_invalid(TransferPlan::bind(&logical, &[tb], &[sb]), "canonical contiguous view");
}

#[test]
fn acc_304_binding_for_an_empty_participant_is_refused() {
    let t = tensor("layers.9.w", &[8], 1, &[own(Pp)]);
    let src = Arc::new(
        flat_with(
            &live_ids("step-42"),
            topo(1, 1, 1, 1, &[rank(0, 0, 0, 0)]),
            vec![t.clone()],
            vec![whole(&t, rank(0, 0, 0, 0))],
        )
        .unwrap(),
    );
    let tr = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    let dst = Arc::new(
        flat_with(&live_ids("step-42"), topo(1, 2, 1, 1, &tr), vec![t.clone()], vec![whole(&t, tr[1])]).unwrap(),
    );
    assert!(dst.part(&pid(tr[0])).unwrap().fragments().is_empty());
    let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), lim()).unwrap();
    let sb = live_binding(&src, &pid(tr[0]), "source-t0", 0x1000, 1);
    let mut tb = vec![live_binding(&dst, &pid(tr[1]), "target-p1", 0x9000, 1)];
    TransferPlan::bind(&logical, &tb, std::slice::from_ref(&sb)).unwrap();
    tb.push(RuntimeBinding::new(binding_spec(&dst, &pid(tr[0]), "target-p0", 1, vec![])).unwrap());
    expect_invalid(TransferPlan::bind(&logical, &tb, &[sb]), "target runtime binding participants differ");
}

#[test]
fn acc_305_source_bindings_of_one_space_must_not_overlap() {
    let (src, dst) = (tp_placement(2), tp_placement(1));
    let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), lim()).unwrap();
    let sb: Vec<_> = (0..2)
        .map(|i| {
            let b = live_binding(&src, &pid(tp(i)), "shared", 0x1000, 1);
            RuntimeBinding::new(RuntimeBindingSpec {
                lease_id: format!("lease-{i}"),
                ..binding_spec(
                    &src,
                    &pid(tp(i)),
                    "shared",
                    1,
                    b.fragments()
                        .iter()
                        .map(|f| {
                            RuntimeFragment::new(rt_spec(
                                f.placement_fragment_id(),
                                &format!("rt{i}"),
                                0x1000,
                                4,
                                "shared",
                                &[4],
                                1,
                            ))
                            .unwrap()
                        })
                        .collect(),
                )
            })
            .unwrap()
        })
        .collect();
    let tb = live_binding(&dst, &pid(tp(0)), "target-t0", 0x9000, 1);
    expect_invalid(TransferPlan::bind(&logical, &[tb], &sb), "address ranges overlap");
}

#[test]
fn acc_306_rebinding_needs_no_replanning() {
    let (src, _, sb, tb, logical) = local_fixture();
    let a = TransferPlan::bind(&logical, std::slice::from_ref(&tb), &[sb]).unwrap();
    let moved = live_binding(&src, &pid(tp(0)), "source-worker-2", 0x2000, 4);
    let moved = RuntimeBinding::new(RuntimeBindingSpec {
        instance_id: "source-instance-2".into(),
        ..binding_spec(&src, &pid(tp(0)), "source-instance-2", 4, moved.fragments().to_vec())
    })
    .unwrap();
    let b = TransferPlan::bind(&logical, &[tb], &[moved]).unwrap();
    assert_eq!(a.operation_fragment(0, Side::Source).1.address(), 0x1000);
    assert_eq!(b.operation_fragment(0, Side::Source).1.address(), 0x2000);
    let e = &b.executors(Side::Source)[0];
    assert_eq!(
        (e.instance_id.as_str(), e.worker_id.as_str(), e.lease_generation),
        ("source-instance-2", "source-worker-2", 4)
    );
    for (x, y) in a.regions().iter().zip(b.regions()) {
        assert_eq!((&x.overlap_offset, &x.overlap_shape), (&y.overlap_offset, &y.overlap_shape));
    }
    assert_ne!(a, b);
}

#[test]
fn acc_307_binding_for_another_placement_is_refused() {
    let (_, _, sb, _, logical) = local_fixture();
    let other = tp_placement(4);
    let tb = live_binding(&other, &pid(tp(1)), "target-t1", 0x9000, 1);
    let e = TransferPlan::bind(&logical, &[tb], &[sb]).unwrap_err();
    assert!(e.message().contains("placement"), "{e}");
}

/// One participant holding rows 0..4 and 4..8 of an (8,) u8 tensor.
fn two_rows_placement() -> Placement {
    let t = gate_up();
    flat_with(
        &live_ids("step-42"),
        topo(1, 1, 1, 1, &[tp(0)]),
        vec![t.clone()],
        vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))],
    )
    .unwrap()
}

#[test]
fn acc_308_placement_level_range_validation() {
    let p = two_rows_placement();
    let ids: Vec<String> = p.parts()[0].fragments().iter().map(|f| f.placement_fragment_id().to_string()).collect();
    let bind = |a: u64, b: u64, wb: &str| {
        RuntimeBinding::new(binding_spec(
            &p,
            &pid(tp(0)),
            "i",
            1,
            vec![
                RuntimeFragment::new(rt_spec(&ids[0], "l", 0x9000, 4, "w", &[4], 1)).unwrap(),
                RuntimeFragment::new(rt_spec(&ids[1], "r", b.max(a), 4, wb, &[4], 1)).unwrap(),
            ],
        ))
        .unwrap()
    };
    for right in [0x9000, 0x9002] {
        expect_invalid(validate_runtime_binding(&p, &bind(0, right, "w")), "runtime binding address ranges overlap");
    }
    validate_runtime_binding(&p, &bind(0, 0x9004, "w")).unwrap();
    validate_runtime_binding(&p, &bind(0, 0x9000, "other-worker")).unwrap();
    // Exact declared aliases share one address; a partial overlap does not.
    let group = ["tied.a", "tied.b"];
    let (ta, tb) = (tensor("tied.a", &[4], 1, &[]), tensor("tied.b", &[4], 1, &[]));
    let mk = |t: &TensorDescriptor| {
        PlacementFragment::new(PlacementFragmentSpec {
            aliases: group.iter().map(|s| s.to_string()).collect(),
            ..frag_spec(t, &[0], &[4], tp(0))
        })
        .unwrap()
    };
    let (fa, fb) = (mk(&ta), mk(&tb));
    let p = flat_with(&live_ids("step-42"), topo(1, 1, 1, 1, &[tp(0)]), vec![ta, tb], vec![fa.clone(), fb.clone()])
        .unwrap();
    let alias = |b: u64| {
        RuntimeBinding::new(binding_spec(
            &p,
            &pid(tp(0)),
            "i",
            1,
            vec![
                RuntimeFragment::new(rt_spec(fa.placement_fragment_id(), "a", 0x9000, 4, "w", &[4], 1)).unwrap(),
                RuntimeFragment::new(rt_spec(fb.placement_fragment_id(), "b", b, 4, "w", &[4], 1)).unwrap(),
            ],
        ))
        .unwrap()
    };
    validate_runtime_binding(&p, &alias(0x9000)).unwrap();
    expect_invalid(validate_runtime_binding(&p, &alias(0x9002)), "runtime binding address ranges overlap");
}

#[test]
fn acc_309_placement_json_round_trips_without_runtime_fields() {
    let p = tp_placement(4);
    let text = p.to_json();
    let back = Placement::from_json(text.as_bytes()).unwrap();
    assert_eq!(back.digest(), p.digest());
    let keys = keys_of(&text);
    for bad in FORBIDDEN.iter().chain(&["fragment_leases"]) {
        assert!(!keys.iter().any(|k| k.contains(bad)), "placement JSON has a key containing {bad}");
    }
    assert!(!text.contains("\"generation\":"));
}

#[test]
fn acc_310_pipeline_routes_are_derived() {
    let t = tensor("layers.9.w", &[8], 1, &[own(Pp)]);
    let src = Arc::new(
        flat_with(
            &live_ids("step-42"),
            topo(1, 1, 1, 1, &[rank(0, 0, 0, 0)]),
            vec![t.clone()],
            vec![whole(&t, rank(0, 0, 0, 0))],
        )
        .unwrap(),
    );
    let tr = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    let dst = Arc::new(
        flat_with(&live_ids("step-42"), topo(1, 2, 1, 1, &tr), vec![t.clone()], vec![whole(&t, tr[1])]).unwrap(),
    );
    let logical = LogicalTransferPlan::plan(src, dst, lim()).unwrap();
    let all: Vec<u32> = (0..logical.regions().len() as u32).collect();
    assert_eq!(logical.source_executors().len(), 1);
    assert_eq!(logical.target_executors().len(), 1);
    assert_eq!(logical.source_executors()[0].operation_indices, all);
    assert_eq!(logical.target_executors()[0].operation_indices, all);
    let routes = logical.pipeline_routes();
    assert_eq!(routes.len(), 1);
    let r = &routes[0];
    assert_eq!((r.source_pp, r.source_pipeline_stage_id, r.target_pp, r.target_pipeline_stage_id), (0, None, 1, None));
    assert_eq!(r.operation_indices, all);
}

fn dp2_live() -> (Arc<Placement>, Arc<Placement>, Vec<RuntimeBinding>, Vec<RuntimeBinding>) {
    let t = tensor("layers.0.mlp.gate_up", &[8], 1, &[split(Tp, 0), repl(Dp)]);
    let src = Arc::new(split_placement(&t, 2, 2, "step-42"));
    let sb = src
        .parts()
        .iter()
        .map(|p| {
            live_binding(
                &src,
                p.participant_id(),
                &format!("s-{}", p.participant_id()),
                0x1000 + (p.rank().dp * 2 + p.rank().tp) * 0x1000,
                1,
            )
        })
        .collect();
    let dst = tp_placement(4);
    let tb = (0..4).map(|i| live_binding(&dst, &pid(tp(i)), &format!("t-{i}"), 0x9000 + i * 0x1000, 1)).collect();
    (src, dst, sb, tb)
}

#[test]
fn acc_312_only_the_selected_dp_replica_has_source_executors() {
    let (src, dst, sb, tb) = dp2_live();
    let logical = LogicalTransferPlan::plan(src, dst, lim()).unwrap();
    let plan = TransferPlan::bind(&logical, &tb, &sb).unwrap();
    let se = plan.executors(Side::Source);
    assert_eq!(se.len(), 2);
    assert!(se.iter().all(|e| e.rank.dp == 0));
    assert_eq!(plan.executors(Side::Target).len(), 4);
}

fn bound_212() -> (TransferPlan, Vec<RuntimeBinding>, Vec<RuntimeBinding>) {
    let (src, sb) = manifests(2, "source", 0x10000);
    let (dst, tb) = manifests(4, "target", 0x40000);
    let logical = LogicalTransferPlan::plan(Arc::new(src), Arc::new(dst), lim()).unwrap();
    (TransferPlan::bind(&logical, &tb, &sb).unwrap(), sb, tb)
}

#[test]
fn acc_313_live_source_requires_executor_provenance() {
    let (plan, sb, tb) = bound_212();
    let mut v: J = serde_json::from_str(&plan.to_json()).unwrap();
    assert_eq!(TransferPlan::from_json(&v.to_string(), &tb, &sb).unwrap(), plan);
    v["source_executors"] = J::Array(vec![]);
    expect_invalid(TransferPlan::from_json(&v.to_string(), &tb, &sb), "live source requires executor provenance");
}

#[test]
fn acc_314_plans_retain_no_allocation_owner() {
    // The Rust plan types have no owner field at all: a binding carries no owner,
    // and a plan holds only owner-free copies. An owner-bearing document is refused.
    let (plan, sb, tb) = bound_212();
    let text = plan.to_json();
    assert!(!keys_of(&text).iter().any(|k| k.contains("owner")));
    let mut v: J = serde_json::from_str(&text).unwrap();
    v["operations"][0]["source"]["owner"] = J::String("framework tensor".into());
    expect_invalid(TransferPlan::from_json(&v.to_string(), &tb, &sb), "transfer plan operations differ");
}

#[test]
fn acc_315_forged_fields_are_rejected_on_reconstruction() {
    let (plan, sb, tb) = bound_212();
    let v: J = serde_json::from_str(&plan.to_json()).unwrap();
    for side in ["source", "target"] {
        for (field, forged) in [
            ("fragment_id", J::from("forged")),
            ("worker_id", J::from("forged")),
            ("endpoint", J::from("forged:1")),
            ("device", J::from("cuda:7")),
            ("generation", J::from(9)),
            ("address_offset", J::from(1)),
            ("storage_offset", J::from(1)),
        ] {
            let mut w = v.clone();
            w["operations"][0][side][field] = forged;
            expect_invalid(TransferPlan::from_json(&w.to_string(), &tb, &sb), "transfer plan operations differ");
        }
        for (field, forged) in [
            ("fragment_ids", J::from(vec!["forged"])),
            ("worker_id", J::from("forged")),
            ("generation", J::from(9)),
            ("lease_id", J::from("forged")),
        ] {
            let mut w = v.clone();
            w[format!("{side}_executors")][0][field] = forged;
            expect_invalid(
                TransferPlan::from_json(&w.to_string(), &tb, &sb),
                &format!("{side} executor provenance differs from attestation"),
            );
        }
    }
    // A binding that changed an attested field is not the planned one.
    let src = plan.placement(Side::Source).clone();
    let moved = live_binding(&src, &pid(tp(0)), "source-t0", 0x90000, 1);
    assert!(plan
        .resolve_executors(Side::Source, &src, &moved)
        .unwrap_err()
        .message()
        .contains("source executor snapshot mismatch"));
}

#[test]
fn acc_316_binding_keeps_limits_and_passes_the_budget() {
    let (src, dst) = (tp_placement(2), tp_placement(4));
    let limits = PlanningLimits { max_transfer_regions: 7, max_segments_per_region: 7, max_total_lowered_segments: 7 };
    let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), limits).unwrap();
    let sb: Vec<_> =
        (0..2).map(|i| live_binding(&src, &pid(tp(i)), &format!("s{i}"), 0x1000 + i * 0x1000, 1)).collect();
    let tb: Vec<_> =
        (0..4).map(|i| live_binding(&dst, &pid(tp(i)), &format!("t{i}"), 0x9000 + i * 0x1000, 1)).collect();
    let seen = std::sync::Mutex::new(Vec::new());
    let validator = |w: &[TargetWrite<'_>], budget: u64| {
        seen.lock().unwrap().push((w.len(), budget));
        validate_target_physical_ranges(w, budget)
    };
    let plan = TransferPlan::bind_with(&logical, &tb, &sb, &validator).unwrap();
    assert_eq!(plan.planning_limits(), limits);
    assert_eq!(*seen.lock().unwrap(), vec![(4, 7)]);
}

#[test]
fn acc_317_each_source_participant_keeps_its_generation() {
    let (src, dst) = (tp_placement(2), tp_placement(1));
    let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), lim()).unwrap();
    let sb: Vec<_> =
        (0..2).map(|i| live_binding(&src, &pid(tp(i)), &format!("s{i}"), 0x1000 + i * 0x1000, 5 + i)).collect();
    let tb = live_binding(&dst, &pid(tp(0)), "t0", 0x9000, 1);
    let plan = TransferPlan::bind(&logical, &[tb], &sb).unwrap();
    let gens: Vec<u64> =
        plan.executors(Side::Source).iter().map(|e| plan.executor_snapshot(e, 0).lease_generation()).collect();
    assert_eq!(gens, vec![5, 6]);
}

#[test]
fn acc_318_binding_keeps_region_geometry() {
    let (plan, _, _) = bound_212();
    assert_eq!(plan.regions().len(), plan.logical().regions().len());
    assert_eq!(plan.regions(), plan.logical().regions());
    assert_eq!(plan.regions().len(), 4);
}

// ---------------------------------------------------------------------------
// Physical target ranges (hand-built writes)
// ---------------------------------------------------------------------------

struct Hand {
    tensor: TensorDescriptor,
    target: PlacementFragment,
    source: PlacementFragment,
}

fn hand(shape: &[u64]) -> Hand {
    let t = tensor("w", shape, 1, &[]);
    Hand { target: whole(&t, tp(0)), source: whole(&t, tp(0)), tensor: t }
}

fn column_region(h: &Hand, col: u64, width: u64) -> TransferRegion {
    let shape = h.tensor.global_shape();
    let b = h.target.as_box();
    TransferRegion::derive(b, b, vec![0, col], vec![shape[0], width], 1)
}

fn rt(h: &Hand, id: &str, address: u64, worker: &str, device: &str, endpoint: &str) -> RuntimeFragment {
    RuntimeFragment::new(RuntimeFragmentSpec {
        device: device.into(),
        endpoint: endpoint.into(),
        ..rt_spec(h.target.placement_fragment_id(), id, address, h.target.nbytes(), worker, h.target.local_shape(), 1)
    })
    .unwrap()
}

fn write<'a>(h: &'a Hand, f: &'a RuntimeFragment, r: &'a TransferRegion) -> TargetWrite<'a> {
    TargetWrite {
        instance_id: "i",
        lease_id: "l",
        lease_generation: 1,
        target: f,
        target_placement: &h.target,
        region: r,
        source_placement: &h.source,
    }
}

#[test]
fn acc_319_physically_overlapping_strided_targets_conflict() {
    let h = hand(&[4, 8]);
    let (r1, r2) = (column_region(&h, 0, 2), column_region(&h, 2, 2));
    let f1 = rt(&h, "f1", 0x1000, "w", "cuda:0", "e:1");
    let check =
        |f2: &RuntimeFragment| validate_target_physical_ranges(&[write(&h, &f1, &r1), write(&h, f2, &r2)], 1000);
    expect_invalid(check(&rt(&h, "f2", 0x1000 - 2, "w", "cuda:0", "e:1")), "conflicting target physical range");
    check(&rt(&h, "f2", 0x1000 - 2, "w", "cuda:1", "e:1")).unwrap();
    expect_invalid(check(&rt(&h, "f2", 0x1000 - 2, "w", "cuda:0", "other:2")), "conflicting target physical range");
    // Only the last segment of r1 meets the first of r2.
    expect_invalid(check(&rt(&h, "f2", 0x1000 + 24 - 2, "w", "cuda:0", "e:1")), "conflicting target physical range");
    check(&rt(&h, "f2", 0x1000 + 32, "w", "cuda:0", "e:1")).unwrap();
}

#[test]
fn acc_320_scan_budget_counts_segments_of_incomplete_fragments() {
    let h = hand(&[16, 64]);
    let regions: Vec<TransferRegion> = (0..32).map(|c| column_region(&h, 2 * c, 1)).collect();
    let f = rt(&h, "f", 0x1000, "w", "cuda:0", "e:1");
    let writes: Vec<_> = regions.iter().map(|r| write(&h, &f, r)).collect();
    validate_target_physical_ranges(&writes, 512).unwrap();
    expect_invalid(validate_target_physical_ranges(&writes, 511), "segment scan budget");
    let h = hand(&[8, 64]);
    let regions: Vec<TransferRegion> = (0..32).map(|c| column_region(&h, 2 * c, 1)).collect();
    let f = rt(&h, "f", 0x1000, "w", "cuda:0", "e:1");
    let writes: Vec<_> = regions.iter().map(|r| write(&h, &f, r)).collect();
    expect_invalid(validate_target_physical_ranges(&writes, 3), "segment scan budget");
}

#[test]
fn acc_321_complete_fragments_count_as_one_range() {
    let h = hand(&[600_000, 2]);
    let (r1, r2) = (column_region(&h, 0, 1), column_region(&h, 1, 1));
    assert!(r1.segment_count() + r2.segment_count() > 1_000_000);
    let f = rt(&h, "f", 0x10_0000, "w", "cuda:0", "e:1");
    validate_target_physical_ranges(&[write(&h, &f, &r1), write(&h, &f, &r2)], 1).unwrap();
    // A fallback (incomplete) fragment overlapping the complete one conflicts.
    let g = rt(&h, "g", 0x10_0000 + 100, "w", "cuda:0", "e:1");
    expect_invalid(
        validate_target_physical_ranges(&[write(&h, &f, &r1), write(&h, &f, &r2), write(&h, &g, &r1)], 10_000_000),
        "conflicting target physical range",
    );
}

#[test]
fn acc_322_plans_are_only_built_by_binding() {
    // `TransferPlan` has no public constructor: a plan exists only as the result of
    // binding (or of restoring a shipped document, which re-binds). Regions that
    // name fragments no binding attests are refused on restore.
    let (plan, sb, tb) = bound_212();
    let mut v: J = serde_json::from_str(&plan.to_json()).unwrap();
    v["operations"][0]["target"]["fragment_id"] = J::from("unattested");
    expect_invalid(TransferPlan::from_json(&v.to_string(), &tb, &sb), "transfer plan operations differ");
    let mut v: J = serde_json::from_str(&plan.to_json()).unwrap();
    v["logical"]["regions"][0]["inner_bytes"] = J::from(3);
    expect_invalid(TransferPlan::from_json(&v.to_string(), &tb, &sb), "logical transfer plan JSON differs");
    let logical = LogicalTransferPlan::from_json(&plan.logical().to_json()).unwrap();
    assert_eq!(&logical, plan.logical());
}

#[test]
fn acc_311_bound_plan_is_evidence_not_a_capability() {
    // `TransferPlan` has no `execute` or `submit` (a compile-time fact: execution
    // lives in `protocol::transfer::TransferExecutor`, which takes the plan by
    // reference). The plan is a plain immutable value that holds no engine, token or
    // owner: it is `Send + Sync + Clone + 'static`, and its JSON has no address.
    fn inert<T: Send + Sync + Clone + 'static>() {}
    inert::<TransferPlan>();
    let (plan, _, _) = bound_212();
    assert!(!keys_of(&plan.to_json()).iter().any(|k| k == "address" || k.contains("owner") || k.contains("token")));
}
