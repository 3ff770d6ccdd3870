//! Device memory in snapshots and restores: the weight store's device engine
//! ([`crate::device::DeviceEngine`]) stages device bytes in host buffers, so that the
//! store only ever sees host memory.
//!
//! - Restore ([`restore`]): the device targets are read window by window (up to
//!   [`WINDOW_BYTES`] of target fragments each) into a host mirror of each target,
//!   by the same read paths as host targets; the window is verified against the
//!   integrity record (when the restore is verified); only then do its written
//!   spans go to the device, one copy per contiguous span (a fully written target is
//!   one copy). While a window's copies run, the next window is read. A corrupt block
//!   never reaches the device: the window fails before its copies are queued.
//! - Snapshot ([`stage_sources`]): device sources are copied into host staging
//!   buffers window by window (one batch per window), and the window's payloads and
//!   block checksums are written from the staged bytes (device memory is read once).

use super::integrity::{Delivered, Verifier};
use super::load::{read_regions, verify_reads, LoadOptions, Tally};
use super::state::WeightStore;
use crate::device::{coalesce, CopyDirection, CopyRange, CopyTicket, DeviceEngine, StagingBuffer};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::bound_load::LoadPlan;
use crate::runtime::{MemoryKind, MemoryRegion, RuntimeFragment};
use std::collections::{BTreeMap, HashMap};

/// Target (or source) bytes staged per window: the host memory a device restore or
/// snapshot holds at once is at most two windows (or two fragments, when one
/// fragment is larger).
pub const WINDOW_BYTES: u64 = 64 << 20;

/// Mirrors are placed at multiples of this inside a window's buffer.
const MIRROR_ALIGN: u64 = 256;

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

/// How a window's reads are verified: the restore's verifier (none: unverified),
/// the objects' sizes and how errors name an object.
pub(super) struct WindowCheck<'a> {
    pub(super) verifier: Option<&'a Verifier>,
    pub(super) object_sizes: &'a BTreeMap<&'a str, u64>,
    pub(super) name: &'a dyn Fn(&str) -> String,
}

