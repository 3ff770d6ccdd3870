//! The live-transfer executors (`live-transfer.md` §5–§11): the sink (a source
//! worker pushes writes into remote targets) and the reader (a target worker pulls
//! reads from remote sources), both over a [`TransferEngine`].
//!
//! One execution: preflight checks (nothing pinned, nothing called) -> reserve the
//! engine -> pin both sides (lifetime tokens) -> re-check under the pins ->
//! per-operation checks, registration leases, limits -> register own memory (whole
//! allocations) -> per remote endpoint, lowered batches of at most
//! `max_batch_operations` segments, each run to a known outcome -> unregister ->
//! release the pins -> receipts. When a batch's completion is unknown, nothing is
//! unregistered or released: everything moves into a pending entry
//! ([`super::completion`]) that only a drain (or an engine restart) ends.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use super::completion::{
    self, cleanup_error, execute_batch, quarantine_cleanup, reserve, retain_unknown, unregister_all, BatchOutcome,
    Handoff,
};
use super::error::{TransferError, TransferErrorKind, TransferResult};
use super::lease::{registration_map, validate_registration, GuardProviders, MemoryRegistrationLease};
use crate::engine::{Direction, MemoryRegion, TransferBatch, TransferBatchRange, TransferEngine};
use crate::error::{Error, ErrorKind};
use crate::fxhash::FxHashMap;
use crate::model::Placement;
use crate::plan::region::TransferRegion;
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::protocol::guards::{acquire_pin, LifetimeToken, TerminalState};
use crate::protocol::guards::{GuardProvider, StepPin};
use crate::protocol::progress::{ProgressFn, ProgressPhase, Reporter};
use crate::runtime::{validate_runtime_binding_remembered, RuntimeBinding, RuntimeFragment};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Executor limits (`live-transfer.md` §4.1): they bound lowering on the executing
/// worker and are checked independently of the plan's planning limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutorLimits {
    /// Engine operations per batch (default 1024: the wheel's TCP transport queues at
    /// most 1024 transfers per peer); merged segments count once.
    pub max_batch_operations: u64,
    /// Largest `segment_count` of one region (default 1,000,000).
    pub max_region_segments: u64,
    /// Segments of one execution (default 10,000,000).
    pub max_total_lowered_segments: u64,
    /// Inline drains of an unknown ticket (default 3; 0 = never drain inline).
    pub max_completion_drain_attempts: u32,
    /// Timeout of one inline drain (default 1000 ms).
    pub completion_drain_timeout_ms: u64,
    /// Merge adjacent segments of one batch into one engine operation (default true):
    /// two consecutive segments between the same pair of allocations whose source and
    /// target are both contiguous (`src_end == next src`, `dst_end == next dst`)
    /// become one range. Engines charge per operation (Mooncake's TCP transport about
    /// 20-50 us per range), so this is execution-only: the plan, its JSON, the bytes
    /// moved and every receipt (which counts planned segments) are unchanged;
    /// `max_batch_operations` then bounds the merged operations of a batch. `false`
    /// submits one engine operation per planned segment (the reference's pattern).
    pub coalesce_adjacent: bool,
}

impl Default for ExecutorLimits {
    fn default() -> Self {
        ExecutorLimits {
            max_batch_operations: 1024,
            max_region_segments: 1_000_000,
            max_total_lowered_segments: 10_000_000,
            max_completion_drain_attempts: 3,
            completion_drain_timeout_ms: 1000,
            coalesce_adjacent: true,
        }
    }
}

impl ExecutorLimits {
    /// The first three must be positive (`<name> must be a positive integer`).
    pub fn validate(&self) -> crate::Result<()> {
        for (name, v) in [
            ("max_batch_operations", self.max_batch_operations),
            ("max_region_segments", self.max_region_segments),
            ("max_total_lowered_segments", self.max_total_lowered_segments),
        ] {
            if v == 0 {
                return crate::error::invalid(format!("{name} must be a positive integer"));
            }
        }
        Ok(())
    }
}

/// What one worker completed toward one remote endpoint (`DirectTransferReceipt`
/// for the sink: `worker_id` = the source worker, `endpoint` = the target endpoint;
/// `DirectReadReceipt` for the reader: `worker_id` = the target worker, `endpoint` =
/// the source endpoint). `operation_count` counts lowered segments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferReceipt {
    /// WRITE (sink) or READ (reader).
    pub direction: Direction,
    /// The local executor's worker.
    pub worker_id: String,
    /// The remote endpoint.
    pub endpoint: String,
    /// Engine operations (segments).
    pub operation_count: u64,
    /// Bytes moved.
    pub nbytes: u64,
}

/// What one execution submitted to its engine, filled in when passed as
/// [`ExecuteArgs::stats`] (added to: pass a fresh value per call
/// to read one call's figures). Counts completed batches only. Thread-safe.
#[derive(Debug, Default)]
pub struct ExecutionStats {
    /// Planned segments moved (the receipts' `operation_count` summed).
    pub planned_segments: std::sync::atomic::AtomicU64,
    /// Engine operations submitted for them (after coalescing; at most `planned_segments`).
    pub engine_operations: std::sync::atomic::AtomicU64,
    /// Engine batches.
    pub engine_batches: std::sync::atomic::AtomicU64,
    /// Set once any batch of the call was handed to the engine (completed or not).
    pub submitted: std::sync::atomic::AtomicBool,
    /// How the call ended its hold on the guards' pins ([`GuardRelease`] as `u8`).
    guard_release: std::sync::atomic::AtomicU8,
}

impl ExecutionStats {
    /// `(planned_segments, engine_operations, engine_batches)`.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.planned_segments.load(Ordering::Relaxed),
            self.engine_operations.load(Ordering::Relaxed),
            self.engine_batches.load(Ordering::Relaxed),
        )
    }

    /// How the (last) call ended its hold on the guards' pins.
    pub fn guard_release(&self) -> GuardRelease {
        GuardRelease::from_u8(self.guard_release.load(Ordering::Acquire))
    }

    fn set_guard_release(&self, r: GuardRelease) {
        self.guard_release.store(r as u8, Ordering::Release);
    }
}

/// What an engine still holds ([`TransferExecutor::resources`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineResources {
    /// Every region registered with the engine now (`None`: the engine cannot list).
    pub registered: Option<Vec<MemoryRegion>>,
    /// The engine's pending transfers (sorted by id).
    pub pending: Vec<super::completion::PendingTransferInfo>,
}

/// How a live call ended its hold on the allocation guards' pins (the lifetime
/// tokens of the source and target allocations it pinned), as a caller proving that
/// nothing stays pinned needs to know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GuardRelease {
    /// The call pinned nothing (it failed before the guards, or had no work).
    #[default]
    NotPinned = 0,
    /// Released with terminal state `completed`: every batch completed.
    Completed = 1,
    /// Released `failed_drained`: a batch failed or was cancelled after submission;
    /// the engine no longer touches the memory.
    FailedDrained = 2,
    /// Released `aborted`: the call failed before it submitted anything.
    Aborted = 3,
    /// Not released: the pins are held by a pending transfer (completion unknown, or
    /// an unregistration that failed) until it is drained or the engine restarts.
    Pending = 4,
    /// A lifetime token's release failed (the error says which).
    ReleaseFailed = 5,
}

impl GuardRelease {
    fn from_u8(v: u8) -> GuardRelease {
        match v {
            1 => GuardRelease::Completed,
            2 => GuardRelease::FailedDrained,
            3 => GuardRelease::Aborted,
            4 => GuardRelease::Pending,
            5 => GuardRelease::ReleaseFailed,
            _ => GuardRelease::NotPinned,
        }
    }

