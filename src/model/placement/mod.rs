//! Placement fragments, topology, parts and the complete placement
//! (`data-model.md` §5–§9, `wire-format.md` §2–§3).
//!
//! One file per concept: [`fragment`], [`topology`], [`part`], shared [`checks`], the
//! tensor [`semantics`] across the topology, the placement itself (here) and its
//! canonical [`wire`].

mod builder;
mod checks;
mod fragment;
mod part;
mod semantics;
mod topology;
mod wire;

pub use builder::{BuilderFragment, PlacementBuilder, PlacementBuilderSpec};
pub(crate) use fragment::{check_fragment_geometry, normalize_aliases};
pub use fragment::{PlacementFragment, PlacementFragmentSpec};
pub use part::{PlacementPart, PlacementPartSpec};
pub use topology::{ParallelTopology, TopologyParticipant, TopologySpec};
pub(crate) use wire::decode_fragment;

use self::checks::{check_alias_completeness, tensor_index};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::model::axes::ParallelRank;
use crate::model::non_empty;
use crate::model::tensor::TensorDescriptor;
use sha2::Digest;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A sort key whose order agrees with the byte order of ids wherever two keys
/// differ; equal keys fall back to comparing the whole ids. Ids with the
/// canonical `sha256:` prefix form one contiguous interval of that order (class 1,
/// keyed by the 16 bytes after the prefix); other ids sort below (class 0) or above
/// (class 2) it, keyed by their first 16 bytes. Bytes are big-endian, zero-padded.
pub(super) fn id_sort_key(id: &str) -> (u8, u128) {
    const PREFIX: &[u8] = b"sha256:";
    let b = id.as_bytes();
    let (class, tail) = match b.strip_prefix(PREFIX) {
        Some(rest) => (1, rest),
        None if b < PREFIX => (0, b),
        None => (2, b),
    };
    let mut key = [0u8; 16];
    let n = tail.len().min(16);
    key[..n].copy_from_slice(&tail[..n]);
    (class, u128::from_be_bytes(key))
}

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
    pub(super) resource_id: String,
    pub(super) revision: String,
    pub(super) weight_generation: u64,
    pub(super) placement_set_id: String,
    pub(super) topology: ParallelTopology,
    pub(super) parts: Vec<PlacementPart>,
    pub(super) tensors: Vec<Arc<TensorDescriptor>>,
    /// (part index, fragment index) sorted by placement fragment id.
    pub(super) order: Vec<(u32, u32)>,
    pub(super) placement_id: String,
    pub(super) digest: String,
    /// Where each part's JSON ends in [`Placement::to_json`] (the byte after its
    /// `}`), and that document's length, learned when construction hashes it: the
    /// two-thread writer starts its second half at a part's end. Derived from the
    /// content, like `digest`.
    pub(super) part_json_ends: Vec<usize>,
    pub(super) json_len: usize,
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
        let mut keyed: Vec<((u8, u128), &str, (u32, u32))> = order
            .iter()
            .map(|k| {
                let id = &*frag(k).placement_fragment_id;
                (id_sort_key(id), id, *k)
            })
            .collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        for (slot, (_, _, k)) in order.iter_mut().zip(keyed) {
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
            part_json_ends: Vec::new(),
            json_len: 0,
        };
        placement.check_complete()?;
        // Both documents start with the same `{"parts":[...]` (the bulk): write it
        // once, hashed as it is written (`digest::hash_written`: in cache-sized
        // chunks, or on a second thread for a large placement), then fork the
        // hash state for the two different tails.
        let (mut head, part_json_ends, head_len) = placement.hash_parts();
        placement.part_json_ends = part_json_ends;
        let mut tail = String::new();
        placement.write_tail(&mut tail, None);
        let mut h = head.clone();
        h.update(tail.as_bytes());
        placement.placement_id = format!("sha256:{}", super::hex_of(h));
        if let Some(given) = spec.placement_id {
            // The `fuzzing` feature (fuzz builds only) lets mismatched ids through.
            if given != placement.placement_id && !cfg!(feature = "fuzzing") {
                return invalid("placement_id does not match canonical logical content");
            }
        }
        tail.clear();
        placement.write_tail(&mut tail, Some(&placement.placement_id));
        head.update(tail.as_bytes());
        placement.json_len = head_len + tail.len();
        placement.digest = super::hex_of(head);
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
        // Referenced tensor ids (fragments of one tensor usually come together).
        let mut referenced: HashSet<&str> = crate::fxhash::set_with_capacity(by_id.len());
        let mut last: Option<&str> = None;
        for f in &spec.fragments {
            if last != Some(f.tensor_id()) {
                referenced.insert(f.tensor_id());
                last = Some(f.tensor_id());
            }
        }
        let mut unknown: Vec<&str> = referenced.iter().copied().filter(|id| !by_id.contains_key(id)).collect();
        unknown.sort_unstable();
        if let Some(unknown) = unknown.first() {
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
            let mut ids: Vec<&str> = Vec::new();
            for f in &fragments {
                if ids.last() != Some(&f.tensor_id()) {
                    ids.push(f.tensor_id());
                }
            }
            ids.sort_unstable();
            ids.dedup();
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
    /// (part index, fragment index) of every fragment, sorted by placement
    /// fragment id.
    pub(crate) fn fragment_order(&self) -> &[(u32, u32)] {
        &self.order
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
}

#[cfg(test)]
mod tests {
    use super::id_sort_key;

    #[test]
    fn id_sort_key_agrees_with_byte_order() {
        let ids = [
            "",
            "a",
            "ab",
            "ab\u{0}",
            "abc",
            "r",
            "sha256",
            "sha256:",
            "sha256:0",
            "sha256:00",
            "sha256:0000000000000000",
            "sha256:00000000000000001",
            "sha256:00000000000000002",
            "sha256:ff",
            "sha256;",
            "sha257",
            "t",
            "zzzz",
            "sha256:\u{0}",
            "s",
            "sh",
            "sha256:abcdefabcdefabcdefab",
            "sha256:abcdefabcdefabcdefaa",
        ];
        for a in ids {
            for b in ids {
                let (ka, kb) = (id_sort_key(a), id_sort_key(b));
                if ka != kb {
                    assert_eq!(ka.cmp(&kb), a.cmp(b), "{a:?} vs {b:?}");
                }
            }
        }
    }
}
