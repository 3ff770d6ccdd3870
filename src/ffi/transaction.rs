//! `mws_transaction`: an upload transaction bound to a store and an upload plan that
//! collects receipts (translates `WeightStore::upload/commit/abort_upload/finalize`).

use crate::ffi::boundary::mws_status;
use crate::ffi::handles::{
    handle, mws_binding, mws_placement, mws_receipts, mws_store, mws_stored_manifest, mws_transaction, mws_upload_plan,
    Handle,
};
use crate::ffi::io_args::{mws_io_args, with_upload_args};
use crate::ffi::strings::{check_out, write_out};
use crate::protocol::Transaction;
use crate::protocol::TransactionState;
use std::ffi::c_int;

/// The state of an `mws_transaction` handle (`mws_transaction_get_state`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_transaction_state {
    /// Uploads and receipts are accepted; not committed or aborted through this handle.
    MWS_TRANSACTION_OPEN = 0,
    /// `mws_transaction_commit` succeeded.
    MWS_TRANSACTION_COMMITTED = 1,
    /// `mws_transaction_abort` succeeded.
    MWS_TRANSACTION_ABORTED = 2,
}

/// Starts an upload transaction of `plan` in `store`. No I/O. The handle keeps the
/// store alive and copies the plan (both may be freed afterwards). On success writes
/// a new handle to `*out` (free it with `mws_transaction_free`).
///
/// Several transactions over the same plan (in one or several processes) are the
/// same store transaction: the one that commits must hold every receipt.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `store` and `plan` are NULL or live handles; `out` is NULL or valid for a pointer
/// write.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_new(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    out: *mut *mut mws_transaction,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `store` is NULL or a live handle of this type (this function's contract).
        let s = unsafe { handle(store, "store") }?;
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        check_out(out, "out")?;
        let tx = mws_transaction { inner: Transaction::new(s.ws.clone(), p.inner.clone()) };
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(tx)) };
        Ok(())
    })
}

/// Uploads the payloads of `binding`'s participant (only those of `args->worker_id`
/// when given; `args` may be NULL) exactly as `mws_store_upload` does with the
/// transaction's store and plan, and adds their receipts to the transaction.
/// `placement` is the source placement the plan was made from (only read during the
/// call). A failed upload adds no receipts and leaves the transaction open (retry the
/// upload, or `mws_transaction_abort`); uploading a participant twice makes the
/// commit fail with a duplicate receipt.
///
/// Errors: those of `mws_store_upload`, plus `MWS_CONFLICT` when the transaction is
/// committed or aborted (nothing is uploaded).
/// Thread safety: serialized with every other call on `tx` (see `mws_transaction`).
///
/// # Safety
/// Handles are NULL or live; `args` is NULL or valid. Every source buffer of
/// `binding` must be valid for reads and not written during the call (or while the
/// guard pins it).
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_upload(
    tx: *mut mws_transaction,
    placement: *const mws_placement,
    binding: *const mws_binding,
    args: *const mws_io_args,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx as *const mws_transaction, "tx") }?;
        // SAFETY: `placement` is NULL or a live handle of this type (this function's contract).
        let pl = unsafe { handle(placement, "placement") }?;
        // SAFETY: `binding` is NULL or a live handle of this type (this function's contract).
        let b = unsafe { handle(binding, "binding") }?;
        // SAFETY: the io arguments and the binding's buffers satisfy this function's contract.
        unsafe { with_upload_args(t.inner.store(), b, args, |rb, ua| t.inner.upload(&pl.inner, rb, ua)) }
    })
}

/// Writes a new handle to `*out` (free it with `mws_receipts_free`) holding a copy of
/// every receipt the transaction holds now (its uploads and the added receipts, in
/// the order they came). Send it to the committing process with
/// `mws_receipts_to_json`.
///
/// # Safety
/// `tx` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_receipts(
    tx: *const mws_transaction,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx, "tx") }?;
        check_out(out, "out")?;
        let r = t.inner.receipts();
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_receipts::new(r))) };
        Ok(())
    })
}

/// Adds a copy of `receipts` (produced by other processes' uploads of the same plan,
/// e.g. decoded with `mws_receipts_from_json`; borrowed for the call) to the
/// transaction. They are checked against the plan at commit.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_CONFLICT` (committed or aborted).
///
/// # Safety
/// Handles are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_add_receipts(
    tx: *mut mws_transaction,
    receipts: *const mws_receipts,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx as *const mws_transaction, "tx") }?;
        // SAFETY: `receipts` is NULL or a live handle of this type (this function's contract).
        let r = unsafe { handle(receipts, "receipts") }?;
        Ok(t.inner.add_receipts(&r.inner)?)
    })
}

