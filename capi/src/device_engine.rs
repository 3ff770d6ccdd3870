//! `mws_device_engine`: a device copy engine handle (CUDA, the fenced test device, or
//! a caller's `mws_device_engine_vtable`), its batched copies and its counters. Stores
//! (`mws_store_options.device_engine`) and the embedded transfer engine
//! (`mws_transfer_engine_new_local_device`) take their own reference to it.

use crate::boundary::{mws_status, Failure};
use crate::callbacks::device_engine::{direction_from_c, mws_device_engine_vtable, CallbackDeviceEngine};
use mws::device::{copy_ranges, CopyRange, CudaEngine, DeviceEngine, FencedDevice};
use std::ffi::c_void;
use std::sync::Arc;

/// A device copy engine: moves bytes between host and device memory (and within one
/// device) in batches of 2-D copies. Every path of the library that touches device
/// memory goes through one: snapshots read device sources and restores write device
/// targets through the store's engine (`mws_store_options.device_engine`), live
/// transfers through the embedded engine's (`mws_transfer_engine_new_local_device`).
///
/// Created by `mws_device_engine_new_cuda`, `mws_device_engine_new_fenced` or
/// `mws_device_engine_from_vtable`; freed by `mws_device_engine_free`. Stores and
/// transfer engines made with it keep their own reference, so the handle may be freed
/// as soon as they are made; the engine itself (its stream, a fenced device's memory,
/// a vtable's `ctx`) lives until the last of them is freed.
///
/// Thread safety: every function may run concurrently on one engine.
pub struct mws_device_engine {
    pub(crate) engine: Arc<dyn DeviceEngine>,
    /// The same engine when it is a fenced device (`mws_device_engine_fenced_alloc`).
    fenced: Option<Arc<FencedDevice>>,
}

handle!(mws_device_engine);

impl mws_device_engine {
    fn new(engine: Arc<dyn DeviceEngine>) -> Self {
        mws_device_engine { engine, fenced: None }
    }
}

/// One byte range of `mws_device_engine_copy`: `len` bytes from `source` to `target`,
/// addresses in the memories of the call's direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mws_copy_range {
    /// First source byte.
    pub source: u64,
    /// First target byte.
    pub target: u64,
    /// Bytes (0: skipped).
    pub len: u64,
}

/// The counters of a device engine (`mws_device_engine_stats`), totals since it was
/// made, over every user of the engine.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mws_device_stats {
    /// Batches submitted.
    pub batches: u64,
    /// 2-D copies submitted (`mws_copy_op`s).
    pub copies: u64,
    /// What the batches cost: driver calls (copies, events, synchronizations, context
    /// switches, staging allocations) for the CUDA and fenced engines; for a vtable
    /// engine, the callbacks called (submit, wait, staging_alloc).
    pub driver_calls: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// Creates a CUDA engine for device `ordinal` (CUDA's driver API, `libcuda.so.1` or
/// the path in the environment variable `MWS_CUDA_DRIVER`, opened at run time: the
/// library needs nothing CUDA to build or load). It copies in the device's primary
/// context (the one the CUDA runtime and PyTorch use) on one stream:
/// - `stream` NULL: a non-blocking stream of the engine's own;
/// - else `*stream` is the `CUstream` / `cudaStream_t` (of that device's primary
///   context) to copy on, which the caller keeps alive while the engine lives; 0 is
///   the legacy default stream. A batch then runs after the work queued on the stream
///   before the call (a PyTorch caller passes
///   `torch.cuda.current_stream().cuda_stream`).
///
/// Every batch is complete (visible to the host and to later work on the stream) when
/// the library call that made it returns. Staging buffers are pinned host memory,
/// pooled by the engine. New handle in `*out` (free it with `mws_device_engine_free`).
///
/// Errors: `MWS_NULL_ARGUMENT` (`out`), `MWS_UNSUPPORTED` (no CUDA driver on this
/// machine: the message names the library that could not be opened),
/// `MWS_INVALID_ARGUMENT` (ordinal out of range), `MWS_IO` (the driver refused the
/// device or the stream).
///
/// # Safety
/// `stream` is NULL or readable; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_new_cuda(
    ordinal: u32,
    stream: *const u64,
    out: *mut *mut mws_device_engine,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let stream = c.opt_struct(stream).copied();
        let engine = CudaEngine::new(ordinal, stream)?;
        out.give_handle(mws_device_engine::new(Arc::new(engine)))
    })
}

/// Creates a fenced device: a test device of `capacity` bytes (rounded up to whole
/// pages) reporting device ordinal `ordinal`, whose memory the host cannot touch. Its
/// pages are mapped without access (`PROT_NONE`): any host read or write of one of
/// its addresses — by the caller or anywhere in the library — crashes the process
/// (SIGSEGV). Only this engine reaches them (`mws_device_engine_copy`, and the stores
/// and transfer engines given it), which is what tests in C, C++ and Python rely on to
/// prove that no path touches device memory on the host. Allocate its memory with
/// `mws_device_engine_fenced_alloc`; it stays mapped until the last user of the
/// engine is freed. New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT` (`out`), `MWS_INVALID_ARGUMENT` (zero capacity),
/// `MWS_IO` (the mappings cannot be made).
///
/// # Safety
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_new_fenced(
    ordinal: u32,
    capacity: u64,
    out: *mut *mut mws_device_engine,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let device = Arc::new(FencedDevice::new(ordinal, capacity)?);
        out.give_handle(mws_device_engine { engine: device.clone(), fenced: Some(device) })
    })
}

