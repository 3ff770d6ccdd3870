//! The encoder, one pass over the region in chunks of [`CHUNK`] bytes, two steps per
//! chunk:
//!
//! 1. compare: each 64-byte block of `base` and `new` gives a mask with one bit per
//!    changed element (AVX-512BW compares at the element's width where the CPU has
//!    them, detected at run time; else SSE2 byte compares on x86-64, `u64` words
//!    elsewhere, folded to one bit per element); the set bits become the chunk's
//!    list of changed element indices. The first three (four for byte elements) are
//!    extracted without a branch, so an equal block and a block with up to three
//!    changes cost the same; lines [`PREFETCH`] bytes ahead are requested into L1 as
//!    the blocks go (x86-64), and on the AVX-512 path [`PREFETCH_L2`] ahead into L2.
//! 2. write: the chunk's changed elements become runs (`docs/DELTA.md`), with one
//!    look at the next index to tell an isolated change (the common case, written
//!    without a call, in two stores, into `out`'s spare capacity: `out` is reserved
//!    ahead, never zero-filled) from the start of a longer run. A run that reaches the chunk's
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

/// How far ahead of the compared block the scan requests lines into L1 (x86-64):
/// measured best among 1-16 KiB on the benchmark machine (`docs/DELTA.md`).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
const PREFETCH: usize = 2048;

/// How far ahead the AVX-512 scan also requests lines into L2 (on the benchmark
/// machine 2-3% faster than [`PREFETCH`] alone; 16 KiB no better).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
const PREFETCH_L2: usize = 8192;

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
/// chunk's changed elements to `runs`: AVX-512BW compares where the CPU has them
/// (x86-64, detected at run time), else SSE2 (x86-64), else the portable one.
fn scan<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        // `is_x86_feature_detected!` caches its answer in a static: one load and a test.
        if std::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has AVX-512BW (detected above), and with it AVX-512F,
            // which AVX-512BW requires.
            return unsafe { scan_avx512(base, new, runs) };
        }
        // SAFETY: `scan_sse2` needs only SSE2, which this build enables (the cfg
        // above; SSE2 is part of the x86-64 baseline, every x86-64 CPU has it).
        unsafe { scan_sse2(base, new, runs) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        scan_portable(base, new, runs)
    }
}

/// [`scan_with`] on `u64` words (any machine; on x86-64 only the tests run it).
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), allow(dead_code))]
fn scan_portable<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    scan_with::<ES, ES>(base, new, runs, |x, y| fold::<ES>(ne_bytes_words(x, y)), |_| ())
}

/// Requests the lines `ahead` bytes after offset `at` of `base` and `new`, into L1
/// (`HINT` [`_MM_HINT_T0`](std::arch::x86_64::_MM_HINT_T0)) or L2 (`_MM_HINT_T1`).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn prefetch_ahead<const HINT: i32>(base: &[u8], new: &[u8], at: usize, ahead: usize) {
    use std::arch::x86_64::_mm_prefetch;
    // SAFETY: a prefetch never faults and changes nothing visible: addresses past
    // the end are harmless (`wrapping_add`, no dereference).
    unsafe {
        _mm_prefetch::<HINT>(base.as_ptr().wrapping_add(at + ahead).cast());
        _mm_prefetch::<HINT>(new.as_ptr().wrapping_add(at + ahead).cast());
    }
}

/// [`scan_with`] on SSE2 compares, with prefetches.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn scan_sse2<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    use std::arch::x86_64::_MM_HINT_T0;
    scan_with::<ES, ES>(
        base,
        new,
        runs,
        |x, y| fold::<ES>(ne_bytes_sse2(x, y)),
        |at| prefetch_ahead::<_MM_HINT_T0>(base, new, at, PREFETCH),
    )
}

/// [`scan_with`] on AVX-512BW compares at the element's width (one mask bit per
/// element, nothing to fold; 16-byte elements fold pairs of 8-byte lanes), with
/// prefetches.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "avx512f,avx512bw")]
fn scan_avx512<const ES: usize>(base: &[u8], new: &[u8], runs: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
    use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1};
    let prefetch = |at| {
        prefetch_ahead::<_MM_HINT_T0>(base, new, at, PREFETCH);
        prefetch_ahead::<_MM_HINT_T1>(base, new, at, PREFETCH_L2);
    };
    if ES == 16 {
        scan_with::<ES, 2>(base, new, runs, |x, y| ne_elements_avx512::<ES>(x, y), prefetch)
    } else {
        scan_with::<ES, 1>(base, new, runs, |x, y| ne_elements_avx512::<ES>(x, y), prefetch)
    }
}

