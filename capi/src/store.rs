//! `mws_store`: a weight store over a backend (memory, directory, C vtable), raw
//! object access and quarantined registrations. The store's jobs (upload, commit,
//! abort, finalize, decisions, restores), which take other objects, are in
//! `store_jobs.rs`.

use crate::args::{CText, Caller};
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::store::{mws_store_vtable, store_from_vtable};
use crate::device_engine::mws_device_engine;
use mws::device::DeviceEngine;
use mws::protocol::StoreLimits;
use mws::protocol::WeightStore;
use mws::store::directory::DirectoryStore;
use mws::store::memory::MemoryStore;
use mws::store::RecordType;
use mws::store::WriteConfig;
use mws::store::{get_for_buffer, ObjectStore};
use mws::{Error, ErrorKind};
use std::ffi::c_char;
use std::ffi::c_int;
use std::ffi::c_void;
use std::sync::Arc;

/// A weight store: an object store backend (memory, directory or caller vtable) plus
/// the key prefix, limits and buffer-registration state of the weight protocol.
///
/// Created by `mws_store_open_memory`, `mws_store_open_dir`, `mws_store_from_vtable`
/// or `mws_store_from_vtable_with_options`; freed by `mws_store_free`.
///
/// Thread safety: every function taking a `const mws_store *` may be called from
/// several threads at once (uploads and loads of different participants run in
/// parallel). Writers (`mws_writer`) keep the store alive: freeing the store while a
/// writer lives is allowed; the backend is released when the last of them goes.
pub struct mws_store {
    pub(crate) ws: Arc<WeightStore>,
    pub(crate) key_prefix: CText,
}

impl mws_store {
    pub(crate) fn new(ws: WeightStore) -> mws_store {
        mws_store { key_prefix: CText::new(ws.key_prefix()), ws: Arc::new(ws) }
    }
}

handle!(mws_store);

/// `mws_store_options.staging_bytes` value that turns restore staging off.
pub const MWS_STAGING_OFF: u64 = u64::MAX;

/// `mws_store_options.verify_integrity`: the default, which verifies restores.
pub const MWS_VERIFY_DEFAULT: u32 = 0;
/// `mws_store_options.verify_integrity`: verify restores (as the default).
pub const MWS_VERIFY_ON: u32 = 1;
/// `mws_store_options.verify_integrity`: do not verify restores.
pub const MWS_VERIFY_OFF: u32 = 2;

/// `mws_store_options.write_integrity`: the default, which writes the integrity record.
pub const MWS_WRITE_INTEGRITY_DEFAULT: u32 = 0;
/// `mws_store_options.write_integrity`: write the integrity record (as the default).
pub const MWS_WRITE_INTEGRITY_ON: u32 = 1;
/// `mws_store_options.write_integrity`: snapshots compute no checksums and write no
/// integrity record.
pub const MWS_WRITE_INTEGRITY_OFF: u32 = 2;

