//! Binding a logical transfer plan to source and target runtime bindings
//! (`live-transfer.md` §2–§3): attestation of every binding against its placement,
//! target physical-range validation, source/target allocation disjointness, and
//! executor plans per (participant, worker) on each side.
//!
//! Pure: addresses are compared and offset, never dereferenced. A bound
//! [`TransferPlan`] is evidence, not a capability: it has no `execute`, holds no
//! allocation owner and no lifetime token.

use super::region::{PlanningLimits, TransferRegion};
use super::transfer::LogicalTransferPlan;
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::model::{ParallelRank, Placement, PlacementFragment};
use crate::runtime::RuntimeFragmentSnapshot;
use crate::runtime::{
    check_bindings, check_shared_instances, first_repeated_fragment_id, validate_runtime_binding, BindingSpaces,
    RuntimeBinding, RuntimeFragment,
};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Which side of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The running instance that holds the current weights.
    Source,
    /// The running instance that receives them.
    Target,
}

impl Side {
    /// `source` or `target`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Target => "target",
        }
    }
    /// Parses `source` / `target` (`invalid executor side: <side>`).
    pub fn parse(s: &str) -> Result<Side> {
        match s {
            "source" => Ok(Side::Source),
            "target" => Ok(Side::Target),
            other => invalid(format!("invalid executor side: {other}")),
        }
    }
}

/// Where one bound fragment lives: index of the binding in the plan's bindings of
/// that side, and of the fragment in the binding's fragment list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BoundRef {
    /// Binding index (see [`TransferPlan::bindings`]).
    pub binding: u32,
    /// Fragment index in that binding.
    pub fragment: u32,
}

/// One executor of a bound plan (`ExecutorTransferPlan`): one (participant, worker)
/// on one side, with the runtime fragments the plan uses there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorTransferPlan {
    /// Side.
    pub side: Side,
    /// Index of the binding in [`TransferPlan::bindings`] of that side.
    pub binding: u32,
    /// Instance of the binding.
    pub instance_id: String,
    /// Placement id.
    pub placement_id: String,
    /// Placement digest.
    pub placement_digest: String,
    /// Participant.
    pub participant_id: String,
    /// The binding's lease id.
    pub runtime_lease_id: String,
    /// The binding's lease generation (every snapshot's `lease_generation`).
    pub lease_generation: u64,
    /// Worker.
    pub worker_id: String,
    /// The part's rank.
    pub rank: ParallelRank,
    /// Runtime fragment ids used by the plan on this worker, sorted.
    pub fragment_ids: Vec<String>,
    /// Fragment indices in the binding, same order as `fragment_ids`.
    pub fragments: Vec<u32>,
    /// Derived: ascending indices of the operations whose fragment on this side is
    /// one of `fragment_ids`.
    pub operation_indices: Vec<u32>,
}

/// One target write for [`validate_target_physical_ranges`]: a region bound to a
/// target runtime fragment in the address space of `instance_id`.
#[derive(Clone, Copy, Debug)]
pub struct TargetWrite<'a> {
    /// Instance of the target binding.
    pub instance_id: &'a str,
    /// Lease of the target binding.
    pub lease_id: &'a str,
    /// Lease generation of the target binding.
    pub lease_generation: u64,
    /// The bound target runtime fragment.
    pub target: &'a RuntimeFragment,
    /// Its placement fragment.
    pub target_placement: &'a PlacementFragment,
    /// The region.
    pub region: &'a TransferRegion,
    /// The region's source placement fragment.
    pub source_placement: &'a PlacementFragment,
}

