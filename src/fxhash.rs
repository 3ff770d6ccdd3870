//! A small, fast, non-cryptographic hasher (the Fx hash of rustc) for the
//! in-memory indexes of validation and planning. Inputs are our own validated
//! values, and a worst case degrades to slower lookups, never to wrong answers.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The Fx hasher.
#[derive(Clone, Copy, Default)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with the Fx hasher.
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with the Fx hasher.
pub type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// An empty map with room for `n` entries.
pub fn map_with_capacity<K, V>(n: usize) -> FxHashMap<K, V> {
    FxHashMap::with_capacity_and_hasher(n, Default::default())
}

/// An empty set with room for `n` entries.
pub fn set_with_capacity<K>(n: usize) -> FxHashSet<K> {
    FxHashSet::with_capacity_and_hasher(n, Default::default())
}

/// The Fx hash of `key`.
#[inline]
fn hash_of<K: std::hash::Hash + ?Sized>(key: &K) -> u64 {
    let mut h = FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The Fx hash of a string (as `Hash for str` feeds it).
#[inline]
pub(crate) fn hash_str(s: &str) -> u64 {
    hash_of(s)
}

/// Whether two of the hashes in `runs` are equal; each run must be sorted. False
/// proves the hashed keys distinct. Pure; O(n log k) for `n` hashes in `k` runs.
///
/// Runs are merged pairwise (a value that two runs share ends the walk) until two are
/// left, and those two are walked side by side without building their merge: for the
/// usual one run per worker thread, one branch-free pass over both.
pub(crate) fn has_repeated_hash_runs(runs: &[Vec<u64>]) -> bool {
    debug_assert!(runs.iter().all(|r| r.is_sorted()));
    if runs.iter().any(|r| r.windows(2).any(|w| w[0] == w[1])) {
        return true;
    }
    let mut level: Vec<std::borrow::Cow<'_, [u64]>> = runs.iter().map(|r| r.as_slice().into()).collect();
    while level.len() > 2 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        let mut pending = level.into_iter();
        while let Some(a) = pending.next() {
            match pending.next() {
                Some(b) => match merge_distinct(&a, &b) {
                    Some(merged) => next.push(merged.into()),
                    None => return true,
                },
                None => next.push(a),
            }
        }
        level = next;
    }
    match &level[..] {
        [a, b] => share_a_value(a, b),
        _ => false,
    }
}

/// The merge of two sorted runs of distinct values, or `None` when they share one.
fn merge_distinct(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (i, j) = walk_distinct(a, b, |v| out.push(v))?;
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    Some(out)
}

/// Whether two sorted runs share a value.
fn share_a_value(a: &[u64], b: &[u64]) -> bool {
    walk_distinct(a, b, |_| {}).is_none()
}

/// Walks two sorted runs side by side (branch-free steps), handing `take` each value
/// in merged order until one run ends: `None` at the first value both hold, else where
/// each run's untaken rest starts.
#[inline(always)]
fn walk_distinct(a: &[u64], b: &[u64], mut take: impl FnMut(u64)) -> Option<(usize, usize)> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        if x == y {
            return None;
        }
        take(x.min(y));
        i += usize::from(x < y);
        j += usize::from(y < x);
    }
    Some((i, j))
}

/// Whether two of the keys `key(0)`, ..., `key(n - 1)` are equal (see
/// [`equal_key_groups`]). No errors; pure.
pub(crate) fn has_duplicate<K: std::hash::Hash + Ord>(n: usize, key: impl Fn(usize) -> K) -> bool {
    !equal_key_groups(n, key).is_empty()
}

