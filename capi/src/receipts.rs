//! `mws_receipts_*`: upload receipts, their JSON transport between processes, and
//! receipts rebuilt from a plan for recovery.

use crate::args::CText;
use crate::boundary::mws_status;
use crate::upload_plan::mws_upload_plan;
use mws::protocol::{receipts_to_json, UploadReceipt};
use std::ffi::c_char;
use std::sync::OnceLock;

/// Upload receipts: proof that stored fragments were written and are visible.
/// Returned by `mws_store_upload` and `mws_writer_write_tensor`, decoded by
/// `mws_receipts_from_json`, merged by `mws_receipts_concat`; freed by
/// `mws_receipts_free`. Immutable: may be used from several threads at once.
pub struct mws_receipts {
    pub(crate) inner: Vec<UploadReceipt>,
    pub(crate) json: OnceLock<CText>,
}

impl mws_receipts {
    pub(crate) fn new(inner: Vec<UploadReceipt>) -> mws_receipts {
        mws_receipts { inner, json: OnceLock::new() }
    }
}

handle!(mws_receipts);

/// Frees a receipts handle. `NULL` does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `receipts` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_free(receipts: *mut mws_receipts) {
    value_call!((), |c| c.free(receipts))
}

/// Returns the number of receipts, or 0 (and the last error) if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_count(receipts: *const mws_receipts) -> usize {
    value_call!(0, |c| Ok(c.handle(receipts, "receipts")?.inner.len()))
}

/// Encodes the receipts for transport (a rank sends them to the coordinator that
/// commits). Borrowed NUL-terminated string (built on first use), valid while
/// `receipts` lives; length to `*len` when not NULL. NULL if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_to_json(receipts: *const mws_receipts, len: *mut usize) -> *const c_char {
    text_call!(receipts, "receipts", len, |r| r.json.get_or_init(|| CText::new(&receipts_to_json(&r.inner))))
}

/// Decodes receipts sent by `mws_receipts_to_json` (strict; their validity for a plan
/// is checked at commit). `json` points to `len` bytes read during the call. On
/// success writes a new handle to `*out` (free with `mws_receipts_free`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT`.
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        out.give_handle(mws_receipts::new(mws::protocol::receipts_from_json(c.bytes(json, len, "json")?)?))
    })
}

/// Concatenates `count` receipts handles (borrowed for the call; NULL elements are an
/// error) into a new handle written to `*out` (free with `mws_receipts_free`).
/// `count` 0 gives an empty set.
///
/// # Safety
/// `list` points to `count` pointers that are NULL or live handles; `out` is NULL or
/// valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_concat(
    list: *const *const mws_receipts,
    count: usize,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let mut all = Vec::new();
        for r in c.handles(list, count, "list")? {
            all.extend(r.inner.iter().cloned());
        }
        out.give_handle(mws_receipts::new(all))
    })
}

/// The receipts of every operation of `plan` (receipts are determined by the plan: a
/// coordinator can rebuild them to retry a commit after a crash). New handle in
/// `*out`.
///
/// # Safety
/// `plan` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_from_plan(
    plan: *const mws_upload_plan,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_receipts::new(UploadReceipt::all_for(&p.inner)))
    })
}