/// The target physical-range rule (`load-path.md` §4 step 4): per address space
/// `(instance_id, worker_id, device)`, a target fragment exactly covered by its
/// regions contributes its whole view, any other fragment one range per lowered
/// segment (each consumes one unit of `budget`, afresh in each space:
/// `target physical segment scan budget exceeded`). Ranges may overlap only as
/// identical ranges of a safe declared alias (two tensors of one alias group with
/// identical geometry, same address, size, instance, lease and generation, regions
/// of identical geometry from sources of identical geometry); any other overlap
/// fails `conflicting target physical range: <runtime fragment id>`. Pure.
///
/// When several ranges conflict, the one named is the reference's first: address
/// spaces are scanned in the order of their first write, ranges in `(start, end,
/// write position in the space)` order (a complete fragment at the position of its
/// first write), and the first range that starts before the end of the ranges
/// already scanned is named.
pub fn validate_target_physical_ranges(writes: &[TargetWrite<'_>], budget: u64) -> Result<()> {
    // Address spaces numbered in first-appearance order (the reference's dict), and
    // runtime fragments by their id within a space. Consecutive writes almost always
    // share both (regions come in target fragment order): compare with the previous
    // write before hashing.
    let mut space_ids: HashMap<(&str, &str, &str), u32> = HashMap::default();
    let mut fragment_ids: HashMap<(u32, &str), u32> = HashMap::default();
    let mut space_of = Vec::with_capacity(writes.len());
    let mut fragment_of = Vec::with_capacity(writes.len());
    let mut last: Option<(&TargetWrite<'_>, u32, u32)> = None;
    for w in writes {
        let (space, fragment) = match last {
            Some((l, s, f)) if std::ptr::eq(l.target, w.target) && l.instance_id == w.instance_id => (s, f),
            _ => {
                let key = (w.instance_id, w.target.worker_id(), w.target.device());
                let n = space_ids.len() as u32;
                let s = *space_ids.entry(key).or_insert(n);
                let n = fragment_ids.len() as u32;
                (s, *fragment_ids.entry((s, w.target.fragment_id())).or_insert(n))
            }
        };
        last = Some((w, space, fragment));
        space_of.push(space);
        fragment_of.push(fragment);
    }
    physical_ranges(writes, &space_of, space_ids.len(), &fragment_of, fragment_ids.len(), budget, false)
}

/// A value that no index takes.
const NONE: u32 = u32::MAX;

/// [`validate_target_physical_ranges`] over writes whose address spaces
/// (`space_of`: `0..spaces`, numbered in first-appearance order) and target runtime
/// fragments (`fragment_of`: `0..fragments`, one number per runtime fragment id of a
/// space) are known. `covered`: every target fragment is known to be exactly covered
/// by its writes (the writes are all regions of a logical plan, whose planner
/// checked each target fragment's cover by the same boxes), so the cover is not
/// checked again (debug builds do).
fn physical_ranges(
    writes: &[TargetWrite<'_>],
    space_of: &[u32],
    spaces: usize,
    fragment_of: &[u32],
    fragments: usize,
    budget: u64,
    covered: bool,
) -> Result<()> {
    // The writes of each space, in order (one array cut by `space_start`).
    let mut space_start = vec![0u32; spaces + 1];
    for &s in space_of {
        space_start[s as usize + 1] += 1;
    }
    for k in 0..spaces {
        space_start[k + 1] += space_start[k];
    }
    let mut by_space = vec![0u32; writes.len()];
    let mut fill = space_start.clone();
    for (i, &s) in space_of.iter().enumerate() {
        by_space[fill[s as usize] as usize] = i as u32;
        fill[s as usize] += 1;
    }
    drop(fill);
    let mut local_of = vec![NONE; fragments];
    let mut order: Vec<u32> = Vec::new(); // fragments of the space, first-appearance order
    let mut count: Vec<u32> = Vec::new();
    let mut members: Vec<u32> = Vec::new(); // positions in `scoped`, by fragment
    let mut boxes: Vec<BoxRef<'_>> = Vec::new();
    let mut ranges: Vec<(u64, u64, u32, u32, bool)> = Vec::new();
    for k in 0..spaces {
        let scoped = &by_space[space_start[k] as usize..space_start[k + 1] as usize];
        // Positions in `scoped` grouped by target runtime fragment, in first-appearance order.
        order.clear();
        count.clear();
        for &i in scoped {
            let f = fragment_of[i as usize] as usize;
            if local_of[f] == NONE {
                local_of[f] = order.len() as u32;
                order.push(f as u32);
                count.push(0);
            }
            count[local_of[f] as usize] += 1;
        }
        let mut start = Vec::with_capacity(order.len() + 1);
        start.push(0u32);
        for c in &count {
            start.push(start.last().copied().unwrap_or(0) + c);
        }
        members.clear();
        members.resize(scoped.len(), 0);
        let mut next = start.clone();
        for (pos, &i) in scoped.iter().enumerate() {
            let lf = local_of[fragment_of[i as usize] as usize] as usize;
            members[next[lf] as usize] = pos as u32;
            next[lf] += 1;
        }
        for &f in &order {
            local_of[f as usize] = NONE;
        }
        let list = |lf: u32| &members[start[lf as usize] as usize..start[lf as usize + 1] as usize];
        let at = |pos: u32| &writes[scoped[pos as usize] as usize];
        // (start, end, position of the write in `scoped`, fragment index, complete?)
        ranges.clear();
        let mut used = 0u64;
        for lf in 0..order.len() as u32 {
            let list = list(lf);
            let w0 = at(list[0]);
            let mut cover = || {
                boxes.clear();
                boxes.extend(list.iter().map(|&p| {
                    let r = at(p).region;
                    BoxRef::new(&r.overlap_offset, &r.overlap_shape)
                }));
                geometry::boxes_exactly_cover(w0.target_placement.as_box(), &boxes, HIGH_DIM_COMPARISON_BUDGET)
                    .unwrap_or(false)
            };
            debug_assert!(!covered || cover());
            if covered || cover() {
                ranges.push((w0.target.address(), w0.target.address() + w0.target.nbytes(), list[0], lf, true));
                continue;
            }
            for &p in list {
                let w = at(p);
                let mut err = None;
                w.region.for_each_segment(u64::MAX, |_, t, n| {
                    used += 1;
                    if used > budget {
                        err.get_or_insert(());
                        return;
                    }
                    ranges.push((w.target.address() + t, w.target.address() + t + n, p, lf, false));
                })?;
                if err.is_some() {
                    return invalid(format!("target physical segment scan budget exceeded: {budget}"));
                }
            }
        }
        ranges.sort_unstable_by_key(|r| (r.0, r.1, r.2));
        let mut prev: Option<(u64, u64, u32, u32, bool)> = None; // the range holding the max end
        for &cur in &ranges {
            if let Some(p) = prev {
                if cur.0 < p.1 {
                    let same = cur.0 == p.0 && cur.1 == p.1 && cur.4 && p.4;
                    if !(same && safe_alias(&at, list(p.3), list(cur.3))) {
                        return invalid(format!(
                            "conflicting target physical range: {}",
                            at(cur.2).target.fragment_id()
                        ));
                    }
                    continue;
                }
            }
            if prev.is_none_or(|p| cur.1 > p.1) {
                prev = Some(cur);
            }
        }
    }
    Ok(())
}

fn same_geometry(a: &TransferRegion, b: &TransferRegion) -> bool {
    a.overlap_offset == b.overlap_offset
        && a.overlap_shape == b.overlap_shape
        && a.source_base_offset == b.source_base_offset
        && a.target_base_offset == b.target_base_offset
        && a.inner_bytes == b.inner_bytes
        && a.outer_loop_counts == b.outer_loop_counts
        && a.source_strides == b.source_strides
        && a.target_strides == b.target_strides
}

/// Whether two complete target fragments (`la`, `lb`: the positions of their
/// writes, `at` the write at a position) are a safe declared alias of each other.
fn safe_alias<'w>(at: &impl Fn(u32) -> &'w TargetWrite<'w>, la: &[u32], lb: &[u32]) -> bool {
    let (wa, wb) = (at(la[0]), at(lb[0]));
    let (pa, pb) = (wa.target_placement, wb.target_placement);
    let group = pa.aliases();
    let alias = pa.tensor_id() != pb.tensor_id()
        && group.len() >= 2
        && group == pb.aliases()
        && pa.global_offset() == pb.global_offset()
        && pa.local_shape() == pb.local_shape()
        && wa.target.address() == wb.target.address()
        && wa.target.nbytes() == wb.target.nbytes()
        && wa.instance_id == wb.instance_id
        && wa.lease_id == wb.lease_id
        && wa.lease_generation == wb.lease_generation;
    if !alias {
        return false;
    }
    la.len() == lb.len()
        && la.iter().zip(lb).all(|(&x, &y)| {
            let (x, y) = (at(x), at(y));
            same_geometry(x.region, y.region)
                && x.source_placement.global_offset() == y.source_placement.global_offset()
                && x.source_placement.local_shape() == y.source_placement.local_shape()
                && x.source_placement.aliases() == y.source_placement.aliases()
        })
}

/// A logical plan bound to runtime bindings on both sides (`TransferPlan`, live
/// form). Immutable, `Send + Sync`, cheap to clone. Equality is plan equality
/// (`live-transfer.md` §12.2 step 4): same logical plan, same kept bindings.
#[derive(Clone, Debug)]
pub struct TransferPlan {
    inner: Arc<BoundInner>,
}

#[derive(Debug)]
struct BoundInner {
    logical: LogicalTransferPlan,
    source_bindings: Vec<RuntimeBinding>,
    target_bindings: Vec<RuntimeBinding>,
    /// Per region: (source ref, target ref).
    operations: Vec<(BoundRef, BoundRef)>,
    source_executors: Vec<ExecutorTransferPlan>,
    target_executors: Vec<ExecutorTransferPlan>,
}

impl PartialEq for TransferPlan {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
            || (self.inner.logical == o.inner.logical
                && self.inner.source_bindings == o.inner.source_bindings
                && self.inner.target_bindings == o.inner.target_bindings)
    }
}
impl Eq for TransferPlan {}

/// A validator of target physical ranges (see [`TransferPlan::bind_with`]).
pub type PhysicalRangeValidator<'v> = &'v dyn Fn(&[TargetWrite<'_>], u64) -> Result<()>;

/// Binding inputs of one side after the §2 step 2 checks.
struct SideBinding<'a> {
    kept: Vec<RuntimeBinding>,
    /// The address spaces of each kept binding's fragments (same order as `kept`).
    spaces: Vec<BindingSpaces<'a>>,
    /// Placement part index -> index in `kept` ([`NOT_KEPT`]: none).
    by_part: Vec<u32>,
}

impl SideBinding<'_> {
    /// The address space `(instance_id, worker_id, device)` of local space `space`
    /// of kept binding `binding`.
    fn space(&self, binding: u32, space: u32) -> (&str, &str, &str) {
        let (worker, device) = self.spaces[binding as usize].keys[space as usize];
        (self.kept[binding as usize].instance_id(), worker, device)
    }
    /// The local space of a bound fragment.
    fn space_of(&self, r: BoundRef) -> u32 {
        self.spaces[r.binding as usize].of_fragment[r.fragment as usize]
    }
}

/// A part without a kept binding in [`SideBinding::by_part`].
const NOT_KEPT: u32 = NONE;

/// §2 step 2 for one side; `required` are the part indices of the side's executors.
fn bind_side<'a>(
    placement: &Placement,
    bindings: &'a [RuntimeBinding],
    required: &[u32],
    side: Side,
) -> Result<SideBinding<'a>> {
    let s = side.as_str();
    if bindings.is_empty() {
        return invalid(format!("logical plan requires {s} runtime bindings"));
    }
    let mut keys: HashSet<(&str, &str)> = HashSet::default();
    for b in bindings {
        if !keys.insert((b.placement_id(), b.participant_id())) {
            return invalid(format!("duplicate {s} runtime binding participant: {}", b.participant_id()));
        }
    }
    // The per-fragment work of this step in one pass (on several threads for many
    // fragments): every binding paired with the placement and its ranges checked
    // (the subset validation below), and the runtime fragment ids hashed. Its
    // results are reported in the order of the checks.
    let mut checks = check_bindings(placement, bindings);
    if checks.may_repeat_ids {
        if let Some((_, id)) = first_repeated_fragment_id(bindings) {
            return invalid(format!("duplicate {s} runtime fragment_id: {id}"));
        }
    }
    if bindings.iter().any(|b| b.placement_id() != placement.placement_id()) {
        return invalid(format!("logical plan and {s} placement IDs differ"));
    }
    let parts = placement.parts();
    let part_of: Vec<Option<usize>> =
        bindings.iter().map(|b| parts.binary_search_by(|p| p.participant_id().cmp(b.participant_id())).ok()).collect();
    let mut bound = vec![false; parts.len()];
    for &p in part_of.iter().flatten() {
        bound[p] = true;
    }
    let differ = || Error::invalid(format!("logical plan and {s} runtime binding participants differ"));
    if required.iter().any(|&p| !bound[p as usize]) {
        return Err(differ());
    }
    if part_of.iter().any(|p| p.is_none_or(|p| parts[p].fragments().is_empty())) {
        return Err(differ());
    }
    // The subset validation (`validate_binding_subset`): its participants are
    // distinct (unique keys under one placement id) and so are its runtime fragment
    // ids (above), so what is left are each binding's own checks, then the ranges of
    // instances that hold several bindings.
    if let Some((_, e)) = checks.first_error {
        return Err(e);
    }
    check_shared_instances(placement, bindings)?;
    let mut is_required = vec![false; parts.len()];
    for &p in required {
        is_required[p as usize] = true;
    }
    let mut kept = Vec::with_capacity(required.len());
    let mut spaces = Vec::with_capacity(required.len());
    let mut by_part = vec![NOT_KEPT; parts.len()];
    for ((b, p), sp) in bindings.iter().zip(part_of).zip(checks.spaces.drain(..)) {
        let p = p.expect("every binding has a part (checked above)");
        if is_required[p] {
            by_part[p] = kept.len() as u32;
            kept.push(b.clone());
            spaces.push(sp);
        }
    }
    Ok(SideBinding { kept, spaces, by_part })
}

