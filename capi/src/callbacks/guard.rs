//! `mws_guard_vtable`: a framework's allocation guard (pin, release with a terminal
//! state) as a `protocol::GuardProvider`.

use crate::args::Caller;
use crate::binding::mws_binding;
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::Ctx;
use mws::protocol::guards::GuardProvider;
use mws::protocol::guards::LifetimeToken;
use mws::protocol::guards::{Observed, ReleaseFn, ReleaseToken, StepPin, StepTransfer};
use mws::Error;
use mws::ErrorKind;
use mws::RuntimeBinding;
use std::ffi::c_char;
use std::ffi::c_void;
use std::ffi::CString;

/// How an allocation pin ends (the `state` passed to a guard's `release`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_terminal_state {
    /// No I/O was submitted (or registration failed before I/O).
    MWS_TERMINAL_ABORTED = 0,
    /// All I/O finished successfully.
    MWS_TERMINAL_COMPLETED = 1,
    /// I/O was submitted and failed; no submitted I/O can still touch the memory.
    MWS_TERMINAL_FAILED_DRAINED = 2,
}

/// Version of `mws_guard_vtable` this library implements.
pub const MWS_GUARD_VTABLE_VERSION: u32 = 1;

/// `acquire` callback: pins the allocations of `count` runtime fragment ids
/// (`fragment_ids`, sorted, distinct, borrowed for the call) of participant
/// `participant_id`, for transfer `transfer_id`. Returns 0 on success and writes an
/// opaque token to `*token` (given back to `release`). It may write to `*observed` a
/// new binding handle (ownership passes to the library) describing the buffers as
/// observed under the pin; leaving it NULL means "exactly the binding that was
/// passed". The library checks the observed binding against the plan (lease,
/// generation, addresses) and releases the pin as aborted if it differs. Return
/// `MWS_STALE_BINDING` when the buffers were freed or moved (the call fails
/// `MWS_STALE_BINDING`; a prepared transfer's step asks to be prepared again); any
/// other non-zero return fails the call (`MWS_STORE`). Either way before any I/O.
pub type mws_guard_acquire_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        transfer_id: *const c_char,
        participant_id: *const c_char,
        fragment_ids: *const *const c_char,
        count: usize,
        observed: *mut *mut mws_binding,
        token: *mut u64,
    ) -> i32,
>;

/// `release` callback: ends the pin `token` after I/O ended in `state` (an
/// `mws_terminal_state` value). Called exactly once per successful `acquire`. A
/// non-zero return is reported as `MWS_STORE`.
pub type mws_guard_release_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, token: u64, state: u32) -> i32>;

/// An allocation guard implemented by the caller: pins the buffers of a binding for
/// the duration of one upload or load (the framework must not free or reuse them
/// while pinned). Set `size = sizeof(mws_guard_vtable)` and
/// `version = MWS_GUARD_VTABLE_VERSION`; both callbacks are required. Callbacks get
/// the `guard_ctx` of `mws_io_args`, must be thread-safe and must not throw or unwind.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_guard_vtable {
    /// `sizeof(mws_guard_vtable)`.
    pub size: u32,
    /// `MWS_GUARD_VTABLE_VERSION`.
    pub version: u32,
    /// Pins (see `mws_guard_acquire_fn`).
    pub acquire: mws_guard_acquire_fn,
    /// Unpins (see `mws_guard_release_fn`).
    pub release: mws_guard_release_fn,
}

/// A [`GuardProvider`] over C callbacks (both checked present at construction).
pub(crate) struct CGuard {
    acquire: mws_guard_acquire_fn,
    release: mws_guard_release_fn,
    ctx: Ctx,
}

impl CGuard {
    pub(crate) fn new(
        acquire: mws_guard_acquire_fn,
        release: mws_guard_release_fn,
        ctx: *mut c_void,
    ) -> FfiResult<CGuard> {
        if acquire.is_none() || release.is_none() {
            return Err(Failure::invalid("an allocation guard needs both acquire and release callbacks"));
        }
        Ok(CGuard { acquire, release, ctx: Ctx(ctx) })
    }

    /// The guard of a caller's vtable (checked and copied) over `ctx`.
    pub(crate) fn from_vtable(c: Caller<'_>, vt: *const mws_guard_vtable, ctx: *mut c_void) -> FfiResult<CGuard> {
        let vt = c.vtable(vt, "mws_guard_vtable", MWS_GUARD_VTABLE_VERSION)?;
        CGuard::new(vt.acquire, vt.release, ctx)
    }
}

pub(crate) fn c_string(s: &str, what: &str) -> mws::Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

