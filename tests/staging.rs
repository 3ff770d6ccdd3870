//! Staging for stores that pay per range (`StoreLimits::staging_bytes`, on by
//! default and chosen per region by the store's cost model): the same bytes land in
//! the targets with far fewer ranges, the staging buffer is registered once per
//! weight store and reused, a store whose ranges cost nothing is never staged, and
//! staging off keeps exactly the specified ranges.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::*;
use mooncake_weight_store::store::*;
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A range-only store (no native strided reads) that counts what it is asked and
/// insists that destinations are registered, like Mooncake.
#[derive(Default)]
struct RangeOnly {
    inner: memory::MemoryStore,
    registered: Mutex<BTreeSet<(u64, u64)>>,
    calls: Mutex<Vec<usize>>,
    registrations: Mutex<usize>,
    /// None: the trait's default (a remote, range-priced store).
    cost: Option<StoreCost>,
}

impl ObjectStore for RangeOnly {
    fn put(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
        self.inner.put(k, v, c)
    }
    fn upsert(&self, k: &str, v: &[u8], c: &WriteConfig<'_>) -> Result<()> {
        self.inner.upsert(k, v, c)
    }
    fn get(&self, k: &str) -> Result<Vec<u8>> {
        self.inner.get(k)
    }
    fn exists(&self, k: &str) -> Result<bool> {
        self.inner.exists(k)
    }
    fn remove(&self, k: &str) -> Result<()> {
        self.inner.remove(k)
    }
    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], c: &WriteConfig<'_>) -> Vec<Result<()>> {
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.batch_put_from(items, c) }
    }
    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        let reg = self.registered.lock();
        for r in ranges {
            let inside = reg.iter().any(|&(a, n)| r.dest.address >= a && r.dest.address + r.dest.len <= a + n);
            assert!(inside, "range into unregistered memory");
        }
        drop(reg);
        self.calls.lock().push(ranges.len());
        // SAFETY: forwards this fake's own `unsafe fn` contract to the backend it wraps.
        unsafe { self.inner.get_into_ranges(ranges) }
    }
    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        self.registered.lock().insert((region.address, region.len));
        *self.registrations.lock() += 1;
        Ok(())
    }
    fn cost(&self) -> StoreCost {
        self.cost.unwrap_or(StoreCost::REMOTE)
    }
    fn unregister_buffer(&self, address: u64) -> Result<()> {
        let mut reg = self.registered.lock();
        let entry = *reg.iter().find(|(a, _)| *a == address).expect("registered");
        reg.remove(&entry);
        Ok(())
    }
}

struct Run {
    calls: usize,
    ranges: usize,
    bytes: Vec<Vec<u8>>,
    stats: LoadStats,
    registrations: usize,
}

fn restore_with(staging_bytes: u64, cost: Option<StoreCost>, loads: usize) -> Run {
    let defs = model_tensors(2, 64, 4);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 4, pp: 1, ep: 2, dp: 1 }, &defs, 1), true, "trainer", 1);
    let backend = Arc::new(RangeOnly { cost, ..Default::default() });
    let limits = StoreLimits { staging_bytes, ..StoreLimits::default() };
    let ws = WeightStore::new(backend.clone()).with_limits(limits).unwrap();
    let m = src.snapshot_into(&ws).unwrap();
    let dst =
        HostModel::new(build_placement("dst", Layout { tp: 2, pp: 1, ep: 4, dp: 1 }, &defs, 1), false, "serving", 1);
    let plan = ws.plan_load(Arc::new(m), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    backend.calls.lock().clear();
    let before = *backend.registrations.lock();
    let mut stats = LoadStats::default();
    for _ in 0..loads {
        for b in &dst.bindings {
            let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
            // SAFETY: dst.buffers outlive the call.
            let s = unsafe { ws.load(&plan, b, args) }.unwrap();
            stats.regions += s.regions;
            stats.staged_regions += s.staged_regions;
            stats.direct_regions += s.direct_regions;
            stats.strided_regions += s.strided_regions;
            stats.staged_bytes += s.staged_bytes;
            stats.bytes += s.bytes;
        }
    }
    dst.verify().unwrap();
    // Each load registers and unregisters its target buffers; the staging buffer (one
    // per weight store) stays registered until the store is dropped.
    let registrations = *backend.registrations.lock() - before;
    drop(ws);
    assert!(backend.registered.lock().is_empty(), "everything unregistered");
    let calls = backend.calls.lock();
    Run { calls: calls.len(), ranges: calls.iter().sum(), bytes: dst.buffers.clone(), stats, registrations }
}

