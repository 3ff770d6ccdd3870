//! `mws_store` (a weight store over a backend), raw object access, allocation guards
//! from C, and the upload transaction: upload, receipts, commit, abort, finalize.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

use super::binding::mws_binding;
use super::boundary::{status_call, value_call, Failure, FfiResult};
use super::lease::mws_registration_lease;
use super::manifest::mws_stored_manifest;
use super::mws_status;
use super::placement::mws_placement;
use super::strings::{check_out, handle, opt_str_arg, slice_arg, str_arg, write_out, CText};
use super::upload::mws_upload_plan;
use crate::protocol::guards::{
    weight_allocation_fence, AllocationFence, GuardProvider, LifetimeToken, StaticGuard, TerminalState,
};
use crate::protocol::{StoreLimits, UploadArgs, UploadReceipt, WeightStore};
use crate::store::callbacks::{mws_copy_hook_vtable, mws_store_vtable, CallbackCopyHook, CallbackStore};
use crate::store::directory::DirectoryStore;
use crate::store::memory::MemoryStore;
use crate::store::{CopyHook, ObjectStore, RecordType, WriteConfig};
use crate::{Decision, Error, ErrorKind, Placement, RuntimeBinding, UploadPlan};

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
    /// Device <-> host copies for the embedded stores (memory, directory). NULL: device
    /// memory is refused (`MWS_UNSUPPORTED`, before any I/O). The vtable is copied.
    /// Not accepted by `mws_store_from_vtable_with_options` (a vtable store handles
    /// device memory in its own callbacks).
    pub copy_hook: *const mws_copy_hook_vtable,
    /// Passed to every copy hook callback. On success the store owns it: the hook's
    /// `destroy` (if any) is called once when the store is freed.
    pub copy_hook_ctx: *mut c_void,
    /// Opt-in host staging for restores (`mws_store_load`) through stores that pay per
    /// range (Mooncake Store): a region of many small rows whose source rows lie close
    /// together is read as one span into a registered host staging buffer of at most
    /// this many bytes and scattered locally (host targets only; device targets keep
    /// the exact ranges). 0 (the default) means off: requests are exactly the ranges of
    /// the load plan. Accepted by every store constructor. Added at the end of the
    /// struct in 0.1 (this struct has no size field: code built against an older
    /// header must be rebuilt; a zeroed struct keeps the old behaviour).
    pub staging_bytes: u64,
    /// Largest manifest or decision record read back from the store, in bytes; 0 means
    /// the default (256 MiB, about 2.9x the largest benchmark manifest). A larger
    /// object fails with `MWS_LIMIT_EXCEEDED` before it is read or allocated. Added at
    /// the end of the struct in 0.1 (rebuild against this header; zeroed = default).
    pub max_metadata_bytes: u64,
}

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
    key_prefix: CText,
}

impl mws_store {
    fn new(ws: WeightStore) -> mws_store {
        mws_store { key_prefix: CText::new(ws.key_prefix()), ws: Arc::new(ws) }
    }
}

/// What the caller asked for in `mws_store_options`, validated.
struct StoreConfig {
    key_prefix: Option<String>,
    limits: StoreLimits,
}

unsafe fn read_options(
    options: *const mws_store_options,
    allow_hook: bool,
) -> FfiResult<(StoreConfig, Option<Arc<dyn CopyHook>>)> {
    let mut config = StoreConfig { key_prefix: None, limits: StoreLimits::default() };
    let Some(o) = options.as_ref() else { return Ok((config, None)) };
    config.key_prefix = opt_str_arg(o.key_prefix, "options->key_prefix")?.map(str::to_owned);
    if o.max_range_bytes != 0 {
        config.limits.max_range_bytes = o.max_range_bytes;
    }
    if o.max_ranges_per_request != 0 {
        config.limits.max_ranges_per_request = usize::try_from(o.max_ranges_per_request)
            .map_err(|_| Failure::invalid("options->max_ranges_per_request is too large"))?;
    }
    if o.max_region_segments != 0 {
        config.limits.max_region_segments = o.max_region_segments;
    }
    config.limits.staging_bytes = o.staging_bytes;
    if o.max_metadata_bytes != 0 {
        config.limits.max_metadata_bytes = o.max_metadata_bytes;
    }
    let hook: Option<Arc<dyn CopyHook>> = if o.copy_hook.is_null() {
        None
    } else if !allow_hook {
        return Err(Failure::invalid(
            "options->copy_hook is only for the embedded stores; a vtable store handles device memory in its callbacks",
        ));
    } else {
        Some(Arc::new(CallbackCopyHook::new(o.copy_hook, o.copy_hook_ctx)?))
    };
    Ok((config, hook))
}

