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

use super::completion::{cleanup_error, quarantine_cleanup, run_synchronous, submit_batch, Submission};
use super::completion::{engine_busy, execute_batch, judge_ticket, reserve, Reservation};
use super::completion::{retain_unknown, unregister_all, BatchOutcome, Handoff};
use super::delta::{DeltaBatch, DeltaInbox, DeltaReport, DeltaSource, StepDelta, TargetHeld};
use super::delta_pull::{DeltaPull, PullStep, SourceOutbox};
use super::error::{TransferError, TransferErrorKind, TransferResult};
use super::executor::{Call, TransferExecutor, TransferReceipt};
use super::executor::{ExecutionStats, GuardRelease, PinSpec, Pins, PrepareOut, PreparedEndpoint};
use super::loader::TargetReport;
use super::loader::{local_executors, Front, LiveArgs, LiveError, LiveReport, Loader, ProgressCallback, Sink};
use super::notify::{step_key, NotifyDelivery, NotifyDelta, NotifyKind, StepNotifier};
use super::outcome::{call_outcomes, predicted_receipts, CallRecord, TargetOutcome, TransferMode};
use super::step_handle::{Advance, StepCallback, StepDriven, StepHandle};
use crate::engine::{Direction, TransferBatch, TransferTicket};
use crate::error::{Error, ErrorKind};
use crate::model::Placement;
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::protocol::guards::{acquire_step_pin, LifetimeToken, StepTransfer, TerminalState};
use crate::protocol::progress::{ProgressPhase, Reporter};
use crate::runtime::RuntimeBinding;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
    /// A delta step ([`super::delta`]; a prepared sink after
    /// [`PreparedTransfer::enable_delta`], notified and content-verified): what each
    /// target participant verifiably holds, as its acceptor reports
    /// ([`NotifyAcceptor::held_generation`](super::NotifyAcceptor::held_generation)).
    /// A target is sent the elements that changed when it holds the generation of
    /// the source's base, else every byte. `None`: every byte.
    pub delta: Option<&'a [TargetHeld<'a>]>,
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
    /// Write (a sink's pushes) or read (a reader's pulls).
    direction: Direction,
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
/// (a concurrent [`Self::step`] or [`Self::close`] waits, a concurrent
/// [`Self::start_step`] is refused), and steps on one engine are serialized by its
/// fence.
pub struct PreparedTransfer {
    front: Arc<Front>,
    mode: TransferMode,
    /// The engine identity at preparation.
    identity: u64,
    prepared: Arc<Prepared>,
    state: Mutex<State>,
    /// Admits one step (or the close) at a time.
    gate: Gate,
    /// The source side of delta steps ([`Self::enable_delta`]).
    delta: Mutex<Option<DeltaSource>>,
    /// The reader side of pulled delta steps ([`Self::enable_delta_pull`]).
    pull: Mutex<Option<DeltaPull>>,
    /// What the last delta step sent each target.
    last_delta: Mutex<Option<DeltaReport>>,
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
                direction: if mode == TransferMode::Sink { Direction::Write } else { Direction::Read },
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
            gate: Gate::default(),
            delta: Mutex::new(None),
            pull: Mutex::new(None),
            last_delta: Mutex::new(None),
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
    /// `args.weight_generation`. Runs on the calling thread (its progress callback
    /// too); [`Self::start_step`] is the same step without blocking.
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
    /// Thread safety: a step started while another step of this prepared transfer
    /// runs (blocking or started) waits for it to end.
    ///
    /// # Safety
    /// Every buffer of the prepared bindings, local and remote, is valid at the
    /// addresses it was prepared with for the step (and, when completion is unknown,
    /// until the pending transfer is drained), and the guards pin it.
    pub unsafe fn step(&self, args: &StepArgs<'_>) -> std::result::Result<LiveReport, LiveError> {
        let _pass = self.gate.enter();
        let stats = ExecutionStats::default();
        let cancel = &self.front.cancel.0;
        let result = match self.begin(args, &stats) {
            Ok(Some(mut flight)) => {
                let cancelled = || cancel.load(Ordering::Acquire);
                flight.cursor.advance(&self.prepared, &self.front.exec, &stats, &cancelled, Drive::Block);
                self.end(flight, &stats)
            }
            Ok(None) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        self.finish(args.weight_generation, &stats, result)
    }

    /// Starts [`Self::step`] without blocking: returns at once a [`StepHandle`] that
    /// can be polled, waited on with a timeout and cancelled, and runs `on_complete`
    /// (if any) when the step ends. The step's checks, pins, notifications and
    /// batches run on the library's step driver, one thread shared by every started
    /// step, which follows each batch through the engine's own completion (its
    /// ticket's status) without blocking on it; an engine without ticketed calls
    /// runs each batch on a thread of its own. The step's progress callback and
    /// `on_complete` run on the driver thread: they must be quick and must not wait
    /// for another started step.
    ///
    /// The outcome is exactly [`Self::step`]'s (report, errors), except that a
    /// started step waits (without holding anything) while another submission is
    /// active on the engine, where a blocking step is refused: started steps of
    /// several prepared transfers on one engine run one after another. A step started
    /// while another step of this prepared transfer runs ends at once with a
    /// contract error (`a step of this prepared transfer is running`); two steps of
    /// one prepared transfer never overlap. The handle keeps this prepared transfer
    /// alive until the step ended. Cancellation ([`StepHandle::cancel`], or the
    /// loader's or sink's token) takes effect before the next batch is submitted.
    ///
    /// # Safety
    /// As [`Self::step`], until the step ended (the handle is finished): the
    /// buffers stay valid and pinned while it runs, whether or not the handle is
    /// still held.
    pub unsafe fn start_step(self: &Arc<Self>, args: &StepArgs<'_>, on_complete: Option<StepCallback>) -> StepHandle {
        let owned = OwnedStepArgs::new(args);
        if !self.gate.try_enter() {
            let error = TransferError::contract(Error::invalid(
                "a step of this prepared transfer is running (two steps of one prepared transfer never overlap)",
            ));
            let result = self.finish(owned.weight_generation, &ExecutionStats::default(), Err(error));
            return StepHandle::finished(result, on_complete);
        }
        let work = StepWork {
            prepared: Some(self.clone()),
            args: owned,
            stats: ExecutionStats::default(),
            flight: None,
            started: false,
            holds_gate: true,
        };
        StepHandle::start(Box::new(work), on_complete)
    }

    /// Enables delta steps ([`super::delta`]) of this prepared sink: `inboxes` names
    /// the inbox of every target participant it writes. Allocates a base (a copy of
    /// the bytes sent into each target, host memory, as large as what the step moves)
    /// and an outbox per target (its slot of the inbox, registered with the engine
    /// until the close). The first step after it is full. Calling it again replaces
    /// the inboxes and forgets the bases.
    ///
    /// Inboxes of targets it does not write are ignored (one map may serve every
    /// prepared sink of a trainer). Errors (nothing changes): a prepared reader
    /// (`InvalidArgument`: deltas are pushed), a target without an inbox, an inbox
    /// named twice, a slot under 64 bytes (`InvalidArgument`), a target written at several
    /// endpoints or device memory while the engine has no device engine
    /// ([`TransferEngine::device_engine`](crate::engine::TransferEngine::device_engine);
    /// `Unsupported`), an outbox registration refused
    /// (`Store`), a closed transfer. Thread safety: waits for a running step.
    pub fn enable_delta(&self, inboxes: &[(&str, DeltaInbox)]) -> crate::Result<()> {
        if self.mode != TransferMode::Sink {
            return Err(Error::invalid("delta steps are pushed: enable them on a prepared sink"));
        }
        let _pass = self.gate.enter();
        if self.state.lock().closed {
            return Err(Error::invalid("prepared transfer is closed"));
        }
        let engine = &*self.front.exec.engine;
        let Some((e, endpoints)) =
            self.own_executor(Side::Source, "delta steps need the sink's executor in the plan")?
        else {
            return Ok(());
        };
        let new = DeltaSource::new(&self.prepared.plan, e, &endpoints, inboxes, engine, engine.device_engine())?;
        if let Some(mut old) = self.delta.lock().replace(new) {
            old.close(engine);
        }
        Ok(())
    }

    /// The local executor on `side` in the plan and the prepared endpoints, in order
    /// (what delta steps are set up for); `None` when a step has nothing to do.
    /// Errors (`InvalidArgument`): `missing`, when the plan lacks the executor.
    fn own_executor(&self, side: Side, missing: &str) -> crate::Result<Option<(&ExecutorTransferPlan, Vec<String>)>> {
        let p = &*self.prepared;
        if p.worker.is_none() {
            return Ok(None);
        }
        let (participant, worker) = &p.executor_key;
        let Some(e) =
            p.plan.executors(side).iter().find(|e| e.participant_id == *participant && e.worker_id == *worker)
        else {
            return Err(Error::invalid(missing));
        };
        Ok(Some((e, p.endpoints.iter().map(|e| e.endpoint.clone()).collect())))
    }

    /// What the last delta step sent each target (delta or full, bytes moved and
    /// held), `None` before the first. For a delta-enabled reader: its one target,
    /// `base_generation` `Some` when every source sent a delta on that base,
    /// `wire_bytes` the publication headers and the records or bytes it read.
    pub fn last_delta(&self) -> Option<DeltaReport> {
        self.last_delta.lock().clone()
    }

    /// Enables pulled delta steps ([`super::delta_pull`]) of this prepared reader:
    /// `outboxes` names the outbox of every source executor it reads (those of other
    /// executors are ignored, so one list may serve every reader of a server), each
    /// published by a [`super::DeltaPublisher`] on the source side. Allocates a
    /// staging buffer (the reader's slots of those outboxes, host memory, registered
    /// with the engine until the close). From then on every step is content-verified
    /// against the sources' publications of its generation, and pulls only the
    /// changes from the sources whose base the reader holds
    /// ([`Self::held_generation`]); the first step is full. Calling it again replaces
    /// the outboxes and forgets what the reader holds.
    ///
    /// Errors (nothing changes): a prepared sink (`InvalidArgument`: sinks push,
    /// [`Self::enable_delta`]), a source executor without an outbox, an outbox named
    /// twice, an outbox under its least capacity
    /// ([`min_outbox_capacity`](super::delta_pull::min_outbox_capacity)) (`InvalidArgument`),
    /// a source executor read at several endpoints or device target memory while the
    /// engine has no device engine (`Unsupported`), a refused registration
    /// (`Store`), a closed transfer. Thread safety: waits for a running step.
    pub fn enable_delta_pull(&self, outboxes: &[SourceOutbox<'_>]) -> crate::Result<()> {
        if self.mode != TransferMode::Reader {
            return Err(Error::invalid("pulled delta steps are for prepared readers (a sink pushes: enable_delta)"));
        }
        let _pass = self.gate.enter();
        let st = self.state.lock();
        if st.closed {
            return Err(Error::invalid("prepared transfer is closed"));
        }
        if st.handed_to.is_some() {
            return Err(Error::invalid("its registrations are held by a pending transfer (drain it on the engine)"));
        }
        drop(st);
        let engine = &*self.front.exec.engine;
        let missing = "pulled delta steps need the reader's executor in the plan";
        let Some((e, endpoints)) = self.own_executor(Side::Target, missing)? else {
            return Ok(());
        };
        let new = DeltaPull::new(&self.prepared.plan, e, &endpoints, outboxes, engine)?;
        if let Some(mut old) = self.pull.lock().replace(new) {
            old.close(engine, false);
        }
        Ok(())
    }

    /// The weight generation a delta-enabled reader's target bytes hold, verified by
    /// content against the sources' publications and untouched by a step since
    /// (`None`: not delta-enabled, before its first verified step, after a failed
    /// or torn one, while a step runs). What decides whether its next step pulls
    /// deltas.
    pub fn held_generation(&self) -> Option<u64> {
        self.pull.lock().as_ref().and_then(DeltaPull::held_generation)
    }

    /// The first part of a step: the freshness checks, the pins and, for a notified
    /// step, the content checksums and `begin`; `None` when the step has nothing to
    /// do.
    fn begin(&self, args: &StepArgs<'_>, stats: &ExecutionStats) -> TransferResult<Option<Flight>> {
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
            return Ok(None);
        }
        let reservation = reserve(self.identity)?;
        let transfer = match args.transfer_id {
            Some(id) => StepTransfer::new(id),
            None => StepTransfer::new(&uuid::Uuid::new_v4().simple().to_string()),
        };
        let specs = rotated.as_ref().unwrap_or(&st.pins);
        let mut pins = Pins { tokens: Vec::with_capacity(specs.len()), stats: Some(stats) };
        for spec in specs {
            match acquire_step_pin(&*spec.provider, spec.side.as_str(), &transfer, &spec.pin) {
                Ok(token) => pins.tokens.push(token),
                Err(e) => return pins.abort(pin_error(spec, e)),
            }
        }
        if let Some(p) = rotated {
            st.pins = p;
        }
        drop(st);
        if args.delta.is_some() && self.mode == TransferMode::Reader {
            return pins.abort(TransferError::contract(Error::invalid(
                "a reader decides its delta steps itself (enable_delta_pull); StepArgs::delta is for sinks",
            )));
        }
        let pulled = match self.pull_begin(args.weight_generation, &mut pins) {
            Ok(p) => p,
            Err(e) => return pins.abort(e),
        };
        let step_delta = match args.delta {
            None => None,
            // SAFETY: `step`'s contract: the prepared source buffers are valid and
            // pinned for the step.
            Some(held) => match unsafe { self.plan_delta(args, held) } {
                Ok(d) => Some(d),
                Err(e) => return pins.abort(e),
            },
        };
        let (over, messages, pull) = match (step_delta, pulled) {
            (Some(d), _) => {
                *self.last_delta.lock() = Some(d.report);
                (Some(d.endpoints), Some(d.messages), None)
            }
            (None, Some((step, over))) => (Some(over), None, Some(step)),
            (None, None) => (None, None, None),
        };
        let notify = match &args.notify {
            None => None,
            Some(n) => match self.notify_begin(n, key, transfer.id(), args.weight_generation, messages) {
                Ok(tail) => Some(tail),
                Err(e) => return pins.abort(e),
            },
        };
        let progress = self.front.progress.lock().clone();
        Ok(Some(Flight {
            tokens: std::mem::take(&mut pins.tokens),
            reservation: Some(reservation),
            notify,
            pull,
            cursor: Cursor::new(&self.prepared, progress, over),
        }))
    }

    /// Hands the pins, the registrations and the memory DMA may still touch to a
    /// pending transfer (completion unknown); this prepared transfer cannot step
    /// again.
    fn hand_off(
        &self,
        pins: &mut Pins<'_>,
        ticket: Option<Box<dyn crate::engine::TransferTicket>>,
        restart_required: bool,
        interrupted: Option<String>,
    ) -> TransferError {
        pins.record(GuardRelease::Pending);
        let mut resources: Vec<Box<dyn Any + Send>> = vec![Box::new(self.prepared.clone())];
        let mut st = self.state.lock();
        let mut registrations = st.registered.take().unwrap_or_default();
        if let Some(p) = self.pull.lock().as_mut() {
            resources.push(Box::new(p.staging()));
            registrations.extend(p.hand_over());
        }
        let handoff = Handoff { registrations, tokens: std::mem::take(&mut pins.tokens), resources };
        let exec = &self.front.exec;
        let e = retain_unknown(self.identity, &exec.engine, ticket, restart_required, interrupted, handoff);
        st.handed_to = e.pending_transfer_id.clone();
        e
    }

    /// A delta-enabled reader's step start (under its pins and the engine's
    /// reservation): reads the sources' publication headers (one blocking batch per
    /// endpoint) and plans the step. `None` when pulled deltas are not enabled.
    fn pull_begin(&self, generation: u64, pins: &mut Pins<'_>) -> TransferResult<Option<(PullStep, StepBatches)>> {
        let mut guard = self.pull.lock();
        let Some(pull) = guard.as_mut() else { return Ok(None) };
        let exec = &self.front.exec;
        let endpoints: Vec<String> = self.prepared.endpoints.iter().map(|e| e.endpoint.clone()).collect();
        let (attempts, timeout) = (exec.limits.max_completion_drain_attempts, exec.limits.completion_drain_timeout_ms);
        for batch in pull.header_batches(&endpoints).map_err(TransferError::contract)? {
            match execute_batch(&*exec.engine, &batch, attempts, timeout) {
                BatchOutcome::Completed => {}
                BatchOutcome::Failed(m) => {
                    return Err(TransferError::engine(format!("reading the sources' delta publications failed: {m}")))
                }
                BatchOutcome::Unknown { ticket, restart_required, interrupted } => {
                    drop(guard);
                    let mut e = self.hand_off(pins, ticket, restart_required, interrupted);
                    e.message = format!("reading the sources' delta publications: {}", e.message);
                    return Err(e);
                }
            }
        }
        let (step, over) = pull.plan_step(generation, &endpoints).map_err(TransferError::contract)?;
        let over = over
            .into_iter()
            .map(|e| {
                e.map(|b| {
                    b.into_iter().map(|(batch, planned, logical)| DeltaBatch { batch, planned, logical }).collect()
                })
            })
            .collect();
        Ok(Some((step, over)))
    }

    /// A delta-enabled reader's step end, its batches completed: applies the deltas
    /// and verifies the content (the report kept as the last delta's).
    fn pull_end(&self, step: &PullStep) -> TransferResult<()> {
        let mut guard = self.pull.lock();
        let Some(pull) = guard.as_mut() else {
            return Err(TransferError::engine("pulled delta steps were disabled during the step"));
        };
        // SAFETY: `step`'s contract: the prepared target buffers are valid and
        // pinned for the step, and only this step writes them.
        match unsafe { pull.finish(&self.prepared.plan, step) } {
            Ok(report) => {
                *self.last_delta.lock() = Some(report);
                Ok(())
            }
            Err(e) => {
                pull.forget();
                let mut e = TransferError::contract(e);
                e.submitted = true;
                Err(e)
            }
        }
    }

    /// Plans a delta step (see [`StepArgs::delta`]).
    ///
    /// # Safety
    /// As [`Self::step`].
    unsafe fn plan_delta(&self, args: &StepArgs<'_>, held: &[TargetHeld<'_>]) -> TransferResult<StepDelta> {
        if !args.notify.is_some_and(|n| n.verify_content) {
            return Err(TransferError::contract(Error::invalid(
                "a delta step must be notified and content-verified (its targets verify what they apply)",
            )));
        }
        let mut d = self.delta.lock();
        let Some(d) = d.as_mut() else {
            return Err(TransferError::contract(Error::invalid(
                "delta steps are not enabled: call enable_delta first",
            )));
        };
        // SAFETY: forwarded contract.
        unsafe { d.plan_step(&self.prepared.plan, held, args.weight_generation) }.map_err(TransferError::contract)
    }

