//! Canonical JSON (both profiles of `wire-format.md` §1) and the strict decoder.
//!
//! The encoder is hand-written: callers emit object members in code-point order of
//! their keys (all schema keys are ASCII, so byte order), and strings go through
//! [`write_str`], which implements Python's `json.dumps` escaping for
//! `ensure_ascii=True` (profile A) and `ensure_ascii=False` (profile U).
//!
//! The decoder uses serde_json's parser with our own [`Value`] visitor, which keeps
//! object members in order, rejects a repeated key at any depth
//! (`duplicate JSON field: <key>`), and keeps integers apart from floats so that
//! `8.0`, `1e3` and `true` are never accepted where an integer is required.

use crate::error::{Error, Result};
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

/// Which canonical JSON profile to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// `ensure_ascii=True`: pure ASCII output, `\uXXXX` escapes (lowercase hex),
    /// surrogate pairs above U+FFFF. Placement JSON, ids, decision record.
    Ascii,
    /// `ensure_ascii=False`: raw UTF-8 for code points >= U+007F. Stored manifest.
    Utf8,
}

/// Where the encoders write. `String` is the usual output; the crate's two-thread
/// writers run the same encoders into a writer over a fixed slice (each half of a
/// document in place).
///
/// Thread safety: an implementation is used through `&mut` only.
pub trait JsonOut {
    /// Appends `s`.
    fn push_str(&mut self, s: &str);
    /// Appends `c` (UTF-8 encoded).
    #[inline]
    fn push(&mut self, c: char) {
        self.push_str(c.encode_utf8(&mut [0; 4]));
    }
    /// A hint that about `additional` more bytes follow (no effect by default).
    #[inline]
    fn reserve(&mut self, additional: usize) {
        let _ = additional;
    }
}

impl JsonOut for String {
    #[inline]
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
    #[inline]
    fn push(&mut self, c: char) {
        String::push(self, c);
    }
    #[inline]
    fn reserve(&mut self, additional: usize) {
        String::reserve(self, additional);
    }
}

/// A [`JsonOut`] over a fixed, uninitialized slice: it writes in place and never
/// past the slice's end. A write that does not fit is dropped and remembered, so a
/// caller that measured wrong learns it from [`SliceOut::filled`] instead of
/// writing out of bounds.
pub(crate) struct SliceOut<'a> {
    buf: &'a mut [std::mem::MaybeUninit<u8>],
    len: usize,
    overflow: bool,
}

impl<'a> SliceOut<'a> {
    /// An empty writer at the start of `buf`.
    pub(crate) fn new(buf: &'a mut [std::mem::MaybeUninit<u8>]) -> Self {
        SliceOut { buf, len: 0, overflow: false }
    }

    /// Whether every byte of the slice was written, and nothing was dropped: then
    /// the slice holds the concatenation of the strings written, valid UTF-8.
    pub(crate) fn filled(&self) -> bool {
        !self.overflow && self.len == self.buf.len()
    }
}

impl JsonOut for SliceOut<'_> {
    #[inline]
    fn push_str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(dst) => {
                // SAFETY: `dst` is exactly `bytes.len()` writable bytes of our own
                // slice, and `bytes` is a different allocation (a `&str` cannot
                // borrow the `&mut` slice).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_mut_ptr().cast::<u8>(), bytes.len()) };
                self.len += bytes.len();
            }
            None => self.overflow = true,
        }
    }
}

/// A document that a two-thread writer can cut in two ([`write_halves`]), each
/// half written into any [`JsonOut`].
pub(crate) trait TwoHalves: Sync {
    /// The document's bytes up to the cut.
    fn first<W: JsonOut>(&self, out: &mut W);
    /// The document's bytes from the cut to the end.
    fn second<W: JsonOut>(&self, out: &mut W);
}

