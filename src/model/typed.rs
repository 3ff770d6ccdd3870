//! One-pass decoding of the large documents (placement JSON, stored manifest JSON,
//! the upload plan transport): one decoder per object, which reads the text once
//! and reports the precise contract errors itself. There is no second decoder and
//! no fallback.
//!
//! # How one pass keeps the strict decoder's every message and their order
//!
//! The contract's errors come in a fixed order: first anything wrong with the text
//! (not JSON, a repeated key at any depth, a non-finite number), then each object's
//! checks in the order the contract lists them, whatever the order of the members
//! in the text. So each object decoder here *reads* first and *checks* after:
//!
//! - While reading, it keeps each member in a slot, and a semantic fault is never a
//!   parse error: values of every JSON type are accepted at every place (a value of
//!   an unexpected shape is kept as a [`Value`]), unknown keys are read and noted,
//!   and a decoder returns its checks' outcome as a `crate::Result` *inside* serde's
//!   `Ok`. The only parse errors are those of the text (serde_json's, and
//!   [`json::duplicate`] for a repeated key, raised where [`Value`]'s decoder raises
//!   it), so the text's errors win, as in a parse-then-check decoder.
//! - When the object ends, its checks run in the contract order over the slots,
//!   with the same helpers ([`json::req_str`], [`json::req_int`], [`Obj`] key sets,
//!   `ParallelRank::from_json`, `TensorDescriptor::from_json`, ...) and labels as a
//!   tree decoder, and a member decoded ahead of its turn (a large array streamed
//!   before the small members that the contract checks first) hands its first error
//!   to its parent, which reports it at its turn.
//!
//! The hot members (the fragments: tens of thousands) are held typed when they have
//! the one canonical shape (an integer array on the stack: [`Ints`]; a rank:
//! [`Rank`]); anything else in their place is held as the [`Value`] it is, and the
//! same check runs over either. Small members (scalars, the topology, the tensors,
//! a part's rank) are held as [`Value`]s: a scalar [`Value`] allocates nothing.
//!
//! A decoder is written once, as serde visitors ([`Typed`]), and runs over text
//! (`serde_json`) or over an already parsed [`Value`] ([`json::ValueDe`], for
//! `Placement::from_json_value` and for the members that a document keeps as
//! values before their turn).
//!
//! Why this and not two decoders derived from one field table: a table would still
//! leave two decoders to run (and the fallback that reparses every rejected
//! document); one pass has one place per object where fields are read and one
//! where they are checked, at the speed of the former fast path. The oracle test
//! `tests/decode_golden.rs` pins the result on thousands of edited documents
//! against what the former strict decoder reported.

use crate::json::{self, CowStr, Members, Value, ValueVisitor};
use crate::model::axes::ParallelRank;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

#[cfg(doc)]
use crate::json::Obj;

/// A decoder of one JSON value of any type: what it makes of an object, of an
/// array, and of any other value (given as a [`Value`], the default of the first
/// two as well). Read it with [`Any`].
pub(crate) trait Typed<'de>: Sized {
    /// The decoded value (usually a `crate::Result`: the checks' outcome).
    type Out;
    /// An object (default: read whole, then [`Typed::other`]).
    fn map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Out, A::Error> {
        let v = json::members_with(&mut m, Vec::new(), |_, _| Ok(false))?;
        Ok(self.other(Value::Object(v)))
    }
    /// An array (default: read whole, then [`Typed::other`]).
    fn seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Out, A::Error> {
        let v = json::items_after(&mut s, Vec::new())?;
        Ok(self.other(v))
    }
    /// Any other value.
    fn other(self, v: Value<'de>) -> Self::Out;
}

/// Reads one value of any JSON type with a [`Typed`] decoder.
pub(crate) struct Any<T>(pub(crate) T);

impl<'de, T: Typed<'de>> DeserializeSeed<'de> for Any<T> {
    type Value = T::Out;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Typed<'de>> Visitor<'de> for Any<T> {
    type Value = T::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
        self.0.map(m)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Self::Value, A::Error> {
        self.0.seq(s)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_bool::<E>(v)?))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_u64::<E>(v)?))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_i64::<E>(v)?))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_f64::<E>(v)?))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_borrowed_str::<E>(v)?))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_str::<E>(v)?))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(self.0.other(ValueVisitor.visit_string::<E>(v)?))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.other(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.0.other(Value::Null))
    }
}

