//! The copy kernels of the embedded backends (memory and directory stores): the
//! thread budget of one batch, parallel runs of a batch's items, and merged strided
//! copies into one destination view, over the crate's streaming `memcpy`
//! ([`crate::copy`], shared with the embedded transfer engine).
//!
//! Nothing here knows keys or objects beyond a checked [`StridedRead`]; the store
//! contract itself is `store/mod.rs`.

use super::StridedRead;
pub(crate) use crate::copy::CrcRuns;
use std::sync::atomic::{AtomicU64, Ordering};

/// Below this many bytes in a batch, items run sequentially on the calling thread.
const PARALLEL_MIN_BYTES: u64 = 8 << 20;
/// At most this many threads per batch (overlaps the per-object fsyncs and copies).
const MAX_WORKERS: usize = 4;

/// Threads the embedded backends use for one large batch by default: the machine's
/// parallelism, at least 2 (to overlap `fsync`s) and at most 4.
pub fn io_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(2, MAX_WORKERS)
}

/// A backend's thread limit for one batch (0 = [`io_threads`]); see
/// `MemoryStore::set_max_threads`, `DirectoryStore::set_max_threads`.
#[derive(Debug, Default)]
pub(crate) struct ThreadLimit(std::sync::atomic::AtomicUsize);

