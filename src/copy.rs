//! The streaming `memcpy` shared by the embedded stores' restore path
//! (`store::kernels`) and the embedded transfer engine (`engine::local`): bytes
//! written once and not read back soon go out with non-temporal stores, so the
//! destination is never read before it is overwritten. Long copies stream either
//! line after line or four pages at a time, whichever this process measured faster
//! on its first long copies ([`Picker`]; `MWS_COPY_PATTERN` fixes it): which is
//! faster depends on the machine, not on the data.
//!
//! Verified restores copy with [`copy_streaming_crc`], which also returns the CRC-32C
//! of the source bytes, computed in the same loop as the copy (folded by carry-less
//! multiplication from the registers it streams, or four hardware CRC chains, one per
//! interleaved page, while the copy waits on memory), and [`CrcRuns`], which keeps
//! those checksums per range of object bytes; the short rows of a reshard are folded
//! as they are copied too ([`crate::crc::clmul::Folder`]) where they are whole
//! 64-byte lines, else summed a window at a time after their copies.
//!
//! Nothing here knows stores, engines or plans: a pointer pair and a length.

use crate::crc::RangeCrc;

/// Copies shorter than this are plain `memcpy`s (the stream stores need a head copy
/// to align the destination first).
#[cfg(target_arch = "x86_64")]
const STREAM_MIN: usize = 256;

/// Copies `n` bytes whose destination is written once and not read back soon (a
/// restore, a live transfer). Long copies use non-temporal stores on x86-64, which
/// avoids reading every destination cache line before overwriting it; callers issue
/// [`copy_fence`] before reporting the copies complete. Copies of at least
/// [`STREAM_BLOCK`] bytes stream in this process's [`Pattern`] (see [`Picker`]).
///
/// # Safety
/// `src` must be valid for `n` bytes of reads, `dst` for `n` bytes of writes, and
/// the ranges must not overlap.
#[inline]
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if n >= STREAM_MIN {
            let left = n - ((64 - (dst as usize & 63)) & 63);
            let choice = if left >= STREAM_BLOCK { PICKER.pattern() } else { Some(Pattern::Sequential) };
            match choice {
                // SAFETY: the caller's contract.
                Some(p) => unsafe { copy_with(p, dst, src, n) },
                None => {
                    // Calibrating: this copy is one of the samples when it is long
                    // enough to be timed, else it takes the default pattern.
                    if left < CALIBRATION_MIN_BYTES {
                        // SAFETY: the caller's contract.
                        unsafe { copy_with(Pattern::FourPage, dst, src, n) };
                        return;
                    }
                    let p = PICKER.turn();
                    let t = std::time::Instant::now();
                    // SAFETY: the caller's contract.
                    unsafe { copy_with(p, dst, src, n) };
                    // Time the stores to completion, not only their issue.
                    copy_fence();
                    PICKER.record(p, n as u64, t.elapsed().as_nanos() as u64);
                }
            }
            return;
        }
    }
    // SAFETY: the caller guarantees `src`/`dst` valid for `n` bytes and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// How a long [`copy_streaming`] moves its bytes. Which one is faster depends on the
/// machine's memory system, not on the data: on the 2-core benchmark VMs one pattern
/// or the other has been 1.3-1.45x faster on different days (docs/PERFORMANCE.md,
/// "The copy pattern"), so each process measures it on its first long copies
/// ([`Picker`]) unless `MWS_COPY_PATTERN` names one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Pattern {
    /// One stream, 64-byte line after line ([`stream_lines`]).
    Sequential = 2,
    /// Four pages at a time, interleaved ([`stream_blocks`]): glibc's pattern for
    /// very large copies, and the default while a process has not decided.
    FourPage = 3,
}

#[cfg(target_arch = "x86_64")]
impl Pattern {
    /// The name `MWS_COPY_PATTERN` and [`pattern_name`] use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::Sequential => "sequential",
            Pattern::FourPage => "four-page",
        }
    }

    /// The pattern `MWS_COPY_PATTERN` names (`sequential` or `four-page`); `None`
    /// for unset, `auto` or anything else (the process measures).
    pub(crate) fn from_setting(v: Option<&str>) -> Option<Pattern> {
        match v.map(str::trim) {
            Some("sequential") => Some(Pattern::Sequential),
            Some("four-page") => Some(Pattern::FourPage),
            _ => None,
        }
    }
}

/// Copies `n >= STREAM_MIN` bytes with pattern `p`: a plain head up to the first
/// 64-byte destination line, then non-temporal stores.
///
/// # Safety
/// As [`copy_streaming`], with `n >= STREAM_MIN`.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy_with(p: Pattern, dst: *mut u8, src: *const u8, n: usize) {
    // Head: bring the destination to 64-byte alignment with a plain copy, so every
    // stream store fills whole cache lines.
    let head = (64 - (dst as usize & 63)) & 63;
    // SAFETY: head < 64 <= n, so both ranges lie inside the caller's `src..src+n` /
    // `dst..dst+n`, which it guarantees valid and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    // SAFETY: as above; the stream helpers need a 16-byte aligned destination, which
    // the head copy establishes.
    let (mut d, mut s) = unsafe { (dst.add(head), src.add(head)) };
    let mut left = n - head;
    if p == Pattern::FourPage && left >= STREAM_BLOCK {
        // SAFETY: `left` bytes from `s` / `d` lie inside the caller's ranges; `d` is aligned.
        let done = unsafe { stream_blocks(d, s, left) };
        // SAFETY: `done <= left`, so the pointers stay inside the ranges.
        unsafe { (d, s) = (d.add(done), s.add(done)) };
        left -= done;
    }
    // SAFETY: as above.
    unsafe { stream_lines(d, s, left) };
}

/// The pattern of this process's long streaming copies (what `LocalEngine` and the
/// embedded stores' restores use for host bytes): `sequential` or `four-page` once
/// decided, `measuring` while the first long copies still time both, `memcpy` off
/// x86-64. `MWS_COPY_PATTERN=sequential|four-page` fixes it (docs/ARCHITECTURE.md,
/// copy layer). For reports and benchmarks; no errors; thread-safe.
pub fn pattern_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        PICKER.pattern().map_or("measuring", Pattern::name)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "memcpy"
    }
}

