//! Placement fragments, topology, parts and the complete placement
//! (`data-model.md` §5–§9, `wire-format.md` §2–§3).

use super::axes::{AxisKind, ParallelAxis, ParallelRank};
use super::tensor::TensorDescriptor;
use super::{non_empty, sha256_hex};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::json::{self, Obj, Profile, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

// ---------------------------------------------------------------------------
// Fragments
// ---------------------------------------------------------------------------

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
    tensor_id: String,
    global_offset: Vec<u64>,
    local_shape: Vec<u64>,
    nbytes: u64,
    rank: ParallelRank,
    pipeline_stage_id: Option<u64>,
    aliases: Vec<String>,
    placement_fragment_id: String,
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
    pub fn new(spec: PlacementFragmentSpec) -> Result<Self> {
        if spec.local_shape.iter().any(|&x| x < 1) {
            return invalid("local_shape must be at least 1");
        }
        non_empty(&spec.tensor_id, "tensor_id")?;
        if spec.nbytes < 1 {
            return invalid("nbytes must be at least 1");
        }
        let aliases = normalize_aliases(spec.aliases, &spec.tensor_id)?;
        let mut f = PlacementFragment {
            tensor_id: spec.tensor_id,
            global_offset: spec.global_offset,
            local_shape: spec.local_shape,
            nbytes: spec.nbytes,
            rank: spec.rank,
            pipeline_stage_id: spec.pipeline_stage_id,
            aliases,
            placement_fragment_id: String::new(),
        };
        f.placement_fragment_id = match spec.placement_fragment_id {
            Some(id) => {
                non_empty(&id, "placement_fragment_id")?;
                id
            }
            None => f.canonical_id(),
        };
        Ok(f)
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
    fn write_geometry(&self, out: &mut String) {
        out.push_str(",\"global_offset\":");
        json::write_u64_array(out, &self.global_offset);
        out.push_str(",\"local_shape\":");
        json::write_u64_array(out, &self.local_shape);
        out.push_str(",\"nbytes\":");
        json::write_u64(out, self.nbytes);
        if let Some(stage) = self.pipeline_stage_id {
            out.push_str(",\"pipeline_stage_id\":");
            json::write_u64(out, stage);
        }
    }

    pub(crate) fn write_json(&self, out: &mut String) {
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
        &self.global_offset
    }
    /// Box extents.
    pub fn local_shape(&self) -> &[u64] {
        &self.local_shape
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
        BoxRef::new(&self.global_offset, &self.local_shape)
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

// ---------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------

/// One participant of a topology.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologyParticipant {
    /// Non-empty participant id.
    pub participant_id: String,
    /// Its rank.
    pub rank: ParallelRank,
}

/// Construction input of a [`ParallelTopology`].
#[derive(Clone, Debug, Default)]
pub struct TopologySpec {
    /// TP size (>= 1).
    pub tp_size: u64,
    /// PP size (>= 1).
    pub pp_size: u64,
    /// EP size (>= 1).
    pub ep_size: u64,
    /// DP size (>= 1).
    pub dp_size: u64,
    /// Participants in any order.
    pub participants: Vec<TopologyParticipant>,
    /// Optional id that must equal the canonical one.
    pub topology_id: Option<String>,
}

/// The validated runtime topology: axis sizes plus explicit participants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParallelTopology {
    tp_size: u64,
    pp_size: u64,
    ep_size: u64,
    dp_size: u64,
    participants: Vec<TopologyParticipant>,
    topology_id: String,
}

impl ParallelTopology {
    /// Validates `spec` (`data-model.md` §7) and computes the canonical id.
    pub fn new(spec: TopologySpec) -> Result<Self> {
        for (name, v) in
            [("tp_size", spec.tp_size), ("pp_size", spec.pp_size), ("ep_size", spec.ep_size), ("dp_size", spec.dp_size)]
        {
            if v < 1 {
                return invalid(format!("{name} must be at least 1"));
            }
        }
        let mut participants = spec.participants;
        if participants.is_empty() {
            return invalid("parallel topology participants must not be empty");
        }
        for p in &participants {
            non_empty(&p.participant_id, "participant_id")?;
        }
        participants.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        if participants.windows(2).any(|w| w[0].participant_id == w[1].participant_id) {
            return invalid("duplicate topology participant_id");
        }
        let mut ranks = crate::fxhash::set_with_capacity(participants.len());
        if !participants.iter().all(|p| ranks.insert(p.rank)) {
            return invalid("duplicate topology parallel rank");
        }
        let mut t = ParallelTopology {
            tp_size: spec.tp_size,
            pp_size: spec.pp_size,
            ep_size: spec.ep_size,
            dp_size: spec.dp_size,
            participants,
            topology_id: String::new(),
        };
        for p in &t.participants {
            for kind in [AxisKind::Tp, AxisKind::Pp, AxisKind::Ep, AxisKind::Dp] {
                if p.rank.coord(kind) >= t.size(kind) {
                    return invalid(format!(
                        "{} rank is out of range for participant {}",
                        kind.as_str(),
                        p.participant_id
                    ));
                }
            }
        }
        let mut text = String::new();
        t.write_fields(&mut text, true);
        t.topology_id = format!("sha256:{}", sha256_hex(text.as_bytes()));
        if let Some(given) = spec.topology_id {
            // The `fuzzing` feature (fuzz builds only) lets mismatched ids through.
            if given != t.topology_id && !cfg!(feature = "fuzzing") {
                return invalid("topology_id does not match canonical topology");
            }
        }
        Ok(t)
    }

    fn write_fields(&self, out: &mut String, schema: bool) {
        out.push_str("{\"dp_size\":");
        json::write_u64(out, self.dp_size);
        out.push_str(",\"ep_size\":");
        json::write_u64(out, self.ep_size);
        out.push_str(",\"participants\":[");
        for (i, p) in self.participants.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"participant_id\":");
            json::write_str(out, &p.participant_id, Profile::Ascii);
            out.push_str(",\"rank\":");
            p.rank.write_json(out);
            out.push('}');
        }
        out.push_str("],\"pp_size\":");
        json::write_u64(out, self.pp_size);
        if schema {
            out.push_str(",\"schema\":\"weight-parallel-topology\"");
        } else {
            out.push_str(",\"topology_id\":");
            json::write_str(out, &self.topology_id, Profile::Ascii);
        }
        out.push_str(",\"tp_size\":");
        json::write_u64(out, self.tp_size);
        out.push('}');
    }

    /// Size of axis `kind`.
    pub fn size(&self, kind: AxisKind) -> u64 {
        match kind {
            AxisKind::Dp => self.dp_size,
            AxisKind::Pp => self.pp_size,
            AxisKind::Ep => self.ep_size,
            AxisKind::Tp => self.tp_size,
        }
    }
    /// TP size.
    pub fn tp_size(&self) -> u64 {
        self.tp_size
    }
    /// PP size.
    pub fn pp_size(&self) -> u64 {
        self.pp_size
    }
    /// EP size.
    pub fn ep_size(&self) -> u64 {
        self.ep_size
    }
    /// DP size.
    pub fn dp_size(&self) -> u64 {
        self.dp_size
    }
    /// Participants sorted by id.
    pub fn participants(&self) -> &[TopologyParticipant] {
        &self.participants
    }
    /// `len(participants)` (deliberately not the product of the sizes).
    pub fn world_size(&self) -> usize {
        self.participants.len()
    }
    /// Canonical `sha256:` id.
    pub fn topology_id(&self) -> &str {
        &self.topology_id
    }
    /// The participant `id`, or `unknown topology participant: <id>`.
    pub fn participant(&self, id: &str) -> Result<&TopologyParticipant> {
        self.participants
            .binary_search_by(|p| p.participant_id.as_str().cmp(id))
            .map(|i| &self.participants[i])
            .map_err(|_| Error::invalid(format!("unknown topology participant: {id}")))
    }

    fn from_json(v: &Value) -> Result<Self> {
        let schema = || "parallel topology schema fields do not match contract".to_string();
        let o = Obj::new(v, schema)?;
        o.expect_keys(&["tp_size", "pp_size", "ep_size", "dp_size", "topology_id", "participants"], schema)?;
        let items =
            json::req_array(o.get("participants"), || "parallel topology participants must be a sequence".into())?;
        let mut participants = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let schema = || format!("parallel topology participant {i} schema fields do not match contract");
            let po = Obj::new(item, schema)?;
            po.expect_keys(&["participant_id", "rank"], schema)?;
            participants.push(TopologyParticipant {
                participant_id: json::req_str(po.get("participant_id"), "participant_id")?,
                rank: ParallelRank::from_json(po.get("rank"), &|| {
                    format!("parallel topology rank {i} schema fields do not match contract")
                })?,
            });
        }
        ParallelTopology::new(TopologySpec {
            tp_size: json::req_int(o.get("tp_size"), "tp_size", 1)?,
            pp_size: json::req_int(o.get("pp_size"), "pp_size", 1)?,
            ep_size: json::req_int(o.get("ep_size"), "ep_size", 1)?,
            dp_size: json::req_int(o.get("dp_size"), "dp_size", 1)?,
            participants,
            topology_id: Some(json::req_str(o.get("topology_id"), "topology_id")?),
        })
    }
}

