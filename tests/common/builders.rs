//! Builders for the common fixtures of `acceptance.md` (F-desc, F-place, F-bind,
//! S(dp,tp), M) and small helpers shared by the acceptance test files.
//!
//! Declare from a test file with `#[path = "common/builders.rs"] mod builders;`.
#![allow(dead_code)]

use mooncake_weight_store::*;
use serde_json::Value as J;
use std::sync::Arc;

pub use mooncake_weight_store::AxisKind::{Dp, Ep, Pp, Tp};

/// The F-desc tensor id.
pub const F_TENSOR: &str = "layers.2.experts.3.w1";
/// The W1 / F-place placement id.
pub const F_PLACEMENT_ID: &str = "sha256:618f22d9994d8d327a7afd97f3cfcf1f6680a337d71ea3a8162a7827ed0346db";
/// The W1 / F-place digest.
pub const F_DIGEST: &str = "a2ade0db5b17691e6a7c16d589d0498a64359eef91589addc870590899512d98";

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Asserts that `r` failed with `kind` and a message containing `needle`.
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, needle: &str) -> Error {
    match r {
        Ok(v) => panic!("expected an error containing {needle:?}, got Ok({v:?})"),
        Err(e) => {
            assert!(e.message().contains(needle), "error {e} does not contain {needle:?}");
            assert_eq!(e.kind(), kind, "error {e} has the wrong kind");
            e
        }
    }
}

/// [`expect_err`] for contract errors ([`ErrorKind::InvalidArgument`]).
#[track_caller]
pub fn expect_invalid<T: std::fmt::Debug>(r: Result<T>, needle: &str) -> Error {
    expect_err(r, ErrorKind::InvalidArgument, needle)
}

// ---------------------------------------------------------------------------
// Ranks, axes, tensors
// ---------------------------------------------------------------------------

/// `ParallelRank` from `(dp, pp, ep, tp)`.
pub fn rank(dp: u64, pp: u64, ep: u64, tp: u64) -> ParallelRank {
    ParallelRank::new(dp, pp, ep, tp)
}

/// Rank with only a TP coordinate.
pub fn tp(t: u64) -> ParallelRank {
    rank(0, 0, 0, t)
}

/// A validated split axis.
pub fn split(kind: AxisKind, dim: u64) -> ParallelAxis {
    ParallelAxis::split(kind, dim).expect("valid split axis")
}

/// `Replicated(kind)`.
pub fn repl(kind: AxisKind) -> ParallelAxis {
    ParallelAxis::Replicated(kind)
}

/// `Ownership(kind)`.
pub fn own(kind: AxisKind) -> ParallelAxis {
    ParallelAxis::Ownership(kind)
}

/// The split dims of `axes`, sorted (what `shard_dims` must be).
pub fn split_dims(axes: &[ParallelAxis]) -> Vec<u64> {
    let mut d: Vec<u64> = axes
        .iter()
        .filter_map(|a| match a {
            ParallelAxis::Split { dim, .. } => Some(*dim),
            _ => None,
        })
        .collect();
    d.sort_unstable();
    d
}

/// A tensor spec: dtype `uint8`/`bfloat16`/`float32` from `itemsize`, shard_dims
/// from the split axes, fingerprint `fp:test`, no layer/expert.
pub fn tensor_spec(id: &str, shape: &[u64], itemsize: u64, axes: &[ParallelAxis]) -> TensorSpec {
    TensorSpec {
        tensor_id: id.into(),
        global_shape: shape.to_vec(),
        dtype: match itemsize {
            1 => "uint8",
            2 => "bfloat16",
            _ => "float32",
        }
        .into(),
        itemsize,
        shard_dims: split_dims(axes),
        layout_fingerprint: "fp:test".into(),
        parallel_axes: axes.to_vec(),
        layer_id: None,
        expert_id: None,
    }
}

