//! CRC-32C by carry-less multiplication on 512-bit registers (AVX-512 with
//! VPCLMULQDQ): four independent 128-bit lanes per register, each *folded* forward
//! over the bytes that follow it, then the lanes folded into one and reduced with the
//! CRC instruction. About a quarter of the instructions of the CRC-instruction loop
//! per byte, and none of them re-reads memory: the fused copy kernel
//! ([`crate::copy`]) folds the very registers it streams to the destination.
//!
//! # The algebra (reflected CRC, worked out for this file)
//! A 16-byte lane read from memory is a 128-bit integer whose bit `k` is the
//! coefficient of `x^(127-k)` (the first byte's low bit is the highest power: the
//! reflected bit order of CRC-32C). The carry-less product of two such 64-bit halves
//! `a` (poly `A`) and `b` (poly `B`), read as a 128-bit lane, is `x·A·B`. A lane `X =
//! Lo·x^64 + Hi` (`Lo` the first eight bytes) that is followed by `D` more bits of
//! message contributes `X·x^D`; modulo `P`, that is `Lo·(x^(D+64) mod P) + Hi·(x^D mod
//! P)`, which two products with the constants `x^(D+63) mod P` and `x^(D-1) mod P`
//! (the `x·` of the product absorbed) give as a lane of degree < 96: a *fold by `D`*.
//! Folding every lane to the end of the message and adding them gives one lane `Y ≡
//! M (mod P)`; the CRC register after `M` (from 0) is `Y·x^32 mod P`, which is the CRC
//! instruction's result for the 16 bytes of `Y`. The initial register of an append
//! enters as an XOR into the message's first four bytes, and the pre- and
//! post-inversion of CRC-32C are applied around that.
//!
//! The unit tests compare every entry point with the `crc32c` crate at every length
//! around the register and loop boundaries.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m128i, __m512i, _mm512_castsi512_si128, _mm512_clmulepi64_epi128, _mm512_extracti32x4_epi32, _mm512_loadu_si512,
    _mm512_set_epi64, _mm512_ternarylogic_epi64, _mm512_xor_si512, _mm512_zextsi128_si512, _mm_clmulepi64_si128,
    _mm_crc32_u64, _mm_cvtsi128_si64, _mm_cvtsi32_si128, _mm_extract_epi64, _mm_set_epi64x, _mm_xor_si128,
};

use super::xpow;

/// The two 64-bit constants of a fold by `d_bits` (see the module's algebra): the
/// first multiplies a lane's first eight bytes, the second its last eight. A 64-bit
/// constant has `x^j` at bit `63 - j`, which is the 32-bit reflected form shifted up.
pub(crate) const fn fold_constants(d_bits: u64) -> (u64, u64) {
    ((xpow(d_bits + 63) as u64) << 32, (xpow(d_bits - 1) as u64) << 32)
}

/// Whether this CPU runs the functions of this module (AVX-512F and VPCLMULQDQ).
#[inline]
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The fold constants of a distance ([`fold_constants`], computed at compile time by
/// the callers: `k512(const { fold_constants(d) })`) in every lane of a 512-bit
/// register.
///
/// Callable where AVX-512F is enabled ([`available`]).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn k512((lo, hi): (u64, u64)) -> __m512i {
    let (lo, hi) = (lo as i64, hi as i64);
    _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
}

/// The fold constants of a distance ([`fold_constants`]) in a 128-bit register.
///
/// Callable where the CPU has PCLMULQDQ (the functions that use the constants).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq")]
pub(crate) fn k128((lo, hi): (u64, u64)) -> __m128i {
    _mm_set_epi64x(hi as i64, lo as i64)
}

/// Every lane of `acc` folded by the distance of `k` ([`k512`]), plus `data`.
///
/// Callable where the CPU has the module's features ([`available`]).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
pub(crate) fn fold512(acc: __m512i, k: __m512i, data: __m512i) -> __m512i {
    let lo = _mm512_clmulepi64_epi128::<0x00>(acc, k);
    let hi = _mm512_clmulepi64_epi128::<0x11>(acc, k);
    // 0x96: a ^ b ^ c.
    _mm512_ternarylogic_epi64::<0x96>(lo, hi, data)
}

/// `acc` folded by the distance of `k` ([`k128`]), plus `data`.
///
/// Callable where the CPU has PCLMULQDQ.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "pclmulqdq")]
pub(crate) fn fold128(acc: __m128i, k: __m128i, data: __m128i) -> __m128i {
    let lo = _mm_clmulepi64_si128::<0x00>(acc, k);
    let hi = _mm_clmulepi64_si128::<0x11>(acc, k);
    _mm_xor_si128(_mm_xor_si128(lo, hi), data)
}

