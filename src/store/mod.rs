//! The store contract (`store-protocol.md` §1): keys and bytes only, never models.
//!
//! Backends: [`memory::MemoryStore`] (tests, single process),
//! [`directory::DirectoryStore`] (the embedded default: one file per key, crash-safe)
//! and [`remote::RemoteStore`], the adapter of every remote store with Mooncake's
//! return codes (code mapping, transient retries, the contract's checks) over a small
//! trait of raw calls ([`remote::RemoteCalls`]) that the C ABI's store vtable, and
//! through it the Python bridge to Mooncake Store, implement. The embedded backends'
//! copy kernels are in `kernels.rs`.
//!
//! Results are per item where the contract says so: one missing key fails its own
//! item, not the batch. Keys are UTF-8 strings; backends that map keys to paths
//! validate them ([`validate_key`]).

use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{MemoryKind, MemoryRegion};

pub mod directory;
mod dirfd;
pub(crate) mod kernels;
pub mod memory;
pub mod remote;

pub use crate::crc::RangeCrc;
pub use kernels::io_threads;

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

/// One item of [`ObjectStore::get_into_strided`]: a strided region of object `key`
/// (`segment_count` runs of `inner_bytes`) copied into the destination view `dest`.
///
/// Segment `i` (row-major index vector over `counts`) starts at
/// `object_offset + Σ i_j·src_strides[j]` in the object and at
/// `dest_offset + Σ i_j·dst_strides[j]` in `dest`.
#[derive(Clone, Copy, Debug)]
pub struct StridedRead<'a> {
    /// Object key.
    pub key: &'a str,
    /// Absolute object offset of the first segment.
    pub object_offset: u64,
    /// The whole destination view; no byte outside it is ever written.
    pub dest: MemoryRegion,
    /// Offset of the first segment inside `dest`.
    pub dest_offset: u64,
    /// Length of one segment.
    pub inner_bytes: u64,
    /// Outer loop counts (may be empty: one segment).
    pub counts: &'a [u64],
    /// Source strides of the outer loops.
    pub src_strides: &'a [u64],
    /// Destination strides of the outer loops.
    pub dst_strides: &'a [u64],
}

impl StridedRead<'_> {
    /// Number of segments (saturating).
    pub fn segment_count(&self) -> u64 {
        self.counts.iter().fold(1u64, |a, &c| a.saturating_mul(c))
    }

    /// Total bytes copied.
    pub fn total_bytes(&self) -> u64 {
        self.inner_bytes.saturating_mul(self.segment_count())
    }

    /// One past the furthest byte touched, relative to the base, for `strides`;
    /// `None` on overflow or inconsistent lengths.
    fn reach(&self, strides: &[u64]) -> Option<u64> {
        if strides.len() != self.counts.len() || self.counts.contains(&0) {
            return None;
        }
        let mut end = self.inner_bytes;
        for (c, s) in self.counts.iter().zip(strides) {
            end = end.checked_add((c - 1).checked_mul(*s)?)?;
        }
        Some(end)
    }

    /// One past the furthest object byte the read touches, relative to
    /// `object_offset`; `None` on overflow or inconsistent lengths.
    pub fn reach_src(&self) -> Option<u64> {
        self.reach(self.src_strides)
    }

    /// Checks the read against the object size and the destination view:
    /// `(source end, destination end)` or an [`ErrorKind::Integrity`] error naming
    /// the key.
    pub fn check_bounds(&self, object_len: u64) -> Result<()> {
        let bad = |what: &str| Err(Error::new(ErrorKind::Integrity, format!("strided read of {} {what}", self.key)));
        match self.reach(self.src_strides).and_then(|r| r.checked_add(self.object_offset)) {
            Some(end) if end <= object_len => {}
            _ => return bad("exceeds the object"),
        }
        match self.reach(self.dst_strides).and_then(|r| r.checked_add(self.dest_offset)) {
            Some(end) if end <= self.dest.len => Ok(()),
            _ => bad("exceeds the destination view"),
        }
    }

    /// Calls `f(object_offset, dest_offset, len)` for every segment in row-major
    /// order (offsets absolute in the object and relative to `dest`).
    pub fn for_each_segment(&self, mut f: impl FnMut(u64, u64, u64) -> Result<()>) -> Result<()> {
        let k = self.counts.len();
        if k <= 1 {
            // Fast path: one contiguous run, or one outer loop (2-D reshards).
            let (n, ss, ds) = match k {
                0 => (1, 0, 0),
                _ => (self.counts[0], self.src_strides[0], self.dst_strides[0]),
            };
            let (mut s, mut d) = (self.object_offset, self.dest_offset);
            for _ in 0..n {
                f(s, d, self.inner_bytes)?;
                s += ss;
                d += ds;
            }
            return Ok(());
        }
        let mut idx = vec![0u64; k];
        let (mut s, mut d) = (self.object_offset, self.dest_offset);
        for _ in 0..self.segment_count() {
            f(s, d, self.inner_bytes)?;
            let mut j = k;
            while j > 0 {
                j -= 1;
                idx[j] += 1;
                s += self.src_strides[j];
                d += self.dst_strides[j];
                if idx[j] < self.counts[j] {
                    break;
                }
                s -= self.src_strides[j] * idx[j];
                d -= self.dst_strides[j] * idx[j];
                idx[j] = 0;
            }
        }
        Ok(())
    }
}

