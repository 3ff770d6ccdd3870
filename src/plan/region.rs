//! What every planner produces and obeys: [`TransferRegion`] (one compact strided
//! overlap of a source box and a target box) and [`PlanningLimits`] (fail-closed
//! bounds on planning work). Shared by the load planner, the transfer planner and
//! their N-D core.

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::geometry::BoxRef;
use crate::model::canonical_strides;

/// Fail-closed bounds on planning work (`load-path.md` §3.1).
///
/// The defaults are far above the reference's (1M regions, 1M segments per region,
/// 10M lowered segments), which reject realistic models (the benchmark's 10^5
/// fragment load lowers to 151M segments). Planning work is proportional to
/// regions, not segments; segments only bound execution, which is linear in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanningLimits {
    /// Max regions in a plan.
    pub max_transfer_regions: u64,
    /// Max `segment_count` of one region.
    pub max_segments_per_region: u64,
    /// Max sum of `segment_count` over the plan.
    pub max_total_lowered_segments: u64,
}

impl Default for PlanningLimits {
    fn default() -> Self {
        PlanningLimits {
            max_transfer_regions: 64 << 20,
            max_segments_per_region: 1 << 32,
            max_total_lowered_segments: 1 << 40,
        }
    }
}

impl PlanningLimits {
    /// The reference's defaults (1M regions, 1M segments per region, 10M segments).
    pub fn reference() -> Self {
        PlanningLimits {
            max_transfer_regions: 1_000_000,
            max_segments_per_region: 1_000_000,
            max_total_lowered_segments: 10_000_000,
        }
    }

    /// Each limit must be positive (`planning limit <name> must be a positive integer`).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("max_transfer_regions", self.max_transfer_regions),
            ("max_segments_per_region", self.max_segments_per_region),
            ("max_total_lowered_segments", self.max_total_lowered_segments),
        ] {
            if v == 0 {
                return invalid(format!("planning limit {name} must be a positive integer"));
            }
        }
        Ok(())
    }
}

/// One overlap between a stored fragment and a target fragment, as strided byte
/// segments (`load-path.md` §3.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferRegion {
    /// Index of the source fragment in the manifest's fragment list.
    pub source: u32,
    /// Index of the target part in the placement's part list.
    pub target_part: u32,
    /// Index of the target fragment in its part's fragment list.
    pub target_fragment: u32,
    /// Intersection box offset (global coordinates).
    pub overlap_offset: Vec<u64>,
    /// Intersection box extents.
    pub overlap_shape: Vec<u64>,
    /// Byte offset of the box origin inside the source fragment's contiguous layout.
    pub source_base_offset: u64,
    /// Byte offset of the box origin inside the target fragment's contiguous layout.
    pub target_base_offset: u64,
    /// Length of one contiguous segment.
    pub inner_bytes: u64,
    /// Extents of the outer (non-collapsed) dimensions.
    pub outer_loop_counts: Vec<u64>,
    /// Source byte strides of the outer dimensions.
    pub source_strides: Vec<u64>,
    /// Target byte strides of the outer dimensions.
    pub target_strides: Vec<u64>,
}

