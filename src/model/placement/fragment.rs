//! Placement fragments (`data-model.md` §5): address-free N-D boxes of one tensor
//! owned by one rank, their canonical ids and geometry checks.

use crate::error::{invalid, Result};
use crate::geometry::{self, BoxRef, SharedBox};
use crate::json::{self, Profile};
use crate::model::axes::ParallelRank;
use crate::model::tensor::TensorDescriptor;
use crate::model::{non_empty, sha256_hex};
use std::sync::Arc;

/// Construction input of a [`PlacementFragment`].
#[derive(Clone, Debug, Default)]
pub struct PlacementFragmentSpec {
    /// Tensor id (non-empty).
    pub tensor_id: String,
    /// Box offset (one entry per tensor dimension).
    pub global_offset: Vec<u64>,
    /// Box extents (each >= 1).
    pub local_shape: Vec<u64>,
    /// Byte size of the box (>= 1; checked against the tensor when the fragment
    /// joins a part).
    pub nbytes: u64,
    /// Owning rank.
    pub rank: ParallelRank,
    /// Optional virtual pipeline stage.
    pub pipeline_stage_id: Option<u64>,
    /// Alias group (any order; normalized).
    pub aliases: Vec<String>,
    /// Explicit id, or `None` to derive the canonical `sha256:` id.
    pub placement_fragment_id: Option<String>,
}

/// An address-free N-D box of one tensor owned by one rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlacementFragment {
    /// Interned: within a part (and a placement) the tensor descriptor's own id.
    pub(super) tensor_id: Arc<str>,
    /// Offset and shape, shared with what is planned from the fragment.
    pub(super) geometry: SharedBox,
    pub(super) nbytes: u64,
    pub(super) rank: ParallelRank,
    pub(super) pipeline_stage_id: Option<u64>,
    pub(super) aliases: Vec<String>,
    /// Shared with the plans that keep a copy of the fragment.
    pub(super) placement_fragment_id: Arc<str>,
}

/// Normalizes an alias list (`data-model.md` §6): non-empty strings, no
/// duplicates, sorted; a non-empty group has >= 2 members including `tensor_id`.
pub(crate) fn normalize_aliases(mut aliases: Vec<String>, tensor_id: &str) -> Result<Vec<String>> {
    if aliases.iter().any(|a| a.is_empty()) {
        return invalid("aliases must contain non-empty strings");
    }
    aliases.sort_unstable();
    if aliases.windows(2).any(|w| w[0] == w[1]) {
        return invalid("aliases must not contain duplicates");
    }
    if !aliases.is_empty() {
        if aliases.len() < 2 {
            return invalid("alias group must contain at least two tensor IDs");
        }
        if aliases.binary_search_by(|a| a.as_str().cmp(tensor_id)).is_err() {
            return invalid("alias group must contain the fragment tensor_id");
        }
    }
    Ok(aliases)
}

impl PlacementFragment {
    /// Validates `spec` (order: offset, shape, tensor id, nbytes, rank, stage,
    /// aliases, id) and derives the canonical id when none is given.
    pub fn new(mut spec: PlacementFragmentSpec) -> Result<Self> {
        let tensor_id = Arc::from(std::mem::take(&mut spec.tensor_id));
        Self::with_tensor_id(spec, tensor_id)
    }

    /// [`Self::new`] with the tensor id given as a shared string (`spec.tensor_id`
    /// is ignored): decoders pass one allocation per tensor.
    pub(crate) fn with_tensor_id(spec: PlacementFragmentSpec, tensor_id: Arc<str>) -> Result<Self> {
        let geometry = SharedBox::new(&spec.global_offset, &spec.local_shape);
        Self::with_geometry(spec, tensor_id, geometry)
    }

    /// [`Self::with_tensor_id`] with the offset and shape given as one shared box
    /// (`spec.global_offset` and `spec.local_shape` are ignored).
    pub(crate) fn with_geometry(spec: PlacementFragmentSpec, tensor_id: Arc<str>, geometry: SharedBox) -> Result<Self> {
        if geometry.shape().iter().any(|&x| x < 1) {
            return invalid("local_shape must be at least 1");
        }
        non_empty(&tensor_id, "tensor_id")?;
        if spec.nbytes < 1 {
            return invalid("nbytes must be at least 1");
        }
        let aliases = normalize_aliases(spec.aliases, &tensor_id)?;
        let mut f = PlacementFragment {
            tensor_id,
            geometry,
            nbytes: spec.nbytes,
            rank: spec.rank,
            pipeline_stage_id: spec.pipeline_stage_id,
            aliases,
            placement_fragment_id: Arc::from(""),
        };
        f.placement_fragment_id = match spec.placement_fragment_id {
            Some(id) => {
                non_empty(&id, "placement_fragment_id")?;
                Arc::from(id)
            }
            None => Arc::from(f.canonical_id()),
        };
        Ok(f)
    }

