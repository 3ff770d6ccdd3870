//! `mws_device_engine_vtable`: a caller's device copy engine (its own CUDA streams, a
//! ROCm or another accelerator's copies, a test double) as a `device::DeviceEngine`.
//!
//! [`CallbackDeviceEngine`] submits each batch with the vtable's `submit` and waits
//! with its `wait`; staging buffers come from `staging_alloc` / `staging_free` when
//! the vtable has them, else from ordinary host memory. The engine counts what it
//! hands the callbacks (the vtable has no counters of its own).
//!
//! The callbacks are C functions: they must not unwind and must be thread-safe
//! (several stores, restores and transfers may use one engine at once). Nothing on the
//! Rust side of this module panics on caller data.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use crate::callbacks::{read_vtable, Ctx};
use mws::device::{CopyDirection, CopyOp, CopyTicket, DeviceEngine, DeviceStats, StagingBuffer};
use mws::error::{Error, ErrorKind, Result};
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Version of [`mws_device_engine_vtable`] this library implements.
pub const MWS_DEVICE_ENGINE_VTABLE_VERSION: u32 = 1;

/// Which memories a batch of device copies reads and writes (the `direction`
/// arguments of `mws_device_engine_copy` and of `mws_device_engine_vtable.submit`,
/// passed as `uint32_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_copy_direction {
    /// Host memory into device memory.
    MWS_COPY_HOST_TO_DEVICE = 1,
    /// Device memory into host memory.
    MWS_COPY_DEVICE_TO_HOST = 2,
    /// Device memory into device memory (the same device).
    MWS_COPY_DEVICE_TO_DEVICE = 3,
}

/// The core's direction of an `mws_copy_direction` value (`MWS_INVALID_ARGUMENT`
/// naming `name` for another value).
pub(crate) fn direction_from_c(direction: u32, name: &str) -> Result<CopyDirection> {
    match direction {
        1 => Ok(CopyDirection::HostToDevice),
        2 => Ok(CopyDirection::DeviceToHost),
        3 => Ok(CopyDirection::DeviceToDevice),
        d => Err(Error::invalid(format!(
            "{name} must be MWS_COPY_HOST_TO_DEVICE (1), MWS_COPY_DEVICE_TO_HOST (2) or MWS_COPY_DEVICE_TO_DEVICE (3), \
             got {d}"
        ))),
    }
}

/// One 2-D copy of a batch: `height` rows of `width` bytes; row `i` goes from
/// `source + i * source_pitch` to `target + i * target_pitch` (addresses in the
/// memories the batch's direction names). `height == 1` is a plain copy of `width`
/// bytes; when `height > 1` both pitches are at least `width`. The library never
/// hands an engine a copy with `width == 0` or `height == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mws_copy_op {
    /// First source byte.
    pub source: u64,
    /// Source bytes from one row to the next.
    pub source_pitch: u64,
    /// First target byte.
    pub target: u64,
    /// Target bytes from one row to the next.
    pub target_pitch: u64,
    /// Bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
}

impl From<&CopyOp> for mws_copy_op {
    fn from(op: &CopyOp) -> Self {
        mws_copy_op {
            source: op.source,
            source_pitch: op.source_pitch,
            target: op.target,
            target_pitch: op.target_pitch,
            width: op.width,
            height: op.height,
        }
    }
}

