//! `mws_prepared_transfer`: a live transfer prepared once (`mws_sink_prepare`,
//! `mws_loader_prepare_live`) and stepped many times, one weight generation per step;
//! wraps the core's `protocol::transfer::PreparedTransfer`.

use crate::args::Caller;
use crate::boundary::mws_status;
use crate::boundary::Failure;
use crate::boundary::FfiResult;
use crate::live::{mws_live_report, mws_transfer_stats, stats_c, LastReport};
use crate::notify::key_arg;
use mws::protocol::transfer::{
    DeltaInbox, DeltaReport, LeaseRotation, PreparedRestore, PreparedTransfer, StepNotify, StepRequest, TargetHeld,
    TransferStats,
};
use std::ffi::c_char;
use std::sync::Arc;

/// `flags` of `mws_prepared_transfer_step_notified`: a content-verified step (the
/// CRC-32C of the bytes sent into each target, computed from the source buffers
/// before they move, in each `done`; device buffers are read through the transfer
/// engine's device engine).
pub const MWS_STEP_VERIFY_CONTENT: u32 = 1;

/// The inbox of one target participant for delta steps
/// (`mws_prepared_transfer_enable_delta`): a host buffer of the target side,
/// registered with the target's engine, into which the sources write their encoded
/// deltas (each writer its own slot). `participant_id` is read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_delta_inbox {
    /// The target participant.
    pub participant_id: *const c_char,
    /// First byte (a target-side host address).
    pub address: u64,
    /// Bytes.
    pub capacity: u64,
}

/// What a target verifiably holds (`mws_notify_acceptor_held_generation` on the
/// target side), told to a delta step. `participant_id` is read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_target_held {
    /// The target participant.
    pub participant_id: *const c_char,
    /// The weight generation its bytes hold.
    pub weight_generation: u64,
}

/// What the last delta step of a prepared transfer sent
/// (`mws_prepared_transfer_delta_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_delta_stats {
    /// The step's weight generation.
    pub weight_generation: u64,
    /// Targets sent the changed elements.
    pub delta_targets: u64,
    /// Targets sent every byte.
    pub full_targets: u64,
    /// Bytes moved into the targets.
    pub wire_bytes: u64,
    /// Bytes the targets hold after the step (what a full step moves).
    pub logical_bytes: u64,
    /// Elements changed in the delta targets.
    pub changed_elements: u64,
}

/// The C form of a delta report (what a delta step sent, or a publication).
pub(crate) fn delta_stats(r: &DeltaReport) -> mws_delta_stats {
    let delta = r.targets.iter().filter(|t| t.base_generation.is_some()).count() as u64;
    mws_delta_stats {
        weight_generation: r.weight_generation,
        delta_targets: delta,
        full_targets: r.targets.len() as u64 - delta,
        wire_bytes: r.wire_bytes(),
        logical_bytes: r.logical_bytes(),
        changed_elements: r.targets.iter().map(|t| t.changed_elements).sum(),
    }
}

/// A transfer prepared once for many steps. Live (`mws_sink_prepare`,
/// `mws_loader_prepare_live`): the checks of one call, its lowered engine batches and
/// its own memory registration are kept, and each `mws_prepared_transfer_step` moves
/// one weight generation after the freshness checks (engine identity, rotated leases,
/// one pin per binding through the guard; an observed binding that differs is refused
/// with "prepare the transfer again"). Stored (`mws_loader_prepare_stored`): each step
/// restores the revision / weight generation it names, of the prepared layout.
///
/// Created by `mws_sink_prepare`, `mws_loader_prepare_live` or
/// `mws_loader_prepare_stored`, freed by
/// `mws_prepared_transfer_free` (which unregisters the memory the preparation
/// registered). Steps report through the sink's or loader's cancellation flag and
/// progress callback, and through `mws_prepared_transfer_last_report`. A live step
/// may also start without blocking (`mws_prepared_transfer_step_start`). Thread
/// safety: steps of one prepared transfer run one at a time (a concurrent
/// `mws_prepared_transfer_step` waits, a concurrent started step is refused); the
/// handle may be used from any thread.
pub struct mws_prepared_transfer {
    pub(crate) inner: Prepared,
    report: LastReport,
}

