//! Runtime bindings (`data-model.md` §11): one participant's runtime fragments for
//! one placement, fenced by instance, lease and generation; their fragment list is
//! shared by every clone, with what is derived from it alone (fence digests, id
//! order, the placement parts it passed validation for) computed once.

use super::fragment::{fence_binding_digest, RuntimeFragment};
use crate::error::{invalid, Result};
use crate::model::{is_hex64, non_empty, Placement};
use std::sync::Arc;

/// Construction input of a [`RuntimeBinding`].
#[derive(Clone, Debug, Default)]
pub struct RuntimeBindingSpec {
    /// Resource id.
    pub resource_id: String,
    /// Attested placement id.
    pub placement_id: String,
    /// Attested placement digest (hex64).
    pub placement_digest: String,
    /// Runtime instance (process group) id.
    pub instance_id: String,
    /// Lease generation: the runtime fence the owner moves with its lease (the
    /// reference's wire name is `generation`).
    pub lease_generation: u64,
    /// Lease fence.
    pub lease_id: String,
    /// Revision.
    pub revision: String,
    /// Participant id.
    pub participant_id: String,
    /// Runtime fragments (any order).
    pub fragments: Vec<RuntimeFragment>,
}

/// One participant's runtime fragments for one placement
/// (`WeightRuntimeBindingManifest`), fenced by instance, lease and generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeBinding {
    pub(super) resource_id: String,
    pub(super) placement_id: String,
    pub(super) placement_digest: String,
    pub(super) instance_id: String,
    lease_generation: u64,
    lease_id: String,
    pub(super) revision: String,
    pub(super) participant_id: String,
    /// Shared: a clone (a plan's kept binding, a guard's observation, a prepared
    /// transfer's expected binding) is a reference count, and two clones compare
    /// equal without walking their fragments.
    pub(super) fragments: Arc<FragmentList>,
}

/// The fragments of a binding, with what is derived from them alone, computed once
/// and shared by every clone.
#[derive(Debug)]
pub(super) struct FragmentList {
    items: Box<[RuntimeFragment]>,
    /// [`fence_binding_digest`] of every fragment.
    fence_digest: std::sync::OnceLock<String>,
    /// Indices of `items` in runtime fragment id order.
    by_fragment_id: std::sync::OnceLock<Box<[u32]>>,
    /// [`fence_binding_digest`] of a few id subsets (a plan pins the same subset of
    /// a binding at every call): (sorted ids, digest), most recent last.
    subset_digests: parking_lot::Mutex<Vec<(Box<[String]>, String)>>,
    /// `(placement digest, participant id)` pairs whose part these fragments passed
    /// [`validate_runtime_binding_remembered`](super::validate_runtime_binding_remembered)'s
    /// fragment checks for, most recent last. The fragments never change and a
    /// placement digest names its whole content, so the outcome for a pair is settled
    /// once it passed.
    pub(super) passed: parking_lot::Mutex<Vec<(String, String)>>,
}

/// Subset digests (and passed placement parts) kept per fragment list.
const SUBSET_DIGESTS: usize = 4;

/// Adds `item` to one of a fragment list's small memories (most recent last, at most
/// [`SUBSET_DIGESTS`]); an item already there is not added twice.
pub(super) fn keep_recent<T: PartialEq>(kept: &mut Vec<T>, item: T) {
    if kept.contains(&item) {
        return;
    }
    if kept.len() == SUBSET_DIGESTS {
        kept.remove(0);
    }
    kept.push(item);
}

impl PartialEq for FragmentList {
    fn eq(&self, o: &Self) -> bool {
        self.items == o.items
    }
}
impl Eq for FragmentList {}

impl std::ops::Deref for FragmentList {
    type Target = [RuntimeFragment];
    fn deref(&self) -> &[RuntimeFragment] {
        &self.items
    }
}

