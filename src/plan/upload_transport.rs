//! JSON transport of upload plans between the processes of one job (a coordinator
//! plans, each rank uploads its own operations). Never written to a store; the
//! reference does not read it. A decoded plan passes the same invariants as a
//! planned one.

use super::upload::{UploadOperation, UploadPlan};
use crate::error::{invalid, Error, Result};
use crate::json::{self, write_kv_str, Obj, Profile, Value};
use crate::model::placement::decode_fragment;
use crate::model::StoredManifest;
use crate::runtime::transport::{read_runtime_fragment, write_runtime_fragment};
use crate::runtime::RuntimeFragmentSnapshot;

const PLAN_FORMAT: &str = "mooncake-weight-store/upload-plan/v1";

/// Encodes an upload plan for transport between the processes of one job.
pub fn plan_to_json(plan: &UploadPlan) -> String {
    // About 420 bytes per manifest fragment and 900 per operation.
    let mut out = String::with_capacity(1024 + plan.manifest().fragments().len() * 420 + plan.operations().len() * 900);
    out.push_str("{\"control_key\":");
    json::write_str(&mut out, plan.control_key(), Profile::Utf8);
    out.push_str(",\"format\":\"");
    out.push_str(PLAN_FORMAT);
    out.push_str("\",\"manifest\":");
    plan.manifest().write_json(&mut out);
    out.push_str(",\"operations\":[");
    for (i, op) in plan.operations().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"source_generation\":");
        json::write_u64(&mut out, op.source_generation());
        out.push(',');
        write_kv_str(&mut out, "source_instance_id", op.source_instance_id());
        out.push(',');
        write_kv_str(&mut out, "source_lease_id", op.source_lease_id());
        out.push(',');
        write_kv_str(&mut out, "source_participant_id", op.source_participant_id());
        out.push_str(",\"source_placement\":");
        op.source_placement().write_json(&mut out);
        out.push_str(",\"source_runtime\":");
        write_runtime_fragment(&mut out, op.source_snapshot().runtime());
        out.push(',');
        write_kv_str(&mut out, "target_fragment_id", op.target().fragment_id());
        out.push('}');
    }
    out.push_str("],");
    write_kv_str(&mut out, "source_placement_digest", plan.source_placement_digest());
    out.push(',');
    write_kv_str(&mut out, "source_placement_id", plan.source_placement_id());
    out.push(',');
    write_kv_str(&mut out, "transaction_group_id", plan.transaction_group_id());
    out.push('}');
    out
}

/// Decodes and fully re-validates an upload plan sent by [`plan_to_json`].
pub fn plan_from_json(bytes: &[u8]) -> Result<UploadPlan> {
    let v = json::parse_bytes(bytes, "upload plan")?;
    let o = Obj::new(&v, || "upload plan must be a JSON object".into())?;
    o.expect_keys(
        &[
            "control_key",
            "format",
            "manifest",
            "operations",
            "source_placement_digest",
            "source_placement_id",
            "transaction_group_id",
        ],
        || "upload plan schema fields do not match contract".into(),
    )?;
    if o.get("format") != &Value::Str(PLAN_FORMAT.into()) {
        return invalid(format!("upload plan format must be {PLAN_FORMAT}"));
    }
    let manifest = StoredManifest::from_json_value(o.get("manifest"))?;
    let items = json::req_array(o.get("operations"), || "upload plan operations must be a sequence".into())?;
    // Index the manifest once: linear in the plan, not operations x fragments.
    // SipHash (std), not Fx: the ids come from the wire.
    let by_fragment_id: std::collections::HashMap<&str, usize> =
        manifest.fragments().iter().enumerate().map(|(i, f)| (f.fragment_id(), i)).collect();
    let mut operations = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let op = Obj::new(item, || format!("upload operation {i} must be a JSON object"))?;
        op.expect_keys(
            &[
                "source_generation",
                "source_instance_id",
                "source_lease_id",
                "source_participant_id",
                "source_placement",
                "source_runtime",
                "target_fragment_id",
            ],
            || format!("upload operation {i} schema fields do not match contract"),
        )?;
        let placement = decode_fragment(op.get("source_placement"), i)?;
        let runtime = read_runtime_fragment(op.get("source_runtime"))?;
        let generation = json::req_int(op.get("source_generation"), "source_generation", 0)?;
        let target_id = json::req_str(op.get("target_fragment_id"), "target_fragment_id")?;
        let target = by_fragment_id
            .get(target_id.as_str())
            .map(|&f| manifest.fragments()[f].clone())
            .ok_or_else(|| Error::invalid("upload plan operations and manifest differ"))?;
        operations.push(UploadOperation::new(
            placement.clone(),
            RuntimeFragmentSnapshot::new(&placement, &runtime, generation),
            json::req_str(op.get("source_participant_id"), "source_participant_id")?,
            json::req_str(op.get("source_instance_id"), "source_instance_id")?,
            target,
            generation,
            json::req_str(op.get("source_lease_id"), "source_lease_id")?,
        )?);
    }
    UploadPlan::new(
        manifest,
        json::req_str(o.get("source_placement_id"), "source_placement_id")?,
        json::req_str(o.get("source_placement_digest"), "source_placement_digest")?,
        json::req_str(o.get("transaction_group_id"), "transaction_group_id")?,
        json::req_str(o.get("control_key"), "control_key")?,
        operations,
    )
}