fn configure(backend: Arc<dyn ObjectStore>, config: StoreConfig) -> FfiResult<WeightStore> {
    let mut ws = WeightStore::new(backend);
    if let Some(prefix) = &config.key_prefix {
        ws = ws.with_key_prefix(prefix);
    }
    Ok(ws.with_limits(config.limits)?)
}

/// Opens an empty in-memory store (for tests and single-process use; the objects
/// live as long as the store).
///
/// `options` may be NULL (defaults). On success writes a new handle to `*out` (free
/// it with `mws_store_free`); on failure `*out` is not written and the copy hook's
/// `destroy` is not called.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (invalid
/// copy hook vtable), `MWS_UNSUPPORTED` (copy hook vtable version).
///
/// # Safety
/// `options` is NULL or valid (its copy hook as documented in
/// `mws_copy_hook_vtable`); `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_open_memory(
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> mws_status {
    status_call("mws_store_open_memory", || {
        check_out(out, "out")?;
        let (config, hook) = read_options(options, true)?;
        let backend = match hook {
            Some(h) => MemoryStore::with_copy_hook(h),
            None => MemoryStore::new(),
        };
        let ws = configure(Arc::new(backend), config)?;
        write_out(out, Box::into_raw(Box::new(mws_store::new(ws))));
        Ok(())
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
    status_call("mws_store_open_dir", || {
        check_out(out, "out")?;
        let path = str_arg(path, "path")?;
        let (config, hook) = read_options(options, true)?;
        let dir = match hook {
            Some(h) => DirectoryStore::with_copy_hook(path, h)?,
            None => DirectoryStore::open(path)?,
        };
        let ws = configure(Arc::new(dir), config)?;
        write_out(out, Box::into_raw(Box::new(mws_store::new(ws))));
        Ok(())
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
    status_call("mws_store_from_vtable", || from_vtable(vt, ctx, std::ptr::null(), out))
}

/// As `mws_store_from_vtable`, with a key prefix and limits from `options` (NULL
/// means defaults; `options->copy_hook` must be NULL).
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
    status_call("mws_store_from_vtable_with_options", || from_vtable(vt, ctx, options, out))
}

unsafe fn from_vtable(
    vt: *const mws_store_vtable,
    ctx: *mut c_void,
    options: *const mws_store_options,
    out: *mut *mut mws_store,
) -> FfiResult<()> {
    check_out(out, "out")?;
    if vt.is_null() {
        return Err(Failure::null("vt"));
    }
    let (config, _) = read_options(options, false)?;
    // Validate the options before taking ownership of ctx (construction is last).
    let mut probe = WeightStore::new(Arc::new(MemoryStore::new()));
    if let Some(prefix) = &config.key_prefix {
        probe = probe.with_key_prefix(prefix);
    }
    probe.with_limits(config.limits)?;
    let backend = CallbackStore::new(vt, ctx)?;
    let ws = configure(Arc::new(backend), config)?;
    write_out(out, Box::into_raw(Box::new(mws_store::new(ws))));
    Ok(())
}

/// Frees a store handle. `NULL` does nothing. The backend (and a vtable store's
/// `destroy`) is released once no writer uses it any more. Strings borrowed from the
/// handle become invalid.
///
/// # Safety
/// `store` is NULL or a live handle not yet freed, and no other thread is using it.
#[no_mangle]
pub unsafe extern "C" fn mws_store_free(store: *mut mws_store) {
    value_call("mws_store_free", (), || {
        if !store.is_null() {
            drop(Box::from_raw(store));
        }
        Ok(())
    })
}

/// Returns the key prefix of the store. Borrowed NUL-terminated string, valid while
/// the store lives; its length is written to `*len` when `len` is not NULL. NULL (and
/// the last error) if `store` is NULL.
///
/// # Safety
/// `store` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_key_prefix(store: *const mws_store, len: *mut usize) -> *const c_char {
    value_call("mws_store_key_prefix", std::ptr::null(), || Ok(handle(store, "store")?.key_prefix.lend(len)))
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
    status_call("mws_store_get", || {
        let s = handle(store, "store")?;
        let key = str_arg(key, "key")?;
        check_out(len, "len")?;
        let backend = s.ws.backend();
        let too_small =
            |size: u64| Failure::invalid(format!("buffer of {cap} bytes is too small for {key} ({size} bytes)"));
        if buf.is_null() {
            let size = backend.object_size(key)?;
            let size = usize::try_from(size).map_err(|_| {
                Error::new(ErrorKind::LimitExceeded, format!("object {key} holds {size} bytes, more than size_t holds"))
            })?;
            write_out(len, size);
            return Ok(());
        }
        let bytes = match backend.get_limited(key, cap as u64) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::LimitExceeded => match backend.object_size(key) {
                Ok(size) if size > cap as u64 => return Err(too_small(size)),
                _ => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        if cap < bytes.len() {
            return Err(too_small(bytes.len() as u64));
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len());
        write_out(len, bytes.len());
        Ok(())
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
    status_call("mws_store_exists", || {
        let s = handle(store, "store")?;
        let key = str_arg(key, "key")?;
        check_out(present, "present")?;
        let p = s.ws.backend().exists(key)?;
        write_out(present, c_int::from(p));
        Ok(())
    })
}

unsafe fn raw_write(
    store: *const mws_store,
    key: *const c_char,
    value: *const u8,
    len: usize,
    group_id: *const c_char,
    upsert: bool,
) -> FfiResult<()> {
    let s = handle(store, "store")?;
    let key = str_arg(key, "key")?;
    let value = slice_arg(value, len, "value")?;
    let groups = [opt_str_arg(group_id, "group_id")?.unwrap_or("").to_owned()];
    let config = WriteConfig { group_ids: &groups, record_type: RecordType::Metadata };
    if upsert {
        s.ws.backend().upsert(key, value, &config)?;
    } else {
        s.ws.backend().put(key, value, &config)?;
    }
    Ok(())
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
    status_call("mws_store_put", || raw_write(store, key, value, len, group_id, false))
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
    status_call("mws_store_upsert", || raw_write(store, key, value, len, group_id, true))
}

/// Raw access: removes object `key` (removing an absent key succeeds).
///
/// # Safety
/// `store` is NULL or a live handle; `key` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mws_store_remove(store: *const mws_store, key: *const c_char) -> mws_status {
    status_call("mws_store_remove", || {
        let s = handle(store, "store")?;
        let key = str_arg(key, "key")?;
        Ok(s.ws.backend().remove(key)?)
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
    value_call("mws_store_pending_registration_count", 0, || {
        Ok(handle(store, "store")?.ws.pending_registration_ids().len())
    })
}

/// Retries the cleanup of every quarantined registration and releases their pins.
///
/// Errors: `MWS_STORE` (an unregistration still fails; the entry stays quarantined).
///
/// # Safety
/// `store` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_store_drain_pending_registrations(store: *const mws_store) -> mws_status {
    status_call("mws_store_drain_pending_registrations", || {
        let s = handle(store, "store")?;
        for id in s.ws.pending_registration_ids() {
            s.ws.drain_pending_registration(&id)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// Allocation guards
// ---------------------------------------------------------------------------------

/// How an allocation pin ends (the `state` passed to a guard's `release`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_terminal_state {
    /// No I/O was submitted (or registration failed before I/O).
    MWS_TERMINAL_ABORTED = 0,
    /// All I/O finished successfully.
    MWS_TERMINAL_COMPLETED = 1,
    /// I/O was submitted and failed; no submitted I/O can still touch the memory.
    MWS_TERMINAL_FAILED_DRAINED = 2,
}

/// Version of `mws_guard_vtable` this library implements.
pub const MWS_GUARD_VTABLE_VERSION: u32 = 1;

/// `acquire` callback: pins the allocations of `count` runtime fragment ids
/// (`fragment_ids`, sorted, distinct, borrowed for the call) of participant
/// `participant_id`, for transfer `transfer_id`. Returns 0 on success and writes an
/// opaque token to `*token` (given back to `release`). It may write to `*observed` a
/// new binding handle (ownership passes to the library) describing the buffers as
/// observed under the pin; leaving it NULL means "exactly the binding that was
/// passed". The library checks the observed binding against the plan (lease,
/// generation, addresses) and releases the pin as aborted if it differs. Any non-zero
/// return fails the call (`MWS_STORE`) before any I/O.
pub type mws_guard_acquire_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        transfer_id: *const c_char,
        participant_id: *const c_char,
        fragment_ids: *const *const c_char,
        count: usize,
        observed: *mut *mut mws_binding,
        token: *mut u64,
    ) -> i32,
>;

/// `release` callback: ends the pin `token` after I/O ended in `state` (an
/// `mws_terminal_state` value). Called exactly once per successful `acquire`. A
/// non-zero return is reported as `MWS_STORE`.
pub type mws_guard_release_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, token: u64, state: u32) -> i32>;

/// An allocation guard implemented by the caller: pins the buffers of a binding for
/// the duration of one upload or load (the framework must not free or reuse them
/// while pinned). Set `size = sizeof(mws_guard_vtable)` and
/// `version = MWS_GUARD_VTABLE_VERSION`; both callbacks are required. Callbacks get
/// the `guard_ctx` of `mws_io_args`, must be thread-safe and must not throw or unwind.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_guard_vtable {
    /// `sizeof(mws_guard_vtable)`.
    pub size: u32,
    /// `MWS_GUARD_VTABLE_VERSION`.
    pub version: u32,
    /// Pins (see `mws_guard_acquire_fn`).
    pub acquire: mws_guard_acquire_fn,
    /// Unpins (see `mws_guard_release_fn`).
    pub release: mws_guard_release_fn,
}

/// Per-call arguments of `mws_store_upload` and `mws_store_load`. A NULL pointer or a
/// zeroed struct means the defaults. Strings are only read during the call.
#[repr(C)]
pub struct mws_io_args {
    /// Restricts the call to the fragments of one worker of the binding. NULL: upload
    /// requires it when the participant's fragments live on several workers; load
    /// serves every worker of the participant.
    pub worker_id: *const c_char,
    /// Transfer id handed to the guard. NULL: a fresh random id.
    pub transfer_id: *const c_char,
    /// Allocation guard. NULL: the caller promises the buffers stay valid and
    /// unchanged (upload) or untouched by anyone else (load) for the whole call (a
    /// static guard).
    pub guard: *const mws_guard_vtable,
    /// Passed to the guard's callbacks.
    pub guard_ctx: *mut c_void,
    /// A registration lease of this store covering exactly the buffers the call
    /// touches (`mws_registration_lease_new`): the call then neither pins (`guard` is
    /// ignored) nor registers anything. NULL: pin and register for this call only.
    /// Added at the end of the struct in 0.1 (this struct has no size field: code
    /// built against an older header must be rebuilt).
    pub lease: *const mws_registration_lease,
}

#[derive(Clone, Copy)]
struct GuardCtx(*mut c_void);
// SAFETY: the guard contract requires thread-safe callbacks over `ctx`.
unsafe impl Send for GuardCtx {}
unsafe impl Sync for GuardCtx {}

/// A [`GuardProvider`] over C callbacks.
pub(crate) struct CGuard {
    acquire: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        *const c_char,
        *const *const c_char,
        usize,
        *mut *mut mws_binding,
        *mut u64,
    ) -> i32,
    release: unsafe extern "C" fn(*mut c_void, u64, u32) -> i32,
    ctx: GuardCtx,
}

impl CGuard {
    pub(crate) fn new(
        acquire: mws_guard_acquire_fn,
        release: mws_guard_release_fn,
        ctx: *mut c_void,
    ) -> FfiResult<CGuard> {
        match (acquire, release) {
            (Some(acquire), Some(release)) => Ok(CGuard { acquire, release, ctx: GuardCtx(ctx) }),
            _ => Err(Failure::invalid("an allocation guard needs both acquire and release callbacks")),
        }
    }

    pub(crate) unsafe fn from_vtable(vt: *const mws_guard_vtable, ctx: *mut c_void) -> FfiResult<CGuard> {
        let size = (vt as *const u32).read_unaligned();
        let version = (vt as *const u32).add(1).read_unaligned();
        if (size as usize) < std::mem::size_of::<mws_guard_vtable>() {
            return Err(Failure::invalid(format!(
                "mws_guard_vtable.size is {size}, expected at least {}",
                std::mem::size_of::<mws_guard_vtable>()
            )));
        }
        if version != MWS_GUARD_VTABLE_VERSION {
            return Err(Failure::new(
                mws_status::MWS_UNSUPPORTED,
                format!(
                    "mws_guard_vtable.version is {version}, this library implements version {MWS_GUARD_VTABLE_VERSION}"
                ),
            ));
        }
        let vt = vt.read_unaligned();
        CGuard::new(vt.acquire, vt.release, ctx)
    }
}

struct CToken {
    fence: AllocationFence,
    release: unsafe extern "C" fn(*mut c_void, u64, u32) -> i32,
    ctx: GuardCtx,
    token: u64,
}

impl LifetimeToken for CToken {
    fn fence(&self) -> &AllocationFence {
        &self.fence
    }
    fn release(&mut self, state: TerminalState) -> crate::Result<()> {
        let code = unsafe { (self.release)(self.ctx.0, self.token, terminal_code(state)) };
        if code != 0 {
            return Err(Error::new(ErrorKind::Store, format!("allocation guard release failed: error code {code}")));
        }
        Ok(())
    }
}

fn terminal_code(state: TerminalState) -> u32 {
    match state {
        TerminalState::Aborted => mws_terminal_state::MWS_TERMINAL_ABORTED as u32,
        TerminalState::Completed => mws_terminal_state::MWS_TERMINAL_COMPLETED as u32,
        TerminalState::FailedDrained => mws_terminal_state::MWS_TERMINAL_FAILED_DRAINED as u32,
    }
}

fn c_string(s: &str, what: &str) -> crate::Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

impl GuardProvider for CGuard {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> crate::Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        let tid = c_string(transfer_id, "transfer id")?;
        let pid = c_string(expected.participant_id(), "participant id")?;
        let ids: Vec<CString> =
            required_ids.iter().map(|i| c_string(i, "fragment id")).collect::<crate::Result<_>>()?;
        let ptrs: Vec<*const c_char> = ids.iter().map(|c| c.as_ptr()).collect();
        let mut observed: *mut mws_binding = std::ptr::null_mut();
        let mut token: u64 = 0;
        let code = unsafe {
            (self.acquire)(self.ctx.0, tid.as_ptr(), pid.as_ptr(), ptrs.as_ptr(), ptrs.len(), &mut observed, &mut token)
        };
        // The observed binding (if any) is ours from now on, whatever happens.
        let observed = if observed.is_null() { None } else { Some(unsafe { Box::from_raw(observed) }) };
        if code != 0 {
            return Err(Error::new(ErrorKind::Store, format!("allocation guard acquire failed: error code {code}")));
        }
        let abort = |e: Error| {
            let _ = unsafe { (self.release)(self.ctx.0, token, terminal_code(TerminalState::Aborted)) };
            e
        };
        let fresh = match observed {
            None => expected.clone(),
            Some(b) => b.build().map_err(|f| {
                abort(Error::new(ErrorKind::StaleBinding, format!("observed binding is invalid: {}", f.message)))
            })?,
        };
        let fence = weight_allocation_fence(&fresh, required_ids, &format!("c-{transfer_id}"))
            .map_err(|e| abort(e.with_kind(ErrorKind::StaleBinding)))?;
        Ok((fresh, Box::new(CToken { fence, release: self.release, ctx: self.ctx, token })))
    }
}

/// What a call's `mws_io_args` says, decoded.
pub(crate) struct IoArgs<'a> {
    pub(crate) worker_id: Option<&'a str>,
    pub(crate) transfer_id: Option<&'a str>,
    pub(crate) guard: Box<dyn GuardProvider>,
    pub(crate) lease: Option<&'a mws_registration_lease>,
}

pub(crate) unsafe fn io_args<'a>(args: *const mws_io_args) -> FfiResult<IoArgs<'a>> {
    let Some(a) = args.as_ref() else {
        return Ok(IoArgs { worker_id: None, transfer_id: None, guard: Box::new(StaticGuard), lease: None });
    };
    let guard: Box<dyn GuardProvider> =
        if a.guard.is_null() { Box::new(StaticGuard) } else { Box::new(CGuard::from_vtable(a.guard, a.guard_ctx)?) };
    Ok(IoArgs {
        worker_id: opt_str_arg(a.worker_id, "args->worker_id")?,
        transfer_id: opt_str_arg(a.transfer_id, "args->transfer_id")?,
        guard,
        lease: a.lease.as_ref(),
    })
}

// ---------------------------------------------------------------------------------
// Receipts
// ---------------------------------------------------------------------------------

/// Upload receipts: proof that stored fragments were written and are visible.
/// Returned by `mws_store_upload` and `mws_writer_write_tensor`, decoded by
/// `mws_receipts_from_json`, merged by `mws_receipts_concat`; freed by
/// `mws_receipts_free`. Immutable: may be used from several threads at once.
pub struct mws_receipts {
    pub(crate) inner: Vec<UploadReceipt>,
    json: OnceLock<CText>,
}

impl mws_receipts {
    pub(crate) fn new(inner: Vec<UploadReceipt>) -> mws_receipts {
        mws_receipts { inner, json: OnceLock::new() }
    }
}

/// Frees a receipts handle. `NULL` does nothing.
///
/// # Safety
/// `receipts` is NULL or a live handle not yet freed, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_free(receipts: *mut mws_receipts) {
    value_call("mws_receipts_free", (), || {
        if !receipts.is_null() {
            drop(Box::from_raw(receipts));
        }
        Ok(())
    })
}

/// Returns the number of receipts, or 0 (and the last error) if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_count(receipts: *const mws_receipts) -> usize {
    value_call("mws_receipts_count", 0, || Ok(handle(receipts, "receipts")?.inner.len()))
}