    /// A notified step's checksums (when verified) and `begin`.
    fn notify_begin(
        &self,
        n: &StepNotify<'_>,
        key: Option<Vec<u8>>,
        transfer: &str,
        generation: u64,
        delta: Option<BTreeMap<String, NotifyDelta>>,
    ) -> TransferResult<NotifyTail> {
        let notifier = self.notifier()?;
        let content = if n.verify_content {
            let device = self.front.exec.engine.device_engine();
            // SAFETY: `step`'s contract: the prepared source buffers are valid and
            // pinned for the step.
            Some(unsafe { notifier.source_checksums(&self.prepared.plan, device.as_deref()) }?)
        } else {
            None
        };
        let mut tail =
            NotifyTail { key, transfer: transfer.to_string(), generation, content, delta, delivered: Vec::new() };
        let exec = &self.front.exec;
        let (k, d) = (tail.key.as_deref(), tail.delta.as_ref());
        notifier.send(exec, k, NotifyKind::Begin, generation, transfer, None, d, &mut tail.delivered)?;
        Ok(tail)
    }

    /// The last part of a step, once its batches are over: releases the pins with
    /// the step's terminal state, or hands them and the registrations to a pending
    /// transfer when completion is unknown; then a notified step's `done`.
    fn end(&self, flight: Flight, stats: &ExecutionStats) -> TransferResult<Vec<TransferReceipt>> {
        let Flight { tokens, reservation, notify, pull, cursor } = flight;
        let mut pins = Pins { tokens, stats: Some(stats) };
        let exec = &self.front.exec;
        let submitted = cursor.submitted;
        let body = match cursor.stop {
            None if cursor.cancelled => {
                Err(TransferError::engine("transfer was cancelled before a batch was submitted"))
            }
            None => Ok(cursor.receipts),
            Some(BatchOutcome::Failed(msg)) => Err(TransferError::new(TransferErrorKind::CompletionFailed, msg)),
            Some(BatchOutcome::Unknown { ticket, restart_required, interrupted }) => {
                return Err(self.hand_off(&mut pins, ticket, restart_required, interrupted));
            }
            Some(BatchOutcome::Completed) => unreachable!("a completed batch does not stop the step"),
        };
        let state = match &body {
            Ok(_) => TerminalState::Completed,
            Err(e) if e.kind == TransferErrorKind::CompletionFailed || submitted => TerminalState::FailedDrained,
            Err(_) => TerminalState::Aborted,
        };
        // A delta-enabled reader applies and verifies while its pins hold.
        let body = match (body, pull) {
            (Ok(r), Some(step)) => self.pull_end(&step).map(|()| r),
            (Ok(r), None) => Ok(r),
            (Err(e), _) => {
                if let Some(p) = self.pull.lock().as_mut() {
                    p.forget();
                }
                Err(e)
            }
        };
        let release = pins.release(state);
        drop(reservation);
        let receipts = match (body, release) {
            (Ok(r), None) => r,
            (Ok(_), Some(m)) => {
                let mut e = TransferError::engine(format!("allocation lifetime release failed: {m}"));
                e.submitted = submitted;
                return Err(e);
            }
            (Err(mut e), _) => {
                e.submitted = submitted;
                return Err(e);
            }
        };
        if let Some(mut n) = notify {
            let notifier = self.notifier()?;
            let (key, content, delta) = (n.key.as_deref(), n.content.as_ref(), n.delta.as_ref());
            let (g, t) = (n.generation, &n.transfer);
            notifier.send(exec, key, NotifyKind::Done, g, t, content, delta, &mut n.delivered).map_err(|mut e| {
                e.submitted = true;
                e.message = format!("the step completed but {}", e.message);
                e
            })?;
        }
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
        let _pass = self.gate.enter();
        let mut st = self.state.lock();
        if let Some(mut d) = self.delta.lock().take() {
            if self.front.exec.engine.identity().ok() == Some(self.identity) {
                d.close(&*self.front.exec.engine);
            }
        }
        if let Some(mut d) = self.pull.lock().take() {
            if self.front.exec.engine.identity().ok() == Some(self.identity) {
                d.close(&*self.front.exec.engine, st.handed_to.is_some());
            }
        }
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

/// Admits one step (or the close) of a prepared transfer at a time.
#[derive(Default)]
struct Gate {
    busy: Mutex<bool>,
    free: Condvar,
}

/// A blocking step's (or the close's) hold on the gate, released on drop.
struct GatePass<'a>(&'a Gate);

impl Gate {
    /// Waits until no step runs, then holds the gate.
    fn enter(&self) -> GatePass<'_> {
        let mut busy = self.busy.lock();
        while *busy {
            self.free.wait(&mut busy);
        }
        *busy = true;
        GatePass(self)
    }
    /// Holds the gate when no step runs (a started step; released by [`Gate::leave`]).
    fn try_enter(&self) -> bool {
        !std::mem::replace(&mut *self.busy.lock(), true)
    }
    fn leave(&self) {
        *self.busy.lock() = false;
        self.free.notify_one();
    }
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// A step past its pins: what its batches and its end need.
struct Flight {
    tokens: Vec<Box<dyn LifetimeToken>>,
    /// The engine's reservation, released when the batches are over.
    reservation: Option<Reservation>,
    notify: Option<NotifyTail>,
    /// A delta-enabled reader's step: applied and verified at the end.
    pull: Option<PullStep>,
    cursor: Cursor,
}

/// What a notified step's `done` needs.
struct NotifyTail {
    key: Option<Vec<u8>>,
    transfer: String,
    generation: u64,
    content: Option<BTreeMap<String, Vec<u32>>>,
    /// A delta step's `delta` member per delta target.
    delta: Option<BTreeMap<String, NotifyDelta>>,
    delivered: Vec<NotifyDelivery>,
}

/// How a step's batches are driven.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// Each batch to its end on the calling thread (inline drains).
    Block,
    /// Submit and check without waiting (the step driver).
    Poll,
}

