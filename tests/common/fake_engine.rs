//! A scripted fake transfer engine, recording guards, and the live-transfer
//! fixtures of `acceptance-live-transfer.md` (`manifests(tp, prefix, base)`, the N-D
//! fixture). The fake never touches memory: it records calls and returns scripted
//! results, so addresses can be the small constants of the reference tests.
//!
//! Declare from a test file with `#[path = "common/fake_engine.rs"] mod fake_engine;`
//! (after `#[path = "common/builders.rs"] mod builders;`).
#![allow(dead_code)]

use mooncake_weight_store::engine::{
    CompletionStatus, Direction, EngineCallError, EngineResult, MemoryRegion, TransferBatch, TransferEngine,
    TransferTicket,
};
use mooncake_weight_store::protocol::guards::{weight_allocation_fence, AllocationFence};
use mooncake_weight_store::protocol::{GuardProvider, LifetimeToken, TerminalState};
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One recorded engine call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Register(u64, u64),
    Unregister(u64),
    Batch { direction: Direction, endpoint: String, local: Vec<u64>, remote: Vec<u64>, sizes: Vec<u64>, ticket: bool },
}

/// A gate that a fake call waits at: `wait_entered` returns once a call arrived;
/// the call proceeds after `open`.
#[derive(Default)]
pub struct Gate {
    state: std::sync::Mutex<(bool, bool)>, // (entered, open)
    cv: std::sync::Condvar,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Gate::default())
    }
    fn pass(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 = true;
        self.cv.notify_all();
        while !g.1 {
            g = self.cv.wait(g).unwrap();
        }
    }
    pub fn wait_entered(&self) {
        let mut g = self.state.lock().unwrap();
        while !g.0 {
            g = self.cv.wait(g).unwrap();
        }
    }
    pub fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

/// A recorded batch call: (endpoint, local addresses, remote addresses, sizes).
pub type BatchCall = (String, Vec<u64>, Vec<u64>, Vec<u64>);

/// A scripted result of an engine call.
#[derive(Clone, Debug)]
pub enum Step {
    Code(i32),
    Raise(String),
    Interrupt(String),
}

impl Step {
    fn result(&self) -> EngineResult<i32> {
        match self {
            Step::Code(c) => Ok(*c),
            Step::Raise(m) => Err(EngineCallError::failed(m.clone())),
            Step::Interrupt(m) => Err(EngineCallError::interrupted(m.clone())),
        }
    }
}

/// A scripted ticket step.
#[derive(Clone, Debug)]
pub enum TicketStep {
    Status(CompletionStatus),
    Raise(String),
    Interrupt(String),
}

/// A scripted ticket: `status()` and `drain()` pop their scripts, then report `state`.
#[derive(Default)]
pub struct FakeTicket {
    pub state: Mutex<Option<CompletionStatus>>,
    pub status_script: Mutex<VecDeque<TicketStep>>,
    pub drain_script: Mutex<VecDeque<TicketStep>>,
    pub drains: Mutex<Vec<u64>>,
    /// When set, `drain` waits at this gate first.
    pub gate: Mutex<Option<Arc<Gate>>>,
}

impl FakeTicket {
    pub fn new(state: CompletionStatus) -> Arc<Self> {
        let t = FakeTicket::default();
        *t.state.lock() = Some(state);
        Arc::new(t)
    }
    pub fn set(&self, s: CompletionStatus) {
        *self.state.lock() = Some(s);
    }
    pub fn drains(&self) -> Vec<u64> {
        self.drains.lock().clone()
    }
    fn step(&self, script: &Mutex<VecDeque<TicketStep>>) -> EngineResult<CompletionStatus> {
        match script.lock().pop_front() {
            Some(TicketStep::Status(s)) => Ok(s),
            Some(TicketStep::Raise(m)) => Err(EngineCallError::failed(m)),
            Some(TicketStep::Interrupt(m)) => Err(EngineCallError::interrupted(m)),
            None => Ok(self.state.lock().clone().unwrap_or(CompletionStatus::Completed)),
        }
    }
}

struct TicketRef(Arc<FakeTicket>);

impl TransferTicket for TicketRef {
    fn status(&self) -> EngineResult<CompletionStatus> {
        self.0.step(&self.0.status_script)
    }
    fn drain(&self, timeout_ms: u64) -> EngineResult<CompletionStatus> {
        self.0.drains.lock().push(timeout_ms);
        let gate = self.0.gate.lock().clone();
        if let Some(g) = gate {
            g.pass();
        }
        self.0.step(&self.0.drain_script)
    }
}