impl RuntimeBinding {
    /// Validates `spec` (`data-model.md` §11); fragments are sorted by placement
    /// fragment id.
    pub fn new(spec: RuntimeBindingSpec) -> Result<Self> {
        non_empty(&spec.resource_id, "resource_id")?;
        non_empty(&spec.placement_id, "placement_id")?;
        non_empty(&spec.instance_id, "instance_id")?;
        non_empty(&spec.lease_id, "lease_id")?;
        non_empty(&spec.revision, "revision")?;
        non_empty(&spec.participant_id, "participant_id")?;
        if !is_hex64(&spec.placement_digest) {
            return invalid("placement_digest must be a lowercase SHA-256 digest");
        }
        let mut fragments = spec.fragments;
        fragments.sort_by(|a, b| a.spec.placement_fragment_id.cmp(&b.spec.placement_fragment_id));
        if fragments.windows(2).any(|w| w[0].spec.placement_fragment_id == w[1].spec.placement_fragment_id) {
            return invalid("duplicate placement fragment in runtime binding");
        }
        let mut ids = crate::fxhash::set_with_capacity(fragments.len());
        if !fragments.iter().all(|f| ids.insert(f.fragment_id())) {
            return invalid("duplicate runtime fragment_id in runtime binding");
        }
        Ok(RuntimeBinding {
            resource_id: spec.resource_id,
            placement_id: spec.placement_id,
            placement_digest: spec.placement_digest,
            instance_id: spec.instance_id,
            lease_generation: spec.lease_generation,
            lease_id: spec.lease_id,
            revision: spec.revision,
            participant_id: spec.participant_id,
            fragments: Arc::new(FragmentList {
                items: fragments.into(),
                fence_digest: Default::default(),
                by_fragment_id: Default::default(),
                subset_digests: Default::default(),
                passed: Default::default(),
            }),
        })
    }

    /// Indices of the fragments in runtime fragment id order (computed once per
    /// fragment list).
    fn fragment_id_order(&self) -> &[u32] {
        let items = &self.fragments.items;
        self.fragments.by_fragment_id.get_or_init(|| {
            let mut v: Vec<u32> = (0..items.len() as u32).collect();
            v.sort_unstable_by(|&a, &b| items[a as usize].fragment_id().cmp(items[b as usize].fragment_id()));
            v.into()
        })
    }

    /// True when `ids` are exactly the runtime fragment ids of the binding, sorted
    /// and distinct (no allocation).
    pub fn has_exactly_fragment_ids(&self, ids: &[String]) -> bool {
        let items = &self.fragments.items;
        ids.len() == items.len()
            && self.fragment_id_order().iter().zip(ids).all(|(&i, id)| items[i as usize].fragment_id() == id)
    }

