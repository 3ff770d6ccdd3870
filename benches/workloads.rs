//! Synthetic transformer workloads of `shared/bench/workloads.json` (see
//! `shared/bench/README.md`, "Exact workload definition"), generated from the
//! file's rules: tensors, topology, placement fragments, runtime bindings and the
//! fixed upload options.
//!
//! Shared by the benchmarks: include it with
//! `#[path = "workloads.rs"] mod workloads;`. (Cargo also auto-discovers this file
//! as a bench target of its own; it then builds as an empty libtest bench.)
#![allow(dead_code)]

use mooncake_weight_store::{
    canonical_strides, AxisKind, FlatPlacementSpec, MemoryKind, ParallelAxis, ParallelRank, ParallelTopology,
    Placement, PlacementFragment, PlacementFragmentSpec, RuntimeBinding, RuntimeBindingSpec, RuntimeFragment,
    RuntimeFragmentSpec, TensorDescriptor, TensorSpec, TopologyParticipant, TopologySpec, UploadOptions,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Fixed upload identity of the README ("Upload and load").
pub const NAMESPACE: &str = "default";
pub const KEY_PREFIX: &str = "weights";
pub const TRANSACTION_ID: &str = "00000000000000000000000062656e63";
pub const CREATED_AT: &str = "2025-01-01T00:00:00Z";

/// Base runtime address of participant 0; each participant gets its own 4 GiB window.
pub const BINDING_BASE: u64 = 0x10_0000_0000;
pub const BINDING_PART_STRIDE: u64 = 0x1_0000_0000;
pub const BINDING_ALIGN: u64 = 256;

type R<T> = Result<T, String>;

/// `$MWS_BENCH_WORKLOADS`, else the vendored `<CARGO_MANIFEST_DIR>/benches/data/workloads.json`.
pub fn default_path() -> PathBuf {
    match std::env::var_os("MWS_BENCH_WORKLOADS") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data/workloads.json"),
    }
}

/// Parallel sizes of one side (source or target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub tp: u64,
    pub pp: u64,
    pub ep: u64,
    pub dp: u64,
}

/// TP rule of a tensor rule: `replicated` or `split:<dim>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpRule {
    Replicated,
    Split(u64),
}

/// Placement of a global tensor on PP: `first` (0) or `last` (pp-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PpOwner {
    First,
    Last,
    /// Per-layer: `floor(l * pp / layers)`.
    Layer,
}

/// One tensor rule of `tensor_rules` (templated by `{l}` / `{e}`).
#[derive(Clone, Debug)]
pub struct TensorRule {
    pub id: String,
    /// Factors per dimension, e.g. `3*hidden` → `[Num(3), Var("hidden")]`.
    pub shape: Vec<String>,
    pub tp: TpRule,
    /// EP ownership (per-expert tensors) vs replicated.
    pub ep_ownership: bool,
    pub pp_owner: PpOwner,
    /// `expert_id` is `{e}`.
    pub per_expert: bool,
}

/// The common tensor rules.
#[derive(Clone, Debug)]
pub struct Rules {
    pub dtype: String,
    pub itemsize: u64,
    pub layout_fingerprint: String,
    pub head_dim: u64,
    pub globals: Vec<TensorRule>,
    pub per_layer_common: Vec<TensorRule>,
    pub dense_mlp: Vec<TensorRule>,
    pub moe_mlp: Vec<TensorRule>,
}

/// One workload with its expectations.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    /// Numeric parameters usable in shape expressions (`layers`, `hidden`, ...).
    pub params: BTreeMap<String, u64>,
    pub layers: u64,
    pub experts: u64,
    pub source: Sizes,
    pub target: Sizes,
    pub expected_counts: BTreeMap<String, u64>,
    pub expected_ids: BTreeMap<String, String>,
}

/// Parsed `workloads.json`.
#[derive(Clone, Debug)]
pub struct WorkloadFile {
    pub rules: Rules,
    pub workloads: Vec<Workload>,
}

