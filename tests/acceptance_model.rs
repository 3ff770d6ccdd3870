//! Acceptance tests, section A (data model), items 1–81 of `acceptance.md`.

#[path = "common/builders.rs"]
mod builders;

use builders::*;
use mooncake_weight_store::*;
use serde_json::json;
use std::sync::Arc;

// ---------------------------------------------------------------------------
// A.1 Descriptors and axes
// ---------------------------------------------------------------------------

#[test]
fn acc_001_descriptor_keeps_canonical_shard_dims() {
    let t = f_desc();
    assert_eq!(t.shard_dims(), &[0]);
    let t = tensor("experts", &[8, 16, 32], 2, &[split(Ep, 0), split(Tp, 1)]);
    assert_eq!(t.shard_dims(), &[0, 1]);
}

#[test]
fn acc_002_axes_are_stored_in_canonical_kind_order() {
    let t = tensor("w", &[8, 16, 32], 2, &[split(Tp, 2), split(Ep, 0), own(Pp), repl(Dp)]);
    assert_eq!(t.parallel_axes(), &[repl(Dp), own(Pp), split(Ep, 0), split(Tp, 2)]);
    assert_eq!(t.shard_dims(), &[0, 2]);
}

#[test]
fn acc_003_ambiguous_axis_semantics_are_rejected() {
    let mut s = tensor_spec("w", &[8, 8], 2, &[split(Tp, 1)]);
    s.shard_dims = vec![0];
    expect_invalid(TensorDescriptor::new(s), "shard_dims");
    let mut s = tensor_spec("w", &[8, 8], 2, &[split(Tp, 0), repl(Tp)]);
    s.shard_dims = vec![0];
    expect_invalid(TensorDescriptor::new(s), "duplicate");
    let mut s = tensor_spec("w", &[8, 8], 2, &[split(Tp, 0), split(Ep, 0)]);
    s.shard_dims = vec![0];
    expect_invalid(TensorDescriptor::new(s), "share a dimension");
}

#[test]
fn acc_004_individually_allocated_expert_requires_ep_ownership() {
    let mut s = tensor_spec("w", &[8, 8], 2, &[split(Ep, 0)]);
    s.expert_id = Some(3);
    expect_invalid(TensorDescriptor::new(s), "individually allocated expert");
    let mut s = tensor_spec("w", &[8, 8], 2, &[own(Ep)]);
    s.expert_id = Some(3);
    let t = TensorDescriptor::new(s).unwrap();
    assert!(t.shard_dims().is_empty());
    assert_eq!(t.expert_id(), Some(3));
}

/// Replaces the first axis of F-place's tensor with `axis` and decodes.
fn with_axis(axis: serde_json::Value) -> Result<Placement> {
    edited_f_place(|v| v["tensors"][0]["parallel_axes"][0] = axis)
}

#[test]
fn acc_005_invalid_axis_schema_is_rejected() {
    // Typed constructors.
    expect_invalid(AxisKind::parse("unknown"), "kind");
    expect_invalid(ParallelAxis::split(Pp, 0), "split semantics");
    expect_invalid(ParallelAxis::split(Dp, 0), "split semantics");
    let e = expect_invalid(ParallelAxis::split(Ep, 1), "leading");
    assert!(e.message().contains("EP must split"));
    // A negative or boolean dim, and unknown kinds, can only arrive through JSON.
    expect_invalid(with_axis(json!({"semantics": "split", "kind": "unknown", "dim": 0})), "kind");
    expect_invalid(with_axis(json!({"semantics": "split", "kind": "tp", "dim": -1})), "at least");
    expect_invalid(with_axis(json!({"semantics": "split", "kind": "tp", "dim": true})), "integer");
    expect_invalid(with_axis(json!({"semantics": "split", "kind": "pp", "dim": 0})), "split semantics");
    expect_invalid(with_axis(json!({"semantics": "split", "kind": "dp", "dim": 0})), "split semantics");
    let e = expect_invalid(with_axis(json!({"semantics": "split", "kind": "ep", "dim": 1})), "leading");
    assert!(e.message().contains("EP must split"));
    expect_invalid(with_axis(json!({"semantics": "replicated", "kind": "unknown"})), "kind");
    expect_invalid(with_axis(json!({"semantics": "ownership", "kind": "unknown"})), "kind");
}

#[test]
fn acc_006_invalid_descriptor_schema_is_rejected() {
    let base = || tensor_spec("w", &[8, 4], 2, &[]);
    expect_invalid(TensorDescriptor::new(TensorSpec { global_shape: vec![], ..base() }), "global_shape");
    expect_invalid(TensorDescriptor::new(TensorSpec { shard_dims: vec![0, 0], ..base() }), "duplicates");
    expect_invalid(TensorDescriptor::new(TensorSpec { shard_dims: vec![1, 0], ..base() }), "sorted");
    expect_invalid(TensorDescriptor::new(TensorSpec { shard_dims: vec![2], ..base() }), "out-of-range");
    expect_invalid(
        TensorDescriptor::new(TensorSpec { layout_fingerprint: String::new(), ..base() }),
        "layout_fingerprint",
    );
    // Floats and booleans (and non-axis values) are unrepresentable in the typed
    // API: exercised through the JSON decoder.
    let t = |edit: fn(&mut serde_json::Value)| edited_f_place(|v| edit(&mut v["tensors"][0]));
    expect_invalid(t(|t| t["global_shape"] = json!([8.0, 4])), "integer");
    expect_invalid(t(|t| t["itemsize"] = json!(true)), "integer");
    expect_invalid(t(|t| t["shard_dims"] = json!([true])), "integer");
    // A non-axis element in parallel_axes (JSON: not an axis object).
    expect_invalid(t(|t| t["parallel_axes"] = json!([1])), "parallel axis 0 must be a JSON object");
}

#[test]
fn acc_007_global_shape_must_be_an_ordered_sequence() {
    // Mapping / set / one-shot iterator map to non-array JSON values; the typed
    // API (Vec<u64>) is ordered by construction.
    for bad in [json!({"0": 8, "1": 4}), json!("84"), json!(8)] {
        let r = edited_w5(|v| v["tensors"][0]["global_shape"] = bad.clone());
        expect_invalid(r, "global_shape must contain integers");
        let r = edited_f_place(|v| v["tensors"][0]["global_shape"] = bad.clone());
        expect_invalid(r, "global_shape must be a sequence");
    }
    let t = TensorDescriptor::new(TensorSpec { global_shape: vec![8, 4], ..tensor_spec("w", &[1], 1, &[]) }).unwrap();
    assert_eq!(t.global_shape(), &[8, 4]);
}

#[test]
fn acc_008_layout_fingerprint_is_required() {
    // No default: a spec without a fingerprint (Default = "") fails naming it.
    let spec = TensorSpec { layout_fingerprint: Default::default(), ..f_desc_spec() };
    expect_invalid(TensorDescriptor::new(spec), "layout_fingerprint");
    // JSON: the key is required.
    let r = edited_w5(|v| {
        v["tensors"][0].as_object_mut().unwrap().remove("layout_fingerprint");
    });
    expect_invalid(r, "schema");
}

