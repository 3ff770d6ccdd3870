//! `mws_receipts_*`: upload receipts, their JSON transport between processes, and
//! receipts rebuilt from a plan for recovery.

use crate::boundary::{mws_status, Failure};
use crate::handles::{handle, mws_receipts, mws_upload_plan, Handle};
use crate::strings::{check_out, slice_arg, write_out, CText};
use mws::protocol::UploadReceipt;
use std::ffi::c_char;

/// Frees a receipts handle. `NULL` does nothing.
///
/// # Safety
/// `receipts` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_free(receipts: *mut mws_receipts) {
    value_call!((), || {
        // SAFETY: `receipts` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(receipts) };
        Ok(())
    })
}

/// Returns the number of receipts, or 0 (and the last error) if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_count(receipts: *const mws_receipts) -> usize {
    // SAFETY: `receipts` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(receipts, "receipts") }?.inner.len()))
}

/// Encodes the receipts for transport (a rank sends them to the coordinator that
/// commits). Borrowed NUL-terminated string (built on first use), valid while
/// `receipts` lives; length to `*len` when not NULL. NULL if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_to_json(receipts: *const mws_receipts, len: *mut usize) -> *const c_char {
    value_call!(std::ptr::null(), || {
        // SAFETY: `receipts` is NULL or a live handle of this type (this function's contract).
        let r = unsafe { handle(receipts, "receipts") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        Ok(unsafe { r.json.get_or_init(|| CText::new(&mws::protocol::receipts_to_json(&r.inner))).lend(len) })
    })
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
    status_call!(|| {
        check_out(out, "out")?;
        if json.is_null() {
            return Err(Failure::null("json"));
        }
        // SAFETY: `json as *const u8` is NULL or valid for `len` reads during the call (this function's contract).
        let bytes = unsafe { slice_arg(json as *const u8, len, "json") }?;
        let r = mws::protocol::receipts_from_json(bytes)?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_receipts::new(r))) };
        Ok(())
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
    status_call!(|| {
        check_out(out, "out")?;
        // SAFETY: `list` is NULL or valid for `count` reads during the call (this function's contract).
        let items = unsafe { slice_arg(list, count, "list") }?;
        let mut all = Vec::new();
        for (i, r) in items.iter().enumerate() {
            // SAFETY: the pointer is NULL or valid for the call (this function's contract).
            let r = unsafe { r.as_ref() }.ok_or_else(|| Failure::null(&format!("list[{i}]")))?;
            all.extend(r.inner.iter().cloned());
        }
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_receipts::new(all))) };
        Ok(())
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
    status_call!(|| {
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        check_out(out, "out")?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_receipts::new(UploadReceipt::all_for(&p.inner)))) };
        Ok(())
    })
}
