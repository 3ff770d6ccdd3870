//! JSON transport of logical and bound transfer plans (`live-transfer.md` §2.1:
//! serialization keeps only placements and bindings-derived evidence and
//! re-validates on restore). A coordinator ships these documents to executors;
//! absolute addresses never appear in them: bound operations carry offsets relative
//! to the runtime fragment they name (`address_offset`, `storage_offset`), as the
//! conformance fixtures do. Restoring re-plans (and re-binds, with the receiver's
//! bindings) and requires the shipped content to equal the recomputed one.

use super::region::{PlanningLimits, TransferRegion};
use super::transfer::{LogicalTransferPlan, PlacementExecutorPlan, SourceRouting};
use super::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::error::{invalid, Error, Result};
use crate::model::{ParallelRank, Placement, PlacementFragment};
use crate::runtime::RuntimeBinding;
use serde_json::{json, Value};
use std::sync::Arc;

const LOGICAL_SCHEMA: &str = "mws-logical-transfer-plan";
const BOUND_SCHEMA: &str = "mws-transfer-plan";

/// `{"dp":..,"tp":..,"pp":..,"ep":..}`.
pub fn rank_json(r: ParallelRank) -> Value {
    json!({"dp": r.dp, "tp": r.tp, "pp": r.pp, "ep": r.ep})
}

/// A placement fragment in the fixtures' region form.
pub fn placement_fragment_json(f: &PlacementFragment, participant_id: &str) -> Value {
    json!({
        "placement_fragment_id": f.placement_fragment_id(),
        "participant_id": participant_id,
        "tensor_id": f.tensor_id(),
        "global_offset": f.global_offset(),
        "local_shape": f.local_shape(),
        "nbytes": f.nbytes(),
        "rank": rank_json(f.rank()),
        "pipeline_stage_id": f.pipeline_stage_id(),
        "aliases": f.aliases(),
    })
}

fn geometry_json(r: &TransferRegion, v: &mut serde_json::Map<String, Value>) {
    v.insert("inner_bytes".into(), json!(r.inner_bytes));
    v.insert("outer_loop_counts".into(), json!(r.outer_loop_counts));
    v.insert("source_strides".into(), json!(r.source_strides));
    v.insert("target_strides".into(), json!(r.target_strides));
    v.insert("segment_count".into(), json!(r.segment_count()));
    v.insert("total_bytes".into(), json!(r.total_bytes()));
}

/// A logical region in the fixtures' form.
pub fn region_json(plan: &LogicalTransferPlan, r: &TransferRegion) -> Value {
    let mut v = serde_json::Map::new();
    v.insert("tensor_id".into(), json!(plan.target_of(r).tensor_id()));
    v.insert("source".into(), placement_fragment_json(plan.source_of(r), plan.source_participant_of(r)));
    v.insert("target".into(), placement_fragment_json(plan.target_of(r), plan.target_participant_of(r)));
    v.insert("overlap_offset".into(), json!(r.overlap_offset));
    v.insert("overlap_shape".into(), json!(r.overlap_shape));
    v.insert("source_base_offset".into(), json!(r.source_base_offset));
    v.insert("target_base_offset".into(), json!(r.target_base_offset));
    geometry_json(r, &mut v);
    Value::Object(v)
}

fn placement_executor_json(e: &PlacementExecutorPlan) -> Value {
    json!({
        "participant_id": e.participant_id,
        "rank": rank_json(e.rank),
        "placement_fragment_ids": e.placement_fragment_ids,
        "operation_indices": e.operation_indices,
    })
}

fn limits_json(l: PlanningLimits) -> Value {
    json!({
        "max_transfer_regions": l.max_transfer_regions,
        "max_segments_per_region": l.max_segments_per_region,
        "max_total_lowered_segments": l.max_total_lowered_segments,
    })
}

fn placement_value(p: &Placement) -> Value {
    serde_json::from_str(&p.to_json()).expect("canonical placement JSON parses")
}

