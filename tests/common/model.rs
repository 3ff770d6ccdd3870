//! A small synthetic transformer in any TP/PP/EP/DP layout, bound to host buffers
//! with deterministic contents (test helper, shared by integration tests).
#![allow(dead_code)]

use mooncake_weight_store::protocol::{
    GuardProvider, SnapshotAdapter, SnapshotDescriptor, SnapshotSource, StaticGuard,
};
use mooncake_weight_store::*;
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub tp: u64,
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
}

#[derive(Clone, Debug)]
pub struct TensorDef {
    pub id: String,
    pub shape: Vec<u64>,
    /// TP split dimension, or None for TP-replicated.
    pub tp_split: Option<u64>,
    /// Expert ownership: (expert id, experts).
    pub expert: Option<(u64, u64)>,
    /// PP owner as (layer, layers) or None for "first stage".
    pub layer: Option<(u64, u64)>,
    pub itemsize: u64,
}

/// `layers` layers (attention + dense or MoE MLP) with dims divisible by 8.
pub fn model_tensors(layers: u64, hidden: u64, experts: u64) -> Vec<TensorDef> {
    let mut v = vec![TensorDef {
        id: "model.embed_tokens.weight".into(),
        shape: vec![4 * hidden, hidden],
        tp_split: Some(0),
        expert: None,
        layer: None,
        itemsize: 2,
    }];
    for l in 0..layers {
        let t = |name: &str, shape: Vec<u64>, tp: Option<u64>| TensorDef {
            id: format!("model.layers.{l}.{name}"),
            shape,
            tp_split: tp,
            expert: None,
            layer: Some((l, layers)),
            itemsize: 2,
        };
        v.push(t("input_layernorm.weight", vec![hidden], None));
        v.push(t("self_attn.qkv_proj.weight", vec![3 * hidden, hidden], Some(0)));
        v.push(t("self_attn.o_proj.weight", vec![hidden, hidden], Some(1)));
        if experts == 0 {
            v.push(t("mlp.up_proj.weight", vec![2 * hidden, hidden], Some(0)));
            v.push(t("mlp.down_proj.weight", vec![hidden, 2 * hidden], Some(1)));
        } else {
            for e in 0..experts {
                let mut g = t(&format!("mlp.experts.{e}.gate_up_proj.weight"), vec![hidden, hidden], Some(0));
                g.expert = Some((e, experts));
                v.push(g);
                let mut d = t(&format!("mlp.experts.{e}.down_proj.weight"), vec![hidden, hidden / 2], Some(1));
                d.expert = Some((e, experts));
                v.push(d);
            }
        }
    }
    v
}

fn pid(dp: u64, pp: u64, ep: u64, tp: u64) -> String {
    format!("w-d{dp}-p{pp}-e{ep}-t{tp}")
}

pub fn build_placement(set: &str, layout: Layout, defs: &[TensorDef], generation: u64) -> Placement {
    let mut participants = Vec::new();
    for dp in 0..layout.dp {
        for pp in 0..layout.pp {
            for ep in 0..layout.ep {
                for tp in 0..layout.tp {
                    participants.push(TopologyParticipant {
                        participant_id: pid(dp, pp, ep, tp),
                        rank: ParallelRank::new(dp, pp, ep, tp),
                    });
                }
            }
        }
    }
    let topology = ParallelTopology::new(TopologySpec {
        tp_size: layout.tp,
        pp_size: layout.pp,
        ep_size: layout.ep,
        dp_size: layout.dp,
        participants: participants.clone(),
        topology_id: None,
    })
    .unwrap();
    let mut tensors = Vec::new();
    let mut fragments = Vec::new();
    for d in defs {
        let ep_axis = if d.expert.is_some() {
            ParallelAxis::Ownership(AxisKind::Ep)
        } else {
            ParallelAxis::Replicated(AxisKind::Ep)
        };
        let tp_axis = match d.tp_split {
            Some(dim) => ParallelAxis::split(AxisKind::Tp, dim).unwrap(),
            None => ParallelAxis::Replicated(AxisKind::Tp),
        };
        tensors.push(
            TensorDescriptor::new(TensorSpec {
                tensor_id: d.id.clone(),
                global_shape: d.shape.clone(),
                dtype: "bfloat16".into(),
                itemsize: d.itemsize,
                shard_dims: d.tp_split.into_iter().collect(),
                layout_fingerprint: "test:row-major:v1".into(),
                parallel_axes: vec![
                    ParallelAxis::Replicated(AxisKind::Dp),
                    ParallelAxis::Ownership(AxisKind::Pp),
                    ep_axis,
                    tp_axis,
                ],
                layer_id: d.layer.map(|l| l.0),
                expert_id: d.expert.map(|e| e.0),
            })
            .unwrap(),
        );
        let pp_owner = d.layer.map(|(l, n)| l * layout.pp / n).unwrap_or(0);
        for p in &participants {
            let r = p.rank;
            if r.pp != pp_owner {
                continue;
            }
            if let Some((e, n)) = d.expert {
                assert!(n % layout.ep == 0, "experts must divide by ep");
                if r.ep != e / (n / layout.ep) {
                    continue;
                }
            }
            let mut offset = vec![0; d.shape.len()];
            let mut shape = d.shape.clone();
            if let Some(dim) = d.tp_split {
                let dim = dim as usize;
                shape[dim] /= layout.tp;
                offset[dim] = r.tp * shape[dim];
            }
            let nbytes = shape.iter().product::<u64>() * d.itemsize;
            fragments.push(
                PlacementFragment::new(PlacementFragmentSpec {
                    tensor_id: d.id.clone(),
                    global_offset: offset,
                    local_shape: shape,
                    nbytes,
                    rank: r,
                    pipeline_stage_id: None,
                    aliases: vec![],
                    placement_fragment_id: None,
                })
                .unwrap(),
            );
        }
    }
    Placement::from_fragments(FlatPlacementSpec {
        resource_id: "test-model".into(),
        revision: "rev-1".into(),
        weight_generation: generation,
        placement_set_id: set.into(),
        topology,
        tensors,
        fragments,
    })
    .unwrap()
}