/// Writes `doc` with both halves on their own thread, straight into one buffer of
/// `total` bytes, the second half from byte `first` on: lengths the caller knows
/// (a placement learns them when it hashes its document at construction). Large
/// buffers get huge-page advice ([`crate::mem`]). Every byte is written once;
/// nothing is copied.
///
/// `None` when the halves wrote other lengths than `first` and `total - first`
/// (the caller then writes the document on one thread); the writes stay inside
/// the buffer in any case. A thread that cannot be started leaves its half to the
/// calling thread.
pub(crate) fn write_halves<D: TwoHalves>(doc: &D, first: usize, total: usize) -> Option<String> {
    if first > total {
        return None;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(total);
    crate::mem::advise_huge_pages_vec(&mut buf);
    let (x, y) = buf.spare_capacity_mut()[..total].split_at_mut(first);
    let (ok_x, ok_y) = crate::par::join(
        true,
        || {
            let mut out = SliceOut::new(x);
            doc.first(&mut out);
            out.filled()
        },
        || {
            let mut out = SliceOut::new(y);
            doc.second(&mut out);
            out.filled()
        },
    );
    if !(ok_x && ok_y) {
        return None;
    }
    // SAFETY: both halves filled their slices exactly (`filled`), so all `total`
    // bytes are initialized; each is a concatenation of `&str`s meeting at the
    // cut, which is itself a boundary between two `&str`s, so the whole is UTF-8.
    unsafe {
        buf.set_len(total);
        Some(String::from_utf8_unchecked(buf))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_u16_escape<W: JsonOut>(out: &mut W, unit: u32) {
    out.push_str("\\u");
    for shift in [12u32, 8, 4, 0] {
        out.push(HEX[((unit >> shift) & 0xF) as usize] as char);
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Nonzero when some byte of `x` is below `n` (exact as a boolean for `n <= 128`).
#[inline]
fn any_byte_below(x: u64, n: u8) -> u64 {
    x.wrapping_sub(LO * u64::from(n)) & !x & HI
}

/// Nonzero when some byte of `x` equals `b`.
#[inline]
fn any_byte_is(x: u64, b: u8) -> u64 {
    any_byte_below(x ^ (LO * u64::from(b)), 1)
}

/// Whether byte `b` is written as itself in `profile` (no escape).
#[inline]
fn plain(b: u8, profile: Profile) -> bool {
    b >= 0x20 && b != b'"' && b != b'\\' && (profile == Profile::Utf8 || b < 0x7f)
}

/// Whether every byte of `bytes` is written as itself in `profile`: eight bytes
/// at a time (ids and keys are long and almost never need an escape).
fn all_plain(bytes: &[u8], profile: Profile) -> bool {
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let x = u64::from_le_bytes(w.try_into().expect("chunks of eight bytes"));
        let mut bad = any_byte_below(x, 0x20) | any_byte_is(x, b'"') | any_byte_is(x, b'\\');
        if profile == Profile::Ascii {
            bad |= (x & HI) | any_byte_is(x, 0x7f);
        }
        if bad != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&b| plain(b, profile))
}

/// Appends `s` as a JSON string literal in `profile`.
pub fn write_str<W: JsonOut>(out: &mut W, s: &str, profile: Profile) {
    let bytes = s.as_bytes();
    // Fastest path (ids, keys): nothing to escape, one copy.
    if all_plain(bytes, profile) {
        out.reserve(bytes.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    out.push('"');
    // Scan bytes; runs that need no escaping are copied whole.
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if plain(bytes[i], profile) {
            i += 1;
            continue;
        }
        out.push_str(&s[start..i]);
        let ch = s[i..].chars().next().expect("char boundary: escapes start at ASCII or lead bytes");
        let c = ch as u32;
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            _ if c < 0x20 || (profile == Profile::Ascii && c < 0x10000) => push_u16_escape(out, c),
            _ if profile == Profile::Ascii => {
                let v = c - 0x10000;
                push_u16_escape(out, 0xD800 + (v >> 10));
                push_u16_escape(out, 0xDC00 + (v & 0x3FF));
            }
            _ => out.push(ch), // profile U: raw UTF-8 for code points >= U+0080
        }
        i += ch.len_utf8();
        start = i;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Two ASCII digits per value 0..=99.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends a decimal integer.
pub fn write_u64<W: JsonOut>(out: &mut W, v: u64) {
    if v < 10 {
        out.push((b'0' + v as u8) as char);
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = v;
    while n >= 100 {
        let r = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[r..r + 2]);
    }
    if n >= 10 {
        let r = n as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[r..r + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    // SAFETY: `buf[i..]` holds only ASCII digits (from `DIGIT_PAIRS` or `b'0' + n`
    // with `n < 10`), which are valid UTF-8.
    out.push_str(unsafe { std::str::from_utf8_unchecked(&buf[i..]) });
}

/// Appends `[a,b,c]` of integers.
pub fn write_u64_array<W: JsonOut>(out: &mut W, values: &[u64]) {
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_u64(out, *v);
    }
    out.push(']');
}

/// Appends `["a","b"]` of strings.
pub fn write_str_array<W: JsonOut, S: AsRef<str>>(out: &mut W, values: &[S], profile: Profile) {
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(out, v.as_ref(), profile);
    }
    out.push(']');
}

/// Appends an optional integer (`null` when absent).
pub fn write_opt_u64<W: JsonOut>(out: &mut W, v: Option<u64>) {
    match v {
        Some(v) => write_u64(out, v),
        None => out.push_str("null"),
    }
}

/// Writes `"key":` (keys are schema constants: plain ASCII, no escaping needed).
#[inline]
pub fn key<W: JsonOut>(out: &mut W, k: &str) {
    out.push('"');
    out.push_str(k);
    out.push_str("\":");
}

/// A decoded JSON value. Object members keep their document order; keys are unique.
/// Strings and keys borrow from the input when they hold no escapes.
#[derive(Clone, Debug, PartialEq)]
pub enum Value<'a> {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A non-negative integer literal that fits in u64.
    UInt(u64),
    /// A negative integer literal that fits in i64.
    NegInt(i64),
    /// Any other number (fraction, exponent, or an integer beyond 64 bits).
    Float(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// An array.
    Array(Vec<Value<'a>>),
    /// An object, members in document order.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl Value<'_> {
    /// A short name of the JSON type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::UInt(_) | Value::NegInt(_) | Value::Float(_) => "number",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// The visitor that builds [`Value`]s.
pub(crate) struct ValueVisitor;

/// Deserializes a string, borrowing from the input when possible.
pub(crate) struct CowStr;

impl<'de> DeserializeSeed<'de> for CowStr {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_str(CowStrVisitor)
    }
}

struct CowStrVisitor;

impl<'de> Visitor<'de> for CowStrVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value<'de>, E> {
        Ok(Value::UInt(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value<'de>, E> {
        Ok(if v >= 0 { Value::UInt(v as u64) } else { Value::NegInt(v) })
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Float(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Value<'de>, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value<'de>, A::Error> {
        let items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        items_after(&mut seq, items)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value<'de>, A::Error> {
        members_with(&mut map, Vec::new(), |_, _| Ok(false)).map(Value::Object)
    }
}

/// The members of an object, in document order.
pub(crate) type Members<'de> = Vec<(Cow<'de, str>, Value<'de>)>;

/// The error of a key that repeats one of its object (the same in every decoder).
#[cold]
pub(crate) fn duplicate<E: de::Error>(k: &str) -> E {
    E::custom(format!("duplicate JSON field: {k}"))
}

/// Fails when `k` is already among `members` (`seen`: their set, built once an
/// object grows past a linear scan's size).
// `&Cow`, not `&str`: the set keeps a clone of the key, borrowed from the input
// when the key is.
#[allow(clippy::ptr_arg)]
#[inline]
pub(crate) fn check_new_key<'de, E: de::Error>(
    members: &[(Cow<'de, str>, Value<'de>)],
    seen: &mut Option<HashSet<Cow<'de, str>>>,
    k: &Cow<'de, str>,
) -> std::result::Result<(), E> {
    // Small objects (all schema objects) use a linear scan; large ones a set.
    let dup =
        if members.len() < 16 { members.iter().any(|(existing, _)| existing == k) } else { in_set(members, seen, k) };
    if dup {
        return Err(duplicate(k));
    }
    Ok(())
}

/// Whether `k` is in the set of `members`' keys (`seen`, built at the first call),
/// which then holds it.
#[allow(clippy::ptr_arg)]
#[inline(never)]
fn in_set<'de>(
    members: &[(Cow<'de, str>, Value<'de>)],
    seen: &mut Option<HashSet<Cow<'de, str>>>,
    k: &Cow<'de, str>,
) -> bool {
    let set = seen.get_or_insert_with(|| members.iter().map(|(k, _)| k.clone()).collect());
    !set.insert(k.clone())
}

/// Reads the rest of an object after `members` (a repeated key fails as in
/// [`Value`]'s decoder). For each new key `take` may read the value itself
/// (returning true), which is then kept as a `null` placeholder; other values are
/// read as [`Value`]s.
#[inline]
pub(crate) fn members_with<'de, A: MapAccess<'de>>(
    map: &mut A,
    mut members: Members<'de>,
    mut take: impl FnMut(&str, &mut A) -> std::result::Result<bool, A::Error>,
) -> std::result::Result<Members<'de>, A::Error> {
    let mut seen: Option<HashSet<Cow<'de, str>>> = None;
    while let Some(k) = map.next_key_seed(CowStr)? {
        check_new_key(&members, &mut seen, &k)?;
        let v = if take(&k, map)? { Value::Null } else { map.next_value::<Value<'de>>()? };
        members.push((k, v));
    }
    Ok(members)
}

/// Reads the rest of an array after `items`, as [`Value`]s.
pub(crate) fn items_after<'de, A: SeqAccess<'de>>(
    seq: &mut A,
    mut items: Vec<Value<'de>>,
) -> std::result::Result<Value<'de>, A::Error> {
    while let Some(v) = seq.next_element::<Value<'de>>()? {
        items.push(v);
    }
    Ok(Value::Array(items))
}

impl<'de> Deserialize<'de> for Value<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Value<'de>, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// Finds a bare `NaN`, `Infinity` or `-Infinity` literal outside strings.
fn find_non_finite(text: &str) -> Option<&'static str> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
        } else if c == b'"' {
            in_str = true;
        } else if b[i..].starts_with(b"NaN") {
            return Some("NaN");
        } else if b[i..].starts_with(b"-Infinity") {
            return Some("-Infinity");
        } else if b[i..].starts_with(b"Infinity") {
            return Some("Infinity");
        }
        i += 1;
    }
    None
}

/// Parses `bytes` strictly as one JSON document (UTF-8, an optional leading BOM).
///
/// Errors (all [`crate::ErrorKind::InvalidArgument`]):
/// `non-finite JSON number is unsupported: <literal>`, `duplicate JSON field: <key>`,
/// `<label> is not valid JSON`.
pub fn parse_bytes<'a>(bytes: &'a [u8], label: &str) -> Result<Value<'a>> {
    parse_text(text_of(bytes, label)?, label)
}

