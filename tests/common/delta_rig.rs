//! What the pushed and pulled delta-step tests share (test helper): the embedded
//! engine with a notify mailbox per endpoint and a count of the bytes its batches
//! move, a deterministic generator, bf16 changes to a model's buffers, and the check
//! that every target byte equals the source byte the plan routes into it. Needs
//! `model.rs` as the `model` module beside it.
#![allow(dead_code)]

use super::model::{model_tensors, trainer_server_plan, HostModel, Layout};
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{
    EngineCallError, EngineResult, MemoryRegion, TransferBatch, TransferEngine, TransferTicket,
};
use mooncake_weight_store::plan::transfer_bind::{Side, TransferPlan};
use mooncake_weight_store::protocol::transfer::notify::NOTIFY_NAME;
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// The embedded engine with a notify mailbox per endpoint, counting the bytes its
/// batches move.
pub struct MailEngine {
    pub inner: LocalEngine,
    pub mailbox: Mutex<BTreeMap<String, Vec<Vec<u8>>>>,
    /// Bytes moved by batches.
    pub moved: Mutex<u64>,
    /// Fails the next batch this says yes to (then forgets it), as an engine whose
    /// call errs: completion unknown.
    pub fail: Mutex<Option<BatchFilter>>,
}

/// Which batch [`MailEngine::fail`] fails.
pub type BatchFilter = Box<dyn Fn(&TransferBatch) -> bool + Send>;

impl MailEngine {
    pub fn new() -> MailEngine {
        MailEngine {
            inner: LocalEngine::new(),
            mailbox: Mutex::new(BTreeMap::new()),
            moved: Mutex::new(0),
            fail: Mutex::new(None),
        }
    }
    fn fails(&self, batch: &TransferBatch) -> bool {
        let mut f = self.fail.lock();
        let hit = f.as_ref().is_some_and(|f| f(batch));
        if hit {
            *f = None;
        }
        hit
    }
}

impl TransferEngine for MailEngine {
    fn identity(&self) -> std::result::Result<u64, String> {
        self.inner.identity()
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.register_memory(region) }
    }
    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        self.inner.unregister_memory(address)
    }
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        if self.fails(batch) {
            return Err(EngineCallError::failed("injected failure"));
        }
        *self.moved.lock() += batch.nbytes();
        self.inner.batch_transfer_sync(batch)
    }
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        if self.fails(batch) {
            return Some(Err(EngineCallError::failed("injected failure")));
        }
        *self.moved.lock() += batch.nbytes();
        self.inner.submit_with_ticket(batch)
    }
    fn registered_regions(&self) -> Option<Vec<MemoryRegion>> {
        self.inner.registered_regions()
    }
    fn send_notify(&self, endpoint: &str, name: &str, message: &[u8]) -> Option<EngineResult<i32>> {
        assert_eq!(name, NOTIFY_NAME);
        self.mailbox.lock().entry(endpoint.to_string()).or_default().push(message.to_vec());
        Some(Ok(0))
    }
}

/// A xorshift generator (deterministic).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Changes `per_million` of the bf16 elements of every buffer of `model` (a new
/// generation; at least one per buffer).
pub fn change(model: &mut HostModel, rng: &mut Rng, per_million: u64) {
    if per_million == 0 {
        return;
    }
    for b in &mut model.buffers {
        let elements = b.len() / 2;
        let n = (elements as u64 * per_million / 1_000_000).max(1);
        for _ in 0..n {
            let e = (rng.next() % elements as u64) as usize;
            b[2 * e] = b[2 * e].wrapping_add(1 + (rng.next() % 200) as u8);
        }
    }
}

/// Every target byte equals the source byte `plan` routes into it (host models).
pub fn targets_match_sources(plan: &TransferPlan) -> bool {
    plan.regions().iter().enumerate().all(|(i, r)| {
        let s = plan.operation_fragment(i, Side::Source).1.address();
        let t = plan.operation_fragment(i, Side::Target).1.address();
        let mut same = true;
        r.for_each_segment(u64::MAX, |so, to, len| {
            // SAFETY: the plan's segments lie in the live models' host buffers.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts((s + so) as usize as *const u8, len as usize),
                    std::slice::from_raw_parts((t + to) as usize as *const u8, len as usize),
                )
            };
            same &= a == b;
        })
        .unwrap();
        same
    })
}

/// The delta tests' pair: a trainer TP2 x PP2 x DP2 (filled) and a server TP4 x EP2
/// (bf16, 256 hidden), host models, and the plan between them bound to both.
pub fn trainer_and_server() -> (HostModel, HostModel, TransferPlan) {
    trainer_server_plan(
        &model_tensors(2, 256, 2),
        Layout { tp: 2, pp: 2, ep: 1, dp: 2 },
        Layout { tp: 4, pp: 1, ep: 2, dp: 1 },
    )
}
