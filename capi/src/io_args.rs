//! `mws_io_args`: the per-call arguments of uploads and restores (worker, guard,
//! transfer id, registration lease), translated into `protocol::UploadArgs` /
//! `protocol::LoadArgs`.

use crate::args::Caller;
use crate::binding::mws_binding;
use crate::boundary::{Failure, FfiResult};
use crate::callbacks::guard::{mws_guard_vtable, CGuard};
use crate::callbacks::progress::{mws_progress_fn, CProgress};
use crate::lease::mws_registration_lease;
use mws::protocol::guards::{GuardProvider, StaticGuard};
use mws::protocol::transfer::ProgressCallback;
use mws::protocol::{LoadArgs, ProgressFn, RegistrationLease, UploadArgs, WeightStore};
use mws::RuntimeBinding;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// Per-call arguments of `mws_store_upload` and `mws_store_load`. A NULL pointer or a
/// zeroed struct means the defaults. Strings are only read during the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_io_args {
    /// Restricts the call to the fragments of one worker of the binding. NULL: upload
    /// requires it when the participant's fragments live on several workers; load
    /// serves every worker of the participant.
    pub worker_id: *const c_char,
    /// Transfer id handed to the guard. NULL: a fresh random id.
    pub transfer_id: *const c_char,
    /// Allocation guard. NULL: the caller promises the buffers stay valid and
    /// unchanged (upload) or untouched by anyone else (load) for the whole call (a
    /// static guard).
    pub guard: *const mws_guard_vtable,
    /// Passed to the guard's callbacks.
    pub guard_ctx: *mut c_void,
    /// A registration lease of this store covering exactly the buffers the call
    /// touches (`mws_registration_lease_new`): the call then neither pins (`guard` is
    /// ignored) nor registers anything. NULL: pin and register for this call only.
    /// Added at the end of the struct in 0.1 (this struct has no size field: code
    /// built against an older header must be rebuilt).
    pub lease: *const mws_registration_lease,
    /// Progress callback of the call (`mws_progress_fn`: upload or restore reports,
    /// throttled, on the calling thread). NULL: none. Added in 0.2, at the end.
    pub progress: mws_progress_fn,
    /// Passed to `progress`; must stay valid for the call.
    pub progress_ctx: *mut c_void,
}

/// What a call's `mws_io_args` says, decoded.
pub(crate) struct IoArgs<'a> {
    pub(crate) worker_id: Option<&'a str>,
    pub(crate) transfer_id: Option<&'a str>,
    pub(crate) guard: Box<dyn GuardProvider>,
    pub(crate) lease: Option<&'a mws_registration_lease>,
    pub(crate) progress: Option<ProgressCallback>,
}

impl IoArgs<'_> {
    /// The [`UploadArgs`] of these arguments with `lease` (the call's locked lease).
    pub(crate) fn upload<'a>(&'a self, lease: Option<&'a RegistrationLease>) -> UploadArgs<'a> {
        let progress = self.progress.as_deref().map(|f| f as ProgressFn<'_>);
        UploadArgs {
            worker_id: self.worker_id,
            guard: Some(&*self.guard),
            transfer_id: self.transfer_id,
            lease,
            progress,
        }
    }
}

/// Decodes `args` (NULL: the defaults).
pub(crate) fn io_args<'a>(c: Caller<'a>, args: *const mws_io_args) -> FfiResult<IoArgs<'a>> {
    let Some(a) = c.opt_struct(args) else {
        let guard = Box::new(StaticGuard);
        return Ok(IoArgs { worker_id: None, transfer_id: None, guard, lease: None, progress: None });
    };
    let guard: Box<dyn GuardProvider> =
        if a.guard.is_null() { Box::new(StaticGuard) } else { Box::new(CGuard::from_vtable(c, a.guard, a.guard_ctx)?) };
    Ok(IoArgs {
        worker_id: c.opt_str(a.worker_id, "args->worker_id")?,
        transfer_id: c.opt_str(a.transfer_id, "args->transfer_id")?,
        guard,
        lease: c.opt_handle(a.lease),
        // SAFETY: the entry point's contract: a callback set in `args` honours
        // `mws_progress_fn` with its context for the call.
        progress: unsafe { CProgress::new(a.progress, a.progress_ctx) }.map(CProgress::into_callback),
    })
}

