//! The C ABI. Translation only: every rule lives in the Rust API.
//!
//! The generated header is `include/mooncake_weight_store.h` (cbindgen, see
//! `cbindgen.toml`); the header-only C++ wrapper is `include/mooncake_weight_store.hpp`.
//!
//! House rules of this module:
//! - every `extern "C"` body runs inside [`boundary::status_call`] or
//!   [`boundary::value_call`], which catch panics (no unwinding ever crosses into C)
//!   and record the thread-local last error message;
//! - handles are `Box`es handed out with `Box::into_raw` and taken back by `*_free`;
//! - strings handed out are borrowed from the handle that owns them (NUL-terminated
//!   copies built once, when the handle is created, so every handle is immutable and
//!   can be shared between threads);
//! - nothing here validates the domain: a rule enforced here but not in the Rust API
//!   would be a bug. We only check what C can get wrong and Rust cannot express
//!   (NULL pointers, UTF-8, (pointer, length) pairs).

#![allow(non_camel_case_types)]

mod binding;
mod boundary;
pub mod callbacks;
mod lease;
mod loader;
mod manifest;
mod placement;
mod store;
mod strings;
mod transaction;
mod transfer_plan;
mod upload;
mod writer;

pub use crate::store::callbacks::{
    mws_bytes, mws_copy_hook_vtable, mws_put_item, mws_range_item, mws_store_vtable, MWS_COPY_HOOK_VTABLE_VERSION,
    MWS_RECORD_METADATA, MWS_RECORD_PAYLOAD, MWS_STORE_VTABLE_VERSION,
};
pub use binding::*;
pub use boundary::*;
pub use callbacks::engine::{
    mws_transfer_engine_vtable, MWS_TRANSFER_ENGINE_VTABLE_VERSION, MWS_TRANSFER_READ, MWS_TRANSFER_WRITE,
};
pub use lease::*;
pub use loader::*;
pub use manifest::*;
pub use placement::*;
pub use store::*;
pub use transaction::*;
pub use transfer_plan::*;
pub use upload::*;
pub use writer::*;
