//! `mws_stored_manifest` (a published revision) and `mws_load_plan` + `mws_store_load`
//! (the restore path).

use std::ffi::c_char;
use std::sync::Arc;

use super::binding::mws_binding;
use super::boundary::{status_call, value_call, Failure};
use super::mws_status;
use super::placement::mws_placement;
use super::store::{io_args, mws_io_args, mws_store};
use super::strings::{check_out, handle, slice_arg, str_arg, write_out, CText};
use crate::plan::load::PlanningLimits;
use crate::protocol::{LoadArgs, LoadPlan};
use crate::StoredManifest;

struct StoredFragmentView {
    fragment_id: CText,
    tensor_id: CText,
    object_key: CText,
    object_offset: u64,
    nbytes: u64,
    global_offset: Vec<u64>,
    local_shape: Vec<u64>,
}

/// A stored manifest: the published, immutable description of one weight revision
/// (tensors, stored fragments, object keys).
///
/// Created by `mws_store_load_manifest`, `mws_stored_manifest_from_json`,
/// `mws_store_commit` and `mws_writer_commit`; freed by `mws_stored_manifest_free`.
/// Immutable: may be used from several threads at once. Strings returned by its
/// accessors are borrowed from the handle and valid until it is freed.
pub struct mws_stored_manifest {
    pub(crate) inner: Arc<StoredManifest>,
    json: CText,
    digest: CText,
    key: CText,
    group_id: CText,
    namespace: CText,
    resource_id: CText,
    revision: CText,
    fragments: Vec<StoredFragmentView>,
}

impl mws_stored_manifest {
    pub(crate) fn new(inner: Arc<StoredManifest>) -> Self {
        let fragments = inner
            .fragments()
            .iter()
            .map(|f| StoredFragmentView {
                fragment_id: CText::new(f.fragment_id()),
                tensor_id: CText::new(f.tensor_id()),
                object_key: CText::new(f.object_key()),
                object_offset: f.object_offset(),
                nbytes: f.nbytes(),
                global_offset: f.global_offset().to_vec(),
                local_shape: f.local_shape().to_vec(),
            })
            .collect();
        mws_stored_manifest {
            json: CText::new(&inner.to_json()),
            digest: CText::new(inner.manifest_digest()),
            key: CText::new(inner.manifest_key()),
            group_id: CText::new(inner.group_id()),
            namespace: CText::new(inner.namespace()),
            resource_id: CText::new(inner.resource_id()),
            revision: CText::new(inner.revision()),
            fragments,
            inner,
        }
    }
}

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
pub unsafe extern "C" fn mws_store_load_manifest(
    store: *const mws_store,
    manifest_key: *const c_char,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call("mws_store_load_manifest", || {
        let s = handle(store, "store")?;
        let key = str_arg(manifest_key, "manifest_key")?;
        check_out(out, "out")?;
        let m = s.ws.load_manifest(key)?;
        write_out(out, Box::into_raw(Box::new(mws_stored_manifest::new(Arc::new(m)))));
        Ok(())
    })
}

/// Decodes a stored manifest from its JSON (`len` bytes, read during the call), with
/// the same strict validation as `mws_store_load_manifest`. New handle in `*out`.
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
    status_call("mws_stored_manifest_from_json", || {
        check_out(out, "out")?;
        if json.is_null() {
            return Err(Failure::null("json"));
        }
        let bytes = slice_arg(json as *const u8, len, "json")?;
        let m = StoredManifest::from_json(bytes)?;
        write_out(out, Box::into_raw(Box::new(mws_stored_manifest::new(Arc::new(m)))));
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
    value_call("mws_stored_manifest_free", (), || {
        if !manifest.is_null() {
            drop(Box::from_raw(manifest));
        }
        Ok(())
    })
}

unsafe fn lend_m(
    function: &'static str,
    m: *const mws_stored_manifest,
    len: *mut usize,
    pick: impl FnOnce(&mws_stored_manifest) -> &CText,
) -> *const c_char {
    value_call(function, std::ptr::null(), || Ok(pick(handle(m, "manifest")?).lend(len)))
}

/// Returns the manifest JSON (the exact stored bytes its digest covers). Borrowed
/// NUL-terminated string valid until `manifest` is freed; length to `*len` when not
/// NULL. NULL (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_to_json(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    lend_m("mws_stored_manifest_to_json", m, len, |m| &m.json)
}