/// Encodes the receipts for transport (a rank sends them to the coordinator that
/// commits). Borrowed NUL-terminated string (built on first use), valid while
/// `receipts` lives; length to `*len` when not NULL. NULL if `receipts` is NULL.
///
/// # Safety
/// `receipts` is NULL or a live handle; `len` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_to_json(receipts: *const mws_receipts, len: *mut usize) -> *const c_char {
    value_call("mws_receipts_to_json", std::ptr::null(), || {
        let r = handle(receipts, "receipts")?;
        Ok(r.json.get_or_init(|| CText::new(&crate::protocol::transport::receipts_to_json(&r.inner))).lend(len))
    })
}

/// Decodes receipts sent by `mws_receipts_to_json` (strict; their validity for a plan
/// is checked at commit). `json` points to `len` bytes read during the call. On
/// success writes a new handle to `*out` (free with `mws_receipts_free`).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT`.
///
/// # Safety
/// `json` points to `len` readable bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_from_json(
    json: *const c_char,
    len: usize,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call("mws_receipts_from_json", || {
        check_out(out, "out")?;
        if json.is_null() {
            return Err(Failure::null("json"));
        }
        let bytes = slice_arg(json as *const u8, len, "json")?;
        let r = crate::protocol::transport::receipts_from_json(bytes)?;
        write_out(out, Box::into_raw(Box::new(mws_receipts::new(r))));
        Ok(())
    })
}

