//! Decoding of the large documents (placement JSON, stored manifest JSON, the
//! upload plan transport): one decoder per object, written once, generic over a
//! [`Mode`], which reads the text in one pass and reports the precise contract
//! errors itself.
//!
//! # One description, two readings
//!
//! Each object decoder (a fragment, a tensor, an axis, a part, a document) names
//! its keys once (the `match` of the slot function it gives [`Keys::next`]), reads
//! each member once (`mode.value(&mut m, Str)`, ...), and checks the object once,
//! in the contract's order. The mode decides only how that text is read:
//!
//! - [`Fast`]: each member with the deserializer's typed call for the one shape
//!   the schema wants (`deserialize_str`, `deserialize_u64`, a sequence of `u64`,
//!   ...; [`Typed::fast`]), keys borrowed from the input; the first deviation
//!   (another type, an unknown, repeated or escaped key, a failed check) fails at
//!   once with an opaque error ([`declined`]), and a checked object comes back
//!   as itself ([`Mode::Out`]).
//! - [`Exact`]: every JSON type accepted at every place, and the checks' outcome
//!   returned with the contract's message (below).
//!
//! `from_json` reads [`Fast`], and only a document it declines is read again
//! [`Exact`]ly, for its error; a tree ([`Value`]) is read [`Exact`]ly. Both run
//! the same checks over the same slots ([`Held`]), so what [`Fast`] accepts it
//! decodes to what [`Exact`] decodes (the decoders' tests compare the two on the
//! conformance documents).
//!
//! # How one pass keeps the strict decoder's every message and their order
//!
//! The contract's errors come in a fixed order: first anything wrong with the text
//! (not JSON, a repeated key at any depth, a non-finite number), then each object's
//! checks in the order the contract lists them, whatever the order of the members
//! in the text. So each object decoder here *reads* first and *checks* after:
//!
//! - While reading [`Exact`]ly, it keeps each member in a slot, and a semantic
//!   fault is never a parse error: values of every JSON type are accepted at every
//!   place (a value of an unexpected shape is kept as a [`Value`]), unknown keys
//!   are read and noted, and a decoder returns its checks' outcome as a
//!   `crate::Result` *inside* serde's `Ok`. The only parse errors are those of the
//!   text (serde_json's, and [`json::duplicate`] for a repeated key, raised where
//!   [`Value`]'s decoder raises it), so the text's errors win, as in a
//!   parse-then-check decoder.
//! - When the object ends, its checks run in the contract order over the slots,
//!   with the same helpers ([`json::req_str`], [`json::req_int`], [`Obj`] key sets,
//!   `ParallelRank::from_json`, `TensorDescriptor`'s checks, ...) and labels as a
//!   tree decoder, and a member decoded ahead of its turn (a large array streamed
//!   before the small members that the contract checks first) hands its first error
//!   to its parent, which reports it at its turn.
//!
//! The members of the hot objects (fragments: tens of thousands; tensors; axes)
//! are held as [`Held`]: typed when they have the one canonical shape (a string,
//! an integer, an integer array on the stack, an alias group, a rank), else the
//! [`Value`] it is (only when read [`Exact`]ly), and the same check runs over
//! either: inline for the typed value, out of line otherwise. Small members of
//! the documents (scalars, the topology, a part's rank) are held as [`Value`]s
//! in both modes: a scalar [`Value`] allocates nothing.
//!
//! A decoder is written as serde visitors ([`Typed`]), and runs over text
//! (`serde_json`) or over an already parsed [`Value`] ([`json::ValueDe`], for
//! `Placement::from_json_value` and for the fragment of an upload operation).
//! The oracle test `tests/decode_golden.rs` pins the result on thousands of
//! edited documents against what the former two-decoder implementation
//! reported.

use crate::json::{self, CowStr, Members, Value, ValueVisitor};
use crate::model::axes::ParallelRank;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
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
        self.other(Value::Object(v))
    }
    /// An array (default: read whole, then [`Typed::other`]).
    fn seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Out, A::Error> {
        let v = json::items_after(&mut s, Vec::new())?;
        self.other(v)
    }
    /// Any other value.
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E>;
    /// The [`Fast`] reading: only the one shape the schema wants, read with the
    /// deserializer's typed call; anything else fails (declines). Default: an
    /// object, read by [`Typed::map`].
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_map(Shaped(self))
    }
}

