//! A caller-implemented transfer engine behind a C vtable: how a C++ process that
//! already runs Mooncake's `TransferEngine` plugs it into the live-transfer
//! executors. [`CallbackEngine`] implements [`TransferEngine`] by calling the
//! function pointers of a [`mws_transfer_engine_vtable`] with the caller's `ctx`.
//!
//! Return codes: 0 = ok, any other value is the engine's code (for batches:
//! completion unknown, as the wheel's legacy API cannot tell; `live-transfer.md`
//! §8.3). Ticket statuses: 0 completed, -1 failed-drained, -2 completion unknown,
//! other values are reported by number (known failures).
//!
//! The callbacks are C functions: they must not unwind and must be thread-safe
//! (batches of different engines may run concurrently; one engine never runs two
//! submissions at once, the executors reserve it). Nothing on the Rust side of this
//! module panics on caller data.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use crate::callbacks::store::mws_bytes;
use crate::callbacks::{read_vtable_prefix, Ctx};
use mws::engine::{
    CompletionStatus, Direction, EngineCallError, EngineResult, MemoryRegion, TransferBatch, TransferEngine,
    TransferTicket,
};
use mws::error::{Error, Result};
use mws::runtime::MemoryKind;
use std::ffi::c_void;
use std::sync::Arc;

/// Version of [`mws_transfer_engine_vtable`] this library implements.
pub const MWS_TRANSFER_ENGINE_VTABLE_VERSION: u32 = 1;

/// `direction` argument of `submit_with_ticket`: pull (local = target).
pub const MWS_TRANSFER_READ: u32 = 0;
/// `direction` argument of `submit_with_ticket`: push (local = source).
pub const MWS_TRANSFER_WRITE: u32 = 1;

/// A transfer engine implemented by the caller. Set `size =
/// sizeof(mws_transfer_engine_vtable)` and `version = MWS_TRANSFER_ENGINE_VTABLE_VERSION`.
/// Every callback receives the `ctx` given with the vtable. Addresses are absolute;
/// `local`/`remote`/`sizes` point to `n` values each and are valid only during the
/// call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_transfer_engine_vtable {
    /// `sizeof(mws_transfer_engine_vtable)`.
    pub size: u32,
    /// `MWS_TRANSFER_ENGINE_VTABLE_VERSION`.
    pub version: u32,
    /// Required. The engine identity (> 0; Mooncake: `get_engine_ptr`). Two
    /// vtables of one native engine must report the same value.
    pub get_engine_id: Option<unsafe extern "C" fn(ctx: *mut c_void) -> u64>,
    /// Required. Registers `[address, address + len)`; `device` is -1 for host
    /// memory, else the device ordinal. Returns 0 or an engine code.
    pub register_memory: Option<unsafe extern "C" fn(ctx: *mut c_void, address: u64, len: u64, device: i32) -> i32>,
    /// Required. Unregisters the region registered at `address`.
    pub unregister_memory: Option<unsafe extern "C" fn(ctx: *mut c_void, address: u64) -> i32>,
    /// Required. `batch_transfer_sync_write(endpoint, local sources, remote targets, sizes)`.
    pub batch_transfer_sync_write: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            endpoint: mws_bytes,
            local: *const u64,
            remote: *const u64,
            sizes: *const u64,
            n: usize,
        ) -> i32,
    >,
    /// Required. `batch_transfer_sync_read(endpoint, local targets, remote sources, sizes)`.
    pub batch_transfer_sync_read: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            endpoint: mws_bytes,
            local: *const u64,
            remote: *const u64,
            sizes: *const u64,
            n: usize,
        ) -> i32,
    >,
    /// Optional (NULL: legacy batches only). Submits a batch and writes a non-zero
    /// ticket id to `*ticket`; returns 0, or non-zero when no ticket exists (then
    /// completion is unknown and the engine must be restarted).
    pub submit_with_ticket: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            direction: u32,
            endpoint: mws_bytes,
            local: *const u64,
            remote: *const u64,
            sizes: *const u64,
            n: usize,
            ticket: *mut u64,
        ) -> i32,
    >,
    /// Required with `submit_with_ticket`. Writes the ticket's status to `*status`;
    /// returns 0, or non-zero when the status cannot be read.
    pub ticket_status: Option<unsafe extern "C" fn(ctx: *mut c_void, ticket: u64, status: *mut i32) -> i32>,
    /// Required with `submit_with_ticket`. Waits up to `timeout_ms` and writes the
    /// status then; returns 0, or non-zero when the drain failed.
    pub ticket_drain:
        Option<unsafe extern "C" fn(ctx: *mut c_void, ticket: u64, timeout_ms: u64, status: *mut i32) -> i32>,
    /// Optional. Called once when the library no longer tracks a ticket.
    pub ticket_release: Option<unsafe extern "C" fn(ctx: *mut c_void, ticket: u64)>,
    /// Optional, appended in 0.2 (a vtable whose `size` ends before this field is
    /// accepted and has no notify support). Delivers `message` under the notify
    /// `name` to the engine at `endpoint` (Mooncake: `sendNotifyByName(endpoint,
    /// {name, message})`); returns 0 once the peer acknowledged it, else an engine
    /// code. The three views are valid only during the call. Needed by
    /// `mws_sink_execute_notified`.
    pub send_notify:
        Option<unsafe extern "C" fn(ctx: *mut c_void, endpoint: mws_bytes, name: mws_bytes, message: mws_bytes) -> i32>,
}

