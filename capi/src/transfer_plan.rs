//! `mws_transfer_plan`: logical and bound live-transfer plans (placement ->
//! placement), with accessors for every region and every bound operation so that an
//! outside executor (for example a serving engine's own Transfer Engine hook) can
//! execute a plan itself.

use crate::args::{CText, Caller, Lent, Texts};
use crate::binding::{bindings_arg, mws_binding};
use crate::placement::mws_placement;
use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::load_plan::{mws_planning_limits, planning_limits};
use mws::model::ParallelRank;
use mws::plan::region::TransferRegion;
use mws::plan::transfer::{LogicalTransferPlan, SourceRouting};
use mws::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};

/// A side of a transfer (`mws_transfer_plan_executor_count`, ...).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_transfer_side {
    /// The running instance that holds the weights.
    MWS_SIDE_SOURCE = 0,
    /// The running instance that receives them.
    MWS_SIDE_TARGET = 1,
}

/// Which complete source DP replica each target participant reads
/// (`mws_transfer_plan_new_routed`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_source_routing {
    /// The reference's routing: a target participant of DP rank `d` reads complete
    /// source replica `R[d mod len(R)]` (a target with one DP replica reads everything
    /// from one source replica). What `mws_transfer_plan_new` does.
    MWS_SOURCE_ROUTING_TARGET_DP = 0,
    /// A target participant reads `R[i mod len(R)]`, `i` its rank's index in the
    /// target grid (dp, pp, ep, tp order): the targets of one DP replica spread over
    /// every complete source replica. Deterministic; not in the reference (plans
    /// differ from the reference's whenever there are two or more complete replicas).
    MWS_SOURCE_ROUTING_SPREAD_TARGETS = 1,
}

/// The routing of an `mws_source_routing` value (the table is in the C enum's order).
fn routing_arg(routing: u32) -> FfiResult<SourceRouting> {
    let all = [SourceRouting::TargetDp, SourceRouting::SpreadTargets];
    all.get(routing as usize).copied().ok_or_else(|| Failure::invalid(format!("invalid source routing: {routing}")))
}

/// The side of an `mws_transfer_side` value (the table is in the C enum's order).
fn side_arg(side: u32) -> FfiResult<Side> {
    let all = [Side::Source, Side::Target];
    all.get(side as usize).copied().ok_or_else(|| Failure::invalid(format!("invalid executor side: {side}")))
}

/// One logical region (`mws_transfer_plan_region`). Strings and arrays are borrowed
/// from the plan handle and stay valid until it is freed.
///
/// Segment `(i_0..i_k)` (row-major over `outer_loop_counts`, `outer_ndim` = k+1
/// values, possibly 0) copies `inner_bytes` from source fragment offset
/// `source_base_offset + Σ i_j*source_strides[j]` to target fragment offset
/// `target_base_offset + Σ i_j*target_strides[j]` (offsets in the fragments'
/// contiguous row-major layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_transfer_region_info {
    /// Tensor id.
    pub tensor_id: *const c_char,
    /// Source participant.
    pub source_participant_id: *const c_char,
    /// Source placement fragment id.
    pub source_placement_fragment_id: *const c_char,
    /// Target participant.
    pub target_participant_id: *const c_char,
    /// Target placement fragment id.
    pub target_placement_fragment_id: *const c_char,
    /// Offset of the first segment in the source fragment.
    pub source_base_offset: u64,
    /// Offset of the first segment in the target fragment.
    pub target_base_offset: u64,
    /// Length of one segment.
    pub inner_bytes: u64,
    /// Number of outer loops.
    pub outer_ndim: usize,
    /// Outer loop extents (`outer_ndim` values; NULL when 0).
    pub outer_loop_counts: *const u64,
    /// Source byte strides of the outer loops.
    pub source_strides: *const u64,
    /// Target byte strides of the outer loops.
    pub target_strides: *const u64,
    /// Product of the loop extents (1 when none).
    pub segment_count: u64,
    /// `inner_bytes * segment_count`.
    pub total_bytes: u64,
}

