//! The store contract (`store-protocol.md` §1): keys and bytes only, never models.
//!
//! Backends: [`memory::MemoryStore`] (tests, single process) and
//! [`directory::DirectoryStore`] (the embedded default: one file per key, crash-safe).
//! A C vtable backend lives with the C ABI.
//!
//! Results are per item where the contract says so: one missing key fails its own
//! item, not the batch. Keys are UTF-8 strings; backends that map keys to paths
//! validate them ([`validate_key`]).

use crate::error::{Error, ErrorKind, Result};
use crate::runtime::MemoryKind;

pub mod directory;
pub mod memory;

/// The kind of object a write creates (Mooncake's `ReplicateConfig.data_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordType {
    /// Payload bytes (`WEIGHT`).
    Payload,
    /// Manifest or decision record (`METADATA`).
    Metadata,
}

/// Write configuration: the group ids of the written keys and the record type.
/// Every object is hard-pinned (backends that evict must not evict these).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteConfig<'a> {
    /// For `put`: one group id. For `batch_put_from`: one per key, in key order.
    pub group_ids: &'a [String],
    /// Payload or metadata.
    pub record_type: RecordType,
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

/// One item of [`ObjectStore::batch_put_from`]: write `source` as object `key`.
#[derive(Clone, Copy, Debug)]
pub struct PutFrom<'a> {
    /// Object key.
    pub key: &'a str,
    /// Source bytes (registered memory).
    pub source: MemoryRegion,
}

/// One item of [`ObjectStore::get_into_ranges`]: copy `dest.len` bytes of object
/// `key`, starting at `object_offset`, into `dest`.
#[derive(Clone, Copy, Debug)]
pub struct RangeRead<'a> {
    /// Object key.
    pub key: &'a str,
    /// Byte offset inside the object.
    pub object_offset: u64,
    /// Destination (registered memory); its `len` is the range length.
    pub dest: MemoryRegion,
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

/// The operations the protocol drives (`store-protocol.md` §1). All calls are
/// synchronous and thread-safe.
///
/// Error kinds: [`ErrorKind::NotFound`] for a missing key,
/// [`ErrorKind::AlreadyExists`] for a create-only `put` on an existing key,
/// [`ErrorKind::Store`] / [`ErrorKind::Io`] for backend failures,
/// [`ErrorKind::Unsupported`] for memory the backend cannot reach.
pub trait ObjectStore: Send + Sync {
    /// Create-only, atomic put: if `key` exists the stored value is left unchanged
    /// and the result is `AlreadyExists`; a reader sees nothing or the whole value.
    fn put(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()>;

    /// Writes `value` at `key`, replacing any previous value atomically.
    fn upsert(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()>;

    /// The whole object. `NotFound` if absent.
    fn get(&self, key: &str) -> Result<Vec<u8>>;

    /// True when the object is present and complete.
    fn exists(&self, key: &str) -> Result<bool>;

    /// Per key, as [`ObjectStore::exists`].
    fn batch_exists(&self, keys: &[&str]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.exists(k)).collect()
    }

    /// Removes `key`; removing an absent key succeeds.
    fn remove(&self, key: &str) -> Result<()>;

    /// Writes each item's source bytes as its object (per-item results, item order).
    /// `config.group_ids` has one entry per item.
    ///
    /// # Safety
    /// Every `source` region must be valid for reads of `len` bytes, and must not be
    /// written concurrently, for the duration of the call.
    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>>;

    /// Copies byte ranges of objects into destination memory. Per-item result: the
    /// number of bytes copied (equal to `dest.len` on success). A range beyond the
    /// end of its object is an error of that item, and nothing past the object's
    /// end is written.
    ///
    /// # Safety
    /// Every `dest` region must be valid for writes of `len` bytes, and not accessed
    /// by anyone else, for the duration of the call.
    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>>;

    /// True when the backend can read and write memory of `kind` (host always;
    /// device memory needs a copy hook or a device-capable backend).
    fn supports_memory(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::Host
    }

    /// Registers memory for transfers (a no-op for embedded backends).
    fn register_buffer(&self, _region: MemoryRegion) -> Result<()> {
        Ok(())
    }

    /// Unregisters memory registered at `address` (a no-op for embedded backends).
    fn unregister_buffer(&self, _address: u64) -> Result<()> {
        Ok(())
    }
}

/// Validates a key for path-mapped backends: non-empty, no NUL, no empty, `.` or
/// `..` segment, not absolute (no leading `/`), no trailing `/`.
pub fn validate_key(key: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("invalid store key {key:?}: {why}")));
    if key.is_empty() {
        return bad("empty");
    }
    if key.contains('\0') {
        return bad("contains NUL");
    }
    if key.starts_with('/') {
        return bad("absolute");
    }
    for seg in key.split('/') {
        match seg {
            "" => return bad("empty segment"),
            "." | ".." => return bad("dot segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Error for a missing key.
pub fn not_found(key: &str) -> Error {
    Error::new(ErrorKind::NotFound, format!("object not found: {key}"))
}
