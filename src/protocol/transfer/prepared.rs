//! Prepared live transfers: plan, bind, validate, register and lower once, then move
//! a new weight generation through the same buffers at every step (the weight sync
//! of reinforcement learning: after each optimizer step the trainer's new weights go
//! to the inference servers, the same plan every time).
//!
//! [`Sink::prepare`](super::Sink::prepare) and
//! [`Loader::prepare_live`](super::Loader::prepare_live) run every check of one
//! [`Sink::execute`](super::Sink::execute) / [`Loader::load_live`](super::Loader::load_live)
//! under the guards' pins (`live-transfer.md` §5 / §10: manifest pairs, executor
//! snapshots, per-operation freshness, registration evidence, bounds, limits),
//! lower the local operations into engine batches, register the own local
//! allocations, and keep all of it. A [`PreparedTransfer::step`] then takes only the
//! weight generation it moves (and any rotated lease) and costs, before its bytes,
//! time in proportion to the number of bindings it pins, not to their fragments:
//!
//! * the engine is the one the transfer was prepared on (its identity is unchanged:
//!   an engine restart is refused), and it has no pending transfer or concurrent
//!   submission (§8.2);
//! * each rotated lease names a prepared binding (a participant that now runs as
//!   another instance is refused);
//! * every prepared binding is pinned again through its guard
//!   ([`GuardProvider::acquire_step`](crate::protocol::guards::GuardProvider::acquire_step)):
//!   a guard that vouches for the binding answers in O(1); a binding it observes
//!   instead is checked as every fresh binding is (`acquire_pin`), so another
//!   placement, a new instance, another lease or generation, moved or freed buffers
//!   are refused before any byte moves;
//! * the prepared batches run (cancellation and progress as for a call), the pins
//!   are released with the call's terminal state, and the report carries the
//!   step's generation.
//!
//! Nothing re-digests a binding, serializes JSON or allocates per fragment. Every
//! refusal of stale prepared state is a [`TransferError`] whose message ends with
//! `prepare the transfer again`; nothing is ever executed against stale addresses.
//!
//! The prepared state (bindings, batches) stays valid only as long as the buffers
//! stay where they were prepared: a framework that moves, frees or re-registers
//! them must make its guard report it (or bump its lease and generation, which the
//! guard then observes) and prepare again.

use super::completion::{cleanup_error, quarantine_cleanup};
use super::completion::{execute_batch, reserve, retain_unknown, unregister_all, BatchOutcome, Handoff};
use super::error::{TransferError, TransferErrorKind, TransferResult};
use super::executor::{Call, TransferReceipt};
use super::executor::{ExecutionStats, GuardRelease, Hooks, PinSpec, Pins, PrepareOut, PreparedEndpoint};
use super::loader::{local_executors, Front, LiveArgs, LiveError, LiveReport, Loader, Sink, TargetReport};
use super::notify::{step_key, NotifyKind, StepNotifier};
use super::outcome::{call_outcomes, predicted_receipts, CallRecord, TargetOutcome, TransferMode};
use crate::engine::Direction;
use crate::error::{Error, ErrorKind};
use crate::model::Placement;
use crate::plan::transfer_bind::{Side, TransferPlan};
use crate::protocol::guards::{acquire_step_pin, StepTransfer, TerminalState};
use crate::protocol::progress::{ProgressFn, ProgressPhase, Reporter};
use crate::runtime::RuntimeBinding;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

/// The suffix of every refusal of stale prepared state.
const PREPARE_AGAIN: &str = "prepare the transfer again";

/// A runtime lease of one prepared binding that rotated since the preparation (or
/// the last rotation): its owner moved the binding's lease fence on (`lease_id`,
/// `generation`) while its buffers stayed where they were prepared. Passing one
/// asserts, for the owner, that its own engine registration (when pre-registered)
/// follows the new lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRotation<'a> {
    /// The binding's instance (as prepared).
    pub instance_id: &'a str,
    /// The binding's participant.
    pub participant_id: &'a str,
    /// The new lease id (non-empty).
    pub lease_id: &'a str,
    /// The new lease generation.
    pub lease_generation: u64,
}

