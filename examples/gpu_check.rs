//! The GPU check (`scripts/gpu-check.sh` runs it): every device path of the library
//! on a real NVIDIA GPU through [`CudaEngine`], with every byte checked, and each
//! path's speed against a plain CUDA copy of the same bytes in the same run.
//!
//! A ~2 GiB model (7 layers, hidden 4096, bf16-sized items) lives in GPU memory in
//! a TP4 layout. It is snapshotted into the memory store (device -> pinned staging
//! -> checksums and store), restored into GPU memory in a TP2 x PP2 layout (store
//! -> staging -> verified -> device; and unverified), and resharded GPU -> GPU live
//! through the embedded engine (sink and reader modes, then prepared steps, then
//! verified delta steps). Every restored or transferred byte is compared with a
//! restore of the same revision into host memory (the host path).
//!
//! Output: one line per measurement, then `figure: NAME = VALUE` lines. Exits 2
//! when no CUDA driver or device is present. `MWS_GPU_CHECK_LAYERS` (default 7)
//! and `MWS_GPU_CHECK_HIDDEN` (default 4096) size the model;
//! `MWS_GPU_CHECK_STORE_THREADS` (default: every core) sets the memory store's copy threads.

#[path = "../tests/common/device.rs"]
mod device_model;
#[path = "../tests/common/model.rs"]
mod model;

use device_model::{leases, DeviceModel};
use model::*;
use mooncake_weight_store::device::{copy_ranges, CopyDirection, CopyRange, CudaEngine, DeviceEngine, FencedDevice};
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::{LoadArgs, LoadStats, StaticGuard, StoreLimits, WeightStore};
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::RuntimeBinding;
use std::sync::Arc;
use std::time::Instant;

/// The device under test: CUDA, or (`MWS_GPU_CHECK_FENCED=1`, to rehearse the
/// program on a machine without a GPU) the fenced test device. Its engine, and how
/// the program takes and gives back device memory.
struct Gpu {
    engine: Arc<dyn DeviceEngine>,
    alloc: Box<dyn Fn(u64) -> u64>,
    free: Box<dyn Fn(u64)>,
}

impl Gpu {
    fn cuda() -> mooncake_weight_store::Result<Gpu> {
        let c = Arc::new(CudaEngine::new(0, None)?);
        let (a, f) = (c.clone(), c.clone());
        Ok(Gpu {
            engine: c,
            alloc: Box::new(move |n| a.alloc_device(n).expect("device memory")),
            // SAFETY: the program frees only what it allocated, once, after its last use.
            free: Box::new(move |address| unsafe { f.free_device(address) }.expect("cuMemFree")),
        })
    }

    fn fenced(capacity: u64) -> Gpu {
        let d = Arc::new(FencedDevice::new(0, capacity).unwrap());
        let a = d.clone();
        // Fenced memory is never reused: nothing to give back.
        Gpu { engine: d, alloc: Box::new(move |n| a.alloc(n).expect("fenced memory")), free: Box::new(|_| ()) }
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn fill_bytes(b: &mut [u8]) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ b.len() as u64;
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn fill_random(m: &mut HostModel) {
    for b in &mut m.buffers {
        fill_bytes(b);
    }
}

/// `dst`'s device bytes equal `reference`'s (the host path's), or the program panics.
fn check(dst: &mut DeviceModel, reference: &HostModel, what: &str) {
    let bytes = dst.check_against(reference, what);
    println!("check: {what}: {bytes} bytes equal the host path's");
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Best of `n` timed runs of `f`.
fn best(n: usize, mut f: impl FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            secs(t)
        })
        .fold(f64::INFINITY, f64::min)
}

fn restore(ws: &WeightStore, manifest_key: &str, bindings: &[RuntimeBinding], target: &HostModel) -> LoadStats {
    let manifest = Arc::new(ws.load_manifest(manifest_key).unwrap());
    let plan = ws.plan_load(manifest, target.placement.clone(), bindings, PlanningLimits::default()).unwrap();
    let mut total = LoadStats::default();
    for b in bindings {
        // SAFETY: the target memory (host or device) outlives the call.
        let s = unsafe { ws.load(&plan, b, LoadArgs { guard: Some(&StaticGuard), ..Default::default() }) }.unwrap();
        total.bytes += s.bytes;
        total.ranges += s.ranges;
        total.verified_bytes += s.verified_bytes;
    }
    total
}

fn main() {
    let layers = env("MWS_GPU_CHECK_LAYERS", 7);
    let hidden = env("MWS_GPU_CHECK_HIDDEN", 4096);
    let gpu = if env("MWS_GPU_CHECK_FENCED", 0) == 1 {
        Gpu::fenced(80 * hidden * hidden * (layers + 1) + (1 << 20))
    } else {
        match Gpu::cuda() {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gpu-check: no CUDA device: {}", e.message());
                std::process::exit(2);
            }
        }
    };
    let engine = gpu.engine.clone();
    println!("device: {}", engine.name());
    let defs = model_tensors(layers, hidden, 0);
    let src_layout = Layout { tp: 4, pp: 1, ep: 1, dp: 1 };
    let dst_layout = Layout { tp: 2, pp: 2, ep: 1, dp: 1 };
    let mut src_host = HostModel::new(build_placement("trainer", src_layout, &defs, 1), false, "trainer", 1);
    fill_random(&mut src_host);
    let total: u64 = src_host.views.iter().map(|v| v.3 as u64).sum();
    println!(
        "model: {layers} layers, hidden {hidden}: {:.2} GiB, TP4 -> TP2 x PP2",
        total as f64 / (1u64 << 30) as f64
    );

