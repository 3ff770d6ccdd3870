//! `mws_snapshot_adapter_vtable`: a framework's snapshot adapter (export the source,
//! resolve tensors to fragments, guards) as a `protocol::SnapshotAdapter`.

use crate::args::Caller;
use crate::binding::mws_binding;
use crate::callbacks::guard::{mws_guard_acquire_fn, mws_guard_release_fn, CGuard};
use crate::callbacks::Ctx;
use crate::placement::mws_placement;
use mws::protocol::guards::GuardProvider;
use mws::protocol::guards::StaticGuard;
use mws::protocol::SnapshotAdapter;
use mws::protocol::SnapshotDescriptor;
use mws::protocol::SnapshotSource;
use mws::Error;
use mws::ErrorKind;
use mws::RuntimeBinding;
use std::ffi::c_char;
use std::ffi::c_void;
use std::ffi::CString;
use std::sync::Arc;

/// Version of `mws_snapshot_adapter_vtable` this library implements.
pub const MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION: u32 = 1;

/// The identity of a snapshot, passed to `mws_writer_new` and to the adapter's
/// `export_source`. Strings are NUL-terminated UTF-8.
#[repr(C)]
pub struct mws_snapshot_descriptor {
    /// Resource id (required; must equal the source placement's).
    pub resource_id: *const c_char,
    /// Revision (required; must equal the source placement's).
    pub revision: *const c_char,
    /// Weight generation (must equal the source placement's).
    pub weight_generation: u64,
    /// Store namespace. NULL means `"default"`.
    pub store_namespace: *const c_char,
}

/// The framework side of a snapshot, implemented by the caller. Set
/// `size = sizeof(mws_snapshot_adapter_vtable)` and
/// `version = MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION`. Every callback receives the `ctx`
/// given to `mws_writer_new` (which must outlive the writer; the library never
/// frees it), returns 0 on success (any other value fails the call), must not throw or
/// unwind, and is only called from inside a call on the writer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_snapshot_adapter_vtable {
    /// `sizeof(mws_snapshot_adapter_vtable)`.
    pub size: u32,
    /// `MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION`.
    pub version: u32,
    /// Required. Called once by `mws_writer_new`: writes the source placement to
    /// `*placement` and an array of `*count` binding handles (one per participant
    /// that lends buffers) to `*bindings`. The handles and the array stay owned by the
    /// adapter; the library copies them before `mws_writer_new` returns. Every
    /// buffer they describe must stay valid and unchanged until the writer is closed
    /// (or, with `acquire_source`, while it is pinned).
    pub export_source: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            descriptor: *const mws_snapshot_descriptor,
            placement: *mut *const mws_placement,
            bindings: *mut *const *const mws_binding,
            count: *mut usize,
        ) -> i32,
    >,
    /// Required. Maps the framework tensor `tensor` (the pointer given to
    /// `mws_writer_write_tensor`) named `tensor_id` to the placement fragment ids it
    /// backs: writes an array of `*count` NUL-terminated ids to `*ids`. The array and
    /// strings stay owned by the adapter and must stay valid until the callback's
    /// caller (`mws_writer_write_tensor`) returns.
    pub resolve_fragment_ids: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            tensor_id: *const c_char,
            tensor: *mut c_void,
            ids: *mut *const *const c_char,
            count: *mut usize,
        ) -> i32,
    >,
    /// Optional allocation guard of the source buffers of one participant during its
    /// flush (same contract as `mws_guard_vtable.acquire`, with this `ctx`). NULL
    /// (together with `release_source`): the buffers stay valid and unchanged for the
    /// writer's whole life.
    pub acquire_source: mws_guard_acquire_fn,
    /// Optional: releases a pin of `acquire_source`.
    pub release_source: mws_guard_release_fn,
}

pub(crate) struct CAdapter {
    pub(crate) vt: mws_snapshot_adapter_vtable,
    pub(crate) ctx: Ctx,
}

/// The framework tensor handle: the caller's opaque pointer.
pub(crate) struct CTensor(pub(crate) *mut c_void);

pub(crate) fn adapter_err(what: &str, code: i32) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("snapshot adapter {what} failed: error code {code}"))
}