#[test]
fn acc_009_bool_and_float_integers_are_rejected() {
    // Typed API fields are u64; bool/float arrive only through JSON. The runtime
    // binding has no JSON form in Rust (address/nbytes/generation are u64).
    let p = |edit: fn(&mut serde_json::Value)| edited_f_place(edit);
    expect_invalid(p(|v| v["parts"][0]["fragments"][0]["rank"]["dp"] = json!(true)), "integer");
    expect_invalid(p(|v| v["parts"][0]["rank"]["dp"] = json!(true)), "integer");
    expect_invalid(p(|v| v["topology"]["participants"][0]["rank"]["dp"] = json!(true)), "integer");
    expect_invalid(p(|v| v["tensors"][0]["global_shape"] = json!([8.0, 4])), "integer");
    expect_invalid(p(|v| v["tensors"][0]["itemsize"] = json!(2.0)), "integer");
    expect_invalid(p(|v| v["tensors"][0]["shard_dims"] = json!([0.0])), "integer");
    expect_invalid(p(|v| v["weight_generation"] = json!(true)), "integer");
    expect_invalid(p(|v| v["weight_generation"] = json!(7.0)), "integer");
    let m = |edit: fn(&mut serde_json::Value)| edited_w5(edit);
    expect_invalid(m(|v| v["fragments"][0]["object_offset"] = json!(0.0)), "integer");
    expect_invalid(m(|v| v["fragments"][0]["nbytes"] = json!(64.0)), "integer");
    expect_invalid(m(|v| v["fragments"][0]["nbytes"] = json!(false)), "integer");
    expect_invalid(m(|v| v["weight_generation"] = json!(true)), "integer");
    expect_invalid(m(|v| v["tensors"][0]["itemsize"] = json!(1e0)), "integer");
}

// ---------------------------------------------------------------------------
// A.2 Placement fragments, parts, topology
// ---------------------------------------------------------------------------

#[test]
fn acc_010_derived_fragment_ids_are_stable() {
    let t = f_desc();
    let a = frag(&t, &[0, 0], &[4, 4], tp(0));
    let b = frag(&t, &[0, 0], &[4, 4], tp(0));
    assert_eq!(a.placement_fragment_id(), b.placement_fragment_id());
    assert!(a.placement_fragment_id().starts_with("sha256:"));
    assert_eq!(a.placement_fragment_id().len(), 7 + 64);
    assert_eq!(a.fragment_id(), a.placement_fragment_id());
    assert_ne!(a.placement_fragment_id(), frag(&t, &[0, 0], &[4, 4], tp(1)).placement_fragment_id());
}

#[test]
fn acc_011_part_rejects_unreferenced_tensor() {
    let topology = f_topology();
    let t = f_desc();
    let other = tensor("unused", &[4], 1, &[]);
    let spec = part_spec(&topology, "worker-0", &[&t, &other], vec![whole(&t, tp(0))]);
    expect_invalid(PlacementPart::new(spec), "unreferenced tensor");
}

#[test]
fn acc_012_part_rejects_same_rank_overlap() {
    let topology = f_topology();
    let t = tensor("w", &[8, 8], 1, &[]);
    let fragments = vec![frag(&t, &[0, 0], &[6, 8], tp(0)), frag(&t, &[4, 0], &[4, 8], tp(0))];
    expect_invalid(
        PlacementPart::new(part_spec(&topology, "worker-0", &[&t], fragments)),
        "logical fragment boxes overlap",
    );
}

#[test]
fn acc_013_part_accepts_adjacent_boxes() {
    let topology = f_topology();
    let t = tensor("w", &[8, 8], 1, &[split(Ep, 0), split(Tp, 1)]);
    let fragments = [(0, 0), (0, 4), (4, 0), (4, 4)].iter().map(|&(r, c)| frag(&t, &[r, c], &[4, 4], tp(0))).collect();
    let part = PlacementPart::new(part_spec(&topology, "worker-0", &[&t], fragments)).unwrap();
    assert_eq!(part.fragments().len(), 4);
}

#[test]
fn acc_014_fragment_geometry_is_checked() {
    let topology = f_topology();
    let t = tensor("w", &[8, 8], 1, &[]);
    let spec = part_spec(&topology, "worker-0", &[&t], vec![frag(&t, &[7, 0], &[2, 8], tp(0))]);
    expect_invalid(PlacementPart::new(spec), "out of bounds");
    let b = f_desc();
    let bad =
        PlacementFragment::new(PlacementFragmentSpec { nbytes: 31, ..frag_spec(&b, &[0, 0], &[4, 4], tp(0)) }).unwrap();
    let spec = part_spec(&topology, "worker-0", &[&b], vec![bad]);
    expect_invalid(PlacementPart::new(spec), "byte size mismatch");
}

#[test]
fn acc_015_partial_part_is_allowed_but_placement_is_not() {
    let topology = f_topology();
    let t = tensor("w", &[8, 4], 1, &[]);
    let part = PlacementPart::new(part_spec(&topology, "worker-0", &[&t], vec![rows(&t, 0, 4, tp(0))])).unwrap();
    expect_invalid(from_parts(topology, vec![part]), "not fully covered");
}

#[test]
fn acc_016_topology_rejects_out_of_range_rank() {
    expect_invalid(try_topo(1, 1, 1, 2, &[tp(0), tp(2)]), "tp rank");
}

#[test]
fn acc_017_topology_world_size_is_participant_count() {
    let t = topo(1, 1, 2, 2, &[rank(0, 0, 0, 0), rank(0, 0, 1, 1)]);
    assert_eq!(t.world_size(), 2);
    assert_eq!(t.tp_size() * t.ep_size(), 4);
}

#[test]
fn acc_018_wrong_element_and_container_types() {
    // Typed collections cannot hold a wrong element type; JSON can.
    expect_invalid(edited_f_place(|v| v["tensors"] = json!([1])), "tensor");
    expect_invalid(edited_f_place(|v| v["parts"][0]["fragments"] = json!([1])), "fragment");
    expect_invalid(edited_f_place(|v| v["tensors"] = json!(null)), "tensors");
    expect_invalid(edited_f_place(|v| v["parts"][0]["fragments"] = json!(null)), "fragments");
    expect_invalid(edited_w5(|v| v["tensors"] = json!(null)), "tensors");
    expect_invalid(edited_w5(|v| v["fragments"] = json!(null)), "fragments");
    expect_invalid(edited_w5(|v| v["tensors"] = json!([1])), "tensor");
    expect_invalid(edited_w5(|v| v["fragments"] = json!([1])), "fragment");
}

// ---------------------------------------------------------------------------
// A.3 Placement completeness and semantics
// ---------------------------------------------------------------------------

/// A (8,4) uint8 tensor with `axes`.
fn t84(axes: &[ParallelAxis]) -> TensorDescriptor {
    tensor("w", &[8, 4], 1, axes)
}

#[test]
fn acc_019_one_complete_global_placement_from_parts() {
    let t = t84(&[repl(Dp), own(Pp), split(Tp, 0)]);
    let topology = topo(1, 1, 1, 2, &[tp(0), tp(1)]);
    let parts = (0..2)
        .map(|i| {
            let r = tp(i);
            PlacementPart::new(part_spec(&topology, &pid(r), &[&t], vec![rows(&t, 4 * i, 4, r)])).unwrap()
        })
        .collect();
    let p = from_parts(topology, parts).unwrap();
    assert_eq!(p.topology().world_size(), 2);
    assert_eq!(p.parts().len(), 2);
    assert_eq!(p.tensors().len(), 1);
    assert_eq!(p.fragment_count(), 2);
    let back = Placement::from_json(p.to_json().as_bytes()).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.digest(), p.digest());
}

