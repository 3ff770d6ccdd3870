//! The placement's canonical JSON (`wire-format.md` §2–§3): encoding, strict decoding.

use super::fragment::{PlacementFragment, PlacementFragmentSpec};
use super::part::{PlacementPart, PlacementPartSpec};
use super::semantics::{check_tensor_semantics, AxisSignature, ParticipantIndex};
use super::topology::ParallelTopology;
use super::{Placement, PlacementSpec};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::geometry::SharedBox;
use crate::json::{self, Obj, Profile, Value};
use crate::model::axes::ParallelRank;
use crate::model::tensor::{read_tensors, TensorDescriptor};
use crate::model::typed::{
    self, Any, Each, Exact, Fast, Held, In, IntArray, Interner, Keys, Mode, NameArray, OptUInt, RankObject, Str, Typed,
    UInt,
};
use serde::de::{self, MapAccess};
use sha2::{Digest, Sha256};
use std::sync::Arc;

impl Placement {
    /// The canonical placement JSON (profile A, `wire-format.md` §2). A large
    /// placement of several parts is written by two threads, each straight into
    /// its half of one buffer of the exact size; the bytes are those of the
    /// one-thread writer. No errors; thread safety: `&self` only.
    pub fn to_json(&self) -> String {
        let parts = self.parts.len();
        if crate::par::workers(self.order.len()) >= 2 && parts >= 2 && self.part_json_ends.len() == parts {
            // The cut nearest the middle byte, with a part on either side.
            let half = self.json_len / 2;
            let cut = self.part_json_ends[..parts - 1].partition_point(|&end| end <= half).clamp(1, parts - 1);
            if let Some(out) = self.to_json_cut(cut) {
                return out;
            }
        }
        let mut out = String::with_capacity(256 + self.order.len() * 320);
        crate::mem::advise_huge_pages(&mut out);
        self.write_json(&mut out, Some(&self.placement_id));
        out
    }

