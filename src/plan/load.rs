//! The logical N-D load planner (`load-path.md` §3): from a stored manifest to a
//! target placement, one compact strided [`TransferRegion`] per (stored fragment,
//! target fragment) overlap. Pure: no store I/O, no per-element work.

use super::core::{plan_regions, sorted_targets, SourceBox, SourceGroups, SourceIndex};
pub use super::region::{PlanningLimits, TransferRegion};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::model::{ParallelRank, Placement, PlacementFragment, StoredFragment, StoredManifest};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Stored sources: one group per tensor (every stored geometry exists once).
struct StoredGroups<'a> {
    manifest: &'a StoredManifest,
    target: &'a Placement,
    source_tensors: HashMap<&'a str, usize>,
    members: HashMap<&'a str, Vec<u32>>,
    sources: &'a [SourceBox<'a>],
    /// One index per tensor, built on first use.
    indexes: Vec<SourceIndex>,
    /// Position in `indexes` per tensor id.
    positions: HashMap<&'a str, u32>,
    /// Checked tensors by the address of their interned id: (itemsize, position).
    /// Later fragments of a tensor skip the descriptor checks and the string maps.
    checked: HashMap<u64, (u64, u32)>,
}

impl SourceGroups for StoredGroups<'_> {
    fn group(&mut self, t: &PlacementFragment) -> Result<(u64, &SourceIndex)> {
        let ptr = crate::model::id_key(t.tensor_id_arc());
        if let Some(&(itemsize, pos)) = self.checked.get(&ptr) {
            return Ok((itemsize, &self.indexes[pos as usize]));
        }
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
        let pos = match self.positions.get(key) {
            Some(&pos) => pos,
            None => {
                self.indexes.push(SourceIndex::build(self.sources, group));
                let pos = (self.indexes.len() - 1) as u32;
                self.positions.insert(key, pos);
                pos
            }
        };
        self.checked.insert(ptr, (t_desc.itemsize(), pos));
        Ok((t_desc.itemsize(), &self.indexes[pos as usize]))
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
    /// <id>`), uncovered targets, and limits ([`crate::ErrorKind::LimitExceeded`]).
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
            indexes: Vec::new(),
            positions: HashMap::default(),
            checked: HashMap::default(),
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
    use crate::geometry::BoxRef;

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