/// Reads one value of any JSON type with a [`Typed`] decoder.
pub(crate) struct Any<T>(pub(crate) T);

impl<'de, T: Typed<'de>> DeserializeSeed<'de> for Any<T> {
    type Value = T::Out;
    #[inline]
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Typed<'de>> Visitor<'de> for Any<T> {
    type Value = T::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    #[inline]
    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
        self.0.map(m)
    }
    #[inline]
    fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Self::Value, A::Error> {
        self.0.seq(s)
    }
    #[inline]
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_bool::<E>(v)?)
    }
    #[inline]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_u64::<E>(v)?)
    }
    #[inline]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_i64::<E>(v)?)
    }
    #[inline]
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_f64::<E>(v)?)
    }
    #[inline]
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_borrowed_str::<E>(v)?)
    }
    #[inline]
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_str::<E>(v)?)
    }
    #[inline]
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.0.other(ValueVisitor.visit_string::<E>(v)?)
    }
    #[inline]
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.other(Value::Null)
    }
    #[inline]
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.other(Value::Null)
    }
}

/// How a decoder reads: [`Fast`] or [`Exact`]. Each object decoder is written
/// once, generic over its mode; the mode decides how a member is read
/// ([`Mode::value`]), what an unknown key does ([`Keys::next`]) and how a checked
/// object is returned ([`Mode::Out`]).
pub(crate) trait Mode: Copy {
    /// Whether this is [`Fast`].
    const FAST: bool;
    /// A checked object as its decoder returns it: [`Fast`]: the object (a failed
    /// check has declined); [`Exact`]: the checks' outcome.
    type Out<T>: Outcome<Self, T = T>;
    /// A check's outcome as [`Mode::Out`] (a failed check declines [`Fast`]).
    fn checked<T, E: de::Error>(r: crate::Result<T>) -> Result<Self::Out<T>, E>;
    /// [`Mode::Out`] as a check's outcome.
    fn result<T>(o: Self::Out<T>) -> crate::Result<T>;
    /// The object when [`Mode::Out`] holds one.
    fn as_ok<T>(o: &Self::Out<T>) -> Option<&T>;
    /// Reads the next member's value with `t`.
    #[inline]
    fn value<'de, A: MapAccess<'de>, T: Typed<'de>>(self, m: &mut A, t: T) -> Result<T::Out, A::Error> {
        m.next_value_seed(In(self, t))
    }
}

/// The fast reading: typed reads of the one shape the schema wants, and the
/// first deviation (another type, an unknown, repeated or missing key, a failed
/// check) fails at once with an opaque error ([`declined`]); the caller then
/// reads the text again [`Exact`]ly. What it accepts, it decodes to what
/// [`Exact`] decodes.
#[derive(Clone, Copy, Default)]
pub(crate) struct Fast;

/// The exact reading: every JSON type accepted at every place, the contract's
/// checks in the contract's order, with its messages (see the module doc).
#[derive(Clone, Copy, Default)]
pub(crate) struct Exact;

/// The error of a [`Fast`] reading that declines.
#[cold]
pub(crate) fn declined<E: de::Error>() -> E {
    E::custom("fast path declined")
}

impl Mode for Fast {
    const FAST: bool = true;
    type Out<T> = T;
    #[inline]
    fn checked<T, E: de::Error>(r: crate::Result<T>) -> Result<T, E> {
        r.map_err(|_| declined())
    }
    #[inline]
    fn result<T>(o: T) -> crate::Result<T> {
        Ok(o)
    }
    #[inline]
    fn as_ok<T>(o: &T) -> Option<&T> {
        Some(o)
    }
}

impl Mode for Exact {
    const FAST: bool = false;
    type Out<T> = crate::Result<T>;
    #[inline]
    fn checked<T, E: de::Error>(r: crate::Result<T>) -> Result<crate::Result<T>, E> {
        Ok(r)
    }
    #[inline]
    fn result<T>(o: crate::Result<T>) -> crate::Result<T> {
        o
    }
    #[inline]
    fn as_ok<T>(o: &crate::Result<T>) -> Option<&T> {
        o.as_ref().ok()
    }
}

/// Reads one value with a [`Typed`] decoder in mode `M`: [`Typed::fast`], or any
/// JSON value through [`Any`].
pub(crate) struct In<M, T>(pub(crate) M, pub(crate) T);