    /// [`Self::to_json`] on two threads, the second half starting with part `cut`
    /// (`0 < cut < parts`). `None` if the lengths construction learned
    /// (`part_json_ends`, `json_len`) do not hold.
    fn to_json_cut(&self, cut: usize) -> Option<String> {
        struct Halves<'a> {
            placement: &'a Placement,
            cut: usize,
        }
        impl json::TwoHalves for Halves<'_> {
            fn first<W: json::JsonOut>(&self, out: &mut W) {
                out.push_str("{\"parts\":[");
                self.placement.write_part_range(out, 0..self.cut, &mut |_: &mut W| {});
            }
            fn second<W: json::JsonOut>(&self, out: &mut W) {
                let p = self.placement;
                p.write_part_range(out, self.cut..p.parts.len(), &mut |_: &mut W| {});
                out.push(']');
                p.write_tail(out, Some(&p.placement_id));
            }
        }
        let first = *self.part_json_ends.get(cut.checked_sub(1)?)?;
        json::write_halves(&Halves { placement: self, cut }, first, self.json_len)
    }

    /// Recomputes the placement digest: the hex SHA-256 of [`Self::to_json`]'s
    /// bytes (what construction stores in [`Self::digest`]), without building the
    /// document. A large placement is hashed on a second thread while this one
    /// serializes (same bytes, same digest). No errors; thread safety: `&self` only.
    pub fn compute_digest(&self) -> String {
        let (mut h, _, _) = self.hash_parts();
        let mut tail = String::new();
        self.write_tail(&mut tail, Some(&self.placement_id));
        h.update(tail.as_bytes());
        crate::model::hex_of(h)
    }

    /// A hasher fed with `{"parts":[...]` (the bulk both the placement JSON and the
    /// `placement_id` input start with), where each part's JSON ends in it, and
    /// its length.
    pub(super) fn hash_parts(&self) -> (Sha256, Vec<usize>, usize) {
        let expected = 256 + self.order.len() * 320;
        let mut ends = Vec::with_capacity(self.parts.len());
        let mut len = 0;
        let h = crate::model::digest::hash_written(Sha256::new(), expected, |out, flush| {
            let written = crate::model::digest::Position::default();
            out.push_str("{\"parts\":[");
            for i in 0..self.parts.len() {
                self.write_part_range(out, i..i + 1, &mut |c: &mut String| written.flush(flush, c));
                ends.push(written.at(out));
            }
            out.push(']');
            len = written.at(out);
        });
        (h, ends, len)
    }

    /// With `id`: the placement JSON; without: the `placement_id` input (§3.3).
    pub(super) fn write_json(&self, out: &mut String, id: Option<&str>) {
        out.push_str("{\"parts\":[");
        self.write_part_range(out, 0..self.parts.len(), &mut |_: &mut String| {});
        out.push(']');
        self.write_tail(out, id);
    }

    /// The parts `range` of the `parts` array, each after a comma unless it is the
    /// first part; `flush` after each fragment, so that a chunked writer can
    /// consume (hash, clear) what has been written so far.
    fn write_part_range<W: json::JsonOut, F: FnMut(&mut W)>(
        &self,
        out: &mut W,
        range: std::ops::Range<usize>,
        flush: &mut F,
    ) {
        for i in range {
            let part = &self.parts[i];
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"fragments\":[");
            for (j, f) in part.fragments.iter().enumerate() {
                if let Some(next) = part.fragments.get(j + crate::model::PREFETCH_AHEAD) {
                    next.prefetch_heap();
                }
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
    }

    /// Everything after the parts (with `id`: placement JSON; without: the
    /// `placement_id` input).
    pub(super) fn write_tail<W: json::JsonOut>(&self, out: &mut W, id: Option<&str>) {
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
        Self::from_json_str(json::text_of(bytes, LABEL)?)
    }

    /// Same as [`Placement::from_json`] for text input (a leading BOM is an error).
    pub fn from_json_str(text: &str) -> Result<Self> {
        // The fast reading first; what it declines is read again exactly, for the
        // contract's error (see `model::typed`).
        if let Some(p) = typed::parse_fast(text, In(Fast, DocSeed(Fast))).and_then(|doc| finish_doc::<Fast>(doc).ok()) {
            return Ok(p);
        }
        finish_doc::<Exact>(json::parse_text_with(text, LABEL, Any(DocSeed(Exact)))?)
    }

    /// Decodes an already parsed JSON value (see [`Placement::from_json`]): the
    /// same decoder (read exactly), reading the tree instead of text.
    pub fn from_json_value(v: &Value) -> Result<Self> {
        finish_doc::<Exact>(json::decode_value(v, Any(DocSeed(Exact)))?)
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
        // Fragments by tensor index: fragment tensor ids are interned (the parts'
        // descriptors' ids), so the pointer finds the tensor; a part whose
        // descriptor is another (equal) Arc falls back to the string.
        let by_ptr: HashMap<u64, u32> =
            self.tensors.iter().enumerate().map(|(i, t)| (crate::model::id_key(t.tensor_id_arc()), i as u32)).collect();
        let index_of = |f: &PlacementFragment| -> Option<usize> {
            match by_ptr.get(&crate::model::id_key(f.tensor_id_arc())) {
                Some(&i) => Some(i as usize),
                None => self.tensors.binary_search_by(|t| t.tensor_id().cmp(f.tensor_id())).ok(),
            }
        };
        let mut counts = vec![0u32; self.tensors.len() + 1];
        let mut slot_of: Vec<u32> = Vec::with_capacity(self.order.len());
        for f in self.fragments() {
            // Every part's tensors are in the catalog, so this always finds one.
            let i = index_of(f).ok_or_else(|| Error::invalid(format!("unknown tensor_id: {}", f.tensor_id())))?;
            counts[i + 1] += 1;
            slot_of.push(i as u32);
        }
        for i in 1..counts.len() {
            counts[i] += counts[i - 1];
        }
        let starts = counts.clone();
        let mut grouped: Vec<&PlacementFragment> = Vec::with_capacity(self.order.len());
        // Counting sort: each fragment goes to its tensor's next free slot.
        let mut next = counts;
        let placeholder = self.fragments().next().expect("non-empty");
        grouped.resize(self.order.len(), placeholder);
        for (f, &i) in self.fragments().zip(&slot_of) {
            grouped[next[i as usize] as usize] = f;
            next[i as usize] += 1;
        }
        drop(slot_of);
        // One participant index per axis signature (few), then the tensors, checked
        // in parallel when there are many fragments; the error reported is the
        // first tensor's in order, as a sequential pass would report.
        let mut indexes: HashMap<[u8; 4], ParticipantIndex> = HashMap::default();
        for t in self.tensors.iter() {
            let sig = AxisSignature::of(t);
            indexes.entry(sig.code).or_insert_with(|| ParticipantIndex::build(&self.topology, &sig));
        }
        let check = |ti: usize| -> Result<()> {
            let t = &self.tensors[ti];
            let frags = &grouped[starts[ti] as usize..starts[ti + 1] as usize];
            if frags.is_empty() {
                return invalid(format!("global placement tensor is not fully covered: {}", t.tensor_id()));
            }
            let sig = AxisSignature::of(t);
            check_tensor_semantics(&self.topology, t, &sig, &indexes[&sig.code], frags)
        };
        crate::par::try_map(self.tensors.len(), crate::par::workers(grouped.len()), check)?;
        Ok(())
    }
}

