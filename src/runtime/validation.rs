//! Pairing runtime bindings with a placement (`data-model.md` §12): identity, exact
//! fragment membership of the participant's part, sizes, shapes, item size,
//! canonical strides, and the address-range rule (per address space, views overlap
//! only as exact declared aliases, storage allocations only when identical); for one
//! binding (remembered per fragment list for callers that check the same bindings
//! again), for a binding set, and for a subset of one.

use super::binding::{keep_recent, RuntimeBinding};
use super::fragment::RuntimeFragment;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::model::{Placement, PlacementFragment, PlacementPart, TensorDescriptor};
use std::collections::BTreeMap;

struct Bound<'a> {
    runtime: &'a RuntimeFragment,
    placement: &'a PlacementFragment,
    tensor: &'a TensorDescriptor,
}

/// Validates one binding against `placement` (`validate_runtime_binding`):
/// identity, exact fragment membership of the participant's part, sizes, shapes,
/// item size, canonical strides and address ranges. Contract errors. Thread-safe;
/// walks every fragment at every call (see [`validate_runtime_binding_remembered`]).
pub fn validate_runtime_binding(placement: &Placement, binding: &RuntimeBinding) -> Result<()> {
    check_binding(placement, binding, &mut Vec::new()).map(drop)
}

/// [`validate_runtime_binding`], with the same result and first error, for a caller
/// that validates the same bindings again and again (a live-transfer call checks
/// every binding handed to it, and each call of a step gets the same ones): the
/// binding's identity fields are checked every time, the fragment checks once per
/// fragment list and placement part (`FragmentList::passed`), so clones and
/// `with_lease` rotations of a validated binding cost O(1) against the same
/// placement. Thread-safe (a short lock on the fragment list).
pub fn validate_runtime_binding_remembered(placement: &Placement, binding: &RuntimeBinding) -> Result<()> {
    binding_part(placement, binding)?;
    let key = |(digest, participant): &(String, String)| {
        digest == placement.digest() && *participant == binding.participant_id
    };
    if binding.fragments.passed.lock().iter().any(key) {
        return Ok(());
    }
    check_binding(placement, binding, &mut Vec::new())?;
    keep_recent(&mut binding.fragments.passed.lock(), (placement.digest().to_string(), binding.participant_id.clone()));
    Ok(())
}

/// The identity checks of [`pair_binding`] and the binding's part.
fn binding_part<'a>(placement: &'a Placement, binding: &RuntimeBinding) -> Result<&'a PlacementPart> {
    if placement.resource_id() != binding.resource_id {
        return invalid("placement and runtime binding resource_id differ");
    }
    if placement.placement_id() != binding.placement_id {
        return invalid("placement_id and runtime binding placement_id differ");
    }
    if placement.digest() != binding.placement_digest {
        return invalid("placement digest and runtime binding placement digest differ");
    }
    if placement.revision() != binding.revision {
        return invalid("placement and runtime binding revision differ");
    }
    placement
        .part(&binding.participant_id)
        .ok_or_else(|| Error::invalid(format!("unknown runtime binding participant: {}", binding.participant_id)))
}

/// The membership error of a binding whose fragments are not its part's (the
/// first unknown one, else the first missing one).
fn membership_error(part: &PlacementPart, binding: &RuntimeBinding) -> Option<Error> {
    if let Some(f) = binding.fragments.iter().find(|f| part.fragment(f.placement_fragment_id()).is_none()) {
        return Some(Error::invalid(format!(
            "unknown placement fragment in runtime binding: {}",
            f.placement_fragment_id()
        )));
    }
    part.fragments().iter().find(|p| binding.fragment_for(p.placement_fragment_id()).is_none()).map(|p| {
        Error::invalid(format!("missing placement fragment in runtime binding: {}", p.placement_fragment_id()))
    })
}

/// The per-fragment checks of [`pair_binding`], in its order.
fn check_fragment(p: &PlacementFragment, r: &RuntimeFragment, t: &TensorDescriptor) -> Result<()> {
    let pfid = p.placement_fragment_id();
    if r.nbytes() != p.nbytes() {
        return invalid(format!("runtime binding byte size does not match placement: {pfid}"));
    }
    if r.local_shape() != p.local_shape() {
        return invalid(format!("runtime binding local_shape does not match placement: {pfid}"));
    }
    if r.itemsize() != t.itemsize() {
        return invalid(format!("runtime binding itemsize does not match placement: {pfid}"));
    }
    if !is_canonical(r.strides_bytes(), p.local_shape(), t.itemsize()) {
        return invalid(format!("runtime binding stride does not describe a canonical contiguous view: {pfid}"));
    }
    Ok(())
}

