//! Device memory in snapshots and restores: the weight store's device engine
//! ([`crate::device::DeviceEngine`]) stages device bytes in host buffers, so that the
//! store only ever sees host memory.
//!
//! - Restore (`load::restore_on_device`): the device targets are read window by window (up to
//!   [`WINDOW_BYTES`] of target fragments each) into a host mirror of each target,
//!   by the same read paths as host targets; the window is verified against the
//!   integrity record (when the restore is verified); only then do its written
//!   spans go to the device, one copy per contiguous span (a fully written target is
//!   one copy). While a window's copies run, the next window is read. A corrupt block
//!   never reaches the device: the window fails before its copies are queued.
//! - Snapshot ([`stage_sources`]): device sources are copied into host staging
//!   buffers window by window (one batch per window), and the window's payloads and
//!   block checksums are written from the staged bytes (device memory is read once).

use super::state::WeightStore;
use crate::device::{Batches, CopyDirection, CopyOp, CopyTicket, DeviceEngine, StagingBuffer};
use crate::error::Result;
use crate::plan::bound_load::LoadPlan;
use crate::runtime::{MemoryKind, MemoryRegion, RuntimeFragment};
use std::collections::BTreeMap;

/// Target (or source) bytes staged per window: the host memory a device restore or
/// snapshot holds at once is at most two windows (or two fragments, when one
/// fragment is larger).
pub const WINDOW_BYTES: u64 = 64 << 20;

/// Mirrors are placed at multiples of this inside a window's buffer.
pub(super) const MIRROR_ALIGN: u64 = 256;

/// `by_target` split into (targets the store writes, device targets the engine
/// writes); without a device engine every target stays with the store.
pub(super) fn split_device_targets<'p>(
    ws: &WeightStore,
    plan: &LoadPlan,
    by_target: BTreeMap<&'p str, Vec<usize>>,
) -> (BTreeMap<&'p str, Vec<usize>>, BTreeMap<&'p str, Vec<usize>>) {
    if ws.device.is_none() {
        return (by_target, BTreeMap::new());
    }
    by_target.into_iter().partition(|(_, list)| plan.target_fragment(list[0]).memory() == MemoryKind::Host)
}

/// The byte spans (`[start, end)`, relative to the target) that the regions `list`
/// of one target write, merged and sorted. A target whose regions' bytes add up to
/// its size is written whole (one span: the regions of one target never overlap).
pub(super) fn written_spans(plan: &LoadPlan, list: &[usize], max_segments: u64) -> Result<Vec<(u64, u64)>> {
    let nbytes = plan.target_fragment(list[0]).nbytes();
    let total: u64 = list.iter().map(|&i| plan.regions()[i].total_bytes()).sum();
    if total == nbytes {
        return Ok(vec![(0, nbytes)]);
    }
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &i in list {
        plan.regions()[i].for_each_segment(max_segments, |_, to, n| spans.push((to, to + n)))?;
    }
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    Ok(merged)
}

/// A window's copies in flight: what to wait on, and the buffer they read.
pub(super) struct InFlight {
    pub(super) tickets: Vec<CopyTicket>,
    /// The staging buffer the copies read: freed only after they are waited on.
    pub(super) _buffer: StagingBuffer,
}

impl InFlight {
    pub(super) fn wait(self, engine: &dyn DeviceEngine) -> Result<()> {
        let mut first = Ok(());
        for t in self.tickets {
            let r = engine.wait(t);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Snapshot sources of device memory, staged: calls `write(ops, frags)` for
/// consecutive windows of `frags` (and the items of `ops` paired with them), device
/// fragments replaced by host copies of their bytes made through the weight store's
/// device engine (one batch per window), and returns the concatenated results.
/// Without device fragments (or without an engine) `write` runs once on everything.
///
/// # Safety
/// Every device fragment of `frags` is device memory valid for reads and unchanged
/// for the duration of the call.
pub(super) unsafe fn stage_sources<O: Copy, T>(
    ws: &WeightStore,
    ops: &[O],
    frags: &[RuntimeFragment],
    mut write: impl FnMut(&[O], &[RuntimeFragment]) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let engine = match ws.device.as_deref() {
        Some(e) if frags.iter().any(|f| f.memory() != MemoryKind::Host) => e,
        _ => return write(ops, frags),
    };
    let mut out = Vec::with_capacity(frags.len());
    let staged_len = |f: &RuntimeFragment| match f.memory() {
        MemoryKind::Host => 0,
        MemoryKind::Device(_) => f.nbytes().div_ceil(MIRROR_ALIGN) * MIRROR_ALIGN,
    };
    let mut k = 0;
    while k < frags.len() {
        let start = k;
        let mut size = 0u64;
        while k < frags.len() && (k == start || size + staged_len(&frags[k]) <= WINDOW_BYTES) {
            size += staged_len(&frags[k]);
            k += 1;
        }
        let buffer = engine.staging(size.max(1))?;
        let mut window: Vec<RuntimeFragment> = Vec::with_capacity(k - start);
        // One copy per fragment (never merged: fragments may be separate allocations).
        let mut batches: Batches<u32> = Batches::default();
        let mut off = 0;
        for f in &frags[start..k] {
            match f.memory() {
                MemoryKind::Host => window.push(f.clone()),
                MemoryKind::Device(ordinal) => {
                    let at = buffer.address() + off;
                    off += staged_len(f);
                    let op = CopyOp {
                        source: f.address(),
                        source_pitch: f.nbytes(),
                        target: at,
                        target_pitch: f.nbytes(),
                        width: f.nbytes(),
                        height: 1,
                    };
                    batches.of(ordinal).push(op);
                    window.push(f.staged_at(at));
                }
            }
        }
        for (ordinal, ops) in batches.iter() {
            // SAFETY: sources are the caller's device views (this function's contract),
            // targets lie in `buffer`, owned here until after the wait.
            unsafe { engine.submit(*ordinal, CopyDirection::DeviceToHost, ops) }
                .and_then(|t| engine.wait(t))
                .map_err(|e| e.context("copy of snapshot sources from the device: "))?;
        }
        let region = MemoryRegion { address: buffer.address(), len: buffer.len(), kind: MemoryKind::Host };
        ws.store.register_buffer(region)?;
        let written = write(&ops[start..k], &window);
        let _ = ws.store.unregister_buffer(region.address);
        out.extend(written?);
        drop(buffer);
    }
    Ok(out)
}