/// A device copy engine implemented by the caller: how a process that drives its
/// accelerator itself (its own streams, another vendor's runtime, a test double)
/// lets the library move bytes between host and device memory. Hand it to
/// `mws_device_engine_from_vtable`.
///
/// Set `size = sizeof(mws_device_engine_vtable)` and
/// `version = MWS_DEVICE_ENGINE_VTABLE_VERSION`. Every callback receives the `ctx`
/// given with the vtable, returns 0 on success (any other value is an error, reported
/// as `MWS_IO` with the code), must not throw or unwind, and must be thread-safe:
/// batches of several stores, restores and transfers may be submitted and waited on
/// from several threads at once. `submit` and `wait` are required; `staging_alloc`
/// and `staging_free` are optional but come together; `destroy` is optional.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_device_engine_vtable {
    /// `sizeof(mws_device_engine_vtable)`.
    pub size: u32,
    /// `MWS_DEVICE_ENGINE_VTABLE_VERSION`.
    pub version: u32,
    /// Required. Starts the `n` copies of `ops` (an array valid only during the call),
    /// all in `direction` (an `mws_copy_direction` value), on device `ordinal`, in
    /// order, and writes a ticket for them to `*ticket`. The copies may run after the
    /// call returns; the source rows stay readable and the target rows stay reserved
    /// for them until `wait` returns for the ticket. `n` may be 0 (write a ticket all
    /// the same). On a non-zero return nothing may be pending and `wait` is not
    /// called.
    pub submit: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            ordinal: u32,
            direction: u32,
            ops: *const mws_copy_op,
            n: usize,
            ticket: *mut u64,
        ) -> i32,
    >,
    /// Required. Blocks until every copy of the ticket is complete and visible to the
    /// host and to later device work; returns non-zero if one failed. Called exactly
    /// once per successful `submit`.
    pub wait: Option<unsafe extern "C" fn(ctx: *mut c_void, ticket: u64) -> i32>,
    /// Optional (with `staging_free`; both NULL: ordinary host memory). Allocates at
    /// least `len` bytes (`len > 0`) of host memory for staging device bytes (pinned
    /// memory, where the device has it, makes copies faster) and writes its address to
    /// `*out`. The library reads and writes it only on the host and through `submit`.
    pub staging_alloc: Option<unsafe extern "C" fn(ctx: *mut c_void, len: u64, out: *mut *mut c_void) -> i32>,
    /// Optional (with `staging_alloc`). Frees a buffer of `staging_alloc` (`len` is the
    /// length it was asked for). Called exactly once per buffer, possibly from another
    /// thread, always before `destroy`.
    pub staging_free: Option<unsafe extern "C" fn(ctx: *mut c_void, buffer: *mut c_void, len: u64)>,
    /// Optional: called exactly once, when the last user of the engine (its handle,
    /// the stores and transfer engines that took it, their staging buffers) is gone.
    pub destroy: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
}

/// The vtable and its context, shared with the staging buffers the engine hands out:
/// `destroy` runs when the last of them goes.
struct Callbacks {
    vt: mws_device_engine_vtable,
    ctx: Ctx,
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        if let Some(destroy) = self.vt.destroy {
            // SAFETY: the vtable contract: `destroy` is valid for `ctx`; called once,
            // after every other callback returned (the last reference is gone).
            unsafe { destroy(self.ctx.0) };
        }
    }
}

/// A [`DeviceEngine`] implemented by C callbacks ([`mws_device_engine_vtable`]).
pub struct CallbackDeviceEngine {
    cb: Arc<Callbacks>,
    batches: AtomicU64,
    copies: AtomicU64,
    calls: AtomicU64,
    bytes: AtomicU64,
}

impl fmt::Debug for CallbackDeviceEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackDeviceEngine").finish_non_exhaustive()
    }
}

fn failed(what: &str, code: i32) -> Error {
    Error::new(ErrorKind::Io, format!("device engine vtable: {what} failed: error code {code}"))
}

