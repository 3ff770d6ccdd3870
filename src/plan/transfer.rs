//! The placement -> placement planner (`live-transfer.md` §1, `load-path.md` §3.7):
//! a live source placement resharded into a target placement, either for every
//! target participant (sink mode) or for one local target participant (reader
//! mode). It shares the N-D core (`plan::core`) with the load planner; only the
//! sources differ: the placement fragments of the complete source DP replica that
//! each target DP replica reads (`R[d mod len(R)]`), one fragment per distinct box.
//! [`SourceRouting::SpreadTargets`] (not in the reference, off by default) routes per
//! target participant instead, so that the targets of one DP replica read from every
//! complete source replica.
//!
//! Pure: no I/O, no addresses, no per-element work.

use super::core::{plan_regions, sorted_targets, SourceBox, SourceGroups, SourceIndex};
use super::region::{PlanningLimits, TransferRegion};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::model::{AxisKind, ParallelAxis, ParallelRank, Placement, PlacementFragment, TensorDescriptor};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One executor of a logical plan (`PlacementExecutorPlan`): a placement part that
/// sends (source side) or receives (target side) at least one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementExecutorPlan {
    /// Index of the part in its placement's part list.
    pub part: u32,
    /// The part's participant id.
    pub participant_id: String,
    /// The part's rank.
    pub rank: ParallelRank,
    /// All placement fragment ids of the part, sorted.
    pub placement_fragment_ids: Vec<String>,
    /// Derived: ascending indices of the regions whose fragment on this side
    /// belongs to the part.
    pub operation_indices: Vec<u32>,
}

/// Which complete source DP replica a target participant reads (live transfer).
///
/// `R` is the sorted list of complete source DP ranks. Both choices are deterministic
/// functions of the placements; every target byte has exactly one source either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SourceRouting {
    /// The reference's routing (`load-path.md` §3.7): a target participant of DP rank
    /// `d` reads `R[d mod len(R)]`. A target with one DP replica therefore reads every
    /// byte from source replica `R[0]`, whatever the number of source replicas.
    #[default]
    TargetDp,
    /// A target participant reads `R[i mod len(R)]`, where `i` is its rank's index in
    /// the target grid in the canonical order `((dp * pp + pp_rank) * ep + ep_rank) *
    /// tp + tp_rank`: consecutive target ranks read from consecutive source
    /// replicas, so the load is spread over the hosts of every complete replica.
    /// Not part of the reference: plans differ from its plans (and from the
    /// conformance fixtures) whenever there are two or more complete source replicas.
    SpreadTargets,
}

impl SourceRouting {
    /// The name used in plan JSON, the C ABI and Python (`"target_dp"`,
    /// `"spread_targets"`).
    pub fn name(self) -> &'static str {
        match self {
            SourceRouting::TargetDp => "target_dp",
            SourceRouting::SpreadTargets => "spread_targets",
        }
    }

    /// The routing named `name` (see [`Self::name`]).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "target_dp" => Ok(SourceRouting::TargetDp),
            "spread_targets" => Ok(SourceRouting::SpreadTargets),
            _ => invalid(format!("unknown source routing: {name}")),
        }
    }

    /// The routing key of a target rank in `target` (indexes `R` modulo its length).
    fn key(self, target: &Placement, r: ParallelRank) -> u64 {
        match self {
            SourceRouting::TargetDp => r.dp,
            SourceRouting::SpreadTargets => {
                let t = target.topology();
                let i = r.dp.wrapping_mul(t.pp_size()).wrapping_add(r.pp);
                let i = i.wrapping_mul(t.ep_size()).wrapping_add(r.ep);
                i.wrapping_mul(t.tp_size()).wrapping_add(r.tp)
            }
        }
    }
}

/// One pipeline route: regions grouped by (source pp, source stage, target pp,
/// target stage).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineRoute {
    /// Source pipeline coordinate.
    pub source_pp: u64,
    /// Source virtual stage.
    pub source_pipeline_stage_id: Option<u64>,
    /// Target pipeline coordinate.
    pub target_pp: u64,
    /// Target virtual stage.
    pub target_pipeline_stage_id: Option<u64>,
    /// Ascending region indices.
    pub operation_indices: Vec<u32>,
}

