//! Device memory on every path, proven on CPU with the fenced device
//! (`device::FencedDevice`): its memory is mapped `PROT_NONE`, so any host read or
//! write of a device address anywhere in the library crashes this test process.
//! Snapshots from device sources, resharded restores into device targets (verified
//! before a byte reaches the device), a corrupt payload that never lands, live
//! reshards through the embedded engine in both modes and every direction, prepared
//! steps; every byte checked, and the device engine's driver calls counted.

#[path = "common/device.rs"]
mod device_model;
#[path = "common/model.rs"]
mod model;

use device_model::{leases, DeviceModel, Mailbox};
use model::*;
use mooncake_weight_store::device::{DeviceEngine, FencedDevice};
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::TransferEngine;
use mooncake_weight_store::model::StoredManifest;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::{LoadArgs, LoadStats, StaticGuard, WeightStore};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::store::{ObjectStore, RecordType, WriteConfig};
use mooncake_weight_store::{ErrorKind, MemoryKind, MemoryRegion};
use std::sync::Arc;

const TP2: Layout = Layout { tp: 2, pp: 1, ep: 1, dp: 1 };
const TP4: Layout = Layout { tp: 4, pp: 1, ep: 1, dp: 1 };
const ONE: Layout = Layout { tp: 1, pp: 1, ep: 1, dp: 1 };

/// `host` on the fenced device `dev`.
fn on_device(host: HostModel, dev: &Arc<FencedDevice>, instance: &str) -> DeviceModel {
    DeviceModel::new(host, dev.clone(), &|n| dev.alloc(n).unwrap(), instance)
}

fn device() -> Arc<FencedDevice> {
    Arc::new(FencedDevice::new(0, 256 << 20).unwrap())
}

/// Hidden 1024: a column-split target fragment reads 1,024 rows (a range each), what
/// makes "at most one driver call per 256 ranges" a bound a restore can meet (one copy
/// per target fragment, two calls per window).
fn defs() -> Vec<TensorDef> {
    model_tensors(2, 1024, 0)
}

/// A TP2 source on the device, snapshotted through `ws`.
fn snapshot(ws: &WeightStore, dev: &Arc<FencedDevice>) -> StoredManifest {
    let src = on_device(HostModel::new(build_placement("source", TP2, &defs(), 1), true, "t", 1), dev, "t");
    src.host.snapshot_into(ws).unwrap()
}

/// Restores `manifest` into a device target of `layout`; returns the statistics and
/// the target (not yet pulled).
fn restore(
    ws: &WeightStore,
    manifest: &StoredManifest,
    layout: Layout,
    dev: &Arc<FencedDevice>,
) -> mooncake_weight_store::Result<(LoadStats, DeviceModel)> {
    let dst = on_device(HostModel::new(build_placement("target", layout, &defs(), 1), false, "s", 1), dev, "s");
    let manifest = Arc::new(ws.load_manifest(manifest.manifest_key())?);
    let plan = ws.plan_load(manifest, dst.host.placement.clone(), &dst.host.bindings, PlanningLimits::default())?;
    let mut total = LoadStats::default();
    for b in &dst.host.bindings {
        // SAFETY: the device allocations outlive the call.
        let s = unsafe { ws.load(&plan, b, LoadArgs { guard: Some(&StaticGuard), ..Default::default() }) }?;
        total.bytes += s.bytes;
        total.ranges += s.ranges;
        total.verified_bytes += s.verified_bytes;
    }
    Ok((total, dst))
}

