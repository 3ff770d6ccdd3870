//! A remote object store (Mooncake Store's shape) as an [`ObjectStore`]:
//! [`RemoteStore`] turns the raw calls of [`RemoteCalls`], which return Mooncake's
//! `ErrorCode` values, into the store contract.
//!
//! What it adds, written once for every remote backend (the C vtable of the C ABI,
//! and through it the Python bridge to Mooncake Store's client):
//! - the code mapping: `0` ok, `-704` not found, `-705` already exists, any other
//!   negative value a store error naming the key and the code;
//! - transient codes (`-200` no available handle, `-706` object has lease) retried
//!   with a bounded exponential backoff ([`MAX_TRIES`] calls, 5 ms doubling to
//!   200 ms), per item for batches;
//! - the contract, enforced exactly: a value outside a call's documented range
//!   (`exists` other than 0, 1 or negative; a positive status; a size or byte count
//!   larger than the buffer or the requested range; a batch that leaves an item
//!   unwritten) is a [`ErrorKind::Store`] error `store callback <op> returned
//!   <value> for <key>, outside its contract (<range>)`, never taken as success;
//! - bounded whole-object reads: a reported size is checked against the bound before
//!   any allocation, and the allocation is fallible, so no reported size can abort
//!   the process; small objects are read in one call;
//! - the registered buffers, so that every range read names the registered view that
//!   contains its destination.

use super::{alloc_failed, not_found, too_large, ObjectStore, PutFrom, RangeRead, RecordType, StoreCost, WriteConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{MemoryKind, MemoryRegion};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Mooncake `ErrorCode::NO_AVAILABLE_HANDLE` (transient).
pub const NO_AVAILABLE_HANDLE: i64 = -200;
/// Mooncake `ErrorCode::OBJECT_NOT_FOUND`.
pub const OBJECT_NOT_FOUND: i64 = -704;
/// Mooncake `ErrorCode::OBJECT_ALREADY_EXISTS`.
pub const OBJECT_ALREADY_EXISTS: i64 = -705;
/// Mooncake `ErrorCode::OBJECT_HAS_LEASE` (transient).
pub const OBJECT_HAS_LEASE: i64 = -706;

/// Mooncake `ErrorCode::INVALID_PARAMS`, returned by the default of an optional call.
const UNSUPPORTED: i32 = -600;

/// The optional calls a backend has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteCapabilities {
    /// `register_buffer` / `unregister_buffer` (without them registration is a no-op).
    pub buffers: bool,
    /// `batch_exists` (without it: `exists` per key).
    pub batch_exists: bool,
    /// `batch_get_size` (without it: `get_size` per key).
    pub batch_get_size: bool,
    /// `list` (without it the store cannot list: `mws ls` and `gc` refuse it).
    pub list: bool,
}

/// Calls of one operation (or per item of a batch) before a transient code is final.
pub const MAX_TRIES: u32 = 8;
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);
/// A single call taking at least this long is logged as slow.
const SLOW_CALL: Duration = Duration::from_secs(1);
/// Capacity of the first, unsized read of a whole object (objects smaller than this
/// are read in one call instead of `get_size` + `get_into`).
const GET_FIRST_TRY: usize = 256 << 10;
/// Most keys passed to one `batch_get_size` call.
const SIZES_PER_CALL: usize = 1024;

/// One item of [`RemoteCalls::batch_put_from`].
#[derive(Clone, Copy, Debug)]
pub struct RemotePut<'a> {
    /// Object key.
    pub key: &'a str,
    /// The key's group (`ReplicateConfig.group_ids[i]`).
    pub group_id: &'a str,
    /// Source bytes (registered memory).
    pub source: MemoryRegion,
}

/// One item of [`RemoteCalls::get_into_ranges`].
#[derive(Clone, Copy, Debug)]
pub struct RemoteRange<'a> {
    /// Object key.
    pub key: &'a str,
    /// Absolute offset inside the object.
    pub object_offset: u64,
    /// Destination (registered memory); its `len` is the range length.
    pub dest: MemoryRegion,
    /// Start of the registered view that contains `dest`.
    pub buffer_address: u64,
}

