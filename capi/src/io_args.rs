//! `mws_io_args`: the per-call arguments of uploads and restores (worker, guard,
//! transfer id, registration lease), translated into `protocol::UploadArgs` /
//! `protocol::LoadArgs`.

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::guard::{mws_guard_vtable, CGuard};
use crate::callbacks::progress::{mws_progress_fn, CProgress};
use crate::handles::{mws_binding, mws_registration_lease};
use crate::strings::opt_str_arg;
use mws::protocol::guards::GuardProvider;
use mws::protocol::guards::StaticGuard;
use mws::protocol::RegistrationLease;
use mws::protocol::UploadArgs;
use mws::protocol::WeightStore;
use mws::protocol::{Progress, ProgressFn};
use mws::RuntimeBinding;
use std::ffi::c_char;
use std::ffi::c_void;
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

impl mws_io_args {
    /// The defaults (what a zeroed struct or NULL means).
    pub(crate) fn none() -> mws_io_args {
        mws_io_args {
            worker_id: std::ptr::null(),
            transfer_id: std::ptr::null(),
            guard: std::ptr::null(),
            guard_ctx: std::ptr::null_mut(),
            lease: std::ptr::null(),
            progress: None,
            progress_ctx: std::ptr::null_mut(),
        }
    }
}

/// What a call's `mws_io_args` says, decoded.
pub(crate) struct IoArgs<'a> {
    pub(crate) worker_id: Option<&'a str>,
    pub(crate) transfer_id: Option<&'a str>,
    pub(crate) guard: Box<dyn GuardProvider>,
    pub(crate) lease: Option<&'a mws_registration_lease>,
    pub(crate) progress: Option<CProgress>,
}

pub(crate) unsafe fn io_args<'a>(args: *const mws_io_args) -> FfiResult<IoArgs<'a>> {
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    let Some(a) = (unsafe { args.as_ref() }) else {
        return Ok(IoArgs {
            worker_id: None,
            transfer_id: None,
            guard: Box::new(StaticGuard),
            lease: None,
            progress: None,
        });
    };
    let guard: Box<dyn GuardProvider> =
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        if a.guard.is_null() { Box::new(StaticGuard) } else { Box::new(unsafe { CGuard::from_vtable(a.guard, a.guard_ctx) }?) };
    Ok(IoArgs {
        // SAFETY: `a.worker_id` is NULL or a NUL-terminated string valid for the call (this function's contract).
        worker_id: unsafe { opt_str_arg(a.worker_id, "args->worker_id") }?,
        // SAFETY: `a.transfer_id` is NULL or a NUL-terminated string valid for the call (this function's contract).
        transfer_id: unsafe { opt_str_arg(a.transfer_id, "args->transfer_id") }?,
        guard,
        // SAFETY: the pointer is NULL or valid for the call (this function's contract).
        lease: unsafe { a.lease.as_ref() },
        // SAFETY: the callback honours `mws_progress_fn` with its context for the call (this function's contract).
        progress: unsafe { CProgress::new(a.progress, a.progress_ctx) },
    })
}

/// `mws_store_upload` after the handle checks (shared with `mws_transaction_upload`).
///
/// # Safety
/// As `mws_store_upload`.
pub(crate) unsafe fn with_upload_args<T>(
    ws: &Arc<WeightStore>,
    binding: &mws_binding,
    args: *const mws_io_args,
    run: impl FnOnce(&RuntimeBinding, UploadArgs<'_>) -> mws::Result<T>,
) -> FfiResult<T> {
    // SAFETY: the io arguments and the binding's buffers satisfy this function's contract.
    let a = unsafe { io_args(args) }?;
    let rb = source_binding(binding, "")?;
    let lease = a.lease.map(|l| l.for_store(ws)).transpose()?;
    let report = a.progress.map(|c| move |p: &Progress| c.report(p));
    let ua = a.upload_args(lease.as_deref(), report.as_ref().map(|f| f as ProgressFn<'_>));
    Ok(run(&rb, ua)?)
}

/// The runtime binding of a source handle, or `MWS_INVALID_BINDING`
/// (`invalid source runtime binding: {at}...`; `at` names the handle in a list, e.g.
/// `"bindings[3]: "`, or is empty).
pub(crate) fn source_binding(binding: &mws_binding, at: &str) -> FfiResult<RuntimeBinding> {
    binding.build().map_err(|f| {
        Failure::new(mws_status::MWS_INVALID_BINDING, format!("invalid source runtime binding: {at}{}", f.message))
    })
}

impl<'a> IoArgs<'a> {
    /// The [`UploadArgs`] these arguments say, with `lease` (already checked against
    /// the store) in place of `self.lease` and `progress` (a trampoline to
    /// `self.progress` that the caller keeps alive for the call).
    pub(crate) fn upload_args<'x>(
        &'x self,
        lease: Option<&'x RegistrationLease>,
        progress: Option<ProgressFn<'x>>,
    ) -> UploadArgs<'x>
    where
        'a: 'x,
    {
        UploadArgs {
            worker_id: self.worker_id,
            guard: Some(&*self.guard),
            transfer_id: self.transfer_id,
            lease,
            progress,
        }
    }
}
