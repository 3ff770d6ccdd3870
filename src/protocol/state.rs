//! The state of a [`WeightStore`]: its backend, key prefix, limits and
//! registration state. The store's API is its methods: `weight_store.rs` holds
//! construction, configuration, the key-prefix rules every job shares, restore
//! planning and registration leases; each job's methods are the `impl WeightStore`
//! block of the job's own file (`upload.rs`, `commit.rs`, `load.rs`, `writer.rs`,
//! `revisions.rs`), so each job's logic lives in exactly one place. Those files take
//! the type from here, never from `weight_store.rs`.

use super::registration::Registrar;
use crate::error::{invalid, Result};
use crate::plan::integrity::IntegrityRecord;
use crate::runtime::MemoryKind;
use crate::runtime::MemoryRegion;
use crate::store::ObjectStore;
use parking_lot::Mutex;
use std::sync::Arc;

/// Range and batching limits (all > 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest single range read in bytes (default 64 MiB).
    pub max_range_bytes: u64,
    /// Keys or ranges per backend request (default 1024).
    pub max_ranges_per_request: usize,
    /// Largest segment count of one region at execution (default 2^32; the
    /// reference's 1,000,000 rejects realistic dim-1 reshards of large matrices).
    pub max_region_segments: u64,
    /// Budget of the host staging buffer of restores through stores without native
    /// strided reads (Mooncake), which pay per range: a region of many short rows is
    /// read as one span into a registered host staging buffer and scattered locally
    /// when the store's cost model says it is cheaper ([`crate::store::StoreCost`];
    /// host targets only). Default [`DEFAULT_STAGING_BYTES`] (64 MiB per weight
    /// store, registered once and reused); 0 = never stage (requests are then
    /// exactly the specified ranges).
    pub staging_bytes: u64,
    /// Largest manifest or decision record read back from the store, in bytes
    /// (default [`crate::store::DEFAULT_MAX_METADATA_BYTES`], 256 MiB: about 2.9x the
    /// largest benchmark manifest). A larger object fails with
    /// [`crate::ErrorKind::LimitExceeded`] before it is read or allocated.
    pub max_metadata_bytes: u64,
    /// Verify restored payloads against the revision's integrity record when it has
    /// one (default: true). The check is fused with the copy: the store's checked
    /// reads ([`crate::store::ObjectStore::get_into_ranges_checked`]) return the
    /// CRC-32C of every range they deliver, computed while the bytes are copied; the
    /// restore combines them into the checksum of every 1 MiB block it touched and
    /// compares it with the record (`protocol::integrity`). Blocks the restore reads
    /// only in part are completed by reading just their gaps. A corrupted, truncated
    /// or swapped payload fails with [`crate::ErrorKind::Integrity`] naming the tensor,
    /// the stored fragment's box, the fragment id and the object key. Cost on the
    /// embedded stores: see `docs/INTEGRITY.md` (`cargo bench --bench io`,
    /// `figure: restore_verified_vs_unverified`). A revision without a record (one the
    /// reference wrote, or an older one) restores unverified. `false` skips the check
    /// (the reference's behaviour); `mws verify` checks a revision offline at any time.
    /// Whether snapshots write a record is [`StoreLimits::write_integrity`].
    pub verify_integrity: bool,
    /// Snapshots compute the CRC-32C of every 1 MiB block of every payload while they
    /// write it and commit write them as the transaction's integrity record (default:
    /// true). `false`: uploads compute no checksums (their receipts carry none) and
    /// commit writes no record, so the revision is exactly what the reference writes
    /// (the manifest, the decision, the payloads; the record is the library's own
    /// object, not part of the specified protocol). Such a revision restores
    /// everywhere; a verifying restore loads it unverified
    /// ([`super::LoadStats::verified_bytes`] 0, an `info` log line per load) and
    /// `mws verify` checks only the presence and sizes of its payloads. A commit writes
    /// a record only when this is true for the committing store and every receipt
    /// carries checksums (an upload by a store with this false, or of device memory
    /// without a device engine, carries none).
    pub write_integrity: bool,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_range_bytes: 64 << 20,
            max_ranges_per_request: 1024,
            max_region_segments: 1 << 32,
            staging_bytes: DEFAULT_STAGING_BYTES,
            max_metadata_bytes: crate::store::DEFAULT_MAX_METADATA_BYTES,
            verify_integrity: true,
            write_integrity: true,
        }
    }
}

impl StoreLimits {
    /// Checks the limits, as every weight store does before it is built: each range
    /// and batching limit must be positive (`range limits must be positive`).
    pub fn validate(&self) -> Result<()> {
        if self.max_range_bytes == 0
            || self.max_ranges_per_request == 0
            || self.max_region_segments == 0
            || self.max_metadata_bytes == 0
        {
            return invalid("range limits must be positive");
        }
        Ok(())
    }
}

/// Default [`StoreLimits::staging_bytes`]: 64 MiB.
pub const DEFAULT_STAGING_BYTES: u64 = 64 << 20;