fn get<'a>(v: &'a Value, key: &str) -> R<&'a Value> {
    v.get(key).ok_or_else(|| format!("workloads.json: missing field {key:?}"))
}
fn get_u64(v: &Value, key: &str) -> R<u64> {
    get(v, key)?.as_u64().ok_or_else(|| format!("workloads.json: {key:?} is not an unsigned integer"))
}
fn get_str(v: &Value, key: &str) -> R<String> {
    Ok(get(v, key)?.as_str().ok_or_else(|| format!("workloads.json: {key:?} is not a string"))?.to_string())
}

fn parse_rule(v: &Value, per_layer: bool) -> R<TensorRule> {
    let id = get_str(v, "id")?;
    let shape = get(v, "shape")?
        .as_array()
        .ok_or("workloads.json: rule shape is not an array")?
        .iter()
        .map(|d| d.as_str().map(str::to_string).ok_or_else(|| format!("bad shape entry in {id}")))
        .collect::<R<Vec<_>>>()?;
    let tp = match get_str(v, "tp")?.as_str() {
        "replicated" => TpRule::Replicated,
        s => match s.strip_prefix("split:").and_then(|d| d.parse().ok()) {
            Some(d) => TpRule::Split(d),
            None => return Err(format!("unsupported tp rule {s:?} in {id}")),
        },
    };
    let ep_ownership = match get_str(v, "ep")?.as_str() {
        "replicated" => false,
        "ownership" => true,
        s => return Err(format!("unsupported ep rule {s:?} in {id}")),
    };
    let pp_owner = if per_layer {
        PpOwner::Layer
    } else {
        match v.get("pp_owner").and_then(Value::as_str) {
            Some("first") => PpOwner::First,
            Some("last") => PpOwner::Last,
            other => return Err(format!("unsupported pp_owner {other:?} in {id}")),
        }
    };
    let per_expert = match v.get("expert_id") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "{e}" => true,
        Some(other) => return Err(format!("unsupported expert_id {other} in {id}")),
    };
    if per_expert != ep_ownership {
        return Err(format!("{id}: per-expert tensors (and only they) must use EP ownership"));
    }
    Ok(TensorRule { id, shape, tp, ep_ownership, pp_owner, per_expert })
}

fn parse_rules(v: &Value, key_prefix: &str, per_layer: bool) -> R<Vec<TensorRule>> {
    let obj = v.as_object().ok_or("workloads.json: tensor_rules is not an object")?;
    let (_, list) = obj
        .iter()
        .find(|(k, _)| k.as_str() == key_prefix || k.starts_with(&format!("{key_prefix} ")))
        .ok_or_else(|| format!("workloads.json: tensor_rules has no {key_prefix:?}"))?;
    list.as_array()
        .ok_or_else(|| format!("workloads.json: {key_prefix} is not an array"))?
        .iter()
        .map(|r| parse_rule(r, per_layer))
        .collect()
}

fn parse_sizes(v: &Value) -> R<Sizes> {
    Ok(Sizes { tp: get_u64(v, "tp")?, pp: get_u64(v, "pp")?, ep: get_u64(v, "ep")?, dp: get_u64(v, "dp")? })
}