impl<'de, M: Mode, T: Typed<'de>> DeserializeSeed<'de> for In<M, T> {
    type Value = T::Out;
    #[inline]
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        if M::FAST {
            self.1.fast(d)
        } else {
            d.deserialize_any(Any(self.1))
        }
    }
}

/// The visitor of [`Typed::fast`] for objects and arrays: any other value fails.
pub(crate) struct Shaped<T>(pub(crate) T);

impl<'de, T: Typed<'de>> Visitor<'de> for Shaped<T> {
    type Value = T::Out;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object or an array")
    }
    #[inline]
    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
        self.0.map(m)
    }
    #[inline]
    fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Self::Value, A::Error> {
        self.0.seq(s)
    }
}

/// Reads `text` as one document with `seed` ([`Fast`]): `None` when it declines
/// (anything [`json::parse_text_with`] would fail on declines too).
pub(crate) fn parse_fast<'de, S: DeserializeSeed<'de>>(text: &'de str, seed: S) -> Option<S::Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// Reads the parsed `v` with `seed` ([`Fast`]; see [`json::ValueDe`]): `Err` when
/// it declines.
pub(crate) fn decode_fast<'de, S: DeserializeSeed<'de>>(v: &Value<'de>, seed: S) -> Result<S::Value, de::value::Error> {
    seed.deserialize(json::ValueDe(v))
}

/// The keys of one object read into slots: which known keys were seen (a repeated
/// key fails as in [`Value`]'s decoder) and whether any other key was (such members
/// are read, for the text's own errors, and dropped). An object names its keys
/// once, in the `slot` function it passes to [`Keys::next`] (a `match` on the key).
#[derive(Default)]
pub(crate) struct Keys<'de> {
    seen: u32,
    /// The unknown keys, and their set once they are many (boxed: rare, and a
    /// [`Fast`] reading never has any).
    unknown: Option<Box<(Members<'de>, Option<HashSet<Cow<'de, str>>>)>>,
}

impl<'de> Keys<'de> {
    /// The slot of the next known key (`slot(key)`; its value is the caller's to
    /// read), `None` at the end of the object.
    #[inline]
    pub(crate) fn next<M: Mode, A: MapAccess<'de>>(
        &mut self,
        _: M,
        m: &mut A,
        slot: impl Fn(&str) -> Option<u32>,
    ) -> Result<Option<u32>, A::Error> {
        if M::FAST {
            // A key with escapes is not borrowed from the input: it declines.
            return match m.next_key::<&'de str>()? {
                Some(k) => match slot(k) {
                    Some(i) if self.seen & (1 << i) == 0 => {
                        self.seen |= 1 << i;
                        Ok(Some(i))
                    }
                    _ => Err(declined()),
                },
                None => Ok(None),
            };
        }
        while let Some(k) = m.next_key_seed(CowStr)? {
            if let Some(i) = slot(&k) {
                if self.seen & (1 << i) != 0 {
                    return Err(json::duplicate(&k));
                }
                self.seen |= 1 << i;
                return Ok(Some(i));
            }
            self.other(m, k)?;
        }
        Ok(None)
    }

    /// An unknown key: its value is read (for the text's own errors) and dropped.
    #[cold]
    fn other<A: MapAccess<'de>>(&mut self, m: &mut A, k: Cow<'de, str>) -> Result<(), A::Error> {
        let (members, set) = &mut **self.unknown.get_or_insert_with(Box::default);
        json::check_new_key(members, set, &k)?;
        m.next_value::<Value<'de>>()?;
        members.push((k, Value::Null));
        Ok(())
    }

    /// Whether the keys were exactly the known ones whose bits `set` has.
    #[inline]
    pub(crate) fn are(&self, set: u32) -> bool {
        self.seen == set && self.unknown.is_none()
    }
}

/// Tensor ids seen so far in one document, one shared allocation each.
pub(crate) type Interner<'de> = std::cell::RefCell<crate::fxhash::FxHashMap<&'de str, Arc<str>>>;

/// A tensor id, shared through `interner` (an id with escapes is not borrowed from
/// the input and gets its own allocation).
pub(crate) fn intern<'de>(interner: &Interner<'de>, id: Cow<'de, str>) -> Arc<str> {
    match id {
        Cow::Borrowed(s) => interner.borrow_mut().entry(s).or_insert_with(|| Arc::from(s)).clone(),
        Cow::Owned(s) => Arc::from(s.as_str()),
    }
}

