//! JSON transport of upload plans between the processes of one job (a coordinator
//! plans, each rank uploads its own operations). Never written to a store; the
//! reference does not read it. A decoded plan passes the same invariants as a
//! planned one.

use super::upload::{UploadOperation, UploadPlan};
use crate::error::{invalid, Error, Result};
use crate::json::{self, write_kv_str, Obj, Profile, Value};
use crate::model::placement::decode_fragment;
use crate::model::typed::{self, Any, Each, Exact, Fast, In, Mode, Typed};
use crate::model::{ManifestDocSeed, StoredManifest};
use crate::runtime::transport::{read_runtime_fragment, write_runtime_fragment};
use crate::runtime::RuntimeFragmentSnapshot;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess};

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
/// One decoder, read fast and, for a document it declines, exactly (see
/// `model::typed`): the manifest is read straight into its structures, and each
/// operation, when the manifest came before it (as
/// [`plan_to_json`] writes them), is decoded as it arrives (otherwise after the
/// document is read); no value tree of the whole document. Errors:
/// `InvalidArgument` naming the first violation (schema, format, the manifest's
/// rules, an operation's checks, the plan's invariants). Thread safety: pure; the
/// result is owned.
pub fn plan_from_json(bytes: &[u8]) -> Result<UploadPlan> {
    let text = json::text_of(bytes, LABEL)?;
    // The fast reading first; what it declines is read again exactly, for the
    // contract's error (see `model::typed`).
    if let Some(plan) = typed::parse_fast(text, In(Fast, PlanSeed(Fast))).and_then(|read| decode::<Fast>(read).ok()) {
        return Ok(plan);
    }
    decode::<Exact>(json::parse_text_with(text, LABEL, Any(PlanSeed(Exact)))?)
}

/// Checks a plan read in mode `M` in the contract's order.
fn decode<M: Mode>((doc, manifest, operations): Read<'_, M>) -> Result<UploadPlan> {
    let o = Obj::new(&doc, || "upload plan must be a JSON object".into())?;
    o.expect_keys(&PLAN_KEYS, || "upload plan schema fields do not match contract".into())?;
    check_format(&o)?;
    // The key set holds `manifest`.
    let manifest =
        M::result(manifest.ok_or_else(|| Error::invalid("upload plan schema fields do not match contract"))?)?;
    let operations = match operations {
        Some(decoded) => M::result(decoded)?,
        None => {
            let items = json::req_array(o.get("operations"), || operations_not_array().message().to_string())?;
            let index = FragmentIndex::new(&manifest);
            items.iter().enumerate().map(|(i, item)| decode_operation(item, i, &index)).collect::<Result<Vec<_>>>()?
        }
    };
    finish(&o, manifest, operations)
}

const LABEL: &str = "upload plan";

fn operations_not_array() -> Error {
    Error::invalid("upload plan operations must be a sequence")
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

/// The plan object: its members as values, except the manifest (decoded) and the
/// operations when the manifest came first (decoded as they arrive, or their
/// first error); any other value as it is.
/// The plan object read in mode `M`.
struct PlanSeed<M>(M);

type Read<'de, M> =
    (Value<'de>, Option<<M as Mode>::Out<StoredManifest>>, Option<<M as Mode>::Out<Vec<UploadOperation>>>);

impl<'de, M: Mode> Typed<'de> for PlanSeed<M> {
    type Out = Read<'de, M>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.0;
        let mut manifest: Option<M::Out<StoredManifest>> = None;
        let mut operations = None;
        let members = json::members_with(&mut m, Vec::new(), |k, m| match (k, manifest.as_ref().and_then(M::as_ok)) {
            ("manifest", _) => {
                manifest = Some(m.next_value_seed(ManifestDocSeed(mode))?);
                Ok(true)
            }
            ("operations", Some(decoded)) => {
                let index = FragmentIndex::new(decoded);
                let each = Each(mode, |i| OperationSeed { i, index: &index, mode }, operations_not_array);
                operations = Some(mode.value(m, each)?);
                Ok(true)
            }
            _ => Ok(false),
        })?;
        Ok((Value::Object(members), manifest, operations))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> std::result::Result<Self::Out, E> {
        Ok((v, None, None))
    }
}

/// Operation `i`, read as a value and decoded at once.
struct OperationSeed<'a, 'm, M> {
    i: usize,
    index: &'a FragmentIndex<'m>,
    mode: M,
}

impl<'de, M: Mode> DeserializeSeed<'de> for OperationSeed<'_, '_, M> {
    type Value = M::Out<UploadOperation>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        let _ = self.mode;
        let item = Value::deserialize(d)?;
        M::checked(decode_operation(&item, self.i, self.index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Placement;
    use crate::plan::upload::tests::fixture_binding;
    use crate::plan::upload::{plan_upload, UploadOptions};

    /// Every plan of the upload fixtures, as `plan_to_json` writes it, is read by
    /// the [`Fast`] reading (no second, exact reading) to the plan itself; a
    /// repeated key or an unknown member makes it decline, and the exact reading
    /// refuses those.
    #[test]
    fn canonical_plans_are_read_fast_and_edited_ones_declined() {
        let fast = |text: &str| typed::parse_fast(text, In(Fast, PlanSeed(Fast))).map(decode::<Fast>);
        let mut planned = 0;
        for (name, fixture) in crate::testutil::conformance_fixtures("") {
            let inputs = &fixture["inputs"];
            let (Some(placement), Some(bindings)) =
                (inputs.get("placement"), inputs.get("bindings").and_then(|b| b.as_array()))
            else {
                continue;
            };
            let text = match placement {
                serde_json::Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            let Ok(placement) = Placement::from_json(text.as_bytes()) else { continue };
            let Ok(bindings) = bindings.iter().map(fixture_binding).collect::<Result<Vec<_>>>() else { continue };
            let options = UploadOptions {
                namespace: inputs["namespace"].as_str().unwrap_or("default").into(),
                key_prefix: inputs["key_prefix"].as_str().unwrap_or("weights").into(),
                transaction_id: Some("t".into()),
                created_at: Some("2026-01-01T00:00:00Z".into()),
            };
            let Ok(plan) = plan_upload(&placement, &bindings, &options) else { continue };
            planned += 1;
            let json = plan_to_json(&plan);
            match fast(&json) {
                Some(Ok(read)) => assert!(read == plan, "{name}: the fast reading differs from the plan"),
                Some(Err(e)) => panic!("{name}: the fast reading refused a canonical plan: {e}"),
                None => panic!("{name}: the fast reading declined a canonical plan"),
            }
            for edit in
                [json.replacen("\"format\":", "\"format\":1,\"format\":", 1), json.replacen('{', "{\"x\":0,", 1)]
            {
                assert_ne!(edit, json, "{name}: the edit applies");
                assert!(!matches!(fast(&edit), Some(Ok(_))), "{name}: an edited plan read fast");
                assert!(plan_from_json(edit.as_bytes()).is_err(), "{name}: an edited plan accepted");
            }
        }
        assert!(planned >= 9, "the upload fixtures were found and planned ({planned})");
    }
}