// ---------------------------------------------------------------------------
// Fragment checks shared by parts and placements (§9.4)
// ---------------------------------------------------------------------------

fn tensor_index(tensors: &[Arc<TensorDescriptor>]) -> Result<HashMap<&str, &TensorDescriptor>> {
    let mut map = crate::fxhash::map_with_capacity(tensors.len());
    for t in tensors {
        if map.insert(t.tensor_id(), &**t).is_some() {
            return invalid(format!("duplicate tensor_id: {}", t.tensor_id()));
        }
    }
    Ok(map)
}

/// §9.4 over a tensor list and fragments. `alias_check` runs §9.5 (placement only).
fn check_fragments<'a, I>(tensors: &'a [Arc<TensorDescriptor>], fragments: I, alias_check: bool) -> Result<()>
where
    I: Iterator<Item = &'a PlacementFragment> + Clone,
{
    let index = tensor_index(tensors)?;
    let mut ids: HashSet<&str> = HashSet::default();
    let mut logical: HashSet<(&str, ParallelRank, &[u64], &[u64])> = HashSet::default();
    let mut groups: HashMap<(&str, ParallelRank), Vec<BoxRef<'a>>> = HashMap::default();
    for f in fragments.clone() {
        let id = f.placement_fragment_id();
        if !ids.insert(id) {
            return invalid(format!("duplicate fragment_id: {id}"));
        }
        if !logical.insert((f.tensor_id(), f.rank, f.global_offset(), f.local_shape())) {
            return invalid(format!("duplicate logical fragment for tensor and parallel rank: {id}"));
        }
        let t =
            index.get(f.tensor_id()).ok_or_else(|| Error::invalid(format!("unknown tensor_id: {}", f.tensor_id())))?;
        check_fragment_geometry(t, id, f.global_offset(), f.local_shape(), f.nbytes())?;
        groups.entry((f.tensor_id(), f.rank)).or_default().push(f.as_box());
    }
    if alias_check {
        check_alias_completeness(&index, fragments)?;
    }
    for boxes in groups.values() {
        if boxes.len() >= 2 && geometry::boxes_overlap(boxes, HIGH_DIM_COMPARISON_BUDGET)? {
            return invalid("logical fragment boxes overlap for tensor and parallel rank");
        }
    }
    Ok(())
}

