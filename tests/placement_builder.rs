//! `model::PlacementBuilder` (the C, C++ and Python placement builders are fronts for
//! it): every successful placement fixture, rebuilt call by call from its parts,
//! gives the reference's canonical JSON, ids and digest byte for byte; bad input is
//! refused with a precise message.

mod common;

use mooncake_weight_store::*;
use serde_json::Value as J;

fn rebuild(p: &Placement, derive_ids: bool) -> Result<(Placement, Vec<String>)> {
    let t = p.topology();
    let mut b = PlacementBuilder::new(PlacementBuilderSpec {
        resource_id: p.resource_id().into(),
        revision: p.revision().into(),
        weight_generation: p.weight_generation(),
        placement_set_id: p.placement_set_id().into(),
        tp_size: t.tp_size(),
        pp_size: t.pp_size(),
        ep_size: t.ep_size(),
        dp_size: t.dp_size(),
    });
    // Reverse order: the builder's result must not depend on call order.
    for part in t.participants().iter().rev() {
        b.add_participant(&part.participant_id, part.rank)?;
    }
    for d in p.tensors().iter().rev() {
        b.add_tensor(TensorSpec {
            tensor_id: d.tensor_id().into(),
            global_shape: d.global_shape().to_vec(),
            dtype: d.dtype().into(),
            itemsize: d.itemsize(),
            shard_dims: Vec::new(), // derived from the split axes
            layout_fingerprint: d.layout_fingerprint().into(),
            parallel_axes: d.parallel_axes().to_vec(),
            layer_id: d.layer_id(),
            expert_id: d.expert_id(),
        })?;
    }
    let mut ids = Vec::new();
    for part in p.parts() {
        for f in part.fragments() {
            let id = b.add_fragment(BuilderFragment {
                participant_id: part.participant_id().into(),
                tensor_id: f.tensor_id().into(),
                global_offset: f.global_offset().to_vec(),
                local_shape: f.local_shape().to_vec(),
                pipeline_stage_id: f.pipeline_stage_id(),
                aliases: f.aliases().to_vec(),
                placement_fragment_id: if derive_ids { None } else { Some(f.placement_fragment_id().into()) },
            })?;
            ids.push(id.to_string());
        }
    }
    Ok((b.build()?, ids))
}

#[test]
fn every_placement_fixture_rebuilds_byte_for_byte() {
    let mut n = 0;
    for entry in std::fs::read_dir(common::conformance_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.contains("-placement-") || name.contains("-reject-") {
            continue;
        }
        let fx: J = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let exp = &fx["expected"];
        let original = Placement::from_json_str(exp["canonical_json"].as_str().unwrap()).unwrap();
        let (built, _) = rebuild(&original, false).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(built.to_json(), exp["canonical_json"].as_str().unwrap(), "{name}");
        assert_eq!(built.placement_id(), exp["placement_id"].as_str().unwrap(), "{name}");
        assert_eq!(built.digest(), exp["digest"].as_str().unwrap(), "{name}");
        assert_eq!(built.topology().topology_id(), exp["topology_id"].as_str().unwrap(), "{name}");
        // Derived ids are the canonical ones the fixture lists (original id -> canonical).
        let (_, derived) = rebuild(&original, true).unwrap();
        let map = exp["canonical_fragment_ids"].as_object().unwrap();
        let originals = original.parts().iter().flat_map(|p| p.fragments().iter().map(|f| f.placement_fragment_id()));
        for (orig, d) in originals.zip(&derived) {
            assert_eq!(map[orig].as_str().unwrap(), d, "{name}: derived id of {orig}");
        }
        assert_eq!(derived.len(), map.len(), "{name}");
        n += 1;
    }
    assert!(n >= 7, "only {n} placement fixtures found");
}

fn small() -> PlacementBuilder {
    let mut b = PlacementBuilder::new(PlacementBuilderSpec {
        resource_id: "m".into(),
        revision: "r".into(),
        weight_generation: 1,
        placement_set_id: "s".into(),
        tp_size: 2,
        pp_size: 1,
        ep_size: 1,
        dp_size: 1,
    });
    b.add_participant("a", ParallelRank::new(0, 0, 0, 0)).unwrap();
    b.add_participant("b", ParallelRank::new(0, 0, 0, 1)).unwrap();
    b.add_tensor(TensorSpec {
        tensor_id: "w".into(),
        global_shape: vec![4, 2],
        dtype: "bfloat16".into(),
        itemsize: 2,
        layout_fingerprint: "t:v1".into(),
        parallel_axes: vec![ParallelAxis::split(AxisKind::Tp, 0).unwrap()],
        ..Default::default()
    })
    .unwrap();
    b
}

fn frag(p: &str, off: u64) -> BuilderFragment {
    BuilderFragment {
        participant_id: p.into(),
        tensor_id: "w".into(),
        global_offset: vec![off, 0],
        local_shape: vec![2, 2],
        ..Default::default()
    }
}

#[test]
fn bad_calls_are_refused_precisely() {
    let mut b = small();
    assert!(b
        .add_participant("a", ParallelRank::new(0, 0, 0, 1))
        .unwrap_err()
        .message()
        .contains("duplicate participant: a"));
    assert!(b.add_fragment(frag("zz", 0)).unwrap_err().message().contains("unknown participant: zz"));
    let mut f = frag("a", 0);
    f.tensor_id = "nope".into();
    assert!(b.add_fragment(f).unwrap_err().message().contains("unknown tensor_id: nope"));
    b.add_fragment(frag("a", 0)).unwrap();
    // Coverage is checked at build: participant b's half is missing.
    let e = b.build().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let id = b.add_fragment(frag("b", 2)).unwrap().to_string();
    assert!(id.starts_with("sha256:"), "{id}");
    let p = b.build().unwrap();
    assert_eq!(p.fragment_count(), 2);
    // Built twice: the same placement.
    assert_eq!(b.build().unwrap().placement_id(), p.placement_id());
    // The JSON round-trips through the strict decoder with the same identity.
    assert_eq!(Placement::from_json_str(&p.to_json()).unwrap().digest(), p.digest());
}
