//! A caller-implemented object store behind a C vtable (`docs/STORE-VTABLE.md`).
//!
//! [`VtableCalls`] implements the core's [`RemoteCalls`] by calling the function
//! pointers of a [`mws_store_vtable`] with the caller's `ctx`, and nothing more: the
//! code mapping, the retries of transient codes and every check of the contract are
//! the core's [`RemoteStore`] ([`store_from_vtable`] builds one).
//!
//! The callbacks are C functions: they must not unwind (a C++ exception escaping a
//! callback is undefined behaviour) and must be thread-safe.

use crate::callbacks::{memory_code, read_vtable_prefix, Ctx};
use mws::error::{Error, Result};
use mws::runtime::MemoryRegion;
use mws::store::remote::{RemoteCalls, RemoteCapabilities, RemotePut, RemoteRange, RemoteStore};
use mws::store::{RecordType, StoreCost};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Version of [`mws_store_vtable`] this library implements.
pub const MWS_STORE_VTABLE_VERSION: u32 = 1;

/// `record_type` of payload objects (Mooncake `ObjectDataType.WEIGHT`).
pub const MWS_RECORD_PAYLOAD: u32 = 0;

/// `record_type` of manifests and decision records (Mooncake `METADATA`).
pub const MWS_RECORD_METADATA: u32 = 1;

/// A borrowed UTF-8 byte string (a key or group id); not NUL-terminated. Valid only
/// for the duration of the callback it is passed to.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_bytes {
    /// First byte (never NULL, even when `len` is 0).
    pub ptr: *const std::ffi::c_char,
    /// Length in bytes.
    pub len: usize,
}

impl mws_bytes {
    /// A view of `s` (for the duration of one callback).
    pub(crate) fn of(s: &str) -> mws_bytes {
        mws_bytes::of_bytes(s.as_bytes())
    }

    /// A view of `b`; never NULL (a static empty string when `b` is empty).
    pub(crate) fn of_bytes(b: &[u8]) -> mws_bytes {
        mws_bytes { ptr: bytes_ptr(b) as *const std::ffi::c_char, len: b.len() }
    }
}

/// One item of `batch_put_from`: write `len` bytes at `address` as object `key`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_put_item {
    /// Object key.
    pub key: mws_bytes,
    /// The key's group (`ReplicateConfig.group_ids[i]`).
    pub group_id: mws_bytes,
    /// Source bytes (registered memory).
    pub address: u64,
    /// Number of bytes.
    pub len: u64,
    /// `MWS_MEMORY_HOST` (0) or `MWS_MEMORY_DEVICE` (1).
    pub memory_kind: u32,
    /// Device ordinal when `memory_kind` is `MWS_MEMORY_DEVICE`.
    pub device_ordinal: u32,
}

/// One item of `get_into_ranges` (flat form): copy `len` bytes of object `key` from
/// `object_offset` to `dest_address`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_range_item {
    /// Object key.
    pub key: mws_bytes,
    /// Absolute offset inside the object.
    pub object_offset: u64,
    /// Destination (registered memory).
    pub dest_address: u64,
    /// Number of bytes.
    pub len: u64,
    /// Start of the registered target view that contains `dest_address`.
    pub buffer_address: u64,
    /// `MWS_MEMORY_HOST` (0) or `MWS_MEMORY_DEVICE` (1).
    pub memory_kind: u32,
    /// Device ordinal when `memory_kind` is `MWS_MEMORY_DEVICE`.
    pub device_ordinal: u32,
}

