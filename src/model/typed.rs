//! Typed fast-path decoding of the two large documents (placement JSON and stored
//! manifest JSON): serde visitors that read fragments straight into their specs,
//! with no intermediate [`Value`] tree for the bulk of the document.
//!
//! The fast path is an optimization only. It accepts a strict subset of what the
//! [`Value`] path accepts (exact key sets, no duplicate keys, keys without
//! escapes, integers where integers are required) and reports every deviation as
//! an opaque [`Fallback`]; callers then rerun the [`Value`] path, which produces
//! the precise contract error. A document the fast path accepts decodes to the
//! same values the [`Value`] path would build.

use crate::json::Value;
use crate::model::axes::{AxisKind, ParallelAxis, ParallelRank};
use crate::model::tensor::{TensorDescriptor, TensorSpec};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// "Not for the fast path": the caller falls back to the [`Value`] decoder.
pub(crate) fn fallback<E: de::Error>() -> E {
    E::custom("fast path declined")
}

/// Parses `text` as one document with `seed`, requiring the whole input to be
/// consumed. Every failure is a fallback (`None`).
pub(crate) fn parse_with<'de, S: DeserializeSeed<'de>>(text: &'de str, seed: S) -> Option<S::Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// The text of a document given as bytes: an optional leading BOM, then UTF-8.
pub(crate) fn text_of(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)).ok()
}

/// A string, borrowed from the input when it holds no escapes.
pub(crate) struct Text<'de>(pub(crate) Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Reads the next key of an object as a borrowed string (a key with escapes
/// declines the fast path).
pub(crate) fn next_key<'de, A: MapAccess<'de>>(m: &mut A) -> Result<Option<&'de str>, A::Error> {
    m.next_key::<&'de str>()
}

/// Marks `bit` as seen; a repeated key declines the fast path.
pub(crate) fn mark<E: de::Error>(seen: &mut u32, bit: u32) -> Result<(), E> {
    if *seen & (1 << bit) != 0 {
        return Err(fallback());
    }
    *seen |= 1 << bit;
    Ok(())
}

/// Tensor ids seen so far in one document, one shared allocation each.
pub(crate) type Interner<'de> = std::cell::RefCell<crate::fxhash::FxHashMap<&'de str, std::sync::Arc<str>>>;

/// Reads a tensor id value, shared through `interner` (an id with escapes is not
/// borrowed from the input and gets its own allocation).
pub(crate) fn interned_id<'de, A: MapAccess<'de>>(
    m: &mut A,
    interner: &Interner<'de>,
) -> Result<std::sync::Arc<str>, A::Error> {
    Ok(match m.next_value::<Text<'de>>()?.0 {
        Cow::Borrowed(s) => interner.borrow_mut().entry(s).or_insert_with(|| std::sync::Arc::from(s)).clone(),
        Cow::Owned(s) => std::sync::Arc::from(s),
    })
}

/// The members of a document object, in document order: small members kept as
/// values, the large array member as a name placeholder (decoded separately).
pub(crate) type Members<'de> = Vec<(Cow<'de, str>, Value<'de>)>;

