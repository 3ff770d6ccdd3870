//! CUDA through its driver API, opened at run time (`libcuda.so.1`, or the path in
//! `MWS_CUDA_DRIVER`): nothing CUDA is needed to build the library, and nothing
//! changes for a process without a GPU until it asks for a [`CudaEngine`].
//!
//! One engine serves one device, in the device's primary context (the one the CUDA
//! runtime, PyTorch and most frameworks use), on one stream: the caller's (a PyTorch
//! caller passes `torch.cuda.current_stream().cuda_stream`, a C caller its own
//! `CUstream`) or one of its own (non-blocking). Copies are enqueued on that stream
//! with `cuMemcpy2DAsync` (one per [`CopyOp`]; a single row with `cuMemcpyAsync`),
//! followed by an event; [`DeviceEngine::wait`] synchronizes on the event. So a
//! batch runs after all work the caller queued on the stream before the call, and is
//! complete (host and device visible) when the library returns. Staging buffers are
//! pinned (`cuMemHostAlloc`) and pooled by the engine.

use super::{check_ops, CopyDirection, CopyOp, CopyTicket, DeviceEngine, DeviceStats, StagingBuffer};
use crate::error::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

type CuResult = i32;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuEvent = *mut c_void;

/// `CUDA_MEMCPY2D` of the driver API (64-bit layout).
#[repr(C)]
struct Memcpy2d {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

const CU_MEMORYTYPE_HOST: u32 = 1;
const CU_MEMORYTYPE_DEVICE: u32 = 2;
const CU_STREAM_NON_BLOCKING: u32 = 1;
const CU_EVENT_DISABLE_TIMING: u32 = 2;

/// The driver entry points the engine uses.
struct Api {
    init: unsafe extern "C" fn(u32) -> CuResult,
    device_get: unsafe extern "C" fn(*mut i32, i32) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, i32) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(i32) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, u32) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    memcpy_2d_async: unsafe extern "C" fn(*const Memcpy2d, CuStream) -> CuResult,
    memcpy_async: unsafe extern "C" fn(u64, u64, usize, CuStream) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, u32) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    event_synchronize: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(u64) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

// SAFETY: function pointers into the driver, which is thread-safe.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// The driver, opened once per process (or the reason it could not be).
fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| Error::new(ErrorKind::Unsupported, e.clone()))
}

// Each symbol's type is the field it initializes (`Api`), spelled once there.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> std::result::Result<Api, String> {
    let path = std::env::var("MWS_CUDA_DRIVER").unwrap_or_else(|_| "libcuda.so.1".to_string());
    let c_path = std::ffi::CString::new(path.clone()).map_err(|_| "MWS_CUDA_DRIVER holds a NUL byte".to_string())?;
    // SAFETY: dlopen of a library path; the handle is kept for the life of the process.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("the CUDA driver ({path}) cannot be opened: no NVIDIA driver on this machine"));
    }
    let sym = |name: &str| -> std::result::Result<*mut c_void, String> {
        let c = std::ffi::CString::new(name).expect("static name");
        // SAFETY: dlsym on the handle opened above.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!("the CUDA driver ({path}) has no {name}"))
        } else {
            Ok(p)
        }
    };
    macro_rules! f {
        ($name:literal) => {
            // SAFETY: the driver exports the symbol with the signature of the field
            // it initializes (CUDA driver API, `cuda.h`).
            unsafe { std::mem::transmute::<*mut c_void, _>(sym($name)?) }
        };
    }
    let api = Api {
        init: f!("cuInit"),
        device_get: f!("cuDeviceGet"),
        primary_ctx_retain: f!("cuDevicePrimaryCtxRetain"),
        primary_ctx_release: f!("cuDevicePrimaryCtxRelease_v2"),
        ctx_push: f!("cuCtxPushCurrent_v2"),
        ctx_pop: f!("cuCtxPopCurrent_v2"),
        stream_create: f!("cuStreamCreate"),
        stream_destroy: f!("cuStreamDestroy_v2"),
        stream_synchronize: f!("cuStreamSynchronize"),
        memcpy_2d_async: f!("cuMemcpy2DAsync_v2"),
        memcpy_async: f!("cuMemcpyAsync"),
        event_create: f!("cuEventCreate"),
        event_record: f!("cuEventRecord"),
        event_synchronize: f!("cuEventSynchronize"),
        event_destroy: f!("cuEventDestroy_v2"),
        mem_host_alloc: f!("cuMemHostAlloc"),
        mem_free_host: f!("cuMemFreeHost"),
        mem_alloc: f!("cuMemAlloc_v2"),
        mem_free: f!("cuMemFree_v2"),
        get_error_string: f!("cuGetErrorString"),
    };
    // SAFETY: cuInit(0) is the documented first call; idempotent.
    let rc = unsafe { (api.init)(0) };
    if rc != 0 {
        return Err(format!("cuInit failed: {}", describe(&api, rc)));
    }
    Ok(api)
}