/// Options of the `mws_store_open_*` functions. A zeroed struct (or a NULL pointer)
/// means every default. Strings are only read during the call.
#[repr(C)]
pub struct mws_store_options {
    /// Key prefix of every key the store writes (leading/trailing `/` stripped). NULL
    /// means `"weights"`.
    pub key_prefix: *const c_char,
    /// Largest single range read in bytes; 0 means the default (64 MiB).
    pub max_range_bytes: u64,
    /// Keys or ranges per backend request; 0 means the default (1024).
    pub max_ranges_per_request: u64,
    /// Largest segment count of one region at execution; 0 means the default (2^32).
    pub max_region_segments: u64,
    /// The device engine through which the store reaches device memory (NULL: none).
    /// Snapshots read device sources and restores write device targets through it,
    /// staged in host buffers of the engine: the backend (of every kind: memory,
    /// directory, vtable) sees host bytes only, and a verified restore checks every
    /// byte before it is copied to the device. Without one, the embedded stores refuse
    /// a binding with device memory (`MWS_UNSUPPORTED`, before any I/O) and a vtable
    /// store gets device regions in its own callbacks (`memory_kind`). The store takes
    /// its own reference: the handle may be freed once the store is opened. Replaced
    /// `copy_hook` and `copy_hook_ctx` in 0.3.
    pub device_engine: *const mws_device_engine,
    /// Budget of the host staging buffer of restores (`mws_store_load`) through stores
    /// that pay per range (Mooncake Store): a region of many short rows is read as one
    /// span into a registered host staging buffer and scattered locally when the
    /// store's cost model (`mws_store_vtable.get_cost`) says it is cheaper than one
    /// range per row (host targets only; device targets keep the exact ranges). 0 (a
    /// zeroed struct) means the default, 64 MiB per store handle, registered once and
    /// reused; `MWS_STAGING_OFF` means never stage (requests are then exactly the
    /// ranges of the load plan). Embedded stores read whole regions natively and never
    /// stage.
    pub staging_bytes: u64,
    /// Largest manifest or decision record read back from the store, in bytes; 0 means
    /// the default (256 MiB, about 2.9x the largest benchmark manifest). A larger
    /// object fails with `MWS_LIMIT_EXCEEDED` before it is read or allocated. Added at
    /// the end of the struct in 0.1 (rebuild against this header; zeroed = default).
    pub max_metadata_bytes: u64,
    /// Whether restores (`mws_store_load`, loaders over this store) verify what they
    /// read against the revision's integrity record (CRC-32C of every 1 MiB block,
    /// written by every snapshot of this library): `MWS_VERIFY_DEFAULT` (0, a zeroed
    /// struct) and `MWS_VERIFY_ON` (1) verify, `MWS_VERIFY_OFF` (2) does not. Other
    /// values are `MWS_INVALID_ARGUMENT`. The check is fused with the copy (the
    /// checksums are computed as the bytes are copied; see docs/INTEGRITY.md for its
    /// cost); a corrupted, truncated or swapped payload fails with `MWS_INTEGRITY`
    /// naming the tensor, the stored fragment's box, the fragment id and the object
    /// key. Revisions without a record (the reference's, older ones) load unverified
    /// either way. Until 0.2 this field was a boolean with 0 = off; its layout is
    /// unchanged and 1 still means on.
    pub verify_integrity: u32,
    /// Whether snapshots (`mws_store_upload`, writers, transactions over this store)
    /// compute the CRC-32C of every 1 MiB block of every payload and commit writes
    /// them as the integrity record: `MWS_WRITE_INTEGRITY_DEFAULT` (0, a zeroed
    /// struct) and `MWS_WRITE_INTEGRITY_ON` (1) write it, `MWS_WRITE_INTEGRITY_OFF`
    /// (2) computes and writes none: the revision is then exactly what the reference
    /// writes (manifest, decision, payloads), it restores everywhere, and a verifying
    /// restore loads it unverified (`mws_load_stats.verified_bytes` 0). Other values
    /// are `MWS_INVALID_ARGUMENT`. A commit writes a record only when the committing
    /// store writes records and every receipt carries checksums. Added in 0.3 in what
    /// was the struct's tail padding (its size is unchanged): rebuild against this
    /// header, since padding was not guaranteed to be zero.
    pub write_integrity: u32,
}

/// What the caller asked for in `mws_store_options`, validated.
pub(crate) struct StoreConfig<'a> {
    key_prefix: Option<&'a str>,
    limits: StoreLimits,
    device: Option<Arc<dyn DeviceEngine>>,
}

impl StoreConfig<'_> {
    /// The store over `backend` with these options.
    fn open(self, backend: Arc<dyn ObjectStore>) -> FfiResult<mws_store> {
        let ws = WeightStore::new(backend);
        let ws = match self.key_prefix {
            Some(prefix) => ws.with_key_prefix(prefix),
            None => ws,
        };
        let ws = match self.device {
            Some(device) => ws.with_device_engine(device),
            None => ws,
        };
        Ok(mws_store::new(ws.with_limits(self.limits)?))
    }
}

