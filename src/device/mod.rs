//! Device memory: the device copy engine every path uses to move bytes between host
//! and device memory (and between two device buffers), in batches.
//!
//! - [`DeviceEngine`]: the interface. A batch of 2-D copies ([`CopyOp`]) in one
//!   [`CopyDirection`] on one device is submitted asynchronously and waited on by
//!   ticket; the engine also hands out host staging buffers (pinned where the device
//!   has such memory) and counts its driver calls.
//! - [`coalesce`]: turns a list of byte ranges into the fewest 2-D copies (contiguous
//!   ranges merged, rows of constant width and constant pitches folded into one copy),
//!   so that a million short rows of a reshard cost a handful of driver calls.
//! - [`copy_ranges`]: coalesce, submit, wait.
//! - [`CudaEngine`] (`cuda.rs`): CUDA's driver API, opened at run time
//!   (`libcuda.so.1`); nothing at build time.
//! - [`FencedDevice`] (`fenced.rs`): a test device whose memory the host cannot
//!   touch (its pages are mapped `PROT_NONE`); only its own engine reaches it, through
//!   a second mapping of the same pages. Any host dereference of one of its addresses
//!   anywhere in the library crashes the process, which is what the tests rely on.
//!
//! Who calls it: the restore path (store -> host staging -> verified -> device), the
//! snapshot path (device -> staging -> checksums and store), the embedded transfer
//! engine (device <-> device, host <-> device). Stores only ever see host memory.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod cuda;
mod fenced;

pub use cuda::CudaEngine;
pub use fenced::FencedDevice;

use crate::error::{Error, ErrorKind, Result};
use std::fmt;

/// Which memory a batch copies from and to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CopyDirection {
    /// Host memory into device memory.
    HostToDevice = 1,
    /// Device memory into host memory.
    DeviceToHost = 2,
    /// Device memory into device memory (the same device).
    DeviceToDevice = 3,
}

impl CopyDirection {
    /// The direction from the two sides' kinds (`true` = device); `None` for host to host.
    pub fn between(source_device: bool, target_device: bool) -> Option<CopyDirection> {
        match (source_device, target_device) {
            (false, true) => Some(CopyDirection::HostToDevice),
            (true, false) => Some(CopyDirection::DeviceToHost),
            (true, true) => Some(CopyDirection::DeviceToDevice),
            (false, false) => None,
        }
    }

    /// Whether the source side is device memory.
    pub fn source_is_device(self) -> bool {
        matches!(self, CopyDirection::DeviceToHost | CopyDirection::DeviceToDevice)
    }

    /// Whether the target side is device memory.
    pub fn target_is_device(self) -> bool {
        matches!(self, CopyDirection::HostToDevice | CopyDirection::DeviceToDevice)
    }
}

/// One byte range to copy: `len` bytes from `source` to `target` (addresses in the
/// memory of the batch's direction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyRange {
    /// First source byte.
    pub source: u64,
    /// First target byte.
    pub target: u64,
    /// Bytes.
    pub len: u64,
}

/// One 2-D copy: `height` rows of `width` bytes; row `i` goes from
/// `source + i * source_pitch` to `target + i * target_pitch`. One row (`height ==
/// 1`) is a plain copy. Pitches are at least `width` when `height > 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct CopyOp {
    /// First source byte.
    pub source: u64,
    /// Source bytes from one row to the next.
    pub source_pitch: u64,
    /// First target byte.
    pub target: u64,
    /// Target bytes from one row to the next.
    pub target_pitch: u64,
    /// Bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
}

impl CopyOp {
    /// Bytes the copy moves (saturating).
    pub fn bytes(&self) -> u64 {
        self.width.saturating_mul(self.height)
    }

    /// One past the last source byte touched, or `None` on overflow.
    pub fn source_end(&self) -> Option<u64> {
        self.source.checked_add(self.height.checked_sub(1)?.checked_mul(self.source_pitch)?)?.checked_add(self.width)
    }