fn check_alias_completeness<'a, I>(index: &HashMap<&str, &TensorDescriptor>, fragments: I) -> Result<()>
where
    I: Iterator<Item = &'a PlacementFragment>,
{
    let mut declared: BTreeSet<&'a [String]> = BTreeSet::new();
    let mut per_tensor: HashMap<&'a str, BTreeSet<&'a [String]>> = HashMap::default();
    for f in fragments {
        if !f.aliases.is_empty() {
            declared.insert(&f.aliases);
        }
        per_tensor.entry(f.tensor_id()).or_default().insert(&f.aliases);
    }
    for group in declared {
        if let Some(unknown) = group.iter().find(|m| !index.contains_key(m.as_str())) {
            return invalid(format!("alias group references unknown tensor: {unknown}"));
        }
        for member in group {
            let ok = per_tensor.get(member.as_str()).is_some_and(|s| s.len() == 1 && s.contains(group));
            if !ok {
                return invalid(format!("alias group is not declared consistently for tensor: {member}"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Parts
// ---------------------------------------------------------------------------

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
    resource_id: String,
    revision: String,
    placement_set_id: String,
    topology_id: String,
    participant_id: String,
    weight_generation: u64,
    rank: ParallelRank,
    tensors: Vec<Arc<TensorDescriptor>>,
    fragments: Vec<PlacementFragment>,
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
        let referenced: HashSet<&str> = spec.fragments.iter().map(|f| f.tensor_id()).collect();
        let mut tensors = spec.tensors;
        tensors.sort_by(|a, b| a.tensor_id().cmp(b.tensor_id()));
        if let Some(t) = tensors.iter().find(|t| !referenced.contains(t.tensor_id())) {
            return invalid(format!("placement part contains an unreferenced tensor: {}", t.tensor_id()));
        }
        let mut fragments = spec.fragments;
        fragments.sort_by(|a, b| a.placement_fragment_id.cmp(&b.placement_fragment_id));
        check_fragments(&tensors, fragments.iter(), false)?;
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
            .binary_search_by(|f| f.placement_fragment_id.as_str().cmp(placement_fragment_id))
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

// ---------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------

/// Construction input of a [`Placement`] from parts (`data-model.md` §9.2).
#[derive(Clone, Debug)]
pub struct PlacementSpec {
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Placement set id.
    pub placement_set_id: String,
    /// Topology.
    pub topology: ParallelTopology,
    /// One part per topology participant.
    pub parts: Vec<PlacementPart>,
    /// Optional id that must equal the canonical one.
    pub placement_id: Option<String>,
}

/// Construction input of a [`Placement`] from a flat inventory (`data-model.md` §9.3).
#[derive(Clone, Debug)]
pub struct FlatPlacementSpec {
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Placement set id.
    pub placement_set_id: String,
    /// Topology.
    pub topology: ParallelTopology,
    /// Every tensor (each referenced by some fragment).
    pub tensors: Vec<TensorDescriptor>,
    /// Every fragment (its rank names its participant).
    pub fragments: Vec<PlacementFragment>,
}

/// The complete, validated, address-free layout of one weight generation over one
/// topology (`WeightPlacementManifest`). Immutable, `Send + Sync`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    resource_id: String,
    revision: String,
    weight_generation: u64,
    placement_set_id: String,
    topology: ParallelTopology,
    parts: Vec<PlacementPart>,
    tensors: Vec<Arc<TensorDescriptor>>,
    /// (part index, fragment index) sorted by placement fragment id.
    order: Vec<(u32, u32)>,
    placement_id: String,
    digest: String,
}

impl Placement {
    /// Builds and validates a placement from parts (§9.2), computing its
    /// `placement_id` and `digest`.
    pub fn from_parts(spec: PlacementSpec) -> Result<Self> {
        non_empty(&spec.resource_id, "resource_id")?;
        non_empty(&spec.revision, "revision")?;
        non_empty(&spec.placement_set_id, "placement_set_id")?;
        if let Some(id) = &spec.placement_id {
            non_empty(id, "placement_id")?;
        }
        let mut parts = spec.parts;
        parts.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        if parts.windows(2).any(|w| w[0].participant_id == w[1].participant_id) {
            return invalid("duplicate placement participant");
        }
        let topo = &spec.topology;
        let part_ids: HashSet<&str> = parts.iter().map(|p| p.participant_id.as_str()).collect();
        if let Some(p) = topo.participants().iter().find(|p| !part_ids.contains(p.participant_id.as_str())) {
            return invalid(format!("missing topology participant: {}", p.participant_id));
        }
        for part in &parts {
            let tp = topo
                .participant(&part.participant_id)
                .map_err(|_| Error::invalid(format!("unknown topology participant: {}", part.participant_id)))?;
            if part.resource_id != spec.resource_id {
                return invalid("placement part resource_id differs");
            }
            if part.revision != spec.revision {
                return invalid("placement part revision differs");
            }
            if part.weight_generation != spec.weight_generation {
                return invalid("placement part weight_generation differs");
            }
            if part.placement_set_id != spec.placement_set_id {
                return invalid("placement part placement_set_id differs");
            }
            if part.topology_id != topo.topology_id() {
                return invalid("placement part topology_id differs");
            }
            if part.rank != tp.rank {
                return invalid("placement part rank differs from topology");
            }
        }
        // Tensor catalog.
        let mut catalog: HashMap<&str, &Arc<TensorDescriptor>> = HashMap::default();
        for part in &parts {
            for t in &part.tensors {
                match catalog.get(t.tensor_id()) {
                    // Parts decoded together share one Arc per tensor: no deep compare.
                    Some(existing) if !Arc::ptr_eq(existing, t) && ***existing != **t => {
                        return invalid(format!("placement part tensor descriptor mismatch: {}", t.tensor_id()));
                    }
                    Some(_) => {}
                    None => {
                        catalog.insert(t.tensor_id(), t);
                    }
                }
            }
        }
        let mut tensors: Vec<Arc<TensorDescriptor>> = catalog.into_values().cloned().collect();
        tensors.sort_unstable_by(|a, b| a.tensor_id().cmp(b.tensor_id()));
        let mut order: Vec<(u32, u32)> = Vec::new();
        for (pi, part) in parts.iter().enumerate() {
            order.extend((0..part.fragments.len()).map(|fi| (pi as u32, fi as u32)));
        }
        let frag = |&(p, f): &(u32, u32)| &parts[p as usize].fragments[f as usize];
        let mut keyed: Vec<(&str, (u32, u32))> =
            order.iter().map(|k| (frag(k).placement_fragment_id.as_str(), *k)).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (slot, (_, k)) in order.iter_mut().zip(keyed) {
            *slot = k;
        }
        // Each part already validated its own fragments (geometry, known tensors,
        // logical duplicates and overlaps within its one rank); what is left is
        // global: unique fragment ids and alias completeness.
        if let Some(w) =
            order.windows(2).find(|w| frag(&w[0]).placement_fragment_id == frag(&w[1]).placement_fragment_id)
        {
            return invalid(format!("duplicate fragment_id: {}", frag(&w[0]).placement_fragment_id));
        }
        if order.iter().any(|k| !frag(k).aliases.is_empty()) {
            check_alias_completeness(&tensor_index(&tensors)?, order.iter().map(frag))?;
        }
        let mut placement = Placement {
            resource_id: spec.resource_id,
            revision: spec.revision,
            weight_generation: spec.weight_generation,
            placement_set_id: spec.placement_set_id,
            topology: spec.topology,
            parts,
            tensors,
            order,
            placement_id: String::new(),
            digest: String::new(),
        };
        placement.check_complete()?;
        // Both documents start with the same `{"parts":[...]` (the bulk): write it
        // once and hash it into both digests with different tails.
        let mut head = String::with_capacity(256 + placement.order.len() * 320);
        placement.write_parts(&mut head);
        let mut tail = String::new();
        placement.write_tail(&mut tail, None);
        placement.placement_id = format!("sha256:{}", super::sha256_hex_parts(&[head.as_bytes(), tail.as_bytes()]));
        if let Some(given) = spec.placement_id {
            // The `fuzzing` feature (fuzz builds only) lets mismatched ids through.
            if given != placement.placement_id && !cfg!(feature = "fuzzing") {
                return invalid("placement_id does not match canonical logical content");
            }
        }
        tail.clear();
        placement.write_tail(&mut tail, Some(&placement.placement_id));
        placement.digest = super::sha256_hex_parts(&[head.as_bytes(), tail.as_bytes()]);
        Ok(placement)
    }

    /// Builds a placement from a flat inventory (§9.3): one part per topology
    /// participant (possibly empty), then [`Placement::from_parts`].
    pub fn from_fragments(spec: FlatPlacementSpec) -> Result<Self> {
        let mut by_id: BTreeMap<&str, Arc<TensorDescriptor>> = BTreeMap::new();
        for t in &spec.tensors {
            if by_id.insert(t.tensor_id(), Arc::new(t.clone())).is_some() {
                return invalid("duplicate tensor_id in placement tensors");
            }
        }
        let referenced: BTreeSet<&str> = spec.fragments.iter().map(|f| f.tensor_id()).collect();
        if let Some(unknown) = referenced.iter().find(|id| !by_id.contains_key(**id)) {
            return invalid(format!("unknown tensor_id: {unknown}"));
        }
        if let Some(id) = by_id.keys().find(|id| !referenced.contains(**id)) {
            return invalid(format!("global placement contains an unreferenced tensor: {id}"));
        }
        let topo = &spec.topology;
        let by_rank: HashMap<ParallelRank, usize> =
            topo.participants().iter().enumerate().map(|(i, p)| (p.rank, i)).collect();
        let mut buckets: Vec<Vec<PlacementFragment>> = vec![Vec::new(); topo.participants().len()];
        let topo_ranks = by_rank;
        let mut fragments = spec.fragments;
        if let Some(f) = fragments.iter().find(|f| !topo_ranks.contains_key(&f.rank)) {
            return invalid(format!(
                "placement fragment rank has no topology participant: {}",
                f.placement_fragment_id
            ));
        }
        for f in fragments.drain(..) {
            buckets[topo_ranks[&f.rank]].push(f);
        }
        let mut parts = Vec::with_capacity(buckets.len());
        for (p, fragments) in topo.participants().iter().zip(buckets) {
            let ids: BTreeSet<&str> = fragments.iter().map(|f| f.tensor_id()).collect();
            let tensors = ids.iter().map(|id| by_id[id].clone()).collect();
            parts.push(PlacementPart::new(PlacementPartSpec {
                resource_id: spec.resource_id.clone(),
                revision: spec.revision.clone(),
                placement_set_id: spec.placement_set_id.clone(),
                topology_id: topo.topology_id().to_string(),
                participant_id: p.participant_id.clone(),
                weight_generation: spec.weight_generation,
                rank: p.rank,
                tensors,
                fragments,
            })?);
        }
        Placement::from_parts(PlacementSpec {
            resource_id: spec.resource_id,
            revision: spec.revision,
            weight_generation: spec.weight_generation,
            placement_set_id: spec.placement_set_id,
            topology: spec.topology,
            parts,
            placement_id: None,
        })
    }

    /// Resource id.
    pub fn resource_id(&self) -> &str {
        &self.resource_id
    }
    /// Resource kind (always `model_weight`).
    pub fn resource_kind(&self) -> &'static str {
        "model_weight"
    }
    /// Revision.
    pub fn revision(&self) -> &str {
        &self.revision
    }
    /// Weight generation.
    pub fn weight_generation(&self) -> u64 {
        self.weight_generation
    }
    /// Placement set id.
    pub fn placement_set_id(&self) -> &str {
        &self.placement_set_id
    }
    /// Topology.
    pub fn topology(&self) -> &ParallelTopology {
        &self.topology
    }
    /// Parts sorted by participant id (one per topology participant).
    pub fn parts(&self) -> &[PlacementPart] {
        &self.parts
    }
    /// The part of `participant_id`.
    pub fn part(&self, participant_id: &str) -> Option<&PlacementPart> {
        self.parts.binary_search_by(|p| p.participant_id.as_str().cmp(participant_id)).ok().map(|i| &self.parts[i])
    }
    /// Tensors sorted by id.
    pub fn tensors(&self) -> &[Arc<TensorDescriptor>] {
        &self.tensors
    }
    /// The tensor `tensor_id`.
    pub fn tensor(&self, tensor_id: &str) -> Option<&TensorDescriptor> {
        self.tensors.binary_search_by(|t| t.tensor_id().cmp(tensor_id)).ok().map(|i| &*self.tensors[i])
    }
    /// All fragments, sorted by placement fragment id.
    pub fn fragments(&self) -> impl ExactSizeIterator<Item = &PlacementFragment> + Clone + '_ {
        self.order.iter().map(move |&(p, f)| &self.parts[p as usize].fragments[f as usize])
    }
    /// Number of fragments.
    pub fn fragment_count(&self) -> usize {
        self.order.len()
    }
    /// Canonical `sha256:` placement id.
    pub fn placement_id(&self) -> &str {
        &self.placement_id
    }
    /// Hex SHA-256 of the canonical placement JSON (computed once).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The canonical placement JSON (profile A, `wire-format.md` §2).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(256 + self.order.len() * 320);
        self.write_json(&mut out, Some(&self.placement_id));
        out
    }

    /// With `id`: the placement JSON; without: the `placement_id` input (§3.3).
    fn write_json(&self, out: &mut String, id: Option<&str>) {
        self.write_parts(out);
        self.write_tail(out, id);
    }

    /// `{"parts":[...]` — the part of both documents that holds the fragments.
    fn write_parts(&self, out: &mut String) {
        out.push_str("{\"parts\":[");
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"fragments\":[");
            for (j, f) in part.fragments.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                f.write_json(out);
            }
            out.push_str("],\"participant_id\":");
            json::write_str(out, &part.participant_id, Profile::Ascii);
            out.push_str(",\"rank\":");
            part.rank.write_json(out);
            out.push('}');
        }
        out.push(']');
    }

    /// Everything after the parts (with `id`: placement JSON; without: the
    /// `placement_id` input).
    fn write_tail(&self, out: &mut String, id: Option<&str>) {
        if let Some(id) = id {
            out.push_str(",\"placement_id\":");
            json::write_str(out, id, Profile::Ascii);
        }
        out.push_str(",\"placement_set_id\":");
        json::write_str(out, &self.placement_set_id, Profile::Ascii);
        out.push_str(",\"resource_id\":");
        json::write_str(out, &self.resource_id, Profile::Ascii);
        if id.is_some() {
            out.push_str(",\"resource_kind\":\"model_weight\"");
        }
        out.push_str(",\"revision\":");
        json::write_str(out, &self.revision, Profile::Ascii);
        if id.is_none() {
            out.push_str(",\"schema\":\"complete-weight-placement\"");
        }
        out.push_str(",\"tensors\":[");
        for (i, t) in self.tensors.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            t.write_json(out, Profile::Ascii);
        }
        out.push_str("],\"topology\":");
        self.topology.write_fields(out, false);
        out.push_str(",\"weight_generation\":");
        json::write_u64(out, self.weight_generation);
        out.push('}');
    }

    /// Decodes placement JSON strictly (`wire-format.md` §2.1) and validates it
    /// completely. `bytes` is UTF-8 with an optional BOM.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] naming the first violation.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let v = json::parse_bytes(bytes, "placement manifest")?;
        Self::from_json_value(&v)
    }

    /// Same as [`Placement::from_json`] for text input (a leading BOM is an error).
    pub fn from_json_str(text: &str) -> Result<Self> {
        let v = json::parse_text(text, "placement manifest")?;
        Self::from_json_value(&v)
    }

    /// Decodes an already parsed JSON value (see [`Placement::from_json`]).
    pub fn from_json_value(v: &Value) -> Result<Self> {
        const KEYS: [&str; 9] = [
            "resource_kind",
            "resource_id",
            "revision",
            "placement_set_id",
            "weight_generation",
            "placement_id",
            "topology",
            "tensors",
            "parts",
        ];
        let o = Obj::new(v, || "placement manifest must be a JSON object".into())?;
        o.expect_keys(&KEYS, || "placement manifest schema fields do not match contract".into())?;
        match o.get("resource_kind") {
            Value::Str(s) if s == "model_weight" => {}
            _ => return invalid("placement manifest resource_kind must be model_weight"),
        }
        let resource_id = json::req_str(o.get("resource_id"), "resource_id")?;
        let revision = json::req_str(o.get("revision"), "revision")?;
        let placement_set_id = json::req_str(o.get("placement_set_id"), "placement_set_id")?;
        let placement_id = json::req_str(o.get("placement_id"), "placement_id")?;
        let weight_generation = json::req_int(o.get("weight_generation"), "weight_generation", 0).map_err(|e| {
            Error::invalid(format!("weight_generation must be an integer at least 0 ({})", e.message()))
        })?;
        let topology = ParallelTopology::from_json(o.get("topology"))?;

        let tensor_items = json::req_array(o.get("tensors"), || "placement tensors must be a sequence".into())?;
        let mut tensors: Vec<Arc<TensorDescriptor>> = Vec::with_capacity(tensor_items.len());
        for (i, item) in tensor_items.iter().enumerate() {
            let schema = || format!("placement tensor {i} schema fields do not match contract");
            tensors.push(Arc::new(TensorDescriptor::from_json(item, &schema, "", "placement tensor parallel axis")?));
        }
        let mut index: HashMap<&str, usize> = crate::fxhash::map_with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.tensor_id(), i).is_some() {
                return invalid("duplicate tensor_id in placement JSON");
            }
        }

        let part_items = json::req_array(o.get("parts"), || "placement parts must be a sequence".into())?;
        let mut referenced = vec![false; tensors.len()];
        let mut unknown: Vec<String> = Vec::new();
        let mut raw_parts = Vec::with_capacity(part_items.len());
        let mut frag_index = 0usize;
        for (i, item) in part_items.iter().enumerate() {
            let schema = || format!("placement part {i} schema fields do not match contract");
            let po = Obj::new(item, schema)?;
            po.expect_keys(&["participant_id", "rank", "fragments"], schema)?;
            let participant_id = json::req_str(po.get("participant_id"), "participant_id")?;
            let rank = ParallelRank::from_json(po.get("rank"), &|| {
                format!("placement part rank {i} schema fields do not match contract")
            })?;
            let frag_items =
                json::req_array(po.get("fragments"), || "placement part fragments must be a sequence".into())?;
            let mut fragments = Vec::with_capacity(frag_items.len());
            let mut part_tensors: Vec<usize> = Vec::new();
            for item in frag_items {
                let f = decode_fragment(item, frag_index)?;
                frag_index += 1;
                match index.get(f.tensor_id()) {
                    Some(&t) => {
                        referenced[t] = true;
                        part_tensors.push(t);
                    }
                    None => unknown.push(f.tensor_id().to_string()),
                }
                fragments.push(f);
            }
            part_tensors.sort_unstable();
            part_tensors.dedup();
            raw_parts.push((participant_id, rank, fragments, part_tensors));
        }
        unknown.sort_unstable();
        if let Some(id) = unknown.first() {
            return invalid(format!("unknown tensor_id in placement part: {id}"));
        }
        let mut unreferenced: Vec<&str> =
            tensors.iter().zip(&referenced).filter(|(_, r)| !**r).map(|(t, _)| t.tensor_id()).collect();
        unreferenced.sort_unstable();
        if let Some(id) = unreferenced.first() {
            return invalid(format!("placement JSON contains an unreferenced tensor: {id}"));
        }
        let mut parts = Vec::with_capacity(raw_parts.len());
        for (participant_id, rank, fragments, part_tensors) in raw_parts {
            parts.push(PlacementPart::new(PlacementPartSpec {
                resource_id: resource_id.clone(),
                revision: revision.clone(),
                placement_set_id: placement_set_id.clone(),
                topology_id: topology.topology_id().to_string(),
                participant_id,
                weight_generation,
                rank,
                tensors: part_tensors.iter().map(|&t| tensors[t].clone()).collect(),
                fragments,
            })?);
        }
        Placement::from_parts(PlacementSpec {
            resource_id,
            revision,
            weight_generation,
            placement_set_id,
            topology,
            parts,
            placement_id: Some(placement_id),
        })
    }

    // -----------------------------------------------------------------------
    // Complete-placement semantics (§9.6)
    // -----------------------------------------------------------------------

    fn check_complete(&self) -> Result<()> {
        if self.tensors.is_empty() {
            return invalid("global weight placement must contain tensors");
        }
        if self.order.is_empty() {
            return invalid("global weight placement must contain fragments");
        }
        let mut by_tensor: HashMap<&str, Vec<&PlacementFragment>> =
            crate::fxhash::map_with_capacity(self.tensors.len());
        for f in self.fragments() {
            by_tensor.entry(f.tensor_id()).or_default().push(f);
        }
        let mut indexes: HashMap<[u8; 4], ParticipantIndex> = HashMap::default();
        for t in &self.tensors {
            let frags = by_tensor.get(t.tensor_id()).map(Vec::as_slice).unwrap_or(&[]);
            if frags.is_empty() {
                return invalid(format!("global placement tensor is not fully covered: {}", t.tensor_id()));
            }
            let sig = AxisSignature::of(t);
            let index = indexes.entry(sig.code).or_insert_with(|| ParticipantIndex::build(&self.topology, &sig));
            check_tensor_semantics(&self.topology, t, &sig, index, frags)?;
        }
        Ok(())
    }
}

