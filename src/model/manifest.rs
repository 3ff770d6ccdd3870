//! `StoredFragmentSnapshot` and `StoredWeightManifest` (`data-model.md` §14–§15,
//! `wire-format.md` §4).

use super::placement::{check_fragment_geometry, normalize_aliases};
use super::tensor::{read_tensors, TensorDescriptor};
use super::{hex_of, is_hex64, non_empty};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::{self, BoxRef, SharedBox};
use crate::json::{self, Obj, Profile, Value};
use crate::model::typed::{
    self, Any, Each, Exact, Fast, Held, In, IntArray, Interner, Keys, Mode, NameArray, Str, Typed, UInt,
};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Construction input of a [`StoredFragment`].
#[derive(Clone, Debug, Default)]
pub struct StoredFragmentSpec {
    /// Stored fragment id (the planner derives a 24-hex id).
    pub fragment_id: String,
    /// Tensor id.
    pub tensor_id: String,
    /// Box offset.
    pub global_offset: Vec<u64>,
    /// Box extents (each >= 1).
    pub local_shape: Vec<u64>,
    /// Store object holding the payload.
    pub object_key: String,
    /// Byte offset inside the object.
    pub object_offset: u64,
    /// Payload size (>= 1).
    pub nbytes: u64,
    /// Alias group (normalized like placement fragments).
    pub aliases: Vec<String>,
}

/// One box of one tensor persisted in a store object. Its payload is the box in
/// row-major order (a canonical contiguous view).
///
/// Immutable and shared: a clone is a reference count (an upload plan's
/// operations and its manifest hold the same fragments). Equality, hashing and
/// ordering are by value. `Send + Sync`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoredFragment(Arc<StoredFragmentData>);

/// The fields of a [`StoredFragment`] (an implementation detail: not exported,
/// no public fields; read them through the fragment's accessors).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct StoredFragmentData {
    fragment_id: String,
    /// Interned where the producer can (the planner and the decoder share one
    /// allocation per tensor).
    tensor_id: Arc<str>,
    /// Offset and shape; the planner shares its source placement fragment's.
    geometry: SharedBox,
    object_key: String,
    object_offset: u64,
    nbytes: u64,
    aliases: Vec<String>,
}

impl std::ops::Deref for StoredFragment {
    type Target = StoredFragmentData;
    fn deref(&self) -> &StoredFragmentData {
        &self.0
    }
}

impl StoredFragment {
    /// Validates `spec` (`data-model.md` §14).
    pub fn new(mut spec: StoredFragmentSpec) -> Result<Self> {
        let tensor_id = Arc::from(std::mem::take(&mut spec.tensor_id));
        Self::with_tensor_id(spec, tensor_id)
    }

    /// [`Self::new`] with the tensor id given as a shared string (`spec.tensor_id`
    /// is ignored).
    pub(crate) fn with_tensor_id(spec: StoredFragmentSpec, tensor_id: Arc<str>) -> Result<Self> {
        let geometry = SharedBox::new(&spec.global_offset, &spec.local_shape);
        Self::with_geometry(spec, tensor_id, geometry)
    }

    /// [`Self::with_tensor_id`] with the offset and shape given as one shared box
    /// (`spec.global_offset` and `spec.local_shape` are ignored).
    pub(crate) fn with_geometry(spec: StoredFragmentSpec, tensor_id: Arc<str>, geometry: SharedBox) -> Result<Self> {
        if geometry.shape().iter().any(|&x| x < 1) {
            return invalid("local_shape must be at least 1");
        }
        non_empty(&spec.fragment_id, "fragment_id")?;
        non_empty(&tensor_id, "tensor_id")?;
        non_empty(&spec.object_key, "object_key")?;
        if spec.nbytes < 1 {
            return invalid("nbytes must be at least 1");
        }
        // Narrowing (the reference has no bound): the byte range of the payload
        // must be addressable, so no later offset arithmetic can overflow.
        if spec.object_offset.checked_add(spec.nbytes).is_none() {
            return invalid("object_offset plus nbytes must fit in an unsigned 64-bit integer");
        }
        let aliases = normalize_aliases(spec.aliases, &tensor_id)?;
        Ok(StoredFragment(Arc::new(StoredFragmentData {
            fragment_id: spec.fragment_id,
            tensor_id,
            geometry,
            object_key: spec.object_key,
            object_offset: spec.object_offset,
            nbytes: spec.nbytes,
            aliases,
        })))
    }

    /// Stored fragment id.
    pub fn fragment_id(&self) -> &str {
        &self.fragment_id
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
    /// Object key.
    pub fn object_key(&self) -> &str {
        &self.object_key
    }
    /// Byte offset inside the object.
    pub fn object_offset(&self) -> u64 {
        self.object_offset
    }
    /// Payload size.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// Sorted alias group.
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }
    /// Box view.
    pub fn as_box(&self) -> BoxRef<'_> {
        self.geometry.as_box()
    }

    /// Prefetches what `write_json` reads behind pointers.
    #[inline]
    fn prefetch_heap(&self) {
        super::prefetch(self.fragment_id.as_ptr());
        super::prefetch(self.geometry.as_ptr());
        super::prefetch(self.object_key.as_ptr());
    }

    fn write_json<W: json::JsonOut>(&self, out: &mut W) {
        out.push_str("{\"aliases\":");
        json::write_str_array(out, &self.aliases, Profile::Utf8);
        out.push_str(",\"fragment_id\":");
        json::write_str(out, &self.fragment_id, Profile::Utf8);
        let geometry = self.geometry.as_box();
        out.push_str(",\"global_offset\":");
        json::write_u64_array(out, geometry.offset);
        out.push_str(",\"local_shape\":");
        json::write_u64_array(out, geometry.shape);
        out.push_str(",\"nbytes\":");
        json::write_u64(out, self.nbytes);
        out.push_str(",\"object_key\":");
        json::write_str(out, &self.object_key, Profile::Utf8);
        out.push_str(",\"object_offset\":");
        json::write_u64(out, self.object_offset);
        out.push_str(",\"tensor_id\":");
        json::write_str(out, &self.tensor_id, Profile::Utf8);
        out.push('}');
    }
}