    /// One past the last target byte touched, or `None` on overflow.
    pub fn target_end(&self) -> Option<u64> {
        self.target.checked_add(self.height.checked_sub(1)?.checked_mul(self.target_pitch)?)?.checked_add(self.width)
    }

    /// Calls `f(source, target, len)` for every row.
    pub fn for_each_row(&self, mut f: impl FnMut(u64, u64, u64)) {
        for i in 0..self.height {
            f(self.source + i * self.source_pitch, self.target + i * self.target_pitch, self.width);
        }
    }
}

/// Largest pitch of a 2-D copy [`coalesce`] forms (CUDA's 2-D copies take pitches
/// below 2^31 on current devices); rows further apart stay separate copies.
pub const MAX_PITCH: u64 = (1 << 31) - 1;

/// The fewest [`CopyOp`]s that copy `ranges`, in order: a range that continues the
/// previous one in both memories extends it; a range of the previous copy's width
/// that starts one pitch further in both memories adds a row to it. Empty ranges are
/// skipped. The copies write exactly the bytes of `ranges`, in the same order per
/// target byte as long as the ranges' targets do not overlap (a batch's targets never
/// do).
///
/// A copy may span every range given, so all of `ranges` must lie, on each side, in
/// one allocation: CUDA refuses a copy across two allocations, even adjacent ones.
/// Coalesce each allocation pair's ranges on its own ([`coalesce_into`]).
pub fn coalesce(ranges: &[CopyRange]) -> Vec<CopyOp> {
    let mut out = Vec::new();
    coalesce_into(&mut out, ranges);
    out
}

/// As [`coalesce`], appending to `out`; the new copies never extend the copies
/// already in `out` (call it once per allocation pair).
pub fn coalesce_into(out: &mut Vec<CopyOp>, ranges: &[CopyRange]) {
    let first = out.len();
    for r in ranges {
        if r.len == 0 {
            continue;
        }
        if let Some(last) = out[first..].last_mut() {
            if last.height == 1
                && last.source.checked_add(last.width) == Some(r.source)
                && last.target.checked_add(last.width) == Some(r.target)
            {
                last.width += r.len;
                last.source_pitch = last.width;
                last.target_pitch = last.width;
                continue;
            }
            if r.len == last.width {
                if last.height == 1 {
                    if r.source > last.source && r.target > last.target {
                        let (sp, tp) = (r.source - last.source, r.target - last.target);
                        if sp >= last.width && tp >= last.width && sp <= MAX_PITCH && tp <= MAX_PITCH {
                            last.source_pitch = sp;
                            last.target_pitch = tp;
                            last.height = 2;
                            continue;
                        }
                    }
                } else if Some(r.source) == last.source.checked_add(last.height * last.source_pitch)
                    && Some(r.target) == last.target.checked_add(last.height * last.target_pitch)
                {
                    last.height += 1;
                    continue;
                }
            }
        }
        out.push(CopyOp {
            source: r.source,
            source_pitch: r.len,
            target: r.target,
            target_pitch: r.len,
            width: r.len,
            height: 1,
        });
    }
}

/// Copies grouped into one batch per key (a device, or a direction and a device): what
/// a caller then submits once per key, in the order the keys first appeared.
#[derive(Debug)]
pub struct Batches<K>(Vec<(K, Vec<CopyOp>)>);

impl<K> Default for Batches<K> {
    fn default() -> Self {
        Batches(Vec::new())
    }
}

impl<K: PartialEq> Batches<K> {
    /// The copies of `key`'s batch (an empty batch on first use).
    pub fn of(&mut self, key: K) -> &mut Vec<CopyOp> {
        let k = match self.0.iter().position(|(k, _)| *k == key) {
            Some(k) => k,
            None => {
                self.0.push((key, Vec::new()));
                self.0.len() - 1
            }
        };
        &mut self.0[k].1
    }