/// Concatenates `count` receipts handles (borrowed for the call; NULL elements are an
/// error) into a new handle written to `*out` (free with `mws_receipts_free`).
/// `count` 0 gives an empty set.
///
/// # Safety
/// `list` points to `count` pointers that are NULL or live handles; `out` is NULL or
/// valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_concat(
    list: *const *const mws_receipts,
    count: usize,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call("mws_receipts_concat", || {
        check_out(out, "out")?;
        let items = slice_arg(list, count, "list")?;
        let mut all = Vec::new();
        for (i, r) in items.iter().enumerate() {
            let r = r.as_ref().ok_or_else(|| Failure::null(&format!("list[{i}]")))?;
            all.extend(r.inner.iter().cloned());
        }
        write_out(out, Box::into_raw(Box::new(mws_receipts::new(all))));
        Ok(())
    })
}

/// The receipts of every operation of `plan` (receipts are determined by the plan: a
/// coordinator can rebuild them to retry a commit after a crash). New handle in
/// `*out`.
///
/// # Safety
/// `plan` is NULL or a live handle; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_receipts_for_plan(
    plan: *const mws_upload_plan,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call("mws_receipts_for_plan", || {
        let p = handle(plan, "plan")?;
        check_out(out, "out")?;
        write_out(out, Box::into_raw(Box::new(mws_receipts::new(UploadReceipt::all_for(&p.inner)))));
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// The upload transaction
// ---------------------------------------------------------------------------------

/// Uploads the payloads of `binding`'s participant (only those of
/// `args->worker_id` when given) for `plan`, planned from `placement`, and writes
/// their receipts (plan order) to a new handle in `*out`.
///
/// Every freshness check (binding against placement and plan: lease, generation,
/// addresses, memory kind) runs before any store call; then the guard pins the
/// buffers, they are registered, written with `batch_put_from`, unregistered, and the
/// pin released (with `args->lease`, the lease's registration is used instead and
/// nothing is pinned or registered per call). A failure never deletes payloads: clean up with
/// `mws_store_abort_upload`. A participant without operations gives empty receipts.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_BINDING`, `MWS_STALE_BINDING`,
/// `MWS_INVALID_ARGUMENT` (unknown worker, worker required), `MWS_UNSUPPORTED` (device
/// memory and the store has no copy path), `MWS_CONFLICT` (the transaction already
/// chose abort), `MWS_STORE`/`MWS_IO` (backend; retryable).
/// Thread safety: uploads of different participants may run concurrently.
///
/// # Safety
/// Handles are NULL or live; `args` is NULL or valid. Every source buffer of
/// `binding` must be valid for reads and not written during the call (or while the
/// guard pins it).
#[no_mangle]
pub unsafe extern "C" fn mws_store_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    placement: *const mws_placement,
    binding: *const mws_binding,
    args: *const mws_io_args,
    out: *mut *mut mws_receipts,
) -> mws_status {
    status_call("mws_store_upload", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        let pl = handle(placement, "placement")?;
        let b = handle(binding, "binding")?;
        check_out(out, "out")?;
        let receipts = upload_participant(&s.ws, &p.inner, &pl.inner, b, args)?;
        write_out(out, Box::into_raw(Box::new(mws_receipts::new(receipts))));
        Ok(())
    })
}

