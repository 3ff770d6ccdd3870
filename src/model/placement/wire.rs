//! The placement's canonical JSON (`wire-format.md` §2–§3): encoding, strict decoding.

use super::fragment::{PlacementFragment, PlacementFragmentSpec};
use super::part::{PlacementPart, PlacementPartSpec};
use super::semantics::{check_tensor_semantics, AxisSignature, ParticipantIndex};
use super::topology::ParallelTopology;
use super::{Placement, PlacementSpec};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::json::{self, Obj, Profile, Value};
use crate::model::axes::ParallelRank;
use crate::model::tensor::TensorDescriptor;
use std::sync::Arc;

impl Placement {
    /// The canonical placement JSON (profile A, `wire-format.md` §2).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(256 + self.order.len() * 320);
        self.write_json(&mut out, Some(&self.placement_id));
        out
    }

    /// With `id`: the placement JSON; without: the `placement_id` input (§3.3).
    pub(super) fn write_json(&self, out: &mut String, id: Option<&str>) {
        self.write_parts(out);
        self.write_tail(out, id);
    }

    /// `{"parts":[...]` — the part of both documents that holds the fragments.
    pub(super) fn write_parts(&self, out: &mut String) {
        self.write_parts_with(out, &mut |_: &mut String| {})
    }

    /// [`Self::write_parts`], calling `flush` after each fragment so that a caller
    /// can consume (hash, clear) what has been written so far.
    pub(super) fn write_parts_with<F: FnMut(&mut String)>(&self, out: &mut String, flush: &mut F) {
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
                flush(out);
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
    pub(super) fn write_tail(&self, out: &mut String, id: Option<&str>) {
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

    pub(super) fn check_complete(&self) -> Result<()> {
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