#[test]
fn acc_020_flat_inventory_rejects_unreferenced_tensor() {
    let t = f_desc();
    let other = tensor("unused", &[4], 1, &[]);
    expect_invalid(flat(f_topology(), vec![t.clone(), other], vec![whole(&t, tp(0))]), "unreferenced tensor");
}

fn tied(id: &str, aliases: &[&str]) -> (TensorDescriptor, PlacementFragment) {
    let t = tensor(id, &[8], 2, &[]);
    let f = PlacementFragment::new(PlacementFragmentSpec {
        aliases: aliases.iter().map(|s| s.to_string()).collect(),
        ..frag_spec(&t, &[0], &[8], tp(0))
    })
    .unwrap();
    (t, f)
}

#[test]
fn acc_021_alias_member_missing_from_catalog() {
    let (t, f) = tied("tied.embedding", &["tied.embedding", "tied.output"]);
    expect_invalid(flat(f_topology(), vec![t], vec![f]), "alias group references unknown tensor");
}

#[test]
fn acc_022_every_alias_member_declares_the_group() {
    let (a, fa) = tied("tied.embedding", &["tied.embedding", "tied.output"]);
    let (b, fb) = tied("tied.output", &[]);
    expect_invalid(flat(f_topology(), vec![a, b], vec![fa, fb]), "alias group is not declared consistently");
}

#[test]
fn acc_023_alias_group_must_contain_the_fragment_tensor() {
    let t = f_desc();
    let spec = PlacementFragmentSpec {
        aliases: vec!["unrelated-x".into(), "unrelated-y".into()],
        ..frag_spec(&t, &[0, 0], &[4, 4], tp(0))
    };
    expect_invalid(PlacementFragment::new(spec), "alias");
}

#[test]
fn acc_024_placement_digest_is_cached() {
    // Rust: the digest is computed once at construction; repeated calls return the
    // same stored string (same address), equal to SHA-256 of the canonical JSON.
    let p = f_place();
    let (a, b) = (p.digest(), p.digest());
    assert!(std::ptr::eq(a, b));
    assert_eq!(a, sha256_hex(p.to_json().as_bytes()));
}

#[test]
fn acc_025_placement_may_select_one_dp_replica() {
    let t = t84(&[repl(Dp), own(Pp), split(Tp, 0)]);
    let ranks = [rank(0, 1, 0, 0), rank(0, 1, 0, 1)];
    let fragments = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    let p = flat(topo(2, 4, 1, 2, &ranks), vec![t], fragments).unwrap();
    assert_eq!(p.topology().dp_size(), 2);
    assert_eq!(p.topology().pp_size(), 4);
}

#[test]
fn acc_026_empty_selected_dp_replica_is_rejected() {
    let t = t84(&[repl(Dp)]);
    let ranks = [rank(0, 0, 0, 0), rank(1, 0, 0, 0)];
    expect_invalid(
        flat(topo(2, 1, 1, 1, &ranks), vec![t.clone()], vec![whole(&t, ranks[0])]),
        "replicated-axis participant",
    );
}

#[test]
fn acc_027_parts_must_match_topology_participants() {
    let t = t84(&[split(Tp, 0)]);
    let topology = topo(1, 1, 1, 2, &[tp(0), tp(1)]);
    let part0 = PlacementPart::new(part_spec(&topology, &pid(tp(0)), &[&t], vec![rows(&t, 0, 4, tp(0))])).unwrap();
    expect_invalid(from_parts(topology.clone(), vec![part0.clone()]), "missing topology participant");
    expect_invalid(from_parts(topology, vec![part0.clone(), part0]), "duplicate placement participant");
}

#[test]
fn acc_028_parts_from_another_collection_are_rejected() {
    let t = f_desc();
    let topology = f_topology();
    let base = || part_spec(&topology, "worker-0", &[&t], vec![whole(&t, tp(0))]);
    let cases: Vec<(PlacementPartSpec, &str)> = vec![
        (PlacementPartSpec { resource_id: "other".into(), ..base() }, "resource_id"),
        (PlacementPartSpec { revision: "other".into(), ..base() }, "revision"),
        (PlacementPartSpec { placement_set_id: "other".into(), ..base() }, "placement_set_id"),
        (PlacementPartSpec { weight_generation: 8, ..base() }, "weight_generation"),
        (PlacementPartSpec { topology_id: "sha256:other".into(), ..base() }, "topology_id"),
    ];
    for (spec, field) in cases {
        let part = PlacementPart::new(spec).unwrap();
        expect_invalid(from_parts(topology.clone(), vec![part]), field);
    }
}

/// A TP-2 (8,4) placement `[Split tp 0]` with fragments `fs`.
fn tp2(t: &TensorDescriptor, fs: Vec<PlacementFragment>) -> Result<Placement> {
    flat(topo(1, 1, 1, 2, &[tp(0), tp(1)]), vec![t.clone()], fs)
}

#[test]
fn acc_029_incomplete_tensor_coverage_is_rejected() {
    let t = t84(&[split(Tp, 0)]);
    expect_invalid(tp2(&t, vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 2, tp(1))]), "not fully covered");
}

#[test]
fn acc_030_every_split_axis_participant_is_required() {
    let t = t84(&[split(Tp, 0)]);
    expect_invalid(tp2(&t, vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))]), "split-axis participant");
}

#[test]
fn acc_031_full_shard_on_each_split_rank_is_rejected() {
    let t = t84(&[split(Tp, 0)]);
    expect_invalid(tp2(&t, vec![whole(&t, tp(0)), whole(&t, tp(1))]), "not fully covered");
}

#[test]
fn acc_032_missing_declared_split_rank_is_rejected() {
    let t = t84(&[split(Tp, 0)]);
    let r = flat(topo(1, 1, 1, 2, &[tp(0)]), vec![t.clone()], vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))]);
    expect_invalid(r, "split-axis participant");
}

#[test]
fn acc_033_replicated_axis_needs_a_copy_per_rank() {
    let t = t84(&[repl(Tp)]);
    tp2(&t, vec![whole(&t, tp(0)), whole(&t, tp(1))]).unwrap();
    expect_invalid(tp2(&t, vec![whole(&t, tp(0))]), "replicated-axis participant");
}

#[test]
fn acc_034_replicated_tensor_may_be_segmented() {
    let t = t84(&[repl(Tp)]);
    let p =
        flat(topo(1, 1, 1, 1, &[tp(0)]), vec![t.clone()], vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))]).unwrap();
    assert_eq!(p.fragment_count(), 2);
}

#[test]
fn acc_035_split_tensor_may_be_segmented_on_other_dims() {
    let t = t84(&[split(Tp, 0)]);
    let fs = (0..2)
        .flat_map(|i| {
            let t = &t;
            (0..2).map(move |c| frag(t, &[4 * i, 2 * c], &[4, 2], tp(i)))
        })
        .collect();
    assert_eq!(tp2(&t, fs).unwrap().fragment_count(), 4);
}

#[test]
fn acc_036_each_pp_owner_needs_a_complete_cover() {
    let t = t84(&[own(Pp), split(Tp, 0)]);
    let ranks = grid(1, 2, 1, 2);
    let topology = topo(1, 2, 1, 2, &ranks);
    let all = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    flat(topology.clone(), vec![t.clone()], all).unwrap();
    let split_owners = vec![rows(&t, 0, 4, rank(0, 0, 0, 0)), rows(&t, 4, 4, rank(0, 1, 0, 1))];
    expect_invalid(flat(topology, vec![t], split_owners), "not fully covered");
}

