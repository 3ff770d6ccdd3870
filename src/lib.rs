//! # mooncake-weight-store
//!
//! Snapshot and restore the weights of large sharded LLMs (TP / PP / EP / DP) into an
//! object store, wire-compatible with Mooncake's Python `mooncake-reshard` weight
//! store (same JSON, ids, digests and keys). This is the core crate: every behaviour,
//! behind a safe Rust API; the C ABI is the crate in `capi/`, which only translates.
//!
//! Layers (`docs/ARCHITECTURE.md`), each using only the ones before it:
//! - [`model`]: address-free contracts (tensors, axes, fragments, topology, parts,
//!   placements, the placement builder, the stored manifest), validation, canonical
//!   JSON and SHA-256 identities;
//! - [`runtime`]: live bindings (addresses, leases, generations), pairing with a
//!   placement, their JSON transport;
//! - [`geometry`]: N-D boxes, exact covers, strided overlaps;
//! - [`plan`]: pure planners — uploads, restores (logical and bound), and their
//!   transport;
//! - [`store`]: the object-store contract and the embedded backends;
//! - [`protocol`]: everything that does I/O — the weight store's API, upload,
//!   commit/abort/finalize, the transaction state machine, restores, the snapshot
//!   writer, guards and registration;
//! - [`delta`]: the sparse delta codec of live weight sync (pure: the changed
//!   elements of a region against a base, encoded, and applied to a buffer);
//! - [`logging`]: the library's log records for a host that installs a sink at run
//!   time (the C ABI's log callback);
//!
//! Pure layers (model, geometry, plan, delta) do no I/O. Every value type is immutable and
//! validated at construction: a value that exists is valid. All types are
//! `Send + Sync`.

// Index maps keyed by tuples of borrowed ids read best spelled out in place.
#![allow(clippy::type_complexity)]

pub(crate) mod copy;
pub(crate) mod crc;
pub mod delta;
pub mod device;
pub mod engine;
pub mod error;
pub(crate) mod fxhash;
pub mod geometry;
pub mod json;
pub mod logging;
pub(crate) mod mem;
pub mod model;
pub(crate) mod par;
pub mod plan;
pub(crate) mod pyrepr;
pub mod runtime;

pub use copy::pattern_name as streaming_copy_pattern;
pub use error::{Error, ErrorKind, Result};
pub use model::*;
pub use plan::upload::{plan_upload, Decision, UploadOperation, UploadOptions, UploadPlan};
pub use plan::upload_transport::{plan_from_json, plan_to_json};
pub use runtime::transport::{binding_from_json, binding_to_json};
pub use runtime::{
    validate_binding_subset, validate_runtime_binding, validate_runtime_bindings, MemoryKind, MemoryRegion,
    RuntimeBinding, RuntimeBindingSpec, RuntimeFragment, RuntimeFragmentSnapshot, RuntimeFragmentSpec,
};
pub mod protocol;
pub mod store;
#[cfg(test)]
pub(crate) mod testutil;