/// `mws_store_upload` after the handle checks (shared with `mws_transaction_upload`).
///
/// # Safety
/// As `mws_store_upload`.
pub(crate) unsafe fn upload_participant(
    ws: &Arc<WeightStore>,
    plan: &UploadPlan,
    placement: &Placement,
    binding: &mws_binding,
    args: *const mws_io_args,
) -> FfiResult<Vec<UploadReceipt>> {
    let a = io_args(args)?;
    let rb = binding.build().map_err(|f| {
        Failure::new(mws_status::MWS_INVALID_BINDING, format!("invalid source runtime binding: {}", f.message))
    })?;
    let lease = a.lease.map(|l| l.for_store(ws)).transpose()?;
    let ua = UploadArgs {
        worker_id: a.worker_id,
        guard: Some(&*a.guard),
        transfer_id: a.transfer_id,
        lease: lease.as_deref(),
    };
    Ok(ws.upload(plan, placement, &rb, ua)?)
}

/// Commits the upload: checks the receipts and payloads, claims the commit decision
/// and publishes the manifest, written as a new handle to `*out`.
///
/// `receipts` may be NULL (no receipts: only valid for an empty plan). If
/// `decision_may_exist` is not NULL, it is set to 0 at entry and to 1 as soon as the
/// commit decision may have been written; from then on the caller must keep the plan
/// and retry the commit (or `mws_store_finalize_upload`), never abort. This flag is
/// written on failure too.
///
/// Errors: `MWS_INVALID_ARGUMENT` (receipts do not match the plan), `MWS_STORE`
/// (retryable: payload not complete, decision not visible yet), `MWS_CONFLICT` (the
/// transaction chose abort or lost to a conflicting revision).
///
/// # Safety
/// Handles are NULL or live; `decision_may_exist` is NULL or valid for writes; `out`
/// is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_commit(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    receipts: *const mws_receipts,
    decision_may_exist: *mut c_int,
    out: *mut *mut mws_stored_manifest,
) -> mws_status {
    status_call("mws_store_commit", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        check_out(out, "out")?;
        let r: &[UploadReceipt] = match receipts.as_ref() {
            Some(r) => &r.inner,
            None => &[],
        };
        if !decision_may_exist.is_null() {
            *decision_may_exist = 0;
        }
        let mut flag = || {
            if !decision_may_exist.is_null() {
                // SAFETY: checked non-NULL; valid for writes per the contract.
                unsafe { *decision_may_exist = 1 };
            }
        };
        let m = s.ws.commit(&p.inner, r, Some(&mut flag))?;
        write_out(out, Box::into_raw(Box::new(mws_stored_manifest::new(Arc::new(m)))));
        Ok(())
    })
}