/// One item's result of a checked read ([`ObjectStore::get_into_ranges_checked`],
/// [`ObjectStore::get_into_strided_checked`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedRead {
    /// Bytes copied (what the unchecked read returns).
    pub bytes: u64,
    /// The CRC-32C of the object bytes the item delivered, as runs over object offsets
    /// in delivery order: every delivered byte is in exactly one run (a byte that two
    /// segments of a strided read deliver, in one run per delivery), and no run crosses
    /// a multiple of the call's `crc_span`. `None` when the store could not sum them
    /// (device memory through the default implementations).
    pub crcs: Option<Vec<RangeCrc>>,
}

/// The runs of the host bytes delivered into `dest` at `dest_offset` for object
/// bytes `[object_offset, +len)` (the default implementations' read-back).
///
/// # Safety
/// `dest` is host memory valid for reads of its bytes that the read just wrote.
unsafe fn sum_delivered(
    runs: &mut crate::copy::CrcRuns,
    dest: &MemoryRegion,
    dest_offset: u64,
    object_offset: u64,
    len: u64,
) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller's contract; the segment lies inside `dest` (the read succeeded).
    let bytes = unsafe { std::slice::from_raw_parts((dest.address + dest_offset) as usize as *const u8, len as usize) };
    runs.account(object_offset, bytes);
}

/// What moving bytes through a backend costs, as the restore planner models it:
/// a request of `r` ranges and `b` bytes costs about
/// `per_request_ns + r * per_range_ns + b / bytes_per_second`. The planner uses it to
/// choose, per region, between reading each row as its own range and reading the
/// whole span of rows into a staging buffer (then scattering locally); see
/// `protocol::load`. Backends report their own ([`ObjectStore::cost`]); a vtable
/// store reports it through the optional `get_cost` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreCost {
    /// Fixed cost of one request (one `get_into_ranges` or `batch_put_from` call), ns.
    pub per_request_ns: u64,
    /// Additional cost of each range (or item) of a request, ns.
    pub per_range_ns: u64,
    /// Sustained bandwidth of one request stream, bytes per second (> 0).
    pub bytes_per_second: u64,
}

impl StoreCost {
    /// An in-process backend: memory-speed copies, no per-request cost to speak of.
    pub const LOCAL: StoreCost = StoreCost { per_request_ns: 200, per_range_ns: 20, bytes_per_second: 10_000_000_000 };

    /// What a store behind a vtable is assumed to cost when it reports nothing: a
    /// remote, range-priced store like Mooncake Store (measured here through the
    /// Python client: about 21 us per range, 2-4 GB/s per stream).
    pub const REMOTE: StoreCost =
        StoreCost { per_request_ns: 50_000, per_range_ns: 21_000, bytes_per_second: 3_000_000_000 };

    /// Modeled nanoseconds of one request of `ranges` ranges and `bytes` bytes.
    pub fn request_ns(&self, ranges: u64, bytes: u64) -> u128 {
        self.per_request_ns as u128
            + ranges as u128 * self.per_range_ns as u128
            + bytes as u128 * 1_000_000_000 / self.bytes_per_second.max(1) as u128
    }

    /// Checks the values (`bytes_per_second` must be positive).
    pub fn validate(&self) -> Result<()> {
        if self.bytes_per_second == 0 {
            return Err(Error::invalid("store cost bytes_per_second must be positive"));
        }
        Ok(())
    }
}

