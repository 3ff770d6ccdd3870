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
use crate::model::axes::ParallelRank;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

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
/// values) and the one large array member `big`, decoded by `seed`. Any other key, a
/// repeated key or a missing `big` declines the fast path. The placement and the
/// manifest decoders share it.
pub(crate) fn members_and_array<'de, A, S>(
    m: &mut A,
    small: &[&str],
    big: &str,
    seed: S,
) -> Result<(Members<'de>, S::Value), A::Error>
where
    A: MapAccess<'de>,
    S: DeserializeSeed<'de>,
{
    let mut members: Members<'de> = Vec::with_capacity(small.len() + 1);
    let mut seed = Some(seed);
    let mut array = None;
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
            members.push((Cow::Borrowed(k), value(m)?));
        }
    }
    Ok((members, array.ok_or_else(fallback)?))
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
    use super::Dims;

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