/// Reads a document object made of the `small` members (each at most once, kept as
/// values, except the `tensors` member: decoded by [`Tensors`] and returned apart, its
/// member kept as an empty placeholder array) and the one large array member `big`,
/// decoded by `seed`. Any other key, a repeated key, or a missing `big` or `tensors`
/// declines the fast path. The placement and the
/// manifest decoders share it.
pub(crate) fn members_and_array<'de, A, S>(
    m: &mut A,
    small: &[&str],
    big: &str,
    seed: S,
) -> Result<(Members<'de>, S::Value, Tensors), A::Error>
where
    A: MapAccess<'de>,
    S: DeserializeSeed<'de>,
{
    let mut members: Members<'de> = Vec::with_capacity(small.len() + 1);
    let mut seed = Some(seed);
    let mut array = None;
    let mut tensors = None;
    let mut seen = 0u32;
    while let Some(k) = next_key(m)? {
        if k == big {
            mark(&mut seen, small.len() as u32)?;
            array = Some(m.next_value_seed(seed.take().ok_or_else(fallback)?)?);
            // The caller's decoder checks the key set; it only needs the name.
            members.push((Cow::Borrowed(k), Value::Array(Vec::new())));
        } else {
            let bit = small.iter().position(|s| *s == k).ok_or_else(fallback)?;
            mark(&mut seen, bit as u32)?;
            if k == "tensors" {
                // Decoded typed; the caller's decoder takes them instead of the
                // (empty) placeholder, which only keeps the key set whole.
                tensors = Some(m.next_value::<Tensors>()?);
                members.push((Cow::Borrowed(k), Value::Array(Vec::new())));
            } else {
                members.push((Cow::Borrowed(k), value(m)?));
            }
        }
    }
    Ok((members, array.ok_or_else(fallback)?, tensors.ok_or_else(fallback)?))
}

/// A non-empty string value, owned.
pub(crate) fn non_empty_string<'de, A: MapAccess<'de>>(m: &mut A) -> Result<String, A::Error> {
    let s = m.next_value::<Text<'de>>()?.0;
    if s.is_empty() {
        return Err(fallback());
    }
    Ok(s.into_owned())
}

/// An array of integers >= `MIN`, held on the stack up to [`Dims::INLINE`]
/// entries (a tensor's rank rarely exceeds that), so a decoder copies it once,
/// into its final home.
pub(crate) struct Dims<const MIN: u64> {
    inline: [u64; 8],
    len: usize,
    spill: Vec<u64>,
}

impl<const MIN: u64> Dims<MIN> {
    /// Entries kept without a heap allocation.
    pub(crate) const INLINE: usize = 8;

    /// The integers, in order.
    pub(crate) fn as_slice(&self) -> &[u64] {
        if self.len <= Self::INLINE {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    fn push(&mut self, v: u64) {
        if self.len < Self::INLINE {
            self.inline[self.len] = v;
        } else {
            if self.len == Self::INLINE {
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(v);
        }
        self.len += 1;
    }
}

impl<'de, const MIN: u64> de::Deserialize<'de> for Dims<MIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const MIN: u64>;
        impl<'de, const MIN: u64> Visitor<'de> for V<MIN> {
            type Value = Dims<MIN>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of integers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Dims { inline: [0; 8], len: 0, spill: Vec::new() };
                while let Some(v) = seq.next_element::<u64>()? {
                    if v < MIN {
                        return Err(fallback());
                    }
                    out.push(v);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V::<MIN>)
    }
}

/// An array of non-empty strings.
pub(crate) struct Names(pub(crate) Vec<String>);

impl<'de> de::Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<Text<'de>>()? {
                    if v.0.is_empty() {
                        return Err(fallback());
                    }
                    out.push(v.0.into_owned());
                }
                Ok(Names(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A RANK object: exactly `dp`, `ep`, `pp`, `tp`, each an unsigned integer.
pub(crate) struct Rank(pub(crate) ParallelRank);

impl<'de> de::Deserialize<'de> for Rank {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Rank;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rank object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut seen = 0u32;
                let mut r = ParallelRank::default();
                while let Some(k) = next_key(&mut m)? {
                    let (bit, slot) = match k {
                        "dp" => (0, &mut r.dp),
                        "ep" => (1, &mut r.ep),
                        "pp" => (2, &mut r.pp),
                        "tp" => (3, &mut r.tp),
                        _ => return Err(fallback()),
                    };
                    mark(&mut seen, bit)?;
                    *slot = m.next_value::<u64>()?;
                }
                if seen != 0b1111 {
                    return Err(fallback());
                }
                Ok(Rank(r))
            }
        }
        d.deserialize_map(V)
    }
}

/// An array of TENSOR objects (`wire-format.md` §2.1), each with exactly the nine
/// keys, values of the exact types, and valid as a [`TensorDescriptor`]; anything
/// else declines the fast path (the [`Value`] decoder then names the error).
pub(crate) struct Tensors(pub(crate) Vec<Arc<TensorDescriptor>>);

impl<'de> de::Deserialize<'de> for Tensors {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tensors = Vec::<Tensor>::deserialize(d)?;
        Ok(Tensors(tensors.into_iter().map(|t| Arc::new(t.0)).collect()))
    }
}

struct Tensor(TensorDescriptor);

impl<'de> de::Deserialize<'de> for Tensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tensor;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tensor object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut seen = 0u32;
                let mut spec = TensorSpec {
                    tensor_id: String::new(),
                    global_shape: Vec::new(),
                    dtype: String::new(),
                    itemsize: 0,
                    shard_dims: Vec::new(),
                    layout_fingerprint: String::new(),
                    parallel_axes: Vec::new(),
                    layer_id: None,
                    expert_id: None,
                };
                while let Some(k) = next_key(&mut m)? {
                    match k {
                        "tensor_id" => {
                            mark(&mut seen, 0)?;
                            spec.tensor_id = non_empty_string(&mut m)?;
                        }
                        "global_shape" => {
                            mark(&mut seen, 1)?;
                            spec.global_shape = m.next_value::<Dims<1>>()?.as_slice().to_vec();
                        }
                        "dtype" => {
                            mark(&mut seen, 2)?;
                            spec.dtype = non_empty_string(&mut m)?;
                        }
                        "itemsize" => {
                            mark(&mut seen, 3)?;
                            spec.itemsize = m.next_value::<u64>()?;
                        }
                        "shard_dims" => {
                            mark(&mut seen, 4)?;
                            spec.shard_dims = m.next_value::<Dims<0>>()?.as_slice().to_vec();
                        }
                        "layout_fingerprint" => {
                            mark(&mut seen, 5)?;
                            spec.layout_fingerprint = non_empty_string(&mut m)?;
                        }
                        "parallel_axes" => {
                            mark(&mut seen, 6)?;
                            spec.parallel_axes = m.next_value::<Axes>()?.0;
                        }
                        "layer_id" => {
                            mark(&mut seen, 7)?;
                            spec.layer_id = m.next_value::<Option<u64>>()?;
                        }
                        "expert_id" => {
                            mark(&mut seen, 8)?;
                            spec.expert_id = m.next_value::<Option<u64>>()?;
                        }
                        _ => return Err(fallback()),
                    }
                }
                if seen != 0x1ff {
                    return Err(fallback());
                }
                TensorDescriptor::new(spec).map(Tensor).map_err(|_| fallback())
            }
        }
        d.deserialize_map(V)
    }
}

