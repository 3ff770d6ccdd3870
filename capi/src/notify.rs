//! The notify hook (issue 27) in C, target side: `mws_notify_acceptor` checks each
//! message its engine's notify poll received against its own bound plan and
//! generation and keeps the per-target outcome. The sink side,
//! `mws_sink_execute_notified`, is a sink call (`sink.rs`). Translation only: the
//! protocol, the message format and every rule live in
//! `mws::protocol::transfer::notify`.
//!
//! How a serving engine wires it (Mooncake TE): on every notify poll
//! (`TransferEngine::getNotifies`), hand each `NotifyDesc` whose `name` equals
//! `mws_notify_name()` to `mws_notify_acceptor_accept` of the acceptor bound to the
//! plan of the generation it is about to serve; serve generation G only once
//! `mws_notify_acceptor_outcome` says `MWS_TARGET_UPDATED` with generation G.

use crate::args::Caller;
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::live::verdict;
use crate::transfer_plan::mws_transfer_plan;
use mws::protocol::transfer::notify::{NotifyAcceptor, NOTIFY_NAME};
use mws::protocol::transfer::TargetOutcome;
use parking_lot::Mutex;
use std::ffi::c_char;

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
/// Refused: a `begin` of a new transfer from a writer that already began
/// `MWS_NOTIFY_MAX_TRANSFERS_PER_WRITER` under this acceptor (its replay memory is
/// bounded); bind a new acceptor.
pub const MWS_NOTIFY_TOO_MANY: u32 = 8;
/// The transfers one writer may begin under one acceptor (`MWS_NOTIFY_TOO_MANY`).
pub const MWS_NOTIFY_MAX_TRANSFERS_PER_WRITER: u32 = 1024;
const _: () = assert!(
    MWS_NOTIFY_MAX_TRANSFERS_PER_WRITER as usize == mws::protocol::transfer::notify::MAX_TRANSFERS_PER_WRITER
        && MWS_NOTIFY_TOO_MANY == mws::protocol::transfer::notify::NotifyRefusal::TooMany as u32
);

/// A participant's outcome for the acceptor's generation, from the notifications
/// accepted so far.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mws_notify_outcome {
    /// An `mws_target_verdict` value: `MWS_TARGET_UNCHANGED` (no writer announced
    /// anything: the previous contents stand), `MWS_TARGET_UPDATED` (every writer the
    /// plan routes into the participant reported its call done: it may serve
    /// `weight_generation`) or `MWS_TARGET_TORN` (a writer began and has not reported done:
    /// the bytes are undefined).
    pub verdict: u32,
    /// The acceptor's weight generation (the plan's).
    pub weight_generation: u64,
    /// Torn: the writers (source executors) whose calls are incomplete; else 0.
    pub incomplete: u64,
}

fn outcome_c(o: &TargetOutcome, bound: u64) -> mws_notify_outcome {
    let (weight_generation, incomplete) = match o {
        TargetOutcome::Unchanged => (bound, 0),
        TargetOutcome::Updated { weight_generation } => (*weight_generation, 0),
        TargetOutcome::Torn { incomplete } => (bound, incomplete.len() as u64),
    };
    mws_notify_outcome { verdict: verdict(o) as u32, weight_generation, incomplete }
}

/// The target side of the notify hook for one participant under one bound plan
/// (hence one generation). Created by `mws_notify_acceptor_new`, freed by
/// `mws_notify_acceptor_free`. Thread safety: every function may be called from any
/// thread, concurrently (calls are serialized inside).
pub struct mws_notify_acceptor {
    inner: Mutex<NotifyAcceptor>,
}

handle!(mws_notify_acceptor);

/// A key argument: (NULL, 0) = unkeyed; else the bytes (at least 16: checked by the
/// core, which words the error).
pub(crate) fn key_arg<'a>(c: Caller<'a>, key: *const u8, key_len: usize) -> FfiResult<Option<&'a [u8]>> {
    if key.is_null() && key_len == 0 {
        return Ok(None);
    }
    Ok(Some(c.slice(key, key_len, "key")?))
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
    status_call!(|c| {
        let bound = c.handle(plan, "plan")?.bound()?;
        let participant = c.str(target_participant, "target_participant")?;
        let out = c.out(out, "out")?;
        let key = key_arg(c, key, key_len)?;
        let acceptor = NotifyAcceptor::new(bound, participant, key)?;
        out.give_handle(mws_notify_acceptor { inner: Mutex::new(acceptor) })
    })
}

/// Checks one received notification (`message`, `len` bytes: the `notify_msg` of a
/// `NotifyDesc` whose name is `mws_notify_name()`) against the acceptor's plan,
/// generation and participant, and records it when accepted. Writes the verdict
/// (`MWS_NOTIFY_*`) to `*verdict` and the outcome after the call to `*outcome` (both
/// optional, written on success and on refusal). A refused message changes nothing.
///
/// Errors: `MWS_NULL_ARGUMENT`; refusals: `MWS_INVALID_ARGUMENT` (malformed,
/// truncated, misrouted), `MWS_INTEGRITY` (forged), `MWS_CONFLICT` (replayed),
/// `MWS_STALE_BINDING` (stale, other plan), `MWS_LIMIT_EXCEEDED` (too many); the
/// message says exactly why. Thread
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
    outcome: *mut mws_notify_outcome,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let bytes = c.slice(message, len, "message")?;
        let mut acc = a.inner.lock();
        let result = acc.accept(bytes);
        let o = outcome_c(&acc.outcome(), acc.weight_generation());
        let (v, r) = match result {
            Ok(_) => (MWS_NOTIFY_ACCEPTED, Ok(())),
            Err(e) => (e.refusal as u32, Err(Failure::from(mws::Error::from(e)))),
        };
        c.opt_set(verdict, v);
        c.opt_set(outcome, o);
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
    out: *mut mws_notify_outcome,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let out = c.out(out, "out")?;
        let acc = a.inner.lock();
        out.give(outcome_c(&acc.outcome(), acc.weight_generation()))
    })
}

/// Frees an acceptor; NULL does nothing.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `acceptor` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_free(acceptor: *mut mws_notify_acceptor) {
    value_call!((), |c| c.free(acceptor))
}
