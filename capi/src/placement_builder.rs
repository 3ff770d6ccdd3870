//! `mws_placement_builder_*`: build a placement from parts in C (translates
//! `model::PlacementBuilder`; every rule and identity is the library's).

use crate::args::Texts;
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::placement::mws_placement;
use mws::model::{AxisKind, BuilderFragment, ParallelAxis, ParallelRank, PlacementBuilder, PlacementBuilderSpec};
use mws::TensorSpec;
use std::ffi::c_char;

/// A placement under construction (`mws_placement_builder_new`): participants,
/// tensors and fragments added one call at a time, then `mws_placement_builder_build`.
/// Mirrors `model::PlacementBuilder`.
///
/// Freed by `mws_placement_builder_free`. Thread safety: calls are serialized by a
/// mutex; fragment ids it lends stay valid until it is freed.
pub struct mws_placement_builder {
    pub(crate) inner: parking_lot::Mutex<mws::model::PlacementBuilder>,
    /// The ids returned by `mws_placement_builder_add_fragment`.
    ids: Texts,
}

handle!(mws_placement_builder);

/// Identity and topology sizes of a placement to build (`mws_placement_builder_new`).
#[repr(C)]
pub struct mws_placement_builder_options {
    /// Resource id (required).
    pub resource_id: *const c_char,
    /// Revision (required).
    pub revision: *const c_char,
    /// Weight generation.
    pub weight_generation: u64,
    /// Placement set id; NULL gives `"placement"`.
    pub placement_set_id: *const c_char,
    /// TP size (>= 1).
    pub tp_size: u64,
    /// PP size (>= 1).
    pub pp_size: u64,
    /// EP size (>= 1).
    pub ep_size: u64,
    /// DP size (>= 1).
    pub dp_size: u64,
}

/// A parallel rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_rank {
    /// Data-parallel coordinate.
    pub dp: u64,
    /// Pipeline-parallel coordinate.
    pub pp: u64,
    /// Expert-parallel coordinate.
    pub ep: u64,
    /// Tensor-parallel coordinate.
    pub tp: u64,
}

/// The kind of a parallel axis (`mws_parallel_axis.kind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_axis_kind {
    /// Data parallel.
    MWS_AXIS_DP = 0,
    /// Pipeline parallel.
    MWS_AXIS_PP = 1,
    /// Expert parallel.
    MWS_AXIS_EP = 2,
    /// Tensor parallel.
    MWS_AXIS_TP = 3,
}

/// The semantics a tensor declares on an axis (`mws_parallel_axis.semantics`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_axis_semantics {
    /// The ranks along the axis partition dimension `dim` (TP or EP; EP splits dim 0).
    MWS_AXIS_SPLIT = 0,
    /// Every rank along the axis holds a complete copy.
    MWS_AXIS_REPLICATED = 1,
    /// Only the ranks that hold fragments hold the tensor.
    MWS_AXIS_OWNERSHIP = 2,
}

/// One axis of a tensor. `kind` is an `mws_axis_kind` value, `semantics` an
/// `mws_axis_semantics` value (plain integers, so any value is safe to pass and an
/// unknown one is `MWS_INVALID_ARGUMENT`); `dim` is read only for `MWS_AXIS_SPLIT`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_parallel_axis {
    /// An `mws_axis_kind` value.
    pub kind: u32,
    /// An `mws_axis_semantics` value.
    pub semantics: u32,
    /// The split dimension (split axes only).
    pub dim: u64,
}

/// A tensor descriptor (`mws_placement_builder_add_tensor`). Arrays are only read
/// during the call. `shard_dims` is derived from the split axes.
#[repr(C)]
pub struct mws_tensor_spec {
    /// Tensor id (required).
    pub tensor_id: *const c_char,
    /// Global shape (`ndim` values, each >= 1).
    pub global_shape: *const u64,
    /// Number of dimensions.
    pub ndim: usize,
    /// Dtype name, e.g. `"bfloat16"` (required).
    pub dtype: *const c_char,
    /// Bytes per element (>= 1).
    pub itemsize: u64,
    /// Framework layout identity (required, non-empty), e.g. `"torch:row-major:v1"`.
    pub layout_fingerprint: *const c_char,
    /// Axes (`axis_count` values, any order).
    pub axes: *const mws_parallel_axis,
    /// Number of axes.
    pub axis_count: usize,
    /// Optional layer id (NULL: none).
    pub layer_id: *const u64,
    /// Optional expert id (NULL: none).
    pub expert_id: *const u64,
}

