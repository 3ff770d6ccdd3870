//! `mws_sink`: a source worker pushes its part of a live transfer into the remote
//! targets; wraps the core's `protocol::transfer::Sink`.

use crate::args::Caller;
use crate::binding::{bindings_arg, mws_binding};
use crate::boundary::{mws_status, FfiResult};
use crate::callbacks::progress::mws_progress_fn;
use crate::engine::mws_transfer_engine;
use crate::live::{self, LastReport};
use crate::live::{limits_arg, live_args, mws_executor_limits, mws_live_args, mws_live_report, mws_transfer_stats};
use crate::notify::key_arg;
use crate::placement::mws_placement;
use crate::prepared::mws_prepared_transfer;
use crate::step_handle::{mws_step_callback, mws_step_handle, on_complete};
use crate::transfer_plan::mws_transfer_plan;
use mws::plan::transfer_bind::TransferPlan;
use mws::protocol::transfer::{LiveArgs, Sink};
use mws::runtime::RuntimeBinding;
use mws::Placement;
use std::ffi::c_void;

/// A source worker's executor of a live transfer: pushes its part of a bound plan
/// into the remote targets (`mws_sink_execute`). Created by `mws_sink_new`, freed by
/// `mws_sink_free`; threading as `mws_loader`.
pub struct mws_sink {
    inner: Sink,
    report: LastReport,
}

handle!(mws_sink);

live_object!(mws_sink);

/// Creates a sink on `engine` with `limits` (NULL: defaults). New handle in `*out`.
///
/// Errors: as `mws_loader_new`.
///
/// # Safety
/// As `mws_loader_new`.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_new(
    engine: *const mws_transfer_engine,
    limits: *const mws_executor_limits,
    out: *mut *mut mws_sink,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let out = c.out(out, "out")?;
        let inner = Sink::new(e.engine.clone(), limits_arg(c, limits))?;
        out.give_handle(mws_sink { inner, report: LastReport::default() })
    })
}

/// Sets (or clears, with NULL) the progress callback of a sink (throttled
/// `MWS_PROGRESS_TRANSFER` progress; items = engine operations). As
/// `mws_loader_set_progress`.
///
/// # Safety
/// As `mws_loader_set_progress`.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_set_progress(
    sink: *const mws_sink,
    progress: mws_progress_fn,
    ctx: *mut c_void,
) -> mws_status {
    // SAFETY: this function's contract: the callback honours `mws_progress_fn` with
    // `ctx` until it is replaced or the sink is freed.
    status_call!(|c| unsafe { live::set_progress(c.handle(sink, "sink")?, progress, ctx) })
}

/// Requests cancellation of the running (and every later) execution, as
/// `mws_loader_cancel`. NULL does nothing.
///
/// # Safety
/// `sink` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_cancel(sink: *const mws_sink) {
    value_call!((), |c| live::cancel(c.opt_handle(sink), true))
}

/// Clears a cancellation request. NULL does nothing.
///
/// # Safety
/// `sink` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_reset_cancel(sink: *const mws_sink) {
    value_call!((), |c| live::cancel(c.opt_handle(sink), false))
}

/// Pushes every operation of the local source executor of `plan` (a bound plan) from
/// the buffers of `source_binding` into the remote targets (sink mode,
/// `live-transfer.md` §5). The remote target memory must be registered with the
/// engine by its owners for the given target bindings (passing them asserts it); the
/// local source buffers are registered for the call unless
/// `args.local_pre_registered`. A source participant the plan does not read from
/// (an unselected DP replica) succeeds with zero statistics. `stats` may be NULL.
/// Successful or not, the call's report is then `mws_sink_last_report`.
///
/// Errors: as `mws_loader_load_live`.
///
/// # Safety
/// As `mws_loader_load_live`, with the sides swapped.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_execute(
    sink: *const mws_sink,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let a =
            SinkCallArgs { plan, source_placement, source_binding, target_placement, target_bindings, n_targets, args };
        with_sink_call(c, sink, a, |s, call| {
            // SAFETY: this function's contract: every buffer of the bindings stays
            // valid for the call (and until a pending transfer is drained).
            let result = unsafe { s.inner.execute(call.0, call.1, call.2, call.3, call.4, call.5) };
            s.report.keep(c, result, stats)
        })
    })
}

