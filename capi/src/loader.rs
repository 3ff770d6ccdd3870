//! `mws_loader`: fills the buffers of one target participant from a live source
//! through an engine (`mws_loader_load_live`) or from a stored revision
//! (`mws_loader_load_stored`); wraps the core's `protocol::transfer::Loader`.

use crate::args::Caller;
use crate::binding::{bindings_arg, mws_binding};
use crate::boundary::mws_status;
use crate::boundary::FfiResult;
use crate::callbacks::progress::mws_progress_fn;
use crate::engine::mws_transfer_engine;
use crate::io_args::{mws_io_args, with_load_args};
use crate::live::{self, LastReport};
use crate::live::{limits_arg, live_args, mws_executor_limits, mws_live_args, mws_live_report, mws_transfer_stats};
use crate::load_plan::{mws_load_plan, mws_load_stats, stats_out};
use crate::placement::mws_placement;
use crate::prepared::mws_prepared_transfer;
use crate::step_handle::{mws_step_callback, mws_step_handle, on_complete};
use crate::store::mws_store;
use crate::transfer_plan::mws_transfer_plan;
use mws::plan::transfer_bind::TransferPlan;
use mws::protocol::transfer::{LiveArgs, Loader, StoredPrepareArgs};
use mws::runtime::RuntimeBinding;
use mws::Placement;
use std::ffi::c_void;

/// Fills the buffers of one target participant, from a stored revision
/// (`mws_loader_load_stored`) or from a live source through an engine
/// (`mws_loader_load_live`), with a progress callback, a cancellation flag checked
/// between batches, the statistics of the last call and the report of the last live
/// call.
///
/// Created by `mws_loader_new`, freed by `mws_loader_free`. Thread safety: one call
/// at a time per loader (calls on one engine are serialized by the engine fence);
/// `mws_loader_cancel` may be called from any thread at any time.
pub struct mws_loader {
    inner: Loader,
    report: LastReport,
}

handle!(mws_loader);

live_object!(mws_loader);

/// Creates a loader on `engine` with `limits` (NULL: defaults). New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (limits), `MWS_STORE` (engine
/// identity cannot be resolved).
///
/// # Safety
/// Handles are NULL or live; `limits` is NULL or valid; `out` is NULL or valid for a
/// pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_new(
    engine: *const mws_transfer_engine,
    limits: *const mws_executor_limits,
    out: *mut *mut mws_loader,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let out = c.out(out, "out")?;
        let inner = Loader::new(e.engine.clone(), limits_arg(c, limits))?;
        out.give_handle(mws_loader { inner, report: LastReport::default() })
    })
}

/// Sets (or clears, with NULL) the progress callback of a loader: live loads report
/// throttled `MWS_PROGRESS_TRANSFER` progress (items = engine operations), stored
/// loads (`mws_loader_load_stored`) `MWS_PROGRESS_RESTORE` progress unless their io
/// arguments bring their own callback. `ctx` is passed to it and must stay valid
/// while it is set.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: may be called while a load runs; the
/// running load keeps the callback it started with.
///
/// # Safety
/// `loader` is NULL or live; `progress`, when set, honours `mws_progress_fn` with
/// `ctx` until it is replaced or the loader is freed.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_set_progress(
    loader: *const mws_loader,
    progress: mws_progress_fn,
    ctx: *mut c_void,
) -> mws_status {
    // SAFETY: this function's contract: the callback honours `mws_progress_fn` with
    // `ctx` until it is replaced or the loader is freed.
    status_call!(|c| unsafe { live::set_progress(c.handle(loader, "loader")?, progress, ctx) })
}

/// Requests cancellation: the running (and every later) load stops before its next
/// batch and fails (`MWS_STORE`, "cancelled"); completed batches stay written.
/// Reset with `mws_loader_reset_cancel`. NULL does nothing.
///
/// # Safety
/// `loader` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_cancel(loader: *const mws_loader) {
    value_call!((), |c| live::cancel(c.opt_handle(loader), true))
}

/// Clears a cancellation request. NULL does nothing.
///
/// # Safety
/// `loader` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_reset_cancel(loader: *const mws_loader) {
    value_call!((), |c| live::cancel(c.opt_handle(loader), false))
}

/// The raw arguments of one reader call (`mws_loader_load_live` and its prepared and
/// started forms).
struct ReaderCallArgs {
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_bindings: *const *const mws_binding,
    n_sources: usize,
    target_placement: *const mws_placement,
    target_binding: *const mws_binding,
    args: *const mws_live_args,
}