/// The text of a document given as bytes: an optional leading BOM, then UTF-8
/// (`<label> is not valid JSON: input is not UTF-8`).
pub(crate) fn text_of<'a>(bytes: &'a [u8], label: &str) -> Result<&'a str> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    std::str::from_utf8(bytes).map_err(|_| Error::invalid(format!("{label} is not valid JSON: input is not UTF-8")))
}

/// Parses `text` strictly (a leading BOM is an error for text input, as in the
/// reference). Same errors as [`parse_bytes`].
pub fn parse_text<'a>(text: &'a str, label: &str) -> Result<Value<'a>> {
    parse_text_with(text, label, std::marker::PhantomData::<Value<'a>>)
}

/// Parses `text` as one document read by `seed`, with [`parse_text`]'s rules and
/// errors: `seed` reads values as [`Value`]'s visitor would (every JSON type
/// accepted at every place, a repeated key failing with [`duplicate`]), so the
/// only errors it meets are those of the text itself.
pub(crate) fn parse_text_with<'a, S: DeserializeSeed<'a>>(text: &'a str, label: &str, seed: S) -> Result<S::Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = seed.deserialize(&mut de).and_then(|v| de.end().map(|_| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => {
            let msg = e.to_string();
            if let Some(lit) = find_non_finite(text) {
                return Err(Error::invalid(format!("non-finite JSON number is unsupported: {lit}")));
            }
            if msg.starts_with("duplicate JSON field: ") {
                let field = msg.trim_start_matches("duplicate JSON field: ").split(" at line ").next().unwrap_or("");
                return Err(Error::invalid(format!("duplicate JSON field: {field}")));
            }
            Err(Error::invalid(format!("{label} is not valid JSON: {msg}")))
        }
    }
}