/// Decodes `options` (NULL: the defaults).
pub(crate) fn read_options<'a>(c: Caller<'a>, options: *const mws_store_options) -> FfiResult<StoreConfig<'a>> {
    let d = StoreLimits::default();
    let Some(o) = c.opt_struct(options) else { return Ok(StoreConfig { key_prefix: None, limits: d, device: None }) };
    let key_prefix = c.opt_str(o.key_prefix, "options->key_prefix")?;
    let max_ranges_per_request = usize::try_from(o.max_ranges_per_request)
        .map_err(|_| Failure::invalid("options->max_ranges_per_request is too large"))?;
    let verify_integrity = match o.verify_integrity {
        MWS_VERIFY_DEFAULT | MWS_VERIFY_ON => true,
        MWS_VERIFY_OFF => false,
        v => {
            return Err(Failure::invalid(format!(
                "options->verify_integrity must be MWS_VERIFY_DEFAULT (0), MWS_VERIFY_ON (1) or MWS_VERIFY_OFF (2), \
                 got {v}"
            )))
        }
    };
    let write_integrity = match o.write_integrity {
        MWS_WRITE_INTEGRITY_DEFAULT | MWS_WRITE_INTEGRITY_ON => true,
        MWS_WRITE_INTEGRITY_OFF => false,
        v => {
            return Err(Failure::invalid(format!(
                "options->write_integrity must be MWS_WRITE_INTEGRITY_DEFAULT (0), MWS_WRITE_INTEGRITY_ON (1) or \
                 MWS_WRITE_INTEGRITY_OFF (2), got {v}"
            )))
        }
    };
    // A zeroed field means the default.
    let or = |value: u64, default: u64| if value == 0 { default } else { value };
    let limits = StoreLimits {
        max_range_bytes: or(o.max_range_bytes, d.max_range_bytes),
        max_ranges_per_request: if max_ranges_per_request == 0 {
            d.max_ranges_per_request
        } else {
            max_ranges_per_request
        },
        max_region_segments: or(o.max_region_segments, d.max_region_segments),
        staging_bytes: if o.staging_bytes == MWS_STAGING_OFF { 0 } else { or(o.staging_bytes, d.staging_bytes) },
        max_metadata_bytes: or(o.max_metadata_bytes, d.max_metadata_bytes),
        verify_integrity,
        write_integrity,
    };
    let device = c.opt_handle(o.device_engine).map(|d| Arc::clone(&d.engine));
    Ok(StoreConfig { key_prefix, limits, device })
}

/// Opens an empty in-memory store (for tests and single-process use; the objects
/// live as long as the store).
///
/// `options` may be NULL (defaults). On success writes a new handle to `*out` (free
/// it with `mws_store_free`); on failure `*out` is not written.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (invalid
/// options).
///
/// # Safety
/// `options` is NULL or valid (its `device_engine` NULL or a live handle); `out` is
/// NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_open_memory(
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let config = read_options(c, options)?;
        out.give_handle(config.open(Arc::new(MemoryStore::new()))?)
    })
}