fn restore(staging_bytes: u64) -> (usize, usize, Vec<Vec<u8>>) {
    let r = restore_with(staging_bytes, None, 1);
    (r.calls, r.ranges, r.bytes)
}

#[test]
fn staging_moves_the_same_bytes_with_far_fewer_ranges() {
    let (calls_off, ranges_off, bytes_off) = restore(0);
    let (calls_on, ranges_on, bytes_on) = restore(1 << 20);
    assert_eq!(bytes_on, bytes_off);
    assert!(ranges_on * 4 < ranges_off, "staging: {ranges_on} ranges vs {ranges_off} without");
    assert!(calls_on <= calls_off + 8, "{calls_on} calls vs {calls_off}");
}

#[test]
fn staging_respects_a_small_buffer() {
    // A staging buffer smaller than any span leaves every region on the ranges path.
    let (_, ranges_small, _) = restore(16);
    let (_, ranges_off, _) = restore(0);
    assert_eq!(ranges_small, ranges_off);
}

#[test]
fn staging_is_on_by_default_and_explained_in_the_stats() {
    let r = restore_with(StoreLimits::default().staging_bytes, None, 1);
    let off = restore_with(0, None, 1);
    assert_eq!(r.bytes, off.bytes);
    assert!(r.stats.staged_regions > 0, "{:?}", r.stats);
    assert_eq!(r.stats.staged_regions + r.stats.direct_regions, r.stats.regions, "{:?}", r.stats);
    assert_eq!(r.stats.strided_regions, 0);
    assert!(r.stats.staged_bytes > 0, "{:?}", r.stats);
    assert!(r.ranges * 4 < off.ranges, "default: {} ranges vs {} unstaged", r.ranges, off.ranges);
    assert_eq!(off.stats.staged_regions, 0);
    assert_eq!(off.stats.direct_regions, off.stats.regions);
}

#[test]
fn the_staging_buffer_is_registered_once_and_reused() {
    let once = restore_with(1 << 20, None, 1);
    let thrice = restore_with(1 << 20, None, 3);
    assert!(thrice.stats.staged_regions == 3 * once.stats.staged_regions);
    // Target registrations grow with the number of loads; the staging buffer's does not.
    let per_load = (thrice.registrations - once.registrations) / 2;
    assert_eq!(once.registrations, per_load + 1, "one staging registration (per load: {per_load})");
}

#[test]
fn a_store_whose_ranges_cost_nothing_is_never_staged() {
    let free = StoreCost { per_request_ns: 0, per_range_ns: 0, bytes_per_second: 10_000_000_000 };
    let r = restore_with(64 << 20, Some(free), 1);
    let off = restore_with(0, None, 1);
    assert_eq!(r.stats.staged_regions, 0, "{:?}", r.stats);
    assert_eq!(r.ranges, off.ranges);
    assert_eq!(r.bytes, off.bytes);
}

#[test]
fn staged_three_dimensional_regions_land_exactly() {
    // A 3-D tensor split on dim 1 by the source and on dim 2 by the target: the
    // regions keep two outer dimensions, so staged spans are scattered in 2-D.
    let t3 = |split: u64| TensorDef {
        id: "model.experts.w3d".into(),
        shape: vec![4, 32, 64],
        tp_split: Some(split),
        expert: None,
        layer: None,
        itemsize: 2,
    };
    let src_defs = vec![t3(1)];
    let dst_defs = vec![t3(2)];
    let src =
        HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &src_defs, 1), true, "trainer", 1);
    let backend = Arc::new(RangeOnly::default());
    let ws = WeightStore::new(backend.clone());
    let m = src.snapshot_into(&ws).unwrap();
    let dst = HostModel::new(
        build_placement("dst", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &dst_defs, 1),
        false,
        "serving",
        1,
    );
    let plan = ws.plan_load(Arc::new(m), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let multi = plan.regions().iter().filter(|r| r.outer_loop_counts.len() >= 2).count();
    assert_eq!(multi, plan.regions().len(), "every region keeps two outer dimensions");
    let mut stats = LoadStats::default();
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call.
        let st = unsafe { ws.load(&plan, b, args) }.unwrap();
        stats.staged_regions += st.staged_regions;
        stats.regions += st.regions;
    }
    dst.verify().unwrap();
    assert_eq!(stats.staged_regions, stats.regions, "{stats:?}");
}
