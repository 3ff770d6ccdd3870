//! A caller-implemented object store behind a C vtable (`docs/STORE-VTABLE.md`) as a
//! `store::ObjectStore`.
//!
//! [`CallbackStore`] implements [`ObjectStore`] by calling the function pointers of a
//! [`mws_store_vtable`] with the caller's `ctx`. Return codes are Mooncake's
//! `ErrorCode` values: `0` ok, `-704` not found, `-705` already exists, `-706`
//! object has lease and `-200` no available handle (both transient: retried with a
//! bounded exponential backoff), any other negative value is a store error naming the
//! key and the code.
//!
//! The contract is enforced exactly: a value outside an entry point's documented
//! range (`exists` other than 0, 1 or negative; a positive status from `put`,
//! `upsert`, `remove`, a batch call or the buffer callbacks; a size or byte count
//! larger than the buffer or the requested range) is a [`ErrorKind::Store`] error
//! `store callback <op> returned <value> for <key>, outside its contract (<range>)`,
//! never taken as success. Sizes reported by `get_size` are validated before any
//! allocation: whole-object reads are bounded ([`ObjectStore::get_limited`]) and
//! allocate with `try_reserve`, so no reported size can abort the process.
//!
//! The callbacks are C functions: they must not unwind (a C++ exception escaping a
//! callback is undefined behaviour) and must be thread-safe. Nothing on the Rust side
//! of this module panics on caller data.

use crate::callbacks::{memory_code, Ctx};
use mws::error::Error;
use mws::error::ErrorKind;
use mws::error::Result;
use mws::runtime::MemoryKind;
use mws::runtime::MemoryRegion;
use mws::store::not_found;
use mws::store::ObjectStore;
use mws::store::PutFrom;
use mws::store::RangeRead;
use mws::store::RecordType;
use mws::store::WriteConfig;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::time::Duration;

use mws::store::{alloc_failed, too_large, StoreCost};

/// Version of [`mws_store_vtable`] this library implements.
pub const MWS_STORE_VTABLE_VERSION: u32 = 1;

/// `record_type` of payload objects (Mooncake `ObjectDataType.WEIGHT`).
pub const MWS_RECORD_PAYLOAD: u32 = 0;

/// `record_type` of manifests and decision records (Mooncake `METADATA`).
pub const MWS_RECORD_METADATA: u32 = 1;

/// Mooncake `ErrorCode` values the library interprets.
pub(crate) const NO_AVAILABLE_HANDLE: i64 = -200;

pub(crate) const OBJECT_NOT_FOUND: i64 = -704;

pub(crate) const OBJECT_ALREADY_EXISTS: i64 = -705;

pub(crate) const OBJECT_HAS_LEASE: i64 = -706;

/// Capacity of the first, unsized read of [`CallbackStore`]'s `get` (objects smaller
/// than this are read in one callback instead of `get_size` + `get_into`).
pub(crate) const GET_FIRST_TRY: usize = 256 << 10;

/// Retry policy of transient codes (-200, -706): at most `MAX_TRIES` calls, sleeping
/// 5 ms, 10 ms, ... (doubling, capped at 200 ms) between them.
pub(crate) const MAX_TRIES: u32 = 8;

pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(5);

pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Most keys passed to one `batch_get_size` call.
const SIZES_PER_CALL: usize = 1024;

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
    pub(crate) fn of(s: &str) -> mws_bytes {
        // A dangling-but-non-NULL pointer for empty strings keeps `ptr` non-NULL.
        let ptr = if s.is_empty() { c"".as_ptr().cast::<u8>() } else { s.as_ptr() };
        mws_bytes { ptr: ptr as *const std::ffi::c_char, len: s.len() }
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

/// The library's [`mws_list_emit`]: forwards to the Rust visitor behind `emit_ctx`
/// (a `&mut ListSink`).
unsafe extern "C" fn list_emit(emit_ctx: *mut c_void, key: mws_bytes, size: u64) -> i32 {
    // SAFETY: `emit_ctx` is the `&mut ListSink` passed by `list` below, alive for
    // the whole `list` call, and the callback runs on that call's thread.
    let sink = unsafe { &mut *(emit_ctx as *mut ListSink<'_>) };
    if sink.done || key.ptr.is_null() {
        sink.bad = sink.bad || key.ptr.is_null();
        return 1;
    }
    // SAFETY: the callee passes `len` readable bytes at `ptr` for this call.
    let bytes = unsafe { std::slice::from_raw_parts(key.ptr as *const u8, key.len) };
    let Ok(k) = std::str::from_utf8(bytes) else {
        sink.bad = true;
        return 1;
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (sink.visit)(k, size))) {
        Ok(true) => 0,
        _ => {
            sink.done = true;
            1
        }
    }
}

struct ListSink<'a> {
    visit: &'a mut dyn FnMut(&str, u64) -> bool,
    done: bool,
    bad: bool,
}

/// Size of the first [`mws_store_vtable`] layout (up to and including `destroy`):
/// the smallest `size` accepted. Fields after it are read only when `size` covers them.
pub(crate) const STORE_VTABLE_MIN_SIZE: usize = std::mem::offset_of!(mws_store_vtable, batch_exists);

/// Reads a caller's versioned vtable: checks `size` and `version` and copies the
/// part this library knows.
///
/// # Safety
/// `vt` points to at least 8 readable bytes and, when its `size` field says so, to
/// `size_of::<T>()` readable bytes.
pub(crate) unsafe fn read_vtable<T: Copy>(vt: *const T, name: &str, version: u32) -> Result<T> {
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    unsafe { read_vtable_prefix(vt, name, version, std::mem::size_of::<T>()) }
}

/// As [`read_vtable`], accepting any `size` of at least `min_size` (the byte offset of
/// a field boundary of `T`): when `size` is smaller than `T`, only the fields `size`
/// covers are read and the fields after them are zero (NULL callbacks).
///
/// # Safety
/// As [`read_vtable`]; every field of `T` after `min_size` must be pointer-sized,
/// pointer-aligned and valid when all-zero (optional callbacks): a `size` between
/// `min_size` and `size_of::<T>()` copies the whole fields it covers, the rest are
/// zero.
pub(crate) unsafe fn read_vtable_prefix<T: Copy>(vt: *const T, name: &str, version: u32, min_size: usize) -> Result<T> {
    if vt.is_null() {
        return Err(Error::invalid(format!("{name} is NULL")));
    }
    let header = vt as *const u32;
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    let size = unsafe { header.read_unaligned() };
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    let ver = unsafe { header.add(1).read_unaligned() };
    if (size as usize) < min_size {
        return Err(Error::invalid(format!("{name}.size is {size}, expected at least {min_size}")));
    }
    if ver != version {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("{name}.version is {ver}, this library implements version {version}"),
        ));
    }
    if (size as usize) >= std::mem::size_of::<T>() {
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        return Ok(unsafe { vt.read_unaligned() });
    }
    // A smaller (older) layout: copy the fields it covers whole (every optional field
    // after the first layout is one pointer-sized `Option<fn>`), zero the rest.
    let ptr = std::mem::size_of::<usize>();
    let covered = min_size.max((size as usize) / ptr * ptr);
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the caller's vtable is readable for `size` >= `covered` bytes, and `out`
    // is a `T` of more than `covered` bytes; all-zero optional fields are `None`.
    unsafe { std::ptr::copy_nonoverlapping(vt as *const u8, out.as_mut_ptr() as *mut u8, covered) };
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    Ok(unsafe { out.assume_init() })
}

pub(crate) fn record_code(r: RecordType) -> u32 {
    match r {
        RecordType::Payload => MWS_RECORD_PAYLOAD,
        RecordType::Metadata => MWS_RECORD_METADATA,
    }
}

pub(crate) fn transient(code: i64) -> bool {
    code == NO_AVAILABLE_HANDLE || code == OBJECT_HAS_LEASE
}

/// The error of a value outside the documented range of callback `op`.
fn violation(op: &str, key: &str, value: i64, contract: &str) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("store callback {op} returned {value} for {key}, outside its contract ({contract})"),
    )
}

