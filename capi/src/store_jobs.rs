//! `mws_store_*`, the store's jobs: upload, commit, abort, finalize, decisions and
//! restores (`mws_store_load`). They take the other objects (plans, bindings,
//! receipts, manifests, per-call arguments), which in turn only name the store
//! (`store.rs`): the object itself is a leaf, the jobs sit above everything they use.

use crate::binding::mws_binding;
use crate::boundary::mws_status;
use crate::io_args::{mws_io_args, with_load_args, with_load_many_args, with_upload_args};
use crate::load_plan::mws_load_plan;
use crate::load_plan::{mws_load_stats, stats_out};
use crate::placement::mws_placement;
use crate::receipts::mws_receipts;
use crate::store::mws_store;
use crate::stored_manifest::mws_stored_manifest;
use crate::upload_plan::mws_upload_plan;
use mws::protocol::UploadReceipt;
use mws::Decision;
use std::ffi::c_int;
use std::sync::Arc;

/// Uploads the payloads of `binding`'s participant (only those of
/// `args->worker_id` when given) for `plan`, planned from `placement`, and writes
/// their receipts (plan order) to a new handle in `*out`.
///
/// Every freshness check (binding against placement and plan: lease, generation,
/// addresses, memory kind) runs before any store call; then the guard pins the
/// buffers, they are registered, written with `batch_put_from`, unregistered, and the
/// pin released (with `args->lease`, the lease's registration is used instead and
/// nothing is pinned or registered per call). A failure never deletes payloads: clean up with
/// `mws_store_abort_upload`. A participant without operations gives empty receipts.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING`, `MWS_STALE_BINDING`,
/// `MWS_INVALID_ARGUMENT` (unknown worker, worker required), `MWS_UNSUPPORTED` (device
/// memory and the store has no device engine), `MWS_CONFLICT` (the transaction already
/// chose abort), `MWS_STORE`/`MWS_IO` (backend; retryable).
/// Thread safety: uploads of different participants may run concurrently.
///
/// # Safety
/// Handles are NULL or live; `args` is NULL or valid. Every source buffer of
/// `binding` must be valid for reads and not written during the call (or while the
/// guard pins it).
#[no_mangle]
pub unsafe extern "C" fn mws_store_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    placement: *const mws_placement,
    binding: *const mws_binding,
    args: *const mws_io_args,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let pl = c.handle(placement, "placement")?;
        let b = c.handle(binding, "binding")?;
        let out = c.out(out, "out")?;
        let receipts = with_upload_args(c, &s.ws, b, args, |rb, ua| {
            // SAFETY: this function's contract: the source buffers stay valid and
            // unchanged during the call.
            unsafe { s.ws.upload(&p.inner, &pl.inner, rb, ua) }
        })?;
        out.give_handle(mws_receipts::new(receipts))
    })
}

/// Commits the upload: checks the receipts and payloads, claims the commit decision
/// and publishes the manifest, written as a new handle to `*out`.
///
/// `receipts` may be NULL (no receipts: only valid for an empty plan). If
/// `decision_may_exist` is not NULL, it is set to 0 at entry and to 1 as soon as the
/// commit decision may have been written; from then on the caller must keep the plan
/// and retry the commit (or `mws_store_finalize_upload`), never abort. This flag is
/// written on failure too.
///
/// Errors: `MWS_INVALID_ARGUMENT` (receipts do not match the plan), `MWS_STORE`
/// (retryable: payload not complete, decision not visible yet), `MWS_CONFLICT` (the
/// transaction chose abort or lost to a conflicting revision).
///
/// # Safety
/// Handles are NULL or live; `decision_may_exist` is NULL or valid for writes; `out`
/// is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_commit(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    receipts: *const mws_receipts,
    decision_may_exist: *mut c_int,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let r: &[UploadReceipt] = c.opt_handle(receipts).map_or(&[], |r| &r.inner);
        let mut may = false;
        let result = s.ws.commit(&p.inner, r, Some(&mut || may = true));
        c.opt_set(decision_may_exist, c_int::from(may));
        out.give_handle(mws_stored_manifest::new(Arc::new(result?)))
    })
}

/// Aborts the upload: records the abort decision and removes every payload of the
/// plan that no published manifest references. `receipts` may be NULL.
///
/// Errors: `MWS_CONFLICT` (the revision is already published or committed),
/// `MWS_STORE` (cleanup failed; retry or finalize later).
///
/// # Safety
/// Handles are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_store_abort_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    receipts: *const mws_receipts,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let r: &[UploadReceipt] = c.opt_handle(receipts).map_or(&[], |r| &r.inner);
        Ok(s.ws.abort_upload(&p.inner, r)?)
    })
}

/// Idempotent recovery: brings the transaction of `plan` to its terminal state and
/// removes the payloads it must not keep. Never removes a decision or a manifest.
///
/// Errors: `MWS_CONFLICT` (no terminal decision yet, or a decision of another plan),
/// `MWS_STORE` (retryable).
///
/// # Safety
/// Handles are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_store_finalize_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        Ok(s.ws.finalize(&c.handle(plan, "plan")?.inner)?)
    })
}

/// The decision recorded for an upload transaction (`mws_store_read_decision`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_decision {
    /// No decision recorded yet.
    MWS_DECISION_NONE = 0,
    /// The transaction committed.
    MWS_DECISION_COMMIT = 1,
    /// The transaction aborted.
    MWS_DECISION_ABORT = 2,
}