#[test]
fn acc_037_ownership_requires_only_declared_owners() {
    let t = t84(&[own(Pp)]);
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    flat(topo(1, 2, 1, 1, &ranks), vec![t.clone()], vec![whole(&t, ranks[0])]).unwrap();
}

#[test]
fn acc_038_coverage_across_undeclared_axis_is_rejected() {
    let t = t84(&[split(Tp, 0)]);
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    expect_invalid(flat(topo(1, 2, 1, 2, &ranks), vec![t.clone()], fs), "undeclared pp axis");
    let ranks = [rank(0, 0, 0, 0), rank(1, 0, 0, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    expect_invalid(flat(topo(2, 1, 1, 2, &ranks), vec![t], fs), "undeclared dp axis");
}

#[test]
fn acc_039_implicit_pp_owner_is_rejected() {
    let t = t84(&[]);
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 0)];
    expect_invalid(
        flat(topo(1, 2, 1, 1, &ranks), vec![t.clone()], vec![whole(&t, ranks[1])]),
        "active undeclared pp axis",
    );
}

#[test]
fn acc_040_swapped_ep_tp_geometry_is_rejected() {
    let t = tensor("w", &[4, 4], 1, &[split(Ep, 0), split(Tp, 1)]);
    let ranks = grid(1, 1, 2, 2);
    // TP placed on dim 0 and EP on dim 1 (swapped).
    let fs = ranks.iter().map(|&r| frag(&t, &[2 * r.tp, 2 * r.ep], &[2, 2], r)).collect();
    expect_invalid(flat(topo(1, 1, 2, 2, &ranks), vec![t], fs), "split-axis rank geometry");
}

#[test]
fn acc_041_non_cartesian_split_mapping_is_rejected() {
    let t = tensor("w", &[4, 4], 1, &[split(Ep, 0), split(Tp, 1)]);
    let ranks = [rank(0, 0, 0, 0), rank(0, 0, 1, 1)];
    let fs = vec![rows(&t, 0, 2, ranks[0]), rows(&t, 2, 2, ranks[1])];
    expect_invalid(flat(topo(1, 1, 2, 2, &ranks), vec![t], fs), "non-Cartesian split-axis");
}

#[test]
fn acc_042_ep_rank_derived_from_tp_rank_is_accepted() {
    let t = t84(&[split(Tp, 0)]);
    let ranks: Vec<ParallelRank> = (0..4).map(|i| rank(0, 0, i / 2, i)).collect();
    let fs = ranks.iter().map(|&r| rows(&t, 2 * r.tp, 2, r)).collect();
    flat(topo(1, 1, 2, 4, &ranks), vec![t], fs).unwrap();
}

#[test]
fn acc_043_independent_undeclared_ep_rank_is_rejected() {
    let t = t84(&[split(Tp, 0)]);
    let ranks = grid(1, 1, 2, 2);
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    let e = expect_invalid(flat(topo(1, 1, 2, 2, &ranks), vec![t], fs), "undeclared ep axis");
    let m = e.message();
    assert!(m.find("independently").unwrap() < m.find("undeclared ep axis").unwrap(), "{m}");
}

#[test]
fn acc_044_coverage_across_ep_owners_is_rejected() {
    let t = t84(&[own(Ep), split(Tp, 0)]);
    let ranks = grid(1, 1, 2, 2);
    let fs = vec![rows(&t, 0, 4, rank(0, 0, 0, 0)), rows(&t, 4, 4, rank(0, 0, 1, 1))];
    expect_invalid(flat(topo(1, 1, 2, 2, &ranks), vec![t], fs), "not fully covered");
}

#[test]
fn acc_045_empty_placement_is_rejected() {
    expect_invalid(flat(f_topology(), vec![], vec![]), "must contain tensors");
}

#[test]
fn acc_046_split_ranks_collectively_cover_once() {
    let t = t84(&[split(Tp, 0)]);
    assert_eq!(tp2(&t, vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(1))]).unwrap().fragment_count(), 2);
}

#[test]
fn acc_047_store_fixture_cross_owner_coverage_is_rejected() {
    // Expert S tensor: TP shards whose pp and ep equal tp.
    let t = s_tensor();
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 1, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    expect_invalid(flat_with(&s_ids(1), topo(1, 2, 2, 2, &ranks), vec![t], fs), "not fully covered");
    // Dense tensor (expert_id null) with ep = tp.
    let dense =
        TensorDescriptor::new(TensorSpec { tensor_id: "layers.2.mlp.w1".into(), expert_id: None, ..s_tensor_spec() })
            .unwrap();
    let ranks = [rank(0, 0, 0, 0), rank(0, 0, 1, 1)];
    let fs = ranks.iter().map(|&r| rows(&dense, 4 * r.tp, 4, r)).collect();
    expect_invalid(flat_with(&s_ids(1), topo(1, 1, 2, 2, &ranks), vec![dense], fs), "not fully covered");
}

#[test]
fn acc_048_global_manifest_barrier_names_the_tensor() {
    // Two tensors replicated over dp=2; the dp=1 fragment of one is removed.
    let a = tensor("a.weight", &[8], 1, &[repl(Dp)]);
    let b = tensor("b.weight", &[8], 1, &[repl(Dp)]);
    let ranks = [rank(0, 0, 0, 0), rank(1, 0, 0, 0)];
    let fs = vec![whole(&a, ranks[0]), whole(&a, ranks[1]), whole(&b, ranks[0])];
    let e =
        expect_invalid(flat(topo(2, 1, 1, 1, &ranks), vec![a, b], fs), "global placement tensor is not fully covered:");
    assert!(e.message().contains("b.weight"));
    // Dropping one TP shard of a source (TP2) or a target (TP4).
    for n in [2u64, 4] {
        let t = s_tensor();
        let ranks = grid(1, 1, 1, n);
        let shard = 8 / n;
        let fs = ranks.iter().filter(|r| r.tp != 1).map(|&r| rows(&t, r.tp * shard, shard, r)).collect();
        let e = expect_invalid(
            flat_with(&s_ids(1), topo(1, 1, 1, n, &ranks), vec![t], fs),
            "global placement tensor is not fully covered:",
        );
        assert!(e.message().contains(F_TENSOR));
    }
}