/// Runs `run` with the [`UploadArgs`] that `args` says for `binding` on `ws`
/// (`mws_store_upload`, `mws_transaction_upload`).
pub(crate) fn with_upload_args<T>(
    c: Caller<'_>,
    ws: &Arc<WeightStore>,
    binding: &mws_binding,
    args: *const mws_io_args,
    run: impl FnOnce(&RuntimeBinding, UploadArgs<'_>) -> mws::Result<T>,
) -> FfiResult<T> {
    let a = io_args(c, args)?;
    let rb = source_binding(binding, "")?;
    let lease = a.lease.map(|l| l.inner.for_store(ws)).transpose()?;
    Ok(run(&rb, a.upload(lease.as_deref()))?)
}

/// Runs `run` with the [`LoadArgs`] that `args` says for `binding` on `ws`
/// (`mws_store_load`, `mws_loader_load_stored`).
pub(crate) fn with_load_args<T>(
    c: Caller<'_>,
    ws: &Arc<WeightStore>,
    binding: &mws_binding,
    args: *const mws_io_args,
    run: impl FnOnce(&RuntimeBinding, LoadArgs<'_>) -> mws::Result<T>,
) -> FfiResult<T> {
    let a = io_args(c, args)?;
    let rb = binding.build_as("invalid target runtime binding: ")?;
    let lease = a.lease.map(|l| l.inner.for_store(ws)).transpose()?;
    let la = LoadArgs {
        worker_id: a.worker_id,
        guard: Some(&*a.guard),
        transfer_id: a.transfer_id,
        skip_committed_check: false,
        lease: lease.as_deref(),
        progress: a.progress.as_deref().map(|f| f as ProgressFn<'_>),
    };
    Ok(run(&rb, la)?)
}

/// Runs `run` with the target bindings of `bindings` and the [`LoadArgs`] that `args`
/// says (`mws_store_load_many`: no lease, which covers one binding).
pub(crate) fn with_load_many_args<T>(
    c: Caller<'_>,
    bindings: &[&mws_binding],
    args: *const mws_io_args,
    run: impl FnOnce(&[&RuntimeBinding], LoadArgs<'_>) -> mws::Result<T>,
) -> FfiResult<T> {
    let a = io_args(c, args)?;
    if a.lease.is_some() {
        return Err(Failure::invalid("mws_store_load_many takes no `args->lease` (a lease covers one binding)"));
    }
    let mut built = Vec::with_capacity(bindings.len());
    for (i, b) in bindings.iter().enumerate() {
        built.push(b.build_as(&format!("invalid target runtime binding: bindings[{i}]: "))?);
    }
    let refs: Vec<&RuntimeBinding> = built.iter().collect();
    let la = LoadArgs {
        worker_id: a.worker_id,
        guard: Some(&*a.guard),
        transfer_id: a.transfer_id,
        skip_committed_check: false,
        lease: None,
        progress: a.progress.as_deref().map(|f| f as ProgressFn<'_>),
    };
    Ok(run(&refs, la)?)
}

/// The runtime binding of a source handle, or `MWS_INVALID_BINDING`
/// (`invalid source runtime binding: {at}...`; `at` names the handle in a list, e.g.
/// `"bindings[3]: "`, or is empty).
pub(crate) fn source_binding(binding: &mws_binding, at: &str) -> FfiResult<RuntimeBinding> {
    binding.build_as(&format!("invalid source runtime binding: {at}"))
}
