//! The embedded engine: moves bytes by memcpy between memory registered in one
//! process (tests, examples, and same-host resharding such as a TP change inside
//! one server). Endpoints name the peer but do not separate memory: every region
//! registered with one `LocalEngine` is reachable from every endpoint of it, so two
//! in-process "instances" share one engine (`Arc`).
//!
//! Both allocations of every range of a batch must lie inside registered regions;
//! a batch that violates this is refused before any byte moves (a known failure:
//! `FAILED_DRAINED` on the ticket path, -1 on the legacy path). Device memory needs
//! a [`CopyHook`] (for example `cudaMemcpy`); without one, registering device
//! memory is refused, so no transfer can touch it. READ and WRITE copy the same
//! way (source -> target): they differ only in which side a networked engine calls
//! local.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use super::{CompletionStatus, EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket};
use crate::copy::{copy_fence, copy_streaming};
use crate::runtime::CopyHook;
use crate::runtime::MemoryKind;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Engine identities allocated by this process (never 0, never reused).
static NEXT_IDENTITY: AtomicU64 = AtomicU64::new(1);

/// Allocates a fresh engine identity for an engine without a native one.
pub fn allocate_identity() -> u64 {
    NEXT_IDENTITY.fetch_add(1, Ordering::Relaxed)
}

/// The pattern of this process's long streaming copies (what `LocalEngine` and the
/// embedded stores' restores use for host bytes): `sequential` or `four-page` once
/// decided, `measuring` while the first long copies still time both (or
/// `MWS_COPY_PATTERN=sequential|four-page` fixes it; see docs/ARCHITECTURE.md, copy
/// layer). For reports and benchmarks; no errors; thread-safe.
pub fn copy_pattern() -> &'static str {
    crate::copy::pattern_name()
}

/// Engine code for a batch that touches unregistered memory or fails a copy hook.
pub const LOCAL_TRANSFER_FAILED: i32 = -1;
/// Engine code for a refused registration (overlap, device memory without a hook).
pub const LOCAL_REGISTRATION_REFUSED: i32 = -2;
/// Engine code for unregistering an address that is not registered.
pub const LOCAL_NOT_REGISTERED: i32 = -3;

/// The embedded in-process engine. Thread-safe; batches run on the caller's
/// thread.
pub struct LocalEngine {
    identity: u64,
    /// base -> (length, kind)
    regions: RwLock<BTreeMap<u64, (u64, MemoryKind)>>,
    hook: Option<Arc<dyn CopyHook>>,
    /// Copy threads per large batch (1 = the caller's thread only).
    threads: usize,
    /// Smallest batch (bytes) copied by several threads.
    parallel_min_bytes: u64,
}

impl std::fmt::Debug for LocalEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEngine")
            .field("identity", &self.identity)
            .field("regions", &self.regions.read().len())
            .field("copy_hook", &self.hook.is_some())
            .finish()
    }
}

impl Default for LocalEngine {
    fn default() -> Self {
        Self::new()
    }
}

struct DoneTicket(CompletionStatus);

impl TransferTicket for DoneTicket {
    fn status(&self) -> EngineResult<CompletionStatus> {
        Ok(self.0.clone())
    }
    fn drain(&self, _timeout_ms: u64) -> EngineResult<CompletionStatus> {
        Ok(self.0.clone())
    }
}

impl LocalEngine {
    /// A host-memory engine with a fresh identity.
    pub fn new() -> Self {
        LocalEngine {
            identity: allocate_identity(),
            regions: RwLock::new(BTreeMap::new()),
            hook: None,
            threads: 1,
            parallel_min_bytes: PARALLEL_MIN_BYTES,
        }
    }

    /// An engine that reaches device memory through `hook`.
    pub fn with_copy_hook(hook: Arc<dyn CopyHook>) -> Self {
        LocalEngine { hook: Some(hook), ..Self::new() }
    }

    /// An engine that copies host batches of at least `min_batch_bytes` (0: 4 MiB)
    /// with up to `threads` scoped threads (ranges whose target spans overlap stay on
    /// one thread, in batch order, so no two threads ever write the same bytes). Raise
    /// the executor's `max_batch_operations` to give the threads enough work.
    pub fn with_threads(threads: usize, min_batch_bytes: u64) -> Self {
        let parallel_min_bytes = if min_batch_bytes == 0 { PARALLEL_MIN_BYTES } else { min_batch_bytes };
        LocalEngine { threads: threads.max(1), parallel_min_bytes, ..Self::new() }
    }

