//! `mws_stored_manifest` (a published revision) and `mws_load_plan` + `mws_store_load`
//! (the restore path).

use crate::args::{at, CText, Lent, Texts};
use crate::boundary::mws_status;
use crate::store::mws_store;
use mws::StoredManifest;
use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

/// A stored manifest: the published, immutable description of one weight revision
/// (tensors, stored fragments, object keys).
///
/// Created by `mws_stored_manifest_from_store`, `mws_stored_manifest_from_json`,
/// `mws_store_commit` and `mws_writer_commit`; freed by `mws_stored_manifest_free`.
/// Immutable: may be used from several threads at once. Strings returned by its
/// accessors are borrowed from the handle and valid until it is freed.
pub struct mws_stored_manifest {
    pub(crate) inner: Arc<StoredManifest>,
    json: OnceLock<CText>,
    texts: Texts,
    fragments: Lent<mws_stored_fragment_info>,
}

impl mws_stored_manifest {
    pub(crate) fn new(inner: Arc<StoredManifest>) -> Self {
        let texts = Texts::default();
        let fragments = inner
            .fragments()
            .iter()
            .map(|f| mws_stored_fragment_info {
                fragment_id: texts.ptr(f.fragment_id()),
                tensor_id: texts.ptr(f.tensor_id()),
                object_key: texts.ptr(f.object_key()),
                object_offset: f.object_offset(),
                nbytes: f.nbytes(),
                ndim: f.local_shape().len(),
                global_offset: f.global_offset().as_ptr(),
                local_shape: f.local_shape().as_ptr(),
            })
            .collect();
        mws_stored_manifest { json: OnceLock::new(), texts, fragments: Lent(fragments), inner }
    }
}

handle!(mws_stored_manifest);

/// One stored fragment, as returned by `mws_stored_manifest_fragment`. Every pointer
/// is borrowed from the manifest handle and valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
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
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let key = c.str(manifest_key, "manifest_key")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_stored_manifest::new(Arc::new(s.ws.load_manifest(key)?)))
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
    status_call!(|c| {
        let out = c.out(out, "out")?;
        out.give_handle(mws_stored_manifest::new(Arc::new(StoredManifest::from_json(c.bytes(json, len, "json")?)?)))
    })
}

/// Frees a stored manifest handle. `NULL` does nothing. Load plans made from it do
/// not borrow it and stay valid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `manifest` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_free(manifest: *mut mws_stored_manifest) {
    value_call!((), |c| c.free(manifest))
}

/// Returns the manifest JSON (the exact stored bytes its digest covers). Borrowed
/// NUL-terminated string valid until `manifest` is freed; length to `*len` when not
/// NULL. NULL (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_to_json(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    text_call!(m, "manifest", len, |m| m.json.get_or_init(|| CText::new(&m.inner.to_json())))
}

/// Returns the manifest digest (64 lowercase hex). Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_digest(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.manifest_digest()))
}

/// Returns the key the manifest is stored at. Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_key(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.manifest_key()))
}

/// Returns the group id of the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_group_id(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.group_id()))
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
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.namespace()))
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
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.resource_id()))
}

/// Returns the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_revision(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    text_call!(m, "manifest", len, |m| m.texts.get(m.inner.revision()))
}

/// Returns the weight generation, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_weight_generation(m: *const mws_stored_manifest) -> u64 {
    value_call!(0, |c| Ok(c.handle(m, "manifest")?.inner.weight_generation()))
}

/// Returns the number of tensors, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_tensor_count(m: *const mws_stored_manifest) -> usize {
    value_call!(0, |c| Ok(c.handle(m, "manifest")?.inner.tensors().len()))
}

/// Returns the number of stored fragments, or 0 (and the last error) if `manifest`
/// is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_fragment_count(m: *const mws_stored_manifest) -> usize {
    value_call!(0, |c| Ok(c.handle(m, "manifest")?.fragments.len()))
}

/// Returns the sum of the stored fragments' sizes in bytes, or 0 (and the last
/// error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_total_bytes(m: *const mws_stored_manifest) -> u64 {
    value_call!(0, |c| Ok(c.handle(m, "manifest")?.fragments.iter().map(|f| f.nbytes).sum()))
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
    status_call!(|c| {
        let m = c.handle(m, "manifest")?;
        let out = c.out(out, "out")?;
        let f = at(&m.fragments, index, "fragment", |n| format!("manifest has {n} fragments"))?;
        out.give(*f)
    })
}
