//! `mws_binding`: a runtime binding (live buffers of one participant) built from C.

use crate::args::Caller;
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::placement::mws_placement;
use mws::{
    validate_runtime_binding, MemoryKind, RuntimeBinding, RuntimeBindingSpec, RuntimeFragment, RuntimeFragmentSpec,
};
use std::ffi::{c_char, c_void};

/// A runtime binding under construction: the identity of one participant's binding
/// plus the fragments added so far.
///
/// Created by `mws_binding_new`, filled with `mws_binding_add_fragment`, freed by
/// `mws_binding_free`. The binding is checked as a whole (against its placement) by
/// `mws_binding_validate` and `mws_upload_plan_new`.
///
/// The handle copies every string and array it is given. It does not dereference the
/// buffer addresses; the caller keeps the buffers valid and stable for as long as
/// operations that move bytes (a later upload) use them.
///
/// Thread safety: `mws_binding_add_fragment` modifies the handle and must not run
/// concurrently with any other call on the same handle; functions taking a
/// `const mws_binding *` may run concurrently with each other.
pub struct mws_binding {
    /// The identity and the fragments added so far (validated as a whole by `build`).
    pub(crate) spec: RuntimeBindingSpec,
}

impl mws_binding {
    /// Builds the Rust binding (validates it as a whole).
    pub(crate) fn build(&self) -> FfiResult<RuntimeBinding> {
        Ok(RuntimeBinding::new(self.spec.clone())?)
    }

    /// As [`mws_binding::build`], failing with `MWS_INVALID_BINDING` and the reason
    /// after `prefix` (which names the binding, e.g. `invalid source runtime binding: `).
    pub(crate) fn build_as(&self, prefix: &str) -> FfiResult<RuntimeBinding> {
        self.build().map_err(|f| Failure::new(mws_status::MWS_INVALID_BINDING, format!("{prefix}{}", f.message)))
    }
}

handle!(mws_binding);

/// Kind of memory a runtime fragment lives in (values of
/// `mws_runtime_fragment.memory_kind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_memory_kind {
    /// Host (CPU) memory.
    MWS_MEMORY_HOST = 0,
    /// Device (accelerator) memory; `mws_runtime_fragment.device_ordinal` says which.
    MWS_MEMORY_DEVICE = 1,
}

/// Identity of a runtime binding: which participant lends its buffers, under which
/// lease and generation, for which placement. Read by `mws_binding_new` (copied; the
/// strings are only read during the call). Every string is required (non-NULL,
/// NUL-terminated UTF-8).
#[repr(C)]
pub struct mws_binding_options {
    /// Resource id; must equal the placement's.
    pub resource_id: *const c_char,
    /// Revision; must equal the placement's.
    pub revision: *const c_char,
    /// The placement id this binding attests (`mws_placement_id`).
    pub placement_id: *const c_char,
    /// The placement digest this binding attests (`mws_placement_digest`).
    pub placement_digest: *const c_char,
    /// The topology participant whose part this binding lends.
    pub participant_id: *const c_char,
    /// The process/engine instance holding the buffers.
    pub instance_id: *const c_char,
    /// The lease under which the buffers are lent.
    pub lease_id: *const c_char,
    /// The lease generation: the runtime fence the owner moves with its lease (a
    /// binding observed under another lease generation is stale). Not the weight
    /// generation, which the placement carries (the reference's wire name of this
    /// field is `generation`).
    pub lease_generation: u64,
}

