//! `mws_load_plan_*`: restore plans (a stored manifest planned into a target
//! placement and bound to target bindings), planning limits and load statistics.

use crate::boundary::{mws_status, Failure};
use crate::handles::{handle, mws_binding, mws_load_plan, mws_placement, mws_stored_manifest, Handle};
use crate::strings::{check_out, slice_arg, write_out, CText};
use mws::plan::load::PlanningLimits;
use mws::protocol::LoadPlan;
use std::ffi::c_char;
use std::sync::Arc;

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
    /// Regions read whole by a store with native strided reads (embedded stores).
    pub strided_regions: u64,
    /// Regions read row by row as ranges straight into the target.
    pub direct_regions: u64,
    /// Regions read as one span into the staging buffer and scattered locally
    /// (chosen by the store's cost model).
    pub staged_regions: u64,
    /// Bytes read into the staging buffer (the staged spans, gaps included).
    pub staged_bytes: u64,
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
    status_call!(|| {
        // SAFETY: `manifest` is NULL or a live handle of this type (this function's contract).
        let m = unsafe { handle(manifest, "manifest") }?;
        // SAFETY: `target` is NULL or a live handle of this type (this function's contract).
        let t = unsafe { handle(target, "target") }?;
        check_out(out, "out")?;
        // SAFETY: `bindings` is NULL or valid for `count` reads during the call (this function's contract).
        let handles = unsafe { slice_arg(bindings, count, "bindings") }?;
        let mut built = Vec::with_capacity(handles.len());
        for (i, b) in handles.iter().enumerate() {
            // SAFETY: the pointer is NULL or valid for the call (this function's contract).
            let b = unsafe { b.as_ref() }.ok_or_else(|| Failure::null(&format!("bindings[{i}]")))?;
            built.push(b.build()?);
        }
        let mut l = PlanningLimits::default();
        // SAFETY: the pointer is NULL or valid for the call (this function's contract).
        if let Some(c) = unsafe { limits.as_ref() } {
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
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_load_plan { inner: plan, participants })) };
        Ok(())
    })
}

/// Frees a load plan. `NULL` does nothing.
///
/// # Safety
/// `plan` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_free(plan: *mut mws_load_plan) {
    value_call!((), || {
        // SAFETY: `plan` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(plan) };
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
    // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(plan, "plan") }?.inner.regions().len()))
}

/// Returns the bytes the plan moves, or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_total_bytes(plan: *const mws_load_plan) -> u64 {
    // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(plan, "plan") }?.inner.total_bytes()))
}

/// Returns the number of target participants the plan loads (sorted ids via
/// `mws_load_plan_participant`), or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_participant_count(plan: *const mws_load_plan) -> usize {
    // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
    value_call!(0, || Ok(unsafe { handle(plan, "plan") }?.participants.len()))
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
    value_call!(std::ptr::null(), || {
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        let t = p.participants.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "participant index {index} is out of range (the plan has {})",
                p.participants.len()
            ))
        })?;
        // SAFETY: `len` is NULL or valid for a write of `size_t` (this function's contract).
        Ok(unsafe { t.lend(len) })
    })
}

pub(crate) fn stats_out(s: mws::protocol::LoadStats) -> mws_load_stats {
    mws_load_stats {
        regions: s.regions,
        ranges: s.ranges,
        requests: s.requests,
        bytes: s.bytes,
        strided_regions: s.strided_regions,
        direct_regions: s.direct_regions,
        staged_regions: s.staged_regions,
        staged_bytes: s.staged_bytes,
    }
}
