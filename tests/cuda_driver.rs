//! The production CUDA engine (`device::CudaEngine`) on CPU, through a fake CUDA
//! driver (`tests/fake_cuda/fake_cuda.c`, compiled here with the system C compiler
//! and named by `MWS_CUDA_DRIVER`): the same driver calls, descriptors and error
//! paths as on a GPU. The fake's device memory is fenced (a host dereference of it
//! crashes), and it refuses copies whose memory types disagree with their addresses.
//! A snapshot from device memory, a resharded verified restore into it and a live
//! reshard device -> device, and delta steps device -> device, run through it,
//! every byte checked. What a GPU adds
//! (speed, the real driver) is `scripts/gpu-check.sh`'s.

#[path = "common/device.rs"]
mod device_model;
#[path = "common/model.rs"]
mod model;

use device_model::{leases, DeviceModel};
use model::*;
use mooncake_weight_store::device::{copy_ranges, CopyDirection, CopyOp, CopyRange, CudaEngine, DeviceEngine};
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, WeightStore};
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::ErrorKind;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

/// Builds the fake driver into the test's target directory; the test fails (never
/// skips) without a C compiler.
fn fake_driver() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda/fake_cuda.c");
    let out = std::env::temp_dir().join(format!("mws-fake-cuda-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("the C compiler `{cc}` is needed to build the fake CUDA driver: {e}"));
    assert!(status.success(), "building {} failed", src.display());
    out
}

#[test]
fn the_cuda_engine_moves_every_path_through_a_fake_driver() {
    let driver = fake_driver();
    // Only this test of this binary touches the variable, before the engine opens the driver.
    std::env::set_var("MWS_CUDA_DRIVER", &driver);
    let engine = Arc::new(CudaEngine::new(0, None).unwrap());
    let e = CudaEngine::new(1, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.message().contains("cuDeviceGet failed: CUDA error 101 (invalid device ordinal)"), "{e}");

    // 2-D copies in each direction, checked byte for byte.
    let rows = 500u64;
    let host: Vec<u8> = (0..rows * 300).map(|i| (i * 7 % 251) as u8).collect();
    let pitched = engine.alloc_device(rows * 128).unwrap();
    let dense = engine.alloc_device(rows * 100).unwrap();
    let mut back = vec![0u8; (rows * 100) as usize];
    let up: Vec<CopyRange> = (0..rows)
        .map(|r| CopyRange { source: host.as_ptr() as u64 + r * 300, target: pitched + r * 128, len: 100 })
        .collect();
    let across: Vec<CopyRange> =
        (0..rows).map(|r| CopyRange { source: pitched + r * 128, target: dense + r * 100, len: 100 }).collect();
    let before = engine.stats();
    // SAFETY: host buffers owned here, device memory allocated above.
    let copies = unsafe {
        copy_ranges(&*engine, 0, CopyDirection::HostToDevice, &up).unwrap()
            + copy_ranges(&*engine, 0, CopyDirection::DeviceToDevice, &across).unwrap()
            + copy_ranges(
                &*engine,
                0,
                CopyDirection::DeviceToHost,
                &[CopyRange { source: dense, target: back.as_mut_ptr() as u64, len: rows * 100 }],
            )
            .unwrap()
    };
    assert_eq!(copies, 3, "1,000 rows in two 2-D copies and one plain copy");
    let want: Vec<u8> = (0..rows as usize).flat_map(|r| host[r * 300..r * 300 + 100].to_vec()).collect();
    assert!(back == want);
    let st = engine.stats();
    // Per batch: push, copies, event create and record, pop, synchronize.
    assert_eq!(st.driver_calls - before.driver_calls, 3 * 6, "{st:?}");
    // A device address handed over as host memory is refused by the driver: an error, no crash.
    let bad = [CopyOp { source: pitched, source_pitch: 8, target: dense, target_pitch: 8, width: 8, height: 2 }];
    // SAFETY: refused by the driver before any byte moves.
    let e = unsafe { engine.submit(0, CopyDirection::HostToDevice, &bad) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.message().contains("cuMemcpy2DAsync failed"), "{e}");

    // Pinned staging is pooled: a second buffer of a size served before allocates nothing.
    drop(engine.staging(3 << 20).unwrap());
    let before = engine.stats().driver_calls;
    let b = engine.staging(4 << 20).unwrap();
    assert_eq!(engine.stats().driver_calls, before, "served from the pool");
    assert!(b.len() == 4 << 20);
    drop(b);

    // Snapshot from device memory, resharded verified restore into it.
    let dev: Arc<dyn DeviceEngine> = engine.clone();
    let alloc = |n: u64| engine.alloc_device(n).unwrap();
    let defs = model_tensors(2, 256, 0);
    let src_host =
        HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let src = DeviceModel::new(src_host, dev.clone(), &alloc, "t");
    let ws = WeightStore::new(Arc::new(MemoryStore::new())).with_device_engine(dev.clone());
    let manifest = src.host.snapshot_into(&ws).unwrap();
    let dst_host =
        HostModel::new(build_placement("target", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    let mut dst = DeviceModel::new(dst_host, dev.clone(), &alloc, "s");
    let m = Arc::new(ws.load_manifest(manifest.manifest_key()).unwrap());
    let plan = ws.plan_load(m, dst.host.placement.clone(), &dst.host.bindings, PlanningLimits::default()).unwrap();
    for b in &dst.host.bindings {
        // SAFETY: the device allocations outlive the call.
        let st = unsafe { ws.load(&plan, b, LoadArgs { guard: Some(&StaticGuard), ..Default::default() }) }.unwrap();
        assert!(st.verified_bytes >= st.bytes && st.bytes > 0, "{st:?}");
    }
    assert_eq!(dst.verify() as u64, plan.regions().iter().map(|r| r.total_bytes()).sum::<u64>());

    // Live reshard device -> device (sink mode) through the embedded engine.
    dst.clear(0xA5);
    let local = Arc::new(LocalEngine::with_device_engine(dev.clone()));
    dst.register(&*local, true);
    let logical =
        LogicalTransferPlan::plan(src.host.placement.clone(), dst.host.placement.clone(), PlanningLimits::default())
            .unwrap();
    let tplan = TransferPlan::bind(&logical, &dst.host.bindings, &src.host.bindings).unwrap();
    let leases = leases(&dst.host.bindings);
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let ex = TransferExecutor::new(local.clone(), ExecutorLimits::default()).unwrap();
    for b in &src.host.bindings {
        // SAFETY: device allocations alive for the call.
        unsafe { ex.execute_sink(&tplan, &src.host.placement, b, &dst.host.placement, &dst.host.bindings, &args) }
            .unwrap();
    }
    assert_eq!(dst.verify() as u64, tplan.total_bytes());
    dst.register(&*local, false);

    // Verified and delta steps of prepared pushes (issue 47) device -> device through
    // the CUDA engine: checksums, encodes and applies staged through it.
    device_model::delta_steps_on(dev.clone(), &alloc, true, true);
    // Pulled: published device sources, device targets of prepared readers.
    device_model::pulled_delta_steps_on(dev.clone(), &alloc, true, true);
    let _ = std::fs::remove_file(driver);
}