fn describe(api: &Api, rc: CuResult) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it NULL.
    unsafe { (api.get_error_string)(rc, &mut s) };
    if s.is_null() {
        format!("CUDA error {rc}")
    } else {
        // SAFETY: a static NUL-terminated string of the driver.
        format!("CUDA error {rc} ({})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
    }
}

/// What the engine shares with the staging buffers it lends.
struct Inner {
    api: &'static Api,
    ordinal: u32,
    ctx: usize,
    stream: usize,
    owns_stream: bool,
    /// Pinned buffers returned by dropped [`StagingBuffer`]s: (address, length).
    pool: Mutex<Vec<(usize, usize)>>,
    /// Events of submitted, not yet waited batches.
    events: Mutex<HashMap<u64, usize>>,
    tickets: AtomicU64,
    batches: AtomicU64,
    copies: AtomicU64,
    calls: AtomicU64,
    bytes: AtomicU64,
}

/// Pinned buffers kept for reuse per engine.
const POOL_BUFFERS: usize = 4;

impl Inner {
    fn check(&self, rc: CuResult, what: &str) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Io, format!("cuda:{}: {what} failed: {}", self.ordinal, describe(self.api, rc))))
        }
    }

    /// Runs `f` with the device's primary context current on this thread.
    fn in_context<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // SAFETY: the context retained in `CudaEngine::new`, alive while `self` is.
        self.check(unsafe { (self.api.ctx_push)(self.ctx as CuContext) }, "cuCtxPushCurrent")?;
        let r = f();
        let mut popped: CuContext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above.
        let pop = self.check(unsafe { (self.api.ctx_pop)(&mut popped) }, "cuCtxPopCurrent");
        let v = r?;
        pop?;
        Ok(v)
    }

    fn give_back(&self, address: usize, len: usize) {
        let mut pool = self.pool.lock();
        pool.push((address, len));
        if pool.len() > POOL_BUFFERS {
            pool.sort_by_key(|&(_, l)| std::cmp::Reverse(l));
            let (a, _) = pool.pop().expect("more than POOL_BUFFERS");
            // SAFETY: a pinned buffer this engine allocated and nobody holds.
            let _ =
                self.in_context(|| self.check(unsafe { (self.api.mem_free_host)(a as *mut c_void) }, "cuMemFreeHost"));
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let pool = std::mem::take(&mut *self.pool.lock());
        let events: Vec<usize> = self.events.lock().drain().map(|(_, e)| e).collect();
        let _ = self.in_context(|| {
            for (a, _) in &pool {
                // SAFETY: pinned buffers of this engine; no staging buffer is alive (they hold `Inner`).
                unsafe { (self.api.mem_free_host)(*a as *mut c_void) };
            }
            for e in &events {
                // SAFETY: events of this engine never waited on; destroying them is allowed.
                unsafe { (self.api.event_destroy)(*e as CuEvent) };
            }
            if self.owns_stream {
                // SAFETY: the stream this engine created.
                unsafe { (self.api.stream_destroy)(self.stream as CuStream) };
            }
            Ok(())
        });
        // SAFETY: releases the primary context retained in `new`.
        unsafe { (self.api.primary_ctx_release)(self.ordinal as i32) };
    }
}

/// The CUDA [`DeviceEngine`]: one device, its primary context, one stream. Thread-safe.
pub struct CudaEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine").field("ordinal", &self.inner.ordinal).finish_non_exhaustive()
    }
}