/// Decodes placement fragment `i` (of an upload operation) from a parsed value.
pub(crate) fn decode_fragment(item: &Value, i: usize) -> Result<PlacementFragment> {
    // (One fragment: its tensor id is not shared.)
    if let Ok(f) = typed::decode_fast(item, In(Fast, FragmentSeed { index: i, interner: None, mode: Fast })) {
        return Ok(f);
    }
    json::decode_value(item, Any(FragmentSeed { index: i, interner: None, mode: Exact }))?
}

/// Everything of a placement document but its parts, decoded and checked in the
/// order of `wire-format.md` §2.1.
struct Header {
    resource_id: String,
    revision: String,
    placement_set_id: String,
    placement_id: String,
    weight_generation: u64,
    topology: ParallelTopology,
    tensors: Vec<Arc<TensorDescriptor>>,
}

/// One decoded part, before it is validated.
struct RawPart {
    participant_id: String,
    rank: ParallelRank,
    fragments: Vec<PlacementFragment>,
}

impl Header {
    /// `tensors`: the `tensors` member as [`DocSeed`] decoded it.
    fn decode(v: &Value, tensors: Option<Result<Vec<Arc<TensorDescriptor>>>>) -> Result<Self> {
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
        // The key set holds `tensors`.
        let tensors =
            tensors.ok_or_else(|| Error::invalid("placement manifest schema fields do not match contract"))??;
        Ok(Header { resource_id, revision, placement_set_id, placement_id, weight_generation, topology, tensors })
    }

