//! What `mws_loader` and `mws_sink` share: the per-call C structs of live transfers
//! (executor limits, live arguments, statistics, and the report of the last call,
//! `mws_live_report`: submitted, guard release, per-target verdicts), and one body for
//! each of their cancel, progress, statistics, report and free entry points
//! ([`LiveObject`]).

use crate::args::{Caller, Handle, Texts};
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::callbacks::guard::{mws_guard_vtable, CGuard};
use crate::callbacks::progress::{mws_progress_fn, CProgress};
use mws::protocol::guards::GuardProvider;
use mws::protocol::transfer::{
    CancelToken, ExecutorLimits, LiveArgs, LiveError, LiveReport, ProgressCallback, TargetOutcome, TransferStats,
};
use parking_lot::Mutex;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// Executor limits (`mws_loader_new`, `mws_sink_new`); a NULL pointer means the
/// defaults (1024, 1000000, 10000000, 3, 1000, 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_executor_limits {
    /// Engine operations per batch (> 0; merged segments count once).
    pub max_batch_operations: u64,
    /// Largest `segment_count` of one region (> 0).
    pub max_region_segments: u64,
    /// Segments of one call (> 0).
    pub max_total_lowered_segments: u64,
    /// Inline drains of an unknown ticket (0 = none).
    pub max_completion_drain_attempts: u32,
    /// Timeout of one inline drain, milliseconds.
    pub completion_drain_timeout_ms: u64,
    /// 0 (default): adjacent segments of a batch (same pair of allocations, source and
    /// target both contiguous) are merged into one engine operation; the bytes moved,
    /// the plan and the receipts are the same either way. Non-zero: one engine
    /// operation per planned segment (the reference's request pattern).
    pub no_coalescing: u32,
}

/// Statistics of the last call of a loader or sink.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_transfer_stats {
    /// Bytes moved.
    pub bytes: u64,
    /// Regions (operations of the plan) executed.
    pub regions: u64,
    /// Planned segments moved (the receipts' operation counts; stored loads: ranged
    /// reads).
    pub operations: u64,
    /// Receipts (one per remote endpoint; stored loads: requests).
    pub receipts: u64,
    /// Operations submitted to the engine for them: at most `operations`, fewer when
    /// adjacent segments were merged (stored loads: equal to `operations`).
    pub engine_operations: u64,
}

/// Per-call arguments of a live load or a sink execution. A NULL pointer or a zeroed
/// struct means the defaults. Strings are only read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_live_args {
    /// Restricts the call to one worker of the local binding (NULL: its one worker).
    pub worker_id: *const c_char,
    /// Transfer id handed to the guards (NULL: a fresh random id).
    pub transfer_id: *const c_char,
    /// Non-zero: the local buffers are registered with the engine by their owner
    /// (`mws_transfer_engine_register_memory`); zero: the call registers their whole
    /// allocations and unregisters them after.
    pub local_pre_registered: i32,
    /// Allocation guard of the local and remote buffers (NULL: a static guard; the
    /// caller keeps every buffer valid and untouched for the call).
    pub guard: *const mws_guard_vtable,
    /// Passed to the guard's callbacks.
    pub guard_ctx: *mut c_void,
}

/// The verdict of a live call for one target participant (`mws_target_outcome`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_target_verdict {
    /// The call's share of the target landed completely (the target may be
    /// activated at `weight_generation` once every call writing it reports this).
    MWS_TARGET_UPDATED = 0,
    /// The call submitted nothing: the target still holds its previous contents.
    MWS_TARGET_UNCHANGED = 1,
    /// The call may have written part of its share: the target's bytes are undefined
    /// until a call completes under the same plan.
    MWS_TARGET_TORN = 2,
}

/// How a live call released the allocation guards' pins (`mws_live_report`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mws_guard_release {
    /// The call pinned nothing.
    MWS_GUARD_NOT_PINNED = 0,
    /// Released `completed`.
    MWS_GUARD_COMPLETED = 1,
    /// Released `failed_drained` (a batch failed or was cancelled after submission).
    MWS_GUARD_FAILED_DRAINED = 2,
    /// Released `aborted` (failed before anything was submitted).
    MWS_GUARD_ABORTED = 3,
    /// Held by a pending transfer until it is drained (`pending_transfer_id`).
    MWS_GUARD_PENDING = 4,
    /// A release failed (the call's error says which).
    MWS_GUARD_RELEASE_FAILED = 5,
}

/// One target participant of a live call's report. Strings are borrowed from the
/// loader or sink until its next call or its free.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_target_outcome {
    /// The target participant.
    pub participant_id: *const c_char,
    /// The plan's weight generation.
    pub weight_generation: u64,
    /// An `mws_target_verdict` value.
    pub verdict: u32,
}

