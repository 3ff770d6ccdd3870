//! # mooncake-weight-store
//!
//! Snapshot and restore the weights of large sharded LLMs (TP / PP / EP / DP) into an
//! object store, wire-compatible with Mooncake's Python `mooncake-reshard` weight
//! store (same JSON, ids, digests and keys), with a C ABI (`src/ffi/`).
//!
//! Layers (see `ARCHITECTURE.md` of the design notes): [`model`] (address-free
//! contracts, canonical JSON, identities), [`runtime`] (live bindings), [`geometry`]
//! (N-D boxes), [`plan`] (upload planning). Pure layers do no I/O.
//!
//! Every value type is immutable and validated at construction: a value that exists
//! is valid. All types are `Send + Sync`.

// Index maps keyed by tuples of borrowed ids read best spelled out in place.
#![allow(clippy::type_complexity)]

pub mod engine;
pub mod error;
pub(crate) mod fxhash;
pub mod geometry;
pub mod json;
pub mod model;
pub mod plan;
pub mod runtime;

pub mod ffi;

pub use error::{Error, ErrorKind, Result};
pub use model::*;
pub use plan::upload::{plan_upload, Decision, UploadOperation, UploadOptions, UploadPlan};
pub use runtime::{
    validate_binding_subset, validate_runtime_binding, validate_runtime_bindings, MemoryKind, RuntimeBinding,
    RuntimeBindingSpec, RuntimeFragment, RuntimeFragmentSnapshot, RuntimeFragmentSpec,
};
pub mod protocol;
pub mod store;
