//! A model whose bytes live in device memory, for the device tests and the GPU check
//! (test helper): one device allocation per participant, laid out as the host
//! model's buffer, which holds the model only to fill the device and to check what
//! comes back. Needs `model.rs` as the `model` module beside it.
#![allow(dead_code)]

use super::model::{build_placement, model_tensors, HostModel, Layout};
use mooncake_weight_store::device::{copy_ranges, CopyDirection, CopyRange, DeviceEngine};
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::TransferEngine;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::delta_pull;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::runtime::{RuntimeBindingSpec, RuntimeFragmentSpec};
use mooncake_weight_store::ErrorKind;
use mooncake_weight_store::{MemoryKind, MemoryRegion, RuntimeBinding, RuntimeFragment};
use std::sync::Arc;

/// The registration evidence of every fragment of `bindings` (their owners registered
/// them): what a live transfer is given for the side it does not register itself.
pub fn leases(bindings: &[RuntimeBinding]) -> Vec<MemoryRegistrationLease> {
    bindings
        .iter()
        .flat_map(|b| {
            b.fragments()
                .iter()
                .map(|f| MemoryRegistrationLease::from_fragment(f, b.lease_generation(), Some(b.lease_id())))
        })
        .collect()
}

pub struct DeviceModel {
    pub host: HostModel,
    pub engine: Arc<dyn DeviceEngine>,
    pub bases: Vec<u64>,
}

impl DeviceModel {
    /// Allocates device memory with `alloc` (device 0), copies the host model's bytes
    /// there and scrambles the host copies: only the device holds the model.
    pub fn new(
        host: HostModel,
        engine: Arc<dyn DeviceEngine>,
        alloc: &dyn Fn(u64) -> u64,
        instance: &str,
    ) -> DeviceModel {
        let bases: Vec<u64> = host.buffers.iter().map(|b| alloc(b.len() as u64)).collect();
        let mut m = DeviceModel { host, engine, bases };
        m.push();
        m.host.bindings = m.device_bindings(instance, 1);
        m
    }

    fn copy(&mut self, direction: CopyDirection) {
        for (buf, &base) in self.host.buffers.iter_mut().zip(&self.bases) {
            let (source, target) = match direction {
                CopyDirection::HostToDevice => (buf.as_ptr() as u64, base),
                _ => (base, buf.as_mut_ptr() as u64),
            };
            let r = [CopyRange { source, target, len: buf.len() as u64 }];
            // SAFETY: a live host buffer and the device allocation made for it.
            unsafe { copy_ranges(&*self.engine, 0, direction, &r) }.unwrap();
        }
    }

    /// Host buffers -> device, then the host copies are scrambled.
    pub fn push(&mut self) {
        self.copy(CopyDirection::HostToDevice);
        for b in &mut self.host.buffers {
            b.fill(0x3C);
        }
    }

    /// Device -> host buffers (to check them).
    pub fn pull(&mut self) {
        self.copy(CopyDirection::DeviceToHost);
    }

    /// Sets every device byte to `value`.
    pub fn clear(&mut self, value: u8) {
        for b in &mut self.host.buffers {
            b.fill(value);
        }
        self.copy(CopyDirection::HostToDevice);
    }

    /// The host model's bindings moved onto the device allocations.
    pub fn device_bindings(&self, instance: &str, generation: u64) -> Vec<RuntimeBinding> {
        let host_bases: Vec<u64> = self.host.buffers.iter().map(|b| b.as_ptr() as u64).collect();
        self.host
            .make_bindings(instance, generation)
            .into_iter()
            .map(|b| {
                let frags = b
                    .fragments()
                    .iter()
                    .map(|f: &RuntimeFragment| {
                        let pi = host_bases.iter().position(|&h| h == f.storage_address()).unwrap();
                        let base = self.bases[pi];
                        RuntimeFragment::new(RuntimeFragmentSpec {
                            placement_fragment_id: f.placement_fragment_id().into(),
                            fragment_id: f.fragment_id().into(),
                            address: base + f.storage_offset_bytes(),
                            nbytes: f.nbytes(),
                            worker_id: f.worker_id().into(),
                            endpoint: f.endpoint().into(),
                            device: "cuda:0".into(),
                            itemsize: f.itemsize(),
                            local_shape: f.local_shape().to_vec(),
                            strides_bytes: f.strides_bytes().to_vec(),
                            storage_address: base,
                            storage_nbytes: f.storage_nbytes(),
                            storage_offset_bytes: f.storage_offset_bytes(),
                            memory: MemoryKind::Device(0),
                        })
                        .unwrap()
                    })
                    .collect();
                RuntimeBinding::new(RuntimeBindingSpec {
                    resource_id: b.resource_id().into(),
                    placement_id: b.placement_id().into(),
                    placement_digest: b.placement_digest().into(),
                    instance_id: b.instance_id().into(),
                    lease_generation: b.lease_generation(),
                    lease_id: b.lease_id().into(),
                    revision: b.revision().into(),
                    participant_id: b.participant_id().into(),
                    fragments: frags,
                })
                .unwrap()
            })
            .collect()
    }