    /// The state's name (`"completed"`, `"pending"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GuardRelease::NotPinned => "not_pinned",
            GuardRelease::Completed => "completed",
            GuardRelease::FailedDrained => "failed_drained",
            GuardRelease::Aborted => "aborted",
            GuardRelease::Pending => "pending",
            GuardRelease::ReleaseFailed => "release_failed",
        }
    }
}

/// Options of one call of [`TransferExecutor::execute_sink`] (the local binding is the
/// source: `MooncakeTransferEngineSink.execute`) or [`TransferExecutor::execute_reader`]
/// (the local binding is the target: `MooncakeTransferEngineReader.execute`). *Local*
/// is the side the calling worker owns, *remote* the other side, reached through the
/// engine; remote memory is always registered by its owners.
#[derive(Clone, Copy, Default)]
pub struct ExecuteArgs<'a> {
    /// Only this worker of the local binding (default: its one worker).
    pub local_worker_id: Option<&'a str>,
    /// The local memory is registered by its owner (then `local_registrations` are its
    /// evidence); otherwise the call registers the local allocations for its duration.
    pub local_pre_registered: bool,
    /// Evidence for pre-registered local memory.
    pub local_registrations: Option<&'a [MemoryRegistrationLease]>,
    /// Evidence that every remote allocation the call touches is registered by its
    /// owner (required unless `registrations_from_bindings`).
    pub remote_registrations: Option<&'a [MemoryRegistrationLease]>,
    /// Pins of the source allocations (required).
    pub source_guards: Option<&'a GuardProviders>,
    /// Pins of the target allocations (required).
    pub target_guards: Option<&'a GuardProviders>,
    /// Transfer id handed to the guards (default: 32 random hex).
    pub transfer_id: Option<&'a str>,
    /// Checked before every batch: set it to stop submitting (the call then fails).
    pub cancel: Option<&'a AtomicBool>,
    /// Throttled [`Progress`](crate::protocol::Progress) reports
    /// ([`ProgressPhase::Transfer`], items = planned segments) after completed
    /// batches, on the calling thread.
    pub progress: Option<ProgressFn<'a>>,
    /// Receives what the call submitted to the engine (optional).
    pub stats: Option<&'a ExecutionStats>,
    /// The owners' registration evidence is the bindings themselves: every fragment
    /// of the remote bindings (and, when pre-registered, of the local binding) is
    /// registered for its binding's lease generation and lease id, as
    /// [`Sink`](super::Sink) and [`Loader`](super::Loader) assert for their callers.
    /// The registration leases are then neither needed nor read.
    pub registrations_from_bindings: bool,
}

/// One live call as the executor runs it: which side drives it and the bindings of
/// both sides. A sink's local binding is a source (it pushes writes); a reader's is a
/// target (it pulls reads).
pub(crate) struct Call<'a> {
    /// The side of the local binding.
    pub(crate) local_side: Side,
    pub(crate) plan: &'a TransferPlan,
    pub(crate) source_placement: &'a Placement,
    pub(crate) target_placement: &'a Placement,
    /// The calling worker's binding.
    pub(crate) local: &'a RuntimeBinding,
    /// The other side's bindings.
    pub(crate) remote: &'a [RuntimeBinding],
}

impl<'a> Call<'a> {
    /// A sink's call (`live-transfer.md` §5).
    pub(crate) fn sink(
        plan: &'a TransferPlan,
        source_placement: &'a Placement,
        source_binding: &'a RuntimeBinding,
        target_placement: &'a Placement,
        target_bindings: &'a [RuntimeBinding],
    ) -> Call<'a> {
        Call {
            local_side: Side::Source,
            plan,
            source_placement,
            target_placement,
            local: source_binding,
            remote: target_bindings,
        }
    }

    /// A reader's call (`live-transfer.md` §10: §5 with the sides swapped).
    pub(crate) fn reader(
        plan: &'a TransferPlan,
        source_placement: &'a Placement,
        source_bindings: &'a [RuntimeBinding],
        target_placement: &'a Placement,
        target_binding: &'a RuntimeBinding,
    ) -> Call<'a> {
        Call {
            local_side: Side::Target,
            plan,
            source_placement,
            target_placement,
            local: target_binding,
            remote: source_bindings,
        }
    }

    fn remote_side(&self) -> Side {
        match self.local_side {
            Side::Source => Side::Target,
            Side::Target => Side::Source,
        }
    }

    fn placement(&self, side: Side) -> &'a Placement {
        match side {
            Side::Source => self.source_placement,
            Side::Target => self.target_placement,
        }
    }

    /// The engine direction of the call's batches.
    fn direction(&self) -> Direction {
        match self.local_side {
            Side::Source => Direction::Write,
            Side::Target => Direction::Read,
        }
    }
}

/// The registration evidence of one side: the owners' leases by fragment id, or
/// `None` when it is the bindings themselves.
fn evidence<'a>(
    from_bindings: bool,
    leases: Option<&'a [MemoryRegistrationLease]>,
    label: &str,
) -> std::result::Result<Option<FxHashMap<&'a str, &'a MemoryRegistrationLease>>, Error> {
    if from_bindings {
        return Ok(None);
    }
    registration_map(leases, label).map(Some)
}

/// `validate_registration` against `evidence` (nothing to check when the evidence is
/// the bindings).
fn check_evidence(
    f: &RuntimeFragment,
    evidence: &Option<FxHashMap<&str, &MemoryRegistrationLease>>,
    label: &str,
    lease_generation: u64,
    lease_id: &str,
) -> std::result::Result<(), String> {
    match evidence {
        Some(map) => validate_registration(f, map, label, lease_generation, lease_id),
        None => Ok(()),
    }
}

/// A live-transfer executor on one engine (sink and reader share it). Cheap; any
/// number may exist per engine: every fence is keyed by the engine identity.
#[derive(Clone)]
pub struct TransferExecutor {
    pub(super) engine: Arc<dyn TransferEngine>,
    pub(super) identity: u64,
    pub(super) limits: ExecutorLimits,
}

impl std::fmt::Debug for TransferExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferExecutor").field("identity", &self.identity).field("limits", &self.limits).finish()
    }
}

fn te(msg: impl Into<String>) -> TransferError {
    TransferError::engine(msg)
}

fn contract(msg: impl Into<String>) -> TransferError {
    TransferError::contract(Error::invalid(msg))
}

/// `validate_manifest_pair(plan, placement, binding, label)` (§5.1 step 2).
fn manifest_pair(
    plan: &TransferPlan,
    placement: &Placement,
    binding: &RuntimeBinding,
    side: Side,
) -> TransferResult<()> {
    manifest_pair_with(plan, placement, binding, side, true)
}

/// [`manifest_pair`]; `validate == false` skips the binding validation for a binding
/// equal to one validated earlier in the same call (the check is pure).
fn manifest_pair_with(
    plan: &TransferPlan,
    placement: &Placement,
    binding: &RuntimeBinding,
    side: Side,
    validate: bool,
) -> TransferResult<()> {
    let s = side.as_str();
    // A binding the plan was bound to (its participant's kept binding, or a clone of
    // it) paired with the plan's own placement (same digest: same content) was
    // validated by the binding; the check is pure.
    let bound = || {
        placement.digest() == plan.placement(side).digest()
            && plan.executors(side).iter().any(|e| {
                e.participant_id == binding.participant_id() && plan.bindings(side)[e.binding as usize] == *binding
            })
    };
    if validate && !bound() {
        validate_runtime_binding_remembered(placement, binding).map_err(|e| {
            te(format!("invalid {s} runtime binding: {}", e.message())).with_error_kind(ErrorKind::InvalidBinding)
        })?;
    }
    if placement.resource_id() != plan.resource_id() {
        return Err(TransferError::stale(format!("{s} resource_id mismatch")));
    }
    if placement.revision() != plan.revision() {
        return Err(TransferError::stale(format!("{s} revision mismatch")));
    }
    if placement.weight_generation() != plan.weight_generation() {
        return Err(TransferError::stale(format!("{s} weight_generation mismatch")));
    }
    Ok(())
}

