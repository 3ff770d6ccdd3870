//! Tensor semantics across the topology (`data-model.md` §9.6–§9.7): axis roles,
//! owners and replicas, split geometry.

use super::fragment::PlacementFragment;
use super::topology::ParallelTopology;
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::model::axes::{AxisKind, ParallelAxis, ParallelRank};
use crate::model::tensor::TensorDescriptor;
use std::collections::{BTreeMap, BTreeSet};

/// Per-kind role of a tensor's axes: 0 undeclared, 1 split, 2 replicated, 3 ownership.
pub(super) struct AxisSignature {
    pub(super) code: [u8; 4],
}

impl AxisSignature {
    pub(super) fn of(t: &TensorDescriptor) -> Self {
        let mut code = [0u8; 4];
        for a in t.parallel_axes() {
            code[a.kind() as usize] = match a {
                ParallelAxis::Split { .. } => 1,
                ParallelAxis::Replicated(_) => 2,
                ParallelAxis::Ownership(_) => 3,
            };
        }
        AxisSignature { code }
    }

    /// Projects `rank` onto the kinds of role `role` (other coordinates zeroed).
    pub(super) fn key(&self, rank: ParallelRank, role: u8) -> [u64; 4] {
        let mut k = [0u64; 4];
        for kind in AxisKind::ALL {
            if self.code[kind as usize] == role {
                k[kind as usize] = rank.coord(kind);
            }
        }
        k
    }
}

/// Topology participants grouped by owner, then replica, with their split keys.
pub(super) struct ParticipantIndex {
    pub(super) owners: HashMap<[u64; 4], BTreeMap<[u64; 4], BTreeSet<[u64; 4]>>>,
}

impl ParticipantIndex {
    pub(super) fn build(topo: &ParallelTopology, sig: &AxisSignature) -> Self {
        let mut owners: HashMap<[u64; 4], BTreeMap<[u64; 4], BTreeSet<[u64; 4]>>> = HashMap::default();
        for p in topo.participants() {
            owners
                .entry(sig.key(p.rank, 3))
                .or_default()
                .entry(sig.key(p.rank, 2))
                .or_default()
                .insert(sig.key(p.rank, 1));
        }
        ParticipantIndex { owners }
    }
}

