//! `mws_upload_plan`: a planned upload (stored manifest, keys, operations).

use crate::args::{at, CText, Caller, Lent, Texts};
use crate::binding::mws_binding;
use crate::boundary::{mws_status, FfiResult};
use crate::placement::mws_placement;
use mws::plan_upload;
use mws::Decision;
use mws::UploadOptions;
use mws::UploadPlan;
use std::ffi::c_char;
use std::sync::OnceLock;

/// A planned upload: the stored manifest to commit, every key of the upload
/// transaction, and the copy operations, in plan order.
///
/// Created by `mws_upload_plan_new`, freed by `mws_upload_plan_free`. Immutable: every
/// function taking a `const mws_upload_plan *` may be called from several threads at
/// once. It holds no runtime address in any string and does not borrow the placement
/// or bindings it was planned from. Strings returned by its accessors are owned by the
/// handle and stay valid until it is freed.
pub struct mws_upload_plan {
    pub(crate) inner: UploadPlan,
    manifest_json: OnceLock<CText>,
    commit_record: OnceLock<CText>,
    /// Transport JSON (`mws_upload_plan_to_json`), built on first use.
    transport_json: OnceLock<CText>,
    texts: Texts,
    operations: Lent<mws_upload_operation>,
}

impl mws_upload_plan {
    pub(crate) fn new(inner: UploadPlan) -> Self {
        let texts = Texts::default();
        let operations = inner
            .operations()
            .iter()
            .map(|op| mws_upload_operation {
                source_participant_id: texts.ptr(op.source_participant_id()),
                source_instance_id: texts.ptr(op.source_instance_id()),
                source_lease_id: texts.ptr(op.source_lease_id()),
                source_lease_generation: op.source_lease_generation(),
                source_fragment_id: texts.ptr(op.source_snapshot().fragment_id()),
                source_worker_id: texts.ptr(op.source_snapshot().worker_id()),
                source_placement_fragment_id: texts.ptr(op.source_placement().placement_fragment_id()),
                target_fragment_id: texts.ptr(op.target().fragment_id()),
                object_key: texts.ptr(op.target().object_key()),
                nbytes: op.target().nbytes(),
            })
            .collect();
        mws_upload_plan {
            manifest_json: OnceLock::new(),
            commit_record: OnceLock::new(),
            transport_json: OnceLock::new(),
            texts,
            operations: Lent(operations),
            inner,
        }
    }
}

handle!(mws_upload_plan);

/// Options of `mws_upload_plan_new`. Every field may be NULL; the strings are only read
/// during the call.
#[repr(C)]
pub struct mws_upload_options {
    /// Store namespace (key segment, percent-encoded). NULL means `"default"`.
    pub store_namespace: *const c_char,
    /// Key prefix (its leading/trailing `/` are stripped). NULL means `"weights"`.
    pub key_prefix: *const c_char,
    /// Upload transaction id (32 lowercase hex characters). NULL means a fresh random
    /// one.
    pub transaction_id: *const c_char,
    /// Manifest creation time, `YYYY-MM-DDTHH:MM:SSZ`. NULL means now (UTC).
    pub created_at: *const c_char,
}

/// One operation of an upload plan (copy one runtime fragment into one stored object),
/// as returned by `mws_upload_plan_operation`. Every string is NUL-terminated, borrowed
/// from the plan handle and valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_upload_operation {
    /// The participant whose binding lends the source buffer.
    pub source_participant_id: *const c_char,
    /// The instance id of that binding.
    pub source_instance_id: *const c_char,
    /// The lease id of that binding.
    pub source_lease_id: *const c_char,
    /// The lease generation of that binding.
    pub source_lease_generation: u64,
    /// The runtime fragment id of the source buffer.
    pub source_fragment_id: *const c_char,
    /// The worker that owns the source buffer.
    pub source_worker_id: *const c_char,
    /// The placement fragment the source buffer holds.
    pub source_placement_fragment_id: *const c_char,
    /// The stored fragment id (in the manifest).
    pub target_fragment_id: *const c_char,
    /// The object key the bytes are written to.
    pub object_key: *const c_char,
    /// Number of bytes to copy.
    pub nbytes: u64,
}

/// The [`UploadOptions`] `options` says (NULL: the defaults).
pub(crate) fn options_from(c: Caller<'_>, options: *const mws_upload_options) -> FfiResult<UploadOptions> {
    let d = UploadOptions::default();
    let Some(o) = c.opt_struct(options) else { return Ok(d) };
    Ok(UploadOptions {
        namespace: c.opt_str(o.store_namespace, "options->store_namespace")?.map_or(d.namespace, str::to_owned),
        key_prefix: c.opt_str(o.key_prefix, "options->key_prefix")?.map_or(d.key_prefix, str::to_owned),
        transaction_id: c.opt_str(o.transaction_id, "options->transaction_id")?.map(str::to_owned),
        created_at: c.opt_str(o.created_at, "options->created_at")?.map(str::to_owned),
    })
}

