//! `mws_copy_hook_vtable`: a caller's device-memory copy functions (for example
//! `cudaMemcpy`) as a `store::CopyHook` for the embedded stores.

use crate::callbacks::{memory_code, read_vtable, Ctx};
use mws::error::Error;
use mws::error::ErrorKind;
use mws::error::Result;
use mws::runtime::CopyHook;
use mws::runtime::MemoryRegion;
use std::ffi::c_void;
use std::fmt;

/// Version of [`mws_copy_hook_vtable`] this library implements.
pub const MWS_COPY_HOOK_VTABLE_VERSION: u32 = 1;

/// Device <-> host copies for the embedded stores (memory, directory), which cannot
/// touch device memory themselves (for example a `cudaMemcpy` wrapper).
///
/// Set `size = sizeof(mws_copy_hook_vtable)` and
/// `version = MWS_COPY_HOOK_VTABLE_VERSION`. Callbacks receive the hook's `ctx`,
/// return 0 on success (any other value is an error), must not throw or unwind, and
/// must be thread-safe. `destroy` may be NULL.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mws_copy_hook_vtable {
    /// `sizeof(mws_copy_hook_vtable)`.
    pub size: u32,
    /// `MWS_COPY_HOOK_VTABLE_VERSION`.
    pub version: u32,
    /// Copies `len` bytes from device memory at `src_address` into host `dst`.
    pub device_to_host: Option<
        unsafe extern "C" fn(ctx: *mut c_void, src_address: u64, device_ordinal: u32, dst: *mut u8, len: u64) -> i32,
    >,
    /// Copies `len` host bytes at `src` into device memory at `dst_address`.
    pub host_to_device: Option<
        unsafe extern "C" fn(ctx: *mut c_void, src: *const u8, len: u64, dst_address: u64, device_ordinal: u32) -> i32,
    >,
    /// Optional: called once when the last store using the hook is freed.
    pub destroy: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
}

/// A [`CopyHook`] implemented by C callbacks ([`mws_copy_hook_vtable`]).
pub struct CallbackCopyHook {
    pub(crate) vt: mws_copy_hook_vtable,
    pub(crate) ctx: Ctx,
}

impl fmt::Debug for CallbackCopyHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackCopyHook").finish_non_exhaustive()
    }
}

impl CallbackCopyHook {
    /// Wraps `vt` (copied) and `ctx`; both copy callbacks are required. Ownership of
    /// `ctx` as for [`store_from_vtable`](super::store::store_from_vtable).
    ///
    /// # Safety
    /// As [`store_from_vtable`](super::store::store_from_vtable), for a [`mws_copy_hook_vtable`].
    pub unsafe fn new(vt: *const mws_copy_hook_vtable, ctx: *mut c_void) -> Result<Self> {
        // SAFETY: forwarded contract: `vt` is NULL or readable for its size.
        let vt = unsafe { read_vtable(vt, "mws_copy_hook_vtable", MWS_COPY_HOOK_VTABLE_VERSION) }?;
        if vt.device_to_host.is_none() || vt.host_to_device.is_none() {
            return Err(Error::invalid(
                "mws_copy_hook_vtable is missing mandatory callbacks: device_to_host and host_to_device are required",
            ));
        }
        Ok(CallbackCopyHook { vt, ctx: Ctx(ctx) })
    }
}

impl Drop for CallbackCopyHook {
    fn drop(&mut self) {
        if let Some(destroy) = self.vt.destroy {
            // SAFETY: called exactly once.
            unsafe { destroy(self.ctx.0) };
        }
    }
}

impl CopyHook for CallbackCopyHook {
    fn device_to_host(&self, src: MemoryRegion, dst: &mut [u8]) -> Result<()> {
        let f = self.vt.device_to_host.expect("checked at construction");
        let (_, ordinal) = memory_code(src.kind);
        // SAFETY: the vtable was checked at construction and the caller's contract makes its functions valid and thread-safe over `ctx`; `dst` is a live buffer of `dst.len()` bytes, `src` a device region the caller vouched for.
        let code = unsafe { f(self.ctx.0, src.address, ordinal, dst.as_mut_ptr(), dst.len() as u64) };
        if code != 0 {
            return Err(Error::new(ErrorKind::Store, format!("copy hook device_to_host failed: error code {code}")));
        }
        Ok(())
    }

    fn host_to_device(&self, src: &[u8], dst: MemoryRegion) -> Result<()> {
        let f = self.vt.host_to_device.expect("checked at construction");
        let (_, ordinal) = memory_code(dst.kind);
        // SAFETY: as above: a checked vtable function; `src` is a live buffer of `src.len()` bytes and `dst` a device region the caller vouched for.
        let code = unsafe { f(self.ctx.0, src.as_ptr(), src.len() as u64, dst.address, ordinal) };
        if code != 0 {
            return Err(Error::new(ErrorKind::Store, format!("copy hook host_to_device failed: error code {code}")));
        }
        Ok(())
    }
}
