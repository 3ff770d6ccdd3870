//! Live runtime bindings (`data-model.md` §10–§13): where each placement fragment
//! lives right now. Pointers are borrowed from the framework and never persisted;
//! nothing in this module dereferences them.

mod memory;
pub mod transport;

pub use memory::{CopyHook, MemoryRegion};

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::SharedBox;
use crate::json::{self, Profile};
use crate::model::{
    canonical_strides, is_hex64, non_empty, sha256_hex, Placement, PlacementFragment, PlacementPart, TensorDescriptor,
};
use std::collections::BTreeMap;
#[cfg(test)]
use std::collections::BTreeSet;
use std::sync::Arc;

/// Where a runtime buffer lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory: embedded backends copy it directly.
    #[default]
    Host,
    /// Device memory on accelerator `ordinal`: needs a copy hook or a
    /// device-capable backend.
    Device(u32),
}

/// Construction input of a [`RuntimeFragment`].
#[derive(Clone, Debug, Default)]
pub struct RuntimeFragmentSpec {
    /// The placement fragment this view holds.
    pub placement_fragment_id: String,
    /// The runtime fragment id (unique within a binding set).
    pub fragment_id: String,
    /// First byte of the view (>= 1).
    pub address: u64,
    /// View size in bytes (>= 1).
    pub nbytes: u64,
    /// Executor that owns the memory.
    pub worker_id: String,
    /// Routing endpoint (does not separate address spaces).
    pub endpoint: String,
    /// Device name, e.g. `cuda:0` (separates address spaces).
    pub device: String,
    /// Runtime item size (must equal the tensor's).
    pub itemsize: u64,
    /// View shape.
    pub local_shape: Vec<u64>,
    /// View byte strides (normalized on extent-1 dimensions).
    pub strides_bytes: Vec<u64>,
    /// Start of the enclosing storage allocation.
    pub storage_address: u64,
    /// Size of the enclosing storage allocation.
    pub storage_nbytes: u64,
    /// Offset of the view inside the allocation.
    pub storage_offset_bytes: u64,
    /// Host or device memory (our extension; defaults to host).
    pub memory: MemoryKind,
}

/// A validated runtime binding fragment. Equality covers every field (there is no
/// framework `owner` in this type: the caller keeps its allocations alive).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeFragment {
    /// Shared: plans keep a snapshot of each fragment they use, and a clone is a
    /// reference count, not a copy of its strings.
    spec: Arc<RuntimeFragmentSpec>,
}

impl PartialEq for RuntimeFragmentSpec {
    fn eq(&self, o: &Self) -> bool {
        self.placement_fragment_id == o.placement_fragment_id
            && self.fragment_id == o.fragment_id
            && self.address == o.address
            && self.nbytes == o.nbytes
            && self.worker_id == o.worker_id
            && self.endpoint == o.endpoint
            && self.device == o.device
            && self.itemsize == o.itemsize
            && self.local_shape == o.local_shape
            && self.strides_bytes == o.strides_bytes
            && self.storage_address == o.storage_address
            && self.storage_nbytes == o.storage_nbytes
            && self.storage_offset_bytes == o.storage_offset_bytes
            && self.memory == o.memory
    }
}
impl Eq for RuntimeFragmentSpec {}
impl std::hash::Hash for RuntimeFragmentSpec {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.fragment_id.hash(h);
        self.address.hash(h);
    }
}

fn check_range(address: u64, nbytes: u64, a: &str, n: &str) -> Result<()> {
    if address < 1 {
        return invalid(format!("{a} must be at least 1"));
    }
    if nbytes < 1 {
        return invalid(format!("{n} must be at least 1"));
    }
    if address.checked_add(nbytes).is_none() {
        return invalid("address range must fit in an unsigned 64-bit integer");
    }
    Ok(())
}