/// A fragment (`mws_placement_builder_add_fragment`): a box of a tensor held by a
/// participant. Its byte size is derived; its rank is the participant's. Arrays are
/// only read during the call.
#[repr(C)]
pub struct mws_fragment_spec {
    /// The participant that holds it (added before).
    pub participant_id: *const c_char,
    /// The tensor (added before).
    pub tensor_id: *const c_char,
    /// Box offset (`ndim` values).
    pub global_offset: *const u64,
    /// Box shape (`ndim` values).
    pub local_shape: *const u64,
    /// Number of dimensions.
    pub ndim: usize,
    /// Optional virtual pipeline stage (NULL: none).
    pub pipeline_stage_id: *const u64,
    /// Alias group (`alias_count` tensor ids, any order), or NULL with 0.
    pub aliases: *const *const c_char,
    /// Number of aliases.
    pub alias_count: usize,
    /// Explicit `placement_fragment_id`; NULL derives the canonical `sha256:` id.
    pub placement_fragment_id: *const c_char,
}

/// The axis kind of an `mws_axis_kind` value (the table is in the C enum's order).
fn axis_kind(code: u32) -> FfiResult<AxisKind> {
    let kinds = [AxisKind::Dp, AxisKind::Pp, AxisKind::Ep, AxisKind::Tp];
    kinds.get(code as usize).copied().ok_or_else(|| Failure::invalid(format!("unknown mws_axis_kind value {code}")))
}

fn axis(a: &mws_parallel_axis) -> FfiResult<ParallelAxis> {
    let kind = axis_kind(a.kind)?;
    Ok(match a.semantics {
        0 => ParallelAxis::split(kind, a.dim)?,
        1 => ParallelAxis::Replicated(kind),
        2 => ParallelAxis::Ownership(kind),
        s => return Err(Failure::invalid(format!("unknown mws_axis_semantics value {s}"))),
    })
}

/// Starts a placement builder. No validation yet beyond the C arguments: sizes and ids
/// are checked by `mws_placement_builder_build`. On success writes a new handle to
/// `*out` (free it with `mws_placement_builder_free`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`.
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `options` is NULL or valid, its strings NULL or NUL-terminated; `out` is NULL or
/// valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_new(
    options: *const mws_placement_builder_options,
    out: *mut *mut mws_placement_builder,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let o = c.struct_ref(options, "options")?;
        let spec = PlacementBuilderSpec {
            resource_id: c.str(o.resource_id, "options->resource_id")?.to_string(),
            revision: c.str(o.revision, "options->revision")?.to_string(),
            weight_generation: o.weight_generation,
            placement_set_id: c
                .opt_str(o.placement_set_id, "options->placement_set_id")?
                .unwrap_or("placement")
                .to_string(),
            tp_size: o.tp_size,
            pp_size: o.pp_size,
            ep_size: o.ep_size,
            dp_size: o.dp_size,
        };
        out.give_handle(mws_placement_builder {
            inner: parking_lot::Mutex::new(PlacementBuilder::new(spec)),
            ids: Texts::default(),
        })
    })
}

/// Adds a topology participant with `*rank`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT`
/// (`duplicate participant`, empty id). Thread safety: serialized per builder.
///
/// # Safety
/// `builder` is NULL or live; `participant_id` NULL or NUL-terminated; `rank` NULL or
/// valid.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_add_participant(
    builder: *const mws_placement_builder,
    participant_id: *const c_char,
    rank: *const mws_rank,
) -> mws_status {
    status_call!(|c| {
        let b = c.handle(builder, "builder")?;
        let id = c.str(participant_id, "participant_id")?;
        let r = c.struct_ref(rank, "rank")?;
        b.inner.lock().add_participant(id, ParallelRank::new(r.dp, r.pp, r.ep, r.tp))?;
        Ok(())
    })
}