/// How a ticket engine answers a submission for one endpoint.
#[derive(Clone)]
pub enum Submit {
    Ticket(Arc<FakeTicket>),
    Raise(String),
    Interrupt(String),
}

/// The fake engine. Legacy by default; [`FakeEngine::ticketed`] enables tickets.
pub struct FakeEngine {
    pub identity: AtomicU64,
    pub identity_error: Mutex<Option<String>>,
    pub calls: Mutex<Vec<Call>>,
    pub register: Mutex<Step>,
    pub unregister: Mutex<VecDeque<Step>>,
    /// Legacy batch results per endpoint (default 0).
    pub legacy: Mutex<HashMap<String, Step>>,
    /// Ticket mode: per-endpoint submissions (default: a completed ticket).
    pub tickets: Option<Mutex<HashMap<String, Submit>>>,
    /// When set, every batch call waits at this gate first.
    pub gate: Mutex<Option<Arc<Gate>>>,
    /// Scatter mode: `submit_ranges_with_ticket` is supported and records its calls.
    pub scatter: Option<Mutex<Vec<ScatterCall>>>,
}

/// A recorded scatter call: direction, endpoint, local bases and capacities, remote
/// bases and capacities, local and remote offsets and sizes per range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScatterCall {
    pub direction: Direction,
    pub endpoint: String,
    pub local_bases: Vec<u64>,
    pub local_caps: Vec<u64>,
    pub remote_bases: Vec<u64>,
    pub remote_caps: Vec<u64>,
    pub local_offsets: Vec<Vec<u64>>,
    pub remote_offsets: Vec<Vec<u64>>,
    pub sizes: Vec<Vec<u64>>,
}

static NEXT: AtomicU64 = AtomicU64::new(0x5000_0000);

impl FakeEngine {
    fn build(tickets: bool) -> Arc<Self> {
        Arc::new(FakeEngine {
            identity: AtomicU64::new(NEXT.fetch_add(1, Ordering::Relaxed)),
            identity_error: Mutex::new(None),
            calls: Mutex::new(Vec::new()),
            register: Mutex::new(Step::Code(0)),
            unregister: Mutex::new(VecDeque::new()),
            legacy: Mutex::new(HashMap::new()),
            tickets: tickets.then(|| Mutex::new(HashMap::new())),
            gate: Mutex::new(None),
            scatter: None,
        })
    }
    /// A scatter-ticket engine (ranges submitted whole) with a fresh identity.
    pub fn scatter() -> Arc<Self> {
        let mut e = Arc::try_unwrap(Self::build(true)).ok().expect("fresh");
        e.scatter = Some(Mutex::new(Vec::new()));
        Arc::new(e)
    }
    /// A legacy engine (no tickets) with a fresh identity.
    pub fn legacy() -> Arc<Self> {
        Self::build(false)
    }
    /// A ticket-capable engine with a fresh identity.
    pub fn ticketed() -> Arc<Self> {
        Self::build(true)
    }
    /// A legacy engine reporting `identity` (two wrappers of one native engine).
    pub fn with_identity(identity: u64, tickets: bool) -> Arc<Self> {
        let e = Self::build(tickets);
        e.identity.store(identity, Ordering::Relaxed);
        e
    }
    /// Simulates an engine restart: a new identity no other fake engine has.
    pub fn restart(&self) {
        self.identity.store(NEXT.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }
    pub fn set_legacy(&self, endpoint: &str, step: Step) {
        self.legacy.lock().insert(endpoint.into(), step);
    }
    pub fn set_submit(&self, endpoint: &str, s: Submit) {
        self.tickets.as_ref().expect("ticket engine").lock().insert(endpoint.into(), s);
    }
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }
    /// Batch calls as (endpoint, local addresses, remote addresses, sizes).
    pub fn batches(&self) -> Vec<BatchCall> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Batch { endpoint, local, remote, sizes, .. } => Some((endpoint, local, remote, sizes)),
                _ => None,
            })
            .collect()
    }
    pub fn batch_sizes(&self) -> Vec<usize> {
        self.batches().iter().map(|b| b.3.len()).collect()
    }
    pub fn registers(&self) -> Vec<(u64, u64)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Register(a, n) => Some((a, n)),
                _ => None,
            })
            .collect()
    }
    pub fn unregisters(&self) -> Vec<u64> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Unregister(a) => Some(a),
                _ => None,
            })
            .collect()
    }
    pub fn clear(&self) {
        self.calls.lock().clear();
    }
    fn record_batch(&self, b: &TransferBatch, ticket: bool) {
        let gate = self.gate.lock().clone();
        if let Some(g) = gate {
            g.pass();
        }
        self.calls.lock().push(Call::Batch {
            ticket,
            direction: b.direction(),
            endpoint: b.endpoint().into(),
            local: b.local_addresses().to_vec(),
            remote: b.remote_addresses().to_vec(),
            sizes: b.sizes().to_vec(),
        });
    }
}