/// Allocates `len` bytes of a fenced device's memory (256-byte aligned, zeroed, never
/// reused) and writes its device address to `*address_out`. The memory is valid until
/// the last user of the engine is freed; the host must never dereference it (any host
/// access faults): move bytes in and out with `mws_device_engine_copy`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (not a fenced engine),
/// `MWS_LIMIT_EXCEEDED` (the device is full).
///
/// # Safety
/// `engine` is NULL or a live handle; `address_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_fenced_alloc(
    engine: *const mws_device_engine,
    len: u64,
    address_out: *mut u64,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let out = c.out(address_out, "address_out")?;
        let Some(device) = &e.fenced else {
            return Err(Failure::invalid(format!(
                "engine {} is not a fenced device (made by mws_device_engine_new_fenced)",
                e.engine.name()
            )));
        };
        out.give(device.alloc(len)?)
    })
}

/// Wraps a caller's device copy engine (see `mws_device_engine_vtable`): the vtable is
/// checked (`size`, `version`, mandatory callbacks, staging callbacks both or neither)
/// and copied. On success writes a new handle to `*out`; the engine owns `ctx` from
/// then on and calls `vt->destroy(ctx)` (if not NULL) exactly once, when its last user
/// (the handle, the stores and transfer engines that took it, their staging buffers)
/// is gone. On failure `*out` is not written and `destroy` is not called (the caller
/// keeps `ctx`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (size too small, `submit` or
/// `wait` NULL, only one of `staging_alloc` / `staging_free`), `MWS_UNSUPPORTED`
/// (vtable version).
///
/// # Safety
/// `vt` is NULL or points to a readable vtable of at least `vt->size` bytes whose
/// callbacks follow its contract with `ctx` (thread-safe, never unwind) while the
/// engine lives; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_from_vtable(
    vt: *const mws_device_engine_vtable,
    ctx: *mut c_void,
    out: *mut *mut mws_device_engine,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        c.struct_ref(vt, "vt")?;
        // SAFETY: this function's contract: the vtable is readable for its size and its
        // callbacks honour it with `ctx` for as long as the engine lives.
        let engine = unsafe { CallbackDeviceEngine::new(vt, ctx) }?;
        out.give_handle(mws_device_engine::new(Arc::new(engine)))
    })
}

/// Copies the `n` byte ranges of `ranges`, all in `direction` (an `mws_copy_direction`
/// value), on device `ordinal`, through the engine: the ranges are coalesced into the
/// fewest 2-D copies (contiguous ranges merged, rows of constant width and pitches
/// folded), submitted as one batch and waited on, so the bytes are in place when the
/// call returns. Writes the number of 2-D copies made to `*copies_out` when it is not
/// NULL. Empty ranges are skipped; `n` may be 0. This is how tests put bytes into and
/// read bytes out of fenced device memory, and a batched copy for any caller. Ranges
/// in different allocations may be merged into one copy, which a device refuses (CUDA
/// does, even for adjacent allocations): the batch is then copied again range by
/// range, so any set of ranges is copied; one call per allocation pair keeps the
/// merged copies.
///
/// Errors: `MWS_NULL_ARGUMENT` (`engine`, `ranges` with `n > 0`),
/// `MWS_INVALID_ARGUMENT` (direction; a range the engine cannot copy: a fenced device
/// refuses device ranges outside its memory, host ranges inside it, another ordinal),
/// `MWS_IO` (the driver or the vtable failed), `MWS_UNSUPPORTED` (no driver). On
/// failure some target bytes may have been written.
///
/// Thread safety: any thread; the caller does not write the targets, or free either
/// side, during the call.
///
/// # Safety
/// `engine` is NULL or a live handle; `ranges` is NULL or points to `n` readable
/// ranges; every source range is readable and every target range writable, in the
/// memory `direction` names (host memory of this process, or memory of device
/// `ordinal` that the engine reaches), for the whole call; `copies_out` is NULL or
/// valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_copy(
    engine: *const mws_device_engine,
    ordinal: u32,
    direction: u32,
    ranges: *const mws_copy_range,
    n: usize,
    copies_out: *mut u64,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let direction = direction_from_c(direction, "direction")?;
        let ranges: Vec<CopyRange> = c
            .slice(ranges, n, "ranges")?
            .iter()
            .map(|r| CopyRange { source: r.source, target: r.target, len: r.len })
            .collect();
        // SAFETY: this function's contract: every source range is readable and every
        // target range writable in the memory of `direction` for the whole call, which
        // `copy_ranges` does not outlive (it waits for its batch).
        let copies = unsafe { copy_ranges(&*e.engine, ordinal, direction, &ranges) }?;
        c.opt_set(copies_out, copies as u64);
        Ok(())
    })
}

/// Writes the engine's counters (totals since it was made, over every store and
/// transfer engine that uses it) to `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread; a snapshot.
///
/// # Safety
/// `engine` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_stats(
    engine: *const mws_device_engine,
    out: *mut mws_device_stats,
) -> mws_status {
    status_call!(|c| {
        let e = c.handle(engine, "engine")?;
        let out = c.out(out, "out")?;
        let s = e.engine.stats();
        out.give(mws_device_stats {
            batches: s.batches,
            copies: s.copies,
            driver_calls: s.driver_calls,
            bytes: s.bytes,
        })
    })
}

/// Frees a device engine handle; NULL does nothing. Stores and transfer engines made
/// with it keep the engine alive (its stream, a fenced device's memory, a vtable's
/// `ctx`), so freeing the handle early is safe; the engine goes with the last of them.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `engine` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_device_engine_free(engine: *mut mws_device_engine) {
    value_call!((), |c| c.free(engine))
}
