//! Acceptance tests, section C (upload planning), items 101–114 of `acceptance.md`.
//! All of these exercise `plan_upload` only (pure, no store I/O); store-side halves
//! are noted where an item mentions them.

#[path = "common/builders.rs"]
mod builders;

use builders::*;
use mooncake_weight_store::*;
use std::collections::BTreeSet;

fn plan(p: &Placement, b: &[RuntimeBinding]) -> Result<UploadPlan> {
    plan_upload(p, b, &UploadOptions::default())
}

#[test]
fn acc_101_selects_one_complete_generation_consistent_dp_replica() {
    let (p, bindings) = s_source(2, 2, &|r| if r.dp == 1 && r.tp == 1 { 3 } else { 2 });
    assert_eq!(bindings.len(), 4);
    let plan = plan(&p, &bindings).unwrap();
    assert_eq!(plan.operations().len(), 2);
    for op in plan.operations() {
        assert_eq!(op.source_placement().rank().dp, 0);
        assert_eq!(op.source_lease_generation(), 2);
        assert_eq!(op.source_snapshot().lease_generation(), 2);
        assert_eq!(op.source_lease_id(), "lease-2");
    }
    let targets: Vec<&StoredFragment> = plan.operations().iter().map(|o| o.target()).collect();
    let fragments: Vec<&StoredFragment> = plan.manifest().fragments().iter().collect();
    assert_eq!(targets, fragments);
    assert!(plan.manifest().group_id().ends_with("/1"));
    assert_eq!(plan.control_key(), format!("{}/decision", plan.transaction_group_id()));
    assert!(plan.transaction_group_id().starts_with(&format!("{}/transactions/", plan.manifest().group_id())));
    assert_eq!(plan.source_placement_id(), p.placement_id());
    assert_eq!(plan.source_placement_digest(), p.digest());
}

#[test]
fn acc_102_replicas_with_different_generations_are_refused() {
    let (p, bindings) = s_source(2, 2, &|r| r.dp + 1);
    expect_invalid(plan(&p, &bindings), "inconsistent lease generations");
}

#[test]
fn acc_103_incomplete_dp_replica_is_refused() {
    let (p, bindings) = s_source(1, 2, &|_| 1);
    expect_invalid(plan(&p, &bindings[..1]), "generation-consistent DP replica");
}

#[test]
fn acc_104_mixed_generations_within_one_replica_are_refused() {
    let (p, bindings) = s_source(1, 2, &|r| r.tp + 1);
    expect_invalid(plan(&p, &bindings), "generation-consistent DP replica");
}

#[test]
fn acc_105_dp_owned_source_tensors_are_refused() {
    let t = TensorDescriptor::new(TensorSpec {
        parallel_axes: vec![own(Dp), own(Pp), own(Ep), split(Tp, 0)],
        ..s_tensor_spec()
    })
    .unwrap();
    let ranks = grid(1, 1, 1, 2);
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    let p = flat_with(&s_ids(1), topo(1, 1, 1, 2, &ranks), vec![t], fs).unwrap();
    let bindings = bind_all(&p, &|_| 1);
    expect_invalid(plan(&p, &bindings), "requires replicated DP source tensors");
}

#[test]
fn acc_106_generations_have_disjoint_store_identity() {
    // Committing both plans and loading them back is store I/O (section D); this
    // checks the planned identities that make them independent.
    let plans: Vec<(Placement, UploadPlan)> = [17u64, 18]
        .iter()
        .map(|&g| {
            let p = s_placement(1, 2, g);
            let b = bind_all(&p, &|_| 1);
            let plan = plan(&p, &b).unwrap();
            (p, plan)
        })
        .collect();
    let (p17, a) = &plans[0];
    let (p18, b) = &plans[1];
    assert!(a.manifest().group_id().ends_with("/17"));
    assert!(b.manifest().group_id().ends_with("/18"));
    assert_ne!(a.manifest().group_id(), b.manifest().group_id());
    assert_ne!(a.manifest().manifest_key(), b.manifest().manifest_key());
    let keys = |plan: &UploadPlan| -> BTreeSet<String> {
        let prefix = format!("{}/payload/", plan.manifest().group_id());
        plan.operations()
            .iter()
            .map(|o| {
                assert!(o.target().object_key().starts_with(&prefix));
                o.target().object_key().to_string()
            })
            .collect()
    };
    assert!(keys(a).is_disjoint(&keys(b)));
    assert_ne!(a.manifest(), b.manifest());
    assert_ne!(a.manifest().manifest_digest(), b.manifest().manifest_digest());
    assert_eq!(a.manifest().weight_generation(), 17);
    assert_eq!(b.manifest().weight_generation(), 18);
    assert_ne!(p17.placement_id(), p18.placement_id());
    assert_ne!(p17.digest(), p18.digest());
    assert_eq!(a.manifest().revision(), b.manifest().revision());
}