impl RuntimeFragment {
    /// Validates `spec` (`data-model.md` §10) and normalizes strides on extent-1
    /// dimensions to the canonical stride.
    pub fn new(mut spec: RuntimeFragmentSpec) -> Result<Self> {
        non_empty(&spec.placement_fragment_id, "placement_fragment_id")?;
        non_empty(&spec.fragment_id, "fragment_id")?;
        check_range(spec.address, spec.nbytes, "address", "nbytes")?;
        non_empty(&spec.worker_id, "worker_id")?;
        non_empty(&spec.endpoint, "endpoint")?;
        non_empty(&spec.device, "device")?;
        if spec.itemsize < 1 {
            return invalid("runtime itemsize must be at least 1");
        }
        if let Some(i) = spec.local_shape.iter().position(|&x| x < 1) {
            return invalid(format!("runtime local_shape[{i}] must be at least 1"));
        }
        if spec.strides_bytes.len() != spec.local_shape.len() {
            return invalid("runtime stride rank differs from local_shape");
        }
        if spec.local_shape.iter().zip(&spec.strides_bytes).any(|(&e, &s)| e > 1 && s == 0) {
            return invalid("runtime stride must be positive for non-singleton dimensions");
        }
        check_range(spec.storage_address, spec.storage_nbytes, "address", "nbytes")?;
        if spec.storage_address.checked_add(spec.storage_offset_bytes).is_none() {
            return invalid("normalized runtime address must fit in 64 bits");
        }
        if spec.address != spec.storage_address + spec.storage_offset_bytes {
            return invalid("runtime address must equal storage_address plus storage_offset_bytes");
        }
        if spec.nbytes > spec.storage_nbytes || spec.storage_offset_bytes > spec.storage_nbytes - spec.nbytes {
            return invalid("runtime view exceeds storage allocation bounds");
        }
        let canonical = canonical_strides(&spec.local_shape, spec.itemsize);
        for ((stride, &extent), &c) in spec.strides_bytes.iter_mut().zip(&spec.local_shape).zip(&canonical) {
            if extent == 1 {
                *stride = c;
            }
        }
        Ok(RuntimeFragment { spec: Arc::new(spec) })
    }

    /// Placement fragment id.
    pub fn placement_fragment_id(&self) -> &str {
        &self.spec.placement_fragment_id
    }
    /// Runtime fragment id.
    pub fn fragment_id(&self) -> &str {
        &self.spec.fragment_id
    }
    /// First byte of the view.
    pub fn address(&self) -> u64 {
        self.spec.address
    }
    /// View size.
    pub fn nbytes(&self) -> u64 {
        self.spec.nbytes
    }
    /// Worker id.
    pub fn worker_id(&self) -> &str {
        &self.spec.worker_id
    }
    /// Endpoint.
    pub fn endpoint(&self) -> &str {
        &self.spec.endpoint
    }
    /// Device.
    pub fn device(&self) -> &str {
        &self.spec.device
    }
    /// Item size.
    pub fn itemsize(&self) -> u64 {
        self.spec.itemsize
    }
    /// View shape.
    pub fn local_shape(&self) -> &[u64] {
        &self.spec.local_shape
    }
    /// Address of the shared record (for prefetching).
    pub(crate) fn spec_ptr(&self) -> *const RuntimeFragmentSpec {
        Arc::as_ptr(&self.spec)
    }
    /// Prefetches the strings and shapes the binding checks read behind the shared
    /// record (which should be in cache already: see [`Self::spec_ptr`]).
    #[inline]
    pub(crate) fn prefetch_heap(&self) {
        let s = &*self.spec;
        crate::model::prefetch(s.placement_fragment_id.as_ptr());
        crate::model::prefetch(s.fragment_id.as_ptr());
        crate::model::prefetch(s.worker_id.as_ptr());
        crate::model::prefetch(s.device.as_ptr());
        crate::model::prefetch(s.local_shape.as_ptr());
        crate::model::prefetch(s.strides_bytes.as_ptr());
    }
    /// Normalized byte strides.
    pub fn strides_bytes(&self) -> &[u64] {
        &self.spec.strides_bytes
    }
    /// Storage allocation start.
    pub fn storage_address(&self) -> u64 {
        self.spec.storage_address
    }
    /// Storage allocation size.
    pub fn storage_nbytes(&self) -> u64 {
        self.spec.storage_nbytes
    }
    /// View offset inside the allocation.
    pub fn storage_offset_bytes(&self) -> u64 {
        self.spec.storage_offset_bytes
    }
    /// Memory kind.
    pub fn memory(&self) -> MemoryKind {
        self.spec.memory
    }