/// Construction input of a [`StoredManifest`].
#[derive(Clone, Debug, Default)]
pub struct StoredManifestSpec {
    /// Raw (not percent-encoded) namespace.
    pub namespace: String,
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Group id (base key).
    pub group_id: String,
    /// Must equal `group_id + "/manifest"`.
    pub manifest_key: String,
    /// Tensors, order preserved.
    pub tensors: Vec<Arc<TensorDescriptor>>,
    /// Fragments, order preserved.
    pub fragments: Vec<StoredFragment>,
    /// Opaque non-empty timestamp.
    pub created_at: String,
}

/// The persisted, address-free description of one committed weight generation
/// (`StoredWeightManifest`). Order of tensors and fragments is part of equality
/// and of the digest. Immutable, `Send + Sync`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredManifest {
    namespace: String,
    resource_id: String,
    revision: String,
    weight_generation: u64,
    group_id: String,
    manifest_key: String,
    tensors: Vec<Arc<TensorDescriptor>>,
    fragments: Vec<StoredFragment>,
    created_at: String,
    manifest_digest: String,
    /// Where the two-thread writer cuts [`StoredManifest::to_json`].
    json_cut: JsonCut,
}

/// Where [`StoredManifest::to_json`]'s two halves meet: fragment `index` starts
/// the second half at byte `at` of a `total`-byte document. Learned while
/// construction hashes (or compares) the document; derived from the content like
/// the digest, so equality ignores it. `index == 0`: unknown, write on one thread.
#[derive(Clone, Copy, Debug, Default)]
struct JsonCut {
    index: usize,
    at: usize,
    total: usize,
}

impl PartialEq for JsonCut {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for JsonCut {}

/// `(namespace, resource_id, revision, weight_generation, group_id, manifest_key,
/// content_sha256)`: pins one exact manifest.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoredManifestIdentity {
    /// Namespace.
    pub namespace: String,
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Group id.
    pub group_id: String,
    /// Manifest key.
    pub manifest_key: String,
    /// Manifest digest (hex64).
    pub content_sha256: String,
}

impl StoredManifestIdentity {
    /// Validates the identity: non-empty strings, hex64 digest
    /// (`content_sha256 must be a SHA-256 hex digest`).
    pub fn validate(&self) -> Result<()> {
        non_empty(&self.namespace, "namespace")?;
        non_empty(&self.resource_id, "resource_id")?;
        non_empty(&self.revision, "revision")?;
        non_empty(&self.group_id, "group_id")?;
        non_empty(&self.manifest_key, "manifest_key")?;
        if !is_hex64(&self.content_sha256) {
            return invalid("content_sha256 must be a SHA-256 hex digest");
        }
        Ok(())
    }
}

impl StoredManifest {
    /// Validates `spec` completely (`data-model.md` §15) and computes the digest.
    ///
    /// A manifest with no tensors and no fragments is accepted, as in the reference.
    pub fn new(spec: StoredManifestSpec) -> Result<Self> {
        Self::build(spec, false, None)
    }

    /// [`Self::new`] for the upload planner's own output, which holds by
    /// construction what the two most expensive checks prove: one fragment per
    /// geometry exactly covering each tensor (the planner picked one source per
    /// geometry of an owner whose boxes it checked to cover the tensor exactly),
    /// and one object per fragment at offset 0 (each key embeds the fragment's
    /// unique id). Everything else is checked as in `new`; debug builds (the
    /// tests) run the two checks too and panic should the planner break them.
    pub(crate) fn new_planned(spec: StoredManifestSpec) -> Result<Self> {
        Self::build(spec, true, None)
    }

    /// `decoded`: the text this manifest was decoded from and the hex SHA-256 of
    /// its bytes. When the manifest's canonical JSON is exactly that text, that
    /// is its digest (the same bytes hashed), and the document is only compared,
    /// not hashed again; otherwise the digest is computed as usual.
    fn build(spec: StoredManifestSpec, planned: bool, decoded: Option<(&str, String)>) -> Result<Self> {
        non_empty(&spec.namespace, "namespace")?;
        non_empty(&spec.resource_id, "resource_id")?;
        non_empty(&spec.revision, "revision")?;
        non_empty(&spec.group_id, "group_id")?;
        non_empty(&spec.manifest_key, "manifest_key")?;
        non_empty(&spec.created_at, "created_at")?;
        if spec.manifest_key.len() != spec.group_id.len() + 9
            || !spec.manifest_key.starts_with(&spec.group_id)
            || !spec.manifest_key.ends_with("/manifest")
        {
            return invalid("manifest_key does not belong to manifest group");
        }
        let mut m = StoredManifest {
            namespace: spec.namespace,
            resource_id: spec.resource_id,
            revision: spec.revision,
            weight_generation: spec.weight_generation,
            group_id: spec.group_id,
            manifest_key: spec.manifest_key,
            tensors: spec.tensors,
            fragments: spec.fragments,
            created_at: spec.created_at,
            manifest_digest: String::new(),
            json_cut: JsonCut::default(),
        };
        // The digest hashes the canonical JSON as it is written (no copy of the
        // whole document; a large one is hashed on a second thread). It does not
        // depend on the checks, so a large manifest that is not the planner's own
        // (a decoded one) is checked on one thread while the other computes it,
        // and then the object ranges (the last check, so the first error stays the
        // one a single thread would report).
        let side_by_side = !planned && crate::par::workers(m.fragments.len()) > 1;
        let (checked, (digest, ranges)) = crate::par::join(
            side_by_side,
            || m.check_contents(planned, !side_by_side),
            || {
                let cut = m.fragments.len() / 2;
                let digest = match decoded.and_then(|(text, digest)| Some((m.json_equals(text, cut)?, digest))) {
                    Some((json_cut, digest)) => (digest, json_cut),
                    None => m.digest_with_cut(cut),
                };
                (digest, if side_by_side { check_object_ranges(&m.fragments) } else { Ok(()) })
            },
        );
        checked?;
        ranges?;
        (m.manifest_digest, m.json_cut) = digest;
        Ok(m)
    }

