//! `mws_step_handle`: a step of a live prepared transfer started without blocking
//! (`mws_prepared_transfer_step_start`); wraps the core's
//! `protocol::transfer::StepHandle`.

use crate::args::Caller;
use crate::boundary::{mws_status, set_last_error, Failure, FfiResult};
use crate::callbacks::Ctx;
use crate::live::{mws_live_report, mws_transfer_stats, LastReport};
use crate::prepared::MWS_STEP_VERIFY_CONTENT;
use crate::prepared::{leases, live, mws_prepared_transfer, mws_step_args, mws_target_held, request, step_notify};
use mws::protocol::transfer::{StepCallback, StepHandle, StepResult};
use std::ffi::c_void;
use std::time::Duration;

/// Runs once when a started step ended, on the library's step driver thread (not
/// the thread that started it), with the `user_data` given at the start and the
/// step's status (`MWS_OK`, or the error `mws_step_handle_wait` returns; during
/// the callback, `mws_last_error_message` on that thread gives its message). It
/// must be quick, must not unwind, and must not wait for another started step; it
/// may call any other function, including `mws_step_handle_free` of its own handle.
/// It runs after the outcome is published: `mws_step_handle_wait` and `_poll` may
/// see the step ended before its callback has run.
pub type mws_step_callback = Option<unsafe extern "C" fn(user_data: *mut c_void, status: mws_status)>;

/// The notify hook of a started sink step (`mws_prepared_transfer_step_start`), as
/// the arguments of `mws_prepared_transfer_step_notified`. Read during the start
/// call only (the key is copied).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_step_notify {
    /// NULL (unkeyed) or the key shared with the targets' acceptors (at least 16 bytes).
    pub key: *const u8,
    /// Bytes of `key` (0 when NULL).
    pub key_len: usize,
    /// 0, or `MWS_STEP_VERIFY_CONTENT` and/or `MWS_STEP_DELTA` (a delta step, as
    /// `mws_prepared_transfer_step_delta`: implies content verification).
    pub flags: u32,
    /// A delta step's held generations (`n_held` entries; NULL when 0).
    pub held: *const mws_target_held,
    /// Entries of `held`.
    pub n_held: usize,
}

/// `flags` of `mws_step_notify`: a delta step (see `mws_prepared_transfer_step_delta`).
pub const MWS_STEP_DELTA: u32 = 2;

/// A step started by `mws_prepared_transfer_step_start`: poll it, wait for it with a
/// timeout, cancel it, read its report once it ended. Freed by
/// `mws_step_handle_free`, which does not stop the step: it runs to its end on the
/// step driver, and the buffers it moves stay in use until then (cancel and wait
/// first to stop it early). The handle keeps its prepared transfer alive until the
/// step ended. Thread safety: every function may be called from any thread, the
/// waits concurrently.
pub struct mws_step_handle {
    inner: StepHandle,
    /// The report of the step once a wait or poll saw it end, in C form.
    report: LastReport,
}

handle!(mws_step_handle);

/// Keeps the callback's `user_data` for the driver thread.
struct Callback {
    f: unsafe extern "C" fn(*mut c_void, mws_status),
    user_data: Ctx,
}

impl Callback {
    fn run(self, result: &StepResult) {
        let status = match result {
            Ok(_) => mws_status::MWS_OK,
            Err(e) => {
                let failure = Failure::from(e.error.clone());
                set_last_error("mws_prepared_transfer_step_start", &failure.message);
                failure.status
            }
        };
        // SAFETY: `mws_prepared_transfer_step_start`'s contract: the callback may be
        // called with `user_data` once, from another thread, and does not unwind.
        unsafe { (self.f)(self.user_data.0, status) }
    }
}

/// Starts one step of a live prepared transfer without blocking, as
/// `mws_prepared_transfer_step` (or, with `notify` not NULL,
/// `mws_prepared_transfer_step_notified` of a prepared sink) would run it, and
/// writes its handle to `*out`. The step's checks, pins, notifications and batches
/// run on the library's step driver (one thread shared by every started step), which
/// follows each batch through the engine's own completion (its ticket status)
/// without blocking on it; an engine whose vtable has no ticketed submission runs
/// each batch on a thread of its own. Progress callbacks of the sink or loader run
/// on the driver thread. `callback` (NULL: none) runs once when the step ended.
///
/// The step's outcome is exactly that of the blocking step; read it with
/// `mws_step_handle_wait` (status, statistics) and `mws_step_handle_report`. It is
/// not the prepared transfer's `mws_prepared_transfer_last_report`. A step started
/// while another step of the same prepared transfer runs ends at once with
/// `MWS_INVALID_ARGUMENT` ("a step of this prepared transfer is running"); two
/// steps of one prepared transfer never overlap. A step may run while the caller
/// serves reads of other buffers. `mws_prepared_transfer_step` and
/// `mws_prepared_transfer_close` wait for a started step to end;
/// `mws_prepared_transfer_free` does not: the prepared transfer closes once the
/// step ended.
///
/// Errors (nothing started, `*out` untouched): `MWS_NULL_ARGUMENT` (`prepared`,
/// `args`, `out`), `MWS_INVALID_ARGUMENT` (a prepared restore, whose steps do not
/// start without blocking; `args->revision` set; a lease rotation's strings;
/// `notify` of unknown flags or a key shorter than 16 bytes), `MWS_INVALID_UTF8`.
/// Every error of the step itself comes through the handle.
///
/// # Safety
/// `prepared` is NULL or live; `args` is NULL or valid, with `n_leases` valid
/// entries; `notify` is NULL or valid, its `key` NULL or `key_len` readable bytes;
/// `out` is NULL or valid for a write. Every buffer of the prepared bindings, local
/// and remote, is valid at its prepared address and pinned by the guard until the
/// step ended (and, when completion is unknown, until the pending transfer is
/// drained). `callback`, when not NULL, may be called once from another thread with
/// `user_data` and does not unwind.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_step_start(
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    notify: *const mws_step_notify,
    callback: mws_step_callback,
    user_data: *mut c_void,
    out: *mut *mut mws_step_handle,
) -> mws_status {
    status_call!(|c| start(c, prepared, args, notify, callback, user_data, out))
}

