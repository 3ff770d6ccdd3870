//! `TransferPlan::bind` against the binding algorithm as the reference states it
//! (`live-transfer.md` §2–§3), written plainly here: operations located by
//! placement fragment id, the target physical ranges of every write, source/target
//! allocation disjointness per shared address space and executors per (binding,
//! worker). Random bindings: several workers and devices per participant, instances
//! shared between participants and between the two sides, allocations that
//! sometimes overlap across the sides.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{validate_target_physical_ranges, Side, TargetWrite, TransferPlan};
use mooncake_weight_store::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Bindings of every part of `p` with fragments. Each fragment goes to one of
/// `workers` workers and `devices` devices; each participant to one of
/// `instances` instances named `<prefix><k>`; allocations laid out per
/// (instance, worker, device) from `base`, so that two sides with equal bases and
/// instance names collide.
fn bindings(p: &Placement, rng: &mut Rng, prefix: &str, instances: u64, base: u64) -> Vec<RuntimeBinding> {
    let mut next: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let (workers, devices) = (1 + rng.below(2), 1 + rng.below(2));
    let mut out = Vec::new();
    for part in p.parts().iter().filter(|part| !part.fragments().is_empty()) {
        let pid = part.participant_id();
        let instance = format!("{prefix}{}", rng.below(instances));
        let mut frags = Vec::new();
        for (k, f) in part.fragments().iter().enumerate() {
            let itemsize = p.tensor(f.tensor_id()).unwrap().itemsize();
            let worker = format!("w{}", rng.below(workers));
            let device = format!("cuda:{}", rng.below(devices));
            let at = next.entry((instance.clone(), worker.clone(), device.clone())).or_insert(base);
            let address = *at;
            *at += f.nbytes().next_multiple_of(0x100);
            frags.push(
                RuntimeFragment::new(RuntimeFragmentSpec {
                    placement_fragment_id: f.placement_fragment_id().into(),
                    fragment_id: format!("{prefix}{pid}-rt{}", (k * 7919) % part.fragments().len()),
                    address,
                    nbytes: f.nbytes(),
                    worker_id: worker,
                    endpoint: "e:1".into(),
                    device,
                    itemsize,
                    local_shape: f.local_shape().to_vec(),
                    strides_bytes: canonical_strides(f.local_shape(), itemsize),
                    storage_address: address,
                    storage_nbytes: f.nbytes(),
                    storage_offset_bytes: 0,
                    memory: MemoryKind::Host,
                })
                .unwrap(),
            );
        }
        out.push(
            RuntimeBinding::new(RuntimeBindingSpec {
                resource_id: p.resource_id().into(),
                placement_id: p.placement_id().into(),
                placement_digest: p.digest().into(),
                instance_id: instance,
                lease_generation: 1 + rng.below(3),
                lease_id: format!("lease-{pid}"),
                revision: p.revision().into(),
                participant_id: pid.into(),
                fragments: frags,
            })
            .unwrap(),
        );
    }
    out
}

/// What an executor of the reference holds (binding by participant).
type Executor = (String, String, String, ParallelRank, Vec<String>, Vec<u32>);