    /// `same_runtime_snapshot`: true iff the 13 physical fields equal the planned
    /// snapshot's (and the memory kind).
    pub fn same_as_snapshot(&self, planned: &RuntimeFragmentSnapshot) -> bool {
        self.spec == planned.runtime.spec
    }
}

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
    resource_id: String,
    placement_id: String,
    placement_digest: String,
    instance_id: String,
    lease_generation: u64,
    lease_id: String,
    revision: String,
    participant_id: String,
    /// Shared: a clone (a plan's kept binding, a guard's observation, a prepared
    /// transfer's expected binding) is a reference count, and two clones compare
    /// equal without walking their fragments.
    fragments: Arc<FragmentList>,
}

/// The fragments of a binding, with what is derived from them alone, computed once
/// and shared by every clone.
#[derive(Debug)]
struct FragmentList {
    items: Box<[RuntimeFragment]>,
    /// [`fence_binding_digest`] of every fragment.
    fence_digest: std::sync::OnceLock<String>,
    /// Indices of `items` in runtime fragment id order.
    by_fragment_id: std::sync::OnceLock<Box<[u32]>>,
    /// [`fence_binding_digest`] of a few id subsets (a plan pins the same subset of
    /// a binding at every call): (sorted ids, digest), most recent last.
    subset_digests: parking_lot::Mutex<Vec<(Box<[String]>, String)>>,
    /// `(placement digest, participant id)` pairs whose part these fragments passed
    /// [`validate_runtime_binding_remembered`]'s fragment checks for, most recent last. The
    /// fragments never change and a placement digest names its whole content, so the
    /// outcome for a pair is settled once it passed.
    passed: parking_lot::Mutex<Vec<(String, String)>>,
}

/// Subset digests (and passed placement parts) kept per fragment list.
const SUBSET_DIGESTS: usize = 4;