fn planned_participant(plan: &TransferPlan, side: Side, participant: &str) -> bool {
    plan.executors(side).iter().any(|e| e.participant_id == participant)
}

/// One local operation after the per-operation checks.
struct LocalOp<'a> {
    index: usize,
    source: &'a RuntimeFragment,
    target: &'a RuntimeFragment,
}

impl<'a> LocalOp<'a> {
    /// Its fragment on `side`.
    fn on(&self, side: Side) -> &'a RuntimeFragment {
        match side {
            Side::Source => self.source,
            Side::Target => self.target,
        }
    }
}

/// Pins of one execution, released once.
pub(super) struct Pins<'s> {
    pub(super) tokens: Vec<Box<dyn LifetimeToken>>,
    /// Where the release is recorded (the call's stats).
    pub(super) stats: Option<&'s ExecutionStats>,
}

impl Pins<'_> {
    pub(super) fn release(&mut self, state: TerminalState) -> Option<String> {
        let mut err = None;
        let pinned = !self.tokens.is_empty();
        while let Some(mut t) = self.tokens.pop() {
            if let Err(e) = t.release(state) {
                err.get_or_insert(e.message().to_string());
            }
        }
        let outcome = match (pinned, &err, state) {
            (false, _, _) => GuardRelease::NotPinned,
            (true, Some(_), _) => GuardRelease::ReleaseFailed,
            (true, None, TerminalState::Completed) => GuardRelease::Completed,
            (true, None, TerminalState::FailedDrained) => GuardRelease::FailedDrained,
            (true, None, _) => GuardRelease::Aborted,
        };
        self.record(outcome);
        err
    }
    pub(super) fn record(&self, r: GuardRelease) {
        if let Some(s) = self.stats {
            s.set_guard_release(r);
        }
    }
    pub(super) fn abort<T>(&mut self, e: TransferError) -> TransferResult<T> {
        self.release(TerminalState::Aborted);
        Err(e)
    }
}

impl TransferExecutor {
    /// An executor on `engine` with `limits`. Errors: limit validation (contract),
    /// `failed to resolve canonical engine identity: <error>`, `get_engine_ptr
    /// returned an invalid canonical engine identity` (engine errors).
    pub fn new(engine: Arc<dyn TransferEngine>, limits: ExecutorLimits) -> TransferResult<Self> {
        limits.validate().map_err(TransferError::contract)?;
        let identity = match engine.identity() {
            Ok(0) => return Err(te("get_engine_ptr returned an invalid canonical engine identity")),
            Ok(id) => id,
            Err(e) => return Err(te(format!("failed to resolve canonical engine identity: {e}"))),
        };
        Ok(TransferExecutor { engine, identity, limits })
    }

    /// The engine identity every fence of this executor is keyed by.
    pub fn engine_identity(&self) -> u64 {
        self.identity
    }
    /// What the engine still holds for the library: the regions registered with it
    /// now (whoever registered them; `None` when the engine cannot list them) and the
    /// pending transfers of its identity with their quarantined registrations and
    /// pins. After every call returned and every pending transfer was drained, the
    /// library holds nothing: `pending` is empty and `registered` lists only the
    /// owners' own registrations.
    pub fn resources(&self) -> EngineResources {
        EngineResources {
            registered: self.engine.registered_regions(),
            pending: super::completion::pending_transfers(self.identity),
        }
    }

    /// The limits.
    pub fn limits(&self) -> ExecutorLimits {
        self.limits
    }
    /// Sorted pending transfer ids of this engine (any executor's).
    pub fn pending_transfer_ids(&self) -> Vec<String> {
        completion::pending_transfer_ids(self.identity)
    }
    /// See [`completion::pending_transfer_status`].
    pub fn pending_transfer_status(&self, id: &str) -> TransferResult<String> {
        completion::pending_transfer_status(self.identity, id)
    }
    /// See [`completion::drain_pending_transfer`].
    pub fn drain_pending_transfer(&self, id: &str, timeout_ms: u64) -> TransferResult<String> {
        completion::drain_pending_transfer(self.identity, id, timeout_ms)
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &Arc<dyn TransferEngine> {
        &self.engine
    }

    /// Fails when the engine's identity is no longer the one this executor was
    /// created with (the engine restarted) or cannot be read.
    pub(crate) fn check_engine_identity(&self) -> TransferResult<()> {
        match self.engine.identity() {
            Ok(id) if id == self.identity => Ok(()),
            Ok(_) => Err(te(
                "transfer engine identity changed since the executor was created (engine restarted); create a new executor",
            )),
            Err(e) => Err(te(format!("failed to resolve canonical engine identity: {e}"))),
        }
    }

    /// Pins the planned bindings of one side (§9): required ids per
    /// `(instance, participant)` are the union of that key's executors' fragment ids.
    #[allow(clippy::too_many_arguments)]
    fn pin_side(
        &self,
        plan: &TransferPlan,
        side: Side,
        bindings: &[&RuntimeBinding],
        providers: &GuardProviders,
        transfer_id: &str,
        pins: &mut Pins<'_>,
        mut record: Option<&mut Vec<PinSpec>>,
    ) -> TransferResult<Vec<RuntimeBinding>> {
        let s = side.as_str();
        // The executors of each (instance, participant): their fragment ids (sorted
        // per executor) are that key's required ids.
        let mut required: BTreeMap<(&str, &str), Vec<&ExecutorTransferPlan>> = BTreeMap::new();
        for e in plan.executors(side) {
            required.entry((e.instance_id.as_str(), e.participant_id.as_str())).or_default().push(e);
        }
        let mut sorted: Vec<&RuntimeBinding> = bindings.to_vec();
        sorted.sort_by(|a, b| (a.instance_id(), a.participant_id()).cmp(&(b.instance_id(), b.participant_id())));
        let mut fresh = Vec::new();
        for b in sorted {
            let Some(execs) = required.get(&(b.instance_id(), b.participant_id())) else { continue };
            let Some(provider) = providers.get(b.instance_id(), b.participant_id()) else {
                return pins.abort(contract(format!(
                    "missing {s} allocation guard provider: ({}, {})",
                    b.instance_id(),
                    b.participant_id()
                )));
            };
            let ids: std::borrow::Cow<'_, [String]> = match execs.as_slice() {
                [one] => one.fragment_ids.as_slice().into(),
                many => {
                    let mut v: Vec<String> = many.iter().flat_map(|e| e.fragment_ids.iter().cloned()).collect();
                    v.sort_unstable();
                    v.dedup();
                    v.into()
                }
            };
            match acquire_pin(provider, s, transfer_id, b, &ids) {
                Ok((binding, token)) => {
                    pins.tokens.push(token);
                    if let Some(record) = record.as_deref_mut() {
                        let provider = providers.get_arc(b.instance_id(), b.participant_id()).expect("found above");
                        match StepPin::new(binding.clone(), &ids) {
                            Ok(pin) => record.push(PinSpec { side, pin, provider: provider.clone() }),
                            Err(e) => return pins.abort(TransferError::contract(e)),
                        }
                    }
                    fresh.push(binding);
                }
                Err(e) => return pins.abort(TransferError::contract(e)),
            }
        }
        Ok(fresh)
    }