/// A batch handed to the engine that is still running.
enum Running {
    /// Under the engine's ticket, since then.
    Ticket(Box<dyn TransferTicket>, Instant),
    /// The engine's synchronous call on a thread of its own: its outcome once over.
    Thread(Arc<Mutex<Option<BatchOutcome>>>),
}

/// A delta step's batches: per prepared endpoint, its delta batches, or `None` for
/// its prepared (full) ones.
type StepBatches = Vec<Option<Vec<DeltaBatch>>>;

/// Batch `b` of endpoint `e` of a step: the batch (`None`: nothing to move), its
/// planned segments and the bytes it leaves in the targets.
fn step_batch<'a>(
    p: &'a Prepared,
    over: Option<&'a StepBatches>,
    e: usize,
    b: usize,
) -> Option<(Option<&'a TransferBatch>, u64, u64)> {
    match over.and_then(|o| o.get(e)).and_then(Option::as_ref) {
        Some(list) => list.get(b).map(|d| (d.batch.as_ref(), d.planned, d.logical)),
        None => p.endpoints.get(e)?.batches.get(b).map(|(batch, planned)| (Some(batch), *planned, batch.nbytes())),
    }
}

/// Where a step's batches are.
struct Cursor {
    /// (endpoint, batch) of the running batch, else of the next one to submit.
    at: (usize, usize),
    running: Option<Running>,
    /// A delta step's batches (`None`: the prepared ones).
    over: Option<Arc<StepBatches>>,
    /// The receipts of the endpoints whose batches all completed.
    receipts: Vec<TransferReceipt>,
    /// Operations and bytes completed of the current endpoint.
    counts: (u64, u64),
    submitted: bool,
    stop: Option<BatchOutcome>,
    cancelled: bool,
    progress: Reporter<'static>,
}