/// Commits with every receipt the transaction holds (`mws_store_commit`) and writes
/// the published manifest to `*out` as a new handle (free with
/// `mws_stored_manifest_free`). Once committed, another call gives the same manifest
/// again (no I/O).
///
/// As soon as the commit decision may have been written,
/// `mws_transaction_commit_decision_may_exist` returns 1, also when the call fails:
/// from then on keep the plan and retry the commit (or `mws_store_finalize_upload`),
/// never abort. A failed commit leaves the transaction open.
///
/// Errors: those of `mws_store_commit` (`MWS_INVALID_ARGUMENT`: receipts missing,
/// duplicated or not of the plan; `MWS_STORE`: retryable; `MWS_CONFLICT`: the store
/// transaction chose abort or lost to a conflicting revision), plus `MWS_CONFLICT`
/// when this transaction was aborted.
///
/// # Safety
/// `tx` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_commit(
    tx: *mut mws_transaction,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx as *const mws_transaction, "tx") }?;
        check_out(out, "out")?;
        let m = t.inner.commit()?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_stored_manifest::new(m))) };
        Ok(())
    })
}

/// Returns 1 if a commit of this transaction may have written the commit decision
/// (then never abort: retry `mws_transaction_commit` or finalize), 0 if not. It is
/// 1 after a successful commit and stays 1 once set. Returns 0 (and sets the last
/// error) if `tx` is NULL.
///
/// # Safety
/// `tx` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_commit_decision_may_exist(tx: *const mws_transaction) -> c_int {
    // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || { Ok(c_int::from(unsafe { handle(tx, "tx") }?.inner.decision_may_exist())) })
}

/// Returns the state of the handle (`mws_transaction_state` value), or
/// `MWS_TRANSACTION_OPEN` (and the last error) if `tx` is NULL. The state only
/// reflects calls on this handle: another transaction over the same plan, or
/// `mws_transaction_finalize`, may have decided the store transaction
/// (`mws_store_read_decision` reads the store).
///
/// # Safety
/// `tx` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_get_state(tx: *const mws_transaction) -> mws_transaction_state {
    value_call!(mws_transaction_state::MWS_TRANSACTION_OPEN, || {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        Ok(match unsafe { handle(tx, "tx") }?.inner.state() {
            TransactionState::Open => mws_transaction_state::MWS_TRANSACTION_OPEN,
            TransactionState::Committed => mws_transaction_state::MWS_TRANSACTION_COMMITTED,
            TransactionState::Aborted => mws_transaction_state::MWS_TRANSACTION_ABORTED,
        })
    })
}

/// Aborts (`mws_store_abort_upload` with the receipts the transaction holds): records
/// the abort decision and removes every payload of the plan that no published
/// manifest references, also when no upload succeeded (a failed upload may have left
/// payloads). A no-op once aborted. On failure the transaction stays open: retry the
/// abort, or `mws_transaction_finalize` later.
///
/// Errors: `MWS_CONFLICT` (committed; the commit decision may exist, see
/// `mws_transaction_commit_decision_may_exist`: retry the commit instead; or the store
/// transaction is already committed or published), `MWS_STORE` (cleanup failed;
/// retry), `MWS_INVALID_ARGUMENT` (added receipts not of the plan).
///
/// # Safety
/// `tx` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_abort(tx: *mut mws_transaction) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx as *const mws_transaction, "tx") }?;
        Ok(t.inner.abort()?)
    })
}

/// Idempotent recovery (`mws_store_finalize_upload` of the plan): brings the store
/// transaction to its terminal state (after a commit that failed late, an abort
/// whose cleanup failed, or a crash of another process) and removes the payloads it
/// must not keep. Never removes a decision or a manifest. Does not change the
/// handle's state.
///
/// Errors: `MWS_CONFLICT` (no terminal decision yet, or a decision of another plan),
/// `MWS_STORE` (retryable).
///
/// # Safety
/// `tx` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_finalize(tx: *const mws_transaction) -> mws_status {
    status_call!(|| {
        // SAFETY: `tx` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(tx, "tx") }?;
        Ok(t.inner.finalize()?)
    })
}

/// Frees a transaction. `NULL` does nothing. It does NOT abort an open transaction:
/// its payloads stay in the store until someone decides. Recovery is explicit,
/// because a commit decision may exist (`mws_transaction_commit_decision_may_exist`)
/// or another process may still commit the plan: call `mws_transaction_abort` first
/// to discard, or later `mws_store_abort_upload` / `mws_store_finalize_upload` with
/// the plan. The store is released if nothing else uses it.
///
/// # Safety
/// `tx` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_free(tx: *mut mws_transaction) {
    value_call!((), || {
        // SAFETY: `tx` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(tx) };
        Ok(())
    })
}