    /// Source-pushed writes on one source worker (`live-transfer.md` §5): writes
    /// every operation of the local source executor into the target endpoints and
    /// returns one receipt per target endpoint (sorted). An unplanned source
    /// participant (an unselected DP replica) returns `[]` at once.
    ///
    /// Errors: see [`TransferError`]; every message of §5 (`source executor
    /// snapshot mismatch`, `target registration leases are required`, `stale source
    /// fragment: <id>`, `transfer region exceeds max_region_segments: ...`, ...).
    ///
    /// # Safety
    /// The allocations of `source_binding` (local) and of `target_bindings` (remote,
    /// reachable through the engine) must be valid for the duration of the call and
    /// pinned by the guards; with a pending hand-off, until its drain.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_sink(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_binding: &RuntimeBinding,
        target_placement: &Placement,
        target_bindings: &[RuntimeBinding],
        args: &ExecuteArgs<'_>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let call = Call::sink(plan, source_placement, source_binding, target_placement, target_bindings);
        // SAFETY: forwarded contract (this function's `# Safety`).
        unsafe { self.call(&call, args, None) }
    }

    /// Target-pulled reads on one target worker (`live-transfer.md` §10): reads every
    /// operation of the local target executor from the source endpoints and returns
    /// one receipt per source endpoint (sorted). Remote source memory must be
    /// registered by its owners.
    ///
    /// # Safety
    /// As [`Self::execute_sink`], with the sides swapped.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_reader(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_bindings: &[RuntimeBinding],
        target_placement: &Placement,
        target_binding: &RuntimeBinding,
        args: &ExecuteArgs<'_>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let call = Call::reader(plan, source_placement, source_bindings, target_placement, target_binding);
        // SAFETY: forwarded contract (this function's `# Safety`).
        unsafe { self.call(&call, args, None) }
    }

    /// One call of either side (`live-transfer.md` §5, and §10 with the sides
    /// swapped), or with `prepare` its preparation: every check of the call under its
    /// pins, then, instead of running, the lowered batches, the pins to repeat and the
    /// own registrations (made here) go to `prepare`.
    ///
    /// # Safety
    /// As [`Self::execute_sink`] for the call's sides; with `prepare`, the local
    /// allocations it registers stay valid until they are unregistered.
    pub(crate) unsafe fn call(
        &self,
        c: &Call<'_>,
        args: &ExecuteArgs<'_>,
        prepare: Option<&mut PrepareOut>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let plan = c.plan;
        let (ls, rs) = (c.local_side, c.remote_side());
        let (lname, rname) = (ls.as_str(), rs.as_str());
        let (lp, rp) = (c.placement(ls), c.placement(rs));
        // Preflight (§5.1): nothing pinned, nothing called.
        if args.local_registrations.is_some() && !args.local_pre_registered {
            // The reference's message (its keyword arguments are named by side).
            return Err(te(format!("{lname}_registrations require {lname}_pre_registered=True")));
        }
        manifest_pair(plan, lp, c.local, ls)?;
        if !planned_participant(plan, ls, c.local.participant_id()) {
            return Ok(Vec::new());
        }
        plan.resolve_validated(ls, lp, c.local).map_err(TransferError::engine_from)?;
        for r in c.remote {
            manifest_pair(plan, rp, r, rs)?;
            if planned_participant(plan, rs, r.participant_id()) {
                plan.resolve_validated(rs, rp, r).map_err(TransferError::engine_from)?;
            }
        }
        let source_guards =
            args.source_guards.ok_or_else(|| contract("source allocation guard providers are required"))?;
        let target_guards =
            args.target_guards.ok_or_else(|| contract("target allocation guard providers are required"))?;
        // Reserved execution (§5.2): pin the sources, then the targets.
        self.check_engine_identity()?;
        let reservation = reserve(self.identity)?;
        let transfer_id =
            args.transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let mut pins = Pins { tokens: Vec::new(), stats: args.stats };
        let mut record = prepare.as_ref().map(|_| Vec::new());
        let local_one = [c.local];
        let remote_all: Vec<&RuntimeBinding> = c.remote.iter().collect();
        let (source_side, target_side) =
            if ls == Side::Source { (&local_one[..], &remote_all[..]) } else { (&remote_all[..], &local_one[..]) };
        let fresh_sources =
            self.pin_side(plan, Side::Source, source_side, source_guards, &transfer_id, &mut pins, record.as_mut())?;
        let fresh_targets =
            self.pin_side(plan, Side::Target, target_side, target_guards, &transfer_id, &mut pins, record.as_mut())?;
        let (fresh_local, fresh_remote) =
            if ls == Side::Source { (fresh_sources, fresh_targets) } else { (fresh_targets, fresh_sources) };
        if fresh_local.len() != 1 {
            return pins.abort(te(format!("{lname} allocation guards did not acquire one local binding")));
        }
        let local = &fresh_local[0];
        // Re-check under the pins.
        let checked = (|| -> TransferResult<_> {
            manifest_pair_with(plan, lp, local, ls, local != c.local)?;
            let execs = plan.executors(ls);
            let mut mine: Vec<usize> = plan.resolve_validated(ls, lp, local).map_err(TransferError::engine_from)?;
            if let Some(w) = args.local_worker_id {
                mine.retain(|&i| execs[i].worker_id == w);
            }
            if mine.len() != 1 {
                return Err(te(format!("{lname} binding requires exactly one local worker executor")));
            }
            let exec = &execs[mine[0]];
            // The remote side: pair_manifests, then every planned executor exactly once.
            let mut seen = BTreeSet::new();
            for r in &fresh_remote {
                if !seen.insert(r.participant_id()) {
                    return Err(te(format!("duplicate {rname} runtime binding participant")));
                }
                if r.placement_id() != rp.placement_id() {
                    return Err(te(format!("{rname} placement and binding IDs differ")));
                }
            }
            let mut keys = BTreeSet::new();
            let mut current: FxHashMap<&str, (&RuntimeFragment, &RuntimeBinding)> = FxHashMap::default();
            let rexecs = plan.executors(rs);
            for r in &fresh_remote {
                manifest_pair_with(plan, rp, r, rs, !c.remote.contains(r))?;
                for i in plan.resolve_validated(rs, rp, r).map_err(TransferError::engine_from)? {
                    let e = &rexecs[i];
                    if !keys.insert((e.rank.order_key(), e.worker_id.as_str())) {
                        return Err(te(format!(
                            "duplicate {rname} executor rank and worker: ({:?}, {})",
                            e.rank.order_key(),
                            e.worker_id
                        )));
                    }
                }
                for f in r.fragments() {
                    if current.insert(f.fragment_id(), (f, r)).is_some() {
                        return Err(te(format!("duplicate {rname} fragment: {}", f.fragment_id())));
                    }
                }
            }
            let planned: BTreeSet<_> = rexecs.iter().map(|e| (e.rank.order_key(), e.worker_id.as_str())).collect();
            if keys != planned {
                return Err(te(format!("{rname} executor set is incomplete")));
            }
            if exec.operation_indices.is_empty() {
                return Ok(None);
            }
            // The lease maps first, so that a missing one fails before any stale
            // fragment check.
            let remote_leases = evidence(args.registrations_from_bindings, args.remote_registrations, rname)
                .map_err(TransferError::engine_from)?;
            let local_leases = if args.local_pre_registered {
                Some(
                    evidence(args.registrations_from_bindings, args.local_registrations, lname)
                        .map_err(TransferError::engine_from)?,
                )
            } else {
                None
            };
            let mut ops: Vec<LocalOp<'_>> = Vec::with_capacity(exec.operation_indices.len());
            for &i in &exec.operation_indices {
                let i = i as usize;
                let planned_local = plan.operation_fragment(i, ls).1;
                let cur_local = match local.fragment_for(planned_local.placement_fragment_id()) {
                    Some(f) if f == planned_local => f,
                    _ => {
                        return Err(TransferError::stale(format!(
                            "stale {lname} fragment: {}",
                            planned_local.fragment_id()
                        )))
                    }
                };
                let planned_remote = plan.operation_fragment(i, rs).1;
                let (cur_remote, rb) = current.get(planned_remote.fragment_id()).copied().ok_or_else(|| {
                    TransferError::stale(format!("missing planned {rname} fragment: {}", planned_remote.fragment_id()))
                })?;
                if cur_remote != planned_remote {
                    return Err(TransferError::stale(format!(
                        "stale {rname} fragment: {}",
                        planned_remote.fragment_id()
                    )));
                }
                if cur_remote.endpoint().is_empty() {
                    return Err(te(format!("{rname} endpoint is empty: {}", cur_remote.fragment_id())));
                }
                let (source, target) =
                    if ls == Side::Source { (cur_local, cur_remote) } else { (cur_remote, cur_local) };
                self.check_operation(plan, i, source, target)?;
                check_evidence(cur_remote, &remote_leases, rname, rb.lease_generation(), rb.lease_id())
                    .map_err(TransferError::stale)?;
                if let Some(leases) = &local_leases {
                    check_evidence(cur_local, leases, lname, local.lease_generation(), local.lease_id())
                        .map_err(TransferError::stale)?;
                }
                ops.push(LocalOp { index: i, source, target });
            }
            Ok(Some((exec.worker_id.clone(), ops)))
        })();
        let (worker, ops) = match checked {
            Ok(Some(v)) => v,
            Ok(None) => {
                pins.release(TerminalState::Completed);
                return Ok(Vec::new());
            }
            Err(e) => return pins.abort(e),
        };
        if let Err(e) = self.budget(plan, &ops) {
            return pins.abort(e);
        }
        // Own registrations of the local allocations, unless their owner registered them.
        let own = if args.local_pre_registered {
            Vec::new()
        } else {
            match allocations(ops.iter().map(|o| o.on(ls)), lname) {
                Ok(a) => a,
                Err(e) => return pins.abort(e),
            }
        };
        let mut groups: BTreeMap<&str, Vec<LocalOp<'_>>> = BTreeMap::new();
        for op in ops {
            groups.entry(op.on(rs).endpoint()).or_default().push(op);
        }
        if let Some(out) = prepare {
            out.pins = record.unwrap_or_default();
            let r = self.prepare_finish(plan, c.direction(), &worker, groups, own, pins, out);
            drop(reservation);
            return r.map(|()| Vec::new());
        }
        let resources: Vec<Box<dyn Any + Send>> =
            vec![Box::new(plan.clone()), Box::new(fresh_local.clone()), Box::new(fresh_remote.clone())];
        let hooks = Hooks { cancel: args.cancel, progress: args.progress, stats: args.stats };
        let out = self.run(plan, c.direction(), &worker, groups, own, pins, resources, hooks);
        drop(reservation);
        out
    }

    /// Bounds (`invalid copy range for <tensor>: <detail>`) and
    /// `max_region_segments` of one operation.
    fn check_operation(
        &self,
        plan: &TransferPlan,
        i: usize,
        s: &RuntimeFragment,
        t: &RuntimeFragment,
    ) -> TransferResult<()> {
        let r = &plan.regions()[i];
        let tensor = plan.logical().target_of(r).tensor_id();
        r.check_bounds(s.nbytes(), t.nbytes())
            .map_err(|e| te(format!("invalid copy range for {tensor}: {}", e.message())))?;
        let n = r.segment_count();
        if n > self.limits.max_region_segments {
            return Err(TransferError::new(
                TransferErrorKind::Contract,
                format!(
                    "transfer region exceeds max_region_segments: {tensor}: {n} > {}",
                    self.limits.max_region_segments
                ),
            )
            .with_error_kind(ErrorKind::LimitExceeded));
        }
        Ok(())
    }

    /// The lowering budget over all local operations (§6.1).
    fn budget(&self, plan: &TransferPlan, ops: &[LocalOp<'_>]) -> TransferResult<()> {
        let mut total = 0u64;
        for op in ops {
            total = total.saturating_add(plan.regions()[op.index].segment_count());
            if total > self.limits.max_total_lowered_segments {
                return Err(TransferError::new(
                    TransferErrorKind::Contract,
                    format!(
                        "transfer plan exceeds max_total_lowered_segments: {total} > {}",
                        self.limits.max_total_lowered_segments
                    ),
                )
                .with_error_kind(ErrorKind::LimitExceeded));
            }
        }
        Ok(())
    }

    /// Registers `own`, runs every endpoint's batches, unregisters, releases the
    /// pins (or hands everything to a pending entry) and returns the receipts.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        plan: &TransferPlan,
        direction: Direction,
        worker: &str,
        mut groups: BTreeMap<&str, Vec<LocalOp<'_>>>,
        own: Vec<(MemoryRegion, String)>,
        mut pins: Pins<'_>,
        resources: Vec<Box<dyn Any + Send>>,
        hooks: Hooks<'_>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let label = if direction == Direction::Write { "source" } else { "target" };
        let mut registered: Vec<u64> = Vec::with_capacity(own.len());
        let mut reg_error = None;
        for (region, id) in &own {
            // SAFETY: the caller guarantees the bindings' allocations stay valid and
            // pinned; we unregister before releasing the pins (or hand both off).
            match unsafe { self.engine.register_memory(*region) } {
                Ok(0) => registered.push(region.address),
                Ok(code) => {
                    reg_error = Some(te(format!("{label} register_memory failed for {id}: {code}")));
                    break;
                }
                Err(e) => {
                    reg_error = Some(te(format!("{label} register_memory failed for {id}: {}", e.message)));
                    break;
                }
            }
        }
        let total: u64 = groups.values().flatten().map(|o| plan.regions()[o.index].total_bytes()).sum();
        let total_ops: u64 = groups.values().flatten().map(|o| plan.regions()[o.index].segment_count()).sum();
        let mut progress = Reporter::start(hooks.progress, ProgressPhase::Transfer, total, total_ops);
        let mut submitted = false;
        let body: TransferResult<Vec<TransferReceipt>> = match reg_error {
            Some(e) => Err(e),
            None => {
                let mut receipts = Vec::new();
                let mut result = Ok(());
                for (endpoint, ops) in groups.iter_mut() {
                    sort_ops(plan, ops);
                    let mut sub = Submitter {
                        exec: self,
                        operation_count: 0,
                        nbytes: 0,
                        stop: None,
                        hooks,
                        progress: &mut progress,
                        submitted: &mut submitted,
                    };
                    let lowered = lower(plan, endpoint, direction, &self.limits, ops, |b| sub.submit(b));
                    if let Err(e) = lowered {
                        sub.stop.get_or_insert(Stop::Error(e));
                    }
                    if let Some(stop) = sub.stop.take() {
                        result = Err(stop);
                        break;
                    }
                    receipts.push(TransferReceipt {
                        direction,
                        worker_id: worker.to_string(),
                        endpoint: endpoint.to_string(),
                        operation_count: sub.operation_count,
                        nbytes: sub.nbytes,
                    });
                }
                match result {
                    Ok(()) => {
                        progress.finish();
                        Ok(receipts)
                    }
                    Err(Stop::Error(e)) => Err(e),
                    Err(Stop::Unknown { ticket, restart_required, interrupted }) => {
                        // Hand everything off; nothing is unregistered or released.
                        pins.record(GuardRelease::Pending);
                        let handoff = Handoff { registrations: registered, tokens: pins.tokens, resources };
                        return Err(retain_unknown(
                            self.identity,
                            &self.engine,
                            ticket,
                            restart_required,
                            interrupted,
                            handoff,
                        ));
                    }
                }
            }
        };
        let state = match &body {
            Ok(_) => TerminalState::Completed,
            Err(e) if e.kind == TransferErrorKind::CompletionFailed || submitted => TerminalState::FailedDrained,
            Err(_) => TerminalState::Aborted,
        };
        let (failed, failures) = unregister_all(&*self.engine, &registered);
        if !failed.is_empty() {
            pins.record(GuardRelease::Pending);
            let handoff = Handoff { registrations: Vec::new(), tokens: std::mem::take(&mut pins.tokens), resources };
            let id = quarantine_cleanup(self.identity, &self.engine, failed, state, handoff);
            let mut e = cleanup_error(label, &failures, id, self.identity);
            e.submitted = submitted;
            if let Err(orig) = &body {
                e.cause = Some(orig.message.clone());
            }
            return Err(e);
        }
        let release = pins.release(state);
        let mut body = body;
        if let Err(e) = &mut body {
            e.submitted = submitted;
        }
        match (body, release) {
            (Ok(r), None) => Ok(r),
            (Ok(_), Some(m)) => Err(te(format!("allocation lifetime release failed: {m}"))),
            (Err(e), _) => Err(e),
        }
    }
}