/// What a prepared transfer holds, live ([`PreparedTransfer::info`]) or stored
/// ([`PreparedRestore::info`](super::PreparedRestore::info)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreparedInfo {
    /// A step has nothing to do (an unplanned participant, no local operations, no
    /// bytes).
    pub empty: bool,
    /// Engine batches one step submits (none for a restore).
    pub batches: u64,
    /// Bindings one step pins.
    pub pinned_bindings: u64,
    /// Bytes one step moves.
    pub bytes: u64,
}

/// The arguments of one [`PreparedTransfer::step`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StepArgs<'a> {
    /// The weight generation this step moves: the generation its report's targets
    /// are updated to.
    pub weight_generation: u64,
    /// Leases rotated since the previous step; each holds for the later steps too.
    pub leases: &'a [LeaseRotation<'a>],
    /// Transfer id handed to the guards (default: 32 random hex); also the id of
    /// the step's notifications.
    pub transfer_id: Option<&'a str>,
    /// A sink's step tells each target what landed (the notify hook of
    /// [`super::notify`], as [`Sink::execute_notified`] does for a call), with the
    /// step's weight generation; `None`: no notification.
    pub notify: Option<StepNotify<'a>>,
}

/// How a prepared sink's step notifies its targets ([`StepArgs::notify`]): after the
/// step's freshness checks and pins, `begin` to every endpoint of every target
/// participant the executor writes; the prepared batches; then, when they all
/// completed, `done` to the same endpoints. A failed `begin` fails the step before
/// any byte moves; a failed `done` fails it after its bytes landed (the targets stay
/// Torn until a later step completes).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepNotify<'a> {
    /// `None` (unkeyed: each message carries a SHA-256 of its body) or the key shared
    /// with the targets' acceptors (at least 16 bytes).
    pub key: Option<&'a [u8]>,
    /// Content-verified: the step first computes the CRC-32C of the bytes it sends
    /// into each target from its source memory (host memory only: a device source
    /// fragment refuses the step, `Unsupported`, before anything moves) and the
    /// `done` carries them, so a verifying acceptor
    /// ([`NotifyAcceptor::verify_content`](super::NotifyAcceptor::verify_content))
    /// checks the target bytes before it reports Updated.
    pub verify_content: bool,
}

/// What a prepared transfer keeps that never changes (a pending transfer keeps it
/// alive while DMA may still run).
struct Prepared {
    plan: TransferPlan,
    /// The local executor's worker (`None`: the call has nothing to do).
    worker: Option<String>,
    endpoints: Vec<PreparedEndpoint>,
    regions: u64,
    /// The target participants a step writes (sorted) and the executor key named
    /// when its share is torn.
    targets: Vec<String>,
    executor_key: (String, String),
    /// The receipts a complete step returns (sorted by endpoint).
    predicted: Vec<TransferReceipt>,
    /// The messages of notified steps (made by the first one).
    notifier: OnceLock<StepNotifier>,
}

/// What a step may change.
struct State {
    /// The bindings pinned at every step (rotated leases applied).
    pins: Vec<PinSpec>,
    /// The allocations the preparation registered (`None` once they were handed to
    /// a pending transfer or unregistered).
    registered: Option<Vec<u64>>,
    /// The pending transfer that took the registrations over.
    handed_to: Option<String>,
    closed: bool,
}

/// A live transfer prepared once for many steps ([`Sink::prepare`](super::Sink::prepare),
/// [`Loader::prepare_live`](super::Loader::prepare_live)). Each
/// [`Self::step`] moves one weight generation through the prepared batches after the
/// freshness checks described in the module documentation.
///
/// Steps go through the loader's or sink's cancellation token, progress callback,
/// statistics and last report. Dropping (or [`Self::close`]) unregisters the
/// allocations the preparation registered.
///
/// Thread safety: `Send + Sync`; steps of one prepared transfer run one at a time
/// (a concurrent one waits), and steps on one engine are serialized by its fence.
pub struct PreparedTransfer {
    front: Arc<Front>,
    mode: TransferMode,
    /// The engine identity at preparation.
    identity: u64,
    prepared: Arc<Prepared>,
    state: Mutex<State>,
}

