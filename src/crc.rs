//! CRC-32C arithmetic over the `crc32c` crate: combining the checksums of adjacent
//! byte ranges, and the constant shift the fused copy kernel ([`crate::copy`]) folds
//! its per-page checksums with. Verified restores check the block checksums of the
//! integrity record against checksums computed while the bytes were copied, range by
//! range; [`Combiner`] turns those into block checksums without touching the bytes
//! again.
//!
//! The algebra is zlib's `crc32_combine`: with the polynomial's reflected
//! representation (bit 31 is `x^0`), `crc(A ‖ B) = crc(A) · x^(8·|B|) mod P ⊕ crc(B)`
//! for the standard (pre- and post-inverted) CRC, so appending `|B|` bytes is one
//! multiplication modulo `P` by a power of `x` that depends only on `|B|`.
//!
//! [`crc32c_append`] / [`crc32c`] are the crate's checksum entry points: by carry-less
//! multiplication ([`clmul`]) where the CPU has AVX-512 with VPCLMULQDQ, by the
//! `crc32c` crate (the CRC instruction) elsewhere.
//!
//! Nothing here knows stores or plans: checksums and lengths.

pub(crate) mod clmul;

/// `crc32c(A ‖ data)` from `crc = crc32c(A)`: the CRC-32C of more bytes, appended.
#[inline]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if data.len() >= clmul::STEP && clmul::available() {
            // SAFETY: the CPU features were detected.
            return unsafe { clmul::append(crc, data) };
        }
    }
    crc32c::crc32c_append(crc, data)
}

/// The CRC-32C of `data`.
#[inline]
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// The CRC-32C polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;

/// `a · b mod P` (both reflected: bit 31 is `x^0`).
const fn mul(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut i = 0;
    while i < 32 {
        if a & (1u32 << (31 - i)) != 0 {
            p ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        i += 1;
    }
    p
}

/// `X2N[k] = x^(2^k) mod P`.
const X2N: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut p = 1u32 << 30; // x^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = mul(p, p);
        k += 1;
    }
    t
};

/// `x^(n·2^k) mod P`, by the binary digits of `n` and the table of `x^(2^k)`.
const fn xpow_scaled(mut n: u64, mut k: usize) -> u32 {
    let mut p = 1u32 << 31; // x^0
    while n != 0 {
        if n & 1 != 0 {
            p = mul(X2N[k & 63], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// `x^e mod P` (the fold constants of [`clmul`]).
const fn xpow(e: u64) -> u32 {
    xpow_scaled(e, 0)
}

/// `x^(8·len) mod P`: the operator that appends `len` bytes (the shift of [`Combiner`]).
const fn shift_op(len: u64) -> u32 {
    xpow_scaled(len, 3) // 8·len = len · 2^3
}

/// Combines checksums of adjacent ranges: the CRC-32C of `A ‖ B` from `crc32c(A)`,
/// `crc32c(B)` and `|B|` (`crc32c::crc32c_append(crc_a, B)` without `B`'s bytes). Keeps
/// the last few shift operators (the pieces of a block tend to repeat a few lengths:
/// rows and the gaps between them).
#[derive(Default)]
pub(crate) struct Combiner {
    cache: [(u64, u32); 4],
    next: usize,
}

impl Combiner {
    /// `crc32c(A ‖ B)`; `combine(0, c, n) == c` (the checksum of nothing is 0).
    pub(crate) fn combine(&mut self, crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
        if len_b == 0 {
            return crc_a;
        }
        let op = match self.cache.iter().find(|(l, _)| *l == len_b) {
            Some(&(_, op)) => op,
            None => {
                let op = shift_op(len_b);
                self.cache[self.next] = (len_b, op);
                self.next = (self.next + 1) % self.cache.len();
                op
            }
        };
        mul(op, crc_a) ^ crc_b
    }
}

/// A table form of one constant shift: `apply(c) == mul(op, c)` with four table
/// lookups (the multiplication is linear in `c`, so it is the XOR of the products of
/// `c`'s four bytes, each tabulated).
pub(crate) struct ShiftTable([[u32; 256]; 4]);

impl ShiftTable {
    const fn new(len: u64) -> ShiftTable {
        let op = shift_op(len);
        let mut t = [[0u32; 256]; 4];
        let mut j = 0;
        while j < 4 {
            let mut b = 0;
            while b < 256 {
                t[j][b] = mul(op, (b as u32) << (8 * j));
                b += 1;
            }
            j += 1;
        }
        ShiftTable(t)
    }

    /// `crc32c_append(crc, B)` for any `B` of the table's length whose own checksum is
    /// `crc_b`.
    #[inline(always)]
    pub(crate) fn append(&self, crc: u32, crc_b: u32) -> u32 {
        let t = &self.0;
        t[0][(crc & 0xff) as usize]
            ^ t[1][((crc >> 8) & 0xff) as usize]
            ^ t[2][((crc >> 16) & 0xff) as usize]
            ^ t[3][(crc >> 24) as usize]
            ^ crc_b
    }
}

/// Appends one 4 KiB page (the unit of the fused copy kernel's parallel chains).
pub(crate) static SHIFT_4K: ShiftTable = ShiftTable::new(4096);

/// The CRC-32C of `len` object bytes starting at `object_offset`, as a read delivered
/// them (`store::ObjectStore::get_into_ranges_checked`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RangeCrc {
    /// First object byte of the range.
    pub object_offset: u64,
    /// Bytes in the range (> 0).
    pub len: u64,
    /// `crc32c` of those bytes.
    pub crc: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
    }

    #[test]
    fn combine_equals_the_checksum_of_the_concatenation() {
        let a = data(100_000, 1);
        let mut c = Combiner::default();
        for &cut in &[0usize, 1, 7, 8, 63, 4096, 4097, 65_536, 99_999, 100_000] {
            let (x, y) = a.split_at(cut);
            let got = c.combine(crc32c::crc32c(x), crc32c::crc32c(y), y.len() as u64);
            assert_eq!(got, crc32c::crc32c(&a), "cut {cut}");
        }
        assert_eq!(c.combine(0, 0xdead_beef, 12), 0xdead_beef);
        assert_eq!(c.combine(0x1234_5678, 0, 0), 0x1234_5678);
        let mut crc = 0;
        for piece in a.chunks(700).chain(a.chunks(3)) {
            crc = c.combine(crc, crc32c::crc32c(piece), piece.len() as u64);
        }
        let twice: Vec<u8> = a.iter().chain(&a).copied().collect();
        assert_eq!(crc, crc32c::crc32c(&twice));
    }

    #[test]
    fn shift_table_appends_a_page() {
        let a = data(3 * 4096, 5);
        let mut crc = crc32c::crc32c(&a[..17]);
        let mut want = crc;
        for page in a[17..17 + 2 * 4096].chunks(4096) {
            crc = SHIFT_4K.append(crc, crc32c::crc32c(page));
            want = crc32c::crc32c_append(want, page);
        }
        assert_eq!(crc, want);
        assert_eq!(SHIFT_4K.append(0, 7), 7);
    }
}