/// Sorts one endpoint's operations as §5 step 14 says: by `(target address +
/// target offset, source address + source offset)`.
fn sort_ops(plan: &TransferPlan, ops: &mut [LocalOp<'_>]) {
    ops.sort_by_key(|o| {
        let r = &plan.regions()[o.index];
        (o.target.address() + r.target_base_offset, o.source.address() + r.source_base_offset)
    });
}

/// One binding a prepared transfer pins at every step: its side, the pin (binding
/// as observed at preparation, required ids, fence digest) and its guard.
#[derive(Clone)]
pub(crate) struct PinSpec {
    pub side: Side,
    pub pin: StepPin,
    pub provider: Arc<dyn GuardProvider>,
}

/// One remote endpoint of a prepared transfer: its batches, lowered once, each with
/// its planned segments, and the receipt they predict.
pub(crate) struct PreparedEndpoint {
    pub endpoint: String,
    pub batches: Vec<(TransferBatch, u64)>,
    pub operation_count: u64,
    pub nbytes: u64,
}

/// What a preparation keeps (`super::prepared`): empty when the call has nothing to
/// do (an unplanned participant, no local operations).
#[derive(Default)]
pub(crate) struct PrepareOut {
    /// The bindings to pin at every step, in the call's pinning order.
    pub pins: Vec<PinSpec>,
    /// The local executor's worker (`None`: nothing to do).
    pub worker: Option<String>,
    /// Per remote endpoint (sorted), the lowered batches.
    pub endpoints: Vec<PreparedEndpoint>,
    /// The allocations registered by the preparation (unregistered when the
    /// prepared transfer is closed).
    pub registered: Vec<u64>,
    /// Plan operations executed per step.
    pub regions: u64,
}

impl TransferExecutor {
    /// Ends a preparation under its pins: lowers each endpoint's operations into
    /// batches exactly as [`Self::run`] would submit them, registers the own
    /// allocations, then releases the pins `aborted` (nothing was submitted).
    #[allow(clippy::too_many_arguments)]
    fn prepare_finish(
        &self,
        plan: &TransferPlan,
        direction: Direction,
        worker: &str,
        mut groups: BTreeMap<&str, Vec<LocalOp<'_>>>,
        own: Vec<(MemoryRegion, String)>,
        mut pins: Pins<'_>,
        out: &mut PrepareOut,
    ) -> TransferResult<()> {
        let mut endpoints = Vec::with_capacity(groups.len());
        let mut regions = 0u64;
        for (endpoint, ops) in groups.iter_mut() {
            sort_ops(plan, ops);
            regions += ops.len() as u64;
            let mut batches = Vec::new();
            let (mut operation_count, mut nbytes) = (0u64, 0u64);
            let mut invalid = None;
            let lowered = lower(plan, endpoint, direction, &self.limits, ops, |(batch, planned)| match batch {
                Ok(b) => {
                    operation_count += planned;
                    nbytes += b.nbytes();
                    batches.push((b, planned));
                    true
                }
                Err(e) => {
                    invalid = Some(TransferError::contract(e));
                    false
                }
            });
            if let Some(e) = lowered.err().or(invalid) {
                return pins.abort(e);
            }
            endpoints.push(PreparedEndpoint { endpoint: endpoint.to_string(), batches, operation_count, nbytes });
        }
        let label = if direction == Direction::Write { "source" } else { "target" };
        let mut registered: Vec<u64> = Vec::with_capacity(own.len());
        for (region, id) in &own {
            // SAFETY: the caller of the preparation keeps its local allocations valid
            // until the prepared transfer unregisters them (its `# Safety`).
            let err = match unsafe { self.engine.register_memory(*region) } {
                Ok(0) => {
                    registered.push(region.address);
                    continue;
                }
                Ok(code) => te(format!("{label} register_memory failed for {id}: {code}")),
                Err(e) => te(format!("{label} register_memory failed for {id}: {}", e.message)),
            };
            let (failed, failures) = unregister_all(&*self.engine, &registered);
            if failed.is_empty() {
                return pins.abort(err);
            }
            pins.record(GuardRelease::Pending);
            let handoff =
                Handoff { registrations: Vec::new(), tokens: std::mem::take(&mut pins.tokens), resources: Vec::new() };
            let id = quarantine_cleanup(self.identity, &self.engine, failed, TerminalState::Aborted, handoff);
            let mut e = cleanup_error(label, &failures, id, self.identity);
            e.cause = Some(err.message);
            return Err(e);
        }
        if let Some(m) = pins.release(TerminalState::Aborted) {
            let (failed, _) = unregister_all(&*self.engine, &registered);
            if !failed.is_empty() {
                let handoff = Handoff { registrations: Vec::new(), tokens: Vec::new(), resources: Vec::new() };
                quarantine_cleanup(self.identity, &self.engine, failed, TerminalState::Aborted, handoff);
            }
            return Err(te(format!("allocation lifetime release failed: {m}")));
        }
        out.worker = Some(worker.to_string());
        out.endpoints = endpoints;
        out.registered = registered;
        out.regions = regions;
        Ok(())
    }
}

/// Own registrations of the used fragments (§7.1 step 1): whole allocations
/// (`storage_address`, `storage_nbytes`) in first-seen order, each once; the same
/// base with another size fails `<label> allocation capacity mismatch: <fragment id>`.
fn allocations<'a>(
    frags: impl Iterator<Item = &'a RuntimeFragment>,
    label: &str,
) -> TransferResult<Vec<(MemoryRegion, String)>> {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut out = Vec::new();
    for f in frags {
        match seen.get(&f.storage_address()) {
            Some(&n) if n == f.storage_nbytes() => {}
            Some(_) => return Err(te(format!("{label} allocation capacity mismatch: {}", f.fragment_id()))),
            None => {
                seen.insert(f.storage_address(), f.storage_nbytes());
                out.push((
                    MemoryRegion { address: f.storage_address(), len: f.storage_nbytes(), kind: f.memory() },
                    f.fragment_id().to_string(),
                ));
            }
        }
    }
    Ok(out)
}