/// Returns the manifest digest (64 lowercase hex). Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_digest(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    lend_m("mws_stored_manifest_digest", m, len, |m| &m.digest)
}

/// Returns the key the manifest is stored at. Borrowed, as
/// `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_key(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    lend_m("mws_stored_manifest_key", m, len, |m| &m.key)
}

/// Returns the group id of the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_group_id(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    lend_m("mws_stored_manifest_group_id", m, len, |m| &m.group_id)
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
    lend_m("mws_stored_manifest_namespace", m, len, |m| &m.namespace)
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
    lend_m("mws_stored_manifest_resource_id", m, len, |m| &m.resource_id)
}

/// Returns the revision. Borrowed, as `mws_stored_manifest_to_json`.
///
/// # Safety
/// As `mws_stored_manifest_to_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_revision(m: *const mws_stored_manifest, len: *mut usize) -> *const c_char {
    lend_m("mws_stored_manifest_revision", m, len, |m| &m.revision)
}

/// Returns the weight generation, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_weight_generation(m: *const mws_stored_manifest) -> u64 {
    value_call("mws_stored_manifest_weight_generation", 0, || Ok(handle(m, "manifest")?.inner.weight_generation()))
}

/// Returns the number of tensors, or 0 (and the last error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_tensor_count(m: *const mws_stored_manifest) -> usize {
    value_call("mws_stored_manifest_tensor_count", 0, || Ok(handle(m, "manifest")?.inner.tensors().len()))
}

/// Returns the number of stored fragments, or 0 (and the last error) if `manifest`
/// is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_fragment_count(m: *const mws_stored_manifest) -> usize {
    value_call("mws_stored_manifest_fragment_count", 0, || Ok(handle(m, "manifest")?.fragments.len()))
}

/// Returns the sum of the stored fragments' sizes in bytes, or 0 (and the last
/// error) if `manifest` is NULL.
///
/// # Safety
/// `manifest` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_stored_manifest_total_bytes(m: *const mws_stored_manifest) -> u64 {
    value_call("mws_stored_manifest_total_bytes", 0, || {
        Ok(handle(m, "manifest")?.fragments.iter().map(|f| f.nbytes).sum())
    })
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
    status_call("mws_stored_manifest_fragment", || {
        let m = handle(m, "manifest")?;
        check_out(out, "out")?;
        let f = m.fragments.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "fragment index {index} is out of range (the manifest has {} fragments)",
                m.fragments.len()
            ))
        })?;
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
        );
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// Load plans
// ---------------------------------------------------------------------------------

/// Fail-closed bounds on planning work. A zeroed field means the library default
/// (64Mi regions, 2^32 segments per region, 2^40 segments in all).
#[repr(C)]
pub struct mws_planning_limits {
    /// Max transfer regions in a plan.
    pub max_transfer_regions: u64,
    /// Max segments of one region.
    pub max_segments_per_region: u64,
    /// Max segments over the plan.
    pub max_total_lowered_segments: u64,
}

/// What one `mws_store_load` call moved.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_load_stats {
    /// Transfer regions executed.
    pub regions: u64,
    /// Ranged reads issued.
    pub ranges: u64,
    /// Backend requests (batches).
    pub requests: u64,
    /// Bytes copied into the target buffers.
    pub bytes: u64,
}

/// A restore plan: the transfer regions that move a stored manifest into the target
/// buffers of the bound participants of a target placement.
///
/// Created by `mws_load_plan_new`, freed by `mws_load_plan_free`. Immutable: may be
/// used from several threads at once (each participant's `mws_store_load` may run
/// concurrently). It copies what it needs from the manifest, placement and bindings
/// (which may be freed afterwards) but records the bindings' buffer addresses: the
/// buffers must stay where they are until the loads ran.
pub struct mws_load_plan {
    inner: LoadPlan,
    participants: Vec<CText>,
}