impl WorkloadFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> R<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text)
    }

    /// Parses the JSON text of `workloads.json`.
    pub fn parse(text: &str) -> R<Self> {
        let root: Value = serde_json::from_str(text).map_err(|e| format!("workloads.json: {e}"))?;
        let tr = get(&root, "tensor_rules")?;
        let rules = Rules {
            dtype: get_str(tr, "dtype")?,
            itemsize: get_u64(tr, "itemsize")?,
            layout_fingerprint: get_str(tr, "layout_fingerprint")?,
            head_dim: get_u64(tr, "head_dim")?,
            globals: parse_rules(tr, "globals", false)?,
            per_layer_common: parse_rules(tr, "per_layer_common", true)?,
            dense_mlp: parse_rules(tr, "per_layer_mlp_when_experts_eq_0", true)?,
            moe_mlp: parse_rules(tr, "per_layer_mlp_when_experts_gt_0", true)?,
        };
        let mut workloads = Vec::new();
        for w in get(&root, "workloads")?.as_array().ok_or("workloads.json: workloads is not an array")? {
            let mut params = BTreeMap::new();
            for (k, v) in w.as_object().ok_or("workloads.json: workload is not an object")? {
                if let Some(n) = v.as_u64() {
                    params.insert(k.clone(), n);
                }
            }
            params.entry("head_dim".to_string()).or_insert(rules.head_dim);
            let expected_counts = get(w, "expected_counts")?
                .as_object()
                .ok_or("expected_counts is not an object")?
                .iter()
                .filter_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
                .collect();
            let expected_ids = get(w, "expected_ids")?
                .as_object()
                .ok_or("expected_ids is not an object")?
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect();
            if let Some(layout) = w.get("expert_layout").and_then(Value::as_str) {
                if layout != "per_expert" {
                    return Err(format!("unsupported expert_layout {layout:?}"));
                }
            }
            workloads.push(Workload {
                name: get_str(w, "name")?,
                layers: get_u64(w, "layers")?,
                experts: get_u64(w, "experts")?,
                source: parse_sizes(get(w, "source")?)?,
                target: parse_sizes(get(w, "target")?)?,
                params,
                expected_counts,
                expected_ids,
            });
        }
        Ok(WorkloadFile { rules, workloads })
    }

    /// The workload `name`; a unique prefix (`w1k`, `w1m`) is accepted too.
    pub fn find(&self, name: &str) -> Option<&Workload> {
        if let Some(w) = self.workloads.iter().find(|w| w.name == name) {
            return Some(w);
        }
        let mut hits = self.workloads.iter().filter(|w| w.name.starts_with(name));
        match (hits.next(), hits.next()) {
            (Some(w), None) => Some(w),
            _ => None,
        }
    }
}

/// A generated tensor: its descriptor spec plus the owner rules.
#[derive(Clone, Debug)]
pub struct GenTensor {
    pub spec: TensorSpec,
    pub tp: TpRule,
    pub pp_owner: u64,
    /// EP owner for EP-ownership tensors.
    pub ep_owner: Option<u64>,
}

impl Workload {
    fn eval(&self, expr: &str) -> R<u64> {
        let mut acc: u64 = 1;
        for factor in expr.split('*') {
            let f = factor.trim();
            let v = match f.parse::<u64>() {
                Ok(n) => n,
                Err(_) => *self.params.get(f).ok_or_else(|| format!("{}: unknown shape variable {f:?}", self.name))?,
            };
            acc = acc.checked_mul(v).ok_or("shape overflow")?;
        }
        Ok(acc)
    }

    fn gen(
        &self,
        rules: &Rules,
        rule: &TensorRule,
        sizes: Sizes,
        l: Option<u64>,
        e: Option<u64>,
        out: &mut Vec<GenTensor>,
    ) -> R<()> {
        let mut id = rule.id.clone();
        if let Some(l) = l {
            id = id.replace("{l}", &l.to_string());
        }
        if let Some(e) = e {
            id = id.replace("{e}", &e.to_string());
        }
        let global_shape = rule.shape.iter().map(|d| self.eval(d)).collect::<R<Vec<_>>>()?;
        let (tp_axis, shard_dims) = match rule.tp {
            TpRule::Replicated => (ParallelAxis::Replicated(AxisKind::Tp), vec![]),
            TpRule::Split(d) => (ParallelAxis::split(AxisKind::Tp, d).map_err(|e| e.to_string())?, vec![d]),
        };
        let ep_axis = if rule.ep_ownership {
            ParallelAxis::Ownership(AxisKind::Ep)
        } else {
            ParallelAxis::Replicated(AxisKind::Ep)
        };
        let pp_owner = match rule.pp_owner {
            PpOwner::First => 0,
            PpOwner::Last => sizes.pp - 1,
            PpOwner::Layer => l.expect("per-layer rule") * sizes.pp / self.layers,
        };
        let ep_owner = if rule.ep_ownership {
            let e = e.ok_or_else(|| format!("{id}: EP ownership without an expert"))?;
            Some(e / (self.experts / sizes.ep))
        } else {
            None
        };
        out.push(GenTensor {
            spec: TensorSpec {
                tensor_id: id,
                global_shape,
                dtype: rules.dtype.clone(),
                itemsize: rules.itemsize,
                shard_dims,
                layout_fingerprint: rules.layout_fingerprint.clone(),
                parallel_axes: vec![
                    ParallelAxis::Replicated(AxisKind::Dp),
                    ParallelAxis::Ownership(AxisKind::Pp),
                    ep_axis,
                    tp_axis,
                ],
                layer_id: l,
                expert_id: if rule.per_expert { e } else { None },
            },
            tp: rule.tp,
            pp_owner,
            ep_owner,
        });
        Ok(())
    }