/// A validated tensor built by [`tensor_spec`].
pub fn tensor(id: &str, shape: &[u64], itemsize: u64, axes: &[ParallelAxis]) -> TensorDescriptor {
    TensorDescriptor::new(tensor_spec(id, shape, itemsize, axes)).expect("valid tensor")
}

/// F-desc: `layers.2.experts.3.w1`, (4,4), bfloat16, `Split(tp,0)`, layer 2, expert 3.
pub fn f_desc_spec() -> TensorSpec {
    TensorSpec {
        tensor_id: F_TENSOR.into(),
        global_shape: vec![4, 4],
        dtype: "bfloat16".into(),
        itemsize: 2,
        shard_dims: vec![0],
        layout_fingerprint: "test:qwen:bf16:v1".into(),
        parallel_axes: vec![split(Tp, 0)],
        layer_id: Some(2),
        expert_id: Some(3),
    }
}

/// F-desc as a validated descriptor.
pub fn f_desc() -> TensorDescriptor {
    TensorDescriptor::new(f_desc_spec()).expect("F-desc")
}

// ---------------------------------------------------------------------------
// Fragments, topology, placements
// ---------------------------------------------------------------------------

/// A placement fragment spec with `nbytes` computed from `t` and a derived id.
pub fn frag_spec(t: &TensorDescriptor, offset: &[u64], shape: &[u64], r: ParallelRank) -> PlacementFragmentSpec {
    PlacementFragmentSpec {
        tensor_id: t.tensor_id().into(),
        global_offset: offset.to_vec(),
        local_shape: shape.to_vec(),
        nbytes: shape.iter().product::<u64>() * t.itemsize(),
        rank: r,
        pipeline_stage_id: None,
        aliases: vec![],
        placement_fragment_id: None,
    }
}

/// A validated fragment from [`frag_spec`].
pub fn frag(t: &TensorDescriptor, offset: &[u64], shape: &[u64], r: ParallelRank) -> PlacementFragment {
    PlacementFragment::new(frag_spec(t, offset, shape, r)).expect("valid fragment")
}

/// The whole tensor as one fragment at `r`.
pub fn whole(t: &TensorDescriptor, r: ParallelRank) -> PlacementFragment {
    frag(t, &vec![0; t.ndim()], t.global_shape(), r)
}

/// Rows `[begin, begin+len)` on dimension 0 of `t` at `r`.
pub fn rows(t: &TensorDescriptor, begin: u64, len: u64, r: ParallelRank) -> PlacementFragment {
    let mut offset = vec![0; t.ndim()];
    offset[0] = begin;
    let mut shape = t.global_shape().to_vec();
    shape[0] = len;
    frag(t, &offset, &shape, r)
}

/// Participant id from a rank: `dp<d>-pp<p>-ep<e>-tp<t>`.
pub fn pid(r: ParallelRank) -> String {
    format!("dp{}-pp{}-ep{}-tp{}", r.dp, r.pp, r.ep, r.tp)
}

/// A topology with sizes `(dp, pp, ep, tp)` and one participant per rank (ids from
/// [`pid`]).
pub fn topo(dp: u64, pp: u64, ep: u64, tp: u64, ranks: &[ParallelRank]) -> ParallelTopology {
    try_topo(dp, pp, ep, tp, ranks).expect("valid topology")
}

/// Fallible [`topo`].
pub fn try_topo(dp: u64, pp: u64, ep: u64, tp: u64, ranks: &[ParallelRank]) -> Result<ParallelTopology> {
    ParallelTopology::new(TopologySpec {
        tp_size: tp,
        pp_size: pp,
        ep_size: ep,
        dp_size: dp,
        participants: ranks.iter().map(|&r| TopologyParticipant { participant_id: pid(r), rank: r }).collect(),
        topology_id: None,
    })
}