    /// The fragments with runtime ids `sorted_ids` (sorted and distinct), in that
    /// order, found by one merge; `Err` lists the ids the binding lacks (sorted).
    pub fn fragments_with_ids<'a>(
        &self,
        sorted_ids: &'a [String],
    ) -> std::result::Result<Vec<&RuntimeFragment>, Vec<&'a str>> {
        let items = &self.fragments.items;
        let order = self.fragment_id_order();
        let mut found = Vec::with_capacity(sorted_ids.len());
        let mut missing = Vec::new();
        let mut k = 0;
        for id in sorted_ids {
            while k < order.len() && items[order[k] as usize].fragment_id() < id.as_str() {
                k += 1;
            }
            match order.get(k).map(|&i| &items[i as usize]) {
                Some(f) if f.fragment_id() == id => found.push(f),
                _ => missing.push(id.as_str()),
            }
        }
        if missing.is_empty() {
            Ok(found)
        } else {
            Err(missing)
        }
    }

    /// The [`fence_binding_digest`] of the fragments `sorted_ids` (`compute`s it on a
    /// miss): the last few subsets' digests are kept with the fragment list.
    /// Only ids that the binding holds are kept (so a kept subset needs no other
    /// lookup: the fragments of a binding never change). Thread-safe (a short lock).
    pub fn fence_digest_subset(&self, sorted_ids: &[String], compute: impl FnOnce() -> String) -> String {
        if let Some(d) = self.cached_subset_digest(sorted_ids) {
            return d;
        }
        let d = compute();
        if self.fragments_with_ids(sorted_ids).is_ok() {
            self.keep_subset_digest(sorted_ids, &d);
        }
        d
    }

    /// Keeps `digest` for `sorted_ids`, which the caller found to be fragments of
    /// this binding (see [`Self::cached_subset_digest`]).
    pub(crate) fn keep_subset_digest(&self, sorted_ids: &[String], digest: &str) {
        keep_recent(&mut self.fragments.subset_digests.lock(), (sorted_ids.into(), digest.to_string()));
    }

    /// The digest [`Self::fence_digest_subset`] keeps for exactly `sorted_ids`, if
    /// any: every one of those ids is then a fragment of this binding.
    pub(crate) fn cached_subset_digest(&self, sorted_ids: &[String]) -> Option<String> {
        let cache = self.fragments.subset_digests.lock();
        cache.iter().find(|(ids, _)| **ids == *sorted_ids).map(|(_, d)| d.clone())
    }

    /// The same binding under another runtime lease: `lease_id` and `generation`
    /// replaced, every fragment shared (O(1) in fragments). For a framework whose
    /// lease rotates while its buffers stay where they are (a prepared transfer's
    /// lease rotation). Errors: `lease_id must be a non-empty string`.
    pub fn with_lease(&self, lease_id: &str, lease_generation: u64) -> Result<RuntimeBinding> {
        non_empty(lease_id, "lease_id")?;
        Ok(RuntimeBinding { lease_id: lease_id.to_string(), lease_generation, ..self.clone() })
    }

    /// The same binding attesting `placement` (its id, digest, resource and revision
    /// replaced; the runtime fences and every fragment shared, O(1) in fragments): the
    /// same memory holding the same layout for another revision or weight generation
    /// (a prepared restore's step). Validate it against `placement` before use.
    pub fn attesting(&self, placement: &Placement) -> RuntimeBinding {
        RuntimeBinding {
            resource_id: placement.resource_id().to_string(),
            placement_id: placement.placement_id().to_string(),
            placement_digest: placement.digest().to_string(),
            revision: placement.revision().to_string(),
            ..self.clone()
        }
    }

    /// True when `self` and `other` share one fragment list (one is a clone of the
    /// other, or both of a third): their fragments are then equal without a walk.
    pub fn shares_fragments(&self, other: &RuntimeBinding) -> bool {
        Arc::ptr_eq(&self.fragments, &other.fragments)
    }

    /// Resource kind (always `model_weight`).
    pub fn resource_kind(&self) -> &'static str {
        "model_weight"
    }
    /// Resource id.
    pub fn resource_id(&self) -> &str {
        &self.resource_id
    }
    /// Attested placement id.
    pub fn placement_id(&self) -> &str {
        &self.placement_id
    }
    /// Attested placement digest.
    pub fn placement_digest(&self) -> &str {
        &self.placement_digest
    }
    /// Instance id.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }
    /// Lease generation (the runtime fence; the reference's wire name is
    /// `generation`).
    pub fn lease_generation(&self) -> u64 {
        self.lease_generation
    }
    /// Lease id.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }
    /// Revision.
    pub fn revision(&self) -> &str {
        &self.revision
    }
    /// Participant id.
    pub fn participant_id(&self) -> &str {
        &self.participant_id
    }
    /// Fragments sorted by placement fragment id.
    pub fn fragments(&self) -> &[RuntimeFragment] {
        &self.fragments.items
    }
    /// [`fence_binding_digest`] of every fragment of the binding, computed on first
    /// use and kept (shared by every clone: a binding pinned at every call is
    /// digested once).
    pub fn fence_digest_all(&self) -> &str {
        self.fragments.fence_digest.get_or_init(|| {
            let all: Vec<&RuntimeFragment> = self.fragments.items.iter().collect();
            fence_binding_digest(&all)
        })
    }
    /// The runtime fragment that holds `placement_fragment_id`.
    pub fn fragment_for(&self, placement_fragment_id: &str) -> Option<&RuntimeFragment> {
        let items = &self.fragments.items;
        items
            .binary_search_by(|f| f.spec.placement_fragment_id.as_str().cmp(placement_fragment_id))
            .ok()
            .map(|i| &items[i])
    }
}
