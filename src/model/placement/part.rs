//! Placement parts (`data-model.md` §8): one participant's address-free contribution.

use super::checks::check_fragments;
use super::fragment::PlacementFragment;
use super::id_sort_key;
use crate::error::{invalid, Result};
use crate::fxhash::FxHashSet as HashSet;
use crate::model::axes::ParallelRank;
use crate::model::non_empty;
use crate::model::tensor::TensorDescriptor;
use std::sync::Arc;

/// Construction input of a [`PlacementPart`].
#[derive(Clone, Debug, Default)]
pub struct PlacementPartSpec {
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Placement set id.
    pub placement_set_id: String,
    /// Topology id of the placement the part belongs to.
    pub topology_id: String,
    /// Participant id.
    pub participant_id: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// The participant's rank; every fragment must carry it.
    pub rank: ParallelRank,
    /// Tensors referenced by the fragments (each must be referenced).
    pub tensors: Vec<Arc<TensorDescriptor>>,
    /// The participant's fragments.
    pub fragments: Vec<PlacementFragment>,
}

/// One participant's address-free contribution (`data-model.md` §8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementPart {
    pub(super) resource_id: String,
    pub(super) revision: String,
    pub(super) placement_set_id: String,
    pub(super) topology_id: String,
    pub(super) participant_id: String,
    pub(super) weight_generation: u64,
    pub(super) rank: ParallelRank,
    pub(super) tensors: Vec<Arc<TensorDescriptor>>,
    pub(super) fragments: Vec<PlacementFragment>,
}

/// Stable sort by placement fragment id, through a compact key array (the
/// fragments themselves move once).
fn sort_by_fragment_id(fragments: Vec<PlacementFragment>) -> Vec<PlacementFragment> {
    if fragments.windows(2).all(|w| w[0].placement_fragment_id <= w[1].placement_fragment_id) {
        return fragments;
    }
    let mut keyed: Vec<((u8, u128), u32)> =
        fragments.iter().enumerate().map(|(i, f)| (id_sort_key(&f.placement_fragment_id), i as u32)).collect();
    keyed.sort_by(|a, b| {
        a.0.cmp(&b.0).then_with(|| {
            fragments[a.1 as usize].placement_fragment_id.cmp(&fragments[b.1 as usize].placement_fragment_id)
        })
    });
    let mut slots: Vec<Option<PlacementFragment>> = fragments.into_iter().map(Some).collect();
    keyed.iter().map(|&(_, i)| slots[i as usize].take().expect("each index once")).collect()
}

/// Points every fragment's tensor id at its tensor descriptor's own (shared) id,
/// so that fragments hold no string of their own and compare by pointer.
/// `positions[i]`: the index in `tensors` of fragment `i`'s tensor.
fn intern_tensor_ids(tensors: &[Arc<TensorDescriptor>], fragments: &mut [PlacementFragment], positions: &[u32]) {
    for (f, &pos) in fragments.iter_mut().zip(positions) {
        let id = tensors[pos as usize].tensor_id_arc();
        if !Arc::ptr_eq(&f.tensor_id, id) {
            f.tensor_id = id.clone();
        }
    }
}

impl PlacementPart {
    /// Validates the part's own geometry (not its coverage).
    pub fn new(spec: PlacementPartSpec) -> Result<Self> {
        non_empty(&spec.resource_id, "resource_id")?;
        non_empty(&spec.revision, "revision")?;
        non_empty(&spec.placement_set_id, "placement_set_id")?;
        non_empty(&spec.topology_id, "topology_id")?;
        non_empty(&spec.participant_id, "participant_id")?;
        if spec.fragments.iter().any(|f| f.rank != spec.rank) {
            return invalid("placement part fragment rank differs from part rank");
        }
        let mut tensors = spec.tensors;
        tensors.sort_by(|a, b| a.tensor_id().cmp(b.tensor_id()));
        {
            // Fragments of one tensor usually come together: skip repeats of the
            // previous id before touching the set.
            let mut referenced: HashSet<&str> = crate::fxhash::set_with_capacity(tensors.len());
            let mut last: Option<&str> = None;
            for f in &spec.fragments {
                if last != Some(f.tensor_id()) {
                    referenced.insert(f.tensor_id());
                    last = Some(f.tensor_id());
                }
            }
            if let Some(t) = tensors.iter().find(|t| !referenced.contains(t.tensor_id())) {
                return invalid(format!("placement part contains an unreferenced tensor: {}", t.tensor_id()));
            }
        }
        let mut fragments = sort_by_fragment_id(spec.fragments);
        let positions = check_fragments(&tensors, fragments.iter(), false)?;
        intern_tensor_ids(&tensors, &mut fragments, &positions);
        Ok(PlacementPart {
            resource_id: spec.resource_id,
            revision: spec.revision,
            placement_set_id: spec.placement_set_id,
            topology_id: spec.topology_id,
            participant_id: spec.participant_id,
            weight_generation: spec.weight_generation,
            rank: spec.rank,
            tensors,
            fragments,
        })
    }

    /// Participant id.
    pub fn participant_id(&self) -> &str {
        &self.participant_id
    }
    /// Rank.
    pub fn rank(&self) -> ParallelRank {
        self.rank
    }
    /// Tensors sorted by id.
    pub fn tensors(&self) -> &[Arc<TensorDescriptor>] {
        &self.tensors
    }
    /// Fragments sorted by placement fragment id.
    pub fn fragments(&self) -> &[PlacementFragment] {
        &self.fragments
    }
    /// The fragment with `placement_fragment_id`, if it belongs to this part.
    pub fn fragment(&self, placement_fragment_id: &str) -> Option<&PlacementFragment> {
        self.fragments
            .binary_search_by(|f| (*f.placement_fragment_id).cmp(placement_fragment_id))
            .ok()
            .map(|i| &self.fragments[i])
    }
    /// Resource id.
    pub fn resource_id(&self) -> &str {
        &self.resource_id
    }
    /// Revision.
    pub fn revision(&self) -> &str {
        &self.revision
    }
    /// Placement set id.
    pub fn placement_set_id(&self) -> &str {
        &self.placement_set_id
    }
    /// Topology id.
    pub fn topology_id(&self) -> &str {
        &self.topology_id
    }
    /// Weight generation.
    pub fn weight_generation(&self) -> u64 {
        self.weight_generation
    }
}