/// Plans the restore of `manifest` into `target`, for the `count` participants whose
/// bindings are given (all participants, or a subset: each rank of a multi-process
/// job plans its own part). Pure: no store I/O. `limits` may be NULL (defaults).
///
/// New handle in `*out` (free with `mws_load_plan_free`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING` (a binding does not pair with
/// `target`, duplicates, empty set), `MWS_INVALID_ARGUMENT` (revision or tensor set
/// mismatch, incompatible layouts, uncovered target), `MWS_INVALID_MANIFEST`,
/// `MWS_LIMIT_EXCEEDED`.
///
/// # Safety
/// `manifest`/`target` are NULL or live; `bindings` points to `count` pointers that are
/// NULL or live handles; `limits` is NULL or valid; `out` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_new(
    manifest: *const mws_stored_manifest,
    target: *const mws_placement,
    bindings: *const *const mws_binding,
    count: usize,
    limits: *const mws_planning_limits,
    out: *mut *mut mws_load_plan,
) -> mws_status {
    status_call("mws_load_plan_new", || {
        let m = handle(manifest, "manifest")?;
        let t = handle(target, "target")?;
        check_out(out, "out")?;
        let handles = slice_arg(bindings, count, "bindings")?;
        let mut built = Vec::with_capacity(handles.len());
        for (i, b) in handles.iter().enumerate() {
            let b = b.as_ref().ok_or_else(|| Failure::null(&format!("bindings[{i}]")))?;
            built.push(b.build()?);
        }
        let mut l = PlanningLimits::default();
        if let Some(c) = limits.as_ref() {
            if c.max_transfer_regions != 0 {
                l.max_transfer_regions = c.max_transfer_regions;
            }
            if c.max_segments_per_region != 0 {
                l.max_segments_per_region = c.max_segments_per_region;
            }
            if c.max_total_lowered_segments != 0 {
                l.max_total_lowered_segments = c.max_total_lowered_segments;
            }
        }
        let plan = LoadPlan::plan(m.inner.clone(), Arc::new(t.inner.clone()), &built, l)?;
        let participants = plan.participants().into_iter().map(CText::new).collect();
        write_out(out, Box::into_raw(Box::new(mws_load_plan { inner: plan, participants })));
        Ok(())
    })
}

/// Frees a load plan. `NULL` does nothing.
///
/// # Safety
/// `plan` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_free(plan: *mut mws_load_plan) {
    value_call("mws_load_plan_free", (), || {
        if !plan.is_null() {
            drop(Box::from_raw(plan));
        }
        Ok(())
    })
}

/// Returns the number of transfer regions, or 0 (and the last error) if `plan` is
/// NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_region_count(plan: *const mws_load_plan) -> usize {
    value_call("mws_load_plan_region_count", 0, || Ok(handle(plan, "plan")?.inner.regions().len()))
}

/// Returns the bytes the plan moves, or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_total_bytes(plan: *const mws_load_plan) -> u64 {
    value_call("mws_load_plan_total_bytes", 0, || Ok(handle(plan, "plan")?.inner.total_bytes()))
}

/// Returns the number of target participants the plan loads (sorted ids via
/// `mws_load_plan_participant`), or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_participant_count(plan: *const mws_load_plan) -> usize {
    value_call("mws_load_plan_participant_count", 0, || Ok(handle(plan, "plan")?.participants.len()))
}

/// Returns target participant `index` (sorted order). Borrowed NUL-terminated string
/// valid until `plan` is freed; length to `*len` when not NULL. NULL (and the last
/// error) if `plan` is NULL or `index` is out of range.
///
/// # Safety
/// `plan` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_participant(
    plan: *const mws_load_plan,
    index: usize,
    len: *mut usize,
) -> *const c_char {
    value_call("mws_load_plan_participant", std::ptr::null(), || {
        let p = handle(plan, "plan")?;
        let t = p.participants.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "participant index {index} is out of range (the plan has {})",
                p.participants.len()
            ))
        })?;
        Ok(t.lend(len))
    })
}

fn stats_out(s: crate::protocol::LoadStats) -> mws_load_stats {
    mws_load_stats { regions: s.regions, ranges: s.ranges, requests: s.requests, bytes: s.bytes }
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
/// a copy path), `MWS_STORE`/`MWS_IO`, `MWS_LIMIT_EXCEEDED`.
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
    status_call("mws_store_load", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        let b = handle(binding, "binding")?;
        let a = io_args(args)?;
        let rb = b.build().map_err(|f| {
            Failure::new(mws_status::MWS_INVALID_BINDING, format!("invalid target runtime binding: {}", f.message))
        })?;
        let lease = a.lease.map(|l| l.for_store(&s.ws)).transpose()?;
        let la = LoadArgs {
            worker_id: a.worker_id,
            guard: Some(&*a.guard),
            transfer_id: a.transfer_id,
            skip_committed_check: false,
            lease: lease.as_deref(),
        };
        let st = s.ws.load(&p.inner, &rb, la)?;
        if !stats.is_null() {
            write_out(stats, stats_out(st));
        }
        Ok(())
    })
}