    /// Whether [`Self::to_json`] would write exactly `text` (compared as it is
    /// written, without building the document): then where its halves meet when
    /// fragment `cut` starts the second.
    fn json_equals(&self, text: &str, cut: usize) -> Option<JsonCut> {
        let mut json_cut = JsonCut::default();
        let same = super::digest::written_equals(text.as_bytes(), |out, flush| {
            json_cut = self.write_json_cut(out, flush, cut);
        });
        same.then_some(json_cut)
    }

    /// [`Self::compute_digest`], and where the halves meet when fragment `cut`
    /// starts the second.
    fn digest_with_cut(&self, cut: usize) -> (String, JsonCut) {
        let expected = 512 + self.fragments.len() * 420;
        let mut json_cut = JsonCut::default();
        let h = super::digest::hash_written(Sha256::new(), expected, |out, flush| {
            json_cut = self.write_json_cut(out, flush, cut);
        });
        (hex_of(h), json_cut)
    }

    /// [`Self::write_json_with`] through a chunked writer's `flush`, noting where
    /// fragment `cut` (`0 < cut < fragments`, else nothing is noted) starts.
    fn write_json_cut(&self, out: &mut String, flush: &mut super::digest::Flush<'_>, cut: usize) -> JsonCut {
        let written = super::digest::Position::default();
        let (mut flushed, mut at) = (0usize, None);
        self.write_json_with(out, &mut |c: &mut String| {
            written.flush(flush, c);
            flushed += 1;
            if flushed == cut {
                at = Some(written.at(c));
            }
        });
        match at {
            Some(at) if cut < self.fragments.len() => JsonCut { index: cut, at, total: written.at(out) },
            _ => JsonCut::default(),
        }
    }

    /// The checks of [`Self::new`] over the tensors and fragments (key ownership,
    /// unique tensor and fragment ids, fragment geometry, aliases, exact coverage,
    /// object ranges, unless `ranges` is false: the caller checks those after
    /// the rest); `planned` skips, in release builds, what the planner's own
    /// construction proves (see [`Self::new_planned`]).
    fn check_contents(&self, planned: bool, ranges: bool) -> Result<()> {
        let payload_prefix = format!("{}/payload/", self.group_id);
        let foreign_key = || self.fragments.iter().any(|f| !f.object_key.starts_with(&payload_prefix));
        // The planner derives every key from the group (`KeyLayout::payload_key`).
        if planned {
            debug_assert!(!foreign_key());
        } else if foreign_key() {
            return invalid("payload object_key does not belong to manifest group");
        }
        let mut index: HashMap<&str, &TensorDescriptor> = crate::fxhash::map_with_capacity(self.tensors.len());
        for t in &self.tensors {
            if index.insert(t.tensor_id(), t).is_some() {
                return invalid(format!("duplicate tensor_id: {}", t.tensor_id()));
            }
        }
        // Fragment tensor ids are usually interned (the planner shares the
        // descriptor's id, the decoder one id per tensor): the pointer finds the
        // tensor, the string is the fallback.
        let by_ptr: HashMap<u64, u32> =
            self.tensors.iter().enumerate().map(|(i, t)| (crate::model::id_key(t.tensor_id_arc()), i as u32)).collect();
        let position: HashMap<&str, u32> =
            self.tensors.iter().enumerate().map(|(i, t)| (t.tensor_id(), i as u32)).collect();
        let mut slots: Vec<u32> = Vec::with_capacity(self.fragments.len());
        // Only when some id repeats does the loop track them (to name the first
        // repeat at its place among the other per-fragment errors).
        let frags = &self.fragments;
        // The planner's ids are the SHA-256 of distinct (tensor, offset, shape)
        // triples: unique by construction (debug builds check).
        let repeats = if planned {
            debug_assert!(!crate::fxhash::has_duplicate(frags.len(), |i| frags[i].fragment_id.as_str()));
            false
        } else {
            crate::fxhash::has_duplicate(frags.len(), |i| frags[i].fragment_id.as_str())
        };
        let mut ids: HashSet<&str> = crate::fxhash::set_with_capacity(if repeats { frags.len() } else { 0 });
        // The planner's fragments name the placement's own tensors and copy its
        // checked geometry: a release build skips this loop for them.
        let each_fragment: &[StoredFragment] = if planned && !cfg!(debug_assertions) { &[] } else { frags };
        for f in each_fragment {
            if repeats && !ids.insert(&f.fragment_id) {
                return invalid(format!("duplicate fragment_id: {}", f.fragment_id));
            }
            let slot = match by_ptr.get(&crate::model::id_key(&f.tensor_id)) {
                Some(&i) => i,
                None => *position
                    .get(f.tensor_id())
                    .ok_or_else(|| Error::invalid(format!("unknown tensor_id: {}", f.tensor_id)))?,
            };
            let t = &self.tensors[slot as usize];
            // The planner copies the geometry of placement fragments, which their
            // placement checked against the same tensor.
            if planned {
                debug_assert!(
                    check_fragment_geometry(t, &f.fragment_id, f.global_offset(), f.local_shape(), f.nbytes).is_ok()
                );
            } else {
                check_fragment_geometry(t, &f.fragment_id, f.global_offset(), f.local_shape(), f.nbytes)?;
            }
            slots.push(slot);
        }
        drop(ids);
        check_stored_aliases(&index, &self.fragments)?;
        if planned {
            debug_assert!(check_stored_coverage(&self.tensors, &self.fragments, &slots).is_ok());
            debug_assert!(check_object_ranges(&self.fragments).is_ok());
            debug_assert!(self.fragments.iter().all(|f| f.object_offset == 0));
        } else {
            check_stored_coverage(&self.tensors, &self.fragments, &slots)?;
            if ranges {
                check_object_ranges(&self.fragments)?;
            }
        }
        Ok(())
    }

