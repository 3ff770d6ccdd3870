//! The notify hook (issue 27) in C: `mws_sink_execute_notified` (a sink call that
//! tells every target engine, through the engine's `send_notify`, `begin` before it
//! writes and `done` after it returned) and `mws_notify_acceptor` (the target side:
//! checks each message its engine's notify poll received against its own bound plan
//! and generation and keeps the per-target outcome). Translation only: the protocol,
//! the message format and every rule live in `mws::protocol::transfer::notify`.
//!
//! How a serving engine wires it (Mooncake TE): on every notify poll
//! (`TransferEngine::getNotifies`), hand each `NotifyDesc` whose `name` equals
//! `mws_notify_name()` to `mws_notify_acceptor_accept` of the acceptor bound to the
//! plan of the generation it is about to serve; serve generation G only once
//! `mws_notify_acceptor_outcome` says `MWS_TARGET_UPDATED` with generation G.

use std::ffi::c_char;

use parking_lot::Mutex;

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::handles::{handle, mws_binding, mws_placement, Handle};
use crate::loader::{leases_of, live_args, mws_live_args, mws_sink, mws_transfer_stats, transfer_failure};
use crate::strings::{check_out, slice_arg, str_arg, write_out};
use crate::transfer_plan::{bindings_arg, mws_transfer_plan};
use mws::plan::transfer_bind::Side;
use mws::protocol::transfer::notify::{execute_sink_notified, NotifyAcceptor, NotifyError, NOTIFY_NAME};
use mws::protocol::transfer::{ExecutionStats, SinkArgs, TargetOutcome};

/// `mws_target_outcome.kind`: no writer announced anything; the participant holds
/// its previous contents.
pub const MWS_TARGET_UNCHANGED: u32 = 0;
/// `mws_target_outcome.kind`: every writer the plan routes into the participant
/// reported its call done; it may serve `generation`.
pub const MWS_TARGET_UPDATED: u32 = 1;
/// `mws_target_outcome.kind`: some writer began and has not reported done (or is
/// missing while others wrote): the participant's bytes are undefined.
pub const MWS_TARGET_TORN: u32 = 2;

/// `*verdict` of `mws_notify_acceptor_accept`: accepted and recorded.
pub const MWS_NOTIFY_ACCEPTED: u32 = 0;
/// Refused: not a message of this format, unsupported version, bad header or body.
pub const MWS_NOTIFY_MALFORMED: u32 = 1;
/// Refused: shorter than its header says.
pub const MWS_NOTIFY_TRUNCATED: u32 = 2;
/// Refused: bad authenticator (no key, another key, corrupted), or claims the plan
/// does not make (a writer that does not write this target, other ranges, `done`
/// without `begin`).
pub const MWS_NOTIFY_FORGED: u32 = 3;
/// Refused: already accepted (same kind, writer and transfer id).
pub const MWS_NOTIFY_REPLAYED: u32 = 4;
/// Refused: an older generation, or a superseded transfer of the same writer.
pub const MWS_NOTIFY_STALE: u32 = 5;
/// Refused: another plan at the same generation, or a later generation.
pub const MWS_NOTIFY_OTHER_PLAN: u32 = 6;
/// Refused: addressed to another target participant.
pub const MWS_NOTIFY_MISROUTED: u32 = 7;

/// A participant's outcome for the acceptor's generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mws_target_outcome {
    /// `MWS_TARGET_UNCHANGED`, `MWS_TARGET_UPDATED` or `MWS_TARGET_TORN`.
    pub kind: u32,
    /// The acceptor's generation (the plan's weight generation).
    pub generation: u64,
    /// Torn: the writers (source executors) whose calls are incomplete; else 0.
    pub incomplete: u64,
}

fn outcome_c(o: &TargetOutcome, generation: u64) -> mws_target_outcome {
    match o {
        TargetOutcome::Unchanged => mws_target_outcome { kind: MWS_TARGET_UNCHANGED, generation, incomplete: 0 },
        TargetOutcome::Updated { generation } => {
            mws_target_outcome { kind: MWS_TARGET_UPDATED, generation: *generation, incomplete: 0 }
        }
        TargetOutcome::Torn { incomplete } => {
            mws_target_outcome { kind: MWS_TARGET_TORN, generation, incomplete: incomplete.len() as u64 }
        }
    }
}

/// The target side of the notify hook for one participant under one bound plan
/// (hence one generation). Created by `mws_notify_acceptor_new`, freed by
/// `mws_notify_acceptor_free`. Thread safety: every function may be called from any
/// thread, concurrently (calls are serialized inside).
pub struct mws_notify_acceptor {
    inner: Mutex<NotifyAcceptor>,
}

impl Handle for mws_notify_acceptor {}