pub(crate) fn logical_value(plan: &LogicalTransferPlan) -> Value {
    let mut v = json!({
        "schema": LOGICAL_SCHEMA,
        "version": 1,
        "source_placement": placement_value(plan.source()),
        "target_placement": placement_value(plan.target()),
        "planning_limits": limits_json(plan.limits()),
        "target_participant_id": plan.local_target(),
        "source_placement_id": plan.source_placement_id(),
        "target_placement_id": plan.target_placement_id(),
        "total_bytes": plan.total_bytes(),
        "regions": plan.regions().iter().map(|r| region_json(plan, r)).collect::<Vec<_>>(),
        "source_executors": plan.source_executors().iter().map(placement_executor_json).collect::<Vec<_>>(),
        "target_executors": plan.target_executors().iter().map(placement_executor_json).collect::<Vec<_>>(),
    });
    // Only a non-reference routing is written, so that reference plans keep the
    // reference's document.
    if plan.routing() != SourceRouting::TargetDp {
        v["source_routing"] = json!(plan.routing().name());
    }
    v
}

pub(crate) fn logical_to_json(plan: &LogicalTransferPlan) -> String {
    logical_value(plan).to_string()
}

fn parse(text: &str, what: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::invalid(format!("invalid {what} JSON: {e}")))
}

fn u64_field(v: &Value, k: &str) -> Result<u64> {
    v[k].as_u64().ok_or_else(|| Error::invalid(format!("transfer plan field {k} must be a non-negative integer")))
}

fn logical_from_value(v: &Value) -> Result<LogicalTransferPlan> {
    if v["schema"] != LOGICAL_SCHEMA || v["version"] != 1 {
        return invalid("logical transfer plan JSON has an unknown schema");
    }
    let placement = |k: &str| -> Result<Arc<Placement>> {
        let text = serde_json::to_string(&v[k]).expect("a value serializes");
        Ok(Arc::new(Placement::from_json(text.as_bytes())?))
    };
    let (source, target) = (placement("source_placement")?, placement("target_placement")?);
    let l = &v["planning_limits"];
    let limits = PlanningLimits {
        max_transfer_regions: u64_field(l, "max_transfer_regions")?,
        max_segments_per_region: u64_field(l, "max_segments_per_region")?,
        max_total_lowered_segments: u64_field(l, "max_total_lowered_segments")?,
    };
    let routing = match &v["source_routing"] {
        Value::Null => SourceRouting::TargetDp,
        Value::String(name) if name != "target_dp" => SourceRouting::from_name(name)?,
        _ => return invalid("transfer plan field source_routing must be absent or \"spread_targets\""),
    };
    let plan = match &v["target_participant_id"] {
        Value::Null => LogicalTransferPlan::plan_routed(source, target, limits, routing)?,
        Value::String(p) => LogicalTransferPlan::plan_local_routed(source, target, Some(p), limits, routing)?,
        _ => return invalid("transfer plan field target_participant_id must be a string or null"),
    };
    if logical_value(&plan) != *v {
        return invalid("logical transfer plan JSON differs from its placements");
    }
    Ok(plan)
}

pub(crate) fn logical_from_json(text: &str) -> Result<LogicalTransferPlan> {
    logical_from_value(&parse(text, "logical transfer plan")?)
}

fn endpoint_json(plan: &TransferPlan, i: usize, side: Side) -> Value {
    let (b, f) = plan.operation_fragment(i, side);
    let r = &plan.regions()[i];
    let offset = if side == Side::Source { r.source_base_offset } else { r.target_base_offset };
    json!({
        "participant_id": b.participant_id(),
        "instance_id": b.instance_id(),
        "lease_id": b.lease_id(),
        "generation": b.lease_generation(),
        "worker_id": f.worker_id(),
        "endpoint": f.endpoint(),
        "device": f.device(),
        "fragment_id": f.fragment_id(),
        "placement_fragment_id": f.placement_fragment_id(),
        "address_offset": offset,
        "storage_offset": f.storage_offset_bytes() + offset,
    })
}