pub(super) enum Stop {
    Error(TransferError),
    Unknown {
        ticket: Option<Box<dyn crate::engine::TransferTicket>>,
        restart_required: bool,
        interrupted: Option<String>,
    },
}

/// The caller's hooks of one execution.
#[derive(Clone, Copy, Default)]
pub(super) struct Hooks<'a> {
    pub(super) cancel: Option<&'a AtomicBool>,
    pub(super) progress: Option<ProgressFn<'a>>,
    pub(super) stats: Option<&'a ExecutionStats>,
}

/// One lowered batch: the batch built from its ranges (or why it could not be) and
/// the planned segments it carries.
type Lowered = (crate::Result<TransferBatch>, u64);

/// `(source base, source capacity, target base, target capacity)` of one batch range.
type Allocations = (u64, u64, u64, u64);

fn allocations_of(r: &TransferBatchRange) -> Allocations {
    (r.source_base_address, r.source_capacity, r.target_base_address, r.target_capacity)
}

/// Lowers one endpoint's operations (sorted) into batches (§6.2) and hands each to
/// `emit`, in order, until `emit` returns false. Pure: nothing is submitted here.
/// Errors: a region's segment limit (contract).
fn lower(
    plan: &TransferPlan,
    endpoint: &str,
    direction: Direction,
    limits: &ExecutorLimits,
    ops: &[LocalOp<'_>],
    mut emit: impl FnMut(Lowered) -> bool,
) -> TransferResult<()> {
    let mut b = Batcher { endpoint, direction, limits, ranges: Vec::new(), count: 0, planned: 0 };
    for op in ops {
        if !b.push_operation(plan, op, &mut emit)? {
            return Ok(());
        }
    }
    if !b.ranges.is_empty() {
        emit(b.take());
    }
    Ok(())
}

/// Streams segments into batches of at most `max_batch_operations` engine
/// operations, merging adjacent segments when [`ExecutorLimits::coalesce_adjacent`]
/// is set.
struct Batcher<'a> {
    endpoint: &'a str,
    direction: Direction,
    limits: &'a ExecutorLimits,
    ranges: Vec<TransferBatchRange>,
    /// Engine operations in `ranges` (merged segments count once).
    count: u64,
    /// Planned segments in `ranges`.
    planned: u64,
}