/// A weight store: the protocol's entry point for snapshots and restores (its API:
/// `weight_store.rs`). `Send + Sync`; calls may run concurrently from several threads.
pub struct WeightStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) key_prefix: String,
    pub(crate) limits: StoreLimits,
    pub(crate) registrar: Registrar,
    /// Staging buffers of restores, registered with the backend once and reused.
    pub(crate) staging: StagingPool,
    /// The integrity record verified restores decoded last ([`RecordCache`]).
    pub(crate) integrity_records: RecordCache,
    /// The device engine that stages device sources and targets (none: device
    /// memory only where the backend reaches it itself).
    pub(crate) device: Option<Arc<dyn crate::device::DeviceEngine>>,
}

/// The last integrity record a weight store decoded, with its key and its exact
/// bytes: a restore of many participants of one revision (one load call each) reads
/// the record every time (it may have changed: nothing is trusted across calls) but
/// decodes it once, reusing the decoded record only when the bytes just read are
/// identical to the ones it was decoded from.
#[derive(Default)]
pub(crate) struct RecordCache(Mutex<Option<(String, Vec<u8>, Arc<IntegrityRecord>)>>);

impl RecordCache {
    /// The record of `key` decoded from `bytes`: the cached one when `key` and the
    /// bytes are those it was decoded from, else `decode(key, bytes)` (kept when it
    /// succeeds).
    pub(crate) fn get_or_decode(
        &self,
        key: &str,
        bytes: Vec<u8>,
        decode: impl FnOnce(&str, &[u8]) -> Result<Arc<IntegrityRecord>>,
    ) -> Result<Arc<IntegrityRecord>> {
        if let Some((k, b, r)) = &*self.0.lock() {
            if k == key && *b == bytes {
                return Ok(r.clone());
            }
        }
        let record = decode(key, &bytes)?;
        *self.0.lock() = Some((key.to_string(), bytes, record.clone()));
        Ok(record)
    }
}

impl Drop for WeightStore {
    fn drop(&mut self) {
        self.staging.release_all(&*self.store);
    }
}

/// One host staging buffer, registered with the backend (see [`StagingPool`]).
pub(crate) struct StagingBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value; only the thread that
// took it from the pool writes it (through the store) while it is out of the pool.
unsafe impl Send for StagingBuffer {}

impl StagingBuffer {
    fn new(len: usize) -> Result<Self> {
        let failed = || crate::store::alloc_failed("the restore staging buffer", len as u64);
        if len == 0 {
            let b = Box::into_raw(Vec::<u8>::new().into_boxed_slice());
            return Ok(StagingBuffer { ptr: b as *mut u8, len });
        }
        // Zeroed memory from the allocator (fresh pages for a buffer this large): only
        // the pages restores write are ever touched. Filling `len` bytes up front
        // cost a store's first staged restore tens of milliseconds (64 MiB of
        // first-touch writes; issue 45's bench).
        let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| failed())?;
        // SAFETY: `layout` has a non-zero size (len > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(failed());
        }
        Ok(StagingBuffer { ptr, len })
    }

    /// The buffer as a host memory region (what the store writes spans into).
    pub(crate) fn region(&self) -> MemoryRegion {
        MemoryRegion { address: self.ptr as u64, len: self.len as u64, kind: MemoryKind::Host }
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` come from `new`: a boxed empty slice, or `len` zeroed
        // bytes allocated with `Layout::array::<u8>(len)`, the layout of a boxed slice
        // of `len` bytes; freed exactly once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Host staging buffers of restores: each is registered with the backend when it is
/// made, lent to one restore at a time, and unregistered when the weight store is
/// dropped. Concurrent restores each get their own buffer.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<StagingBuffer>>,
}

impl StagingPool {
    /// A registered buffer of at least `len` bytes (a free one, or a new one).
    pub(crate) fn take(&self, store: &dyn ObjectStore, len: u64) -> Result<StagingBuffer> {
        {
            let mut free = self.free.lock();
            if let Some(i) = free.iter().position(|b| b.len as u64 >= len) {
                return Ok(free.swap_remove(i));
            }
        }
        let len =
            usize::try_from(len).map_err(|_| crate::Error::invalid("staging budget exceeds the address space"))?;
        let b = StagingBuffer::new(len)?;
        store.register_buffer(b.region()).map_err(|e| {
            crate::Error::new(e.kind(), format!("register_buffer failed for the staging buffer: {}", e.message()))
        })?;
        Ok(b)
    }

    /// Returns a buffer for later restores.
    pub(crate) fn give_back(&self, b: StagingBuffer) {
        self.free.lock().push(b);
    }

    /// Unregisters and frees every pooled buffer (failures are ignored: the memory is
    /// freed by the process either way, and a backend that cannot unregister cannot be
    /// helped here).
    fn release_all(&self, store: &dyn ObjectStore) {
        for b in self.free.lock().drain(..) {
            let _ = store.unregister_buffer(b.region().address);
        }
    }
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore").field("key_prefix", &self.key_prefix).field("limits", &self.limits).finish()
    }
}
