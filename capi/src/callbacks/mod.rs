//! Every C vtable a caller hands the library, each translated into the Rust trait of
//! the layer below: [`store`] (`mws_store_vtable` -> `store::ObjectStore`),
//! [`copy_hook`] (`mws_copy_hook_vtable` -> `store::CopyHook`), [`guard`]
//! (`mws_guard_vtable` -> `protocol::GuardProvider`) and [`snapshot`]
//! (`mws_snapshot_adapter_vtable` -> `protocol::SnapshotAdapter`), [`engine`]
//! (`mws_transfer_engine_vtable` -> `engine::TransferEngine`) [`log`] (the
//! `mws_set_log_callback` function -> a `log::Log` backend) and [`progress`]
//! (`mws_progress_fn` -> `protocol::ProgressFn`). The layers below know
//! no `mws_*` type.

pub mod copy_hook;
pub mod engine;
pub mod guard;
pub mod log;
pub mod progress;
pub mod snapshot;
pub mod store;

use mws::runtime::MemoryKind;
use std::ffi::c_void;

/// The caller's context pointer. The vtable contract makes the callbacks thread-safe.
#[derive(Clone, Copy)]
pub(crate) struct Ctx(pub(crate) *mut c_void);

// SAFETY: the vtable contract requires thread-safe callbacks over `ctx`.
unsafe impl Send for Ctx {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ctx {}

pub(crate) fn memory_code(kind: MemoryKind) -> (u32, u32) {
    match kind {
        MemoryKind::Host => (0, 0),
        MemoryKind::Device(o) => (1, o),
    }
}