    /// Recomputes the manifest digest: the hex SHA-256 of [`Self::to_json`]'s bytes
    /// (what construction stores in [`Self::manifest_digest`]), without building
    /// the document. A large manifest is hashed on a second thread while this one
    /// serializes (same bytes, same digest). No errors; thread safety: `&self` only.
    pub fn compute_digest(&self) -> String {
        let expected = 512 + self.fragments.len() * 420;
        hex_of(super::digest::hash_written(Sha256::new(), expected, |out, flush| {
            self.write_json_with(out, &mut |c: &mut String| flush(c))
        }))
    }

    /// The canonical manifest JSON (profile U, raw UTF-8). A large manifest is
    /// written by two threads, each straight into its half of one buffer of the
    /// exact size; the bytes are those of the one-thread writer. No errors;
    /// thread safety: `&self` only.
    pub fn to_json(&self) -> String {
        if crate::par::workers(self.fragments.len()) >= 2 {
            if let Some(out) = self.to_json_halves(self.json_cut) {
                return out;
            }
        }
        let mut out = String::with_capacity(512 + self.fragments.len() * 420);
        crate::mem::advise_huge_pages(&mut out);
        self.write_json_with(&mut out, &mut |_: &mut String| {});
        out
    }

    /// [`Self::to_json`] on two threads, cut at `cut`. `None` if `cut` is unknown
    /// or does not hold.
    fn to_json_halves(&self, cut: JsonCut) -> Option<String> {
        struct Halves<'a> {
            manifest: &'a StoredManifest,
            cut: usize,
        }
        impl json::TwoHalves for Halves<'_> {
            fn first<W: json::JsonOut>(&self, out: &mut W) {
                self.manifest.write_head(out);
                self.manifest.write_fragment_range(out, 0..self.cut, &mut |_: &mut W| {});
            }
            fn second<W: json::JsonOut>(&self, out: &mut W) {
                let m = self.manifest;
                m.write_fragment_range(out, self.cut..m.fragments.len(), &mut |_: &mut W| {});
                m.write_tail(out);
            }
        }
        if cut.index == 0 || cut.index >= self.fragments.len() {
            return None;
        }
        json::write_halves(&Halves { manifest: self, cut: cut.index }, cut.at, cut.total)
    }

    /// Appends the canonical JSON to `out` (no intermediate string).
    pub(crate) fn write_json(&self, out: &mut String) {
        self.write_json_with(out, &mut |_: &mut String| {});
    }

    /// Writes the canonical JSON, calling `flush` after each fragment so that a
    /// caller can consume (hash, clear) what has been written so far.
    fn write_json_with<F: FnMut(&mut String)>(&self, out: &mut String, flush: &mut F) {
        self.write_head(out);
        self.write_fragment_range(out, 0..self.fragments.len(), flush);
        self.write_tail(out);
    }

    /// `{"created_at":..,"fragments":[`
    fn write_head<W: json::JsonOut>(&self, out: &mut W) {
        out.push_str("{\"created_at\":");
        json::write_str(out, &self.created_at, Profile::Utf8);
        out.push_str(",\"fragments\":[");
    }

    /// The fragments `range`, each after a comma unless it is the first; `flush`
    /// after each fragment.
    fn write_fragment_range<W: json::JsonOut, F: FnMut(&mut W)>(
        &self,
        out: &mut W,
        range: std::ops::Range<usize>,
        flush: &mut F,
    ) {
        let ahead = super::PREFETCH_AHEAD;
        for i in range {
            // Two levels: the fragment's shared record, then (once it is near) its strings.
            if let Some(next) = self.fragments.get(i + 2 * ahead) {
                super::prefetch(Arc::as_ptr(&next.0));
            }
            if let Some(next) = self.fragments.get(i + ahead) {
                next.prefetch_heap();
            }
            if i > 0 {
                out.push(',');
            }
            self.fragments[i].write_json(out);
            flush(out);
        }
    }

    /// `],"group_id":..` to the end.
    fn write_tail<W: json::JsonOut>(&self, out: &mut W) {
        out.push_str("],\"group_id\":");
        json::write_str(out, &self.group_id, Profile::Utf8);
        out.push_str(",\"manifest_key\":");
        json::write_str(out, &self.manifest_key, Profile::Utf8);
        out.push_str(",\"namespace\":");
        json::write_str(out, &self.namespace, Profile::Utf8);
        out.push_str(",\"resource_id\":");
        json::write_str(out, &self.resource_id, Profile::Utf8);
        out.push_str(",\"resource_kind\":\"model_weight\",\"revision\":");
        json::write_str(out, &self.revision, Profile::Utf8);
        out.push_str(",\"tensors\":[");
        for (i, t) in self.tensors.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            t.write_json(out, Profile::Utf8);
        }
        out.push_str("],\"weight_generation\":");
        json::write_u64(out, self.weight_generation);
        out.push('}');
    }

    /// Decodes manifest JSON strictly (`wire-format.md` §4.1) from bytes (UTF-8, an
    /// optional leading BOM) and validates it completely. The digest is recomputed
    /// from the re-serialization.
    ///
    /// Errors: [`crate::ErrorKind::InvalidArgument`] naming the first violation
    /// (callers reading from a store re-map it to `InvalidManifest`).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        Self::from_json_str(json::text_of(bytes, LABEL)?)
    }

    /// Same as [`StoredManifest::from_json`] for text (a leading BOM is an error).
    ///
    /// A large document (from 8 MiB: `digest::PIPELINE_MIN_BYTES`) is hashed on
    /// a second thread while this one reads it: a canonical document (what every
    /// writer of manifests produces) then needs no second hash of its
    /// re-serialization, only a comparison (see `StoredManifest::build`).
    pub fn from_json_str(text: &str) -> Result<Self> {
        // (Unit tests that force several workers take this path at any size.)
        let hash_beside = (text.len() >= super::digest::PIPELINE_MIN_BYTES || cfg!(test) && crate::par::workers(1) > 1)
            && crate::par::workers(usize::MAX) > 1;
        // The fast reading first; what it declines is read again exactly, for the
        // contract's error (see `model::typed`).
        let (parsed, text_digest) = crate::par::join(
            hash_beside,
            || typed::parse_fast(text, In(Fast, ManifestSeed(Fast))),
            || hash_beside.then(|| crate::sha256_hex(text.as_bytes())),
        );
        if let Some(read) = parsed {
            if let Ok(m) = Self::decode::<Fast>(read, text_digest.clone().map(|d| (text, d))) {
                return Ok(m);
            }
        }
        let read = json::parse_text_with(text, LABEL, Any(ManifestSeed(Exact)))?;
        Self::decode::<Exact>(read, text_digest.map(|d| (text, d)))
    }

    /// Checks a manifest object read in mode `M` in the contract's order (its
    /// tensors and fragments as [`ManifestSeed`] decoded them); `decoded` as in
    /// [`Self::build`].
    fn decode<M: Mode>((v, tensors, fragments): Read<'_, M>, decoded: Option<(&str, String)>) -> Result<Self> {
        let v = &v;
        let o = Obj::new(v, || "weight manifest must be a JSON object".into())?;
        o.expect_keys(
            &[
                "created_at",
                "fragments",
                "group_id",
                "manifest_key",
                "namespace",
                "resource_id",
                "resource_kind",
                "revision",
                "tensors",
                "weight_generation",
            ],
            || "weight manifest schema fields do not match contract".into(),
        )?;
        match o.get("resource_kind") {
            Value::Str(s) if s == "model_weight" => {}
            _ => return invalid("weight manifest resource_kind must be model_weight"),
        }
        // The key set holds `tensors` and `fragments`.
        let tensors =
            M::result(tensors.ok_or_else(|| Error::invalid("weight manifest schema fields do not match contract"))?)?;
        // The key set holds `fragments`.
        let fragments =
            M::result(fragments.ok_or_else(|| Error::invalid("weight manifest schema fields do not match contract"))?)?;
        let spec = StoredManifestSpec {
            namespace: json::req_str(o.get("namespace"), "namespace")?,
            resource_id: json::req_str(o.get("resource_id"), "resource_id")?,
            revision: json::req_str(o.get("revision"), "revision")?,
            weight_generation: json::req_int(o.get("weight_generation"), "weight_generation", 0)?,
            group_id: json::req_str(o.get("group_id"), "group_id")?,
            manifest_key: json::req_str(o.get("manifest_key"), "manifest_key")?,
            tensors,
            fragments,
            created_at: json::req_str(o.get("created_at"), "created_at")?,
        };
        Self::build(spec, false, decoded)
    }

    /// Namespace (raw).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// Resource kind (always `model_weight`).
    pub fn resource_kind(&self) -> &'static str {
        "model_weight"
    }
    /// Resource id.
    pub fn resource_id(&self) -> &str {
        &self.resource_id
    }
    /// Revision.
    pub fn revision(&self) -> &str {
        &self.revision
    }
    /// Weight generation.
    pub fn weight_generation(&self) -> u64 {
        self.weight_generation
    }
    /// Group id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }
    /// Manifest key.
    pub fn manifest_key(&self) -> &str {
        &self.manifest_key
    }
    /// Tensors in manifest order.
    pub fn tensors(&self) -> &[Arc<TensorDescriptor>] {
        &self.tensors
    }
    /// Fragments in manifest order.
    pub fn fragments(&self) -> &[StoredFragment] {
        &self.fragments
    }
    /// Creation timestamp (opaque).
    pub fn created_at(&self) -> &str {
        &self.created_at
    }
    /// Hex SHA-256 of [`StoredManifest::to_json`].
    pub fn manifest_digest(&self) -> &str {
        &self.manifest_digest
    }
    /// The identity that pins this exact manifest.
    pub fn identity(&self) -> StoredManifestIdentity {
        StoredManifestIdentity {
            namespace: self.namespace.clone(),
            resource_id: self.resource_id.clone(),
            revision: self.revision.clone(),
            weight_generation: self.weight_generation,
            group_id: self.group_id.clone(),
            manifest_key: self.manifest_key.clone(),
            content_sha256: self.manifest_digest.clone(),
        }
    }
}

