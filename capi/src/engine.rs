//! `mws_transfer_engine`: a transfer engine handle (the embedded in-process engine or
//! a caller's `mws_transfer_engine_vtable`), its memory registrations, its pending
//! transfers, and what it still holds (`mws_transfer_engine_resources`).

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::engine::{mws_transfer_engine_vtable, CallbackEngine};
use crate::device_engine::mws_device_engine;
use mws::engine::local::LocalEngine;
use mws::engine::{EngineResult, TransferEngine};
use mws::protocol::transfer::completion::{drain_pending_transfers, pending_transfer_ids, pending_transfers};
use mws::runtime::{MemoryKind, MemoryRegion};
use std::ffi::c_void;
use std::sync::Arc;

/// A transfer engine: the embedded in-process engine or a caller's vtable.
///
/// Created by `mws_transfer_engine_new_local`, `mws_transfer_engine_new_local_device`
/// or `mws_transfer_engine_from_vtable`, freed by `mws_transfer_engine_free`.
/// Loaders and sinks keep their engine alive.
/// Thread safety: every function may run concurrently on one engine (the executors
/// allow one submission per engine identity at a time and refuse the others).
pub struct mws_transfer_engine {
    pub(crate) engine: Arc<dyn TransferEngine>,
}

handle!(mws_transfer_engine);

/// What an engine still holds (`mws_transfer_engine_resources`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_engine_resources {
    /// 1 when the engine can list its registrations (then `registered_regions` and
    /// `registered_bytes` count every region registered with it now, whoever
    /// registered it); 0 when it cannot (a vtable engine), and both are 0.
    pub registrations_known: u32,
    /// Regions registered with the engine now.
    pub registered_regions: u64,
    /// Bytes of those regions.
    pub registered_bytes: u64,
    /// Pending transfers of the engine (completion unknown, or quarantined
    /// registrations): drain them with `mws_transfer_engine_drain`.
    pub pending_transfers: u64,
    /// Registrations the library made and still holds (quarantined in pending
    /// transfers).
    pub quarantined_registrations: u64,
    /// Allocation-guard pins held by pending transfers.
    pub pinned_tokens: u64,
}

fn engine_identity(e: &mws_transfer_engine) -> FfiResult<u64> {
    e.engine.identity().map_err(|m| Failure::new(mws_status::MWS_STORE, m))
}

/// The outcome of an engine call `what` that returns a code: 0 is success, another
/// code or an error is `MWS_STORE` (`<what> failed: <code or error>`).
fn engine_code(what: &str, result: EngineResult<i32>) -> FfiResult<()> {
    match result {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure::new(mws_status::MWS_STORE, format!("{what} failed: {code}"))),
        Err(err) => Err(Failure::new(mws_status::MWS_STORE, format!("{what} failed: {err}"))),
    }
}

/// Creates the embedded engine (memcpy between memory registered in this process;
/// device memory is refused at registration: see
/// `mws_transfer_engine_new_local_device`). New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_new_local(out: *mut *mut mws_transfer_engine) -> mws_status {
    status_call!(|c| c.out(out, "out")?.give_handle(mws_transfer_engine { engine: Arc::new(LocalEngine::new()) }))
}

/// Creates the embedded engine with a device engine: as
/// `mws_transfer_engine_new_local`, and device memory (of any ordinal the device
/// engine serves) may be registered too. Host ranges are copied with memcpy; the
/// device ranges of a batch go to `device` as one batch per direction and device,
/// coalesced into 2-D copies, never touched by the host (device to device copies
/// within one device; a batch between two devices fails). The transfer engine takes
/// its own reference to `device`: the device engine handle may be freed at once. New
/// handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT` (`device`, `out`).
///
/// # Safety
/// `device` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_new_local_device(
    device: *const mws_device_engine,
    out: *mut *mut mws_transfer_engine,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let device = Arc::clone(&c.handle(device, "device")?.engine);
        out.give_handle(mws_transfer_engine { engine: Arc::new(LocalEngine::with_device_engine(device)) })
    })
}

/// Wraps a caller's engine (for example Mooncake's `TransferEngine`): the vtable is
/// copied; `ctx` and the callbacks must stay valid and thread-safe until the handle
/// and every loader or sink made from it are freed. New handle in `*out`. The
/// library reads and writes no device memory of this engine's transfers itself
/// (content-verified and delta steps refuse device buffers, `MWS_UNSUPPORTED`):
/// see `mws_transfer_engine_from_vtable_device`.
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
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let vt = c.struct_ref(vt, "vt")?;
        // SAFETY: this function's contract: the vtable's callbacks honour it with `ctx`
        // for as long as the engine lives.
        let engine = unsafe { CallbackEngine::new(vt, ctx, None) }?;
        out.give_handle(mws_transfer_engine { engine })
    })
}