fn space_text(instance: &str, worker: &str, device: &str) -> String {
    crate::pyrepr::repr(&(instance, worker, device))
}

impl TransferPlan {
    /// `bind_logical_transfer_plan(logical, target_bindings, source_bindings=...)`
    /// (`live-transfer.md` §2) with the default physical-range validator.
    ///
    /// Bindings of participants that hold fragments but take no part are accepted
    /// and ignored; only the participants with executors are kept. Errors
    /// (contract): `logical plan requires <side> runtime bindings`, `duplicate
    /// <side> runtime binding participant: <id>`, `duplicate <side> runtime
    /// fragment_id: <id>`, `logical plan and <side> placement IDs differ`, `logical
    /// plan and <side> runtime binding participants differ`, the binding validation
    /// errors of `data-model.md` §12, `missing runtime binding for placement
    /// fragment: <id>`, `conflicting target physical range: <id>`, `target physical
    /// segment scan budget exceeded`, `source and target runtime storage allocations
    /// overlap in address space <space>; in-place reshard is unsupported`,
    /// `duplicate <side> executor rank and worker: <key>`.
    pub fn bind(
        logical: &LogicalTransferPlan,
        target_bindings: &[RuntimeBinding],
        source_bindings: &[RuntimeBinding],
    ) -> Result<TransferPlan> {
        Self::bind_impl(logical, target_bindings, source_bindings, None)
    }