/// A tensor's `parallel_axes`: AXIS objects with exactly `semantics` and `kind`
/// (`replicated`, `ownership`) or `semantics`, `kind` and `dim` (`split`).
struct Axes(Vec<ParallelAxis>);

impl<'de> de::Deserialize<'de> for Axes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Axes(Vec::<Axis>::deserialize(d)?.into_iter().map(|a| a.0).collect()))
    }
}

struct Axis(ParallelAxis);

impl<'de> de::Deserialize<'de> for Axis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Axis;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an axis object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut seen = 0u32;
                let (mut semantics, mut kind, mut dim) = (None, None, None);
                while let Some(k) = next_key(&mut m)? {
                    match k {
                        "semantics" => {
                            mark(&mut seen, 0)?;
                            semantics = Some(m.next_value::<Text<'de>>()?.0);
                        }
                        "kind" => {
                            mark(&mut seen, 1)?;
                            kind = Some(m.next_value::<Text<'de>>()?.0);
                        }
                        "dim" => {
                            mark(&mut seen, 2)?;
                            dim = Some(m.next_value::<u64>()?);
                        }
                        _ => return Err(fallback()),
                    }
                }
                let (Some(semantics), Some(kind)) = (semantics, kind) else {
                    return Err(fallback());
                };
                let kind = AxisKind::parse(&kind).map_err(|_| fallback())?;
                let axis = match (semantics.as_ref(), dim) {
                    ("split", Some(dim)) => ParallelAxis::split(kind, dim).map_err(|_| fallback())?,
                    ("replicated", None) => ParallelAxis::Replicated(kind),
                    ("ownership", None) => ParallelAxis::Ownership(kind),
                    _ => return Err(fallback()),
                };
                Ok(Axis(axis))
            }
        }
        d.deserialize_map(V)
    }
}

