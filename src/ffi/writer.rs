//! `mws_writer`: the per-tensor snapshot writer over a caller's adapter vtable.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;

use parking_lot::Mutex;

use super::binding::mws_binding;
use super::boundary::{status_call, value_call, Failure};
use super::manifest::mws_stored_manifest;
use super::mws_status;
use super::placement::mws_placement;
use super::store::{mws_guard_acquire_fn, mws_guard_release_fn, mws_receipts, mws_store, CGuard};
use super::strings::{check_out, handle, opt_str_arg, str_arg, utf8, write_out};
use super::upload::{mws_upload_options, mws_upload_plan};
use crate::protocol::guards::{GuardProvider, StaticGuard};
use crate::protocol::{SnapshotAdapter, SnapshotDescriptor, SnapshotSource, SnapshotWriter, WeightStore};
use crate::{Error, ErrorKind, RuntimeBinding, UploadOptions};

/// Version of `mws_snapshot_adapter_vtable` this library implements.
pub const MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION: u32 = 1;

/// The identity of a snapshot, passed to `mws_writer_begin` and to the adapter's
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
/// given to `mws_writer_begin` (which must outlive the writer; the library never
/// frees it), returns 0 on success (any other value fails the call), must not throw or
/// unwind, and is only called from inside a call on the writer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_snapshot_adapter_vtable {
    /// `sizeof(mws_snapshot_adapter_vtable)`.
    pub size: u32,
    /// `MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION`.
    pub version: u32,
    /// Required. Called once by `mws_writer_begin`: writes the source placement to
    /// `*placement` and an array of `*count` binding handles (one per participant
    /// that lends buffers) to `*bindings`. The handles and the array stay owned by the
    /// adapter; the library copies them before `mws_writer_begin` returns. Every
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

#[derive(Clone, Copy)]
struct AdapterCtx(*mut c_void);

struct CAdapter {
    vt: mws_snapshot_adapter_vtable,
    ctx: AdapterCtx,
}

/// The framework tensor handle: the caller's opaque pointer.
struct CTensor(*mut c_void);

fn adapter_err(what: &str, code: i32) -> Error {
    Error::new(ErrorKind::InvalidArgument, format!("snapshot adapter {what} failed: error code {code}"))
}

// SAFETY: `mws_writer_begin`'s contract makes the caller vouch for the exported
// buffers (valid and unchanged while the writer lives or while pinned).
unsafe impl SnapshotAdapter for CAdapter {
    type Tensor = CTensor;

    fn export_source(&self, d: &SnapshotDescriptor) -> crate::Result<SnapshotSource> {
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
        let code = unsafe { f(self.ctx.0, &desc, &mut placement, &mut bindings, &mut count) };
        if code != 0 {
            return Err(adapter_err("export_source", code));
        }
        let placement = unsafe { placement.as_ref() }
            .ok_or_else(|| Error::invalid("snapshot adapter export_source returned a NULL placement"))?;
        let list = unsafe { super::strings::slice_arg(bindings, count, "bindings") }
            .map_err(|f| Error::invalid(format!("snapshot adapter export_source: {}", f.message)))?;
        let mut built = Vec::with_capacity(list.len());
        for (i, b) in list.iter().enumerate() {
            let b = unsafe { b.as_ref() }
                .ok_or_else(|| Error::invalid(format!("snapshot adapter export_source returned a NULL binding {i}")))?;
            built.push(b.build().map_err(|f| Error::new(ErrorKind::InvalidBinding, f.message))?);
        }
        Ok(SnapshotSource { placement: Arc::new(placement.inner.clone()), bindings: built })
    }

    fn resolve_fragment_ids(
        &self,
        tensor_id: &str,
        tensor: &CTensor,
        _source: &SnapshotSource,
    ) -> crate::Result<Vec<String>> {
        let f = self.vt.resolve_fragment_ids.expect("checked at begin");
        let tid = CString::new(tensor_id).map_err(|_| Error::invalid("tensor_id contains a NUL byte"))?;
        let mut ids: *const *const c_char = std::ptr::null();
        let mut count: usize = 0;
        let code = unsafe { f(self.ctx.0, tid.as_ptr(), tensor.0, &mut ids, &mut count) };
        if code != 0 {
            return Err(adapter_err("resolve_fragment_ids", code));
        }
        let list = unsafe { super::strings::slice_arg(ids, count, "ids") }
            .map_err(|f| Error::invalid(format!("snapshot adapter resolve_fragment_ids: {}", f.message)))?;
        let mut out = Vec::with_capacity(list.len());
        for (i, p) in list.iter().enumerate() {
            if p.is_null() {
                return Err(Error::invalid(format!("snapshot adapter resolve_fragment_ids returned a NULL id {i}")));
            }
            let bytes = unsafe { CStr::from_ptr(*p) }.to_bytes();
            out.push(utf8(bytes, "fragment id").map_err(|f| Error::invalid(f.message))?.to_owned());
        }
        Ok(out)
    }