impl Cursor {
    fn new(p: &Prepared, progress: Option<ProgressCallback>, over: Option<StepBatches>) -> Cursor {
        let total = p.endpoints.iter().map(|e| e.nbytes).sum();
        let total_ops = p.endpoints.iter().map(|e| e.operation_count).sum();
        Cursor {
            at: (0, 0),
            running: None,
            over: over.map(Arc::new),
            receipts: Vec::with_capacity(p.endpoints.len()),
            counts: (0, 0),
            submitted: false,
            stop: None,
            cancelled: false,
            progress: Reporter::shared(progress, ProgressPhase::Transfer, total, total_ops),
        }
    }

    /// Moves the batches on, in order, until they are over (true: all completed,
    /// one stopped them, or the step was cancelled before the next submission) or,
    /// when polled, until the running batch has not completed yet (false).
    fn advance(
        &mut self,
        p: &Arc<Prepared>,
        exec: &TransferExecutor,
        stats: &ExecutionStats,
        cancelled: &dyn Fn() -> bool,
        drive: Drive,
    ) -> bool {
        let (attempts, timeout) = (exec.limits.max_completion_drain_attempts, exec.limits.completion_drain_timeout_ms);
        // A polled batch may run as long as the inline drains would wait for it.
        let deadline = Duration::from_millis(timeout.saturating_mul(u64::from(attempts)));
        loop {
            if let Some(running) = self.running.take() {
                let outcome = match running {
                    Running::Ticket(ticket, since) => {
                        let status = ticket.status();
                        let batch = step_batch(p, self.over.as_deref(), self.at.0, self.at.1).and_then(|x| x.0);
                        let batch = batch.expect("a running batch is at the cursor");
                        match judge_ticket(batch, ticket, status) {
                            Ok(outcome) => outcome,
                            Err(ticket) if since.elapsed() < deadline => {
                                self.running = Some(Running::Ticket(ticket, since));
                                return false;
                            }
                            Err(ticket) => BatchOutcome::Unknown {
                                ticket: Some(ticket),
                                restart_required: false,
                                interrupted: None,
                            },
                        }
                    }
                    Running::Thread(slot) => {
                        let done = slot.lock().take();
                        match done {
                            Some(o) => o,
                            None => {
                                self.running = Some(Running::Thread(slot));
                                return false;
                            }
                        }
                    }
                };
                if !self.account(p, stats, outcome) {
                    return true;
                }
            }
            let (e, b) = self.at;
            let Some(ep) = p.endpoints.get(e) else {
                self.progress.finish();
                return true;
            };
            let Some((batch, _, _)) = step_batch(p, self.over.as_deref(), e, b) else {
                self.receipts.push(TransferReceipt {
                    direction: p.direction,
                    worker_id: p.worker.clone().unwrap_or_default(),
                    endpoint: ep.endpoint.clone(),
                    operation_count: self.counts.0,
                    nbytes: self.counts.1,
                });
                self.counts = (0, 0);
                self.at = (e + 1, 0);
                continue;
            };
            if cancelled() {
                self.cancelled = true;
                return true;
            }
            let Some(batch) = batch else {
                // A delta of a target where nothing changed: nothing to move.
                self.account(p, stats, BatchOutcome::Completed);
                continue;
            };
            self.submitted = true;
            stats.submitted.store(true, Ordering::Release);
            if drive == Drive::Block {
                let outcome = execute_batch(&*exec.engine, batch, attempts, timeout);
                if !self.account(p, stats, outcome) {
                    return true;
                }
                continue;
            }
            match submit_batch(&*exec.engine, batch) {
                Submission::Ticket(ticket) => self.running = Some(Running::Ticket(ticket, Instant::now())),
                Submission::Failed(outcome) => {
                    self.stop = Some(outcome);
                    return true;
                }
                Submission::Synchronous => {
                    let slot = Arc::new(Mutex::new(None));
                    let (engine, prepared, over, out) =
                        (exec.engine.clone(), p.clone(), self.over.clone(), slot.clone());
                    let spawned = std::thread::Builder::new().name("mws-sync-batch".into()).spawn(move || {
                        let batch = step_batch(&prepared, over.as_deref(), e, b).and_then(|x| x.0);
                        let outcome = match batch {
                            Some(batch) => run_synchronous(&*engine, batch),
                            None => BatchOutcome::Completed,
                        };
                        *out.lock() = Some(outcome);
                    });
                    match spawned {
                        Ok(_) => self.running = Some(Running::Thread(slot)),
                        Err(err) => {
                            let msg = format!("cannot start a thread for the engine's synchronous batch call: {err}");
                            self.stop = Some(BatchOutcome::Failed(msg));
                            return true;
                        }
                    }
                }
            }
        }
    }