#[test]
fn acc_107_tp_pp_and_ep_ownership_are_preserved() {
    let t = s_tensor();
    let ranks = [rank(0, 3, 2, 0), rank(0, 3, 2, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    let p = flat_with(&s_ids(1), topo(1, 4, 3, 2, &ranks), vec![t], fs).unwrap();
    let plan = plan(&p, &bind_all(&p, &|_| 1)).unwrap();
    assert_eq!(plan.operations().len(), 2);
    let ranks: Vec<ParallelRank> = plan.operations().iter().map(|o| o.source_placement().rank()).collect();
    assert_eq!(ranks.iter().map(|r| r.tp).collect::<BTreeSet<_>>(), BTreeSet::from([0, 1]));
    assert_eq!(ranks.iter().map(|r| r.pp).collect::<BTreeSet<_>>(), BTreeSet::from([3]));
    assert_eq!(ranks.iter().map(|r| r.ep).collect::<BTreeSet<_>>(), BTreeSet::from([2]));
}

#[test]
fn acc_108_plan_keeps_no_framework_allocation_owner() {
    // Rust: runtime fragments carry no owner; the plan holds only copied values, so
    // it outlives every input and the framework may free its allocations (here an
    // `Arc` standing in for the owner) without affecting the plan.
    let owner = std::sync::Arc::new(vec![0u8; 8]);
    let (plan, addresses) = {
        let (p, bindings) = s_source(1, 2, &|_| 1);
        let addresses: Vec<u64> = bindings.iter().flat_map(|b| b.fragments().iter().map(|f| f.address())).collect();
        let plan = plan(&p, &bindings).unwrap();
        drop(bindings);
        drop(p);
        (plan, addresses)
    };
    assert_eq!(std::sync::Arc::strong_count(&owner), 1);
    drop(owner);
    let planned: Vec<u64> = plan.operations().iter().map(|o| o.source_snapshot().address()).collect();
    assert_eq!(planned, addresses);
    assert_eq!(plan.operations()[0].source_snapshot().runtime().worker_id(), "worker-dp0-pp0-ep0-tp0");
}

#[test]
fn acc_109_payload_outside_the_transaction_is_refused() {
    let (p, bindings) = s_source(1, 2, &|_| 1);
    let plan = plan(&p, &bindings).unwrap();
    let m = plan.manifest();
    let foreign = |f: &StoredFragment| {
        StoredFragment::new(StoredFragmentSpec {
            fragment_id: f.fragment_id().into(),
            tensor_id: f.tensor_id().into(),
            global_offset: f.global_offset().to_vec(),
            local_shape: f.local_shape().to_vec(),
            object_key: format!("{}/payload/other-transaction/{}", m.group_id(), f.fragment_id()),
            object_offset: 0,
            nbytes: f.nbytes(),
            aliases: f.aliases().to_vec(),
        })
        .unwrap()
    };
    let fragments: Vec<StoredFragment> = m.fragments().iter().map(foreign).collect();
    let manifest = StoredManifest::new(StoredManifestSpec {
        namespace: m.namespace().into(),
        resource_id: m.resource_id().into(),
        revision: m.revision().into(),
        weight_generation: m.weight_generation(),
        group_id: m.group_id().into(),
        manifest_key: m.manifest_key().into(),
        tensors: m.tensors().to_vec(),
        fragments,
        created_at: m.created_at().into(),
    })
    .unwrap();
    let operations = plan
        .operations()
        .iter()
        .map(|o| {
            UploadOperation::new(
                o.source_placement().clone(),
                o.source_snapshot().clone(),
                o.source_participant_id().into(),
                o.source_instance_id().into(),
                foreign(o.target()),
                o.source_lease_generation(),
                o.source_lease_id().into(),
            )
            .unwrap()
        })
        .collect();
    let rebuilt = UploadPlan::new(
        manifest,
        plan.source_placement_id().into(),
        plan.source_placement_digest().into(),
        plan.transaction_group_id().into(),
        plan.control_key().into(),
        operations,
    );
    expect_invalid(rebuilt, "does not own payload members");
    // The original parts rebuild into an equal plan.
    let same = UploadPlan::new(
        plan.manifest().clone(),
        plan.source_placement_id().into(),
        plan.source_placement_digest().into(),
        plan.transaction_group_id().into(),
        plan.control_key().into(),
        plan.operations().to_vec(),
    )
    .unwrap();
    assert_eq!(same, plan);
}

#[test]
fn acc_110_empty_participant_needs_no_binding() {
    let t = s_tensor();
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    let p = flat_with(&s_ids(1), topo(1, 2, 1, 1, &ranks), vec![t.clone()], vec![whole(&t, ranks[0])]).unwrap();
    let bindings = bind_all(&p, &|_| 1);
    assert_eq!(bindings.len(), 1);
    assert_eq!(plan(&p, &bindings).unwrap().operations().len(), 1);
}

#[test]
fn acc_111_missing_nonempty_participant_binding_is_refused() {
    let a = TensorDescriptor::new(TensorSpec { tensor_id: "layers.0.w".into(), ..s_tensor_spec() }).unwrap();
    let b = TensorDescriptor::new(TensorSpec { tensor_id: "layers.1.w".into(), ..s_tensor_spec() }).unwrap();
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    let fs = vec![whole(&a, ranks[0]), whole(&b, ranks[1])];
    let p = flat_with(&s_ids(1), topo(1, 2, 1, 1, &ranks), vec![a, b], fs).unwrap();
    let only_pp0 = vec![bind_part(&p, &pid(ranks[0]), 1, 0x1000)];
    expect_invalid(plan(&p, &only_pp0), "no complete generation-consistent DP replica");
    // With both bound it plans.
    let both = vec![bind_part(&p, &pid(ranks[0]), 1, 0x1000), bind_part(&p, &pid(ranks[1]), 1, 0x1000)];
    assert_eq!(plan(&p, &both).unwrap().operations().len(), 2);
}

#[test]
fn acc_112_dp_replicas_are_deduplicated() {
    // The placement-to-placement (load) planner half of the reference test is not
    // part of upload planning; here: S(2,2) uploads two payloads, from dp 0.
    let (p, bindings) = s_source(2, 2, &|_| 1);
    let plan = plan(&p, &bindings).unwrap();
    assert_eq!(plan.operations().len(), 2);
    assert!(plan.operations().iter().all(|o| o.source_placement().rank().dp == 0));
    let tps: Vec<u64> = plan.operations().iter().map(|o| o.source_placement().rank().tp).collect();
    assert_eq!(tps, [0, 1]);
    // Binding dp 1 only selects dp 1.
    let dp1: Vec<RuntimeBinding> = bindings.into_iter().filter(|b| b.participant_id().starts_with("dp1")).collect();
    let plan = plan_upload(&p, &dp1, &UploadOptions::default()).unwrap();
    assert!(plan.operations().iter().all(|o| o.source_placement().rank().dp == 1));
}

#[test]
fn acc_113_expert_boxes_are_kept() {
    let (p, bindings) = m_source();
    let plan = plan(&p, &bindings).unwrap();
    assert_eq!(plan.operations().len(), 4);
    let keys: BTreeSet<&str> = plan.operations().iter().map(|o| o.target().object_key()).collect();
    assert_eq!(keys.len(), 4);
    for (r, op) in plan.operations().iter().enumerate() {
        assert_eq!(op.target().global_offset(), &[r as u64, 0, 0]);
        assert_eq!(op.target().local_shape(), &[1, 6, 8]);
        assert_eq!(op.source_placement().rank().ep, r as u64);
    }
    assert_eq!(plan.manifest().tensors()[0].shard_dims(), &[0]);
    assert_eq!(plan.manifest().fragments()[1].fragment_id(), "4469de153fb6cdc02d5e7a34");
}

#[test]
fn acc_114_mixed_single_axis_descriptors_round_trip() {
    let big = m_tensor();
    let small = tensor("layers.0.experts.bias", &[4], 1, &[split(Ep, 0)]);
    let ranks: Vec<ParallelRank> = (0..4).map(|e| rank(0, 0, e, 0)).collect();
    let fs = ranks.iter().flat_map(|&r| [rows(&big, r.ep, 1, r), rows(&small, r.ep, 1, r)]).collect();
    let p = flat(topo(1, 1, 4, 1, &ranks), vec![big, small], fs).unwrap();
    let plan = plan(&p, &bind_all(&p, &|_| 1)).unwrap();
    let m = plan.manifest();
    assert_eq!(m.fragments().len(), 8);
    let back = StoredManifest::from_json(m.to_json().as_bytes()).unwrap();
    assert_eq!(&back, m);
    let bias = back.tensors().iter().find(|t| t.tensor_id() == "layers.0.experts.bias").unwrap();
    assert_eq!(bias.shard_dims(), &[0]);
    assert_eq!(bias.global_shape(), &[4]);
}
