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
//! `mws_notify_acceptor_outcome` says `MWS_TARGET_UPDATED` with generation G. A
//! process hosting several targets adds their acceptors to one `mws_notify_router`
//! and hands it every message: it picks the acceptor of the message's plan and
//! target. Prepared steps (`mws_prepared_transfer_step_notified`) move many
//! generations under one plan: the acceptor follows the newest one.

use crate::args::Caller;
use crate::boundary::{mws_status, Failure, FfiResult};
use crate::device_engine::mws_device_engine;
use crate::live::verdict;
use crate::transfer_plan::mws_transfer_plan;
use mws::protocol::transfer::notify::{NotifyAcceptor, NOTIFY_NAME};
use mws::protocol::transfer::{NotifyRouter, SharedAcceptor, TargetOutcome};
use parking_lot::Mutex;
use std::ffi::{c_char, CString};
use std::sync::Arc;

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
/// Refused: a `done` without content checksums at an acceptor that verifies
/// content (`mws_notify_acceptor_verify_content`; the sink's step was not verified).
pub const MWS_NOTIFY_UNVERIFIED: u32 = 9;
/// Refused: a delta step's message the target cannot apply (its bytes do not hold
/// the delta's base generation, verified, or it has no inbox, or the delta is
/// malformed); the target needs a full step.
pub const MWS_NOTIFY_DELTA_BASE: u32 = 10;
/// The transfers one writer may begin under one acceptor (`MWS_NOTIFY_TOO_MANY`).
pub const MWS_NOTIFY_MAX_TRANSFERS_PER_WRITER: u32 = 1024;
const _: () = assert!(
    MWS_NOTIFY_MAX_TRANSFERS_PER_WRITER as usize == mws::protocol::transfer::notify::MAX_TRANSFERS_PER_WRITER
        && MWS_NOTIFY_TOO_MANY == mws::protocol::transfer::notify::NotifyRefusal::TooMany as u32
        && MWS_NOTIFY_UNVERIFIED == mws::protocol::transfer::notify::NotifyRefusal::Unverified as u32
        && MWS_NOTIFY_DELTA_BASE == mws::protocol::transfer::notify::NotifyRefusal::DeltaBase as u32
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
    /// The acceptor's weight generation: the plan's at first, then the newest
    /// generation of the plan a writer began (prepared steps).
    pub weight_generation: u64,
    /// Torn: the writers (source executors) whose calls are incomplete, or whose
    /// verified bytes differ (`mws_notify_acceptor_mismatch`); else 0.
    pub incomplete: u64,
}

/// One target range whose bytes differ from the source's checksums
/// (`mws_notify_acceptor_mismatch`). Strings are borrowed from the acceptor until
/// the next `mws_notify_acceptor_mismatch_count` on it or its free.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_notify_mismatch {
    /// The writing source executor's participant.
    pub source_participant: *const c_char,
    /// The writing source executor's worker.
    pub source_worker: *const c_char,
    /// The target runtime fragment.
    pub fragment_id: *const c_char,
    /// The plan operation.
    pub operation: u32,
    /// First byte of the operation's box in the fragment.
    pub offset: u64,
    /// Bytes the operation writes.
    pub bytes: u64,
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
/// (its generation, then the newest generation of the plan a writer began).
/// Created by `mws_notify_acceptor_new`, freed by `mws_notify_acceptor_free`.
/// Thread safety: every function may be called from any thread, concurrently (calls
/// are serialized inside).
pub struct mws_notify_acceptor {
    inner: SharedAcceptor,
    /// The mismatches lent by `mws_notify_acceptor_mismatch` (strings, then ranges).
    lent: Mutex<Vec<LentMismatch>>,
}

/// One lent mismatched range: its strings and the C struct pointing into them.
struct LentMismatch {
    _strings: [CString; 3],
    c: mws_notify_mismatch,
}

// SAFETY: the raw pointers of `c` point into `_strings`, owned by the same value and
// never mutated; they are only read by C under the documented lifetime.
unsafe impl Send for LentMismatch {}

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
        out.give_handle(mws_notify_acceptor { inner: Arc::new(Mutex::new(acceptor)), lent: Mutex::new(Vec::new()) })
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

