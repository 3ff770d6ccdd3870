//! Opt-in staging for stores that pay per range (`StoreLimits::staging_bytes`):
//! the same bytes land in the targets with far fewer ranges, and staging off
//! keeps exactly the specified ranges.

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
        Ok(())
    }
    fn unregister_buffer(&self, address: u64) -> Result<()> {
        let mut reg = self.registered.lock();
        let entry = *reg.iter().find(|(a, _)| *a == address).expect("registered");
        reg.remove(&entry);
        Ok(())
    }
}

fn restore(staging_bytes: u64) -> (usize, usize, Vec<Vec<u8>>) {
    let defs = model_tensors(2, 64, 4);
    let src =
        HostModel::new(build_placement("src", Layout { tp: 4, pp: 1, ep: 2, dp: 1 }, &defs, 1), true, "trainer", 1);
    let backend = Arc::new(RangeOnly::default());
    let limits = StoreLimits { staging_bytes, ..StoreLimits::default() };
    let ws = WeightStore::new(backend.clone()).with_limits(limits).unwrap();
    let m = src.snapshot_into(&ws).unwrap();
    let dst =
        HostModel::new(build_placement("dst", Layout { tp: 2, pp: 1, ep: 4, dp: 1 }, &defs, 1), false, "serving", 1);
    let plan = ws.plan_load(Arc::new(m), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    backend.calls.lock().clear();
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call.
        unsafe { ws.load(&plan, b, args) }.unwrap();
    }
    dst.verify().unwrap();
    assert!(backend.registered.lock().is_empty(), "everything unregistered");
    let calls = backend.calls.lock();
    (calls.len(), calls.iter().sum(), dst.buffers.clone())
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
