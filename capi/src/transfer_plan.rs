//! `mws_transfer_plan`: logical and bound live-transfer plans (placement ->
//! placement), with accessors for every region and every bound operation so that an
//! outside executor (for example a serving engine's own Transfer Engine hook) can
//! execute a plan itself.

use crate::args::{CText, Handle};
use crate::binding::{bindings_arg, mws_binding};
use crate::placement::mws_placement;
use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::load_plan::{mws_planning_limits, planning_limits};
use mws::plan::transfer::{LogicalTransferPlan, SourceRouting};
use mws::plan::transfer_bind::{Side, TransferPlan};
use std::collections::HashMap;

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

fn routing_arg(routing: u32) -> FfiResult<SourceRouting> {
    match routing {
        x if x == mws_source_routing::MWS_SOURCE_ROUTING_TARGET_DP as u32 => Ok(SourceRouting::TargetDp),
        x if x == mws_source_routing::MWS_SOURCE_ROUTING_SPREAD_TARGETS as u32 => Ok(SourceRouting::SpreadTargets),
        x => Err(Failure::invalid(format!("invalid source routing: {x}"))),
    }
}

fn side_arg(side: u32) -> FfiResult<Side> {
    match side {
        x if x == mws_transfer_side::MWS_SIDE_SOURCE as u32 => Ok(Side::Source),
        x if x == mws_transfer_side::MWS_SIDE_TARGET as u32 => Ok(Side::Target),
        x => Err(Failure::invalid(format!("invalid executor side: {x}"))),
    }
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
    /// Generation of the binding.
    pub generation: u64,
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
/// lease and worker are NULL and `generation` is 0.
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
    /// Generation (bound plans).
    pub generation: u64,
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

/// Interned NUL-terminated strings lent by a plan handle.
#[derive(Default, Debug)]
struct Strings {
    index: HashMap<String, usize>,
    texts: Vec<CText>,
}

impl Strings {
    fn get(&mut self, s: &str) -> *const c_char {
        if let Some(&i) = self.index.get(s) {
            return self.texts[i].as_ptr();
        }
        self.texts.push(CText::new(s));
        self.index.insert(s.to_string(), self.texts.len() - 1);
        self.texts.last().expect("pushed").as_ptr()
    }
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
    regions: Vec<mws_transfer_region_info>,
    operations: Vec<mws_transfer_operation_info>,
    executors: [Vec<mws_transfer_executor_info>; 2],
    _indices: Vec<Box<[u32]>>,
    _strings: Strings,
    json: OnceLock<CText>,
}

impl Handle for mws_transfer_plan {}

// SAFETY: the raw pointers point into data owned by the handle (`_strings`,
// `_indices`, the plans' regions), which is immutable after construction.
unsafe impl Send for mws_transfer_plan {}
// SAFETY: as above.
unsafe impl Sync for mws_transfer_plan {}

fn region_info(s: &mut Strings, l: &LogicalTransferPlan, i: usize) -> mws_transfer_region_info {
    let r = &l.regions()[i];
    let arr = |v: &Vec<u64>| if v.is_empty() { std::ptr::null() } else { v.as_ptr() };
    mws_transfer_region_info {
        tensor_id: s.get(l.target_of(r).tensor_id()),
        source_participant_id: s.get(l.source_participant_of(r)),
        source_placement_fragment_id: s.get(l.source_of(r).placement_fragment_id()),
        target_participant_id: s.get(l.target_participant_of(r)),
        target_placement_fragment_id: s.get(l.target_of(r).placement_fragment_id()),
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

fn endpoint_info(s: &mut Strings, p: &TransferPlan, i: usize, side: Side) -> mws_transfer_endpoint_info {
    let (b, f) = p.operation_fragment(i, side);
    let r = &p.regions()[i];
    let off = if side == Side::Source { r.source_base_offset } else { r.target_base_offset };
    mws_transfer_endpoint_info {
        participant_id: s.get(b.participant_id()),
        instance_id: s.get(b.instance_id()),
        lease_id: s.get(b.lease_id()),
        generation: b.generation(),
        worker_id: s.get(f.worker_id()),
        endpoint: s.get(f.endpoint()),
        device: s.get(f.device()),
        fragment_id: s.get(f.fragment_id()),
        placement_fragment_id: s.get(f.placement_fragment_id()),
        address: f.address(),
        address_offset: off,
        storage_address: f.storage_address(),
        storage_nbytes: f.storage_nbytes(),
        storage_offset: f.storage_offset_bytes() + off,
    }
}

impl mws_transfer_plan {
    pub(crate) fn new(logical: LogicalTransferPlan, bound: Option<TransferPlan>) -> mws_transfer_plan {
        let mut s = Strings::default();
        let regions: Vec<_> = (0..logical.regions().len()).map(|i| region_info(&mut s, &logical, i)).collect();
        let mut indices: Vec<Box<[u32]>> = Vec::new();
        let mut executors: [Vec<mws_transfer_executor_info>; 2] = [Vec::new(), Vec::new()];
        let mut operations = Vec::new();
        let null = std::ptr::null();
        match &bound {
            None => {
                for (k, list) in [logical.source_executors(), logical.target_executors()].into_iter().enumerate() {
                    for e in list {
                        let ops: Box<[u32]> = e.operation_indices.clone().into_boxed_slice();
                        executors[k].push(mws_transfer_executor_info {
                            participant_id: s.get(&e.participant_id),
                            instance_id: null,
                            lease_id: null,
                            worker_id: null,
                            generation: 0,
                            dp: e.rank.dp,
                            pp: e.rank.pp,
                            ep: e.rank.ep,
                            tp: e.rank.tp,
                            operation_indices: ops.as_ptr(),
                            operation_count: ops.len(),
                        });
                        indices.push(ops);
                    }
                }
            }
            Some(p) => {
                for (k, side) in [Side::Source, Side::Target].into_iter().enumerate() {
                    for e in p.executors(side) {
                        let ops: Box<[u32]> = e.operation_indices.clone().into_boxed_slice();
                        executors[k].push(mws_transfer_executor_info {
                            participant_id: s.get(&e.participant_id),
                            instance_id: s.get(&e.instance_id),
                            lease_id: s.get(&e.runtime_lease_id),
                            worker_id: s.get(&e.worker_id),
                            generation: e.generation,
                            dp: e.rank.dp,
                            pp: e.rank.pp,
                            ep: e.rank.ep,
                            tp: e.rank.tp,
                            operation_indices: ops.as_ptr(),
                            operation_count: ops.len(),
                        });
                        indices.push(ops);
                    }
                }
                for (i, region) in regions.iter().enumerate() {
                    operations.push(mws_transfer_operation_info {
                        region: *region,
                        source: endpoint_info(&mut s, p, i, Side::Source),
                        target: endpoint_info(&mut s, p, i, Side::Target),
                    });
                }
            }
        }
        mws_transfer_plan {
            logical,
            bound,
            regions,
            operations,
            executors,
            _indices: indices,
            _strings: s,
            json: OnceLock::new(),
        }
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
    status_call!(|c| {
        let s = c.handle(source, "source")?;
        let t = c.handle(target, "target")?;
        let out = c.out(out, "out")?;
        let participant = c.opt_str(target_participant_id, "target_participant_id")?;
        let l = planning_limits(c, limits);
        let limits = l;
        let (sp, tp) = (Arc::new(s.inner.clone()), Arc::new(t.inner.clone()));
        let logical = match participant {
            None => LogicalTransferPlan::plan(sp, tp, limits)?,
            Some(p) => LogicalTransferPlan::plan_local(sp, tp, Some(p), limits)?,
        };
        out.set(Handle::into_raw(mws_transfer_plan::new(logical, None)));
        Ok(())
    })
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
    status_call!(|c| {
        let s = c.handle(source, "source")?;
        let t = c.handle(target, "target")?;
        let out = c.out(out, "out")?;
        let participant = c.opt_str(target_participant_id, "target_participant_id")?;
        let routing = routing_arg(routing)?;
        let limits = planning_limits(c, limits);
        let (sp, tp) = (Arc::new(s.inner.clone()), Arc::new(t.inner.clone()));
        let logical = match participant {
            None => LogicalTransferPlan::plan_routed(sp, tp, limits, routing)?,
            Some(p) => LogicalTransferPlan::plan_local_routed(sp, tp, Some(p), limits, routing)?,
        };
        out.set(Handle::into_raw(mws_transfer_plan::new(logical, None)));
        Ok(())
    })
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
        out.set(Handle::into_raw(mws_transfer_plan::new(p.logical.clone(), Some(bound))));
        Ok(())
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
        let bytes = c.slice(json as *const u8, len, "json")?;
        let text = crate::args::utf8(bytes, "json")?;
        let logical = LogicalTransferPlan::from_json(text)?;
        out.set(Handle::into_raw(mws_transfer_plan::new(logical, None)));
        Ok(())
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
    value_call!(std::ptr::null(), |c| {
        let p = c.handle(plan, "plan")?;
        let text = p.json.get_or_init(|| {
            CText::new(&match &p.bound {
                Some(b) => b.to_json(),
                None => p.logical.to_json(),
            })
        });
        Ok(c.lend(text, len))
    })
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
        out.set(*r);
        Ok(())
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
        out.set(*o);
        Ok(())
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
        let k = side_arg(side)? as usize;
        Ok(p.executors[k].len())
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
        out.set(*e);
        Ok(())
    })
}

/// Frees a plan handle; NULL does nothing.
///
/// # Safety
/// `plan` is NULL or a live handle not yet freed and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_plan_free(plan: *mut mws_transfer_plan) {
    value_call!((), |c| c.free(plan))
}
