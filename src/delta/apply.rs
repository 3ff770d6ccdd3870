//! The decoder: checks a whole encoding against the target, then writes it. Every
//! run header is decoded and bounds-checked once before the first byte of the
//! target is written, then decoded again to write, with the target's lines
//! prefetched ahead of the runs on x86-64 (the body is a few percent of the region
//! at the densities it is made for, so the first pass costs less than the
//! scattered writes of the second).

use super::format::{read_varint, Header, Kind, HEADER_LEN};
use crate::error::{Error, Result};

/// What one [`apply`] wrote. Plain data (`Copy`, `Send`, `Sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Runs of the sparse body (0 for a whole encoding).
    pub runs: usize,
    /// Elements written: every element of the runs (the encoder's runs of 1-byte
    /// elements may carry an unchanged element between two changed ones), or every
    /// element of the region for a whole encoding.
    pub elements_written: usize,
    /// Bytes of `target` written (`elements_written` times the element size).
    pub bytes_written: usize,
    /// True for a whole encoding.
    pub whole: bool,
}

/// Applies one encoding made by [`super::encode`] to `target`, which must hold the
/// base it was encoded against: afterwards `target` holds the encoder's `new`.
/// Applied to any other content, the changed elements are written all the same and
/// the rest is left as it was, so the result is not `new` (a content checksum of the
/// result tells). The source side applies the same encoding to its own copy of the
/// base, once the target has accepted it, to move that base forward (`base := new`).
///
/// `encoded` must be exactly one encoding: a concatenation is split first with
/// [`super::Header::read`] and [`super::Header::encoded_len`].
///
/// Ownership: borrows `encoded` for the call and writes only inside `target`, which
/// it borrows mutably for the call. Errors ([`crate::ErrorKind::InvalidArgument`]):
/// every way `encoded` can be malformed (the header's, see [`super::Header::read`];
/// `element_size` or `target.len()` other than the header's; a body shorter or
/// longer than the header says; a truncated, overlong or overflowing varint; a run
/// of 0 elements; a run that ends past the region; values missing at the end; the
/// errors of the body name their byte offset in `encoded`). The whole encoding is
/// checked before the first write: on any error `target` is untouched. Never panics
/// on any input. Thread safety: pure; distinct targets may be written at once from
/// one `encoded`.
pub fn apply(encoded: &[u8], target: &mut [u8], element_size: usize) -> Result<ApplyStats> {
    let header = Header::read(encoded)?;
    if header.element_size != element_size {
        return Err(Error::invalid(format!(
            "delta encoding: element size {} where the region's is {element_size}",
            header.element_size
        )));
    }
    if header.region_len != target.len() as u64 {
        return Err(Error::invalid(format!(
            "delta encoding: of a {}-byte region, applied to a {}-byte target",
            header.region_len,
            target.len()
        )));
    }
    let body = &encoded[HEADER_LEN..];
    if header.body_len != body.len() as u64 {
        return Err(Error::invalid(format!(
            "delta encoding: the header announces a {}-byte body and {} bytes follow it",
            header.body_len,
            body.len()
        )));
    }
    if header.kind == Kind::Whole {
        // Header::read checked body_len == region_len.
        target.copy_from_slice(body);
        return Ok(ApplyStats {
            runs: 0,
            elements_written: target.len() / element_size,
            bytes_written: target.len(),
            whole: true,
        });
    }
    let (runs, elements) = match element_size {
        1 => apply_es::<1>(body, target)?,
        2 => apply_es::<2>(body, target)?,
        4 => apply_es::<4>(body, target)?,
        8 => apply_es::<8>(body, target)?,
        _ => apply_es::<16>(body, target)?,
    };
    Ok(ApplyStats { runs, elements_written: elements, bytes_written: elements * element_size, whole: false })
}

