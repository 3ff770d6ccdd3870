//! [`PlacementBuilder`]: a placement assembled one participant, tensor and fragment at
//! a time, validated by the same constructors as every other placement. The C
//! placement builder (`mws_placement_builder_*`), the C++ `mws::PlacementBuilder` and
//! Python's `PlacementBuilder` are fronts for it, so the identity rules (canonical
//! JSON, SHA-256 ids) live in one place: this library.

use super::{FlatPlacementSpec, ParallelTopology, Placement, PlacementFragment, PlacementFragmentSpec};
use super::{TopologyParticipant, TopologySpec};
use crate::error::{invalid, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::model::axes::{ParallelAxis, ParallelRank};
use crate::model::tensor::{TensorDescriptor, TensorSpec};

/// What a [`PlacementBuilder`] builds: the placement's identity and topology sizes.
#[derive(Clone, Debug)]
pub struct PlacementBuilderSpec {
    /// Resource id (non-empty).
    pub resource_id: String,
    /// Revision (non-empty).
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Placement set id (non-empty).
    pub placement_set_id: String,
    /// TP size (>= 1).
    pub tp_size: u64,
    /// PP size (>= 1).
    pub pp_size: u64,
    /// EP size (>= 1).
    pub ep_size: u64,
    /// DP size (>= 1).
    pub dp_size: u64,
}

/// One fragment for [`PlacementBuilder::add_fragment`]: a box of a tensor added
/// before, held by a participant added before. `nbytes` is derived (the box's
/// elements times the tensor's item size) and the rank is the participant's.
#[derive(Clone, Debug, Default)]
pub struct BuilderFragment {
    /// The participant that holds the box.
    pub participant_id: String,
    /// The tensor.
    pub tensor_id: String,
    /// Box offset (one entry per tensor dimension).
    pub global_offset: Vec<u64>,
    /// Box extents.
    pub local_shape: Vec<u64>,
    /// Optional virtual pipeline stage.
    pub pipeline_stage_id: Option<u64>,
    /// Alias group (any order).
    pub aliases: Vec<String>,
    /// Explicit id, or `None` for the canonical `sha256:` id.
    pub placement_fragment_id: Option<String>,
}

/// Builds a [`Placement`] incrementally. Every `add_*` validates what it can at once
/// (tensor descriptors, fragment geometry, duplicates, unknown names); [`build`]
/// validates the whole (coverage, axes, topology) exactly as
/// [`Placement::from_fragments`] does, and can be called more than once.
///
/// Thread safety: a plain value (`Send + Sync`); mutation needs `&mut`.
///
/// [`build`]: PlacementBuilder::build
#[derive(Clone, Debug)]
pub struct PlacementBuilder {
    spec: PlacementBuilderSpec,
    participants: Vec<TopologyParticipant>,
    participant_index: HashMap<String, usize>,
    tensors: Vec<TensorDescriptor>,
    tensor_index: HashMap<String, usize>,
    fragments: Vec<PlacementFragment>,
}

impl PlacementBuilder {
    /// An empty builder. No validation yet (sizes and ids are checked by
    /// [`PlacementBuilder::build`], with the constructors' messages).
    pub fn new(spec: PlacementBuilderSpec) -> Self {
        PlacementBuilder {
            spec,
            participants: Vec::new(),
            participant_index: HashMap::default(),
            tensors: Vec::new(),
            tensor_index: HashMap::default(),
            fragments: Vec::new(),
        }
    }

    /// Adds a topology participant. Errors: `duplicate participant: <id>`,
    /// `participant_id must be a non-empty string`.
    pub fn add_participant(&mut self, participant_id: &str, rank: ParallelRank) -> Result<()> {
        if participant_id.is_empty() {
            return invalid("participant_id must be a non-empty string");
        }
        if self.participant_index.contains_key(participant_id) {
            return invalid(format!("duplicate participant: {participant_id}"));
        }
        self.participant_index.insert(participant_id.to_string(), self.participants.len());
        self.participants.push(TopologyParticipant { participant_id: participant_id.to_string(), rank });
        Ok(())
    }

    /// Adds a tensor (validated by [`TensorDescriptor::new`]). An empty
    /// `spec.shard_dims` is derived from the split axes (ascending), which is what a
    /// valid descriptor must say anyway. Errors: the descriptor's, and
    /// `duplicate tensor: <id>`.
    pub fn add_tensor(&mut self, mut spec: TensorSpec) -> Result<()> {
        if spec.shard_dims.is_empty() {
            let mut dims: Vec<u64> = spec
                .parallel_axes
                .iter()
                .filter_map(|a| match a {
                    ParallelAxis::Split { dim, .. } => Some(*dim),
                    _ => None,
                })
                .collect();
            dims.sort_unstable();
            spec.shard_dims = dims;
        }
        let t = TensorDescriptor::new(spec)?;
        if self.tensor_index.contains_key(t.tensor_id()) {
            return invalid(format!("duplicate tensor: {}", t.tensor_id()));
        }
        self.tensor_index.insert(t.tensor_id().to_string(), self.tensors.len());
        self.tensors.push(t);
        Ok(())
    }

    /// Adds a fragment and returns its `placement_fragment_id` (the canonical one
    /// when none was given). Errors: `unknown participant: <id>`, `unknown tensor_id:
    /// <id>`, `fragment byte size overflows`, and the fragment's own checks.
    pub fn add_fragment(&mut self, f: BuilderFragment) -> Result<&str> {
        let Some(&p) = self.participant_index.get(f.participant_id.as_str()) else {
            return invalid(format!("unknown participant: {}", f.participant_id));
        };
        let Some(&t) = self.tensor_index.get(f.tensor_id.as_str()) else {
            return invalid(format!("unknown tensor_id: {}", f.tensor_id));
        };
        let itemsize = self.tensors[t].itemsize();
        let nbytes = f
            .local_shape
            .iter()
            .try_fold(itemsize, |acc, &x| acc.checked_mul(x))
            .ok_or_else(|| crate::Error::invalid(format!("fragment byte size overflows: {}", f.tensor_id)))?;
        let fragment = PlacementFragment::new(PlacementFragmentSpec {
            tensor_id: f.tensor_id,
            global_offset: f.global_offset,
            local_shape: f.local_shape,
            nbytes,
            rank: self.participants[p].rank,
            pipeline_stage_id: f.pipeline_stage_id,
            aliases: f.aliases,
            placement_fragment_id: f.placement_fragment_id,
        })?;
        self.fragments.push(fragment);
        Ok(self.fragments.last().map(|f| f.placement_fragment_id()).unwrap_or_default())
    }

    /// Participants added so far.
    pub fn participant_count(&self) -> usize {
        self.participants.len()
    }
    /// Tensors added so far.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }
    /// Fragments added so far.
    pub fn fragment_count(&self) -> usize {
        self.fragments.len()
    }

    /// Validates and builds the placement (the builder stays usable).
    pub fn build(&self) -> Result<Placement> {
        let s = &self.spec;
        let topology = ParallelTopology::new(TopologySpec {
            tp_size: s.tp_size,
            pp_size: s.pp_size,
            ep_size: s.ep_size,
            dp_size: s.dp_size,
            participants: self.participants.clone(),
            topology_id: None,
        })?;
        Placement::from_fragments(FlatPlacementSpec {
            resource_id: s.resource_id.clone(),
            revision: s.revision.clone(),
            weight_generation: s.weight_generation,
            placement_set_id: s.placement_set_id.clone(),
            topology,
            tensors: self.tensors.clone(),
            fragments: self.fragments.clone(),
        })
    }
}