    /// The shared tensor id.
    pub(crate) fn tensor_id_arc(&self) -> &Arc<str> {
        &self.tensor_id
    }

    /// The content-derived id `sha256:<hex>` (`wire-format.md` §3.2), whatever id
    /// the fragment carries.
    pub fn canonical_id(&self) -> String {
        let mut out = String::with_capacity(256);
        out.push_str("{\"aliases\":");
        json::write_str_array(&mut out, &self.aliases, Profile::Ascii);
        self.write_geometry(&mut out);
        out.push_str(",\"rank\":");
        self.rank.write_json(&mut out);
        out.push_str(",\"schema\":\"weight-placement-fragment\",\"tensor_id\":");
        json::write_str(&mut out, &self.tensor_id, Profile::Ascii);
        out.push('}');
        format!("sha256:{}", sha256_hex(out.as_bytes()))
    }

    // `,"global_offset":..,"local_shape":..,"nbytes":..[,"pipeline_stage_id":..]`
    pub(super) fn write_geometry<W: json::JsonOut>(&self, out: &mut W) {
        let geometry = self.geometry.as_box();
        out.push_str(",\"global_offset\":");
        json::write_u64_array(out, geometry.offset);
        out.push_str(",\"local_shape\":");
        json::write_u64_array(out, geometry.shape);
        out.push_str(",\"nbytes\":");
        json::write_u64(out, self.nbytes);
        if let Some(stage) = self.pipeline_stage_id {
            out.push_str(",\"pipeline_stage_id\":");
            json::write_u64(out, stage);
        }
    }

    /// Prefetches what [`Self::write_json`] reads behind pointers.
    #[inline]
    pub(crate) fn prefetch_heap(&self) {
        let id = self.placement_fragment_id.as_bytes();
        crate::model::prefetch(id.as_ptr());
        // A content-derived id is 71 bytes: its end is often on the next line.
        crate::model::prefetch(id.as_ptr().wrapping_add(id.len().saturating_sub(1)));
        crate::model::prefetch(self.geometry.as_ptr());
    }

    pub(crate) fn write_json<W: json::JsonOut>(&self, out: &mut W) {
        out.push_str("{\"aliases\":");
        json::write_str_array(out, &self.aliases, Profile::Ascii);
        self.write_geometry(out);
        out.push_str(",\"placement_fragment_id\":");
        json::write_str(out, &self.placement_fragment_id, Profile::Ascii);
        out.push_str(",\"rank\":");
        self.rank.write_json(out);
        out.push_str(",\"tensor_id\":");
        json::write_str(out, &self.tensor_id, Profile::Ascii);
        out.push('}');
    }

    /// Tensor id.
    pub fn tensor_id(&self) -> &str {
        &self.tensor_id
    }
    /// Box offset.
    pub fn global_offset(&self) -> &[u64] {
        self.geometry.offset()
    }
    /// Box extents.
    pub fn local_shape(&self) -> &[u64] {
        self.geometry.shape()
    }
    /// Byte size.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// Owning rank.
    pub fn rank(&self) -> ParallelRank {
        self.rank
    }
    /// Virtual pipeline stage.
    pub fn pipeline_stage_id(&self) -> Option<u64> {
        self.pipeline_stage_id
    }
    /// Sorted alias group (empty when none).
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }
    /// The placement fragment id.
    pub fn placement_fragment_id(&self) -> &str {
        &self.placement_fragment_id
    }
    /// Alias of [`Self::placement_fragment_id`].
    pub fn fragment_id(&self) -> &str {
        &self.placement_fragment_id
    }
    /// The box view.
    pub fn as_box(&self) -> BoxRef<'_> {
        self.geometry.as_box()
    }

    /// The shared offset and shape.
    pub(crate) fn geometry(&self) -> &SharedBox {
        &self.geometry
    }
}

/// Geometry of a fragment against its tensor (`data-model.md` §5): rank, bounds and
/// byte size. `id` names the fragment in messages.
pub(crate) fn check_fragment_geometry(
    t: &TensorDescriptor,
    id: &str,
    offset: &[u64],
    shape: &[u64],
    nbytes: u64,
) -> Result<()> {
    let gs = t.global_shape();
    if offset.len() != gs.len() || shape.len() != gs.len() {
        return invalid(format!("fragment rank mismatch: {id}"));
    }
    for d in 0..gs.len() {
        match offset[d].checked_add(shape[d]) {
            Some(end) if end <= gs[d] => {}
            _ => return invalid(format!("fragment is out of bounds: {id}")),
        }
    }
    let expected = geometry::volume(shape).saturating_mul(t.itemsize() as u128);
    if expected != nbytes as u128 {
        return invalid(format!("fragment byte size mismatch: {id}: expected {expected}, got {nbytes}"));
    }
    Ok(())
}
