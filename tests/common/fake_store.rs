//! A recording, fault-injecting [`ObjectStore`] over [`MemoryStore`], a recording
//! [`GuardProvider`]/[`LifetimeToken`] pair, and small host-memory helpers shared by
//! the store, writer, load and robustness tests.
//!
//! Declare with `#[path = "common/fake_store.rs"] mod fake_store;` (it needs
//! `#[path = "common/model.rs"] mod model;` declared in the same crate root).
#![allow(dead_code)]

use mooncake_weight_store::protocol::guards::{weight_allocation_fence, AllocationFence};
use mooncake_weight_store::protocol::{GuardProvider, LifetimeToken, TerminalState};
use mooncake_weight_store::runtime::MemoryRegion;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::store::{ObjectStore, PutFrom, RangeRead, RecordType, WriteConfig};
use mooncake_weight_store::*;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One recorded backend call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Put(String, RecordType, String),
    Upsert(String),
    Get(String),
    Exists(String),
    BatchExists(Vec<String>),
    Remove(String),
    /// Keys, record type, group ids.
    BatchPut(Vec<String>, RecordType, Vec<String>),
    /// (key, object offset, length) per range.
    GetRanges(Vec<(String, u64, u64)>),
    Register(u64, u64),
    Unregister(u64),
}

/// How a put of a matching key misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutFault {
    /// Fails with `status` and writes nothing.
    Fail(String),
    /// Writes, then reports `status` (the response was lost).
    FailAfterWrite(String),
    /// Writes and reports success, but the object reads as absent for the next
    /// `n` `exists`/`get` calls on that key.
    Invisible(usize),
}

/// A one-shot hook, run (outside every lock) when its trigger matches.
pub type Hook = Box<dyn FnOnce() + Send>;

/// When a hook runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Before the `put` of a key containing this text.
    BeforePut(String),
    /// After a `batch_exists` call whose keys all contain this text.
    AfterBatchExists(String),
}

#[derive(Default)]
pub struct Faults {
    /// (key substring, fault, remaining uses).
    pub puts: Vec<(String, PutFault, usize)>,
    /// Remaining not-visible reads per key.
    pub invisible: HashMap<String, usize>,
    /// Keys whose next `exists` reports "not found" once.
    pub exists_not_found_once: BTreeSet<String>,
    /// Every item of every `batch_put_from` fails with this status.
    pub batch_put_scalar: Option<String>,
    /// Every item of every `batch_exists` fails with this status.
    pub batch_exists_scalar: Option<String>,
    /// Every item of every `get_into_ranges` fails with this status.
    pub ranges_scalar: Option<String>,
    /// Ranges of a key containing this text report one byte less.
    pub ranges_short: Option<String>,
    /// Every `register_buffer` fails with this status.
    pub register_status: Option<String>,
    /// Per address: unregister fails with this status (until cleared).
    pub unregister_status: HashMap<u64, String>,
    /// Any operation outside get/exists/register/unregister/get_into_ranges fails.
    pub restore_only: bool,
    pub hooks: Vec<(Trigger, Hook)>,
}

/// The fake store. Keep it in an `Arc` and hand a clone to `WeightStore::new`.
#[derive(Default)]
pub struct FakeStore {
    pub inner: MemoryStore,
    pub calls: Mutex<Vec<Call>>,
    pub faults: Mutex<Faults>,
    registered: Mutex<Vec<(u64, u64)>>,
}

fn status(s: &str) -> Error {
    Error::new(ErrorKind::Store, s.to_string())
}

impl FakeStore {
    pub fn new() -> Arc<FakeStore> {
        Arc::new(FakeStore::default())
    }

    fn log(&self, c: Call) {
        self.calls.lock().push(c);
    }

    pub fn clear_log(&self) {
        self.calls.lock().clear();
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().clone()
    }