/// A key argument: (NULL, 0) = unkeyed; else the bytes.
///
/// # Safety
/// `key` is NULL or points to `key_len` readable bytes.
unsafe fn key_arg<'a>(key: *const u8, key_len: usize) -> FfiResult<Option<&'a [u8]>> {
    if key.is_null() && key_len == 0 {
        return Ok(None);
    }
    // SAFETY: the caller's contract (this function's `# Safety`).
    let k = unsafe { slice_arg(key, key_len, "key") }?;
    if k.is_empty() {
        return Err(Failure::invalid("notify key must be at least 16 bytes, got 0"));
    }
    Ok(Some(k))
}

/// The notify name (Mooncake's `NotifyDesc::name`) of this library's messages: a
/// static NUL-terminated string. A notify poll hands messages with exactly this name
/// to `mws_notify_acceptor_accept`. Never fails; any thread.
#[no_mangle]
pub extern "C" fn mws_notify_name() -> *const c_char {
    static NAME: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    NAME.get_or_init(|| std::ffi::CString::new(NOTIFY_NAME).expect("no NUL in the notify name")).as_ptr()
}

/// Creates an acceptor for `target_participant` under `plan` (a bound plan: the one
/// the target bound for the generation it is about to serve). `key`/`key_len`: NULL
/// and 0 for unkeyed messages (each carries a SHA-256 of its body), or the key
/// shared with the sinks (at least 16 bytes; HMAC-SHA256; copied). New handle in
/// `*out`; its outcome starts `MWS_TARGET_UNCHANGED`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (a logical
/// plan, a key shorter than 16 bytes, a participant that is not a target of the
/// plan). Thread safety: any thread.
///
/// # Safety
/// `plan` is NULL or live; `target_participant` is NULL or NUL-terminated; `key` is
/// NULL or points to `key_len` bytes; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_new(
    plan: *const mws_transfer_plan,
    target_participant: *const c_char,
    key: *const u8,
    key_len: usize,
    out: *mut *mut mws_notify_acceptor,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        let bound = p.bound()?;
        // SAFETY: NULL or NUL-terminated (this function's contract).
        let participant = unsafe { str_arg(target_participant, "target_participant") }?;
        check_out(out, "out")?;
        // SAFETY: this function's contract.
        let key = unsafe { key_arg(key, key_len) }?;
        let acceptor = NotifyAcceptor::new(bound, participant, key)?;
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, Handle::into_raw(mws_notify_acceptor { inner: Mutex::new(acceptor) })) };
        Ok(())
    })
}

fn refusal_status(e: NotifyError) -> (u32, Failure) {
    let verdict = e.refusal as u32;
    (verdict, Failure::from(mws::Error::from(e)))
}

/// Checks one received notification (`message`, `len` bytes: the `notify_msg` of a
/// `NotifyDesc` whose name is `mws_notify_name()`) against the acceptor's plan,
/// generation and participant, and records it when accepted. Writes the verdict
/// (`MWS_NOTIFY_*`) to `*verdict` and the outcome after the call to `*outcome` (both
/// optional, written on success and on refusal). A refused message changes nothing.
///
/// Errors: `MWS_NULL_ARGUMENT`; refusals: `MWS_INVALID_ARGUMENT` (malformed,
/// truncated, misrouted), `MWS_INTEGRITY` (forged), `MWS_CONFLICT` (replayed),
/// `MWS_STALE_BINDING` (stale, other plan); the message says exactly why. Thread
/// safety: any thread; concurrent calls are serialized.
///
/// # Safety
/// `acceptor` is NULL or live; `message` is NULL or points to `len` bytes;
/// `verdict` and `outcome` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_accept(
    acceptor: *const mws_notify_acceptor,
    message: *const u8,
    len: usize,
    verdict: *mut u32,
    outcome: *mut mws_target_outcome,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `acceptor` is NULL or a live handle of this type (this function's contract).
        let a = unsafe { handle(acceptor, "acceptor") }?;
        // SAFETY: this function's contract.
        let bytes = unsafe { slice_arg(message, len, "message") }?;
        let mut acc = a.inner.lock();
        let result = acc.accept(bytes);
        let o = outcome_c(&acc.outcome(), acc.generation());
        let (v, r) = match result {
            Ok(_) => (0, Ok(())),
            Err(e) => {
                let (v, f) = refusal_status(e);
                (v, Err(f))
            }
        };
        if !verdict.is_null() {
            // SAFETY: non-NULL and valid for a write (this function's contract).
            unsafe { write_out(verdict, v) };
        }
        if !outcome.is_null() {
            // SAFETY: non-NULL and valid for a write (this function's contract).
            unsafe { write_out(outcome, o) };
        }
        r
    })
}

