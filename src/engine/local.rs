//! The embedded engine: moves bytes by memcpy between memory registered in one
//! process (tests, examples, and same-host resharding such as a TP change inside
//! one server). Endpoints name the peer but do not separate memory: every region
//! registered with one `LocalEngine` is reachable from every endpoint of it, so two
//! in-process "instances" share one engine (`Arc`).
//!
//! Both allocations of every range of a batch must lie inside registered regions;
//! a batch that violates this is refused before any byte moves (a known failure:
//! `FAILED_DRAINED` on the ticket path, -1 on the legacy path). Device memory needs
//! a [`DeviceEngine`] (for example [`crate::device::CudaEngine`]); without one,
//! registering device memory is refused, so no transfer can touch it. With one, the
//! device segments of a batch go to it as one batch per direction and device,
//! coalesced into 2-D copies ([`crate::device::coalesce`]), never touched by the host. READ and WRITE copy the same
//! way (source -> target): they differ only in which side a networked engine calls
//! local.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use super::{CompletionStatus, EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket};
use crate::copy::{copy_fence, copy_streaming};
use crate::device::{coalesce_into, Batches, CopyDirection, CopyRange, DeviceEngine};
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

/// Engine code for a batch that touches unregistered memory or fails a device copy.
pub const LOCAL_TRANSFER_FAILED: i32 = -1;
/// Engine code for a refused registration (overlap, device memory without a device engine).
pub const LOCAL_REGISTRATION_REFUSED: i32 = -2;
/// Engine code for unregistering an address that is not registered.
pub const LOCAL_NOT_REGISTERED: i32 = -3;