/// `size` of a version-1 vtable without the appended `send_notify` field: the
/// smallest `size` accepted.
const VTABLE_V1_SIZE: usize = std::mem::offset_of!(mws_transfer_engine_vtable, send_notify);

const NAME: &str = "mws_transfer_engine_vtable";

/// A [`TransferEngine`] over a caller's vtable.
pub struct CallbackEngine {
    vt: mws_transfer_engine_vtable,
    ctx: Ctx,
    /// What [`TransferEngine::device_engine`] returns.
    device: Option<Arc<dyn mws::device::DeviceEngine>>,
}

impl std::fmt::Debug for CallbackEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackEngine").field("tickets", &self.vt.submit_with_ticket.is_some()).finish()
    }
}

impl CallbackEngine {
    /// Copies and checks the vtable: `size` at least the version-1 size (the fields
    /// up to `ticket_release`; fields appended later and not covered by `size` are
    /// NULL), `version` equal to
    /// [`MWS_TRANSFER_ENGINE_VTABLE_VERSION`] (`Unsupported` otherwise), the required
    /// callbacks present (`mws_transfer_engine_vtable.<name> is NULL`). `device`: the
    /// engine's [`TransferEngine::device_engine`].
    ///
    /// # Safety
    /// `vt` is NULL or points to a readable vtable of at least `size` bytes; `ctx`
    /// and the callbacks stay valid and thread-safe for the engine's lifetime.
    pub unsafe fn new(
        vt: *const mws_transfer_engine_vtable,
        ctx: *mut c_void,
        device: Option<Arc<dyn mws::device::DeviceEngine>>,
    ) -> Result<Arc<CallbackEngine>> {
        // SAFETY: the caller's contract: `vt` is NULL or readable for its `size`; every
        // field after the version-1 size is an optional callback (NULL when not covered).
        let v = unsafe { read_vtable_prefix(vt, NAME, MWS_TRANSFER_ENGINE_VTABLE_VERSION, VTABLE_V1_SIZE) }?;
        let missing = [
            ("get_engine_id", v.get_engine_id.is_none()),
            ("register_memory", v.register_memory.is_none()),
            ("unregister_memory", v.unregister_memory.is_none()),
            ("batch_transfer_sync_write", v.batch_transfer_sync_write.is_none()),
            ("batch_transfer_sync_read", v.batch_transfer_sync_read.is_none()),
            ("ticket_status", v.submit_with_ticket.is_some() && v.ticket_status.is_none()),
            ("ticket_drain", v.submit_with_ticket.is_some() && v.ticket_drain.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|m| m.1) {
            return Err(Error::invalid(format!("{NAME}.{name} is NULL")));
        }
        Ok(Arc::new(CallbackEngine { vt: v, ctx: Ctx(ctx), device }))
    }
}

struct CallbackTicket {
    vt: mws_transfer_engine_vtable,
    ctx: Ctx,
    id: u64,
}

fn status_of(rc: i32, status: i32, what: &str) -> EngineResult<CompletionStatus> {
    if rc != 0 {
        return Err(EngineCallError::failed(format!("{what} failed: {rc}")));
    }
    Ok(CompletionStatus::from_code(status))
}

impl TransferTicket for CallbackTicket {
    fn status(&self) -> EngineResult<CompletionStatus> {
        let f = self.vt.ticket_status.expect("checked at construction");
        let mut s = -2i32;
        // SAFETY: vtable contract; `s` is a valid out-pointer.
        let rc = unsafe { f(self.ctx.0, self.id, &mut s) };
        status_of(rc, s, "ticket_status")
    }
    fn drain(&self, timeout_ms: u64) -> EngineResult<CompletionStatus> {
        let f = self.vt.ticket_drain.expect("checked at construction");
        let mut s = -2i32;
        // SAFETY: vtable contract; `s` is a valid out-pointer.
        let rc = unsafe { f(self.ctx.0, self.id, timeout_ms, &mut s) };
        status_of(rc, s, "ticket_drain")
    }
}

impl Drop for CallbackTicket {
    fn drop(&mut self) {
        if let Some(f) = self.vt.ticket_release {
            // SAFETY: vtable contract; called once per ticket.
            unsafe { f(self.ctx.0, self.id) };
        }
    }
}

impl TransferEngine for CallbackEngine {
    fn device_engine(&self) -> Option<Arc<dyn mws::device::DeviceEngine>> {
        self.device.clone()
    }