impl TransferEngine for FakeEngine {
    fn identity(&self) -> std::result::Result<u64, String> {
        match &*self.identity_error.lock() {
            Some(e) => Err(e.clone()),
            None => Ok(self.identity.load(Ordering::Relaxed)),
        }
    }
    unsafe fn register_memory(&self, region: MemoryRegion) -> EngineResult<i32> {
        self.calls.lock().push(Call::Register(region.address, region.len));
        self.register.lock().result()
    }
    fn unregister_memory(&self, address: u64) -> EngineResult<i32> {
        self.calls.lock().push(Call::Unregister(address));
        self.unregister.lock().pop_front().unwrap_or(Step::Code(0)).result()
    }
    fn batch_transfer_sync(&self, batch: &TransferBatch) -> EngineResult<i32> {
        self.record_batch(batch, false);
        self.legacy.lock().get(batch.endpoint()).cloned().unwrap_or(Step::Code(0)).result()
    }
    fn submit_ranges_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let calls = self.scatter.as_ref()?;
        let ranges: Vec<_> = batch.local_ranges().collect();
        calls.lock().push(ScatterCall {
            direction: batch.direction(),
            endpoint: batch.endpoint().into(),
            local_bases: ranges.iter().map(|r| r.local_base).collect(),
            local_caps: ranges.iter().map(|r| r.local_capacity).collect(),
            remote_bases: ranges.iter().map(|r| r.remote_base).collect(),
            remote_caps: ranges.iter().map(|r| r.remote_capacity).collect(),
            local_offsets: ranges.iter().map(|r| r.local_offsets.to_vec()).collect(),
            remote_offsets: ranges.iter().map(|r| r.remote_offsets.to_vec()).collect(),
            sizes: ranges.iter().map(|r| r.sizes.to_vec()).collect(),
        });
        let s = self.tickets.as_ref()?.lock().get(batch.endpoint()).cloned();
        Some(match s {
            None => Ok(Box::new(TicketRef(FakeTicket::new(CompletionStatus::Completed)))),
            Some(Submit::Ticket(t)) => Ok(Box::new(TicketRef(t))),
            Some(Submit::Raise(m)) => Err(EngineCallError::failed(m)),
            Some(Submit::Interrupt(m)) => Err(EngineCallError::interrupted(m)),
        })
    }
    fn submit_with_ticket(&self, batch: &TransferBatch) -> Option<EngineResult<Box<dyn TransferTicket>>> {
        let tickets = self.tickets.as_ref()?;
        self.record_batch(batch, true);
        let s = tickets.lock().get(batch.endpoint()).cloned();
        Some(match s {
            None => Ok(Box::new(TicketRef(FakeTicket::new(CompletionStatus::Completed)))),
            Some(Submit::Ticket(t)) => Ok(Box::new(TicketRef(t))),
            Some(Submit::Raise(m)) => Err(EngineCallError::failed(m)),
            Some(Submit::Interrupt(m)) => Err(EngineCallError::interrupted(m)),
        })
    }
}

// ---------------------------------------------------------------------------
// Guards
// ---------------------------------------------------------------------------

