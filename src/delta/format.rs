//! The byte format of one encoding (`docs/DELTA.md`): the fixed header, and the
//! LEB128 varints of the sparse body's run headers. Shared by the encoder and the
//! decoder; nothing here touches region bytes.

use crate::error::{Error, Result};

/// The first four bytes of every encoding.
pub const MAGIC: [u8; 4] = *b"MWSD";

/// The format version this build writes and the only one it reads. A change of the
/// byte format takes a new number; an older reader refuses the new encodings.
pub const VERSION: u8 = 1;

/// Bytes of the fixed header that starts every encoding.
pub const HEADER_LEN: usize = 24;

/// The element sizes the codec accepts, in bytes.
pub const ELEMENT_SIZES: [usize; 5] = [1, 2, 4, 8, 16];

/// How the body of an encoding carries the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Runs of changed elements: each a gap of unchanged elements, a count and that
    /// many new values. A region without changes is a sparse encoding of no runs.
    Sparse,
    /// The region's new bytes, whole (the sparse body would have exceeded the
    /// encoder's threshold).
    Whole,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Sparse => 0,
            Kind::Whole => 1,
        }
    }
}

/// The header of one encoding, decoded and checked: what the region is and how
/// long the encoding is. Plain data (`Copy`, `Send`, `Sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Bytes of one element (one of [`ELEMENT_SIZES`]).
    pub element_size: usize,
    /// Sparse runs or the whole region.
    pub kind: Kind,
    /// Bytes of the region the encoding is of (a multiple of `element_size`).
    pub region_len: u64,
    /// Bytes of the body that follows the header (`region_len` for [`Kind::Whole`]).
    pub body_len: u64,
}

impl Header {
    /// Decodes and checks the header at the start of `encoded` (which may be longer
    /// than one encoding: [`Header::encoded_len`] says where the next one starts).
    ///
    /// Errors ([`crate::ErrorKind::InvalidArgument`]): fewer than [`HEADER_LEN`]
    /// bytes, a wrong magic, another version, an element size outside
    /// [`ELEMENT_SIZES`], an unknown kind, a reserved byte not 0, a region length
    /// that is not a multiple of the element size, a whole body whose length is not
    /// the region's. Whether `encoded` holds the whole body is not checked here.
    /// Pure; borrows `encoded` for the call only.
    pub fn read(encoded: &[u8]) -> Result<Header> {
        let Some(h) = encoded.first_chunk::<HEADER_LEN>() else {
            return Err(Error::invalid(format!(
                "delta encoding: {} bytes, shorter than its {HEADER_LEN}-byte header",
                encoded.len()
            )));
        };
        if h[..4] != MAGIC {
            return Err(Error::invalid(format!("delta encoding: bad magic {:02x?} (expected {MAGIC:02x?})", &h[..4])));
        }
        if h[4] != VERSION {
            return Err(Error::invalid(format!(
                "delta encoding: format version {} is not supported (this build reads version {VERSION})",
                h[4]
            )));
        }
        let element_size = h[5] as usize;
        check_element_size(element_size).map_err(|e| e.context("delta encoding: "))?;
        let kind = match h[6] {
            0 => Kind::Sparse,
            1 => Kind::Whole,
            k => return Err(Error::invalid(format!("delta encoding: unknown kind {k} (0 sparse, 1 whole)"))),
        };
        if h[7] != 0 {
            return Err(Error::invalid(format!("delta encoding: reserved header byte 7 is {}, not 0", h[7])));
        }
        let region_len = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let body_len = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        if !region_len.is_multiple_of(element_size as u64) {
            return Err(Error::invalid(format!(
                "delta encoding: region length {region_len} is not a multiple of the element size {element_size}"
            )));
        }
        if kind == Kind::Whole && body_len != region_len {
            return Err(Error::invalid(format!(
                "delta encoding: a whole encoding of a {region_len}-byte region has a {body_len}-byte body"
            )));
        }
        Ok(Header { element_size, kind, region_len, body_len })
    }

    /// Bytes of the whole encoding, header included: where the next encoding of a
    /// concatenation starts. `None` when that does not fit in a `u64` (a hostile
    /// header).
    pub fn encoded_len(&self) -> Option<u64> {
        self.body_len.checked_add(HEADER_LEN as u64)
    }

    /// Appends the header's bytes to `out`.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, self.element_size as u8, self.kind.byte(), 0]);
        out.extend_from_slice(&self.region_len.to_le_bytes());
        out.extend_from_slice(&self.body_len.to_le_bytes());
    }
}

/// Offset of the body length in the header (the encoder writes it last).
pub(crate) const BODY_LEN_AT: usize = 16;

/// `Ok` for an element size of [`ELEMENT_SIZES`], else an `InvalidArgument` error.
pub(crate) fn check_element_size(element_size: usize) -> Result<()> {
    if ELEMENT_SIZES.contains(&element_size) {
        Ok(())
    } else {
        Err(Error::invalid(format!("element size {element_size} is not one of {ELEMENT_SIZES:?}")))
    }
}

/// Most bytes of one varint (a `u64`).
pub(crate) const MAX_VARINT: usize = 10;

/// Writes `v` at the start of `out` as an unsigned LEB128 varint (7 bits a byte, low
/// bits first, the high bit set on every byte but the last; 1 byte below 128) and
/// returns its length. Panics when `out` is shorter than that ([`MAX_VARINT`] is
/// always enough).
#[inline]
pub(crate) fn put_varint(out: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    while v >= 0x80 {
        out[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    out[n] = v as u8;
    n + 1
}

/// Reads the varint at `body[*at..]` and moves `*at` past it. Refused (the message
/// names `what` and the byte offset `base + *at` in the encoding): the body ends
/// inside it, it has more than 10 bytes or a value past `u64::MAX`, or it is longer
/// than needed (a last byte of 0 after the first: every value has one spelling).
#[inline(always)]
pub(crate) fn read_varint(body: &[u8], at: &mut usize, base: usize, what: &str) -> Result<u64> {
    match body.get(*at) {
        Some(&b) if b < 0x80 => {
            *at += 1;
            Ok(b as u64)
        }
        _ => read_varint_slow(body, at, base, what),
    }
}

#[cold]
#[inline(never)]
fn read_varint_slow(body: &[u8], at: &mut usize, base: usize, what: &str) -> Result<u64> {
    let start = *at;
    let mut v = 0u64;
    for k in 0..10 {
        let Some(&b) = body.get(start + k) else {
            return Err(Error::invalid(format!(
                "delta encoding: truncated {what} at byte {} (the body ends inside it)",
                base + start
            )));
        };
        let bits = (b & 0x7f) as u64;
        if k == 9 && b > 1 {
            return Err(Error::invalid(format!("delta encoding: {what} at byte {} overflows 64 bits", base + start)));
        }
        v |= bits << (7 * k);
        if b < 0x80 {
            if k > 0 && b == 0 {
                return Err(Error::invalid(format!(
                    "delta encoding: {what} at byte {} is not minimally encoded",
                    base + start
                )));
            }
            *at = start + k + 1;
            return Ok(v);
        }
    }
    Err(Error::invalid(format!("delta encoding: {what} at byte {} is longer than 10 bytes", base + start)))
}
