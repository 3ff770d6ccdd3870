//! The one N-D planning core shared by the manifest -> placement load planner
//! ([`super::load`]) and the placement -> placement transfer planner
//! ([`super::transfer`]) (`load-path.md` §3.3–§3.5, `live-transfer.md` §1.2).
//!
//! The two planners differ only in their *sources*: stored fragments (each geometry
//! stored once) or the placement fragments of the chosen source DP replica. A
//! planner describes its sources as a flat list of [`SourceBox`]es and hands the core
//! an implementation of [`SourceGroups`], which returns, for one target fragment,
//! the index of the source boxes that may feed it. The core does the rest: candidate
//! lookup, intersection, planning limits, exact coverage, region derivation and the
//! region order. Pure: no I/O, no per-element work.

use super::region::{PlanningLimits, TransferRegion};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::model::{Placement, PlacementFragment};
use std::collections::BTreeSet;

/// One source box: a stored fragment or a source placement fragment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SourceBox<'a> {
    /// Box offset (global coordinates).
    pub offset: &'a [u64],
    /// Box extents.
    pub shape: &'a [u64],
    /// Byte size of the box.
    pub nbytes: u64,
    /// The id that orders regions of one target (stored `fragment_id` or
    /// `placement_fragment_id`).
    pub id: &'a str,
}

impl<'a> SourceBox<'a> {
    fn as_box(&self) -> BoxRef<'a> {
        BoxRef::new(self.offset, self.shape)
    }
}

/// Index of one group of source boxes (one tensor, or one tensor of one source DP
/// replica) on the dimension with the most distinct intervals (ties to the lowest).
#[derive(Debug)]
pub(crate) struct SourceIndex {
    dim: usize,
    max_extent: u64,
    /// (begin on `dim`, index into the source list), sorted.
    entries: Vec<(u64, u32)>,
}