impl CGuard {
    /// Calls `acquire` for transfer `tid` with the participant and fragment ids of
    /// `ids`: the observed binding it may hand over (ours whatever the code) and the
    /// token of the pin.
    fn pin(&self, tid: &CString, ids: &CIds) -> mws::Result<(Option<Box<mws_binding>>, u64)> {
        let mut observed: *mut mws_binding = std::ptr::null_mut();
        let mut token: u64 = 0;
        let (pid, list, n) = (ids.participant.as_ptr(), ids.ptrs.as_ptr().cast(), ids.ptrs.len());
        let acquire = self.acquire.expect("checked at construction");
        // SAFETY: the guard vtable's checked `acquire` callback over the caller's `ctx`; every pointer passed points to a live local or to strings that outlive the call.
        let code = unsafe { acquire(self.ctx.0, tid.as_ptr(), pid, list, n, &mut observed, &mut token) };
        // SAFETY: a non-NULL `observed` is a binding the callback created with `mws_binding_new` (or `_clone`), whose ownership passes to us (the guard contract); the token: this runs inside the entry point whose guard it is.
        let observed = unsafe { Caller::trusted().take_handle(observed) }.map(Box::new);
        if code != 0 {
            return Err(acquire_failed(code));
        }
        Ok((observed, token))
    }

    /// How pin `token` ends: the vtable's `release` with the caller's `ctx`
    /// (`MWS_STORE` for a non-zero return).
    fn release(&self, token: u64) -> ReleaseFn {
        let (release, ctx) = (self.release.expect("checked at construction"), self.ctx);
        Box::new(move |state| {
            let ctx = ctx;
            // SAFETY: the guard vtable's checked `release` callback over the caller's `ctx`, with the token `acquire` issued.
            let code = unsafe { release(ctx.0, token, state.code()) };
            if code != 0 {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!("allocation guard release failed: error code {code}"),
                ));
            }
            Ok(())
        })
    }
}

/// A binding handed over by `acquire` as observed under the pin (`MWS_STALE_BINDING`
/// when it does not build).
fn observed_binding(b: &mws_binding) -> mws::Result<RuntimeBinding> {
    b.build().map_err(|f| Error::new(ErrorKind::StaleBinding, format!("observed binding is invalid: {}", f.message)))
}

impl GuardProvider for CGuard {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> mws::Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        let tid = c_string(transfer_id, "transfer id")?;
        let (observed, token) = self.pin(&tid, &CIds::new(expected.participant_id(), required_ids)?)?;
        let fresh = observed.map_or_else(|| Ok(expected.clone()), |b| observed_binding(&b));
        ReleaseToken::checked(fresh, required_ids, &format!("c-{transfer_id}"), self.release(token))
    }

    fn acquire_step(&self, transfer: &StepTransfer, pin: &StepPin) -> mws::Result<(Observed, Box<dyn LifetimeToken>)> {
        // The C strings of the participant and ids: built on the pin's first step and
        // kept with it (a step pins in O(1) of its fragments).
        let of_pin = || CIds::new(pin.binding().participant_id(), pin.required_ids());
        let cached = pin.cache().get_or_init(|| match of_pin() {
            Ok(ids) => Box::new(ids),
            Err(e) => Box::new(e),
        });
        let ids = match (cached.downcast_ref::<CIds>(), cached.downcast_ref::<Error>()) {
            (Some(ids), _) => ids,
            (None, Some(e)) => return Err(e.clone()),
            // Another guard type's cache: build them for this call.
            (None, None) => &of_pin()?,
        };
        let (observed, token) = self.pin(&c_string(transfer.id(), "transfer id")?, ids)?;
        let Some(b) = observed else {
            return Ok((Observed::Unchanged, ReleaseToken::lazy(pin.lazy_fence("c-", transfer), self.release(token))));
        };
        let token_id = format!("c-{}", transfer.id());
        let (fresh, token) =
            ReleaseToken::checked(observed_binding(&b), pin.required_ids(), &token_id, self.release(token))?;
        Ok((Observed::Binding(fresh), token))
    }
}

/// A participant and its fragment ids as C strings, with the pointer array `acquire`
/// takes (kept by a step pin in its cache).
struct CIds {
    participant: CString,
    _ids: Vec<CString>,
    /// Pointers into `_ids` (as addresses: the array is immutable once built).
    ptrs: Vec<usize>,
}

impl CIds {
    fn new(participant: &str, ids: &[String]) -> mws::Result<CIds> {
        let participant = c_string(participant, "participant id")?;
        let ids: Vec<CString> = ids.iter().map(|i| c_string(i, "fragment id")).collect::<mws::Result<_>>()?;
        let ptrs = ids.iter().map(|c| c.as_ptr() as usize).collect();
        Ok(CIds { participant, _ids: ids, ptrs })
    }
}

/// The error of a failed `acquire`: `MWS_STALE_BINDING` says the allocations are gone
/// or changed (a stale binding); any other code is a guard failure.
fn acquire_failed(code: i32) -> Error {
    if code == mws_status::MWS_STALE_BINDING as i32 {
        Error::new(ErrorKind::StaleBinding, "allocation guard reports the buffers freed or moved (MWS_STALE_BINDING)")
    } else {
        Error::new(ErrorKind::Store, format!("allocation guard acquire failed: error code {code}"))
    }
}