/// The four lanes of `x` (64 consecutive message bytes) as one lane congruent to them.
///
/// Callable where the CPU has the module's features ([`available`]).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,pclmulqdq")]
pub(crate) fn lanes_to_one(x: __m512i) -> __m128i {
    let k = k128(const { fold_constants(128) });
    let mut y = _mm512_castsi512_si128(x);
    y = fold128(y, k, _mm512_extracti32x4_epi32::<1>(x));
    y = fold128(y, k, _mm512_extracti32x4_epi32::<2>(x));
    fold128(y, k, _mm512_extracti32x4_epi32::<3>(x))
}

/// The initial register `!crc` of an append, as a value to XOR into the first 64
/// message bytes.
///
/// Callable where the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn initial(crc: u32) -> __m512i {
    _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32))
}

/// The CRC-32C (post-inverted) of a message whose folded lane is `y` and whose initial
/// register went in through [`initial`].
///
/// Callable where the CPU has SSE 4.2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "sse4.2")]
pub(crate) fn finish(y: __m128i) -> u32 {
    let lo = _mm_cvtsi128_si64(y) as u64;
    let hi = _mm_extract_epi64::<1>(y) as u64;
    !(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32)
}

/// Bytes per step of [`append`]: four registers.
pub(crate) const STEP: usize = 256;

/// `crc32c_append(crc, data)` for `data.len() >= STEP`: the whole steps folded, the
/// tail by the `crc32c` crate.
///
/// # Safety
/// The CPU supports the module's features ([`available`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
pub(crate) unsafe fn append(crc: u32, data: &[u8]) -> u32 {
    debug_assert!(data.len() >= STEP);
    let steps = data.len() / STEP;
    let p = data.as_ptr();
    // SAFETY: every load reads 64 bytes inside `data[..steps * STEP]`; the features
    // are enabled on this function.
    let load = |at: usize| unsafe { _mm512_loadu_si512(p.add(at).cast()) };
    let mut a = [_mm512_xor_si512(load(0), initial(crc)), load(64), load(128), load(192)];
    let k = k512(const { fold_constants(8 * STEP as u64) });
    for s in 1..steps {
        let at = s * STEP;
        for (i, x) in a.iter_mut().enumerate() {
            *x = fold512(*x, k, load(at + 64 * i));
        }
    }
    // Line `i` went into accumulator `i mod 4`, as a `Folder`'s lines do.
    // SAFETY: the features are enabled on this function.
    let crc = unsafe { Folder { acc: a, lines: 4 * steps as u64, crc }.finish() };
    crc32c::crc32c_append(crc, &data[steps * STEP..])
}

/// The CRC-32C of a message copied to its destination 64 bytes at a time, in pieces
/// of any number of whole 64-byte lines (the short rows of a reshard, contiguous in
/// the source object, scattered in the destination): each line is loaded once,
/// streamed to the destination and folded into one of four accumulators (line `i`
/// into accumulator `i mod 4`, folded by four lines), so the checksum costs no second
/// read and runs while the copy waits on memory. [`Folder::finish`] folds the four
/// accumulators, oldest first, into the checksum.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Folder {
    acc: [__m512i; 4],
    /// Lines folded so far.
    lines: u64,
    /// The register the message is appended to.
    crc: u32,
}

#[cfg(target_arch = "x86_64")]
impl Folder {
    /// A message appended to `crc` (as [`crate::crc::crc32c_append`]), empty so far.
    pub(crate) fn new(crc: u32) -> Folder {
        // SAFETY: an all-zero 512-bit register is a valid value (no feature needed).
        Folder { acc: unsafe { std::mem::zeroed() }, lines: 0, crc }
    }