/// One live buffer of a runtime binding, read by `mws_binding_add_fragment` (copied;
/// strings and arrays are only read during the call). Every string is required
/// (non-NULL, NUL-terminated UTF-8). Addresses are recorded, never dereferenced by
/// planning, and never written into any output string.
#[repr(C)]
pub struct mws_runtime_fragment {
    /// The placement fragment this buffer holds.
    pub placement_fragment_id: *const c_char,
    /// The runtime fragment id (unique across all bindings of an upload).
    pub fragment_id: *const c_char,
    /// Address of the fragment's first byte.
    pub address: *const c_void,
    /// Size of the fragment in bytes.
    pub nbytes: u64,
    /// The worker that owns the buffer.
    pub worker_id: *const c_char,
    /// The transfer endpoint of the worker (for example `"host:port"`).
    pub endpoint: *const c_char,
    /// The device name (for example `"cuda:0"` or `"cpu"`).
    pub device: *const c_char,
    /// Size of one element, in bytes.
    pub itemsize: u64,
    /// Shape of the fragment, in elements (`local_shape_len` values; may be NULL when
    /// `local_shape_len` is 0).
    pub local_shape: *const u64,
    /// Number of values in `local_shape`.
    pub local_shape_len: usize,
    /// Byte strides of the fragment (may be NULL when `strides_bytes_len` is 0).
    pub strides_bytes: *const u64,
    /// Number of values in `strides_bytes`.
    pub strides_bytes_len: usize,
    /// Start of the storage allocation that contains the fragment.
    pub storage_address: *const c_void,
    /// Size of that storage allocation in bytes.
    pub storage_nbytes: u64,
    /// Offset of the fragment in that allocation
    /// (`address == storage_address + storage_offset_bytes`).
    pub storage_offset_bytes: u64,
    /// An `mws_memory_kind` value (`MWS_MEMORY_HOST` or `MWS_MEMORY_DEVICE`); any other
    /// value is rejected with `MWS_INVALID_ARGUMENT`.
    pub memory_kind: u32,
    /// Device ordinal when `memory_kind` is `MWS_MEMORY_DEVICE`; ignored for host memory.
    pub device_ordinal: u32,
}

/// Creates an empty runtime binding with the identity in `*options`.
///
/// On success writes a new handle to `*out`; the caller owns it and frees it with
/// `mws_binding_free`. On failure `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT` (`options`, `out` or a string field NULL),
/// `MWS_INVALID_UTF8`. Thread safety: may be called from any thread.
///
/// # Safety
/// `options` is NULL or points to a valid struct whose strings are NUL-terminated;
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_new(
    options: *const mws_binding_options,
    out: *mut *mut mws_binding,
) -> mws_status {
    status_call!(|c| {
        let o = c.struct_ref(options, "options")?;
        let out = c.out(out, "out")?;
        let spec = RuntimeBindingSpec {
            resource_id: c.str(o.resource_id, "options->resource_id")?.to_owned(),
            revision: c.str(o.revision, "options->revision")?.to_owned(),
            placement_id: c.str(o.placement_id, "options->placement_id")?.to_owned(),
            placement_digest: c.str(o.placement_digest, "options->placement_digest")?.to_owned(),
            participant_id: c.str(o.participant_id, "options->participant_id")?.to_owned(),
            instance_id: c.str(o.instance_id, "options->instance_id")?.to_owned(),
            lease_id: c.str(o.lease_id, "options->lease_id")?.to_owned(),
            lease_generation: o.lease_generation,
            fragments: Vec::new(),
        };
        out.give_handle(mws_binding { spec })
    })
}