/// Reads object `key` for a caller's buffer of `capacity` bytes (raw access: the C
/// ABI's `mws_store_get`, tools): the whole object when it holds at most `capacity`
/// bytes, never reading or allocating more than that, whatever size the backend
/// reports. Errors: those of [`ObjectStore::get_limited`], except that a larger
/// object is [`ErrorKind::InvalidArgument`] `buffer of <capacity> bytes is too small
/// for <key> (<size> bytes)`.
pub fn get_for_buffer(store: &dyn ObjectStore, key: &str, capacity: u64) -> Result<Vec<u8>> {
    let too_small =
        |size: u64| Error::invalid(format!("buffer of {capacity} bytes is too small for {key} ({size} bytes)"));
    let bytes = match store.get_limited(key, capacity) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::LimitExceeded => match store.object_size(key) {
            Ok(size) if size > capacity => return Err(too_small(size)),
            _ => return Err(e),
        },
        Err(e) => return Err(e),
    };
    if bytes.len() as u64 > capacity {
        return Err(too_small(bytes.len() as u64));
    }
    Ok(bytes)
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

    /// The whole object if it holds at most `max_bytes`; else
    /// [`ErrorKind::LimitExceeded`] (`object K holds N bytes, more than the limit of
    /// M bytes`), without reading or allocating the object. Allocation failures are
    /// `LimitExceeded` too, never an abort. Use it for every object of unknown size
    /// (store content is untrusted). The default asks [`ObjectStore::object_size`]
    /// first, then checks what [`ObjectStore::get`] returned; backends override it to
    /// bound the read itself.
    fn get_limited(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let size = self.object_size(key)?;
        if size > max_bytes {
            return Err(too_large(key, size, max_bytes));
        }
        let value = self.get(key)?;
        if value.len() as u64 > max_bytes {
            return Err(too_large(key, value.len() as u64, max_bytes));
        }
        Ok(value)
    }

    /// The size of the object in bytes. `NotFound` if absent. The default reads
    /// the whole object; backends override it with a metadata query.
    fn object_size(&self, key: &str) -> Result<u64> {
        self.get(key).map(|v| v.len() as u64)
    }

    /// Per key, as [`ObjectStore::object_size`] (same results and errors); backends
    /// override it to share work between keys (the directory store resolves each
    /// key directory once per call).
    fn object_sizes(&self, keys: &[&str]) -> Vec<Result<u64>> {
        keys.iter().map(|k| self.object_size(k)).collect()
    }

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

    /// As [`ObjectStore::get_into_ranges`], and per successful item the CRC-32C of the
    /// object bytes it delivered ([`CheckedRead`]; runs split at multiples of
    /// `crc_span` object bytes). Verified restores use it: the checksums are compared
    /// with the integrity record's block checksums.
    ///
    /// The default implementation reads the host destination back after
    /// [`ObjectStore::get_into_ranges`] returns (one extra pass over the delivered
    /// bytes at CRC-32C speed, serial with the reads), and cannot sum device memory
    /// (`crcs: None`). The embedded backends compute the checksums while they copy.
    ///
    /// # Safety
    /// As [`ObjectStore::get_into_ranges`]; besides, host destinations stay readable
    /// for the duration of the call.
    unsafe fn get_into_ranges_checked(&self, ranges: &[RangeRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: this function's contract is `get_into_ranges`'s.
        let results = unsafe { self.get_into_ranges(ranges) };
        results
            .into_iter()
            .zip(ranges)
            .map(|(res, r)| {
                let bytes = res?;
                if r.dest.kind != MemoryKind::Host || bytes != r.dest.len {
                    return Ok(CheckedRead { bytes, crcs: None });
                }
                let mut runs = crate::copy::CrcRuns::new(crc_span);
                // SAFETY: the read just wrote `dest` (host, readable: this function's contract).
                unsafe { sum_delivered(&mut runs, &r.dest, 0, r.object_offset, bytes) };
                Ok(CheckedRead { bytes, crcs: Some(runs.finish()) })
            })
            .collect()
    }

    /// As [`ObjectStore::get_into_strided`], and per successful item the CRC-32C of the
    /// object bytes it delivered (see [`ObjectStore::get_into_ranges_checked`]; the
    /// default reads host destinations back segment by segment after the call).
    ///
    /// # Safety
    /// As [`ObjectStore::get_into_strided`]; besides, host destinations stay readable
    /// for the duration of the call.
    unsafe fn get_into_strided_checked(&self, reads: &[StridedRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: this function's contract is `get_into_strided`'s.
        let results = unsafe { self.get_into_strided(reads) };
        results
            .into_iter()
            .zip(reads)
            .map(|(res, r)| {
                let bytes = res?;
                if r.dest.kind != MemoryKind::Host || bytes != r.total_bytes() {
                    return Ok(CheckedRead { bytes, crcs: None });
                }
                let mut runs = crate::copy::CrcRuns::new(crc_span);
                r.for_each_segment(|s, d, n| {
                    // SAFETY: the read just wrote every segment of `dest` (host, readable).
                    unsafe { sum_delivered(&mut runs, &r.dest, d, s, n) };
                    Ok(())
                })?;
                Ok(CheckedRead { bytes, crcs: Some(runs.finish()) })
            })
            .collect()
    }

    /// The backend's cost model (see [`StoreCost`]). The default is
    /// [`StoreCost::REMOTE`]; embedded backends report [`StoreCost::LOCAL`].
    fn cost(&self) -> StoreCost {
        StoreCost::REMOTE
    }

    /// True when [`ObjectStore::get_into_strided`] is native (whole regions per
    /// call); the restore path then hands regions over instead of chunked ranges.
    fn supports_strided_reads(&self) -> bool {
        false
    }

    /// Copies strided regions of objects into destination views (per-item result:
    /// bytes copied). The default expands each region into ranges.
    ///
    /// # Safety
    /// Every `dest` region must be valid for writes of `len` bytes, and not accessed
    /// by anyone else, for the duration of the call.
    unsafe fn get_into_strided(&self, reads: &[StridedRead<'_>]) -> Vec<Result<u64>> {
        reads
            .iter()
            .map(|r| {
                let mut ranges = Vec::new();
                r.for_each_segment(|s, d, n| {
                    ranges.push(RangeRead {
                        key: r.key,
                        object_offset: s,
                        dest: MemoryRegion { address: r.dest.address + d, len: n, kind: r.dest.kind },
                    });
                    Ok(())
                })?;
                let mut total = 0;
                // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                for res in unsafe { self.get_into_ranges(&ranges) } {
                    total += res?;
                }
                Ok(total)
            })
            .collect()
    }

    /// True when the backend can read and write memory of `kind` (host always;
    /// device memory only for a backend that reaches it itself). The weight store
    /// never hands device memory to a backend when it has a device engine: it stages
    /// device bytes in host memory ([`crate::device`]).
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

    /// True when [`ObjectStore::list`] is implemented.
    fn supports_list(&self) -> bool {
        false
    }

    /// Streams every object whose key starts with `prefix` (a plain string prefix;
    /// `""` lists everything) to `visit(key, size)`, in no particular order, until
    /// `visit` returns `false`. A listing is not a snapshot: objects written or
    /// removed during the call may or may not appear. Use [`list_sorted`] for a
    /// sorted vector. The default fails with [`ErrorKind::Unsupported`].
    fn list(&self, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<()> {
        let _ = (prefix, visit);
        Err(Error::new(ErrorKind::Unsupported, "this store cannot list its keys"))
    }
}

/// One object of a listing: its key and size in bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListedObject {
    /// Object key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
}

/// Every object under `prefix` ([`ObjectStore::list`]), sorted by key.
pub fn list_sorted(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<ListedObject>> {
    let mut out = Vec::new();
    store.list(prefix, &mut |k, size| {
        out.push(ListedObject { key: k.to_string(), size });
        true
    })?;
    out.sort();
    Ok(out)
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

/// Default bound of whole-object reads of metadata (manifests, decision records):
/// 256 MiB. The largest manifest the benchmark workloads produce (w1m-moe: 1.1 M
/// placement fragments, 251,581 stored fragments) is 93,758,268 bytes (89.4 MiB), so
/// the default leaves about 2.9x headroom while a hostile size can never make a
/// reader allocate more than this. Configurable per store
/// (`StoreLimits::max_metadata_bytes`, `mws_store_options.max_metadata_bytes`).
pub const DEFAULT_MAX_METADATA_BYTES: u64 = 256 << 20;

/// Error for an object larger than a read's bound (or than what can be allocated).
pub fn too_large(key: &str, size: u64, max_bytes: u64) -> Error {
    Error::new(
        ErrorKind::LimitExceeded,
        format!("object {key} holds {size} bytes, more than the limit of {max_bytes} bytes"),
    )
}

/// Error for an object whose buffer cannot be allocated (`try_reserve` failed).
pub fn alloc_failed(key: &str, size: u64) -> Error {
    Error::new(ErrorKind::LimitExceeded, format!("cannot allocate {size} bytes to read object {key}"))
}

/// Error for a missing key.
pub fn not_found(key: &str) -> Error {
    Error::new(ErrorKind::NotFound, format!("object not found: {key}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_for_buffer_reads_what_fits_and_names_what_does_not() {
        let store = memory::MemoryStore::new();
        let groups = [String::new()];
        let config = WriteConfig { group_ids: &groups, record_type: RecordType::Metadata };
        store.put("k", b"0123456789", &config).unwrap();
        assert_eq!(get_for_buffer(&store, "k", 10).unwrap(), b"0123456789");
        assert_eq!(get_for_buffer(&store, "k", 64).unwrap(), b"0123456789");
        let e = get_for_buffer(&store, "k", 4).unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::InvalidArgument, "buffer of 4 bytes is too small for k (10 bytes)")
        );
        assert_eq!(get_for_buffer(&store, "absent", 4).unwrap_err().kind(), ErrorKind::NotFound);
    }
}