fn check_stored_aliases(index: &HashMap<&str, &TensorDescriptor>, fragments: &[StoredFragment]) -> Result<()> {
    type GroupKey<'a> = (&'a [String], &'a [u64], &'a [u64], u64);
    let mut groups: HashMap<GroupKey<'_>, BTreeSet<&str>> = HashMap::default();
    let mut order: Vec<GroupKey<'_>> = Vec::new();
    for f in fragments.iter().filter(|f| !f.aliases.is_empty()) {
        if let Some(unknown) = f.aliases.iter().find(|a| !index.contains_key(a.as_str())) {
            return invalid(format!("stored alias references unknown tensor: {unknown}"));
        }
        let key = (f.aliases.as_slice(), f.global_offset(), f.local_shape(), f.nbytes);
        let entry = groups.entry(key).or_default();
        if entry.is_empty() {
            order.push(key);
        }
        entry.insert(&*f.tensor_id);
    }
    for key in order {
        let members = &groups[&key];
        if !members.iter().copied().eq(key.0.iter().map(String::as_str)) {
            return invalid("stored alias group is incomplete for fragment geometry");
        }
        let first = index[key.0[0].as_str()];
        if key.0[1..].iter().any(|m| !index[m.as_str()].same_alias_key(first)) {
            return invalid("stored alias tensor descriptors differ");
        }
    }
    Ok(())
}