/// A logical live-transfer plan (`LogicalTransferPlan` with a placement source):
/// regions from source placement fragments into target placement fragments, the
/// source and target executors and the planning limits. No addresses, endpoints,
/// workers, instances, leases or owners. Immutable, `Send + Sync`; cheap to clone.
#[derive(Clone, Debug)]
pub struct LogicalTransferPlan {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    source: Arc<Placement>,
    target: Arc<Placement>,
    limits: PlanningLimits,
    routing: SourceRouting,
    local_target: Option<String>,
    /// Source index (`TransferRegion::source`) -> (part, fragment) in `source`.
    sources: Vec<(u32, u32)>,
    regions: Vec<TransferRegion>,
    source_executors: Vec<PlacementExecutorPlan>,
    target_executors: Vec<PlacementExecutorPlan>,
    total_bytes: u64,
    total_segments: u64,
}

impl PartialEq for LogicalTransferPlan {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
            || (self.inner.source == o.inner.source
                && self.inner.target == o.inner.target
                && self.inner.limits == o.inner.limits
                && self.inner.routing == o.inner.routing
                && self.inner.local_target == o.inner.local_target
                && self.inner.regions == o.inner.regions)
    }
}
impl Eq for LogicalTransferPlan {}

/// The owner tuple of a fragment of `t`: its coordinates on the tensor's ownership
/// kinds (others zero), indexed by kind (dp, pp, ep, tp).
fn owner_of(t: &TensorDescriptor, rank: ParallelRank) -> [u64; 4] {
    let mut owner = [0u64; 4];
    for a in t.parallel_axes() {
        if let ParallelAxis::Ownership(k) = a {
            owner[*k as usize] = rank.coord(*k);
        }
    }
    owner
}

fn is_dp_owned(t: &TensorDescriptor) -> bool {
    t.axis(AxisKind::Dp) == Some(&ParallelAxis::Ownership(AxisKind::Dp))
}

/// Key of a DP-owned tensor's group (read from its one owner whatever the target dp).
const ANY_DP: u64 = u64::MAX;

/// Placement sources: per (tensor, source dp) the deduplicated fragments of the
/// chosen owner; DP-owned tensors under [`ANY_DP`].
struct PlacementGroups<'a> {
    /// Tensor id -> (source descriptor, target descriptor), built once.
    tensors: HashMap<&'a str, (&'a TensorDescriptor, &'a TensorDescriptor)>,
    target: &'a Placement,
    routing: SourceRouting,
    complete: Vec<u64>,
    members: HashMap<(&'a str, u64), Vec<u32>>,
    sources: &'a [SourceBox<'a>],
    /// One index per group, built on first use.
    indexes: Vec<SourceIndex>,
    /// Position in `indexes` per group.
    positions: HashMap<(&'a str, u64), u32>,
    /// Checked (target tensor, routing key), the tensor by the address of its
    /// interned id: (itemsize, position). Later fragments skip the checks and the string maps.
    checked: HashMap<(u64, u64), (u64, u32)>,
}

impl SourceGroups for PlacementGroups<'_> {
    fn group(&mut self, t: &PlacementFragment) -> Result<(u64, &SourceIndex)> {
        // Keyed by the routing key: the targets that share it read the same group.
        let route = self.routing.key(self.target, t.rank());
        let checked_key = (crate::model::id_key(t.tensor_id_arc()), route);
        if let Some(&(itemsize, pos)) = self.checked.get(&checked_key) {
            return Ok((itemsize, &self.indexes[pos as usize]));
        }
        let tid = t.tensor_id();
        let &(s_desc, t_desc) =
            self.tensors.get(tid).ok_or_else(|| Error::invalid(format!("missing source tensor: {tid}")))?;
        if s_desc.layout_fingerprint() != t_desc.layout_fingerprint() {
            return invalid(format!("layout mismatch for tensor {tid}"));
        }
        if !s_desc.is_compatible_with(t_desc) {
            return invalid(format!("tensor descriptor mismatch: {tid}"));
        }
        let dp =
            if is_dp_owned(s_desc) { ANY_DP } else { self.complete[(route % self.complete.len() as u64) as usize] };
        let Some((&key, group)) = self.members.get_key_value(&(s_desc.tensor_id(), dp)) else {
            return invalid(format!("target fragment is not fully covered: {}", t.placement_fragment_id()));
        };
        let pos = match self.positions.get(&key) {
            Some(&pos) => pos,
            None => {
                self.indexes.push(SourceIndex::build(self.sources, group));
                let pos = (self.indexes.len() - 1) as u32;
                self.positions.insert(key, pos);
                pos
            }
        };
        self.checked.insert(checked_key, (t_desc.itemsize(), pos));
        Ok((t_desc.itemsize(), &self.indexes[pos as usize]))
    }
}