    /// True when no batch was started.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The batches, in the order their keys first appeared.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &[CopyOp])> {
        self.0.iter().map(|(k, v)| (k, v.as_slice()))
    }
}

/// A submitted batch, waited on with [`DeviceEngine::wait`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CopyTicket(pub u64);

/// A host buffer for staging device bytes: pinned (page-locked) memory where the
/// engine has it, else ordinary page-aligned host memory. Released (or returned to
/// its engine's pool) when dropped.
pub struct StagingBuffer {
    address: u64,
    len: u64,
    release: Option<Box<dyn FnOnce() + Send>>,
    _host: Vec<u64>,
}

impl fmt::Debug for StagingBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingBuffer").field("len", &self.len).field("pinned", &self.release.is_some()).finish()
    }
}

impl StagingBuffer {
    /// `len` bytes of ordinary host memory (8-byte aligned, zeroed).
    /// [`ErrorKind::LimitExceeded`] when it cannot be allocated.
    pub fn host(len: u64) -> Result<StagingBuffer> {
        let words = usize::try_from(len.div_ceil(8)).map_err(|_| staging_too_large(len))?;
        let mut v: Vec<u64> = Vec::new();
        v.try_reserve_exact(words).map_err(|_| staging_too_large(len))?;
        v.resize(words, 0);
        Ok(StagingBuffer { address: v.as_mut_ptr() as u64, len, release: None, _host: v })
    }

    /// A buffer the engine allocated: `len` bytes at `address`, valid until `release`
    /// runs (once, when the buffer is dropped).
    ///
    /// # Safety
    /// `[address, address + len)` is host memory valid for reads and writes, owned by
    /// this buffer until `release` runs.
    pub unsafe fn from_raw(address: u64, len: u64, release: Box<dyn FnOnce() + Send>) -> StagingBuffer {
        StagingBuffer { address, len, release: Some(release), _host: Vec::new() }
    }

    /// First byte.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the buffer owns `len` readable host bytes at `address` (constructors' contracts).
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len as usize) }
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

fn staging_too_large(len: u64) -> Error {
    Error::new(ErrorKind::LimitExceeded, format!("cannot allocate a host staging buffer of {len} bytes"))
}

/// Counters of a [`DeviceEngine`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Batches submitted.
    pub batches: u64,
    /// Copies ([`CopyOp`]) submitted.
    pub copies: u64,
    /// Driver calls made (copies, events, synchronizations, context switches,
    /// staging allocations): what a batch costs.
    pub driver_calls: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// Moves bytes between host and device memory in batches, asynchronously.
///
/// Ordering: the copies of one batch run in the order given on one queue (a CUDA
/// stream); batches submitted from one thread run in submission order; [`wait`]
/// returns once every copy of the batch is complete and visible to the host and to
/// later device work on the engine's queue. Implementations must be thread-safe and
/// must not panic.
///
/// [`wait`]: DeviceEngine::wait
pub trait DeviceEngine: Send + Sync + fmt::Debug {
    /// A short name for messages (`"cuda:0"`, `"fenced"`).
    fn name(&self) -> String;

    /// Starts the copies of `ops`, all in `direction`, on device `ordinal`. An empty
    /// batch is valid. Errors: [`ErrorKind::InvalidArgument`] for a copy the engine
    /// cannot make (an address outside the device's memory), [`ErrorKind::Io`] for
    /// a driver failure, [`ErrorKind::Unsupported`] for no driver. On error nothing is pending.
    ///
    /// # Safety
    /// Every source row is valid for reads and every target row for writes, in the
    /// memory `direction` names, until [`DeviceEngine::wait`] returns for the ticket;
    /// nobody else writes the targets meanwhile.
    unsafe fn submit(&self, ordinal: u32, direction: CopyDirection, ops: &[CopyOp]) -> Result<CopyTicket>;

    /// Blocks until the ticket's copies are complete; their error, if one failed.
    /// Every ticket must be waited on once.
    fn wait(&self, ticket: CopyTicket) -> Result<()>;