    /// [`Self::bind`] with an injected physical-range validator (called once with
    /// every target write and the budget `max_total_lowered_segments`).
    pub fn bind_with(
        logical: &LogicalTransferPlan,
        target_bindings: &[RuntimeBinding],
        source_bindings: &[RuntimeBinding],
        validator: PhysicalRangeValidator<'_>,
    ) -> Result<TransferPlan> {
        Self::bind_impl(logical, target_bindings, source_bindings, Some(validator))
    }

    /// `bind_with`; no validator: [`validate_target_physical_ranges`], with the
    /// address spaces and fragments of the writes known from the bindings' checks.
    fn bind_impl(
        logical: &LogicalTransferPlan,
        target_bindings: &[RuntimeBinding],
        source_bindings: &[RuntimeBinding],
        validator: Option<PhysicalRangeValidator<'_>>,
    ) -> Result<TransferPlan> {
        let (source, target) = (logical.source(), logical.target());
        let t_required: Vec<u32> = logical.target_executors().iter().map(|e| e.part).collect();
        let s_required: Vec<u32> = logical.source_executors().iter().map(|e| e.part).collect();
        let tb = bind_side(target, target_bindings, &t_required, Side::Target)?;
        let sb = bind_side(source, source_bindings, &s_required, Side::Source)?;
        // A kept binding holds exactly its part's fragments, in the same (placement
        // fragment id) order: a region's placement fragment index is its runtime
        // fragment index.
        let mut operations = Vec::with_capacity(logical.regions().len());
        for r in logical.regions() {
            let t = locate(&tb, r.target_part, r.target_fragment).ok_or_else(|| {
                Error::invalid(format!(
                    "missing runtime binding for placement fragment: {}",
                    logical.target_of(r).placement_fragment_id()
                ))
            })?;
            let (sp, sf) = logical.source_index(r);
            let s = locate(&sb, sp, sf).ok_or_else(|| {
                Error::invalid(format!(
                    "missing source runtime binding for placement fragment: {}",
                    logical.source_of(r).placement_fragment_id()
                ))
            })?;
            debug_assert_eq!(frag(&tb, t).1.placement_fragment_id(), logical.target_of(r).placement_fragment_id());
            debug_assert_eq!(frag(&sb, s).1.placement_fragment_id(), logical.source_of(r).placement_fragment_id());
            operations.push((s, t));
        }
        // Target physical ranges.
        let writes: Vec<TargetWrite<'_>> = logical
            .regions()
            .iter()
            .zip(&operations)
            .map(|(r, &(_, t))| {
                let (b, f) = frag(&tb, t);
                TargetWrite {
                    instance_id: b.instance_id(),
                    lease_id: b.lease_id(),
                    lease_generation: b.lease_generation(),
                    target: f,
                    target_placement: logical.target_of(r),
                    region: r,
                    source_placement: logical.source_of(r),
                }
            })
            .collect();
        let budget = logical.limits().max_total_lowered_segments;
        match validator {
            Some(validator) => validator(&writes, budget)?,
            None => {
                // Spaces numbered in first-appearance order; a target runtime fragment
                // is its (kept binding, fragment) (runtime fragment ids are unique on a
                // side, so that is one number per id of a space).
                let mut start = Vec::with_capacity(tb.kept.len() + 1);
                start.push(0u32);
                for b in &tb.kept {
                    start.push(start.last().copied().unwrap_or(0) + b.fragments().len() as u32);
                }
                let mut global: Vec<Vec<u32>> = tb.spaces.iter().map(|s| vec![NONE; s.keys.len()]).collect();
                let mut ids: HashMap<(&str, &str, &str), u32> = HashMap::default();
                let mut space_of = Vec::with_capacity(operations.len());
                let mut fragment_of = Vec::with_capacity(operations.len());
                for &(_, t) in &operations {
                    let local = tb.space_of(t);
                    let g = &mut global[t.binding as usize][local as usize];
                    if *g == NONE {
                        let n = ids.len() as u32;
                        *g = *ids.entry(tb.space(t.binding, local)).or_insert(n);
                    }
                    space_of.push(*g);
                    fragment_of.push(start[t.binding as usize] + t.fragment);
                }
                let fragments = *start.last().unwrap_or(&0) as usize;
                physical_ranges(&writes, &space_of, ids.len(), &fragment_of, fragments, budget, true)?;
            }
        }
        drop(writes);
        let source_use = executor_groups(&sb, &operations, Side::Source);
        let target_use = executor_groups(&tb, &operations, Side::Target);
        check_disjoint(&sb, &source_use, &tb, &target_use)?;
        let source_executors = build_executors(source, &sb, source_use.groups, Side::Source)?;
        let target_executors = build_executors(target, &tb, target_use.groups, Side::Target)?;
        if source_executors.is_empty() && !operations.is_empty() {
            return invalid("live source requires executor provenance");
        }
        Ok(TransferPlan {
            inner: Arc::new(BoundInner {
                logical: logical.clone(),
                source_bindings: sb.kept,
                target_bindings: tb.kept,
                operations,
                source_executors,
                target_executors,
            }),
        })
    }