/// The raw calls of a remote store. Every status is a Mooncake `ErrorCode` (`0` ok,
/// negative an error); [`RemoteStore`] interprets them. Implementations only
/// translate (a C vtable, a client library) and must be thread-safe; they must not
/// panic.
pub trait RemoteCalls: Send + Sync {
    /// Create-only put (may return 0 for an existing key, as Mooncake does).
    fn put(&self, key: &str, value: &[u8], group_id: &str, record: RecordType) -> i64;
    /// Insert or replace.
    fn upsert(&self, key: &str, value: &[u8], group_id: &str, record: RecordType) -> i64;
    /// The object's size in bytes, or a negative code.
    fn get_size(&self, key: &str) -> i64;
    /// Copies the object into `buf`: bytes read, or a negative code (`-600` when the
    /// object does not fit).
    fn get_into(&self, key: &str, buf: &mut [u8]) -> i64;
    /// 1 present, 0 absent, or a negative code.
    fn exists(&self, key: &str) -> i64;
    /// Force remove: 0, or a negative code (`-704` counts as removed).
    fn remove(&self, key: &str) -> i64;
    /// Writes each item; one status per item into `results` (same length as
    /// `items`, pre-filled with `i32::MIN`: an entry left so is an error); returns
    /// 0, or a negative batch-level code applied to every item.
    ///
    /// # Safety
    /// Every source region is valid for reads for the call (the caller of
    /// [`ObjectStore::batch_put_from`] guarantees it).
    unsafe fn batch_put_from(&self, items: &[RemotePut<'_>], record: RecordType, results: &mut [i32]) -> i32;
    /// Reads each range; per item the bytes read (`== len`) or a negative code into
    /// `results` (pre-filled with `i64::MIN`); returns 0 or a negative batch code.
    ///
    /// # Safety
    /// Every destination region is valid for writes and untouched by anyone else for
    /// the call (the caller of [`ObjectStore::get_into_ranges`] guarantees it).
    unsafe fn get_into_ranges(&self, items: &[RemoteRange<'_>], results: &mut [i64]) -> i32;
    /// Which optional calls the backend has (asked once, when the store is built).
    fn capabilities(&self) -> RemoteCapabilities {
        RemoteCapabilities::default()
    }
    /// Registers memory (called only with [`RemoteCapabilities::buffers`]): a code.
    fn register_buffer(&self, region: MemoryRegion) -> i64 {
        let _ = region;
        0
    }
    /// Unregisters memory (called only with [`RemoteCapabilities::buffers`]): a code.
    fn unregister_buffer(&self, address: u64) -> i64 {
        let _ = address;
        0
    }
    /// Existence of many keys in one round trip (called only with
    /// [`RemoteCapabilities::batch_exists`]): 1, 0 or a negative code per key into
    /// `results` (pre-filled with `i32::MIN`); returns 0 or a negative batch code.
    fn batch_exists(&self, keys: &[&str], results: &mut [i32]) -> i32 {
        let _ = (keys, results);
        UNSUPPORTED
    }
    /// Sizes of many keys in one round trip (called only with
    /// [`RemoteCapabilities::batch_get_size`]): a size or a negative code per key into
    /// `sizes` (pre-filled with `i64::MIN`); returns 0 or a negative batch code.
    fn batch_get_size(&self, keys: &[&str], sizes: &mut [i64]) -> i32 {
        let _ = (keys, sizes);
        UNSUPPORTED
    }
    /// Streams every object whose key starts with `prefix` to `visit(key, size)`
    /// (`None` for a key the backend handed over as a NULL pointer) until `visit`
    /// returns false (called only with [`RemoteCapabilities::list`]); returns 0 or a
    /// negative code.
    fn list(&self, prefix: &str, visit: &mut dyn FnMut(Option<&[u8]>, u64) -> bool) -> i64 {
        let _ = (prefix, visit);
        UNSUPPORTED as i64
    }
    /// The backend's cost model, asked once when the store is built: `Ok(None)` when
    /// it reports none (then [`StoreCost::REMOTE`]), `Err(code)` when it failed.
    fn cost(&self) -> std::result::Result<Option<StoreCost>, i64> {
        Ok(None)
    }
    /// True when the backend moves memory of `kind` itself (the default: every kind,
    /// as Mooncake Store does with the memory kind it is handed).
    fn supports_memory(&self, kind: MemoryKind) -> bool {
        let _ = kind;
        true
    }
}

/// An [`ObjectStore`] over [`RemoteCalls`] (see the module docs).
pub struct RemoteStore {
    calls: Box<dyn RemoteCalls>,
    caps: RemoteCapabilities,
    /// Buffers registered through this store: start address -> length.
    registered: RwLock<BTreeMap<u64, u64>>,
    cost: StoreCost,
}

impl fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteStore").field("cost", &self.cost).finish_non_exhaustive()
    }
}

/// True for the codes retried with backoff.
pub fn transient(code: i64) -> bool {
    code == NO_AVAILABLE_HANDLE || code == OBJECT_HAS_LEASE
}

/// The error of a value outside the documented range of call `op`.
fn violation(op: &str, key: &str, value: i64, contract: &str) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("store callback {op} returned {value} for {key}, outside its contract ({contract})"),
    )
}

