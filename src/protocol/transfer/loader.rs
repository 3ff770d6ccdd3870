//! [`Loader`] and [`Sink`]: the objects a serving engine and a trainer keep for live
//! transfer (and, for the loader, restores from a store), over one engine.
//!
//! A [`Loader`] fills the buffers of one target participant, from a live source
//! through the engine ([`Loader::load_live`], targets pull) or from a stored revision
//! ([`Loader::load_stored`]); a [`Sink`] pushes a source worker's part of a live
//! transfer into the remote targets ([`Sink::execute`]). Both carry what a caller
//! wants across calls: a [`CancelToken`] checked before every engine batch, a
//! progress callback, and the statistics of the last successful call. Every live call
//! returns a [`LiveReport`] (on failure inside [`LiveError`]): the receipts, the
//! statistics, whether anything was submitted to the engine, how the guards' pins
//! were released, and the per-target verdict of the call's share.
//!
//! The C ABI's `mws_loader` / `mws_sink` wrap these without adding behaviour.

use super::error::{TransferError, TransferResult};
use super::executor::{ExecuteArgs, ExecutionStats, ExecutorLimits, GuardRelease, TransferExecutor, TransferReceipt};
use super::lease::GuardProviders;
use super::outcome::{call_outcomes, CallRecord, TargetOutcome, TransferMode};
use crate::engine::TransferEngine;
use crate::error::{Error, ErrorKind, Result};
use crate::model::Placement;
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::protocol::guards::{GuardProvider, StaticGuard};
use crate::protocol::{LoadArgs, LoadPlan, LoadStats, Progress, ProgressFn, WeightStore};
use crate::runtime::RuntimeBinding;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A cancellation flag shared between a [`Loader`] or [`Sink`] and whoever may stop
/// it (another thread, a signal handler's flag, a C caller). Cloning shares the flag.
///
/// Cancelling stops a running live call before its next engine batch (the call then
/// fails; completed batches stay written) and refuses later calls until
/// [`CancelToken::reset`]. Thread-safe.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(pub(super) Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// Clears a cancellation request.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Release);
    }
    /// True while cancellation is requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A progress callback kept by a loader or sink (called on the calling thread of
/// each call, throttled).
pub type ProgressCallback = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Statistics of one call of a loader or sink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Bytes moved.
    pub bytes: u64,
    /// Regions (operations of the plan) executed.
    pub regions: u64,
    /// Planned segments moved (the receipts' operation counts; stored loads: ranged
    /// reads).
    pub operations: u64,
    /// Receipts (one per remote endpoint; stored loads: requests).
    pub receipts: u64,
    /// Engine operations submitted: at most `operations`, fewer when adjacent
    /// segments were merged (stored loads: equal to `operations`).
    pub engine_operations: u64,
}

impl From<&LoadStats> for TransferStats {
    /// The statistics of a stored load (`Loader::load_stored`, a prepared restore's
    /// step) as a loader reports them: its ranged reads are the operations (and the
    /// engine operations), its requests the receipts.
    fn from(s: &LoadStats) -> TransferStats {
        TransferStats {
            bytes: s.bytes,
            regions: s.regions,
            operations: s.ranges,
            receipts: s.requests,
            engine_operations: s.ranges,
        }
    }
}

/// Per-call arguments of a live load or a sink execution. The default: the local
/// binding's one worker, a fresh transfer id, the call registers the local buffers
/// itself, and a static guard (the caller keeps every buffer valid and untouched).
#[derive(Clone, Default)]
pub struct LiveArgs<'a> {
    /// Restricts the call to one worker of the local binding.
    pub worker_id: Option<&'a str>,
    /// Transfer id handed to the guards.
    pub transfer_id: Option<&'a str>,
    /// The local buffers are registered with the engine by their owner (for the
    /// binding's current generation); otherwise the call registers their whole
    /// allocations and unregisters them after.
    pub local_pre_registered: bool,
    /// Allocation guard of the local and remote buffers (`None`: [`StaticGuard`]).
    pub guard: Option<Arc<dyn GuardProvider>>,
}

