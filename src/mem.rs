//! Advice to the kernel for large, freshly reserved buffers.
//!
//! The JSON writers at a million fragments fill a few hundred MiB of new memory
//! (the placement document is 309 MB at w1m-moe). Each first touch of a 4 KiB
//! page is a page fault; asking for transparent huge pages makes it one fault per
//! 2 MiB (w1m placement to_json 0.29-0.39 s -> 0.20 s on the benchmark VM). The
//! advice is only that: where the kernel declines (THP off, no free huge page),
//! on other systems, or for buffers under [`MIN_BYTES`], nothing changes.
//!
//! Only sequentially written output buffers are advised: the one-thread writers'
//! strings, and the two-thread writers' buffers, whose two halves are each
//! written front to back by one thread (w1m placement to_json on two threads,
//! three alternated runs: 0.13-0.20 s advised against 0.25-0.35 s not). The
//! planner's large tables, filled by two threads at once, ran slower advised (w1m
//! `plan_upload`, four alternated runs each: median 0.85 s advised against 0.72 s).

/// Buffers smaller than this are left alone (a 28 MB placement JSON gained
/// nothing measurable, and a huge-page fault may first compact memory).
pub(crate) const MIN_BYTES: usize = 64 << 20;

/// Advises the whole capacity of a freshly reserved output string (its 2 MiB-
/// aligned interior) for transparent huge pages, from [`MIN_BYTES`] on (see the
/// module docs). Call it before writing. No errors (a refusal leaves the buffer
/// as it was); thread safety: `buf` is borrowed mutably.
pub(crate) fn advise_huge_pages(buf: &mut String) {
    advise_region(buf.as_ptr() as usize, buf.capacity());
}

/// [`advise_huge_pages`] for a byte buffer (the two-thread writers fill its spare
/// capacity in place). Same rules, no errors; `buf` is borrowed mutably.
pub(crate) fn advise_huge_pages_vec(buf: &mut Vec<u8>) {
    advise_region(buf.as_ptr() as usize, buf.capacity());
}

/// The advice for `bytes` bytes from `start`: the caller's own allocation.
fn advise_region(start: usize, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if bytes < MIN_BYTES {
            return;
        }
        let (lo, hi) = ((start + HUGE - 1) & !(HUGE - 1), (start + bytes) & !(HUGE - 1));
        if hi > lo {
            // SAFETY: [lo, hi) lies inside the allocation the caller owns; MADV_HUGEPAGE
            // reads and writes no memory and changes no mapping, only how later
            // faults are served. Its result is ignored (advice only).
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}

#[cfg(test)]
mod tests {
    /// The advice changes no contents and no capacity, at any size and alignment.
    #[test]
    fn huge_page_advice_keeps_the_buffer() {
        for cap in [16, 100, super::MIN_BYTES, super::MIN_BYTES + (8 << 20) + 12_345] {
            let mut s = String::with_capacity(cap);
            s.push_str("kept");
            let before = (s.as_ptr(), s.capacity());
            super::advise_huge_pages(&mut s);
            assert_eq!((s.as_ptr(), s.capacity()), before, "{cap}");
            let mut expected = String::from("kept");
            while s.len() + 7 <= cap {
                s.push_str("written");
                expected.push_str("written");
            }
            assert_eq!(s.capacity(), before.1, "{cap}");
            assert!(s == expected && s.len() + 7 > cap, "{cap}");
        }
    }
}