    /// Checks the tensor references of `raw_parts`, builds the parts and the
    /// placement (its id must be the canonical one).
    fn finish(self, raw_parts: Vec<RawPart>) -> Result<Placement> {
        let Header { resource_id, revision, placement_set_id, placement_id, weight_generation, topology, tensors } =
            self;
        let mut index: HashMap<&str, usize> = crate::fxhash::map_with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(t.tensor_id(), i).is_some() {
                return invalid("duplicate tensor_id in placement JSON");
            }
        }
        let mut referenced = vec![false; tensors.len()];
        let mut unknown: Vec<&str> = Vec::new();
        let mut part_tensors: Vec<Vec<usize>> = Vec::with_capacity(raw_parts.len());
        for part in &raw_parts {
            let mut ts: Vec<usize> = Vec::new();
            let mut last: Option<&str> = None;
            for f in &part.fragments {
                if last == Some(f.tensor_id()) {
                    continue;
                }
                last = Some(f.tensor_id());
                match index.get(f.tensor_id()) {
                    Some(&t) => {
                        referenced[t] = true;
                        ts.push(t);
                    }
                    None => unknown.push(f.tensor_id()),
                }
            }
            ts.sort_unstable();
            ts.dedup();
            part_tensors.push(ts);
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
        drop(index);
        let mut parts = Vec::with_capacity(raw_parts.len());
        for (raw, ts) in raw_parts.into_iter().zip(part_tensors) {
            parts.push(PlacementPart::new(PlacementPartSpec {
                resource_id: resource_id.clone(),
                revision: revision.clone(),
                placement_set_id: placement_set_id.clone(),
                topology_id: topology.topology_id().to_string(),
                participant_id: raw.participant_id,
                weight_generation,
                rank: raw.rank,
                tensors: ts.iter().map(|&t| tensors[t].clone()).collect(),
                fragments: raw.fragments,
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
}

// ---------------------------------------------------------------------------
// The one decoder (see `model::typed`), generic over its reading mode: the
// document and each part keep their small members as values and stream their
// large array; each fragment is read into typed slots. Every object is checked,
// in the contract's order, once it has been read.
// ---------------------------------------------------------------------------

const LABEL: &str = "placement manifest";

/// The document read in mode `M`, with its decoded tensors and parts (or their
/// first error; `None` without the member) apart.
type Doc<'de, M> =
    (Value<'de>, Option<<M as Mode>::Out<Vec<Arc<TensorDescriptor>>>>, Option<<M as Mode>::Out<Vec<RawPart>>>);

/// Checks a read document in the contract's order: the header
/// ([`Header::decode`]), the parts, then the placement as a whole.
fn finish_doc<M: Mode>((doc, tensors, parts): Doc<'_, M>) -> Result<Placement> {
    let header = Header::decode(&doc, tensors.map(M::result))?;
    // The header's key set holds `parts`.
    let parts = parts.ok_or_else(|| Error::invalid("placement manifest schema fields do not match contract"))?;
    header.finish(M::result(parts)?)
}

/// The placement document, read in mode `M`.
struct DocSeed<M>(M);

impl<'de, M: Mode> Typed<'de> for DocSeed<M> {
    type Out = Doc<'de, M>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.0;
        let interner: Interner<'de> = Interner::default();
        // The document's number of the next part's first fragment.
        let next_fragment = std::cell::Cell::new(0);
        let (mut tensors, mut parts) = (None, None);
        let members = json::members_with(&mut m, Vec::new(), |k, m| {
            if k == "tensors" {
                tensors = Some(read_tensors(mode, m, false)?);
                return Ok(true);
            }
            if k != "parts" {
                return Ok(false);
            }
            let (next_fragment, interner) = (&next_fragment, &interner);
            let each = Each(
                mode,
                |index| In(mode, PartSeed { index, first_fragment: next_fragment, interner, mode }),
                || Error::invalid("placement parts must be a sequence"),
            );
            parts = Some(mode.value(m, each)?);
            Ok(true)
        })?;
        Ok((Value::Object(members), tensors, parts))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> std::result::Result<Self::Out, E> {
        Ok((v, None, None))
    }
}

/// Part `index`, whose first fragment is fragment `first_fragment` of the
/// document (it advances the count past its own).
struct PartSeed<'a, 'de, M> {
    index: usize,
    first_fragment: &'a std::cell::Cell<usize>,
    interner: &'a Interner<'de>,
    mode: M,
}

impl<'de, M: Mode> Typed<'de> for PartSeed<'_, 'de, M> {
    type Out = M::Out<RawPart>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let (i, interner, mode) = (self.index, self.interner, self.mode);
        let first = self.first_fragment.get();
        let mut fragments: Option<Result<Vec<PlacementFragment>>> = None;
        let members = json::members_with(&mut m, Vec::new(), |k, m| {
            if k != "fragments" {
                return Ok(false);
            }
            let each = Each(
                mode,
                |j| In(mode, FragmentSeed { index: first + j, interner: Some(interner), mode }),
                || Error::invalid("placement part fragments must be a sequence"),
            );
            fragments = Some(M::result(mode.value(m, each)?));
            Ok(true)
        })?;
        // (After an error the count no longer matters: the first error wins.)
        let count = fragments.as_ref().map_or(0, |f| f.as_ref().map_or(0, Vec::len));
        self.first_fragment.set(first + count);
        let v = Value::Object(members);
        let checked = (|| {
            let schema = || format!("placement part {i} schema fields do not match contract");
            let po = Obj::new(&v, schema)?;
            po.expect_keys(&["participant_id", "rank", "fragments"], schema)?;
            let participant_id = json::req_str(po.get("participant_id"), "participant_id")?;
            let rank = ParallelRank::from_json(po.get("rank"), &|| {
                format!("placement part rank {i} schema fields do not match contract")
            })?;
            let fragments = fragments.expect("the key set holds fragments")?;
            Ok(RawPart { participant_id, rank, fragments })
        })();
        M::checked(checked)
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> std::result::Result<Self::Out, E> {
        M::checked(invalid(format!("placement part {} schema fields do not match contract", self.index)))
    }
}

/// Fragment `index` of the document (its number in messages), its tensor id shared
/// through `interner` when there is one.
struct FragmentSeed<'a, 'de, M> {
    index: usize,
    interner: Option<&'a Interner<'de>>,
    mode: M,
}

/// A fragment's key slots (`pipeline_stage_id`, slot 7, is optional).
fn fragment_slot(k: &str) -> Option<u32> {
    Some(match k {
        "placement_fragment_id" => 0,
        "tensor_id" => 1,
        "global_offset" => 2,
        "local_shape" => 3,
        "nbytes" => 4,
        "rank" => 5,
        "aliases" => 6,
        "pipeline_stage_id" => 7,
        _ => return None,
    })
}

impl<'de, M: Mode> Typed<'de> for FragmentSeed<'_, 'de, M> {
    type Out = M::Out<PlacementFragment>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.mode;
        let mut keys = Keys::default();
        let (mut id, mut tensor_id, mut nbytes, mut stage) =
            (Held::default(), Held::default(), Held::default(), Held::default());
        let (mut offset, mut shape, mut rank, mut aliases) =
            (Held::default(), Held::default(), Held::default(), Held::default());
        while let Some(k) = keys.next(mode, &mut m, fragment_slot)? {
            match k {
                0 => id = mode.value(&mut m, Str)?,
                1 => tensor_id = mode.value(&mut m, Str)?,
                2 => offset = mode.value(&mut m, IntArray)?,
                3 => shape = mode.value(&mut m, IntArray)?,
                4 => nbytes = mode.value(&mut m, UInt)?,
                5 => rank = mode.value(&mut m, RankObject)?,
                6 => aliases = mode.value(&mut m, NameArray)?,
                _ => stage = mode.value(&mut m, OptUInt)?,
            }
        }
        let i = self.index;
        let checked = (|| {
            if !keys.are(0x7f) && !keys.are(0xff) {
                return invalid(format!("placement fragment {i} has an invalid schema"));
            }
            let aliases = aliases.names("aliases must be a sequence", "alias must be a non-empty string")?;
            let tensor_id = tensor_id.req_str("tensor_id")?;
            let tensor_id = match self.interner {
                Some(interner) => typed::intern(interner, tensor_id),
                None => Arc::from(&*tensor_id),
            };
            let offset = offset.ints("global_offset", 0)?;
            let shape = shape.ints("local_shape", 1)?;
            let spec = PlacementFragmentSpec {
                nbytes: nbytes.req_int("nbytes", 1)?,
                rank: rank.rank(&|| format!("placement rank {i} schema fields do not match contract"))?,
                pipeline_stage_id: stage.opt_int("pipeline_stage_id", 0)?,
                aliases,
                placement_fragment_id: Some(id.req_str("placement_fragment_id")?.into_owned()),
                ..PlacementFragmentSpec::default()
            };
            let geometry = SharedBox::new(&offset, &shape);
            PlacementFragment::with_geometry(spec, tensor_id, geometry)
        })();
        M::checked(checked)
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> std::result::Result<Self::Out, E> {
        M::checked(invalid(format!("placement fragment {} must be a JSON object", self.index)))
    }
}

#[cfg(test)]
mod tests {
    use super::Placement;

    /// Text and its parsed tree go through the same decoder: the same placement.
    #[test]
    fn text_and_value_decode_alike() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/conformance/004-placement-ep2-tp2-experts.json");
        let fixture: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let text = serde_json::to_string(&fixture["inputs"]["placement"]).unwrap();
        let p = Placement::from_json_str(&text).unwrap();
        let v = crate::json::parse_text(&text, "t").unwrap();
        assert_eq!(Placement::from_json_value(&v).unwrap(), p);
        assert_eq!(Placement::from_json_str(&p.to_json()).unwrap(), p);
    }

    /// The two modes of the one decoder agree: every placement among the
    /// conformance fixtures (and its re-serialization) that the fast reading
    /// accepts decodes to what the exact reading makes of it, every valid one is
    /// read fast, and a repeated or an unknown key declines.
    #[test]
    fn fast_and_exact_readings_agree() {
        use super::{finish_doc, json, typed, Any, DocSeed, Exact, Fast, In, LABEL};
        let fast = |text: &str| typed::parse_fast(text, In(Fast, DocSeed(Fast))).map(finish_doc::<Fast>);
        let exact = |text: &str| json::parse_text_with(text, LABEL, Any(DocSeed(Exact))).and_then(finish_doc::<Exact>);
        let mut valid = 0;
        for (name, fixture) in crate::testutil::conformance_fixtures("") {
            for key in ["placement", "target_placement"] {
                let Some(doc) = fixture["inputs"].get(key) else { continue };
                let text = serde_json::to_string(doc).unwrap();
                let want = exact(&text);
                match fast(&text) {
                    Some(Ok(p)) => assert_eq!(Ok(&p), want.as_ref(), "{name}"),
                    _ => assert!(want.is_err(), "{name}: a valid placement declined"),
                }
                if let Ok(p) = want {
                    valid += 1;
                    let again = p.to_json();
                    assert_eq!(fast(&again).map(|r| r.unwrap()), Some(p), "{name}");
                    for edit in [
                        again.replacen("\"nbytes\":", "\"nbytes\":1,\"nbytes\":", 1),
                        again.replacen('{', "{\"x\":0,", 1),
                    ] {
                        assert!(!matches!(fast(&edit), Some(Ok(_))), "{name}");
                    }
                }
            }
        }
        assert!(valid >= 10, "only {valid} valid placements");
    }

    /// The two-thread writer gives the one-thread writer's bytes for every cut
    /// between parts, on every valid placement among the conformance fixtures
    /// (Unicode and slashes in ids included); `to_json` takes it when two workers
    /// are allowed; part ends that do not hold are refused, never overrun, and
    /// `to_json` then writes on one thread.
    #[test]
    fn two_thread_placement_json_is_the_one_thread_bytes_at_every_cut() {
        let mut checked = 0;
        for (_, fixture) in crate::testutil::conformance_fixtures("") {
            let Some(doc) = fixture["inputs"].get("placement") else { continue };
            let Ok(p) = Placement::from_json(serde_json::to_string(doc).unwrap().as_bytes()) else { continue };
            let mut one = String::new();
            p.write_json(&mut one, Some(&p.placement_id));
            assert_eq!((p.part_json_ends.len(), p.json_len), (p.parts.len(), one.len()));
            for (i, &end) in p.part_json_ends.iter().enumerate() {
                let next = if i + 1 < p.parts.len() { ",{\"fragments\":[" } else { "],\"placement_id\":" };
                assert!(one[..end].ends_with('}') && one[end..].starts_with(next), "part {i} ends at {end}");
            }
            for cut in 1..p.parts.len() {
                assert_eq!(p.to_json_cut(cut).as_deref(), Some(one.as_str()), "cut {cut}");
                checked += 1;
            }
            assert_eq!(crate::par::with_workers(Some(2), || p.to_json()), one);
            assert_eq!(crate::par::with_workers(Some(1), || p.to_json()), one);
            if p.parts.len() >= 2 {
                for delta in [-1i64, 1] {
                    let mut q = p.clone();
                    q.part_json_ends[0] = (q.part_json_ends[0] as i64 + delta) as usize;
                    assert_eq!(q.to_json_cut(1), None, "first half {delta:+} bytes");
                    q.part_json_ends[0] = p.part_json_ends[0];
                    q.json_len = (q.json_len as i64 + delta) as usize;
                    assert_eq!(q.to_json_cut(1), None, "whole {delta:+} bytes");
                    assert_eq!(crate::par::with_workers(Some(2), || q.to_json()), one);
                }
            }
        }
        assert!(checked >= 20, "only {checked} cuts checked");
    }
}