    /// Every device byte checked against the expected model bytes.
    pub fn verify(&mut self) -> usize {
        self.pull();
        self.host.verify().unwrap()
    }

    /// Device bytes equal `reference`'s host bytes (same layout), fragment by
    /// fragment; returns the bytes compared.
    pub fn check_against(&mut self, reference: &HostModel, what: &str) -> usize {
        for b in &mut self.host.buffers {
            b.fill(0);
        }
        self.pull();
        let mut bytes = 0usize;
        for (v, r) in self.host.views.iter().zip(&reference.views) {
            assert_eq!((v.0, &v.1, v.2, v.3), (r.0, &r.1, r.2, r.3));
            if self.host.buffers[v.0][v.2..v.2 + v.3] != reference.buffers[r.0][r.2..r.2 + r.3] {
                panic!("{what}: bytes of {} on participant {} differ from the host path", v.1, v.0);
            }
            bytes += v.3;
        }
        bytes
    }

    /// Registers (or unregisters) the device allocations with `engine`.
    pub fn register(&self, engine: &dyn TransferEngine, on: bool) {
        for (buf, &base) in self.host.buffers.iter().zip(&self.bases) {
            let r = MemoryRegion { address: base, len: buf.len() as u64, kind: MemoryKind::Device(0) };
            let rc = if on {
                // SAFETY: device memory of the test, alive while registered.
                unsafe { engine.register_memory(r) }.unwrap()
            } else {
                engine.unregister_memory(base).unwrap()
            };
            assert_eq!(rc, 0);
        }
    }
}

/// The embedded engine with a mailbox for the notify hook (it has no channel of its own).
pub struct Mailbox {
    pub inner: LocalEngine,
    pub mail: parking_lot::Mutex<std::collections::BTreeMap<String, Vec<Vec<u8>>>>,
}

