//! `mws_delta_publisher`: the source side of pulled delta steps (issue 47). Each
//! publication encodes, for every target executor the source executor feeds, the
//! elements that changed since the previous one into a registered outbox that the
//! servers' delta-enabled prepared readers read
//! (`mws_prepared_transfer_enable_delta_pull`). Translation only: the protocol lives
//! in `mws::protocol::transfer::delta_pull`.

use crate::boundary::mws_status;
use crate::boundary::{Failure, FfiResult};
use crate::engine::mws_transfer_engine;
use crate::prepared::{delta_stats, mws_delta_stats, mws_prepared_transfer, Prepared};
use crate::transfer_plan::mws_transfer_plan;
use mws::protocol::transfer::delta_pull::min_outbox_capacity;
use mws::protocol::transfer::{DeltaOutbox, DeltaPublisher, PreparedTransfer, SourceOutbox};
use std::ffi::{c_char, CString};
use std::sync::Arc;

/// The outbox of one source executor for pulled delta steps: a host buffer of the
/// source side, registered with the source's engine, that the readers read. Written
/// by `mws_delta_publisher_outbox` (its strings borrowed from the publisher until it
/// is freed); read by `mws_prepared_transfer_enable_delta_pull` (its strings read
/// during the call).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_delta_outbox {
    /// The source executor's participant.
    pub participant_id: *const c_char,
    /// The source executor's worker.
    pub worker_id: *const c_char,
    /// First byte (a source-side host address).
    pub address: u64,
    /// Bytes.
    pub capacity: u64,
}

/// Publishes each weight generation of one source executor for the readers of a
/// bound plan. Created by `mws_delta_publisher_new`, freed by
/// `mws_delta_publisher_free` (which unregisters its outbox). Keeps its own
/// reference to the transfer engine and a copy of the plan. Thread safety: every
/// function may be called from any thread; publications are serialized inside.
pub struct mws_delta_publisher {
    inner: DeltaPublisher,
    participant: CString,
    worker: CString,
}

handle!(mws_delta_publisher);

/// Creates a publisher for the source executor of `participant_id` (its only one,
/// or the one of `worker_id`; NULL: the only one) under the bound `plan` (the plan
/// the readers prepared), with an outbox of `capacity` bytes allocated here,
/// registered with `engine` until the free, and split among the target executors it
/// feeds (each a 320-byte header and a share of the rest in proportion to its
/// bytes; `mws_delta_min_outbox_capacity` says the least). Device source buffers
/// are read through the engine's device engine (`mws_transfer_engine_new_local_device`,
/// `mws_transfer_engine_from_vtable_device`). Nothing is published until
/// `mws_delta_publisher_publish`. New handle in `*out`.
///
/// Errors (nothing kept): `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`,
/// `MWS_INVALID_ARGUMENT` (a logical plan, not a source participant of the plan,
/// several executors and no worker, an unknown worker, a capacity under the least),
/// `MWS_LIMIT_EXCEEDED` (a capacity that cannot be allocated), `MWS_UNSUPPORTED`
/// (device source buffers and no device engine), `MWS_STORE` (the engine refused to
/// register the outbox). Thread safety: any thread.
///
/// # Safety
/// `plan` and `engine` are NULL or live; `participant_id` is NULL or NUL-terminated;
/// `worker_id` is NULL or NUL-terminated; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_delta_publisher_new(
    plan: *const mws_transfer_plan,
    participant_id: *const c_char,
    worker_id: *const c_char,
    engine: *const mws_transfer_engine,
    capacity: u64,
    out: *mut *mut mws_delta_publisher,
) -> mws_status {
    status_call!(|c| {
        let bound = c.handle(plan, "plan")?.bound()?;
        let participant = c.str(participant_id, "participant_id")?;
        let worker = c.opt_str(worker_id, "worker_id")?;
        let engine = c.handle(engine, "engine")?.engine.clone();
        let out = c.out(out, "out")?;
        let inner = DeltaPublisher::new(bound, participant, worker, engine, capacity)?;
        let (p, w) = inner.executor();
        let cstr = |s: &str| CString::new(s).map_err(|_| mws::Error::invalid("an executor id holds a NUL byte"));
        let (participant, worker) = (cstr(p)?, cstr(w)?);
        out.give_handle(mws_delta_publisher { inner, participant, worker })
    })
}

