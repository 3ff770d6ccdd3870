//! Progress reports (issue 12, item 5) through the Rust API: the snapshot writer
//! (totals of the whole plan), restores (one call per target participant) on the
//! memory and directory stores; reports are monotonic, start at 0, end at the totals,
//! and the final one matches the load statistics.

#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, Progress, ProgressPhase, StaticGuard, StoreLimits, WeightStore};
use mooncake_weight_store::store::{directory::DirectoryStore, memory::MemoryStore, ObjectStore};
use parking_lot::Mutex;
use std::sync::Arc;

fn check_call(call: &[Progress], phase: ProgressPhase) {
    assert!(!call.is_empty());
    assert_eq!((call[0].bytes_done, call[0].items_done), (0, 0), "{call:?}");
    let last = call.last().unwrap();
    assert_eq!((last.bytes_done, last.items_done), (last.bytes_total, last.items_total), "{call:?}");
    for w in call.windows(2) {
        assert!(w[0].bytes_done <= w[1].bytes_done && w[0].items_done <= w[1].items_done, "{call:?}");
        assert_eq!((w[0].bytes_total, w[0].items_total), (w[1].bytes_total, w[1].items_total));
    }
    assert!(call.iter().all(|p| p.phase == phase));
}

fn run(backend: Arc<dyn ObjectStore>) {
    let defs = model_tensors(2, 64, 4);
    let src = HostModel::new(build_placement("source", Layout { tp: 4, pp: 1, ep: 2, dp: 1 }, &defs, 1), true, "t", 1);
    let ws = WeightStore::new(backend);
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = seen.clone();
    let manifest = ws
        .snapshot(&src.descriptor("default"), HostAdapter(&src), |w| {
            w.set_progress(Some(Box::new(move |p: &Progress| sink.lock().push(*p))));
            let ops: Vec<(String, String)> = w
                .plan()
                .operations()
                .iter()
                .map(|o| (o.source_placement().tensor_id().to_string(), o.source_participant_id().to_string()))
                .collect();
            let mut done = std::collections::BTreeSet::new();
            for (t, p) in ops {
                if done.insert((t.clone(), p.clone())) {
                    w.write_tensor(&t, &p)?;
                }
            }
            Ok(())
        })
        .unwrap();
    let snap = seen.lock().clone();
    // One set of totals across every participant's upload, ending at the plan's.
    assert!(snap.iter().all(|p| p.phase == ProgressPhase::Upload));
    let last = snap.last().unwrap();
    assert_eq!(last.bytes_total, manifest.fragments().iter().map(|f| f.nbytes()).sum::<u64>());
    assert_eq!(last.items_total, manifest.fragments().len() as u64);
    assert_eq!((last.bytes_done, last.items_done), (last.bytes_total, last.items_total));
    assert!(snap.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done && w[0].bytes_total == w[1].bytes_total));

    let mut dst =
        HostModel::new(build_placement("target", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    dst.bindings = dst.make_bindings("s", 1);
    let plan =
        ws.plan_load(Arc::new(manifest), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let mut moved = 0;
    for b in &dst.bindings {
        let calls: Mutex<Vec<Progress>> = Mutex::default();
        let f = |p: &Progress| calls.lock().push(*p);
        let args = LoadArgs { guard: Some(&StaticGuard), progress: Some(&f), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        let st = unsafe { ws.load(&plan, b, args) }.unwrap();
        let calls = calls.into_inner();
        check_call(&calls, ProgressPhase::Restore);
        let last = calls.last().unwrap();
        assert_eq!((last.bytes_done, last.items_done), (st.bytes, st.regions));
        moved += last.bytes_total;
    }
    assert_eq!(moved, plan.total_bytes());
    assert!(dst.verify().unwrap() > 0);
}

#[test]
fn progress_memory_store() {
    run(Arc::new(MemoryStore::new()));
}

#[test]
fn progress_directory_store() {
    let dir = std::env::temp_dir().join(format!("mws-progress-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    run(Arc::new(DirectoryStore::open(&dir).unwrap()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A restore made of many store requests (a ranged store, 2 ranges per request,
/// staging off) reports work in between, not only the start and the end; the reports
/// never run ahead of the bytes the finished requests delivered.
#[test]
fn restore_reports_progress_between_requests() {
    let defs = model_tensors(1, 64, 2);
    let src = HostModel::new(build_placement("source", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let limits = StoreLimits { max_ranges_per_request: 2, staging_bytes: 0, ..Default::default() };
    let ws = WeightStore::new(fake_store::FakeStore::new()).with_limits(limits).unwrap();
    let manifest = Arc::new(src.snapshot_into(&ws).unwrap());
    let mut dst =
        HostModel::new(build_placement("target", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    dst.bindings = dst.make_bindings("s", 1);
    let plan = ws.plan_load(manifest, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let calls: Mutex<Vec<Progress>> = Mutex::default();
    let f = |p: &Progress| calls.lock().push(*p);
    let args = LoadArgs { guard: Some(&StaticGuard), progress: Some(&f), ..Default::default() };
    // SAFETY: dst.buffers outlive the call and nobody else touches them.
    let st = unsafe { ws.load(&plan, &dst.bindings[0], args) }.unwrap();
    assert!(st.requests > 2, "{st:?}");
    let calls = calls.into_inner();
    check_call(&calls, ProgressPhase::Restore);
    assert!(calls.iter().any(|p| p.bytes_done > 0 && p.bytes_done < p.bytes_total), "{calls:?}");
    assert!(dst.verify().unwrap() > 0);
}