pub(crate) fn decode_fragment(item: &Value, i: usize) -> Result<PlacementFragment> {
    const KEYS7: [&str; 7] =
        ["placement_fragment_id", "tensor_id", "global_offset", "local_shape", "nbytes", "rank", "aliases"];
    const KEYS8: [&str; 8] = [
        "placement_fragment_id",
        "tensor_id",
        "global_offset",
        "local_shape",
        "nbytes",
        "rank",
        "aliases",
        "pipeline_stage_id",
    ];
    let o = Obj::new(item, || format!("placement fragment {i} must be a JSON object"))?;
    if !o.has_exact_keys(&KEYS7) && !o.has_exact_keys(&KEYS8) {
        return invalid(format!("placement fragment {i} has an invalid schema"));
    }
    let aliases_v = json::req_array(o.get("aliases"), || "aliases must be a sequence".into())?;
    let mut aliases = Vec::with_capacity(aliases_v.len());
    for a in aliases_v {
        match a {
            Value::Str(s) if !s.is_empty() => aliases.push(s.to_string()),
            _ => return invalid("alias must be a non-empty string"),
        }
    }
    PlacementFragment::new(PlacementFragmentSpec {
        tensor_id: json::req_str(o.get("tensor_id"), "tensor_id")?,
        global_offset: json::req_int_array(o.get("global_offset"), "global_offset", 0)?,
        local_shape: json::req_int_array(o.get("local_shape"), "local_shape", 1)?,
        nbytes: json::req_int(o.get("nbytes"), "nbytes", 1)?,
        rank: ParallelRank::from_json(o.get("rank"), &|| {
            format!("placement rank {i} schema fields do not match contract")
        })?,
        pipeline_stage_id: json::opt_int(o.get("pipeline_stage_id"), "pipeline_stage_id", 0)?,
        aliases,
        placement_fragment_id: Some(json::req_str(o.get("placement_fragment_id"), "placement_fragment_id")?),
    })
}