/// Source replica selection (`load-path.md` §3.7): the sorted complete source dps
/// and the member source indices per (tensor, dp) group: the fragments of the
/// lowest owner, one per distinct box (the lowest `(dp, pp, ep, tp, id)`).
///
/// One sort of all source fragments by (tensor, dp, owner, box, rank, id) makes
/// every group a contiguous run. A validated placement already guarantees that each
/// (owner, replica) cover is exact (`data-model.md` §9.6), so a tensor whose DP axis
/// is replicated (or whose topology has one DP rank) is complete in every DP rank
/// that holds it; only other DP semantics need the exact-cover check here.
fn select_sources<'a>(
    source: &'a Placement,
    flat: &[(u32, u32)],
) -> Result<(Vec<u64>, HashMap<(&'a str, u64), Vec<u32>>)> {
    let frag = |i: u32| {
        let (p, f) = flat[i as usize];
        &source.parts()[p as usize].fragments()[f as usize]
    };
    let tensors = source.tensors();
    // Fragments carry their descriptor's interned id: its address finds the tensor;
    // the id itself is the fallback.
    let by_ptr: HashMap<u64, u32> =
        tensors.iter().enumerate().map(|(i, t)| (crate::model::id_key(t.tensor_id_arc()), i as u32)).collect();
    let by_id: HashMap<&str, u32> = tensors.iter().enumerate().map(|(i, t)| (t.tensor_id(), i as u32)).collect();
    let tensor_index = |f: &PlacementFragment| match by_ptr.get(&crate::model::id_key(f.tensor_id_arc())) {
        Some(&i) if tensors[i as usize].tensor_id() == f.tensor_id() => i,
        _ => by_id[f.tensor_id()],
    };
    // (tensor index, group dp, owner, source index), on several threads for many
    // fragments, then grouped by tensor by a counting sort.
    let workers = crate::par::workers(flat.len());
    let unsorted: Vec<(u32, u64, [u64; 4], u32)> = crate::par::try_map(flat.len(), workers, |i| {
        let f = frag(i as u32);
        let ti = tensor_index(f);
        let t = &*tensors[ti as usize];
        let dp = if is_dp_owned(t) { ANY_DP } else { f.rank().dp };
        Ok::<_, ()>((ti, dp, owner_of(t, f.rank()), i as u32))
    })
    .unwrap_or_default();
    let mut start = vec![0u32; tensors.len() + 1];
    for e in &unsorted {
        start[e.0 as usize + 1] += 1;
    }
    for k in 1..start.len() {
        start[k] += start[k - 1];
    }
    let mut keyed: Vec<(u32, u64, [u64; 4], u32)> = vec![(0, 0, [0; 4], 0); unsorted.len()];
    let mut next = start.clone();
    for e in unsorted {
        let slot = &mut next[e.0 as usize];
        keyed[*slot as usize] = e;
        *slot += 1;
    }
    drop(next);
    let single_dp = source.topology().dp_size() <= 1;
    let needs_check =
        |t: &TensorDescriptor| !single_dp && t.axis(AxisKind::Dp) != Some(&ParallelAxis::Replicated(AxisKind::Dp));
    let cover = |t: &TensorDescriptor, list: &[u32]| -> Result<bool> {
        let whole_offset = vec![0u64; t.ndim()];
        let whole = BoxRef::new(&whole_offset, t.global_shape());
        let boxes: Vec<BoxRef<'_>> = list.iter().map(|&i| frag(i).as_box()).collect();
        geometry::boxes_exactly_cover(whole, &boxes, HIGH_DIM_COMPARISON_BUDGET)
    };
    // Per tensor (on several threads; the first error in tensor order): its groups
    // in dp order, each with the chosen owner's fragments (sorted by (owner, box,
    // rank, id): the lowest owner, one fragment per distinct box) and whether some
    // owner of the group is incomplete.
    let per_tensor = crate::par::try_map(tensors.len(), workers, |k| {
        let mut run = keyed[start[k] as usize..start[k + 1] as usize].to_vec();
        run.sort_unstable_by(|a, b| {
            (a.1, a.2).cmp(&(b.1, b.2)).then_with(|| {
                let (fa, fb) = (frag(a.3), frag(b.3));
                (fa.global_offset(), fa.local_shape(), fa.rank().order_key(), fa.placement_fragment_id()).cmp(&(
                    fb.global_offset(),
                    fb.local_shape(),
                    fb.rank().order_key(),
                    fb.placement_fragment_id(),
                ))
            })
        });
        let t = &*tensors[k];
        let mut groups: Vec<(u64, Vec<u32>, bool)> = Vec::new();
        let mut i = 0;
        while i < run.len() {
            let dp = run[i].1;
            let mut chosen: Option<Vec<u32>> = None;
            let mut owners = 0usize;
            let mut incomplete = false;
            while i < run.len() && run[i].1 == dp {
                let owner = run[i].2;
                let mut list: Vec<u32> = Vec::new();
                while i < run.len() && run[i].1 == dp && run[i].2 == owner {
                    let f = frag(run[i].3);
                    let dup = list.last().is_some_and(|&l| {
                        let g = frag(l);
                        g.global_offset() == f.global_offset() && g.local_shape() == f.local_shape()
                    });
                    if !dup {
                        list.push(run[i].3);
                    }
                    i += 1;
                }
                owners += 1;
                let complete = if dp == ANY_DP || needs_check(t) { cover(t, &list)? } else { true };
                if dp == ANY_DP && !complete {
                    return invalid(format!(
                        "DP-owned source tensor has no complete declared owner: {}",
                        t.tensor_id()
                    ));
                }
                incomplete |= !complete;
                if chosen.is_none() {
                    chosen = Some(list);
                }
            }
            if dp == ANY_DP && owners > 1 {
                return invalid(format!("DP-owned source tensor has ambiguous declared owners: {}", t.tensor_id()));
            }
            groups.push((dp, chosen.expect("a group has an owner"), incomplete));
        }
        Ok(groups)
    })?;
    drop(keyed);
    let mut members: HashMap<(&str, u64), Vec<u32>> = crate::fxhash::map_with_capacity(tensors.len());
    // (tensor, dp) groups that are incomplete (then the dp is not a complete replica).
    let mut incomplete: BTreeSet<u64> = BTreeSet::new();
    let mut dps: BTreeSet<u64> = BTreeSet::new();
    for (t, groups) in tensors.iter().zip(per_tensor) {
        for (dp, chosen, partial) in groups {
            if dp != ANY_DP {
                dps.insert(dp);
                if partial {
                    incomplete.insert(dp);
                }
            }
            members.insert((t.tensor_id(), dp), chosen);
        }
    }
    // A complete replica holds every non-DP-owned tensor, each owner complete.
    let replicated: Vec<&str> = tensors.iter().filter(|t| !is_dp_owned(t)).map(|t| t.tensor_id()).collect();
    let complete: Vec<u64> = dps
        .into_iter()
        .filter(|dp| !incomplete.contains(dp) && replicated.iter().all(|tid| members.contains_key(&(*tid, *dp))))
        .collect();
    if !replicated.is_empty() && complete.is_empty() {
        return invalid("source manifests have no complete DP replica; tensors are not fully covered");
    }
    let complete = if complete.is_empty() { vec![0] } else { complete };
    Ok((complete, members))
}

/// The source parts the planner looks at, and the complete DP ranks `R` when they
/// are known without looking at fragments.
///
/// A validated placement whose topology is a full grid and whose every non-DP-owned
/// tensor is replicated on DP (or that has one DP rank) holds a complete replica in
/// every DP rank (`data-model.md` §9.6: each (owner, replica) cover is exact and every
/// owner exists in every DP rank). Then `R` is every DP rank, and only the ranks the
/// planned targets route to (`R[key mod len(R)]`, [`SourceRouting`]), plus the parts
/// that hold DP-owned tensors, can be sources: the other replicas are never read.
/// Otherwise every part is examined and `R` comes from the fragments.
fn source_parts(
    source: &Placement,
    target: &Placement,
    parts: &[u32],
    routing: SourceRouting,
) -> (Vec<u32>, Option<Vec<u64>>) {
    let all: Vec<u32> = (0..source.parts().len() as u32).collect();
    let topo = source.topology();
    let grid = topo.world_size() as u64
        == topo.dp_size().saturating_mul(topo.pp_size()).saturating_mul(topo.ep_size()).saturating_mul(topo.tp_size());
    let replicated = source
        .tensors()
        .iter()
        .all(|t| is_dp_owned(t) || t.axis(AxisKind::Dp) == Some(&ParallelAxis::Replicated(AxisKind::Dp)));
    if !(grid && (replicated || topo.dp_size() <= 1)) {
        return (all, None);
    }
    let dps: BTreeSet<u64> = source.parts().iter().filter(|p| !p.fragments().is_empty()).map(|p| p.rank().dp).collect();
    let r: Vec<u64> = dps.into_iter().collect();
    if r.is_empty() {
        return (all, None);
    }
    let needed: BTreeSet<u64> = parts
        .iter()
        .map(|&p| r[(routing.key(target, target.parts()[p as usize].rank()) % r.len() as u64) as usize])
        .collect();
    let any_dp_owned = source.tensors().iter().any(|t| is_dp_owned(t));
    let chosen = all
        .into_iter()
        .filter(|&i| {
            let p = &source.parts()[i as usize];
            needed.contains(&p.rank().dp) || (any_dp_owned && p.tensors().iter().any(|t| is_dp_owned(t)))
        })
        .collect();
    (chosen, Some(r))
}

/// The tensor ids of `p`, sorted.
fn sorted_ids(p: &Placement) -> Vec<&str> {
    let ids: Vec<&str> = p.tensors().iter().map(|t| t.tensor_id()).collect();
    debug_assert!(ids.is_sorted());
    ids
}

/// The ids of sorted `a` that sorted `b` lacks, in order.
fn difference<'a>(a: &[&'a str], b: &[&str]) -> Vec<&'a str> {
    let mut j = 0;
    let mut out = Vec::new();
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if b.get(j) != Some(&x) {
            out.push(x);
        }
    }
    out
}