/// Every rank of a full `(dp, pp, ep, tp)` grid.
pub fn grid(dp: u64, pp: u64, ep: u64, tp: u64) -> Vec<ParallelRank> {
    let mut out = Vec::new();
    for d in 0..dp {
        for p in 0..pp {
            for e in 0..ep {
                for t in 0..tp {
                    out.push(rank(d, p, e, t));
                }
            }
        }
    }
    out
}

/// Scalar identity of a placement (F-place defaults).
#[derive(Clone, Debug)]
pub struct Ids {
    pub resource_id: String,
    pub revision: String,
    pub weight_generation: u64,
    pub placement_set_id: String,
}

impl Default for Ids {
    fn default() -> Self {
        Ids {
            resource_id: "model".into(),
            revision: "revision".into(),
            weight_generation: 7,
            placement_set_id: "placement-set-7".into(),
        }
    }
}

/// `Placement::from_fragments` with F-place identity.
pub fn flat(
    topology: ParallelTopology,
    tensors: Vec<TensorDescriptor>,
    fragments: Vec<PlacementFragment>,
) -> Result<Placement> {
    flat_with(&Ids::default(), topology, tensors, fragments)
}

/// `Placement::from_fragments` with `ids`.
pub fn flat_with(
    ids: &Ids,
    topology: ParallelTopology,
    tensors: Vec<TensorDescriptor>,
    fragments: Vec<PlacementFragment>,
) -> Result<Placement> {
    Placement::from_fragments(FlatPlacementSpec {
        resource_id: ids.resource_id.clone(),
        revision: ids.revision.clone(),
        weight_generation: ids.weight_generation,
        placement_set_id: ids.placement_set_id.clone(),
        topology,
        tensors,
        fragments,
    })
}

/// A part spec with F-place identity for participant `participant_id` of `topology`.
pub fn part_spec(
    topology: &ParallelTopology,
    participant_id: &str,
    tensors: &[&TensorDescriptor],
    fragments: Vec<PlacementFragment>,
) -> PlacementPartSpec {
    let ids = Ids::default();
    let r = topology.participant(participant_id).expect("participant").rank;
    PlacementPartSpec {
        resource_id: ids.resource_id,
        revision: ids.revision,
        placement_set_id: ids.placement_set_id,
        topology_id: topology.topology_id().into(),
        participant_id: participant_id.into(),
        weight_generation: ids.weight_generation,
        rank: r,
        tensors: tensors.iter().map(|t| Arc::new((*t).clone())).collect(),
        fragments,
    }
}

/// `Placement::from_parts` with F-place identity.
pub fn from_parts(topology: ParallelTopology, parts: Vec<PlacementPart>) -> Result<Placement> {
    let ids = Ids::default();
    Placement::from_parts(PlacementSpec {
        resource_id: ids.resource_id,
        revision: ids.revision,
        weight_generation: ids.weight_generation,
        placement_set_id: ids.placement_set_id,
        topology,
        parts,
        placement_id: None,
    })
}

/// The F-place topology: one participant `worker-0` at rank 0, all sizes 1.
pub fn f_topology() -> ParallelTopology {
    ParallelTopology::new(TopologySpec {
        tp_size: 1,
        pp_size: 1,
        ep_size: 1,
        dp_size: 1,
        participants: vec![TopologyParticipant { participant_id: "worker-0".into(), rank: ParallelRank::default() }],
        topology_id: None,
    })
    .expect("F topology")
}

/// The F-place fragment `placement-0`: (0,0)/(4,4), 32 B, rank 0.
pub fn f_fragment_spec() -> PlacementFragmentSpec {
    PlacementFragmentSpec {
        tensor_id: F_TENSOR.into(),
        global_offset: vec![0, 0],
        local_shape: vec![4, 4],
        nbytes: 32,
        rank: ParallelRank::default(),
        pipeline_stage_id: None,
        aliases: vec![],
        placement_fragment_id: Some("placement-0".into()),
    }
}