impl std::fmt::Debug for PreparedTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTransfer")
            .field("mode", &self.mode)
            .field("identity", &self.identity)
            .field("worker", &self.prepared.worker)
            .field("regions", &self.prepared.regions)
            .field("batches", &self.batch_count())
            .finish_non_exhaustive()
    }
}

fn stale(message: impl std::fmt::Display) -> TransferError {
    TransferError::stale(format!("prepared transfer is stale: {message}; {PREPARE_AGAIN}"))
}

impl PreparedTransfer {
    /// Prepares one call of either side ([`super::Sink::prepare`],
    /// [`super::Loader::prepare_live`]).
    ///
    /// # Safety
    /// As [`super::Sink::prepare`] for the call's sides.
    unsafe fn prepare(front: Arc<Front>, call: &Call<'_>, args: &LiveArgs<'_>) -> TransferResult<PreparedTransfer> {
        let guards = Front::guards(args);
        let mut out = PrepareOut::default();
        // SAFETY: forwarded contract (this function's `# Safety`).
        unsafe { front.exec.call(call, &Front::execute_args(args, &guards), Some(&mut out)) }?;
        let mode = if call.local_side == Side::Source { TransferMode::Sink } else { TransferMode::Reader };
        Ok(Self::new(front, mode, call.plan, call.local, args.worker_id, out))
    }

    fn new(
        front: Arc<Front>,
        mode: TransferMode,
        plan: &TransferPlan,
        local: &RuntimeBinding,
        worker: Option<&str>,
        out: PrepareOut,
    ) -> PreparedTransfer {
        let side = if mode == TransferMode::Sink { Side::Source } else { Side::Target };
        // The call's executor and the targets it writes, as `Front::finish` finds them.
        let mine = local_executors(plan, side, local, worker);
        let (targets, executor_key, predicted) = match (mine.as_slice(), &out.worker) {
            ([e], Some(_)) => {
                let predicted = predicted_receipts(plan, e);
                let record = CallRecord {
                    plan: plan.clone(),
                    participant_id: e.participant_id.clone(),
                    worker_id: e.worker_id.clone(),
                    result: Ok(predicted.clone()),
                };
                let targets = call_outcomes(plan, mode, e, &record).into_keys().collect();
                (targets, (e.participant_id.clone(), e.worker_id.clone()), predicted)
            }
            _ => (Vec::new(), Default::default(), Vec::new()),
        };
        let identity = front.exec.identity;
        PreparedTransfer {
            front,
            mode,
            identity,
            prepared: Arc::new(Prepared {
                plan: plan.clone(),
                worker: out.worker,
                endpoints: out.endpoints,
                regions: out.regions,
                targets,
                executor_key,
                predicted,
                notifier: OnceLock::new(),
            }),
            state: Mutex::new(State {
                pins: out.pins,
                registered: Some(out.registered),
                handed_to: None,
                closed: false,
            }),
        }
    }

    /// Sink or reader.
    pub fn mode(&self) -> TransferMode {
        self.mode
    }
    /// The bound plan it was prepared from.
    pub fn plan(&self) -> &TransferPlan {
        &self.prepared.plan
    }
    /// The engine identity it was prepared on.
    pub fn engine_identity(&self) -> u64 {
        self.identity
    }
    /// True when a step has nothing to do (an unplanned participant, or no local
    /// operations).
    pub fn is_empty(&self) -> bool {
        self.prepared.worker.is_none()
    }
    /// Engine batches one step submits.
    pub fn batch_count(&self) -> usize {
        self.prepared.endpoints.iter().map(|e| e.batches.len()).sum()
    }
    /// Bindings one step pins.
    pub fn pinned_bindings(&self) -> usize {
        self.state.lock().pins.len()
    }
    /// Bytes one step moves.
    pub fn total_bytes(&self) -> u64 {
        self.prepared.endpoints.iter().map(|e| e.nbytes).sum()
    }
    /// [`Self::is_empty`], [`Self::batch_count`], [`Self::pinned_bindings`] and
    /// [`Self::total_bytes`] at once.
    pub fn info(&self) -> PreparedInfo {
        PreparedInfo {
            empty: self.is_empty(),
            batches: self.batch_count() as u64,
            pinned_bindings: self.pinned_bindings() as u64,
            bytes: self.total_bytes(),
        }
    }