/// A release log shared by every token of a [`RecordingGuard`].
pub type ReleaseLog = Arc<Mutex<Vec<(String, &'static str)>>>;

/// A guard that reports `binding` (or the expected one) and records releases.
pub struct RecordingGuard {
    pub binding: Option<RuntimeBinding>,
    pub log: ReleaseLog,
    pub owner: Option<Arc<String>>,
    pub acquired: Mutex<u32>,
}

impl RecordingGuard {
    pub fn new(log: &ReleaseLog) -> Arc<Self> {
        Arc::new(RecordingGuard { binding: None, log: log.clone(), owner: None, acquired: Mutex::new(0) })
    }
    pub fn with_owner(log: &ReleaseLog, owner: Arc<String>) -> Arc<Self> {
        Arc::new(RecordingGuard { binding: None, log: log.clone(), owner: Some(owner), acquired: Mutex::new(0) })
    }
}

struct RecordingToken {
    fence: AllocationFence,
    log: ReleaseLog,
    _owner: Option<Arc<String>>,
}

impl LifetimeToken for RecordingToken {
    fn fence(&self) -> &AllocationFence {
        &self.fence
    }
    fn release(&mut self, state: TerminalState) -> Result<()> {
        self.log.lock().push((self.fence.participant_id.clone(), state.as_str()));
        Ok(())
    }
}

impl GuardProvider for RecordingGuard {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        *self.acquired.lock() += 1;
        let b = self.binding.clone().unwrap_or_else(|| expected.clone());
        let fence = weight_allocation_fence(&b, required_ids, &format!("token-{transfer_id}-{}", b.participant_id()))?;
        Ok((b, Box::new(RecordingToken { fence, log: self.log.clone(), _owner: self.owner.clone() })))
    }
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// The tensor of `manifests`: `layers.0.mlp.gate_up`, (8,), uint8, split on dim 0.
pub fn gate_up() -> TensorDescriptor {
    crate::builders::tensor("layers.0.mlp.gate_up", &[8], 1, &[crate::builders::split(AxisKind::Tp, 0)])
}

/// The identity of the live fixtures (revision `step-42`).
pub fn live_ids(revision: &str) -> crate::builders::Ids {
    crate::builders::Ids {
        resource_id: "model".into(),
        revision: revision.into(),
        weight_generation: 1,
        placement_set_id: "live-set".into(),
    }
}

/// A placement of `t` split on dim 0 over `tp` participants (dp `dp`).
pub fn split_placement(t: &TensorDescriptor, tpn: u64, dpn: u64, revision: &str) -> Placement {
    use crate::builders::*;
    let ranks = grid(dpn, 1, 1, tpn);
    let n = t.global_shape()[0] / tpn;
    let frags = ranks.iter().map(|&r| rows(t, r.tp * n, n, r)).collect();
    flat_with(&live_ids(revision), topo(dpn, 1, 1, tpn, &ranks), vec![t.clone()], frags).expect("placement")
}

/// The binding of participant `pid` of `placement`: worker/instance
/// `<prefix>-t<i>`, endpoint `<prefix>-t<i>:12345`, lease `<prefix>-t<i>-runtime-lease`,
/// generation 1, fragments from `address` (view = allocation).
pub fn live_binding(placement: &Placement, pid: &str, name: &str, address: u64, generation: u64) -> RuntimeBinding {
    let part = placement.part(pid).expect("participant");
    let mut frags = Vec::new();
    let mut a = address;
    for (k, f) in part.fragments().iter().enumerate() {
        let t = placement.tensor(f.tensor_id()).unwrap();
        frags.push(
            RuntimeFragment::new(RuntimeFragmentSpec {
                placement_fragment_id: f.placement_fragment_id().into(),
                fragment_id: format!("{name}-frag{k}"),
                address: a,
                nbytes: f.nbytes(),
                worker_id: name.into(),
                endpoint: format!("{name}:12345"),
                device: "cuda:0".into(),
                itemsize: t.itemsize(),
                local_shape: f.local_shape().to_vec(),
                strides_bytes: canonical_strides(f.local_shape(), t.itemsize()),
                storage_address: a,
                storage_nbytes: f.nbytes(),
                storage_offset_bytes: 0,
                memory: MemoryKind::Host,
            })
            .expect("runtime fragment"),
        );
        a += f.nbytes().next_multiple_of(0x100);
    }
    RuntimeBinding::new(RuntimeBindingSpec {
        resource_id: placement.resource_id().into(),
        placement_id: placement.placement_id().into(),
        placement_digest: placement.digest().into(),
        instance_id: name.into(),
        lease_generation: generation,
        lease_id: format!("{name}-runtime-lease"),
        revision: placement.revision().into(),
        participant_id: pid.into(),
        fragments: frags,
    })
    .expect("binding")
}

/// `manifests(tp, prefix, base)`: the placement and one binding per participant
/// `i` at `base + i * 0x1000`.
pub fn manifests(tpn: u64, prefix: &str, base: u64) -> (Placement, Vec<RuntimeBinding>) {
    let p = split_placement(&gate_up(), tpn, 1, "step-42");
    let b = (0..tpn)
        .map(|i| {
            let pid = crate::builders::pid(crate::builders::tp(i));
            live_binding(&p, &pid, &format!("{prefix}-t{i}"), base + i * 0x1000, 1)
        })
        .collect();
    (p, b)
}