/// One side of a bound operation (`mws_transfer_operation_info`). `address` and
/// `storage_address` are the absolute, in-process addresses of the runtime fragment
/// (never serialized); `address_offset` is the region's base offset in the fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_transfer_endpoint_info {
    /// Participant.
    pub participant_id: *const c_char,
    /// Instance of the binding.
    pub instance_id: *const c_char,
    /// Lease of the binding.
    pub lease_id: *const c_char,
    /// Lease generation of the binding.
    pub lease_generation: u64,
    /// Worker.
    pub worker_id: *const c_char,
    /// Transfer Engine endpoint (segment name).
    pub endpoint: *const c_char,
    /// Device name.
    pub device: *const c_char,
    /// Runtime fragment id.
    pub fragment_id: *const c_char,
    /// Placement fragment id.
    pub placement_fragment_id: *const c_char,
    /// First byte of the fragment view.
    pub address: u64,
    /// Offset of the first segment from `address`.
    pub address_offset: u64,
    /// Start of the fragment's allocation.
    pub storage_address: u64,
    /// Size of the fragment's allocation.
    pub storage_nbytes: u64,
    /// `storage_offset_bytes + address_offset`: the first segment from `storage_address`.
    pub storage_offset: u64,
}

/// One bound operation (`mws_transfer_plan_operation`): the region and both sides.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_transfer_operation_info {
    /// The region geometry.
    pub region: mws_transfer_region_info,
    /// The source side.
    pub source: mws_transfer_endpoint_info,
    /// The target side.
    pub target: mws_transfer_endpoint_info,
}

/// One executor (`mws_transfer_plan_executor`). For a logical plan the instance,
/// lease and worker are NULL and `lease_generation` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_transfer_executor_info {
    /// Participant.
    pub participant_id: *const c_char,
    /// Instance (bound plans).
    pub instance_id: *const c_char,
    /// Lease id (bound plans).
    pub lease_id: *const c_char,
    /// Worker (bound plans).
    pub worker_id: *const c_char,
    /// Lease generation of the binding (bound plans).
    pub lease_generation: u64,
    /// Rank: data parallel.
    pub dp: u64,
    /// Rank: pipeline parallel.
    pub pp: u64,
    /// Rank: expert parallel.
    pub ep: u64,
    /// Rank: tensor parallel.
    pub tp: u64,
    /// Ascending operation indices of this executor.
    pub operation_indices: *const u32,
    /// Number of operation indices.
    pub operation_count: usize,
}

/// A live-transfer plan: logical (address-free) or bound to runtime bindings.
///
/// Created by `mws_transfer_plan_new`, `mws_transfer_plan_from_json` or
/// `mws_transfer_plan_bind`; freed by `mws_transfer_plan_free`. Immutable; copies
/// everything it needs (placements and bindings may be freed after creation).
/// Strings and arrays returned by accessors are owned by the handle.
///
/// Thread safety: every function taking a `const mws_transfer_plan *` may run
/// concurrently.
pub struct mws_transfer_plan {
    pub(crate) logical: LogicalTransferPlan,
    pub(crate) bound: Option<TransferPlan>,
    regions: Lent<mws_transfer_region_info>,
    operations: Lent<mws_transfer_operation_info>,
    executors: [Lent<mws_transfer_executor_info>; 2],
    _texts: Texts,
    json: OnceLock<CText>,
}

handle!(mws_transfer_plan);

fn region_info(s: &Texts, l: &LogicalTransferPlan, r: &TransferRegion) -> mws_transfer_region_info {
    let arr = |v: &Vec<u64>| if v.is_empty() { std::ptr::null() } else { v.as_ptr() };
    mws_transfer_region_info {
        tensor_id: s.ptr(l.target_of(r).tensor_id()),
        source_participant_id: s.ptr(l.source_participant_of(r)),
        source_placement_fragment_id: s.ptr(l.source_of(r).placement_fragment_id()),
        target_participant_id: s.ptr(l.target_participant_of(r)),
        target_placement_fragment_id: s.ptr(l.target_of(r).placement_fragment_id()),
        source_base_offset: r.source_base_offset,
        target_base_offset: r.target_base_offset,
        inner_bytes: r.inner_bytes,
        outer_ndim: r.outer_loop_counts.len(),
        outer_loop_counts: arr(&r.outer_loop_counts),
        source_strides: arr(&r.source_strides),
        target_strides: arr(&r.target_strides),
        segment_count: r.segment_count(),
        total_bytes: r.total_bytes(),
    }
}