/// The error of a negative code of call `op` for `key`.
pub fn code_error(op: &str, key: &str, code: i64) -> Error {
    match code {
        OBJECT_NOT_FOUND => not_found(key),
        OBJECT_ALREADY_EXISTS => Error::new(ErrorKind::AlreadyExists, format!("object already exists: {key}")),
        _ => Error::new(ErrorKind::Store, format!("store callback {op} failed for {key}: error code {code}")),
    }
}

/// A status-only call's result: 0 success, negative an error, positive a violation.
fn status_result(op: &str, key: &str, code: i64) -> Result<()> {
    match code {
        0 => Ok(()),
        c if c < 0 => Err(code_error(op, key, c)),
        c => Err(violation(op, key, c, "0 or a negative error code")),
    }
}

/// Runs `call` until it returns a non-transient code, at most [`MAX_TRIES`] times,
/// sleeping with exponential backoff in between; logs a slow first call.
pub fn with_retry(mut call: impl FnMut() -> i64) -> i64 {
    let mut delay = FIRST_BACKOFF;
    let started = Instant::now();
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

/// What a batch item's code turned into.
enum Item<T> {
    Done(Result<T>),
    Retry,
}

/// Runs a batch call with per-item retries of transient codes: `call(pending,
/// codes)` gets the indices still to do and fills one code per index (pre-filled with
/// `unset`), returning a batch status; `item(index, code, last_try)` turns one code
/// into the item's result or a retry.
fn batch_with_retry<T, C: Copy>(
    op: &str,
    keys: &[&str],
    unset: C,
    mut call: impl FnMut(&[usize], &mut [C]) -> i64,
    item: impl Fn(usize, C, bool) -> Item<T>,
) -> Vec<Result<T>> {
    let mut results: Vec<Option<Result<T>>> = (0..keys.len()).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..keys.len()).collect();
    let mut delay = FIRST_BACKOFF;
    for attempt in 0..MAX_TRIES {
        if pending.is_empty() {
            break;
        }
        let mut codes = vec![unset; pending.len()];
        let batch = call(&pending, &mut codes);
        let last = attempt + 1 == MAX_TRIES;
        let mut retry = Vec::new();
        for (j, &i) in pending.iter().enumerate() {
            results[i] = if batch > 0 {
                Some(Err(violation(op, keys[i], batch, "batch status: 0 or a negative error code")))
            } else if batch < 0 {
                if transient(batch) && !last {
                    retry.push(i);
                    None
                } else {
                    Some(Err(code_error(op, keys[i], batch)))
                }
            } else {
                match item(i, codes[j], last) {
                    Item::Done(r) => Some(r),
                    Item::Retry => {
                        retry.push(i);
                        None
                    }
                }
            };
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

/// The result of one item code: `ok` for a non-negative code, retry for a transient
/// one before the last try, the code's error otherwise; `unset` (never written) is
/// an error.
fn item_code<T>(op: &str, key: &str, code: i64, unset: bool, last: bool, ok: impl FnOnce(i64) -> Result<T>) -> Item<T> {
    if unset {
        Item::Done(Err(Error::new(ErrorKind::Store, format!("store callback {op} left no result for {key}"))))
    } else if code >= 0 {
        Item::Done(ok(code))
    } else if transient(code) && !last {
        Item::Retry
    } else {
        Item::Done(Err(code_error(op, key, code)))
    }
}

impl RemoteStore {
    /// A store over `calls`; asks the backend's cost model once. Errors: `store
    /// callback get_cost returned <code>` (`Store`), an invalid cost
    /// (`InvalidArgument`).
    pub fn new(calls: Box<dyn RemoteCalls>) -> Result<RemoteStore> {
        let cost = match calls.cost() {
            Ok(None) => StoreCost::REMOTE,
            Ok(Some(c)) => {
                c.validate()?;
                c
            }
            Err(code) => {
                return Err(Error::new(ErrorKind::Store, format!("store callback get_cost returned {code}")));
            }
        };
        let caps = calls.capabilities();
        Ok(RemoteStore { calls, caps, registered: RwLock::new(BTreeMap::new()), cost })
    }

    /// The raw calls.
    pub fn calls(&self) -> &dyn RemoteCalls {
        &*self.calls
    }

    fn write(&self, op: &str, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        let group = config.group_ids.first().map(String::as_str).unwrap_or("");
        let code = with_retry(|| {
            if op == "put" {
                self.calls.put(key, value, group, config.record_type)
            } else {
                self.calls.upsert(key, value, group, config.record_type)
            }
        });
        status_result(op, key, code)
    }

    /// The registered view containing `dest`, else its own start.
    fn buffer_of(registered: &BTreeMap<u64, u64>, dest: MemoryRegion) -> u64 {
        match registered.range(..=dest.address).next_back() {
            Some((&start, &len)) if dest.address.saturating_add(dest.len) <= start.saturating_add(len) => start,
            _ => dest.address,
        }
    }
}

impl ObjectStore for RemoteStore {
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
        let size = with_retry(|| self.calls.get_size(key));
        if size < 0 {
            return Err(code_error("get_size", key, size));
        }
        Ok(size as u64)
    }

    /// With `batch_get_size`: one call per 1024 keys; a key with a transient code (or
    /// a transient batch status) is asked again through `object_size` (with its
    /// retries). Without it: `object_size` per key.
    fn object_sizes(&self, keys: &[&str]) -> Vec<Result<u64>> {
        if !self.caps.batch_get_size {
            return keys.iter().map(|k| self.object_size(k)).collect();
        }
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(SIZES_PER_CALL) {
            let mut sizes = vec![i64::MIN; chunk.len()];
            let batch = self.calls.batch_get_size(chunk, &mut sizes);
            for (&key, &size) in chunk.iter().zip(&sizes) {
                let code = if batch < 0 { batch as i64 } else { size };
                out.push(if batch > 0 {
                    Err(violation("batch_get_size", key, batch as i64, "batch status: 0 or a negative error code"))
                } else if code >= 0 {
                    Ok(code as u64)
                } else if code == i64::MIN {
                    Err(Error::new(ErrorKind::Store, format!("store callback batch_get_size left no result for {key}")))
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
        // One round trip for small objects (manifests, decision records): a result
        // shorter than the buffer is the whole object (an implementation that
        // truncated would report the capacity); -704 is "not found"; anything else
        // (-600: larger object) takes the sized path.
        let first_cap = (GET_FIRST_TRY as u64).min(max_bytes.saturating_add(1)) as usize;
        let mut first = vec![0u8; first_cap];
        let n = with_retry(|| self.calls.get_into(key, &mut first));
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
            let size = with_retry(|| self.calls.get_size(key));
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
            let n = with_retry(|| self.calls.get_into(key, &mut buf));
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
        match with_retry(|| self.calls.exists(key)) {
            0 => Ok(false),
            1 => Ok(true),
            c if c < 0 => Err(code_error("exists", key, c)),
            c => Err(violation("exists", key, c, "1 present, 0 absent or a negative error code")),
        }
    }

    fn supports_list(&self) -> bool {
        self.caps.list
    }

    fn list(&self, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<()> {
        if !self.caps.list {
            return Err(Error::new(ErrorKind::Unsupported, "this store's backend cannot list its keys"));
        }
        let mut bad = false;
        let mut stopped = false;
        let code = self.calls.list(prefix, &mut |key, size| {
            if stopped || bad {
                return false;
            }
            match key.map(std::str::from_utf8) {
                Some(Ok(k)) => {
                    let go = visit(k, size);
                    stopped = !go;
                    go
                }
                _ => {
                    bad = true;
                    false
                }
            }
        });
        if bad {
            return Err(violation("list", prefix, 1, "emit keys as valid UTF-8 with a non-NULL pointer"));
        }
        status_result("list", prefix, code)
    }

    fn batch_exists(&self, keys: &[&str]) -> Vec<Result<bool>> {
        if !self.caps.batch_exists {
            return keys.iter().map(|k| self.exists(k)).collect();
        }
        batch_with_retry(
            "batch_exists",
            keys,
            i32::MIN,
            |pending, codes| {
                let ks: Vec<&str> = pending.iter().map(|&i| keys[i]).collect();
                i64::from(self.calls.batch_exists(&ks, codes))
            },
            |i, code, last| {
                item_code("batch_exists", keys[i], code as i64, code == i32::MIN, last, |c| match c {
                    0 => Ok(false),
                    1 => Ok(true),
                    c => Err(violation("batch_exists", keys[i], c, "1 present, 0 absent or a negative error code")),
                })
            },
        )
    }

    fn remove(&self, key: &str) -> Result<()> {
        match with_retry(|| self.calls.remove(key)) {
            OBJECT_NOT_FOUND => Ok(()),
            c => status_result("remove", key, c),
        }
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
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
            i32::MIN,
            |pending, codes| {
                let puts: Vec<RemotePut<'_>> = pending
                    .iter()
                    .map(|&i| RemotePut { key: items[i].key, group_id: &config.group_ids[i], source: items[i].source })
                    .collect();
                // SAFETY: the sources are this function's caller's, valid for reads for
                // the call (`ObjectStore::batch_put_from`'s contract).
                i64::from(unsafe { self.calls.batch_put_from(&puts, config.record_type, codes) })
            },
            |i, code, last| {
                item_code("batch_put_from", keys[i], code as i64, code == i32::MIN, last, |c| {
                    status_result("batch_put_from", keys[i], c)
                })
            },
        )
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        let buffers: Vec<u64> = {
            let registered = self.registered.read();
            ranges.iter().map(|r| Self::buffer_of(&registered, r.dest)).collect()
        };
        let keys: Vec<&str> = ranges.iter().map(|r| r.key).collect();
        batch_with_retry(
            "get_into_ranges",
            &keys,
            i64::MIN,
            |pending, codes| {
                let items: Vec<RemoteRange<'_>> = pending
                    .iter()
                    .map(|&i| RemoteRange {
                        key: ranges[i].key,
                        object_offset: ranges[i].object_offset,
                        dest: ranges[i].dest,
                        buffer_address: buffers[i],
                    })
                    .collect();
                // SAFETY: the destinations are this function's caller's, valid for
                // writes and untouched for the call (`get_into_ranges`'s contract).
                i64::from(unsafe { self.calls.get_into_ranges(&items, codes) })
            },
            |i, code, last| {
                let r = &ranges[i];
                if code > 0 && code as u64 > r.dest.len {
                    let contract = format!("at most the {} bytes of the range", r.dest.len);
                    return Item::Done(Err(violation("get_into_ranges", r.key, code, &contract)));
                }
                item_code("get_into_ranges", r.key, code, code == i64::MIN, last, |n| {
                    if n as u64 == r.dest.len {
                        Ok(n as u64)
                    } else {
                        Err(Error::new(
                            ErrorKind::Integrity,
                            format!(
                                "short read of {} at offset {}: {} of {} bytes",
                                r.key, r.object_offset, n, r.dest.len
                            ),
                        ))
                    }
                })
            },
        )
    }

    fn supports_memory(&self, kind: MemoryKind) -> bool {
        self.calls.supports_memory(kind)
    }

    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        if self.caps.buffers {
            let code = with_retry(|| self.calls.register_buffer(region));
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
        if self.caps.buffers {
            let code = with_retry(|| self.calls.unregister_buffer(address));
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
