//! A model whose bytes live in device memory, for the device tests and the GPU check
//! (test helper): one device allocation per participant, laid out as the host
//! model's buffer, which holds the model only to fill the device and to check what
//! comes back. Needs `model.rs` as the `model` module beside it.
#![allow(dead_code)]

use super::model::HostModel;
use mooncake_weight_store::device::{copy_ranges, CopyDirection, CopyRange, DeviceEngine};
use mooncake_weight_store::engine::TransferEngine;
use mooncake_weight_store::protocol::transfer::MemoryRegistrationLease;
use mooncake_weight_store::runtime::{RuntimeBindingSpec, RuntimeFragmentSpec};
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