fn endpoint_info(s: &Texts, p: &TransferPlan, i: usize, side: Side) -> mws_transfer_endpoint_info {
    let (b, f) = p.operation_fragment(i, side);
    let r = &p.regions()[i];
    let off = if side == Side::Source { r.source_base_offset } else { r.target_base_offset };
    mws_transfer_endpoint_info {
        participant_id: s.ptr(b.participant_id()),
        instance_id: s.ptr(b.instance_id()),
        lease_id: s.ptr(b.lease_id()),
        lease_generation: b.lease_generation(),
        worker_id: s.ptr(f.worker_id()),
        endpoint: s.ptr(f.endpoint()),
        device: s.ptr(f.device()),
        fragment_id: s.ptr(f.fragment_id()),
        placement_fragment_id: s.ptr(f.placement_fragment_id()),
        address: f.address(),
        address_offset: off,
        storage_address: f.storage_address(),
        storage_nbytes: f.storage_nbytes(),
        storage_offset: f.storage_offset_bytes() + off,
    }
}

/// One executor: `bound` (instance, lease, worker, lease generation) for a bound plan's.
fn executor_info(
    s: &Texts,
    participant_id: &str,
    rank: ParallelRank,
    operation_indices: &[u32],
    bound: Option<&ExecutorTransferPlan>,
) -> mws_transfer_executor_info {
    let text = |f: fn(&ExecutorTransferPlan) -> &str| bound.map_or(std::ptr::null(), |e| s.ptr(f(e)));
    mws_transfer_executor_info {
        participant_id: s.ptr(participant_id),
        instance_id: text(|e| &e.instance_id),
        lease_id: text(|e| &e.runtime_lease_id),
        worker_id: text(|e| &e.worker_id),
        lease_generation: bound.map_or(0, |e| e.lease_generation),
        dp: rank.dp,
        pp: rank.pp,
        ep: rank.ep,
        tp: rank.tp,
        operation_indices: operation_indices.as_ptr(),
        operation_count: operation_indices.len(),
    }
}

impl mws_transfer_plan {
    pub(crate) fn new(logical: LogicalTransferPlan, bound: Option<TransferPlan>) -> mws_transfer_plan {
        let s = Texts::default();
        let regions: Vec<_> = logical.regions().iter().map(|r| region_info(&s, &logical, r)).collect();
        let executors = [Side::Source, Side::Target].map(|side| {
            Lent(match &bound {
                None => {
                    let list =
                        if side == Side::Source { logical.source_executors() } else { logical.target_executors() };
                    list.iter()
                        .map(|e| executor_info(&s, &e.participant_id, e.rank, &e.operation_indices, None))
                        .collect()
                }
                Some(p) => p
                    .executors(side)
                    .iter()
                    .map(|e| executor_info(&s, &e.participant_id, e.rank, &e.operation_indices, Some(e)))
                    .collect(),
            })
        });
        let operations = match &bound {
            None => Vec::new(),
            Some(p) => (regions.iter().enumerate())
                .map(|(i, region)| mws_transfer_operation_info {
                    region: *region,
                    source: endpoint_info(&s, p, i, Side::Source),
                    target: endpoint_info(&s, p, i, Side::Target),
                })
                .collect(),
        };
        let (regions, operations) = (Lent(regions), Lent(operations));
        mws_transfer_plan { logical, bound, regions, operations, executors, _texts: s, json: OnceLock::new() }
    }

    /// The bound plan, or `MWS_INVALID_ARGUMENT` for a logical one.
    pub(crate) fn bound(&self) -> FfiResult<&TransferPlan> {
        self.bound.as_ref().ok_or_else(|| Failure::invalid("the transfer plan is not bound to runtime bindings"))
    }
}

