//! The encoder, one pass over the region in chunks of [`CHUNK`] bytes, two steps per
//! chunk:
//!
//! 1. compare: each 64-byte block of `base` and `new` gives a mask of the bytes that
//!    differ (SSE2 compares on x86-64, `u64` words elsewhere), folded to one bit per
//!    element; the set bits become the chunk's list of changed element indices. The
//!    first two (four for byte elements) are extracted without a branch, so an equal
//!    block and a block with one or two changes cost the same; lines [`PREFETCH`]
//!    bytes ahead are requested as the blocks go (x86-64).
//! 2. write: the chunk's changed elements become runs (`docs/DELTA.md`), with one
//!    look at the next index to tell an isolated change (the common case, written
//!    without a call) from the start of a longer run. A run that reaches the chunk's
//!    end stays open until the next chunk says whether it goes on, so the output does
//!    not depend on the chunking.
//!
//! Separating the two keeps the branches of step 2, whose outcome depends on the
//! data, away from the memory stream of step 1. When the sparse body outgrows the
//! threshold the encoder stops writing runs, writes the region whole and only counts
//! the remaining changes.

use super::format::{check_element_size, put_varint, Header, Kind, BODY_LEN_AT, HEADER_LEN, MAX_VARINT};
use crate::error::{Error, Result};

/// Bytes compared per block: one cache line, one mask.
const BLOCK: usize = 64;

/// Bytes per chunk: step 1 collects a chunk's changed elements, step 2 writes them
/// (at 3% density of bf16, about 15 of them).
const CHUNK: usize = 1024;

/// How far ahead of the compared block the scan requests lines (x86-64): measured
/// best among 1-16 KiB on the benchmark machine (`docs/DELTA.md`).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
const PREFETCH: usize = 2048;

/// Options of [`encode_with`]. Plain data (`Copy`, `Send`, `Sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The region is sent whole when the sparse body would be larger than this
    /// percentage of the region's bytes (0 to 100; default 50). At 0 any change
    /// sends the region whole; at 100 only a sparse body larger than the region
    /// does.
    pub whole_above_percent: u8,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions { whole_above_percent: 50 }
    }
}

/// What one [`encode`] did. Plain data (`Copy`, `Send`, `Sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeStats {
    /// Elements of `new` that differ from `base` (whatever the kind written).
    pub changed_elements: usize,
    /// Runs in the sparse body (0 when `whole`).
    pub runs: usize,
    /// Bytes appended to `out`, header included.
    pub encoded_bytes: usize,
    /// True when the region was written whole ([`super::Kind::Whole`]).
    pub whole: bool,
}

/// [`encode_with`] under the default options (whole above 50% of the region).
///
/// Ownership: borrows `base` and `new` for the call; appends to `out`, whose earlier
/// contents are kept (reuse one `out`, cleared, across steps to keep its capacity).
/// Errors: see [`encode_with`]. Thread safety: pure; any number of calls may run at
/// once on shared `base` / `new`.
pub fn encode(base: &[u8], new: &[u8], element_size: usize, out: &mut Vec<u8>) -> Result<EncodeStats> {
    encode_with(base, new, element_size, EncodeOptions::default(), out)
}