fn check_identity(source: &Placement, target: &Placement) -> Result<()> {
    if source.resource_id() != target.resource_id() {
        return invalid("source and target resource_id differ");
    }
    if source.revision() != target.revision() {
        return invalid("source and target revision differ");
    }
    if source.weight_generation() != target.weight_generation() {
        return invalid("source and target weight_generation differ");
    }
    Ok(())
}

/// The reference's text of a rank: the repr of its `ParallelRank` dataclass (fields
/// in declaration order: dp, tp, pp, ep).
fn rank_text(r: ParallelRank) -> String {
    format!("ParallelRank(dp={}, tp={}, pp={}, ep={})", r.dp, r.tp, r.pp, r.ep)
}

/// Executors of one side: parts with fragments whose index appears in
/// `part_of_region`, sorted by rank; a rank shared by two parts with fragments fails
/// `duplicate <side> placement executor rank: <rank>`.
/// The placement fragment ids of each of `parts` (indexed by part; `None` for
/// the others), what an executor of the part lists.
fn fragment_ids(placement: &Placement, parts: &[u32]) -> Vec<Option<Vec<String>>> {
    let mut out = vec![None; placement.parts().len()];
    for &p in parts {
        out[p as usize] = Some(
            placement.parts()[p as usize].fragments().iter().map(|f| f.placement_fragment_id().to_string()).collect(),
        );
    }
    out
}