/// A member held as it was read: `Typed` when it has the one shape the schema
/// wants (read without building a [`Value`]), else the [`Value`] it is, or
/// `Absent` (a key not seen: read as `null`, though an object checks its key set
/// first). Its checks (`req_str`, `req_int`, `ints`, ...) give exactly the outcome
/// of the [`json`] helpers (and of `ParallelRank::from_json`) over the member's
/// value: the accepted value, or the helper's own message. Read one with the slot
/// readers: `Any(Str)`, `Any(UInt)`, `Any(OptUInt)`, `Any(IntArray)`,
/// `Any(NameArray)`, `Any(RankObject)`.
#[derive(Default)]
pub(crate) enum Held<'de, T> {
    /// Not seen.
    #[default]
    Absent,
    /// The wanted shape.
    Typed(T),
    /// Anything else.
    Other(Value<'de>),
}

impl<'de, T> Held<'de, T> {
    /// The member's value when it is not `Typed` (`Err`: the typed value).
    #[inline]
    fn untyped(self) -> Result<Value<'de>, T> {
        match self {
            Held::Typed(t) => Err(t),
            Held::Other(v) => Ok(v),
            Held::Absent => Ok(Value::Null),
        }
    }
}

/// Reads a string member ([`Held`]).
pub(crate) struct Str;
/// Reads an unsigned integer member ([`Held`]).
pub(crate) struct UInt;
/// Reads a `null`-or-unsigned-integer member ([`Held`]).
pub(crate) struct OptUInt;
/// Reads an array of unsigned integers ([`Held`] of [`Dims`]).
pub(crate) struct IntArray;
/// Reads an array of non-empty strings ([`Held`] of the strings).
pub(crate) struct NameArray;
/// Reads a RANK object ([`Held`] of a [`ParallelRank`]): typed when it is exactly
/// `dp`, `ep`, `pp`, `tp` with unsigned integers.
pub(crate) struct RankObject;

impl<'de> Typed<'de> for Str {
    type Out = Held<'de, Cow<'de, str>>;
    #[inline]
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(match v {
            Value::Str(s) => Held::Typed(s),
            v => Held::Other(v),
        })
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        CowStr.deserialize(d).map(Held::Typed)
    }
}

impl<'de> Typed<'de> for UInt {
    type Out = Held<'de, u64>;
    #[inline]
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(match v {
            Value::UInt(n) => Held::Typed(n),
            v => Held::Other(v),
        })
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        u64::deserialize(d).map(Held::Typed)
    }
}

impl<'de> Typed<'de> for OptUInt {
    type Out = Held<'de, Option<u64>>;
    #[inline]
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(match v {
            Value::UInt(n) => Held::Typed(Some(n)),
            Value::Null => Held::Typed(None),
            v => Held::Other(v),
        })
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        Option::<u64>::deserialize(d).map(Held::Typed)
    }
}

impl<'de> Held<'de, Cow<'de, str>> {
    /// [`json::req_str`]: a non-empty string (as held: borrowed from the input when
    /// it has no escapes).
    #[inline(always)]
    pub(crate) fn req_str(self, field: impl fmt::Display) -> crate::Result<Cow<'de, str>> {
        match self {
            Held::Typed(s) if !s.is_empty() => Ok(s),
            other => other.req_str_cold(field),
        }
    }

    #[cold]
    #[inline(never)]
    fn req_str_cold(self, field: impl fmt::Display) -> crate::Result<Cow<'de, str>> {
        let v = self.untyped().unwrap_or_else(Value::Str);
        json::req_cow(&v, field).cloned()
    }
}

impl<'de> Held<'de, u64> {
    /// [`json::req_int`]: an integer at least `min`.
    #[inline(always)]
    pub(crate) fn req_int(self, field: impl fmt::Display, min: u64) -> crate::Result<u64> {
        match self {
            Held::Typed(n) if n >= min => Ok(n),
            other => other.req_int_cold(field, min),
        }
    }

    #[cold]
    #[inline(never)]
    fn req_int_cold(self, field: impl fmt::Display, min: u64) -> crate::Result<u64> {
        json::req_int(&self.untyped().unwrap_or_else(Value::UInt), field, min)
    }
}