    /// Moves one weight generation through the prepared transfer (see the module
    /// documentation for what it checks) and returns its report: the receipts, the
    /// statistics, and the verdict of each target participant it writes for
    /// `args.weight_generation`.
    ///
    /// Errors (each with the step's report): `prepared transfer is stale: ...;
    /// prepare the transfer again` ([`ErrorKind::StaleBinding`]: the engine
    /// restarted, a participant runs as another instance, the registrations were
    /// handed to a pending transfer, or a guard observed a binding that differs from
    /// the prepared one: placement, instance, lease, generation, fragments or
    /// addresses), `lease rotation names no binding of the prepared transfer: (<instance>,
    /// <participant>)` (contract), `prepared transfer is closed`, and every error of
    /// a call's engine phase (reservation, cancellation, completion failed or
    /// unknown, ...).
    ///
    /// # Safety
    /// Every buffer of the prepared bindings, local and remote, is valid at the
    /// addresses it was prepared with for the step (and, when completion is unknown,
    /// until the pending transfer is drained), and the guards pin it.
    pub unsafe fn step(&self, args: &StepArgs<'_>) -> std::result::Result<LiveReport, LiveError> {
        let exec_stats = ExecutionStats::default();
        let progress = self.front.progress.lock().clone();
        let hooks = Hooks {
            cancel: Some(&self.front.cancel.0),
            progress: progress.as_deref().map(|p| p as ProgressFn<'_>),
            stats: Some(&exec_stats),
        };
        let result = self.run_step(args, hooks);
        self.finish(args.weight_generation, &exec_stats, result)
    }

    fn run_step(&self, args: &StepArgs<'_>, hooks: Hooks<'_>) -> TransferResult<Vec<TransferReceipt>> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(TransferError::engine("prepared transfer is closed"));
        }
        if let Some(id) = &st.handed_to {
            return Err(stale(format!("its registrations are held by pending transfer {id} (drain it on the engine)")));
        }
        let exec = &self.front.exec;
        match exec.engine.identity() {
            Ok(id) if id == self.identity => {}
            Ok(_) => return Err(stale("the transfer engine restarted since the transfer was prepared")),
            Err(e) => return Err(TransferError::engine(format!("failed to resolve canonical engine identity: {e}"))),
        }
        let key =
            match &args.notify {
                Some(_) if self.mode == TransferMode::Reader => return Err(TransferError::contract(Error::invalid(
                    "a reader's step notifies no one (its report is its target's outcome); notify is for sink steps",
                ))),
                Some(n) => step_key(n.key)?,
                None => None,
            };
        let rotated = if args.leases.is_empty() { None } else { Some(self.rotate(&st.pins, args.leases)?) };
        if self.prepared.worker.is_none() {
            if let Some(p) = rotated {
                st.pins = p;
            }
            return Ok(Vec::new());
        }
        let reservation = reserve(self.identity)?;
        let transfer = match args.transfer_id {
            Some(id) => StepTransfer::new(id),
            None => StepTransfer::new(&uuid::Uuid::new_v4().simple().to_string()),
        };
        let specs = rotated.as_ref().unwrap_or(&st.pins);
        let mut pins = Pins { tokens: Vec::with_capacity(specs.len()), stats: hooks.stats };
        for spec in specs {
            match acquire_step_pin(&*spec.provider, spec.side.as_str(), &transfer, &spec.pin) {
                Ok(token) => pins.tokens.push(token),
                Err(e) => return pins.abort(pin_error(spec, e)),
            }
        }
        if let Some(p) = rotated {
            st.pins = p;
        }
        let Some(notify) = &args.notify else {
            let out = self.run_batches(&mut st, pins, hooks);
            drop(reservation);
            return out;
        };
        let notifier = match self.notifier() {
            Ok(n) => n,
            Err(e) => return pins.abort(e),
        };
        let key = key.as_deref();
        let transfer = transfer.id().to_string();
        let g = args.weight_generation;
        let mut delivered = Vec::new();
        let content = if notify.verify_content {
            // SAFETY: `step`'s contract: the prepared source buffers are valid and
            // pinned for the step.
            match unsafe { notifier.source_checksums(&self.prepared.plan) } {
                Ok(c) => Some(c),
                Err(e) => return pins.abort(e),
            }
        } else {
            None
        };
        if let Err(e) = notifier.send(exec, key, NotifyKind::Begin, g, &transfer, None, &mut delivered) {
            return pins.abort(e);
        }
        let out = self.run_batches(&mut st, pins, hooks);
        drop(reservation);
        let receipts = out?;
        notifier.send(exec, key, NotifyKind::Done, g, &transfer, content.as_ref(), &mut delivered).map_err(
            |mut e| {
                e.submitted = true;
                e.message = format!("the step completed but {}", e.message);
                e
            },
        )?;
        Ok(receipts)
    }

    /// The notify side of this (sink) transfer's steps, made once.
    fn notifier(&self) -> TransferResult<&StepNotifier> {
        let p = &*self.prepared;
        if let Some(n) = p.notifier.get() {
            return Ok(n);
        }
        let (participant, worker) = &p.executor_key;
        let Some(e) =
            p.plan.executors(Side::Source).iter().find(|e| e.participant_id == *participant && e.worker_id == *worker)
        else {
            return Err(TransferError::engine("a notified step needs the sink's executor in the plan"));
        };
        Ok(p.notifier.get_or_init(|| StepNotifier::new(&p.plan, e)))
    }

    /// The plan identity of this transfer's notifications (SHA-256 of the bound
    /// plan's JSON, computed once): what the targets' acceptors are keyed by.
    pub fn plan_identity(&self) -> String {
        if let (Some(_), TransferMode::Sink) = (&self.prepared.worker, self.mode) {
            if let Ok(n) = self.notifier() {
                return n.identity().to_string();
            }
        }
        super::notify::plan_identity(&self.prepared.plan)
    }

    /// The pins with `leases` applied (persisted by the caller once the step's pins
    /// hold).
    fn rotate(&self, pins: &[PinSpec], leases: &[LeaseRotation<'_>]) -> TransferResult<Vec<PinSpec>> {
        let mut out = pins.to_vec();
        for r in leases {
            let found = out
                .iter_mut()
                .filter(|s| s.pin.binding().instance_id() == r.instance_id)
                .find(|s| s.pin.binding().participant_id() == r.participant_id);
            match found {
                Some(s) => s.pin = s.pin.with_lease(r.lease_id, r.lease_generation).map_err(TransferError::contract)?,
                None => {
                    if let Some(s) = out.iter().find(|s| s.pin.binding().participant_id() == r.participant_id) {
                        return Err(stale(format!(
                            "participant {} now runs as instance {} (prepared for instance {})",
                            r.participant_id,
                            r.instance_id,
                            s.pin.binding().instance_id()
                        )));
                    }
                    return Err(TransferError::contract(Error::invalid(format!(
                        "lease rotation names no binding of the prepared transfer: ({}, {})",
                        r.instance_id, r.participant_id
                    ))));
                }
            }
        }
        Ok(out)
    }

    /// Runs the prepared batches under the step's pins and ends the step: releases
    /// the pins with its terminal state, or hands them and the registrations to a
    /// pending transfer when completion is unknown.
    fn run_batches(
        &self,
        st: &mut State,
        mut pins: Pins<'_>,
        hooks: Hooks<'_>,
    ) -> TransferResult<Vec<TransferReceipt>> {
        let exec = &self.front.exec;
        let p = &*self.prepared;
        let direction = if self.mode == TransferMode::Sink { Direction::Write } else { Direction::Read };
        let worker = p.worker.as_deref().unwrap_or_default();
        let total = p.endpoints.iter().map(|e| e.nbytes).sum();
        let total_ops = p.endpoints.iter().map(|e| e.operation_count).sum();
        let mut progress = Reporter::start(hooks.progress, ProgressPhase::Transfer, total, total_ops);
        let (attempts, timeout) = (exec.limits.max_completion_drain_attempts, exec.limits.completion_drain_timeout_ms);
        let mut submitted = false;
        let mut receipts = Vec::with_capacity(p.endpoints.len());
        let mut stop: Option<BatchOutcome> = None;
        let mut cancelled = false;
        'endpoints: for ep in &p.endpoints {
            let (mut operation_count, mut nbytes) = (0u64, 0u64);
            for (batch, planned) in &ep.batches {
                if hooks.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
                    cancelled = true;
                    break 'endpoints;
                }
                submitted = true;
                if let Some(s) = hooks.stats {
                    s.submitted.store(true, Ordering::Release);
                }
                match execute_batch(&*exec.engine, batch, attempts, timeout) {
                    BatchOutcome::Completed => {
                        operation_count += planned;
                        nbytes += batch.nbytes();
                        if let Some(s) = hooks.stats {
                            s.planned_segments.fetch_add(*planned, Ordering::Relaxed);
                            s.engine_operations.fetch_add(batch.operation_count(), Ordering::Relaxed);
                            s.engine_batches.fetch_add(1, Ordering::Relaxed);
                        }
                        progress.advance(batch.nbytes(), *planned);
                    }
                    other => {
                        stop = Some(other);
                        break 'endpoints;
                    }
                }
            }
            receipts.push(TransferReceipt {
                direction,
                worker_id: worker.to_string(),
                endpoint: ep.endpoint.clone(),
                operation_count,
                nbytes,
            });
        }
        let body = match stop {
            None if cancelled => Err(TransferError::engine("transfer was cancelled before a batch was submitted")),
            None => {
                progress.finish();
                Ok(receipts)
            }
            Some(BatchOutcome::Failed(msg)) => Err(TransferError::new(TransferErrorKind::CompletionFailed, msg)),
            Some(BatchOutcome::Unknown { ticket, restart_required, interrupted }) => {
                // DMA may still run: the registrations and the pins go to a pending
                // transfer, and this prepared transfer cannot step again.
                pins.record(GuardRelease::Pending);
                let resources: Vec<Box<dyn Any + Send>> = vec![Box::new(self.prepared.clone())];
                let registrations = st.registered.take().unwrap_or_default();
                let handoff = Handoff { registrations, tokens: std::mem::take(&mut pins.tokens), resources };
                let e = retain_unknown(self.identity, &exec.engine, ticket, restart_required, interrupted, handoff);
                st.handed_to = e.pending_transfer_id.clone();
                return Err(e);
            }
            Some(BatchOutcome::Completed) => unreachable!("a completed batch does not stop the step"),
        };
        let state = match &body {
            Ok(_) => TerminalState::Completed,
            Err(e) if e.kind == TransferErrorKind::CompletionFailed || submitted => TerminalState::FailedDrained,
            Err(_) => TerminalState::Aborted,
        };
        let release = pins.release(state);
        match (body, release) {
            (Ok(r), None) => Ok(r),
            (Ok(_), Some(m)) => {
                let mut e = TransferError::engine(format!("allocation lifetime release failed: {m}"));
                e.submitted = submitted;
                Err(e)
            }
            (Err(mut e), _) => {
                e.submitted = submitted;
                Err(e)
            }
        }
    }

    /// The step's report (recorded as the loader's or sink's last one).
    fn finish(
        &self,
        generation: u64,
        exec_stats: &ExecutionStats,
        result: TransferResult<Vec<TransferReceipt>>,
    ) -> std::result::Result<LiveReport, LiveError> {
        let p = &*self.prepared;
        let submitted = exec_stats.submitted.load(Ordering::Acquire) || result.as_ref().is_err_and(|e| e.submitted);
        let verdict = match &result {
            Ok(r) if *r == p.predicted => TargetOutcome::Updated { weight_generation: generation },
            Err(e) if !e.submitted => TargetOutcome::Unchanged,
            _ => TargetOutcome::Torn { incomplete: vec![p.executor_key.clone()] },
        };
        let report = LiveReport {
            submitted,
            guard_release: exec_stats.guard_release(),
            pending_transfer_id: result.as_ref().err().and_then(|e| e.pending_transfer_id.clone()),
            targets: p
                .targets
                .iter()
                .map(|t| TargetReport {
                    participant_id: t.clone(),
                    weight_generation: generation,
                    outcome: verdict.clone(),
                })
                .collect(),
            ..LiveReport::default()
        };
        self.front.conclude(report, result, p.regions, exec_stats)
    }

    /// Unregisters the allocations the preparation registered (unless a pending
    /// transfer took them over, or the engine restarted and they went with it) and
    /// refuses later steps. Idempotent; also run on drop (which ignores its result).
    ///
    /// Errors: `<side> unregister_memory failed: <failures>; registration cleanup is
    /// quarantined as <id>` (the failed addresses stay with a pending transfer that
    /// blocks the engine until it is drained).
    pub fn close(&self) -> TransferResult<()> {
        let mut st = self.state.lock();
        st.closed = true;
        let Some(registered) = st.registered.take() else { return Ok(()) };
        if registered.is_empty() {
            return Ok(());
        }
        let exec = &self.front.exec;
        if exec.engine.identity().ok() != Some(self.identity) {
            return Ok(());
        }
        let (failed, failures) = unregister_all(&*exec.engine, &registered);
        if failed.is_empty() {
            return Ok(());
        }
        let handoff = Handoff { registrations: Vec::new(), tokens: Vec::new(), resources: Vec::new() };
        let id = quarantine_cleanup(self.identity, &exec.engine, failed, TerminalState::Completed, handoff);
        let label = if self.mode == TransferMode::Sink { "source" } else { "target" };
        Err(cleanup_error(label, &failures, id, self.identity))
    }
}