/// Executors of one side (see the function below); `ids`: the fragment ids of
/// some parts, computed beforehand (taken from here when a part has an executor).
fn build_executors(
    placement: &Placement,
    part_of_region: impl Iterator<Item = u32>,
    only: Option<u32>,
    side: &str,
    ids: Vec<Option<Vec<String>>>,
) -> Result<Vec<PlacementExecutorPlan>> {
    let mut ranks: HashMap<(u64, u64, u64, u64), u32> = HashMap::default();
    for (i, part) in placement.parts().iter().enumerate() {
        if part.fragments().is_empty() || only.is_some_and(|o| o != i as u32) {
            continue;
        }
        if ranks.insert(part.rank().order_key(), i as u32).is_some() {
            return invalid(format!("duplicate {side} placement executor rank: {}", rank_text(part.rank())));
        }
    }
    let mut ops: Vec<Vec<u32>> = vec![Vec::new(); placement.parts().len()];
    for (i, p) in part_of_region.enumerate() {
        ops[p as usize].push(i as u32);
    }
    // One executor per part with regions; their fragment ids are copied on several
    // threads for many fragments.
    type Pending = std::sync::Mutex<(Vec<u32>, Option<Vec<String>>)>;
    let used: Vec<(u32, Pending)> = (0..ops.len() as u32)
        .zip(ops.into_iter().zip(ids))
        .filter(|(_, (ops, _))| !ops.is_empty())
        .map(|(p, pending)| (p, std::sync::Mutex::new(pending)))
        .collect();
    let total: usize = used.iter().map(|&(p, _)| placement.parts()[p as usize].fragments().len()).sum();
    let mut out = crate::par::try_map(used.len(), crate::par::workers(total), |k| {
        let (p, pending) = &used[k];
        let part = &placement.parts()[*p as usize];
        let (operation_indices, ids) = std::mem::take(&mut *pending.lock().unwrap_or_else(|e| e.into_inner()));
        Ok::<_, Error>(PlacementExecutorPlan {
            part: *p,
            participant_id: part.participant_id().to_string(),
            rank: part.rank(),
            placement_fragment_ids: ids
                .unwrap_or_else(|| part.fragments().iter().map(|f| f.placement_fragment_id().to_string()).collect()),
            operation_indices,
        })
    })?;
    out.sort_by_key(|e| e.rank.order_key());
    Ok(out)
}