/// Bound operation `i` in the fixtures' form (relative offsets, no addresses).
pub fn bound_operation_json(plan: &TransferPlan, i: usize) -> Value {
    let r = &plan.regions()[i];
    let mut v = serde_json::Map::new();
    v.insert("tensor_id".into(), json!(plan.logical().target_of(r).tensor_id()));
    v.insert("source".into(), endpoint_json(plan, i, Side::Source));
    v.insert("target".into(), endpoint_json(plan, i, Side::Target));
    geometry_json(r, &mut v);
    Value::Object(v)
}

/// An executor in the fixtures' form.
pub fn executor_json(e: &ExecutorTransferPlan) -> Value {
    json!({
        "participant_id": e.participant_id,
        "instance_id": e.instance_id,
        "lease_id": e.runtime_lease_id,
        "generation": e.lease_generation,
        "worker_id": e.worker_id,
        "rank": rank_json(e.rank),
        "placement_id": e.placement_id,
        "placement_digest": e.placement_digest,
        "fragment_ids": e.fragment_ids,
        "operation_indices": e.operation_indices,
    })
}

fn bound_value(plan: &TransferPlan) -> Value {
    json!({
        "schema": BOUND_SCHEMA,
        "version": 1,
        "logical": logical_value(plan.logical()),
        "operations": (0..plan.regions().len()).map(|i| bound_operation_json(plan, i)).collect::<Vec<_>>(),
        "source_executors": plan.executors(Side::Source).iter().map(executor_json).collect::<Vec<_>>(),
        "target_executors": plan.executors(Side::Target).iter().map(executor_json).collect::<Vec<_>>(),
    })
}

pub(crate) fn bound_to_json(plan: &TransferPlan) -> String {
    bound_value(plan).to_string()
}

pub(crate) fn bound_from_json(
    text: &str,
    target_bindings: &[RuntimeBinding],
    source_bindings: &[RuntimeBinding],
) -> Result<TransferPlan> {
    let v = parse(text, "transfer plan")?;
    if v["schema"] != BOUND_SCHEMA || v["version"] != 1 {
        return invalid("transfer plan JSON has an unknown schema");
    }
    let logical = logical_from_value(&v["logical"])?;
    let plan = TransferPlan::bind(&logical, target_bindings, source_bindings)?;
    let ours = bound_value(&plan);
    if ours["operations"] != v["operations"] {
        return invalid("transfer plan operations differ from the attested runtime bindings");
    }
    for side in [Side::Source, Side::Target] {
        let key = format!("{}_executors", side.as_str());
        if ours[&key] != v[&key] {
            if side == Side::Source && v[&key].as_array().is_some_and(|a| a.is_empty()) {
                return invalid("live source requires executor provenance");
            }
            return invalid(format!("{} executor provenance differs from attestation", side.as_str()));
        }
    }
    Ok(plan)
}

impl LogicalTransferPlan {
    /// The plan as transport JSON (`mws-logical-transfer-plan`): both placements,
    /// the limits, the local participant and the regions. No addresses.
    pub fn to_json(&self) -> String {
        logical_to_json(self)
    }

    /// Restores a plan from [`Self::to_json`]: re-plans from the shipped placements
    /// and limits and requires the shipped regions and executors to equal the
    /// re-planned ones (`logical transfer plan JSON differs from its placements`),
    /// so a forged document is refused.
    pub fn from_json(text: &str) -> Result<Self> {
        logical_from_json(text)
    }
}

impl TransferPlan {
    /// The plan as transport JSON (`mws-transfer-plan`): the logical plan plus every
    /// bound operation and executor, with offsets relative to runtime fragments and
    /// no absolute address.
    pub fn to_json(&self) -> String {
        bound_to_json(self)
    }

    /// Restores a plan shipped by [`Self::to_json`]: re-plans and re-binds to the
    /// given bindings, then requires every shipped operation and executor to equal
    /// the re-bound ones (`transfer plan operations differ from the attested runtime
    /// bindings`, `<side> executor provenance differs from attestation`, `live source
    /// requires executor provenance`), so a forged or stale document is refused.
    pub fn from_json(
        text: &str,
        target_bindings: &[RuntimeBinding],
        source_bindings: &[RuntimeBinding],
    ) -> Result<TransferPlan> {
        bound_from_json(text, target_bindings, source_bindings)
    }
}
