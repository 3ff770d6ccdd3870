//! The bytes of a plan's operations on one side, read or written on the host whatever
//! memory holds them: host fragments in place, device fragments through a device
//! copy engine ([`crate::device::DeviceEngine`]), staged in host buffers. The content
//! checksums of verified steps and the delta steps' encode and apply walk operations
//! through here, so that no host code ever dereferences a device address.
//!
//! An operation's bytes are its segments in row-major order (the plan's segments,
//! consecutive ones merged where they are contiguous on both sides, [`segments`]):
//! the order the content checksums and the delta records follow on both sides.

use crate::device::{copy_ranges, CopyDirection, CopyRange, DeviceEngine};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::transfer_bind::{Side, TransferPlan};
use crate::runtime::MemoryKind;

/// Device bytes staged at once while they are only read (checksums): the host memory
/// a read holds is at most this (a larger segment is read in pieces).
pub const READ_WINDOW: u64 = 64 << 20;

/// Calls `f(address, len)` for every segment of operation `i` on `side`, in
/// row-major order: the plan's segments, consecutive ones merged where they are
/// contiguous on both sides (so both sides cut an operation alike, and a contiguous
/// operation is one segment). Addresses are the fragment's (host or device).
pub fn for_each_segment(plan: &TransferPlan, i: usize, side: Side, mut f: impl FnMut(u64, u64)) {
    let r = &plan.regions()[i];
    let base = plan.operation_fragment(i, side).1.address();
    let mut run: Option<(u64, u64, u64)> = None;
    let _ = r.for_each_segment(u64::MAX, |s, t, len| {
        run = match run {
            Some((s0, t0, n)) if s0 + n == s && t0 + n == t => Some((s0, t0, n + len)),
            Some((s0, t0, n)) => {
                f(base + if side == Side::Source { s0 } else { t0 }, n);
                Some((s, t, len))
            }
            None => Some((s, t, len)),
        };
    });
    if let Some((s0, t0, n)) = run {
        f(base + if side == Side::Source { s0 } else { t0 }, n);
    }
}

/// The segments of [`for_each_segment`] as a list.
pub fn segments(plan: &TransferPlan, i: usize, side: Side) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for_each_segment(plan, i, side, |a, n| out.push((a, n)));
    out
}

/// The memory of operation `i`'s fragment on `side`.
pub fn memory(plan: &TransferPlan, i: usize, side: Side) -> MemoryKind {
    plan.operation_fragment(i, side).1.memory()
}

/// `Ok` when every operation of `ops` on `side` can be read and written on the
/// host: host memory, or device memory with a device engine. Errors
/// (`Unsupported`): `<side> fragment <id> is device memory (<kind>): <what> needs a
/// device engine`.
pub fn check_reachable(
    plan: &TransferPlan,
    ops: &[u32],
    side: Side,
    device: Option<&dyn DeviceEngine>,
    what: &str,
) -> Result<()> {
    if device.is_some() {
        return Ok(());
    }
    for &i in ops {
        let f = plan.operation_fragment(i as usize, side).1;
        if f.memory() != MemoryKind::Host {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{} fragment {} is device memory ({:?}): {what} needs a device engine",
                    side.as_str(),
                    f.fragment_id(),
                    f.memory()
                ),
            ));
        }
    }
    Ok(())
}

/// The device engine of a device operation, or the refusal of [`check_reachable`].
fn engine_for<'a>(
    plan: &TransferPlan,
    i: usize,
    side: Side,
    device: Option<&'a dyn DeviceEngine>,
) -> Result<&'a dyn DeviceEngine> {
    check_reachable(plan, &[i as u32], side, device, "reading it on the host")?;
    device.ok_or_else(|| Error::new(ErrorKind::Unsupported, "device memory needs a device engine"))
}

/// Copies `ranges` (device addresses and lengths, in order) of device `ordinal`
/// into `host` back to back (`host.len()` is their total).
///
/// # Safety
/// The ranges are device memory of `ordinal` valid for reads.
pub unsafe fn gather(device: &dyn DeviceEngine, ordinal: u32, ranges: &[(u64, u64)], host: &mut [u8]) -> Result<()> {
    debug_assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), host.len() as u64);
    // SAFETY: the caller's contract for the device side; `host` is ours, writable,
    // and exactly as long as the ranges.
    unsafe { back_to_back(device, ordinal, CopyDirection::DeviceToHost, ranges, host.as_mut_ptr() as u64) }
}

/// Copies `host` (the bytes of `ranges` back to back) into the device `ranges` of
/// device `ordinal`.
///
/// # Safety
/// The ranges are device memory of `ordinal` valid for writes, written by no one
/// else during the call.
pub unsafe fn scatter(device: &dyn DeviceEngine, ordinal: u32, ranges: &[(u64, u64)], host: &[u8]) -> Result<()> {
    debug_assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), host.len() as u64);
    // SAFETY: the caller's contract for the device side; `host` is readable and as
    // long as the ranges.
    unsafe { back_to_back(device, ordinal, CopyDirection::HostToDevice, ranges, host.as_ptr() as u64) }
}

