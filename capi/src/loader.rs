//! `mws_transfer_engine` (an engine handle: the embedded `LocalEngine` or a caller's
//! `mws_transfer_engine_vtable`), `mws_loader` (fills the buffers of one target
//! participant from a stored revision or from a live source) and `mws_sink` (a
//! source worker pushes its part of a live transfer).

use std::ffi::{c_char, c_void};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::engine::{mws_transfer_engine_vtable, CallbackEngine};
use crate::callbacks::guard::{mws_guard_vtable, CGuard};
use crate::callbacks::progress::{mws_progress_fn, CProgress};
use crate::handles::{handle, mws_binding, Handle};
use crate::handles::{mws_load_plan, mws_placement, mws_store};
use crate::io_args::mws_io_args;
use crate::load_plan::mws_load_stats;
use crate::strings::{check_out, opt_str_arg, write_out};
use crate::transfer_plan::{bindings_arg, mws_transfer_plan};
use mws::engine::local::LocalEngine;
use mws::engine::{MemoryRegion, TransferEngine};
use mws::plan::transfer_bind::Side;
use mws::protocol::guards::{GuardProvider, StaticGuard};
use mws::protocol::transfer::{
    ExecutionStats, ExecutorLimits, GuardProviders, MemoryRegistrationLease, ReaderArgs, SinkArgs, TransferError,
    TransferExecutor, TransferReceipt,
};
use mws::protocol::{Progress, ProgressFn};
use mws::runtime::{MemoryKind, RuntimeBinding};

/// A transfer engine: the embedded in-process engine or a caller's vtable.
///
/// Created by `mws_transfer_engine_new_local` or `mws_transfer_engine_from_vtable`,
/// freed by `mws_transfer_engine_free`. Loaders and sinks keep their engine alive.
/// Thread safety: every function may run concurrently on one engine (the executors
/// allow one submission per engine identity at a time and refuse the others).
pub struct mws_transfer_engine {
    engine: Arc<dyn TransferEngine>,
}

impl Handle for mws_transfer_engine {}

/// Executor limits (`mws_loader_new`, `mws_sink_new`); a NULL pointer means the
/// defaults (1024, 1000000, 10000000, 3, 1000, 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_executor_limits {
    /// Engine operations per batch (> 0; merged segments count once).
    pub max_batch_operations: u64,
    /// Largest `segment_count` of one region (> 0).
    pub max_region_segments: u64,
    /// Segments of one call (> 0).
    pub max_total_lowered_segments: u64,
    /// Inline drains of an unknown ticket (0 = none).
    pub max_completion_drain_attempts: u32,
    /// Timeout of one inline drain, milliseconds.
    pub completion_drain_timeout_ms: u64,
    /// 0 (default): adjacent segments of a batch (same pair of allocations, source and
    /// target both contiguous) are merged into one engine operation; the bytes moved,
    /// the plan and the receipts are the same either way. Non-zero: one engine
    /// operation per planned segment (the reference's request pattern).
    pub no_coalescing: u32,
}

/// Statistics of the last call of a loader or sink.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_transfer_stats {
    /// Bytes moved.
    pub bytes: u64,
    /// Regions (operations of the plan) executed.
    pub regions: u64,
    /// Planned segments moved (the receipts' operation counts; stored loads: ranged
    /// reads).
    pub operations: u64,
    /// Receipts (one per remote endpoint; stored loads: requests).
    pub receipts: u64,
    /// Operations submitted to the engine for them: at most `operations`, fewer when
    /// adjacent segments were merged (stored loads: equal to `operations`).
    pub engine_operations: u64,
}

