//! In-memory backend: a sharded map of `Arc<[u8]>`, for tests and single-process use.
//!
//! Keys are arbitrary strings (like Mooncake Store, and unlike the path-mapped
//! [`super::directory::DirectoryStore`], this backend does not validate them).
//! Values are immutable `Arc<[u8]>`: a reader clones the `Arc` under a short read
//! lock and copies outside it, so a concurrent `upsert` never tears a read.
//!
//! The store records, per key, the group id and [`RecordType`] of the write that
//! stored its current value ([`MemoryStore::group_of`]), so protocol tests can check
//! which group each object was written with.

use std::collections::hash_map::{DefaultHasher, Entry as MapEntry};
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::RwLock;

use super::kernels::{run_parallel_on, CrcRuns};
use super::{not_found, CheckedRead, ObjectStore, PutFrom, RangeRead, RecordType, StridedRead, WriteConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::MemoryKind;
use crate::runtime::MemoryRegion;

const SHARDS: usize = 16;

struct Entry {
    value: Arc<[u8]>,
    group_id: String,
    record_type: RecordType,
}

type Shard = RwLock<HashMap<String, Entry>>;

/// Concurrent in-memory [`ObjectStore`]. `Send + Sync`; clone the `Arc` you keep it in
/// to share it.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    /// Threads of one large batch ([`MemoryStore::set_max_threads`]).
    threads: super::kernels::ThreadLimit,
    /// False: behaves as a store that cannot list its keys
    /// ([`MemoryStore::without_listing`]).
    listing: bool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").field("objects", &self.len()).finish()
    }
}

impl MemoryStore {
    /// An empty store. It holds host bytes only: device memory reaches it through
    /// the weight store's device engine ([`crate::device`]), which stages it.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            threads: super::kernels::ThreadLimit::default(),
            listing: true,
        }
    }

    /// An empty store that cannot list its keys, as Mooncake Store: `supports_list`
    /// is false and `list` fails with [`ErrorKind::Unsupported`]; everything else is
    /// [`MemoryStore::new`]'s. For tests and single-process use of what the protocol
    /// does on such stores (the revision index, `protocol::revision_index`). Any
    /// thread, as the store itself.
    pub fn without_listing() -> Self {
        MemoryStore { listing: false, ..MemoryStore::new() }
    }

    /// Limits the threads one large strided read batch runs on to `n` (1 = the
    /// calling thread only; 0 = the default, [`super::io_threads`]). Takes effect for
    /// later calls; thread-safe.
    pub fn set_max_threads(&self, n: usize) {
        self.threads.set(n);
    }

    fn shard(&self, key: &str) -> &Shard {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    fn value(&self, key: &str) -> Option<Arc<[u8]>> {
        self.shard(key).read().get(key).map(|e| e.value.clone())
    }

    /// All keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> =
            self.shards.iter().flat_map(|s| s.read().keys().cloned().collect::<Vec<_>>()).collect();
        keys.sort();
        keys
    }

    /// Number of stored objects.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// True when no object is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The group id and record type of the write that stored `key`'s current value
    /// (`put`/`upsert`: `group_ids[0]`, or `""` when the list was empty;
    /// `batch_put_from`: `group_ids[i]`). `None` if absent.
    pub fn group_of(&self, key: &str) -> Option<(String, RecordType)> {
        self.shard(key).read().get(key).map(|e| (e.group_id.clone(), e.record_type))
    }

    /// Create-only insert of an already materialised value.
    fn insert_new(&self, key: &str, value: Arc<[u8]>, group_id: &str, record_type: RecordType) -> Result<()> {
        match self.shard(key).write().entry(key.to_owned()) {
            MapEntry::Occupied(_) => Err(already_exists(key)),
            MapEntry::Vacant(v) => {
                v.insert(Entry { value, group_id: group_id.to_owned(), record_type });
                Ok(())
            }
        }
    }

    /// One item of `batch_put_from`, after the pre-checks.
    unsafe fn put_from_one(&self, item: &PutFrom<'_>, group_id: &str, record_type: RecordType) -> Result<()> {
        // Cheap early refusal (the insert below is the authoritative check).
        if self.shard(item.key).read().contains_key(item.key) {
            return Err(already_exists(item.key));
        }
        let value: Arc<[u8]> = match item.source.kind {
            // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
            MemoryKind::Host => Arc::from(unsafe { host_bytes(&item.source, item.key) }?),
            MemoryKind::Device(_) => return Err(device_unsupported(item.key)),
        };
        self.insert_new(item.key, value, group_id, record_type)
    }

    /// One range; with `span`, also the CRC-32C of the bytes delivered (summed from
    /// the value as it is copied).
    unsafe fn read_one(&self, r: &RangeRead<'_>, span: Option<u64>) -> Result<CheckedRead> {
        if matches!(r.dest.kind, MemoryKind::Device(_)) {
            return Err(device_unsupported(r.key));
        }
        let value = self.value(r.key).ok_or_else(|| not_found(r.key))?;
        let (start, len) = check_range(r, value.len() as u64)?;
        let src = &value[start..start + len];
        let mut sums = span.map(CrcRuns::new);
        match r.dest.kind {
            MemoryKind::Host => {
                if len > 0 {
                    let dst = host_ptr_mut(&r.dest, r.key)?;
                    match &mut sums {
                        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above; `value` outlives `sums`.
                        Some(s) => unsafe {
                            s.copy(dst, src.as_ptr(), r.object_offset, len);
                            super::kernels::copy_fence();
                        },
                        // SAFETY: as above.
                        None => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) },
                    }
                }
            }
            MemoryKind::Device(_) => return Err(device_unsupported(r.key)),
        }
        Ok(CheckedRead { bytes: len as u64, crcs: sums.map(CrcRuns::finish) })
    }
}