/// The operations of a caller-implemented object store (`docs/STORE-VTABLE.md`).
///
/// Set `size = sizeof(mws_store_vtable)` and `version = MWS_STORE_VTABLE_VERSION`.
/// Every callback receives the `ctx` given to `mws_store_from_vtable`. Callbacks must
/// not throw or unwind and must be thread-safe. Return codes are Mooncake's
/// `ErrorCode` values: 0 ok, -704 not found, -706 object has lease, -200 no available
/// handle (transient), -600 invalid params, other negative = error. The library
/// retries -200 and -706 with a bounded backoff. `register_buffer`,
/// `unregister_buffer`, `destroy` and every field after `destroy` (`batch_exists`,
/// `list`, `get_cost`, `batch_get_size`) may be NULL; every other callback is required.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_store_vtable {
    /// `sizeof(mws_store_vtable)`: lets the struct grow.
    pub size: u32,
    /// `MWS_STORE_VTABLE_VERSION`.
    pub version: u32,
    /// Create-only put (MAY return 0 for an existing key, as Mooncake does).
    pub put: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: mws_bytes,
            value: *const u8,
            len: u64,
            group_id: mws_bytes,
            record_type: u32,
        ) -> i32,
    >,
    /// Insert or replace.
    pub upsert: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: mws_bytes,
            value: *const u8,
            len: u64,
            group_id: mws_bytes,
            record_type: u32,
        ) -> i32,
    >,
    /// Size of the object in bytes, or a negative code (-704).
    pub get_size: Option<unsafe extern "C" fn(ctx: *mut c_void, key: mws_bytes) -> i64>,
    /// Copies the object into `buf` (capacity `cap`); bytes read or a negative code.
    pub get_into: Option<unsafe extern "C" fn(ctx: *mut c_void, key: mws_bytes, buf: *mut u8, cap: u64) -> i64>,
    /// 1 present, 0 absent, negative error.
    pub exists: Option<unsafe extern "C" fn(ctx: *mut c_void, key: mws_bytes) -> i32>,
    /// Force remove; 0 or -704 is success.
    pub remove: Option<unsafe extern "C" fn(ctx: *mut c_void, key: mws_bytes) -> i32>,
    /// Per-item status into `results[n]`; returns 0, or a negative batch-level error.
    pub batch_put_from: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            items: *const mws_put_item,
            n: usize,
            record_type: u32,
            results: *mut i32,
        ) -> i32,
    >,
    /// Per-item bytes read (== len) or a negative code into `results[n]`; returns 0,
    /// or a negative batch-level error.
    pub get_into_ranges: Option<
        unsafe extern "C" fn(ctx: *mut c_void, items: *const mws_range_item, n: usize, results: *mut i64) -> i32,
    >,
    /// Optional (NULL = no-op).
    pub register_buffer: Option<
        unsafe extern "C" fn(ctx: *mut c_void, address: u64, len: u64, memory_kind: u32, device_ordinal: u32) -> i32,
    >,
    /// Optional (NULL = no-op).
    pub unregister_buffer: Option<unsafe extern "C" fn(ctx: *mut c_void, address: u64) -> i32>,
    /// Optional: called once when the store is freed.
    pub destroy: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// Optional (NULL: `exists` is called per key), read only when `size` covers it
    /// (a vtable of the previous, smaller size keeps working). Existence of `n` keys
    /// in one round trip: writes 1 (present), 0 (absent) or a negative code per key
    /// into `results[n]`; returns 0, or a negative batch-level error (applied to every
    /// key). Mooncake: `batchIsExist`.
    pub batch_exists:
        Option<unsafe extern "C" fn(ctx: *mut c_void, keys: *const mws_bytes, n: usize, results: *mut i32) -> i32>,
    /// Optional (NULL: the store cannot list; `mws ls`/`gc` then refuse it), read
    /// only when `size` covers it. Streams every object whose key starts with
    /// `prefix` by calling `emit(emit_ctx, key, size)` once per object, in any
    /// order; `emit` copies the key (it need only live for that call) and returns 0
    /// to continue or 1 to stop early (then `list` returns 0 at once). Returns 0, or
    /// a negative error code. Must not call `emit` after returning. Mooncake: no
    /// client call lists keys (`docs/mooncake/README.md`), so its vtable leaves it NULL.
    pub list: Option<
        unsafe extern "C" fn(ctx: *mut c_void, prefix: mws_bytes, emit: mws_list_emit, emit_ctx: *mut c_void) -> i32,
    >,
    /// Optional (NULL: the library assumes a remote, range-priced store such as
    /// Mooncake Store), read only when `size` covers it. Called once, when the store
    /// is opened: writes the backend's cost model to `*out` (see `mws_store_cost`);
    /// returns 0, or a negative code (the open then fails with `MWS_STORE`). Restores
    /// use it to choose between ranged reads and staged span reads per region.
    pub get_cost: Option<unsafe extern "C" fn(ctx: *mut c_void, out: *mut mws_store_cost) -> i32>,
    /// Optional (NULL: `get_size` is called per key), read only when `size` covers it
    /// (a vtable of a previous, smaller size keeps working). Sizes of `n` keys in one
    /// round trip: writes per key the object's size in bytes (`>= 0`) or a negative
    /// code (-704 not found, -200/-706 transient: that key is then asked again with
    /// `get_size`) into `sizes[n]`; returns 0, or a negative batch-level error
    /// (applied to every key). `keys[n]` and `sizes[n]` are valid for the call only;
    /// a key left unwritten is an error. Restores ask it for every object they read
    /// (in chunks of at most 1024 keys) before writing any byte. Mooncake:
    /// `batch_get_replica_desc` (the size of a complete memory replica).
    pub batch_get_size:
        Option<unsafe extern "C" fn(ctx: *mut c_void, keys: *const mws_bytes, n: usize, sizes: *mut i64) -> i32>,
}