impl Drop for PreparedTransfer {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// A step pin that failed: stale observations say so and ask for a new
/// preparation; other guard failures keep their class (contract, as for a call).
fn pin_error(spec: &PinSpec, e: Error) -> TransferError {
    let b = spec.pin.binding();
    let what = format!(
        "the {} allocation guard of participant {} (instance {}): {}",
        spec.side.as_str(),
        b.participant_id(),
        b.instance_id(),
        e.message()
    );
    if e.kind() == ErrorKind::StaleBinding {
        stale(what)
    } else {
        TransferError::contract(Error::new(e.kind(), what))
    }
}

impl Loader {
    /// Prepares [`Loader::load_live`] with these arguments for many steps
    /// ([`PreparedTransfer`]): runs every check of the call under the guards' pins,
    /// lowers the local target executor's operations into engine batches and, unless
    /// `args.local_pre_registered`, registers the local target allocations until the
    /// prepared transfer is closed. Each [`PreparedTransfer::step`] then pulls one
    /// weight generation. Errors: those of [`Loader::load_live`] before its first
    /// batch (nothing is submitted).
    ///
    /// # Safety
    /// As [`Loader::load_live`] for the preparation itself; in addition the local
    /// target allocations stay valid until the prepared transfer is closed or dropped
    /// (they are registered with the engine until then).
    pub unsafe fn prepare_live(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_bindings: &[RuntimeBinding],
        target_placement: &Placement,
        target_binding: &RuntimeBinding,
        args: &LiveArgs<'_>,
    ) -> TransferResult<PreparedTransfer> {
        let call = Call::reader(plan, source_placement, source_bindings, target_placement, target_binding);
        // SAFETY: forwarded contract (this function's `# Safety`).
        unsafe { PreparedTransfer::prepare(self.front.clone(), &call, args) }
    }
}

impl Sink {
    /// Prepares [`Sink::execute`] with these arguments for many steps
    /// ([`PreparedTransfer`]): runs every check of the call under the guards' pins,
    /// lowers the local source executor's operations into engine batches and, unless
    /// `args.local_pre_registered`, registers the local source allocations until the
    /// prepared transfer is closed. Each [`PreparedTransfer::step`] then pushes one
    /// weight generation. A source participant the plan does not read from prepares
    /// a transfer whose steps do nothing. Errors: those of [`Sink::execute`] before
    /// its first batch (nothing is submitted).
    ///
    /// # Safety
    /// As [`Sink::execute`] for the preparation itself; in addition the local source
    /// allocations stay valid until the prepared transfer is closed or dropped (they
    /// are registered with the engine until then).
    pub unsafe fn prepare(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_binding: &RuntimeBinding,
        target_placement: &Placement,
        target_bindings: &[RuntimeBinding],
        args: &LiveArgs<'_>,
    ) -> TransferResult<PreparedTransfer> {
        let call = Call::sink(plan, source_placement, source_binding, target_placement, target_bindings);
        // SAFETY: forwarded contract (this function's `# Safety`).
        unsafe { PreparedTransfer::prepare(self.front.clone(), &call, args) }
    }
}