/// The keys of one object read into slots: which of `names` were seen (a repeated
/// key fails as in [`Value`]'s decoder) and whether any other key was (such
/// members are read, for the text's own errors, and dropped).
pub(crate) struct Keys<'de, const N: usize> {
    names: &'static [&'static str; N],
    seen: u32,
    unknown: Members<'de>,
    unknown_set: Option<HashSet<Cow<'de, str>>>,
}

impl<'de, const N: usize> Keys<'de, N> {
    /// No key seen yet.
    pub(crate) fn new(names: &'static [&'static str; N]) -> Self {
        Keys { names, seen: 0, unknown: Vec::new(), unknown_set: None }
    }

    /// The index in `names` of the next known key (its value is the caller's to
    /// read), `None` at the end of the object.
    pub(crate) fn next<A: MapAccess<'de>>(&mut self, m: &mut A) -> Result<Option<usize>, A::Error> {
        while let Some(k) = m.next_key_seed(CowStr)? {
            if let Some(i) = self.names.iter().position(|n| *n == k) {
                if self.seen & (1 << i) != 0 {
                    return Err(json::duplicate(&k));
                }
                self.seen |= 1 << i;
                return Ok(Some(i));
            }
            json::check_new_key(&self.unknown, &mut self.unknown_set, &k)?;
            m.next_value::<Value<'de>>()?;
            self.unknown.push((k, Value::Null));
        }
        Ok(None)
    }

    /// Whether the keys were exactly those of `names` whose bits `set` has.
    pub(crate) fn are(&self, set: u32) -> bool {
        self.unknown.is_empty() && self.seen == set
    }
}

/// Tensor ids seen so far in one document, one shared allocation each.
pub(crate) type Interner<'de> = std::cell::RefCell<crate::fxhash::FxHashMap<&'de str, Arc<str>>>;

/// A tensor id, shared through `interner` (an id with escapes is not borrowed from
/// the input and gets its own allocation).
pub(crate) fn intern<'de>(interner: &Interner<'de>, id: &Cow<'de, str>) -> Arc<str> {
    match id {
        Cow::Borrowed(s) => interner.borrow_mut().entry(s).or_insert_with(|| Arc::from(*s)).clone(),
        Cow::Owned(s) => Arc::from(s.as_str()),
    }
}

/// An array of integers, held on the stack up to [`Dims::INLINE`] entries (a
/// tensor's rank rarely exceeds that), so a decoder copies it once, into its final
/// home.
pub(crate) struct Dims {
    inline: [u64; 8],
    len: usize,
    spill: Vec<u64>,
}

impl Dims {
    /// Entries kept without a heap allocation.
    pub(crate) const INLINE: usize = 8;

    fn new() -> Self {
        Dims { inline: [0; 8], len: 0, spill: Vec::new() }
    }

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

/// A member that should be an array of unsigned integers: held as [`Dims`] when it
/// is one, else as the [`Value`] it is. Read it with `Any(Ints::default())`.
pub(crate) enum Ints<'de> {
    /// An array of integers that fit in u64.
    Typed(Dims),
    /// Anything else (also the slot of a member not seen).
    Other(Value<'de>),
}

impl Default for Ints<'_> {
    fn default() -> Self {
        Ints::Other(Value::Null)
    }
}

impl<'de> Ints<'de> {
    /// [`json::req_int_array`]'s check (its messages: `<field> must be a sequence`,
    /// `<field> must be at least <min>`, ...), the integers kept on the stack.
    pub(crate) fn check(self, field: impl fmt::Display, min: u64) -> crate::Result<Dims> {
        match self {
            Ints::Typed(d) => match d.as_slice().iter().find(|&&x| x < min) {
                Some(&x) => json::req_int(&Value::UInt(x), field, min).map(|_| d),
                None => Ok(d),
            },
            Ints::Other(v) => {
                let mut d = Dims::new();
                json::req_int_array(&v, field, min)?.into_iter().for_each(|x| d.push(x));
                Ok(d)
            }
        }
    }
}