impl<'de> Held<'de, Option<u64>> {
    /// [`json::opt_int`]: `null` or an integer at least `min`.
    #[inline(always)]
    pub(crate) fn opt_int(self, field: impl fmt::Display, min: u64) -> crate::Result<Option<u64>> {
        match self {
            // (A key not seen reads as `null`.)
            Held::Typed(None) | Held::Absent => Ok(None),
            Held::Typed(Some(n)) if n >= min => Ok(Some(n)),
            other => other.opt_int_cold(field, min),
        }
    }

    #[cold]
    #[inline(never)]
    fn opt_int_cold(self, field: impl fmt::Display, min: u64) -> crate::Result<Option<u64>> {
        let v = self.untyped().unwrap_or_else(|n| n.map_or(Value::Null, Value::UInt));
        json::opt_int(&v, field, min)
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

    #[inline]
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

impl<'de> Held<'de, Dims> {
    /// [`json::req_int_array`]'s check (its messages: `<field> must be a sequence`,
    /// `<field> must be at least <min>`, ...): the integers, borrowed where they
    /// were read typed.
    #[inline(always)]
    pub(crate) fn ints(&self, field: impl fmt::Display, min: u64) -> crate::Result<Cow<'_, [u64]>> {
        match self {
            Held::Typed(d) if min == 0 || d.as_slice().iter().all(|&x| x >= min) => Ok(Cow::Borrowed(d.as_slice())),
            other => other.ints_cold(field, min),
        }
    }

    #[cold]
    #[inline(never)]
    fn ints_cold(&self, field: impl fmt::Display, min: u64) -> crate::Result<Cow<'_, [u64]>> {
        match self {
            Held::Typed(d) => match d.as_slice().iter().find(|&&x| x < min) {
                Some(&x) => json::req_int(&Value::UInt(x), field, min).map(|_| Cow::Borrowed(d.as_slice())),
                None => Ok(Cow::Borrowed(d.as_slice())),
            },
            Held::Other(v) => json::req_int_array(v, field, min).map(Cow::Owned),
            Held::Absent => json::req_int_array(&Value::Null, field, min).map(Cow::Owned),
        }
    }

    /// Whether the member is not an array.
    pub(crate) fn is_not_array(&self) -> bool {
        match self {
            Held::Typed(_) => false,
            Held::Other(v) => !matches!(v, Value::Array(_)),
            Held::Absent => true,
        }
    }
}

/// Reads one element of an integer array: its integer, or (any other value) 0,
/// the value then kept in the slot. The integer comes back in registers, not
/// inside a [`Held`] (the element loop is the decoders' hottest).
struct Element<'a, 'de>(&'a mut Option<Value<'de>>);

impl<'de> Typed<'de> for Element<'_, 'de> {
    type Out = u64;
    #[inline]
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<u64, E> {
        Ok(match v {
            Value::UInt(n) => n,
            v => {
                *self.0 = Some(v);
                0
            }
        })
    }
}

impl<'de> Typed<'de> for IntArray {
    type Out = Held<'de, Dims>;
    fn seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Out, A::Error> {
        let mut d = Dims::new();
        let mut odd = None;
        while let Some(x) = s.next_element_seed(Any(Element(&mut odd)))? {
            if let Some(other) = odd.take() {
                let mut items: Vec<Value<'de>> = d.as_slice().iter().map(|&x| Value::UInt(x)).collect();
                items.push(other);
                return Ok(Held::Other(json::items_after(&mut s, items)?));
            }
            d.push(x);
        }
        Ok(Held::Typed(d))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(Held::Other(v))
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_seq(FastInts).map(Held::Typed)
    }
}

/// [`IntArray`]'s [`Fast`] reading: unsigned integers only.
struct FastInts;

impl<'de> Visitor<'de> for FastInts {
    type Value = Dims;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of unsigned integers")
    }
    #[inline]
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Dims, A::Error> {
        let mut d = Dims::new();
        while let Some(x) = s.next_element::<u64>()? {
            d.push(x);
        }
        Ok(d)
    }
}

impl<'de> Held<'de, Vec<String>> {
    /// The strings, else `not_array` (not an array) or `not_string` (an element
    /// that is not a non-empty string).
    #[inline(always)]
    pub(crate) fn names(self, not_array: &str, not_string: &str) -> crate::Result<Vec<String>> {
        match self {
            Held::Typed(names) => Ok(names),
            other => other.names_cold(not_array, not_string),
        }
    }