impl MemoryStore {
    /// Reads a group of strided reads into one destination view (see
    /// [`super::kernels::dest_groups`]): each read is looked up and checked on its own (its
    /// own result), then the host reads that passed are copied merged by destination
    /// ([`super::kernels::copy_merged`]); device reads go one by one through the hook.
    /// With `span`, every item also returns the CRC-32C of what it delivered.
    unsafe fn read_group(&self, reads: &[StridedRead<'_>], span: Option<u64>) -> Vec<Result<CheckedRead>> {
        let mut results: Vec<Result<CheckedRead>> = Vec::with_capacity(reads.len());
        let mut values: Vec<Arc<[u8]>> = Vec::new();
        let mut merged: Vec<(usize, usize)> = Vec::new(); // (read index, value index)
        let mut base: *mut u8 = std::ptr::null_mut();
        for (i, r) in reads.iter().enumerate() {
            if r.dest.kind != MemoryKind::Host {
                // SAFETY: forwarded from this function's contract.
                results.push(unsafe { self.read_strided(r, span) });
                continue;
            }
            let checked = (|| {
                let value = self.value(r.key).ok_or_else(|| not_found(r.key))?;
                r.check_bounds(value.len() as u64)?;
                if r.total_bytes() > 0 {
                    base = host_ptr_mut(&r.dest, r.key)?;
                    merged.push((i, values.len()));
                    values.push(value);
                }
                Ok(CheckedRead { bytes: r.total_bytes(), crcs: span.map(|_| Vec::new()) })
            })();
            results.push(checked);
        }
        if !merged.is_empty() {
            let parts: Vec<super::kernels::MappedRead<'_, '_>> = merged
                .iter()
                .map(|&(i, v)| super::kernels::MappedRead { read: &reads[i], src: values[v].as_ptr(), src_origin: 0 })
                .collect();
            let mut sums: Option<Vec<CrcRuns>> = span.map(|s| merged.iter().map(|_| CrcRuns::new(s)).collect());
            // SAFETY: every part passed `check_bounds` against its value and the shared
            // destination view, which this function's caller guarantees valid and ours;
            // `values` outlive the sums.
            unsafe { super::kernels::copy_merged(base, &parts, sums.as_deref_mut()) };
            for (runs, &(i, _)) in sums.into_iter().flatten().zip(&merged) {
                if let Ok(c) = &mut results[i] {
                    c.crcs = Some(runs.finish());
                }
            }
        }
        results
    }

    unsafe fn read_strided(&self, r: &StridedRead<'_>, span: Option<u64>) -> Result<CheckedRead> {
        let value = self.value(r.key).ok_or_else(|| not_found(r.key))?;
        r.check_bounds(value.len() as u64)?;
        let mut sums = span.map(CrcRuns::new);
        match r.dest.kind {
            MemoryKind::Host => {
                if r.total_bytes() > 0 {
                    let base = host_ptr_mut(&r.dest, r.key)?;
                    r.for_each_segment(|s, d, n| {
                        // Bounds were checked for the whole region above.
                        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above; `value` outlives `sums`.
                        unsafe {
                            let (dst, src) = (base.add(d as usize), value.as_ptr().add(s as usize));
                            match &mut sums {
                                Some(sums) => sums.copy(dst, src, s, n as usize),
                                None => super::kernels::copy_for_restore(dst, src, n as usize),
                            }
                        };
                        Ok(())
                    })?;
                    super::kernels::copy_fence();
                }
            }
            MemoryKind::Device(_) => return Err(device_unsupported(r.key)),
        }
        Ok(CheckedRead { bytes: r.total_bytes(), crcs: sums.map(CrcRuns::finish) })
    }

    unsafe fn strided(&self, reads: &[StridedRead<'_>], span: Option<u64>) -> Vec<Result<CheckedRead>> {
        let bytes: u64 = reads.iter().map(|r| r.total_bytes()).sum();
        let groups = super::kernels::dest_groups(reads);
        let mut results: Vec<Result<CheckedRead>> = (0..reads.len()).map(|_| Ok(CheckedRead::default())).collect();
        // SAFETY: this function's caller guarantees every destination region valid and exclusively ours for the call (its `# Safety`), which is `read_group`'s contract.
        let done = run_parallel_on((0..groups.len()).collect(), bytes, self.threads.get(), |g, _: &mut ()| unsafe {
            self.read_group(&reads[groups[g].clone()], span)
        });
        for (g, rs) in done {
            for (i, r) in groups[g].clone().zip(rs) {
                results[i] = r;
            }
        }
        results
    }
}

impl ObjectStore for MemoryStore {
    fn supports_list(&self) -> bool {
        self.listing
    }

    fn list(&self, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<()> {
        if !self.listing {
            return Err(Error::new(ErrorKind::Unsupported, "this store cannot list its keys"));
        }
        for shard in self.shards.iter() {
            // Copied out first: `visit` never runs under a shard lock.
            let found: Vec<(String, u64)> = shard
                .read()
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, e)| (k.clone(), e.value.len() as u64))
                .collect();
            for (k, n) in found {
                if !visit(&k, n) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn object_size(&self, key: &str) -> Result<u64> {
        self.value(key).map(|v| v.len() as u64).ok_or_else(|| not_found(key))
    }

    fn cost(&self) -> super::StoreCost {
        super::StoreCost::LOCAL
    }

    fn supports_strided_reads(&self) -> bool {
        true
    }

    unsafe fn get_into_strided(&self, reads: &[StridedRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.strided(reads, None) }.into_iter().map(|r| r.map(|c| c.bytes)).collect()
    }

    /// Sums the source bytes as the copy kernels copy them.
    unsafe fn get_into_strided_checked(&self, reads: &[StridedRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.strided(reads, Some(crc_span)) }
    }

    fn put(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        if self.shard(key).read().contains_key(key) {
            return Err(already_exists(key));
        }
        self.insert_new(key, Arc::from(value), first_group(config), config.record_type)
    }

    fn upsert(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        let entry = Entry {
            value: Arc::from(value),
            group_id: first_group(config).to_owned(),
            record_type: config.record_type,
        };
        // Drop the replaced value outside the lock.
        let old = self.shard(key).write().insert(key.to_owned(), entry);
        drop(old);
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.value(key).map(|v| v.to_vec()).ok_or_else(|| not_found(key))
    }

    fn get_limited(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let v = self.value(key).ok_or_else(|| not_found(key))?;
        if v.len() as u64 > max_bytes {
            return Err(super::too_large(key, v.len() as u64, max_bytes));
        }
        Ok(v.to_vec())
    }

    fn exists(&self, key: &str) -> Result<bool> {
        Ok(self.shard(key).read().contains_key(key))
    }

    fn remove(&self, key: &str) -> Result<()> {
        let old = self.shard(key).write().remove(key);
        drop(old);
        Ok(())
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
        let checked = precheck_put_from(items, config);
        items
            .iter()
            .zip(checked)
            // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
            .map(|(item, c)| c.and_then(|gid| unsafe { self.put_from_one(item, gid, config.record_type) }))
            .collect()
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        ranges.iter().map(|r| unsafe { self.read_one(r, None) }.map(|c| c.bytes)).collect()
    }

    unsafe fn get_into_ranges_checked(&self, ranges: &[RangeRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: forwarded from this function's contract.
        ranges.iter().map(|r| unsafe { self.read_one(r, Some(crc_span)) }).collect()
    }
}

// ---- helpers shared with the directory backend -------------------------------------

/// `put`'s group id: the first entry, or `""`.
pub(crate) fn first_group<'a>(config: &WriteConfig<'a>) -> &'a str {
    config.group_ids.first().map(String::as_str).unwrap_or("")
}

pub(crate) fn already_exists(key: &str) -> Error {
    Error::new(ErrorKind::AlreadyExists, format!("object already exists: {key}"))
}

pub(crate) fn device_unsupported(key: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("device memory for {key}: this store holds host bytes only (give the weight store a device engine)"),
    )
}

/// Per-item checks done before any I/O of a `batch_put_from`: the group id list has
/// one entry per item, and no source is device memory. Returns each item's group id.
pub(crate) fn precheck_put_from<'a>(items: &[PutFrom<'_>], config: &WriteConfig<'a>) -> Vec<Result<&'a str>> {
    let count_ok = config.group_ids.len() == items.len();
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            if !count_ok {
                return Err(Error::invalid(format!(
                    "batch_put_from: {} group ids for {} keys (item {})",
                    config.group_ids.len(),
                    items.len(),
                    item.key
                )));
            }
            if matches!(item.source.kind, MemoryKind::Device(_)) {
                return Err(device_unsupported(item.key));
            }
            region_len(&item.source, item.key)?;
            Ok(config.group_ids[i].as_str())
        })
        .collect()
}