    /// The tensor list for `sizes`, in the README's tensor order (embed, layers,
    /// then the remaining globals). Owners depend on `sizes` (PP/EP).
    pub fn tensors(&self, rules: &Rules, sizes: Sizes) -> R<Vec<GenTensor>> {
        let mut out = Vec::new();
        let (first, rest) = rules.globals.split_first().ok_or("no global tensors")?;
        self.gen(rules, first, sizes, None, None, &mut out)?;
        for l in 0..self.layers {
            for r in &rules.per_layer_common {
                self.gen(rules, r, sizes, Some(l), None, &mut out)?;
            }
            if self.experts == 0 {
                for r in &rules.dense_mlp {
                    self.gen(rules, r, sizes, Some(l), None, &mut out)?;
                }
            } else {
                for r in rules.moe_mlp.iter().filter(|r| !r.per_expert) {
                    self.gen(rules, r, sizes, Some(l), None, &mut out)?;
                }
                for e in 0..self.experts {
                    for r in rules.moe_mlp.iter().filter(|r| r.per_expert) {
                        self.gen(rules, r, sizes, Some(l), Some(e), &mut out)?;
                    }
                }
            }
        }
        for r in rest {
            self.gen(rules, r, sizes, None, None, &mut out)?;
        }
        Ok(out)
    }

    /// `bench-<name>`.
    pub fn resource_id(&self) -> String {
        format!("bench-{}", self.name)
    }
    /// `<name>-source`.
    pub fn source_set_id(&self) -> String {
        format!("{}-source", self.name)
    }
    /// `<name>-target`.
    pub fn target_set_id(&self) -> String {
        format!("{}-target", self.name)
    }
}

/// Every `(dp, pp, ep, tp)` rank, in that loop order.
pub fn ranks(sizes: Sizes) -> Vec<ParallelRank> {
    let mut out = Vec::with_capacity((sizes.dp * sizes.pp * sizes.ep * sizes.tp) as usize);
    for dp in 0..sizes.dp {
        for pp in 0..sizes.pp {
            for ep in 0..sizes.ep {
                for tp in 0..sizes.tp {
                    out.push(ParallelRank::new(dp, pp, ep, tp));
                }
            }
        }
    }
    out
}

/// `w-d{dp}-p{pp}-e{ep}-t{tp}`.
pub fn participant_id(r: ParallelRank) -> String {
    format!("w-d{}-p{}-e{}-t{}", r.dp, r.pp, r.ep, r.tp)
}

/// The topology of `sizes` (one participant per rank).
pub fn topology(sizes: Sizes) -> R<ParallelTopology> {
    ParallelTopology::new(TopologySpec {
        tp_size: sizes.tp,
        pp_size: sizes.pp,
        ep_size: sizes.ep,
        dp_size: sizes.dp,
        participants: ranks(sizes)
            .into_iter()
            .map(|rank| TopologyParticipant { participant_id: participant_id(rank), rank })
            .collect(),
        topology_id: None,
    })
    .map_err(|e| e.to_string())
}

/// Validated descriptors of `tensors`.
pub fn descriptors(tensors: &[GenTensor]) -> R<Vec<TensorDescriptor>> {
    tensors.iter().map(|t| TensorDescriptor::new(t.spec.clone()).map_err(|e| e.to_string())).collect()
}

/// The placement fragments (content-derived ids), grouped by participant in rank
/// loop order, each participant's tensors in tensor order.
pub fn fragments(tensors: &[GenTensor], sizes: Sizes, itemsize: u64) -> R<Vec<PlacementFragment>> {
    let mut out = Vec::new();
    for rank in ranks(sizes) {
        for t in tensors {
            if rank.pp != t.pp_owner || t.ep_owner.is_some_and(|o| o != rank.ep) {
                continue;
            }
            let shape = &t.spec.global_shape;
            let mut offset = vec![0u64; shape.len()];
            let mut local = shape.clone();
            if let TpRule::Split(d) = t.tp {
                let d = d as usize;
                local[d] = shape[d] / sizes.tp;
                offset[d] = rank.tp * local[d];
            }
            let nbytes = local.iter().product::<u64>() * itemsize;
            out.push(
                PlacementFragment::new(PlacementFragmentSpec {
                    tensor_id: t.spec.tensor_id.clone(),
                    global_offset: offset,
                    local_shape: local,
                    nbytes,
                    rank,
                    pipeline_stage_id: None,
                    aliases: vec![],
                    placement_fragment_id: None,
                })
                .map_err(|e| e.to_string())?,
            );
        }
    }
    Ok(out)
}