    // The engine's 2-D copies, each direction: 1,000 rows of 100 bytes, pitched
    // 300 in host memory and 128 on the device, there and back, then device to
    // device into a dense layout; every byte compared.
    {
        let rows = 1000u64;
        let mut host: Vec<u8> = (0..rows * 300).map(|i| (i * 7 % 251) as u8).collect();
        fill_bytes(&mut host);
        let dev_rows = (gpu.alloc)(rows * 128);
        let dev_dense = (gpu.alloc)(rows * 100);
        let mut back = vec![0u8; (rows * 100) as usize];
        let up: Vec<CopyRange> = (0..rows)
            .map(|r| CopyRange { source: host.as_ptr() as u64 + r * 300, target: dev_rows + r * 128, len: 100 })
            .collect();
        let across: Vec<CopyRange> = (0..rows)
            .map(|r| CopyRange { source: dev_rows + r * 128, target: dev_dense + r * 100, len: 100 })
            .collect();
        let down = [CopyRange { source: dev_dense, target: back.as_mut_ptr() as u64, len: rows * 100 }];
        // SAFETY: host buffers owned here; device allocations made above.
        let ops = unsafe {
            copy_ranges(&*engine, 0, CopyDirection::HostToDevice, &up).unwrap()
                + copy_ranges(&*engine, 0, CopyDirection::DeviceToDevice, &across).unwrap()
                + copy_ranges(&*engine, 0, CopyDirection::DeviceToHost, &down).unwrap()
        };
        let want: Vec<u8> = (0..rows as usize).flat_map(|r| host[r * 300..r * 300 + 100].to_vec()).collect();
        assert!(back == want, "2-D copies through the engine lost or moved bytes");
        println!("check: 2-D copies (H2D pitched, D2D, D2H): 3,000 rows in {ops} copies, every byte equal");
        (gpu.free)(dev_rows);
        (gpu.free)(dev_dense);
    }

    // Baselines: one copy of all the model's bytes, pinned host <-> device and device -> device.
    let pinned = engine.staging(total).unwrap();
    let dev_a = (gpu.alloc)(total);
    let dev_b = (gpu.alloc)(total);
    let one = |s: u64, t: u64, d: CopyDirection| {
        // SAFETY: the pinned buffer and the two device allocations hold `total` bytes each.
        unsafe { copy_ranges(&*engine, 0, d, &[CopyRange { source: s, target: t, len: total }]) }.unwrap();
    };
    let h2d = best(3, || one(pinned.address(), dev_a, CopyDirection::HostToDevice));
    let d2h = best(3, || one(dev_a, pinned.address(), CopyDirection::DeviceToHost));
    let d2d = best(3, || one(dev_a, dev_b, CopyDirection::DeviceToDevice));
    let gb = |t: f64| total as f64 / t / 1e9;
    println!("baseline: cuMemcpy pinned H2D {:.1} GB/s, D2H {:.1} GB/s, D2D {:.1} GB/s", gb(h2d), gb(d2h), gb(d2d));
    drop(pinned);
    (gpu.free)(dev_a);
    (gpu.free)(dev_b);

    // The source model in GPU memory.
    let src_reference_bytes = src_host.buffers.clone();
    let alloc = |n: u64| (gpu.alloc)(n);
    let mut src = DeviceModel::new(src_host, engine.clone(), &alloc, "trainer");