/// Reads the decision record at the plan's control key into `*out`.
///
/// Errors: `MWS_INVALID_MANIFEST` (the record is invalid), `MWS_CONFLICT` (the record
/// belongs to another plan of the same transaction id), `MWS_STORE`.
///
/// # Safety
/// Handles are NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_read_decision(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    out: *mut mws_decision,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let d = match s.ws.current_decision(&p.inner)? {
            None => mws_decision::MWS_DECISION_NONE,
            Some(Decision::Commit) => mws_decision::MWS_DECISION_COMMIT,
            Some(Decision::Abort) => mws_decision::MWS_DECISION_ABORT,
        };
        out.give(d)
    })
}

/// Executes the part of `plan` that belongs to `binding`'s participant (one worker
/// of it when `args->worker_id` is given): checks the binding still matches the plan
/// and that the plan's manifest is the committed one, pins (guard) and registers the
/// target buffers (with `args->lease`: uses the lease's registration, nothing is
/// pinned or registered per call), then reads every range straight into them. Nothing is registered
/// or read before every check passed; a refused plan leaves the buffers untouched.
/// `args` may be NULL (static guard). If `stats` is not NULL, what moved is written
/// there on success.
///
/// Errors: `MWS_STALE_BINDING` (binding changed since planning),
/// `MWS_INVALID_BINDING`, `MWS_INVALID_MANIFEST`/`MWS_INTEGRITY` (stored objects do
/// not match the manifest), `MWS_NOT_FOUND`, `MWS_UNSUPPORTED` (device memory without
/// a device engine), `MWS_STORE`/`MWS_IO`, `MWS_LIMIT_EXCEEDED`.
/// Thread safety: loads of different participants may run concurrently.
///
/// # Safety
/// Handles are NULL or live; `args` is NULL or valid; `stats` is NULL or valid. Every
/// target buffer of `binding` must be valid for writes and not accessed by anyone
/// else during the call.
#[no_mangle]
pub unsafe extern "C" fn mws_store_load(
    store: *const mws_store,
    plan: *const mws_load_plan,
    binding: *const mws_binding,
    args: *const mws_io_args,
    stats: *mut mws_load_stats,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let b = c.handle(binding, "binding")?;
        let st = with_load_args(c, &s.ws, b, args, |rb, la| {
            // SAFETY: this function's contract: the target buffers are valid for writes
            // and untouched by anyone else during the call.
            unsafe { s.ws.load(&p.inner, rb, la) }
        })?;
        c.opt_set(stats, stats_out(st));
        Ok(())
    })
}

/// Loads several target participants of this process (`count` bindings, each its
/// whole part of `plan`, or its `args->worker_id` part) in one call: what one
/// `mws_store_load` per binding, in order, does, with the plan's checks (the committed
/// manifest, the objects' sizes, the integrity record) made once for all of them
/// instead of once per binding. Every binding's own checks run before any store call;
/// then each binding is pinned, registered and read as by `mws_store_load`, on up to
/// as many threads as the machine has cores (at least 2; as concurrent
/// `mws_store_load` calls of different participants may: the store's callbacks and
/// the guard are called from them), or one after the other on the calling thread when
/// `args->progress` is set. A failure stops the call: no binding starts after it, those
/// that started finish, the others stay untouched; the first failed binding's error is
/// returned. If `stats` is not NULL, the totals of every binding are written there on
/// success.
/// `args` may be NULL (static guard); `args->lease` must be NULL (a lease covers one
/// binding).
///
/// Errors: those of `mws_store_load`, plus `MWS_INVALID_ARGUMENT` (a participant
/// given twice, `args->lease` set) and `MWS_INVALID_BINDING` naming `bindings[i]`.
/// Thread safety: as `mws_store_load`.
///
/// # Safety
/// Handles are NULL or live; `bindings` is valid for `count` handles; `args` and
/// `stats` are NULL or valid. Every target buffer of every binding must be valid for
/// writes and not accessed by anyone else during the call.
#[no_mangle]
pub unsafe extern "C" fn mws_store_load_many(
    store: *const mws_store,
    plan: *const mws_load_plan,
    bindings: *const *const mws_binding,
    count: usize,
    args: *const mws_io_args,
    stats: *mut mws_load_stats,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let handles = c.handles(bindings, count, "bindings")?;
        let all = with_load_many_args(c, &handles, args, |rbs, la| {
            // SAFETY: this function's contract: every binding's target buffers are
            // valid for writes and untouched by anyone else during the call.
            unsafe { s.ws.load_many(&p.inner, rbs, la) }
        })?;
        let mut total = mws::protocol::LoadStats::default();
        for st in all {
            total.regions += st.regions;
            total.ranges += st.ranges;
            total.requests += st.requests;
            total.bytes += st.bytes;
            total.strided_regions += st.strided_regions;
            total.direct_regions += st.direct_regions;
            total.staged_regions += st.staged_regions;
            total.staged_bytes += st.staged_bytes;
            total.verified_bytes += st.verified_bytes;
            total.verify_read_bytes += st.verify_read_bytes;
        }
        c.opt_set(stats, stats_out(total));
        Ok(())
    })
}