/// The flat spec of a placement.
pub fn flat_spec(
    w: &Workload,
    placement_set_id: String,
    topology: ParallelTopology,
    tensors: Vec<TensorDescriptor>,
    fragments: Vec<PlacementFragment>,
) -> FlatPlacementSpec {
    FlatPlacementSpec {
        resource_id: w.resource_id(),
        revision: "rev-1".to_string(),
        weight_generation: 1,
        placement_set_id,
        topology,
        tensors,
        fragments,
    }
}

/// Builds a complete placement of `w` for `sizes` (tensors, fragments, `from_fragments`).
pub fn build_placement(file: &WorkloadFile, w: &Workload, sizes: Sizes, placement_set_id: String) -> R<Placement> {
    let gen = w.tensors(&file.rules, sizes)?;
    let frags = fragments(&gen, sizes, file.rules.itemsize)?;
    let spec = flat_spec(w, placement_set_id, topology(sizes)?, descriptors(&gen)?, frags);
    Placement::from_fragments(spec).map_err(|e| e.to_string())
}

/// One runtime binding per participant (README "Runtime bindings").
pub fn bindings(placement: &Placement) -> R<Vec<RuntimeBinding>> {
    let mut out = Vec::with_capacity(placement.parts().len());
    for (part_index, part) in placement.parts().iter().enumerate() {
        let pid = part.participant_id();
        let rank = part.rank();
        let device = format!("cuda:{}", rank.tp);
        let endpoint = format!("{pid}:17000");
        let base = BINDING_BASE + part_index as u64 * BINDING_PART_STRIDE;
        let mut offset = 0u64;
        let mut frags = Vec::with_capacity(part.fragments().len());
        for (i, f) in part.fragments().iter().enumerate() {
            let itemsize = placement.tensor(f.tensor_id()).ok_or("unknown tensor")?.itemsize();
            let address = base + offset;
            frags.push(
                RuntimeFragment::new(RuntimeFragmentSpec {
                    placement_fragment_id: f.placement_fragment_id().to_string(),
                    fragment_id: format!("{pid}:rt{i}"),
                    address,
                    nbytes: f.nbytes(),
                    worker_id: pid.to_string(),
                    endpoint: endpoint.clone(),
                    device: device.clone(),
                    itemsize,
                    local_shape: f.local_shape().to_vec(),
                    strides_bytes: canonical_strides(f.local_shape(), itemsize),
                    storage_address: address,
                    storage_nbytes: f.nbytes(),
                    storage_offset_bytes: 0,
                    memory: MemoryKind::Device(rank.tp as u32),
                })
                .map_err(|e| e.to_string())?,
            );
            offset += f.nbytes().div_ceil(BINDING_ALIGN) * BINDING_ALIGN;
        }
        out.push(
            RuntimeBinding::new(RuntimeBindingSpec {
                resource_id: placement.resource_id().to_string(),
                placement_id: placement.placement_id().to_string(),
                placement_digest: placement.digest().to_string(),
                instance_id: pid.to_string(),
                lease_generation: 1,
                lease_id: format!("{pid}-lease-g1"),
                revision: placement.revision().to_string(),
                participant_id: pid.to_string(),
                fragments: frags,
            })
            .map_err(|e| e.to_string())?,
        );
    }
    Ok(out)
}

/// The README's fixed upload options.
pub fn upload_options() -> UploadOptions {
    UploadOptions {
        namespace: NAMESPACE.to_string(),
        key_prefix: KEY_PREFIX.to_string(),
        transaction_id: Some(TRANSACTION_ID.to_string()),
        created_at: Some(CREATED_AT.to_string()),
    }
}