impl Batcher<'_> {
    fn new_range(a: &Allocations) -> TransferBatchRange {
        TransferBatchRange {
            source_base_address: a.0,
            source_capacity: a.1,
            target_base_address: a.2,
            target_capacity: a.3,
            source_offsets: Vec::new(),
            target_offsets: Vec::new(),
            sizes: Vec::new(),
        }
    }

    /// The batch built so far, ready to hand on; the batcher starts a new one.
    fn take(&mut self) -> Lowered {
        self.count = 0;
        let planned = std::mem::take(&mut self.planned);
        let ranges = std::mem::take(&mut self.ranges);
        (TransferBatch::from_ranges(self.endpoint, self.direction, ranges), planned)
    }

    /// Adds one operation's segments; every batch that fills up goes to `emit`.
    /// Returns false when `emit` asked to stop.
    fn push_operation(
        &mut self,
        plan: &TransferPlan,
        op: &LocalOp<'_>,
        emit: &mut impl FnMut(Lowered) -> bool,
    ) -> TransferResult<bool> {
        let (s, t) = (op.source, op.target);
        let allocations = (s.storage_address(), s.storage_nbytes(), t.storage_address(), t.storage_nbytes());
        let offsets = (s.storage_offset_bytes(), t.storage_offset_bytes());
        self.push_region(&plan.regions()[op.index], offsets, &allocations, emit)
    }

    /// Adds the segments of `r` (its offsets shifted by `(so, to)`, the fragments'
    /// offsets in their allocations) copying between `allocations`.
    fn push_region(
        &mut self,
        r: &TransferRegion,
        (so, to): (u64, u64),
        allocations: &Allocations,
        emit: &mut impl FnMut(Lowered) -> bool,
    ) -> TransferResult<bool> {
        let max_batch = self.limits.max_batch_operations;
        let coalesce = self.limits.coalesce_adjacent;
        // Coalescing: continue the batch's last range when it joins the same pair of
        // allocations (its last segment may then merge with this operation's first).
        let mut cur = match self.ranges.last() {
            Some(last) if coalesce && allocations_of(last) == *allocations => {
                self.ranges.pop().expect("checked non-empty")
            }
            _ => Self::new_range(allocations),
        };
        // Segments come in rows (`TransferRegion::row`): the first segment of a row
        // may join the batch's last segment; after it, a row's segments are `stride`
        // apart, so they join one another only when both strides equal their length
        // (then the whole row is one run), and otherwise go in as a block.
        let (len, ss, ts) = r.row();
        let n = r.inner_bytes;
        let row_joins = coalesce && ss == n && ts == n;
        // Room for the segments that go into this batch (no regrowth while lowering);
        // a batch handed on starts its next range with room for the rest.
        let mut left = if row_joins { r.segment_count() / len.max(1) } else { r.segment_count() };
        let reserve = |cur: &mut TransferBatchRange, k: u64| {
            // Capped: a huge batch limit grows the vectors as they fill instead.
            let k = k.min(1 << 20) as usize;
            cur.source_offsets.reserve(k);
            cur.target_offsets.reserve(k);
            cur.sizes.reserve(k);
        };
        reserve(&mut cur, left.min(max_batch - self.count));
        let mut go = true;
        r.for_each_row(self.limits.max_region_segments, |s, t| {
            let (s, t) = (so + s, to + t);
            let mut j = 0;
            while j < len {
                if j == 0 || row_joins {
                    let (s, t) = (s + j * ss, t + j * ts);
                    if coalesce {
                        if let (Some(&ls), Some(&lt), Some(ln)) =
                            (cur.source_offsets.last(), cur.target_offsets.last(), cur.sizes.last_mut())
                        {
                            if ls.checked_add(*ln) == Some(s) && lt.checked_add(*ln) == Some(t) {
                                // The rest of a joining row extends the same run.
                                let joined = if row_joins { len - j } else { 1 };
                                *ln += n * joined;
                                self.planned += joined;
                                j += joined;
                                continue;
                            }
                        }
                    }
                }
                // A full batch is handed on when the next segment does not join it (so
                // that a following adjacent segment can still merge into its last one).
                if self.count == max_batch {
                    if !cur.sizes.is_empty() {
                        let full = std::mem::replace(&mut cur, Self::new_range(allocations));
                        self.ranges.push(full);
                    }
                    go = emit(self.take());
                    if !go {
                        return false;
                    }
                    reserve(&mut cur, left.min(max_batch));
                }
                // A joining row's first remaining segment starts a run the rest of the
                // row then extends; any other row goes in as a block.
                let m = if row_joins { 1 } else { (len - j).min(max_batch - self.count) };
                left = left.saturating_sub(m);
                cur.source_offsets.extend((j..j + m).map(|i| s + i * ss));
                cur.target_offsets.extend((j..j + m).map(|i| t + i * ts));
                cur.sizes.extend(std::iter::repeat_n(n, m as usize));
                self.count += m;
                self.planned += m;
                j += m;
            }
            true
        })
        .map_err(TransferError::contract)?;
        if go && !cur.sizes.is_empty() {
            self.ranges.push(cur);
        }
        Ok(go)
    }
}

/// Submits lowered batches of one endpoint, one at a time, each run to a known
/// outcome, and counts what completed (the receipt).
struct Submitter<'x, 'p> {
    exec: &'x TransferExecutor,
    /// Planned segments of the completed batches (the receipt's count).
    operation_count: u64,
    nbytes: u64,
    stop: Option<Stop>,
    hooks: Hooks<'x>,
    progress: &'x mut Reporter<'p>,
    submitted: &'x mut bool,
}

