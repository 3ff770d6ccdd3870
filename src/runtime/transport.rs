//! JSON transport of runtime bindings between the processes of one job. A binding
//! holds raw addresses: it is sent to the process that plans or executes, never
//! written to a store. Every decode re-validates fully.

use super::{MemoryKind, RuntimeBinding, RuntimeBindingSpec, RuntimeFragment, RuntimeFragmentSpec};
use crate::error::{invalid, Error, Result};
use crate::json::{self, write_kv_str, Obj, Value};

const BINDING_FORMAT: &str = "mooncake-weight-store/runtime-binding/v1";

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

pub(crate) fn write_runtime_fragment(out: &mut String, f: &RuntimeFragment) {
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
pub(crate) fn read_runtime_fragment(v: &Value) -> Result<RuntimeFragment> {
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
    json::write_u64(&mut out, b.lease_generation());
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
        lease_generation: json::req_int(o.get("generation"), "generation", 0)?,
        lease_id: json::req_str(o.get("lease_id"), "lease_id")?,
        revision: json::req_str(o.get("revision"), "revision")?,
        participant_id: json::req_str(o.get("participant_id"), "participant_id")?,
        fragments: items.iter().map(read_runtime_fragment).collect::<Result<Vec<_>>>()?,
    })
}