// SAFETY: `mws_writer_new`'s contract makes the caller vouch for the exported
// buffers (valid and unchanged while the writer lives or while pinned).
unsafe impl SnapshotAdapter for CAdapter {
    type Tensor = CTensor;

    fn export_source(&self, d: &SnapshotDescriptor) -> mws::Result<SnapshotSource> {
        let f = self.vt.export_source.expect("checked at begin");
        let cstr = |s: &str| CString::new(s).map_err(|_| Error::invalid("snapshot descriptor contains a NUL byte"));
        let (rid, rev, ns) = (cstr(&d.resource_id)?, cstr(&d.revision)?, cstr(&d.namespace)?);
        let desc = mws_snapshot_descriptor {
            resource_id: rid.as_ptr(),
            revision: rev.as_ptr(),
            weight_generation: d.weight_generation,
            store_namespace: ns.as_ptr(),
        };
        let mut placement: *const mws_placement = std::ptr::null();
        let mut bindings: *const *const mws_binding = std::ptr::null();
        let mut count: usize = 0;
        // SAFETY: the adapter vtable's checked `export_source` callback over the caller's `ctx`; every out-pointer points to a live local.
        let code = unsafe { f(self.ctx.0, &desc, &mut placement, &mut bindings, &mut count) };
        if code != 0 {
            return Err(adapter_err("export_source", code));
        }
        // SAFETY: the callback returned 0: by the adapter contract, `placement` is NULL
        // or a live placement handle and (`bindings`, `count`) an array of NULL or live
        // binding handles, valid while the writer lives: the token's promise.
        let c = unsafe { Caller::trusted() };
        let bad = |f: crate::boundary::Failure| {
            Error::invalid(format!("snapshot adapter export_source returned {}", f.message))
        };
        let placement = c.handle(placement, "placement").map_err(bad)?;
        let mut built = Vec::with_capacity(count);
        for b in c.handles(bindings, count, "bindings").map_err(bad)? {
            built.push(b.build().map_err(|f| Error::new(ErrorKind::InvalidBinding, f.message))?);
        }
        Ok(SnapshotSource { placement: Arc::new(placement.inner.clone()), bindings: built })
    }

    fn resolve_fragment_ids(
        &self,
        tensor_id: &str,
        tensor: &CTensor,
        _source: &SnapshotSource,
    ) -> mws::Result<Vec<String>> {
        let f = self.vt.resolve_fragment_ids.expect("checked at begin");
        let tid = CString::new(tensor_id).map_err(|_| Error::invalid("tensor_id contains a NUL byte"))?;
        let mut ids: *const *const c_char = std::ptr::null();
        let mut count: usize = 0;
        // SAFETY: the adapter vtable's checked `resolve_fragment_ids` callback; `tid` is a live NUL-terminated string and the out-pointers point to live locals.
        let code = unsafe { f(self.ctx.0, tid.as_ptr(), tensor.0, &mut ids, &mut count) };
        if code != 0 {
            return Err(adapter_err("resolve_fragment_ids", code));
        }
        // SAFETY: the callback returned 0: by the adapter contract (`ids`, `count`) is an
        // array of NULL or NUL-terminated strings valid until the next call: the token's
        // promise.
        let c = unsafe { Caller::trusted() };
        let bad = |f: crate::boundary::Failure| {
            Error::invalid(format!("snapshot adapter resolve_fragment_ids returned {}", f.message))
        };
        let mut out = Vec::with_capacity(count);
        for (i, &p) in c.slice(ids, count, "ids").map_err(bad)?.iter().enumerate() {
            out.push(c.str(p, &format!("ids[{i}]")).map_err(bad)?.to_owned());
        }
        Ok(out)
    }

    fn source_allocation_guards(&self, _binding: &RuntimeBinding) -> mws::Result<Arc<dyn GuardProvider>> {
        if self.vt.acquire_source.is_none() && self.vt.release_source.is_none() {
            return Ok(Arc::new(StaticGuard));
        }
        let g = CGuard::new(self.vt.acquire_source, self.vt.release_source, self.ctx.0)
            .map_err(|f| Error::invalid(f.message))?;
        Ok(Arc::new(g))
    }
}