/// F-place with weight generation `generation`.
pub fn f_place_gen(generation: u64) -> Placement {
    let ids = Ids { weight_generation: generation, ..Ids::default() };
    flat_with(&ids, f_topology(), vec![f_desc()], vec![PlacementFragment::new(f_fragment_spec()).unwrap()])
        .expect("F-place")
}

/// F-place (W1).
pub fn f_place() -> Placement {
    f_place_gen(7)
}

// ---------------------------------------------------------------------------
// Runtime bindings
// ---------------------------------------------------------------------------

/// A runtime fragment spec: endpoint `<worker>:12345`, device `cuda:0`, canonical
/// strides, storage = view.
pub fn rt_spec(
    pfid: &str,
    fid: &str,
    address: u64,
    nbytes: u64,
    worker: &str,
    shape: &[u64],
    itemsize: u64,
) -> RuntimeFragmentSpec {
    RuntimeFragmentSpec {
        placement_fragment_id: pfid.into(),
        fragment_id: fid.into(),
        address,
        nbytes,
        worker_id: worker.into(),
        endpoint: format!("{worker}:12345"),
        device: "cuda:0".into(),
        itemsize,
        local_shape: shape.to_vec(),
        strides_bytes: canonical_strides(shape, itemsize),
        storage_address: address,
        storage_nbytes: nbytes,
        storage_offset_bytes: 0,
        memory: MemoryKind::Host,
    }
}

/// The F-bind runtime fragment `runtime-0` at 0x1000, 32 B, strides (8,2).
pub fn f_rt_spec() -> RuntimeFragmentSpec {
    rt_spec("placement-0", "runtime-0", 0x1000, 32, "worker-0", &[4, 4], 2)
}

/// A binding spec attesting `placement` (instance, lease `lease-<generation>`).
pub fn binding_spec(
    placement: &Placement,
    participant_id: &str,
    instance_id: &str,
    generation: u64,
    fragments: Vec<RuntimeFragment>,
) -> RuntimeBindingSpec {
    RuntimeBindingSpec {
        resource_id: placement.resource_id().into(),
        placement_id: placement.placement_id().into(),
        placement_digest: placement.digest().into(),
        instance_id: instance_id.into(),
        lease_generation: generation,
        lease_id: format!("lease-{generation}"),
        revision: placement.revision().into(),
        participant_id: participant_id.into(),
        fragments,
    }
}

/// F-bind for `placement` (normally F-place) with `fragments`.
pub fn f_bind_with(placement: &Placement, fragments: Vec<RuntimeFragmentSpec>) -> Result<RuntimeBinding> {
    let fragments = fragments.into_iter().map(RuntimeFragment::new).collect::<Result<Vec<_>>>()?;
    RuntimeBinding::new(binding_spec(placement, "worker-0", "instance", 7, fragments))
}

/// F-bind.
pub fn f_bind() -> RuntimeBinding {
    f_bind_with(&f_place(), vec![f_rt_spec()]).expect("F-bind")
}

/// Binds every fragment of `participant_id`'s part: worker `worker-<participant>`,
/// instance `instance-<participant>`, consecutive views from `base`, runtime ids
/// `rt-<participant>-<i>`.
pub fn bind_part(placement: &Placement, participant_id: &str, generation: u64, base: u64) -> RuntimeBinding {
    let part = placement.part(participant_id).expect("participant part");
    let worker = format!("worker-{participant_id}");
    let mut address = base;
    let mut fragments = Vec::new();
    for (i, f) in part.fragments().iter().enumerate() {
        let t = placement.tensor(f.tensor_id()).unwrap();
        let spec = rt_spec(
            f.placement_fragment_id(),
            &format!("rt-{participant_id}-{i}"),
            address,
            f.nbytes(),
            &worker,
            f.local_shape(),
            t.itemsize(),
        );
        address += f.nbytes().max(0x100);
        fragments.push(RuntimeFragment::new(spec).expect("valid runtime fragment"));
    }
    RuntimeBinding::new(binding_spec(
        placement,
        participant_id,
        &format!("instance-{participant_id}"),
        generation,
        fragments,
    ))
    .expect("valid binding")
}