/// The pointer arguments of a sink call after the sink (`mws_sink_execute`,
/// `mws_sink_execute_notified`, `mws_sink_prepare`), as C passed them.
struct SinkCallArgs {
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
}

/// The arguments of one sink call, translated: plan, source placement and binding,
/// target placement and bindings, live arguments.
type SinkCall<'a> =
    (&'a TransferPlan, &'a Placement, &'a RuntimeBinding, &'a Placement, &'a [RuntimeBinding], &'a LiveArgs<'a>);

/// The body of every sink call: translates the arguments (sink, plan, placements,
/// bindings, live arguments, in this order) and runs `run` with them.
fn with_sink_call(
    c: Caller<'_>,
    sink: *const mws_sink,
    a: SinkCallArgs,
    run: impl FnOnce(&mws_sink, SinkCall<'_>) -> FfiResult<()>,
) -> FfiResult<()> {
    let s = c.handle(sink, "sink")?;
    let bound = c.handle(a.plan, "plan")?.bound()?;
    let sp = c.handle(a.source_placement, "source_placement")?;
    let tp = c.handle(a.target_placement, "target_placement")?;
    let source = bindings_arg(c, &a.source_binding, 1, "source_binding")?.remove(0);
    let targets = bindings_arg(c, a.target_bindings, a.n_targets, "target_bindings")?;
    let args = live_args(c, a.args)?;
    run(s, (bound, &sp.inner, &source, &tp.inner, &targets, &args))
}

/// `mws_sink_execute` with the notify hook: after the stale-lease and
/// stale-generation checks (no engine call), sends `begin` to every endpoint of every
/// target participant the local source executor writes (through the engine's
/// `send_notify`), runs the sink call, and sends `done` to the same endpoints when
/// it returned normally. `key`/`key_len`: NULL and 0, or the key shared with the
/// targets' acceptors (at least 16 bytes). The transfer id is `args->transfer_id` or
/// a fresh one. Other arguments, `stats` and the report as `mws_sink_execute`.
///
/// Errors: as `mws_sink_execute`; `MWS_STALE_BINDING` before any engine call;
/// `MWS_UNSUPPORTED` when the engine's vtable has no `send_notify` (before any
/// transfer); `MWS_STORE` when a `begin` could not be delivered (nothing was
/// written) or a `done` could not be delivered (the bytes landed; that target stays
/// Torn until a later call completes). Thread safety: as `mws_sink_execute`.
///
/// # Safety
/// As `mws_sink_execute`; `key` is NULL or points to `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_execute_notified(
    sink: *const mws_sink,
    key: *const u8,
    key_len: usize,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let key = key_arg(c, key, key_len)?;
        let a =
            SinkCallArgs { plan, source_placement, source_binding, target_placement, target_bindings, n_targets, args };
        with_sink_call(c, sink, a, |s, call| {
            // SAFETY: this function's contract, as `mws_sink_execute`'s.
            let result = unsafe { s.inner.execute_notified(key, call.0, call.1, call.2, call.3, call.4, call.5) };
            s.report.keep(c, result, stats)
        })
    })
}