    /// Number of registered regions.
    pub fn registered_count(&self) -> usize {
        self.regions.read().len()
    }

    /// True when `[address, address + len)` lies inside one registered region;
    /// returns that region's kind.
    fn covered(map: &BTreeMap<u64, (u64, MemoryKind)>, address: u64, len: u64) -> Option<MemoryKind> {
        let (&base, &(size, kind)) = map.range(..=address).next_back()?;
        let end = address.checked_add(len)?;
        (end <= base + size).then_some(kind)
    }

    /// Runs a batch: checks every range first (both allocations, whole, inside
    /// registered regions: a validated range keeps every segment inside them), then
    /// copies. Returns the status.
    fn run(&self, batch: &TransferBatch) -> CompletionStatus {
        let map = self.regions.read();
        let mut kinds = Vec::with_capacity(batch.ranges().len());
        for r in batch.ranges() {
            match (
                Self::covered(&map, r.source_base_address, r.source_capacity),
                Self::covered(&map, r.target_base_address, r.target_capacity),
            ) {
                (Some(a), Some(b)) => kinds.push((a, b)),
                _ => return CompletionStatus::FailedDrained,
            }
        }
        let all_host = kinds.iter().all(|k| *k == (MemoryKind::Host, MemoryKind::Host));
        if self.threads > 1 && all_host && batch.nbytes() >= self.parallel_min_bytes {
            return copy_parallel(batch, self.threads);
        }
        for (r, &(sk, dk)) in batch.ranges().iter().zip(&kinds) {
            for i in 0..r.sizes.len() {
                let (src, dst, n) = (
                    r.source_base_address + r.source_offsets[i],
                    r.target_base_address + r.target_offsets[i],
                    r.sizes[i],
                );
                let ok = match (sk, dk) {
                    (MemoryKind::Host, MemoryKind::Host) => {
                        // SAFETY: both ranges lie inside regions registered with this
                        // engine, which `register_memory`'s contract keeps valid until
                        // unregistered; overlapping ranges take the memmove path.
                        unsafe { copy_segment(src, dst, n) };
                        true
                    }
                    (s, d) => self.copy_device(src, s, dst, d, n),
                };
                if !ok {
                    copy_fence();
                    return CompletionStatus::FailedDrained;
                }
            }
        }
        copy_fence();
        CompletionStatus::Completed
    }

    fn copy_device(&self, src: u64, sk: MemoryKind, dst: u64, dk: MemoryKind, len: u64) -> bool {
        let Some(hook) = &self.hook else { return false };
        let s = MemoryRegion { address: src, len, kind: sk };
        let d = MemoryRegion { address: dst, len, kind: dk };
        match (sk, dk) {
            (MemoryKind::Host, _) => {
                // SAFETY: registered host memory (see `run`).
                let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, len as usize) };
                hook.host_to_device(bytes, d).is_ok()
            }
            (_, MemoryKind::Host) => {
                // SAFETY: registered host memory (see `run`).
                let bytes = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len as usize) };
                hook.device_to_host(s, bytes).is_ok()
            }
            _ => {
                let mut staging = vec![0u8; len as usize];
                hook.device_to_host(s, &mut staging).is_ok() && hook.host_to_device(&staging, d).is_ok()
            }
        }
    }
}

/// Host batches at least this large may be copied by several threads.
const PARALLEL_MIN_BYTES: u64 = 4 << 20;

/// Copies one host segment: the streaming memcpy the embedded stores' restore path
/// uses ([`crate::copy`]: the target is written once and not read back soon), or a
/// memmove when source and target overlap. Callers issue [`copy_fence`] before they
/// report the batch complete.
///
/// # Safety
/// `[src, src + n)` is valid for reads and `[dst, dst + n)` for writes (registered
/// host memory).
#[inline]
unsafe fn copy_segment(src: u64, dst: u64, n: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        if src < dst + n && dst < src + n {
            std::ptr::copy(src as *const u8, dst as *mut u8, n as usize);
        } else {
            copy_streaming(dst as *mut u8, src as *const u8, n as usize);
        }
    }
}