/// Per-kind role of a tensor's axes: 0 undeclared, 1 split, 2 replicated, 3 ownership.
struct AxisSignature {
    code: [u8; 4],
}

impl AxisSignature {
    fn of(t: &TensorDescriptor) -> Self {
        let mut code = [0u8; 4];
        for a in t.parallel_axes() {
            code[a.kind() as usize] = match a {
                ParallelAxis::Split { .. } => 1,
                ParallelAxis::Replicated(_) => 2,
                ParallelAxis::Ownership(_) => 3,
            };
        }
        AxisSignature { code }
    }

    /// Projects `rank` onto the kinds of role `role` (other coordinates zeroed).
    fn key(&self, rank: ParallelRank, role: u8) -> [u64; 4] {
        let mut k = [0u64; 4];
        for kind in AxisKind::ALL {
            if self.code[kind as usize] == role {
                k[kind as usize] = rank.coord(kind);
            }
        }
        k
    }
}

/// Topology participants grouped by owner, then replica, with their split keys.
struct ParticipantIndex {
    owners: HashMap<[u64; 4], BTreeMap<[u64; 4], BTreeSet<[u64; 4]>>>,
}

impl ParticipantIndex {
    fn build(topo: &ParallelTopology, sig: &AxisSignature) -> Self {
        let mut owners: HashMap<[u64; 4], BTreeMap<[u64; 4], BTreeSet<[u64; 4]>>> = HashMap::default();
        for p in topo.participants() {
            owners
                .entry(sig.key(p.rank, 3))
                .or_default()
                .entry(sig.key(p.rank, 2))
                .or_default()
                .insert(sig.key(p.rank, 1));
        }
        ParticipantIndex { owners }
    }
}

