//! `mws_transaction`: an upload transaction bound to a store and an upload plan that
//! collects receipts (translates `WeightStore::upload/commit/abort_upload/finalize`).

use crate::binding::mws_binding;
use crate::boundary::mws_status;
use crate::boundary::Failure;
use crate::io_args::{io_args, mws_io_args, source_binding, with_upload_args};
use crate::lease::mws_registration_lease;
use crate::placement::mws_placement;
use crate::receipts::mws_receipts;
use crate::store::mws_store;
use crate::stored_manifest::mws_stored_manifest;
use crate::upload_plan::mws_upload_plan;
use mws::protocol::{Transaction, TransactionState, UploadSource};
use std::ffi::c_int;

/// An upload transaction: one upload plan in one store, uploaded participant by
/// participant (`mws_transaction_upload`), with receipts collected in the handle
/// (plus those of other processes, `mws_transaction_add_receipts`), then committed
/// (`mws_transaction_commit`) or aborted (`mws_transaction_abort`).
///
/// Created by `mws_transaction_new`, freed by `mws_transaction_free`. The handle keeps
/// the store alive and holds its own copy of the plan: both may be freed while it
/// lives. Freeing it never aborts: recovery is explicit (see `mws_transaction_free`).
///
/// Thread safety: calls on one transaction are serialized internally (a mutex held
/// for the whole call, I/O included), so it may be shared between threads, but
/// uploads through one transaction never run in parallel. For parallel uploads, give
/// each thread or process its own transaction over the same plan (or
/// `mws_upload_plan_from_json` of it) and merge their receipts into the committing
/// one. Guard callbacks run under that mutex and must not call into the same
/// transaction.
pub struct mws_transaction {
    pub(crate) inner: Transaction,
}

handle!(mws_transaction);

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
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let tx = mws_transaction { inner: Transaction::new(s.ws.clone(), p.inner.clone()) };
        out.give_handle(tx)
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
    status_call!(|c| {
        let t = c.handle(tx as *const mws_transaction, "tx")?;
        let pl = c.handle(placement, "placement")?;
        let b = c.handle(binding, "binding")?;
        with_upload_args(c, t.inner.store(), b, args, |rb, ua| {
            // SAFETY: this function's contract: the source buffers stay valid and
            // unchanged during the call.
            unsafe { t.inner.upload(&pl.inner, rb, ua) }
        })
    })
}

