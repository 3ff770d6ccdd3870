//! Runtime fragments (`data-model.md` §10): one live view of a placement fragment
//! (address, size, worker, device, shape and strides inside its storage allocation),
//! validated and normalized at construction; the snapshot of one that plans keep; and
//! the allocation-fence digest of a list of them.

use super::MemoryKind;
use crate::error::{invalid, Result};
use crate::geometry::SharedBox;
use crate::json::{self, Profile};
use crate::model::{canonical_strides, non_empty, sha256_hex, PlacementFragment};
use std::sync::Arc;

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
    pub(super) spec: Arc<RuntimeFragmentSpec>,
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

    /// This view's bytes as a host copy at `address` (its own allocation): the same
    /// fragment ids and geometry in host memory, what the snapshot path hands the
    /// store after staging a device view there.
    pub(crate) fn staged_at(&self, address: u64) -> RuntimeFragment {
        let mut spec = (*self.spec).clone();
        spec.address = address;
        spec.storage_address = address;
        spec.storage_offset_bytes = 0;
        spec.storage_nbytes = spec.nbytes;
        spec.memory = MemoryKind::Host;
        RuntimeFragment { spec: Arc::new(spec) }
    }

    /// `same_runtime_snapshot`: true iff the 13 physical fields equal the planned
    /// snapshot's (and the memory kind).
    pub fn same_as_snapshot(&self, planned: &RuntimeFragmentSnapshot) -> bool {
        self.spec == planned.runtime.spec
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