/// What a request to a vtable store costs (`mws_store_vtable.get_cost`): about
/// `per_request_ns + ranges * per_range_ns + bytes * 1e9 / bytes_per_second`
/// nanoseconds. Mooncake Store through its Python client measures about 21 us per
/// range here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_store_cost {
    /// Fixed cost of one request (one `get_into_ranges` or `batch_put_from` call), ns.
    pub per_request_ns: u64,
    /// Additional cost of each range or item, ns.
    pub per_range_ns: u64,
    /// Sustained bandwidth of one request stream, bytes per second (> 0).
    pub bytes_per_second: u64,
}

/// The visitor [`mws_store_vtable::list`] calls once per object: copy `key` (valid
/// for the call only), return 0 to continue or 1 to stop.
pub type mws_list_emit = unsafe extern "C" fn(emit_ctx: *mut c_void, key: mws_bytes, size: u64) -> i32;

/// The library's [`mws_list_emit`]: forwards each key (as bytes; `None` for a NULL
/// pointer) to the core's visitor behind `emit_ctx` (a `&mut ListSink`).
unsafe extern "C" fn list_emit(emit_ctx: *mut c_void, key: mws_bytes, size: u64) -> i32 {
    // SAFETY: `emit_ctx` is the `&mut ListSink` passed by `list` below, alive for the
    // whole `list` call, and the callback runs on that call's thread.
    let sink = unsafe { &mut *(emit_ctx as *mut ListSink<'_>) };
    let bytes = (!key.ptr.is_null()).then(|| {
        // SAFETY: the callee passes `len` readable bytes at a non-NULL `ptr` for this call.
        unsafe { std::slice::from_raw_parts(key.ptr as *const u8, key.len) }
    });
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (sink.0)(bytes, size))) {
        Ok(true) => 0,
        _ => 1,
    }
}

struct ListSink<'a>(&'a mut dyn FnMut(Option<&[u8]>, u64) -> bool);

/// Size of the first [`mws_store_vtable`] layout (up to and including `destroy`):
/// the smallest `size` accepted. Fields after it are read only when `size` covers them.
pub(crate) const STORE_VTABLE_MIN_SIZE: usize = std::mem::offset_of!(mws_store_vtable, batch_exists);

pub(crate) fn record_code(r: RecordType) -> u32 {
    match r {
        RecordType::Payload => MWS_RECORD_PAYLOAD,
        RecordType::Metadata => MWS_RECORD_METADATA,
    }
}

/// The raw calls of a store vtable. Once `owns` is set (the store was built), it
/// owns `ctx`: `destroy` is called once on drop.
pub(crate) struct VtableCalls {
    vt: mws_store_vtable,
    ctx: Ctx,
    owns: Arc<AtomicBool>,
}

impl Drop for VtableCalls {
    fn drop(&mut self) {
        if let (Some(destroy), true) = (self.vt.destroy, self.owns.load(Ordering::Acquire)) {
            // SAFETY: called exactly once, as the contract says.
            unsafe { destroy(self.ctx.0) };
        }
    }
}