impl TransferRegion {
    /// Derives the region of `overlap` between `source` and `target` boxes with item
    /// size `itemsize` (`load-path.md` §3.5).
    pub fn derive(
        source_box: BoxRef<'_>,
        target_box: BoxRef<'_>,
        overlap_offset: Vec<u64>,
        overlap_shape: Vec<u64>,
        itemsize: u64,
    ) -> TransferRegion {
        let n = overlap_shape.len();
        let ss = canonical_strides(source_box.shape, itemsize);
        let st = canonical_strides(target_box.shape, itemsize);
        let base = |b: BoxRef<'_>, strides: &[u64]| -> u64 {
            (0..n).map(|d| (overlap_offset[d] - b.offset[d]) * strides[d]).sum()
        };
        let mut inner = overlap_shape[n - 1] * itemsize;
        let mut k = n - 1;
        for d in (0..n - 1).rev() {
            if ss[d] == inner && st[d] == inner {
                inner *= overlap_shape[d];
                k = d;
            } else {
                break;
            }
        }
        TransferRegion {
            source: 0,
            target_part: 0,
            target_fragment: 0,
            source_base_offset: base(source_box, &ss),
            target_base_offset: base(target_box, &st),
            inner_bytes: inner,
            outer_loop_counts: overlap_shape[..k].to_vec(),
            source_strides: ss[..k].to_vec(),
            target_strides: st[..k].to_vec(),
            overlap_offset,
            overlap_shape,
        }
    }

    /// `prod(outer_loop_counts)` (1 when empty).
    pub fn segment_count(&self) -> u64 {
        self.outer_loop_counts.iter().fold(1u64, |a, &c| a.saturating_mul(c))
    }

    /// `inner_bytes * segment_count`.
    pub fn total_bytes(&self) -> u64 {
        self.inner_bytes.saturating_mul(self.segment_count())
    }

    /// Calls `f(source_offset, target_offset, len)` for every segment in row-major
    /// order (offsets relative to the fragments). Fails before the first call when
    /// `segment_count > max_segments` (`transfer region exceeds max_segments`).
    pub fn for_each_segment(&self, max_segments: u64, mut f: impl FnMut(u64, u64, u64)) -> Result<()> {
        let (len, ss, ts) = self.row();
        self.for_each_row(max_segments, |s, t| {
            for j in 0..len {
                f(s + j * ss, t + j * ts, self.inner_bytes);
            }
            true
        })
    }

    /// The rows the segments come in: `(segments per row, source stride, target
    /// stride)`, the innermost outer dimension's extent and byte strides (`(1, 0, 0)`
    /// for a region of one segment). Segment `j` of a row starts `j * stride` bytes
    /// after the row's first.
    pub fn row(&self) -> (u64, u64, u64) {
        match self.outer_loop_counts.len() {
            0 => (1, 0, 0),
            k => (self.outer_loop_counts[k - 1], self.source_strides[k - 1], self.target_strides[k - 1]),
        }
    }

    /// Calls `f(source_offset, target_offset)` with the first segment of every row
    /// (see [`Self::row`]) in row-major order, so that a caller can lower a whole row
    /// at once; stops early when `f` returns false. Fails before the first call when
    /// `segment_count > max_segments` (`transfer region exceeds max_segments`).
    pub fn for_each_row(&self, max_segments: u64, mut f: impl FnMut(u64, u64) -> bool) -> Result<()> {
        if max_segments == 0 {
            return invalid("max_segments must be a positive integer");
        }
        let count = self.segment_count();
        if count > max_segments {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                format!("transfer region exceeds max_segments: {count} > {max_segments}"),
            ));
        }
        let (len, _, _) = self.row();
        if len == 0 {
            return Ok(());
        }
        // The dimensions outside the rows; the last of them varies fastest.
        let k = self.outer_loop_counts.len().saturating_sub(1);
        let mut idx = vec![0u64; k];
        let (mut s, mut t) = (self.source_base_offset, self.target_base_offset);
        for _ in 0..count / len {
            if !f(s, t) {
                return Ok(());
            }
            let mut d = k;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                s += self.source_strides[d];
                t += self.target_strides[d];
                if idx[d] < self.outer_loop_counts[d] {
                    break;
                }
                s -= self.source_strides[d] * idx[d];
                t -= self.target_strides[d] * idx[d];
                idx[d] = 0;
            }
        }
        Ok(())
    }

    /// Checks the region against its fragments' byte sizes: the furthest byte of
    /// every segment stays inside both fragments. Used before any byte moves.
    pub fn check_bounds(&self, source_nbytes: u64, target_nbytes: u64) -> Result<()> {
        let reach = |base: u64, strides: &[u64]| -> Option<u64> {
            let mut end = base.checked_add(self.inner_bytes)?;
            for (c, s) in self.outer_loop_counts.iter().zip(strides) {
                end = end.checked_add((c - 1).checked_mul(*s)?)?;
            }
            Some(end)
        };
        match reach(self.source_base_offset, &self.source_strides) {
            Some(e) if e <= source_nbytes => {}
            _ => return Err(Error::new(ErrorKind::InvalidManifest, "transfer region exceeds source fragment")),
        }
        match reach(self.target_base_offset, &self.target_strides) {
            Some(e) if e <= target_nbytes => Ok(()),
            _ => Err(Error::new(ErrorKind::InvalidManifest, "transfer region exceeds target fragment")),
        }
    }
}