    /// The logical plan.
    pub fn logical(&self) -> &LogicalTransferPlan {
        &self.inner.logical
    }
    /// Resource id.
    pub fn resource_id(&self) -> &str {
        self.inner.logical.target().resource_id()
    }
    /// Revision.
    pub fn revision(&self) -> &str {
        self.inner.logical.target().revision()
    }
    /// Weight generation (the target placement's).
    pub fn weight_generation(&self) -> u64 {
        self.inner.logical.target().weight_generation()
    }
    /// The placement of `side`.
    pub fn placement(&self, side: Side) -> &Arc<Placement> {
        match side {
            Side::Source => self.inner.logical.source(),
            Side::Target => self.inner.logical.target(),
        }
    }
    /// Planning limits.
    pub fn planning_limits(&self) -> PlanningLimits {
        self.inner.logical.limits()
    }
    /// Regions (same order as the logical plan's; geometry unchanged).
    pub fn regions(&self) -> &[TransferRegion] {
        self.inner.logical.regions()
    }
    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        self.inner.logical.total_bytes()
    }
    /// The kept bindings of `side` (participants with executors only).
    pub fn bindings(&self, side: Side) -> &[RuntimeBinding] {
        match side {
            Side::Source => &self.inner.source_bindings,
            Side::Target => &self.inner.target_bindings,
        }
    }
    /// The bound (source, target) of operation `i`.
    pub fn operation(&self, i: usize) -> (BoundRef, BoundRef) {
        self.inner.operations[i]
    }
    /// The binding and runtime fragment of `r` on `side`.
    pub fn fragment(&self, side: Side, r: BoundRef) -> (&RuntimeBinding, &RuntimeFragment) {
        let b = &self.bindings(side)[r.binding as usize];
        (b, &b.fragments()[r.fragment as usize])
    }
    /// The runtime fragment operation `i` uses on `side`.
    pub fn operation_fragment(&self, i: usize, side: Side) -> (&RuntimeBinding, &RuntimeFragment) {
        let (s, t) = self.inner.operations[i];
        self.fragment(side, if side == Side::Source { s } else { t })
    }
    /// Executors of `side`, sorted by rank then worker.
    pub fn executors(&self, side: Side) -> &[ExecutorTransferPlan] {
        match side {
            Side::Source => &self.inner.source_executors,
            Side::Target => &self.inner.target_executors,
        }
    }
    /// `operation_indices_for_executor`: the executor must be one of this plan's
    /// (`<side> executor is not part of this transfer plan`).
    pub fn operation_indices_for_executor(&self, executor: &ExecutorTransferPlan) -> Result<&[u32]> {
        self.executors(executor.side)
            .iter()
            .find(|e| *e == executor)
            .map(|e| e.operation_indices.as_slice())
            .ok_or_else(|| {
                Error::invalid(format!("{} executor is not part of this transfer plan", executor.side.as_str()))
            })
    }
    /// The snapshot of the `k`-th fragment of `executor` (lease generation = the
    /// binding's generation).
    pub fn executor_snapshot(&self, executor: &ExecutorTransferPlan, k: usize) -> RuntimeFragmentSnapshot {
        let b = &self.bindings(executor.side)[executor.binding as usize];
        let f = &b.fragments()[executor.fragments[k] as usize];
        let placement = self.placement(executor.side);
        let pf = placement
            .part(b.participant_id())
            .and_then(|p| p.fragment(f.placement_fragment_id()))
            .expect("a bound fragment pairs with its placement");
        RuntimeFragmentSnapshot::new(pf, f, b.lease_generation())
    }

    /// `resolve_executor_plans(plan, placement, binding, side)` (§3.3): the indices of
    /// the executors of `side` that `binding` (as it is now) serves. Errors
    /// (contract): `transfer plan has no <side> executor metadata`, `transfer plan
    /// identity differs from <side> placement`, binding validation errors,
    /// `<side> executor snapshot mismatch: unknown instance`, `<side> executor
    /// snapshot mismatch` (any planned fragment missing or changed, lease id or
    /// generation changed).
    pub fn resolve_executors(&self, side: Side, placement: &Placement, binding: &RuntimeBinding) -> Result<Vec<usize>> {
        self.resolve_executors_with(side, placement, binding, true)
    }

    /// [`Self::resolve_executors`] for a binding the caller has just validated
    /// against `placement` (`validate_runtime_binding` is pure: the same pair gives
    /// the same result), skipping that validation.
    pub(crate) fn resolve_validated(
        &self,
        side: Side,
        placement: &Placement,
        binding: &RuntimeBinding,
    ) -> Result<Vec<usize>> {
        self.resolve_executors_with(side, placement, binding, false)
    }

    fn resolve_executors_with(
        &self,
        side: Side,
        placement: &Placement,
        binding: &RuntimeBinding,
        validate: bool,
    ) -> Result<Vec<usize>> {
        let s = side.as_str();
        let execs = self.executors(side);
        if execs.is_empty() {
            return invalid(format!("transfer plan has no {s} executor metadata"));
        }
        let planned = self.placement(side);
        if placement.placement_id() != planned.placement_id()
            || placement.digest() != planned.digest()
            || placement.resource_id() != self.resource_id()
            || placement.revision() != self.revision()
            || placement.weight_generation() != self.weight_generation()
        {
            return invalid(format!("transfer plan identity differs from {s} placement"));
        }
        if validate {
            validate_runtime_binding(placement, binding)?;
        }
        let mine: Vec<usize> = (0..execs.len())
            .filter(|&i| {
                execs[i].instance_id == binding.instance_id() && execs[i].participant_id == binding.participant_id()
            })
            .collect();
        if mine.is_empty() {
            return invalid(format!("{s} executor snapshot mismatch: unknown instance"));
        }
        let mismatch = || Error::invalid(format!("{s} executor snapshot mismatch"));
        for &i in &mine {
            let e = &execs[i];
            if e.runtime_lease_id != binding.lease_id() || e.lease_generation != binding.lease_generation() {
                return Err(mismatch());
            }
            let planned_binding = &self.bindings(side)[e.binding as usize];
            if binding.shares_fragments(planned_binding) {
                // One fragment list (the binding the plan was bound to, or a clone).
                continue;
            }
            for &fi in &e.fragments {
                let pf = &planned_binding.fragments()[fi as usize];
                match binding.fragment_for(pf.placement_fragment_id()) {
                    Some(cur) if cur == pf => {}
                    _ => return Err(mismatch()),
                }
            }
        }
        Ok(mine)
    }
}