    // The memory store copies a batch on up to this many threads (its default is 4):
    // every core of the machine here, as a restore at start-up may use them all.
    let cores = std::thread::available_parallelism().map_or(8, |n| n.get()) as u64;
    let threads = env("MWS_GPU_CHECK_STORE_THREADS", cores) as usize;
    println!("memory store: {threads} copy threads");
    // The same snapshot from host memory: what the store itself costs.
    let host_snapshot = {
        let mut host = HostModel::new(build_placement("trainer", src_layout, &defs, 1), false, "trainer", 1);
        host.buffers = src_reference_bytes.clone();
        host.bindings = host.make_bindings("trainer", 1);
        let store = MemoryStore::new();
        store.set_max_threads(threads);
        let ws = WeightStore::new(Arc::new(store));
        let t = Instant::now();
        host.snapshot_into(&ws).unwrap();
        secs(t)
    };
    println!("snapshot from host memory: {:.3} s ({:.1} GB/s)", host_snapshot, gb(host_snapshot));

    // Snapshot: device -> staging -> store.
    let store = Arc::new(MemoryStore::new());
    store.set_max_threads(threads);
    let ws = WeightStore::new(store.clone()).with_device_engine(engine.clone());
    let t = Instant::now();
    let manifest = src.host.snapshot_into(&ws).unwrap();
    let snapshot = secs(t);
    println!("snapshot: {:.3} s ({:.1} GB/s)", snapshot, gb(snapshot));
    // A second snapshot measures without first-touch costs of the store's memory.
    let store2 = Arc::new(MemoryStore::new());
    store2.set_max_threads(threads);
    let ws2 = WeightStore::new(store2).with_device_engine(engine.clone());
    let t = Instant::now();
    src.host.snapshot_into(&ws2).unwrap();
    let snapshot = snapshot.min(secs(t));
    drop(ws2);

    // Reference: the host path restores the revision into host memory.
    let mut reference = HostModel::new(build_placement("serving", dst_layout, &defs, 1), false, "serving", 1);
    let bindings = reference.bindings.clone();
    restore(&ws, manifest.manifest_key(), &bindings, &reference);
    reference.bindings = bindings;
    // And the source bytes it came from are those of the GPU model.
    src.host.buffers.iter_mut().for_each(|b| b.fill(0));
    src.pull();
    assert!(src.host.buffers == src_reference_bytes, "the snapshot left the source unchanged");

    // Restore into GPU memory, verified (default) and unverified.
    let serving = HostModel::new(build_placement("serving", dst_layout, &defs, 1), false, "serving", 1);
    let mut dst = DeviceModel::new(serving, engine.clone(), &alloc, "serving");
    let before = engine.stats();
    let mut stats = LoadStats::default();
    let verified = best(3, || {
        stats = restore(&ws, manifest.manifest_key(), &dst.host.bindings.clone(), &dst.host);
    });
    let calls = (engine.stats().driver_calls - before.driver_calls) as f64 / 3.0;
    let calls_per_1k = calls / (stats.ranges as f64 / 1000.0);
    println!(
        "restore (verified): {:.3} s ({:.1} GB/s), {} ranges, {:.0} driver calls per restore, {} bytes verified",
        verified,
        gb(verified),
        stats.ranges,
        calls,
        stats.verified_bytes
    );
    check(&mut dst, &reference, "restore into GPU memory (verified)");
    let unverified_ws = WeightStore::new(store.clone())
        .with_device_engine(engine.clone())
        .with_limits(StoreLimits { verify_integrity: false, ..StoreLimits::default() })
        .unwrap();
    dst.clear(0);
    let unverified = best(3, || {
        restore(&unverified_ws, manifest.manifest_key(), &dst.host.bindings.clone(), &dst.host);
    });
    println!("restore (unverified): {:.3} s ({:.1} GB/s)", unverified, gb(unverified));
    check(&mut dst, &reference, "restore into GPU memory (unverified)");