/// The verdict of one call for one target participant it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetReport {
    /// The target participant.
    pub participant_id: String,
    /// The plan's weight generation.
    pub weight_generation: u64,
    /// The verdict of this call's share of the target (`Updated` when the share
    /// landed completely). A target written by several calls (sinks of several
    /// sources) is updated only when every one of them reports `Updated`:
    /// [`target_outcomes`](super::target_outcomes) over all the calls' records says so.
    pub outcome: TargetOutcome,
}

/// What a live call did, successful or not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveReport {
    /// The receipts of a successful call (empty on failure).
    pub receipts: Vec<TransferReceipt>,
    /// The statistics (zero on failure).
    pub stats: TransferStats,
    /// True once any batch was handed to the engine: `false` proves the call wrote
    /// nothing.
    pub submitted: bool,
    /// How the guards' pins were released.
    pub guard_release: GuardRelease,
    /// The pending transfer that holds the call's resources (completion unknown or a
    /// failed unregistration): drain it on the engine.
    pub pending_transfer_id: Option<String>,
    /// Per target participant the call writes (sorted by participant).
    pub targets: Vec<TargetReport>,
}

/// A failed live call: the error and what the call did before it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveError {
    /// The error.
    pub error: TransferError,
    /// The call's report (`targets` say which targets may be torn).
    pub report: Box<LiveReport>,
}

impl std::fmt::Display for LiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for LiveError {}

impl From<LiveError> for Error {
    fn from(e: LiveError) -> Error {
        e.error.into()
    }
}

/// State shared by [`Loader`] and [`Sink`] (and the transfers they prepare).
pub(super) struct Front {
    pub(super) exec: TransferExecutor,
    pub(super) cancel: CancelToken,
    pub(super) progress: Mutex<Option<ProgressCallback>>,
    pub(super) stats: Mutex<TransferStats>,
    pub(super) last: Mutex<Option<LiveReport>>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").field("exec", &self.exec).field("cancel", &self.cancel).finish_non_exhaustive()
    }
}

impl Front {
    fn new(engine: Arc<dyn TransferEngine>, limits: ExecutorLimits) -> TransferResult<Front> {
        Ok(Front {
            exec: TransferExecutor::new(engine, limits)?,
            cancel: CancelToken::new(),
            progress: Mutex::new(None),
            stats: Mutex::new(TransferStats::default()),
            last: Mutex::new(None),
        })
    }