/// Adds `item` to one of a fragment list's small memories (most recent last, at most
/// [`SUBSET_DIGESTS`]); an item already there is not added twice.
fn keep_recent<T: PartialEq>(kept: &mut Vec<T>, item: T) {
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

/// Owner-free evidence of one runtime fragment plus its logical geometry and lease
/// generation, kept inside plans (`RuntimeFragmentSnapshot`).
#[derive(Clone, Debug)]
pub struct RuntimeFragmentSnapshot {
    runtime: RuntimeFragment,
    tensor_id: Arc<str>,
    /// The placement fragment's (shared); only its offset is the snapshot's.
    geometry: SharedBox,
    lease_generation: u64,
}

impl PartialEq for RuntimeFragmentSnapshot {
    fn eq(&self, o: &Self) -> bool {
        self.runtime == o.runtime
            && self.tensor_id == o.tensor_id
            && self.global_offset() == o.global_offset()
            && self.lease_generation == o.lease_generation
    }
}

impl Eq for RuntimeFragmentSnapshot {}

impl RuntimeFragmentSnapshot {
    /// Snapshot of `runtime` holding `placement` under `lease_generation`.
    pub fn new(placement: &PlacementFragment, runtime: &RuntimeFragment, lease_generation: u64) -> Self {
        RuntimeFragmentSnapshot {
            runtime: runtime.clone(),
            tensor_id: placement.tensor_id_arc().clone(),
            geometry: placement.geometry().clone(),
            lease_generation,
        }
    }
    /// The runtime fragment as planned.
    pub fn runtime(&self) -> &RuntimeFragment {
        &self.runtime
    }
    /// Placement fragment id.
    pub fn placement_fragment_id(&self) -> &str {
        self.runtime.placement_fragment_id()
    }
    /// Runtime fragment id.
    pub fn fragment_id(&self) -> &str {
        self.runtime.fragment_id()
    }
    /// Tensor id.
    pub fn tensor_id(&self) -> &str {
        &self.tensor_id
    }
    /// Box offset.
    pub fn global_offset(&self) -> &[u64] {
        self.geometry.offset()
    }
    /// Box shape.
    pub fn local_shape(&self) -> &[u64] {
        self.runtime.local_shape()
    }
    /// Address of the view.
    pub fn address(&self) -> u64 {
        self.runtime.address()
    }
    /// View size.
    pub fn nbytes(&self) -> u64 {
        self.runtime.nbytes()
    }
    /// Worker id.
    pub fn worker_id(&self) -> &str {
        self.runtime.worker_id()
    }
    /// Device.
    pub fn device(&self) -> &str {
        self.runtime.device()
    }
    /// Memory kind.
    pub fn memory(&self) -> MemoryKind {
        self.runtime.memory()
    }
    /// Lease generation.
    pub fn lease_generation(&self) -> u64 {
        self.lease_generation
    }
}

/// The allocation-fence `binding_digest` (`wire-format.md` §9): hex SHA-256 of the
/// profile-A JSON array of fragment identities sorted by runtime fragment id.
pub fn fence_binding_digest(fragments: &[&RuntimeFragment]) -> String {
    let mut sorted: Vec<&RuntimeFragment> = fragments.to_vec();
    sorted.sort_by(|a, b| a.fragment_id().cmp(b.fragment_id()));
    let mut out = String::from("[");
    for (i, f) in sorted.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let s = &f.spec;
        out.push_str("{\"address\":");
        json::write_u64(&mut out, s.address);
        out.push_str(",\"device\":");
        json::write_str(&mut out, &s.device, Profile::Ascii);
        out.push_str(",\"endpoint\":");
        json::write_str(&mut out, &s.endpoint, Profile::Ascii);
        out.push_str(",\"fragment_id\":");
        json::write_str(&mut out, &s.fragment_id, Profile::Ascii);
        out.push_str(",\"itemsize\":");
        json::write_u64(&mut out, s.itemsize);
        out.push_str(",\"local_shape\":");
        json::write_u64_array(&mut out, &s.local_shape);
        out.push_str(",\"nbytes\":");
        json::write_u64(&mut out, s.nbytes);
        out.push_str(",\"placement_fragment_id\":");
        json::write_str(&mut out, &s.placement_fragment_id, Profile::Ascii);
        out.push_str(",\"storage_address\":");
        json::write_u64(&mut out, s.storage_address);
        out.push_str(",\"storage_nbytes\":");
        json::write_u64(&mut out, s.storage_nbytes);
        out.push_str(",\"storage_offset_bytes\":");
        json::write_u64(&mut out, s.storage_offset_bytes);
        out.push_str(",\"strides_bytes\":");
        json::write_u64_array(&mut out, &s.strides_bytes);
        out.push_str(",\"worker_id\":");
        json::write_str(&mut out, &s.worker_id, Profile::Ascii);
        out.push('}');
    }
    out.push(']');
    sha256_hex(out.as_bytes())
}

// ---------------------------------------------------------------------------
// Pairing with a placement (§12)
// ---------------------------------------------------------------------------

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
        FlatPlacementSpec, ParallelAxis, ParallelRank, ParallelTopology, PlacementFragmentSpec, TensorSpec,
        TopologyParticipant, TopologySpec,
    };

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