    /// Copies `n` bytes (a multiple of 64) from `src` to `dst` with non-temporal
    /// stores (whole lines where `dst` is 64-byte aligned, 16-byte quarters where it
    /// is 16-byte aligned) and appends them to the message. The stores are ordered
    /// before later ones by [`crate::copy::copy_fence`], which the caller issues.
    ///
    /// # Safety
    /// The CPU has the module's features ([`available`]); `src` valid for `n` bytes
    /// of reads, `dst` for `n` bytes of writes and 16-byte aligned, disjoint.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(crate) unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, n: usize) {
        use std::arch::x86_64::{_mm512_stream_si512, _mm_stream_si128};
        debug_assert!(n.is_multiple_of(64) && (dst as usize).is_multiple_of(16));
        let k = k512(const { fold_constants(8 * STEP as u64) });
        let whole_lines = (dst as usize).is_multiple_of(64);
        for at in (0..n).step_by(64) {
            // SAFETY: `at + 64 <= n`: inside both ranges (the contract); `dst + at` is
            // 64-byte aligned where `whole_lines`, else 16-byte aligned.
            let v = unsafe {
                let (s, d) = (src.add(at), dst.add(at));
                let v = _mm512_loadu_si512(s.cast());
                if whole_lines {
                    _mm512_stream_si512(d.cast(), v);
                } else {
                    let d = d.cast::<__m128i>();
                    _mm_stream_si128(d, _mm512_castsi512_si128(v));
                    _mm_stream_si128(d.add(1), _mm512_extracti32x4_epi32::<1>(v));
                    _mm_stream_si128(d.add(2), _mm512_extracti32x4_epi32::<2>(v));
                    _mm_stream_si128(d.add(3), _mm512_extracti32x4_epi32::<3>(v));
                }
                v
            };
            let j = (self.lines % 4) as usize;
            self.acc[j] = match self.lines {
                0 => _mm512_xor_si512(v, initial(self.crc)),
                1..4 => v,
                _ => fold512(self.acc[j], k, v),
            };
            self.lines += 1;
        }
    }

    /// `crc32c_append(crc, <the bytes copied>)`.
    ///
    /// # Safety
    /// The CPU has the module's features ([`available`]).
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(crate) unsafe fn finish(&self) -> u32 {
        if self.lines == 0 {
            return self.crc;
        }
        // Accumulator `j` ends at the last line `i < lines` with `i = j mod 4`: taken
        // oldest first, each ends one line after the one before.
        let k = k512(const { fold_constants(512) });
        let (used, first) = if self.lines >= 4 { (4, self.lines % 4) } else { (self.lines, 0) };
        // SAFETY: as in `new`.
        let mut z: __m512i = unsafe { std::mem::zeroed() };
        for i in 0..used {
            z = fold512(z, k, self.acc[((first + i) % 4) as usize]);
        }
        finish(lanes_to_one(z))
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    #[test]
    fn append_equals_the_crc32c_crate_at_every_boundary() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 VPCLMULQDQ");
            return;
        }
        let src = data(70_000, 3);
        let mut lens: Vec<usize> = (STEP..3 * STEP + 2).collect();
        lens.extend([4095, 4096, 4097, 16_384, 65_536 + 17, 69_000]);
        for &n in &lens {
            for &(at, crc) in &[(0usize, 0u32), (1, 0x5eed), (63, u32::MAX), (5, 0x8000_0001)] {
                let s = &src[at..at + n];
                // SAFETY: the features were detected above.
                let got = unsafe { append(crc, s) };
                assert_eq!(got, crc32c::crc32c_append(crc, s), "n {n} at {at} crc {crc:#x}");
            }
        }
        // All-zero and all-one inputs (no accidental cancellation of the initial value).
        for fill in [0u8, 0xff] {
            let s = vec![fill; 1000];
            // SAFETY: as above.
            assert_eq!(unsafe { append(7, &s) }, crc32c::crc32c_append(7, &s));
        }
    }

    /// Messages copied in pieces of whole lines (1 to 13 pieces, every line count
    /// around the four accumulators): the same checksum as the crate's and the exact
    /// bytes, nothing written past them.
    #[test]
    fn folder_copies_and_sums_pieces_of_whole_lines() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 VPCLMULQDQ");
            return;
        }
        let src = data(64 * 64 + 17, 11);
        for crc in [0u32, 0xdead_beef] {
            for lines in 0..40usize {
                for (piece, skew) in [(1usize, 0usize), (2, 16), (3, 0), (5, 48), (8, 32)] {
                    let n = 64 * lines;
                    let s = &src[17..17 + n];
                    let mut dst = vec![0xa5u8; n + 128];
                    let d = (64 - (dst.as_ptr() as usize) % 64) % 64 + skew;
                    let mut f = Folder::new(crc);
                    for at in (0..n).step_by(64 * piece) {
                        let len = (64 * piece).min(n - at);
                        // SAFETY: features detected; both ranges inside their buffers,
                        // the destination 16-byte aligned.
                        unsafe { f.copy(dst.as_mut_ptr().add(d + at), s.as_ptr().add(at), len) };
                    }
                    // SAFETY: SSE is baseline on x86-64; the fence orders the stream
                    // stores before the reads below.
                    unsafe { std::arch::x86_64::_mm_sfence() };
                    // SAFETY: features detected.
                    let got = unsafe { f.finish() };
                    assert_eq!(got, crc32c::crc32c_append(crc, s), "{lines} lines by {piece}, +{skew}");
                    assert_eq!(&dst[d..d + n], s);
                    assert!(dst[..d].iter().chain(&dst[d + n..]).all(|&b| b == 0xa5), "nothing else written");
                }
            }
        }
    }

    #[test]
    fn fold_constants_are_the_powers_of_the_algebra() {
        let (lo, hi) = fold_constants(128);
        assert_eq!(lo, (xpow(191) as u64) << 32);
        assert_eq!(hi, (xpow(127) as u64) << 32);
        assert_eq!(xpow(0), 1 << 31, "x^0 is the reflected top bit");
        assert_eq!(xpow(32), super::super::POLY, "x^32 mod P is the polynomial's low terms");
        assert_eq!(xpow(8 * 4096), super::super::shift_op(4096), "the same shift as the combiner's");
    }
}