/// Appends to `out` one encoding of `new` relative to `base` (what the target holds):
/// the header (element size, region length), then the runs of changed elements, or
/// `new` whole when the runs would take more than `options.whole_above_percent` of
/// the region's bytes. The output depends only on the arguments (deterministic, the
/// same on every machine). [`super::apply`] of it on a copy of `base` gives `new`.
///
/// Ownership: borrows `base` and `new` for the call; appends to `out` and keeps what
/// it held before. Errors ([`crate::ErrorKind::InvalidArgument`], nothing appended):
/// `base` and `new` of different lengths, an element size outside
/// [`super::ELEMENT_SIZES`], a length that is not a multiple of the element size (a
/// region is whole elements), `whole_above_percent` above 100. Thread safety: pure;
/// any number of calls may run at once on shared `base` / `new`.
pub fn encode_with(
    base: &[u8],
    new: &[u8],
    element_size: usize,
    options: EncodeOptions,
    out: &mut Vec<u8>,
) -> Result<EncodeStats> {
    if base.len() != new.len() {
        return Err(Error::invalid(format!(
            "delta encode: the base has {} bytes and the new region {}",
            base.len(),
            new.len()
        )));
    }
    check_element_size(element_size).map_err(|e| e.context("delta encode: "))?;
    if !new.len().is_multiple_of(element_size) {
        return Err(Error::invalid(format!(
            "delta encode: region length {} is not a multiple of the element size {element_size}",
            new.len()
        )));
    }
    if options.whole_above_percent > 100 {
        return Err(Error::invalid(format!(
            "delta encode: whole_above_percent is {}, at most 100",
            options.whole_above_percent
        )));
    }
    let start = out.len();
    let header = Header { element_size, kind: Kind::Sparse, region_len: new.len() as u64, body_len: 0 };
    header.write(out);
    // At most 100% of the region: no overflow for any slice length.
    let limit = (new.len() as u128 * options.whole_above_percent as u128 / 100) as usize;
    let stats = match element_size {
        1 => encode_es::<1>(base, new, limit, out, scan),
        2 => encode_es::<2>(base, new, limit, out, scan),
        4 => encode_es::<4>(base, new, limit, out, scan),
        8 => encode_es::<8>(base, new, limit, out, scan),
        _ => encode_es::<16>(base, new, limit, out, scan),
    };
    if stats.whole {
        out[start + 6] = 1; // the kind byte: Kind::Whole
    }
    let body_len = (out.len() - start - HEADER_LEN) as u64;
    out[start + BODY_LEN_AT..start + HEADER_LEN].copy_from_slice(&body_len.to_le_bytes());
    Ok(EncodeStats { encoded_bytes: out.len() - start, ..stats })
}

/// A scan of the region (the module docs' two steps): [`scan`], or in tests the
/// portable one.
type Scan<const ES: usize> = fn(&[u8], &[u8], &mut Runs<'_, ES>) -> std::result::Result<(), Stop>;

/// The body of the encoding of `new` against `base` in `ES`-byte elements, appended
/// to `out` (which ends with the header): runs, or the whole region once the runs
/// exceed `limit` bytes. `encoded_bytes` is left to the caller.
fn encode_es<const ES: usize>(base: &[u8], new: &[u8], limit: usize, out: &mut Vec<u8>, scan: Scan<ES>) -> EncodeStats {
    let body_start = out.len();
    let mut runs = Runs::<ES> {
        new,
        w: body_start,
        out,
        body_start,
        limit,
        cursor: 0,
        open_start: 0,
        open_len: 0,
        changed: 0,
        runs: 0,
    };
    let stopped = scan(base, new, &mut runs).and_then(|()| runs.finish());
    let (changed, runs_written) = (runs.changed, runs.runs);
    match stopped {
        Ok(()) => EncodeStats { changed_elements: changed, runs: runs_written, encoded_bytes: 0, whole: false },
        Err(Stop { from }) => {
            // Elements before `from` are counted; count the rest, and send the region whole.
            let rest = count_changed::<ES>(&base[from * ES..], &new[from * ES..]);
            out.truncate(body_start);
            out.extend_from_slice(new);
            EncodeStats { changed_elements: changed + rest, runs: 0, encoded_bytes: 0, whole: true }
        }
    }
}

/// The encoder stopped writing runs: the body is over its limit. Changed elements
/// before element `from` are counted.
struct Stop {
    from: usize,
}

/// Runs the chunked scan of the module docs over the whole region, handing each
/// chunk's changed elements to `runs`.
fn scan<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        // SAFETY: `scan_sse2` needs only SSE2, which this build enables (the cfg
        // above; SSE2 is part of the x86-64 baseline, every x86-64 CPU has it).
        unsafe { scan_sse2(base, new, runs) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        scan_with(base, new, runs, ne_bytes_words, |_| ())
    }
}