/// Opens (creating if needed) the directory store rooted at `path`: one file per key
/// under `<path>/objects`, every write atomic and fsynced (crash-safe). Several stores,
/// in one or more processes, may share a root.
///
/// `options` may be NULL. Ownership and failure as `mws_store_open_memory`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_IO` (cannot create or open
/// the directory), `MWS_INVALID_ARGUMENT`.
///
/// # Safety
/// `path` is NULL or NUL-terminated; `options` and `out` as `mws_store_open_memory`.
#[no_mangle]
pub unsafe extern "C" fn mws_store_open_dir(
    path: *const c_char,
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> mws_status {
    status_call!(|c| {
        let out = c.out(out, "out")?;
        let path = c.str(path, "path")?;
        let config = read_options(c, options)?;
        out.give_handle(config.open(Arc::new(DirectoryStore::open(path)?))?)
    })
}

/// Plugs a caller-implemented object store (Mooncake Store's client, a test double)
/// into the library; see `docs/STORE-VTABLE.md` and `mws_store_vtable`. Default key
/// prefix and limits (see `mws_store_from_vtable_with_options`).
///
/// `*vt` is checked (`size`, `version`, mandatory callbacks) and copied. On success
/// writes a new handle to `*out`; the store owns `ctx` from then on and calls
/// `vt->destroy(ctx)` (if not NULL) exactly once, when it is freed. On failure `*out`
/// is not written and `destroy` is not called (the caller keeps `ctx`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (size too small, missing
/// mandatory callback), `MWS_UNSUPPORTED` (vtable version).
///
/// # Safety
/// `vt` is NULL or points to a readable vtable of at least `vt->size` bytes whose
/// callbacks follow the contract (thread-safe, never unwind) while the store lives;
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_from_vtable(
    vt: *const mws_store_vtable,
    ctx: *mut c_void,
    out: *mut *mut mws_store,
) -> mws_status {
    // SAFETY: `from_vtable`'s contract is this function's.
    status_call!(|c| unsafe { from_vtable(c, vt, ctx, std::ptr::null(), out) })
}

/// As `mws_store_from_vtable`, with a key prefix, limits and a device engine from
/// `options` (NULL means defaults). With `options->device_engine`, device sources and
/// targets are staged through host buffers of that engine, so the vtable's callbacks
/// only ever see host memory; without one, device regions go to the callbacks, which
/// handle `memory_kind` themselves (docs/STORE-VTABLE.md).
///
/// # Safety
/// As `mws_store_from_vtable`; `options` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn mws_store_from_vtable_with_options(
    vt: *const mws_store_vtable,
    ctx: *mut c_void,
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> mws_status {
    // SAFETY: `from_vtable`'s contract is this function's.
    status_call!(|c| unsafe { from_vtable(c, vt, ctx, options, out) })
}

/// `mws_store_from_vtable(_with_options)` inside the boundary.
///
/// # Safety
/// As `mws_store_from_vtable`.
unsafe fn from_vtable(
    c: Caller<'_>,
    vt: *const mws_store_vtable,
    ctx: *mut c_void,
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> FfiResult<()> {
    let out = c.out(out, "out")?;
    c.struct_ref(vt, "vt")?;
    let config = read_options(c, options)?;
    // Validate the options before taking ownership of ctx (construction is last).
    config.limits.validate()?;
    // SAFETY: this function's contract: the vtable is readable for its size and its
    // callbacks honour the contract while the store lives.
    let backend = unsafe { store_from_vtable(vt, ctx) }?;
    out.give_handle(config.open(Arc::new(backend))?)
}

/// Frees a store handle. `NULL` does nothing. The backend (and a vtable store's
/// `destroy`) is released once no writer uses it any more. Strings borrowed from the
/// handle become invalid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `store` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_store_free(store: *mut mws_store) {
    value_call!((), |c| c.free(store))
}

/// Returns the key prefix of the store. Borrowed NUL-terminated string, valid while
/// the store lives; its length is written to `*len` when `len` is not NULL. NULL (and
/// the last error) if `store` is NULL.
///
/// # Safety
/// `store` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_key_prefix(store: *const mws_store, len: *mut usize) -> *const c_char {
    value_call!(std::ptr::null(), |c| Ok(c.lend(&c.handle(store, "store")?.key_prefix, len)))
}

/// Raw access (tests, tools): copies object `key` into `buf`.
///
/// Length query: with `buf` NULL, only writes the object's size to `*len` (nothing is
/// read). Otherwise `cap` must be at least the object's size (else
/// `MWS_INVALID_ARGUMENT`, nothing written); the object is read (never more than `cap`
/// bytes are read or allocated, whatever size the backend reports), copied and its
/// size written to `*len`.
///
/// Errors: `MWS_NULL_ARGUMENT` (`store`, `key` or `len`), `MWS_INVALID_UTF8`,
/// `MWS_NOT_FOUND`, `MWS_STORE` / `MWS_IO` (backend), `MWS_INVALID_ARGUMENT`,
/// `MWS_LIMIT_EXCEEDED` (a size that does not fit `size_t`, or the allocation of the
/// read buffer failed).
///
/// # Safety
/// `store` is NULL or a live handle; `key` is NULL or NUL-terminated; `buf` is NULL or
/// valid for `cap` bytes of writes; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_get(
    store: *const mws_store,
    key: *const c_char,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let key = c.str(key, "key")?;
        let len = c.out(len, "len")?;
        let backend = s.ws.backend();
        if buf.is_null() {
            let size = backend.object_size(key)?;
            let size = usize::try_from(size).map_err(|_| {
                Error::new(ErrorKind::LimitExceeded, format!("object {key} holds {size} bytes, more than size_t holds"))
            })?;
            len.set(size);
            return Ok(());
        }
        let bytes = get_for_buffer(&**backend, key, cap as u64)?;
        c.copy_to(&bytes, buf, cap);
        len.give(bytes.len())
    })
}

