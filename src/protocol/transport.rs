//! JSON transport of in-memory values between the processes of one job: upload
//! plans, receipts and runtime bindings. These documents are never written to a
//! store and the reference does not read them; every decode re-validates fully
//! (a decoded plan passes the same invariants as a planned one).

use super::transaction::UploadReceipt;
use crate::error::{invalid, Error, Result};
use crate::json::{self, Obj, Profile, Value};
use crate::model::placement::decode_fragment;
use crate::model::{StoredFragment, StoredManifest};
use crate::plan::upload::{UploadOperation, UploadPlan};
use crate::runtime::{
    MemoryKind, RuntimeBinding, RuntimeBindingSpec, RuntimeFragment, RuntimeFragmentSnapshot, RuntimeFragmentSpec,
};

const PLAN_FORMAT: &str = "mooncake-weight-store/upload-plan/v1";
const RECEIPTS_FORMAT: &str = "mooncake-weight-store/upload-receipts/v1";
const BINDING_FORMAT: &str = "mooncake-weight-store/runtime-binding/v1";

fn write_kv_str(out: &mut String, k: &str, v: &str) {
    json::key(out, k);
    json::write_str(out, v, Profile::Utf8);
}

fn write_memory(out: &mut String, m: MemoryKind) {
    match m {
        MemoryKind::Host => out.push_str("{\"kind\":\"host\"}"),
        MemoryKind::Device(o) => {
            out.push_str("{\"kind\":\"device\",\"ordinal\":");
            json::write_u64(out, o as u64);
            out.push('}');
        }
    }
}

fn read_memory(v: &Value) -> Result<MemoryKind> {
    let o = Obj::new(v, || "memory must be a JSON object".into())?;
    match o.get("kind") {
        Value::Str(k) if k == "host" && o.has_exact_keys(&["kind"]) => Ok(MemoryKind::Host),
        Value::Str(k) if k == "device" && o.has_exact_keys(&["kind", "ordinal"]) => {
            let n = json::req_int(o.get("ordinal"), "memory ordinal", 0)?;
            u32::try_from(n).map(MemoryKind::Device).map_err(|_| Error::invalid("memory ordinal is out of range"))
        }
        _ => invalid("memory must be {\"kind\":\"host\"} or {\"kind\":\"device\",\"ordinal\":N}"),
    }
}

const FRAGMENT_KEYS: [&str; 14] = [
    "address",
    "device",
    "endpoint",
    "fragment_id",
    "itemsize",
    "local_shape",
    "memory",
    "nbytes",
    "placement_fragment_id",
    "storage_address",
    "storage_nbytes",
    "storage_offset_bytes",
    "strides_bytes",
    "worker_id",
];

fn write_runtime_fragment(out: &mut String, f: &RuntimeFragment) {
    out.push_str("{\"address\":");
    json::write_u64(out, f.address());
    out.push(',');
    write_kv_str(out, "device", f.device());
    out.push(',');
    write_kv_str(out, "endpoint", f.endpoint());
    out.push(',');
    write_kv_str(out, "fragment_id", f.fragment_id());
    out.push_str(",\"itemsize\":");
    json::write_u64(out, f.itemsize());
    out.push_str(",\"local_shape\":");
    json::write_u64_array(out, f.local_shape());
    out.push_str(",\"memory\":");
    write_memory(out, f.memory());
    out.push_str(",\"nbytes\":");
    json::write_u64(out, f.nbytes());
    out.push(',');
    write_kv_str(out, "placement_fragment_id", f.placement_fragment_id());
    out.push_str(",\"storage_address\":");
    json::write_u64(out, f.storage_address());
    out.push_str(",\"storage_nbytes\":");
    json::write_u64(out, f.storage_nbytes());
    out.push_str(",\"storage_offset_bytes\":");
    json::write_u64(out, f.storage_offset_bytes());
    out.push_str(",\"strides_bytes\":");
    json::write_u64_array(out, f.strides_bytes());
    out.push(',');
    write_kv_str(out, "worker_id", f.worker_id());
    out.push('}');
}

/// Decodes a runtime fragment object. `memory` may be omitted (host), so the
/// conformance fixtures' binding form is accepted too.
fn read_runtime_fragment(v: &Value) -> Result<RuntimeFragment> {
    let o = Obj::new(v, || "runtime fragment must be a JSON object".into())?;
    let with_memory = o.has_exact_keys(&FRAGMENT_KEYS);
    let without: Vec<&str> = FRAGMENT_KEYS.iter().copied().filter(|k| *k != "memory").collect();
    if !with_memory && !o.has_exact_keys(&without) {
        return invalid("runtime fragment schema fields do not match contract");
    }
    RuntimeFragment::new(RuntimeFragmentSpec {
        placement_fragment_id: json::req_str(o.get("placement_fragment_id"), "placement_fragment_id")?,
        fragment_id: json::req_str(o.get("fragment_id"), "fragment_id")?,
        address: json::req_int(o.get("address"), "address", 1)?,
        nbytes: json::req_int(o.get("nbytes"), "nbytes", 1)?,
        worker_id: json::req_str(o.get("worker_id"), "worker_id")?,
        endpoint: json::req_str(o.get("endpoint"), "endpoint")?,
        device: json::req_str(o.get("device"), "device")?,
        itemsize: json::req_int(o.get("itemsize"), "runtime itemsize", 1)?,
        local_shape: json::req_int_array(o.get("local_shape"), "runtime local_shape", 1)?,
        strides_bytes: json::req_int_array(o.get("strides_bytes"), "runtime strides_bytes", 0)?,
        storage_address: json::req_int(o.get("storage_address"), "storage_address", 1)?,
        storage_nbytes: json::req_int(o.get("storage_nbytes"), "storage_nbytes", 1)?,
        storage_offset_bytes: json::req_int(o.get("storage_offset_bytes"), "storage_offset_bytes", 0)?,
        memory: if with_memory { read_memory(o.get("memory"))? } else { MemoryKind::Host },
    })
}