    /// Builds the call's report from its result and records it (and, on success, the
    /// statistics).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        plan: &TransferPlan,
        side: Side,
        local: &RuntimeBinding,
        worker: Option<&str>,
        exec_stats: &ExecutionStats,
        result: TransferResult<Vec<TransferReceipt>>,
    ) -> std::result::Result<LiveReport, LiveError> {
        let mode = if side == Side::Source { TransferMode::Sink } else { TransferMode::Reader };
        let mine = local_executors(plan, side, local, worker);
        let submitted = exec_stats.submitted.load(Ordering::Acquire) || result.as_ref().is_err_and(|e| e.submitted);
        let result = result.map_err(|mut e| {
            e.submitted = submitted;
            e
        });
        let mut report = LiveReport {
            submitted,
            guard_release: exec_stats.guard_release(),
            pending_transfer_id: result.as_ref().err().and_then(|e| e.pending_transfer_id.clone()),
            ..LiveReport::default()
        };
        // The call's record, under its executor (the local worker's, when the plan
        // has exactly one; a call that failed before choosing one has none).
        if let [e] = mine.as_slice() {
            let record = CallRecord {
                plan: plan.clone(),
                participant_id: e.participant_id.clone(),
                worker_id: e.worker_id.clone(),
                result: result.clone(),
            };
            report.targets = call_outcomes(plan, mode, e, &record)
                .into_iter()
                .map(|(participant_id, outcome)| TargetReport {
                    participant_id,
                    weight_generation: plan.weight_generation(),
                    outcome,
                })
                .collect();
        }
        let regions = mine.iter().map(|e| e.operation_indices.len() as u64).sum();
        self.conclude(report, result, regions, exec_stats)
    }

    /// Ends the report of any live call, plain or prepared: on success its statistics
    /// (from the receipts; `regions` counts only when something moved) and receipts,
    /// recorded as the last statistics; the report is recorded as the last one either
    /// way, and a failure returns it inside its [`LiveError`].
    pub(super) fn conclude(
        &self,
        mut report: LiveReport,
        result: TransferResult<Vec<TransferReceipt>>,
        regions: u64,
        exec_stats: &ExecutionStats,
    ) -> std::result::Result<LiveReport, LiveError> {
        match result {
            Ok(receipts) => {
                report.stats = TransferStats {
                    bytes: receipts.iter().map(|r| r.nbytes).sum(),
                    regions: if receipts.is_empty() { 0 } else { regions },
                    operations: receipts.iter().map(|r| r.operation_count).sum(),
                    receipts: receipts.len() as u64,
                    engine_operations: exec_stats.snapshot().1,
                };
                report.receipts = receipts;
                *self.stats.lock() = report.stats;
                *self.last.lock() = Some(report.clone());
                Ok(report)
            }
            Err(error) => {
                *self.last.lock() = Some(report.clone());
                Err(LiveError { error, report: Box::new(report) })
            }
        }
    }

    /// The executor arguments every call of a loader, sink or prepared transfer
    /// shares: the local worker and registration, the transfer id, the guard (the
    /// call's, else the static one) on both sides, and the owners' registrations
    /// asserted by the bindings. A plain call adds its cancellation, progress and
    /// statistics.
    pub(super) fn execute_args<'a>(args: &LiveArgs<'a>, guards: &'a GuardProviders) -> ExecuteArgs<'a> {
        ExecuteArgs {
            local_worker_id: args.worker_id,
            local_pre_registered: args.local_pre_registered,
            source_guards: Some(guards),
            target_guards: Some(guards),
            transfer_id: args.transfer_id,
            registrations_from_bindings: true,
            ..ExecuteArgs::default()
        }
    }

    /// A plain call's arguments: [`Self::execute_args`] with the front's cancellation
    /// flag, `progress` and `stats`.
    fn plain_args<'a>(
        &'a self,
        args: &LiveArgs<'a>,
        guards: &'a GuardProviders,
        progress: Option<&'a ProgressCallback>,
        stats: &'a ExecutionStats,
    ) -> ExecuteArgs<'a> {
        ExecuteArgs {
            cancel: Some(&self.cancel.0),
            progress: progress.map(|p| &**p as ProgressFn<'_>),
            stats: Some(stats),
            ..Front::execute_args(args, guards)
        }
    }

    pub(super) fn guards(args: &LiveArgs<'_>) -> GuardProviders {
        GuardProviders::all(args.guard.clone().unwrap_or_else(|| Arc::new(StaticGuard)))
    }
}

/// The executors of `plan` on `side` that a call of `local` (restricted to `worker`
/// when given) runs: exactly one for a call that can run.
pub(super) fn local_executors<'p>(
    plan: &'p TransferPlan,
    side: Side,
    local: &RuntimeBinding,
    worker: Option<&str>,
) -> Vec<&'p ExecutorTransferPlan> {
    plan.executors(side)
        .iter()
        .filter(|e| {
            e.participant_id == local.participant_id()
                && e.instance_id == local.instance_id()
                && worker.is_none_or(|w| e.worker_id == w)
        })
        .collect()
}

/// The accessors [`Loader`] and [`Sink`] share, written once.
macro_rules! front_accessors {
    () => {
        /// The executor (engine identity, limits, pending transfers).
        pub fn executor(&self) -> &TransferExecutor {
            &self.front.exec
        }

        /// The cancellation flag of its calls (and of the transfers it prepared).
        pub fn cancel_token(&self) -> &CancelToken {
            &self.front.cancel
        }

        /// Sets (or clears) the progress callback: live calls report `Transfer`
        /// progress (items = planned segments); a loader's stored loads report
        /// `Restore` progress unless their arguments bring their own callback. A
        /// running call keeps the callback it started with.
        pub fn set_progress(&self, progress: Option<ProgressCallback>) {
            *self.front.progress.lock() = progress;
        }

        /// Statistics of the last successful call.
        pub fn stats(&self) -> TransferStats {
            *self.front.stats.lock()
        }

        /// The report of the last live call, successful or not (`None` before the
        /// first).
        pub fn last_report(&self) -> Option<LiveReport> {
            self.front.last.lock().clone()
        }
    };
}

