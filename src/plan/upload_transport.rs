//! JSON transport of upload plans between the processes of one job (a coordinator
//! plans, each rank uploads its own operations). Never written to a store; the
//! reference does not read it. A decoded plan passes the same invariants as a
//! planned one.

use super::upload::{UploadOperation, UploadPlan};
use crate::error::{invalid, Error, Result};
use crate::json::{self, write_kv_str, Obj, Profile, Value};
use crate::model::placement::decode_fragment;
use crate::model::{typed, ManifestDocSeed, StoredManifest};
use crate::runtime::transport::{read_runtime_fragment, write_runtime_fragment};
use crate::runtime::RuntimeFragmentSnapshot;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

const PLAN_FORMAT: &str = "mooncake-weight-store/upload-plan/v1";

/// Encodes an upload plan for transport between the processes of one job.
pub fn plan_to_json(plan: &UploadPlan) -> String {
    // About 420 bytes per manifest fragment and 900 per operation.
    let mut out = String::with_capacity(1024 + plan.manifest().fragments().len() * 420 + plan.operations().len() * 900);
    crate::mem::advise_huge_pages(&mut out);
    out.push_str("{\"control_key\":");
    json::write_str(&mut out, plan.control_key(), Profile::Utf8);
    out.push_str(",\"format\":\"");
    out.push_str(PLAN_FORMAT);
    out.push_str("\",\"manifest\":");
    plan.manifest().write_json(&mut out);
    out.push_str(",\"operations\":[");
    let ops = plan.operations();
    for (i, op) in ops.iter().enumerate() {
        // An operation's placement fragment is the placement's own (shared, laid
        // out in placement order): fetch it ahead of the writer.
        if let Some(next) = ops.get(i + crate::model::PREFETCH_AHEAD) {
            next.source_placement().prefetch_heap();
            crate::model::prefetch(next.source_snapshot().runtime().spec_ptr());
        }
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"source_generation\":");
        json::write_u64(&mut out, op.source_lease_generation());
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

const PLAN_KEYS: [&str; 7] = [
    "control_key",
    "format",
    "manifest",
    "operations",
    "source_placement_digest",
    "source_placement_id",
    "transaction_group_id",
];

/// Decodes and fully re-validates an upload plan sent by [`plan_to_json`].
///
/// A typed fast path reads the manifest straight into its structures and each
/// operation as it arrives (no value tree of the whole document); any document it
/// declines or rejects is decoded again by the value path, which reports the
/// precise error. Errors: `InvalidArgument` naming the first violation (schema,
/// format, the manifest's rules, an operation's checks, the plan's invariants).
/// Thread safety: pure; the result is owned.
pub fn plan_from_json(bytes: &[u8]) -> Result<UploadPlan> {
    if let Some(plan) = typed::text_of(bytes).and_then(|text| typed::parse_with(text, PlanSeed)) {
        return Ok(plan);
    }
    let v = json::parse_bytes(bytes, "upload plan")?;
    let o = Obj::new(&v, || "upload plan must be a JSON object".into())?;
    o.expect_keys(&PLAN_KEYS, || "upload plan schema fields do not match contract".into())?;
    check_format(&o)?;
    let manifest = StoredManifest::from_json_value(o.get("manifest"))?;
    let items = json::req_array(o.get("operations"), || "upload plan operations must be a sequence".into())?;
    let index = FragmentIndex::new(&manifest);
    let operations =
        items.iter().enumerate().map(|(i, item)| decode_operation(item, i, &index)).collect::<Result<Vec<_>>>()?;
    finish(&o, manifest, operations)
}

fn check_format(o: &Obj<'_, '_>) -> Result<()> {
    if o.get("format") != &Value::Str(PLAN_FORMAT.into()) {
        return invalid(format!("upload plan format must be {PLAN_FORMAT}"));
    }
    Ok(())
}

/// The plan from its decoded manifest and operations and the object's other members.
fn finish(o: &Obj<'_, '_>, manifest: StoredManifest, operations: Vec<UploadOperation>) -> Result<UploadPlan> {
    UploadPlan::new(
        manifest,
        json::req_str(o.get("source_placement_id"), "source_placement_id")?,
        json::req_str(o.get("source_placement_digest"), "source_placement_digest")?,
        json::req_str(o.get("transaction_group_id"), "transaction_group_id")?,
        json::req_str(o.get("control_key"), "control_key")?,
        operations,
    )
}

/// The manifest's fragments by id, indexed once: linear in the plan, not
/// operations x fragments. SipHash (std), not Fx: the ids come from the wire.
struct FragmentIndex<'m> {
    manifest: &'m StoredManifest,
    by_id: std::collections::HashMap<&'m str, usize>,
}