/// The deterministic content of a box of a tensor.
pub fn expected_bytes(tensor: &TensorDescriptor, offset: &[u64], shape: &[u64]) -> Vec<u8> {
    let seed =
        tensor.tensor_id().bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let n = shape.len();
    let gs = tensor.global_shape();
    let item = tensor.itemsize();
    let count: u64 = shape.iter().product();
    let mut out = Vec::with_capacity((count * item) as usize);
    let mut idx = vec![0u64; n];
    for _ in 0..count {
        let mut linear = 0u64;
        for d in 0..n {
            linear = linear * gs[d] + offset[d] + idx[d];
        }
        for b in 0..item {
            let x = (seed ^ (linear * item + b)).wrapping_mul(0x9E3779B97F4A7C15);
            out.push((x >> 56) as u8);
        }
        for d in (0..n).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// A placement bound to host buffers: one flat allocation per participant.
pub struct HostModel {
    pub placement: Arc<Placement>,
    pub bindings: Vec<RuntimeBinding>,
    pub buffers: Vec<Vec<u8>>,
    /// (participant index, placement fragment id, offset in the buffer, nbytes)
    pub views: Vec<(usize, String, usize, usize)>,
}

impl HostModel {
    pub fn new(placement: Placement, fill: bool, instance: &str, generation: u64) -> HostModel {
        let placement = Arc::new(placement);
        let mut buffers = Vec::new();
        let mut views = Vec::new();
        for (pi, part) in placement.parts().iter().enumerate() {
            let mut size = 0usize;
            for f in part.fragments() {
                views.push((pi, f.placement_fragment_id().to_string(), size, f.nbytes() as usize));
                size += (f.nbytes() as usize).div_ceil(64) * 64;
            }
            let mut buf = vec![0xA5u8; size.max(64)];
            if fill {
                for v in views.iter().filter(|v| v.0 == pi) {
                    let f = part.fragment(&v.1).unwrap();
                    let t = placement.tensor(f.tensor_id()).unwrap();
                    buf[v.2..v.2 + v.3].copy_from_slice(&expected_bytes(t, f.global_offset(), f.local_shape()));
                }
            }
            buffers.push(buf);
        }
        let mut m = HostModel { placement, bindings: Vec::new(), buffers, views };
        m.bindings = m.make_bindings(instance, generation);
        m
    }

    pub fn make_bindings(&self, instance: &str, generation: u64) -> Vec<RuntimeBinding> {
        let mut out = Vec::new();
        for (pi, part) in self.placement.parts().iter().enumerate() {
            if part.fragments().is_empty() {
                continue;
            }
            let base = self.buffers[pi].as_ptr() as u64;
            let total = self.buffers[pi].len() as u64;
            let mut frags = Vec::new();
            for (i, v) in self.views.iter().filter(|v| v.0 == pi).enumerate() {
                let f = part.fragment(&v.1).unwrap();
                let t = self.placement.tensor(f.tensor_id()).unwrap();
                frags.push(
                    RuntimeFragment::new(RuntimeFragmentSpec {
                        placement_fragment_id: v.1.clone(),
                        fragment_id: format!("{}:rt{i}", part.participant_id()),
                        address: base + v.2 as u64,
                        nbytes: v.3 as u64,
                        worker_id: part.participant_id().into(),
                        endpoint: format!("{}:17000", part.participant_id()),
                        device: "cpu".into(),
                        itemsize: t.itemsize(),
                        local_shape: f.local_shape().to_vec(),
                        strides_bytes: model::canonical_strides(f.local_shape(), t.itemsize()),
                        storage_address: base,
                        storage_nbytes: total,
                        storage_offset_bytes: v.2 as u64,
                        memory: MemoryKind::Host,
                    })
                    .unwrap(),
                );
            }
            out.push(
                RuntimeBinding::new(RuntimeBindingSpec {
                    resource_id: self.placement.resource_id().into(),
                    placement_id: self.placement.placement_id().into(),
                    placement_digest: self.placement.digest().into(),
                    instance_id: instance.into(),
                    lease_generation: generation,
                    lease_id: format!("{instance}-lease-{generation}"),
                    revision: self.placement.revision().into(),
                    participant_id: part.participant_id().into(),
                    fragments: frags,
                })
                .unwrap(),
            );
        }
        out
    }

    /// Checks every target fragment holds its box's expected bytes.
    pub fn verify(&self) -> Result<usize> {
        let mut checked = 0;
        for v in &self.views {
            let part = &self.placement.parts()[v.0];
            let f = part.fragment(&v.1).unwrap();
            let t = self.placement.tensor(f.tensor_id()).unwrap();
            if self.buffers[v.0][v.2..v.2 + v.3] != expected_bytes(t, f.global_offset(), f.local_shape())[..] {
                return Err(Error::new(
                    ErrorKind::Integrity,
                    format!("target bytes differ: {} {}", part.participant_id(), f.tensor_id()),
                ));
            }
            checked += v.3;
        }
        Ok(checked)
    }

    /// Snapshots the model with the writer: each (tensor, participant) of the plan
    /// is written once; the writer uploads participants as they complete.
    pub fn snapshot_into(&self, ws: &mooncake_weight_store::protocol::WeightStore) -> Result<StoredManifest> {
        ws.snapshot(&self.descriptor("default"), HostAdapter(self), |w| {
            let mut seen = std::collections::BTreeSet::new();
            let ops: Vec<(String, String)> = w
                .plan()
                .operations()
                .iter()
                .map(|o| (o.source_placement().tensor_id().to_string(), o.source_participant_id().to_string()))
                .collect();
            for (tensor, participant) in ops {
                if seen.insert((tensor.clone(), participant.clone())) {
                    w.write_tensor(&tensor, &participant)?;
                }
            }
            Ok(())
        })
    }

    pub fn descriptor(&self, namespace: &str) -> SnapshotDescriptor {
        SnapshotDescriptor {
            resource_id: self.placement.resource_id().into(),
            revision: self.placement.revision().into(),
            weight_generation: self.placement.weight_generation(),
            namespace: namespace.into(),
        }
    }
}

/// A snapshot adapter over a [`HostModel`]: the framework "tensor" is the
/// participant id that writes it.
pub struct HostAdapter<'a>(pub &'a HostModel);

// SAFETY: the type's callbacks and pointers are only used under the test's own synchronization.
unsafe impl SnapshotAdapter for HostAdapter<'_> {
    type Tensor = str;
    fn export_source(&self, _d: &SnapshotDescriptor) -> Result<SnapshotSource> {
        Ok(SnapshotSource { placement: self.0.placement.clone(), bindings: self.0.bindings.clone() })
    }
    fn resolve_fragment_ids(&self, tensor_id: &str, participant: &str, source: &SnapshotSource) -> Result<Vec<String>> {
        let part = source.placement.part(participant).ok_or_else(|| Error::invalid("unknown participant"))?;
        Ok(part
            .fragments()
            .iter()
            .filter(|f| f.tensor_id() == tensor_id)
            .map(|f| f.placement_fragment_id().to_string())
            .collect())
    }
    fn source_allocation_guards(&self, _b: &RuntimeBinding) -> Result<Arc<dyn GuardProvider>> {
        Ok(Arc::new(StaticGuard))
    }
}

/// A trainer (`src` layout, filled) and a server (`dst` layout, zeroed) of the model
/// `defs`, host buffers, and the transfer plan between them bound to both.
pub fn trainer_server_plan(
    defs: &[TensorDef],
    src: Layout,
    dst: Layout,
) -> (HostModel, HostModel, mooncake_weight_store::plan::transfer_bind::TransferPlan) {
    use mooncake_weight_store::plan::load::PlanningLimits;
    use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
    use mooncake_weight_store::plan::transfer_bind::TransferPlan;
    let src = HostModel::new(build_placement("trainer", src, defs, 1), true, "trainer", 1);
    let dst = HostModel::new(build_placement("serving", dst, defs, 1), false, "serving", 1);
    let logical =
        LogicalTransferPlan::plan(src.placement.clone(), dst.placement.clone(), PlanningLimits::default()).unwrap();
    let plan = TransferPlan::bind(&logical, &dst.bindings, &src.bindings).unwrap();
    (src, dst, plan)
}