/// Plans an upload of `placement` from `count` runtime bindings (one per participant
/// that lends buffers): validates every binding against the placement, selects the
/// source replica, and derives the stored manifest, keys and copy operations. Pure:
/// no I/O, no buffer is read.
///
/// `bindings` points to `count` binding handles (borrowed for the call only).
/// `options` may be NULL (all defaults).
///
/// On success writes a new handle to `*out`; the caller owns it and frees it with
/// `mws_upload_plan_free`. On failure `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT` (`placement`, `out`, `bindings` with `count > 0`, or a
/// NULL element), `MWS_INVALID_UTF8`, `MWS_INVALID_BINDING` (a binding does not pair with
/// the placement, or the set is empty), `MWS_INVALID_ARGUMENT` (unplannable inputs,
/// invalid options). Thread safety: may run concurrently with other calls taking
/// `const` handles.
///
/// # Safety
/// `placement` is NULL or a live handle; `bindings` points to `count` pointers that are
/// NULL or live binding handles not modified during the call; `options` is NULL or
/// valid; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_new(
    placement: *const mws_placement,
    bindings: *const *const mws_binding,
    count: usize,
    options: *const mws_upload_options,
    out: *mut *mut mws_upload_plan,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(placement, "placement")?;
        let out = c.out(out, "out")?;
        let built = c.handles(bindings, count, "bindings")?.iter().map(|b| b.build()).collect::<Result<Vec<_>, _>>()?;
        let options = options_from(c, options)?;
        out.give_handle(mws_upload_plan::new(plan_upload(&p.inner, &built, &options)?))
    })
}

/// Frees an upload plan handle. `NULL` does nothing. Every string borrowed from it
/// becomes invalid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `plan` is NULL or a handle from `mws_upload_plan_new` not yet freed; no call starts
/// on it once this returns.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_free(plan: *mut mws_upload_plan) {
    value_call!((), |c| c.free(plan))
}

/// Returns the stored manifest JSON (the exact bytes stored at the manifest key and
/// covered by the manifest digest; UTF-8, not ASCII-escaped).
///
/// Ownership: the NUL-terminated string is borrowed from `plan` and valid until it is
/// freed. If `len` is not NULL, the length in bytes (without the NUL) is written there.
/// Returns NULL (and sets the last error) if `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_manifest_json(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.manifest_json.get_or_init(|| CText::new(&p.inner.manifest().to_json())))
}

/// Returns the manifest digest (sha256 hex of the manifest JSON). Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_manifest_digest(
    plan: *const mws_upload_plan,
    len: *mut usize,
) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.manifest().manifest_digest()))
}

/// Returns the key the manifest is stored at. Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_manifest_key(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.manifest().manifest_key()))
}

/// Returns the group id of the stored revision (the key base). Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_group_id(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.manifest().group_id()))
}

/// Returns the control key (where the commit/abort decision record is stored).
/// Borrowed string, as `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_control_key(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.control_key()))
}

/// Returns the transaction group id (the group of the payload objects of this upload).
/// Borrowed string, as `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_transaction_group_id(
    plan: *const mws_upload_plan,
    len: *mut usize,
) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.transaction_group_id()))
}

/// Returns the upload transaction id. Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_transaction_id(
    plan: *const mws_upload_plan,
    len: *mut usize,
) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.transaction_id()))
}

/// Returns the id of the placement the plan was made from. Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_source_placement_id(
    plan: *const mws_upload_plan,
    len: *mut usize,
) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.source_placement_id()))
}

/// Returns the digest of the placement the plan was made from. Borrowed string, as
/// `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_source_placement_digest(
    plan: *const mws_upload_plan,
    len: *mut usize,
) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.texts.get(p.inner.source_placement_digest()))
}

/// Returns the exact bytes of the commit decision record to store at the control key.
/// Borrowed string, as `mws_upload_plan_manifest_json`.
///
/// # Safety
/// As `mws_upload_plan_manifest_json`.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_commit_record(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p
        .commit_record
        .get_or_init(|| CText::new(&p.inner.decision_record(Decision::Commit))))
}

/// Returns the number of operations of the plan, or 0 (and sets the last error) if
/// `plan` is NULL.
///
/// # Safety
/// `plan` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_operation_count(plan: *const mws_upload_plan) -> usize {
    value_call!(0, |c| Ok(c.handle(plan, "plan")?.operations.len()))
}

/// Describes operation `index` (0 <= index < `mws_upload_plan_operation_count`, in plan
/// order) into `*out`. The strings written to `*out` are borrowed from `plan` and valid
/// until it is freed.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range; `*out` is not
/// written). Thread safety: may be called from any thread.
///
/// # Safety
/// `plan` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_operation(
    plan: *const mws_upload_plan,
    index: usize,
    out: *mut mws_upload_operation,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(plan, "plan")?;
        let out = c.out(out, "out")?;
        let op = at(&p.operations, index, "operation", |n| format!("plan has {n} operations"))?;
        out.give(*op)
    })
}

/// Encodes the plan for transport to the other processes of one job (a coordinator
/// plans, each rank uploads its participant with the decoded plan, the coordinator
/// commits). The document holds the runtime addresses of the source buffers: it is
/// meant for the processes of one job, never for a store.
///
/// Ownership: the NUL-terminated UTF-8 string is borrowed from `plan` (built on the
/// first call) and valid until it is freed. If `len` is not NULL, the length in bytes
/// (without the NUL) is written there. Returns NULL (and sets the last error) if
/// `plan` is NULL. Thread safety: may be called from several threads at once.
///
/// # Safety
/// `plan` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_to_json(plan: *const mws_upload_plan, len: *mut usize) -> *const c_char {
    text_call!(plan, "plan", len, |p| p.transport_json.get_or_init(|| CText::new(&mws::plan_to_json(&p.inner))))
}

/// Decodes an upload plan sent by `mws_upload_plan_to_json` and re-validates it
/// completely (a decoded plan passes the same invariants as a planned one).
///
/// `json` points to `len` bytes of UTF-8 JSON, only read during the call. On success
/// writes a new handle to `*out` (free it with `mws_upload_plan_free`); on failure
/// `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (malformed or invalid plan).
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_upload_plan_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_upload_plan,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        out.give_handle(mws_upload_plan::new(mws::plan_from_json(c.bytes(json, len, "json")?)?))
    })
}
