//! `mws_registration_lease`: buffers pinned and registered once for many uploads or
//! loads (`WeightStore::register_weight_buffers`).

use crate::binding::mws_binding;
use crate::boundary::{mws_status, Failure};
use crate::callbacks::guard::{mws_guard_vtable, CGuard};
use crate::store::mws_store;
use mws::protocol::guards::GuardProvider;
use mws::protocol::guards::StaticGuard;
use mws::protocol::guards::TerminalState;
use mws::protocol::SharedLease;
use std::ffi::c_char;
use std::ffi::c_int;
use std::ffi::c_void;

/// A registration lease: the buffers of some runtime fragments of one binding, pinned
/// (allocation guard) and registered with the store's backend once, for any number of
/// `mws_store_upload` / `mws_store_load` calls that pass it in `mws_io_args.lease`
/// (those calls then neither pin nor register anything).
///
/// Created by `mws_registration_lease_new`, closed by `mws_registration_lease_close`
/// (unregisters and releases the pin with a terminal state), freed by
/// `mws_registration_lease_free` (which closes an open lease as
/// `MWS_TERMINAL_ABORTED` first). The lease keeps its store's backend alive.
///
/// Thread safety: uploads and loads using one lease may run concurrently; a close
/// waits until they returned.
pub struct mws_registration_lease {
    pub(crate) inner: SharedLease,
}

handle!(mws_registration_lease);

/// Which side of a transfer a registration lease pins (the `side` of
/// `mws_registration_lease_new`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_lease_side {
    /// Source buffers of uploads (snapshots).
    MWS_LEASE_SOURCE = 0,
    /// Target buffers of loads (restores).
    MWS_LEASE_TARGET = 1,
}

/// Pins (through `guard`) and registers the buffers of `count` runtime fragments
/// (`fragment_ids`, NUL-terminated, borrowed for the call; duplicates are ignored) of
/// `binding` with `store`'s backend, once. `side` is an `mws_lease_side` value.
/// `guard` NULL means a static guard (the caller keeps the buffers valid, as for
/// `mws_io_args.guard`); otherwise the vtable is copied and `guard_ctx` must stay
/// valid until the lease is closed (its `release` is called then). `transfer_id` NULL
/// means a fresh random one (handed to the guard).
///
/// A lease covers exactly the fragments an upload or load touches: pass it to
/// `mws_store_upload` (the source fragments of the participant's, or worker's,
/// operations) or `mws_store_load` (the participant's, or worker's, target fragments)
/// in `mws_io_args.lease`; those calls check it (`MWS_STALE_BINDING`: closed, other
/// binding, other fragments, other address bounds) before any I/O.
///
/// On success writes a new handle to `*out` (close it, then free it). On failure the
/// pin is released as aborted (or quarantined in the store when an unregistration
/// failed) and `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (no
/// fragments, invalid side, invalid guard vtable), `MWS_INVALID_BINDING`,
/// `MWS_STALE_BINDING` (unknown fragment, guard observed another binding),
/// `MWS_UNSUPPORTED` (guard vtable version), `MWS_STORE` (guard or registration
/// failure, pending registrations block new I/O).
///
/// # Safety
/// Handles are NULL or live; `fragment_ids` points to `count` pointers that are NULL
/// or NUL-terminated; `guard` is NULL or a valid vtable; `out` is NULL or valid for a
/// pointer write. The fragments' buffers must stay valid until the lease is closed.
#[no_mangle]
pub unsafe extern "C" fn mws_registration_lease_new(
    store: *const mws_store,
    binding: *const mws_binding,
    fragment_ids: *const *const c_char,
    count: usize,
    side: u32,
    guard: *const mws_guard_vtable,
    guard_ctx: *mut c_void,
    transfer_id: *const c_char,
    out: *mut *mut mws_registration_lease,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let b = c.handle(binding, "binding")?;
        let out = c.out(out, "out")?;
        // The core's names of the sides, in the order of `mws_lease_side`.
        let sides = ["source", "target"];
        let side = *sides.get(side as usize).ok_or_else(|| Failure::invalid(format!("invalid lease side: {side}")))?;
        let mut ids = Vec::with_capacity(count);
        for (i, &p) in c.slice(fragment_ids, count, "fragment_ids")?.iter().enumerate() {
            ids.push(c.str(p, &format!("fragment_ids[{i}]"))?.to_owned());
        }
        let transfer_id = c.opt_str(transfer_id, "transfer_id")?;
        let guard: Box<dyn GuardProvider> =
            if guard.is_null() { Box::new(StaticGuard) } else { Box::new(CGuard::from_vtable(c, guard, guard_ctx)?) };
        let rb = b.build_as("invalid runtime binding: ")?;
        let lease = s.ws.register_weight_buffers(&rb, &ids, &*guard, side, transfer_id)?;
        out.give_handle(mws_registration_lease { inner: SharedLease::new(s.ws.clone(), lease) })
    })
}

/// Closes `lease`: unregisters its buffers and releases its pin with `state` (an
/// `mws_terminal_state` value). Closing a closed lease does nothing and succeeds. Waits
/// for uploads and loads running with the lease. Uses of a closed lease are refused
/// (`MWS_STALE_BINDING`, `Store registration lease is closed`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (invalid state; the lease stays
/// open), `MWS_STORE` (an unregistration failed: the pin is quarantined in the store,
/// see `mws_store_drain_pending_registrations`; or the guard's release failed). The
/// lease is closed whatever the error, except for an invalid state.
///
/// # Safety
/// `lease` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_registration_lease_close(lease: *const mws_registration_lease, state: u32) -> mws_status {
    status_call!(|c| Ok(c.handle(lease, "lease")?.inner.close(TerminalState::from_code(state)?)?))
}

/// Returns 1 if `lease` is closed, 0 if open, -1 (and the last error) if `lease` is
/// NULL.
///
/// # Safety
/// `lease` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_registration_lease_is_closed(lease: *const mws_registration_lease) -> c_int {
    value_call!(-1, |c| Ok(c_int::from(c.handle(lease, "lease")?.inner.is_closed())))
}

/// Frees a lease handle. `NULL` does nothing. An open lease is closed first as
/// `MWS_TERMINAL_ABORTED` (errors are dropped; an unregistration failure leaves the
/// pin quarantined in the store, where `mws_store_pending_registration_count` sees
/// it). Close explicitly to report another state or to see errors.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `lease` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_registration_lease_free(lease: *mut mws_registration_lease) {
    value_call!((), |c| c.free(lease))
}
