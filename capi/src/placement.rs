//! `mws_placement`: a parsed, validated, immutable complete placement.

use crate::args::{at, CText, Lent, Texts};
use crate::boundary::mws_status;
use mws::Placement;
use std::ffi::c_char;
use std::sync::OnceLock;

/// A parsed and validated complete weight placement (address-free: tensors, topology,
/// and which participant holds which fragment of which tensor).
///
/// Created by `mws_placement_from_json`, freed by `mws_placement_free`. Immutable: every
/// function taking a `const mws_placement *` may be called from several threads at
/// once. Strings returned by its accessors are owned by the handle and stay valid until
/// it is freed.
pub struct mws_placement {
    pub(crate) inner: Placement,
    json: OnceLock<CText>,
    texts: Texts,
    fragments: Lent<mws_placement_fragment_info>,
}

impl mws_placement {
    pub(crate) fn new(inner: Placement) -> Self {
        let texts = Texts::default();
        let mut fragments = Vec::new();
        for part in inner.parts() {
            for f in part.fragments() {
                fragments.push(mws_placement_fragment_info {
                    placement_fragment_id: texts.ptr(f.placement_fragment_id()),
                    participant_id: texts.ptr(part.participant_id()),
                    tensor_id: texts.ptr(f.tensor_id()),
                    ndim: f.local_shape().len(),
                    global_offset: f.global_offset().as_ptr(),
                    local_shape: f.local_shape().as_ptr(),
                    nbytes: f.nbytes(),
                    // Tensors are sorted by id: a binary search, not a scan (n log n overall).
                    itemsize: inner.tensor(f.tensor_id()).map_or(0, |t| t.itemsize()),
                });
            }
        }
        mws_placement { json: OnceLock::new(), texts, fragments: Lent(fragments), inner }
    }
}

handle!(mws_placement);

/// One fragment of a placement, as returned by `mws_placement_fragment`. Every pointer
/// is borrowed from the placement handle and stays valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_placement_fragment_info {
    /// The fragment's wire `placement_fragment_id` (NUL-terminated).
    pub placement_fragment_id: *const c_char,
    /// The participant (placement part) that holds the fragment.
    pub participant_id: *const c_char,
    /// The tensor the fragment belongs to.
    pub tensor_id: *const c_char,
    /// Number of dimensions: length of `global_offset` and of `local_shape`.
    pub ndim: usize,
    /// Offset of the fragment's box in the tensor, in elements (`ndim` values).
    pub global_offset: *const u64,
    /// Shape of the fragment's box, in elements (`ndim` values).
    pub local_shape: *const u64,
    /// Size of the fragment in bytes (its contiguous row-major buffer).
    pub nbytes: u64,
    /// Size of one element of the tensor, in bytes.
    pub itemsize: u64,
}

/// Parses and validates a placement from its JSON wire form.
///
/// `json` points to `len` bytes of UTF-8 JSON (no NUL terminator needed; the bytes are
/// only read during the call). Duplicate object keys, unknown fields, NaN/Infinity,
/// inconsistent identities (`placement_id`, `topology_id`) and incomplete coverage are
/// rejected with `MWS_INVALID_ARGUMENT`.
///
/// On success writes a new handle to `*out`; the caller owns it and frees it with
/// `mws_placement_free`. On failure `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT` (`json` NULL with `len > 0`, or `out` NULL),
/// `MWS_INVALID_ARGUMENT` (malformed or invalid placement).
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_placement,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        out.give_handle(mws_placement::new(Placement::from_json(c.bytes(json, len, "json")?)?))
    })
}

/// Frees a placement handle. `NULL` does nothing. Every string borrowed from the
/// handle becomes invalid. Bindings and upload plans created with it do not borrow it
/// and stay valid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `placement` is NULL or a handle from `mws_placement_from_json` not yet freed; no
/// call starts on it once this returns.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_free(placement: *mut mws_placement) {
    value_call!((), |c| c.free(placement))
}

/// Returns the canonical JSON of the placement (sorted keys, compact, ASCII only; the
/// exact bytes its digest covers).
///
/// Ownership: the NUL-terminated string is borrowed from `placement` and valid until it
/// is freed. If `len` is not NULL, the length in bytes (without the NUL) is written
/// there. Returns NULL (and sets the last error) if `placement` is NULL.
///
/// # Safety
/// `placement` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_to_json(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.json.get_or_init(|| CText::new(&p.inner.to_json())))
}

/// Returns the placement id (`"sha256:<hex>"`). Borrowed string, as
/// `mws_placement_to_json`.
///
/// # Safety
/// As `mws_placement_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_id(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.texts.get(p.inner.placement_id()))
}

/// Returns the placement digest (64 lowercase hex characters, no prefix). Borrowed
/// string, as `mws_placement_to_json`.
///
/// # Safety
/// As `mws_placement_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_digest(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.texts.get(p.inner.digest()))
}

/// Returns the topology id (`"sha256:<hex>"`). Borrowed string, as
/// `mws_placement_to_json`.
///
/// # Safety
/// As `mws_placement_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_topology_id(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.texts.get(p.inner.topology().topology_id()))
}

/// Returns the resource id of the placement. Borrowed string, as
/// `mws_placement_to_json`.
///
/// # Safety
/// As `mws_placement_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_resource_id(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.texts.get(p.inner.resource_id()))
}

/// Returns the revision of the placement. Borrowed string, as `mws_placement_to_json`.
///
/// # Safety
/// As `mws_placement_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_revision(placement: *const mws_placement, len: *mut usize) -> *const c_char {
    text_call!(placement, "placement", len, |p| p.texts.get(p.inner.revision()))
}

/// Returns the weight generation of the placement, or 0 (and sets the last error) if
/// `placement` is NULL.
///
/// # Safety
/// `placement` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_weight_generation(placement: *const mws_placement) -> u64 {
    value_call!(0, |c| Ok(c.handle(placement, "placement")?.inner.weight_generation()))
}

/// Returns the number of participants of the placement's topology, or 0 (and sets the
/// last error) if `placement` is NULL.
///
/// # Safety
/// `placement` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_participant_count(placement: *const mws_placement) -> usize {
    value_call!(0, |c| Ok(c.handle(placement, "placement")?.inner.topology().participants().len()))
}

/// Returns the number of tensors of the placement, or 0 (and sets the last error) if
/// `placement` is NULL.
///
/// # Safety
/// `placement` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_tensor_count(placement: *const mws_placement) -> usize {
    value_call!(0, |c| Ok(c.handle(placement, "placement")?.inner.tensors().len()))
}

/// Returns the number of fragments of the placement, over all its parts, or 0 (and sets
/// the last error) if `placement` is NULL.
///
/// # Safety
/// `placement` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_fragment_count(placement: *const mws_placement) -> usize {
    value_call!(0, |c| Ok(c.handle(placement, "placement")?.fragments.len()))
}

/// Describes fragment `index` (0 <= index < `mws_placement_fragment_count`) into `*out`.
/// Fragments are ordered by participant id, then by placement fragment id (the
/// canonical order). The pointers written to `*out` are borrowed from `placement` and
/// valid until it is freed.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range; `*out` is not
/// written). Thread safety: may be called from any thread.
///
/// # Safety
/// `placement` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_fragment(
    placement: *const mws_placement,
    index: usize,
    out: *mut mws_placement_fragment_info,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(placement, "placement")?;
        let out = c.out(out, "out")?;
        let f = at(&p.fragments, index, "fragment", |n| format!("placement has {n} fragments"))?;
        out.give(*f)
    })
}
