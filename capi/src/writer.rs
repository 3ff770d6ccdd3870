//! `mws_writer`: the per-tensor snapshot writer over a caller's adapter vtable.

use crate::args::Handle;
use crate::boundary::{mws_status, Failure};
use crate::callbacks::progress::{mws_progress_fn, CProgress};
use crate::callbacks::snapshot::{
    mws_snapshot_adapter_vtable, mws_snapshot_descriptor, CAdapter, CTensor, MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION,
};
use crate::callbacks::Ctx;
use crate::receipts::mws_receipts;
use crate::store::mws_store;
use crate::stored_manifest::mws_stored_manifest;
use crate::upload_plan::mws_upload_options;
use crate::upload_plan::mws_upload_plan;
use mws::model::DEFAULT_NAMESPACE;
use mws::protocol::{Progress, SnapshotDescriptor};
use mws::protocol::{SnapshotWriter, WeightStore};
use mws::UploadOptions;
use parking_lot::Mutex;
use std::ffi::c_char;
use std::ffi::c_void;
use std::sync::Arc;

/// A snapshot in progress: one upload plan written tensor by tensor. Each participant
/// is uploaded as soon as all its fragments were written; `mws_writer_commit`
/// publishes the manifest.
///
/// Created by `mws_writer_new`, freed by `mws_writer_free`. Freeing an open writer
/// (neither committed nor aborted) aborts it (best effort; unless the commit decision
/// may exist, in which case the transaction is left for `mws_store_finalize_upload`).
/// The writer keeps its store alive. Calls on one writer are serialized internally
/// (a mutex), so it may be shared between threads, but the adapter callbacks then run
/// on whichever thread calls.
pub struct mws_writer {
    /// The writer, sharing its store (it keeps the store alive).
    pub(crate) inner: Mutex<SnapshotWriter<'static, CAdapter>>,
}

impl Handle for mws_writer {}

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
pub unsafe extern "C" fn mws_writer_new(
    store: *const mws_store,
    descriptor: *const mws_snapshot_descriptor,
    adapter: *const mws_snapshot_adapter_vtable,
    ctx: *mut c_void,
    options: *const mws_upload_options,
    out: *mut *mut mws_writer,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let d = c.struct_ref(descriptor, "descriptor")?;
        let out = c.out(out, "out")?;
        c.struct_ref(adapter, "adapter")?;
        let vt = c.vtable(adapter, "mws_snapshot_adapter_vtable", MWS_SNAPSHOT_ADAPTER_VTABLE_VERSION)?;
        if vt.export_source.is_none() || vt.resolve_fragment_ids.is_none() {
            return Err(Failure::invalid(
                "mws_snapshot_adapter_vtable is missing mandatory callbacks: export_source and resolve_fragment_ids are required",
            ));
        }
        if vt.acquire_source.is_some() != vt.release_source.is_some() {
            return Err(Failure::invalid("acquire_source and release_source must both be set or both be NULL"));
        }
        let descriptor = SnapshotDescriptor {
            resource_id: c.str(d.resource_id, "descriptor->resource_id")?.to_owned(),
            revision: c.str(d.revision, "descriptor->revision")?.to_owned(),
            weight_generation: d.weight_generation,
            namespace: c
                .opt_str(d.store_namespace, "descriptor->store_namespace")?
                .unwrap_or(DEFAULT_NAMESPACE)
                .to_owned(),
        };
        let mut o = UploadOptions::default();
        if let Some(opts) = c.opt_struct(options) {
            o.transaction_id = c.opt_str(opts.transaction_id, "options->transaction_id")?.map(str::to_owned);
            o.created_at = c.opt_str(opts.created_at, "options->created_at")?.map(str::to_owned);
        }
        let w = WeightStore::begin_shared_snapshot(s.ws.clone(), &descriptor, CAdapter { vt, ctx: Ctx(ctx) }, &o)?;
        out.give_handle(mws_writer { inner: Mutex::new(w) })
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
    status_call!(|c| {
        let w = c.handle(writer, "writer")?;
        let id = c.str(tensor_id, "tensor_id")?;
        let r = w.inner.lock().write_tensor(id, &CTensor(tensor))?;
        if let Some(out) = c.opt_out(receipts) {
            out.set(Handle::into_raw(mws_receipts::new(r)));
        }
        Ok(())
    })
}

/// Sets (or clears, with a NULL `progress`) the writer's progress callback: from then
/// on, the uploads that `mws_writer_write_tensor` triggers report throttled
/// `MWS_PROGRESS_UPLOAD` progress whose totals are the whole snapshot (every object
/// of the plan). `ctx` is passed to it and must stay valid while it is set.
///
/// Errors: `MWS_NULL_ARGUMENT` (NULL writer). Thread safety: serialized with the
/// writer's other calls.
///
/// # Safety
/// `writer` is NULL or a live handle; `progress`, when set, honours
/// `mws_progress_fn` with `ctx` until it is replaced or the writer is freed.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_set_progress(
    writer: *const mws_writer,
    progress: mws_progress_fn,
    ctx: *mut c_void,
) -> mws_status {
    status_call!(|c| {
        let w = c.handle(writer, "writer")?;
        // SAFETY: this function's contract: the callback honours `mws_progress_fn` with `ctx`.
        let report = unsafe { CProgress::new(progress, ctx) };
        w.inner.lock().set_progress(report.map(|c| Box::new(move |p: &Progress| c.report(p)) as _));
        Ok(())
    })
}

/// Defers the writer's uploads to `mws_writer_commit` (`defer` 1) or not (0, the
/// default). Deferred, `mws_writer_write_tensor` only records tensors and returns
/// empty receipts, and `mws_writer_commit` uploads every complete participant in one
/// upload call (one store `batch_put_from` stream where the default makes one per
/// participant; each participant pinned through `acquire_source`, when the adapter
/// has one) before it commits. The source buffers must then stay valid and unchanged
/// from `mws_writer_write_tensor` until `mws_writer_commit` returns (the default needs
/// them only until the participant's upload). An upload failure at commit aborts the
/// writer, as a failed upload in `mws_writer_write_tensor` does. Participants completed
/// before the call are uploaded by the next `mws_writer_write_tensor` (0) or by
/// `mws_writer_commit`.
///
/// Errors: `MWS_NULL_ARGUMENT` (NULL writer), `MWS_INVALID_ARGUMENT` (`defer` not 0
/// or 1), `MWS_CONFLICT` (writer closed). Thread
/// safety: serialized with the writer's other calls.
///
/// # Safety
/// `writer` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_defer_uploads(writer: *const mws_writer, defer: u32) -> mws_status {
    status_call!(|c| {
        let w = c.handle(writer, "writer")?;
        let defer = match defer {
            0 => false,
            1 => true,
            v => return Err(Failure::invalid(format!("defer must be 0 or 1, got {v}"))),
        };
        w.inner.lock().defer_uploads(defer)?;
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
    status_call!(|c| {
        let w = c.handle(writer, "writer")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_stored_manifest::new(Arc::new(w.inner.lock().commit()?)))
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
    status_call!(|c| Ok(c.handle(writer, "writer")?.inner.lock().abort()?))
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
    status_call!(|c| {
        let w = c.handle(writer, "writer")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_upload_plan::new(w.inner.lock().plan().clone()))
    })
}

/// Frees a writer. `NULL` does nothing. An open writer is aborted first (best effort,
/// errors are dropped; see `mws_writer`).
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `writer` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_writer_free(writer: *mut mws_writer) {
    value_call!((), |c| c.free(writer))
}