/// A live transfer or a stored restore.
pub(crate) enum Prepared {
    Live(Arc<PreparedTransfer>),
    Stored(Box<PreparedRestore>),
}

handle!(mws_prepared_transfer);

impl mws_prepared_transfer {
    pub(crate) fn new(inner: PreparedTransfer) -> mws_prepared_transfer {
        mws_prepared_transfer { inner: Prepared::Live(Arc::new(inner)), report: LastReport::default() }
    }
    pub(crate) fn stored(inner: PreparedRestore) -> mws_prepared_transfer {
        mws_prepared_transfer { inner: Prepared::Stored(Box::new(inner)), report: LastReport::default() }
    }
}

/// A runtime lease of one prepared binding that rotated: its owner moved the lease
/// fence on (`lease_id`, `lease_generation`) while the buffers stayed where they were
/// prepared (and, when pre-registered, re-registered them for the new lease). Strings
/// are only read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_lease_rotation {
    /// The binding's instance (as prepared).
    pub instance_id: *const c_char,
    /// The binding's participant.
    pub participant_id: *const c_char,
    /// The new lease id (non-empty).
    pub lease_id: *const c_char,
    /// The new lease generation.
    pub lease_generation: u64,
}

/// The arguments of one step (`mws_prepared_transfer_step`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_step_args {
    /// The weight generation the step moves (its report's targets are updated to it).
    pub weight_generation: u64,
    /// `n_leases` leases rotated since the previous step (NULL when 0); each holds
    /// for the later steps too.
    pub leases: *const mws_lease_rotation,
    /// Number of entries of `leases`.
    pub n_leases: usize,
    /// Transfer id handed to the guard (NULL: a fresh random id).
    pub transfer_id: *const c_char,
    /// The revision a stored restore's step reads (NULL: the prepared one). Must be
    /// NULL for a live transfer.
    pub revision: *const c_char,
}

/// What a prepared transfer holds (`mws_prepared_transfer_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mws_prepared_info {
    /// 1 when a step has nothing to do (an unplanned participant, no local operations).
    pub empty: u32,
    /// Engine batches one step submits (0 for a stored restore).
    pub batches: u64,
    /// Bindings one step pins.
    pub pinned_bindings: u64,
    /// Bytes one step moves.
    pub bytes: u64,
}

/// Moves one weight generation through the prepared transfer. Live: checks that the
/// engine did not restart, applies the rotated leases, pins every prepared binding
/// through the guard (the static guard, and a C guard that reports no observed
/// binding, vouch for it in O(1); an observed binding is compared with the prepared
/// one), then runs the prepared batches and releases the pins. Stored: restores
/// revision `args->revision` (NULL: the prepared one), generation
/// `args->weight_generation` (see `mws_loader_prepare_stored`; no report, no lease
/// rotation). Writes the step's statistics to
/// `*stats` when not NULL; successful or not, the step's report is then
/// `mws_prepared_transfer_last_report` (each target updated to
/// `args->weight_generation`, or unchanged when the step failed before any batch).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STALE_BINDING` ("prepared transfer is stale:
/// ...; prepare the transfer again": the engine restarted, a participant runs as
/// another instance, the guard observed another placement, instance, lease,
/// generation or other addresses, or freed buffers, or the registrations are held by
/// a pending transfer), `MWS_INVALID_ARGUMENT` (a rotation names no prepared binding;
/// guard failures), `MWS_STORE` (closed, cancellation, engine failures, completion
/// unknown: the message names the pending transfer; see `mws_transfer_engine_drain`);
/// stored: `MWS_NOT_FOUND` (nothing committed at that revision / generation) and the
/// errors of `mws_store_load`.
///
/// # Safety
/// `prepared` is NULL or live; `args` is NULL or valid, with `n_leases` valid entries;
/// `stats` is NULL or valid for a write. Every buffer of the prepared bindings, local
/// and remote, is valid at its prepared address for the step (and, when completion is
/// unknown, until the pending transfer is drained), and the guard pins it.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_step(
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| step(c, prepared, args, None, stats))
}