impl<'m> FragmentIndex<'m> {
    fn new(manifest: &'m StoredManifest) -> Self {
        let by_id = manifest.fragments().iter().enumerate().map(|(i, f)| (f.fragment_id(), i)).collect();
        FragmentIndex { manifest, by_id }
    }
}

/// Decodes operation `i` of the plan against the manifest's fragments.
fn decode_operation(item: &Value<'_>, i: usize, index: &FragmentIndex<'_>) -> Result<UploadOperation> {
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
    let target = index
        .by_id
        .get(target_id.as_str())
        .map(|&f| index.manifest.fragments()[f].clone())
        .ok_or_else(|| Error::invalid("upload plan operations and manifest differ"))?;
    let snapshot = RuntimeFragmentSnapshot::new(&placement, &runtime, generation);
    UploadOperation::new(
        placement,
        snapshot,
        json::req_str(op.get("source_participant_id"), "source_participant_id")?,
        json::req_str(op.get("source_instance_id"), "source_instance_id")?,
        target,
        generation,
        json::req_str(op.get("source_lease_id"), "source_lease_id")?,
    )
}

/// The typed fast path of [`plan_from_json`]: the plan object with its members in
/// any order except that `manifest` comes before `operations` (as
/// [`plan_to_json`] writes them); each operation is read as a small value and
/// decoded at once. Declines (a fallback error) anything else.
struct PlanSeed;

impl<'de> DeserializeSeed<'de> for PlanSeed {
    type Value = UploadPlan;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UploadPlan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an upload plan object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Value, A::Error> {
                let mut members: typed::Members<'de> = Vec::with_capacity(PLAN_KEYS.len());
                let mut manifest: Option<StoredManifest> = None;
                let mut operations: Option<Vec<UploadOperation>> = None;
                let mut seen = 0u32;
                while let Some(k) = typed::next_key(&mut m)? {
                    let bit = PLAN_KEYS.iter().position(|s| *s == k).ok_or_else(typed::fallback)?;
                    typed::mark(&mut seen, bit as u32)?;
                    match k {
                        "manifest" => manifest = Some(m.next_value_seed(ManifestDocSeed)?),
                        "operations" => {
                            let manifest = manifest.as_ref().ok_or_else(typed::fallback)?;
                            let index = FragmentIndex::new(manifest);
                            operations = Some(m.next_value_seed(OperationsSeed { index: &index })?);
                        }
                        _ => {
                            members.push((Cow::Borrowed(k), typed::value(&mut m)?));
                            continue;
                        }
                    }
                    // The schema check needs only the name.
                    members.push((Cow::Borrowed(k), Value::Null));
                }
                let (Some(manifest), Some(operations)) = (manifest, operations) else {
                    return Err(typed::fallback());
                };
                let v = Value::Object(members);
                let decoded = Obj::new(&v, String::new).and_then(|o| {
                    o.expect_keys(&PLAN_KEYS, String::new)?;
                    check_format(&o)?;
                    finish(&o, manifest, operations)
                });
                decoded.map_err(|_| typed::fallback())
            }
        }
        d.deserialize_map(V)
    }
}

/// The operations array of [`PlanSeed`], decoded one element at a time.
struct OperationsSeed<'a, 'm> {
    index: &'a FragmentIndex<'m>,
}

impl<'de> DeserializeSeed<'de> for OperationsSeed<'_, '_> {
    type Value = Vec<UploadOperation>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        struct V<'a, 'm>(&'a FragmentIndex<'m>);
        impl<'de> Visitor<'de> for V<'_, '_> {
            type Value = Vec<UploadOperation>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of upload operations")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(self.0.manifest.fragments().len());
                while let Some(item) = seq.next_element::<Value<'de>>()? {
                    out.push(decode_operation(&item, out.len(), self.0).map_err(|_| typed::fallback())?);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V(self.index))
    }
}