/// The arguments of one reader call, translated: plan, source placement and
/// bindings, target placement and binding, live arguments.
type ReaderCall<'a> =
    (&'a TransferPlan, &'a Placement, &'a [RuntimeBinding], &'a Placement, &'a RuntimeBinding, &'a LiveArgs<'a>);

/// The body of every reader call: translates the arguments (loader, plan,
/// placements, bindings, live arguments, in this order) and runs `run` with them.
fn with_reader_call(
    c: Caller<'_>,
    loader: *const mws_loader,
    a: ReaderCallArgs,
    run: impl FnOnce(&mws_loader, ReaderCall<'_>) -> FfiResult<()>,
) -> FfiResult<()> {
    let l = c.handle(loader, "loader")?;
    let bound = c.handle(a.plan, "plan")?.bound()?;
    let sp = c.handle(a.source_placement, "source_placement")?;
    let tp = c.handle(a.target_placement, "target_placement")?;
    let sources = bindings_arg(c, a.source_bindings, a.n_sources, "source_bindings")?;
    let target = bindings_arg(c, &a.target_binding, 1, "target_binding")?.remove(0);
    let args = live_args(c, a.args)?;
    run(l, (bound, &sp.inner, &sources, &tp.inner, &target, &args))
}

/// Pulls every operation of the local target executor of `plan` (a bound plan) into
/// the buffers of `target_binding`, reading from the sources through the engine
/// (reader mode, `live-transfer.md` §10). The remote source memory must be
/// registered with the engine by its owners for the given source bindings (passing
/// them asserts it); the local target buffers are registered for the call unless
/// `args.local_pre_registered`. Writes the call's statistics to `*stats` when not
/// NULL. Successful or not, the call's report is then `mws_loader_last_report`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING`, `MWS_INVALID_ARGUMENT`
/// (logical plan, contract errors), `MWS_LIMIT_EXCEEDED`, `MWS_STALE_BINDING`
/// (bindings or leases differ from the plan), `MWS_STORE` (engine failures,
/// cancellation, completion unknown: the message names the pending transfer id; see
/// `mws_transfer_engine_drain`).
///
/// # Safety
/// Handles are NULL or live; `source_bindings` holds `n_sources` handles; every
/// buffer of the bindings stays valid for the call (and, when completion is unknown,
/// until the pending transfer is drained).
#[no_mangle]
pub unsafe extern "C" fn mws_loader_load_live(
    loader: *const mws_loader,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_bindings: *const *const mws_binding,
    n_sources: usize,
    target_placement: *const mws_placement,
    target_binding: *const mws_binding,
    args: *const mws_live_args,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let a = ReaderCallArgs {
            plan,
            source_placement,
            source_bindings,
            n_sources,
            target_placement,
            target_binding,
            args,
        };
        with_reader_call(c, loader, a, |l, call| {
            // SAFETY: this function's contract: every buffer of the bindings stays
            // valid for the call (and until a pending transfer is drained).
            let result = unsafe { l.inner.load_live(call.0, call.1, call.2, call.3, call.4, call.5) };
            l.report.keep(c, result, stats)
        })
    })
}

/// Prepares `mws_loader_load_live` with these arguments for many steps: runs every
/// check of the call under the guard's pins, lowers the local target executor's
/// operations into engine batches and, unless `args.local_pre_registered`, registers
/// the local target allocations until the prepared transfer is closed or freed. Each
/// `mws_prepared_transfer_step` then pulls one weight generation (through this
/// loader's cancellation flag and progress callback). New handle in `*out`; the
/// guard of `args` (with its `guard_ctx`) is kept and must stay valid until the
/// prepared transfer is freed.
///
/// Errors: as `mws_loader_load_live` before its first batch (nothing is submitted).
///
/// # Safety
/// As `mws_loader_load_live` for the preparation; in addition the local target
/// buffers stay valid and at their addresses until the prepared transfer is freed,
/// and the guard callbacks honour their contract until then.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_prepare_live(
    loader: *const mws_loader,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_bindings: *const *const mws_binding,
    n_sources: usize,
    target_placement: *const mws_placement,
    target_binding: *const mws_binding,
    args: *const mws_live_args,
    out: *mut *mut mws_prepared_transfer,
) -> mws_status {
    status_call!(|c| {
        let a = ReaderCallArgs {
            plan,
            source_placement,
            source_bindings,
            n_sources,
            target_placement,
            target_binding,
            args,
        };
        with_reader_call(c, loader, a, |l, call| {
            let out = c.out(out, "out")?;
            // SAFETY: this function's contract: the buffers stay valid (the local ones
            // until the prepared transfer is freed).
            let p = unsafe { l.inner.prepare_live(call.0, call.1, call.2, call.3, call.4, call.5) }?;
            out.give_handle(mws_prepared_transfer::new(p))
        })
    })
}

