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
use crate::runtime::{validate_binding_subset, validate_runtime_binding, RuntimeBinding, RuntimeFragment};
use std::collections::BTreeMap;
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
    /// The binding's generation (every snapshot's `lease_generation`).
    pub generation: u64,
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
    /// Generation of the target binding.
    pub generation: u64,
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
    // Writes by address space, spaces in first-appearance order (the reference's dict).
    let mut space_of: HashMap<(&str, &str, &str), usize> = HashMap::default();
    let mut spaces: Vec<Vec<usize>> = Vec::new();
    for (i, w) in writes.iter().enumerate() {
        let key = (w.instance_id, w.target.worker_id(), w.target.device());
        let s = *space_of.entry(key).or_insert_with(|| {
            spaces.push(Vec::new());
            spaces.len() - 1
        });
        spaces[s].push(i);
    }
    for scoped in &spaces {
        // Positions in `scoped` grouped by target runtime fragment, in first-appearance order.
        let mut fragment_of: HashMap<&str, usize> = HashMap::default();
        let mut fragments: Vec<Vec<usize>> = Vec::new();
        for (pos, &i) in scoped.iter().enumerate() {
            let f = *fragment_of.entry(writes[i].target.fragment_id()).or_insert_with(|| {
                fragments.push(Vec::new());
                fragments.len() - 1
            });
            fragments[f].push(pos);
        }
        // (start, end, position of the write in `scoped`, fragment index, complete?)
        let mut ranges: Vec<(u64, u64, usize, usize, bool)> = Vec::new();
        let mut used = 0u64;
        for (f, list) in fragments.iter().enumerate() {
            let w0 = &writes[scoped[list[0]]];
            let boxes: Vec<BoxRef<'_>> = list
                .iter()
                .map(|&p| {
                    let r = writes[scoped[p]].region;
                    BoxRef::new(&r.overlap_offset, &r.overlap_shape)
                })
                .collect();
            let complete =
                geometry::boxes_exactly_cover(w0.target_placement.as_box(), &boxes, HIGH_DIM_COMPARISON_BUDGET)
                    .unwrap_or(false);
            if complete {
                ranges.push((w0.target.address(), w0.target.address() + w0.target.nbytes(), list[0], f, true));
                continue;
            }
            for &p in list {
                let w = &writes[scoped[p]];
                let mut err = None;
                w.region.for_each_segment(u64::MAX, |_, t, n| {
                    used += 1;
                    if used > budget {
                        err.get_or_insert(());
                        return;
                    }
                    ranges.push((w.target.address() + t, w.target.address() + t + n, p, f, false));
                })?;
                if err.is_some() {
                    return invalid(format!("target physical segment scan budget exceeded: {budget}"));
                }
            }
        }
        ranges.sort_unstable_by_key(|r| (r.0, r.1, r.2));
        let mut prev: Option<(u64, u64, usize, usize, bool)> = None; // the range holding the max end
        for cur in ranges {
            if let Some(p) = prev {
                if cur.0 < p.1 {
                    let same = cur.0 == p.0 && cur.1 == p.1 && cur.4 && p.4;
                    if !(same && safe_alias(writes, scoped, &fragments[p.3], &fragments[cur.3])) {
                        return invalid(format!(
                            "conflicting target physical range: {}",
                            writes[scoped[cur.2]].target.fragment_id()
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

/// Whether two complete target fragments (`la`, `lb`: positions in `scoped` of
/// their writes) are a safe declared alias of each other.
fn safe_alias(writes: &[TargetWrite<'_>], scoped: &[usize], la: &[usize], lb: &[usize]) -> bool {
    let (wa, wb) = (&writes[scoped[la[0]]], &writes[scoped[lb[0]]]);
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
        && wa.generation == wb.generation;
    if !alias {
        return false;
    }
    la.len() == lb.len()
        && la.iter().zip(lb).all(|(&x, &y)| {
            let (x, y) = (&writes[scoped[x]], &writes[scoped[y]]);
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
struct SideBinding {
    kept: Vec<RuntimeBinding>,
    by_participant: HashMap<String, u32>,
}

fn bind_side(placement: &Placement, bindings: &[RuntimeBinding], required: &[&str], side: Side) -> Result<SideBinding> {
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
    let n: usize = bindings.iter().map(|b| b.fragments().len()).sum();
    let mut ids: HashSet<&str> = crate::fxhash::set_with_capacity(n);
    for f in bindings.iter().flat_map(|b| b.fragments()) {
        if !ids.insert(f.fragment_id()) {
            return invalid(format!("duplicate {s} runtime fragment_id: {}", f.fragment_id()));
        }
    }
    drop(ids);
    if bindings.iter().any(|b| b.placement_id() != placement.placement_id()) {
        return invalid(format!("logical plan and {s} placement IDs differ"));
    }
    let bound: HashSet<&str> = bindings.iter().map(|b| b.participant_id()).collect();
    let differ = || Error::invalid(format!("logical plan and {s} runtime binding participants differ"));
    if required.iter().any(|p| !bound.contains(p)) {
        return Err(differ());
    }
    if bindings.iter().any(|b| placement.part(b.participant_id()).is_none_or(|p| p.fragments().is_empty())) {
        return Err(differ());
    }
    validate_binding_subset(placement, bindings)?;
    let required: HashSet<&str> = required.iter().copied().collect();
    let mut kept = Vec::with_capacity(required.len());
    let mut by_participant = HashMap::default();
    for b in bindings.iter().filter(|b| required.contains(b.participant_id())) {
        by_participant.insert(b.participant_id().to_string(), kept.len() as u32);
        kept.push(b.clone());
    }
    Ok(SideBinding { kept, by_participant })
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
        Self::bind_with(logical, target_bindings, source_bindings, &validate_target_physical_ranges)
    }

    /// [`Self::bind`] with an injected physical-range validator (called once with
    /// every target write and the budget `max_total_lowered_segments`).
    pub fn bind_with(
        logical: &LogicalTransferPlan,
        target_bindings: &[RuntimeBinding],
        source_bindings: &[RuntimeBinding],
        validator: PhysicalRangeValidator<'_>,
    ) -> Result<TransferPlan> {
        let (source, target) = (logical.source(), logical.target());
        let t_required: Vec<&str> = logical.target_executors().iter().map(|e| e.participant_id.as_str()).collect();
        let s_required: Vec<&str> = logical.source_executors().iter().map(|e| e.participant_id.as_str()).collect();
        let tb = bind_side(target, target_bindings, &t_required, Side::Target)?;
        let sb = bind_side(source, source_bindings, &s_required, Side::Source)?;
        let mut operations = Vec::with_capacity(logical.regions().len());
        for r in logical.regions() {
            let tp = logical.target_of(r);
            let t = locate(&tb, logical.target_participant_of(r), tp.placement_fragment_id()).ok_or_else(|| {
                Error::invalid(format!(
                    "missing runtime binding for placement fragment: {}",
                    tp.placement_fragment_id()
                ))
            })?;
            let sp = logical.source_of(r);
            let s = locate(&sb, logical.source_participant_of(r), sp.placement_fragment_id()).ok_or_else(|| {
                Error::invalid(format!(
                    "missing source runtime binding for placement fragment: {}",
                    sp.placement_fragment_id()
                ))
            })?;
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
                    generation: b.generation(),
                    target: f,
                    target_placement: logical.target_of(r),
                    region: r,
                    source_placement: logical.source_of(r),
                }
            })
            .collect();
        validator(&writes, logical.limits().max_total_lowered_segments)?;
        drop(writes);
        // Source/target allocation disjointness per shared address space.
        let mut spaces: BTreeMap<(&str, &str, &str), (Vec<(u64, u64)>, Vec<(u64, u64)>)> = BTreeMap::new();
        for &(s, t) in &operations {
            let (b, f) = frag(&sb, s);
            spaces
                .entry((b.instance_id(), f.worker_id(), f.device()))
                .or_default()
                .0
                .push((f.storage_address(), f.storage_address() + f.storage_nbytes()));
            let (b, f) = frag(&tb, t);
            spaces
                .entry((b.instance_id(), f.worker_id(), f.device()))
                .or_default()
                .1
                .push((f.storage_address(), f.storage_address() + f.storage_nbytes()));
        }
        for ((i, w, d), (src, tgt)) in spaces.iter_mut() {
            if src.is_empty() || tgt.is_empty() {
                continue;
            }
            src.sort_unstable();
            src.dedup();
            tgt.sort_unstable();
            tgt.dedup();
            // Two sorted lists: any intersection of a source and a target range.
            let (mut a, mut b) = (0, 0);
            while a < src.len() && b < tgt.len() {
                let (s, t) = (src[a], tgt[b]);
                if s.0 < t.1 && t.0 < s.1 {
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
        let source_executors = build_executors(source, &sb, &operations, Side::Source)?;
        let target_executors = build_executors(target, &tb, &operations, Side::Target)?;
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
        RuntimeFragmentSnapshot::new(pf, f, b.generation())
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
            if e.runtime_lease_id != binding.lease_id() || e.generation != binding.generation() {
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

fn frag(side: &SideBinding, r: BoundRef) -> (&RuntimeBinding, &RuntimeFragment) {
    let b = &side.kept[r.binding as usize];
    (b, &b.fragments()[r.fragment as usize])
}

fn locate(side: &SideBinding, participant: &str, pfid: &str) -> Option<BoundRef> {
    let &b = side.by_participant.get(participant)?;
    let binding = &side.kept[b as usize];
    let f = binding.fragments().binary_search_by(|f| f.placement_fragment_id().cmp(pfid)).ok()?;
    Some(BoundRef { binding: b, fragment: f as u32 })
}

fn build_executors(
    placement: &Placement,
    side_binding: &SideBinding,
    operations: &[(BoundRef, BoundRef)],
    side: Side,
) -> Result<Vec<ExecutorTransferPlan>> {
    // (binding, worker) -> (fragment indices, op indices)
    let mut used: BTreeMap<(u32, &str), (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    for (i, &(s, t)) in operations.iter().enumerate() {
        let r = if side == Side::Source { s } else { t };
        let b = &side_binding.kept[r.binding as usize];
        let f = &b.fragments()[r.fragment as usize];
        let e = used.entry((r.binding, f.worker_id())).or_default();
        e.0.push(r.fragment);
        e.1.push(i as u32);
    }
    let mut out: Vec<ExecutorTransferPlan> = Vec::with_capacity(used.len());
    let mut keys: HashSet<((u64, u64, u64, u64), &str)> = HashSet::default();
    for ((bi, worker), (mut frags, ops)) in used {
        let b = &side_binding.kept[bi as usize];
        let part = placement.part(b.participant_id()).expect("a kept binding has a part");
        if !keys.insert((part.rank().order_key(), worker)) {
            return invalid(format!(
                "duplicate {} executor rank and worker: ({:?}, {worker})",
                side.as_str(),
                part.rank().order_key()
            ));
        }
        frags.sort_unstable_by(|&x, &y| {
            b.fragments()[x as usize].fragment_id().cmp(b.fragments()[y as usize].fragment_id())
        });
        frags.dedup();
        out.push(ExecutorTransferPlan {
            side,
            binding: bi,
            instance_id: b.instance_id().to_string(),
            placement_id: b.placement_id().to_string(),
            placement_digest: b.placement_digest().to_string(),
            participant_id: b.participant_id().to_string(),
            runtime_lease_id: b.lease_id().to_string(),
            generation: b.generation(),
            worker_id: worker.to_string(),
            rank: part.rank(),
            fragment_ids: frags.iter().map(|&x| b.fragments()[x as usize].fragment_id().to_string()).collect(),
            fragments: frags,
            operation_indices: ops,
        });
    }
    // Placement part order, then workers sorted; then a stable sort by rank.
    out.sort_by(|a, b| {
        (a.participant_id.as_str(), a.worker_id.as_str()).cmp(&(b.participant_id.as_str(), b.worker_id.as_str()))
    });
    out.sort_by_key(|e| e.rank.order_key());
    Ok(out)
}