/// Writes the least outbox capacity of the source executor of `participant_id`
/// (`worker_id` as for `mws_delta_publisher_new`) under `plan` to `*out`: a header
/// and 64 bytes of records per target executor it feeds.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (a logical
/// plan, not a source executor of the plan). Thread safety: any thread.
///
/// # Safety
/// `plan` is NULL or live; the strings are NULL or NUL-terminated (`worker_id` may be
/// NULL); `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_delta_min_outbox_capacity(
    plan: *const mws_transfer_plan,
    participant_id: *const c_char,
    worker_id: *const c_char,
    out: *mut u64,
) -> mws_status {
    status_call!(|c| {
        let bound = c.handle(plan, "plan")?.bound()?;
        let participant = c.str(participant_id, "participant_id")?;
        let worker = c.opt_str(worker_id, "worker_id")?;
        let out = c.out(out, "out")?;
        let mine: Vec<_> = bound
            .executors(mws::plan::transfer_bind::Side::Source)
            .iter()
            .filter(|e| e.participant_id == participant && worker.is_none_or(|w| e.worker_id == w))
            .collect();
        let [e] = mine[..] else {
            return Err(mws::Error::invalid(format!(
                "{participant} has {} source executors{} in this plan (one needed)",
                mine.len(),
                worker.map(|w| format!(" of worker {w}")).unwrap_or_default()
            ))
            .into());
        };
        out.give(min_outbox_capacity(bound, (&e.participant_id, &e.worker_id)))
    })
}

/// Writes the publisher's outbox to `*out` (its source executor's participant and
/// worker, borrowed from the publisher until it is freed): what the readers need,
/// told to them out of band.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread.
///
/// # Safety
/// `publisher` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_delta_publisher_outbox(
    publisher: *const mws_delta_publisher,
    out: *mut mws_delta_outbox,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(publisher, "publisher")?;
        let out = c.out(out, "out")?;
        let o = p.inner.outbox();
        out.give(mws_delta_outbox {
            participant_id: p.participant.as_ptr(),
            worker_id: p.worker.as_ptr(),
            address: o.address,
            capacity: o.capacity,
        })
    })
}

/// Publishes weight generation `weight_generation`: what the source executor's
/// buffers hold now, for every target executor it feeds (the elements that changed
/// since the previous publication when they fit its slot, else none: its readers
/// pull every byte; and the CRC-32C of the new bytes). Call it once the trainer's
/// buffers hold the generation and before the readers step it; do not write the
/// buffers or publish again until the readers are done. Writes what was published
/// to `*stats` (optional; `delta_targets`: target executors given a delta,
/// `wire_bytes`: what the readers will pull).
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (the transfer engine
/// restarted since the publisher was made), a device engine's error (the readers
/// then fail their steps until the next publication). Thread safety: any thread;
/// publications are serialized.
///
/// # Safety
/// `publisher` is NULL or live; the source executor's buffers are valid for reads at
/// their bound addresses and not written during the call; `stats` is NULL or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_delta_publisher_publish(
    publisher: *const mws_delta_publisher,
    weight_generation: u64,
    stats: *mut mws_delta_stats,
) -> mws_status {
    status_call!(|c| {
        let p = c.handle(publisher, "publisher")?;
        // SAFETY: the entry point's contract.
        let r = unsafe { p.inner.publish(weight_generation) }?;
        c.opt_set(stats, delta_stats(&r));
        Ok(())
    })
}