/// [`scan_with`] on SSE2 compares, with prefetches.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn scan_sse2<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (b, n) = (base.as_ptr(), new.as_ptr());
    scan_with(
        base,
        new,
        runs,
        |x, y| ne_bytes_sse2(x, y),
        |at| {
            // A prefetch never faults: addresses past the end are harmless.
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(at + PREFETCH).cast());
            _mm_prefetch::<_MM_HINT_T0>(n.wrapping_add(at + PREFETCH).cast());
        },
    )
}

/// The two steps of the module docs, chunk after chunk. `ne` gives the mask of the
/// differing bytes of two blocks; `prefetch(at)` is called for each block at byte
/// offset `at`.
#[inline(always)]
fn scan_with<const ES: usize>(
    base: &[u8],
    new: &[u8],
    runs: &mut Runs<'_, ES>,
    ne: impl Fn(&[u8; BLOCK], &[u8; BLOCK]) -> u64,
    prefetch: impl Fn(usize),
) -> std::result::Result<(), Stop> {
    // Branch-free extractions per block: most blocks have at most this many changes.
    let steps = if ES == 1 { 4 } else { 2 };
    // One index per element of a chunk, the sentinel, and room for the unconditional
    // stores of the last block.
    let mut idx = [0u32; CHUNK + 8];
    let mut at = 0;
    while at < base.len() {
        let len = CHUNK.min(base.len() - at);
        let (a, n) = (&base[at..at + len], &new[at..at + len]);
        let mut p = 0;
        for (k, (x, y)) in a.chunks_exact(BLOCK).zip(n.chunks_exact(BLOCK)).enumerate() {
            prefetch(at + k * BLOCK);
            let mut m = fold::<ES>(ne(x.try_into().expect("64 bytes"), y.try_into().expect("64 bytes")));
            let first = (k * (BLOCK / ES)) as u32;
            for _ in 0..steps {
                // With m == 0 this stores a stray index that p does not count.
                idx[p] = first + m.trailing_zeros() / ES as u32;
                p += (m != 0) as usize;
                m &= m.wrapping_sub(1);
            }
            while m != 0 {
                idx[p] = first + m.trailing_zeros() / ES as u32;
                p += 1;
                m &= m - 1;
            }
        }
        // A last chunk shorter than a block ends element by element.
        let done = len / BLOCK * BLOCK;
        for (i, (x, y)) in a[done..].chunks_exact(ES).zip(n[done..].chunks_exact(ES)).enumerate() {
            if x != y {
                idx[p] = ((done / ES) + i) as u32;
                p += 1;
            }
        }
        idx[p] = u32::MAX; // never the next element of a run
        runs.chunk(&idx[..=p], at / ES, len / ES)?;
        at += len;
    }
    Ok(())
}

/// Bit `i` set where byte `i` of the two blocks differs: four 16-byte compares and
/// their byte masks (`pcmpeqb`, `pmovmskb`).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
#[inline]
fn ne_bytes_sse2(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set_epi64x};
    let mut eq = 0u64;
    for q in 0..BLOCK / 16 {
        let x = _mm_set_epi64x(word(a, 2 * q + 1) as i64, word(a, 2 * q) as i64);
        let y = _mm_set_epi64x(word(b, 2 * q + 1) as i64, word(b, 2 * q) as i64);
        eq |= (_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) as u16 as u64) << (16 * q);
    }
    !eq
}

