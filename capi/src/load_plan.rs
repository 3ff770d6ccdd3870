//! `mws_load_plan_*`: restore plans (a stored manifest planned into a target
//! placement and bound to target bindings), planning limits and load statistics.

use crate::args::Caller;
use crate::args::{at, CText};
use crate::binding::mws_binding;
use crate::boundary::mws_status;
use crate::placement::mws_placement;
use crate::stored_manifest::mws_stored_manifest;
use mws::plan::load::PlanningLimits;
use mws::protocol::LoadPlan;
use std::ffi::c_char;
use std::sync::Arc;

/// A restore plan: the transfer regions that move a stored manifest into the target
/// buffers of the bound participants of a target placement.
///
/// Created by `mws_load_plan_new`, freed by `mws_load_plan_free`. Immutable: may be
/// used from several threads at once (each participant's `mws_store_load` may run
/// concurrently). It copies what it needs from the manifest, placement and bindings
/// (which may be freed afterwards) but records the bindings' buffer addresses: the
/// buffers must stay where they are until the loads ran.
pub struct mws_load_plan {
    pub(crate) inner: LoadPlan,
    pub(crate) participants: Vec<CText>,
}

handle!(mws_load_plan);

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
    status_call!(|c| {
        let m = c.handle(manifest, "manifest")?;
        let t = c.handle(target, "target")?;
        let out = c.out(out, "out")?;
        let built = c.handles(bindings, count, "bindings")?.iter().map(|b| b.build()).collect::<Result<Vec<_>, _>>()?;
        let l = planning_limits(c, limits);
        let plan = LoadPlan::plan(m.inner.clone(), Arc::new(t.inner.clone()), &built, l)?;
        let participants = plan.participants().into_iter().map(CText::new).collect();
        out.give_handle(mws_load_plan { inner: plan, participants })
    })
}

/// Frees a load plan. `NULL` does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `plan` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_free(plan: *mut mws_load_plan) {
    value_call!((), |c| c.free(plan))
}

/// Returns the number of transfer regions, or 0 (and the last error) if `plan` is
/// NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_region_count(plan: *const mws_load_plan) -> usize {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.inner.regions().len()))
}

/// Returns the bytes the plan moves, or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_total_bytes(plan: *const mws_load_plan) -> u64 {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.inner.total_bytes()))
}

/// Returns the number of target participants the plan loads (sorted ids via
/// `mws_load_plan_participant`), or 0 (and the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_load_plan_participant_count(plan: *const mws_load_plan) -> usize {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.participants.len()))
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
    value_call!(std::ptr::null(), |c| {
        let p = c.handle(plan, "plan")?;
        let t = at(&p.participants, index, "participant", |n| format!("plan has {n}"))?;
        Ok(c.lend(t, len))
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

/// The planning limits `limits` says: NULL or a zeroed field means the library default.
pub(crate) fn planning_limits(c: Caller<'_>, limits: *const mws_planning_limits) -> PlanningLimits {
    let d = PlanningLimits::default();
    let Some(l) = c.opt_struct(limits) else { return d };
    let or = |value: u64, default: u64| if value == 0 { default } else { value };
    PlanningLimits {
        max_transfer_regions: or(l.max_transfer_regions, d.max_transfer_regions),
        max_segments_per_region: or(l.max_segments_per_region, d.max_segments_per_region),
        max_total_lowered_segments: or(l.max_total_lowered_segments, d.max_total_lowered_segments),
    }
}
