//! N-D boxes: intersection, containment, overlap and exact-cover checks
//! (`data-model.md` §16). Pure; no per-element work anywhere.
//!
//! Boxes handed to these functions have equal rank and positive extents (every
//! caller passes validated fragments or regions).
//!
//! * 1-D overlap: sort by begin, compare with the running maximum end: `O(N log N)`.
//! * 2-D overlap: a sweep over dimension 0 keeping the active boxes' dimension-1
//!   intervals in an ordered map. Active boxes overlap pairwise on dimension 0, so if
//!   none has overlapped yet their dimension-1 intervals are pairwise disjoint and a
//!   new interval only needs its two neighbours: exact, `O(N log N)`.
//! * 3-D and up: the reference's sweep with a budget of pairwise comparisons
//!   ([`HIGH_DIM_COMPARISON_BUDGET`]); exceeding it is the contract error
//!   `high-dimensional overlap budget exceeded before validation`.

use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// The reference's budget of pairwise comparisons for the >= 3-D overlap sweep.
pub const HIGH_DIM_COMPARISON_BUDGET: u64 = 1_000_000;

/// A borrowed N-D box: `offset` and `shape` of equal length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoxRef<'a> {
    /// Begin coordinate per dimension.
    pub offset: &'a [u64],
    /// Extent per dimension (>= 1).
    pub shape: &'a [u64],
}

impl<'a> BoxRef<'a> {
    /// Builds a box view.
    pub fn new(offset: &'a [u64], shape: &'a [u64]) -> Self {
        BoxRef { offset, shape }
    }

    #[inline]
    fn end(&self, d: usize) -> u64 {
        self.offset[d].saturating_add(self.shape[d])
    }
}

/// An owned N-D box whose offset and shape live in one shared allocation: a clone
/// is a reference count, so a placement fragment, the stored fragment planned from
/// it and the plan's snapshot of it share one copy. The offset and shape may differ
/// in length (validation reports that later, naming the fragment).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct SharedBox(std::sync::Arc<[u64]>);

impl SharedBox {
    /// Copies `offset` and `shape` into one allocation.
    pub(crate) fn new(offset: &[u64], shape: &[u64]) -> Self {
        let words = std::iter::once(offset.len() as u64).chain(offset.iter().copied()).chain(shape.iter().copied());
        SharedBox(words.collect())
    }

    fn split(&self) -> usize {
        self.0[0] as usize + 1
    }

    /// Begin coordinate per dimension.
    #[inline]
    pub(crate) fn offset(&self) -> &[u64] {
        &self.0[1..self.split()]
    }

    /// Extent per dimension.
    #[inline]
    pub(crate) fn shape(&self) -> &[u64] {
        &self.0[self.split()..]
    }

    /// The box view.
    #[inline]
    pub(crate) fn as_box(&self) -> BoxRef<'_> {
        let (offset, shape) = self.0[1..].split_at(self.0[0] as usize);
        BoxRef { offset, shape }
    }

    /// Address of the words (for prefetching).
    pub(crate) fn as_ptr(&self) -> *const u64 {
        self.0.as_ptr()
    }
}

impl std::fmt::Debug for SharedBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBox").field("offset", &self.offset()).field("shape", &self.shape()).finish()
    }
}

/// Product of the extents (saturating in `u128`, which cannot overflow for u64
/// shapes of rank <= 2 and saturates beyond).
pub fn volume(shape: &[u64]) -> u128 {
    shape.iter().fold(1u128, |acc, &x| acc.saturating_mul(x as u128))
}

/// True when `a` and `b` intersect (in every dimension `a.begin < b.end` and
/// `b.begin < a.end`).
pub fn boxes_intersect(a: BoxRef<'_>, b: BoxRef<'_>) -> bool {
    (0..a.offset.len()).all(|d| a.offset[d] < b.end(d) && b.offset[d] < a.end(d))
}

/// True when `outer` contains `inner` in every dimension.
pub fn box_contains(outer: BoxRef<'_>, inner: BoxRef<'_>) -> bool {
    outer.offset.len() == inner.offset.len()
        && (0..outer.offset.len()).all(|d| outer.offset[d] <= inner.offset[d] && inner.end(d) <= outer.end(d))
}