    /// A host buffer of at least `len` bytes for staging (pinned where the engine can;
    /// the default is ordinary host memory).
    fn staging(&self, len: u64) -> Result<StagingBuffer> {
        StagingBuffer::host(len)
    }

    /// The engine's counters so far.
    fn stats(&self) -> DeviceStats;
}

/// Copies `ranges` in `direction` on device `ordinal` through `engine` (coalesced
/// into 2-D copies, one batch, waited on). Returns the number of copies made.
///
/// Ranges in different allocations may be merged into one copy (nothing here knows
/// where allocations end), which a device refuses (CUDA does, even for adjacent
/// allocations). When the merged batch fails, it is copied again range by range
/// (every range written again from its unchanged source), so any set of ranges is
/// copied; give one call per allocation pair to keep the first, merged attempt.
///
/// # Safety
/// As [`DeviceEngine::submit`] for every range, until this function returns.
pub unsafe fn copy_ranges(
    engine: &dyn DeviceEngine,
    ordinal: u32,
    direction: CopyDirection,
    ranges: &[CopyRange],
) -> Result<usize> {
    let ops = coalesce(ranges);
    if ops.is_empty() {
        return Ok(0);
    }
    // SAFETY: the caller's contract, for every row of every copy (the copies write exactly the ranges).
    let merged = unsafe { engine.submit(ordinal, direction, &ops) }.and_then(|t| engine.wait(t));
    match merged {
        Ok(()) => Ok(ops.len()),
        Err(e) => {
            let single: Vec<CopyOp> = ranges
                .iter()
                .filter(|r| r.len > 0)
                .map(|r| CopyOp {
                    source: r.source,
                    source_pitch: r.len,
                    target: r.target,
                    target_pitch: r.len,
                    width: r.len,
                    height: 1,
                })
                .collect();
            if single.len() == ops.len() {
                return Err(e); // nothing was merged: the ranges themselves failed
            }
            // SAFETY: as above.
            let t = unsafe { engine.submit(ordinal, direction, &single) }?;
            engine.wait(t)?;
            Ok(single.len())
        }
    }
}