    fn source_allocation_guards(&self, _binding: &RuntimeBinding) -> crate::Result<Arc<dyn GuardProvider>> {
        if self.vt.acquire_source.is_none() && self.vt.release_source.is_none() {
            return Ok(Arc::new(StaticGuard));
        }
        let g = CGuard::new(self.vt.acquire_source, self.vt.release_source, self.ctx.0)
            .map_err(|f| Error::invalid(f.message))?;
        Ok(Arc::new(g))
    }
}

/// A snapshot in progress: one upload plan written tensor by tensor. Each participant
/// is uploaded as soon as all its fragments were written; `mws_writer_commit`
/// publishes the manifest.
///
/// Created by `mws_writer_begin`, freed by `mws_writer_free`. Freeing an open writer
/// (neither committed nor aborted) aborts it (best effort; unless the commit decision
/// may exist, in which case the transaction is left for `mws_store_finalize_upload`).
/// The writer keeps its store alive. Calls on one writer are serialized internally
/// (a mutex), so it may be shared between threads, but the adapter callbacks then run
/// on whichever thread calls.
pub struct mws_writer {
    // Declared first: dropped (aborting an open writer) before the store it borrows.
    inner: Mutex<SnapshotWriter<'static, CAdapter>>,
    _store: Arc<WeightStore>,
}

/// Starts a snapshot of the source that the adapter exports, into `store`: calls
/// `export_source` once, checks the identity against `*descriptor`, and plans the
/// upload. No store I/O. `options` may be NULL; only its `transaction_id` and
/// `created_at` are used (the namespace comes from the descriptor and the key prefix
/// from the store).
///
/// New handle in `*out` (free with `mws_writer_free`). `adapter` is copied; `ctx`
/// must outlive the writer.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (descriptor, identity mismatch,
/// adapter failure, vtable size), `MWS_UNSUPPORTED` (vtable version),
/// `MWS_INVALID_BINDING`.
///
/// # Safety
/// Handles and pointers are NULL or valid; the adapter honours its contract.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_begin(
    store: *const mws_store,
    descriptor: *const mws_snapshot_descriptor,
    adapter: *const mws_snapshot_adapter_vtable,
    ctx: *mut c_void,
    options: *const mws_upload_options,
    out: *mut *mut mws_writer,
) -> mws_status {
    status_call("mws_writer_begin", || {
        let s = handle(store, "store")?;
        let d = handle(descriptor, "descriptor")?;
        check_out(out, "out")?;
        if adapter.is_null() {
            return Err(Failure::null("adapter"));
        }
        let size = (adapter as *const u32).read_unaligned();
        let version = (adapter as *const u32).add(1).read_unaligned();
        if (size as usize) < std::mem::size_of::<mws_snapshot_adapter_vtable>() {
            return Err(Failure::invalid(format!(
                "mws_snapshot_adapter_vtable.size is {size}, expected at least {}",
                std::mem::size_of::<mws_snapshot_adapter_vtable>()
            )));
        }
        if version != MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION {
            return Err(Failure::new(
                mws_status::MWS_UNSUPPORTED,
                format!("mws_snapshot_adapter_vtable.version is {version}, this library implements version {MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION}"),
            ));
        }
        let vt = adapter.read_unaligned();
        if vt.export_source.is_none() || vt.resolve_fragment_ids.is_none() {
            return Err(Failure::invalid(
                "mws_snapshot_adapter_vtable is missing mandatory callbacks: export_source and resolve_fragment_ids are required",
            ));
        }
        if vt.acquire_source.is_some() != vt.release_source.is_some() {
            return Err(Failure::invalid("acquire_source and release_source must both be set or both be NULL"));
        }
        let descriptor = SnapshotDescriptor {
            resource_id: str_arg(d.resource_id, "descriptor->resource_id")?.to_owned(),
            revision: str_arg(d.revision, "descriptor->revision")?.to_owned(),
            weight_generation: d.weight_generation,
            namespace: opt_str_arg(d.store_namespace, "descriptor->store_namespace")?.unwrap_or("default").to_owned(),
        };
        let mut o = UploadOptions::default();
        if let Some(c) = options.as_ref() {
            o.transaction_id = opt_str_arg(c.transaction_id, "options->transaction_id")?.map(str::to_owned);
            o.created_at = opt_str_arg(c.created_at, "options->created_at")?.map(str::to_owned);
        }
        let ws = s.ws.clone();
        let w = ws.begin_snapshot_with(&descriptor, CAdapter { vt, ctx: AdapterCtx(ctx) }, &o)?;
        // SAFETY: the writer borrows the WeightStore inside `ws`, an Arc the handle
        // keeps (declared after `inner`, so dropped after the writer).
        let w: SnapshotWriter<'static, CAdapter> = std::mem::transmute(w);
        write_out(out, Box::into_raw(Box::new(mws_writer { inner: Mutex::new(w), _store: ws })));
        Ok(())
    })
}