/// True when any two of `boxes` intersect. Exact for 1-D and 2-D; for >= 3-D the
/// budgeted sweep of the reference, failing with a contract error once `budget`
/// comparisons have been made without an answer.
pub fn boxes_overlap(boxes: &[BoxRef<'_>], budget: u64) -> Result<bool> {
    if boxes.len() < 2 {
        return Ok(false);
    }
    match boxes[0].offset.len() {
        0 => Ok(true), // two 0-D boxes are the same point
        1 => Ok(overlap_1d(boxes)),
        2 => Ok(overlap_2d(boxes)),
        _ => overlap_nd(boxes, budget),
    }
}

/// Exact overlap check for any rank with no budget (the stored-manifest coverage
/// sweep). Worst case quadratic for >= 3-D inputs whose boxes all overlap on the
/// sweep dimension; linearithmic for the tilings real manifests contain.
pub fn boxes_overlap_exact(boxes: &[BoxRef<'_>]) -> bool {
    boxes_overlap(boxes, u64::MAX).unwrap_or(true)
}

fn overlap_1d(boxes: &[BoxRef<'_>]) -> bool {
    let mut iv: Vec<(u64, u64)> = boxes.iter().map(|b| (b.offset[0], b.end(0))).collect();
    iv.sort_unstable();
    let mut max_end = iv[0].1;
    for &(begin, end) in &iv[1..] {
        if begin < max_end {
            return true;
        }
        max_end = max_end.max(end);
    }
    false
}

fn overlap_2d(boxes: &[BoxRef<'_>]) -> bool {
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_unstable_by_key(|&i| boxes[i].offset[0]);
    // Active boxes: expiry heap on dim-0 end, and dim-1 intervals keyed by begin.
    let mut expiry: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut active: BTreeMap<u64, u64> = BTreeMap::new();
    for i in order {
        let b = boxes[i];
        let x0 = b.offset[0];
        while let Some(&Reverse((x_end, y_begin))) = expiry.peek() {
            if x_end > x0 {
                break;
            }
            expiry.pop();
            active.remove(&y_begin);
        }
        let (y0, y1) = (b.offset[1], b.end(1));
        if let Some((_, &prev_end)) = active.range(..=y0).next_back() {
            if prev_end > y0 {
                return true;
            }
        }
        if let Some((&next_begin, _)) = active.range(y0..).next() {
            if next_begin < y1 {
                return true;
            }
        }
        active.insert(y0, y1);
        expiry.push(Reverse((b.end(0), y0)));
    }
    false
}

fn overlap_nd(boxes: &[BoxRef<'_>], budget: u64) -> Result<bool> {
    let rank = boxes[0].offset.len();
    // Sweep dimension: the first with the most distinct (begin, end) pairs.
    let mut sweep = 0;
    let mut best = 0;
    for d in 0..rank {
        let mut pairs: Vec<(u64, u64)> = boxes.iter().map(|b| (b.offset[d], b.end(d))).collect();
        pairs.sort_unstable();
        pairs.dedup();
        if pairs.len() > best {
            best = pairs.len();
            sweep = d;
        }
    }
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_by_key(|&i| boxes[i].offset[sweep]); // stable
    let mut active: Vec<usize> = Vec::new();
    let mut comparisons: u64 = 0;
    for i in order {
        let b = boxes[i];
        let begin = b.offset[sweep];
        active.retain(|&j| boxes[j].end(sweep) > begin);
        for &j in &active {
            if comparisons >= budget {
                return Err(Error::invalid("high-dimensional overlap budget exceeded before validation"));
            }
            comparisons += 1;
            if boxes_intersect(b, boxes[j]) {
                return Ok(true);
            }
        }
        active.push(i);
    }
    Ok(false)
}

/// True when `boxes` tile `container` exactly: non-empty, every box contained, the
/// volumes add up, and no two boxes overlap (duplicates count as overlap).
pub fn boxes_exactly_cover(container: BoxRef<'_>, boxes: &[BoxRef<'_>], budget: u64) -> Result<bool> {
    if boxes.is_empty() || !boxes.iter().all(|b| box_contains(container, *b)) {
        return Ok(false);
    }
    let total = boxes.iter().fold(0u128, |acc, b| acc.saturating_add(volume(b.shape)));
    if total != volume(container.shape) {
        return Ok(false);
    }
    Ok(!boxes_overlap(boxes, budget)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, m: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % m
        }
    }

    fn brute(boxes: &[BoxRef<'_>]) -> bool {
        for i in 0..boxes.len() {
            for j in i + 1..boxes.len() {
                if boxes_intersect(boxes[i], boxes[j]) {
                    return true;
                }
            }
        }
        false
    }

    #[test]
    fn shared_box_keeps_offset_and_shape_apart() {
        let b = SharedBox::new(&[1, 2], &[3, 4, 5]);
        assert_eq!(b.offset(), &[1, 2]);
        assert_eq!(b.shape(), &[3, 4, 5]);
        assert_eq!(b.as_box(), BoxRef::new(&[1, 2], &[3, 4, 5]));
        // The split is part of the value: the same words cut elsewhere differ.
        assert_ne!(b, SharedBox::new(&[1], &[2, 3, 4, 5]));
        assert_eq!(b, b.clone());
        let empty = SharedBox::new(&[], &[]);
        assert!(empty.offset().is_empty() && empty.shape().is_empty());
        assert_eq!(format!("{b:?}"), "SharedBox { offset: [1, 2], shape: [3, 4, 5] }");
    }

    #[test]
    fn acc_216_overlap_matches_brute_force() {
        let mut rng = Lcg(7);
        for _ in 0..4000 {
            let rank = 1 + rng.next(4) as usize;
            let n = rng.next(9) as usize;
            let raw: Vec<(Vec<u64>, Vec<u64>)> = (0..n)
                .map(|_| {
                    let off = (0..rank).map(|_| rng.next(6)).collect();
                    let shp = (0..rank).map(|_| 1 + rng.next(4)).collect();
                    (off, shp)
                })
                .collect();
            let boxes: Vec<BoxRef<'_>> = raw.iter().map(|(o, s)| BoxRef::new(o, s)).collect();
            assert_eq!(boxes_overlap(&boxes, HIGH_DIM_COMPARISON_BUDGET).unwrap(), brute(&boxes), "{raw:?}");
        }
    }

    #[test]
    fn acc_216_random_two_box_tilings_cover() {
        let mut rng = Lcg(11);
        for _ in 0..500 {
            let rank = 1 + rng.next(3) as usize;
            let shape: Vec<u64> = (0..rank).map(|_| 2 + rng.next(5)).collect();
            let d = rng.next(rank as u64) as usize;
            let cut = 1 + rng.next(shape[d] - 1);
            let zero = vec![0u64; rank];
            let mut s1 = shape.clone();
            s1[d] = cut;
            let mut o2 = zero.clone();
            o2[d] = cut;
            let mut s2 = shape.clone();
            s2[d] = shape[d] - cut;
            let c = BoxRef::new(&zero, &shape);
            let a = BoxRef::new(&zero, &s1);
            let b = BoxRef::new(&o2, &s2);
            assert!(boxes_exactly_cover(c, &[a, b], 10).unwrap());
            assert!(!boxes_exactly_cover(c, &[a], 10).unwrap());
        }
    }

    #[test]
    fn acc_213_regions_cover_structurally() {
        let t = ([8u64, 4], [2u64, 6]);
        let r1 = ([8u64, 4], [1u64, 6]);
        let r2 = ([9u64, 4], [1u64, 6]);
        let c = BoxRef::new(&t.0, &t.1);
        let a = BoxRef::new(&r1.0, &r1.1);
        let b = BoxRef::new(&r2.0, &r2.1);
        assert!(boxes_exactly_cover(c, &[a, b], 0).unwrap());
        assert!(!boxes_exactly_cover(c, &[a, a], 0).unwrap());
    }

    #[test]
    fn acc_214_row_split_layout_is_fast() {
        let offs: Vec<[u64; 2]> = (0..8192u64).map(|i| [i / 2, (i % 2) * 64]).collect();
        let shape = [1u64, 64];
        let boxes: Vec<BoxRef<'_>> = offs.iter().map(|o| BoxRef::new(o, &shape)).collect();
        let zero = [0u64, 0];
        let full = [4096u64, 128];
        let start = std::time::Instant::now();
        assert!(boxes_exactly_cover(BoxRef::new(&zero, &full), &boxes, 0).unwrap());
        assert!(start.elapsed().as_secs_f64() < 2.0);
    }

    #[test]
    fn acc_215_high_dimensional_budget_fails_closed() {
        // Sweep dimension 0 (first with the most distinct intervals): the boxes are
        // active together there, so a comparison is needed; they are disjoint on
        // dimension 1.
        let a = ([0u64, 0, 0], [2u64, 1, 1]);
        let b = ([1u64, 1, 0], [2u64, 1, 1]);
        let boxes = [BoxRef::new(&a.0, &a.1), BoxRef::new(&b.0, &b.1)];
        let err = boxes_overlap(&boxes, 0).unwrap_err();
        assert!(err.message().contains("high-dimensional overlap budget"));
        assert!(!boxes_overlap(&boxes, 1).unwrap());
    }
}