impl LogicalTransferPlan {
    /// `plan_placement_transfer`: plans every target participant of `target` from
    /// `source` (sink mode).
    ///
    /// Errors (contract, [`crate::ErrorKind::InvalidArgument`] or
    /// [`crate::ErrorKind::LimitExceeded`]): limits not positive; identity
    /// (`source and target resource_id differ`, `... revision differ`,
    /// `... weight_generation differ`); tensor sets (`target manifests are missing
    /// tensors: <ids>`, `target manifests contain unknown tensors: <ids>`);
    /// descriptors (`layout mismatch for tensor <id>`, `tensor descriptor mismatch: <id>`);
    /// source replicas; coverage; limits while planning.
    pub fn plan(source: Arc<Placement>, target: Arc<Placement>, limits: PlanningLimits) -> Result<Self> {
        Self::plan_routed(source, target, limits, SourceRouting::TargetDp)
    }

    /// [`Self::plan`] with the source replica routing `routing` (the reference's is
    /// [`SourceRouting::TargetDp`]).
    pub fn plan_routed(
        source: Arc<Placement>,
        target: Arc<Placement>,
        limits: PlanningLimits,
        routing: SourceRouting,
    ) -> Result<Self> {
        limits.validate()?;
        check_identity(&source, &target)?;
        // Both tensor lists are sorted by (unique) id: the differences are a merge.
        let (source_ids, target_ids) = (sorted_ids(&source), sorted_ids(&target));
        let missing = difference(&source_ids, &target_ids);
        if !missing.is_empty() {
            return invalid(format!("target manifests are missing tensors: {}", missing.join(", ")));
        }
        let unknown = difference(&target_ids, &source_ids);
        if !unknown.is_empty() {
            return invalid(format!("target manifests contain unknown tensors: {}", unknown.join(", ")));
        }
        let parts: Vec<u32> = (0..target.parts().len() as u32).collect();
        Self::plan_core(source, target, limits, routing, &parts, None)
    }

    /// `plan_placement_transfer_to_local_target`: plans only `participant` of
    /// `target` (reader mode). With `None` the target topology must have one
    /// participant (`target_participant_id is required for a multi-participant
    /// target`). Errors as [`Self::plan`] plus `unknown target participant: <id>`,
    /// `local target manifest has no fragments`, and the subset rule
    /// (`target manifests contain unknown tensors: <ids>`).
    pub fn plan_local(
        source: Arc<Placement>,
        target: Arc<Placement>,
        participant: Option<&str>,
        limits: PlanningLimits,
    ) -> Result<Self> {
        Self::plan_local_routed(source, target, participant, limits, SourceRouting::TargetDp)
    }