    /// Keys passed to `remove`, in order.
    pub fn removes(&self) -> Vec<String> {
        self.calls().into_iter().filter_map(|c| if let Call::Remove(k) = c { Some(k) } else { None }).collect()
    }
    /// Sizes of `batch_exists` calls.
    pub fn exists_batches(&self) -> Vec<usize> {
        self.calls()
            .into_iter()
            .filter_map(|c| if let Call::BatchExists(k) = c { Some(k.len()) } else { None })
            .collect()
    }
    /// Keys of `batch_put_from` calls.
    pub fn put_batches(&self) -> Vec<Vec<String>> {
        self.calls().into_iter().filter_map(|c| if let Call::BatchPut(k, _, _) = c { Some(k) } else { None }).collect()
    }
    /// Ranges of `get_into_ranges` calls.
    pub fn range_calls(&self) -> Vec<Vec<(String, u64, u64)>> {
        self.calls().into_iter().filter_map(|c| if let Call::GetRanges(r) = c { Some(r) } else { None }).collect()
    }
    pub fn registrations(&self) -> Vec<(u64, u64)> {
        self.calls()
            .into_iter()
            .filter_map(|c| if let Call::Register(a, n) = c { Some((a, n)) } else { None })
            .collect()
    }
    pub fn unregistrations(&self) -> Vec<u64> {
        self.calls().into_iter().filter_map(|c| if let Call::Unregister(a) = c { Some(a) } else { None }).collect()
    }
    /// Addresses currently registered.
    pub fn still_registered(&self) -> Vec<(u64, u64)> {
        self.registered.lock().clone()
    }
    /// Number of `put`/`batch_put_from`/`upsert`/`remove` calls.
    pub fn mutations(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Put(..) | Call::BatchPut(..) | Call::Upsert(..) | Call::Remove(..)))
            .count()
    }
    pub fn keys(&self) -> Vec<String> {
        self.inner.keys()
    }
    pub fn has(&self, key: &str) -> bool {
        self.inner.exists(key).unwrap()
    }

    pub fn fault_put(&self, key_part: &str, fault: PutFault, uses: usize) {
        self.faults.lock().puts.push((key_part.to_string(), fault, uses));
    }
    pub fn hook(&self, trigger: Trigger, hook: impl FnOnce() + Send + 'static) {
        self.faults.lock().hooks.push((trigger, Box::new(hook)));
    }
    pub fn with_faults<R>(&self, f: impl FnOnce(&mut Faults) -> R) -> R {
        f(&mut self.faults.lock())
    }

    fn take_hook(&self, pred: impl Fn(&Trigger) -> bool) -> Option<Hook> {
        let mut f = self.faults.lock();
        let i = f.hooks.iter().position(|(t, _)| pred(t))?;
        Some(f.hooks.remove(i).1)
    }

    fn put_fault(&self, key: &str) -> Option<PutFault> {
        let mut f = self.faults.lock();
        let i = f.puts.iter().position(|(k, _, n)| key.contains(k.as_str()) && *n > 0)?;
        f.puts[i].2 -= 1;
        Some(f.puts[i].1.clone())
    }

    /// True when the key must read as absent now (consumes one invisible read).
    fn hidden(&self, key: &str) -> bool {
        let mut f = self.faults.lock();
        match f.invisible.get_mut(key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    fn restore_only(&self, op: &str) -> Result<()> {
        if self.faults.lock().restore_only {
            return Err(status(&format!("operation {op} is not available on a restore-only backend")));
        }
        Ok(())
    }

    /// Applies a put fault around `write`.
    fn faulty_write(&self, key: &str, write: impl FnOnce() -> Result<()>) -> Result<()> {
        match self.put_fault(key) {
            None => write(),
            Some(PutFault::Fail(s)) => Err(status(&s)),
            Some(PutFault::FailAfterWrite(s)) => {
                write()?;
                Err(status(&s))
            }
            Some(PutFault::Invisible(n)) => {
                write()?;
                self.faults.lock().invisible.insert(key.to_string(), n);
                Ok(())
            }
        }
    }
}

impl ObjectStore for FakeStore {
    fn put(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        self.log(Call::Put(key.into(), config.record_type, config.group_ids.first().cloned().unwrap_or_default()));
        if let Some(h) = self.take_hook(|t| matches!(t, Trigger::BeforePut(k) if key.contains(k.as_str()))) {
            h();
        }
        self.restore_only("put")?;
        self.faulty_write(key, || self.inner.put(key, value, config))
    }

    fn upsert(&self, key: &str, value: &[u8], config: &WriteConfig<'_>) -> Result<()> {
        self.log(Call::Upsert(key.into()));
        self.restore_only("upsert")?;
        self.inner.upsert(key, value, config)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.log(Call::Get(key.into()));
        // "Not found once" models a read that misses a just-written object; the
        // protocol reads decision and manifest with `get`, payloads with `exists`.
        if self.faults.lock().exists_not_found_once.remove(key) {
            return Err(mooncake_weight_store::store::not_found(key));
        }
        if self.hidden(key) {
            return Err(mooncake_weight_store::store::not_found(key));
        }
        self.inner.get(key)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        self.log(Call::Exists(key.into()));
        let once = self.faults.lock().exists_not_found_once.remove(key);
        if once {
            return Ok(false);
        }
        if self.hidden(key) {
            return Ok(false);
        }
        self.inner.exists(key)
    }

    fn batch_exists(&self, keys: &[&str]) -> Vec<Result<bool>> {
        self.log(Call::BatchExists(keys.iter().map(|k| k.to_string()).collect()));
        let scalar = self.faults.lock().batch_exists_scalar.clone();
        let out = if let Some(s) = scalar {
            keys.iter().map(|_| Err(status(&s))).collect()
        } else {
            keys.iter()
                .map(|k| {
                    let once = self.faults.lock().exists_not_found_once.remove(*k);
                    if once || self.hidden(k) {
                        return Ok(false);
                    }
                    self.inner.exists(k)
                })
                .collect()
        };
        if let Some(h) =
            self.take_hook(|t| matches!(t, Trigger::AfterBatchExists(k) if keys.iter().all(|x| x.contains(k.as_str()))))
        {
            h();
        }
        out
    }

    fn remove(&self, key: &str) -> Result<()> {
        self.log(Call::Remove(key.into()));
        self.restore_only("remove")?;
        self.inner.remove(key)
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
        self.log(Call::BatchPut(
            items.iter().map(|i| i.key.to_string()).collect(),
            config.record_type,
            config.group_ids.to_vec(),
        ));
        if let Err(e) = self.restore_only("batch_put_from") {
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        let scalar = self.faults.lock().batch_put_scalar.clone();
        if let Some(s) = scalar {
            return items.iter().map(|_| Err(status(&s))).collect();
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let one = WriteConfig { group_ids: &config.group_ids[i..i + 1], record_type: config.record_type };
                // SAFETY: forwarded from the caller's contract.
                self.faulty_write(item.key, || {
                    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
                    unsafe { self.inner.batch_put_from(std::slice::from_ref(item), &one) }.remove(0)
                })
            })
            .collect()
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        self.log(Call::GetRanges(ranges.iter().map(|r| (r.key.to_string(), r.object_offset, r.dest.len)).collect()));
        let (scalar, short) = {
            let f = self.faults.lock();
            (f.ranges_scalar.clone(), f.ranges_short.clone())
        };
        if let Some(s) = scalar {
            return ranges.iter().map(|_| Err(status(&s))).collect();
        }
        // SAFETY: forwarded from the caller's contract.
        let mut out = unsafe { self.inner.get_into_ranges(ranges) };
        if let Some(k) = short {
            for (r, o) in ranges.iter().zip(out.iter_mut()) {
                if r.key.contains(k.as_str()) {
                    if let Ok(n) = o {
                        *n -= 1;
                    }
                }
            }
        }
        out
    }

    fn register_buffer(&self, region: MemoryRegion) -> Result<()> {
        self.log(Call::Register(region.address, region.len));
        let st = self.faults.lock().register_status.clone();
        if let Some(s) = st {
            return Err(status(&s));
        }
        self.registered.lock().push((region.address, region.len));
        Ok(())
    }

    fn unregister_buffer(&self, address: u64) -> Result<()> {
        self.log(Call::Unregister(address));
        let st = self.faults.lock().unregister_status.get(&address).cloned();
        if let Some(s) = st {
            return Err(status(&s));
        }
        self.registered.lock().retain(|(a, _)| *a != address);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Recording guard
// ---------------------------------------------------------------------------

/// A guard provider that reports the expected binding and records every token's
/// releases.
#[derive(Clone, Default)]
pub struct RecordingGuard {
    pub acquires: Arc<AtomicUsize>,
    /// Every release: (token id, state).
    pub releases: Arc<Mutex<Vec<(String, TerminalState)>>>,
}

pub struct RecordingToken {
    fence: AllocationFence,
    releases: Arc<Mutex<Vec<(String, TerminalState)>>>,
}

impl LifetimeToken for RecordingToken {
    fn fence(&self) -> &AllocationFence {
        &self.fence
    }
    fn release(&mut self, state: TerminalState) -> Result<()> {
        self.releases.lock().push((self.fence.token_id.clone(), state));
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
        let n = self.acquires.fetch_add(1, Ordering::SeqCst);
        let fence = weight_allocation_fence(expected, required_ids, &format!("token-{n}-{transfer_id}"))?;
        Ok((expected.clone(), Box::new(RecordingToken { fence, releases: self.releases.clone() })))
    }
}

impl RecordingGuard {
    pub fn released(&self) -> Vec<TerminalState> {
        self.releases.lock().iter().map(|r| r.1).collect()
    }
    pub fn acquired(&self) -> usize {
        self.acquires.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------
// Binding rewrites
// ---------------------------------------------------------------------------

/// The spec a runtime fragment was built from.
pub fn rt_spec_of(f: &RuntimeFragment) -> RuntimeFragmentSpec {
    RuntimeFragmentSpec {
        placement_fragment_id: f.placement_fragment_id().into(),
        fragment_id: f.fragment_id().into(),
        address: f.address(),
        nbytes: f.nbytes(),
        worker_id: f.worker_id().into(),
        endpoint: f.endpoint().into(),
        device: f.device().into(),
        itemsize: f.itemsize(),
        local_shape: f.local_shape().to_vec(),
        strides_bytes: f.strides_bytes().to_vec(),
        storage_address: f.storage_address(),
        storage_nbytes: f.storage_nbytes(),
        storage_offset_bytes: f.storage_offset_bytes(),
        memory: f.memory(),
    }
}

/// Rebuilds `b` after editing its spec and every fragment spec.
pub fn rebind(
    b: &RuntimeBinding,
    edit: impl FnOnce(&mut RuntimeBindingSpec),
    mut edit_frag: impl FnMut(&mut RuntimeFragmentSpec),
) -> RuntimeBinding {
    let fragments = b
        .fragments()
        .iter()
        .map(|f| {
            let mut s = rt_spec_of(f);
            edit_frag(&mut s);
            RuntimeFragment::new(s).expect("valid runtime fragment")
        })
        .collect();
    let mut spec = RuntimeBindingSpec {
        resource_id: b.resource_id().into(),
        placement_id: b.placement_id().into(),
        placement_digest: b.placement_digest().into(),
        instance_id: b.instance_id().into(),
        lease_generation: b.lease_generation(),
        lease_id: b.lease_id().into(),
        revision: b.revision().into(),
        participant_id: b.participant_id().into(),
        fragments,
    };
    edit(&mut spec);
    RuntimeBinding::new(spec).expect("valid binding")
}

// ---------------------------------------------------------------------------
// Flows over host models
// ---------------------------------------------------------------------------

use crate::model::HostModel;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, LoadStats, StoreLimits, UploadArgs, UploadReceipt, WeightStore};

/// A weight store over `fake` (prefix `weights`, default limits).
pub fn ws(fake: &Arc<FakeStore>) -> WeightStore {
    WeightStore::new(fake.clone())
}

/// A weight store over `fake` with `max_ranges_per_request` and `max_range_bytes`.
///
/// Staging is off: the store reads exactly the ranges the specification lays out
/// (the reference's request pattern), which these tests check range by range.
pub fn ws_limited(fake: &Arc<FakeStore>, max_ranges_per_request: usize, max_range_bytes: u64) -> WeightStore {
    WeightStore::new(fake.clone())
        .with_limits(StoreLimits {
            max_range_bytes,
            max_ranges_per_request,
            staging_bytes: 0,
            ..StoreLimits::default()
        })
        .unwrap()
}

/// Upload options with a fixed transaction id and clock (namespace `default`).
pub fn opts(tx: &str) -> UploadOptions {
    UploadOptions {
        namespace: "default".into(),
        key_prefix: "weights".into(),
        transaction_id: Some(tx.into()),
        created_at: Some(format!("2026-01-01T00:00:00Z-{tx}")),
    }
}

/// A source model with deterministic contents (instance `trainer`, generation 1).
pub fn source(p: Placement) -> HostModel {
    HostModel::new(p, true, "trainer", 1)
}

/// A target model whose buffers hold the sentinel 0xA5 (instance `serving`).
pub fn target(p: Placement) -> HostModel {
    HostModel::new(p, false, "serving", 1)
}

/// Uploads every binding of `src` (one call per binding) and returns all receipts.
pub fn upload_all(
    ws: &WeightStore,
    plan: &UploadPlan,
    src: &HostModel,
    guard: &dyn GuardProvider,
) -> Result<Vec<UploadReceipt>> {
    let mut out = Vec::new();
    for b in &src.bindings {
        let args = UploadArgs { guard: Some(guard), ..Default::default() };
        // SAFETY: the model's buffers outlive the call and are not written.
        out.extend(unsafe { ws.upload(plan, &src.placement, b, args) }?);
    }
    Ok(out)
}

/// Plans, uploads and commits `src` with transaction `tx`.
pub fn snapshot(ws: &WeightStore, src: &HostModel, tx: &str) -> (UploadPlan, StoredManifest) {
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts(tx)).unwrap();
    let receipts = upload_all(ws, &plan, src, &mooncake_weight_store::protocol::StaticGuard).unwrap();
    let m = ws.commit(&plan, &receipts, None).unwrap();
    (plan, m)
}

/// Plans a load of `manifest` into every binding of `dst`.
pub fn plan_load(
    ws: &WeightStore,
    manifest: &StoredManifest,
    dst: &HostModel,
) -> Result<mooncake_weight_store::protocol::LoadPlan> {
    ws.plan_load(Arc::new(manifest.clone()), dst.placement.clone(), &dst.bindings, PlanningLimits::default())
}

/// Loads every binding of `dst` with `plan`; returns the summed stats.
pub fn load_all(
    ws: &WeightStore,
    plan: &mooncake_weight_store::protocol::LoadPlan,
    dst: &HostModel,
    guard: &dyn GuardProvider,
) -> Result<LoadStats> {
    let mut total = LoadStats::default();
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(guard), ..Default::default() };
        // SAFETY: the model's buffers outlive the call and nobody else touches them.
        let s = unsafe { ws.load(plan, b, args) }?;
        total.regions += s.regions;
        total.ranges += s.ranges;
        total.requests += s.requests;
        total.bytes += s.bytes;
        total.verified_bytes += s.verified_bytes;
        total.verify_read_bytes += s.verify_read_bytes;
    }
    Ok(total)
}