    #[cold]
    #[inline(never)]
    fn names_cold(self, not_array: &str, not_string: &str) -> crate::Result<Vec<String>> {
        match self.untyped() {
            Err(names) => Ok(names),
            Ok(v) => {
                let items = json::req_array(&v, || not_array.to_string())?;
                let mut names = Vec::with_capacity(items.len());
                for a in items {
                    match a {
                        Value::Str(s) if !s.is_empty() => names.push(s.to_string()),
                        _ => return Err(crate::Error::invalid(not_string)),
                    }
                }
                Ok(names)
            }
        }
    }
}

impl<'de> Typed<'de> for NameArray {
    type Out = Held<'de, Vec<String>>;
    fn seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Out, A::Error> {
        let mut names = Vec::new();
        while let Some(v) = s.next_element_seed(Any(Str))? {
            match v.untyped() {
                Err(x) if !x.is_empty() => names.push(x.into_owned()),
                other => {
                    let mut items: Vec<Value<'de>> = names.into_iter().map(|x| Value::Str(Cow::Owned(x))).collect();
                    items.push(other.unwrap_or_else(Value::Str));
                    return Ok(Held::Other(json::items_after(&mut s, items)?));
                }
            }
        }
        Ok(Held::Typed(names))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(Held::Other(v))
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_seq(FastNames).map(Held::Typed)
    }
}

/// [`NameArray`]'s [`Fast`] reading: non-empty strings only.
struct FastNames;

impl<'de> Visitor<'de> for FastNames {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of non-empty strings")
    }
    #[inline]
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Vec<String>, A::Error> {
        let mut names = Vec::new();
        while let Some(x) = s.next_element_seed(CowStr)? {
            if x.is_empty() {
                return Err(declined());
            }
            names.push(x.into_owned());
        }
        Ok(names)
    }
}

impl<'de> Held<'de, ParallelRank> {
    /// `ParallelRank::from_json`'s check (`schema_err` when the object is not
    /// exactly the four coordinates, `rank <axis> must be ...` for a value).
    #[inline(always)]
    pub(crate) fn rank(self, schema_err: &dyn Fn() -> String) -> crate::Result<ParallelRank> {
        match self {
            Held::Typed(r) => Ok(r),
            other => other.rank_cold(schema_err),
        }
    }

    #[cold]
    #[inline(never)]
    fn rank_cold(self, schema_err: &dyn Fn() -> String) -> crate::Result<ParallelRank> {
        match self.untyped() {
            Err(r) => Ok(r),
            Ok(v) => ParallelRank::from_json(&v, schema_err),
        }
    }
}

const RANK_KEYS: [&str; 4] = ["dp", "ep", "pp", "tp"];

impl<'de> Typed<'de> for RankObject {
    type Out = Held<'de, ParallelRank>;
    fn map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Out, A::Error> {
        let mut coords = [0u64; 4];
        // The keys read so far, in document order (to rebuild the object).
        let (mut order, mut n) = ([0usize; 4], 0);
        let mut seen = 0u32;
        let rebuilt = |order: &[usize], coords: &[u64; 4]| -> Members<'de> {
            order.iter().map(|&i| (Cow::Borrowed(RANK_KEYS[i]), Value::UInt(coords[i]))).collect()
        };
        while let Some(k) = m.next_key_seed(CowStr)? {
            let i = match k.as_ref() {
                "dp" => Some(0),
                "ep" => Some(1),
                "pp" => Some(2),
                "tp" => Some(3),
                _ => None,
            };
            if let Some(i) = i {
                if seen & (1 << i) != 0 {
                    return Err(json::duplicate(&k));
                }
            }
            let v = m.next_value_seed(Any(UInt))?;
            match (i, v.untyped()) {
                (Some(i), Err(x)) => {
                    seen |= 1 << i;
                    coords[i] = x;
                    order[n] = i;
                    n += 1;
                }
                (_, v) => {
                    let mut members = rebuilt(&order[..n], &coords);
                    members.push((k, v.unwrap_or_else(Value::UInt)));
                    return Ok(Held::Other(Value::Object(json::members_with(&mut m, members, |_, _| Ok(false))?)));
                }
            }
        }
        if seen != 0b1111 {
            return Ok(Held::Other(Value::Object(rebuilt(&order[..n], &coords))));
        }
        let [dp, ep, pp, tp] = coords;
        Ok(Held::Typed(ParallelRank { dp, ep, pp, tp }))
    }
    fn other<E: de::Error>(self, v: Value<'de>) -> Result<Self::Out, E> {
        Ok(Held::Other(v))
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_map(FastRank).map(Held::Typed)
    }
}