/// The rotated leases of `args`, read for the call.
pub(crate) fn leases<'a>(c: Caller<'a>, a: &'a mws_step_args) -> FfiResult<Vec<LeaseRotation<'a>>> {
    let mut leases = Vec::new();
    for (i, l) in c.slice(a.leases, a.n_leases, "args.leases")?.iter().enumerate() {
        leases.push(LeaseRotation {
            instance_id: c.str(l.instance_id, &format!("args.leases[{i}].instance_id"))?,
            participant_id: c.str(l.participant_id, &format!("args.leases[{i}].participant_id"))?,
            lease_id: c.str(l.lease_id, &format!("args.leases[{i}].lease_id"))?,
            lease_generation: l.lease_generation,
        });
    }
    Ok(leases)
}

/// The request of a step (`args` and its rotated leases), read for the call.
pub(crate) fn request<'a>(
    c: Caller<'a>,
    a: &'a mws_step_args,
    leases: &'a [LeaseRotation<'a>],
) -> FfiResult<StepRequest<'a>> {
    Ok(StepRequest {
        weight_generation: a.weight_generation,
        leases,
        transfer_id: c.opt_str(a.transfer_id, "args.transfer_id")?,
        revision: c.opt_str(a.revision, "args.revision")?,
    })
}

/// The held generations of a delta step, read for the call.
pub(crate) fn held<'a>(c: Caller<'a>, p: *const mws_target_held, n: usize) -> FfiResult<Vec<TargetHeld<'a>>> {
    let mut out = Vec::with_capacity(n);
    for (i, h) in c.slice(p, n, "held")?.iter().enumerate() {
        let participant_id = c.str(h.participant_id, &format!("held[{i}].participant_id"))?;
        out.push(TargetHeld { participant_id, weight_generation: h.weight_generation });
    }
    Ok(out)
}

/// Enables delta steps of a prepared sink (`mws_prepared_transfer_step_delta`, or a
/// started step with `MWS_STEP_DELTA`): `inboxes` (`n` entries) names the inbox of
/// every target participant it writes (others are ignored, so one list may serve
/// every prepared sink of a process). Allocates a base (a host copy of the bytes
/// sent into each target, as large as a step's bytes) and an outbox per target (its
/// slot of the inbox, registered with the engine until the close). The first step
/// after it sends every byte. Calling it again replaces the inboxes and forgets the
/// bases. Waits for a running step.
///
/// Errors (nothing changes): `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (a prepared
/// reader or restore, a target without an inbox, an inbox named twice, a slot under
/// 64 bytes, closed), `MWS_UNSUPPORTED` (a target written at several endpoints,
/// device memory while the transfer engine has no device engine: see
/// `mws_transfer_engine_new_local_device`, `mws_transfer_engine_from_vtable_device`),
/// `MWS_STORE` (an outbox registration refused). Device source buffers are staged
/// through the transfer engine's device engine at each step (a second host copy of
/// their bytes).
///
/// # Safety
/// `prepared` is NULL or live; `inboxes` is NULL (with `n` 0) or `n` valid entries
/// whose strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_enable_delta(
    prepared: *const mws_prepared_transfer,
    inboxes: *const mws_delta_inbox,
    n: usize,
) -> mws_status {
    status_call!(|c| {
        let p = live(c.handle(prepared, "prepared")?)?;
        let mut named = Vec::with_capacity(n);
        for (i, b) in c.slice(inboxes, n, "inboxes")?.iter().enumerate() {
            let t = c.str(b.participant_id, &format!("inboxes[{i}].participant_id"))?;
            named.push((t, DeltaInbox { address: b.address, capacity: b.capacity }));
        }
        Ok(p.enable_delta(&named)?)
    })
}