/// A parsed [`Value`] as a serde deserializer, so that a decoder written as serde
/// visitors reads a tree exactly as it reads text (strings the tree borrows stay
/// borrowed).
pub(crate) struct ValueDe<'a, 'de>(pub(crate) &'a Value<'de>);

impl<'a, 'de> Deserializer<'de> for ValueDe<'a, 'de> {
    type Error = de::value::Error;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> std::result::Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::UInt(n) => visitor.visit_u64(*n),
            Value::NegInt(n) => visitor.visit_i64(*n),
            Value::Float(f) => visitor.visit_f64(*f),
            Value::Str(Cow::Borrowed(s)) => visitor.visit_borrowed_str(s),
            Value::Str(Cow::Owned(s)) => visitor.visit_str(s),
            Value::Array(items) => visitor.visit_seq(SeqDe(items.iter())),
            Value::Object(members) => visitor.visit_map(MapDe(members.iter(), None)),
        }
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

struct SeqDe<'a, 'de>(std::slice::Iter<'a, Value<'de>>);

impl<'a, 'de> SeqAccess<'de> for SeqDe<'a, 'de> {
    type Error = de::value::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> std::result::Result<Option<T::Value>, Self::Error> {
        self.0.next().map(|v| seed.deserialize(ValueDe(v))).transpose()
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct MapDe<'a, 'de>(std::slice::Iter<'a, (Cow<'de, str>, Value<'de>)>, Option<&'a Value<'de>>);

impl<'a, 'de> MapAccess<'de> for MapDe<'a, 'de> {
    type Error = de::value::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, Self::Error> {
        let Some((k, v)) = self.0.next() else { return Ok(None) };
        self.1 = Some(v);
        match k {
            Cow::Borrowed(s) => seed.deserialize(de::value::BorrowedStrDeserializer::new(s)),
            Cow::Owned(s) => seed.deserialize(de::value::StrDeserializer::new(s.as_str())),
        }
        .map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> std::result::Result<V::Value, Self::Error> {
        seed.deserialize(ValueDe(self.1.take().expect("a value follows its key")))
    }
}

/// Reads the parsed `v` with `seed` (see [`ValueDe`]). The only error of the tree
/// itself: a repeated key in an object (which [`parse_text`] never builds).
pub(crate) fn decode_value<'de, S: DeserializeSeed<'de>>(v: &Value<'de>, seed: S) -> Result<S::Value> {
    seed.deserialize(ValueDe(v)).map_err(|e| Error::invalid(e.to_string()))
}

/// Strict reader of one JSON object with an exact key set.
pub struct Obj<'a, 'v> {
    members: &'a [(Cow<'v, str>, Value<'v>)],
}

impl<'a, 'v> Obj<'a, 'v> {
    /// Views `v` as an object, else fails with `err`.
    pub fn new(v: &'a Value<'v>, err: impl FnOnce() -> String) -> Result<Self> {
        match v {
            Value::Object(m) => Ok(Obj { members: m }),
            _ => Err(Error::invalid(err())),
        }
    }

    /// True when the key set is exactly `keys` (no order requirement).
    pub fn has_exact_keys(&self, keys: &[&str]) -> bool {
        self.members.len() == keys.len() && self.members.iter().all(|(k, _)| keys.contains(&k.as_ref()))
    }

    /// Fails with `err` unless the key set is exactly `keys`.
    pub fn expect_keys(&self, keys: &[&str], err: impl FnOnce() -> String) -> Result<()> {
        if self.has_exact_keys(keys) {
            Ok(())
        } else {
            Err(Error::invalid(err()))
        }
    }

    /// True when `k` is present.
    pub fn contains(&self, k: &str) -> bool {
        self.members.iter().any(|(key, _)| key == k)
    }

    /// The member `k` (callers check the key set first).
    pub fn get(&self, k: &str) -> &'a Value<'v> {
        static NULL: Value<'static> = Value::Null;
        self.members.iter().find(|(key, _)| key == k).map(|(_, v)| v).unwrap_or(&NULL)
    }
}

/// Reads a non-empty string: `<field> must be a non-empty string`.
///
/// `field` is only formatted when the value is rejected, so a caller may pass a
/// lazily built label (`format_args!`) at no cost on the success path.
pub fn req_str(v: &Value, field: impl fmt::Display) -> Result<String> {
    req_cow(v, field).map(|s| s.to_string())
}

/// [`req_str`], the string as it is held.
pub(crate) fn req_cow<'a, 'v>(v: &'a Value<'v>, field: impl fmt::Display) -> Result<&'a Cow<'v, str>> {
    match v {
        Value::Str(s) if !s.is_empty() => Ok(s),
        _ => Err(Error::invalid(format!("{field} must be a non-empty string"))),
    }
}

/// Reads an integer >= `min` that fits in u64: `<field> must be an integer`,
/// `<field> must be at least <min>`, `<field> must fit in an unsigned 64-bit integer`.
#[inline]
pub fn req_int(v: &Value, field: impl fmt::Display, min: u64) -> Result<u64> {
    match v {
        Value::UInt(n) if *n >= min => Ok(*n),
        Value::UInt(_) | Value::NegInt(_) => Err(Error::invalid(format!("{field} must be at least {min}"))),
        // Integers beyond 64 bits arrive from serde_json as floats (so does `1e20`).
        Value::Float(f) if f.fract() == 0.0 && *f >= 18446744073709551616.0 => {
            Err(Error::invalid(format!("{field} must be an integer that fits in an unsigned 64-bit integer")))
        }
        _ => Err(Error::invalid(format!("{field} must be an integer"))),
    }
}

/// Reads `null` or an integer >= `min`.
pub fn opt_int(v: &Value, field: impl fmt::Display, min: u64) -> Result<Option<u64>> {
    match v {
        Value::Null => Ok(None),
        other => req_int(other, field, min).map(Some),
    }
}

/// Reads an array, else `<err>`.
pub fn req_array<'a, 'v>(v: &'a Value<'v>, err: impl FnOnce() -> String) -> Result<&'a [Value<'v>]> {
    match v {
        Value::Array(items) => Ok(items),
        _ => Err(Error::invalid(err())),
    }
}

/// Reads an array of integers >= `min`: `<field> must be a sequence` when not an
/// array; element errors as [`req_int`].
#[inline]
pub fn req_int_array(v: &Value, field: impl fmt::Display, min: u64) -> Result<Vec<u64>> {
    let items = req_array(v, || format!("{field} must be a sequence"))?;
    items.iter().map(|x| req_int(x, &field, min)).collect()
}

/// Writes `"k":"v"` (UTF-8 profile) for the transport encoders.
pub(crate) fn write_kv_str(out: &mut String, k: &str, v: &str) {
    key(out, k);
    write_str(out, v, Profile::Utf8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writing in place gives the `String` encoder's bytes, escapes and multi-byte
    /// characters included; a slice that is too short or too long is reported,
    /// never overrun.
    #[test]
    fn in_place_writes_are_the_string_bytes_and_never_overrun() {
        let samples = ["", "plain/id-0", "q\"b\\s", "tab\tnl\n\u{1}", "é/ü", "emoji \u{1F600}", "\u{7f}\u{80}\u{ffff}"];
        for profile in [Profile::Ascii, Profile::Utf8] {
            for s in samples {
                let mut text = String::new();
                write_str(&mut text, s, profile);
                write_u64_array(&mut text, &[0, 9, 10, 99, 100, u64::MAX]);
                for room in [text.len(), text.len() - 1, text.len() + 1] {
                    let mut buf = vec![std::mem::MaybeUninit::new(0xAAu8); room + 4];
                    let mut out = SliceOut::new(&mut buf[..room]);
                    write_str(&mut out, s, profile);
                    write_u64_array(&mut out, &[0, 9, 10, 99, 100, u64::MAX]);
                    assert_eq!(out.filled(), room == text.len(), "{s:?} {profile:?} room {room}");
                    let written = out.len;
                    // SAFETY: every byte was initialized above.
                    let bytes: Vec<u8> = buf.iter().map(|b| unsafe { b.assume_init() }).collect();
                    assert_eq!(&bytes[..written], &text.as_bytes()[..written]);
                    assert!(bytes[room..].iter().all(|&b| b == 0xAA), "wrote past the slice");
                }
            }
        }
    }

    #[test]
    fn the_word_at_a_time_scan_agrees_with_the_byte_rule_at_every_position() {
        for profile in [Profile::Ascii, Profile::Utf8] {
            for b in 0..=255u8 {
                for len in 1..=19 {
                    for pos in 0..len {
                        let mut bytes = vec![b'a'; len];
                        bytes[pos] = b;
                        let want = bytes.iter().all(|&c| plain(c, profile));
                        assert_eq!(all_plain(&bytes, profile), want, "{profile:?} byte {b:#x} at {pos} of {len}");
                    }
                }
            }
        }
        assert!(!plain(0x7f, Profile::Ascii) && plain(0x7f, Profile::Utf8));
        assert!(!plain(0x1f, Profile::Utf8) && plain(0x20, Profile::Utf8) && plain(0xc3, Profile::Utf8));
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for v in [0u64, 9, 10, 99, 100, 101, 999, 1000, 12345, 1 << 32, 10u64.pow(19), u64::MAX] {
            let mut o = String::new();
            write_u64(&mut o, v);
            assert_eq!(o, v.to_string());
        }
    }

    fn a(s: &str) -> String {
        let mut o = String::new();
        write_str(&mut o, s, Profile::Ascii);
        o
    }
    fn u(s: &str) -> String {
        let mut o = String::new();
        write_str(&mut o, s, Profile::Utf8);
        o
    }

    #[test]
    fn escapes_match_python_json_dumps() {
        assert_eq!(a("é"), "\"\\u00e9\"");
        assert_eq!(a("\u{7f}"), "\"\\u007f\"");
        assert_eq!(u("\u{7f}"), "\"\u{7f}\"");
        assert_eq!(a("😀"), "\"\\ud83d\\ude00\"");
        assert_eq!(u("😀"), "\"😀\"");
        assert_eq!(a("\u{2028}"), "\"\\u2028\"");
        assert_eq!(u("\u{1f}\n\t\"\\/"), "\"\\u001f\\n\\t\\\"\\\\/\"");
        assert_eq!(a("\u{8}\u{c}\r"), "\"\\b\\f\\r\"");
    }

    #[test]
    fn decoder_is_strict() {
        assert!(parse_text("{\"a\":1,\"a\":2}", "x").unwrap_err().message().contains("duplicate JSON field: a"));
        assert!(parse_text("{\"b\":[{\"c\":1,\"c\":1}]}", "x")
            .unwrap_err()
            .message()
            .contains("duplicate JSON field: c"));
        assert!(parse_text("{\"a\":NaN}", "x").unwrap_err().message().contains("non-finite"));
        assert!(parse_text("[-Infinity]", "x").unwrap_err().message().contains("non-finite"));
        assert!(parse_text("{\"a\":\"NaN\"} x", "x").unwrap_err().message().contains("not valid JSON"));
        assert_eq!(parse_text("8.0", "x").unwrap(), Value::Float(8.0));
        assert_eq!(parse_text("18446744073709551615", "x").unwrap(), Value::UInt(u64::MAX));
        assert!(matches!(parse_text("18446744073709551616", "x").unwrap(), Value::Float(_)));
        assert!(parse_bytes(b"\xEF\xBB\xBF{}", "x").is_ok());
        assert!(parse_text("\u{feff}{}", "x").is_err());
        assert!(req_int(&Value::Bool(true), "f", 0).unwrap_err().message().contains("integer"));
        assert!(req_int(&Value::Float(8.0), "f", 0).unwrap_err().message().contains("integer"));
    }
}