/// Raw access: writes 1 to `*present` if object `key` exists, else 0.
///
/// # Safety
/// `store` is NULL or a live handle; `key` is NULL or NUL-terminated; `present` is
/// NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_exists(
    store: *const mws_store,
    key: *const c_char,
    present: *mut c_int,
) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        let key = c.str(key, "key")?;
        let present = c.out(present, "present")?;
        let p = s.ws.backend().exists(key)?;
        present.give(c_int::from(p))
    })
}

fn raw_write(
    c: Caller<'_>,
    store: *const mws_store,
    key: *const c_char,
    value: *const u8,
    len: usize,
    group_id: *const c_char,
    upsert: bool,
) -> FfiResult<()> {
    let s = c.handle(store, "store")?;
    let key = c.str(key, "key")?;
    let value = c.slice(value, len, "value")?;
    let groups = [c.opt_str(group_id, "group_id")?.unwrap_or("").to_owned()];
    let config = WriteConfig { group_ids: &groups, record_type: RecordType::Metadata };
    let backend = s.ws.backend();
    Ok(if upsert { backend.upsert(key, value, &config) } else { backend.put(key, value, &config) }?)
}

/// Raw access (tests, tools): create-only write of `len` bytes at `value` as object
/// `key` (a metadata record of group `group_id`; NULL means `""`). Fails with
/// `MWS_ALREADY_EXISTS` if the key exists (backends that report success for an
/// existing key leave the stored value unchanged). The bytes are only read during the
/// call.
///
/// # Safety
/// `store` is NULL or a live handle; `key`/`group_id` are NULL or NUL-terminated;
/// `value` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn mws_store_put(
    store: *const mws_store,
    key: *const c_char,
    value: *const u8,
    len: usize,
    group_id: *const c_char,
) -> mws_status {
    status_call!(|c| raw_write(c, store, key, value, len, group_id, false))
}

/// Raw access: as `mws_store_put`, replacing any existing value.
///
/// # Safety
/// As `mws_store_put`.
#[no_mangle]
pub unsafe extern "C" fn mws_store_upsert(
    store: *const mws_store,
    key: *const c_char,
    value: *const u8,
    len: usize,
    group_id: *const c_char,
) -> mws_status {
    status_call!(|c| raw_write(c, store, key, value, len, group_id, true))
}

/// Raw access: removes object `key` (removing an absent key succeeds).
///
/// # Safety
/// `store` is NULL or a live handle; `key` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mws_store_remove(store: *const mws_store, key: *const c_char) -> mws_status {
    status_call!(|c| {
        let s = c.handle(store, "store")?;
        Ok(s.ws.backend().remove(c.str(key, "key")?)?)
    })
}

/// Returns the number of quarantined buffer registrations (an `unregister_buffer`
/// failed; new weight I/O is blocked until they are drained), or 0 (and the last
/// error) if `store` is NULL.
///
/// # Safety
/// `store` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_store_pending_registration_count(store: *const mws_store) -> usize {
    value_call!(0, |c| Ok(c.handle(store, "store")?.ws.pending_registration_ids().len()))
}

/// Retries the cleanup of every quarantined registration and releases their pins.
///
/// Errors: `MWS_STORE` (an unregistration still fails; the entry stays quarantined).
///
/// # Safety
/// `store` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_store_drain_pending_registrations(store: *const mws_store) -> mws_status {
    status_call!(|c| Ok(c.handle(store, "store")?.ws.drain_pending_registrations()?))
}