impl CudaEngine {
    /// An engine for device `ordinal` copying on `stream` (a `CUstream` / `cudaStream_t`
    /// of that device's primary context, which the caller keeps alive while the engine
    /// lives; `None`: a stream of the engine's own). Errors: [`ErrorKind::Unsupported`]
    /// when no CUDA driver can be opened, [`ErrorKind::Io`] when the driver refuses the
    /// device or the stream.
    pub fn new(ordinal: u32, stream: Option<u64>) -> Result<CudaEngine> {
        let api = api()?;
        let dev_ordinal = i32::try_from(ordinal).map_err(|_| Error::invalid("device ordinal out of range"))?;
        let mut device = 0i32;
        // SAFETY: out-pointer to a local.
        let rc = unsafe { (api.device_get)(&mut device, dev_ordinal) };
        if rc != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("cuda:{ordinal}: cuDeviceGet failed: {}", describe(api, rc)),
            ));
        }
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; released in `Inner::drop`.
        let rc = unsafe { (api.primary_ctx_retain)(&mut ctx, device) };
        if rc != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("cuda:{ordinal}: cuDevicePrimaryCtxRetain failed: {}", describe(api, rc)),
            ));
        }
        let mut inner = Inner {
            api,
            ordinal,
            ctx: ctx as usize,
            stream: stream.unwrap_or(0) as usize,
            owns_stream: false,
            pool: Mutex::new(Vec::new()),
            events: Mutex::new(HashMap::new()),
            tickets: AtomicU64::new(1),
            batches: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        };
        if stream.is_none() {
            let mut s: CuStream = std::ptr::null_mut();
            inner.in_context(|| {
                // SAFETY: out-pointer to a local, in the device's context.
                let rc = unsafe { (api.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) };
                inner.check(rc, "cuStreamCreate")
            })?;
            inner.stream = s as usize;
            inner.owns_stream = true;
        }
        Ok(CudaEngine { inner: Arc::new(inner) })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.inner.ordinal
    }

    /// `len` bytes of device memory (`cuMemAlloc`), for tests and benchmarks; free it
    /// with [`CudaEngine::free_device`].
    pub fn alloc_device(&self, len: u64) -> Result<u64> {
        let mut p = 0u64;
        self.inner.in_context(|| {
            // SAFETY: out-pointer to a local, in the device's context.
            let rc = unsafe { (self.inner.api.mem_alloc)(&mut p, len as usize) };
            self.inner.check(rc, "cuMemAlloc")
        })?;
        Ok(p)
    }

    /// Frees memory of [`CudaEngine::alloc_device`].
    ///
    /// # Safety
    /// `address` came from `alloc_device` of this engine and is not used afterwards.
    pub unsafe fn free_device(&self, address: u64) -> Result<()> {
        self.inner.in_context(|| {
            // SAFETY: the caller's contract.
            let rc = unsafe { (self.inner.api.mem_free)(address) };
            self.inner.check(rc, "cuMemFree")
        })
    }

    fn enqueue(&self, direction: CopyDirection, op: &CopyOp) -> Result<()> {
        let inner = &*self.inner;
        let stream = inner.stream as CuStream;
        if op.height == 1 {
            // Unified addressing: host and device pointers alike.
            // SAFETY: the rows are valid in their memories (`submit`'s contract).
            let rc = unsafe { (inner.api.memcpy_async)(op.target, op.source, op.width as usize, stream) };
            return inner.check(rc, "cuMemcpyAsync");
        }
        let (src_dev, dst_dev) = (direction.source_is_device(), direction.target_is_device());
        let p = Memcpy2d {
            src_x_in_bytes: 0,
            src_y: 0,
            src_memory_type: if src_dev { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST },
            src_host: if src_dev { std::ptr::null() } else { op.source as *const c_void },
            src_device: if src_dev { op.source } else { 0 },
            src_array: std::ptr::null_mut(),
            src_pitch: op.source_pitch as usize,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: if dst_dev { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST },
            dst_host: if dst_dev { std::ptr::null_mut() } else { op.target as *mut c_void },
            dst_device: if dst_dev { op.target } else { 0 },
            dst_array: std::ptr::null_mut(),
            dst_pitch: op.target_pitch as usize,
            width_in_bytes: op.width as usize,
            height: op.height as usize,
        };
        // SAFETY: a fully initialized descriptor of rows valid in their memories.
        let rc = unsafe { (inner.api.memcpy_2d_async)(&p, stream) };
        inner.check(rc, "cuMemcpy2DAsync")
    }
}

impl DeviceEngine for CudaEngine {
    fn name(&self) -> String {
        format!("cuda:{}", self.inner.ordinal)
    }