/// Fills the buffers of one target participant from a live source through an engine
/// (targets pull) or from a stored revision.
///
/// Thread safety: `Send + Sync`; one call at a time per loader is the intended use
/// (calls on one engine are serialized by the engine fence, a concurrent one is
/// refused); [`Loader::cancel_token`] may be used from any thread.
#[derive(Debug)]
pub struct Loader {
    pub(super) front: Arc<Front>,
}

impl Loader {
    /// A loader on `engine` with `limits`. Errors: limit validation (contract), the
    /// engine's identity cannot be resolved (engine error).
    pub fn new(engine: Arc<dyn TransferEngine>, limits: ExecutorLimits) -> TransferResult<Loader> {
        Ok(Loader { front: Arc::new(Front::new(engine, limits)?) })
    }

    front_accessors!();

    /// Pulls every operation of the local target executor of `plan` into the buffers
    /// of `target_binding`, reading from the sources through the engine (reader mode,
    /// `live-transfer.md` §10). The source memory must be registered with the engine
    /// by its owners for `source_bindings` (passing them asserts it). Errors: those of
    /// [`TransferExecutor::execute_reader`] (a set cancellation token stops it
    /// before its next batch: `transfer was cancelled before a batch was submitted`),
    /// each with the call's report.
    ///
    /// # Safety
    /// As [`TransferExecutor::execute_reader`]: every buffer of the bindings stays
    /// valid for the call (and, when completion is unknown, until the pending
    /// transfer is drained), and the guard pins them.
    pub unsafe fn load_live(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_bindings: &[RuntimeBinding],
        target_placement: &Placement,
        target_binding: &RuntimeBinding,
        args: &LiveArgs<'_>,
    ) -> std::result::Result<LiveReport, LiveError> {
        let f = &self.front;
        let guards = Front::guards(args);
        let progress = f.progress.lock().clone();
        let exec_stats = ExecutionStats::default();
        let reader = f.plain_args(args, &guards, progress.as_ref(), &exec_stats);
        // SAFETY: forwarded contract (this function's `# Safety`).
        let result = unsafe {
            f.exec.execute_reader(plan, source_placement, source_bindings, target_placement, target_binding, &reader)
        };
        f.finish(plan, Side::Target, target_binding, args.worker_id, &exec_stats, result)
    }

    /// Restores the part of `plan` that belongs to `binding` from `store`
    /// ([`WeightStore::load`]), honouring the cancellation token (checked before the
    /// call: `load was cancelled before it started`, kind `Store`) and the progress
    /// callback (unless `args` brings one), and recording the statistics.
    ///
    /// # Safety
    /// As [`WeightStore::load`].
    pub unsafe fn load_stored(
        &self,
        store: &WeightStore,
        plan: &LoadPlan,
        binding: &RuntimeBinding,
        args: LoadArgs<'_>,
    ) -> Result<LoadStats> {
        if self.front.cancel.is_cancelled() {
            return Err(Error::new(ErrorKind::Store, "load was cancelled before it started"));
        }
        let progress = self.front.progress.lock().clone();
        let mut args = args;
        if args.progress.is_none() {
            args.progress = progress.as_deref().map(|p| p as ProgressFn<'_>);
        }
        // SAFETY: forwarded contract (this function's `# Safety`).
        let s = unsafe { store.load(plan, binding, args) }?;
        *self.front.stats.lock() = TransferStats::from(&s);
        Ok(s)
    }
}

/// A source worker's executor of a live transfer: pushes its part of a bound plan
/// into the remote targets (sources push).
///
/// Thread safety: as [`Loader`].
#[derive(Debug)]
pub struct Sink {
    pub(super) front: Arc<Front>,
}

impl Sink {
    /// A sink on `engine` with `limits`; errors as [`Loader::new`].
    pub fn new(engine: Arc<dyn TransferEngine>, limits: ExecutorLimits) -> TransferResult<Sink> {
        Ok(Sink { front: Arc::new(Front::new(engine, limits)?) })
    }