/// A sequence whose elements are decoded by `E` (a seed factory) and collected.
pub(crate) struct SeqOf<F, T>(pub(crate) F, pub(crate) PhantomData<T>);

impl<'de, F, T, S> DeserializeSeed<'de> for SeqOf<F, T>
where
    F: FnMut() -> S,
    S: DeserializeSeed<'de, Value = T>,
{
    type Value = Vec<T>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct V<F, T>(F, PhantomData<T>);
        impl<'de, F, T, S> Visitor<'de> for V<F, T>
        where
            F: FnMut() -> S,
            S: DeserializeSeed<'de, Value = T>,
        {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(v) = seq.next_element_seed((self.0)())? {
                    out.push(v);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V(self.0, PhantomData))
    }
}

/// Reads a small member as a [`Value`] (for the parts of a document that the
/// [`Value`] decoders handle well: topology, tensors, scalars).
pub(crate) fn value<'de, A: MapAccess<'de>>(m: &mut A) -> Result<Value<'de>, A::Error> {
    m.next_value::<Value<'de>>()
}

#[cfg(test)]
mod tests {
    use super::{Dims, Tensors};
    use crate::model::tensor::TensorDescriptor;

    const TENSOR: &str = r#"{"dtype":"bfloat16","expert_id":3,"global_shape":[4,8],"itemsize":2,"layer_id":2,"layout_fingerprint":"test:v1","parallel_axes":[{"kind":"dp","semantics":"replicated"},{"kind":"ep","semantics":"ownership"},{"dim":1,"kind":"tp","semantics":"split"}],"shard_dims":[1],"tensor_id":"layers.2.experts.3.w1"}"#;

    /// What the `Value` decoder makes of one tensor object (the placement's labels).
    fn by_value(text: &str) -> crate::Result<TensorDescriptor> {
        let v = crate::json::parse_text(text, "tensor")?;
        TensorDescriptor::from_json(&v, &|| "schema".to_string(), "", &"axis")
    }

