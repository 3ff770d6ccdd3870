//! The C progress callback (`mws_progress_fn` with its `ctx`), as handed in
//! `mws_io_args`, to `mws_writer_set_progress` and to `mws_loader_set_progress`,
//! translated into the Rust [`ProgressFn`](mws::protocol::ProgressFn).

use super::Ctx;
use mws::protocol::{Progress, ProgressPhase};
use std::ffi::c_void;

/// What a progress report describes (`mws_progress::phase`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_progress_phase {
    /// Payload writes into a store (upload, snapshot writer). Items: objects.
    MWS_PROGRESS_UPLOAD = 0,
    /// A restore from a store. Items: transfer regions.
    MWS_PROGRESS_RESTORE = 1,
    /// A live transfer (loader or sink). Items: engine operations.
    MWS_PROGRESS_TRANSFER = 2,
    /// Offline verification of stored payloads. Items: objects.
    MWS_PROGRESS_VERIFY = 3,
}

/// One progress report: how much of the current call's work has completed. Totals
/// are known when the call starts; `bytes_done == bytes_total` means the data phase
/// is over (the call's status still says whether it succeeded).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_progress {
    /// What the call is doing.
    pub phase: mws_progress_phase,
    /// Payload bytes completed so far.
    pub bytes_done: u64,
    /// Payload bytes the call moves in all.
    pub bytes_total: u64,
    /// Items completed so far (see `mws_progress_phase`).
    pub items_done: u64,
    /// Items the call handles in all.
    pub items_total: u64,
}

/// A progress callback. Called on the thread that made the call, inside it: once at
/// the start (0 done), at most every 100 ms while it runs, and once when the data
/// phase completed. `progress` is valid only during the callback. The callback must
/// be quick, must not unwind (C++: catch everything) and must not call back into the
/// object that reports (the store, writer or loader).
pub type mws_progress_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, progress: *const mws_progress)>;

/// A caller's callback with its context, callable as a Rust progress function.
#[derive(Clone, Copy)]
pub(crate) struct CProgress {
    f: unsafe extern "C" fn(*mut c_void, *const mws_progress),
    ctx: Ctx,
}

impl CProgress {
    /// `None` when no callback is given.
    ///
    /// # Safety
    /// `f`, when set, must honour the contract of [`mws_progress_fn`] with `ctx` for
    /// as long as the returned value is used.
    pub(crate) unsafe fn new(f: mws_progress_fn, ctx: *mut c_void) -> Option<Self> {
        f.map(|f| CProgress { f, ctx: Ctx(ctx) })
    }

    /// The callback as a core progress callback (kept by a loader, sink or writer).
    pub(crate) fn into_callback(self) -> mws::protocol::transfer::ProgressCallback {
        std::sync::Arc::new(move |p: &Progress| self.report(p))
    }

    /// Hands `p` to the callback.
    pub(crate) fn report(&self, p: &Progress) {
        let phase = match p.phase {
            ProgressPhase::Upload => mws_progress_phase::MWS_PROGRESS_UPLOAD,
            ProgressPhase::Restore => mws_progress_phase::MWS_PROGRESS_RESTORE,
            ProgressPhase::Transfer => mws_progress_phase::MWS_PROGRESS_TRANSFER,
            ProgressPhase::Verify => mws_progress_phase::MWS_PROGRESS_VERIFY,
        };
        let c = mws_progress {
            phase,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            items_done: p.items_done,
            items_total: p.items_total,
        };
        // SAFETY: `new`'s contract: the callback accepts `ctx` and a report valid for the call.
        unsafe { (self.f)(self.ctx.0, &c) };
    }
}