/// The indices of keys that occur more than once among `key(0)`, ...,
/// `key(n - 1)`: one group per repeated key, each in index order (groups in no
/// particular order); keys that occur once are in none.
///
/// One hash per key, a sort of the `(hash, index)` pairs, and key comparisons only
/// where hashes tie (those keys are sorted by value, so colliding hashes cost
/// `k log k`, never `k²`). For millions of keys this streams through memory where
/// a hash table probes at random, several times faster, and allocates nothing per
/// key; a caller that needs the first repeat in order (for its error message) looks
/// for it only once this found one. No errors; pure.
pub(crate) fn equal_key_groups<K: std::hash::Hash + Ord>(n: usize, key: impl Fn(usize) -> K) -> Vec<Vec<usize>> {
    let mut hashes: Vec<(u64, usize)> = (0..n).map(|i| (hash_of(&key(i)), i)).collect();
    hashes.sort_unstable();
    let mut groups = Vec::new();
    for run in hashes.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() > 1) {
        let mut idx: Vec<usize> = run.iter().map(|&(_, i)| i).collect();
        idx.sort_by(|&a, &b| key(a).cmp(&key(b)).then(a.cmp(&b)));
        groups.extend(idx.chunk_by(|&a, &b| key(a) == key(b)).filter(|g| g.len() > 1).map(<[usize]>::to_vec));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_duplicate_finds_equal_keys_only() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("fragment-{i}")).collect();
        assert!(!has_duplicate(ids.len(), |i| ids[i].as_str()));
        assert!(!has_duplicate(0, |i| ids[i].as_str()));
        let mut twice = ids.clone();
        twice.push("fragment-4711".into());
        assert!(has_duplicate(twice.len(), |i| twice[i].as_str()));
        // Tuples and slices, as the geometry checks use them.
        let boxes: Vec<(u32, Vec<u64>)> = vec![(0, vec![0, 4]), (0, vec![4, 0]), (1, vec![0, 4])];
        assert!(!has_duplicate(boxes.len(), |i| (boxes[i].0, boxes[i].1.as_slice())));
        let same: Vec<(u32, Vec<u64>)> = vec![(0, vec![0, 4]), (1, vec![2]), (0, vec![0, 4])];
        assert!(has_duplicate(same.len(), |i| (same[i].0, same[i].1.as_slice())));
    }

    #[test]
    fn equal_key_groups_lists_each_repeat_in_index_order() {
        let keys = ["a", "b", "a", "c", "b", "a"];
        let mut groups = equal_key_groups(keys.len(), |i| keys[i]);
        groups.sort();
        assert_eq!(groups, vec![vec![0, 2, 5], vec![1, 4]]);
        assert!(equal_key_groups(3, |i| ["x", "y", "z"][i]).is_empty());
    }

    /// The run screen agrees with a set over the same hashes: one to seven runs,
    /// repeats inside a run, across two runs, and across runs merged at different
    /// levels.
    #[test]
    fn repeated_hash_runs_agree_with_a_set() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 5_000
        };
        let (mut repeated, mut distinct) = (0, 0);
        for case in 0..600 {
            let k = 1 + case % 7;
            let mut runs: Vec<Vec<u64>> =
                (0..k).map(|_| (0..(next() % 40) as usize).map(|_| next()).collect()).collect();
            if case % 3 != 0 {
                // Mostly distinct values: each run deduplicated, and offset per run.
                for (r, run) in runs.iter_mut().enumerate() {
                    for v in run.iter_mut() {
                        *v = *v * 8 + r as u64;
                    }
                    run.sort_unstable();
                    run.dedup();
                }
                if case % 3 == 2 && k > 1 {
                    // One value shared by two runs chosen by the case.
                    let (a, b) = (case % k, (case / 7) % k);
                    if a != b {
                        runs[a].push(99_999);
                        runs[b].push(99_999);
                    }
                }
            }
            for run in &mut runs {
                run.sort_unstable();
            }
            let mut seen = std::collections::HashSet::new();
            let expected = !runs.iter().flatten().all(|v| seen.insert(*v));
            assert_eq!(has_repeated_hash_runs(&runs), expected, "case {case}: {runs:?}");
            if expected {
                repeated += 1;
            } else {
                distinct += 1;
            }
        }
        assert!(repeated > 100 && distinct > 100, "both outcomes covered: {repeated} / {distinct}");
        assert!(!has_repeated_hash_runs(&[]));
        assert!(!has_repeated_hash_runs(&[vec![], vec![1], vec![]]));
        assert!(has_repeated_hash_runs(&[vec![1, 5], vec![2], vec![3], vec![4], vec![5]]));
    }

    /// Keys whose hashes all collide are still told apart by value.
    #[test]
    fn has_duplicate_survives_colliding_hashes() {
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        struct Collide(u32);
        impl std::hash::Hash for Collide {
            fn hash<H: Hasher>(&self, h: &mut H) {
                h.write_u64(7);
            }
        }
        assert!(!has_duplicate(5_000, |i| Collide(i as u32)));
        assert!(has_duplicate(5_000, |i| Collide((i % 4_999) as u32)));
    }
}