    /// Records how the batch at the cursor ended: true when it completed (the
    /// cursor moves to the next batch), false when it stops the step.
    fn account(&mut self, p: &Prepared, stats: &ExecutionStats, outcome: BatchOutcome) -> bool {
        if !matches!(outcome, BatchOutcome::Completed) {
            self.stop = Some(outcome);
            return false;
        }
        let (batch, planned, logical) =
            step_batch(p, self.over.as_deref(), self.at.0, self.at.1).expect("the cursor is at a batch");
        self.counts.0 += planned;
        self.counts.1 += logical;
        stats.planned_segments.fetch_add(planned, Ordering::Relaxed);
        if let Some(batch) = batch {
            stats.engine_operations.fetch_add(batch.operation_count(), Ordering::Relaxed);
            stats.engine_batches.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.advance(logical, planned);
        self.at.1 += 1;
        true
    }
}

/// The step arguments a started step keeps ([`PreparedTransfer::start_step`]).
struct OwnedStepArgs {
    weight_generation: u64,
    /// (instance, participant, lease id, lease generation).
    leases: Vec<(String, String, String, u64)>,
    transfer_id: Option<String>,
    /// The notify key and content verification of a notified step.
    notify: Option<(Option<Vec<u8>>, bool)>,
    /// A delta step's held generations.
    delta: Option<Vec<(String, u64)>>,
}

impl OwnedStepArgs {
    fn new(a: &StepArgs<'_>) -> OwnedStepArgs {
        OwnedStepArgs {
            weight_generation: a.weight_generation,
            leases: a
                .leases
                .iter()
                .map(|l| {
                    let (i, p, id) = (l.instance_id.to_string(), l.participant_id.to_string(), l.lease_id.to_string());
                    (i, p, id, l.lease_generation)
                })
                .collect(),
            transfer_id: a.transfer_id.map(str::to_string),
            notify: a.notify.map(|n| (n.key.map(<[u8]>::to_vec), n.verify_content)),
            delta: a.delta.map(|h| h.iter().map(|h| (h.participant_id.to_string(), h.weight_generation)).collect()),
        }
    }
}

/// A started step, as the step driver advances it.
struct StepWork {
    /// Let go when the step ends, before its outcome is published: once a waiter
    /// sees the outcome, freeing the prepared transfer closes it at once.
    prepared: Option<Arc<PreparedTransfer>>,
    args: OwnedStepArgs,
    stats: ExecutionStats,
    flight: Option<Flight>,
    started: bool,
    holds_gate: bool,
}

impl StepWork {
    fn conclude(&mut self, p: &PreparedTransfer, result: TransferResult<Vec<TransferReceipt>>) -> Advance {
        let report = p.finish(self.args.weight_generation, &self.stats, result);
        if std::mem::take(&mut self.holds_gate) {
            p.gate.leave();
        }
        self.prepared = None;
        Advance::Done(report)
    }
}

impl StepDriven for StepWork {
    fn advance(&mut self, cancelled: bool) -> Advance {
        let Some(p) = self.prepared.clone() else {
            return Advance::Done(Err(LiveError {
                error: TransferError::engine("step driver advanced a step that has ended"),
                report: Box::default(),
            }));
        };
        let p = &*p;
        if !self.started {
            if cancelled || p.front.cancel.0.load(Ordering::Acquire) {
                let e = TransferError::engine("transfer was cancelled before a batch was submitted");
                return self.conclude(p, Err(e));
            }
            if engine_busy(p.identity) {
                // Started steps on one engine queue behind its active submission.
                return Advance::Waiting;
            }
            self.started = true;
            let a = &self.args;
            let leases: Vec<LeaseRotation<'_>> = a
                .leases
                .iter()
                .map(|(i, pid, id, g)| LeaseRotation {
                    instance_id: i,
                    participant_id: pid,
                    lease_id: id,
                    lease_generation: *g,
                })
                .collect();
            let held: Option<Vec<TargetHeld<'_>>> = a
                .delta
                .as_ref()
                .map(|h| h.iter().map(|(p, g)| TargetHeld { participant_id: p, weight_generation: *g }).collect());
            let args = StepArgs {
                weight_generation: a.weight_generation,
                leases: &leases,
                transfer_id: a.transfer_id.as_deref(),
                notify: a
                    .notify
                    .as_ref()
                    .map(|(key, verify)| StepNotify { key: key.as_deref(), verify_content: *verify }),
                delta: held.as_deref(),
            };
            return match p.begin(&args, &self.stats) {
                Ok(Some(flight)) => {
                    self.flight = Some(flight);
                    Advance::Moved
                }
                Ok(None) => self.conclude(p, Ok(Vec::new())),
                Err(e) => self.conclude(p, Err(e)),
            };
        }
        let Some(flight) = self.flight.as_mut() else {
            return self.conclude(p, Err(TransferError::engine("step driver advanced a step that has ended")));
        };
        let before = (flight.cursor.at, flight.cursor.running.is_some());
        let cancel = &p.front.cancel.0;
        let cancelled = || cancelled || cancel.load(Ordering::Acquire);
        if !flight.cursor.advance(&p.prepared, &p.front.exec, &self.stats, &cancelled, Drive::Poll) {
            let moved = before != (flight.cursor.at, flight.cursor.running.is_some());
            return if moved { Advance::Moved } else { Advance::Waiting };
        }
        let flight = self.flight.take().expect("the flight is present");
        let result = p.end(flight, &self.stats);
        self.conclude(p, result)
    }
}

impl Drop for StepWork {
    fn drop(&mut self) {
        if let (true, Some(p)) = (self.holds_gate, &self.prepared) {
            p.gate.leave();
        }
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

/// Starts the one step of a prepared plain call (the plan's weight generation).
///
/// # Safety
/// As [`PreparedTransfer::start_step`].
unsafe fn start_once(
    prepared: PreparedTransfer,
    plan: &TransferPlan,
    args: &LiveArgs<'_>,
    on_complete: Option<StepCallback>,
) -> StepHandle {
    let step =
        StepArgs { weight_generation: plan.weight_generation(), transfer_id: args.transfer_id, ..Default::default() };
    // SAFETY: forwarded contract; the step keeps the prepared transfer (and its
    // registrations) until it ended, then closes it.
    unsafe { Arc::new(prepared).start_step(&step, on_complete) }
}

impl Loader {
    /// [`Loader::load_live`] without blocking, as [`Sink::start_execute`] is for a
    /// sink: prepared on the calling thread, its one step started on the step
    /// driver, the local target registrations released when it ended. Errors: those
    /// of [`Loader::prepare_live`] (nothing started).
    ///
    /// # Safety
    /// As [`Loader::load_live`], until the step ended.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_load_live(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_bindings: &[RuntimeBinding],
        target_placement: &Placement,
        target_binding: &RuntimeBinding,
        args: &LiveArgs<'_>,
        on_complete: Option<StepCallback>,
    ) -> TransferResult<StepHandle> {
        // SAFETY: forwarded contract.
        let p = unsafe {
            self.prepare_live(plan, source_placement, source_bindings, target_placement, target_binding, args)
        }?;
        // SAFETY: forwarded contract.
        Ok(unsafe { start_once(p, plan, args, on_complete) })
    }

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
    /// [`Sink::execute`] without blocking: prepares the call on the calling thread
    /// (every check under the guards' pins, the batches lowered, the local source
    /// allocations registered unless `args.local_pre_registered`: work in proportion
    /// to the call's fragments, no byte moved) and starts its one step
    /// ([`PreparedTransfer::start_step`], weight generation: the plan's; transfer
    /// id: `args.transfer_id`) on the step driver. The registrations are released
    /// when the step ended. Errors: those of [`Sink::prepare`] (nothing started);
    /// the call's own outcome comes through the handle.
    ///
    /// # Safety
    /// As [`Sink::execute`], until the step ended: every buffer of the call stays
    /// valid and pinned while it runs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn start_execute(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_binding: &RuntimeBinding,
        target_placement: &Placement,
        target_bindings: &[RuntimeBinding],
        args: &LiveArgs<'_>,
        on_complete: Option<StepCallback>,
    ) -> TransferResult<StepHandle> {
        // SAFETY: forwarded contract.
        let p =
            unsafe { self.prepare(plan, source_placement, source_binding, target_placement, target_bindings, args) }?;
        // SAFETY: forwarded contract.
        Ok(unsafe { start_once(p, plan, args, on_complete) })
    }

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