    // Live GPU -> GPU through the embedded engine.
    let local = Arc::new(LocalEngine::with_device_engine(engine.clone()));
    // The remote side's owner registers its memory; the called side registers its own.
    let register = |m: &DeviceModel, on: bool| m.register(&*local, on);
    let logical =
        LogicalTransferPlan::plan(src.host.placement.clone(), dst.host.placement.clone(), PlanningLimits::default())
            .unwrap();
    let plan = TransferPlan::bind(&logical, &dst.host.bindings, &src.host.bindings).unwrap();
    let (dst_leases, src_leases) = (leases(&dst.host.bindings), leases(&src.host.bindings));
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    // One engine batch per call where it fits: a device engine pays per batch (a
    // completion event and its synchronization), not per segment.
    let limits = ExecutorLimits { max_batch_operations: 1 << 20, ..ExecutorLimits::default() };
    let ex = TransferExecutor::new(local.clone(), limits).unwrap();
    let mut segments = 0u64;
    for reader in [false, true] {
        dst.clear(0x11);
        register(if reader { &src } else { &dst }, true);
        let args = ExecuteArgs {
            remote_registrations: Some(if reader { &src_leases } else { &dst_leases }),
            source_guards: Some(&guards),
            target_guards: Some(&guards),
            ..Default::default()
        };
        let t = Instant::now();
        segments = 0;
        if reader {
            for b in &dst.host.bindings {
                // SAFETY: device allocations alive for the call.
                let r = unsafe {
                    ex.execute_reader(&plan, &src.host.placement, &src.host.bindings, &dst.host.placement, b, &args)
                }
                .unwrap();
                segments += r.iter().map(|x| x.operation_count).sum::<u64>();
            }
        } else {
            for b in &src.host.bindings {
                // SAFETY: as above.
                let r = unsafe {
                    ex.execute_sink(&plan, &src.host.placement, b, &dst.host.placement, &dst.host.bindings, &args)
                }
                .unwrap();
                segments += r.iter().map(|x| x.operation_count).sum::<u64>();
            }
        }
        let t = secs(t);
        println!(
            "live {} GPU -> GPU: {:.3} s ({:.1} GB/s), {} segments",
            if reader { "reader" } else { "sink" },
            t,
            gb(t),
            segments
        );
        check(&mut dst, &reference, if reader { "live reshard, reader mode" } else { "live reshard, sink mode" });
        register(if reader { &src } else { &dst }, false);
    }
    register(&dst, true);
    // Prepared steps: prepared once, stepped per weight generation.
    let sink = Sink::new(local.clone(), limits).unwrap();
    let largs = LiveArgs::default();
    let prepared: Vec<PreparedTransfer> = src
        .host
        .bindings
        .iter()
        .map(|b| {
            // SAFETY: device allocations alive while the prepared transfers live.
            unsafe { sink.prepare(&plan, &src.host.placement, b, &dst.host.placement, &dst.host.bindings, &largs) }
                .unwrap()
        })
        .collect();
    dst.clear(0x22);
    let before = engine.stats();
    let mut g = 1u64;
    let step = best(5, || {
        g += 1;
        for p in &prepared {
            // SAFETY: as above.
            unsafe { p.step(&StepArgs { weight_generation: g, ..Default::default() }) }.unwrap();
        }
    });
    let live_calls = (engine.stats().driver_calls - before.driver_calls) as f64 / 5.0;
    println!(
        "prepared sink step GPU -> GPU: {:.4} s ({:.1} GB/s), {:.0} driver calls per step for {} segments",
        step,
        gb(step),
        live_calls,
        segments
    );
    check(&mut dst, &reference, "prepared steps");
    drop(prepared);

    // Verified and delta steps of prepared pushes (issue 47): GPU -> GPU, GPU -> host,
    // host -> GPU, the checksums, encodes and applies staged through the engine; a
    // corrupted GPU base caught as torn and repaired; every byte checked.
    for (s, d) in [(true, true), (true, false), (false, true)] {
        device_model::delta_steps_on(engine.clone(), &alloc, s, d);
        device_model::pulled_delta_steps_on(engine.clone(), &alloc, s, d);
    }
    println!("delta steps GPU <-> host, pushed and pulled: every byte checked");

    println!("figure: gpu_restore_vs_h2d_memcpy = {:.3}", h2d / verified);
    println!("figure: gpu_snapshot_vs_d2h_memcpy = {:.3}", d2h / snapshot);
    println!("figure: gpu_snapshot_vs_host_snapshot = {:.3}", host_snapshot / snapshot);
    println!("figure: gpu_live_reshard_vs_d2d_memcpy = {:.3}", d2d / step);
    println!("figure: gpu_driver_calls_per_1k_ranges = {:.3}", calls_per_1k);
    println!("figure: gpu_live_driver_calls_per_1k_segments = {:.3}", live_calls / (segments as f64 / 1000.0));
    println!("figure: gpu_verified_restore_vs_unverified = {:.3}", unverified / verified);
}