/// A status-only callback's result: 0 is success, negative an error code, positive a
/// contract violation.
fn status_result(op: &str, key: &str, code: i64) -> Result<()> {
    match code {
        0 => Ok(()),
        c if c < 0 => Err(code_error(op, key, c)),
        c => Err(violation(op, key, c, "0 or a negative error code")),
    }
}

/// The error of a negative return code of callback `op` for `key`.
pub(crate) fn code_error(op: &str, key: &str, code: i64) -> Error {
    match code {
        OBJECT_NOT_FOUND => not_found(key),
        OBJECT_ALREADY_EXISTS => Error::new(ErrorKind::AlreadyExists, format!("object already exists: {key}")),
        _ => Error::new(ErrorKind::Store, format!("store callback {op} failed for {key}: error code {code}")),
    }
}

/// Runs `call` until it returns a non-transient code, at most [`MAX_TRIES`] times.
/// A single store callback taking at least this long is logged as slow.
const SLOW_CALL: Duration = Duration::from_secs(1);

pub(crate) fn with_retry(mut call: impl FnMut() -> i64) -> i64 {
    let mut delay = FIRST_BACKOFF;
    let started = std::time::Instant::now();
    let mut code = call();
    if started.elapsed() >= SLOW_CALL {
        log::warn!("slow store callback: {:.3} s (code {code})", started.elapsed().as_secs_f64());
    }
    for attempt in 1..MAX_TRIES {
        if !transient(code) {
            break;
        }
        log::warn!("store callback returned transient code {code}; retry {attempt} in {delay:?}");
        std::thread::sleep(delay);
        delay = (delay * 2).min(MAX_BACKOFF);
        code = call();
    }
    code
}

/// Runs a batch callback with per-item retries: `call(pending, codes)` gets the
/// indices still to do and fills one status per index (or returns a negative batch
/// status). Items with transient codes are retried with backoff, up to `MAX_TRIES`;
/// `ok` turns a non-negative status into the item's value.
pub(crate) fn batch_with_retry<T>(
    op: &str,
    keys: &[&str],
    mut call: impl FnMut(&[usize], &mut [i32]) -> i32,
    ok: impl Fn(i32, &str) -> Result<T>,
) -> Vec<Result<T>> {
    let mut results: Vec<Option<Result<T>>> = (0..keys.len()).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..keys.len()).collect();
    let mut delay = FIRST_BACKOFF;
    for attempt in 0..MAX_TRIES {
        if pending.is_empty() {
            break;
        }
        let mut codes = vec![i32::MIN; pending.len()];
        let batch = call(&pending, &mut codes);
        let last = attempt + 1 == MAX_TRIES;
        let mut retry = Vec::new();
        for (j, &i) in pending.iter().enumerate() {
            let code = if batch < 0 { batch } else { codes[j] };
            if batch > 0 {
                results[i] =
                    Some(Err(violation(op, keys[i], batch as i64, "batch status: 0 or a negative error code")));
            } else if code == i32::MIN {
                let msg = format!("store callback {op} left no result for {}", keys[i]);
                results[i] = Some(Err(Error::new(ErrorKind::Store, msg)));
            } else if code >= 0 {
                results[i] = Some(ok(code, keys[i]));
            } else if transient(code as i64) && !last {
                retry.push(i);
            } else {
                results[i] = Some(Err(code_error(op, keys[i], code as i64)));
            }
        }
        if retry.is_empty() {
            break;
        }
        pending = retry;
        std::thread::sleep(delay);
        delay = (delay * 2).min(MAX_BACKOFF);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Store, format!("{op}: no result")))))
        .collect()
}

/// An [`ObjectStore`] implemented by C callbacks (`docs/STORE-VTABLE.md`).
pub struct CallbackStore {
    pub(crate) vt: mws_store_vtable,
    pub(crate) ctx: Ctx,
    /// Buffers registered through this store: start address -> length. Gives each
    /// range item the `buffer_address` of the registered view that contains it.
    pub(crate) registered: RwLock<BTreeMap<u64, u64>>,
    /// The backend's cost model (`get_cost`, asked once at construction).
    pub(crate) cost: StoreCost,
}