/// A delta step of a prepared sink (after `mws_prepared_transfer_enable_delta`):
/// as `mws_prepared_transfer_step_notified` with `MWS_STEP_VERIFY_CONTENT`, but each
/// target that holds the generation of the source's base (`held`, `n_held` entries:
/// what the targets' acceptors report) is sent only the elements that changed since,
/// into its inbox; the others every byte (full whenever in doubt). The targets'
/// acceptors apply and verify before they report updated.
/// `mws_prepared_transfer_delta_stats` then says what was sent.
///
/// Errors: as `mws_prepared_transfer_step_notified`; `MWS_INVALID_ARGUMENT` (delta
/// steps not enabled; a held entry's strings).
///
/// # Safety
/// As `mws_prepared_transfer_step_notified`; `held` is NULL (with `n_held` 0) or
/// `n_held` valid entries.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_step_delta(
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    key: *const u8,
    key_len: usize,
    held: *const mws_target_held,
    n_held: usize,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let notify = step_notify(c, key, key_len, MWS_STEP_VERIFY_CONTENT)?;
        let held = self::held(c, held, n_held)?;
        step_with(c, prepared, args, Some(notify), Some(&held), stats)
    })
}

/// Writes what the last delta step of a prepared sink sent to `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_NOT_FOUND` (no delta step yet).
///
/// # Safety
/// `prepared` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_delta_stats(
    prepared: *const mws_prepared_transfer,
    out: *mut mws_delta_stats,
) -> mws_status {
    status_call!(|c| {
        let p = live(c.handle(prepared, "prepared")?)?;
        let out = c.out(out, "out")?;
        let r = p.last_delta().ok_or_else(|| Failure::new(mws_status::MWS_NOT_FOUND, "no delta step yet"))?;
        out.give(delta_stats(&r))
    })
}

/// The live prepared transfer of a handle (a prepared restore has no started steps).
pub(crate) fn live(p: &mws_prepared_transfer) -> FfiResult<&Arc<PreparedTransfer>> {
    match &p.inner {
        Prepared::Live(live) => Ok(live),
        Prepared::Stored(_) => {
            Err(mws::Error::invalid("a prepared restore's steps do not start without blocking (use its step)").into())
        }
    }
}

/// The notify hook of a sink's step from its C form (`flags` checked).
pub(crate) fn step_notify<'a>(c: Caller<'a>, key: *const u8, key_len: usize, flags: u32) -> FfiResult<StepNotify<'a>> {
    if flags & !MWS_STEP_VERIFY_CONTENT != 0 {
        return Err(mws::Error::invalid(format!("unknown notify flags {flags:#x}")).into());
    }
    let key = key_arg(c, key, key_len)?;
    Ok(StepNotify { key, verify_content: flags & MWS_STEP_VERIFY_CONTENT != 0 })
}

/// The body of the step entry points.
fn step(
    c: Caller<'_>,
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    notify: Option<StepNotify<'_>>,
    stats: *mut mws_transfer_stats,
) -> FfiResult<()> {
    step_with(c, prepared, args, notify, None, stats)
}