impl TransferEngine for Mailbox {
    fn identity(&self) -> std::result::Result<u64, String> {
        self.inner.identity()
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> mooncake_weight_store::engine::EngineResult<i32> {
        // SAFETY: forwarded with the caller's contract.
        unsafe { self.inner.register_memory(region) }
    }
    fn unregister_memory(&self, address: u64) -> mooncake_weight_store::engine::EngineResult<i32> {
        self.inner.unregister_memory(address)
    }
    fn batch_transfer_sync(
        &self,
        batch: &mooncake_weight_store::engine::TransferBatch,
    ) -> mooncake_weight_store::engine::EngineResult<i32> {
        self.inner.batch_transfer_sync(batch)
    }
    fn send_notify(
        &self,
        endpoint: &str,
        _name: &str,
        message: &[u8],
    ) -> Option<mooncake_weight_store::engine::EngineResult<i32>> {
        self.mail.lock().entry(endpoint.to_string()).or_default().push(message.to_vec());
        Some(Ok(0))
    }
    fn device_engine(&self) -> Option<Arc<dyn DeviceEngine>> {
        self.inner.device_engine()
    }
}

/// One side of a live transfer: its bytes on a device or on the host.
pub enum Side2 {
    Host(HostModel),
    Device(DeviceModel),
}

impl Side2 {
    fn new(
        host: HostModel,
        on_device: bool,
        engine: &Arc<dyn DeviceEngine>,
        alloc: &dyn Fn(u64) -> u64,
        instance: &str,
    ) -> Side2 {
        if on_device {
            Side2::Device(DeviceModel::new(host, engine.clone(), alloc, instance))
        } else {
            Side2::Host(host)
        }
    }
    pub fn model(&self) -> &HostModel {
        match self {
            Side2::Host(h) => h,
            Side2::Device(d) => &d.host,
        }
    }
    /// Registers the side's allocations with `engine` (its owner's registration, for
    /// the peer's engine batches to reach them).
    fn register(&self, engine: &dyn TransferEngine) {
        match self {
            Side2::Device(d) => d.register(engine, true),
            Side2::Host(h) => {
                for b in &h.buffers {
                    let r = MemoryRegion { address: b.as_ptr() as u64, len: b.len() as u64, kind: MemoryKind::Host };
                    // SAFETY: the buffers outlive every step of the scenario.
                    assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
                }
            }
        }
    }
    /// Brings the device bytes into the host mirror (nothing for a host side).
    fn pull(&mut self) {
        if let Side2::Device(d) = self {
            d.pull();
        }
    }
    /// The host bytes at `addr` (a device address maps into its mirror; pull first).
    fn host_at(&self, addr: u64) -> *const u8 {
        match self {
            Side2::Host(_) => addr as usize as *const u8,
            Side2::Device(d) => {
                let k =
                    d.bases.iter().zip(&d.host.buffers).position(|(&b, buf)| b <= addr && addr < b + buf.len() as u64);
                let k = k.expect("a device address of the model");
                d.host.buffers[k][(addr - d.bases[k]) as usize..].as_ptr()
            }
        }
    }
    /// Changes `per_thousand` of the 2-byte elements of every buffer (a new
    /// generation), through the device when the side lives there.
    fn change(&mut self, per_thousand: usize, seed: &mut u64) {
        self.pull();
        let bufs = match self {
            Side2::Device(d) => &mut d.host.buffers,
            Side2::Host(h) => &mut h.buffers,
        };
        for b in bufs.iter_mut() {
            let elements = b.len() / 2;
            for _ in 0..(elements * per_thousand / 1000).max(1) {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let e = (*seed >> 33) as usize % elements;
                b[2 * e] = b[2 * e].wrapping_add(1 + (*seed >> 20) as u8 % 200);
            }
        }
        if let Side2::Device(d) = self {
            // The device takes the changed bytes; keep the host mirror as the device.
            d.push();
            d.pull();
        }
    }
}

/// Every target byte equals the source byte the plan routes into it (both pulled).
fn routed_bytes_match(plan: &TransferPlan, src: &mut Side2, dst: &mut Side2) -> bool {
    src.pull();
    dst.pull();
    plan.regions().iter().enumerate().all(|(i, r)| {
        let s = plan.operation_fragment(i, Side::Source).1.address();
        let t = plan.operation_fragment(i, Side::Target).1.address();
        let mut same = true;
        r.for_each_segment(u64::MAX, |so, to, len| {
            // SAFETY: host mirrors of the plan's segments, alive and not written meanwhile.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(src.host_at(s + so), len as usize),
                    std::slice::from_raw_parts(dst.host_at(t + to), len as usize),
                )
            };
            same &= a == b;
        })
        .unwrap();
        same
    })
}

/// The live-transfer pair of the device tests: a trainer TP2 x PP2 x EP2 x DP2 (the
/// source, filled) and a server TP4 (the target), host models.
pub fn trainer_and_server() -> (HostModel, HostModel) {
    let defs = model_tensors(2, 64, 4);
    let src_h =
        HostModel::new(build_placement("trainer", Layout { tp: 2, pp: 2, ep: 2, dp: 2 }, &defs, 1), true, "trainer", 1);
    let dst_h = HostModel::new(
        build_placement("serving", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs, 1),
        false,
        "serving",
        1,
    );
    (src_h, dst_h)
}