/// Records that the framework tensor `tensor` (opaque to the library; passed to the
/// adapter's `resolve_fragment_ids`) named `tensor_id` is written, and uploads every
/// participant that is now complete. If `receipts` is not NULL, the receipts of those
/// uploads are written there as a new handle (possibly empty; free with
/// `mws_receipts_free`).
///
/// Errors after the fragments were resolved (unknown or duplicate fragment, upload
/// failure) abort the writer. Errors: `MWS_INVALID_ARGUMENT`, `MWS_CONFLICT` (writer
/// closed), upload errors (see `mws_store_upload`).
///
/// # Safety
/// `writer` is NULL or a live handle; `tensor_id` is NULL or NUL-terminated;
/// `receipts` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_write_tensor(
    writer: *const mws_writer,
    tensor_id: *const c_char,
    tensor: *mut c_void,
    receipts: *mut *mut mws_receipts,
) -> mws_status {
    status_call("mws_writer_write_tensor", || {
        let w = handle(writer, "writer")?;
        let id = str_arg(tensor_id, "tensor_id")?;
        let r = w.inner.lock().write_tensor(id, &CTensor(tensor))?;
        if !receipts.is_null() {
            write_out(receipts, Box::into_raw(Box::new(mws_receipts::new(r))));
        }
        Ok(())
    })
}

/// Publishes the snapshot's manifest, written as a new handle to `*out`. Missing
/// fragments abort the writer (`MWS_INVALID_ARGUMENT`); transaction errors
/// (`MWS_STORE`) leave it open for a retry.
///
/// # Safety
/// `writer` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_commit(
    writer: *const mws_writer,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call("mws_writer_commit", || {
        let w = handle(writer, "writer")?;
        check_out(out, "out")?;
        let m = w.inner.lock().commit()?;
        write_out(out, Box::into_raw(Box::new(mws_stored_manifest::new(Arc::new(m)))));
        Ok(())
    })
}

/// Aborts the snapshot: records the abort and removes its payloads. A no-op on a
/// closed writer. Fails with `MWS_CONFLICT` (writer stays open) when the commit
/// decision may exist: retry `mws_writer_commit` instead.
///
/// # Safety
/// `writer` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_abort(writer: *const mws_writer) -> mws_status {
    status_call("mws_writer_abort", || {
        let w = handle(writer, "writer")?;
        Ok(w.inner.lock().abort()?)
    })
}

/// Copies the writer's upload plan into a new handle in `*out` (free with
/// `mws_upload_plan_free`): its operations say which tensors and participants the
/// snapshot expects.
///
/// # Safety
/// `writer` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_upload_plan(
    writer: *const mws_writer,
    out: *mut *mut mws_upload_plan,
) -> mws_status {
    status_call("mws_writer_upload_plan", || {
        let w = handle(writer, "writer")?;
        check_out(out, "out")?;
        let plan = w.inner.lock().plan().clone();
        write_out(out, Box::into_raw(Box::new(mws_upload_plan::new(plan))));
        Ok(())
    })
}

/// Frees a writer. `NULL` does nothing. An open writer is aborted first (best effort,
/// errors are dropped; see `mws_writer`).
///
/// # Safety
/// `writer` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_free(writer: *mut mws_writer) {
    value_call("mws_writer_free", (), || {
        if !writer.is_null() {
            drop(Box::from_raw(writer));
        }
        Ok(())
    })
}