/// Aborts the upload: records the abort decision and removes every payload of the
/// plan that no published manifest references. `receipts` may be NULL.
///
/// Errors: `MWS_CONFLICT` (the revision is already published or committed),
/// `MWS_STORE` (cleanup failed; retry or finalize later).
///
/// # Safety
/// Handles are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_store_abort_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    receipts: *const mws_receipts,
) -> mws_status {
    status_call("mws_store_abort_upload", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        let r: &[UploadReceipt] = match receipts.as_ref() {
            Some(r) => &r.inner,
            None => &[],
        };
        Ok(s.ws.abort_upload(&p.inner, r)?)
    })
}

/// Idempotent recovery: brings the transaction of `plan` to its terminal state and
/// removes the payloads it must not keep. Never removes a decision or a manifest.
///
/// Errors: `MWS_CONFLICT` (no terminal decision yet, or a decision of another plan),
/// `MWS_STORE` (retryable).
///
/// # Safety
/// Handles are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_store_finalize_upload(
    store: *const mws_store,
    plan: *const mws_upload_plan,
) -> mws_status {
    status_call("mws_store_finalize_upload", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        Ok(s.ws.finalize(&p.inner)?)
    })
}

/// The decision recorded for an upload transaction (`mws_store_read_decision`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_decision {
    /// No decision recorded yet.
    MWS_DECISION_NONE = 0,
    /// The transaction committed.
    MWS_DECISION_COMMIT = 1,
    /// The transaction aborted.
    MWS_DECISION_ABORT = 2,
}

/// Reads the decision record at the plan's control key into `*out`.
///
/// Errors: `MWS_INVALID_MANIFEST` (the record is invalid), `MWS_CONFLICT` (the record
/// belongs to another plan of the same transaction id), `MWS_STORE`.
///
/// # Safety
/// Handles are NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_store_read_decision(
    store: *const mws_store,
    plan: *const mws_upload_plan,
    out: *mut mws_decision,
) -> mws_status {
    status_call("mws_store_read_decision", || {
        let s = handle(store, "store")?;
        let p = handle(plan, "plan")?;
        check_out(out, "out")?;
        let d = match s.ws.read_decision(&p.inner)? {
            None => mws_decision::MWS_DECISION_NONE,
            Some((_, digest)) if digest != p.inner.plan_digest() => {
                return Err(Failure::new(mws_status::MWS_CONFLICT, "upload decision belongs to another plan"))
            }
            Some((Decision::Commit, _)) => mws_decision::MWS_DECISION_COMMIT,
            Some((Decision::Abort, _)) => mws_decision::MWS_DECISION_ABORT,
        };
        write_out(out, d);
        Ok(())
    })
}