/// Writes the participant's outcome from the messages accepted so far to `*out`
/// (`MWS_TARGET_UPDATED` only once every writer the plan routes into it reported
/// done for its latest transfer).
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread.
///
/// # Safety
/// `acceptor` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_outcome(
    acceptor: *const mws_notify_acceptor,
    out: *mut mws_target_outcome,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `acceptor` is NULL or a live handle of this type (this function's contract).
        let a = unsafe { handle(acceptor, "acceptor") }?;
        check_out(out, "out")?;
        let acc = a.inner.lock();
        // SAFETY: `out` was checked non-NULL and is valid for a write (this function's contract).
        unsafe { write_out(out, outcome_c(&acc.outcome(), acc.generation())) };
        Ok(())
    })
}

/// Frees an acceptor; NULL does nothing.
///
/// # Safety
/// `acceptor` is NULL or a live handle not yet freed and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_free(acceptor: *mut mws_notify_acceptor) {
    value_call!((), || {
        // SAFETY: `acceptor` is NULL or a live handle that is not used again (this function's contract).
        unsafe { Handle::free(acceptor) };
        Ok(())
    })
}

/// `mws_sink_execute` with the notify hook: after the stale-lease and
/// stale-generation checks (no engine call), sends `begin` to every endpoint of every
/// target participant the local source executor writes (through the engine's
/// `send_notify`), runs the sink call, and sends `done` to the same endpoints when
/// it returned normally. `key`/`key_len`: NULL and 0, or the key shared with the
/// targets' acceptors (at least 16 bytes). The transfer id is `args->transfer_id` or
/// a fresh one. Other arguments, `stats` and safety as `mws_sink_execute`.
///
/// Errors: as `mws_sink_execute`; `MWS_STALE_BINDING` before any engine call;
/// `MWS_UNSUPPORTED` when the engine's vtable has no `send_notify` (before any
/// transfer); `MWS_STORE` when a `begin` could not be delivered (nothing was
/// written) or a `done` could not be delivered (the bytes landed; that target stays
/// Torn until a later call completes). Thread safety: as `mws_sink_execute`.
///
/// # Safety
/// As `mws_sink_execute`; `key` is NULL or points to `key_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mws_sink_execute_notified(
    sink: *const mws_sink,
    key: *const u8,
    key_len: usize,
    plan: *const mws_transfer_plan,
    source_placement: *const mws_placement,
    source_binding: *const mws_binding,
    target_placement: *const mws_placement,
    target_bindings: *const *const mws_binding,
    n_targets: usize,
    args: *const mws_live_args,
    stats: *mut mws_transfer_stats,
) -> mws_status {
    status_call!(|| {
        // SAFETY: `sink` is NULL or a live handle of this type (this function's contract).
        let s = &unsafe { handle(sink, "sink") }?.inner;
        // SAFETY: `plan` is NULL or a live handle of this type (this function's contract).
        let p = unsafe { handle(plan, "plan") }?;
        let bound = p.bound()?;
        // SAFETY: `source_placement` is NULL or a live handle of this type (this function's contract).
        let sp = unsafe { handle(source_placement, "source_placement") }?;
        // SAFETY: `target_placement` is NULL or a live handle of this type (this function's contract).
        let tp = unsafe { handle(target_placement, "target_placement") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let source = unsafe { bindings_arg(&source_binding, 1, "source_binding") }?.remove(0);
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let targets = unsafe { bindings_arg(target_bindings, n_targets, "target_bindings") }?;
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        let call = unsafe { live_args(args) }?;
        // SAFETY: this function's contract.
        let key = unsafe { key_arg(key, key_len) }?;
        let tl = leases_of(&targets);
        let sl = leases_of(std::slice::from_ref(&source));
        let exec_stats = ExecutionStats::default();
        let sargs = SinkArgs {
            source_worker_id: call.worker.as_deref(),
            target_registrations: Some(&tl),
            source_pre_registered: call.pre_registered,
            source_registrations: call.pre_registered.then_some(sl.as_slice()),
            source_guards: Some(&call.guards),
            target_guards: Some(&call.guards),
            transfer_id: call.transfer_id.as_deref(),
            cancel: Some(&s.cancel),
            progress: None,
            stats: Some(&exec_stats),
        };
        let done =
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            unsafe { execute_sink_notified(&s.exec, key, bound, &sp.inner, &source, &tp.inner, &targets, &sargs) }
                .map_err(transfer_failure)?;
        s.record(p, Side::Source, &done.receipts, &source, &exec_stats);
        if !stats.is_null() {
            // SAFETY: `stats` was checked non-NULL and is valid for a write (this function's contract).
            unsafe { write_out(stats, *s.stats.lock()) };
        }
        Ok(())
    })
}