/// The reference's binding after the binding checks: `Ok(executors of both sides)`
/// or the first error's message.
fn oracle(
    logical: &LogicalTransferPlan,
    tb: &[RuntimeBinding],
    sb: &[RuntimeBinding],
) -> std::result::Result<(Vec<Executor>, Vec<Executor>), String> {
    let find = |bs: &[RuntimeBinding], participant: &str, pfid: &str| -> (usize, usize) {
        let b = bs.iter().position(|b| b.participant_id() == participant).unwrap();
        let f = bs[b].fragments().iter().position(|f| f.placement_fragment_id() == pfid).unwrap();
        (b, f)
    };
    let ops: Vec<((usize, usize), (usize, usize))> = logical
        .regions()
        .iter()
        .map(|r| {
            let s = find(sb, logical.source_participant_of(r), logical.source_of(r).placement_fragment_id());
            let t = find(tb, logical.target_participant_of(r), logical.target_of(r).placement_fragment_id());
            (s, t)
        })
        .collect();
    let writes: Vec<TargetWrite<'_>> = logical
        .regions()
        .iter()
        .zip(&ops)
        .map(|(r, &(_, (b, f)))| TargetWrite {
            instance_id: tb[b].instance_id(),
            lease_id: tb[b].lease_id(),
            lease_generation: tb[b].lease_generation(),
            target: &tb[b].fragments()[f],
            target_placement: logical.target_of(r),
            region: r,
            source_placement: logical.source_of(r),
        })
        .collect();
    validate_target_physical_ranges(&writes, logical.limits().max_total_lowered_segments)
        .map_err(|e| e.message().to_string())?;
    type Ranges = (Vec<(u64, u64)>, Vec<(u64, u64)>);
    let mut spaces: BTreeMap<(&str, &str, &str), Ranges> = BTreeMap::new();
    for &((sbi, sf), (tbi, tf)) in &ops {
        let (b, f) = (&sb[sbi], &sb[sbi].fragments()[sf]);
        let range = (f.storage_address(), f.storage_address() + f.storage_nbytes());
        spaces.entry((b.instance_id(), f.worker_id(), f.device())).or_default().0.push(range);
        let (b, f) = (&tb[tbi], &tb[tbi].fragments()[tf]);
        let range = (f.storage_address(), f.storage_address() + f.storage_nbytes());
        spaces.entry((b.instance_id(), f.worker_id(), f.device())).or_default().1.push(range);
    }
    for ((i, w, d), (src, tgt)) in &spaces {
        if src.iter().any(|s| tgt.iter().any(|t| s.0 < t.1 && t.0 < s.1)) {
            return Err(format!(
                "source and target runtime storage allocations overlap in address space ('{i}', '{w}', '{d}'); in-place reshard is unsupported"
            ));
        }
    }
    let executors = |bs: &[RuntimeBinding], placement: &Placement, side: Side| -> Vec<Executor> {
        type Used = (Vec<usize>, Vec<u32>);
        let mut used: BTreeMap<(usize, &str), Used> = BTreeMap::new();
        for (i, &(s, t)) in ops.iter().enumerate() {
            let (b, f) = if side == Side::Source { s } else { t };
            let e = used.entry((b, bs[b].fragments()[f].worker_id())).or_default();
            e.0.push(f);
            e.1.push(i as u32);
        }
        let mut out: Vec<Executor> = used
            .into_iter()
            .map(|((b, worker), (frags, ops))| {
                let mut ids: Vec<String> =
                    frags.iter().map(|&f| bs[b].fragments()[f].fragment_id().to_string()).collect();
                ids.sort();
                ids.dedup();
                let rank = placement.part(bs[b].participant_id()).unwrap().rank();
                (
                    bs[b].participant_id().to_string(),
                    worker.to_string(),
                    bs[b].instance_id().to_string(),
                    rank,
                    ids,
                    ops,
                )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out.sort_by_key(|e| e.3.order_key());
        out
    };
    let keys = |e: &[Executor]| e.iter().map(|e| (e.3.order_key(), e.1.clone())).collect::<HashSet<_>>().len();
    let (s, t) = (executors(sb, logical.source(), Side::Source), executors(tb, logical.target(), Side::Target));
    assert_eq!(keys(&s), s.len(), "one executor per (rank, worker)");
    assert_eq!(keys(&t), t.len(), "one executor per (rank, worker)");
    Ok((s, t))
}

fn executors_of(plan: &TransferPlan, side: Side) -> Vec<Executor> {
    plan.executors(side)
        .iter()
        .map(|e| {
            let b = &plan.bindings(side)[e.binding as usize];
            assert_eq!(e.participant_id, b.participant_id());
            let ids: Vec<String> =
                e.fragments.iter().map(|&f| b.fragments()[f as usize].fragment_id().to_string()).collect();
            assert_eq!(ids, e.fragment_ids);
            (
                e.participant_id.clone(),
                e.worker_id.clone(),
                e.instance_id.clone(),
                e.rank,
                ids,
                e.operation_indices.clone(),
            )
        })
        .collect()
}

#[test]
fn bind_matches_the_reference_algorithm() {
    let defs = model_tensors(2, 64, 4);
    let layouts = [
        (Layout { tp: 4, pp: 2, ep: 2, dp: 2 }, Layout { tp: 2, pp: 1, ep: 4, dp: 1 }),
        (Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, Layout { tp: 4, pp: 2, ep: 2, dp: 1 }),
        (Layout { tp: 1, pp: 2, ep: 4, dp: 1 }, Layout { tp: 2, pp: 1, ep: 1, dp: 2 }),
    ];
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for (k, (s, t)) in layouts.iter().enumerate() {
        let src = Arc::new(build_placement("trainer", *s, &defs, 1));
        let dst = Arc::new(build_placement("serving", *t, &defs, 1));
        let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), PlanningLimits::default()).unwrap();
        for round in 0..40 {
            // Sides in distinct instances, or sharing instance names (and then,
            // every other round, address ranges too).
            let shared = round % 3 == 0;
            let (sp, tp) = if shared { ("i", "i") } else { ("src-i", "dst-i") };
            let tbase = if shared && round % 2 == 0 { 0x1000 } else { 0x4000_0000 };
            let (si, ti) = (1 + rng.below(4), 1 + rng.below(3));
            let sb = bindings(&src, &mut rng, sp, si, 0x1000);
            let tb = bindings(&dst, &mut rng, tp, ti, tbase);
            let expected = oracle(&logical, &tb, &sb);
            let default = TransferPlan::bind(&logical, &tb, &sb);
            let injected = TransferPlan::bind_with(&logical, &tb, &sb, &validate_target_physical_ranges);
            match (&expected, default, injected) {
                (Ok((se, te)), Ok(a), Ok(b)) => {
                    assert_eq!(a, b);
                    for plan in [&a, &b] {
                        assert_eq!(&executors_of(plan, Side::Source), se, "layout {k} round {round}");
                        assert_eq!(&executors_of(plan, Side::Target), te, "layout {k} round {round}");
                        for i in 0..plan.regions().len() {
                            let (s, t) =
                                (plan.operation_fragment(i, Side::Source), plan.operation_fragment(i, Side::Target));
                            let r = &plan.regions()[i];
                            assert_eq!(s.1.placement_fragment_id(), logical.source_of(r).placement_fragment_id());
                            assert_eq!(t.1.placement_fragment_id(), logical.target_of(r).placement_fragment_id());
                        }
                    }
                    *outcomes.entry("ok".into()).or_default() += 1;
                }
                (Err(m), Err(a), Err(b)) => {
                    assert_eq!((a.message(), b.message()), (m.as_str(), m.as_str()), "layout {k} round {round}");
                    *outcomes.entry(m.split(" in ").next().unwrap_or_default().into()).or_default() += 1;
                }
                (e, a, b) => panic!("layout {k} round {round}: expected {e:?}, bind {a:?}, bind_with {b:?}"),
            }
        }
    }
    assert!(outcomes.len() >= 2 && outcomes.get("ok").is_some_and(|&n| n > 40), "{outcomes:?}");
}