/// Bit `i` set where byte `i` of the two blocks differs, from `u64` words: the top
/// bit of every nonzero byte of a word's XOR (its low bits plus 0x7f carry into the
/// top bit exactly when one is set, never into the next byte), gathered into 8 bits
/// by one multiplication (byte j to bit 56 + j; no two partial products meet there).
#[inline(always)]
fn ne_bytes_words(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    let mut m = 0u64;
    for k in 0..BLOCK / 8 {
        let x = word(a, k) ^ word(b, k);
        let top = (((x & 0x7f7f_7f7f_7f7f_7f7f) + 0x7f7f_7f7f_7f7f_7f7f) | x) & 0x8080_8080_8080_8080;
        m |= ((top >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * k);
    }
    m
}

/// Word `k` (bytes `8k..8k+8`) of a block, little-endian (byte `j` of the block is
/// bits `8j..8j+8` of its word on every machine).
#[inline(always)]
fn word(block: &[u8; BLOCK], k: usize) -> u64 {
    u64::from_le_bytes(block[k * 8..k * 8 + 8].try_into().expect("8 bytes"))
}

/// A byte mask folded to one bit per `ES`-byte element, at the element's first byte
/// (bit `j * ES` for element `j`): set when any of its bytes is.
#[inline(always)]
fn fold<const ES: usize>(ne: u64) -> u64 {
    let mut m = ne;
    let mut shift = 1;
    while shift < ES {
        m |= m >> shift;
        shift *= 2;
    }
    m & match ES {
        1 => u64::MAX,
        2 => 0x5555_5555_5555_5555,
        4 => 0x1111_1111_1111_1111,
        8 => 0x0101_0101_0101_0101,
        _ => 0x0001_0001_0001_0001,
    }
}

/// Changed elements of `new` against `base` (the count the whole path still owes).
fn count_changed<const ES: usize>(base: &[u8], new: &[u8]) -> usize {
    let blocks = base.chunks_exact(BLOCK).zip(new.chunks_exact(BLOCK));
    let mut n: usize = blocks
        .map(|(a, b)| {
            let ne = ne_bytes_words(a.try_into().expect("64 bytes"), b.try_into().expect("64 bytes"));
            fold::<ES>(ne).count_ones() as usize
        })
        .sum();
    let done = base.len() / BLOCK * BLOCK;
    n += base[done..].chunks_exact(ES).zip(new[done..].chunks_exact(ES)).filter(|(a, b)| a != b).count();
    n
}

/// The run writer: turns each chunk's changed elements into runs, written into
/// `out[..w]` (`out` is grown ahead, zero-filled, and cut to `w` at the end).
struct Runs<'a, const ES: usize> {
    new: &'a [u8],
    out: &'a mut Vec<u8>,
    /// Bytes of `out` written.
    w: usize,
    body_start: usize,
    limit: usize,
    /// The element after the last written run (where the next gap counts from).
    cursor: usize,
    /// A run that reached the end of the last chunk, not written yet (`open_len`
    /// 0: none).
    open_start: usize,
    open_len: usize,
    changed: usize,
    runs: usize,
}

/// Bytes `out` grows by at least (it also grows by half its length at a time, so
/// that it is zero-filled about once).
const GROW: usize = 4 << 10;