/// `validate_runtime_binding` in one pass over the fragments (what [`pair_binding`]
/// then [`check_address_ranges`] check, with the same first error), appending the
/// Fx hash of every runtime fragment id to `hashes` (all of them, whatever the
/// outcome).
fn check_binding<'a>(
    placement: &Placement,
    binding: &'a RuntimeBinding,
    hashes: &mut Vec<u64>,
) -> Result<BindingSpaces<'a>> {
    let before = hashes.len();
    let out = check_binding_hashing(placement, binding, hashes);
    if out.is_err() {
        hashes.truncate(before);
        hashes.extend(binding.fragments.iter().map(|f| crate::fxhash::hash_str(f.fragment_id())));
    }
    out
}

/// The address spaces of one binding's fragments, as [`check_binding`] found them.
#[derive(Debug, Default)]
pub(crate) struct BindingSpaces<'a> {
    /// `(worker_id, device)` of each space, in the order of their first fragment.
    pub keys: Vec<(&'a str, &'a str)>,
    /// The space of each fragment (index into `keys`).
    pub of_fragment: Vec<u32>,
}

/// One runtime view of [`check_binding`]'s range pass.
struct View {
    address: u64,
    end: u64,
    storage: u64,
    storage_nbytes: u64,
    /// Index of its `(worker_id, device)` space, in first-appearance order.
    space: u32,
}

fn check_binding_hashing<'a>(
    placement: &Placement,
    binding: &'a RuntimeBinding,
    hashes: &mut Vec<u64>,
) -> Result<BindingSpaces<'a>> {
    let part = binding_part(placement, binding)?;
    let (pf, bf) = (part.fragments(), &binding.fragments[..]);
    if pf.len() != bf.len() {
        return Err(membership_error(part, binding).expect("different lengths differ in membership"));
    }
    let tensor_of = tensor_lookup(part);
    // Membership comes first: a fragment's own error counts only once every id matched.
    let mut first_error: Option<Error> = None;
    let mut views: Vec<View> = Vec::with_capacity(bf.len());
    let mut spaces: Vec<(&str, &str)> = Vec::new();
    let mut space_of: HashMap<(&str, &str), u32> = HashMap::default();
    let mut last: Option<((&str, &str), u32)> = None;
    for (i, (p, r)) in pf.iter().zip(bf).enumerate() {
        // Two levels ahead: the runtime records, then (once they are near) what they
        // and the placement fragments point to.
        if let Some(next) = bf.get(i + 2 * crate::model::PREFETCH_AHEAD) {
            crate::model::prefetch(next.spec_ptr());
        }
        if let Some(next) = bf.get(i + crate::model::PREFETCH_AHEAD) {
            next.prefetch_heap();
            pf[i + crate::model::PREFETCH_AHEAD].prefetch_heap();
        }
        if p.placement_fragment_id() != r.placement_fragment_id() {
            return Err(membership_error(part, binding).expect("a differing id is unknown or missing"));
        }
        if first_error.is_none() {
            first_error = check_fragment(p, r, tensor_of(p)).err();
        }
        hashes.push(crate::fxhash::hash_str(r.fragment_id()));
        let key = (r.worker_id(), r.device());
        let space = match last {
            Some((k, s)) if k == key => s,
            _ => *space_of.entry(key).or_insert_with(|| {
                spaces.push(key);
                (spaces.len() - 1) as u32
            }),
        };
        last = Some((key, space));
        views.push(View {
            address: r.address(),
            end: r.address() + r.nbytes(),
            storage: r.storage_address(),
            storage_nbytes: r.storage_nbytes(),
            space,
        });
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    // The address-range rule (see `check_address_ranges`), space after space.
    let space_text = |s: u32| {
        let (worker, device) = spaces[s as usize];
        crate::pyrepr::repr(&(binding.instance_id.as_str(), worker, device))
    };
    let sorted_by = |key: &dyn Fn(&View) -> u64| -> Vec<u32> {
        let mut order: Vec<u32> = (0..views.len() as u32).collect();
        let k = |i: u32| (views[i as usize].space, key(&views[i as usize]), i);
        if !order.windows(2).all(|w| k(w[0]) <= k(w[1])) {
            order.sort_unstable_by_key(|&i| k(i));
        }
        order
    };
    let by_address = sorted_by(&|v| v.address);
    let by_storage = sorted_by(&|v| v.storage);
    let bound =
        |i: u32| Bound { runtime: &bf[i as usize], placement: &pf[i as usize], tensor: tensor_of(&pf[i as usize]) };
    let (mut a, mut s) = (0, 0);
    let mut active: Vec<u32> = Vec::new();
    for space in 0..spaces.len() as u32 {
        // Views: any overlap must be an exact declared alias.
        active.clear();
        while let Some(&cur) = by_address.get(a).filter(|&&i| views[i as usize].space == space) {
            a += 1;
            let c = &views[cur as usize];
            active.retain(|&e| views[e as usize].end > c.address);
            for &earlier in &active {
                if !exact_alias(&bound(earlier), &bound(cur)) {
                    return invalid(format!(
                        "runtime binding address ranges overlap: {} and {} in {}",
                        bf[earlier as usize].fragment_id(),
                        bf[cur as usize].fragment_id(),
                        space_text(space)
                    ));
                }
            }
            active.push(cur);
        }
        // Storage allocations: overlapping ones must be identical.
        let mut open: Option<(u64, u64, u32)> = None; // (start, size, fragment index)
        while let Some(&cur) = by_storage.get(s).filter(|&&i| views[i as usize].space == space) {
            s += 1;
            let v = &views[cur as usize];
            if let Some((p_start, p_size, p)) = open {
                if p_start + p_size > v.storage {
                    if (p_start, p_size) == (v.storage, v.storage_nbytes) {
                        continue;
                    }
                    return invalid(format!(
                        "runtime binding storage allocation ranges overlap: {} and {} in {}",
                        bf[p as usize].fragment_id(),
                        bf[cur as usize].fragment_id(),
                        space_text(space)
                    ));
                }
            }
            open = Some((v.storage, v.storage_nbytes, cur));
        }
    }
    Ok(BindingSpaces { keys: spaces, of_fragment: views.iter().map(|v| v.space).collect() })
}