/// Turns content verification on: from now on a `done` must carry content
/// checksums (a content-verified step, `MWS_STEP_VERIFY_CONTENT`; else it is
/// refused, `MWS_NOTIFY_UNVERIFIED`), and each accepted `done` makes the acceptor
/// read that writer's target ranges in the participant's buffers (at the addresses
/// of the bound plan) and compare their CRC-32C before it counts the writer done: a
/// mismatch leaves the outcome `MWS_TARGET_TORN` with the ranges named
/// (`mws_notify_acceptor_mismatch`).
///
/// Device buffers are read through the acceptor's device engine
/// (`mws_notify_acceptor_use_device_engine`), staged in host memory.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_UNSUPPORTED` (a target fragment of the
/// participant is device memory and the acceptor has no device engine; nothing
/// changes). Thread safety: any thread.
///
/// # Safety
/// `acceptor` is NULL or live. Every buffer of the acceptor's participant named by
/// its plan stays valid for reads at its planned address until the acceptor is freed
/// (a writer may write it meanwhile).
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_verify_content(acceptor: *const mws_notify_acceptor) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        // SAFETY: this function's contract: the participant's buffers stay readable
        // while the acceptor lives.
        Ok(unsafe { a.inner.lock().verify_content() }?)
    })
}

/// Gives the acceptor the device copy engine through which it reads (content
/// checksums, `mws_notify_acceptor_verify_content`) and writes (delta steps,
/// `mws_notify_acceptor_accept_deltas`) the participant's device buffers, staged in
/// host memory: call it before `mws_notify_acceptor_verify_content` when they are
/// device memory. The acceptor takes its own reference: `device` may be freed at
/// once. A later call replaces the engine.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread.
///
/// # Safety
/// `acceptor` and `device` are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_use_device_engine(
    acceptor: *const mws_notify_acceptor,
    device: *const mws_device_engine,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let device = Arc::clone(&c.handle(device, "device")?.engine);
        a.inner.lock().use_device_engine(device);
        Ok(())
    })
}

/// Accepts delta steps (`mws_prepared_transfer_enable_delta` on the sources): a
/// `done` carrying a delta makes the acceptor read the writer's slot of the inbox
/// (`address`, `capacity` bytes: a host buffer of this side, registered with its
/// engine, whose address the sources are told), apply the changed elements to the
/// target buffers, then verify their content as for any verified `done`. A delta
/// applies only on the generation the target's bytes hold
/// (`mws_notify_acceptor_held_generation`); any other is refused
/// (`MWS_NOTIFY_DELTA_BASE`) and the target stays torn until a full step.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (content verification is off:
/// call `mws_notify_acceptor_verify_content` first; a NULL address or 0 capacity).
/// Thread safety: any thread.
///
/// # Safety
/// `acceptor` is NULL or live. The inbox stays valid for reads, and every buffer of
/// the acceptor's participant valid for writes at its planned address, until the
/// acceptor is freed; nothing else writes those buffers while a message is accepted.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_accept_deltas(
    acceptor: *const mws_notify_acceptor,
    address: u64,
    capacity: u64,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let inbox = mws::protocol::transfer::DeltaInbox { address, capacity };
        // SAFETY: this function's contract.
        Ok(unsafe { a.inner.lock().accept_deltas(inbox) }?)
    })
}

/// Writes the weight generation the target's bytes hold, verified by content and
/// untouched since (what the sources' delta steps need to hear,
/// `mws_target_held`), to `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_NOT_FOUND` (no verified generation: before the
/// first verified update, after a mismatch or a full step's `begin`, or when the
/// acceptor does not verify content). Thread safety: any thread.
///
/// # Safety
/// `acceptor` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_held_generation(
    acceptor: *const mws_notify_acceptor,
    out: *mut u64,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let out = c.out(out, "out")?;
        let held = a.inner.lock().held_generation();
        out.give(held.ok_or_else(|| {
            crate::boundary::Failure::new(mws_status::MWS_NOT_FOUND, "the target holds no verified generation")
        })?)
    })
}