/// Wraps `vt` (copied) and `ctx` in the core's [`RemoteStore`]. Checks `vt->size`,
/// `vt->version` and that every mandatory callback is present. On success the store
/// owns `ctx` (its `destroy`, if any, is called once when the store is dropped); on
/// failure nothing is called and the caller keeps `ctx`.
///
/// # Safety
/// `vt` is NULL or points to a readable vtable of at least `vt->size` bytes; the
/// callbacks honour the vtable contract (thread-safe, never unwind) for as long as
/// the store lives.
pub(crate) unsafe fn store_from_vtable(vt: *const mws_store_vtable, ctx: *mut c_void) -> Result<RemoteStore> {
    // SAFETY: forwarded contract; the fields after STORE_VTABLE_MIN_SIZE are optional
    // callbacks (`Option<fn>`), valid when all-zero.
    let vt = unsafe { read_vtable_prefix(vt, "mws_store_vtable", MWS_STORE_VTABLE_VERSION, STORE_VTABLE_MIN_SIZE) }?;
    let mandatory = [
        ("put", vt.put.is_some()),
        ("upsert", vt.upsert.is_some()),
        ("get_size", vt.get_size.is_some()),
        ("get_into", vt.get_into.is_some()),
        ("exists", vt.exists.is_some()),
        ("remove", vt.remove.is_some()),
        ("batch_put_from", vt.batch_put_from.is_some()),
        ("get_into_ranges", vt.get_into_ranges.is_some()),
    ];
    let missing: Vec<&str> = mandatory.iter().filter(|(_, present)| !present).map(|(name, _)| *name).collect();
    if !missing.is_empty() {
        return Err(Error::invalid(format!("mws_store_vtable is missing mandatory callbacks: {}", missing.join(", "))));
    }
    // A store that fails to build drops the calls without `destroy`: the caller keeps ctx.
    let owns = Arc::new(AtomicBool::new(false));
    let store = RemoteStore::new(Box::new(VtableCalls { vt, ctx: Ctx(ctx), owns: owns.clone() }))?;
    owns.store(true, Ordering::Release);
    Ok(store)
}

/// A NUL-free pointer for `value` (a dangling-but-valid one when empty).
fn bytes_ptr(value: &[u8]) -> *const u8 {
    if value.is_empty() {
        c"".as_ptr().cast::<u8>()
    } else {
        value.as_ptr()
    }
}

impl VtableCalls {
    fn write(&self, upsert: bool, key: &str, value: &[u8], group_id: &str, record: RecordType) -> i64 {
        let f = if upsert { self.vt.upsert } else { self.vt.put }.expect("checked at construction");
        let (key, group) = (mws_bytes::of(key), mws_bytes::of(group_id));
        // SAFETY: a checked vtable function over `ctx`; key, value and group point to
        // live bytes for the call.
        i64::from(unsafe { f(self.ctx.0, key, bytes_ptr(value), value.len() as u64, group, record_code(record)) })
    }
}

impl RemoteCalls for VtableCalls {
    fn put(&self, key: &str, value: &[u8], group_id: &str, record: RecordType) -> i64 {
        self.write(false, key, value, group_id, record)
    }

    fn upsert(&self, key: &str, value: &[u8], group_id: &str, record: RecordType) -> i64 {
        self.write(true, key, value, group_id, record)
    }

    fn get_size(&self, key: &str) -> i64 {
        let f = self.vt.get_size.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        unsafe { f(self.ctx.0, mws_bytes::of(key)) }
    }

    fn get_into(&self, key: &str, buf: &mut [u8]) -> i64 {
        let f = self.vt.get_into.expect("checked at construction");
        let ptr = if buf.is_empty() { std::ptr::NonNull::<u8>::dangling().as_ptr() } else { buf.as_mut_ptr() };
        // SAFETY: a checked vtable function over `ctx`; `ptr` points to `buf.len()`
        // writable bytes (or is dangling with a capacity of 0).
        unsafe { f(self.ctx.0, mws_bytes::of(key), ptr, buf.len() as u64) }
    }

    fn exists(&self, key: &str) -> i64 {
        let f = self.vt.exists.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        i64::from(unsafe { f(self.ctx.0, mws_bytes::of(key)) })
    }

    fn remove(&self, key: &str) -> i64 {
        let f = self.vt.remove.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        i64::from(unsafe { f(self.ctx.0, mws_bytes::of(key)) })
    }