/// The tensor descriptor of a fragment of `part`.
fn tensor_lookup<'a>(part: &'a PlacementPart) -> impl Fn(&PlacementFragment) -> &'a TensorDescriptor + 'a {
    // A part's fragments carry its descriptors' own (interned) tensor ids: the
    // address finds the descriptor; the part's tensors are sorted by id, so a
    // binary search is the fallback.
    let part_tensors = part.tensors();
    let by_ptr: crate::fxhash::FxHashMap<u64, &TensorDescriptor> =
        part_tensors.iter().map(|t| (crate::model::id_key(t.tensor_id_arc()), &**t)).collect();
    move |p: &PlacementFragment| -> &'a TensorDescriptor {
        match by_ptr.get(&crate::model::id_key(p.tensor_id_arc())) {
            Some(t) => t,
            None => {
                let i = part_tensors
                    .binary_search_by(|t| t.tensor_id().cmp(p.tensor_id()))
                    .expect("a part's fragments name its tensors");
                &part_tensors[i]
            }
        }
    }
}

/// Pairs every fragment of `binding` with its placement fragment and tensor
/// (`validate_runtime_binding` without the address ranges, for several bindings of
/// one instance).
fn pair_binding<'a>(placement: &'a Placement, binding: &'a RuntimeBinding) -> Result<Vec<Bound<'a>>> {
    let part = binding_part(placement, binding)?;
    // Both lists are sorted by placement fragment id: membership is a merge.
    let (pf, bf) = (part.fragments(), &binding.fragments[..]);
    let same =
        pf.len() == bf.len() && pf.iter().zip(bf).all(|(p, r)| p.placement_fragment_id() == r.placement_fragment_id());
    if !same {
        if let Some(e) = membership_error(part, binding) {
            return Err(e);
        }
    }
    let tensor_of = tensor_lookup(part);
    let mut bound = Vec::with_capacity(pf.len());
    for (p, r) in pf.iter().zip(bf) {
        let t = tensor_of(p);
        check_fragment(p, r, t)?;
        bound.push(Bound { runtime: r, placement: p, tensor: t });
    }
    Ok(bound)
}