/// Per-call arguments of a live load or a sink execution. A NULL pointer or a zeroed
/// struct means the defaults. Strings are only read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_live_args {
    /// Restricts the call to one worker of the local binding (NULL: its one worker).
    pub worker_id: *const c_char,
    /// Transfer id handed to the guards (NULL: a fresh random id).
    pub transfer_id: *const c_char,
    /// Non-zero: the local buffers are registered with the engine by their owner
    /// (`mws_transfer_engine_register_memory`); zero: the call registers their whole
    /// allocations and unregisters them after.
    pub local_pre_registered: i32,
    /// Allocation guard of the local and remote buffers (NULL: a static guard; the
    /// caller keeps every buffer valid and untouched for the call).
    pub guard: *const mws_guard_vtable,
    /// Passed to the guard's callbacks.
    pub guard_ctx: *mut c_void,
}

fn limits_arg(l: *const mws_executor_limits) -> ExecutorLimits {
    // SAFETY: the caller passes NULL or a valid struct.
    match unsafe { l.as_ref() } {
        None => ExecutorLimits::default(),
        Some(l) => ExecutorLimits {
            max_batch_operations: l.max_batch_operations,
            max_region_segments: l.max_region_segments,
            max_total_lowered_segments: l.max_total_lowered_segments,
            max_completion_drain_attempts: l.max_completion_drain_attempts,
            completion_drain_timeout_ms: l.completion_drain_timeout_ms,
            coalesce_adjacent: l.no_coalescing == 0,
        },
    }
}

pub(crate) fn transfer_failure(e: TransferError) -> Failure {
    let mut msg = e.message.clone();
    if let Some(id) = &e.pending_transfer_id {
        if !msg.contains(id.as_str()) {
            msg.push_str(&format!(" (pending transfer {id})"));
        }
    }
    Failure::new(mws_status::from_kind(e.error_kind), msg)
}

/// Creates the embedded engine (memcpy between memory registered in this process;
/// device memory is refused at registration). New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_new_local(out: *mut *mut mws_transfer_engine) -> mws_status {
    status_call!(|| {
        check_out(out, "out")?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_transfer_engine { engine: Arc::new(LocalEngine::new()) })) };
        Ok(())
    })
}

/// Wraps a caller's engine (for example Mooncake's `TransferEngine`): the vtable is
/// copied; `ctx` and the callbacks must stay valid and thread-safe until the handle
/// and every loader or sink made from it are freed. New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (size, a required callback is
/// NULL), `MWS_UNSUPPORTED` (version).
///
/// # Safety
/// `vt` is NULL or a readable vtable of at least its `size`; `out` is NULL or valid
/// for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_from_vtable(
    vt: *const mws_transfer_engine_vtable,
    ctx: *mut c_void,
    out: *mut *mut mws_transfer_engine,
) -> mws_status {
    status_call!(|| {
        check_out(out, "out")?;
        if vt.is_null() {
            return Err(Failure::null("vt"));
        }
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let engine = unsafe { CallbackEngine::new(vt, ctx) }?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_transfer_engine { engine })) };
        Ok(())
    })
}

/// Registers `[address, address + len)` with the engine (the owner's
/// pre-registration of a whole allocation). `memory_kind` is an `mws_memory_kind`
/// value, `device` the ordinal for device memory.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (memory kind, zero length),
/// `MWS_STORE` (the engine refused: overlap with a registered region, device memory
/// without a copy path, or the engine's code).
///
/// # Safety
/// The memory must stay valid for reads and writes until it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_register_memory(
    engine: *const mws_transfer_engine,
    address: *const c_void,
    len: u64,
    memory_kind: u32,
    device: u32,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        if address.is_null() {
            return Err(Failure::null("address"));
        }
        if len == 0 {
            return Err(Failure::invalid("registration length must be positive"));
        }
        let kind = match memory_kind {
            0 => MemoryKind::Host,
            1 => MemoryKind::Device(device),
            k => return Err(Failure::invalid(format!("invalid memory kind: {k}"))),
        };
        let region = MemoryRegion { address: address as u64, len, kind };
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        match unsafe { e.engine.register_memory(region) } {
            Ok(0) => Ok(()),
            Ok(code) => Err(Failure::new(mws_status::MWS_STORE, format!("register_memory failed: {code}"))),
            Err(err) => Err(Failure::new(mws_status::MWS_STORE, format!("register_memory failed: {err}"))),
        }
    })
}