fn frag<'s>(side: &'s SideBinding<'_>, r: BoundRef) -> (&'s RuntimeBinding, &'s RuntimeFragment) {
    let b = &side.kept[r.binding as usize];
    (b, &b.fragments()[r.fragment as usize])
}

fn locate(side: &SideBinding<'_>, part: u32, fragment: u32) -> Option<BoundRef> {
    let b = *side.by_part.get(part as usize)?;
    (b != NOT_KEPT).then_some(BoundRef { binding: b, fragment })
}

/// The fragments and operations of one executor before it is built: one kept
/// binding's fragments on one worker that the operations use.
struct ExecutorGroup<'a> {
    binding: u32,
    worker: &'a str,
    /// Distinct fragment indices in the binding, in order of first use.
    fragments: Vec<u32>,
    /// Ascending operation indices.
    operations: Vec<u32>,
}

/// How the operations use one side's bindings.
struct SideUse<'a> {
    /// One group per used (kept binding, worker), in no particular order.
    groups: Vec<ExecutorGroup<'a>>,
    /// Per kept binding, per local space: its group ([`NONE`]: the space is unused).
    group_of: Vec<Vec<u32>>,
}

fn executor_groups<'a>(side_binding: &SideBinding<'a>, operations: &[(BoundRef, BoundRef)], side: Side) -> SideUse<'a> {
    let kept = &side_binding.kept;
    let mut start = Vec::with_capacity(kept.len() + 1);
    start.push(0usize);
    for b in kept {
        start.push(start.last().copied().unwrap_or(0) + b.fragments().len());
    }
    let mut seen = vec![false; start[kept.len()]];
    let mut groups: Vec<ExecutorGroup<'a>> = Vec::new();
    let mut group_of: Vec<Vec<u32>> = side_binding.spaces.iter().map(|s| vec![NONE; s.keys.len()]).collect();
    for (i, &(s, t)) in operations.iter().enumerate() {
        let r = if side == Side::Source { s } else { t };
        let (b, local) = (r.binding as usize, side_binding.space_of(r) as usize);
        let mut g = group_of[b][local];
        if g == NONE {
            // Spaces of one worker (other devices) share its group.
            let keys = &side_binding.spaces[b].keys;
            let worker = keys[local].0;
            g = (0..keys.len()).find(|&k| keys[k].0 == worker && group_of[b][k] != NONE).map_or_else(
                || {
                    groups.push(ExecutorGroup {
                        binding: r.binding,
                        worker,
                        fragments: Vec::new(),
                        operations: Vec::new(),
                    });
                    (groups.len() - 1) as u32
                },
                |k| group_of[b][k],
            );
            group_of[b][local] = g;
        }
        let seen = &mut seen[start[b] + r.fragment as usize];
        let group = &mut groups[g as usize];
        if !*seen {
            *seen = true;
            group.fragments.push(r.fragment);
        }
        group.operations.push(i as u32);
    }
    SideUse { groups, group_of }
}