/// Copies at least this long (after the head) are timed while a process measures the
/// patterns: long enough that the clock's cost (tens of ns) is noise and most of the
/// bytes come from memory, not cache.
#[cfg(target_arch = "x86_64")]
const CALIBRATION_MIN_BYTES: usize = 256 << 10;
/// Bytes each pattern must have copied (timed) before the process decides.
#[cfg(target_arch = "x86_64")]
const CALIBRATION_BYTES: u64 = 64 << 20;
/// The sequential pattern is chosen only when it is at least this much faster
/// (percent): the four-page pattern is what glibc's `memcpy` does, so a near tie keeps it.
#[cfg(target_arch = "x86_64")]
const SEQUENTIAL_MARGIN_PERCENT: u64 = 10;

/// This process's pattern choice.
#[cfg(target_arch = "x86_64")]
static PICKER: Picker = Picker::new();

/// Chooses a process's [`Pattern`] from its own copies: `MWS_COPY_PATTERN` when it
/// names one, else the first long copies ([`CALIBRATION_MIN_BYTES`] and more)
/// alternate the two patterns and are timed to completion, until each has copied
/// [`CALIBRATION_BYTES`]; then the faster one (by bytes per second, the sequential
/// one only with a [`SEQUENTIAL_MARGIN_PERCENT`] lead) is kept for good. No memory of
/// its own, no copy of its own: the samples are the caller's copies, whose bytes are
/// the same whichever pattern moves them. Lock-free; concurrent copies may each
/// contribute a sample.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Picker {
    /// [`UNSET`], [`MEASURING`], or the decided pattern (`Pattern as u8`).
    state: std::sync::atomic::AtomicU8,
    turn: std::sync::atomic::AtomicU64,
    /// (bytes, nanoseconds) timed per pattern: [sequential, four-page].
    bytes: [std::sync::atomic::AtomicU64; 2],
    nanos: [std::sync::atomic::AtomicU64; 2],
}

#[cfg(target_arch = "x86_64")]
const UNSET: u8 = 0;
#[cfg(target_arch = "x86_64")]
const MEASURING: u8 = 1;

#[cfg(target_arch = "x86_64")]
impl Picker {
    pub(crate) const fn new() -> Picker {
        use std::sync::atomic::{AtomicU64, AtomicU8};
        Picker {
            state: AtomicU8::new(UNSET),
            turn: AtomicU64::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            nanos: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// The decided pattern, or `None` while measuring. The first call reads
    /// `MWS_COPY_PATTERN`.
    pub(crate) fn pattern(&self) -> Option<Pattern> {
        use std::sync::atomic::Ordering::Relaxed;
        match self.state.load(Relaxed) {
            s if s == Pattern::Sequential as u8 => Some(Pattern::Sequential),
            s if s == Pattern::FourPage as u8 => Some(Pattern::FourPage),
            MEASURING => None,
            _ => {
                let setting = std::env::var("MWS_COPY_PATTERN").ok();
                self.start(Pattern::from_setting(setting.as_deref()));
                self.pattern()
            }
        }
    }

    /// Leaves [`UNSET`]: decided when `fixed` names a pattern, else measuring.
    fn start(&self, fixed: Option<Pattern>) {
        use std::sync::atomic::Ordering::Relaxed;
        let next = fixed.map_or(MEASURING, |p| p as u8);
        let _ = self.state.compare_exchange(UNSET, next, Relaxed, Relaxed);
    }

    /// The pattern the next timed copy uses (the two alternate).
    pub(crate) fn turn(&self) -> Pattern {
        if self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed).is_multiple_of(2) {
            Pattern::Sequential
        } else {
            Pattern::FourPage
        }
    }

    /// Adds one timed copy; decides once both patterns have their bytes.
    pub(crate) fn record(&self, p: Pattern, bytes: u64, nanos: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let i = (p == Pattern::FourPage) as usize;
        self.bytes[i].fetch_add(bytes, Relaxed);
        self.nanos[i].fetch_add(nanos.max(1), Relaxed);
        let sample = |i: usize| (self.bytes[i].load(Relaxed), self.nanos[i].load(Relaxed));
        if let Some(p) = decide(sample(0), sample(1)) {
            let _ = self.state.compare_exchange(MEASURING, p as u8, Relaxed, Relaxed);
        }
    }
}

/// The pattern to keep from the timed (bytes, nanoseconds) of each, or `None` while
/// either has copied less than [`CALIBRATION_BYTES`]. Pure.
#[cfg(target_arch = "x86_64")]
fn decide(sequential: (u64, u64), four_page: (u64, u64)) -> Option<Pattern> {
    if sequential.0 < CALIBRATION_BYTES || four_page.0 < CALIBRATION_BYTES {
        return None;
    }
    let rate = |(bytes, nanos): (u64, u64)| bytes as f64 / nanos.max(1) as f64;
    let lead = 1.0 + SEQUENTIAL_MARGIN_PERCENT as f64 / 100.0;
    Some(if rate(sequential) >= lead * rate(four_page) { Pattern::Sequential } else { Pattern::FourPage })
}

/// Bytes one step of [`stream_blocks`] copies: four pages, interleaved.
#[cfg(target_arch = "x86_64")]
const STREAM_BLOCK: usize = 4 * STREAM_PAGE;
#[cfg(target_arch = "x86_64")]
const STREAM_PAGE: usize = 4096;

/// Copies whole [`STREAM_BLOCK`]s with non-temporal stores, four pages at a time and
/// 128 bytes of each page per step (the pattern glibc uses for very large copies: four
/// concurrent streams keep more DRAM pages open and more fills in flight than one: on
/// the 2-core benchmark VM of 2026-12-01 about 1.4x faster than a single stream, on
/// that of 2026-12-03 about 1.3x slower; hence [`Pattern`]).
/// Returns the bytes copied, a multiple of [`STREAM_BLOCK`] at most `n`.
///
/// # Safety
/// `src` valid for `n` bytes of reads, `dst` for `n` bytes of writes, disjoint, and
/// `dst` 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn stream_blocks(dst: *mut u8, src: *const u8, n: usize) -> usize {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_prefetch, _mm_stream_si128, _MM_HINT_T0};
    let blocks = n / STREAM_BLOCK;
    for b in 0..blocks {
        let mut off = 0;
        while off < STREAM_PAGE {
            for k in 0..4 {
                let at = b * STREAM_BLOCK + k * STREAM_PAGE + off;
                // SAFETY: `at + 128 <= blocks * STREAM_BLOCK <= n`, inside both ranges
                // (this function's contract); `dst + at` is 16-byte aligned since `dst`
                // is and `at` is a multiple of 128; SSE2 is baseline on x86-64. The
                // prefetch address (the same line one block ahead) is computed with
                // `wrapping_add` and never dereferenced: a prefetch is only a hint.
                unsafe {
                    let s = src.add(at);
                    let d = dst.add(at);
                    _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK + 64) as *const i8);
                    let mut v = [std::mem::zeroed::<__m128i>(); 8];
                    for (q, x) in v.iter_mut().enumerate() {
                        *x = _mm_loadu_si128(s.add(16 * q) as *const __m128i);
                    }
                    for (q, x) in v.iter().enumerate() {
                        _mm_stream_si128(d.add(16 * q) as *mut __m128i, *x);
                    }
                }
            }
            off += 128;
        }
    }
    blocks * STREAM_BLOCK
}