/// Unregisters the region registered at `address`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STORE` (the engine's code).
///
/// # Safety
/// `engine` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_unregister_memory(
    engine: *const mws_transfer_engine,
    address: *const c_void,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        match e.engine.unregister_memory(address as u64) {
            Ok(0) => Ok(()),
            Ok(code) => Err(Failure::new(mws_status::MWS_STORE, format!("unregister_memory failed: {code}"))),
            Err(err) => Err(Failure::new(mws_status::MWS_STORE, format!("unregister_memory failed: {err}"))),
        }
    })
}

/// Frees an engine handle; NULL does nothing. Loaders and sinks made from it keep
/// the engine alive.
///
/// # Safety
/// `engine` is NULL or a live handle not yet freed and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_free(engine: *mut mws_transfer_engine) {
    value_call!((), || {
        // SAFETY: `engine` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(engine) };
        Ok(())
    })
}

/// State shared by loaders and sinks.
pub(crate) struct Executor {
    pub(crate) exec: TransferExecutor,
    pub(crate) cancel: AtomicBool,
    progress: Mutex<Option<CProgress>>,
    pub(crate) stats: Mutex<mws_transfer_stats>,
}

impl Executor {
    fn new(engine: &mws_transfer_engine, limits: *const mws_executor_limits) -> FfiResult<Executor> {
        let exec = TransferExecutor::new(engine.engine.clone(), limits_arg(limits)).map_err(transfer_failure)?;
        Ok(Executor {
            exec,
            cancel: AtomicBool::new(false),
            progress: Mutex::new(None),
            stats: Mutex::new(mws_transfer_stats::default()),
        })
    }

    pub(crate) fn record(
        &self,
        plan: &mws_transfer_plan,
        side: Side,
        receipts: &[TransferReceipt],
        local: &RuntimeBinding,
        exec: &ExecutionStats,
    ) {
        let bound = plan.bound.as_ref().expect("a live call has a bound plan");
        let regions = bound
            .executors(side)
            .iter()
            .filter(|e| e.participant_id == local.participant_id() && e.instance_id == local.instance_id())
            .map(|e| e.operation_indices.len() as u64)
            .sum();
        *self.stats.lock() = mws_transfer_stats {
            bytes: receipts.iter().map(|r| r.nbytes).sum(),
            regions: if receipts.is_empty() { 0 } else { regions },
            operations: receipts.iter().map(|r| r.operation_count).sum(),
            receipts: receipts.len() as u64,
            engine_operations: exec.snapshot().1,
        };
    }
}

pub(crate) struct LiveCall {
    pub(crate) guards: GuardProviders,
    pub(crate) worker: Option<String>,
    pub(crate) transfer_id: Option<String>,
    pub(crate) pre_registered: bool,
}

pub(crate) unsafe fn live_args(args: *const mws_live_args) -> FfiResult<LiveCall> {
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    let Some(a) = (unsafe { args.as_ref() }) else {
        return Ok(LiveCall {
            guards: GuardProviders::all(Arc::new(StaticGuard)),
            worker: None,
            transfer_id: None,
            pre_registered: false,
        });
    };
    let guard: Arc<dyn GuardProvider> =
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        if a.guard.is_null() { Arc::new(StaticGuard) } else { Arc::new(unsafe { CGuard::from_vtable(a.guard, a.guard_ctx) }?) };
    Ok(LiveCall {
        guards: GuardProviders::all(guard),
        // SAFETY: `a.worker_id` is NULL or a NUL-terminated string valid for the call (this function's contract).
        worker: unsafe { opt_str_arg(a.worker_id, "args.worker_id") }?.map(str::to_string),
        // SAFETY: `a.transfer_id` is NULL or a NUL-terminated string valid for the call (this function's contract).
        transfer_id: unsafe { opt_str_arg(a.transfer_id, "args.transfer_id") }?.map(str::to_string),
        pre_registered: a.local_pre_registered != 0,
    })
}