#[test]
fn acc_049_tp_coverage_cannot_span_ep_replicas_or_owners() {
    let dense = tensor("layers.0.mlp.w1", &[8], 1, &[repl(Dp), own(Pp), repl(Ep), split(Tp, 0)]);
    // Source TP4 (ep = tp / 2) and target TP2 (ep = tp).
    for (n, ep_of) in [(4u64, 2u64), (2, 1)] {
        let ranks: Vec<ParallelRank> = (0..n).map(|i| rank(0, 0, i / ep_of, i)).collect();
        let shard = 8 / n;
        let fs = ranks.iter().map(|&r| rows(&dense, r.tp * shard, shard, r)).collect();
        let r = flat(topo(1, 1, 2, n, &ranks), vec![dense.clone()], fs);
        expect_invalid(r, "global placement tensor is not fully covered");
    }
    // Expert descriptor (Ownership ep) with ep = tp.
    let t = s_tensor();
    let ranks = [rank(0, 0, 0, 0), rank(0, 0, 1, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    expect_invalid(flat(topo(1, 1, 2, 2, &ranks), vec![t], fs), "global placement tensor is not fully covered");
}

#[test]
fn acc_050_tp_coverage_cannot_span_pp_owners() {
    let t = s_tensor();
    let ranks = [rank(0, 0, 0, 0), rank(0, 1, 0, 1)];
    let fs = ranks.iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    expect_invalid(
        flat_with(&s_ids(1), topo(1, 2, 1, 2, &ranks), vec![t], fs),
        "global placement tensor is not fully covered",
    );
}

// ---------------------------------------------------------------------------
// A.4 Runtime bindings
// ---------------------------------------------------------------------------

#[test]
fn acc_051_runtime_fragment_has_no_owner_and_compares_by_value() {
    // Rust maps the framework `owner` to the caller's own lifetime management:
    // RuntimeFragment has no owner field, never retains one, and two fragments
    // describing the same view are equal whoever owns the memory.
    let owner = Arc::new(vec![0u8; 32]);
    let a = RuntimeFragment::new(f_rt_spec()).unwrap();
    let b = RuntimeFragment::new(f_rt_spec()).unwrap();
    assert_eq!(a, b);
    assert_eq!(Arc::strong_count(&owner), 1);
    let snapshot = RuntimeFragmentSnapshot::new(&PlacementFragment::new(f_fragment_spec()).unwrap(), &a, 7);
    assert!(b.same_as_snapshot(&snapshot));
}

#[test]
fn acc_052_only_typed_contracts_are_accepted() {
    // Duck-typed records cannot be passed to the typed Rust API; the equivalent is a
    // look-alike JSON document, which the strict decoders reject.
    let binding_like = json!({"resource_id": "model", "placement_id": F_PLACEMENT_ID, "fragments": []});
    expect_invalid(decode_placement(&binding_like), "placement manifest schema fields");
    let placement_like = placement_value(&f_place());
    expect_invalid(StoredManifest::from_json(placement_like.to_string().as_bytes()), "weight manifest schema fields");
}

#[test]
fn acc_053_noncanonical_stride_is_rejected() {
    let p = f_place();
    let b = f_bind_with(&p, vec![RuntimeFragmentSpec { strides_bytes: vec![2, 8], ..f_rt_spec() }]).unwrap();
    expect_invalid(validate_runtime_binding(&p, &b), "stride");
}

#[test]
fn acc_054_singleton_strides_are_normalized() {
    let rt = |shape: &[u64], strides: &[u64]| {
        RuntimeFragment::new(RuntimeFragmentSpec {
            local_shape: shape.to_vec(),
            strides_bytes: strides.to_vec(),
            ..f_rt_spec()
        })
        .unwrap()
    };
    assert_eq!(rt(&[1, 4], &[200, 2]).strides_bytes(), &[8, 2]);
    assert_eq!(rt(&[4, 1], &[2, 200]).strides_bytes(), &[2, 2]);
    assert_eq!(rt(&[2, 1, 4], &[8, 0, 2]).strides_bytes(), &[8, 8, 2]);
    assert_eq!(rt(&[1], &[0]).strides_bytes(), &[2]);
    // A binding with a normalized singleton stride validates.
    let t = tensor("w", &[1, 16], 2, &[]);
    let p = flat(f_topology(), vec![t.clone()], vec![whole(&t, tp(0))]).unwrap();
    let pfid = p.fragments().next().unwrap().placement_fragment_id().to_string();
    let spec = RuntimeFragmentSpec {
        strides_bytes: vec![200, 2],
        ..rt_spec(&pfid, "rt", 0x1000, 32, "worker-0", &[1, 16], 2)
    };
    let b = f_bind_with(&p, vec![spec]).unwrap();
    validate_runtime_binding(&p, &b).unwrap();
}

#[test]
fn acc_055_runtime_itemsize_is_not_trusted() {
    let p = f_place();
    let b = f_bind_with(&p, vec![RuntimeFragmentSpec { itemsize: 1, ..f_rt_spec() }]).unwrap();
    expect_invalid(validate_runtime_binding(&p, &b), "itemsize");
}

#[test]
fn acc_056_unsafe_views_are_rejected() {
    // A negative storage_offset_bytes is unrepresentable (u64); an offset that does
    // not place the view is rejected naming the field.
    let spec = RuntimeFragmentSpec { storage_offset_bytes: 8, storage_nbytes: 64, ..f_rt_spec() };
    expect_invalid(RuntimeFragment::new(spec), "storage_offset_bytes");
    expect_invalid(RuntimeFragment::new(RuntimeFragmentSpec { device: String::new(), ..f_rt_spec() }), "device");
    let spec = RuntimeFragmentSpec { storage_address: 0x1000 + 8, ..f_rt_spec() };
    expect_invalid(RuntimeFragment::new(spec), "storage_address plus");
    let spec = RuntimeFragmentSpec {
        address: 0x1010,
        storage_address: 0x1000,
        storage_nbytes: 40,
        storage_offset_bytes: 0x10,
        ..f_rt_spec()
    };
    expect_invalid(RuntimeFragment::new(spec), "storage allocation");
}

#[test]
fn acc_057_binding_requires_content_attestation() {
    let p = f_place();
    let rt = || vec![RuntimeFragment::new(f_rt_spec()).unwrap()];
    let spec = |d: &str| RuntimeBindingSpec {
        placement_digest: d.into(),
        ..binding_spec(&p, "worker-0", "instance", 7, rt())
    };
    expect_invalid(RuntimeBinding::new(spec("")), "placement_digest");
    expect_invalid(RuntimeBinding::new(spec(&"g".repeat(64))), "SHA-256");
    expect_invalid(RuntimeBinding::new(spec(&"a".repeat(63))), "SHA-256");
}

#[test]
fn acc_058_binding_identity_mismatch_is_rejected() {
    let p = f_place();
    let rt = || vec![RuntimeFragment::new(f_rt_spec()).unwrap()];
    let base = || binding_spec(&p, "worker-0", "instance", 7, rt());
    let cases = [
        (RuntimeBindingSpec { resource_id: "other".into(), ..base() }, "resource_id"),
        (RuntimeBindingSpec { revision: "other".into(), ..base() }, "revision"),
        (RuntimeBindingSpec { placement_id: "sha256:other".into(), ..base() }, "placement_id"),
    ];
    for (spec, field) in cases {
        expect_invalid(validate_runtime_binding(&p, &RuntimeBinding::new(spec).unwrap()), field);
    }
}

#[test]
fn acc_059_binding_requires_exact_fragment_set_and_size() {
    let p = f_place();
    expect_invalid(validate_runtime_binding(&p, &f_bind_with(&p, vec![]).unwrap()), "missing placement fragment");
    let unknown = RuntimeFragmentSpec { placement_fragment_id: "placement-9".into(), ..f_rt_spec() };
    expect_invalid(
        validate_runtime_binding(&p, &f_bind_with(&p, vec![unknown]).unwrap()),
        "unknown placement fragment",
    );
    let big = RuntimeFragmentSpec { nbytes: 64, storage_nbytes: 64, ..f_rt_spec() };
    expect_invalid(validate_runtime_binding(&p, &f_bind_with(&p, vec![big]).unwrap()), "byte size");
    let shape = RuntimeFragmentSpec { local_shape: vec![2, 8], strides_bytes: vec![16, 2], ..f_rt_spec() };
    expect_invalid(validate_runtime_binding(&p, &f_bind_with(&p, vec![shape]).unwrap()), "local_shape");
    validate_runtime_binding(&p, &f_bind()).unwrap();
}

#[test]
fn acc_060_duplicate_fragment_ids_in_binding_are_rejected() {
    let p = f_place();
    let second = RuntimeFragmentSpec {
        fragment_id: "runtime-1".into(),
        address: 0x2000,
        storage_address: 0x2000,
        ..f_rt_spec()
    };
    expect_invalid(f_bind_with(&p, vec![f_rt_spec(), second]), "duplicate placement fragment");
    // Two placement fragments (two row boxes) bound with one runtime id.
    let t = tensor("w", &[8, 4], 2, &[]);
    let p = flat(f_topology(), vec![t.clone()], vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))]).unwrap();
    let ids: Vec<String> = p.fragments().map(|f| f.placement_fragment_id().to_string()).collect();
    let specs = vec![
        rt_spec(&ids[0], "runtime-0", 0x1000, 32, "worker-0", &[4, 4], 2),
        rt_spec(&ids[1], "runtime-0", 0x2000, 32, "worker-0", &[4, 4], 2),
    ];
    expect_invalid(f_bind_with(&p, specs), "duplicate runtime fragment_id");
}