/// Moves the acceptor to `weight_generation` (a prepared transfer's next step,
/// before its messages): the older generation's messages are forgotten and refused
/// as stale from then on; the outcome is `MWS_TARGET_UNCHANGED` until a writer
/// announces it. The same generation changes nothing. (Without this call the
/// acceptor moves on by itself when a writer's `begin` of a later generation of its
/// plan arrives.)
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_STALE_BINDING` (older than the acceptor's
/// generation; nothing changes). Thread safety: any thread.
///
/// # Safety
/// `acceptor` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_expect_generation(
    acceptor: *const mws_notify_acceptor,
    weight_generation: u64,
) -> mws_status {
    status_call!(|c| Ok(c.handle(acceptor, "acceptor")?.inner.lock().expect_generation(weight_generation)?))
}

/// Writes to `*out` the number of mismatched target ranges of the current
/// generation (0 unless a verifying acceptor found bytes that differ) and makes
/// them available to `mws_notify_acceptor_mismatch` (replacing those lent before).
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread; not concurrently with
/// `mws_notify_acceptor_mismatch` on the same acceptor.
///
/// # Safety
/// `acceptor` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_mismatch_count(
    acceptor: *const mws_notify_acceptor,
    out: *mut usize,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let out = c.out(out, "out")?;
        let mut lent = Vec::new();
        for m in a.inner.lock().mismatches() {
            for r in &m.ranges {
                let text = |s: &str| CString::new(s).unwrap_or_default();
                let strings = [text(&m.source_participant), text(&m.source_worker), text(&r.fragment_id)];
                let c = mws_notify_mismatch {
                    source_participant: strings[0].as_ptr(),
                    source_worker: strings[1].as_ptr(),
                    fragment_id: strings[2].as_ptr(),
                    operation: r.operation,
                    offset: r.offset,
                    bytes: r.bytes,
                };
                lent.push(LentMismatch { _strings: strings, c });
            }
        }
        let n = lent.len();
        *a.lent.lock() = lent;
        out.give(n)
    })
}

/// Writes mismatched range `index` (of those counted by the last
/// `mws_notify_acceptor_mismatch_count`) to `*out`; its strings are borrowed from
/// the acceptor until the next count or its free.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range). Thread
/// safety: as `mws_notify_acceptor_mismatch_count`.
///
/// # Safety
/// `acceptor` is NULL or live; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_acceptor_mismatch(
    acceptor: *const mws_notify_acceptor,
    index: usize,
    out: *mut mws_notify_mismatch,
) -> mws_status {
    status_call!(|c| {
        let a = c.handle(acceptor, "acceptor")?;
        let out = c.out(out, "out")?;
        let lent = a.lent.lock();
        let Some(m) = lent.get(index) else {
            return Err(mws::Error::invalid(format!(
                "mismatch index {index} is out of range ({} counted)",
                lent.len()
            ))
            .into());
        };
        out.give(m.c)
    })
}

/// Routes received notifications to acceptors when a process hosts several targets
/// (several participants, or several plans): acceptors are keyed by the plan
/// identity and target participant each message names. Created by
/// `mws_notify_router_new`, freed by `mws_notify_router_free`. It shares the
/// acceptors added to it: an acceptor stays usable through its own handle, and the
/// router keeps its state alive until it is removed or the router is freed; remove
/// an acceptor before freeing its handle, or `mws_notify_router_accept` may name
/// the freed handle in `*routed`. Thread safety: any thread, concurrently.
pub struct mws_notify_router {
    inner: NotifyRouter,
    /// The C handle of each routed acceptor, by its shared state.
    handles: Mutex<Vec<(usize, SharedAcceptor)>>,
}

handle!(mws_notify_router);

/// Creates an empty router. New handle in `*out`.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_router_new(out: *mut *mut mws_notify_router) -> mws_status {
    status_call!(|c| c
        .out(out, "out")?
        .give_handle(mws_notify_router { inner: NotifyRouter::new(), handles: Mutex::new(Vec::new()) }))
}

/// Adds `acceptor` under its plan identity and participant.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_CONFLICT` (an acceptor of the same plan and
/// participant is already routed). Thread safety: any thread.
///
/// # Safety
/// `router` and `acceptor` are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_router_add(
    router: *const mws_notify_router,
    acceptor: *const mws_notify_acceptor,
) -> mws_status {
    status_call!(|c| {
        let r = c.handle(router, "router")?;
        let a = c.handle(acceptor, "acceptor")?;
        r.inner.insert(a.inner.clone())?;
        r.handles.lock().push((acceptor as usize, a.inner.clone()));
        Ok(())
    })
}