/// Uploads the payloads of several participants of this process in one call and adds
/// their receipts to the transaction: the same checks, errors and receipts as one
/// `mws_transaction_upload` per binding in array order, except that every check of
/// every binding (and every lease validation and guard pin) runs before any payload
/// is written, and the puts of all bindings go out as one stream of batches with the
/// block checksums computed alongside them. This is the fastest way to snapshot
/// several local ranks (for example one process driving all GPUs of a node).
///
/// `bindings` points to `count` binding handles (`count` 0: nothing to do).
/// `leases` is NULL (no leases) or points to `count` entries, each NULL (that
/// binding is pinned through `args->guard` and registered for the call) or a
/// registration lease of this store covering exactly that binding's planned
/// fragments. `args` may be NULL; its `worker_id`, `transfer_id`, `guard` and
/// `progress` apply to every binding (one progress stream for the call) and its
/// `lease` must be NULL. Everything is borrowed for the call only.
///
/// Errors: those of `mws_transaction_upload`; `MWS_NULL_ARGUMENT` (`bindings` NULL
/// with `count` > 0, or a NULL entry); `MWS_INVALID_ARGUMENT` (a participant given
/// twice, the same lease twice, `args->lease` set, a lease of another store). A
/// failure adds no receipts, leaves the transaction open and never deletes payloads.
/// Thread safety: serialized with every other call on `tx` (see `mws_transaction`).
///
/// # Safety
/// Handles are NULL or live; `bindings` (and `leases` when not NULL) are NULL or
/// valid for `count` reads; `args` is NULL or valid. Every source buffer of every
/// binding must be valid for reads and not written during the call (or while the
/// guard pins it).
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_upload_many(
    tx: *mut mws_transaction,
    placement: *const mws_placement,
    bindings: *const *const mws_binding,
    count: usize,
    leases: *const *const mws_registration_lease,
    args: *const mws_io_args,
) -> mws_status {
    status_call!(|c| {
        let t = c.handle(tx as *const mws_transaction, "tx")?;
        let pl = c.handle(placement, "placement")?;
        let handles = c.handles(bindings, count, "bindings")?;
        let lease_ptrs: &[*const mws_registration_lease] =
            if leases.is_null() { &[] } else { c.slice(leases, count, "leases")? };
        let a = io_args(c, args)?;
        if a.lease.is_some() {
            return Err(Failure::invalid(
                "mws_transaction_upload_many takes one lease per binding (`leases`), not `args->lease`",
            ));
        }
        let ws = t.inner.store();
        let mut built = Vec::with_capacity(handles.len());
        for (i, b) in handles.iter().enumerate() {
            built.push(source_binding(b, &format!("bindings[{i}]: "))?);
        }
        // One read lock per lease: the same lease twice would lock it twice (and can
        // only fit one binding anyway).
        let mut distinct = std::collections::HashSet::with_capacity(lease_ptrs.len());
        if let Some(i) = lease_ptrs.iter().position(|p| !p.is_null() && !distinct.insert(*p)) {
            return Err(Failure::invalid(format!("leases[{i}] repeats an earlier lease")));
        }
        let mut locked = Vec::with_capacity(lease_ptrs.len());
        for &p in lease_ptrs {
            locked.push(c.opt_handle(p).map(|l| l.inner.for_store(ws)).transpose()?);
        }
        let sources: Vec<UploadSource<'_>> = built
            .iter()
            .enumerate()
            .map(|(i, rb)| UploadSource { binding: rb, lease: locked.get(i).and_then(|l| l.as_deref()) })
            .collect();
        // SAFETY: this function's contract: the bindings' buffers stay valid and
        // unchanged during the call.
        Ok(unsafe { t.inner.upload_many(&pl.inner, &sources, a.upload(None)) }?)
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
    status_call!(|c| {
        let t = c.handle(tx, "tx")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_receipts::new(t.inner.receipts()))
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
    status_call!(|c| {
        let t = c.handle(tx as *const mws_transaction, "tx")?;
        Ok(t.inner.add_receipts(&c.handle(receipts, "receipts")?.inner)?)
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
    status_call!(|c| {
        let t = c.handle(tx as *const mws_transaction, "tx")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_stored_manifest::new(t.inner.commit()?))
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
    value_call!(0, |c| Ok(c_int::from(c.handle(tx, "tx")?.inner.decision_may_exist())))
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
    value_call!(mws_transaction_state::MWS_TRANSACTION_OPEN, |c| {
        Ok(match c.handle(tx, "tx")?.inner.state() {
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
    status_call!(|c| Ok(c.handle(tx as *const mws_transaction, "tx")?.inner.abort()?))
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
    status_call!(|c| Ok(c.handle(tx, "tx")?.inner.finalize()?))
}

/// Frees a transaction. `NULL` does nothing. It does NOT abort an open transaction:
/// its payloads stay in the store until someone decides. Recovery is explicit,
/// because a commit decision may exist (`mws_transaction_commit_decision_may_exist`)
/// or another process may still commit the plan: call `mws_transaction_abort` first
/// to discard, or later `mws_store_abort_upload` / `mws_store_finalize_upload` with
/// the plan. The store is released if nothing else uses it.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `tx` is NULL or a live handle not yet freed; no call starts on it once this returns.
#[no_mangle]
pub unsafe extern "C" fn mws_transaction_free(tx: *mut mws_transaction) {
    value_call!((), |c| c.free(tx))
}