impl fmt::Debug for CallbackStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackStore").finish_non_exhaustive()
    }
}

impl CallbackStore {
    /// Wraps `vt` (copied) and `ctx`. Checks `vt->size` and `vt->version` and that
    /// every mandatory callback is present. On success the store owns `ctx`: its
    /// `destroy` callback (if any) is called once when the store is dropped. On
    /// failure nothing is called and the caller keeps `ctx`.
    ///
    /// # Safety
    /// `vt` is NULL or points to a readable vtable of at least `vt->size` bytes; the
    /// callbacks honour the vtable contract (thread-safe, never unwind) for as long as
    /// the store lives.
    pub unsafe fn new(vt: *const mws_store_vtable, ctx: *mut c_void) -> Result<Self> {
        // SAFETY: the fields after STORE_VTABLE_MIN_SIZE are optional callbacks
        // (Option<fn>): all-zero is None.
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let vt =
            unsafe { read_vtable_prefix(vt, "mws_store_vtable", MWS_STORE_VTABLE_VERSION, STORE_VTABLE_MIN_SIZE) }?;
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
            return Err(Error::invalid(format!(
                "mws_store_vtable is missing mandatory callbacks: {}",
                missing.join(", ")
            )));
        }
        let cost = match vt.get_cost {
            None => StoreCost::REMOTE,
            Some(f) => {
                let mut c = mws_store_cost::default();
                // SAFETY: an optional vtable function checked non-NULL, over the caller's
                // `ctx`; `c` is a live local.
                let code = unsafe { f(ctx, &mut c) };
                if code != 0 {
                    return Err(Error::new(ErrorKind::Store, format!("store callback get_cost returned {code}")));
                }
                let c = StoreCost {
                    per_request_ns: c.per_request_ns,
                    per_range_ns: c.per_range_ns,
                    bytes_per_second: c.bytes_per_second,
                };
                c.validate()?;
                c
            }
        };
        Ok(CallbackStore { vt, ctx: Ctx(ctx), registered: RwLock::new(BTreeMap::new()), cost })
    }

    pub(crate) fn write(&self, op: &str, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        let f = if op == "put" { self.vt.put } else { self.vt.upsert };
        let f = f.expect("checked at construction");
        let group = config.group_ids.first().map(String::as_str).unwrap_or("");
        let ptr = if value.is_empty() { c"".as_ptr().cast::<u8>() } else { value.as_ptr() };
        // SAFETY: a checked vtable function of the caller's store over `ctx`; key and value point to live bytes for the call.
        let code = with_retry(|| unsafe {
            f(
                self.ctx.0,
                mws_bytes::of(key),
                ptr,
                value.len() as u64,
                mws_bytes::of(group),
                record_code(config.record_type),
            ) as i64
        });
        status_result(op, key, code)
    }
}

impl Drop for CallbackStore {
    fn drop(&mut self) {
        if let Some(destroy) = self.vt.destroy {
            // SAFETY: called exactly once, as the contract says.
            unsafe { destroy(self.ctx.0) };
        }
    }
}

impl ObjectStore for CallbackStore {
    fn cost(&self) -> StoreCost {
        self.cost
    }

    fn put(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        self.write("put", key, value, config)
    }

    fn upsert(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        self.write("upsert", key, value, config)
    }

    fn object_size(&self, key: &str) -> Result<u64> {
        let get_size = self.vt.get_size.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        let size = with_retry(|| unsafe { get_size(self.ctx.0, mws_bytes::of(key)) });
        if size < 0 {
            return Err(code_error("get_size", key, size));
        }
        Ok(size as u64)
    }