/// The embedded in-process engine. Thread-safe; batches run on the caller's
/// thread.
pub struct LocalEngine {
    identity: u64,
    /// base -> (length, kind)
    regions: RwLock<BTreeMap<u64, (u64, MemoryKind)>>,
    device: Option<Arc<dyn DeviceEngine>>,
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
            .field("device", &self.device.as_ref().map(|d| d.name()))
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
            device: None,
            threads: 1,
            parallel_min_bytes: PARALLEL_MIN_BYTES,
        }
    }

    /// An engine that reaches device memory through `device` (device sources and
    /// targets may then be registered; their bytes move only through it).
    pub fn with_device_engine(device: Arc<dyn DeviceEngine>) -> Self {
        LocalEngine { device: Some(device), ..Self::new() }
    }

    /// An engine that copies host batches of at least `min_batch_bytes` (0: 4 MiB)
    /// with up to `threads` scoped threads, each writing its own slice of the target
    /// addresses (cut where no segment straddles; every thread copies in batch order,
    /// so no two threads ever write the same bytes and overlapping writes keep their
    /// order). Raise the executor's `max_batch_operations` to give the threads enough
    /// work.
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
        // Device segments: one batch per (direction, device), submitted together; the
        // segments of one range (one allocation pair) are coalesced together, never
        // with another range's (a copy never spans two allocations).
        let mut device: Batches<(CopyDirection, u32)> = Batches::default();
        let mut pending: Vec<CopyRange> = Vec::new();
        for (r, &(sk, dk)) in batch.ranges().iter().zip(&kinds) {
            let route = match (sk, dk) {
                (MemoryKind::Host, MemoryKind::Host) => None,
                (MemoryKind::Host, MemoryKind::Device(o)) => Some((CopyDirection::HostToDevice, o)),
                (MemoryKind::Device(o), MemoryKind::Host) => Some((CopyDirection::DeviceToHost, o)),
                (MemoryKind::Device(a), MemoryKind::Device(b)) if a == b => Some((CopyDirection::DeviceToDevice, a)),
                // Peer copies between two devices are not made by this engine.
                (MemoryKind::Device(_), MemoryKind::Device(_)) => return CompletionStatus::FailedDrained,
            };
            pending.clear();
            for i in 0..r.sizes.len() {
                let (src, dst, n) = (
                    r.source_base_address + r.source_offsets[i],
                    r.target_base_address + r.target_offsets[i],
                    r.sizes[i],
                );
                match route {
                    None => {
                        // SAFETY: both ranges lie inside regions registered with this
                        // engine, which `register_memory`'s contract keeps valid until
                        // unregistered; overlapping ranges take the memmove path.
                        unsafe { copy_segment(src, dst, n) };
                    }
                    Some(_) => pending.push(CopyRange { source: src, target: dst, len: n }),
                }
            }
            if let Some(key) = route {
                coalesce_into(device.of(key), &pending);
            }
        }
        copy_fence();
        if device.is_empty() {
            return CompletionStatus::Completed;
        }
        // Registration refuses device memory without an engine.
        let Some(engine) = &self.device else { return CompletionStatus::FailedDrained };
        let mut tickets = Vec::with_capacity(device.len());
        let mut ok = true;
        for (&(direction, ordinal), ops) in device.iter() {
            // SAFETY: every range lies inside registered regions of the kinds the
            // direction names (checked above), valid until unregistered, and we wait
            // for every ticket before returning.
            match unsafe { engine.submit(ordinal, direction, ops) } {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    log::warn!("local engine: device copy failed: {}", e.message());
                    ok = false;
                    break;
                }
            }
        }
        for t in tickets {
            if let Err(e) = engine.wait(t) {
                log::warn!("local engine: device copy failed: {}", e.message());
                ok = false;
            }
        }
        if ok {
            CompletionStatus::Completed
        } else {
            CompletionStatus::FailedDrained
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

/// Copies a host batch with up to `threads` scoped threads. The target address space
/// is cut into slices at addresses that no segment straddles ([`slice_cuts`]); each
/// thread copies the segments that start in its slice, in batch order. So no two
/// threads ever write the same byte (a segment lies wholly in one slice, and segments
/// that share a byte share its slice), and writes that may touch the same bytes (tied
/// aliases) keep their batch order. Every thread scans the whole batch (a few ns per
/// segment) and copies only its own.
fn copy_parallel(batch: &TransferBatch, threads: usize) -> CompletionStatus {
    let cuts = slice_cuts(batch, threads);
    let ranges = batch.ranges();
    let copy_slice = |k: usize| {
        let lo = if k == 0 { 0 } else { cuts[k - 1] };
        let hi = cuts.get(k).copied().unwrap_or(u64::MAX);
        for r in ranges {
            for i in 0..r.sizes.len() {
                let dst = r.target_base_address + r.target_offsets[i];
                if (lo..hi).contains(&dst) {
                    // SAFETY: the batch's ranges were checked against registered host
                    // regions by `run` (a validated range keeps every segment inside
                    // both allocations); no other thread writes this slice.
                    unsafe { copy_segment(r.source_base_address + r.source_offsets[i], dst, r.sizes[i]) };
                }
            }
        }
        // Each thread orders its own non-temporal stores.
        copy_fence();
    };
    let copy_slice = &copy_slice;
    std::thread::scope(|s| {
        for k in 1..=cuts.len() {
            s.spawn(move || copy_slice(k));
        }
        copy_slice(0);
    });
    CompletionStatus::Completed
}

/// Target addresses (ascending, at most `threads - 1`) that cut a batch into slices of
/// about equal bytes, none inside a segment (`target < cut < target + size` for no
/// segment). Each cut starts at the end of the segment where the running byte count
/// (batch order) passes its share, and moves to the end of any segment it falls
/// inside until a whole pass finds none; a cut still moving after four passes is
/// dropped (fewer slices). Pure; a few passes over the segments per cut.
fn slice_cuts(batch: &TransferBatch, threads: usize) -> Vec<u64> {
    let (total, ranges) = (batch.nbytes(), batch.ranges());
    let targets = || {
        ranges
            .iter()
            .flat_map(|r| r.target_offsets.iter().zip(&r.sizes).map(move |(&o, &n)| (r.target_base_address + o, n)))
    };
    let mut wanted = Vec::new();
    if threads >= 2 && total > 0 {
        let (mut seen, mut k) = (0u64, 1u64);
        for (t, n) in targets() {
            seen += n;
            while k < threads as u64 && u128::from(seen) * threads as u128 >= u128::from(total) * u128::from(k) {
                wanted.push(t + n);
                k += 1;
            }
        }
    }
    let mut cuts = Vec::with_capacity(wanted.len());
    for mut cut in wanted {
        for _ in 0..4 {
            let mut moved = false;
            for (t, n) in targets() {
                if t < cut && cut < t + n {
                    cut = t + n;
                    moved = true;
                }
            }
            if !moved {
                cuts.push(cut);
                break;
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

impl TransferEngine for LocalEngine {
    fn identity(&self) -> Result<u64, String> {
        Ok(self.identity)
    }

    fn device_engine(&self) -> Option<Arc<dyn DeviceEngine>> {
        self.device.clone()
    }

    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        let regions = self.regions.read();
        Some(regions.iter().map(|(&address, &(len, kind))| MemoryRegion { address, len, kind }).collect())
    }

    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        if region.address == 0 || region.len == 0 || region.address.checked_add(region.len).is_none() {
            return Ok(LOCAL_REGISTRATION_REFUSED);
        }
        if region.kind != MemoryKind::Host && self.device.is_none() {
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

#[cfg(test)]
mod tests {
    use super::{copy_parallel, slice_cuts, CompletionStatus};
    use crate::engine::Direction;
    use crate::engine::{TransferBatch, TransferBatchRange};

    fn batch(src: &[u8], dst: &mut [u8], segments: &[(u64, u64, u64)]) -> TransferBatch {
        let range = TransferBatchRange {
            source_base_address: src.as_ptr() as u64,
            source_capacity: src.len() as u64,
            target_base_address: dst.as_mut_ptr() as u64,
            target_capacity: dst.len() as u64,
            source_offsets: segments.iter().map(|s| s.0).collect(),
            target_offsets: segments.iter().map(|s| s.1).collect(),
            sizes: segments.iter().map(|s| s.2).collect(),
        };
        TransferBatch::from_ranges("peer", Direction::Write, vec![range]).unwrap()
    }

    /// Cuts fall where no segment is cut, split the bytes about evenly, and move past
    /// overlapping segments; a batch whose segments all overlap gets none.
    #[test]
    fn slice_cuts_never_fall_inside_a_segment() {
        let (src, mut dst) = (vec![0u8; 4096], vec![0u8; 4096]);
        let base = dst.as_ptr() as u64;
        // Eight 100-byte segments in a row: one cut, after the fourth.
        let row: Vec<_> = (0..8).map(|i| (i * 100, i * 100, 100)).collect();
        assert_eq!(slice_cuts(&batch(&src, &mut dst, &row), 2), [base + 400]);
        assert_eq!(slice_cuts(&batch(&src, &mut dst, &row), 4), [base + 200, base + 400, base + 600]);
        assert!(slice_cuts(&batch(&src, &mut dst, &row), 1).is_empty());
        // Interleaved halves (two sources per target row, batch order by source):
        // the byte midpoint of batch order is cut where no segment lies across it.
        let interleaved: Vec<_> =
            (0..4).map(|i| (i * 50, i * 100, 50)).chain((0..4).map(|i| (200 + i * 50, i * 100 + 50, 50))).collect();
        let cuts = slice_cuts(&batch(&src, &mut dst, &interleaved), 2);
        assert_eq!(cuts.len(), 1);
        assert!(interleaved.iter().all(|&(_, t, n)| !(base + t < cuts[0] && cuts[0] < base + t + n)));
        // Segments lying across the wanted cut (800) move it to their ends, one after
        // the other (1000, then 1300).
        let across = [(0, 0, 400), (400, 400, 400), (500, 700, 300), (0, 900, 400)];
        assert_eq!(slice_cuts(&batch(&src, &mut dst, &across), 2), [base + 1300]);
        // Every segment writes the same bytes: nothing can be cut.
        let same = [(0, 0, 500), (500, 0, 500), (1000, 0, 500)];
        assert!(slice_cuts(&batch(&src, &mut dst, &same), 2).iter().all(|&c| c <= base || c >= base + 500));
    }

    /// The threaded copy writes every byte a one-thread copy writes, including tied
    /// aliases (overlapping writes, the last in batch order wins), at 1-4 threads.
    #[test]
    fn threaded_copies_write_what_one_thread_writes() {
        let src: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8).collect();
        let mut segments = Vec::new();
        // Short rows interleaved from two halves of the source, then overlapping rewrites.
        for i in 0..200u64 {
            segments.push((i * 96, i * 192, 96));
            segments.push((30_000 + i * 96, i * 192 + 96, 96));
        }
        segments.extend([(50_000, 1000, 5000), (60_000, 3000, 300), (100, 38_000, 20_000), (7, 38_100, 64)]);
        let expected = {
            let mut d = vec![0u8; 65_536];
            for &(s, t, n) in &segments {
                d[t as usize..(t + n) as usize].copy_from_slice(&src[s as usize..(s + n) as usize]);
            }
            d
        };
        for threads in 1..=4 {
            let mut dst = vec![0u8; 65_536];
            let b = batch(&src, &mut dst, &segments);
            assert!(matches!(copy_parallel(&b, threads), CompletionStatus::Completed));
            assert_eq!(dst, expected, "{threads} threads");
        }
    }
}