/// True when `strides` are the canonical row-major strides of `shape`.
fn is_canonical(strides: &[u64], shape: &[u64], itemsize: u64) -> bool {
    if strides.len() != shape.len() {
        return false;
    }
    let mut acc = itemsize;
    for d in (0..shape.len()).rev() {
        if strides[d] != acc {
            return false;
        }
        acc = acc.saturating_mul(shape[d]);
    }
    true
}

fn exact_alias(a: &Bound<'_>, b: &Bound<'_>) -> bool {
    let group = a.placement.aliases();
    a.runtime.address() == b.runtime.address()
        && a.runtime.nbytes() == b.runtime.nbytes()
        && group.len() >= 2
        && group == b.placement.aliases()
        && group.iter().any(|m| m == a.placement.tensor_id())
        && group.iter().any(|m| m == b.placement.tensor_id())
        && a.placement.global_offset() == b.placement.global_offset()
        && a.placement.local_shape() == b.placement.local_shape()
        && a.tensor.same_alias_key(b.tensor)
}

/// The address-range rule over `bound` fragments of one instance, per address space
/// `(instance, worker, device)`, spaces in the order of their first fragment (the
/// reference's order, so the first overlap named is the reference's): views may
/// overlap only as exact declared aliases, storage allocations only when identical.
fn check_address_ranges(instance_id: &str, bound: &[Bound<'_>]) -> Result<()> {
    let mut space_of: HashMap<(&str, &str), usize> = HashMap::default();
    let mut spaces: Vec<((&str, &str), Vec<&Bound<'_>>)> = Vec::new();
    // Consecutive fragments almost always share their space: compare with the last
    // key before hashing.
    let mut last: Option<((&str, &str), usize)> = None;
    for b in bound {
        let key = (b.runtime.worker_id(), b.runtime.device());
        let s = match last {
            Some((k, s)) if k == key => s,
            _ => *space_of.entry(key).or_insert_with(|| {
                spaces.push((key, Vec::new()));
                spaces.len() - 1
            }),
        };
        last = Some((key, s));
        spaces[s].1.push(b);
    }
    for ((worker, device), in_order) in spaces {
        let space = || crate::pyrepr::repr(&(instance_id, worker, device));
        let mut list = in_order.clone();
        list.sort_by_key(|b| b.runtime.address());
        let mut active: Vec<&Bound<'_>> = Vec::new();
        for cur in &list {
            let at = cur.runtime.address();
            active.retain(|e| e.runtime.address() + e.runtime.nbytes() > at);
            for earlier in &active {
                if !exact_alias(earlier, cur) {
                    return invalid(format!(
                        "runtime binding address ranges overlap: {} and {} in {}",
                        earlier.runtime.fragment_id(),
                        cur.runtime.fragment_id(),
                        space()
                    ));
                }
            }
            active.push(cur);
        }
        // Storage allocations: overlapping ones must be identical. In start order
        // (stable over the fragments' order, as the reference sorts); since any two
        // overlapping allocations that are not identical fail, the allocations still
        // open at a start are copies of one range, so the earliest of them stands for
        // all and is the one the reference names.
        let mut storages = in_order;
        storages.sort_by_key(|b| b.runtime.storage_address());
        let mut open: Option<(u64, u64, &str)> = None; // (start, size, fragment id)
        for b in &storages {
            let (start, size, id) = (b.runtime.storage_address(), b.runtime.storage_nbytes(), b.runtime.fragment_id());
            if let Some((p_start, p_size, p_id)) = open {
                if p_start + p_size > start {
                    if (p_start, p_size) == (start, size) {
                        continue;
                    }
                    return invalid(format!(
                        "runtime binding storage allocation ranges overlap: {p_id} and {id} in {}",
                        space()
                    ));
                }
            }
            open = Some((start, size, id));
        }
    }
    Ok(())
}

/// Validates the exact binding set of `placement` (`validate_runtime_bindings`):
/// every non-empty participant bound exactly once, runtime fragment ids unique
/// across bindings, address ranges checked per instance over all its bindings.
pub fn validate_runtime_bindings(placement: &Placement, bindings: &[RuntimeBinding]) -> Result<()> {
    validate_binding_subset(placement, bindings)?;
    let participants: HashSet<&str> = bindings.iter().map(|b| b.participant_id()).collect();
    for part in placement.parts() {
        if !part.fragments().is_empty() && !participants.contains(part.participant_id()) {
            return invalid(format!("missing runtime binding participant: {}", part.participant_id()));
        }
    }
    // Bindings for unknown participants were rejected by pair_binding.
    Ok(())
}

/// Validates a subset of the bindings of `placement`: like
/// [`validate_runtime_bindings`] but participants may be missing (each rank of a
/// multi-process job holds only its own binding). Contract errors.
pub fn validate_binding_subset(placement: &Placement, bindings: &[RuntimeBinding]) -> Result<()> {
    let mut participants = crate::fxhash::set_with_capacity(bindings.len());
    if !bindings.iter().all(|b| participants.insert(b.participant_id())) {
        return invalid("duplicate runtime binding participant");
    }
    // The reference checks binding after binding: its own pairing and ranges, then
    // its runtime fragment ids against the earlier bindings'. The first failure in
    // that order is the first binding that fails its own checks, unless a repeated
    // id shows up in an earlier binding (or in that binding itself, once its own
    // checks passed).
    let checks = check_bindings(placement, bindings);
    let failed = checks.first_error.as_ref().map_or(bindings.len(), |(k, _)| *k);
    if checks.may_repeat_ids {
        if let Some((j, id)) = first_repeated_fragment_id(bindings) {
            if j < failed {
                return invalid(format!("duplicate runtime fragment_id across participants: {id}"));
            }
        }
    }
    if let Some((_, e)) = checks.first_error {
        return Err(e);
    }
    check_shared_instances(placement, bindings)
}

/// What [`check_bindings`] found.
pub(crate) struct BindingChecks<'a> {
    /// The first binding (in order) that failed its own pairing or address ranges,
    /// with its error.
    pub first_error: Option<(usize, Error)>,
    /// Whether two runtime fragment ids of the bindings may be equal: false proves
    /// them all distinct (their hashes are); true asks for an exact look
    /// ([`first_repeated_fragment_id`]).
    pub may_repeat_ids: bool,
    /// The spaces of each binding (empty for a binding that failed).
    pub spaces: Vec<BindingSpaces<'a>>,
}

/// Every binding paired with `placement` and its address ranges checked on its own
/// (`validate_runtime_binding`), on several threads for many fragments, and the
/// runtime fragment ids of all bindings screened for repeats by their hashes. Pure.
pub(crate) fn check_bindings<'a>(placement: &Placement, bindings: &'a [RuntimeBinding]) -> BindingChecks<'a> {
    let total: usize = bindings.iter().map(|b| b.fragments.len()).sum();
    let workers = crate::par::workers(total).min(bindings.len()).max(1);
    // Contiguous runs of bindings with about as many fragments each.
    let mut bounds = vec![0usize];
    let mut seen = 0usize;
    for (i, b) in bindings.iter().enumerate() {
        seen += b.fragments.len();
        if bounds.len() < workers && seen * workers >= total * bounds.len() && i + 1 < bindings.len() {
            bounds.push(i + 1);
        }
    }
    bounds.push(bindings.len());
    let runs = crate::par::try_map(bounds.len() - 1, bounds.len() - 1, |k| {
        let mut hashes = Vec::with_capacity(bindings[bounds[k]..bounds[k + 1]].iter().map(|b| b.fragments.len()).sum());
        let mut first_error = None;
        let mut spaces = Vec::with_capacity(bounds[k + 1] - bounds[k]);
        for (i, b) in bindings.iter().enumerate().take(bounds[k + 1]).skip(bounds[k]) {
            match check_binding(placement, b, &mut hashes) {
                Ok(s) => spaces.push(s),
                Err(e) => {
                    first_error.get_or_insert((i, e));
                    spaces.push(BindingSpaces::default());
                }
            }
        }
        hashes.sort_unstable();
        Ok::<_, ()>((hashes, first_error, spaces))
    })
    .unwrap_or_default();
    let mut first_error = None;
    let mut sorted = Vec::with_capacity(runs.len());
    let mut spaces = Vec::with_capacity(bindings.len());
    for (hashes, e, s) in runs {
        if first_error.is_none() {
            first_error = e;
        }
        sorted.push(hashes);
        spaces.extend(s);
    }
    BindingChecks { first_error, may_repeat_ids: crate::fxhash::has_repeated_hash_runs(&sorted), spaces }
}