/// Plans a live reshard of `source` into `target` (`plan_placement_transfer`), or
/// into the one target participant `target_participant_id` when it is not NULL
/// (`plan_placement_transfer_to_local_target`). `limits` NULL (or a zeroed field)
/// means the library defaults. Pure: no I/O, no addresses. On success writes a new logical plan to `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT`
/// (identity, tensor sets, descriptors, unknown participant, coverage),
/// `MWS_LIMIT_EXCEEDED`.
///
/// # Safety
/// Handles are NULL or live; `target_participant_id` is NULL or NUL-terminated;
/// `limits` is NULL or valid; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_new(
    source: *const mws_placement,
    target: *const mws_placement,
    target_participant_id: *const c_char,
    limits: *const mws_planning_limits,
    out: *mut *mut mws_transfer_plan,
) -> mws_status {
    status_call!(|c| plan(c, source, target, target_participant_id, limits, Ok(SourceRouting::TargetDp), out))
}

/// As `mws_transfer_plan_new`, with the source replica routing `routing` (a
/// `mws_source_routing` value). `MWS_SOURCE_ROUTING_TARGET_DP` gives exactly what
/// `mws_transfer_plan_new` gives; `MWS_SOURCE_ROUTING_SPREAD_TARGETS` spreads the
/// target participants over the complete source DP replicas. The routing travels with
/// the plan's JSON (`"source_routing"`, present only when not the reference's), so
/// `mws_transfer_plan_from_json` re-plans with it.
///
/// Errors: those of `mws_transfer_plan_new`; `MWS_INVALID_ARGUMENT` for an unknown
/// `routing`.
///
/// # Safety
/// As `mws_transfer_plan_new`.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_new_routed(
    source: *const mws_placement,
    target: *const mws_placement,
    target_participant_id: *const c_char,
    limits: *const mws_planning_limits,
    routing: u32,
    out: *mut *mut mws_transfer_plan,
) -> mws_status {
    status_call!(|c| plan(c, source, target, target_participant_id, limits, routing_arg(routing), out))
}

/// `mws_transfer_plan_new(_routed)` inside the boundary (`routing`: the routing
/// argument, checked after the handles, `out` and the participant).
fn plan(
    c: Caller<'_>,
    source: *const mws_placement,
    target: *const mws_placement,
    target_participant_id: *const c_char,
    limits: *const mws_planning_limits,
    routing: FfiResult<SourceRouting>,
    out: *mut *mut mws_transfer_plan,
) -> FfiResult<()> {
    let s = c.handle(source, "source")?;
    let t = c.handle(target, "target")?;
    let out = c.out(out, "out")?;
    let participant = c.opt_str(target_participant_id, "target_participant_id")?;
    let routing = routing?;
    let limits = planning_limits(c, limits);
    let (sp, tp) = (Arc::new(s.inner.clone()), Arc::new(t.inner.clone()));
    let logical = match participant {
        None => LogicalTransferPlan::plan_routed(sp, tp, limits, routing)?,
        Some(p) => LogicalTransferPlan::plan_local_routed(sp, tp, Some(p), limits, routing)?,
    };
    out.give_handle(mws_transfer_plan::new(logical, None))
}

/// Binds the logical plan `plan` to `n_targets` target and `n_sources` source
/// bindings (`bind_logical_transfer_plan`; bindings of participants without
/// operations are checked and ignored). The bindings are copied. On success writes a
/// new bound plan to `*out` (the logical handle stays valid and unchanged).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING` (a binding handle does not
/// build), `MWS_INVALID_ARGUMENT` (plan already bound; the binding rules of
/// `live-transfer.md` §2: missing or foreign bindings, overlapping ranges, in-place
/// reshard, conflicting target ranges), `MWS_LIMIT_EXCEEDED`.
///
/// # Safety
/// Handles are NULL or live; each array holds its count of handles; `out` is NULL
/// or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_bind(
    plan: *const mws_transfer_plan,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    source_bindings: *const *const mws_binding,
    n_sources: usize,
    out: *mut *mut mws_transfer_plan,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        if p.bound.is_some() {
            return Err(Failure::invalid("the transfer plan is already bound"));
        }
        let tb = bindings_arg(c, target_bindings, n_targets, "target_bindings")?;
        let sb = bindings_arg(c, source_bindings, n_sources, "source_bindings")?;
        let bound = TransferPlan::bind(&p.logical, &tb, &sb)?;
        out.give_handle(mws_transfer_plan::new(p.logical.clone(), Some(bound)))
    })
}