    /// The typed tensor decoder accepts only what the `Value` decoder accepts, and
    /// builds the same descriptor; it may decline more (the caller then reruns the
    /// `Value` path for the error).
    #[test]
    fn typed_tensors_agree_with_the_value_decoder() {
        let edits: &[(&str, &str)] = &[
            ("", ""),
            ("\"expert_id\":3", "\"expert_id\":null"),
            ("\"layer_id\":2", "\"layer_id\":null"),
            ("\"layer_id\":2", "\"layer_id\":-0"),
            ("\"layer_id\":2", "\"layer_id\":-1"),
            ("\"layer_id\":2", "\"layer_id\":2.0"),
            ("\"layer_id\":2", "\"layer_id\":true"),
            ("\"itemsize\":2", "\"itemsize\":0"),
            ("\"itemsize\":2", "\"itemsize\":-0"),
            ("\"itemsize\":2", "\"itemsize\":2,\"itemsize\":2"),
            ("\"global_shape\":[4,8]", "\"global_shape\":[4,0]"),
            ("\"global_shape\":[4,8]", "\"global_shape\":[]"),
            ("\"global_shape\":[4,8]", "\"global_shape\":4"),
            ("\"shard_dims\":[1]", "\"shard_dims\":[0]"),
            ("\"shard_dims\":[1]", "\"shard_dims\":[]"),
            ("\"dtype\":\"bfloat16\"", "\"dtype\":\"\""),
            ("\"dtype\":\"bfloat16\"", "\"dtype\":\"bfloat\\u0031\""),
            ("\"tensor_id\":\"layers.2.experts.3.w1\"", "\"tensor_id\":\"\""),
            ("\"tensor_id\":\"layers.2.experts.3.w1\"", "\"tensor_id\":\"caf\\u00e9\""),
            (",\"layout_fingerprint\":\"test:v1\"", ""),
            ("\"layout_fingerprint\"", "\"extra\":1,\"layout_fingerprint\""),
            ("{\"dim\":1,\"kind\":\"tp\",\"semantics\":\"split\"}", "{\"kind\":\"tp\",\"semantics\":\"split\"}"),
            (
                "{\"kind\":\"dp\",\"semantics\":\"replicated\"}",
                "{\"dim\":0,\"kind\":\"dp\",\"semantics\":\"replicated\"}",
            ),
            ("{\"kind\":\"dp\",\"semantics\":\"replicated\"}", "{\"kind\":\"xp\",\"semantics\":\"replicated\"}"),
            ("{\"kind\":\"dp\",\"semantics\":\"replicated\"}", "{\"kind\":\"dp\",\"semantics\":\"mirrored\"}"),
            (
                "{\"kind\":\"dp\",\"semantics\":\"replicated\"}",
                "{\"kind\":\"dp\",\"kind\":\"dp\",\"semantics\":\"replicated\"}",
            ),
            ("{\"kind\":\"ep\",\"semantics\":\"ownership\"}", "{\"kind\":\"tp\",\"semantics\":\"ownership\"}"),
            ("{\"dim\":1,\"kind\":\"tp\"", "{\"dim\":2,\"kind\":\"tp\""),
            ("{\"dim\":1,\"kind\":\"tp\"", "{\"dim\":1,\"kind\":\"dp\""),
            ("\"parallel_axes\":[", "\"parallel_axes\":[{\"kind\":\"pp\",\"semantics\":\"ownership\"},"),
        ];
        let mut accepted = 0;
        for (from, to) in edits {
            assert!(TENSOR.contains(from), "{from}");
            let text = TENSOR.replacen(from, to, 1);
            let fast = serde_json::from_str::<Tensors>(&format!("[{text}]"));
            match (fast, by_value(&text)) {
                (Ok(t), Ok(d)) => {
                    assert_eq!(t.0.len(), 1);
                    assert_eq!(*t.0[0], d, "{to}");
                    accepted += 1;
                }
                (Ok(_), Err(e)) => panic!("typed accepts what the Value decoder rejects ({e}): {to}"),
                (Err(_), _) => {}
            }
        }
        // The valid spellings (the original, null ids, escapes in values) take the fast path.
        assert!(accepted >= 5, "{accepted}");
    }

    #[test]
    fn dims_keep_every_entry_on_either_side_of_the_inline_limit() {
        for n in [0usize, 1, 7, 8, 9, 20] {
            let v: Vec<u64> = (1..=n as u64).collect();
            let text = serde_json::to_string(&v).unwrap();
            let d: Dims<1> = serde_json::from_str(&text).unwrap();
            assert_eq!(d.as_slice(), v.as_slice(), "n={n}");
        }
        // The lower bound holds inline and spilled.
        assert!(serde_json::from_str::<Dims<1>>("[1,0]").is_err());
        assert!(serde_json::from_str::<Dims<1>>("[1,2,3,4,5,6,7,8,9,0]").is_err());
        assert!(serde_json::from_str::<Dims<0>>("[0,0]").is_ok());
    }
}