/// [`RankObject`]'s [`Fast`] reading: exactly the four coordinates, unsigned
/// integers.
struct FastRank;

impl<'de> Visitor<'de> for FastRank {
    type Value = ParallelRank;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rank object")
    }
    #[inline]
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<ParallelRank, A::Error> {
        let mut seen = 0u32;
        let mut r = ParallelRank::default();
        while let Some(k) = m.next_key_seed(CowStr)? {
            let (bit, slot) = match k.as_ref() {
                "dp" => (0, &mut r.dp),
                "ep" => (1, &mut r.ep),
                "pp" => (2, &mut r.pp),
                "tp" => (3, &mut r.tp),
                _ => return Err(declined()),
            };
            if seen & (1 << bit) != 0 {
                return Err(declined());
            }
            seen |= 1 << bit;
            *slot = m.next_value::<u64>()?;
        }
        if seen != 0b1111 {
            return Err(declined());
        }
        Ok(r)
    }
}

/// Reads a whole array in mode `M`, one element at a time with the seed
/// `element(i)` (`i`: its index), each an `M::Out`: the elements until the first
/// error, then that error (the elements after it are still read, for the text's
/// own errors, but not kept). Anything but an array: `not_array`.
pub(crate) struct Each<M, F, G>(pub(crate) M, pub(crate) F, pub(crate) G);

/// A checked object as mode `M` returns it ([`Mode::Out`]), for [`Each`].
pub(crate) trait Outcome<M> {
    /// The object.
    type T;
    /// As a check's outcome.
    fn result(self) -> crate::Result<Self::T>;
}

impl<T> Outcome<Fast> for T {
    type T = T;
    #[inline]
    fn result(self) -> crate::Result<T> {
        Ok(self)
    }
}

impl<T> Outcome<Exact> for crate::Result<T> {
    type T = T;
    #[inline]
    fn result(self) -> crate::Result<T> {
        self
    }
}

impl<'de, M, S, F, G> Typed<'de> for Each<M, F, G>
where
    M: Mode,
    F: FnMut(usize) -> S,
    S: DeserializeSeed<'de>,
    S::Value: Outcome<M>,
    G: FnOnce() -> crate::Error,
{
    type Out = M::Out<Vec<<S::Value as Outcome<M>>::T>>;
    fn seq<A: SeqAccess<'de>>(mut self, mut s: A) -> Result<Self::Out, A::Error> {
        let mut out = Vec::with_capacity(s.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = s.next_element_seed((self.1)(out.len()))? {
            match item.result() {
                Ok(v) => out.push(v),
                Err(e) => {
                    // Read as values: a repeated key further on is still the text's error.
                    while s.next_element::<Value<'de>>()?.is_some() {}
                    return M::checked(Err(e));
                }
            }
        }
        M::checked(Ok(out))
    }
    fn other<E: de::Error>(self, _: Value<'de>) -> Result<Self::Out, E> {
        M::checked(Err((self.2)()))
    }
    #[inline]
    fn fast<D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_seq(Shaped(self))
    }
}

#[cfg(test)]
mod tests {
    use super::{Any, Held, IntArray, RankObject};
    use crate::json;
    use crate::model::axes::ParallelRank;

    fn ints(text: &str, min: u64) -> (crate::Result<Vec<u64>>, bool) {
        let parsed = json::parse_text_with(text, "t", Any(IntArray)).unwrap();
        let typed = matches!(parsed, Held::Typed(_));
        (parsed.ints("f", min).map(|d| d.into_owned()), typed)
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
            let parsed = json::parse_text_with(text, "t", Any(RankObject)).unwrap();
            assert_eq!(matches!(parsed, Held::Typed(_)), typed, "{text}");
            let got = parsed.rank(&schema);
            assert_eq!(got.map_err(|e| e.to_string()), want.map_err(|e| e.to_string()), "{text}");
        }
        // A repeated key is the text's error, as in the Value decoder, wherever it comes.
        for text in [r#"{"dp":1,"dp":1}"#, r#"{"dp":1.5,"dp":1}"#, r#"{"x":1,"x":1}"#] {
            let e = json::parse_text_with(text, "t", Any(RankObject)).err().unwrap();
            assert_eq!(e.to_string(), json::parse_text(text, "t").unwrap_err().to_string());
        }
    }
}