fn check_tensor_semantics(
    topo: &ParallelTopology,
    t: &TensorDescriptor,
    sig: &AxisSignature,
    index: &ParticipantIndex,
    frags: &[&PlacementFragment],
) -> Result<()> {
    let id = t.tensor_id();
    // (a) undeclared active axes
    let declared: Vec<AxisKind> = t.parallel_axes().iter().map(|a| a.kind()).collect();
    let varying: Vec<AxisKind> = declared
        .iter()
        .copied()
        .filter(|&k| {
            let first = frags[0].rank.coord(k);
            frags.iter().any(|f| f.rank.coord(k) != first)
        })
        .collect();
    for kind in AxisKind::ALL {
        if declared.contains(&kind) || topo.size(kind) <= 1 {
            continue;
        }
        let first = frags[0].rank.coord(kind);
        let distinct = frags.iter().any(|f| f.rank.coord(kind) != first);
        let k = kind.as_str();
        if matches!(kind, AxisKind::Dp | AxisKind::Pp) || !distinct {
            return invalid(format!(
                "global placement tensor requires explicit parallel semantics for active undeclared {k} axis: {id}"
            ));
        }
        if varying.is_empty() {
            return invalid(format!("global placement tensor varies across undeclared {k} axis: {id}"));
        }
        let mut function: HashMap<Vec<u64>, u64> = HashMap::default();
        for f in frags {
            let key: Vec<u64> = varying.iter().map(|&v| f.rank.coord(v)).collect();
            if *function.entry(key).or_insert(f.rank.coord(kind)) != f.rank.coord(kind) {
                return invalid(format!(
                    "global placement tensor varies independently across undeclared {k} axis: {id}"
                ));
            }
        }
    }
    // (b) owners and replicas
    let split_axes: Vec<(AxisKind, usize)> = t
        .parallel_axes()
        .iter()
        .filter_map(|a| match a {
            ParallelAxis::Split { kind, dim } => Some((*kind, *dim as usize)),
            _ => None,
        })
        .collect();
    let mut by_owner: BTreeMap<[u64; 4], BTreeMap<[u64; 4], Vec<&PlacementFragment>>> = BTreeMap::new();
    for f in frags {
        by_owner.entry(sig.key(f.rank, 3)).or_default().entry(sig.key(f.rank, 2)).or_default().push(f);
    }
    let empty = BTreeMap::new();
    let whole_offset = vec![0u64; t.ndim()];
    let whole = BoxRef::new(&whole_offset, t.global_shape());
    for (owner, replicas) in &by_owner {
        let expected = index.owners.get(owner).unwrap_or(&empty);
        if !expected.keys().eq(replicas.keys()) {
            return invalid(format!(
                "global placement tensor is not fully covered: missing or unexpected replicated-axis participant for {id}"
            ));
        }
        for (replica, expected_splits) in expected {
            let cover = &replicas[replica];
            let boxes: Vec<BoxRef<'_>> = cover.iter().map(|f| f.as_box()).collect();
            if !geometry::boxes_exactly_cover(whole, &boxes, HIGH_DIM_COMPARISON_BUDGET)? {
                return invalid(format!("global placement tensor is not fully covered: {id}"));
            }
            if split_axes.is_empty() {
                continue;
            }
            let split_err = || {
                Error::invalid(format!(
                    "global placement tensor is not fully covered: missing or unexpected split-axis participant for {id}"
                ))
            };
            for &(kind, _) in &split_axes {
                let values: BTreeSet<u64> = expected_splits.iter().map(|k| k[kind as usize]).collect();
                if !values.iter().copied().eq(0..topo.size(kind)) {
                    return Err(split_err());
                }
            }
            let actual: BTreeSet<[u64; 4]> = cover.iter().map(|f| sig.key(f.rank, 1)).collect();
            if actual != *expected_splits {
                return Err(split_err());
            }
            let product: u128 = split_axes
                .iter()
                .map(|&(kind, _)| actual.iter().map(|k| k[kind as usize]).collect::<BTreeSet<_>>().len() as u128)
                .product();
            if product != actual.len() as u128 {
                return invalid(format!(
                    "non-Cartesian split-axis participant mapping cannot prove rank-to-dimension ownership: {id}"
                ));
            }
            for &(kind, dim) in &split_axes {
                check_split_geometry(t, cover, kind, dim)?;
            }
        }
    }
    Ok(())
}