/// One participant, two row fragments of a (8,4) bf16 tensor; returns the
/// placement and its two placement fragment ids.
fn two_rows() -> (Placement, Vec<String>) {
    let t = tensor("w", &[8, 4], 2, &[]);
    let p = flat(f_topology(), vec![t.clone()], vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(0))]).unwrap();
    let ids = p.fragments().map(|f| f.placement_fragment_id().to_string()).collect();
    (p, ids)
}

#[test]
fn acc_061_one_rank_may_span_runtime_locations() {
    let (p, ids) = two_rows();
    let b = f_bind_with(
        &p,
        vec![
            rt_spec(&ids[0], "rt-0", 0x1000, 32, "worker-0", &[4, 4], 2),
            rt_spec(&ids[1], "rt-1", 0x1000, 32, "worker-1", &[4, 4], 2),
        ],
    )
    .unwrap();
    validate_runtime_binding(&p, &b).unwrap();
}

/// Two distinct (4,4) bf16 tensors `a`, `b` on one participant.
fn two_tensors() -> (Placement, String, String) {
    let a = tensor("a", &[4, 4], 2, &[]);
    let b = tensor("b", &[4, 4], 2, &[]);
    let p = flat(f_topology(), vec![a.clone(), b.clone()], vec![whole(&a, tp(0)), whole(&b, tp(0))]).unwrap();
    let id = |t: &str| p.fragments().find(|f| f.tensor_id() == t).unwrap().placement_fragment_id().to_string();
    let (ia, ib) = (id("a"), id("b"));
    (p, ia, ib)
}

#[test]
fn acc_062_overlapping_runtime_ranges_are_rejected() {
    let (p, a, b) = two_tensors();
    for addr in [0x1000u64, 0x1010] {
        let mut sb = rt_spec(&b, "rt-b", addr, 32, "worker-0", &[4, 4], 2);
        sb.endpoint = "elsewhere:1".into(); // endpoint is routing only
        let bind = f_bind_with(&p, vec![rt_spec(&a, "rt-a", 0x1000, 32, "worker-0", &[4, 4], 2), sb]).unwrap();
        expect_invalid(validate_runtime_binding(&p, &bind), "address ranges overlap");
    }
}

#[test]
fn acc_063_storage_allocations_must_not_partially_overlap() {
    let (p, a, b) = two_tensors();
    let with_storage = |pf: &str, id: &str, addr: u64, st: u64, size: u64| RuntimeFragmentSpec {
        storage_address: st,
        storage_nbytes: size,
        storage_offset_bytes: addr - st,
        ..rt_spec(pf, id, addr, 32, "worker-0", &[4, 4], 2)
    };
    let bind = f_bind_with(
        &p,
        vec![with_storage(&a, "rt-a", 0x1000, 0x1000, 0x1000), with_storage(&b, "rt-b", 0x1800, 0x1800, 0x1000)],
    )
    .unwrap();
    expect_invalid(validate_runtime_binding(&p, &bind), "storage allocation ranges overlap");
    let bind = f_bind_with(
        &p,
        vec![with_storage(&a, "rt-a", 0x1000, 0x1000, 0x100), with_storage(&b, "rt-b", 0x1080, 0x1000, 0x100)],
    )
    .unwrap();
    validate_runtime_binding(&p, &bind).unwrap();
}

#[test]
fn acc_064_workers_and_devices_separate_address_spaces() {
    let (p, a, b) = two_tensors();
    let other_worker = rt_spec(&b, "rt-b", 0x1000, 32, "worker-1", &[4, 4], 2);
    let other_device =
        RuntimeFragmentSpec { device: "cuda:1".into(), ..rt_spec(&b, "rt-b", 0x1000, 32, "worker-0", &[4, 4], 2) };
    for sb in [other_worker, other_device] {
        let bind = f_bind_with(&p, vec![rt_spec(&a, "rt-a", 0x1000, 32, "worker-0", &[4, 4], 2), sb]).unwrap();
        validate_runtime_binding(&p, &bind).unwrap();
    }
}

#[test]
fn acc_065_only_exact_compatible_aliases_may_share_memory() {
    let group = ["embed.weight", "head.weight"];
    let check = |head: TensorSpec| {
        let embed = TensorDescriptor::new(tensor_spec("embed.weight", &[4, 4], 2, &[])).unwrap();
        let head = TensorDescriptor::new(head).unwrap();
        let mk = |t: &TensorDescriptor| {
            PlacementFragment::new(PlacementFragmentSpec {
                aliases: group.iter().map(|s| s.to_string()).collect(),
                ..frag_spec(t, &[0, 0], &[4, 4], tp(0))
            })
            .unwrap()
        };
        let (fe, fh) = (mk(&embed), mk(&head));
        let p = flat(f_topology(), vec![embed, head], vec![fe.clone(), fh.clone()]).unwrap();
        let b = f_bind_with(
            &p,
            vec![
                rt_spec(fe.placement_fragment_id(), "rt-e", 0x1000, 32, "worker-0", &[4, 4], 2),
                rt_spec(fh.placement_fragment_id(), "rt-h", 0x1000, 32, "worker-0", &[4, 4], 2),
            ],
        )
        .unwrap();
        validate_runtime_binding(&p, &b)
    };
    check(tensor_spec("head.weight", &[4, 4], 2, &[])).unwrap();
    let other_fp = TensorSpec { layout_fingerprint: "fp:other".into(), ..tensor_spec("head.weight", &[4, 4], 2, &[]) };
    expect_invalid(check(other_fp), "address ranges overlap");
    expect_invalid(check(tensor_spec("head.weight", &[4, 4], 2, &[repl(Tp)])), "address ranges overlap");
}

#[test]
fn acc_066_validation_is_pure_and_order_independent() {
    let (p, ids) = two_rows();
    let specs = vec![
        rt_spec(&ids[0], "rt-0", 0x1000, 32, "worker-0", &[4, 4], 2),
        rt_spec(&ids[1], "rt-1", 0x2000, 32, "worker-0", &[4, 4], 2),
    ];
    let forward = f_bind_with(&p, specs.clone()).unwrap();
    let reverse = f_bind_with(&p, specs.into_iter().rev().collect()).unwrap();
    assert_eq!(forward, reverse);
    let (p_before, b_before) = (p.clone(), forward.clone());
    validate_runtime_binding(&p, &forward).unwrap();
    validate_runtime_binding(&p, &reverse).unwrap();
    assert_eq!(p, p_before);
    assert_eq!(forward, b_before);
    assert_eq!(p.to_json(), p_before.to_json());
    // Placement from fragments given in reverse order is the same value.
    let t = tensor("w", &[8, 4], 2, &[]);
    let q = flat(f_topology(), vec![t.clone()], vec![rows(&t, 4, 4, tp(0)), rows(&t, 0, 4, tp(0))]).unwrap();
    assert_eq!(q, p);
}