/// Evidence for remote memory that its owners registered for their bindings' current
/// generation (the caller asserts it by passing the bindings).
pub(crate) fn leases_of(bindings: &[RuntimeBinding]) -> Vec<MemoryRegistrationLease> {
    bindings
        .iter()
        .flat_map(|b| {
            b.fragments().iter().map(|f| MemoryRegistrationLease::from_fragment(f, b.generation(), Some(b.lease_id())))
        })
        .collect()
}

/// Fills the buffers of one target participant, from a stored revision
/// (`mws_loader_load_stored`) or from a live source through an engine
/// (`mws_loader_load_live`), with a progress callback, a cancellation flag checked
/// between batches, and the statistics of the last call.
///
/// Created by `mws_loader_new`, freed by `mws_loader_free`. Thread safety: one call
/// at a time per loader (calls on one engine are serialized by the engine fence);
/// `mws_loader_cancel` may be called from any thread at any time.
pub struct mws_loader {
    inner: Executor,
}

impl Handle for mws_loader {}

/// A source worker's executor of a live transfer: pushes its part of a bound plan
/// into the remote targets (`mws_sink_execute`). Created by `mws_sink_new`, freed by
/// `mws_sink_free`; threading as `mws_loader`.
pub struct mws_sink {
    pub(crate) inner: Executor,
}

impl Handle for mws_sink {}

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
    status_call!(|| {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        check_out(out, "out")?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_loader { inner: Executor::new(e, limits)? })) };
        Ok(())
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
    status_call!(|| {
        // SAFETY: `loader` is NULL or a live handle of this type (this function's contract).
        let l = unsafe { handle(loader, "loader") }?;
        // SAFETY: this function's contract: the callback honours `mws_progress_fn` with `ctx`.
        *l.inner.progress.lock() = unsafe { CProgress::new(progress, ctx) };
        Ok(())
    })
}

/// Requests cancellation: the running (and every later) live load stops before its
/// next batch and fails (`MWS_STORE`, "cancelled"); completed batches stay written.
/// Reset with `mws_loader_reset_cancel`. NULL does nothing.
///
/// # Safety
/// `loader` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_cancel(loader: *const mws_loader) {
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    if let Some(l) = unsafe { loader.as_ref() } {
        l.inner.cancel.store(true, Ordering::Release);
    }
}

/// Clears a cancellation request. NULL does nothing.
///
/// # Safety
/// `loader` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_reset_cancel(loader: *const mws_loader) {
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    if let Some(l) = unsafe { loader.as_ref() } {
        l.inner.cancel.store(false, Ordering::Release);
    }
}