/// One batch between the device `ranges` and the host bytes at `host`, laid back to
/// back, in `direction` (device to host or host to device).
///
/// # Safety
/// As [`gather`] or [`scatter`], by direction.
unsafe fn back_to_back(
    device: &dyn DeviceEngine,
    ordinal: u32,
    direction: CopyDirection,
    ranges: &[(u64, u64)],
    host: u64,
) -> Result<()> {
    let mut at = host;
    let copies: Vec<CopyRange> = ranges
        .iter()
        .map(|&(a, n)| {
            let c = match direction {
                CopyDirection::DeviceToHost => CopyRange { source: a, target: at, len: n },
                _ => CopyRange { source: at, target: a, len: n },
            };
            at += n;
            c
        })
        .collect();
    // SAFETY: the caller's contract.
    unsafe { copy_ranges(device, ordinal, direction, &copies) }.map(|_| ())
}

/// Copies the bytes of operations `ops` on `side` back to back into `into` (as long
/// as their bytes): host segments copied, device ones gathered through `device`, one
/// batch per operation. Errors: device memory without a device engine
/// (`Unsupported`), the device engine's.
///
/// # Safety
/// The operations' fragments on `side` are valid for reads (of their memory kind)
/// at their planned addresses for the call.
pub unsafe fn copy_ops(
    plan: &TransferPlan,
    ops: &[u32],
    side: Side,
    device: Option<&dyn DeviceEngine>,
    into: &mut [u8],
) -> Result<()> {
    let mut at = 0usize;
    for &i in ops {
        let i = i as usize;
        let ranges = segments(plan, i, side);
        let n = ranges.iter().map(|r| r.1 as usize).sum::<usize>();
        let dst = &mut into[at..at + n];
        match memory(plan, i, side) {
            MemoryKind::Host => {
                let mut o = 0usize;
                for (a, len) in ranges {
                    // SAFETY: this function's contract: a host segment valid for reads
                    // (bound plans' regions are checked against the fragments' extents).
                    let src = unsafe { std::slice::from_raw_parts(a as usize as *const u8, len as usize) };
                    dst[o..o + len as usize].copy_from_slice(src);
                    o += len as usize;
                }
            }
            MemoryKind::Device(ordinal) => {
                let d = engine_for(plan, i, side, device)?;
                // SAFETY: this function's contract: device segments valid for reads.
                unsafe { gather(d, ordinal, &ranges, dst) }?;
            }
        }
        at += n;
    }
    Ok(())
}

/// Calls `f(bytes)` with the bytes of operation `i` on `side` in order, in pieces:
/// host segments in place, device segments staged through `device` at most
/// [`READ_WINDOW`] bytes at a time (into `scratch`). Errors: device memory without
/// a device engine (`Unsupported`), the device engine's.
///
/// # Safety
/// The operation's fragment on `side` is valid for reads (of its memory kind) at its
/// planned address for the call.
pub unsafe fn read_op(
    plan: &TransferPlan,
    i: usize,
    side: Side,
    device: Option<&dyn DeviceEngine>,
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(&[u8]),
) -> Result<()> {
    let ordinal = match memory(plan, i, side) {
        MemoryKind::Host => {
            for_each_segment(plan, i, side, |a, n| {
                // SAFETY: this function's contract: the segment lies in a host
                // fragment valid for reads (bound plans' regions are checked against
                // the fragments' extents).
                f(unsafe { std::slice::from_raw_parts(a as usize as *const u8, n as usize) })
            });
            return Ok(());
        }
        MemoryKind::Device(o) => o,
    };
    let device = engine_for(plan, i, side, device)?;
    let mut window: Vec<(u64, u64)> = Vec::new();
    let mut held = 0u64;
    let mut flush = |window: &mut Vec<(u64, u64)>, held: &mut u64| -> Result<()> {
        if window.is_empty() {
            return Ok(());
        }
        scratch.resize(*held as usize, 0);
        // SAFETY: this function's contract (the ranges are pieces of the fragment's segments).
        unsafe { gather(device, ordinal, window, scratch) }?;
        f(scratch);
        window.clear();
        *held = 0;
        Ok(())
    };
    let mut result = Ok(());
    for_each_segment(plan, i, side, |mut a, mut n| {
        while n > 0 && result.is_ok() {
            let take = n.min(READ_WINDOW - held);
            window.push((a, take));
            held += take;
            (a, n) = (a + take, n - take);
            if held == READ_WINDOW {
                result = flush(&mut window, &mut held);
            }
        }
    });
    result?;
    flush(&mut window, &mut held)
}
