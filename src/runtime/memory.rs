//! Memory the library borrows: where a buffer lives (host or device), a region of
//! host or device memory, and the copy hook
//! that moves bytes between device and host memory for backends and engines that
//! cannot touch device memory themselves.

use crate::error::Result;

/// Where a runtime buffer lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory: embedded backends copy it directly.
    #[default]
    Host,
    /// Device memory on accelerator `ordinal`: needs a copy hook or a
    /// device-capable backend.
    Device(u32),
}

/// A borrowed memory range: `len` bytes at `address` in host memory or on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryRegion {
    /// First byte.
    pub address: u64,
    /// Length in bytes.
    pub len: u64,
    /// Host or device.
    pub kind: MemoryKind,
}

/// Copies between device memory and host memory for backends that cannot touch
/// device memory themselves (for example a `cudaMemcpy` wrapper).
///
/// Implementations must be thread-safe and must not panic.
pub trait CopyHook: Send + Sync {
    /// Copies `dst.len()` bytes from device memory at `src` into `dst`.
    fn device_to_host(&self, src: MemoryRegion, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` into device memory at `dst` (`dst.len == src.len()`).
    fn host_to_device(&self, src: &[u8], dst: MemoryRegion) -> Result<()>;
}