/// Pulls every operation of the local target executor of `plan` (a bound plan) into
/// the buffers of `target_binding`, reading from the sources through the engine
/// (reader mode, `live-transfer.md` §10). The remote source memory must be
/// registered with the engine by its owners for the given source bindings (passing
/// them asserts it); the local target buffers are registered for the call unless
/// `args.local_pre_registered`. Writes the call's statistics to `*stats` when not
/// NULL.
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
#[allow(clippy::too_many_arguments)]
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
    status_call!(|| {
        // SAFETY: `loader` is NULL or a live handle of this type (this function's contract).
        let l = &unsafe { handle(loader, "loader") }?.inner;
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        let bound = p.bound()?;
        // SAFETY: `source_placement` is NULL or a live handle of this type (this function's contract).
        let sp = unsafe { handle(source_placement, "source_placement") }?;
        // SAFETY: `target_placement` is NULL or a live handle of this type (this function's contract).
        let tp = unsafe { handle(target_placement, "target_placement") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let sources = unsafe { bindings_arg(source_bindings, n_sources, "source_bindings") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let target = unsafe { bindings_arg(&target_binding, 1, "target_binding") }?.remove(0);
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let call = unsafe { live_args(args) }?;
        let sl = leases_of(&sources);
        let tl = leases_of(std::slice::from_ref(&target));
        let progress = *l.progress.lock();
        let cb = progress.map(|c| move |p: &Progress| c.report(p));
        let exec_stats = ExecutionStats::default();
        let rargs = ReaderArgs {
            target_worker_id: call.worker.as_deref(),
            source_pre_registered: true,
            source_registrations: Some(&sl),
            target_pre_registered: call.pre_registered,
            target_registrations: call.pre_registered.then_some(tl.as_slice()),
            source_guards: Some(&call.guards),
            target_guards: Some(&call.guards),
            transfer_id: call.transfer_id.as_deref(),
            cancel: Some(&l.cancel),
            progress: cb.as_ref().map(|f| f as ProgressFn<'_>),
            stats: Some(&exec_stats),
        };
        let receipts =
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            unsafe { l.exec.execute_reader(bound, &sp.inner, &sources, &tp.inner, &target, &rargs) }.map_err(transfer_failure)?;
        l.record(p, Side::Target, &receipts, &target, &exec_stats);
        if !stats.is_null() {
            // SAFETY: `stats` was checked non-NULL and is valid for a write (this function's contract).
            unsafe { write_out(stats, *l.stats.lock()) };
        }
        Ok(())
    })
}

/// Restores the part of `plan` that belongs to `binding` from `store` (delegates to
/// `mws_store_load`; same arguments, errors and safety), honouring the loader's
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
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    let l = match unsafe { loader.as_ref() } {
        Some(l) => &l.inner,
        None => {
            return status_call!(|| Err(Failure::null("loader")));
        }
    };
    if l.cancel.load(Ordering::Acquire) {
        return status_call!(|| { Err(Failure::new(mws_status::MWS_STORE, "load was cancelled before it started")) });
    }
    let mut s = mws_load_stats::default();
    // The loader's progress callback, unless the call brings its own.
    // SAFETY: the pointer is NULL or valid for the call (this function's contract).
    let mut call_args = unsafe { args.as_ref() }.copied().unwrap_or_else(mws_io_args::none);
    if call_args.progress.is_none() {
        if let Some(c) = *l.progress.lock() {
            (call_args.progress, call_args.progress_ctx) = c.raw();
        }
    }
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    let status = unsafe { crate::store::mws_store_load(store, plan, binding, &call_args, &mut s) };
    if status == mws_status::MWS_OK {
        *l.stats.lock() = mws_transfer_stats {
            bytes: s.bytes,
            regions: s.regions,
            operations: s.ranges,
            receipts: s.requests,
            engine_operations: s.ranges,
        };
        if !stats.is_null() {
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            unsafe { *stats = s };
        }
    }
    status
}

/// Writes the statistics of the loader's last successful call to `*out`.
///
/// # Safety
/// `loader` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_stats(loader: *const mws_loader, out: *mut mws_transfer_stats) -> mws_status {
    status_call!(|| {
        // SAFETY: `loader` is NULL or a live handle of this type (this function's contract).
        let l = unsafe { handle(loader, "loader") }?;
        check_out(out, "out")?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, *l.inner.stats.lock()) };
        Ok(())
    })
}

/// Frees a loader; NULL does nothing.
///
/// # Safety
/// `loader` is NULL or a live handle not yet freed and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_loader_free(loader: *mut mws_loader) {
    value_call!((), || {
        // SAFETY: `loader` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(loader) };
        Ok(())
    })
}

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
    status_call!(|| {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        check_out(out, "out")?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_sink { inner: Executor::new(e, limits)? })) };
        Ok(())
    })
}