    /// With `batch_get_size`: one callback per `SIZES_PER_CALL` (1024) keys; each size is
    /// validated as [`ObjectStore::object_size`] validates `get_size`'s, and a key with
    /// a transient code (or a transient batch status) is asked again through
    /// `object_size` (with its retries). Without it: `object_size` per key.
    fn object_sizes(&self, keys: &[&str]) -> Vec<Result<u64>> {
        let Some(f) = self.vt.batch_get_size else {
            return keys.iter().map(|k| self.object_size(k)).collect();
        };
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(SIZES_PER_CALL) {
            let c_keys: Vec<mws_bytes> = chunk.iter().map(|k| mws_bytes::of(k)).collect();
            let mut sizes = vec![i64::MIN; chunk.len()];
            // SAFETY: a checked optional vtable function over `ctx`; `c_keys` and `sizes`
            // hold `chunk.len()` elements and the keys they point to outlive the call.
            let batch = unsafe { f(self.ctx.0, c_keys.as_ptr(), c_keys.len(), sizes.as_mut_ptr()) };
            for (&key, &size) in chunk.iter().zip(&sizes) {
                let code = if batch < 0 { batch as i64 } else { size };
                out.push(if batch > 0 {
                    Err(violation("batch_get_size", key, batch as i64, "batch status: 0 or a negative error code"))
                } else if code >= 0 {
                    Ok(code as u64)
                } else if code == i64::MIN {
                    let msg = format!("store callback batch_get_size left no result for {key}");
                    Err(Error::new(ErrorKind::Store, msg))
                } else if transient(code) {
                    self.object_size(key)
                } else {
                    Err(code_error("batch_get_size", key, code))
                });
            }
        }
        out
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_limited(key, u64::MAX)
    }

    fn get_limited(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let get_size = self.vt.get_size.expect("checked at construction");
        let get_into = self.vt.get_into.expect("checked at construction");
        // One round trip for small objects (manifests, decision records): read into a
        // buffer of GET_FIRST_TRY bytes (or one byte more than the bound, if smaller)
        // first. A result shorter than the buffer is the whole object (an
        // implementation that truncated would report the capacity); -704 is "not
        // found"; anything else (-600: larger object) takes the sized path.
        let first_cap = (GET_FIRST_TRY as u64).min(max_bytes.saturating_add(1)) as usize;
        let mut first = vec![0u8; first_cap];
        // SAFETY: a checked vtable function over `ctx`; `first` is a live buffer of `first.len()` bytes.
        let n =
            with_retry(|| unsafe { get_into(self.ctx.0, mws_bytes::of(key), first.as_mut_ptr(), first.len() as u64) });
        if n > first_cap as i64 {
            return Err(violation("get_into", key, n, &format!("at most the capacity of {first_cap} bytes")));
        }
        if n >= 0 && (n as u64) < first_cap as u64 {
            first.truncate(n as usize);
            return Ok(first);
        }
        if n == OBJECT_NOT_FOUND {
            return Err(not_found(key));
        }
        drop(first);
        // The object may be replaced between the two calls: retry a few times.
        for _ in 0..MAX_TRIES {
            // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
            let size = with_retry(|| unsafe { get_size(self.ctx.0, mws_bytes::of(key)) });
            if size < 0 {
                return Err(code_error("get_size", key, size));
            }
            if size as u64 > max_bytes {
                return Err(too_large(key, size as u64, max_bytes));
            }
            let cap = usize::try_from(size)
                .ok()
                .filter(|&c| c <= isize::MAX as usize)
                .ok_or_else(|| alloc_failed(key, size as u64))?;
            let mut buf: Vec<u8> = Vec::new();
            buf.try_reserve_exact(cap).map_err(|_| alloc_failed(key, size as u64))?;
            buf.resize(cap, 0);
            let ptr = if cap == 0 { std::ptr::NonNull::<u8>::dangling().as_ptr() } else { buf.as_mut_ptr() };
            // SAFETY: a checked vtable function over `ctx`; `ptr` points to `cap` writable bytes (or is dangling with `cap == 0`).
            let n = with_retry(|| unsafe { get_into(self.ctx.0, mws_bytes::of(key), ptr, cap as u64) });
            if n < 0 {
                return Err(code_error("get_into", key, n));
            }
            if n as u64 > cap as u64 {
                return Err(violation("get_into", key, n, &format!("at most the capacity of {cap} bytes")));
            }
            if n as u64 == size as u64 {
                return Ok(buf);
            }
        }
        Err(Error::new(ErrorKind::Store, format!("object {key} changed size while it was read")))
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let f = self.vt.exists.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        match with_retry(|| unsafe { f(self.ctx.0, mws_bytes::of(key)) as i64 }) {
            0 => Ok(false),
            1 => Ok(true),
            c if c < 0 => Err(code_error("exists", key, c)),
            c => Err(violation("exists", key, c, "1 present, 0 absent or a negative error code")),
        }
    }