/// Frees a publisher (unregisters its outbox: readers reading it from then on
/// fail); NULL does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running.
///
/// # Safety
/// `publisher` is NULL or a live handle not yet freed; no call starts on it once
/// this returns.
#[no_mangle]
pub unsafe extern "C" fn mws_delta_publisher_free(publisher: *mut mws_delta_publisher) {
    value_call!((), |c| c.free(publisher))
}

/// Enables pulled delta steps of a prepared reader (`mws_loader_prepare_live`):
/// `outboxes` (`n` entries) names the outbox of every source executor it reads, each
/// published by a `mws_delta_publisher` on the source side
/// (`mws_delta_publisher_outbox`; entries of other executors are ignored, so one
/// list may serve every reader of a server). Allocates a staging buffer (the reader's
/// slots of those outboxes, host memory, registered with the engine until the free).
/// From then on every `mws_prepared_transfer_step` of it reads the publications'
/// headers first, refuses a generation not yet published (`MWS_CONFLICT`, before
/// any target byte moves), pulls only the changed elements from the sources whose
/// base it holds (`mws_prepared_transfer_held_generation`) and every byte from the
/// others, applies them and verifies its ranges against the publications'
/// checksums: a mismatch fails the step `MWS_INTEGRITY` with the target torn, and
/// the next step pulls every byte. `mws_prepared_transfer_delta_stats` says what the
/// last step pulled. Calling it again replaces the outboxes and forgets what the
/// reader holds. Waits for a running step.
///
/// Errors (nothing changes): `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`,
/// `MWS_INVALID_ARGUMENT` (a prepared sink or restore, a source executor without an
/// outbox, an outbox named twice, an outbox under its least capacity, closed),
/// `MWS_UNSUPPORTED` (a source executor read at several endpoints; device target
/// buffers while the transfer engine has no device engine), `MWS_LIMIT_EXCEEDED` (a
/// staging buffer that cannot be allocated), `MWS_STORE` (the staging registration
/// refused).
///
/// # Safety
/// `prepared` is NULL or live; `outboxes` is NULL (with `n` 0) or `n` valid entries
/// whose strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_enable_delta_pull(
    prepared: *const mws_prepared_transfer,
    outboxes: *const mws_delta_outbox,
    n: usize,
) -> mws_status {
    status_call!(|c| {
        let p = live_only(c.handle(prepared, "prepared")?)?;
        let mut named = Vec::with_capacity(n);
        for (i, o) in c.slice(outboxes, n, "outboxes")?.iter().enumerate() {
            named.push(SourceOutbox {
                participant_id: c.str(o.participant_id, &format!("outboxes[{i}].participant_id"))?,
                worker_id: c.str(o.worker_id, &format!("outboxes[{i}].worker_id"))?,
                outbox: DeltaOutbox { address: o.address, capacity: o.capacity },
            });
        }
        Ok(p.enable_delta_pull(&named)?)
    })
}

/// Writes the weight generation a delta-enabled prepared reader's buffers hold,
/// verified by content against the sources' publications and untouched by a step
/// since, to `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (a prepared restore),
/// `MWS_NOT_FOUND` (none: not delta-enabled, before its first verified step, after a
/// failed or torn one). Thread safety: any thread.
///
/// # Safety
/// `prepared` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_prepared_transfer_held_generation(
    prepared: *const mws_prepared_transfer,
    out: *mut u64,
) -> mws_status {
    status_call!(|c| {
        let p = live_only(c.handle(prepared, "prepared")?)?;
        let out = c.out(out, "out")?;
        let g = p.held_generation().ok_or_else(|| {
            Failure::new(mws_status::MWS_NOT_FOUND, "the reader holds no verified generation of pulled delta steps")
        })?;
        out.give(g)
    })
}

/// A live prepared transfer (pulled delta steps are for prepared readers).
fn live_only(p: &mws_prepared_transfer) -> FfiResult<&Arc<PreparedTransfer>> {
    match &p.inner {
        Prepared::Live(live) => Ok(live),
        Prepared::Stored(_) => {
            Err(mws::Error::invalid("pulled delta steps are for prepared live readers, not restores").into())
        }
    }
}
