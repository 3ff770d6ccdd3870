//! Every C vtable a caller hands the library, each translated into the Rust trait of
//! the layer below: [`store`] (`mws_store_vtable` -> `store::ObjectStore`),
//! [`device_engine`] (`mws_device_engine_vtable` -> `device::DeviceEngine`), [`guard`]
//! (`mws_guard_vtable` -> `protocol::GuardProvider`) and [`snapshot`]
//! (`mws_snapshot_adapter_vtable` -> `protocol::SnapshotAdapter`), [`engine`]
//! (`mws_transfer_engine_vtable` -> `engine::TransferEngine`) [`log`] (the
//! `mws_set_log_callback` function -> a `log::Log` backend) and [`progress`]
//! (`mws_progress_fn` -> `protocol::ProgressFn`). The layers below know
//! no `mws_*` type.

pub mod device_engine;
pub mod engine;
pub mod guard;
pub mod log;
pub mod progress;
pub mod snapshot;
pub mod store;

use mws::error::{Error, ErrorKind, Result};
use mws::runtime::MemoryKind;
use std::ffi::c_void;

/// The caller's context pointer. The vtable contract makes the callbacks thread-safe.
#[derive(Clone, Copy)]
pub(crate) struct Ctx(pub(crate) *mut c_void);

// SAFETY: the vtable contract requires thread-safe callbacks over `ctx`.
unsafe impl Send for Ctx {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ctx {}

pub(crate) fn memory_code(kind: MemoryKind) -> (u32, u32) {
    match kind {
        MemoryKind::Host => (0, 0),
        MemoryKind::Device(o) => (1, o),
    }
}

/// Reads a caller's versioned vtable: checks `size` and `version` and copies the
/// part this library knows.
///
/// # Safety
/// `vt` points to at least 8 readable bytes and, when its `size` field says so, to
/// `size_of::<T>()` readable bytes.
pub(crate) unsafe fn read_vtable<T: Copy>(vt: *const T, name: &str, version: u32) -> Result<T> {
    // SAFETY: forwarded contract; with `min_size` equal to `T`'s size no field is
    // zero-filled.
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
    // SAFETY: the contract: at least the 8 header bytes (`size`, `version`) are readable.
    let (size, ver) = unsafe { (header.read_unaligned(), header.add(1).read_unaligned()) };
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
        // SAFETY: the contract: `size` (checked to cover `T`) bytes are readable.
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
    // SAFETY: every byte of `out` is initialized: the copied prefix, the rest zero,
    // which is `None` for the optional callbacks the contract says follow `min_size`.
    Ok(unsafe { out.assume_init() })
}