/// Removes `acceptor` from the router; writes 1 to `*removed` (optional) when it was
/// routed, else 0.
///
/// Errors: `MWS_NULL_ARGUMENT`. Thread safety: any thread.
///
/// # Safety
/// `router` and `acceptor` are NULL or live; `removed` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_router_remove(
    router: *const mws_notify_router,
    acceptor: *const mws_notify_acceptor,
    removed: *mut u32,
) -> mws_status {
    status_call!(|c| {
        let r = c.handle(router, "router")?;
        let a = c.handle(acceptor, "acceptor")?;
        let was = r.inner.remove_acceptor(&a.inner);
        r.handles.lock().retain(|(_, s)| !Arc::ptr_eq(s, &a.inner));
        c.opt_set(removed, u32::from(was));
        Ok(())
    })
}

/// Hands one received notification to the acceptor of the plan and target it names
/// (as `mws_notify_acceptor_accept` on it). Writes the verdict to `*verdict`, that
/// acceptor's outcome after the call to `*outcome`, and that acceptor's handle (as
/// it was added) to `*routed` (all optional; written on success and on refusal; no
/// acceptor: `*routed` NULL and `*outcome` untouched).
///
/// A message it cannot route (its body is not a message, or no acceptor matches)
/// that no routed acceptor's key authenticates is forged (`MWS_NOTIFY_FORGED`).
///
/// Errors: as `mws_notify_acceptor_accept`; no acceptor for the message:
/// `MWS_STALE_BINDING` (`MWS_NOTIFY_OTHER_PLAN`: the target has acceptors under
/// other plans) or `MWS_INVALID_ARGUMENT` (`MWS_NOTIFY_MISROUTED`: no acceptor of
/// that target). Thread safety: any thread; messages for different acceptors are
/// checked concurrently.
///
/// # Safety
/// `router` is NULL or live; `message` is NULL or points to `len` bytes; `verdict`,
/// `outcome` and `routed` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_router_accept(
    router: *const mws_notify_router,
    message: *const u8,
    len: usize,
    verdict: *mut u32,
    outcome: *mut mws_notify_outcome,
    routed: *mut *const mws_notify_acceptor,
) -> mws_status {
    status_call!(|c| {
        let r = c.handle(router, "router")?;
        let bytes = c.slice(message, len, "message")?;
        let result = r.inner.accept(bytes);
        let shared = match &result {
            Ok(ok) => Some(ok.acceptor.clone()),
            Err(e) => e.acceptor.clone(),
        };
        let handle = shared
            .as_ref()
            .and_then(|s| r.handles.lock().iter().find(|(_, x)| Arc::ptr_eq(x, s)).map(|(h, _)| *h))
            .unwrap_or(0);
        if let Some(s) = &shared {
            let acc = s.lock();
            c.opt_set(outcome, outcome_c(&acc.outcome(), acc.weight_generation()));
        }
        c.opt_set(routed, handle as *const mws_notify_acceptor);
        match result {
            Ok(_) => {
                c.opt_set(verdict, MWS_NOTIFY_ACCEPTED);
                Ok(())
            }
            Err(e) => {
                c.opt_set(verdict, e.error.refusal as u32);
                Err(Failure::from(mws::Error::from(e.error)))
            }
        }
    })
}

/// Frees a router (the acceptors it routed stay usable through their own handles);
/// NULL does nothing.
///
/// Thread safety: as `mws_notify_acceptor_free`.
///
/// # Safety
/// `router` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_notify_router_free(router: *mut mws_notify_router) {
    value_call!((), |c| c.free(router))
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
