//! `mws_stored_manifest` (a published revision) and `mws_load_plan` + `mws_store_load`
//! (the restore path).

use crate::boundary::{mws_status, Failure};
use crate::handles::{handle, lend_text, mws_store, mws_stored_manifest, Handle};
use crate::strings::{check_out, slice_arg, str_arg, write_out};
use mws::StoredManifest;
use std::ffi::c_char;
use std::sync::Arc;

/// One stored fragment, as returned by `mws_stored_manifest_fragment`. Every pointer
/// is borrowed from the manifest handle and valid until it is freed.
#[repr(C)]
pub struct mws_stored_fragment_info {
    /// Stored fragment id.
    pub fragment_id: *const c_char,
    /// The tensor it belongs to.
    pub tensor_id: *const c_char,
    /// The object holding its bytes.
    pub object_key: *const c_char,
    /// Offset of its first byte inside the object.
    pub object_offset: u64,
    /// Size in bytes (contiguous row-major box).
    pub nbytes: u64,
    /// Number of dimensions (length of `global_offset` and `local_shape`).
    pub ndim: usize,
    /// Offset of the box in the tensor, in elements.
    pub global_offset: *const u64,
    /// Shape of the box, in elements.
    pub local_shape: *const u64,
}

/// Reads and strictly decodes the manifest stored at `manifest_key` (for example
/// `mws_upload_plan_manifest_key` or `mws_stored_manifest_key` of a commit). New
/// handle in `*out` (free with `mws_stored_manifest_free`).
///
/// Errors: `MWS_NOT_FOUND` (no manifest at the key), `MWS_INVALID_MANIFEST` (invalid
/// document, wrong digest fields, key mismatch), `MWS_STORE`/`MWS_IO`.
///
/// # Safety
/// `store` is NULL or a live handle; `manifest_key` is NULL or NUL-terminated; `out` is
/// NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_from_store(
    store: *const mws_store,
    manifest_key: *const c_char,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `store` is NULL or a live handle of this type (this function's contract).
        let s = unsafe { handle(store, "store") }?;
        // SAFETY: `manifest_key` is NULL or a NUL-terminated string valid for the call (this function's contract).
        let key = unsafe { str_arg(manifest_key, "manifest_key") }?;
        check_out(out, "out")?;
        let m = s.ws.load_manifest(key)?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_stored_manifest::new(Arc::new(m)))) };
        Ok(())
    })
}

/// Decodes a stored manifest from its JSON (`len` bytes, read during the call), with
/// the same strict validation as `mws_stored_manifest_from_store`. New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (invalid document).
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call!(|| {
        check_out(out, "out")?;
        if json.is_null() {
            return Err(Failure::null("json"));
        }
        // SAFETY: `json as *const u8` is NULL or valid for `len` reads during the call (this function's contract).
        let bytes = unsafe { slice_arg(json as *const u8, len, "json") }?;
        let m = StoredManifest::from_json(bytes)?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_stored_manifest::new(Arc::new(m)))) };
        Ok(())
    })
}

/// Frees a stored manifest handle. `NULL` does nothing. Load plans made from it do
/// not borrow it and stay valid.
///
/// # Safety
/// `manifest` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_free(manifest: *mut mws_stored_manifest) {
    value_call!((), || {
        // SAFETY: `manifest` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(manifest) };
        Ok(())
    })
}

/// Returns the manifest JSON (the exact stored bytes its digest covers). Borrowed
/// NUL-terminated string valid until `manifest` is freed; length to `*len` when not
/// NULL. NULL (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_to_json(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.json) }
}

/// Returns the manifest digest (64 lowercase hex). Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_digest(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.digest) }
}

/// Returns the key the manifest is stored at. Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_key(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.key) }
}

/// Returns the group id of the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_group_id(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.group_id) }
}

/// Returns the store namespace of the revision. Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_namespace(
    m: *const mws_stored_manifest,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.namespace) }
}

/// Returns the resource id. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_resource_id(
    m: *const mws_stored_manifest,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.resource_id) }
}

/// Returns the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_revision(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    // SAFETY: forwards this accessor's contract: the handle is NULL or live, `len` is NULL or writable.
    unsafe { lend_text(function_name!(), m, "manifest", len, |m| &m.revision) }
}

/// Returns the weight generation, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_weight_generation(m: *const mws_stored_manifest) -> u64 {
    // SAFETY: `m` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(m, "manifest") }?.inner.weight_generation()))
}

/// Returns the number of tensors, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_tensor_count(m: *const mws_stored_manifest) -> usize {
    // SAFETY: `m` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(m, "manifest") }?.inner.tensors().len()))
}

/// Returns the number of stored fragments, or 0 (and the last error) if `manifest`
/// is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_fragment_count(m: *const mws_stored_manifest) -> usize {
    // SAFETY: `m` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(m, "manifest") }?.fragments.len()))
}

/// Returns the sum of the stored fragments' sizes in bytes, or 0 (and the last
/// error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_total_bytes(m: *const mws_stored_manifest) -> u64 {
    // SAFETY: `m` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || { Ok(unsafe { handle(m, "manifest") }?.fragments.iter().map(|f| f.nbytes).sum()) })
}

/// Describes stored fragment `index` (manifest order) into `*out`; pointers borrowed
/// from `manifest`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range).
///
/// # Safety
/// `manifest` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_fragment(
    m: *const mws_stored_manifest,
    index: usize,
    out: *mut mws_stored_fragment_info,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `m` is NULL or a live handle of this type (this function's contract).
        let m = unsafe { handle(m, "manifest") }?;
        check_out(out, "out")?;
        let f = m.fragments.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "fragment index {index} is out of range (the manifest has {} fragments)",
                m.fragments.len()
            ))
        })?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe {
            write_out(
                out,
                mws_stored_fragment_info {
                    fragment_id: f.fragment_id.as_ptr(),
                    tensor_id: f.tensor_id.as_ptr(),
                    object_key: f.object_key.as_ptr(),
                    object_offset: f.object_offset,
                    nbytes: f.nbytes,
                    ndim: f.local_shape.len(),
                    global_offset: f.global_offset.as_ptr(),
                    local_shape: f.local_shape.as_ptr(),
                },
            )
        };
        Ok(())
    })
}