/// Copies `n` bytes: 64-byte lines with non-temporal stores, then the tail plainly.
///
/// # Safety
/// As [`stream_blocks`].
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn stream_lines(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_prefetch, _mm_stream_si128, _MM_HINT_T0};
    const PREFETCH_AHEAD: usize = 512;
    let (mut d, mut s, mut left) = (dst, src, n);
    // SAFETY: every pointer stays within `src..src+n` / `dst..dst+n` (64-byte steps
    // while `left >= 64`, then the tail of `left` bytes), valid and disjoint by the
    // contract; `d` stays 16-byte aligned; SSE2 is baseline on x86-64. The prefetch
    // address is computed with `wrapping_add` and never dereferenced.
    unsafe {
        while left >= 64 {
            // Software prefetch 512 bytes ahead: the hardware prefetchers alone lose
            // the stream at every short row and page.
            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(PREFETCH_AHEAD) as *const i8);
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            d = d.add(64);
            s = s.add(64);
            left -= 64;
        }
        std::ptr::copy_nonoverlapping(s, d, left);
    }
}

/// Copies `n` bytes as [`copy_streaming`] does and returns `crc32c_append(crc, src[..n])`.
/// On x86-64 with SSE 4.2 the checksum of every four-page block is computed in the
/// copy's own loop, from the source lines just loaded (four independent CRC chains,
/// one per page, folded with [`crate::crc::SHIFT_4K`]): the CRC instructions run
/// while the copy waits on memory. The head and tail are summed right after they are
/// copied. Elsewhere: the copy, then the checksum of the source.
///
/// # Safety
/// As [`copy_streaming`].
#[inline]
pub(crate) unsafe fn copy_streaming_crc(dst: *mut u8, src: *const u8, n: usize, crc: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if n >= STREAM_MIN && std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the caller's contract; SSE 4.2 was detected.
            return unsafe { copy_streaming_crc_x86(dst, src, n, crc) };
        }
    }
    // SAFETY: the caller's contract.
    unsafe { copy_streaming(dst, src, n) };
    // SAFETY: `src` is valid for `n` bytes of reads (the caller's contract).
    crate::crc::crc32c_append(crc, unsafe { std::slice::from_raw_parts(src, n) })
}

/// [`copy_streaming_crc`] for `n >= STREAM_MIN` on a CPU with SSE 4.2.
///
/// # Safety
/// As [`copy_streaming`]; the CPU supports SSE 4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn copy_streaming_crc_x86(dst: *mut u8, src: *const u8, n: usize, mut crc: u32) -> u32 {
    let head = (64 - (dst as usize & 63)) & 63;
    // SAFETY: head < 64 <= n: inside the caller's valid, disjoint ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    // SAFETY: as above.
    crc = crate::crc::crc32c_append(crc, unsafe { std::slice::from_raw_parts(src, head) });
    // SAFETY: as above; the destination is now 64-byte aligned.
    let (mut d, mut s) = unsafe { (dst.add(head), src.add(head)) };
    let mut left = n - head;
    if left >= STREAM_BLOCK {
        // SAFETY: `left` bytes from `s` / `d` lie inside the caller's ranges; `d` is
        // 64-byte aligned; the 512-bit kernel only where the CPU has its features.
        let (done, c) = unsafe {
            if crate::crc::clmul::available() {
                stream_blocks_clmul(d, s, left, crc)
            } else {
                stream_blocks_crc(d, s, left, crc)
            }
        };
        crc = c;
        // SAFETY: `done <= left`.
        unsafe { (d, s) = (d.add(done), s.add(done)) };
        left -= done;
    }
    // SAFETY: as above.
    unsafe { stream_lines(d, s, left) };
    // SAFETY: `s..s+left` is the rest of the caller's source range.
    crate::crc::crc32c_append(crc, unsafe { std::slice::from_raw_parts(s, left) })
}