/// Copies one host range (segments in order).
///
/// # Safety
/// Both allocations of `r` are registered host memory (valid for the copy).
unsafe fn copy_range(r: &crate::engine::TransferBatchRange) {
    for i in 0..r.sizes.len() {
        let (src, dst, n) =
            (r.source_base_address + r.source_offsets[i], r.target_base_address + r.target_offsets[i], r.sizes[i]);
        // SAFETY: the caller's contract; a validated range keeps every segment inside
        // both allocations.
        unsafe { copy_segment(src, dst, n) };
    }
}

/// Copies a host batch with up to `threads` scoped threads. Ranges are grouped by
/// overlapping target spans (`[base + min offset, base + max offset + size)`): a group
/// runs on one thread in batch order, so writes that may touch the same bytes (tied
/// aliases) keep their order and never race; groups are spread over the threads by
/// bytes.
fn copy_parallel(batch: &TransferBatch, threads: usize) -> CompletionStatus {
    let ranges = batch.ranges();
    let mut spans: Vec<(u64, u64, usize)> = ranges
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let lo = r.target_offsets.iter().copied().min().unwrap_or(0);
            let hi = r.target_offsets.iter().zip(&r.sizes).map(|(o, n)| o + n).max().unwrap_or(0);
            (r.target_base_address + lo, r.target_base_address + hi, i)
        })
        .collect();
    spans.sort_unstable();
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new(); // (bytes, range indices)
    let mut end = 0u64;
    for (lo, hi, i) in spans {
        let bytes: u64 = ranges[i].sizes.iter().sum();
        match groups.last_mut() {
            Some(g) if lo < end => {
                g.0 += bytes;
                g.1.push(i);
            }
            _ => groups.push((bytes, vec![i])),
        }
        end = end.max(hi);
    }
    for g in &mut groups {
        g.1.sort_unstable(); // batch order inside a group
    }
    // Greedy: largest groups first onto the least loaded thread.
    groups.sort_unstable_by_key(|g| std::cmp::Reverse(g.0));
    let mut buckets: Vec<(u64, Vec<usize>)> = vec![(0, Vec::new()); threads.min(groups.len()).max(1)];
    for (bytes, list) in groups {
        let b = buckets.iter_mut().min_by_key(|b| b.0).expect("at least one bucket");
        b.0 += bytes;
        b.1.extend(list);
    }
    std::thread::scope(|s| {
        for (_, list) in buckets.iter().skip(1) {
            s.spawn(move || {
                for &i in list {
                    // SAFETY: the batch's ranges were checked against registered host
                    // regions by `run`; groups never share target bytes.
                    unsafe { copy_range(&ranges[i]) };
                }
                // Each thread orders its own non-temporal stores.
                copy_fence();
            });
        }
        for &i in &buckets[0].1 {
            // SAFETY: as above.
            unsafe { copy_range(&ranges[i]) };
        }
        copy_fence();
    });
    CompletionStatus::Completed
}

impl TransferEngine for LocalEngine {
    fn identity(&self) -> Result<u64, String> {
        Ok(self.identity)
    }

    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        let regions = self.regions.read();
        Some(regions.iter().map(|(&address, &(len, kind))| MemoryRegion { address, len, kind }).collect())
    }

    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        if region.address == 0 || region.len == 0 || region.address.checked_add(region.len).is_none() {
            return Ok(LOCAL_REGISTRATION_REFUSED);
        }
        if region.kind != MemoryKind::Host && self.hook.is_none() {
            return Ok(LOCAL_REGISTRATION_REFUSED);
        }
        let mut map = self.regions.write();
        let end = region.address + region.len;
        let before = map.range(..end).next_back().map(|(&b, &(l, _))| (b, l));
        if before.is_some_and(|(b, l)| b + l > region.address) {
            return Ok(LOCAL_REGISTRATION_REFUSED);
        }
        map.insert(region.address, (region.len, region.kind));
        Ok(0)
    }

    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        Ok(if self.regions.write().remove(&address).is_some() { 0 } else { LOCAL_NOT_REGISTERED })
    }

    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        Ok(match self.run(batch) {
            CompletionStatus::Completed => 0,
            _ => LOCAL_TRANSFER_FAILED,
        })
    }

    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let status = self.run(batch);
        Some(Ok(Box::new(DoneTicket(status))))
    }
}