impl<const ES: usize> Runs<'_, ES> {
    /// Makes room for `n` more bytes at `w`.
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if self.out.len() - self.w < n {
            self.grow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let len = (self.w + n).max(self.out.len() + self.out.len() / 2).max(self.w + GROW);
        self.out.resize(len, 0);
    }

    /// How far a run may end from the chunk's end and still go on in the next
    /// chunk: for byte elements, one unchanged element between two changes joins
    /// them (carrying it costs 1 byte, a new run header at least 2).
    const JOIN: usize = if ES == 1 { 2 } else { 1 };

    /// Writes the changed elements of one chunk: `idx` holds their indices within
    /// the chunk, in increasing order, then `u32::MAX`; the chunk starts at element
    /// `first` and has `elements` elements. `Err` once the body is over its limit.
    #[inline(always)]
    fn chunk(&mut self, idx: &[u32], first: usize, elements: usize) -> std::result::Result<(), Stop> {
        let p = idx.len() - 1;
        if p == 0 {
            return Ok(());
        }
        self.changed += p;
        let end = first + elements;
        let mut k = 0;
        if self.open_len != 0 {
            // The open run goes on only with this chunk's first changes.
            let (start, mut len) = (self.open_start, self.open_len);
            while k < p {
                let i = first + idx[k] as usize;
                if i == start + len {
                    len += 1;
                } else if ES == 1 && i == start + len + 1 {
                    len += 2;
                } else {
                    break;
                }
                k += 1;
            }
            if start + len + Self::JOIN > end {
                self.open_len = len;
                return self.check(end);
            }
            self.open_len = 0;
            self.put_run(start, len);
        }
        // Room for every isolated change of the chunk, written in place below.
        self.room((p - k) * (2 + ES));
        loop {
            k = self.isolated(idx, k, first, elements);
            if k == p {
                break;
            }
            // A longer run, a longer gap, or the chunk's last elements.
            let j = idx[k] as usize;
            let i = first + j;
            let mut len = 1;
            k += 1;
            loop {
                let next = idx[k] as usize;
                if next == j + len {
                    len += 1;
                } else if ES == 1 && next == j + len + 1 {
                    len += 2;
                } else {
                    break;
                }
                k += 1;
            }
            if i + len + Self::JOIN > end {
                // k == p: nothing of this chunk follows a run that reaches its end.
                self.open_start = i;
                self.open_len = len;
                break;
            }
            self.put_run(i, len);
            self.room((p - k) * (2 + ES));
        }
        self.check(end)
    }

    /// Writes the changes of `idx[k..]` (as in [`Runs::chunk`]) while they are
    /// isolated (the next change is neither adjacent nor, for byte elements, one
    /// element further), one byte of gap away, and not where the chunk's end may
    /// cut a run short: gap, count 1, value each, in the room made for them. Returns
    /// the index of the first change that is not. The state lives in locals here so
    /// that the stores into `out` do not make the compiler reload it.
    #[inline(always)]
    fn isolated(&mut self, idx: &[u32], mut k: usize, first: usize, elements: usize) -> usize {
        let p = idx.len() - 1;
        let new = self.new;
        let out = &mut self.out[..];
        let (mut w, mut cursor, mut runs) = (self.w, self.cursor, self.runs);
        while k < p {
            let j = idx[k];
            let next = idx[k + 1];
            let i = first + j as usize;
            let gap = i - cursor;
            let alone = next != j + 1 && (ES != 1 || next != j + 2);
            if !(alone && gap < 0x80 && (j as usize) + Self::JOIN < elements) {
                break;
            }
            let value: &[u8; ES] = new[i * ES..i * ES + ES].try_into().expect("ES bytes");
            let dst = &mut out[w..w + 2 + ES];
            dst[0] = gap as u8;
            dst[1] = 1;
            dst[2..].copy_from_slice(value);
            w += 2 + ES;
            cursor = i + 1;
            runs += 1;
            k += 1;
        }
        (self.w, self.cursor, self.runs) = (w, cursor, runs);
        k
    }

    /// Writes the run of `len` elements from element `start`: gap, count, values.
    #[inline(never)]
    fn put_run(&mut self, start: usize, len: usize) {
        let values = &self.new[start * ES..(start + len) * ES];
        self.room(2 * MAX_VARINT + values.len());
        self.w += put_varint(&mut self.out[self.w..], (start - self.cursor) as u64);
        self.w += put_varint(&mut self.out[self.w..], len as u64);
        self.out[self.w..self.w + values.len()].copy_from_slice(values);
        self.w += values.len();
        self.cursor = start + len;
        self.runs += 1;
    }

    /// `Err` when the body is over its limit (changed elements before `from` are
    /// counted).
    #[inline(always)]
    fn check(&self, from: usize) -> std::result::Result<(), Stop> {
        if self.w - self.body_start > self.limit {
            return Err(Stop { from });
        }
        Ok(())
    }

    /// Writes the run still open at the region's end and cuts `out` to what was
    /// written.
    fn finish(&mut self) -> std::result::Result<(), Stop> {
        if self.open_len != 0 {
            self.put_run(self.open_start, self.open_len);
            self.open_len = 0;
        }
        self.out.truncate(self.w);
        self.check(self.new.len() / ES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64.
    fn rng(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn naive(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
        (0..BLOCK).filter(|&i| a[i] != b[i]).fold(0, |m, i| m | 1 << i)
    }

    #[test]
    fn byte_masks_match_a_byte_by_byte_compare() {
        let mut s = 1;
        let mut a = [0u8; BLOCK];
        for x in a.iter_mut() {
            *x = rng(&mut s) as u8;
        }
        let mut cases = vec![a];
        for i in 0..BLOCK {
            for v in [1u8, 0x7f, 0x80, 0xff] {
                let mut b = a;
                b[i] ^= v;
                cases.push(b);
            }
        }
        for _ in 0..2000 {
            let mut b = a;
            for _ in 0..rng(&mut s) % 20 {
                b[(rng(&mut s) % 64) as usize] = rng(&mut s) as u8;
            }
            cases.push(b);
        }
        cases.push(a.map(|x| !x));
        for b in &cases {
            assert_eq!(ne_bytes_words(&a, b), naive(&a, b));
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            // SAFETY: SSE2 is enabled in this build (the cfg).
            assert_eq!(unsafe { ne_bytes_sse2(&a, b) }, naive(&a, b));
        }
    }

    #[test]
    fn folds_give_one_bit_per_changed_element() {
        fn check<const ES: usize>(ne: u64) {
            let want = (0..BLOCK / ES).filter(|&j| (ne >> (j * ES)) & ((1u128 << ES) - 1) as u64 != 0);
            assert_eq!(fold::<ES>(ne), want.fold(0, |m, j| m | 1 << (j * ES)), "ES {ES}, mask {ne:#x}");
        }
        let mut s = 2;
        for _ in 0..1000 {
            let ne = rng(&mut s) & rng(&mut s) & rng(&mut s);
            check::<1>(ne);
            check::<2>(ne);
            check::<4>(ne);
            check::<8>(ne);
            check::<16>(ne);
        }
    }

    /// The portable scan (what builds other than x86-64 run) writes the same bytes.
    #[test]
    fn the_portable_scan_writes_the_same_encoding() {
        fn portable<const ES: usize>(
            base: &[u8],
            new: &[u8],
            runs: &mut Runs<'_, ES>,
        ) -> std::result::Result<(), Stop> {
            scan_with(base, new, runs, ne_bytes_words, |_| ())
        }
        fn both<const ES: usize>(base: &[u8], new: &[u8]) {
            for limit in [new.len(), new.len() / 20] {
                let (mut a, mut b) = (vec![7u8; 3], vec![7u8; 3]);
                let sa = encode_es::<ES>(base, new, limit, &mut a, scan);
                let sb = encode_es::<ES>(base, new, limit, &mut b, portable);
                assert_eq!(a, b, "ES {ES}");
                assert_eq!(sa, sb, "ES {ES}");
            }
        }
        let mut s = 3;
        for (elements, density) in [(0, 0), (5, 50), (3000, 1), (3000, 30), (9000, 3), (9000, 90)] {
            for es in [1, 2, 4, 8, 16] {
                let mut base = vec![0u8; elements * es];
                base.iter_mut().for_each(|x| *x = rng(&mut s) as u8);
                let mut new = base.clone();
                for e in 0..elements {
                    if rng(&mut s) % 100 < density {
                        new[e * es + (rng(&mut s) as usize % es)] ^= 0x10;
                    }
                }
                match es {
                    1 => both::<1>(&base, &new),
                    2 => both::<2>(&base, &new),
                    4 => both::<4>(&base, &new),
                    8 => both::<8>(&base, &new),
                    _ => both::<16>(&base, &new),
                }
            }
        }
    }
}