fn start(
    c: Caller<'_>,
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    notify: *const mws_step_notify,
    callback: mws_step_callback,
    user_data: *mut c_void,
    out: *mut *mut mws_step_handle,
) -> FfiResult<()> {
    let p = live(c.handle(prepared, "prepared")?)?;
    let a = c.struct_ref(args, "args")?;
    let out = c.out(out, "out")?;
    let leases = leases(c, a)?;
    let mut step = request(c, a, &leases)?.live()?;
    let mut held = None;
    if let Some(n) = c.opt_struct(notify) {
        let delta = n.flags & MWS_STEP_DELTA != 0;
        let flags = if delta { (n.flags & !MWS_STEP_DELTA) | MWS_STEP_VERIFY_CONTENT } else { n.flags };
        step.notify = Some(step_notify(c, n.key, n.key_len, flags)?);
        if delta {
            held = Some(crate::prepared::held(c, n.held, n.n_held)?);
        }
    }
    step.delta = held.as_deref();
    // SAFETY: the entry point's contract: every prepared buffer is valid and pinned
    // until the step ended.
    let inner = unsafe { p.start_step(&step, on_complete(callback, user_data)) };
    out.give_handle(mws_step_handle::new(inner))
}

/// The core's completion callback of a C callback (NULL: none).
pub(crate) fn on_complete(callback: mws_step_callback, user_data: *mut c_void) -> Option<StepCallback> {
    callback.map(|f| {
        let cb = Callback { f, user_data: Ctx(user_data) };
        Box::new(move |r: &StepResult| cb.run(r)) as StepCallback
    })
}

impl mws_step_handle {
    pub(crate) fn new(inner: StepHandle) -> mws_step_handle {
        mws_step_handle { inner, report: LastReport::default() }
    }

    /// The step's status once it ended (keeping its report), `None` while it runs.
    fn settle(&self, result: Option<StepResult>, stats: *mut mws_transfer_stats, c: Caller<'_>) -> FfiResult<bool> {
        let Some(result) = result else { return Ok(false) };
        self.report.keep_first(c, result, stats).map(|_| true)
    }
}

/// Writes 1 to `*finished` when the started step ended, else 0; never blocks.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `step` is NULL or live; `finished` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_step_handle_poll(step: *const mws_step_handle, finished: *mut u32) -> mws_status {
    status_call!(|c| {
        let h = c.handle(step, "step")?;
        c.out(finished, "finished")?.give(u32::from(h.inner.is_finished()))
    })
}

/// Waits up to `timeout_ms` milliseconds (`UINT64_MAX`: no limit; 0: a poll) for the
/// started step to end. Still running then: returns `MWS_OK` with `*finished` = 0.
/// Ended: `*finished` = 1 and returns the step's status, as the blocking step would
/// (`MWS_OK`, with its statistics written to `*stats` when not NULL, or its error
/// and message); its report is then `mws_step_handle_report`. May be called again.
///
/// Errors (the step's aside): `MWS_NULL_ARGUMENT` (`step`, `finished`).
///
/// # Safety
/// `step` is NULL or live; `finished` is NULL or valid for a write; `stats` is NULL
/// or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_step_handle_wait(
    step: *const mws_step_handle,
    timeout_ms: u64,
    finished: *mut u32,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let h = c.handle(step, "step")?;
        let finished = c.out(finished, "finished")?;
        let timeout = (timeout_ms != u64::MAX).then(|| Duration::from_millis(timeout_ms));
        let result = h.inner.wait(timeout);
        finished.set(u32::from(result.is_some()));
        h.settle(result, stats, c).map(|_| ())
    })
}

/// Asks the started step to stop: it submits no further batch (a running batch runs
/// to its completion, which the step still follows) and ends with `MWS_STORE`
/// ("transfer was cancelled before a batch was submitted") unless it already ended.
/// Does not wait; idempotent.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `step` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_step_handle_cancel(step: *const mws_step_handle) -> mws_status {
    status_call!(|c| {
        c.handle(step, "step")?.inner.cancel();
        Ok(())
    })
}

/// Writes the report of the ended step (successful or not) to `*out`, as
/// `mws_prepared_transfer_last_report` does for a blocking step. Its pointers are
/// borrowed from the handle until it is freed.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_NOT_FOUND` (the step has not ended).
///
/// # Safety
/// `step` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_step_handle_report(step: *const mws_step_handle, out: *mut mws_live_report) -> mws_status {
    status_call!(|c| {
        let h = c.handle(step, "step")?;
        let out = c.out(out, "out")?;
        // The step's own error is not this call's: only its report is wanted.
        let _ = h.settle(h.inner.poll(), std::ptr::null_mut(), c);
        out.give(h.report.get("the step has not ended")?)
    })
}

/// Frees a step handle; NULL does nothing. The step, if still running, runs to its
/// end on the step driver (see `mws_step_handle`).
///
/// Thread safety: waits for the calls on the handle that other threads are running.
///
/// # Safety
/// `step` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_step_handle_free(step: *mut mws_step_handle) {
    value_call!((), |c| c.free(step))
}