/// Source/target allocation disjointness (§2.2): in every address space
/// `(instance_id, worker_id, device)` that both sides use (in sorted order), no
/// source storage allocation of an operation intersects a target one.
fn check_disjoint(
    sb: &SideBinding<'_>,
    source: &SideUse<'_>,
    tb: &SideBinding<'_>,
    target: &SideUse<'_>,
) -> Result<()> {
    type Space<'s> = (&'s str, &'s str, &'s str);
    let used = |side: &'_ SideBinding<'_>, u: &SideUse<'_>| -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for (b, groups) in u.group_of.iter().enumerate() {
            for (k, &g) in groups.iter().enumerate() {
                if g != NONE {
                    let (i, w, d) = side.space(b as u32, k as u32);
                    out.insert((i.to_string(), w.to_string(), d.to_string()));
                }
            }
        }
        out
    };
    let (source_spaces, target_spaces) = (used(sb, source), used(tb, target));
    let shared: Vec<&(String, String, String)> = source_spaces.intersection(&target_spaces).collect();
    if shared.is_empty() {
        return Ok(());
    }
    let position: HashMap<Space<'_>, usize> =
        shared.iter().enumerate().map(|(k, (i, w, d))| ((i.as_str(), w.as_str(), d.as_str()), k)).collect();
    // The storage range of every used fragment in a shared space.
    let ranges_of = |side: &SideBinding<'_>, u: &SideUse<'_>| -> Vec<Vec<(u64, u64)>> {
        let mut out = vec![Vec::new(); shared.len()];
        for g in &u.groups {
            let b = &side.kept[g.binding as usize];
            for &f in &g.fragments {
                let r = BoundRef { binding: g.binding, fragment: f };
                if let Some(&k) = position.get(&side.space(g.binding, side.space_of(r))) {
                    let rf = &b.fragments()[f as usize];
                    out[k].push((rf.storage_address(), rf.storage_address() + rf.storage_nbytes()));
                }
            }
        }
        out
    };
    let (source_ranges, target_ranges) = (ranges_of(sb, source), ranges_of(tb, target));
    for (k, (mut src, mut tgt)) in source_ranges.into_iter().zip(target_ranges).enumerate() {
        src.sort_unstable();
        src.dedup();
        tgt.sort_unstable();
        tgt.dedup();
        // Two sorted lists: any intersection of a source and a target range.
        let (mut a, mut b) = (0, 0);
        while a < src.len() && b < tgt.len() {
            let (s, t) = (src[a], tgt[b]);
            if s.0 < t.1 && t.0 < s.1 {
                let (i, w, d) = shared[k];
                return invalid(format!(
                    "source and target runtime storage allocations overlap in address space {}; in-place reshard is unsupported",
                    space_text(i, w, d)
                ));
            }
            if s.1 <= t.1 {
                a += 1;
            } else {
                b += 1;
            }
        }
    }
    Ok(())
}