/// Adds a tensor descriptor (validated at once: the messages of the placement
/// contract, and `duplicate tensor`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT`.
/// Thread safety: serialized per builder.
///
/// # Safety
/// `builder` is NULL or live; `spec` NULL or valid with its arrays readable for their
/// counts and its strings NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_add_tensor(
    builder: *const mws_placement_builder,
    spec: *const mws_tensor_spec,
) -> mws_status {
    status_call!(|c| {
        let b = c.handle(builder, "builder")?;
        let s = c.struct_ref(spec, "spec")?;
        let axes = c.slice(s.axes, s.axis_count, "spec->axes")?.iter().map(axis).collect::<FfiResult<Vec<_>>>()?;
        let t = TensorSpec {
            tensor_id: c.str(s.tensor_id, "spec->tensor_id")?.to_string(),
            global_shape: c.slice(s.global_shape, s.ndim, "spec->global_shape")?.to_vec(),
            dtype: c.str(s.dtype, "spec->dtype")?.to_string(),
            itemsize: s.itemsize,
            shard_dims: Vec::new(),
            layout_fingerprint: c.str(s.layout_fingerprint, "spec->layout_fingerprint")?.to_string(),
            parallel_axes: axes,
            layer_id: c.opt_struct(s.layer_id).copied(),
            expert_id: c.opt_struct(s.expert_id).copied(),
        };
        b.inner.lock().add_tensor(t)?;
        Ok(())
    })
}

/// Adds a fragment and, when `id_out` is not NULL, writes its `placement_fragment_id`
/// there (and its length to `*id_len` when not NULL): a NUL-terminated string owned by
/// the builder, valid until it is freed.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT`
/// (`unknown participant`, `unknown tensor_id`, the fragment's geometry and id
/// rules). Thread safety: serialized per builder.
///
/// # Safety
/// `builder` is NULL or live; `spec` NULL or valid with its arrays readable for their
/// counts; `id_out` and `id_len` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_add_fragment(
    builder: *const mws_placement_builder,
    spec: *const mws_fragment_spec,
    id_out: *mut *const c_char,
    id_len: *mut usize,
) -> mws_status {
    status_call!(|c| {
        let b = c.handle(builder, "builder")?;
        let s = c.struct_ref(spec, "spec")?;
        let aliases = c
            .slice(s.aliases, s.alias_count, "spec->aliases")?
            .iter()
            .map(|a| c.str(*a, "spec->aliases[i]").map(str::to_string))
            .collect::<FfiResult<Vec<_>>>()?;
        let f = BuilderFragment {
            participant_id: c.str(s.participant_id, "spec->participant_id")?.to_string(),
            tensor_id: c.str(s.tensor_id, "spec->tensor_id")?.to_string(),
            global_offset: c.slice(s.global_offset, s.ndim, "spec->global_offset")?.to_vec(),
            local_shape: c.slice(s.local_shape, s.ndim, "spec->local_shape")?.to_vec(),
            pipeline_stage_id: c.opt_struct(s.pipeline_stage_id).copied(),
            aliases,
            placement_fragment_id: c
                .opt_str(s.placement_fragment_id, "spec->placement_fragment_id")?
                .map(str::to_string),
        };
        let id = b.ids.get(b.inner.lock().add_fragment(f)?);
        // The length is written only with the id.
        if let Some(out) = c.opt_out(id_out) {
            out.set(c.lend(id, id_len));
        }
        Ok(())
    })
}

/// Validates and builds the placement: writes a new `mws_placement` to `*out` (free it
/// with `mws_placement_free`). The builder stays usable (it may be built again).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (the placement's rules:
/// topology, coverage, axes, aliases, unreferenced tensors).
/// Thread safety: serialized per builder.
///
/// # Safety
/// `builder` is NULL or live; `out` NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_build(
    builder: *const mws_placement_builder,
    out: *mut *mut mws_placement,
) -> mws_status {
    status_call!(|c| {
        let b = c.handle(builder, "builder")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_placement::new(b.inner.lock().build()?))
    })
}

/// Frees a builder (and the fragment ids it lent). NULL does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `builder` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_placement_builder_free(builder: *mut mws_placement_builder) {
    value_call!((), |c| c.free(builder))
}