#[test]
fn acc_067_values_beyond_64_bits_are_rejected() {
    // u64 fields cannot hold >= 2^64 in Rust; such values arrive through JSON.
    let big = || serde_json::from_str::<serde_json::Value>("18446744073709551616").unwrap();
    expect_invalid(edited_f_place(|v| v["weight_generation"] = big()), "64-bit");
    expect_invalid(edited_w5(|v| v["weight_generation"] = big()), "64-bit");
    expect_invalid(edited_w5(|v| v["fragments"][0]["object_offset"] = big()), "64-bit");
    expect_invalid(edited_w5(|v| v["fragments"][0]["nbytes"] = big()), "64-bit");
    // Address ranges that end beyond 2^64 - 1.
    for (addr, n) in [(u64::MAX - 15, 32u64), (u64::MAX - 3, 4)] {
        let spec =
            RuntimeFragmentSpec { address: addr, nbytes: n, storage_address: addr, storage_nbytes: n, ..f_rt_spec() };
        expect_invalid(RuntimeFragment::new(spec), "64-bit");
    }
}

/// Two participants (tp0, tp1) of an (8,4) bf16 TP-split tensor.
fn tp2_bf16() -> Placement {
    let t = tensor("w", &[8, 4], 2, &[split(Tp, 0)]);
    tp2(&t, vec![rows(&t, 0, 4, tp(0)), rows(&t, 4, 4, tp(1))]).unwrap()
}

/// The runtime spec binding `participant`'s only fragment at `address` on `worker`.
fn only(p: &Placement, participant: &str, id: &str, address: u64, worker: &str) -> RuntimeFragment {
    let f = &p.part(participant).unwrap().fragments()[0];
    RuntimeFragment::new(rt_spec(f.placement_fragment_id(), id, address, 32, worker, &[4, 4], 2)).unwrap()
}

fn bind(p: &Placement, participant: &str, instance: &str, f: RuntimeFragment) -> RuntimeBinding {
    RuntimeBinding::new(binding_spec(p, participant, instance, 7, vec![f])).unwrap()
}

#[test]
fn acc_068_bindings_bind_each_part_of_one_placement() {
    let p = tp2_bf16();
    let (a, b) = (pid(tp(0)), pid(tp(1)));
    let ba = bind(&p, &a, "instance", only(&p, &a, "rt-0", 0x1000, "worker-0"));
    let bb = bind(&p, &b, "instance", only(&p, &b, "rt-1", 0x1000, "worker-1"));
    validate_runtime_binding(&p, &ba).unwrap();
    validate_runtime_binding(&p, &bb).unwrap();
    validate_runtime_bindings(&p, &[ba, bb]).unwrap();
}

#[test]
fn acc_069_cross_participant_address_overlap_is_rejected() {
    let p = tp2_bf16();
    let (a, b) = (pid(tp(0)), pid(tp(1)));
    let ba = bind(&p, &a, "instance", only(&p, &a, "rt-0", 0x1000, "worker-0"));
    let bb = bind(&p, &b, "instance", only(&p, &b, "rt-1", 0x1000, "worker-0"));
    validate_runtime_binding(&p, &bb).unwrap();
    expect_invalid(validate_runtime_bindings(&p, &[ba, bb]), "address ranges overlap");
}

#[test]
fn acc_070_binding_set_requires_every_part_exactly_once() {
    let p = tp2_bf16();
    let (a, b) = (pid(tp(0)), pid(tp(1)));
    let ba = bind(&p, &a, "instance", only(&p, &a, "rt-0", 0x1000, "worker-0"));
    let bb = bind(&p, &b, "instance", only(&p, &b, "rt-1", 0x1000, "worker-1"));
    expect_invalid(validate_runtime_bindings(&p, std::slice::from_ref(&ba)), "missing runtime binding participant");
    expect_invalid(
        validate_runtime_bindings(&p, &[ba.clone(), ba.clone(), bb.clone()]),
        "duplicate runtime binding participant",
    );
    let stranger = bind(&p, "worker-9", "instance", only(&p, &b, "rt-9", 0x9000, "worker-9"));
    expect_invalid(validate_runtime_bindings(&p, &[ba, bb, stranger]), "unknown runtime binding participant");
}

#[test]
fn acc_071_empty_participants_need_no_binding() {
    let t = t84(&[own(Pp), split(Tp, 0)]);
    let ranks = [rank(0, 0, 0, 0), rank(0, 0, 0, 1), rank(0, 1, 0, 0)];
    let fs = ranks[..2].iter().map(|&r| rows(&t, 4 * r.tp, 4, r)).collect();
    let p = flat(topo(1, 2, 1, 2, &ranks), vec![t], fs).unwrap();
    assert!(p.part(&pid(ranks[2])).unwrap().fragments().is_empty());
    assert_eq!(Placement::from_json(p.to_json().as_bytes()).unwrap(), p);
    let bindings = bind_all(&p, &|_| 7);
    assert_eq!(bindings.len(), 2);
    validate_runtime_bindings(&p, &bindings).unwrap();
    // A binding for the empty participant with no fragments is valid too.
    let empty = RuntimeBinding::new(binding_spec(&p, &pid(ranks[2]), "instance-x", 7, vec![])).unwrap();
    validate_runtime_binding(&p, &empty).unwrap();
}

#[test]
fn acc_072_binding_can_only_bind_its_own_part() {
    let p = tp2_bf16();
    let (a, b) = (pid(tp(0)), pid(tp(1)));
    let foreign = bind(&p, &a, "instance", only(&p, &b, "rt-0", 0x1000, "worker-0"));
    expect_invalid(validate_runtime_binding(&p, &foreign), "unknown placement fragment");
}

#[test]
fn acc_073_same_runtime_snapshot_compares_all_physical_fields() {
    let base = || RuntimeFragmentSpec { storage_nbytes: 64, ..f_rt_spec() };
    let planned = RuntimeFragmentSnapshot::new(
        &PlacementFragment::new(f_fragment_spec()).unwrap(),
        &RuntimeFragment::new(base()).unwrap(),
        7,
    );
    assert!(RuntimeFragment::new(base()).unwrap().same_as_snapshot(&planned));
    let variants: Vec<(&str, RuntimeFragmentSpec)> = vec![
        ("placement_fragment_id", RuntimeFragmentSpec { placement_fragment_id: "placement-1".into(), ..base() }),
        ("fragment_id", RuntimeFragmentSpec { fragment_id: "runtime-1".into(), ..base() }),
        ("address", RuntimeFragmentSpec { address: 0x1010, storage_offset_bytes: 0x10, ..base() }),
        ("nbytes", RuntimeFragmentSpec { nbytes: 16, ..base() }),
        ("worker_id", RuntimeFragmentSpec { worker_id: "worker-1".into(), ..base() }),
        ("endpoint", RuntimeFragmentSpec { endpoint: "worker-0:1".into(), ..base() }),
        ("device", RuntimeFragmentSpec { device: "cuda:1".into(), ..base() }),
        ("itemsize", RuntimeFragmentSpec { itemsize: 4, ..base() }),
        ("local_shape", RuntimeFragmentSpec { local_shape: vec![8, 2], ..base() }),
        ("strides_bytes", RuntimeFragmentSpec { strides_bytes: vec![16, 2], ..base() }),
        ("storage_address", RuntimeFragmentSpec { storage_address: 0xff0, storage_offset_bytes: 0x10, ..base() }),
        ("storage_nbytes", RuntimeFragmentSpec { storage_nbytes: 128, ..base() }),
        ("storage_offset_bytes", RuntimeFragmentSpec { storage_address: 0xff8, storage_offset_bytes: 8, ..base() }),
    ];
    assert_eq!(variants.len(), 13);
    for (field, spec) in variants {
        let current = RuntimeFragment::new(spec).unwrap();
        assert!(!current.same_as_snapshot(&planned), "{field} difference not detected");
    }
}