impl SourceIndex {
    /// Indexes `members` (indices into `sources`, non-empty, equal rank).
    pub fn build(sources: &[SourceBox<'_>], members: &[u32]) -> Self {
        let ndim = members.first().map_or(0, |&i| sources[i as usize].offset.len());
        let mut dim = 0;
        let mut best = 0;
        for d in 0..ndim {
            let distinct: BTreeSet<(u64, u64)> = members
                .iter()
                .map(|&i| {
                    let s = &sources[i as usize];
                    (s.offset[d], s.shape[d])
                })
                .collect();
            if distinct.len() > best {
                best = distinct.len();
                dim = d;
            }
        }
        let mut entries: Vec<(u64, u32)> = if ndim == 0 {
            members.iter().map(|&i| (0, i)).collect()
        } else {
            members.iter().map(|&i| (sources[i as usize].offset[dim], i)).collect()
        };
        entries.sort_unstable();
        let max_extent =
            if ndim == 0 { 1 } else { members.iter().map(|&i| sources[i as usize].shape[dim]).max().unwrap_or(1) };
        SourceIndex { dim, max_extent, entries }
    }

    /// Sources whose interval on the index dimension can intersect `t`.
    fn candidates(&self, t: &PlacementFragment) -> &[(u64, u32)] {
        if t.global_offset().is_empty() {
            return &self.entries;
        }
        let begin = t.global_offset()[self.dim];
        let end = begin + t.local_shape()[self.dim];
        let lo_key = (begin + 1).saturating_sub(self.max_extent);
        let lo = self.entries.partition_point(|e| e.0 < lo_key);
        let hi = self.entries.partition_point(|e| e.0 < end);
        &self.entries[lo..hi.max(lo)]
    }
}

/// What a planner tells the core about its sources for one target fragment.
pub(crate) trait SourceGroups {
    /// Checks the target fragment's tensor against its source tensor and returns
    /// the item size and the group of sources that may feed it. A target with no
    /// possible source fails (normally `target fragment is not fully covered: <id>`).
    fn group(&mut self, target: &PlacementFragment) -> Result<(u64, &SourceIndex)>;
}

/// Regions planned by [`plan_regions`].
#[derive(Debug, Default)]
pub(crate) struct CoreRegions {
    pub regions: Vec<TransferRegion>,
    pub total_bytes: u64,
    pub total_segments: u64,
}

fn limit(msg: String) -> Error {
    Error::new(ErrorKind::LimitExceeded, msg)
}

/// Plans the regions of `targets` ((part, fragment) indices of `target`, sorted by
/// placement fragment id) from `sources`, enforcing `limits` while planning (the
/// region count before each region is added, each region's segments, the running
/// segment total) and exact coverage of every target fragment. Regions of one target
/// are sorted by (target base, source id, source base); targets keep their order.
/// `TransferRegion::source` is the index into `sources`.
pub(crate) fn plan_regions(
    target: &Placement,
    targets: &[(u32, u32)],
    sources: &[SourceBox<'_>],
    groups: &mut dyn SourceGroups,
    limits: PlanningLimits,
) -> Result<CoreRegions> {
    let mut out = CoreRegions::default();
    let mut overlaps: Vec<(Vec<u64>, Vec<u64>, u32)> = Vec::new();
    for &(p, f) in targets {
        let t = &target.parts()[p as usize].fragments()[f as usize];
        let (itemsize, index) = groups.group(t)?;
        overlaps.clear();
        for &(_, si) in index.candidates(t) {
            let s = &sources[si as usize];
            if let Some((off, shape)) = intersect(s.as_box(), t.as_box()) {
                if out.regions.len() as u64 + overlaps.len() as u64 + 1 > limits.max_transfer_regions {
                    return Err(limit(format!(
                        "logical transfer plan exceeds max_transfer_regions: {}",
                        limits.max_transfer_regions
                    )));
                }
                overlaps.push((off, shape, si));
            }
        }
        overlaps.sort_by(|a, b| (&a.0, &a.1, sources[a.2 as usize].id).cmp(&(&b.0, &b.1, sources[b.2 as usize].id)));
        let boxes: Vec<BoxRef<'_>> = overlaps.iter().map(|o| BoxRef::new(&o.0, &o.1)).collect();
        if !geometry::boxes_exactly_cover(t.as_box(), &boxes, HIGH_DIM_COMPARISON_BUDGET)? {
            return invalid(format!("target fragment is not fully covered: {}", t.placement_fragment_id()));
        }
        drop(boxes);
        let first = out.regions.len();
        for (off, shape, si) in overlaps.drain(..) {
            let s = &sources[si as usize];
            let mut r = TransferRegion::derive(s.as_box(), t.as_box(), off, shape, itemsize);
            r.source = si;
            r.target_part = p;
            r.target_fragment = f;
            let count = r.segment_count();
            if count > limits.max_segments_per_region {
                return Err(limit(format!(
                    "logical transfer region exceeds max_segments_per_region: {count} > {}",
                    limits.max_segments_per_region
                )));
            }
            out.total_segments = out.total_segments.saturating_add(count);
            if out.total_segments > limits.max_total_lowered_segments {
                return Err(limit(format!(
                    "logical transfer plan exceeds max_total_lowered_segments: {} > {}",
                    out.total_segments, limits.max_total_lowered_segments
                )));
            }
            r.check_bounds(s.nbytes, t.nbytes())?;
            out.total_bytes = out.total_bytes.saturating_add(r.total_bytes());
            out.regions.push(r);
        }
        out.regions[first..].sort_by(|a, b| {
            (a.target_base_offset, sources[a.source as usize].id, a.source_base_offset).cmp(&(
                b.target_base_offset,
                sources[b.source as usize].id,
                b.source_base_offset,
            ))
        });
    }
    Ok(out)
}

/// The intersection box of `s` and `t`, if any.
pub(crate) fn intersect(s: BoxRef<'_>, t: BoxRef<'_>) -> Option<(Vec<u64>, Vec<u64>)> {
    let n = t.offset.len();
    if s.offset.len() != n {
        return None;
    }
    let mut off = Vec::with_capacity(n);
    let mut shape = Vec::with_capacity(n);
    for d in 0..n {
        let b = s.offset[d].max(t.offset[d]);
        let e = (s.offset[d] + s.shape[d]).min(t.offset[d] + t.shape[d]);
        if e <= b {
            return None;
        }
        off.push(b);
        shape.push(e - b);
    }
    Some((off, shape))
}

/// The targets of `parts` (part indices), as (part, fragment) sorted by placement
/// fragment id.
pub(crate) fn sorted_targets(target: &Placement, parts: &[u32]) -> Vec<(u32, u32)> {
    // The placement keeps every fragment in id order already (ids are unique).
    let mut selected = vec![false; target.parts().len()];
    for &p in parts {
        selected[p as usize] = true;
    }
    target.fragment_order().iter().copied().filter(|&(p, _)| selected[p as usize]).collect()
}
