//! Memory the library borrows: where a buffer lives (host or device) and a region of
//! host or device memory. Device bytes move only through a device engine
//! ([`crate::device`]).

/// Where a runtime buffer lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory: embedded backends copy it directly.
    #[default]
    Host,
    /// Device memory on accelerator `ordinal`: reached only through a device engine
    /// ([`crate::device::DeviceEngine`]).
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