/// Restores a logical plan from its transport JSON (`mws_transfer_plan_to_json` of
/// a logical plan; `len` bytes, not NUL-terminated). The plan is re-planned from
/// the shipped placements and must equal the shipped regions and executors.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT`,
/// `MWS_LIMIT_EXCEEDED`.
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_transfer_plan,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let text = crate::args::utf8(c.slice(json as *const u8, len, "json")?, "json")?;
        out.give_handle(mws_transfer_plan::new(LogicalTransferPlan::from_json(text)?, None))
    })
}

/// The plan's transport JSON (logical: `mws-logical-transfer-plan`; bound:
/// `mws-transfer-plan`, offsets relative to runtime fragments, no absolute address).
/// Owned by the handle (built on first use); writes its length to `*len` when `len`
/// is not NULL. Returns NULL (and the last error) when `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or live; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_to_json(plan: *const mws_transfer_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.json.get_or_init(|| {
        CText::new(&match &p.bound {
            Some(b) => b.to_json(),
            None => p.logical.to_json(),
        })
    }))
}

/// 1 for a bound plan, 0 for a logical one, -1 (and the last error) for NULL.
///
/// # Safety
/// `plan` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_is_bound(plan: *const mws_transfer_plan) -> i32 {
    value_call!(-1, |c| Ok(i32::from(c.handle(plan, "plan")?.bound.is_some())))
}

/// Number of regions (= operations of a bound plan); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_region_count(plan: *const mws_transfer_plan) -> usize {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.regions.len()))
}

/// Bytes the plan moves; 0 for NULL.
///
/// # Safety
/// `plan` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_total_bytes(plan: *const mws_transfer_plan) -> u64 {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.logical.total_bytes()))
}

/// Writes region `index` to `*out` (pointers borrowed from the handle).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range).
///
/// # Safety
/// `plan` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_region(
    plan: *const mws_transfer_plan,
    index: usize,
    out: *mut mws_transfer_region_info,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let r = p.regions.get(index).ok_or_else(|| Failure::invalid(format!("region index {index} out of range")))?;
        out.give(*r)
    })
}

/// Writes bound operation `index` to `*out` (pointers borrowed from the handle).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (logical plan, index out of
/// range).
///
/// # Safety
/// `plan` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_operation(
    plan: *const mws_transfer_plan,
    index: usize,
    out: *mut mws_transfer_operation_info,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        p.bound()?;
        let o =
            p.operations.get(index).ok_or_else(|| Failure::invalid(format!("operation index {index} out of range")))?;
        out.give(*o)
    })
}

/// Number of executors on `side` (an `mws_transfer_side` value): per participant for
/// a logical plan, per (participant, worker) for a bound one. 0 for NULL or an
/// invalid side (with the last error).
///
/// # Safety
/// `plan` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_executor_count(plan: *const mws_transfer_plan, side: u32) -> usize {
    value_call!(0, |c| {
        let p = c.handle(plan, "plan")?;
        Ok(p.executors[side_arg(side)? as usize].len())
    })
}

/// Writes executor `index` of `side` to `*out` (sorted by rank, then worker).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (side, index).
///
/// # Safety
/// `plan` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_executor(
    plan: *const mws_transfer_plan,
    side: u32,
    index: usize,
    out: *mut mws_transfer_executor_info,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let k = side_arg(side)? as usize;
        let e = p.executors[k]
            .get(index)
            .ok_or_else(|| Failure::invalid(format!("executor index {index} out of range")))?;
        out.give(*e)
    })
}

/// Frees a plan handle; NULL does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `plan` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_free(plan: *mut mws_transfer_plan) {
    value_call!((), |c| c.free(plan))
}