/// Checks every run of the sparse `body` against `target`'s `ES`-byte elements, then
/// writes them. Returns (runs, elements written).
fn apply_es<const ES: usize>(body: &[u8], target: &mut [u8]) -> Result<(usize, usize)> {
    let checked = walk::<ES>(body, target.len() / ES, |_, _| ())?;
    let written = write::<ES>(body, target)?;
    debug_assert_eq!(checked, written);
    Ok(written)
}

/// The write pass: [`write_with`], with prefetches of the target on x86-64.
#[inline(always)]
fn write<const ES: usize>(body: &[u8], target: &mut [u8]) -> Result<(usize, usize)> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        // SAFETY: `write_sse2` needs only SSE2, which this build enables (the cfg
        // above; SSE2 is part of the x86-64 baseline, every x86-64 CPU has it).
        unsafe { write_sse2::<ES>(body, target) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        write_with::<ES>(body, target, |_| ())
    }
}

/// How far ahead of the run being written the target's lines are requested
/// (x86-64): the runs land in increasing order, most lines of the target are
/// written at a few percent of changed elements, and the line must be read before
/// it is written.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
const PREFETCH: usize = 4096;

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn write_sse2<const ES: usize>(body: &[u8], target: &mut [u8]) -> Result<(usize, usize)> {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let t = target.as_ptr();
    // A prefetch never faults: addresses past the end are harmless.
    write_with::<ES>(body, target, |at| _mm_prefetch::<_MM_HINT_T0>(t.wrapping_add(at + PREFETCH).cast()))
}

/// Writes every run of the checked `body` into `target`, calling `prefetch(at)`
/// before the write at byte `at`.
#[inline(always)]
fn write_with<const ES: usize>(body: &[u8], target: &mut [u8], prefetch: impl Fn(usize)) -> Result<(usize, usize)> {
    walk::<ES>(body, target.len() / ES, |first, values| {
        let at = first * ES;
        prefetch(at);
        if values.len() == ES {
            // One element: a fixed-size copy, not a call to memcpy.
            let v: &[u8; ES] = values.try_into().expect("ES bytes");
            target[at..at + ES].copy_from_slice(v);
        } else {
            target[at..at + values.len()].copy_from_slice(values);
        }
    })
}

/// Decodes the runs of `body` in a region of `elements` elements of `ES` bytes,
/// calling `f(first element, values)` for each after its checks (in the region,
/// values present). Returns (runs, elements), or the first malformed run's error.
#[inline(always)]
fn walk<const ES: usize>(body: &[u8], elements: usize, mut f: impl FnMut(usize, &[u8])) -> Result<(usize, usize)> {
    let (mut at, mut cursor, mut runs, mut written) = (0usize, 0usize, 0usize, 0usize);
    while at < body.len() {
        let run_at = at;
        let gap = read_varint(body, &mut at, HEADER_LEN, "run gap")?;
        let len = read_varint(body, &mut at, HEADER_LEN, "run length")?;
        if len == 0 {
            return Err(Error::invalid(format!("delta encoding: run of 0 elements at byte {}", HEADER_LEN + run_at)));
        }
        // cursor <= elements, and elements * ES fits a usize (the target's length).
        let left = (elements - cursor) as u64;
        if gap > left || len > left - gap {
            return Err(Error::invalid(format!(
                "delta encoding: the run at byte {} (gap {gap}, {len} elements after element {cursor}) ends past \
                 the region's {elements} elements",
                HEADER_LEN + run_at
            )));
        }
        let (start, len) = (cursor + gap as usize, len as usize);
        let bytes = len * ES;
        if body.len() - at < bytes {
            return Err(Error::invalid(format!(
                "delta encoding: the run at byte {} needs {bytes} bytes of values and {} remain",
                HEADER_LEN + run_at,
                body.len() - at
            )));
        }
        f(start, &body[at..at + bytes]);
        at += bytes;
        cursor = start + len;
        runs += 1;
        written += len;
    }
    Ok((runs, written))
}