fn stores() -> Vec<(&'static str, Arc<dyn ObjectStore>, Option<std::path::PathBuf>)> {
    let dir = std::env::temp_dir().join(format!("mws-device-{}-{}", std::process::id(), rand_suffix()));
    vec![
        ("memory", Arc::new(MemoryStore::new()), None),
        ("directory", Arc::new(DirectoryStore::open(&dir).unwrap()), Some(dir)),
    ]
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn snapshot_from_the_device_and_resharded_verified_restores_into_it() {
    for (name, store, dir) in stores() {
        let dev = device();
        let ws = WeightStore::new(store).with_device_engine(dev.clone());
        let m = snapshot(&ws, &dev);
        let snap = dev.stats();
        assert!(snap.bytes > 0, "{name}: the snapshot read its sources through the engine");
        for layout in [ONE, TP4, TP2] {
            let before = dev.stats();
            let (stats, mut dst) = restore(&ws, &m, layout, &dev).unwrap();
            let after = dev.stats();
            let checked = dst.verify();
            assert_eq!(checked as u64, stats.bytes, "{name} {layout:?}: every target byte restored");
            assert_eq!(
                stats.verified_bytes,
                m.fragments().iter().map(|f| f.nbytes()).sum::<u64>().max(stats.verified_bytes)
            );
            assert!(stats.verified_bytes >= stats.bytes, "{name} {layout:?}: verified: {stats:?}");
            // The restore's own calls (the pulls happen after `after`).
            // (Creating the target model pushed its initial bytes: 3 calls per buffer.)
            let calls = after.driver_calls - before.driver_calls - 3 * dst.bases.len() as u64;
            // One copy per (fully written) target fragment, plus an event and its
            // synchronization per window (one window per participant here).
            let fragments: usize = dst.host.bindings.iter().map(|b| b.fragments().len()).sum();
            assert!(
                calls <= (fragments + 2 * dst.host.bindings.len()) as u64,
                "{name} {layout:?}: {calls} driver calls for {fragments} target fragments"
            );
            if layout.tp == 4 {
                assert!(stats.ranges >= 10 * 256, "{name}: the reshard reads many short rows: {stats:?}");
                assert!(calls * 256 <= stats.ranges, "{name}: {calls} driver calls for {} ranges", stats.ranges);
            }
        }
        if let Some(d) = dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn a_corrupt_payload_never_reaches_the_device() {
    let dev = device();
    let mem = Arc::new(MemoryStore::new());
    let ws = WeightStore::new(mem.clone()).with_device_engine(dev.clone());
    let m = snapshot(&ws, &dev);
    let f = &m.fragments()[m.fragments().len() / 2];
    let mut v = mem.get(f.object_key()).unwrap();
    let at = v.len() / 3;
    v[at] ^= 0x10;
    mem.upsert(f.object_key(), &v, &WriteConfig { group_ids: &[], record_type: RecordType::Payload }).unwrap();
    let dst = on_device(HostModel::new(build_placement("target", TP4, &defs(), 1), false, "s", 1), &dev, "s");
    let manifest = Arc::new(ws.load_manifest(m.manifest_key()).unwrap());
    let plan =
        ws.plan_load(manifest, dst.host.placement.clone(), &dst.host.bindings, PlanningLimits::default()).unwrap();
    let before = dev.stats();
    let mut failed = 0;
    for b in &dst.host.bindings {
        // SAFETY: the device allocations outlive the call.
        match unsafe { ws.load(&plan, b, LoadArgs { guard: Some(&StaticGuard), ..Default::default() }) } {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
                assert!(e.message().contains(f.tensor_id()), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "some participant reads the corrupt block");
    // Participants that failed copied nothing to the device: the failing window is
    // verified before its copy. Count: only succeeding participants' batches ran.
    let copies = dev.stats().batches - before.batches;
    assert_eq!(copies as usize, dst.host.bindings.len() - failed, "one window each, none for a failed restore");
    let mut dst = dst;
    dst.pull();
    let bad: Vec<_> = dst.host.bindings.iter().collect();
    assert!(!bad.is_empty());
    // The targets of the failed participants still hold their initial bytes (0xA5).
    let untouched = dst.host.buffers.iter().filter(|b| b.iter().all(|&x| x == 0xA5)).count();
    assert_eq!(untouched, failed, "every failed participant's device memory is untouched");
}

#[test]
fn device_memory_without_a_device_engine_is_refused_before_any_io() {
    let dev = device();
    let mem = Arc::new(MemoryStore::new());
    let plain = WeightStore::new(mem.clone());
    let src = on_device(HostModel::new(build_placement("source", TP2, &defs(), 1), true, "t", 1), &dev, "t");
    let e = src.host.snapshot_into(&plain).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("device engine"), "{e}");
    let staged = WeightStore::new(mem.clone()).with_device_engine(dev.clone());
    let m = src.host.snapshot_into(&staged).unwrap();
    let e = restore(&plain, &m, TP4, &dev).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

fn transfer_models(
    dev: &Arc<FencedDevice>,
    src_on_device: bool,
    dst_on_device: bool,
) -> (Option<DeviceModel>, HostModel, Option<DeviceModel>, HostModel, TransferPlan) {
    let (src_h, dst_h) = device_model::trainer_and_server();
    let (src_d, src_h) = if src_on_device {
        let d = on_device(src_h, dev, "trainer");
        (Some(d), None)
    } else {
        (None, Some(src_h))
    };
    let (dst_d, dst_h) = if dst_on_device {
        let d = on_device(dst_h, dev, "serving");
        (Some(d), None)
    } else {
        (None, Some(dst_h))
    };
    let sb = src_d.as_ref().map_or_else(|| src_h.as_ref().unwrap().bindings.clone(), |d| d.host.bindings.clone());
    let db = dst_d.as_ref().map_or_else(|| dst_h.as_ref().unwrap().bindings.clone(), |d| d.host.bindings.clone());
    let sp = src_d.as_ref().map_or_else(|| src_h.as_ref().unwrap().placement.clone(), |d| d.host.placement.clone());
    let dp = dst_d.as_ref().map_or_else(|| dst_h.as_ref().unwrap().placement.clone(), |d| d.host.placement.clone());
    let logical = LogicalTransferPlan::plan(sp, dp, PlanningLimits::default()).unwrap();
    let plan = TransferPlan::bind(&logical, &db, &sb).unwrap();
    let empty = |p: &HostModel| HostModel {
        placement: p.placement.clone(),
        bindings: Vec::new(),
        buffers: Vec::new(),
        views: Vec::new(),
    };
    let src_h = src_h.unwrap_or_else(|| empty(&src_d.as_ref().unwrap().host));
    let dst_h = dst_h.unwrap_or_else(|| empty(&dst_d.as_ref().unwrap().host));
    (src_d, src_h, dst_d, dst_h, plan)
}

fn register_host(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive the engine's use in the test.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

/// Live reshard TP2 x PP2 x EP2 x DP2 -> TP4 through the embedded engine with a
/// fenced device: device -> device, host -> device, device -> host; sink (sources
/// push) and reader (targets pull) modes; every byte checked.
#[test]
fn live_reshards_between_device_and_host_memory_in_both_modes() {
    for (src_dev, dst_dev) in [(true, true), (false, true), (true, false)] {
        for reader in [false, true] {
            let dev = device();
            let (src_d, src_h, mut dst_d, dst_h, plan) = transfer_models(&dev, src_dev, dst_dev);
            let engine = Arc::new(LocalEngine::with_device_engine(dev.clone()));
            let (sb, sp) = match &src_d {
                Some(d) => (d.host.bindings.clone(), d.host.placement.clone()),
                None => (src_h.bindings.clone(), src_h.placement.clone()),
            };
            let (db, dp) = match &dst_d {
                Some(d) => (d.host.bindings.clone(), d.host.placement.clone()),
                None => (dst_h.bindings.clone(), dst_h.placement.clone()),
            };
            // The side that is called on registers its memory itself; the other side pre-registers.
            let remote = if reader { (&src_d, &src_h) } else { (&dst_d, &dst_h) };
            match remote.0 {
                Some(d) => d.register(&*engine, true),
                None => register_host(&engine, remote.1),
            }
            let remote_bindings = if reader { &sb } else { &db };
            let leases = leases(remote_bindings);
            let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
            let guards = GuardProviders::all(Arc::new(StaticGuard));
            let args = ExecuteArgs {
                remote_registrations: Some(&leases),
                source_guards: Some(&guards),
                target_guards: Some(&guards),
                ..Default::default()
            };
            let before = dev.stats();
            let mut segments = 0u64;
            if reader {
                for b in &db {
                    // SAFETY: every buffer outlives the call.
                    let r = unsafe { ex.execute_reader(&plan, &sp, &sb, &dp, b, &args) }.unwrap();
                    segments += r.iter().map(|x| x.operation_count).sum::<u64>();
                }
            } else {
                for b in &sb {
                    // SAFETY: every buffer outlives the call.
                    let r = unsafe { ex.execute_sink(&plan, &sp, b, &dp, &db, &args) }.unwrap();
                    segments += r.iter().map(|x| x.operation_count).sum::<u64>();
                }
            }
            let calls = dev.stats().driver_calls - before.driver_calls;
            assert!(calls > 0, "device bytes moved through the engine");
            assert!(segments > 0);
            let what = format!("src on device {src_dev}, dst on device {dst_dev}, reader {reader}");
            match &mut dst_d {
                Some(d) => assert_eq!(d.verify() as u64, plan.total_bytes(), "{what}"),
                None => assert_eq!(dst_h.verify().unwrap() as u64, plan.total_bytes(), "{what}"),
            }
        }
    }
}

#[test]
fn prepared_steps_move_device_bytes_every_generation() {
    let dev = device();
    let (src_d, _, dst_d, _, plan) = transfer_models(&dev, true, true);
    let (src_d, mut dst_d) = (src_d.unwrap(), dst_d.unwrap());
    let engine = Arc::new(LocalEngine::with_device_engine(dev.clone()));
    dst_d.register(&*engine, true);
    let sink = Sink::new(engine.clone(), ExecutorLimits::default()).unwrap();
    let prepared: Vec<PreparedTransfer> = src_d
        .host
        .bindings
        .iter()
        .map(|b| {
            // SAFETY: both models' device memory outlives every step.
            unsafe {
                sink.prepare(
                    &plan,
                    &src_d.host.placement,
                    b,
                    &dst_d.host.placement,
                    &dst_d.host.bindings,
                    &LiveArgs::default(),
                )
            }
            .unwrap()
        })
        .collect();
    let planned = prepared.iter().filter(|p| !p.is_empty()).count();
    assert!(planned > 0 && plan.executors(Side::Source).len() == planned);
    for g in 2..5u64 {
        let before = dev.stats();
        let mut bytes = 0;
        for p in &prepared {
            // SAFETY: as above.
            let report = unsafe { p.step(&StepArgs { weight_generation: g, ..Default::default() }) }.unwrap();
            bytes += report.stats.bytes;
            assert!(report.targets.iter().all(|t| t.outcome == TargetOutcome::Updated { weight_generation: g }));
        }
        assert_eq!(bytes, plan.total_bytes());
        assert!(dev.stats().bytes - before.bytes >= plan.total_bytes(), "every byte through the device engine");
        assert_eq!(dst_d.verify() as u64, plan.total_bytes());
    }
}

/// A notified push device -> device: every target learns from its messages alone that
/// it was updated, and the bytes are there; an unverified step never reads device
/// memory on the host (verified and delta steps read it through the device engine:
/// below).
#[test]
fn notified_pushes_between_device_buffers() {
    use mooncake_weight_store::protocol::transfer::notify::{execute_sink_notified, NotifyAcceptor};
    let dev = device();
    let (src_d, _, dst_d, _, plan) = transfer_models(&dev, true, true);
    let (src_d, mut dst_d) = (src_d.unwrap(), dst_d.unwrap());
    let engine = Arc::new(Mailbox { inner: LocalEngine::with_device_engine(dev.clone()), mail: Default::default() });
    dst_d.register(&engine.inner, true);
    let leases = leases(&dst_d.host.bindings);
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ExecuteArgs {
        remote_registrations: Some(&leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let ex = TransferExecutor::new(engine.clone(), ExecutorLimits::default()).unwrap();
    for b in &src_d.host.bindings {
        // SAFETY: the device allocations outlive the call.
        unsafe {
            execute_sink_notified(
                &ex,
                None,
                &plan,
                &src_d.host.placement,
                b,
                &dst_d.host.placement,
                &dst_d.host.bindings,
                &args,
            )
        }
        .unwrap();
    }
    for b in &dst_d.host.bindings {
        let mut acc = NotifyAcceptor::new(&plan, b.participant_id(), None).unwrap();
        let endpoint = b.fragments()[0].endpoint().to_string();
        let mail = engine.mail.lock().remove(&endpoint).unwrap_or_default();
        assert!(!mail.is_empty(), "{endpoint} got its messages");
        for m in &mail {
            acc.accept(m).unwrap();
        }
        assert_eq!(acc.outcome(), TargetOutcome::Updated { weight_generation: 1 }, "{}", b.participant_id());
    }
    assert_eq!(dst_d.verify() as u64, plan.total_bytes());
}

/// Issue 47 on device memory: verified and delta steps of prepared pushes between
/// device buffers (and device <-> host) through the fenced device
/// (`device_model::delta_steps_on`: a corrupted device base caught as Torn and
/// repaired, every byte checked). Any host dereference of a device address crashes
/// this test.
#[test]
fn delta_steps_between_device_buffers() {
    for (src_dev, dst_dev) in [(true, true), (true, false), (false, true)] {
        let dev = device();
        let engine: Arc<dyn DeviceEngine> = dev.clone();
        device_model::delta_steps_on(engine, &|n| dev.alloc(n).unwrap(), src_dev, dst_dev);
    }
}

/// Issue 47 pulled, on device memory: a publisher whose sources are device buffers
/// and prepared readers whose targets are (`device_model::pulled_delta_steps_on`: the
/// publication staged and the deltas applied and checked through the fenced device,
/// a corrupted device base caught as Torn and repaired, every byte checked). Any host
/// dereference of a device address crashes this test.
#[test]
fn pulled_delta_steps_between_device_buffers() {
    for (src_dev, dst_dev) in [(true, true), (true, false), (false, true)] {
        let dev = device();
        let engine: Arc<dyn DeviceEngine> = dev.clone();
        device_model::pulled_delta_steps_on(engine, &|n| dev.alloc(n).unwrap(), src_dev, dst_dev);
    }
}