/// Checks `ops` for overflow and for pitches shorter than their rows (the engines'
/// shared argument check): [`ErrorKind::InvalidArgument`].
pub fn check_ops(ops: &[CopyOp]) -> Result<()> {
    for op in ops {
        if op.width == 0 || op.height == 0 {
            return Err(Error::invalid("device copy has an empty row or no rows"));
        }
        if op.height > 1 && (op.source_pitch < op.width || op.target_pitch < op.width) {
            return Err(Error::invalid("device copy has a pitch shorter than its rows"));
        }
        if op.source_end().is_none() || op.target_end().is_none() {
            return Err(Error::invalid("device copy overflows the address space"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(source: u64, target: u64, len: u64) -> CopyRange {
        CopyRange { source, target, len }
    }

    /// Every byte `ranges` write, as (target, source) pairs, sorted.
    fn bytes_of_ranges(ranges: &[CopyRange]) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> =
            ranges.iter().flat_map(|r| (0..r.len).map(move |i| (r.target + i, r.source + i))).collect();
        v.sort_unstable();
        v
    }

    fn bytes_of_ops(ops: &[CopyOp]) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for op in ops {
            op.for_each_row(|s, t, n| v.extend((0..n).map(|i| (t + i, s + i))));
        }
        v.sort_unstable();
        v
    }

    #[test]
    fn rows_of_a_tensor_parallel_split_become_one_copy() {
        // 1,000 rows of 64 bytes out of a 256-byte source row into a dense target.
        let ranges: Vec<CopyRange> = (0..1000).map(|i| r(1_000 + i * 256, 50_000 + i * 64, 64)).collect();
        let ops = coalesce(&ranges);
        assert_eq!(ops.len(), 1, "{ops:?}");
        assert_eq!(
            ops[0],
            CopyOp { source: 1_000, source_pitch: 256, target: 50_000, target_pitch: 64, width: 64, height: 1000 }
        );
        assert_eq!(bytes_of_ops(&ops), bytes_of_ranges(&ranges));
    }

    #[test]
    fn contiguous_ranges_merge_and_irregular_ones_stay_apart() {
        let ranges = [r(0, 100, 10), r(10, 110, 5), r(40, 200, 7), r(60, 300, 3), r(0, 0, 0)];
        let ops = coalesce(&ranges);
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert_eq!((ops[0].width, ops[0].height), (15, 1));
        assert_eq!(bytes_of_ops(&ops), bytes_of_ranges(&ranges));
    }

    #[test]
    fn a_broken_progression_starts_a_new_copy() {
        let mut ranges: Vec<CopyRange> = (0..10).map(|i| r(i * 100, i * 50, 20)).collect();
        ranges.push(r(2_000, 3_000, 20)); // same width, off the progression
        ranges.extend((0..5).map(|i| r(5_000 + i * 30, 9_000 + i * 20, 20)));
        let ops = coalesce(&ranges);
        assert_eq!(ops.iter().map(|o| o.height).collect::<Vec<_>>(), vec![10, 2, 4], "{ops:?}");
        assert_eq!(bytes_of_ops(&ops), bytes_of_ranges(&ranges));
    }

    #[test]
    fn rows_closer_than_their_width_or_further_than_the_pitch_limit_stay_apart() {
        let overlapping = [r(0, 0, 16), r(8, 100, 16)];
        assert_eq!(coalesce(&overlapping).len(), 2);
        let far = [r(0, 0, 16), r(MAX_PITCH + 1, 16, 16)];
        assert_eq!(coalesce(&far).len(), 2);
        let backwards = [r(100, 100, 16), r(0, 0, 16)];
        assert_eq!(coalesce(&backwards).len(), 2);
    }

    #[test]
    fn pseudo_random_range_lists_copy_exactly_their_bytes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let n = (next() % 40) as usize;
            let mut ranges = Vec::new();
            let (mut s, mut t) = (next() % 1000, 0u64);
            for _ in 0..n {
                let len = 1 + next() % 8;
                ranges.push(r(s, t, len));
                s += len + next() % 3 * 4;
                t += len + next() % 2 * 8;
            }
            let ops = coalesce(&ranges);
            check_ops(&ops).unwrap();
            assert!(ops.len() <= ranges.len());
            assert_eq!(bytes_of_ops(&ops), bytes_of_ranges(&ranges));
        }
    }

    #[test]
    fn coalesce_into_never_extends_the_copies_of_another_allocation() {
        // Two adjacent allocations: contiguous ranges, and rows at one pitch across both.
        let mut ops = Vec::new();
        coalesce_into(&mut ops, &[r(0, 1000, 64)]);
        coalesce_into(&mut ops, &[r(64, 1064, 64)]);
        assert_eq!(ops.len(), 2);
        coalesce_into(&mut ops, &[r(200, 2000, 16), r(300, 2100, 16)]);
        coalesce_into(&mut ops, &[r(400, 2200, 16), r(500, 2300, 16)]);
        assert_eq!(ops.iter().map(|o| o.height).collect::<Vec<_>>(), vec![1, 1, 2, 2]);
    }

    #[test]
    fn check_ops_refuses_short_pitches_and_overflow() {
        let ok = CopyOp { source: 0, source_pitch: 8, target: 0, target_pitch: 8, width: 8, height: 2 };
        check_ops(&[ok]).unwrap();
        assert!(check_ops(&[CopyOp { source_pitch: 4, ..ok }]).is_err());
        assert!(check_ops(&[CopyOp { source: u64::MAX - 4, ..ok }]).is_err());
        assert!(check_ops(&[CopyOp { width: 0, ..ok }]).is_err());
    }
}