/// The first runtime fragment id (in binding order, then fragment order) that an
/// earlier fragment of `bindings` already has, with its binding's index.
pub(crate) fn first_repeated_fragment_id(bindings: &[RuntimeBinding]) -> Option<(usize, &str)> {
    let n: usize = bindings.iter().map(|b| b.fragments.len()).sum();
    let mut ids: HashSet<&str> = crate::fxhash::set_with_capacity(n);
    for (j, b) in bindings.iter().enumerate() {
        for f in b.fragments.iter() {
            if !ids.insert(f.fragment_id()) {
                return Some((j, f.fragment_id()));
            }
        }
    }
    None
}

/// The address-range rule over all bindings of each instance that holds several
/// (instances in sorted order, each over its bindings' fragments in binding order).
/// An instance with one binding is that binding's own rule, already checked by
/// [`check_bindings`]. Every binding must pair with `placement`.
pub(crate) fn check_shared_instances(placement: &Placement, bindings: &[RuntimeBinding]) -> Result<()> {
    let mut by_instance: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, b) in bindings.iter().enumerate() {
        by_instance.entry(b.instance_id()).or_default().push(i);
    }
    let shared: Vec<(&str, Vec<usize>)> = by_instance.into_iter().filter(|(_, list)| list.len() > 1).collect();
    let fragments: usize = shared.iter().flat_map(|(_, l)| l).map(|&i| bindings[i].fragments.len()).sum();
    crate::par::try_map(shared.len(), crate::par::workers(fragments).min(shared.len()), |k| {
        let (instance, list) = &shared[k];
        let mut bound = Vec::new();
        for &i in list {
            bound.extend(pair_binding(placement, &bindings[i])?);
        }
        check_address_ranges(instance, &bound)
    })?;
    Ok(())
}