/// As `mws_transfer_engine_from_vtable`, with a device copy engine through which the
/// library itself reads and writes the device buffers of this engine's transfers on
/// the host: the content checksums of verified steps (`MWS_STEP_VERIFY_CONTENT`) and
/// the staging of delta steps (`mws_prepared_transfer_enable_delta`). The caller's
/// engine still moves every transferred byte itself (GPUDirect for Mooncake's). The
/// transfer engine takes its own reference to `device`: the device engine handle may
/// be freed at once. New handle in `*out`.
///
/// Errors: those of `mws_transfer_engine_from_vtable`; `MWS_NULL_ARGUMENT`
/// (`device`).
///
/// # Safety
/// As `mws_transfer_engine_from_vtable`; `device` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_from_vtable_device(
    vt: *const mws_transfer_engine_vtable,
    ctx: *mut c_void,
    device: *const mws_device_engine,
    out: *mut *mut mws_transfer_engine,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let vt = c.struct_ref(vt, "vt")?;
        let device = Arc::clone(&c.handle(device, "device")?.engine);
        // SAFETY: as in `mws_transfer_engine_from_vtable`.
        let engine = unsafe { CallbackEngine::new(vt, ctx, Some(device)) }?;
        out.give_handle(mws_transfer_engine { engine })
    })
}

/// Registers `[address, address + len)` with the engine (the owner's
/// pre-registration of a whole allocation). `memory_kind` is an `mws_memory_kind`
/// value, `device` the ordinal for device memory.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (memory kind, zero length),
/// `MWS_STORE` (the engine refused: overlap with a registered region, device memory
/// on an embedded engine without a device engine, or the engine's code).
///
/// # Safety
/// `engine` is NULL or live. The memory must stay valid for reads and writes until
/// it is unregistered.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_register_memory(
    engine: *const mws_transfer_engine,
    address: *const c_void,
    len: u64,
    memory_kind: u32,
    device: u32,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
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
        // SAFETY: this function's contract: the memory stays valid until unregistered.
        engine_code("register_memory", unsafe { e.engine.register_memory(region) })
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
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        engine_code("unregister_memory", e.engine.unregister_memory(address as u64))
    })
}

/// Frees an engine handle; NULL does nothing. Loaders and sinks made from it keep
/// the engine alive.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `engine` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_free(engine: *mut mws_transfer_engine) {
    value_call!((), |c| c.free(engine))
}

/// Number of pending transfers (completion unknown, or quarantined registrations)
/// that block `engine`; 0 for NULL.
///
/// # Safety
/// `engine` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_pending_count(engine: *const mws_transfer_engine) -> usize {
    value_call!(0, |c| Ok(pending_transfer_ids(engine_identity(c.handle(engine, "engine")?)?).len()))
}

/// Writes what the engine still holds to `*out`: its registered regions (when it can
/// list them), its pending transfers and the registrations and pins they hold. After
/// every call returned and every pending transfer was drained, the library holds
/// nothing: `pending_transfers`, `quarantined_registrations` and `pinned_tokens` are
/// 0, and the registered regions are only the owners' own.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STORE` (the engine's identity cannot be read).
/// Thread safety: may run at any time; a snapshot.
///
/// # Safety
/// `engine` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_transfer_engine_resources(
    engine: *const mws_transfer_engine,
    out: *mut mws_engine_resources,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let out = c.out(out, "out")?;
        let pending = pending_transfers(engine_identity(e)?);
        let registered = e.engine.registered_regions();
        out.set(mws_engine_resources {
            registrations_known: u32::from(registered.is_some()),
            registered_regions: registered.as_ref().map_or(0, |r| r.len() as u64),
            registered_bytes: registered.as_ref().map_or(0, |r| r.iter().map(|x| x.len).sum()),
            pending_transfers: pending.len() as u64,
            quarantined_registrations: pending.iter().map(|p| p.registrations.len() as u64).sum(),
            pinned_tokens: pending.iter().map(|p| p.pinned_tokens as u64).sum(),
        });
        Ok(())
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
    status_call!(|c| {
        let id = engine_identity(c.handle(engine, "engine")?)?;
        let drained = drain_pending_transfers(id, timeout_ms);
        c.opt_set(remaining, pending_transfer_ids(id).len());
        Ok(drained?)
    })
}