/// The two steps of the module docs, chunk after chunk. `ne` gives the mask of the
/// changed elements of two blocks, element `j` at bit `j * S`; `prefetch(at)` is
/// called for each block at byte offset `at`.
#[inline(always)]
fn scan_with<const ES: usize, const S: usize>(
    base: &[u8],
    new: &[u8],
    runs: &mut Runs<'_, ES>,
    ne: impl Fn(&[u8; BLOCK], &[u8; BLOCK]) -> u64,
    prefetch: impl Fn(usize),
) -> std::result::Result<(), Stop> {
    // Branch-free extractions per block: most blocks have at most this many changes
    // (3% of bf16: 1.7% of blocks have more than 3, 7% more than 2; 3 measured
    // faster than 2).
    let steps = if ES == 1 { 4 } else { 3 };
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
            let mut m = ne(x.try_into().expect("64 bytes"), y.try_into().expect("64 bytes"));
            let first = (k * (BLOCK / ES)) as u32;
            for _ in 0..steps {
                // With m == 0 this stores a stray index that p does not count.
                idx[p] = first + m.trailing_zeros() / S as u32;
                p += (m != 0) as usize;
                m &= m.wrapping_sub(1);
            }
            while m != 0 {
                idx[p] = first + m.trailing_zeros() / S as u32;
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

/// The changed elements of two blocks, one bit each: bit `j` for element `j`
/// (`vpcmpneq` at the element's width into a mask register), for 16-byte elements
/// bit `2j` (pairs of 8-byte lanes folded).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn ne_elements_avx512<const ES: usize>(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{
        _mm512_cmpneq_epi16_mask, _mm512_cmpneq_epi32_mask, _mm512_cmpneq_epi64_mask, _mm512_cmpneq_epi8_mask,
        _mm512_loadu_si512,
    };
    // SAFETY: each load reads the 64 bytes of a `[u8; 64]` (unaligned loads).
    let (x, y) = unsafe { (_mm512_loadu_si512(a.as_ptr().cast()), _mm512_loadu_si512(b.as_ptr().cast())) };
    match ES {
        1 => _mm512_cmpneq_epi8_mask(x, y),
        2 => _mm512_cmpneq_epi16_mask(x, y) as u64,
        4 => _mm512_cmpneq_epi32_mask(x, y) as u64,
        8 => _mm512_cmpneq_epi64_mask(x, y) as u64,
        _ => {
            let m = _mm512_cmpneq_epi64_mask(x, y) as u64;
            (m | m >> 1) & 0x55
        }
    }
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
/// `out[..w]`: bytes past `out.len()` go into its spare capacity (reserved ahead,
/// never zero-filled), and the length is set to `w` when `out` grows and at the end.
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

/// Bytes `out` grows by at least (it also grows by half its length at a time).
const GROW: usize = 4 << 10;

impl<const ES: usize> Runs<'_, ES> {
    /// Makes room for `n` more bytes at `w`.
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if self.out.capacity() - self.w < n {
            self.grow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        // SAFETY: `w` is within the capacity, and every byte from the old length to
        // `w` has been written (through `spare_capacity_mut`), so the first `w` bytes
        // are initialized.
        unsafe { self.out.set_len(self.w) };
        self.out.reserve(n.max(self.w / 2).max(GROW));
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
        use std::mem::MaybeUninit;
        let p = idx.len() - 1;
        // The chunk's new values, and a slot of `2 + ES` bytes per change left (the
        // room made), so that the loop checks neither against its slice's end.
        let values = &self.new[first * ES..(first + elements) * ES];
        let (len, k0) = (self.out.len(), k);
        let at = self.w - len;
        let mut slots = self.out.spare_capacity_mut()[at..at + (p - k) * (2 + ES)].chunks_exact_mut(2 + ES);
        let mut cursor = self.cursor;
        while k < p {
            let (j, next) = (idx[k], idx[k + 1]);
            let i = first + j as usize;
            let gap = i - cursor;
            let alone = next != j + 1 && (ES != 1 || next != j + 2);
            if !(alone && gap < 0x80 && (j as usize) + Self::JOIN < elements) {
                break;
            }
            let j = j as usize;
            let value: [u8; ES] = values[j * ES..j * ES + ES].try_into().expect("ES bytes");
            let dst = slots.next().expect("a slot per change");
            // Two stores: the run header (gap, count 1) and the value.
            dst[..2].copy_from_slice(&(gap as u16 | 0x100).to_le_bytes().map(MaybeUninit::new));
            dst[2..].copy_from_slice(&value.map(MaybeUninit::new));
            cursor = i + 1;
            k += 1;
        }
        self.w += (k - k0) * (2 + ES);
        self.cursor = cursor;
        self.runs += k - k0;
        k
    }

    /// Writes the run of `len` elements from element `start`: gap, count, values.
    #[inline(never)]
    fn put_run(&mut self, start: usize, len: usize) {
        let values = &self.new[start * ES..(start + len) * ES];
        self.room(2 * MAX_VARINT + values.len());
        let mut head = [0u8; 2 * MAX_VARINT];
        let mut h = put_varint(&mut head, (start - self.cursor) as u64);
        h += put_varint(&mut head[h..], len as u64);
        let at = self.w - self.out.len();
        let dst = &mut self.out.spare_capacity_mut()[at..at + h + values.len()];
        for (d, &v) in dst.iter_mut().zip(head[..h].iter().chain(values)) {
            d.write(v);
        }
        self.w += h + values.len();
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
        // SAFETY: as in `grow`: every byte up to `w` is written, within the capacity.
        unsafe { self.out.set_len(self.w) };
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
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            if std::is_x86_feature_detected!("avx512bw") {
                // The element masks: bit j (bit 2j for 16-byte elements) where element j changed.
                fn elements<const ES: usize, const S: usize>(ne: u64) -> u64 {
                    (0..BLOCK / ES).filter(|&j| fold::<ES>(ne) >> (j * ES) & 1 != 0).fold(0, |m, j| m | 1 << (j * S))
                }
                let ne = naive(&a, b);
                // SAFETY: the CPU has AVX-512BW (detected above).
                unsafe {
                    assert_eq!(ne_elements_avx512::<1>(&a, b), elements::<1, 1>(ne));
                    assert_eq!(ne_elements_avx512::<2>(&a, b), elements::<2, 1>(ne));
                    assert_eq!(ne_elements_avx512::<4>(&a, b), elements::<4, 1>(ne));
                    assert_eq!(ne_elements_avx512::<8>(&a, b), elements::<8, 1>(ne));
                    assert_eq!(ne_elements_avx512::<16>(&a, b), elements::<16, 2>(ne));
                }
            }
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

    /// Every scan this machine can run writes the same bytes as the portable one
    /// (what builds other than x86-64 run): the dispatching [`scan`], and on x86-64
    /// the SSE2 one and, where the CPU has AVX-512BW, the AVX-512 one.
    #[test]
    fn every_scan_writes_the_same_encoding_as_the_portable_one() {
        fn scans<const ES: usize>() -> Vec<(&'static str, Scan<ES>)> {
            #[allow(unused_mut)]
            let mut v: Vec<(&'static str, Scan<ES>)> = vec![("dispatch", scan::<ES>)];
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            {
                fn sse2<const ES: usize>(b: &[u8], n: &[u8], r: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
                    // SAFETY: SSE2 is enabled in this build (the cfg).
                    unsafe { scan_sse2(b, n, r) }
                }
                fn avx512<const ES: usize>(b: &[u8], n: &[u8], r: &mut Runs<'_, ES>) -> std::result::Result<(), Stop> {
                    // SAFETY: only listed where the CPU has AVX-512BW (below).
                    unsafe { scan_avx512(b, n, r) }
                }
                v.push(("sse2", sse2::<ES>));
                if std::is_x86_feature_detected!("avx512bw") {
                    v.push(("avx512", avx512::<ES>));
                } else {
                    eprintln!("no AVX-512BW on this CPU: its scan is not tested");
                }
            }
            v
        }
        fn all<const ES: usize>(base: &[u8], new: &[u8]) {
            for limit in [new.len(), new.len() / 20] {
                let mut want = vec![7u8; 3];
                let want_stats = encode_es::<ES>(base, new, limit, &mut want, scan_portable);
                for (name, scan) in scans::<ES>() {
                    // A fresh `out`, and one reused with spare capacity and old bytes past its length.
                    let mut reused = vec![9u8; 3 * new.len() + 64];
                    reused.truncate(3);
                    reused[..].fill(7);
                    for mut out in [vec![7u8; 3], reused] {
                        let stats = encode_es::<ES>(base, new, limit, &mut out, scan);
                        assert_eq!(out, want, "ES {ES}, {name} scan");
                        assert_eq!(stats, want_stats, "ES {ES}, {name} scan");
                    }
                }
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
                    1 => all::<1>(&base, &new),
                    2 => all::<2>(&base, &new),
                    4 => all::<4>(&base, &new),
                    8 => all::<8>(&base, &new),
                    _ => all::<16>(&base, &new),
                }
            }
        }
    }
}