/// The delta scenarios' sides ([`trainer_and_server`], each on the device of `engine`
/// or on the host) and the plan between them bound to both.
fn device_pair(
    engine: &Arc<dyn DeviceEngine>,
    alloc: &dyn Fn(u64) -> u64,
    src_dev: bool,
    dst_dev: bool,
) -> (Side2, Side2, TransferPlan) {
    let (src_h, dst_h) = trainer_and_server();
    let src = Side2::new(src_h, src_dev, engine, alloc, "trainer");
    let dst = Side2::new(dst_h, dst_dev, engine, alloc, "serving");
    let logical = LogicalTransferPlan::plan(
        src.model().placement.clone(),
        dst.model().placement.clone(),
        PlanningLimits::default(),
    )
    .unwrap();
    let plan = TransferPlan::bind(&logical, &dst.model().bindings, &src.model().bindings).unwrap();
    (src, dst, plan)
}

/// Issue 47 on device memory: verified and delta steps of prepared pushes from a
/// trainer (TP2 x PP2 x EP2 x DP2) into a server (TP4), the source and the target on
/// the device of `engine` (memory from `alloc`) or on the host: the source's
/// checksums and delta encodings read the device through the embedded engine's
/// device engine, the target's acceptor applies the deltas and checks the content
/// through its own (refused without one); several generations of deltas, then
/// (device targets) a corrupted device base is caught as Torn and the next step is
/// full for it and repairs it; every byte checked.
pub fn delta_steps_on(engine: Arc<dyn DeviceEngine>, alloc: &dyn Fn(u64) -> u64, src_dev: bool, dst_dev: bool) {
    const KEY: &[u8] = b"a device delta key of 16+ bytes";
    let what = format!("source on device {src_dev}, target on device {dst_dev}");
    let (mut src, mut dst, plan) = device_pair(&engine, alloc, src_dev, dst_dev);
    let mail = Arc::new(Mailbox { inner: LocalEngine::with_device_engine(engine.clone()), mail: Default::default() });
    dst.register(&mail.inner);
    let targets: Vec<(String, String)> = dst
        .model()
        .bindings
        .iter()
        .map(|b| (b.participant_id().to_string(), b.fragments()[0].endpoint().to_string()))
        .collect();
    let inboxes: Vec<Vec<u8>> = dst.model().buffers.iter().map(|b| vec![0u8; b.len() / 2]).collect();
    for b in &inboxes {
        let r = MemoryRegion { address: b.as_ptr() as u64, len: b.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the inboxes outlive every step.
        assert_eq!(unsafe { mail.inner.register_memory(r) }.unwrap(), 0);
    }
    let named: Vec<(&str, DeltaInbox)> = targets
        .iter()
        .zip(&inboxes)
        .map(|((t, _), b)| (t.as_str(), DeltaInbox { address: b.as_ptr() as u64, capacity: b.len() as u64 }))
        .collect();
    let acceptor = |k: usize| {
        let mut a = NotifyAcceptor::new(&plan, &targets[k].0, Some(KEY)).unwrap();
        if dst_dev {
            // SAFETY: refused: a device target needs the acceptor's device engine.
            assert_eq!(unsafe { a.verify_content() }.unwrap_err().kind(), ErrorKind::Unsupported);
            a.use_device_engine(engine.clone());
        }
        // SAFETY: the target buffers and inboxes outlive the acceptor.
        unsafe { a.verify_content() }.unwrap();
        // SAFETY: as above.
        unsafe { a.accept_deltas(named[k].1) }.unwrap();
        a
    };
    let mut acceptors: Vec<NotifyAcceptor> = (0..targets.len()).map(acceptor).collect();
    let sink = Sink::new(mail.clone(), ExecutorLimits::default()).unwrap();
    let (sm, dm) = (src.model(), dst.model());
    let prepared: Vec<PreparedTransfer> = sm
        .bindings
        .iter()
        .map(|b| {
            // SAFETY: both sides' memory outlives every step.
            unsafe { sink.prepare(&plan, &sm.placement, b, &dm.placement, &dm.bindings, &LiveArgs::default()) }.unwrap()
        })
        .filter(|p| !p.is_empty())
        .collect();
    for p in &prepared {
        p.enable_delta(&named).unwrap();
    }
    let mut seed = 47u64;
    let step = |g: u64, acceptors: &mut Vec<NotifyAcceptor>| -> Vec<TargetDelta> {
        let held: Vec<(String, u64)> = targets
            .iter()
            .zip(acceptors.iter())
            .filter_map(|((t, _), a)| a.held_generation().map(|h| (t.clone(), h)))
            .collect();
        let held: Vec<TargetHeld<'_>> =
            held.iter().map(|(t, h)| TargetHeld { participant_id: t, weight_generation: *h }).collect();
        for p in &prepared {
            let args = StepArgs {
                weight_generation: g,
                notify: Some(StepNotify { key: Some(KEY), verify_content: true }),
                delta: Some(&held),
                ..Default::default()
            };
            // SAFETY: as above.
            unsafe { p.step(&args) }.unwrap();
        }
        for (k, (_, endpoint)) in targets.iter().enumerate() {
            for m in mail.mail.lock().remove(endpoint).unwrap_or_default() {
                acceptors[k].accept(&m).unwrap();
            }
        }
        prepared.iter().flat_map(|p| p.last_delta().unwrap().targets).collect()
    };
    let before = engine.stats();
    let full = step(2, &mut acceptors);
    assert!(full.iter().all(|t| t.base_generation.is_none()), "{what}");
    assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: generation 2");
    for (g, per_thousand) in [(3u64, 10usize), (4, 30)] {
        src.change(per_thousand, &mut seed);
        let reports = step(g, &mut acceptors);
        assert!(reports.iter().all(|t| t.base_generation == Some(g - 1)), "{what}: {reports:?}");
        let (wire, logical): (u64, u64) =
            reports.iter().fold((0, 0), |(w, l), t| (w + t.wire_bytes, l + t.logical_bytes));
        assert!(wire * 4 < logical, "{what}: {wire} of {logical} bytes moved");
        for a in &acceptors {
            assert_eq!(a.outcome(), TargetOutcome::Updated { weight_generation: g }, "{what}");
            assert_eq!(a.held_generation(), Some(g), "{what}");
        }
        assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: generation {g}");
    }
    assert!(engine.stats().driver_calls > before.driver_calls, "{what}: device bytes went through the engine");
    // A device target's base changed behind the acceptor's back: the delta step is
    // caught as Torn (its content check reads the device), the next step is full for
    // it and repairs it.
    if let Side2::Device(d) = &mut dst {
        let k = 1;
        d.pull();
        d.host.buffers[k][5] ^= 0x40;
        d.push();
        src.change(10, &mut seed);
        let reports = step(5, &mut acceptors);
        assert!(reports.iter().all(|t| t.base_generation == Some(4)), "{what}");
        let torn: Vec<usize> =
            (0..acceptors.len()).filter(|&j| matches!(acceptors[j].outcome(), TargetOutcome::Torn { .. })).collect();
        assert_eq!(torn, vec![k], "{what}: only the corrupted target is torn");
        src.change(10, &mut seed);
        let reports = step(6, &mut acceptors);
        for t in &reports {
            assert_eq!(t.base_generation.is_none(), t.participant_id == targets[k].0, "{what}: {t:?}");
        }
        assert!(acceptors.iter().all(|a| a.held_generation() == Some(6)), "{what}");
        assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: repaired");
    }
    drop(prepared);
}

/// Issue 47 pulled, on device memory: the trainer publishes each generation
/// (`DeltaPublisher`, its device sources staged through the engine's device
/// engine), the server's delta-enabled prepared readers pull the changes, apply them
/// to their buffers (device ones through the device engine) and verify the content;
/// several generations of deltas, then (device targets) a corrupted device base is
/// caught as Torn and the next step is full for it and repairs it; every byte
/// checked.
pub fn pulled_delta_steps_on(engine: Arc<dyn DeviceEngine>, alloc: &dyn Fn(u64) -> u64, src_dev: bool, dst_dev: bool) {
    let what = format!("pulled: source on device {src_dev}, target on device {dst_dev}");
    let (mut src, mut dst, plan) = device_pair(&engine, alloc, src_dev, dst_dev);
    let te = Arc::new(Mailbox { inner: LocalEngine::with_device_engine(engine.clone()), mail: Default::default() });
    // The readers read the sources: registered by their owner (the trainer).
    src.register(&te.inner);
    let publishers: Vec<DeltaPublisher> = plan
        .executors(Side::Source)
        .iter()
        .map(|e| {
            let least = delta_pull::min_outbox_capacity(&plan, (&e.participant_id, &e.worker_id));
            let bytes: u64 = plan
                .operation_indices_for_executor(e)
                .unwrap()
                .iter()
                .map(|&i| plan.regions()[i as usize].total_bytes())
                .sum();
            DeltaPublisher::new(&plan, &e.participant_id, None, te.clone(), (bytes / 2).max(least)).unwrap()
        })
        .collect();
    let outboxes: Vec<SourceOutbox<'_>> = publishers
        .iter()
        .map(|p| SourceOutbox { participant_id: p.executor().0, worker_id: p.executor().1, outbox: p.outbox() })
        .collect();
    let loader = Loader::new(te.clone(), ExecutorLimits::default()).unwrap();
    let (sm, dm) = (src.model(), dst.model());
    let readers: Vec<PreparedTransfer> = dm
        .bindings
        .iter()
        .map(|b| {
            // SAFETY: both sides' memory outlives every step.
            unsafe { loader.prepare_live(&plan, &sm.placement, &sm.bindings, &dm.placement, b, &LiveArgs::default()) }
                .unwrap()
        })
        .collect();
    for r in &readers {
        r.enable_delta_pull(&outboxes).unwrap();
    }
    let step = |g: u64| -> Vec<(TargetOutcome, Option<u64>)> {
        for p in &publishers {
            // SAFETY: the source memory is valid and unchanged during the call.
            unsafe { p.publish(g) }.unwrap();
        }
        readers
            .iter()
            .map(|r| {
                // SAFETY: as above.
                let out = unsafe { r.step(&StepArgs { weight_generation: g, ..Default::default() }) };
                let outcome = match out {
                    Ok(rep) => rep.targets[0].outcome.clone(),
                    Err(e) => e.report.targets[0].outcome.clone(),
                };
                (outcome, r.last_delta().and_then(|d| d.targets[0].base_generation))
            })
            .collect()
    };
    let mut seed = 74u64;
    let before = engine.stats();
    let full = step(2);
    assert!(full.iter().all(|(o, b)| *o == TargetOutcome::Updated { weight_generation: 2 } && b.is_none()), "{what}");
    assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: generation 2");
    for (g, per_thousand) in [(3u64, 10usize), (4, 30)] {
        src.change(per_thousand, &mut seed);
        let outcomes = step(g);
        assert!(
            outcomes.iter().all(|(o, b)| *o == TargetOutcome::Updated { weight_generation: g } && *b == Some(g - 1)),
            "{what}: {outcomes:?}"
        );
        let (wire, logical): (u64, u64) = readers
            .iter()
            .flat_map(|r| r.last_delta().unwrap().targets)
            .fold((0, 0), |(w, l), t| (w + t.wire_bytes, l + t.logical_bytes));
        assert!(wire * 4 < logical, "{what}: {wire} of {logical} bytes pulled");
        assert!(readers.iter().all(|r| r.held_generation() == Some(g)), "{what}");
        assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: generation {g}");
    }
    assert!(engine.stats().driver_calls > before.driver_calls, "{what}: device bytes went through the engine");
    if let Side2::Device(d) = &mut dst {
        let k = 1;
        d.pull();
        d.host.buffers[k][5] ^= 0x40;
        d.push();
        src.change(10, &mut seed);
        let outcomes = step(5);
        for (j, (o, _)) in outcomes.iter().enumerate() {
            assert_eq!(matches!(o, TargetOutcome::Torn { .. }), j == k, "{what}: only the corrupted target is torn");
        }
        src.change(10, &mut seed);
        let outcomes = step(6);
        for (j, (o, b)) in outcomes.iter().enumerate() {
            assert_eq!(*o, TargetOutcome::Updated { weight_generation: 6 }, "{what}");
            assert_eq!(b.is_none(), j == k, "{what}: full for the repaired target only");
        }
        assert!(routed_bytes_match(&plan, &mut src, &mut dst), "{what}: repaired");
    }
    drop(readers);
    drop(publishers);
    if let Side2::Device(d) = &src {
        d.register(&te.inner, false);
    }
}