/// Encodes a runtime binding for transport (it contains raw addresses: never
/// persist it).
pub fn binding_to_json(b: &RuntimeBinding) -> String {
    let mut out = String::from("{\"format\":\"");
    out.push_str(BINDING_FORMAT);
    out.push_str("\",\"fragments\":[");
    for (i, f) in b.fragments().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_runtime_fragment(&mut out, f);
    }
    out.push_str("],\"generation\":");
    json::write_u64(&mut out, b.generation());
    for (k, v) in [
        ("instance_id", b.instance_id()),
        ("lease_id", b.lease_id()),
        ("participant_id", b.participant_id()),
        ("placement_digest", b.placement_digest()),
        ("placement_id", b.placement_id()),
        ("resource_id", b.resource_id()),
        ("revision", b.revision()),
    ] {
        out.push(',');
        write_kv_str(&mut out, k, v);
    }
    out.push('}');
    out
}

/// Decodes a runtime binding (strict; `format` optional so the conformance
/// fixtures' binding form is accepted).
pub fn binding_from_json(bytes: &[u8]) -> Result<RuntimeBinding> {
    let v = json::parse_bytes(bytes, "runtime binding")?;
    binding_from_value(&v)
}

fn binding_from_value(v: &Value) -> Result<RuntimeBinding> {
    const KEYS: [&str; 9] = [
        "fragments",
        "generation",
        "instance_id",
        "lease_id",
        "participant_id",
        "placement_digest",
        "placement_id",
        "resource_id",
        "revision",
    ];
    let o = Obj::new(v, || "runtime binding must be a JSON object".into())?;
    let with_format: Vec<&str> = KEYS.iter().copied().chain(["format"]).collect();
    if o.has_exact_keys(&with_format) {
        if o.get("format") != &Value::Str(BINDING_FORMAT.into()) {
            return invalid(format!("runtime binding format must be {BINDING_FORMAT}"));
        }
    } else if !o.has_exact_keys(&KEYS) {
        return invalid("runtime binding schema fields do not match contract");
    }
    let items = json::req_array(o.get("fragments"), || "runtime binding fragments must be a sequence".into())?;
    RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: json::req_str(o.get("resource_id"), "resource_id")?,
        placement_id: json::req_str(o.get("placement_id"), "placement_id")?,
        placement_digest: json::req_str(o.get("placement_digest"), "placement_digest")?,
        instance_id: json::req_str(o.get("instance_id"), "instance_id")?,
        generation: json::req_int(o.get("generation"), "generation", 0)?,
        lease_id: json::req_str(o.get("lease_id"), "lease_id")?,
        revision: json::req_str(o.get("revision"), "revision")?,
        participant_id: json::req_str(o.get("participant_id"), "participant_id")?,
        fragments: items.iter().map(read_runtime_fragment).collect::<Result<Vec<_>>>()?,
    })
}

/// Encodes an upload plan for transport between the processes of one job.
pub fn plan_to_json(plan: &UploadPlan) -> String {
    let mut out = String::from("{\"control_key\":");
    json::write_str(&mut out, plan.control_key(), Profile::Utf8);
    out.push_str(",\"format\":\"");
    out.push_str(PLAN_FORMAT);
    out.push_str("\",\"manifest\":");
    out.push_str(&plan.manifest().to_json());
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
    // Index the manifest's fragments by id once (linear decoding; a scan per
    // operation was quadratic). SipHash: the ids come from the wire.
    let by_id: std::collections::HashMap<&str, &StoredFragment> =
        manifest.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
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
        let target = by_id
            .get(target_id.as_str())
            .map(|f| (*f).clone())
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

/// Encodes receipts for transport.
pub fn receipts_to_json(receipts: &[UploadReceipt]) -> String {
    let mut out = String::from("{\"format\":\"");
    out.push_str(RECEIPTS_FORMAT);
    out.push_str("\",\"receipts\":[");
    for (i, r) in receipts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        write_kv_str(&mut out, "fragment_id", &r.fragment_id);
        out.push(',');
        write_kv_str(&mut out, "object_key", &r.object_key);
        out.push(',');
        write_kv_str(&mut out, "worker_id", &r.worker_id);
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// Decodes receipts (strict); validity for a plan is checked at commit.
pub fn receipts_from_json(bytes: &[u8]) -> Result<Vec<UploadReceipt>> {
    let v = json::parse_bytes(bytes, "upload receipts")?;
    let o = Obj::new(&v, || "upload receipts must be a JSON object".into())?;
    o.expect_keys(&["format", "receipts"], || "upload receipts schema fields do not match contract".into())?;
    if o.get("format") != &Value::Str(RECEIPTS_FORMAT.into()) {
        return invalid(format!("upload receipts format must be {RECEIPTS_FORMAT}"));
    }
    let items = json::req_array(o.get("receipts"), || "upload receipts must be a sequence".into())?;
    items
        .iter()
        .map(|item| {
            let r = Obj::new(item, || "upload receipt must be a JSON object".into())?;
            r.expect_keys(&["fragment_id", "object_key", "worker_id"], || {
                "upload receipt schema fields do not match contract".into()
            })?;
            Ok(UploadReceipt {
                fragment_id: json::req_str(r.get("fragment_id"), "fragment_id")?,
                object_key: json::req_str(r.get("object_key"), "object_key")?,
                worker_id: json::req_str(r.get("worker_id"), "worker_id")?,
            })
        })
        .collect()
}