fn check_split_geometry(t: &TensorDescriptor, cover: &[&PlacementFragment], kind: AxisKind, dim: usize) -> Result<()> {
    let mut per_rank: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for f in cover {
        per_rank
            .entry(f.rank.coord(kind))
            .or_default()
            .push((f.global_offset[dim], f.global_offset[dim] + f.local_shape[dim]));
    }
    let mut merged: Vec<(u64, u64, u64)> = Vec::new();
    for (rank, mut iv) in per_rank {
        iv.sort_unstable();
        let mut cur = iv[0];
        for &(b, e) in &iv[1..] {
            if b <= cur.1 {
                cur.1 = cur.1.max(e);
            } else {
                merged.push((cur.0, cur.1, rank));
                cur = (b, e);
            }
        }
        merged.push((cur.0, cur.1, rank));
    }
    merged.sort_unstable();
    let mut expected_begin = 0;
    for &(b, e, _) in &merged {
        if b != expected_begin {
            expected_begin = u64::MAX;
            break;
        }
        expected_begin = e;
    }
    if expected_begin != t.global_shape()[dim] {
        return invalid(format!(
            "split-axis rank geometry conflicts with declared dimension: {}: {} -> dim {dim}",
            t.tensor_id(),
            kind.as_str()
        ));
    }
    Ok(())
}