    fn identity(&self) -> std::result::Result<u64, String> {
        let f = self.vt.get_engine_id.expect("checked at construction");
        // SAFETY: vtable contract.
        Ok(unsafe { f(self.ctx.0) })
    }

    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        let f = self.vt.register_memory.expect("checked at construction");
        let device = match region.kind {
            MemoryKind::Host => -1,
            MemoryKind::Device(o) => o.min(i32::MAX as u32) as i32,
        };
        // SAFETY: vtable contract; the region's validity is the caller's contract.
        Ok(unsafe { f(self.ctx.0, region.address, region.len, device) })
    }

    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        let f = self.vt.unregister_memory.expect("checked at construction");
        // SAFETY: vtable contract.
        Ok(unsafe { f(self.ctx.0, address) })
    }

    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        let f = match batch.direction() {
            Direction::Write => self.vt.batch_transfer_sync_write,
            Direction::Read => self.vt.batch_transfer_sync_read,
        }
        .expect("checked at construction");
        let (l, r, s) = (batch.local_addresses(), batch.remote_addresses(), batch.sizes());
        // SAFETY: vtable contract; the lists hold `len` values each and outlive the call.
        Ok(unsafe { f(self.ctx.0, mws_bytes::of(batch.endpoint()), l.as_ptr(), r.as_ptr(), s.as_ptr(), s.len()) })
    }

    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let f = self.vt.submit_with_ticket?;
        let dir = match batch.direction() {
            Direction::Read => MWS_TRANSFER_READ,
            Direction::Write => MWS_TRANSFER_WRITE,
        };
        let (e, l, r, s) =
            (mws_bytes::of(batch.endpoint()), batch.local_addresses(), batch.remote_addresses(), batch.sizes());
        let mut id = 0u64;
        // SAFETY: vtable contract; the lists hold `len` values each and outlive the call.
        let rc = unsafe { f(self.ctx.0, dir, e, l.as_ptr(), r.as_ptr(), s.as_ptr(), s.len(), &mut id) };
        if rc != 0 || id == 0 {
            return Some(Err(EngineCallError::failed(format!("submit_with_ticket failed: {rc}"))));
        }
        Some(Ok(Box::new(CallbackTicket { vt: self.vt, ctx: self.ctx, id })))
    }

    fn send_notify(&self, endpoint: &str, name: &str, message: &[u8]) -> Option<EngineResult<i32>> {
        let f = self.vt.send_notify?;
        let (endpoint, name, message) = (mws_bytes::of(endpoint), mws_bytes::of(name), mws_bytes::of_bytes(message));
        // SAFETY: vtable contract; the three views outlive the call.
        Some(Ok(unsafe { f(self.ctx.0, endpoint, name, message) }))
    }
}