impl Submitter<'_, '_> {
    /// Submits one batch; returns false (and keeps why in `stop`) when the execution
    /// must end here.
    fn submit(&mut self, (batch, planned): Lowered) -> bool {
        if self.hooks.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            self.stop = Some(Stop::Error(te("transfer was cancelled before a batch was submitted")));
            return false;
        }
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                self.stop = Some(Stop::Error(TransferError::contract(e)));
                return false;
            }
        };
        *self.submitted = true;
        if let Some(s) = self.hooks.stats {
            s.submitted.store(true, Ordering::Release);
        }
        let l = &self.exec.limits;
        match execute_batch(&*self.exec.engine, &batch, l.max_completion_drain_attempts, l.completion_drain_timeout_ms)
        {
            BatchOutcome::Completed => {
                self.operation_count += planned;
                self.nbytes += batch.nbytes();
                if let Some(st) = self.hooks.stats {
                    st.planned_segments.fetch_add(planned, Ordering::Relaxed);
                    st.engine_operations.fetch_add(batch.operation_count(), Ordering::Relaxed);
                    st.engine_batches.fetch_add(1, Ordering::Relaxed);
                }
                self.progress.advance(batch.nbytes(), planned);
                true
            }
            BatchOutcome::Failed(msg) => {
                self.stop = Some(Stop::Error(TransferError::new(TransferErrorKind::CompletionFailed, msg)));
                false
            }
            BatchOutcome::Unknown { ticket, restart_required, interrupted } => {
                self.stop = Some(Stop::Unknown { ticket, restart_required, interrupted });
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Item = (TransferRegion, (u64, u64), Allocations);

    /// Every segment of `r` in row-major order, by an N-D loop of its own.
    fn segments(r: &TransferRegion) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        let k = r.outer_loop_counts.len();
        let mut idx = vec![0u64; k];
        if r.outer_loop_counts.contains(&0) {
            return out;
        }
        loop {
            let s = r.source_base_offset + (0..k).map(|d| idx[d] * r.source_strides[d]).sum::<u64>();
            let t = r.target_base_offset + (0..k).map(|d| idx[d] * r.target_strides[d]).sum::<u64>();
            out.push((s, t, r.inner_bytes));
            let mut d = k;
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < r.outer_loop_counts[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// The lowering segment by segment (what the executor did before rows).
    fn reference(items: &[Item], max_batch: u64, coalesce: bool) -> Vec<(Vec<TransferBatchRange>, u64)> {
        let (mut out, mut ranges, mut count, mut planned) = (Vec::new(), Vec::<TransferBatchRange>::new(), 0, 0);
        for (r, (so, to), a) in items {
            let mut cur = match ranges.last() {
                Some(last) if coalesce && allocations_of(last) == *a => ranges.pop().unwrap(),
                _ => Batcher::new_range(a),
            };
            for (s, t, n) in segments(r) {
                let (s, t) = (so + s, to + t);
                if coalesce {
                    if let (Some(&ls), Some(&lt), Some(ln)) =
                        (cur.source_offsets.last(), cur.target_offsets.last(), cur.sizes.last_mut())
                    {
                        if ls + *ln == s && lt + *ln == t {
                            *ln += n;
                            planned += 1;
                            continue;
                        }
                    }
                }
                if count == max_batch {
                    if !cur.sizes.is_empty() {
                        ranges.push(std::mem::replace(&mut cur, Batcher::new_range(a)));
                    }
                    out.push((std::mem::take(&mut ranges), std::mem::take(&mut planned)));
                    count = 0;
                }
                cur.source_offsets.push(s);
                cur.target_offsets.push(t);
                cur.sizes.push(n);
                count += 1;
                planned += 1;
            }
            if !cur.sizes.is_empty() {
                ranges.push(cur);
            }
        }
        if !ranges.is_empty() {
            out.push((ranges, planned));
        }
        out
    }

    fn lowered(items: &[Item], max_batch: u64, coalesce: bool) -> Vec<(Vec<TransferBatchRange>, u64)> {
        let limits =
            ExecutorLimits { max_batch_operations: max_batch, coalesce_adjacent: coalesce, ..Default::default() };
        let mut b = Batcher {
            endpoint: "e",
            direction: Direction::Write,
            limits: &limits,
            ranges: Vec::new(),
            count: 0,
            planned: 0,
        };
        let mut out = Vec::new();
        let mut emit = |(batch, planned): Lowered| {
            out.push((batch.unwrap().ranges().to_vec(), planned));
            true
        };
        for (r, offsets, a) in items {
            assert!(b.push_region(r, *offsets, a, &mut emit).unwrap());
        }
        if !b.ranges.is_empty() {
            emit(b.take());
        }
        out
    }

    fn region(base: (u64, u64), inner: u64, counts: &[u64], ss: &[u64], ts: &[u64]) -> TransferRegion {
        TransferRegion {
            source: 0,
            target_part: 0,
            target_fragment: 0,
            overlap_offset: Vec::new(),
            overlap_shape: Vec::new(),
            source_base_offset: base.0,
            target_base_offset: base.1,
            inner_bytes: inner,
            outer_loop_counts: counts.to_vec(),
            source_strides: ss.to_vec(),
            target_strides: ts.to_vec(),
        }
    }

    #[test]
    fn rows_lower_exactly_as_segment_by_segment() {
        const CAP: u64 = 1 << 40;
        let (a, b) = ((0x1000, CAP, 0x9000, CAP), (0x1000, CAP, 0x7_0000, CAP));
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for case in 0..300 {
            let mut items = Vec::new();
            let (mut s_at, mut t_at) = (0u64, 0u64);
            for _ in 0..1 + next(6) {
                let n = 1 + next(8);
                let k = next(4) as usize;
                let counts: Vec<u64> = (0..k).map(|_| 1 + next(4)).collect();
                // Innermost strides: contiguous (rows join), one side contiguous, or gapped.
                let mut stride = |inner: u64| match next(3) {
                    0 => inner,
                    1 => inner + 1 + next(5),
                    _ => inner * (1 + next(3)),
                };
                let (mut ss, mut ts) = (vec![0; k], vec![0; k]);
                let (mut s_unit, mut t_unit) = (n, n);
                for d in (0..k).rev() {
                    ss[d] = stride(s_unit);
                    ts[d] = stride(t_unit);
                    s_unit = ss[d] * counts[d];
                    t_unit = ts[d] * counts[d];
                }
                // The next region starts where this one ended (joins) or further on.
                let r = region((s_at, t_at), n, &counts, &ss, &ts);
                let alloc = if next(5) == 0 { b } else { a };
                let offsets = (next(2) * 64, next(2) * 64);
                s_at += s_unit + next(2);
                t_at += t_unit + next(2);
                items.push((r, offsets, alloc));
            }
            for max_batch in [1, 2, 3, 5, 8, 1024] {
                for coalesce in [false, true] {
                    assert_eq!(
                        lowered(&items, max_batch, coalesce),
                        reference(&items, max_batch, coalesce),
                        "case {case}, batches of {max_batch}, coalesce {coalesce}: {items:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn for_each_segment_walks_rows_in_row_major_order() {
        let r = region((5, 7), 3, &[2, 3, 4], &[100, 20, 4], &[60, 16, 3]);
        let mut seen = Vec::new();
        r.for_each_segment(24, |s, t, n| seen.push((s, t, n))).unwrap();
        assert_eq!(seen, segments(&r));
        assert_eq!(seen.len(), 24);
        assert!(r.for_each_segment(23, |_, _, _| {}).is_err());
        let one = region((9, 11), 4, &[], &[], &[]);
        assert_eq!(one.row(), (1, 0, 0));
        let mut seen = Vec::new();
        one.for_each_segment(1, |s, t, n| seen.push((s, t, n))).unwrap();
        assert_eq!(seen, vec![(9, 11, 4)]);
    }
}