/// [`stream_blocks`] that also sums the source: returns the bytes copied and
/// `crc32c_append(crc, <those bytes>)`. Each block's four pages are four independent
/// CRC chains over the 128-byte pieces just loaded (latency 3, throughput 1 per cycle:
/// three or more chains keep the unit busy), folded into `crc` at the end of the block.
///
/// # Safety
/// As [`stream_blocks`]; the CPU supports SSE 4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn stream_blocks_crc(dst: *mut u8, src: *const u8, n: usize, mut crc: u32) -> (usize, u32) {
    use std::arch::x86_64::{__m128i, _mm_crc32_u64, _mm_loadu_si128, _mm_prefetch, _mm_stream_si128, _MM_HINT_T0};
    let blocks = n / STREAM_BLOCK;
    for b in 0..blocks {
        let mut chains = [u64::from(u32::MAX); 4];
        let mut off = 0;
        while off < STREAM_PAGE {
            for (k, chain) in chains.iter_mut().enumerate() {
                let at = b * STREAM_BLOCK + k * STREAM_PAGE + off;
                // SAFETY: as in `stream_blocks`: `at + 128 <= n`, inside both ranges,
                // `dst + at` 16-byte aligned, the prefetch only a hint. The CRC reads
                // the same 128 source bytes again (from L1).
                unsafe {
                    let s = src.add(at);
                    let d = dst.add(at);
                    _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK + 64) as *const i8);
                    let mut v = [std::mem::zeroed::<__m128i>(); 8];
                    for (q, x) in v.iter_mut().enumerate() {
                        *x = _mm_loadu_si128(s.add(16 * q) as *const __m128i);
                    }
                    for (q, x) in v.iter().enumerate() {
                        _mm_stream_si128(d.add(16 * q) as *mut __m128i, *x);
                    }
                    let mut c = *chain;
                    for q in 0..16 {
                        c = _mm_crc32_u64(c, (s.add(8 * q) as *const u64).read_unaligned());
                    }
                    *chain = c;
                }
            }
            off += 128;
        }
        for c in chains {
            crc = crate::crc::SHIFT_4K.append(crc, !(c as u32));
        }
    }
    (blocks * STREAM_BLOCK, crc)
}

/// [`stream_blocks_crc`] on 512-bit registers: each 128-byte piece is loaded into
/// two registers, streamed to the destination from them, and folded into its page's
/// two accumulators by carry-less multiplication ([`crate::crc::clmul`]): no second
/// read of the source and a few instructions per 64 bytes, so the copy keeps the
/// memory parallelism it has without the checksum. Page `k`'s accumulators run
/// through page `k` of every block (the fold from one block's page to the next
/// block's skips the three other pages); after the last block the four pages are
/// folded into one lane and reduced to the checksum.
///
/// # Safety
/// As [`stream_blocks`], with `dst` 64-byte aligned; the CPU has the features of
/// [`crate::crc::clmul::available`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn stream_blocks_clmul(dst: *mut u8, src: *const u8, n: usize, crc: u32) -> (usize, u32) {
    use crate::crc::clmul::{finish, fold512, fold_constants, initial, k512, lanes_to_one};
    use std::arch::x86_64::{
        __m512i, _mm512_loadu_si512, _mm512_setzero_si512, _mm512_stream_si512, _mm512_xor_si512, _mm_prefetch,
        _MM_HINT_T0,
    };
    let blocks = n / STREAM_BLOCK;
    if blocks == 0 {
        return (0, crc);
    }
    // Fold distances (bits): to the next piece of the page; from a page's last piece
    // to its first piece in the next block; from the first register of a piece to the
    // second; from one page to the next.
    let k_piece = k512(const { fold_constants(8 * 128) });
    let k_block = k512(const { fold_constants(8 * (STREAM_BLOCK - STREAM_PAGE + 128) as u64) });
    let k_half = k512(const { fold_constants(8 * 64) });
    let k_page = k512(const { fold_constants(8 * STREAM_PAGE as u64) });
    let mut acc = [[_mm512_setzero_si512(); 2]; 4];
    // Copies the 128 bytes at `at` and folds them into `a` by the distance of `k`.
    let piece = |a: &mut [__m512i; 2], at: usize, k: __m512i| {
        // SAFETY: every call below passes `at + 128 <= blocks * STREAM_BLOCK <= n`,
        // inside both ranges (this function's contract); `dst + at` is 64-byte aligned
        // since `dst` is and `at` is a multiple of 128; the prefetch (one block ahead,
        // computed with `wrapping_add`) is only a hint; the features are enabled on
        // this function.
        unsafe {
            let s = src.add(at);
            let d = dst.add(at);
            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(STREAM_BLOCK + 64) as *const i8);
            let v0: __m512i = _mm512_loadu_si512(s.cast());
            let v1: __m512i = _mm512_loadu_si512(s.add(64).cast());
            _mm512_stream_si512(d.cast(), v0);
            _mm512_stream_si512(d.add(64).cast(), v1);
            *a = [fold512(a[0], k, v0), fold512(a[1], k, v1)];
        }
    };
    for b in 0..blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            piece(a, b * STREAM_BLOCK + k * STREAM_PAGE, k_block);
        }
        if b == 0 {
            // The initial register enters the message's first bytes (the zero
            // accumulators folded above stayed zero).
            acc[0][0] = _mm512_xor_si512(acc[0][0], initial(crc));
        }
        let mut off = 128;
        while off < STREAM_PAGE {
            for (k, a) in acc.iter_mut().enumerate() {
                piece(a, b * STREAM_BLOCK + k * STREAM_PAGE + off, k_piece);
            }
            off += 128;
        }
    }
    let mut z = _mm512_setzero_si512();
    for a in acc {
        z = fold512(z, k_page, fold512(a[0], k_half, a[1]));
    }
    (blocks * STREAM_BLOCK, finish(lanes_to_one(z)))
}

/// Contiguous source bytes summed at once when they were copied in short pieces (the
/// rows of a reshard): summing a window of a few KiB uses the crate's three-chain
/// loop, while each short row alone would be one latency-bound chain. The window is
/// still in L1/L2 from the copy.
const CRC_WINDOW: u64 = 16 << 10;
/// Pieces at least this long are copied by the fused kernel ([`copy_streaming_crc`]).
const FUSED_MIN: usize = 4096;