// ---------------------------------------------------------------------------
// A.5 Stored manifest model
// ---------------------------------------------------------------------------

/// The (8,4) bf16 tensor `w` used by the manifest tests.
fn w84() -> TensorDescriptor {
    tensor("w", &[8, 4], 2, &[])
}

/// Two 32-byte halves of `w84` as stored fragments `a` and `b`.
fn halves(obj_a: &str, off_a: u64, obj_b: &str, off_b: u64) -> Vec<StoredFragment> {
    vec![stored("a", "w", &[0, 0], &[4, 4], 32, obj_a, off_a), stored("b", "w", &[4, 0], &[4, 4], 32, obj_b, off_b)]
}

#[test]
fn acc_074_manifest_rejects_invalid_fragments() {
    let unknown = vec![stored("a", "other", &[0, 0], &[8, 4], 64, "x", 0)];
    expect_invalid(manifest(vec![w84()], unknown), "unknown tensor_id");
    let oob = vec![stored("a", "w", &[6, 0], &[4, 4], 32, "x", 0)];
    expect_invalid(manifest(vec![w84()], oob), "out of bounds");
    let short = vec![stored("a", "w", &[0, 0], &[4, 4], 31, "x", 0), stored("b", "w", &[4, 0], &[4, 4], 32, "y", 0)];
    expect_invalid(manifest(vec![w84()], short), "byte size mismatch");
}

#[test]
fn acc_075_manifest_rejects_missing_coverage() {
    expect_invalid(manifest(vec![w84()], halves("x", 0, "y", 0)[..1].to_vec()), "not fully covered");
}

#[test]
fn acc_076_manifest_rejects_duplicate_geometry() {
    let fs = vec![stored("a", "w", &[0, 0], &[4, 4], 32, "x", 0), stored("b", "w", &[0, 0], &[4, 4], 32, "y", 0)];
    expect_invalid(manifest(vec![w84()], fs), "duplicate fragment geometry");
}

#[test]
fn acc_077_object_ranges_must_not_overlap() {
    expect_invalid(manifest(vec![w84()], halves("x", 0, "x", 0)), "object ranges overlap");
    expect_invalid(manifest(vec![w84()], halves("x", 0, "x", 16)), "object ranges overlap");
    manifest(vec![w84()], halves("x", 0, "x", 32)).unwrap();
    manifest(vec![w84()], halves("x", 0, "y", 0)).unwrap();
}

#[test]
fn acc_078_runtime_fragments_cannot_cross_into_stored_manifests() {
    // The typed API cannot mix the two fragment types; in JSON a runtime binding
    // fragment in a manifest's fragment list is rejected by the stored schema.
    let rt = json!({
        "placement_fragment_id": "a", "fragment_id": "runtime-0", "address": 4096, "nbytes": 8,
        "worker_id": "worker-0", "endpoint": "worker-0:12345", "device": "cuda:0", "itemsize": 1,
        "local_shape": [8], "strides_bytes": [1], "storage_address": 4096, "storage_nbytes": 8,
        "storage_offset_bytes": 0
    });
    expect_invalid(edited_w5(|v| v["fragments"][0] = rt), "stored fragment schema");
}

#[test]
fn acc_079_manifest_and_payload_keys_belong_to_the_group() {
    let spec = StoredManifestSpec { manifest_key: "h/manifest".into(), ..w5_spec() };
    expect_invalid(StoredManifest::new(spec), "group");
    let outside = StoredFragment::new(StoredFragmentSpec {
        fragment_id: "a".into(),
        tensor_id: "w".into(),
        global_offset: vec![0],
        local_shape: vec![8],
        object_key: "g/other/x".into(),
        object_offset: 0,
        nbytes: 8,
        aliases: vec![],
    })
    .unwrap();
    expect_invalid(StoredManifest::new(StoredManifestSpec { fragments: vec![outside], ..w5_spec() }), "group");
}

#[test]
fn acc_080_committed_manifest_is_a_stored_resource_manifest() {
    // The commit itself is store I/O (section D); the manifest it publishes is the
    // plan's manifest, checked here.
    let p = f_place();
    let plan = plan_upload(&p, &[f_bind()], &UploadOptions::default()).unwrap();
    let m = plan.manifest();
    assert_eq!(m.resource_kind(), "model_weight");
    assert_eq!(m.resource_id(), p.resource_id());
    assert_eq!(m.manifest_key(), format!("{}/manifest", m.group_id()));
    assert_eq!(m.identity().manifest_key, m.manifest_key());
    assert_eq!(m.identity().content_sha256, m.manifest_digest());
}

#[test]
fn acc_081_manifest_survives_any_transport() {
    // Python pickling maps to the JSON wire form (and to moving across threads).
    let m = w5_manifest();
    let back = StoredManifest::from_json(m.to_json().as_bytes()).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.manifest_digest(), m.manifest_digest());
    let moved = std::thread::spawn({
        let m = m.clone();
        move || m
    })
    .join()
    .unwrap();
    assert_eq!(moved, m);
    assert_eq!(moved.manifest_digest(), m.manifest_digest());
}

#[test]
fn a_passed_binding_is_still_checked_against_every_other_placement() {
    // validate_runtime_binding_remembered (the executors' freshness checks) remembers
    // the fragment checks' pass per fragment list and placement part;
    // a binding sharing those fragments must still fail against any placement they
    // do not fit, and its identity fields are checked every time.
    let p = f_place();
    let b = f_bind();
    runtime::validate_runtime_binding_remembered(&p, &b).unwrap();
    runtime::validate_runtime_binding_remembered(&p, &b).unwrap();
    runtime::validate_runtime_binding_remembered(&p, &b.with_lease("rotated", 8).unwrap()).unwrap();
    // Another weight generation: another digest, the same layout: passes on its own.
    let p8 = f_place_gen(8);
    runtime::validate_runtime_binding_remembered(&p8, &b.attesting(&p8)).unwrap();
    // The binding (identity of p) against p8: the identity check fails every time.
    for _ in 0..2 {
        expect_invalid(runtime::validate_runtime_binding_remembered(&p8, &b), "placement_id");
    }
    // A placement whose part holds a bigger fragment under the same ids: the shared
    // fragments do not fit it, however often they passed against `p`.
    let wide = TensorSpec { global_shape: vec![4, 8], ..f_desc_spec() };
    let frag = PlacementFragmentSpec { local_shape: vec![4, 8], nbytes: 64, ..f_fragment_spec() };
    let ids = Ids { weight_generation: 7, ..Ids::default() };
    let p_wide = flat_with(
        &ids,
        f_topology(),
        vec![TensorDescriptor::new(wide).unwrap()],
        vec![PlacementFragment::new(frag).unwrap()],
    )
    .unwrap();
    assert_ne!(p_wide.digest(), p.digest());
    for _ in 0..2 {
        expect_invalid(runtime::validate_runtime_binding_remembered(&p_wide, &b.attesting(&p_wide)), "byte size");
    }
}