/// Subset pairing used by the store services (`pair_manifests`): bindings must be
/// non-empty and unique per participant, each validated against `placement`;
/// failures are [`ErrorKind::InvalidBinding`] errors prefixed
/// `invalid <label> runtime binding: `.
pub fn pair_bindings(placement: &Placement, bindings: &[RuntimeBinding], label: &str) -> Result<()> {
    let store_err = |m: String| Error::new(ErrorKind::InvalidBinding, m);
    if bindings.is_empty() {
        return Err(store_err(format!("{label} runtime bindings must not be empty")));
    }
    let mut participants = crate::fxhash::set_with_capacity(bindings.len());
    if !bindings.iter().all(|b| participants.insert(b.participant_id())) {
        return Err(store_err(format!("duplicate {label} runtime binding participant")));
    }
    // Bindings are checked on several threads when they hold many fragments; the
    // error reported is the first binding's in order, whatever the thread count.
    let fragments: usize = bindings.iter().map(|b| b.fragments().len()).sum();
    crate::par::try_map(bindings.len(), crate::par::workers(fragments), |i| {
        validate_runtime_binding(placement, &bindings[i])
            .map_err(|e| store_err(format!("invalid {label} runtime binding: {}", e.message())))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        canonical_strides, FlatPlacementSpec, ParallelAxis, ParallelRank, ParallelTopology, PlacementFragmentSpec,
        TensorSpec, TopologyParticipant, TopologySpec,
    };
    use crate::runtime::{MemoryKind, RuntimeBindingSpec, RuntimeFragmentSpec};
    use std::collections::BTreeSet;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn one_in(&mut self, n: u64) -> bool {
            self.below(n) == 0
        }
    }

    /// Two participants (TP 2, every tensor replicated): tensor `a` (8, 4) in four
    /// row fragments, tied `e` / `h` (4, 4), `c` (16,) of four-byte items.
    fn placement() -> Placement {
        let axes = vec![ParallelAxis::Replicated(crate::model::AxisKind::Tp)];
        let spec = |id: &str, shape: &[u64], itemsize: u64| TensorSpec {
            tensor_id: id.into(),
            global_shape: shape.to_vec(),
            dtype: if itemsize == 2 { "bfloat16" } else { "float32" }.into(),
            itemsize,
            shard_dims: vec![],
            layout_fingerprint: "fp:test".into(),
            parallel_axes: axes.clone(),
            layer_id: None,
            expert_id: None,
        };
        let tensors: Vec<TensorDescriptor> =
            [spec("a", &[8, 4], 2), spec("c", &[16], 4), spec("e", &[4, 4], 2), spec("h", &[4, 4], 2)]
                .into_iter()
                .map(|s| TensorDescriptor::new(s).unwrap())
                .collect();
        let mut fragments = Vec::new();
        for tp in 0..2 {
            let rank = ParallelRank { tp, ..Default::default() };
            let frag = |tensor: &str, offset: &[u64], shape: &[u64], itemsize: u64, aliases: &[&str]| {
                PlacementFragment::new(PlacementFragmentSpec {
                    tensor_id: tensor.into(),
                    global_offset: offset.to_vec(),
                    local_shape: shape.to_vec(),
                    nbytes: shape.iter().product::<u64>() * itemsize,
                    rank,
                    pipeline_stage_id: None,
                    aliases: aliases.iter().map(|s| s.to_string()).collect(),
                    placement_fragment_id: None,
                })
                .unwrap()
            };
            for row in 0..4 {
                fragments.push(frag("a", &[2 * row, 0], &[2, 4], 2, &[]));
            }
            fragments.push(frag("c", &[0], &[16], 4, &[]));
            fragments.push(frag("e", &[0, 0], &[4, 4], 2, &["e", "h"]));
            fragments.push(frag("h", &[0, 0], &[4, 4], 2, &["e", "h"]));
        }
        let topology = ParallelTopology::new(TopologySpec {
            tp_size: 2,
            pp_size: 1,
            ep_size: 1,
            dp_size: 1,
            participants: (0..2)
                .map(|tp| TopologyParticipant {
                    participant_id: format!("w{tp}"),
                    rank: ParallelRank { tp, ..Default::default() },
                })
                .collect(),
            topology_id: None,
        })
        .unwrap();
        Placement::from_fragments(FlatPlacementSpec {
            resource_id: "r".into(),
            revision: "rev".into(),
            weight_generation: 1,
            placement_set_id: "set".into(),
            topology,
            tensors,
            fragments,
        })
        .unwrap()
    }

    /// A binding of `participant`, mutated at random (overlapping views and
    /// allocations, spaces, sizes, shapes, strides, membership, identity).
    /// `calm`: every mutation 20 times rarer, and views and allocations disjoint.
    fn binding(p: &Placement, participant: &str, rng: &mut Rng, ids: &mut u64, calm: bool) -> RuntimeBinding {
        let part = p.part(participant).unwrap();
        let k = if calm { 20 } else { 1 };
        let mut rng = Rng2(rng, k);
        let mut fragments = Vec::new();
        for f in part.fragments() {
            if rng.one_in(40) {
                continue; // missing
            }
            let itemsize = p.tensor(f.tensor_id()).unwrap().itemsize();
            let address = if calm {
                0x1000 + 256 * *ids
            } else {
                0x1000 + 64 * rng.below(12) + if rng.one_in(4) { 16 } else { 0 }
            };
            let offset = [0, 0, 16][rng.below(3) as usize].min(address - 1);
            let mut nbytes = f.nbytes();
            if rng.one_in(30) {
                nbytes += 2;
            }
            let mut shape = f.local_shape().to_vec();
            if rng.one_in(30) {
                shape[0] += 1;
            }
            let mut strides = canonical_strides(f.local_shape(), itemsize);
            if rng.one_in(30) {
                strides[0] += itemsize;
            }
            *ids += 1;
            let spec = RuntimeFragmentSpec {
                placement_fragment_id: if rng.one_in(50) {
                    format!("unknown-{ids}")
                } else {
                    f.placement_fragment_id().into()
                },
                fragment_id: format!(
                    "rt-{}",
                    if rng.0.one_in(25) { ids.saturating_sub(1 + rng.below(9)) } else { *ids }
                ),
                address,
                nbytes,
                worker_id: ["w0", "w1"][rng.below(2) as usize].into(),
                endpoint: "e:1".into(),
                device: ["cuda:0", "cuda:1"][rng.below(2) as usize].into(),
                itemsize: if rng.one_in(40) { itemsize + 1 } else { itemsize },
                local_shape: shape,
                strides_bytes: strides,
                storage_address: address - offset,
                storage_nbytes: nbytes + offset + [0, 32][rng.below(2) as usize],
                storage_offset_bytes: offset,
                memory: MemoryKind::Host,
            };
            fragments.push(RuntimeFragment::new(spec).unwrap());
        }
        let mut spec = RuntimeBindingSpec {
            resource_id: "r".into(),
            placement_id: p.placement_id().into(),
            placement_digest: p.digest().into(),
            instance_id: format!("i{}", rng.below(2)),
            lease_generation: 1,
            lease_id: "l".into(),
            revision: "rev".into(),
            participant_id: participant.into(),
            fragments,
        };
        if rng.one_in(60) {
            spec.revision = "other".into();
        }
        // A fragment id repeated inside one binding is refused here; draw again.
        RuntimeBinding::new(spec.clone()).unwrap_or_else(|_| {
            for (k, f) in spec.fragments.iter_mut().enumerate() {
                let mut s = (*f.spec).clone();
                s.fragment_id = format!("{}-{k}", s.fragment_id);
                *f = RuntimeFragment::new(s).unwrap();
            }
            RuntimeBinding::new(spec).unwrap()
        })
    }

    /// `Rng` with every `one_in(n)` made `one_in(n * k)`.
    struct Rng2<'r>(&'r mut Rng, u64);
    impl Rng2<'_> {
        fn below(&mut self, n: u64) -> u64 {
            self.0.below(n)
        }
        fn one_in(&mut self, n: u64) -> bool {
            self.0.one_in(n * self.1)
        }
    }

    fn message<T>(r: Result<T>) -> std::result::Result<(), String> {
        r.map(|_| ()).map_err(|e| e.message().to_string())
    }

    /// The one-pass check names the same first error as pairing then ranges, and
    /// hashes every fragment id whatever the outcome.
    #[test]
    fn check_binding_matches_pairing_then_ranges() {
        let p = placement();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut ids, mut failed) = (0, 0);
        for _ in 0..4000 {
            let b = binding(&p, ["w0", "w1"][rng.below(2) as usize], &mut rng, &mut ids, false);
            let oracle = message(pair_binding(&p, &b).and_then(|bound| check_address_ranges(&b.instance_id, &bound)));
            let mut hashes = vec![7];
            let got = message(check_binding(&p, &b, &mut hashes));
            assert_eq!(got, oracle, "{b:?}");
            let expected: Vec<u64> = std::iter::once(7)
                .chain(b.fragments.iter().map(|f| crate::fxhash::hash_str(f.fragment_id())))
                .collect();
            assert_eq!(hashes, expected);
            failed += usize::from(oracle.is_err());
        }
        // Both outcomes are well represented.
        assert!(failed > 400 && failed < 3600, "{failed} of 4000 failed");
    }

    /// `validate_binding_subset` as the reference runs it: binding after binding
    /// (pairing, ranges, then ids against the earlier bindings'), then each
    /// instance's ranges over all its bindings.
    fn subset_oracle(placement: &Placement, bindings: &[RuntimeBinding]) -> Result<()> {
        let mut participants = HashSet::default();
        if !bindings.iter().all(|b| participants.insert(b.participant_id())) {
            return invalid("duplicate runtime binding participant");
        }
        let mut by_instance: BTreeMap<&str, Vec<Bound<'_>>> = BTreeMap::new();
        let mut ids: HashSet<&str> = HashSet::default();
        for b in bindings {
            let bound = pair_binding(placement, b)?;
            check_address_ranges(&b.instance_id, &bound)?;
            for f in b.fragments.iter() {
                if !ids.insert(f.fragment_id()) {
                    return invalid(format!("duplicate runtime fragment_id across participants: {}", f.fragment_id()));
                }
            }
            by_instance.entry(b.instance_id()).or_default().extend(bound);
        }
        for (instance, bound) in &by_instance {
            check_address_ranges(instance, bound)?;
        }
        Ok(())
    }

    #[test]
    fn binding_subset_reports_the_sequential_first_error() {
        let p = placement();
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let mut ids = 0;
        let mut outcomes = BTreeSet::new();
        for round in 0..3000 {
            let n = 1 + rng.below(3) as usize;
            let bindings: Vec<RuntimeBinding> = (0..n)
                .map(|k| binding(&p, ["w0", "w1"][(k + round) % 2], &mut rng, &mut ids, round % 3 != 0))
                .collect();
            let oracle = message(subset_oracle(&p, &bindings));
            for workers in [None, Some(1), Some(2), Some(3)] {
                let got = crate::par::with_workers(workers, || message(validate_binding_subset(&p, &bindings)));
                assert_eq!(got, oracle, "workers {workers:?}: {bindings:?}");
            }
            outcomes.insert(oracle.err().map(|m| m.split(':').next().unwrap_or_default().to_string()));
        }
        // Every kind of outcome showed up, the repeated ids and shared instances included.
        for needle in ["duplicate runtime fragment_id across participants", "duplicate runtime binding participant"] {
            assert!(outcomes.contains(&Some(needle.to_string())), "{outcomes:?}");
        }
        assert!(outcomes.contains(&None));
        assert!(outcomes.len() > 8, "{outcomes:?}");
    }
}