impl ThreadLimit {
    pub(crate) fn set(&self, n: usize) {
        self.0.store(n, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> usize {
        match self.0.load(Ordering::Relaxed) {
            0 => io_threads(),
            n => n,
        }
    }
}

/// How many threads [`run_parallel_on`] uses for `jobs` jobs moving `bytes`: 1 (the
/// calling thread) below [`PARALLEL_MIN_BYTES`] or for a single job.
pub(crate) fn parallel_workers(jobs: usize, bytes: u64, max_workers: usize) -> usize {
    if bytes < PARALLEL_MIN_BYTES {
        1
    } else {
        max_workers.min(jobs).max(1)
    }
}

/// Runs `job(i, state)` for every index of `jobs` (each worker thread has its own
/// `state`), on up to `max_workers` scoped threads when the batch moves at least
/// [`PARALLEL_MIN_BYTES`], else in order on this thread. Returns `(index, result)`.
pub(crate) fn run_parallel_on<T: Send, S: Default>(
    jobs: Vec<usize>,
    bytes: u64,
    max_workers: usize,
    job: impl Fn(usize, &mut S) -> T + Sync,
) -> Vec<(usize, T)> {
    let workers = parallel_workers(jobs.len(), bytes, max_workers);
    if workers <= 1 {
        let mut state = S::default();
        return jobs.into_iter().map(|i| (i, job(i, &mut state))).collect();
    }
    let next = AtomicU64::new(0);
    let (jobs, job, next) = (&jobs, &job, &next);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                sc.spawn(move || {
                    let mut state = S::default();
                    let mut out = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(&i) = jobs.get(k) else { break };
                        out.push((i, job(i, &mut state)));
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Reads into one destination view merged per batch: more than this many are merged
/// in chunks of this size (the merge scans the heads linearly).
const MERGE_WAYS: usize = 16;

/// A checked strided read whose source bytes are mapped in memory: object offset
/// `o` of the read is at `src + (o - src_origin)`.
pub(crate) struct MappedRead<'r, 'a> {
    /// The read (already checked against the object size and its destination view).
    pub read: &'r StridedRead<'a>,
    /// Address of object offset `src_origin`.
    pub src: *const u8,
    /// The object offset `src` points at (at most the read's first source offset).
    pub src_origin: u64,
}

/// The segments of one strided read in row-major order, one at a time.
struct Cursor<'r> {
    counts: &'r [u64],
    src_strides: &'r [u64],
    dst_strides: &'r [u64],
    idx: Vec<u64>,
    /// Current segment: object offset (minus the origin) and destination offset.
    s: u64,
    d: u64,
    left: u64,
}

impl<'r> Cursor<'r> {
    fn new(m: &'r MappedRead<'_, '_>) -> Self {
        let r = m.read;
        Cursor {
            counts: r.counts,
            src_strides: r.src_strides,
            dst_strides: r.dst_strides,
            idx: vec![0; r.counts.len()],
            s: r.object_offset - m.src_origin,
            d: r.dest_offset,
            left: r.segment_count(),
        }
    }

    /// Steps to the next segment (last dimension fastest); `false` after the last.
    #[inline]
    fn advance(&mut self) -> bool {
        self.left -= 1;
        if self.left == 0 {
            return false;
        }
        let mut j = self.idx.len();
        while j > 0 {
            j -= 1;
            self.idx[j] += 1;
            self.s += self.src_strides[j];
            self.d += self.dst_strides[j];
            if self.idx[j] < self.counts[j] {
                break;
            }
            self.s -= self.src_strides[j] * self.idx[j];
            self.d -= self.dst_strides[j] * self.idx[j];
            self.idx[j] = 0;
        }
        true
    }
}

/// Copies every segment of `parts` into the host destination view at `dst`, in
/// destination order: the parts' row-major segment streams are merged by destination
/// offset, so rows of a target assembled from several objects (a column split, say)
/// are written front to back like one memcpy instead of one strided pass per object.
/// Segments of different parts never overlap in the destination (each part is a
/// region of a different stored fragment and stored fragments are disjoint; targets
/// are canonical contiguous views), so the order changes no byte. Issues
/// [`copy_fence`] at the end.
///
/// With `sums` (one [`CrcRuns`] per part), every copy also sums its source bytes
/// (verified restores, [`super::ObjectStore::get_into_strided_checked`]).
///
/// # Safety
/// Every part must have passed [`StridedRead::check_bounds`] against its object and
/// its destination view (`dst` is that view's first byte, valid for writes of
/// `dest.len` bytes and not accessed by anyone else); each part's `src` must be valid
/// for reads of the object bytes the read touches, until `sums` are finished;
/// sources and destination disjoint.
pub(crate) unsafe fn copy_merged(dst: *mut u8, parts: &[MappedRead<'_, '_>], mut sums: Option<&mut [CrcRuns]>) {
    // One segment: `n` bytes of object offset `obj` (at `src`) to destination offset `d`.
    let mut copy = |p: usize, d: u64, src: *const u8, obj: u64, n: u64| {
        // SAFETY: the read was checked against its object and the view (this
        // function's contract), so both ranges lie inside them.
        unsafe {
            match sums.as_deref_mut() {
                Some(s) => s[p].copy(dst.add(d as usize), src, obj, n as usize),
                None => copy_for_restore(dst.add(d as usize), src, n as usize),
            }
        }
    };
    for (c, chunk) in parts.chunks(MERGE_WAYS).enumerate() {
        let first = c * MERGE_WAYS;
        if let [one] = chunk {
            let (r, src, origin) = (one.read, one.src, one.src_origin);
            let _ = r.for_each_segment(|s, d, n| {
                // SAFETY: `s - origin` lies inside the checked source bytes.
                copy(first, d, unsafe { src.add((s - origin) as usize) }, s, n);
                Ok(())
            });
            continue;
        }
        let mut heads: Vec<(Cursor<'_>, *const u8, u64, usize, u64)> = chunk
            .iter()
            .enumerate()
            .map(|(i, m)| (Cursor::new(m), m.src, m.src_origin, first + i, m.read.inner_bytes))
            .collect();
        while !heads.is_empty() {
            let mut k = 0;
            for (i, h) in heads.iter().enumerate().skip(1) {
                if h.0.d < heads[k].0.d {
                    k = i;
                }
            }
            let (c, src, origin, p, n) = &mut heads[k];
            // SAFETY: as above: the current segment of a checked read lies inside its
            // source bytes and inside the destination view.
            copy(*p, c.d, unsafe { src.add(c.s as usize) }, c.s + *origin, *n);
            if !c.advance() {
                heads.swap_remove(k);
            }
        }
    }
    copy_fence();
}

/// Groups of consecutive items with the same destination view (address, length,
/// kind), as index ranges: the unit of [`copy_merged`].
pub(crate) fn dest_groups(reads: &[StridedRead<'_>]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=reads.len() {
        if i == reads.len() || reads[i].dest != reads[start].dest {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// The restore path's copy is the crate's streaming memcpy ([`crate::copy`]), shared
/// with the embedded transfer engine.
pub(crate) use crate::copy::{copy_fence, copy_streaming as copy_for_restore};