    unsafe fn batch_put_from(&self, items: &[RemotePut<'_>], record: RecordType, results: &mut [i32]) -> i32 {
        let f = self.vt.batch_put_from.expect("checked at construction");
        let c_items: Vec<mws_put_item> = items
            .iter()
            .map(|it| {
                let (kind, ordinal) = memory_code(it.source.kind);
                mws_put_item {
                    key: mws_bytes::of(it.key),
                    group_id: mws_bytes::of(it.group_id),
                    address: it.source.address,
                    len: it.source.len,
                    memory_kind: kind,
                    device_ordinal: ordinal,
                }
            })
            .collect();
        // SAFETY: the caller vouches for the source regions (this function's contract);
        // `c_items` and `results` hold `items.len()` elements and outlive the call.
        unsafe { f(self.ctx.0, c_items.as_ptr(), c_items.len(), record_code(record), results.as_mut_ptr()) }
    }

    unsafe fn get_into_ranges(&self, items: &[RemoteRange<'_>], results: &mut [i64]) -> i32 {
        let f = self.vt.get_into_ranges.expect("checked at construction");
        let c_items: Vec<mws_range_item> = items
            .iter()
            .map(|r| {
                let (kind, ordinal) = memory_code(r.dest.kind);
                mws_range_item {
                    key: mws_bytes::of(r.key),
                    object_offset: r.object_offset,
                    dest_address: r.dest.address,
                    len: r.dest.len,
                    buffer_address: r.buffer_address,
                    memory_kind: kind,
                    device_ordinal: ordinal,
                }
            })
            .collect();
        // SAFETY: the caller vouches for the destinations (this function's contract);
        // `c_items` and `results` hold `items.len()` elements and outlive the call.
        unsafe { f(self.ctx.0, c_items.as_ptr(), c_items.len(), results.as_mut_ptr()) }
    }

    fn capabilities(&self) -> RemoteCapabilities {
        RemoteCapabilities {
            buffers: self.vt.register_buffer.is_some() || self.vt.unregister_buffer.is_some(),
            batch_exists: self.vt.batch_exists.is_some(),
            batch_get_size: self.vt.batch_get_size.is_some(),
            list: self.vt.list.is_some(),
        }
    }

    fn register_buffer(&self, region: MemoryRegion) -> i64 {
        let Some(f) = self.vt.register_buffer else { return 0 };
        let (kind, ordinal) = memory_code(region.kind);
        // SAFETY: an optional vtable function checked non-NULL, over `ctx`.
        i64::from(unsafe { f(self.ctx.0, region.address, region.len, kind, ordinal) })
    }

    fn unregister_buffer(&self, address: u64) -> i64 {
        let Some(f) = self.vt.unregister_buffer else { return 0 };
        // SAFETY: an optional vtable function checked non-NULL, over `ctx`.
        i64::from(unsafe { f(self.ctx.0, address) })
    }

    fn batch_exists(&self, keys: &[&str], results: &mut [i32]) -> i32 {
        let f = self.vt.batch_exists.expect("called only with the capability");
        let c_keys: Vec<mws_bytes> = keys.iter().map(|k| mws_bytes::of(k)).collect();
        // SAFETY: an optional vtable function checked non-NULL over `ctx`; `c_keys` and
        // `results` hold `keys.len()` elements; the keys outlive the call.
        unsafe { f(self.ctx.0, c_keys.as_ptr(), c_keys.len(), results.as_mut_ptr()) }
    }

    fn batch_get_size(&self, keys: &[&str], sizes: &mut [i64]) -> i32 {
        let f = self.vt.batch_get_size.expect("called only with the capability");
        let c_keys: Vec<mws_bytes> = keys.iter().map(|k| mws_bytes::of(k)).collect();
        // SAFETY: as for `batch_exists`, with `sizes`.
        unsafe { f(self.ctx.0, c_keys.as_ptr(), c_keys.len(), sizes.as_mut_ptr()) }
    }

    fn list(&self, prefix: &str, visit: &mut dyn FnMut(Option<&[u8]>, u64) -> bool) -> i64 {
        let f = self.vt.list.expect("called only with the capability");
        let mut sink = ListSink(visit);
        // SAFETY: an optional vtable function checked non-NULL over `ctx`; `sink`
        // outlives the call and `list_emit` is the matching visitor.
        i64::from(unsafe {
            f(self.ctx.0, mws_bytes::of(prefix), list_emit, &mut sink as *mut ListSink<'_> as *mut c_void)
        })
    }

    fn cost(&self) -> std::result::Result<Option<StoreCost>, i64> {
        let Some(f) = self.vt.get_cost else { return Ok(None) };
        let mut c = mws_store_cost::default();
        // SAFETY: an optional vtable function checked non-NULL, over `ctx`; `c` is a live local.
        let code = unsafe { f(self.ctx.0, &mut c) };
        if code != 0 {
            return Err(i64::from(code));
        }
        Ok(Some(StoreCost {
            per_request_ns: c.per_request_ns,
            per_range_ns: c.per_range_ns,
            bytes_per_second: c.bytes_per_second,
        }))
    }
}