impl<'de> Typed<'de> for Ints<'de> {
    type Out = Ints<'de>;
    fn seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Out, A::Error> {
        let mut d = Dims::new();
        while let Some(v) = s.next_element::<Value<'de>>()? {
            match v {
                Value::UInt(x) => d.push(x),
                other => {
                    let mut items: Vec<Value<'de>> = d.as_slice().iter().map(|&x| Value::UInt(x)).collect();
                    items.push(other);
                    return Ok(Ints::Other(json::items_after(&mut s, items)?));
                }
            }
        }
        Ok(Ints::Typed(d))
    }
    fn other(self, v: Value<'de>) -> Self::Out {
        Ints::Other(v)
    }
}

/// A member that should be a RANK object: held as a [`ParallelRank`] when it is
/// exactly `dp`, `ep`, `pp`, `tp` with unsigned integers, else as the [`Value`] it
/// is. Read it with `Any(Rank::default())`.
pub(crate) enum Rank<'de> {
    /// The four coordinates.
    Typed(ParallelRank),
    /// Anything else (also the slot of a member not seen).
    Other(Value<'de>),
}

impl Default for Rank<'_> {
    fn default() -> Self {
        Rank::Other(Value::Null)
    }
}

impl<'de> Rank<'de> {
    /// `ParallelRank::from_json`'s check (`schema_err` when the object is not
    /// exactly the four coordinates, `rank <axis> must be ...` for a value).
    pub(crate) fn check(self, schema_err: &dyn Fn() -> String) -> crate::Result<ParallelRank> {
        match self {
            Rank::Typed(r) => Ok(r),
            Rank::Other(v) => ParallelRank::from_json(&v, schema_err),
        }
    }
}

const RANK_KEYS: [&str; 4] = ["dp", "ep", "pp", "tp"];

impl<'de> Typed<'de> for Rank<'de> {
    type Out = Rank<'de>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Out, A::Error> {
        let mut coords = [0u64; 4];
        // The keys read so far, in document order (to rebuild the object).
        let (mut order, mut n) = ([0usize; 4], 0);
        let mut seen = 0u32;
        let rebuilt = |order: &[usize], coords: &[u64; 4]| -> Members<'de> {
            order.iter().map(|&i| (Cow::Borrowed(RANK_KEYS[i]), Value::UInt(coords[i]))).collect()
        };
        while let Some(k) = m.next_key_seed(CowStr)? {
            let i = RANK_KEYS.iter().position(|n| *n == k);
            if let Some(i) = i {
                if seen & (1 << i) != 0 {
                    return Err(json::duplicate(&k));
                }
            }
            let v = m.next_value::<Value<'de>>()?;
            match (i, v) {
                (Some(i), Value::UInt(x)) => {
                    seen |= 1 << i;
                    coords[i] = x;
                    order[n] = i;
                    n += 1;
                }
                (_, v) => {
                    let mut members = rebuilt(&order[..n], &coords);
                    members.push((k, v));
                    return Ok(Rank::Other(Value::Object(json::members_with(&mut m, members, |_, _| Ok(false))?)));
                }
            }
        }
        if seen != 0b1111 {
            return Ok(Rank::Other(Value::Object(rebuilt(&order[..n], &coords))));
        }
        let [dp, ep, pp, tp] = coords;
        Ok(Rank::Typed(ParallelRank { dp, ep, pp, tp }))
    }
    fn other(self, v: Value<'de>) -> Self::Out {
        Rank::Other(v)
    }
}

/// Reads a whole array, one element at a time with the seed `element(i)` (`i`: its
/// index), each a `crate::Result`: the elements until the first error, then that
/// error (the elements after it are still read, for the text's own errors, but not
/// kept). Anything but an array: `not_array`.
pub(crate) struct Each<F, G>(pub(crate) F, pub(crate) G);

impl<'de, T, S, F, G> Typed<'de> for Each<F, G>
where
    F: FnMut(usize) -> S,
    S: DeserializeSeed<'de, Value = crate::Result<T>>,
    G: FnOnce() -> crate::Error,
{
    type Out = crate::Result<Vec<T>>;
    fn seq<A: SeqAccess<'de>>(mut self, mut s: A) -> Result<Self::Out, A::Error> {
        let mut out = Vec::with_capacity(s.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = s.next_element_seed((self.0)(out.len()))? {
            match item {
                Ok(v) => out.push(v),
                Err(e) => {
                    // Read as values: a repeated key further on is still the text's error.
                    while s.next_element::<Value<'de>>()?.is_some() {}
                    return Ok(Err(e));
                }
            }
        }
        Ok(Ok(out))
    }
    fn other(self, _: Value<'de>) -> Self::Out {
        Err((self.1)())
    }
}

