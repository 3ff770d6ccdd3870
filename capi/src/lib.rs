//! The C ABI. Translation only: every rule lives in the Rust API.
//!
//! The generated header is `include/mooncake_weight_store.h` (cbindgen, see
//! `cbindgen.toml`); the header-only C++ wrapper is `include/mooncake_weight_store.hpp`.
//!
//! Where things are:
//! - `boundary`: `mws_status`, the thread-local last error, the panic boundary
//!   (`status_call!` / `value_call!`, which take the entry point's name from the
//!   function itself) and the version;
//! - `args`: how a handle is created, borrowed and freed (`args::Handle`), and every
//!   other argument read through the call's `Caller` token;
//! - `calls`: the calls in flight per handle, so that a `*_free` waits for the calls
//!   of other threads that use the handle (and one inside such a call, on the same
//!   thread, is deferred to its end) instead of freeing memory under them;
//! - one file per C object: `mws_placement_*` (`placement`), `mws_placement_builder_*`
//!   (`placement_builder`), `mws_binding_*` (`binding`), `mws_upload_plan_*`
//!   (`upload_plan`), `mws_receipts_*` (`receipts`), `mws_revision_list_*`
//!   (`revision_list`), `mws_store_*` (`store`; its jobs in `store_jobs`),
//!   `mws_transaction_*` (`transaction`), `mws_registration_lease_*` (`lease`),
//!   `mws_writer_*` (`writer`), `mws_stored_manifest_*` (`stored_manifest`),
//!   `mws_load_plan_*` (`load_plan`), `mws_transfer_plan_*` (`transfer_plan`),
//!   `mws_device_engine_*` (`device_engine`), `mws_transfer_engine_*` (`engine`),
//!   `mws_loader_*` (`loader`), `mws_sink_*` (`sink`), `mws_prepared_transfer_*`
//!   (`prepared`), `mws_notify_*` and `mws_sink_execute_notified` (`notify`),
//!   `mws_set_log_callback` (`log`);
//!   `mws_io_args` (`io_args`); the per-call structs of live transfers (`live`);
//! - `callbacks`: every C vtable the caller hands us, each translated into the Rust
//!   trait of the layer below (store vtable -> `ObjectStore`, device engine vtable ->
//!   `device::DeviceEngine`, guard -> `GuardProvider`, snapshot adapter ->
//!   `SnapshotAdapter`, engine vtable, progress and log callbacks).
//!
//! House rules:
//! - every `extern "C"` body runs inside the boundary, which catches panics (no
//!   unwinding ever crosses into C) and records the last error message;
//! - handles are boxed slots made by `args::Handle::into_raw` and taken back by
//!   `*_free` once no call uses them; strings handed out are borrowed from the
//!   handle that owns them;
//! - nothing here validates the domain: a rule enforced here but not in the Rust API
//!   would be a bug. We only check what C can get wrong and Rust cannot express
//!   (NULL pointers, UTF-8, (pointer, length) pairs, enum values).

#![allow(non_camel_case_types)]
// Entry points take their arguments flat, as C passes them.
#![allow(clippy::too_many_arguments)]

extern crate mws;

#[macro_use]
mod boundary;
#[macro_use]
mod args;
mod binding;
pub mod callbacks;
mod calls;
mod delta_publisher;
mod device_engine;
mod engine;
mod io_args;
mod lease;
#[macro_use]
mod live;
mod load_plan;
mod loader;
mod log;
mod notify;
mod placement;
mod placement_builder;
mod prepared;
mod receipts;
mod revision_list;
mod sink;
mod step_handle;
mod store;
mod store_jobs;
mod stored_manifest;
mod transaction;
mod transfer_plan;
mod upload_plan;
mod writer;

pub use binding::*;
pub use boundary::*;
pub use callbacks::device_engine::*;
pub use callbacks::engine::*;
pub use callbacks::guard::*;
pub use callbacks::log::mws_log_fn;
pub use callbacks::progress::*;
pub use callbacks::snapshot::*;
pub use callbacks::store::*;
pub use delta_publisher::*;
pub use device_engine::*;
pub use engine::*;
pub use io_args::*;
pub use lease::*;
pub use live::*;
pub use load_plan::*;
pub use loader::*;
pub use log::*;
pub use notify::*;
pub use placement::*;
pub use placement_builder::*;
pub use prepared::*;
pub use receipts::*;
pub use revision_list::*;
pub use sink::*;
pub use step_handle::*;
pub use store::*;
pub use store_jobs::*;
pub use stored_manifest::*;
pub use transaction::*;
pub use transfer_plan::*;
pub use upload_plan::*;
pub use writer::*;

// The crate's Rust tests (capi/tests/), compiled into the library's test harness: the
// library has no rlib (see Cargo.toml), so they cannot be integration tests. The core's
// shared test model (tests/common/model.rs) names the core by its own crate name.
#[cfg(test)]
extern crate mws as mooncake_weight_store;
#[cfg(test)]
#[path = "../tests/boundary.rs"]
mod boundary_tests;
#[cfg(test)]
#[path = "../tests/hostile_store.rs"]
mod hostile_store_tests;
#[cfg(test)]
#[path = "../tests/log_callback.rs"]
mod log_callback_tests;
#[cfg(test)]
#[path = "../tests/notify_abi.rs"]
mod notify_abi_tests;
#[cfg(test)]
#[path = "../../tests/common/model.rs"]
mod test_model;
#[cfg(test)]
#[path = "../tests/vtable_contract.rs"]
mod vtable_contract_tests;