    unsafe fn submit(&self, ordinal: u32, direction: CopyDirection, ops: &[CopyOp]) -> Result<CopyTicket> {
        let inner = &*self.inner;
        if ordinal != inner.ordinal {
            return Err(Error::invalid(format!(
                "the engine of cuda:{} cannot copy for device {ordinal}",
                inner.ordinal
            )));
        }
        check_ops(ops)?;
        let event = inner.in_context(|| {
            for op in ops {
                self.enqueue(direction, op)?;
            }
            let mut e: CuEvent = std::ptr::null_mut();
            // SAFETY: out-pointer to a local, in the device's context.
            inner.check(unsafe { (inner.api.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) }, "cuEventCreate")?;
            // SAFETY: the event just created, on the engine's stream.
            let rc = unsafe { (inner.api.event_record)(e, inner.stream as CuStream) };
            if let Err(err) = inner.check(rc, "cuEventRecord") {
                // SAFETY: the event created above, never recorded.
                unsafe { (inner.api.event_destroy)(e) };
                return Err(err);
            }
            Ok(e as usize)
        });
        let event = match event {
            Ok(e) => e,
            Err(err) => {
                // Copies enqueued before the failure may still run: finish them before
                // the caller's buffers can go away.
                // SAFETY: the engine's stream.
                let _ = inner.in_context(|| Ok(unsafe { (inner.api.stream_synchronize)(inner.stream as CuStream) }));
                return Err(err);
            }
        };
        inner.batches.fetch_add(1, Ordering::Relaxed);
        inner.copies.fetch_add(ops.len() as u64, Ordering::Relaxed);
        inner.bytes.fetch_add(ops.iter().map(CopyOp::bytes).sum(), Ordering::Relaxed);
        let t = inner.tickets.fetch_add(1, Ordering::Relaxed);
        inner.events.lock().insert(t, event);
        Ok(CopyTicket(t))
    }

    fn wait(&self, ticket: CopyTicket) -> Result<()> {
        let inner = &*self.inner;
        let event = inner
            .events
            .lock()
            .remove(&ticket.0)
            .ok_or_else(|| Error::invalid(format!("unknown device copy ticket {}", ticket.0)))?;
        // SAFETY: an event recorded by `submit`, waited on once.
        let r = inner.check(unsafe { (inner.api.event_synchronize)(event as CuEvent) }, "cuEventSynchronize");
        // SAFETY: the event, no longer used.
        unsafe { (inner.api.event_destroy)(event as CuEvent) };
        r
    }

    fn staging(&self, len: u64) -> Result<StagingBuffer> {
        let inner = Arc::clone(&self.inner);
        // Pinned allocations are slow (milliseconds per call): sizes are rounded up to
        // a power of two (at least 1 MiB) so that the pool serves the next request.
        let want = usize::try_from(len.max(1 << 20).next_power_of_two())
            .map_err(|_| Error::new(ErrorKind::LimitExceeded, "staging buffer too large"))?;
        let pooled = {
            let mut pool = inner.pool.lock();
            let best =
                pool.iter().enumerate().filter(|(_, &(_, l))| l >= want).min_by_key(|(_, &(_, l))| l).map(|(i, _)| i);
            best.map(|i| pool.swap_remove(i))
        };
        let (address, size) = match pooled {
            Some(b) => b,
            None => {
                let mut p: *mut c_void = std::ptr::null_mut();
                inner.in_context(|| {
                    // SAFETY: out-pointer to a local, in the device's context.
                    let rc = unsafe { (inner.api.mem_host_alloc)(&mut p, want, 0) };
                    inner.check(rc, "cuMemHostAlloc")
                })?;
                (p as usize, want)
            }
        };
        let keeper = Arc::clone(&inner);
        // SAFETY: `size >= len` bytes of pinned host memory this engine allocated; the
        // buffer owns it until its release returns it to the pool.
        Ok(unsafe { StagingBuffer::from_raw(address as u64, len, Box::new(move || keeper.give_back(address, size))) })
    }

    fn stats(&self) -> DeviceStats {
        let i = &*self.inner;
        DeviceStats {
            batches: i.batches.load(Ordering::Relaxed),
            copies: i.copies.load(Ordering::Relaxed),
            driver_calls: i.calls.load(Ordering::Relaxed),
            bytes: i.bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_has_the_drivers_layout() {
        // CUDA_MEMCPY2D on 64-bit Linux: 16 fields, 128 bytes.
        assert_eq!(std::mem::size_of::<Memcpy2d>(), 128);
        assert_eq!(std::mem::offset_of!(Memcpy2d, src_pitch), 48);
        assert_eq!(std::mem::offset_of!(Memcpy2d, dst_memory_type), 72);
        assert_eq!(std::mem::offset_of!(Memcpy2d, width_in_bytes), 112);
    }

    #[test]
    fn without_a_driver_the_engine_is_unsupported_not_a_crash() {
        if std::env::var_os("MWS_CUDA_DRIVER").is_some() || std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a machine with a driver: covered by scripts/gpu-check.sh
        }
        let e = CudaEngine::new(0, None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
    }
}