/// The byte spans (`[start, end)`, relative to the target) that the regions `list`
/// of one target write, merged and sorted. A target whose regions' bytes add up to
/// its size is written whole (one span: the regions of one target never overlap).
fn written_spans(plan: &LoadPlan, list: &[usize], max_segments: u64) -> Result<Vec<(u64, u64)>> {
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
struct InFlight {
    tickets: Vec<CopyTicket>,
    _buffer: StagingBuffer,
}

impl InFlight {
    fn wait(self, engine: &dyn DeviceEngine) -> Result<()> {
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

/// Restores the device targets `on_device` (runtime id -> regions) through the
/// weight store's device engine (see the module documentation). Statistics go to
/// `stats` as for host targets.
///
/// # Safety
/// Every target of `on_device` is device memory of its ordinal, valid for writes and
/// not accessed by anyone else for the duration of the call.
pub(super) unsafe fn restore(
    ws: &WeightStore,
    plan: &LoadPlan,
    on_device: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    check: &WindowCheck<'_>,
) -> Result<()> {
    let engine = ws.device.as_deref().ok_or_else(|| Error::new(ErrorKind::Unsupported, "no device engine"))?;
    let mut in_flight: Option<InFlight> = None;
    // SAFETY: forwarded from this function's contract.
    let result = unsafe { restore_windows(ws, engine, plan, on_device, options, stats, check, &mut in_flight) };
    match in_flight.take() {
        Some(f) => {
            let waited = f.wait(engine);
            result.and(waited)
        }
        None => result,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn restore_windows(
    ws: &WeightStore,
    engine: &dyn DeviceEngine,
    plan: &LoadPlan,
    on_device: &BTreeMap<&str, Vec<usize>>,
    options: &LoadOptions,
    stats: &mut Tally<'_>,
    check: &WindowCheck<'_>,
    in_flight: &mut Option<InFlight>,
) -> Result<()> {
    let list: Vec<(&str, &Vec<usize>)> = on_device.iter().map(|(k, v)| (*k, v)).collect();
    let mirror_len = |l: &Vec<usize>| plan.target_fragment(l[0]).nbytes().div_ceil(MIRROR_ALIGN) * MIRROR_ALIGN;
    let mut k = 0;
    while k < list.len() {
        let start = k;
        let mut size = 0u64;
        while k < list.len() && (k == start || size + mirror_len(list[k].1) <= WINDOW_BYTES) {
            size += mirror_len(list[k].1);
            k += 1;
        }
        let window = &list[start..k];
        let buffer = engine.staging(size)?;
        let mut mirrors: HashMap<&str, u64> = HashMap::with_capacity(window.len());
        let mut off = 0;
        for (id, l) in window {
            mirrors.insert(id, buffer.address() + off);
            off += mirror_len(l);
        }
        // Read the window into its mirrors, registered with the store for the reads.
        let region = MemoryRegion { address: buffer.address(), len: buffer.len(), kind: MemoryKind::Host };
        ws.store.register_buffer(region)?;
        let by: BTreeMap<&str, Vec<usize>> = window.iter().map(|(id, l)| (*id, (*l).clone())).collect();
        if check.verifier.is_some() {
            stats.delivered = Some(Delivered::default());
        }
        // SAFETY: the mirrors lie in `buffer` (host memory owned here, sized for every
        // mirror); the reads write only inside each target's `nbytes`.
        let read = unsafe { read_regions(ws, plan, &by, options, stats, Some(&mirrors)) };
        let read = verify_reads(ws, read, check.verifier, check.object_sizes, check.name, options, stats);
        let _ = ws.store.unregister_buffer(region.address);
        read?;
        // The previous window's copies had this window's reads to run; its buffer is
        // free once they are done.
        if let Some(f) = in_flight.take() {
            f.wait(engine)?;
        }
        // The written spans of every target, one batch per device ordinal.
        let mut batches: Vec<(u32, Vec<CopyRange>)> = Vec::new();
        for (id, l) in window {
            let t = plan.target_fragment(l[0]);
            let MemoryKind::Device(ordinal) = t.memory() else {
                return Err(Error::invalid("a host target was staged for the device"));
            };
            let mirror = mirrors[id];
            let ranges: Vec<CopyRange> = written_spans(plan, l, options.max_region_segments)?
                .into_iter()
                .map(|(a, b)| CopyRange { source: mirror + a, target: t.address() + a, len: b - a })
                .collect();
            match batches.iter_mut().find(|(o, _)| *o == ordinal) {
                Some((_, v)) => v.extend(ranges),
                None => batches.push((ordinal, ranges)),
            }
        }
        let mut flight = InFlight { tickets: Vec::with_capacity(batches.len()), _buffer: buffer };
        for (ordinal, ranges) in &batches {
            let ops = coalesce(ranges);
            // SAFETY: sources are the mirrors (host, owned by `flight` until waited);
            // targets are the caller's device targets (this function's contract).
            match unsafe { engine.submit(*ordinal, CopyDirection::HostToDevice, &ops) } {
                Ok(t) => flight.tickets.push(t),
                Err(e) => {
                    let _ = flight.wait(engine);
                    return Err(e.context("copy of restored bytes to the device: "));
                }
            }
        }
        *in_flight = Some(flight);
    }
    Ok(())
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
        let mut batches: Vec<(u32, Vec<CopyRange>)> = Vec::new();
        let mut off = 0;
        for f in &frags[start..k] {
            match f.memory() {
                MemoryKind::Host => window.push(f.clone()),
                MemoryKind::Device(ordinal) => {
                    let at = buffer.address() + off;
                    off += staged_len(f);
                    let range = CopyRange { source: f.address(), target: at, len: f.nbytes() };
                    match batches.iter_mut().find(|(o, _)| *o == ordinal) {
                        Some((_, v)) => v.push(range),
                        None => batches.push((ordinal, vec![range])),
                    }
                    window.push(f.staged_at(at));
                }
            }
        }
        for (ordinal, ranges) in &batches {
            // SAFETY: sources are the caller's device views (this function's contract),
            // targets lie in `buffer`, owned here until after the wait.
            unsafe { crate::device::copy_ranges(engine, *ordinal, CopyDirection::DeviceToHost, ranges) }
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
