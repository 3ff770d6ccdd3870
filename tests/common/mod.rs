//! Shared helpers for integration tests: fixtures and runtime bindings in the
//! conformance JSON form.
#![allow(dead_code)]

use mooncake_weight_store::*;
use serde_json::Value as J;
use std::path::PathBuf;

/// The conformance directory: `$MWS_CONFORMANCE_DIR` or the vendored `tests/fixtures/conformance`.
pub fn conformance_dir() -> PathBuf {
    match std::env::var_os("MWS_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance"),
    }
}

fn s(v: &J, k: &str) -> String {
    v[k].as_str().unwrap_or_else(|| panic!("fixture field {k} must be a string")).to_string()
}
fn u(v: &J, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("fixture field {k} must be an integer"))
}
fn ua(v: &J, k: &str) -> Vec<u64> {
    v[k].as_array().expect("array").iter().map(|x| x.as_u64().expect("u64")).collect()
}

/// Builds a runtime binding from the fixtures' binding JSON form.
pub fn binding_from_fixture(b: &J) -> Result<RuntimeBinding> {
    let mut fragments = Vec::new();
    for f in b["fragments"].as_array().expect("fragments") {
        fragments.push(RuntimeFragment::new(RuntimeFragmentSpec {
            placement_fragment_id: s(f, "placement_fragment_id"),
            fragment_id: s(f, "fragment_id"),
            address: u(f, "address"),
            nbytes: u(f, "nbytes"),
            worker_id: s(f, "worker_id"),
            endpoint: s(f, "endpoint"),
            device: s(f, "device"),
            itemsize: u(f, "itemsize"),
            local_shape: ua(f, "local_shape"),
            strides_bytes: ua(f, "strides_bytes"),
            storage_address: u(f, "storage_address"),
            storage_nbytes: u(f, "storage_nbytes"),
            storage_offset_bytes: u(f, "storage_offset_bytes"),
            memory: MemoryKind::Host,
        })?);
    }
    RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: s(b, "resource_id"),
        placement_id: s(b, "placement_id"),
        placement_digest: s(b, "placement_digest"),
        instance_id: s(b, "instance_id"),
        lease_generation: u(b, "generation"),
        lease_id: s(b, "lease_id"),
        revision: s(b, "revision"),
        participant_id: s(b, "participant_id"),
        fragments,
    })
}

/// Parses a placement given as a JSON object value or raw text.
pub fn placement_from_fixture(inputs: &J, key: &str) -> Result<Placement> {
    match &inputs[key] {
        J::String(text) => Placement::from_json(text.as_bytes()),
        other => Placement::from_json(serde_json::to_string(other).unwrap().as_bytes()),
    }
}