    /// [`Self::plan_local`] with the source replica routing `routing`.
    pub fn plan_local_routed(
        source: Arc<Placement>,
        target: Arc<Placement>,
        participant: Option<&str>,
        limits: PlanningLimits,
        routing: SourceRouting,
    ) -> Result<Self> {
        limits.validate()?;
        let index = match participant {
            None => {
                if target.topology().world_size() != 1 || target.parts().len() != 1 {
                    return invalid("target_participant_id is required for a multi-participant target");
                }
                0
            }
            Some(id) => target
                .parts()
                .binary_search_by(|p| p.participant_id().cmp(id))
                .map_err(|_| Error::invalid(format!("unknown target participant: {id}")))?,
        };
        check_identity(&source, &target)?;
        let part = &target.parts()[index];
        let unknown: Vec<&str> =
            part.tensors().iter().map(|t| t.tensor_id()).filter(|id| source.tensor(id).is_none()).collect();
        if !unknown.is_empty() {
            return invalid(format!("target manifests contain unknown tensors: {}", unknown.join(", ")));
        }
        if part.fragments().is_empty() {
            return invalid("local target manifest has no fragments");
        }
        let local = part.participant_id().to_string();
        let plan = Self::plan_core(source, target, limits, routing, &[index as u32], Some(local))?;
        if plan.inner.target_executors.len() != 1 {
            return invalid("local target placement must describe exactly one executor");
        }
        Ok(plan)
    }

    fn plan_core(
        source: Arc<Placement>,
        target: Arc<Placement>,
        limits: PlanningLimits,
        routing: SourceRouting,
        parts: &[u32],
        local_target: Option<String>,
    ) -> Result<Self> {
        let (source_parts, routed) = source_parts(&source, &target, parts, routing);
        let flat: Vec<(u32, u32)> = source_parts
            .iter()
            .flat_map(|&p| (0..source.parts()[p as usize].fragments().len() as u32).map(move |f| (p, f)))
            .collect();
        let frag = |(p, f): (u32, u32)| &source.parts()[p as usize].fragments()[f as usize];
        let boxes: Vec<SourceBox<'_>> = flat
            .iter()
            .map(|&k| {
                let f = frag(k);
                SourceBox {
                    offset: f.global_offset(),
                    shape: f.local_shape(),
                    nbytes: f.nbytes(),
                    id: f.placement_fragment_id(),
                }
            })
            .collect();
        let (complete, members) = select_sources(&source, &flat)?;
        let complete = routed.unwrap_or(complete);
        let targets = sorted_targets(&target, parts);
        // Both tensor lists are sorted by id: pairs by a merge.
        let mut tensors: HashMap<&str, (&TensorDescriptor, &TensorDescriptor)> =
            crate::fxhash::map_with_capacity(target.tensors().len());
        let mut j = 0;
        for t in target.tensors() {
            let s = source.tensors();
            while j < s.len() && s[j].tensor_id() < t.tensor_id() {
                j += 1;
            }
            if let Some(s) = s.get(j).filter(|s| s.tensor_id() == t.tensor_id()) {
                tensors.insert(t.tensor_id(), (&**s, &**t));
            }
        }
        let mut groups = PlacementGroups {
            tensors,
            target: &target,
            routing,
            complete,
            members,
            sources: &boxes,
            indexes: Vec::new(),
            positions: HashMap::default(),
            checked: HashMap::default(),
        };
        // The executors list every fragment id of their parts: for many fragments,
        // those of the parts that may have executors are copied on the second core
        // while this one plans the regions.
        let ids_beside = crate::par::workers(targets.len() + flat.len()) > 1;
        let (core, (target_ids, source_ids)) = crate::par::join(
            ids_beside,
            || plan_regions(&target, &targets, &boxes, &mut groups, limits),
            || {
                if ids_beside {
                    (fragment_ids(&target, parts), fragment_ids(&source, &source_parts))
                } else {
                    (vec![None; target.parts().len()], vec![None; source.parts().len()])
                }
            },
        );
        let core = core?;
        drop(groups);
        drop(boxes);
        let only = if local_target.is_some() { Some(parts[0]) } else { None };
        let target_executors =
            build_executors(&target, core.regions.iter().map(|r| r.target_part), only, "target", target_ids)?;
        let source_executors = build_executors(
            &source,
            core.regions.iter().map(|r| flat[r.source as usize].0),
            None,
            "source",
            source_ids,
        )?;
        Ok(LogicalTransferPlan {
            inner: Arc::new(Inner {
                source,
                target,
                limits,
                routing,
                local_target,
                sources: flat,
                regions: core.regions,
                source_executors,
                target_executors,
                total_bytes: core.total_bytes,
                total_segments: core.total_segments,
            }),
        })
    }