fn build_executors(
    placement: &Placement,
    side_binding: &SideBinding<'_>,
    groups: Vec<ExecutorGroup<'_>>,
    side: Side,
) -> Result<Vec<ExecutorTransferPlan>> {
    let mut keys: HashSet<((u64, u64, u64, u64), &str)> = HashSet::default();
    for g in &groups {
        let b = &side_binding.kept[g.binding as usize];
        let rank = placement.part(b.participant_id()).expect("a kept binding has a part").rank();
        if !keys.insert((rank.order_key(), g.worker)) {
            return invalid(format!(
                "duplicate {} executor rank and worker: ({:?}, {})",
                side.as_str(),
                rank.order_key(),
                g.worker
            ));
        }
    }
    // The fragment lists are sorted and their ids copied on several threads for
    // many fragments.
    let total: usize = groups.iter().map(|g| g.fragments.len()).sum();
    let groups: Vec<std::sync::Mutex<Option<ExecutorGroup<'_>>>> =
        groups.into_iter().map(|g| std::sync::Mutex::new(Some(g))).collect();
    let mut out = crate::par::try_map(groups.len(), crate::par::workers(total), |k| {
        let g = groups[k].lock().unwrap_or_else(|p| p.into_inner()).take().expect("each group is built once");
        let ExecutorGroup { binding: bi, worker, fragments: mut frags, operations: ops } = g;
        let b = &side_binding.kept[bi as usize];
        let rank = placement.part(b.participant_id()).expect("a kept binding has a part").rank();
        let fragments = b.fragments();
        frags.sort_unstable_by(|&x, &y| fragments[x as usize].fragment_id().cmp(fragments[y as usize].fragment_id()));
        Ok::<_, Error>(ExecutorTransferPlan {
            side,
            binding: bi,
            instance_id: b.instance_id().to_string(),
            placement_id: b.placement_id().to_string(),
            placement_digest: b.placement_digest().to_string(),
            participant_id: b.participant_id().to_string(),
            runtime_lease_id: b.lease_id().to_string(),
            lease_generation: b.lease_generation(),
            worker_id: worker.to_string(),
            rank,
            fragment_ids: frags.iter().map(|&x| fragments[x as usize].fragment_id().to_string()).collect(),
            fragments: frags,
            operation_indices: ops,
        })
    })?;
    // Placement part order, then workers sorted; then a stable sort by rank.
    out.sort_by(|a, b| {
        (a.participant_id.as_str(), a.worker_id.as_str()).cmp(&(b.participant_id.as_str(), b.worker_id.as_str()))
    });
    out.sort_by_key(|e| e.rank.order_key());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Placement;
    use crate::plan::upload::tests::fixture_binding;

    /// The parallel paths (par.rs) give the same logical plans, bound plans and
    /// errors as a sequential run: every transfer fixture, planned and bound with 1,
    /// 2, 3 and 8 workers per stage.
    #[test]
    fn worker_count_changes_no_transfer_plan_or_error() {
        let mut bound = 0;
        for (name, fixture) in crate::testutil::conformance_fixtures("transfer") {
            let inputs = &fixture["inputs"];
            let placement = |k: &str| {
                let text = match &inputs[k] {
                    serde_json::Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                Placement::from_json(text.as_bytes()).map(Arc::new)
            };
            let l = &inputs["planning_limits"];
            let get = |k: &str, d: u64| l.get(k).map_or(d, |v| v.as_i64().map_or(0, |x| x.max(0) as u64));
            let limits = PlanningLimits {
                max_transfer_regions: get("max_transfer_regions", 1_000_000),
                max_segments_per_region: get("max_segments_per_region", 1_000_000),
                max_total_lowered_segments: get("max_total_lowered_segments", 10_000_000),
            };
            type Outcome = (LogicalTransferPlan, Option<(TransferPlan, Vec<Vec<ExecutorTransferPlan>>)>);
            let run = |workers: usize| -> Result<Outcome> {
                crate::par::with_workers(Some(workers), || {
                    let (source, target) = (placement("source_placement")?, placement("target_placement")?);
                    let logical = match inputs.get("target_participant_id").and_then(|p| p.as_str()) {
                        Some(p) => LogicalTransferPlan::plan_local(source, target, Some(p), limits)?,
                        None => LogicalTransferPlan::plan(source, target, limits)?,
                    };
                    let Some(sb) = inputs.get("source_bindings").and_then(|b| b.as_array()) else {
                        return Ok((logical, None));
                    };
                    let sb = sb.iter().map(fixture_binding).collect::<Result<Vec<_>>>()?;
                    let tb = inputs["target_bindings"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(fixture_binding)
                        .collect::<Result<Vec<_>>>()?;
                    let plan = TransferPlan::bind(&logical, &tb, &sb)?;
                    let executors = vec![plan.executors(Side::Source).to_vec(), plan.executors(Side::Target).to_vec()];
                    Ok((logical, Some((plan, executors))))
                })
            };
            let sequential = run(1);
            bound += usize::from(matches!(&sequential, Ok((_, Some(_)))));
            for workers in [2, 3, 8] {
                match (&sequential, &run(workers)) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a.0.regions(), b.0.regions(), "{name}: {workers} workers");
                        assert_eq!(a.0.source_executors(), b.0.source_executors(), "{name}: {workers} workers");
                        assert_eq!(a.0.target_executors(), b.0.target_executors(), "{name}: {workers} workers");
                        match (&a.1, &b.1) {
                            (Some((pa, ea)), Some((pb, eb))) => {
                                assert!(pa == pb, "{name}: {workers} workers");
                                assert_eq!(ea, eb, "{name}: {workers} workers");
                                let ops = |p: &TransferPlan| {
                                    (0..p.regions().len()).map(|i| p.operation(i)).collect::<Vec<_>>()
                                };
                                assert_eq!(ops(pa), ops(pb), "{name}: {workers} workers");
                            }
                            (None, None) => {}
                            _ => panic!("{name}: bound differs"),
                        }
                    }
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", name),
                    (a, b) => {
                        panic!("{}: sequential {:?} but {workers} workers {:?}", name, a.is_ok(), b.is_ok())
                    }
                }
            }
        }
        assert!(bound >= 5, "the bound transfer fixtures were found and bound ({bound})");
    }
}