/// The region's length as `usize` (≤ `isize::MAX`, address + len without overflow).
pub(crate) fn region_len(region: &MemoryRegion, key: &str) -> Result<usize> {
    let len = usize::try_from(region.len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or_else(|| Error::invalid(format!("memory region for {key} is too large")))?;
    if len > 0 && (region.address == 0 || region.address.checked_add(region.len).is_none()) {
        return Err(Error::invalid(format!("memory region for {key} has an invalid address")));
    }
    Ok(len)
}

/// The bytes of a host region.
///
/// # Safety
/// The region must be valid for reads of `len` bytes for `'a`.
pub(crate) unsafe fn host_bytes<'a>(region: &MemoryRegion, key: &str) -> Result<&'a [u8]> {
    let len = region_len(region, key)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
    Ok(unsafe { std::slice::from_raw_parts(region.address as usize as *const u8, len) })
}

/// The first byte of a host destination region (checked like [`region_len`]).
pub(crate) fn host_ptr_mut(region: &MemoryRegion, key: &str) -> Result<*mut u8> {
    region_len(region, key)?;
    Ok(region.address as usize as *mut u8)
}

/// Checks that `[object_offset, object_offset + dest.len)` lies inside an object of
/// `size` bytes; returns `(offset, len)` as `usize`.
pub(crate) fn check_range(r: &RangeRead<'_>, size: u64) -> Result<(usize, usize)> {
    let len = region_len(&r.dest, r.key)?;
    match r.object_offset.checked_add(r.dest.len) {
        Some(end) if end <= size => Ok((r.object_offset as usize, len)),
        _ => Err(Error::new(
            ErrorKind::Integrity,
            format!("range [{}, +{}) is beyond the end of {} ({} bytes)", r.object_offset, r.dest.len, r.key, size),
        )),
    }
}
