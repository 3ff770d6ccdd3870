//! The logical N-D load planner (`load-path.md` §3): from a stored manifest to a
//! target placement, one compact strided [`TransferRegion`] per (stored fragment,
//! target fragment) overlap. Pure: no store I/O, no per-element work.

use super::core::{plan_regions, sorted_targets, SourceBox, SourceGroups, SourceIndex};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::geometry::BoxRef;
use crate::model::{canonical_strides, ParallelRank, Placement, PlacementFragment, StoredFragment, StoredManifest};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Stored sources: one group per tensor (every stored geometry exists once).
struct StoredGroups<'a> {
    manifest: &'a StoredManifest,
    target: &'a Placement,
    source_tensors: HashMap<&'a str, usize>,
    members: HashMap<&'a str, Vec<u32>>,
    sources: &'a [SourceBox<'a>],
    indexes: HashMap<&'a str, SourceIndex>,
}

impl SourceGroups for StoredGroups<'_> {
    fn group(&mut self, t: &PlacementFragment) -> Result<(u64, &SourceIndex)> {
        let tid = t.tensor_id();
        let s_desc = self
            .source_tensors
            .get(tid)
            .map(|&i| &*self.manifest.tensors()[i])
            .ok_or_else(|| Error::invalid(format!("missing source tensor: {tid}")))?;
        let t_desc = self.target.tensor(tid).expect("placement knows its tensors");
        if s_desc.layout_fingerprint() != t_desc.layout_fingerprint() {
            return invalid(format!("layout mismatch for tensor {tid}"));
        }
        if !s_desc.is_compatible_with(t_desc) {
            return invalid(format!("tensor descriptor mismatch: {tid}"));
        }
        let Some((&key, group)) = self.members.get_key_value(tid) else {
            return invalid(format!("target fragment is not fully covered: {}", t.placement_fragment_id()));
        };
        let sources = self.sources;
        let index = self.indexes.entry(key).or_insert_with(|| SourceIndex::build(sources, group));
        Ok((t_desc.itemsize(), index))
    }
}

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
        let k = self.outer_loop_counts.len();
        let mut idx = vec![0u64; k];
        let (mut s, mut t) = (self.source_base_offset, self.target_base_offset);
        for _ in 0..count {
            f(s, t, self.inner_bytes);
            // Increment the index vector, last dimension fastest.
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

/// A logical load plan: regions from a stored manifest into a target placement,
/// optionally restricted to some target participants.
#[derive(Clone, Debug)]
pub struct LogicalLoadPlan {
    manifest: Arc<StoredManifest>,
    target: Arc<Placement>,
    limits: PlanningLimits,
    regions: Vec<TransferRegion>,
    /// (part index, region indices) for each planned part with fragments.
    executors: Vec<(u32, Vec<u32>)>,
    total_bytes: u64,
    total_segments: u64,
}

impl LogicalLoadPlan {
    /// Plans the restore of `manifest` into every participant of `target`
    /// (`plan_stored_transfer_to_target_placement`).
    ///
    /// Errors (contract): identity and tensor-set mismatches, incompatible
    /// descriptors (`layout mismatch for tensor <id>`, `tensor descriptor mismatch:
    /// <id>`), uncovered targets, and limits ([`ErrorKind::LimitExceeded`]).
    pub fn plan(manifest: Arc<StoredManifest>, target: Arc<Placement>, limits: PlanningLimits) -> Result<Self> {
        Self::plan_participants(manifest, target, limits, None)
    }

    /// Plans the restore for the listed target participants only (each rank of a
    /// multi-process job plans its own part). `None` plans every participant.
    /// Unknown participants fail with `unknown target participant: <id>`.
    pub fn plan_participants(
        manifest: Arc<StoredManifest>,
        target: Arc<Placement>,
        limits: PlanningLimits,
        participants: Option<&[&str]>,
    ) -> Result<Self> {
        limits.validate()?;
        if manifest.resource_id() != target.resource_id() {
            return invalid("source and target resource_id differ");
        }
        if manifest.revision() != target.revision() {
            return invalid("source and target revision differ");
        }
        if manifest.weight_generation() != target.weight_generation() {
            return invalid("source and target weight_generation differ");
        }
        let source_ids: BTreeSet<&str> = manifest.tensors().iter().map(|t| t.tensor_id()).collect();
        let target_ids: BTreeSet<&str> = target.tensors().iter().map(|t| t.tensor_id()).collect();
        let missing: Vec<&str> = source_ids.difference(&target_ids).copied().collect();
        if !missing.is_empty() {
            return invalid(format!("target manifests are missing tensors: {}", missing.join(", ")));
        }
        let unknown: Vec<&str> = target_ids.difference(&source_ids).copied().collect();
        if !unknown.is_empty() {
            return invalid(format!("target manifests contain unknown tensors: {}", unknown.join(", ")));
        }
        if manifest.fragments().is_empty() {
            return invalid("source fragments mix placement and stored locations");
        }
        // (Target coverage is guaranteed: a Placement value is a validated complete
        // placement, so every owner/replica group covers its tensors.)
        let source_tensors: HashMap<&str, usize> =
            manifest.tensors().iter().enumerate().map(|(i, t)| (t.tensor_id(), i)).collect();
        let mut members: HashMap<&str, Vec<u32>> = HashMap::default();
        for (i, f) in manifest.fragments().iter().enumerate() {
            members.entry(f.tensor_id()).or_default().push(i as u32);
        }
        let sources: Vec<SourceBox<'_>> = manifest
            .fragments()
            .iter()
            .map(|f| SourceBox {
                offset: f.global_offset(),
                shape: f.local_shape(),
                nbytes: f.nbytes(),
                id: f.fragment_id(),
            })
            .collect();

        // Which parts to plan.
        let selected: Vec<u32> = match participants {
            None => (0..target.parts().len() as u32).collect(),
            Some(ids) => {
                let mut v = Vec::with_capacity(ids.len());
                for id in ids {
                    let pos = target
                        .parts()
                        .binary_search_by(|p| p.participant_id().cmp(id))
                        .map_err(|_| Error::invalid(format!("unknown target participant: {id}")))?;
                    v.push(pos as u32);
                }
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        let targets = sorted_targets(&target, &selected);
        let mut groups = StoredGroups {
            manifest: &manifest,
            target: &target,
            source_tensors,
            members,
            sources: &sources,
            indexes: HashMap::default(),
        };
        let core = plan_regions(&target, &targets, &sources, &mut groups, limits)?;
        drop(groups);
        let (regions, total_bytes, total_segments) = (core.regions, core.total_bytes, core.total_segments);
        // Executors: planned parts with fragments, sorted by rank.
        let mut by_part: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, r) in regions.iter().enumerate() {
            by_part.entry(r.target_part).or_default().push(i as u32);
        }
        let mut executors: Vec<(u32, Vec<u32>)> = by_part.into_iter().collect();
        executors.sort_by_key(|(p, _)| target.parts()[*p as usize].rank().order_key());
        Ok(LogicalLoadPlan { manifest, target, limits, regions, executors, total_bytes, total_segments })
    }

    /// The stored manifest.
    pub fn manifest(&self) -> &Arc<StoredManifest> {
        &self.manifest
    }
    /// The target placement.
    pub fn target(&self) -> &Arc<Placement> {
        &self.target
    }
    /// The limits the plan was made under.
    pub fn limits(&self) -> PlanningLimits {
        self.limits
    }
    /// Regions sorted by (target fragment id, target base, source id, source base).
    pub fn regions(&self) -> &[TransferRegion] {
        &self.regions
    }
    /// The stored fragment a region reads.
    pub fn source_of(&self, r: &TransferRegion) -> &StoredFragment {
        &self.manifest.fragments()[r.source as usize]
    }
    /// The target fragment a region writes.
    pub fn target_of(&self, r: &TransferRegion) -> &PlacementFragment {
        &self.target.parts()[r.target_part as usize].fragments()[r.target_fragment as usize]
    }
    /// The participant id of a region's target.
    pub fn target_participant_of(&self, r: &TransferRegion) -> &str {
        self.target.parts()[r.target_part as usize].participant_id()
    }
    /// Target executors: (participant id, rank, region indices), sorted by rank.
    pub fn target_executors(&self) -> impl Iterator<Item = (&str, ParallelRank, &[u32])> + '_ {
        self.executors.iter().map(move |(p, ops)| {
            let part = &self.target.parts()[*p as usize];
            (part.participant_id(), part.rank(), ops.as_slice())
        })
    }
    /// Sum of region bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
    /// Sum of region segment counts.
    pub fn total_segments(&self) -> u64 {
        self.total_segments
    }
    /// Pipeline routes: region indices grouped by (target pp, target stage), sorted
    /// with an absent stage first (source pp and stage are absent for stored sources).
    pub fn pipeline_routes(&self) -> Vec<((u64, Option<u64>), Vec<u32>)> {
        let mut routes: BTreeMap<(u64, Option<u64>), Vec<u32>> = BTreeMap::new();
        for (i, r) in self.regions.iter().enumerate() {
            let t = self.target_of(r);
            routes.entry((t.rank().pp, t.pipeline_stage_id())).or_default().push(i as u32);
        }
        routes.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(so: &[u64], ss: &[u64], to: &[u64], ts: &[u64]) -> TransferRegion {
        let n = so.len();
        let off: Vec<u64> = (0..n).map(|d| so[d].max(to[d])).collect();
        let shape: Vec<u64> = (0..n).map(|d| (so[d] + ss[d]).min(to[d] + ts[d]) - off[d]).collect();
        TransferRegion::derive(BoxRef::new(so, ss), BoxRef::new(to, ts), off, shape, 2)
    }

    #[test]
    fn acc_184_region_derivation_examples() {
        let r = region(&[1, 0, 0], &[2, 6, 8], &[0, 2, 0], &[4, 3, 8]);
        assert_eq!((r.overlap_offset.clone(), r.overlap_shape.clone()), (vec![1, 2, 0], vec![2, 3, 8]));
        assert_eq!((r.source_base_offset, r.target_base_offset, r.inner_bytes), (32, 48, 48));
        assert_eq!(
            (r.outer_loop_counts.clone(), r.source_strides.clone(), r.target_strides.clone()),
            (vec![2], vec![96], vec![48])
        );
        let mut segs = Vec::new();
        r.for_each_segment(2, |s, t, n| segs.push((s, t, n))).unwrap();
        assert_eq!(segs, vec![(32, 48, 48), (128, 96, 48)]);
        assert_eq!(r.total_bytes(), 2 * 3 * 8 * 2);
        let err = r.for_each_segment(1, |_, _, _| {}).unwrap_err();
        assert!(err.message().contains("exceeds max_segments"));
        let r = region(&[1, 0, 0], &[2, 6, 8], &[0, 0, 4], &[4, 6, 4]);
        assert_eq!((r.source_base_offset, r.target_base_offset, r.inner_bytes), (8, 48, 8));
        assert_eq!(r.outer_loop_counts, vec![2, 6]);
        assert_eq!((r.source_strides.clone(), r.target_strides.clone()), (vec![96, 16], vec![48, 8]));
    }

    #[test]
    fn acc_202_dim_one_split_generates_row_ranges() {
        // (2,8) bf16 split on dim 1: source tp0 of TP2 = (0,0)/(2,4); target tp0 of TP4 = (0,0)/(2,2).
        let r = TransferRegion::derive(
            BoxRef::new(&[0, 0], &[2, 4]),
            BoxRef::new(&[0, 0], &[2, 2]),
            vec![0, 0],
            vec![2, 2],
            2,
        );
        let mut segs = Vec::new();
        r.for_each_segment(10, |s, t, n| segs.push((s, t, n))).unwrap();
        assert_eq!(r.segment_count(), 2);
        assert_eq!((r.source_strides.clone(), r.target_strides.clone()), (vec![8], vec![4]));
        assert_eq!(segs, vec![(0, 0, 4), (8, 4, 4)]);
    }
}