/// Pushes every operation of the local source executor of `plan` (a bound plan) from
/// the buffers of `source_binding` into the remote targets (sink mode,
/// `live-transfer.md` §5). The remote target memory must be registered with the
/// engine by its owners for the given target bindings (passing them asserts it); the
/// local source buffers are registered for the call unless
/// `args.local_pre_registered`. A source participant the plan does not read from
/// (an unselected DP replica) succeeds with zero statistics. `stats` may be NULL.
///
/// Errors: as `mws_loader_load_live`.
///
/// # Safety
/// As `mws_loader_load_live`, with the sides swapped.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
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
    status_call!(|| {
        // SAFETY: `sink` is NULL or a live handle of this type (this function's contract).
        let s = &unsafe { handle(sink, "sink") }?.inner;
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        let bound = p.bound()?;
        // SAFETY: `source_placement` is NULL or a live handle of this type (this function's contract).
        let sp = unsafe { handle(source_placement, "source_placement") }?;
        // SAFETY: `target_placement` is NULL or a live handle of this type (this function's contract).
        let tp = unsafe { handle(target_placement, "target_placement") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let source = unsafe { bindings_arg(&source_binding, 1, "source_binding") }?.remove(0);
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let targets = unsafe { bindings_arg(target_bindings, n_targets, "target_bindings") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let call = unsafe { live_args(args) }?;
        let tl = leases_of(&targets);
        let sl = leases_of(std::slice::from_ref(&source));
        let exec_stats = ExecutionStats::default();
        let sargs = SinkArgs {
            source_worker_id: call.worker.as_deref(),
            target_registrations: Some(&tl),
            source_pre_registered: call.pre_registered,
            source_registrations: call.pre_registered.then_some(sl.as_slice()),
            source_guards: Some(&call.guards),
            target_guards: Some(&call.guards),
            transfer_id: call.transfer_id.as_deref(),
            cancel: Some(&s.cancel),
            progress: None,
            stats: Some(&exec_stats),
        };
        let receipts =
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            unsafe { s.exec.execute_sink(bound, &sp.inner, &source, &tp.inner, &targets, &sargs) }.map_err(transfer_failure)?;
        s.record(p, Side::Source, &receipts, &source, &exec_stats);
        if !stats.is_null() {
            // SAFETY: `stats` was checked non-NULL and is valid for a write (this function's contract).
            unsafe { write_out(stats, *s.stats.lock()) };
        }
        Ok(())
    })
}

/// Frees a sink; NULL does nothing.
///
/// # Safety
/// `sink` is NULL or a live handle not yet freed and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_sink_free(sink: *mut mws_sink) {
    value_call!((), || {
        // SAFETY: `sink` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(sink) };
        Ok(())
    })
}

/// Number of pending transfers (completion unknown, or quarantined registrations)
/// that block `engine`; 0 for NULL.
///
/// # Safety
/// `engine` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_pending_count(engine: *const mws_transfer_engine) -> usize {
    value_call!(0, || {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        let id = e.engine.identity().map_err(|m| Failure::new(mws_status::MWS_STORE, m))?;
        Ok(mws::protocol::transfer::completion::pending_transfer_ids(id).len())
    })
}

/// Drains every pending transfer of `engine` once (`timeout_ms` each) and writes how
/// many remain to `*remaining` (when not NULL). A transfer whose completion is still
/// unknown stays pending; a restart-required one stays until the engine restarts.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STORE` (a drain failed: registration cleanup or
/// release; the transfer stays pending).
///
/// # Safety
/// `engine` is NULL or live; `remaining` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_drain(
    engine: *const mws_transfer_engine,
    timeout_ms: u64,
    remaining: *mut usize,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `engine` is NULL or a live handle of this type (this function's contract).
        let e = unsafe { handle(engine, "engine") }?;
        let id = e.engine.identity().map_err(|m| Failure::new(mws_status::MWS_STORE, m))?;
        use mws::protocol::transfer::completion::{drain_pending_transfer, pending_transfer_ids};
        let mut first_err = None;
        for p in pending_transfer_ids(id) {
            if let Err(err) = drain_pending_transfer(id, &p, timeout_ms) {
                first_err.get_or_insert(err);
            }
        }
        if !remaining.is_null() {
            // SAFETY: `remaining` was checked non-NULL and is valid for a write (this function's contract).
            unsafe { write_out(remaining, pending_transfer_ids(id).len()) };
        }
        match first_err {
            Some(err) => Err(transfer_failure(err)),
            None => Ok(()),
        }
    })
}