/// Binds every non-empty participant with the lease generation `gen(rank)`.
pub fn bind_all(placement: &Placement, gen: &dyn Fn(ParallelRank) -> u64) -> Vec<RuntimeBinding> {
    placement
        .parts()
        .iter()
        .filter(|p| !p.fragments().is_empty())
        .map(|p| bind_part(placement, p.participant_id(), gen(p.rank()), 0x10_0000))
        .collect()
}

// ---------------------------------------------------------------------------
// S(dp,tp) and M
// ---------------------------------------------------------------------------

/// The S tensor: (8) uint8, `[Replicated(dp), Ownership(pp), Ownership(ep),
/// Split(tp,0)]`, layer 2, expert 3.
pub fn s_tensor() -> TensorDescriptor {
    TensorDescriptor::new(s_tensor_spec()).expect("S tensor")
}

/// The spec of [`s_tensor`].
pub fn s_tensor_spec() -> TensorSpec {
    TensorSpec {
        tensor_id: F_TENSOR.into(),
        global_shape: vec![8],
        dtype: "uint8".into(),
        itemsize: 1,
        shard_dims: vec![0],
        layout_fingerprint: "sglang:qwen3.5:uint8:test".into(),
        parallel_axes: vec![repl(Dp), own(Pp), own(Ep), split(Tp, 0)],
        layer_id: Some(2),
        expert_id: Some(3),
    }
}

/// The S identity: resource `qwen3.5-0.8b`, revision `step-42`.
pub fn s_ids(weight_generation: u64) -> Ids {
    Ids {
        resource_id: "qwen3.5-0.8b".into(),
        revision: "step-42".into(),
        weight_generation,
        placement_set_id: "source".into(),
    }
}

/// The S(dp,tp) placement with weight generation `weight_generation`.
pub fn s_placement(dp: u64, tpn: u64, weight_generation: u64) -> Placement {
    let t = s_tensor();
    let ranks = grid(dp, 1, 1, tpn);
    let shard = 8 / tpn;
    let fragments = ranks.iter().map(|&r| rows(&t, r.tp * shard, shard, r)).collect();
    flat_with(&s_ids(weight_generation), topo(dp, 1, 1, tpn, &ranks), vec![t], fragments).expect("S placement")
}

/// S(dp,tp) with weight generation 1 and bindings whose lease generation is
/// `gen(rank)`.
pub fn s_source(dp: u64, tpn: u64, gen: &dyn Fn(ParallelRank) -> u64) -> (Placement, Vec<RuntimeBinding>) {
    let p = s_placement(dp, tpn, 1);
    let b = bind_all(&p, gen);
    (p, b)
}

/// The M tensor: `layers.0.experts.w1` (4,6,8) uint8, `Split(ep,0)`.
pub fn m_tensor() -> TensorDescriptor {
    tensor("layers.0.experts.w1", &[4, 6, 8], 1, &[split(Ep, 0)])
}

/// M source: EP split dim 0 over 4 ranks, one (1,6,8) box per rank, all bound.
pub fn m_source() -> (Placement, Vec<RuntimeBinding>) {
    let t = m_tensor();
    let ranks: Vec<ParallelRank> = (0..4).map(|e| rank(0, 0, e, 0)).collect();
    let fragments = ranks.iter().map(|&r| rows(&t, r.ep, 1, r)).collect();
    let p = flat(topo(1, 1, 4, 1, &ranks), vec![t], fragments).expect("M source");
    let b = bind_all(&p, &|_| 1);
    (p, b)
}

/// Upload options with a fixed transaction id and clock.
pub fn fixed_options(namespace: &str, key_prefix: &str, transaction_id: &str, created_at: &str) -> UploadOptions {
    UploadOptions {
        namespace: namespace.into(),
        key_prefix: key_prefix.into(),
        transaction_id: Some(transaction_id.into()),
        created_at: Some(created_at.into()),
    }
}