/// `slots[i]`: the index in `tensors` of fragment `i`'s tensor.
fn check_stored_coverage(tensors: &[Arc<TensorDescriptor>], fragments: &[StoredFragment], slots: &[u32]) -> Result<()> {
    let geometry = |i: usize| (slots[i], fragments[i].global_offset(), fragments[i].local_shape());
    if crate::fxhash::has_duplicate(fragments.len(), geometry) {
        let mut geometry_seen: HashSet<(u32, &[u64], &[u64])> = crate::fxhash::set_with_capacity(fragments.len());
        for (i, f) in fragments.iter().enumerate() {
            if !geometry_seen.insert(geometry(i)) {
                return invalid(format!("duplicate fragment geometry: {}", f.tensor_id));
            }
        }
    }
    // Boxes grouped by tensor (counting sort, fragment order kept within a tensor).
    let mut starts = vec![0u32; tensors.len() + 1];
    for &slot in slots {
        starts[slot as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut next = starts.clone();
    let mut boxes_by_tensor: Vec<BoxRef<'_>> = vec![BoxRef::new(&[], &[]); fragments.len()];
    for (f, &slot) in fragments.iter().zip(slots) {
        boxes_by_tensor[next[slot as usize] as usize] = f.as_box();
        next[slot as usize] += 1;
    }
    for (i, t) in tensors.iter().enumerate() {
        let boxes = &boxes_by_tensor[starts[i] as usize..starts[i + 1] as usize];
        let total = boxes.iter().fold(0u128, |acc, b| acc.saturating_add(geometry::volume(b.shape)));
        if boxes.is_empty() || total != geometry::volume(t.global_shape()) || geometry::boxes_overlap_exact(boxes) {
            return invalid(format!("tensor is not fully covered: {}", t.tensor_id()));
        }
    }
    Ok(())
}

fn check_object_ranges(fragments: &[StoredFragment]) -> Result<()> {
    // Only objects holding several fragments can overlap; manifests the planner
    // wrote have one fragment per object, so for them this is one duplicate scan.
    if !crate::fxhash::has_duplicate(fragments.len(), |i| fragments[i].object_key.as_str()) {
        return Ok(());
    }
    let mut first: HashMap<&str, u32> = crate::fxhash::map_with_capacity(fragments.len());
    let mut shared: Vec<u32> = Vec::new();
    let mut marked = vec![false; fragments.len()];
    for (i, f) in fragments.iter().enumerate() {
        if let Some(&j) = first.get(f.object_key.as_str()) {
            if !marked[j as usize] {
                marked[j as usize] = true;
                shared.push(j);
            }
            shared.push(i as u32);
        } else {
            first.insert(&f.object_key, i as u32);
        }
    }
    if shared.is_empty() {
        return Ok(());
    }
    // Per object key (key order), fragments by offset (stable).
    shared.sort_unstable_by(|&a, &b| {
        let (fa, fb) = (&fragments[a as usize], &fragments[b as usize]);
        (fa.object_key.as_str(), fa.object_offset, a).cmp(&(fb.object_key.as_str(), fb.object_offset, b))
    });
    for w in shared.windows(2) {
        let (prev, cur) = (&fragments[w[0] as usize], &fragments[w[1] as usize]);
        if prev.object_key != cur.object_key {
            continue;
        }
        let end = prev.object_offset as u128 + prev.nbytes as u128;
        if (cur.object_offset as u128) < end {
            return invalid(format!(
                "stored fragment object ranges overlap: {} and {} in {}",
                prev.fragment_id, cur.fragment_id, cur.object_key
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The one decoder (see `model::typed`), generic over its reading mode: the
// top-level object keeps its small members as values and streams `fragments`,
// each read into typed slots and checked, in the contract's order, once it has
// been read.
// ---------------------------------------------------------------------------

const LABEL: &str = "weight manifest";

/// A manifest object nested in a larger document (the upload plan's transport),
/// read in mode `M`, decoded and validated as [`StoredManifest::from_json`] does.
pub(crate) struct ManifestDocSeed<M>(pub(crate) M);

impl<'de, M: Mode> DeserializeSeed<'de> for ManifestDocSeed<M> {
    type Value = M::Out<StoredManifest>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        M::checked(StoredManifest::decode::<M>(In(self.0, ManifestSeed(self.0)).deserialize(d)?, None))
    }
}

/// The manifest object read in mode `M`, with its decoded tensors and fragments
/// (or their first error; `None` without the member) apart.
type Read<'de, M> =
    (Value<'de>, Option<<M as Mode>::Out<Vec<Arc<TensorDescriptor>>>>, Option<<M as Mode>::Out<Vec<StoredFragment>>>);

/// Reads a manifest object ([`Read`]) in mode `M`; any other value as it is.
struct ManifestSeed<M>(M);

impl<'de, M: Mode> Typed<'de> for ManifestSeed<M> {
    type Out = Read<'de, M>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.0;
        let interner: Interner<'de> = Interner::default();
        let (mut tensors, mut fragments) = (None, None);
        let members = json::members_with(&mut m, Vec::new(), |k, m| {
            if k == "tensors" {
                tensors = Some(read_tensors(mode, m, true)?);
                return Ok(true);
            }
            if k != "fragments" {
                return Ok(false);
            }
            let interner = &interner;
            let each = Each(
                mode,
                |_| In(mode, FragmentSeed { interner, mode }),
                || Error::invalid("StoredWeightManifest fragments must be a sequence"),
            );
            fragments = Some(mode.value(m, each)?);
            Ok(true)
        })?;
        Ok((Value::Object(members), tensors, fragments))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> std::result::Result<Self::Out, E> {
        Ok((v, None, None))
    }
}

struct FragmentSeed<'a, 'de, M> {
    interner: &'a Interner<'de>,
    mode: M,
}

/// A stored fragment's key slots.
fn fragment_slot(k: &str) -> Option<u32> {
    Some(match k {
        "aliases" => 0,
        "fragment_id" => 1,
        "global_offset" => 2,
        "local_shape" => 3,
        "nbytes" => 4,
        "object_key" => 5,
        "object_offset" => 6,
        "tensor_id" => 7,
        _ => return None,
    })
}

impl<'de, M: Mode> Typed<'de> for FragmentSeed<'_, 'de, M> {
    type Out = M::Out<StoredFragment>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Out, A::Error> {
        let mode = self.mode;
        let mut keys = Keys::default();
        let (mut id, mut key, mut tensor_id) = (Held::default(), Held::default(), Held::default());
        let (mut nbytes, mut object_offset) = (Held::default(), Held::default());
        let (mut offset, mut shape, mut aliases) = (Held::default(), Held::default(), Held::default());
        while let Some(k) = keys.next(mode, &mut m, fragment_slot)? {
            match k {
                0 => aliases = mode.value(&mut m, NameArray)?,
                1 => id = mode.value(&mut m, Str)?,
                2 => offset = mode.value(&mut m, IntArray)?,
                3 => shape = mode.value(&mut m, IntArray)?,
                4 => nbytes = mode.value(&mut m, UInt)?,
                5 => key = mode.value(&mut m, Str)?,
                6 => object_offset = mode.value(&mut m, UInt)?,
                _ => tensor_id = mode.value(&mut m, Str)?,
            }
        }
        let checked = (|| {
            if !keys.are(0xff) {
                return invalid("stored fragment schema fields do not match contract");
            }
            let aliases = aliases.names(
                "stored fragment aliases must be a sequence",
                "stored fragment alias must be a non-empty string",
            )?;
            let fragment_id = id.req_str("stored fragment fragment_id")?.into_owned();
            let tensor_id = typed::intern(self.interner, tensor_id.req_str("stored fragment tensor_id")?);
            let offset = offset.ints("stored fragment global_offset", 0)?;
            let shape = shape.ints("stored fragment local_shape", 1)?;
            let spec = StoredFragmentSpec {
                fragment_id,
                object_key: key.req_str("stored fragment object_key")?.into_owned(),
                object_offset: object_offset.req_int("stored fragment object_offset", 0)?,
                nbytes: nbytes.req_int("stored fragment nbytes", 1)?,
                aliases,
                ..StoredFragmentSpec::default()
            };
            StoredFragment::with_geometry(spec, tensor_id, SharedBox::new(&offset, &shape))
        })();
        M::checked(checked)
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> std::result::Result<Self::Out, E> {
        M::checked(invalid("stored fragment schema fields do not match contract"))
    }
}

#[cfg(test)]
mod tests {
    use super::StoredManifest;
    use crate::json::{self, Profile};

    /// The two modes of the one decoder agree: every manifest among the
    /// conformance fixtures (and its re-serialization) that the fast reading
    /// accepts decodes to what the exact reading makes of it, every valid one is
    /// read fast, and a repeated key declines.
    #[test]
    fn fast_and_exact_readings_agree() {
        use super::{typed, Any, Exact, Fast, In, ManifestSeed, LABEL};
        let fast = |text: &str| {
            typed::parse_fast(text, In(Fast, ManifestSeed(Fast))).map(|r| StoredManifest::decode::<Fast>(r, None))
        };
        let exact = |text: &str| {
            json::parse_text_with(text, LABEL, Any(ManifestSeed(Exact)))
                .and_then(|r| StoredManifest::decode::<Exact>(r, None))
        };
        let mut valid = 0;
        for (name, fixture) in crate::testutil::conformance_fixtures("") {
            let Some(text) = fixture["inputs"].get("stored_manifest").and_then(|v| v.as_str()) else { continue };
            let want = exact(text);
            match fast(text) {
                Some(Ok(m)) => assert_eq!(Ok(&m), want.as_ref(), "{name}"),
                _ => assert!(want.is_err(), "{name}: a valid manifest declined"),
            }
            if let Ok(m) = want {
                valid += 1;
                let again = m.to_json();
                assert_eq!(fast(&again).map(|r| r.unwrap()), Some(m), "{name}");
                let repeated = again.replacen("\"nbytes\":", "\"nbytes\":1,\"nbytes\":", 1);
                assert!(typed::parse_fast(&repeated, In(Fast, ManifestSeed(Fast))).is_none(), "{name}");
            }
        }
        assert!(valid >= 5, "only {valid} valid manifests");
    }

    fn fixture_manifest(name: &str) -> String {
        let path = format!("{}/tests/fixtures/conformance/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let fixture: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        fixture["inputs"]["stored_manifest"].as_str().unwrap().to_string()
    }

    /// A decoded manifest is checked on one thread while the other computes its
    /// digest (large documents only; forced here): the same manifest, the same
    /// digest and the same first error as checking and hashing one after the other.
    #[test]
    fn checks_beside_the_digest_match_one_thread() {
        let decode = |workers: usize, text: &str| {
            crate::par::with_workers(Some(workers), || StoredManifest::from_json(text.as_bytes()))
        };
        for name in ["042-manifest-valid-upload-output", "044-manifest-valid-fragment-order-preserved"] {
            let text = fixture_manifest(name);
            let (one, two) = (decode(1, &text).unwrap(), decode(2, &text).unwrap());
            assert_eq!(one, two, "{name}");
            assert_eq!(two.manifest_digest(), crate::sha256_hex(two.to_json().as_bytes()), "{name}");
        }
        for name in [
            "050-manifest-reject-overlapping-fragments",
            "051-manifest-reject-incomplete-coverage",
            "052-manifest-reject-object-range-overlap",
            "053-manifest-reject-fragment-out-of-bounds",
            "054-manifest-reject-object-key-outside-group",
        ] {
            let text = fixture_manifest(name);
            let (one, two) = (decode(1, &text).unwrap_err(), decode(2, &text).unwrap_err());
            assert_eq!(one.to_string(), two.to_string(), "{name}");
        }
    }

    /// A decoded manifest takes the digest of its input only when its canonical
    /// JSON is exactly that input; otherwise it hashes its re-serialization.
    #[test]
    fn input_digest_is_used_only_for_canonical_input() {
        for name in ["042-manifest-valid-upload-output", "044-manifest-valid-fragment-order-preserved"] {
            let m = StoredManifest::from_json(fixture_manifest(name).as_bytes()).unwrap();
            let canonical = m.to_json();
            let digest = crate::sha256_hex(canonical.as_bytes());
            // Whitespace, another member order, an escaped character: the same
            // manifest, other bytes.
            let spaced = canonical.replacen("{\"created_at\":", "{ \"created_at\" : ", 1);
            // created_at (the first member) moved to the end.
            let reordered = {
                let mut first = String::from("\"created_at\":");
                json::write_str(&mut first, m.created_at(), Profile::Utf8);
                let rest = canonical.strip_prefix(&format!("{{{first},")).expect("created_at comes first");
                format!("{{{},{first}}}", rest.strip_suffix('}').unwrap())
            };
            let escaped = canonical.replacen("\"model_weight\"", "\"model_\\u0077eight\"", 1);
            for (what, text) in
                [("canonical", &canonical), ("spaced", &spaced), ("reordered", &reordered), ("escaped", &escaped)]
            {
                assert_eq!(what == "canonical", *text == canonical, "{name}: {what}");
                for workers in [1, 2] {
                    let got = crate::par::with_workers(Some(workers), || StoredManifest::from_json(text.as_bytes()));
                    let got = got.unwrap_or_else(|e| panic!("{name}: {what}: {e}"));
                    assert_eq!(got, m, "{name}: {what}, {workers} workers");
                    assert_eq!(got.manifest_digest(), digest, "{name}: {what}, {workers} workers");
                }
                // The path itself: a digest given with the input is kept exactly
                // when the input is canonical.
                let read = json::parse_text_with(text, "test", super::Any(super::ManifestSeed(super::Exact))).unwrap();
                let told = StoredManifest::decode::<super::Exact>(read, Some((text, "told".into()))).unwrap();
                let expected = if what == "canonical" { "told" } else { digest.as_str() };
                assert_eq!(told.manifest_digest(), expected, "{name}: {what}");
            }
        }
    }

    /// The two-thread writer gives the one-thread writer's bytes at every cut, on
    /// every manifest the conformance fixtures expect (Unicode keys included),
    /// whether construction learned the cut comparing a decoded text or hashing;
    /// `to_json` takes it when two workers are allowed; a cut that does not hold
    /// is refused, never overrun, and `to_json` then writes on one thread.
    #[test]
    fn two_thread_manifest_json_is_the_one_thread_bytes_at_every_cut() {
        let mut checked = 0;
        for (_, fixture) in crate::testutil::conformance_fixtures("") {
            let Some(text) = fixture["expected"]["manifest_json"].as_str() else { continue };
            let m = StoredManifest::from_json_str(text).unwrap();
            let mut one = String::new();
            m.write_json(&mut one);
            assert_eq!(one, text);
            let n = m.fragments.len();
            if n >= 2 {
                assert_eq!(m.json_cut.index, n / 2, "decoded manifests learn the cut");
            }
            for cut in 1..n {
                let from_text = m.json_equals(text, cut).expect("same text");
                let (digest, hashed) = m.digest_with_cut(cut);
                assert_eq!(digest, m.manifest_digest());
                for c in [from_text, hashed] {
                    assert_eq!((c.index, c.total), (cut, text.len()));
                    assert!(text[..c.at].ends_with('}') && text[c.at..].starts_with(",{\"aliases\":"));
                    assert_eq!(m.to_json_halves(c).as_deref(), Some(text), "cut {cut}");
                }
                checked += 1;
            }
            assert_eq!(crate::par::with_workers(Some(2), || m.to_json()), text);
            assert_eq!(crate::par::with_workers(Some(1), || m.to_json()), text);
            if n >= 2 {
                for delta in [-1i64, 1] {
                    let mut q = m.clone();
                    q.json_cut.at = (q.json_cut.at as i64 + delta) as usize;
                    assert_eq!(q.to_json_halves(q.json_cut), None, "first half {delta:+} bytes");
                    q.json_cut = m.json_cut;
                    q.json_cut.total = (q.json_cut.total as i64 + delta) as usize;
                    assert_eq!(q.to_json_halves(q.json_cut), None, "whole {delta:+} bytes");
                    assert_eq!(crate::par::with_workers(Some(2), || q.to_json()), text);
                }
            }
        }
        assert!(checked >= 20, "only {checked} cuts checked");
    }
}