    /// The source placement.
    pub fn source(&self) -> &Arc<Placement> {
        &self.inner.source
    }
    /// The target placement.
    pub fn target(&self) -> &Arc<Placement> {
        &self.inner.target
    }
    /// `source_placement_id`.
    pub fn source_placement_id(&self) -> &str {
        self.inner.source.placement_id()
    }
    /// `target_placement_id`.
    pub fn target_placement_id(&self) -> &str {
        self.inner.target.placement_id()
    }
    /// The limits the plan was made under.
    pub fn limits(&self) -> PlanningLimits {
        self.inner.limits
    }
    /// The source replica routing the plan was made with.
    pub fn routing(&self) -> SourceRouting {
        self.inner.routing
    }
    /// The local target participant (reader mode), if any.
    pub fn local_target(&self) -> Option<&str> {
        self.inner.local_target.as_deref()
    }
    /// Regions sorted by (target fragment id, target base, source id, source base).
    pub fn regions(&self) -> &[TransferRegion] {
        &self.inner.regions
    }
    /// The (part index, fragment index) of a region's source in the source placement.
    pub fn source_index(&self, r: &TransferRegion) -> (u32, u32) {
        self.inner.sources[r.source as usize]
    }
    /// The source placement fragment a region reads.
    pub fn source_of(&self, r: &TransferRegion) -> &PlacementFragment {
        let (p, f) = self.source_index(r);
        &self.inner.source.parts()[p as usize].fragments()[f as usize]
    }
    /// The participant id of a region's source.
    pub fn source_participant_of(&self, r: &TransferRegion) -> &str {
        self.inner.source.parts()[self.source_index(r).0 as usize].participant_id()
    }
    /// The target placement fragment a region writes.
    pub fn target_of(&self, r: &TransferRegion) -> &PlacementFragment {
        &self.inner.target.parts()[r.target_part as usize].fragments()[r.target_fragment as usize]
    }
    /// The participant id of a region's target.
    pub fn target_participant_of(&self, r: &TransferRegion) -> &str {
        self.inner.target.parts()[r.target_part as usize].participant_id()
    }
    /// Source executors (parts that send at least one region), sorted by rank.
    pub fn source_executors(&self) -> &[PlacementExecutorPlan] {
        &self.inner.source_executors
    }
    /// Target executors (parts that receive at least one region), sorted by rank.
    pub fn target_executors(&self) -> &[PlacementExecutorPlan] {
        &self.inner.target_executors
    }
    /// Sum of region bytes.
    pub fn total_bytes(&self) -> u64 {
        self.inner.total_bytes
    }
    /// Sum of region segment counts.
    pub fn total_segments(&self) -> u64 {
        self.inner.total_segments
    }
    /// Pipeline routes, sorted with an absent stage ordered as -1.
    pub fn pipeline_routes(&self) -> Vec<PipelineRoute> {
        let mut routes: BTreeMap<(u64, Option<u64>, u64, Option<u64>), Vec<u32>> = BTreeMap::new();
        for (i, r) in self.inner.regions.iter().enumerate() {
            let (s, t) = (self.source_of(r), self.target_of(r));
            routes
                .entry((s.rank().pp, s.pipeline_stage_id(), t.rank().pp, t.pipeline_stage_id()))
                .or_default()
                .push(i as u32);
        }
        routes
            .into_iter()
            .map(|((sp, ss, tp, ts), operation_indices)| PipelineRoute {
                source_pp: sp,
                source_pipeline_stage_id: ss,
                target_pp: tp,
                target_pipeline_stage_id: ts,
                operation_indices,
            })
            .collect()
    }
}