/// Prepares `mws_sink_execute` with these arguments for many steps: runs every check
/// of the call under the guard's pins, lowers the local source executor's operations
/// into engine batches and, unless `args.local_pre_registered`, registers the local
/// source allocations until the prepared transfer is closed or freed. Each
/// `mws_prepared_transfer_step` then pushes one weight generation (through this
/// sink's cancellation flag and progress callback). A source participant the plan
/// does not read from prepares a transfer whose steps do nothing. New handle in
/// `*out`; the guard of `args` (with its `guard_ctx`) is kept and must stay valid
/// until the prepared transfer is freed.
///
/// Errors: as `mws_sink_execute` before its first batch (nothing is submitted).
///
/// # Safety
/// As `mws_sink_execute` for the preparation; in addition the local source buffers
/// stay valid and at their addresses until the prepared transfer is freed, and the
/// guard callbacks honour their contract until then.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_prepare(
    sink: *const mws_sink,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
    out: *mut *mut mws_prepared_transfer,
) -> mws_status {
    status_call!(|c| {
        let a =
            SinkCallArgs { plan, source_placement, source_binding, target_placement, target_bindings, n_targets, args };
        with_sink_call(c, sink, a, |s, call| {
            let out = c.out(out, "out")?;
            // SAFETY: this function's contract: the buffers stay valid (the local ones
            // until the prepared transfer is freed).
            let p = unsafe { s.inner.prepare(call.0, call.1, call.2, call.3, call.4, call.5) }?;
            out.give_handle(mws_prepared_transfer::new(p))
        })
    })
}

/// `mws_sink_execute` without blocking: prepares the call on the calling thread (as
/// `mws_sink_prepare`: every check, the batches lowered, the local source buffers
/// registered unless `args.local_pre_registered`; no byte moved) and starts its one
/// step (the plan's weight generation, `args.transfer_id`) on the library's step
/// driver, as `mws_prepared_transfer_step_start` does; the registrations are
/// released when it ended. New step handle in `*out`; `callback` as there. The
/// call's outcome comes through the handle (`mws_step_handle_wait`,
/// `mws_step_handle_report`), not `mws_sink_last_report`.
///
/// Errors (nothing started): as `mws_sink_prepare`.
///
/// # Safety
/// As `mws_sink_execute`, until the step ended (every buffer stays valid and in
/// place while it runs; the guard callbacks honour their contract until then);
/// `callback`, when not NULL, may be called once from another thread with
/// `user_data` and does not unwind.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_execute_start(
    sink: *const mws_sink,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
    callback: mws_step_callback,
    user_data: *mut c_void,
    out: *mut *mut mws_step_handle,
) -> mws_status {
    status_call!(|c| {
        let a =
            SinkCallArgs { plan, source_placement, source_binding, target_placement, target_bindings, n_targets, args };
        with_sink_call(c, sink, a, |s, call| {
            let out = c.out(out, "out")?;
            let done = on_complete(callback, user_data);
            // SAFETY: this function's contract: the buffers stay valid until the step ended.
            let h = unsafe { s.inner.start_execute(call.0, call.1, call.2, call.3, call.4, call.5, done) }?;
            out.give_handle(mws_step_handle::new(h))
        })
    })
}

/// Writes the statistics of the sink's last successful call to `*out`.
///
/// # Safety
/// `sink` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_stats(sink: *const mws_sink, out: *mut mws_transfer_stats) -> mws_status {
    status_call!(|c| live::stats_out(c, c.handle(sink, "sink")?, out))
}

/// Writes the report of the sink's last call, successful or not, to `*out`: as
/// `mws_loader_last_report`, with one verdict per target participant the call writes
/// (each for this call's share: a target written by several sources is updated once
/// every one of their calls reports `MWS_TARGET_UPDATED`).
///
/// # Safety
/// `sink` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_last_report(sink: *const mws_sink, out: *mut mws_live_report) -> mws_status {
    status_call!(|c| live::report_out(c, c.handle(sink, "sink")?, out))
}

/// Frees a sink; NULL does nothing. Its prepared transfers stay usable (their steps
/// then report no progress).
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `sink` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_free(sink: *mut mws_sink) {
    value_call!((), |c| live::free(c, sink))
}