/// What the last live call of a loader or sink did, successful or not
/// (`mws_loader_last_report`, `mws_sink_last_report`). Pointers are borrowed from the
/// handle until its next call or its free.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_live_report {
    /// 1 when any batch was handed to the engine; 0 proves the call wrote nothing.
    pub submitted: u32,
    /// An `mws_guard_release` value.
    pub guard_release: u32,
    /// The pending transfer holding the call's resources (drain it with
    /// `mws_transfer_engine_drain`), or NULL.
    pub pending_transfer_id: *const c_char,
    /// Number of entries of `targets`.
    pub n_targets: usize,
    /// The verdict per target participant the call writes (sorted by participant).
    pub targets: *const mws_target_outcome,
    /// The call's statistics (zero on failure).
    pub stats: mws_transfer_stats,
}

/// The report of the last live call of a loader, sink or prepared transfer
/// (`*_last_report`), kept in C form.
#[derive(Default)]
pub(crate) struct LastReport(Mutex<Option<ReportView>>);

impl LastReport {
    /// Ends a live call: keeps its report (successful or not) and, on success, writes
    /// its statistics to `*stats` when `stats` is not NULL.
    pub(crate) fn keep(
        &self,
        c: Caller<'_>,
        result: Result<LiveReport, LiveError>,
        stats: *mut mws_transfer_stats,
    ) -> FfiResult<()> {
        self.store(c, result, stats, true)
    }

    /// As [`Self::keep`], but the first report kept stays: a started step's report,
    /// whose strings its handle lends until it is freed, never changes (two threads
    /// settling the same step keep one view).
    pub(crate) fn keep_first(
        &self,
        c: Caller<'_>,
        result: Result<LiveReport, LiveError>,
        stats: *mut mws_transfer_stats,
    ) -> FfiResult<()> {
        self.store(c, result, stats, false)
    }

    /// Keeps the report (`replace`: over an earlier one; else only the first) and
    /// ends as [`Self::keep`] does.
    fn store(
        &self,
        c: Caller<'_>,
        result: Result<LiveReport, LiveError>,
        stats: *mut mws_transfer_stats,
        replace: bool,
    ) -> FfiResult<()> {
        let (report, outcome) = match result {
            Ok(r) => (r, Ok(())),
            Err(e) => (*e.report, Err(e.error)),
        };
        let st = stats_c(report.stats);
        {
            let mut slot = self.0.lock();
            if replace || slot.is_none() {
                *slot = Some(ReportView::new(report));
            }
        }
        outcome?;
        c.opt_set(stats, st);
        Ok(())
    }

    /// The last report, or `MWS_NOT_FOUND` with `missing` before the first call.
    pub(crate) fn get(&self, missing: &str) -> FfiResult<mws_live_report> {
        let view = self.0.lock();
        Ok(view.as_ref().ok_or_else(|| Failure::new(mws_status::MWS_NOT_FOUND, missing))?.c)
    }
}

/// The C view of a [`LiveReport`], owned by the loader or sink that made it.
pub(crate) struct ReportView {
    _texts: Texts,
    _targets: Vec<mws_target_outcome>,
    c: mws_live_report,
}

// SAFETY: the raw pointers in `c` point into `_texts` and `_targets`, owned by the same
// value and never mutated; the view is only read after it is built.
unsafe impl Send for ReportView {}
// SAFETY: as for `Send`.
unsafe impl Sync for ReportView {}

impl ReportView {
    pub(crate) fn new(report: LiveReport) -> ReportView {
        let texts = Texts::default();
        let targets: Vec<_> = (report.targets.iter())
            .map(|t| mws_target_outcome {
                participant_id: texts.ptr(&t.participant_id),
                weight_generation: t.weight_generation,
                verdict: verdict(&t.outcome) as u32,
            })
            .collect();
        let c = mws_live_report {
            submitted: u32::from(report.submitted),
            // The core numbers its guard releases as `mws_guard_release` does (tested).
            guard_release: report.guard_release as u32,
            pending_transfer_id: report.pending_transfer_id.as_deref().map_or(std::ptr::null(), |id| texts.ptr(id)),
            n_targets: targets.len(),
            targets: if targets.is_empty() { std::ptr::null() } else { targets.as_ptr() },
            stats: stats_c(report.stats),
        };
        ReportView { _texts: texts, _targets: targets, c }
    }
}

/// The verdict of a target outcome (`mws_target_outcome`, `mws_notify_outcome`).
pub(crate) fn verdict(o: &TargetOutcome) -> mws_target_verdict {
    match o {
        TargetOutcome::Updated { .. } => mws_target_verdict::MWS_TARGET_UPDATED,
        TargetOutcome::Unchanged => mws_target_verdict::MWS_TARGET_UNCHANGED,
        TargetOutcome::Torn { .. } => mws_target_verdict::MWS_TARGET_TORN,
    }
}

