//! Fragment checks shared by parts and placements (`data-model.md` §9.4–§9.5).

use super::fragment::{check_fragment_geometry, PlacementFragment};
use crate::error::{invalid, Error, Result};
use crate::fxhash::FxHashMap as HashMap;
use crate::fxhash::FxHashSet as HashSet;
use crate::geometry::{self, BoxRef, HIGH_DIM_COMPARISON_BUDGET};
use crate::model::tensor::TensorDescriptor;
use std::collections::BTreeSet;
use std::sync::Arc;

pub(super) fn tensor_index(tensors: &[Arc<TensorDescriptor>]) -> Result<HashMap<&str, &TensorDescriptor>> {
    let mut map = crate::fxhash::map_with_capacity(tensors.len());
    for t in tensors {
        if map.insert(t.tensor_id(), &**t).is_some() {
            return invalid(format!("duplicate tensor_id: {}", t.tensor_id()));
        }
    }
    Ok(map)
}

/// §9.4 over a tensor list and fragments **sorted by placement fragment id** (so a
/// repeated id is always next to its first occurrence). `alias_check` runs §9.5
/// (placement only). Returns, per fragment, the position of its tensor in
/// `tensors`.
pub(super) fn check_fragments<'a, I>(
    tensors: &'a [Arc<TensorDescriptor>],
    fragments: I,
    alias_check: bool,
) -> Result<Vec<u32>>
where
    I: Iterator<Item = &'a PlacementFragment> + Clone,
{
    let index = tensor_index(tensors)?;
    let position: HashMap<&str, u32> = tensors.iter().enumerate().map(|(i, t)| (t.tensor_id(), i as u32)).collect();
    let all: Vec<&'a PlacementFragment> = fragments.clone().collect();
    let mut positions: Vec<u32> = Vec::with_capacity(all.len());
    let mut previous: Option<&str> = None;
    // Only when some logical fragment repeats does the loop track them (to name
    // the first repeat at its place among the other per-fragment errors).
    let logical_key = |i: usize| {
        let f = all[i];
        (f.tensor_id(), f.rank.order_key(), f.global_offset(), f.local_shape())
    };
    let repeats = crate::fxhash::has_duplicate(all.len(), logical_key);
    let mut logical: HashSet<(&str, (u64, u64, u64, u64), &[u64], &[u64])> =
        crate::fxhash::set_with_capacity(if repeats { all.len() } else { 0 });
    for (i, f) in all.iter().enumerate() {
        let id = f.placement_fragment_id();
        if previous == Some(id) {
            return invalid(format!("duplicate fragment_id: {id}"));
        }
        previous = Some(id);
        if repeats && !logical.insert(logical_key(i)) {
            return invalid(format!("duplicate logical fragment for tensor and parallel rank: {id}"));
        }
        let pos = *position
            .get(f.tensor_id())
            .ok_or_else(|| Error::invalid(format!("unknown tensor_id: {}", f.tensor_id())))?;
        check_fragment_geometry(&tensors[pos as usize], id, f.global_offset(), f.local_shape(), f.nbytes())?;
        positions.push(pos);
    }
    if alias_check {
        check_alias_completeness(&index, fragments)?;
    }
    // Boxes can only overlap within a (tensor, rank) group of two or more.
    for group in crate::fxhash::equal_key_groups(all.len(), |i| (all[i].tensor_id(), all[i].rank.order_key())) {
        let boxes: Vec<BoxRef<'a>> = group.iter().map(|&i| all[i].as_box()).collect();
        if geometry::boxes_overlap(&boxes, HIGH_DIM_COMPARISON_BUDGET)? {
            return invalid("logical fragment boxes overlap for tensor and parallel rank");
        }
    }
    Ok(positions)
}

pub(super) fn check_alias_completeness<'a, I>(index: &HashMap<&str, &TensorDescriptor>, fragments: I) -> Result<()>
where
    I: Iterator<Item = &'a PlacementFragment>,
{
    let mut declared: BTreeSet<&'a [String]> = BTreeSet::new();
    let mut per_tensor: HashMap<&'a str, BTreeSet<&'a [String]>> = HashMap::default();
    for f in fragments {
        if !f.aliases.is_empty() {
            declared.insert(&f.aliases);
        }
        per_tensor.entry(f.tensor_id()).or_default().insert(&f.aliases);
    }
    for group in declared {
        if let Some(unknown) = group.iter().find(|m| !index.contains_key(m.as_str())) {
            return invalid(format!("alias group references unknown tensor: {unknown}"));
        }
        for member in group {
            let ok = per_tensor.get(member.as_str()).is_some_and(|s| s.len() == 1 && s.contains(group));
            if !ok {
                return invalid(format!("alias group is not declared consistently for tensor: {member}"));
            }
        }
    }
    Ok(())
}