    fn supports_list(&self) -> bool {
        self.vt.list.is_some()
    }

    fn list(&self, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<()> {
        let Some(f) = self.vt.list else {
            return Err(Error::new(ErrorKind::Unsupported, "this store's vtable has no list callback"));
        };
        let mut sink = ListSink { visit, done: false, bad: false };
        // SAFETY: a checked vtable function over `ctx`; `sink` outlives the call and
        // `list_emit` is the matching visitor.
        let code =
            unsafe { f(self.ctx.0, mws_bytes::of(prefix), list_emit, &mut sink as *mut ListSink<'_> as *mut c_void) };
        if sink.bad {
            return Err(violation("list", prefix, 1, "emit keys as valid UTF-8 with a non-NULL pointer"));
        }
        status_result("list", prefix, code as i64)
    }

    fn batch_exists(&self, keys: &[&str]) -> Vec<Result<bool>> {
        let Some(f) = self.vt.batch_exists else {
            return keys.iter().map(|k| self.exists(k)).collect();
        };
        batch_with_retry(
            "batch_exists",
            keys,
            |pending, codes| {
                let c_keys: Vec<mws_bytes> = pending.iter().map(|&i| mws_bytes::of(keys[i])).collect();
                // SAFETY: `c_keys` and `codes` hold `len` elements; the keys outlive the call.
                unsafe { f(self.ctx.0, c_keys.as_ptr(), c_keys.len(), codes.as_mut_ptr()) }
            },
            |code, key| match code {
                0 => Ok(false),
                1 => Ok(true),
                c => Err(violation("batch_exists", key, c as i64, "1 present, 0 absent or a negative error code")),
            },
        )
    }

    fn remove(&self, key: &str) -> Result<()> {
        let f = self.vt.remove.expect("checked at construction");
        // SAFETY: a checked vtable function over `ctx`; the key points to live bytes for the call.
        match with_retry(|| unsafe { f(self.ctx.0, mws_bytes::of(key)) as i64 }) {
            OBJECT_NOT_FOUND => Ok(()),
            c => status_result("remove", key, c),
        }
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
        let f = self.vt.batch_put_from.expect("checked at construction");
        if config.group_ids.len() != items.len() {
            return items
                .iter()
                .map(|i| {
                    Err(Error::invalid(format!(
                        "batch_put_from: {} group ids for {} keys (item {})",
                        config.group_ids.len(),
                        items.len(),
                        i.key
                    )))
                })
                .collect();
        }
        let keys: Vec<&str> = items.iter().map(|i| i.key).collect();
        batch_with_retry(
            "batch_put_from",
            &keys,
            |pending, codes| {
                let c_items: Vec<mws_put_item> = pending
                    .iter()
                    .map(|&i| {
                        let it = &items[i];
                        let (kind, ordinal) = memory_code(it.source.kind);
                        mws_put_item {
                            key: mws_bytes::of(it.key),
                            group_id: mws_bytes::of(&config.group_ids[i]),
                            address: it.source.address,
                            len: it.source.len,
                            memory_kind: kind,
                            device_ordinal: ordinal,
                        }
                    })
                    .collect();
                // SAFETY: the caller of batch_put_from vouches for the source regions;
                // `c_items` and `codes` hold `len` elements and outlive the call.
                unsafe {
                    f(self.ctx.0, c_items.as_ptr(), c_items.len(), record_code(config.record_type), codes.as_mut_ptr())
                }
            },
            |code, key| status_result("batch_put_from", key, code as i64),
        )
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        let f = self.vt.get_into_ranges.expect("checked at construction");
        let buffer_of: Vec<u64> = {
            let registered = self.registered.read();
            ranges
                .iter()
                .map(|r| match registered.range(..=r.dest.address).next_back() {
                    Some((&start, &len)) if r.dest.address.saturating_add(r.dest.len) <= start.saturating_add(len) => {
                        start
                    }
                    _ => r.dest.address,
                })
                .collect()
        };
        let mut results: Vec<Option<Result<u64>>> = (0..ranges.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..ranges.len()).collect();
        let mut delay = FIRST_BACKOFF;
        for attempt in 0..MAX_TRIES {
            let c_items: Vec<mws_range_item> = pending
                .iter()
                .map(|&i| {
                    let r = &ranges[i];
                    let (kind, ordinal) = memory_code(r.dest.kind);
                    mws_range_item {
                        key: mws_bytes::of(r.key),
                        object_offset: r.object_offset,
                        dest_address: r.dest.address,
                        len: r.dest.len,
                        buffer_address: buffer_of.get(i).copied().unwrap_or(r.dest.address),
                        memory_kind: kind,
                        device_ordinal: ordinal,
                    }
                })
                .collect();
            let mut codes = vec![i64::MIN; c_items.len()];
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            let batch = unsafe { f(self.ctx.0, c_items.as_ptr(), c_items.len(), codes.as_mut_ptr()) };
            let last = attempt + 1 == MAX_TRIES;
            let mut retry = Vec::new();
            for (j, &i) in pending.iter().enumerate() {
                let r = &ranges[i];
                let code = if batch < 0 { batch as i64 } else { codes[j] };
                if batch > 0 {
                    results[i] = Some(Err(violation(
                        "get_into_ranges",
                        r.key,
                        batch as i64,
                        "batch status: 0 or a negative error code",
                    )));
                } else if code == i64::MIN {
                    results[i] = Some(Err(Error::new(
                        ErrorKind::Store,
                        format!("store callback get_into_ranges left no result for {}", r.key),
                    )));
                } else if code as u64 > r.dest.len && code > 0 {
                    let contract = format!("at most the {} bytes of the range", r.dest.len);
                    results[i] = Some(Err(violation("get_into_ranges", r.key, code, &contract)));
                } else if code >= 0 {
                    results[i] = Some(if code as u64 == r.dest.len {
                        Ok(code as u64)
                    } else {
                        Err(Error::new(
                            ErrorKind::Integrity,
                            format!(
                                "short read of {} at offset {}: {} of {} bytes",
                                r.key, r.object_offset, code, r.dest.len
                            ),
                        ))
                    });
                } else if transient(code) && !last {
                    retry.push(i);
                } else {
                    results[i] = Some(Err(code_error("get_into_ranges", r.key, code)));
                }
            }
            if retry.is_empty() {
                break;
            }
            pending = retry;
            std::thread::sleep(delay);
            delay = (delay * 2).min(MAX_BACKOFF);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::new(ErrorKind::Store, "get_into_ranges: no result"))))
            .collect()
    }

    fn supports_memory(&self, _kind: MemoryKind) -> bool {
        // The callbacks receive `memory_kind` and handle device memory themselves.
        true
    }

    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        if let Some(f) = self.vt.register_buffer {
            let (kind, ordinal) = memory_code(region.kind);
            // SAFETY: an optional vtable function checked non-NULL, over `ctx`; the region is the caller's to register.
            let code = with_retry(|| unsafe { f(self.ctx.0, region.address, region.len, kind, ordinal) as i64 });
            if code < 0 {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!("store callback register_buffer failed: error code {code}"),
                ));
            }
            if code > 0 {
                return Err(violation("register_buffer", "a buffer", code, "0 or a negative error code"));
            }
        }
        self.registered.write().insert(region.address, region.len);
        Ok(())
    }

    fn unregister_buffer(&self, address: u64) -> Result<()> {
        if let Some(f) = self.vt.unregister_buffer {
            // SAFETY: an optional vtable function checked non-NULL, over `ctx`.
            let code = with_retry(|| unsafe { f(self.ctx.0, address) as i64 });
            if code < 0 {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!("store callback unregister_buffer failed: error code {code}"),
                ));
            }
            if code > 0 {
                return Err(violation("unregister_buffer", "a buffer", code, "0 or a negative error code"));
            }
        }
        self.registered.write().remove(&address);
        Ok(())
    }
}