/// `mws_loader_load_live` without blocking, as `mws_sink_execute_start` is for a
/// sink: prepared on the calling thread (as `mws_loader_prepare_live`), its one step
/// started on the library's step driver, the local target registrations released
/// when it ended. New step handle in `*out`.
///
/// Errors (nothing started): as `mws_loader_prepare_live`.
///
/// # Safety
/// As `mws_loader_load_live`, until the step ended; `callback` as for
/// `mws_sink_execute_start`.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_load_live_start(
    loader: *const mws_loader,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_bindings: *const *const mws_binding,
    n_sources: usize,
    target_placement: *const mws_placement,
    target_binding: *const mws_binding,
    args: *const mws_live_args,
    callback: mws_step_callback,
    user_data: *mut c_void,
    out: *mut *mut mws_step_handle,
) -> mws_status {
    status_call!(|c| {
        let a = ReaderCallArgs {
            plan,
            source_placement,
            source_bindings,
            n_sources,
            target_placement,
            target_binding,
            args,
        };
        with_reader_call(c, loader, a, |l, call| {
            let out = c.out(out, "out")?;
            let done = on_complete(callback, user_data);
            // SAFETY: this function's contract: the buffers stay valid until the step ended.
            let h = unsafe { l.inner.start_load_live(call.0, call.1, call.2, call.3, call.4, call.5, done) }?;
            out.give_handle(mws_step_handle::new(h))
        })
    })
}

/// Prepares restores of `binding`'s part of `plan`'s layout from `store`, one revision
/// or weight generation per `mws_prepared_transfer_step` (`args.weight_generation`,
/// `args.revision`; NULL: the plan's revision): each step reads that revision's
/// manifest (refused with "prepare the transfer again" unless it holds the prepared
/// layout: the same tensors and stored fragments), attests the same placement and
/// binding for its identity, plans this participant's part and restores it as
/// `mws_store_load` does (committed-manifest check, pin, registration, reads). `plan`
/// is a load plan of that layout (for example the first revision's) and `binding` one
/// of its bindings. Only `worker_id` and the guard of `args` are used (NULL: the
/// defaults); the guard and its context are kept until the prepared transfer is freed,
/// as is the store. New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING`, `MWS_STALE_BINDING` (`binding`
/// is not one of the plan's).
///
/// # Safety
/// Handles are NULL or live; `args` is NULL or valid; `out` is NULL or valid for a
/// pointer write; the guard callbacks honour their contract until the prepared
/// transfer is freed.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_prepare_stored(
    loader: *const mws_loader,
    store: *const mws_store,
    plan: *const mws_load_plan,
    binding: *const mws_binding,
    args: *const mws_live_args,
    out: *mut *mut mws_prepared_transfer,
) -> mws_status {
    status_call!(|c| {
        let l = c.handle(loader, "loader")?;
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let b = bindings_arg(c, &binding, 1, "binding")?.remove(0);
        let a = live_args(c, args)?;
        let out = c.out(out, "out")?;
        let args = StoredPrepareArgs { worker_id: a.worker_id.map(str::to_string), guard: a.guard };
        let prepared = l.inner.prepare_stored(s.ws.clone(), &p.inner, &b, args)?;
        out.give_handle(mws_prepared_transfer::stored(prepared))
    })
}

/// Restores the part of `plan` that belongs to `binding` from `store` (as
/// `mws_store_load`: same arguments, errors and safety), honouring the loader's
/// cancellation flag (checked before the call), its progress callback (unless `args`
/// sets one) and recording the statistics. `stats` may be NULL.
///
/// # Safety
/// As `mws_store_load`.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_load_stored(
    loader: *const mws_loader,
    store: *const mws_store,
    plan: *const mws_load_plan,
    binding: *const mws_binding,
    args: *const mws_io_args,
    stats: *mut mws_load_stats,
) -> mws_status {
    status_call!(|c| {
        let l = c.handle(loader, "loader")?;
        let s = c.handle(store, "store")?;
        let p = c.handle(plan, "plan")?;
        let b = c.handle(binding, "binding")?;
        let st = with_load_args(c, &s.ws, b, args, |rb, la| {
            // SAFETY: this function's contract (`mws_store_load`'s): the target buffers
            // are valid for writes and untouched by anyone else during the call.
            unsafe { l.inner.load_stored(&s.ws, &p.inner, rb, la) }
        })?;
        c.opt_set(stats, stats_out(st));
        Ok(())
    })
}

/// Writes the statistics of the loader's last successful call to `*out`.
///
/// # Safety
/// `loader` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_stats(loader: *const mws_loader, out: *mut mws_transfer_stats) -> mws_status {
    status_call!(|c| live::stats_out(c, c.handle(loader, "loader")?, out))
}

/// Writes the report of the loader's last live call (`mws_loader_load_live`),
/// successful or not, to `*out`: whether anything was submitted to the engine, how
/// the guards' pins were released, the pending transfer (if any) and the verdict for
/// the target participant. Its pointers are borrowed from the loader until its next
/// call or its free.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_NOT_FOUND` (no live call yet). Thread safety: not
/// concurrently with a call on the same loader.
///
/// # Safety
/// `loader` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_last_report(loader: *const mws_loader, out: *mut mws_live_report) -> mws_status {
    status_call!(|c| live::report_out(c, c.handle(loader, "loader")?, out))
}

/// Frees a loader; NULL does nothing. Its prepared transfers stay usable (their steps
/// then report no progress).
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `loader` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_free(loader: *mut mws_loader) {
    value_call!((), |c| live::free(c, loader))
}