#[cfg(test)]
mod tests {
    use super::{Any, Ints, Rank};
    use crate::json;
    use crate::model::axes::ParallelRank;

    fn ints(text: &str, min: u64) -> (crate::Result<Vec<u64>>, bool) {
        let parsed = json::parse_text_with(text, "t", Any(Ints::default())).unwrap();
        let typed = matches!(parsed, Ints::Typed(_));
        (parsed.check("f", min).map(|d| d.as_slice().to_vec()), typed)
    }

    /// Integer arrays: typed when canonical, and the same outcome (value or exact
    /// message) as [`json::req_int_array`] over the parsed value in every case.
    #[test]
    fn ints_agree_with_the_value_check() {
        let cases = [
            "[]",
            "[0]",
            "[1,2]",
            "[1,0]",
            "[0,1]",
            "[1,2,3,4,5,6,7,8]",
            "[1,2,3,4,5,6,7,8,9,0]",
            "[1.0]",
            "[-1]",
            "[-0]",
            "[1,true]",
            "[\"1\"]",
            "[18446744073709551616]",
            "[1e3]",
            "null",
            "3",
            "{}",
            "[1,[2]]",
            "\"x\"",
        ];
        for text in cases {
            for min in [0, 1] {
                let want = json::req_int_array(&json::parse_text(text, "t").unwrap(), "f", min);
                let (got, typed) = ints(text, min);
                assert_eq!(got.as_ref().map_err(|e| e.to_string()), want.as_ref().map_err(|e| e.to_string()), "{text}");
                let canonical = ["[]", "[0]", "[1,2]", "[1,0]", "[0,1]", "[1,2,3,4,5,6,7,8]", "[1,2,3,4,5,6,7,8,9,0]"];
                assert_eq!(typed, canonical.contains(&text), "{text}");
            }
        }
        assert_eq!(ints("[1,2,3,4,5,6,7,8,9,10]", 1).0.unwrap(), (1..=10).collect::<Vec<u64>>());
    }

    /// Ranks: typed when canonical (any key order), and the same outcome as
    /// `ParallelRank::from_json` over the parsed value in every case.
    #[test]
    fn ranks_agree_with_the_value_check() {
        let cases = [
            (r#"{"dp":1,"ep":2,"pp":3,"tp":4}"#, true),
            (r#"{"tp":4,"pp":3,"ep":2,"dp":1}"#, true),
            (r#"{"dp":1,"ep":2,"pp":3}"#, false),
            (r#"{"dp":1,"ep":2,"pp":3,"tp":4,"xp":0}"#, false),
            (r#"{"dp":1,"ep":2.0,"pp":3,"tp":4}"#, false),
            (r#"{"dp":-1,"ep":2,"pp":3,"tp":4}"#, false),
            (r#"{"d\u0070":1,"ep":2,"pp":3,"tp":4}"#, true),
            (r#"{"xp":0,"dp":1,"ep":2,"pp":3,"tp":4}"#, false),
            ("[]", false),
            ("null", false),
        ];
        let schema = || "schema".to_string();
        for (text, typed) in cases {
            let want = ParallelRank::from_json(&json::parse_text(text, "t").unwrap(), &schema);
            let parsed = json::parse_text_with(text, "t", Any(Rank::default())).unwrap();
            assert_eq!(matches!(parsed, Rank::Typed(_)), typed, "{text}");
            let got = parsed.check(&schema);
            assert_eq!(got.map_err(|e| e.to_string()), want.map_err(|e| e.to_string()), "{text}");
        }
        // A repeated key is the text's error, as in the Value decoder, wherever it comes.
        for text in [r#"{"dp":1,"dp":1}"#, r#"{"dp":1.5,"dp":1}"#, r#"{"x":1,"x":1}"#] {
            let e = json::parse_text_with(text, "t", Any(Rank::default())).err().unwrap();
            assert_eq!(e.to_string(), json::parse_text(text, "t").unwrap_err().to_string());
        }
    }
}