/// The CRC-32C of bytes a read delivers, as [`RangeCrc`] runs over object offsets:
/// consecutive pieces of one object extend the current run, which is closed at a gap,
/// at a jump back, and at every multiple of `span` (so that no run crosses one: the
/// integrity record's blocks). Bytes are summed as they are copied ([`CrcRuns::copy`])
/// or as they were delivered ([`CrcRuns::account`]); [`CrcRuns::finish`] returns the
/// runs in delivery order. One per read (per source object mapping).
pub(crate) struct CrcRuns {
    span: u64,
    runs: Vec<RangeCrc>,
    open: bool,
    /// The open run: `[start, end)` of the object.
    start: u64,
    end: u64,
    /// `crc32c` of `[start, folded)`; `[folded, end)` were copied from `pending` and are
    /// summed later (at most [`CRC_WINDOW`] bytes, before the read returns).
    crc: u32,
    folded: u64,
    pending: *const u8,
    /// The first multiple of `span` after `start`: the open run ends there at most.
    limit: u64,
    /// While set, `[start, folded)` is summed here instead of in `crc`: short pieces
    /// of whole 64-byte lines to 16-byte aligned destinations, copied and folded in
    /// one pass ([`crate::crc::clmul::Folder`]); settled into `crc` before anything
    /// else extends the run.
    #[cfg(target_arch = "x86_64")]
    lines: Option<crate::crc::clmul::Folder>,
    /// Whether this CPU runs the line folder.
    #[cfg(target_arch = "x86_64")]
    clmul: bool,
}

impl CrcRuns {
    /// Runs that never cross a multiple of `span` object bytes (> 0).
    pub(crate) fn new(span: u64) -> CrcRuns {
        CrcRuns {
            span: span.max(1),
            runs: Vec::new(),
            open: false,
            start: 0,
            end: 0,
            crc: 0,
            folded: 0,
            pending: std::ptr::null(),
            limit: 0,
            #[cfg(target_arch = "x86_64")]
            lines: None,
            #[cfg(target_arch = "x86_64")]
            clmul: crate::crc::clmul::available(),
        }
    }

    /// Moves the line folder's sum into `crc`.
    #[inline]
    fn settle(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = self.lines.take() {
            // SAFETY: a folder exists only where the CPU has its features (`clmul`).
            self.crc = unsafe { f.finish() };
        }
    }

    /// Sums the copied bytes not yet summed.
    fn fold(&mut self) {
        self.settle();
        let n = (self.end - self.folded) as usize;
        if n > 0 {
            // SAFETY: `[pending, pending + n)` are source bytes copied by `copy`, whose
            // contract keeps them valid and unchanged until `finish`.
            let bytes = unsafe { std::slice::from_raw_parts(self.pending, n) };
            self.crc = crate::crc::crc32c_append(self.crc, bytes);
            // SAFETY: one past the bytes just summed (inside or at the end of them).
            self.pending = unsafe { self.pending.add(n) };
            self.folded = self.end;
        }
    }

    fn close(&mut self) {
        if self.open {
            self.fold();
            if self.end > self.start {
                self.runs.push(RangeCrc { object_offset: self.start, len: self.end - self.start, crc: self.crc });
            }
            self.open = false;
        }
    }

    /// Makes the open run end at `at` (object offset), continuing it when contiguous
    /// (and, for copied bytes, when `src` follows the pending bytes in memory).
    fn continue_at(&mut self, at: u64, src: *const u8) {
        let contiguous = self.open
            && at == self.end
            && !at.is_multiple_of(self.span)
            && (self.end == self.folded || src == self.pending.wrapping_add((self.end - self.folded) as usize));
        if contiguous {
            if self.end == self.folded {
                self.pending = src;
            }
        } else {
            self.close();
            let limit = (at / self.span).saturating_add(1).saturating_mul(self.span);
            *self = CrcRuns {
                open: true,
                start: at,
                end: at,
                crc: 0,
                folded: at,
                pending: src,
                limit,
                ..std::mem::take(self)
            };
        }
    }

    /// Copies `n` bytes from `src` (object bytes from `object_offset`) to `dst` with
    /// [`copy_streaming`] / [`copy_streaming_crc`] and sums them.
    ///
    /// # Safety
    /// As [`copy_streaming`]; besides, the source bytes stay valid and unchanged until
    /// [`CrcRuns::finish`] (short pieces are summed after later copies).
    #[inline]
    pub(crate) unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, object_offset: u64, n: usize) {
        // Fast path (the rows of a reshard): a short piece that extends the open run
        // inside its span; no division, summed later with the window.
        if n < FUSED_MIN
            && self.open
            && object_offset == self.end
            && object_offset + n as u64 <= self.limit
            && src == self.pending.wrapping_add((self.end - self.folded) as usize)
        {
            // SAFETY: the caller's contract.
            unsafe { self.short(dst, src, n) };
            return;
        }
        pieces(self.span, object_offset, n as u64, |o, done, len| {
            let (len, done) = (len as usize, done as usize);
            // SAFETY: `done + len <= n`: inside the caller's ranges.
            let (d, s) = unsafe { (dst.add(done), src.add(done)) };
            self.continue_at(o, s);
            if len >= FUSED_MIN {
                self.fold();
                // SAFETY: the caller's contract, for this piece.
                self.crc = unsafe { copy_streaming_crc(d, s, len, self.crc) };
                self.end += len as u64;
                self.folded = self.end;
                // SAFETY: one past this piece's source bytes.
                self.pending = unsafe { s.add(len) };
            } else {
                // SAFETY: the caller's contract, for this piece.
                unsafe { self.short(d, s, len) };
            }
        });
    }

    /// Copies a short piece that extends the open run (`src` follows the run's pending
    /// bytes): folded as it is copied when it is whole lines to an aligned destination
    /// and nothing is pending, else copied and summed later with the window.
    ///
    /// # Safety
    /// As [`CrcRuns::copy`], for this piece.
    #[inline]
    unsafe fn short(&mut self, dst: *mut u8, src: *const u8, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.clmul && self.end == self.folded && n.is_multiple_of(64) && (dst as usize).is_multiple_of(16) {
            let crc = self.crc;
            let f = self.lines.get_or_insert_with(|| crate::crc::clmul::Folder::new(crc));
            // SAFETY: the caller's contract; the folder's features were detected
            // (`clmul`); whole lines to a 16-byte aligned destination, checked above.
            unsafe { f.copy(dst, src, n) };
            self.end += n as u64;
            self.folded = self.end;
            // SAFETY: one past this piece's source bytes.
            self.pending = unsafe { src.add(n) };
            return;
        }
        // SAFETY: the caller's contract.
        unsafe { copy_streaming(dst, src, n) };
        self.end += n as u64;
        if self.end - self.folded >= CRC_WINDOW {
            self.fold();
        }
    }

    /// Sums `bytes`, object bytes from `object_offset` already delivered (handed to a
    /// device copy, or read into the destination by the kernel).
    pub(crate) fn account(&mut self, object_offset: u64, bytes: &[u8]) {
        pieces(self.span, object_offset, bytes.len() as u64, |o, done, len| {
            self.continue_at(o, std::ptr::null());
            self.fold();
            self.crc = crate::crc::crc32c_append(self.crc, &bytes[done as usize..(done + len) as usize]);
            self.end += len;
            self.folded = self.end;
        });
    }

    /// The runs, in delivery order.
    pub(crate) fn finish(mut self) -> Vec<RangeCrc> {
        self.close();
        self.runs
    }
}