impl CallbackDeviceEngine {
    /// Wraps `vt` (checked and copied) and `ctx`. On success the engine owns `ctx`
    /// (`destroy`, if any, is called once when the engine and its staging buffers are
    /// gone); on failure nothing is called.
    ///
    /// # Safety
    /// `vt` is NULL or readable for its `size` bytes, and its callbacks honour the
    /// [`mws_device_engine_vtable`] contract with `ctx` for as long as the engine lives.
    pub unsafe fn new(vt: *const mws_device_engine_vtable, ctx: *mut c_void) -> Result<Self> {
        // SAFETY: forwarded contract: `vt` is NULL or readable for its size.
        let vt = unsafe { read_vtable(vt, "mws_device_engine_vtable", MWS_DEVICE_ENGINE_VTABLE_VERSION) }?;
        if vt.submit.is_none() || vt.wait.is_none() {
            return Err(Error::invalid(
                "mws_device_engine_vtable is missing mandatory callbacks: submit and wait are required",
            ));
        }
        if vt.staging_alloc.is_some() != vt.staging_free.is_some() {
            return Err(Error::invalid(
                "mws_device_engine_vtable: staging_alloc and staging_free come together (both set or both NULL)",
            ));
        }
        Ok(CallbackDeviceEngine {
            cb: Arc::new(Callbacks { vt, ctx: Ctx(ctx) }),
            batches: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }
}

impl DeviceEngine for CallbackDeviceEngine {
    fn name(&self) -> String {
        "vtable".to_string()
    }

    unsafe fn submit(&self, ordinal: u32, direction: CopyDirection, ops: &[CopyOp]) -> Result<CopyTicket> {
        let submit = self.cb.vt.submit.ok_or_else(|| Error::invalid("submit is NULL"))?;
        let c_ops: Vec<mws_copy_op> = ops.iter().map(mws_copy_op::from).collect();
        let mut ticket = 0u64;
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the vtable contract (checked at construction) makes `submit` valid and
        // thread-safe over `ctx`; `c_ops` and `ticket` live for the call; the rows are
        // valid until the ticket is waited on (this function's contract, passed on).
        let code =
            unsafe { submit(self.cb.ctx.0, ordinal, direction as u32, c_ops.as_ptr(), c_ops.len(), &mut ticket) };
        if code != 0 {
            return Err(failed("submit", code));
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.copies.fetch_add(ops.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(ops.iter().map(CopyOp::bytes).sum(), Ordering::Relaxed);
        Ok(CopyTicket(ticket))
    }

    fn wait(&self, ticket: CopyTicket) -> Result<()> {
        let wait = self.cb.vt.wait.ok_or_else(|| Error::invalid("wait is NULL"))?;
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the vtable contract: `wait` is valid and thread-safe over `ctx`, for a
        // ticket its `submit` wrote.
        let code = unsafe { wait(self.cb.ctx.0, ticket.0) };
        if code != 0 {
            return Err(failed("wait", code));
        }
        Ok(())
    }

    fn staging(&self, len: u64) -> Result<StagingBuffer> {
        let (Some(alloc), Some(_)) = (self.cb.vt.staging_alloc, self.cb.vt.staging_free) else {
            return StagingBuffer::host(len);
        };
        if len == 0 {
            return StagingBuffer::host(0);
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the vtable contract: `staging_alloc` is valid and thread-safe over
        // `ctx`; `p` is a live out-parameter.
        let code = unsafe { alloc(self.cb.ctx.0, len, &mut p) };
        if code != 0 {
            return Err(failed("staging_alloc", code));
        }
        if p.is_null() {
            return Err(Error::new(
                ErrorKind::Io,
                "device engine vtable: staging_alloc returned 0 but no buffer (NULL)".to_string(),
            ));
        }
        // The buffer keeps the callbacks (and `ctx`) alive until it is freed.
        let cb = Arc::clone(&self.cb);
        let address = p as usize;
        let release = Box::new(move || {
            if let Some(free) = cb.vt.staging_free {
                // SAFETY: the vtable contract: `staging_free` takes back a buffer of
                // `staging_alloc` once, with the length asked for; `cb` keeps `ctx` alive.
                unsafe { free(cb.ctx.0, address as *mut c_void, len) };
            }
        });
        // SAFETY: the vtable contract: `staging_alloc` returned `len` bytes of host
        // memory valid for reads and writes, ours until `staging_free`.
        Ok(unsafe { StagingBuffer::from_raw(address as u64, len, release) })
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            batches: self.batches.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
            driver_calls: self.calls.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}