// ---------------------------------------------------------------------------
// JSON routes
// ---------------------------------------------------------------------------

/// The placement JSON as a `serde_json` value.
pub fn placement_value(p: &Placement) -> J {
    serde_json::from_str(&p.to_json()).expect("placement JSON")
}

/// Decodes a placement from a `serde_json` value.
pub fn decode_placement(v: &J) -> Result<Placement> {
    Placement::from_json(serde_json::to_string(v).unwrap().as_bytes())
}

/// Decodes F-place JSON after `edit`.
pub fn edited_f_place(edit: impl FnOnce(&mut J)) -> Result<Placement> {
    let mut v = placement_value(&f_place());
    edit(&mut v);
    decode_placement(&v)
}

/// The W5 hand-built manifest spec.
pub fn w5_spec() -> StoredManifestSpec {
    StoredManifestSpec {
        namespace: "n".into(),
        resource_id: "r".into(),
        revision: "v".into(),
        weight_generation: 1,
        group_id: "g".into(),
        manifest_key: "g/manifest".into(),
        tensors: vec![Arc::new(
            TensorDescriptor::new(TensorSpec {
                tensor_id: "w".into(),
                global_shape: vec![8],
                dtype: "uint8".into(),
                itemsize: 1,
                shard_dims: vec![],
                layout_fingerprint: "f".into(),
                parallel_axes: vec![],
                layer_id: None,
                expert_id: None,
            })
            .unwrap(),
        )],
        fragments: vec![StoredFragment::new(StoredFragmentSpec {
            fragment_id: "a".into(),
            tensor_id: "w".into(),
            global_offset: vec![0],
            local_shape: vec![8],
            object_key: "g/payload/x".into(),
            object_offset: 0,
            nbytes: 8,
            aliases: vec![],
        })
        .unwrap()],
        created_at: "c".into(),
    }
}

/// The W5 manifest.
pub fn w5_manifest() -> StoredManifest {
    StoredManifest::new(w5_spec()).expect("W5")
}

/// Decodes the W5 manifest JSON after `edit`.
pub fn edited_w5(edit: impl FnOnce(&mut J)) -> Result<StoredManifest> {
    let mut v: J = serde_json::from_str(&w5_manifest().to_json()).unwrap();
    edit(&mut v);
    StoredManifest::from_json(serde_json::to_string(&v).unwrap().as_bytes())
}

/// A stored fragment spec in group `g`: object `g/payload/<object>`.
pub fn stored(
    id: &str,
    tensor_id: &str,
    offset: &[u64],
    shape: &[u64],
    nbytes: u64,
    object: &str,
    object_offset: u64,
) -> StoredFragment {
    try_stored(id, tensor_id, offset, shape, nbytes, object, object_offset).expect("valid stored fragment")
}

/// Fallible [`stored`].
pub fn try_stored(
    id: &str,
    tensor_id: &str,
    offset: &[u64],
    shape: &[u64],
    nbytes: u64,
    object: &str,
    object_offset: u64,
) -> Result<StoredFragment> {
    StoredFragment::new(StoredFragmentSpec {
        fragment_id: id.into(),
        tensor_id: tensor_id.into(),
        global_offset: offset.to_vec(),
        local_shape: shape.to_vec(),
        object_key: format!("g/payload/{object}"),
        object_offset,
        nbytes,
        aliases: vec![],
    })
}

/// A manifest in group `g` with `tensors` and `fragments`.
pub fn manifest(tensors: Vec<TensorDescriptor>, fragments: Vec<StoredFragment>) -> Result<StoredManifest> {
    StoredManifest::new(StoredManifestSpec {
        tensors: tensors.into_iter().map(Arc::new).collect(),
        fragments,
        ..w5_spec()
    })
}