pub(super) fn check_tensor_semantics(
    topo: &ParallelTopology,
    t: &TensorDescriptor,
    sig: &AxisSignature,
    index: &ParticipantIndex,
    frags: &[&PlacementFragment],
) -> Result<()> {
    let id = t.tensor_id();
    // (a) undeclared active axes
    let declared: Vec<AxisKind> = t.parallel_axes().iter().map(|a| a.kind()).collect();
    let varying: Vec<AxisKind> = declared
        .iter()
        .copied()
        .filter(|&k| {
            let first = frags[0].rank.coord(k);
            frags.iter().any(|f| f.rank.coord(k) != first)
        })
        .collect();
    for kind in AxisKind::ALL {
        if declared.contains(&kind) || topo.size(kind) <= 1 {
            continue;
        }
        let first = frags[0].rank.coord(kind);
        let distinct = frags.iter().any(|f| f.rank.coord(kind) != first);
        let k = kind.as_str();
        if matches!(kind, AxisKind::Dp | AxisKind::Pp) || !distinct {
            return invalid(format!(
                "global placement tensor requires explicit parallel semantics for active undeclared {k} axis: {id}"
            ));
        }
        if varying.is_empty() {
            return invalid(format!("global placement tensor varies across undeclared {k} axis: {id}"));
        }
        let mut function: HashMap<Vec<u64>, u64> = HashMap::default();
        for f in frags {
            let key: Vec<u64> = varying.iter().map(|&v| f.rank.coord(v)).collect();
            if *function.entry(key).or_insert(f.rank.coord(kind)) != f.rank.coord(kind) {
                return invalid(format!(
                    "global placement tensor varies independently across undeclared {k} axis: {id}"
                ));
            }
        }
    }
    // (b) owners and replicas
    let split_axes: Vec<(AxisKind, usize)> = t
        .parallel_axes()
        .iter()
        .filter_map(|a| match a {
            ParallelAxis::Split { kind, dim } => Some((*kind, *dim as usize)),
            _ => None,
        })
        .collect();
    let mut by_owner: BTreeMap<[u64; 4], BTreeMap<[u64; 4], Vec<&PlacementFragment>>> = BTreeMap::new();
    for f in frags {
        by_owner.entry(sig.key(f.rank, 3)).or_default().entry(sig.key(f.rank, 2)).or_default().push(f);
    }
    let empty = BTreeMap::new();
    let whole_offset = vec![0u64; t.ndim()];
    let whole = BoxRef::new(&whole_offset, t.global_shape());
    for (owner, replicas) in &by_owner {
        let expected = index.owners.get(owner).unwrap_or(&empty);
        if !expected.keys().eq(replicas.keys()) {
            return invalid(format!(
                "global placement tensor is not fully covered: missing or unexpected replicated-axis participant for {id}"
            ));
        }
        for (replica, expected_splits) in expected {
            let cover = &replicas[replica];
            let boxes: Vec<BoxRef<'_>> = cover.iter().map(|f| f.as_box()).collect();
            if !geometry::boxes_exactly_cover(whole, &boxes, HIGH_DIM_COMPARISON_BUDGET)? {
                return invalid(format!("global placement tensor is not fully covered: {id}"));
            }
            if split_axes.is_empty() {
                continue;
            }
            let split_err = || {
                Error::invalid(format!(
                    "global placement tensor is not fully covered: missing or unexpected split-axis participant for {id}"
                ))
            };
            for &(kind, _) in &split_axes {
                let values: BTreeSet<u64> = expected_splits.iter().map(|k| k[kind as usize]).collect();
                if !values.iter().copied().eq(0..topo.size(kind)) {
                    return Err(split_err());
                }
            }
            let actual: BTreeSet<[u64; 4]> = cover.iter().map(|f| sig.key(f.rank, 1)).collect();
            if actual != *expected_splits {
                return Err(split_err());
            }
            let product: u128 = split_axes
                .iter()
                .map(|&(kind, _)| actual.iter().map(|k| k[kind as usize]).collect::<BTreeSet<_>>().len() as u128)
                .product();
            if product != actual.len() as u128 {
                return invalid(format!(
                    "non-Cartesian split-axis participant mapping cannot prove rank-to-dimension ownership: {id}"
                ));
            }
            for &(kind, dim) in &split_axes {
                check_split_geometry(t, cover, kind, dim)?;
            }
        }
    }
    Ok(())
}

pub(super) fn check_split_geometry(
    t: &TensorDescriptor,
    cover: &[&PlacementFragment],
    kind: AxisKind,
    dim: usize,
) -> Result<()> {
    let mut per_rank: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for f in cover {
        per_rank
            .entry(f.rank.coord(kind))
            .or_default()
            .push((f.global_offset()[dim], f.global_offset()[dim] + f.local_shape()[dim]));
    }
    let mut merged: Vec<(u64, u64, u64)> = Vec::new();
    for (rank, mut iv) in per_rank {
        iv.sort_unstable();
        let mut cur = iv[0];
        for &(b, e) in &iv[1..] {
            if b <= cur.1 {
                cur.1 = cur.1.max(e);
            } else {
                merged.push((cur.0, cur.1, rank));
                cur = (b, e);
            }
        }
        merged.push((cur.0, cur.1, rank));
    }
    merged.sort_unstable();
    let mut expected_begin = 0;
    for &(b, e, _) in &merged {
        if b != expected_begin {
            expected_begin = u64::MAX;
            break;
        }
        expected_begin = e;
    }
    if expected_begin != t.global_shape()[dim] {
        return invalid(format!(
            "split-axis rank geometry conflicts with declared dimension: {}: {} -> dim {dim}",
            t.tensor_id(),
            kind.as_str()
        ));
    }
    Ok(())
}