/// Calls `f(object_offset, offset in the piece list, len)` for the pieces of `[at, at +
/// n)` that do not cross a multiple of `span`.
fn pieces(span: u64, at: u64, n: u64, mut f: impl FnMut(u64, u64, u64)) {
    let mut done = 0;
    while done < n {
        let o = at + done;
        let len = (n - done).min(span - o % span);
        f(o, done, len);
        done += len;
    }
}

impl Default for CrcRuns {
    fn default() -> Self {
        CrcRuns::new(u64::MAX)
    }
}

/// Orders the non-temporal stores of [`copy_streaming`] before later stores.
#[inline]
pub(crate) fn copy_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE2 is baseline on x86-64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::{copy_fence, copy_streaming, copy_streaming_crc, CrcRuns};
    use crate::crc::RangeCrc;

    /// The fused kernel copies exactly like `copy_streaming` and returns the checksum
    /// of the source appended to the one passed in, at every length around the line
    /// and block boundaries and every misalignment that matters.
    #[test]
    fn copy_streaming_crc_copies_and_sums_exactly_the_range() {
        let src: Vec<u8> = (0..140_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let lens = [0usize, 1, 255, 256, 4095, 16_383, 16_384, 16_385, 32_768 + 191, 65_536, 131_072 + 77];
        for &n in &lens {
            for (da, sa) in MISALIGNMENTS {
                // SAFETY: `copied_exactly` passes `n` bytes inside its buffer and `src`.
                let crc = copied_exactly(&src, n, (da, sa), "copy_streaming_crc", |d, s| unsafe {
                    copy_streaming_crc(d, s, n, 0x5eed)
                });
                assert_eq!(crc, crc32c::crc32c_append(0x5eed, &src[sa..sa + n]), "n {n} da {da} sa {sa}");
            }
        }
    }

    /// Destination and source misalignments (bytes past a 64-byte line) that matter.
    const MISALIGNMENTS: [(usize, usize); 5] = [(0, 0), (1, 0), (0, 3), (17, 5), (63, 62)];

    /// Runs `copy(dst + da, src + sa)` for `n` bytes into a fresh buffer of 0xEE bytes
    /// (with room on both sides), fences, and checks that exactly those bytes were
    /// written; returns what `copy` returned.
    fn copied_exactly<R>(
        src: &[u8],
        n: usize,
        (da, sa): (usize, usize),
        what: &str,
        copy: impl FnOnce(*mut u8, *const u8) -> R,
    ) -> R {
        let mut dst = vec![0xEEu8; n + 200];
        assert!(sa + n <= src.len() && da + n <= dst.len());
        let r = copy(dst.as_mut_ptr().wrapping_add(da), src.as_ptr().wrapping_add(sa));
        copy_fence();
        assert!(dst[..da].iter().all(|&b| b == 0xEE), "{what} n {n} da {da}: wrote before the range");
        assert_eq!(&dst[da..da + n], &src[sa..sa + n], "{what} n {n} da {da} sa {sa}");
        assert!(dst[da + n..].iter().all(|&b| b == 0xEE), "{what} n {n} da {da}: wrote past the range");
        r
    }

    /// Both block kernels (the CRC-instruction one, and the carry-less-multiplication
    /// one where the CPU has it) copy whole blocks and return the crate's checksum,
    /// whichever one `copy_streaming_crc` picks on this machine.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_block_kernels_copy_and_sum_whole_blocks() {
        use super::{stream_blocks_clmul, stream_blocks_crc, STREAM_BLOCK};
        let src: Vec<u8> =
            (0..5 * STREAM_BLOCK as u32 + 99).map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8).collect();
        let mut dst = vec![0u8; src.len() + 64];
        let a = (64 - (dst.as_ptr() as usize & 63)) & 63;
        for &(n, sa, crc) in
            &[(STREAM_BLOCK, 0usize, 0u32), (3 * STREAM_BLOCK + 5, 7, 0x1234_5678), (5 * STREAM_BLOCK, 99, u32::MAX)]
        {
            let want = crc32c::crc32c_append(crc, &src[sa..sa + n / STREAM_BLOCK * STREAM_BLOCK]);
            let run = |f: unsafe fn(*mut u8, *const u8, usize, u32) -> (usize, u32), dst: &mut Vec<u8>| {
                dst.fill(0);
                // SAFETY: `sa + n <= src.len()`, `a + n <= dst.len()`, `dst + a` is
                // 64-byte aligned; distinct vectors; the CPU features are checked by the
                // callers below.
                let (done, got) = unsafe { f(dst.as_mut_ptr().add(a), src.as_ptr().add(sa), n, crc) };
                copy_fence();
                assert_eq!(done, n / STREAM_BLOCK * STREAM_BLOCK);
                assert_eq!(got, want, "n {n} sa {sa}");
                assert_eq!(&dst[a..a + done], &src[sa..sa + done]);
                assert!(dst[a + done..].iter().all(|&b| b == 0), "wrote past the blocks");
            };
            if std::arch::is_x86_feature_detected!("sse4.2") {
                run(stream_blocks_crc, &mut dst);
            }
            if crate::crc::clmul::available() {
                run(stream_blocks_clmul, &mut dst);
            }
        }
    }

    fn sum(src: &[u8], r: &RangeCrc) -> u32 {
        crc32c::crc32c(&src[r.object_offset as usize..(r.object_offset + r.len) as usize])
    }

    /// Runs: contiguous pieces extend one run (short ones summed in windows, long ones
    /// fused), a gap or a jump back starts a new one, none crosses a multiple of the
    /// span, and account() (already delivered bytes) joins the same runs.
    #[test]
    fn crc_runs_split_at_gaps_and_spans() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(40_503) >> 5) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let span = 65_536u64;
        let mut runs = CrcRuns::new(span);
        let mut copy = |runs: &mut CrcRuns, at: usize, n: usize| {
            // SAFETY: `at + n <= src.len() == dst.len()`; distinct vectors, unchanged
            // until `finish`.
            unsafe { runs.copy(dst.as_mut_ptr().add(at), src.as_ptr().add(at), at as u64, n) };
        };
        // Short rows, contiguous: one run up to the span boundary, then the next.
        for row in 0..300 {
            copy(&mut runs, row * 300, 300);
        }
        // A gap, then a long fused piece crossing two span boundaries.
        copy(&mut runs, 100_000, 150_000);
        // A jump back.
        copy(&mut runs, 50, 10);
        runs.account(250_000, &src[250_000..250_100]);
        copy(&mut runs, 250_100, 5000);
        let got = runs.finish();
        copy_fence();
        let spans: Vec<(u64, u64)> = got.iter().map(|r| (r.object_offset, r.len)).collect();
        assert_eq!(
            spans,
            vec![
                (0, 65_536),
                (65_536, 90_000 - 65_536),
                (100_000, 131_072 - 100_000),
                (131_072, 65_536),
                (196_608, 250_000 - 196_608),
                (50, 10),
                (250_000, 5100)
            ]
        );
        for r in &got {
            assert_eq!(r.crc, sum(&src, r), "{r:?}");
            assert!(r.object_offset / span == (r.object_offset + r.len - 1) / span, "{r:?} crosses a span");
        }
        assert!(dst[..90_000] == src[..90_000], "the rows were copied");
        assert!(dst[100_000..250_000] == src[100_000..250_000], "the long piece was copied");
        assert!(dst[250_100..255_100] == src[250_100..255_100], "the piece after account() was copied");
    }

    /// Short rows of whole lines to aligned destinations are folded as they are
    /// copied; rows that are not (odd lengths, unaligned destinations) are summed
    /// with the window; any mix of the two, long pieces, deliveries summed by
    /// `account` and span boundaries in the middle of a run give the same runs and
    /// checksums as summing the bytes.
    #[test]
    fn crc_runs_mix_folded_lines_and_windowed_rows() {
        let src: Vec<u8> = (0..400_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let mut buf = vec![0u8; src.len() + 64];
        let base = (64 - buf.as_ptr() as usize % 64) % 64;
        let span = 65_536u64;
        let mut runs = CrcRuns::new(span);
        let mut copy = |runs: &mut CrcRuns, at: usize, n: usize, skew: usize| {
            // SAFETY: `at + skew + n <= src.len() + 64`; distinct vectors, unchanged
            // until `finish`.
            unsafe { runs.copy(buf.as_mut_ptr().add(base + at + skew), src.as_ptr().add(at), at as u64, n) };
        };
        let mut at = 0;
        // Whole lines (folded), an odd row, whole lines again (windowed until the
        // window is summed, then folded), one row to a misaligned destination, and
        // lines across the span boundary at 65,536.
        for (n, count, skew) in [(512, 40, 0), (320, 1, 0), (1024, 30, 0), (256, 1, 8), (2048, 20, 0)] {
            for _ in 0..count {
                copy(&mut runs, at, n, skew);
                at += n;
            }
        }
        let rows_end = at;
        // A long piece continuing the run, an account()ed delivery, then lines.
        copy(&mut runs, at, 20_000, 0);
        at += 20_000;
        runs.account(at as u64, &src[at..at + 4_096]);
        at += 4_096;
        for _ in 0..10 {
            copy(&mut runs, at, 640, 0);
            at += 640;
        }
        let got = runs.finish();
        copy_fence();
        let mut covered = 0;
        for r in &got {
            assert_eq!(r.object_offset, covered, "runs cover the bytes in order: {got:?}");
            assert_eq!(r.crc, sum(&src, r), "{r:?}");
            assert!(r.object_offset / span == (r.object_offset + r.len - 1) / span, "{r:?} crosses a span");
            covered += r.len;
        }
        assert_eq!(covered, at as u64);
        assert!(got.iter().any(|r| r.object_offset == span), "a run starts at the span boundary");
        let skewed = 512 * 40 + 320 + 1024 * 30;
        assert!(buf[base..base + skewed] == src[..skewed], "the rows were copied");
        // (its last 8 bytes were overwritten by the next row, 8 bytes ahead of it)
        assert!(buf[base + skewed + 8..base + skewed + 256] == src[skewed..skewed + 248], "the skewed row");
        let after = skewed + 256;
        assert!(buf[base + after..base + rows_end] == src[after..rows_end], "the lines after it");
        let acc = rows_end + 20_000;
        assert!(buf[base + rows_end..base + acc] == src[rows_end..acc], "the long piece");
        assert!(buf[base + acc + 4_096..base + at] == src[acc + 4_096..at], "the lines after account()");
    }

    /// Every length around the line and four-page block boundaries, at every
    /// destination and source misalignment that matters, copies exactly its bytes and
    /// nothing outside them: through `copy_streaming` (whatever pattern this process
    /// uses) and through each pattern.
    #[test]
    fn copy_streaming_copies_exactly_the_range() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let lens = [0usize, 1, 63, 64, 255, 256, 257, 4095, 16_383, 16_384, 16_385, 16_448, 32_768 + 191, 65_536];
        type Copy = unsafe fn(*mut u8, *const u8, usize);
        #[allow(unused_mut)]
        let mut copies: Vec<(&str, Copy)> = vec![("copy_streaming", copy_streaming)];
        #[cfg(target_arch = "x86_64")]
        {
            /// `copy_with(p)` where it applies (`n >= STREAM_MIN`), else the plain copy.
            ///
            /// # Safety
            /// As `copy_streaming`.
            unsafe fn with<const SEQUENTIAL: bool>(d: *mut u8, s: *const u8, n: usize) {
                let p = if SEQUENTIAL { super::Pattern::Sequential } else { super::Pattern::FourPage };
                // SAFETY: the caller's contract; `copy_with` gets `n >= STREAM_MIN`.
                unsafe {
                    if n >= super::STREAM_MIN {
                        super::copy_with(p, d, s, n)
                    } else {
                        std::ptr::copy_nonoverlapping(s, d, n)
                    }
                }
            }
            copies.push(("sequential", with::<true>));
            copies.push(("four-page", with::<false>));
        }
        for (name, copy) in &copies {
            for &n in &lens {
                for placement in MISALIGNMENTS {
                    // SAFETY: `copied_exactly` passes `n` bytes inside its buffer and `src`.
                    copied_exactly(&src, n, placement, name, |d, s| unsafe { copy(d, s, n) });
                }
            }
        }
    }

    /// `MWS_COPY_PATTERN`: the two names fix a pattern; unset, `auto` or anything
    /// else leaves the choice to the measurement.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_copy_pattern_setting_names_a_pattern_or_leaves_it_to_measurement() {
        use super::Pattern;
        assert_eq!(Pattern::from_setting(Some("sequential")), Some(Pattern::Sequential));
        assert_eq!(Pattern::from_setting(Some(" four-page\n")), Some(Pattern::FourPage));
        for v in [None, Some("auto"), Some(""), Some("Sequential"), Some("fast")] {
            assert_eq!(Pattern::from_setting(v), None, "{v:?}");
        }
        for p in [Pattern::Sequential, Pattern::FourPage] {
            assert_eq!(Pattern::from_setting(Some(p.name())), Some(p));
        }
    }

    /// The decision waits for both patterns' bytes, keeps the four-page pattern on a
    /// near tie, and takes the sequential one only with the margin.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_pattern_decision_needs_both_samples_and_the_margin() {
        use super::{decide, Pattern, CALIBRATION_BYTES as B};
        // Too few bytes on either side: no decision yet.
        assert_eq!(decide((B - 1, 1_000), (B, 10_000)), None);
        assert_eq!(decide((B, 1_000), (B - 1, 10_000)), None);
        // Same bytes: sequential 20 % faster wins; 5 % faster is a tie (four-page).
        assert_eq!(decide((B, 1_000_000), (B, 1_200_000)), Some(Pattern::Sequential));
        assert_eq!(decide((B, 1_000_000), (B, 1_050_000)), Some(Pattern::FourPage));
        assert_eq!(decide((B, 1_200_000), (B, 1_000_000)), Some(Pattern::FourPage));
        // Rates, not totals: twice the bytes in twice the time is the same speed.
        assert_eq!(decide((2 * B, 2_000_000), (B, 1_000_000)), Some(Pattern::FourPage));
        assert_eq!(decide((2 * B, 1_500_000), (B, 1_000_000)), Some(Pattern::Sequential));
        // No overflow at extreme totals, and a zero duration counts as one nanosecond.
        assert_eq!(decide((u64::MAX, u64::MAX), (u64::MAX, u64::MAX)), Some(Pattern::FourPage));
        assert_eq!(decide((B, 0), (B, 0)), Some(Pattern::FourPage));
    }

    /// A picker: a fixed setting decides at once; measuring alternates the patterns,
    /// stays undecided until both have their bytes, then keeps the faster one for
    /// good (later samples change nothing).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_picker_alternates_then_keeps_the_faster_pattern() {
        use super::{Pattern, Picker, CALIBRATION_BYTES as B};
        let fixed = Picker::new();
        fixed.start(Some(Pattern::Sequential));
        assert_eq!(fixed.pattern(), Some(Pattern::Sequential));

        let p = Picker::new();
        p.start(None);
        assert_eq!(p.pattern(), None);
        let turns: Vec<Pattern> = (0..4).map(|_| p.turn()).collect();
        assert_eq!(turns, [Pattern::Sequential, Pattern::FourPage, Pattern::Sequential, Pattern::FourPage]);
        // Sequential at 2 bytes/ns, four-page at 1 byte/ns, in halves.
        p.record(Pattern::Sequential, B / 2, B / 4);
        p.record(Pattern::FourPage, B / 2, B / 2);
        p.record(Pattern::Sequential, B / 2, B / 4);
        assert_eq!(p.pattern(), None, "four-page has only half its bytes");
        p.record(Pattern::FourPage, B / 2, B / 2);
        assert_eq!(p.pattern(), Some(Pattern::Sequential));
        p.record(Pattern::FourPage, 100 * B, 1);
        assert_eq!(p.pattern(), Some(Pattern::Sequential), "decided for good");
        // A started picker ignores a second start.
        p.start(Some(Pattern::FourPage));
        assert_eq!(p.pattern(), Some(Pattern::Sequential));
    }

    /// Copies long enough to be timed feed this process's picker and still copy
    /// exactly their bytes, whichever pattern each sample used.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn timed_copies_copy_exactly() {
        let n = super::CALIBRATION_MIN_BYTES + 4096 + 77;
        let src: Vec<u8> = (0..n as u32 + 64).map(|i| (i.wrapping_mul(2_246_822_519) >> 7) as u8).collect();
        for k in 0..4 {
            let mut dst = vec![0u8; n + 128];
            // SAFETY: `k + n <= src.len()`, `3 + n <= dst.len()`; distinct vectors.
            unsafe { copy_streaming(dst.as_mut_ptr().add(3), src.as_ptr().add(k), n) };
            copy_fence();
            assert_eq!(&dst[3..3 + n], &src[k..k + n], "copy {k}");
            assert!(dst[..3].iter().chain(&dst[3 + n..]).all(|&b| b == 0), "copy {k} wrote outside its range");
        }
        assert!(["sequential", "four-page", "measuring"].contains(&super::pattern_name()));
    }
}