/// Adds one runtime fragment (a live buffer) to the binding. The fragment itself is
/// validated (shape, strides, sizes, storage bounds); how it pairs with the placement
/// is checked later by `mws_binding_validate` / `mws_upload_plan_new`. On failure the
/// binding is unchanged.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (invalid
/// fragment, unknown memory kind). Thread safety: see `mws_binding`.
///
/// # Safety
/// `binding` is NULL or a live handle not used concurrently; `fragment` is NULL or
/// points to a valid struct whose strings are NUL-terminated and whose arrays hold the
/// given number of values.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_add_fragment(
    binding: *mut mws_binding,
    fragment: *const mws_runtime_fragment,
) -> mws_status {
    status_call!(|c| {
        let b = c.handle_mut(binding, "binding")?;
        let f = c.struct_ref(fragment, "fragment")?;
        let memory = match f.memory_kind {
            k if k == mws_memory_kind::MWS_MEMORY_HOST as u32 => MemoryKind::Host,
            k if k == mws_memory_kind::MWS_MEMORY_DEVICE as u32 => MemoryKind::Device(f.device_ordinal),
            k => return Err(Failure::invalid(format!("fragment->memory_kind {k} is not an mws_memory_kind value"))),
        };
        let spec = RuntimeFragmentSpec {
            placement_fragment_id: c.str(f.placement_fragment_id, "fragment->placement_fragment_id")?.to_owned(),
            fragment_id: c.str(f.fragment_id, "fragment->fragment_id")?.to_owned(),
            address: f.address as usize as u64,
            nbytes: f.nbytes,
            worker_id: c.str(f.worker_id, "fragment->worker_id")?.to_owned(),
            endpoint: c.str(f.endpoint, "fragment->endpoint")?.to_owned(),
            device: c.str(f.device, "fragment->device")?.to_owned(),
            itemsize: f.itemsize,
            local_shape: c.slice(f.local_shape, f.local_shape_len, "fragment->local_shape")?.to_vec(),
            strides_bytes: c.slice(f.strides_bytes, f.strides_bytes_len, "fragment->strides_bytes")?.to_vec(),
            storage_address: f.storage_address as usize as u64,
            storage_nbytes: f.storage_nbytes,
            storage_offset_bytes: f.storage_offset_bytes,
            memory,
        };
        b.spec.fragments.push(RuntimeFragment::new(spec)?);
        Ok(())
    })
}

/// Copies a binding (its identity and every fragment) into a new handle in `*out`:
/// for example the binding an allocation guard hands over as observed under its pin
/// (`mws_guard_acquire_fn` takes ownership of it) while the caller keeps its own.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `binding` is NULL or live and not modified concurrently; `out` is NULL or valid for
/// a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_clone(binding: *const mws_binding, out: *mut *mut mws_binding) -> mws_status {
    status_call!(|c| {
        let b = c.handle(binding, "binding")?;
        let out = c.out(out, "out")?;
        out.give_handle(mws_binding { spec: b.spec.clone() })
    })
}

/// Returns the number of fragments added to the binding, or 0 (and sets the last
/// error) if `binding` is NULL.
///
/// # Safety
/// `binding` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_fragment_count(binding: *const mws_binding) -> usize {
    value_call!(0, |c| Ok(c.handle(binding, "binding")?.spec.fragments.len()))
}

/// Checks that the binding is complete and consistent, and pairs with `placement`
/// (attested placement id and digest, resource, revision, participant, every fragment
/// of the participant's part bound with a matching geometry).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING` or `MWS_INVALID_ARGUMENT` with the
/// reason in `mws_last_error_message()`. Thread safety: may run concurrently with other
/// calls taking `const` handles.
///
/// # Safety
/// Both arguments are NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_validate(
    placement: *const mws_placement,
    binding: *const mws_binding,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(placement, "placement")?;
        let b = c.handle(binding, "binding")?.build()?;
        validate_runtime_binding(&p.inner, &b)?;
        Ok(())
    })
}

/// Frees a binding handle. `NULL` does nothing. Upload plans created with it do not
/// borrow it and stay valid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `binding` is NULL or a handle from `mws_binding_new` not yet freed; no call starts
/// on it once this returns.
#[no_mangle]
pub unsafe extern "C" fn mws_binding_free(binding: *mut mws_binding) {
    value_call!((), |c| c.free(binding))
}

/// The runtime bindings of an array of `n` binding handles (`MWS_INVALID_BINDING`
/// naming the handle when one is not a valid binding).
pub(crate) fn bindings_arg(
    c: Caller<'_>,
    list: *const *const mws_binding,
    n: usize,
    name: &str,
) -> FfiResult<Vec<RuntimeBinding>> {
    c.handles(list, n, name)?.into_iter().map(|b| b.build_as("invalid runtime binding: ")).collect()
}