    front_accessors!();

    /// Pushes every operation of the local source executor of `plan` from the buffers
    /// of `source_binding` into the remote targets (sink mode, `live-transfer.md` §5).
    /// The target memory must be registered with the engine by its owners for
    /// `target_bindings` (passing them asserts it). A source participant the plan does
    /// not read from (an unselected DP replica) succeeds with zero statistics and no
    /// targets. Errors: those of [`TransferExecutor::execute_sink`] (cancellation as
    /// [`Loader::load_live`]), each with the call's report.
    ///
    /// # Safety
    /// As [`TransferExecutor::execute_sink`].
    pub unsafe fn execute(
        &self,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_binding: &RuntimeBinding,
        target_placement: &Placement,
        target_bindings: &[RuntimeBinding],
        args: &LiveArgs<'_>,
    ) -> std::result::Result<LiveReport, LiveError> {
        self.run(plan, source_binding, args, |sink| {
            // SAFETY: forwarded contract (this function's `# Safety`).
            unsafe {
                self.front.exec.execute_sink(
                    plan,
                    source_placement,
                    source_binding,
                    target_placement,
                    target_bindings,
                    sink,
                )
            }
        })
    }

    /// [`Sink::execute`] with the notify hook ([`super::notify::execute_sink_notified`]):
    /// `begin` to every target endpoint the local executor writes before the call,
    /// `done` after it returned. `key`: `None` (unkeyed) or the key shared with the
    /// targets' acceptors (at least 16 bytes). Errors: those of
    /// [`super::notify::execute_sink_notified`], each with the call's report (a `done`
    /// that could not be delivered leaves its targets torn).
    ///
    /// # Safety
    /// As [`TransferExecutor::execute_sink`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_notified(
        &self,
        key: Option<&[u8]>,
        plan: &TransferPlan,
        source_placement: &Placement,
        source_binding: &RuntimeBinding,
        target_placement: &Placement,
        target_bindings: &[RuntimeBinding],
        args: &LiveArgs<'_>,
    ) -> std::result::Result<LiveReport, LiveError> {
        self.run(plan, source_binding, args, |sink| {
            // SAFETY: forwarded contract (this function's `# Safety`).
            unsafe {
                super::notify::execute_sink_notified(
                    &self.front.exec,
                    key,
                    plan,
                    source_placement,
                    source_binding,
                    target_placement,
                    target_bindings,
                    sink,
                )
            }
            .map(|n| n.receipts)
        })
    }

    /// One sink call: the executor arguments (registrations, guards, cancellation,
    /// progress, statistics) for `call`, then the report.
    fn run(
        &self,
        plan: &TransferPlan,
        source_binding: &RuntimeBinding,
        args: &LiveArgs<'_>,
        call: impl FnOnce(&ExecuteArgs<'_>) -> TransferResult<Vec<TransferReceipt>>,
    ) -> std::result::Result<LiveReport, LiveError> {
        let f = &self.front;
        let guards = Front::guards(args);
        let progress = f.progress.lock().clone();
        let exec_stats = ExecutionStats::default();
        let result = call(&f.plain_args(args, &guards, progress.as_ref(), &exec_stats));
        f.finish(plan, Side::Source, source_binding, args.worker_id, &exec_stats, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_load_statistics_as_transfer_statistics() {
        let load = LoadStats { regions: 3, ranges: 40, requests: 2, bytes: 4096, ..LoadStats::default() };
        let t = TransferStats::from(&load);
        let want = TransferStats { bytes: 4096, regions: 3, operations: 40, receipts: 2, engine_operations: 40 };
        assert_eq!(t, want);
    }
}