/// A step with its notify hook and delta (`None`: every byte).
fn step_with(
    c: Caller<'_>,
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    notify: Option<StepNotify<'_>>,
    delta: Option<&[TargetHeld<'_>]>,
    stats: *mut mws_transfer_stats,
) -> FfiResult<()> {
    let p = c.handle(prepared, "prepared")?;
    let a = c.struct_ref(args, "args")?;
    let leases = leases(c, a)?;
    let request = request(c, a, &leases)?;
    match &p.inner {
        Prepared::Live(live) => {
            let mut args = request.live()?;
            args.notify = notify;
            args.delta = delta;
            // SAFETY: the entry point's contract: every prepared buffer is valid and
            // pinned for the step (and until a pending transfer is drained).
            let result = unsafe { live.step(&args) };
            p.report.keep(c, result, stats)
        }
        Prepared::Stored(_) if notify.is_some() || delta.is_some() => {
            Err(mws::Error::invalid("a prepared restore's step notifies no one (notified steps are for sinks)").into())
        }
        Prepared::Stored(stored) => {
            let args = request.stored()?;
            // SAFETY: the entry point's contract: the prepared target buffers are
            // valid for writes and untouched by anyone else during the step.
            let s = unsafe { stored.step(&args) }?;
            c.opt_set(stats, stats_c(TransferStats::from(&s)));
            Ok(())
        }
    }
}

/// `mws_prepared_transfer_step` of a prepared sink with the notify hook, as
/// `mws_sink_execute_notified` for a call: after the step's freshness checks and
/// pins, sends `begin` to every endpoint of every target participant the local
/// source executor writes (through the engine's `send_notify`), runs the prepared
/// batches, and sends `done` to the same endpoints when they all completed. Every
/// message carries the step's weight generation (`args->weight_generation`) and
/// transfer id (`args->transfer_id` or a fresh one) under the prepared plan's
/// identity; the targets' acceptors follow the newest generation of the plan.
/// `key`/`key_len`: NULL and 0, or the key shared with the targets' acceptors (at
/// least 16 bytes). `flags`: 0 or `MWS_STEP_VERIFY_CONTENT` (the `done` carries
/// the CRC-32C of the bytes sent into each target, computed from the source buffers
/// before they move; device buffers read through the transfer engine's device
/// engine). `stats` and the report as
/// `mws_prepared_transfer_step`.
///
/// Errors: as `mws_prepared_transfer_step`; `MWS_INVALID_ARGUMENT` (a prepared
/// reader or restore: their steps notify no one; a key shorter than 16 bytes;
/// unknown flags), `MWS_UNSUPPORTED` (the engine's vtable has no `send_notify`, or a
/// verified step of a device source buffer on an engine without a device engine;
/// before any byte moves), `MWS_STORE`
/// when a `begin` could not be delivered (nothing was written) or a `done` could not
/// be delivered (the bytes landed; the targets stay torn until a later step
/// completes). Thread safety: as `mws_prepared_transfer_step`.
///
/// # Safety
/// As `mws_prepared_transfer_step`; `key` is NULL or points to `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_step_notified(
    prepared: *const mws_prepared_transfer,
    args: *const mws_step_args,
    key: *const u8,
    key_len: usize,
    flags: u32,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|c| {
        let notify = step_notify(c, key, key_len, flags)?;
        step(c, prepared, args, Some(notify), stats)
    })
}

/// Writes the report of the last step, successful or not, to `*out` (as
/// `mws_sink_last_report`; each target's generation is the step's weight
/// generation). Its pointers are borrowed from the prepared transfer until its next
/// step or its free.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_NOT_FOUND` (no step yet). Thread safety: not
/// concurrently with a step of the same prepared transfer.
///
/// # Safety
/// `prepared` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_last_report(
    prepared: *const mws_prepared_transfer,
    out: *mut mws_live_report,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(prepared, "prepared")?;
        let out = c.out(out, "out")?;
        out.give(p.report.get("no live step yet (a prepared restore has no live report)")?)
    })
}

/// Writes what the prepared transfer holds to `*out`: whether its steps have nothing
/// to do, the batches and bindings of one step, and its bytes.
///
/// Errors: `MWS_NULL_ARGUMENT`.
///
/// # Safety
/// `prepared` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_info(
    prepared: *const mws_prepared_transfer,
    out: *mut mws_prepared_info,
) -> mws_status {
    status_call!(|c| {
        let i = match &c.handle(prepared, "prepared")?.inner {
            Prepared::Live(p) => p.info(),
            Prepared::Stored(p) => p.info(),
        };
        let (empty, batches, pinned_bindings, bytes) = (u32::from(i.empty), i.batches, i.pinned_bindings, i.bytes);
        c.out(out, "out")?.give(mws_prepared_info { empty, batches, pinned_bindings, bytes })
    })
}

/// Closes the prepared transfer: unregisters the memory its preparation registered
/// (unless a pending transfer took it over, or the engine restarted) and refuses later
/// steps (`MWS_STORE`, "prepared transfer is closed"). Idempotent;
/// `mws_prepared_transfer_free` closes too but cannot report a failure.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STORE` (an unregistration failed: the addresses
/// are quarantined in a pending transfer that blocks the engine until drained).
///
/// # Safety
/// `prepared` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_close(prepared: *const mws_prepared_transfer) -> mws_status {
    status_call!(|c| {
        match &c.handle(prepared, "prepared")?.inner {
            Prepared::Live(p) => Ok(p.close()?),
            Prepared::Stored(_) => Ok(()),
        }
    })
}

/// Frees a prepared transfer (closing it first, as `mws_prepared_transfer_close`,
/// ignoring a failure); NULL does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `prepared` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_free(prepared: *mut mws_prepared_transfer) {
    value_call!((), |c| c.free(prepared))
}