pub(crate) fn stats_c(s: TransferStats) -> mws_transfer_stats {
    mws_transfer_stats {
        bytes: s.bytes,
        regions: s.regions,
        operations: s.operations,
        receipts: s.receipts,
        engine_operations: s.engine_operations,
    }
}

/// The executor limits `l` says (NULL: the defaults).
pub(crate) fn limits_arg(c: Caller<'_>, l: *const mws_executor_limits) -> ExecutorLimits {
    let Some(l) = c.opt_struct(l) else { return ExecutorLimits::default() };
    ExecutorLimits {
        max_batch_operations: l.max_batch_operations,
        max_region_segments: l.max_region_segments,
        max_total_lowered_segments: l.max_total_lowered_segments,
        max_completion_drain_attempts: l.max_completion_drain_attempts,
        completion_drain_timeout_ms: l.completion_drain_timeout_ms,
        coalesce_adjacent: l.no_coalescing == 0,
    }
}

/// The [`LiveArgs`] `args` says (NULL: the defaults).
pub(crate) fn live_args<'a>(c: Caller<'a>, args: *const mws_live_args) -> FfiResult<LiveArgs<'a>> {
    let Some(a) = c.opt_struct(args) else { return Ok(LiveArgs::default()) };
    let guard: Option<Arc<dyn GuardProvider>> =
        if a.guard.is_null() { None } else { Some(Arc::new(CGuard::from_vtable(c, a.guard, a.guard_ctx)?)) };
    Ok(LiveArgs {
        worker_id: c.opt_str(a.worker_id, "args.worker_id")?,
        transfer_id: c.opt_str(a.transfer_id, "args.transfer_id")?,
        local_pre_registered: a.local_pre_registered != 0,
        guard,
    })
}

/// A loader or sink as C holds it: the core object's cancellation flag, progress
/// callback and statistics, and the C view of its last report. The entry points that
/// both have (`_cancel`, `_reset_cancel`, `_set_progress`, `_stats`, `_last_report`,
/// `_free`) are one body each, below.
pub(crate) trait LiveObject: Handle {
    fn cancel_token(&self) -> &CancelToken;
    fn set_progress(&self, progress: Option<ProgressCallback>);
    fn stats(&self) -> TransferStats;
    fn report(&self) -> &LastReport;
}

/// Implements [`LiveObject`] for a handle type holding the core object as `inner` (a
/// `Loader` or `Sink`, whose accessors are the same) and its report view as `report`.
macro_rules! live_object {
    ($t:ty) => {
        impl $crate::live::LiveObject for $t {
            fn cancel_token(&self) -> &mws::protocol::transfer::CancelToken {
                self.inner.cancel_token()
            }
            fn set_progress(&self, progress: Option<mws::protocol::transfer::ProgressCallback>) {
                self.inner.set_progress(progress)
            }
            fn stats(&self) -> mws::protocol::transfer::TransferStats {
                self.inner.stats()
            }
            fn report(&self) -> &$crate::live::LastReport {
                &self.report
            }
        }
    };
}

/// `mws_*_cancel` (`on`) and `mws_*_reset_cancel`: NULL does nothing.
pub(crate) fn cancel(object: Option<&impl LiveObject>, on: bool) -> FfiResult<()> {
    if let Some(o) = object {
        if on {
            o.cancel_token().cancel();
        } else {
            o.cancel_token().reset();
        }
    }
    Ok(())
}

/// `mws_*_set_progress`: sets (or clears, with NULL) the progress callback.
///
/// # Safety
/// `progress`, when set, honours `mws_progress_fn` with `ctx` until it is replaced or
/// the object is freed.
pub(crate) unsafe fn set_progress(
    object: &impl LiveObject,
    progress: mws_progress_fn,
    ctx: *mut c_void,
) -> FfiResult<()> {
    // SAFETY: this function's contract.
    object.set_progress(unsafe { CProgress::new(progress, ctx) }.map(CProgress::into_callback));
    Ok(())
}

/// `mws_*_stats`: the statistics of the last successful call.
pub(crate) fn stats_out(c: Caller<'_>, object: &impl LiveObject, out: *mut mws_transfer_stats) -> FfiResult<()> {
    c.out(out, "out")?.give(stats_c(object.stats()))
}

/// `mws_*_last_report`: the last live call's report (`MWS_NOT_FOUND` before one).
pub(crate) fn report_out(c: Caller<'_>, object: &impl LiveObject, out: *mut mws_live_report) -> FfiResult<()> {
    let out = c.out(out, "out")?;
    out.give(object.report().get("no live call yet")?)
}

/// `mws_*_free`: prepared transfers may outlive the object, so they must not call a
/// progress callback whose context the caller frees with it: the callback is cleared
/// first.
pub(crate) fn free<T: LiveObject>(c: Caller<'_>, p: *mut T) -> FfiResult<()> {
    if let Some(o) = c.opt_handle(p) {
        o.set_progress(None);
    }
    c.free(p)
}
