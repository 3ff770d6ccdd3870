//! The notify hook (issue 27): after a sink pushes its part of generation G, it tells
//! every target engine *through the transfer engine itself* (Mooncake's
//! `sendNotifyByName`) what landed, and the target process, which learns of it only
//! through its engine's notify poll (`getNotifies`), checks each message against its
//! own bound plan and generation and gets its per-target outcome (Updated /
//! Unchanged / Torn, the rules of [`super::outcome`]) before it serves G.
//!
//! # Protocol
//!
//! For one sink call of source executor E (participant, worker) under plan P:
//!
//! 1. before any byte moves (after the stale-lease / stale-generation checks, which
//!    call no engine function), E sends `begin` to every endpoint of every target
//!    participant T that it writes: "E is about to write T under P, transfer id X";
//! 2. the executor runs ([`TransferExecutor::execute_sink`]);
//! 3. only when the call returned normally, E sends `done` to the same endpoints.
//!
//! A failed `begin` fails the call before any transfer (nothing was written); a
//! failed `done` fails the call after the bytes landed (the target stays Torn until
//! a later call completes). The target's [`NotifyAcceptor`] turns the accepted
//! messages into the coordinator's records: `done` = a normal return with the
//! predicted receipts, `begin` without `done` = a failed call that submitted, no
//! message = no call. So a target whose writer died mid-push is Torn (never
//! Unchanged, never Updated), and a target is Updated only when every executor that
//! the plan routes into it said `done` for its latest transfer.
//!
//! # Message format (ASCII, at most [`MAX_NOTIFY_BYTES`])
//!
//! ```text
//! MWS-NOTIFY/1 <mac-kind> <mac-hex> <body-length>\n<body>
//! ```
//!
//! * `mac-kind`: `sha256` (no key: SHA-256 of the body, detects corruption and
//!   truncation) or `hmac-sha256` (a key shared by the sink and the acceptor:
//!   HMAC-SHA256 of the body, also refuses messages from anyone without the key);
//!   the acceptor accepts only its own kind;
//! * `body-length`: the body's length in bytes (a shorter body is "truncated");
//! * `body`: one JSON object with exactly these keys, in this order: `kind`
//!   (`begin`/`done`), `plan` (the plan identity: SHA-256 hex of the bound plan's
//!   JSON, [`plan_identity`]), `generation`, `resource_id`, `source_participant`,
//!   `source_worker`, `target_participant`, `transfer_id`, `operations` (planned
//!   segments E writes into T), `bytes`, `ranges` (SHA-256 hex of the target ranges E
//!   writes into T, [`target_range_digest`]).
//!
//! The notify `name` (Mooncake's `NotifyDesc::name`) is [`NOTIFY_NAME`]: a serving
//! engine's notify poll hands exactly those messages to the acceptor.

use super::error::{TransferError, TransferResult};
use super::executor::{ExecuteArgs, TransferExecutor, TransferReceipt};
use super::outcome::{predicted_receipts, target_outcomes, CallRecord, TargetOutcome, TransferMode};
use crate::error::{Error, ErrorKind};
use crate::model::Placement;
use crate::plan::transfer_bind::{ExecutorTransferPlan, Side, TransferPlan};
use crate::runtime::RuntimeBinding;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// The notify name (Mooncake's `NotifyDesc::name`) of every message of this library.
pub const NOTIFY_NAME: &str = "mooncake_weight_store.notify";
/// The first bytes of every message (`MWS-NOTIFY/<version>`).
pub const NOTIFY_MAGIC: &str = "MWS-NOTIFY/";
/// The message format version this library writes and reads.
pub const NOTIFY_VERSION: u32 = 1;
/// The largest message accepted (bytes).
pub const MAX_NOTIFY_BYTES: usize = 64 * 1024;

/// What a message announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotifyKind {
    /// The sink is about to write (sent before its first batch).
    Begin,
    /// The sink's call returned normally: every planned byte for the target landed.
    Done,
}

impl NotifyKind {
    /// `begin` or `done`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyKind::Begin => "begin",
            NotifyKind::Done => "done",
        }
    }
}

/// Why a message was refused. The numbers are stable (`mws_notify_verdict` in C).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyRefusal {
    /// Not a message of this format, an unsupported version, a bad header or body.
    Malformed = 1,
    /// Shorter than its header says.
    Truncated = 2,
    /// The authenticator does not match, or the message claims what the plan does
    /// not say (an executor that does not write this target, other ranges or counts,
    /// `done` without `begin`).
    Forged = 3,
    /// A message already accepted (same kind, executor and transfer id).
    Replayed = 4,
    /// An older generation, or a transfer superseded by a later one.
    Stale = 5,
    /// The same generation under another plan, or a later generation than the
    /// acceptor's (bind that plan first).
    OtherPlan = 6,
    /// Addressed to another target participant.
    Misrouted = 7,
    /// A `begin` of a new transfer from a writer that already began
    /// [`MAX_TRANSFERS_PER_WRITER`] under this acceptor (what an acceptor remembers
    /// to refuse replays is bounded; bind a new acceptor, as the next generation does).
    TooMany = 8,
}

/// The transfers one writer may begin under one acceptor (one plan, one generation):
/// the acceptor remembers each to refuse its replay, so its memory is bounded by this
/// times the plan's writers. A sink begins one transfer per call, so a generation's
/// retries stay far below it.
pub const MAX_TRANSFERS_PER_WRITER: usize = 1024;

impl NotifyRefusal {
    /// The library error kind of this refusal.
    pub fn error_kind(self) -> ErrorKind {
        match self {
            NotifyRefusal::Malformed | NotifyRefusal::Truncated | NotifyRefusal::Misrouted => {
                ErrorKind::InvalidArgument
            }
            NotifyRefusal::Forged => ErrorKind::Integrity,
            NotifyRefusal::Replayed => ErrorKind::Conflict,
            NotifyRefusal::Stale | NotifyRefusal::OtherPlan => ErrorKind::StaleBinding,
            NotifyRefusal::TooMany => ErrorKind::LimitExceeded,
        }
    }
}

/// A refused message: why, and a precise message (never an address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifyError {
    /// The reason class.
    pub refusal: NotifyRefusal,
    /// What exactly was wrong.
    pub message: String,
}

impl NotifyError {
    fn new(refusal: NotifyRefusal, message: impl Into<String>) -> Self {
        NotifyError { refusal, message: message.into() }
    }
}

impl std::fmt::Display for NotifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NotifyError {}

impl From<NotifyError> for Error {
    fn from(e: NotifyError) -> Error {
        Error::new(e.refusal.error_kind(), e.message)
    }
}

/// One decoded message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyMessage {
    /// `begin` or `done` (see [`NotifyKind`]).
    pub kind: String,
    /// The plan identity ([`plan_identity`]).
    pub plan: String,
    /// The plan's weight generation.
    pub generation: u64,
    /// The plan's resource id.
    pub resource_id: String,
    /// The writing source executor's participant.
    pub source_participant: String,
    /// The writing source executor's worker.
    pub source_worker: String,
    /// The target participant the message is about.
    pub target_participant: String,
    /// The sink call's transfer id.
    pub transfer_id: String,
    /// Planned segments the executor writes into the target.
    pub operations: u64,
    /// Bytes it writes into the target.
    pub bytes: u64,
    /// [`target_range_digest`] of those writes.
    pub ranges: String,
}

impl NotifyMessage {
    /// The kind, parsed (`notify message kind must be begin or done`).
    pub fn parsed_kind(&self) -> Result<NotifyKind, NotifyError> {
        match self.kind.as_str() {
            "begin" => Ok(NotifyKind::Begin),
            "done" => Ok(NotifyKind::Done),
            k => Err(NotifyError::new(
                NotifyRefusal::Malformed,
                format!("notify message kind must be begin or done, got {k:?}"),
            )),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(data);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

/// Equal without an early exit (the authenticator comparison).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A notify key: `None` = unkeyed (integrity only); else at least 16 bytes
/// (`notify key must be at least 16 bytes`).
fn check_key(key: Option<&[u8]>) -> crate::Result<Option<Vec<u8>>> {
    match key {
        None => Ok(None),
        Some(k) if k.len() < 16 => {
            Err(Error::invalid(format!("notify key must be at least 16 bytes, got {}", k.len())))
        }
        Some(k) => Ok(Some(k.to_vec())),
    }
}

fn mac(key: Option<&[u8]>, body: &[u8]) -> (&'static str, String) {
    match key {
        None => ("sha256", hex(&Sha256::digest(body))),
        Some(k) => ("hmac-sha256", hex(&hmac_sha256(k, body))),
    }
}

/// Encodes `msg` (see the module documentation); `key` as for [`NotifyAcceptor::new`].
pub fn encode(msg: &NotifyMessage, key: Option<&[u8]>) -> Vec<u8> {
    let body = serde_json::to_string(msg).expect("a notify message serializes");
    let (kind, tag) = mac(key, body.as_bytes());
    format!("{NOTIFY_MAGIC}{NOTIFY_VERSION} {kind} {tag} {}\n{body}", body.len()).into_bytes()
}

/// Decodes and authenticates one message. Errors: [`NotifyRefusal::Malformed`]
/// (`not a mooncake_weight_store notification`, `unsupported notify version <v>`,
/// `notify header is malformed: <why>`, `notify body is not valid: <why>`, over
/// [`MAX_NOTIFY_BYTES`]), [`NotifyRefusal::Truncated`] (`notify message is truncated:
/// body has <n> of <m> bytes`), [`NotifyRefusal::Forged`] (`notify message
/// authentication failed`, or an authenticator kind other than the acceptor's).
pub fn decode(bytes: &[u8], key: Option<&[u8]>) -> Result<NotifyMessage, NotifyError> {
    let malformed = |m: String| NotifyError::new(NotifyRefusal::Malformed, m);
    if bytes.len() > MAX_NOTIFY_BYTES {
        return Err(malformed(format!("notify message is {} bytes, at most {MAX_NOTIFY_BYTES}", bytes.len())));
    }
    if !bytes.starts_with(NOTIFY_MAGIC.as_bytes()) {
        if NOTIFY_MAGIC.as_bytes().starts_with(bytes) && !bytes.is_empty() {
            return Err(NotifyError::new(NotifyRefusal::Truncated, "notify message is truncated inside its header"));
        }
        return Err(malformed("not a mooncake_weight_store notification".into()));
    }
    let Some(nl) = bytes.iter().position(|&b| b == b'\n') else {
        return Err(NotifyError::new(NotifyRefusal::Truncated, "notify message is truncated inside its header"));
    };
    let header = std::str::from_utf8(&bytes[NOTIFY_MAGIC.len()..nl])
        .map_err(|_| malformed("notify header is malformed: not ASCII".into()))?;
    let fields: Vec<&str> = header.split(' ').collect();
    let version = fields[0];
    if version != NOTIFY_VERSION.to_string() {
        return Err(malformed(format!("unsupported notify version {version:?} (this library reads {NOTIFY_VERSION})")));
    }
    if fields.len() != 4 {
        return Err(malformed(format!("notify header is malformed: {} fields, expected 4", fields.len())));
    }
    let (kind, tag) = (fields[1], fields[2]);
    let len: usize =
        fields[3].parse().map_err(|_| malformed(format!("notify header is malformed: body length {:?}", fields[3])))?;
    let body = &bytes[nl + 1..];
    if body.len() < len {
        return Err(NotifyError::new(
            NotifyRefusal::Truncated,
            format!("notify message is truncated: body has {} of {len} bytes", body.len()),
        ));
    }
    if body.len() > len {
        return Err(malformed(format!("notify message has {} bytes after its {len}-byte body", body.len() - len)));
    }
    let (want_kind, want_tag) = mac(key, body);
    if kind != want_kind {
        return Err(NotifyError::new(
            NotifyRefusal::Forged,
            format!("notify message authenticator is {kind:?}, this acceptor requires {want_kind:?}"),
        ));
    }
    if !same_bytes(tag.as_bytes(), want_tag.as_bytes()) {
        return Err(NotifyError::new(
            NotifyRefusal::Forged,
            "notify message authentication failed (forged or corrupted)",
        ));
    }
    let msg: NotifyMessage =
        serde_json::from_slice(body).map_err(|e| malformed(format!("notify body is not valid: {e}")))?;
    msg.parsed_kind()?;
    Ok(msg)
}

/// The identity of a bound plan: SHA-256 (hex) of its JSON ([`TransferPlan::to_json`]:
/// both placements, every bound operation and executor with leases and generations,
/// no address). Both sides of a transfer compute the same value from the same plan.
pub fn plan_identity(plan: &TransferPlan) -> String {
    hex(&Sha256::digest(plan.to_json().as_bytes()))
}

/// What `executor` writes into `target_participant` under `plan`: `(planned
/// segments, bytes, digest)`. The digest is SHA-256 (hex) over, per operation of the
/// executor whose target is that participant, in ascending order: the operation
/// index, the target runtime fragment id and the region's target geometry (base
/// offset, segment length, outer counts and target strides), which fixes every
/// target byte range written.
pub fn target_range_digest(
    plan: &TransferPlan,
    executor: &ExecutorTransferPlan,
    target_participant: &str,
) -> (u64, u64, String) {
    let mut h = Sha256::new();
    let (mut ops, mut bytes) = (0u64, 0u64);
    for &i in &executor.operation_indices {
        let (b, f) = plan.operation_fragment(i as usize, Side::Target);
        if b.participant_id() != target_participant {
            continue;
        }
        let r = &plan.regions()[i as usize];
        ops += r.segment_count();
        bytes += r.total_bytes();
        h.update(u64::from(i).to_le_bytes());
        h.update((f.fragment_id().len() as u64).to_le_bytes());
        h.update(f.fragment_id().as_bytes());
        h.update(r.target_base_offset.to_le_bytes());
        h.update(r.inner_bytes.to_le_bytes());
        h.update((r.outer_loop_counts.len() as u64).to_le_bytes());
        for (c, s) in r.outer_loop_counts.iter().zip(&r.target_strides) {
            h.update(c.to_le_bytes());
            h.update(s.to_le_bytes());
        }
    }
    (ops, bytes, hex(&h.finalize()))
}

/// One message to send: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedNotify {
    /// The target endpoint (TE segment name).
    pub endpoint: String,
    /// The message.
    pub message: NotifyMessage,
}

/// The messages of `kind` that `executor` (a source executor of `plan`) sends for
/// its call with `transfer_id`: per target participant it writes, one per endpoint
/// of that participant's fragments it writes, sorted by (participant, endpoint).
pub fn planned_notifies(
    plan: &TransferPlan,
    identity: &str,
    executor: &ExecutorTransferPlan,
    kind: NotifyKind,
    transfer_id: &str,
) -> Vec<PlannedNotify> {
    let mut targets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &i in &executor.operation_indices {
        let (b, f) = plan.operation_fragment(i as usize, Side::Target);
        targets.entry(b.participant_id()).or_default().insert(f.endpoint());
    }
    let mut out = Vec::new();
    for (participant, endpoints) in targets {
        let (operations, bytes, ranges) = target_range_digest(plan, executor, participant);
        for endpoint in endpoints {
            out.push(PlannedNotify {
                endpoint: endpoint.to_string(),
                message: NotifyMessage {
                    kind: kind.as_str().into(),
                    plan: identity.to_string(),
                    generation: plan.weight_generation(),
                    resource_id: plan.resource_id().to_string(),
                    source_participant: executor.participant_id.clone(),
                    source_worker: executor.worker_id.clone(),
                    target_participant: participant.to_string(),
                    transfer_id: transfer_id.to_string(),
                    operations,
                    bytes,
                    ranges: ranges.clone(),
                },
            });
        }
    }
    out
}

/// A message the sink delivered: to whom and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifyDelivery {
    /// `begin` or `done`.
    pub kind: NotifyKind,
    /// The target participant.
    pub target_participant: String,
    /// The endpoint it went to.
    pub endpoint: String,
}

/// The result of [`execute_sink_notified`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifiedSink {
    /// The sink's receipts ([`TransferExecutor::execute_sink`]).
    pub receipts: Vec<TransferReceipt>,
    /// The transfer id every message carried.
    pub transfer_id: String,
    /// Every message delivered (`begin` then `done`).
    pub delivered: Vec<NotifyDelivery>,
}

/// The runtime-evidence checks of a sink call that need no engine: the placements
/// against the plan (resource, revision, generation) and every planned binding's
/// lease and generation against the plan's executors. Errors as the executor's
/// (`StaleBinding` kind for stale evidence).
fn check_current(
    plan: &TransferPlan,
    source_placement: &Placement,
    source_binding: &RuntimeBinding,
    target_placement: &Placement,
    target_bindings: &[RuntimeBinding],
) -> TransferResult<Vec<usize>> {
    for (side, p) in [("source", source_placement), ("target", target_placement)] {
        if p.resource_id() != plan.resource_id() {
            return Err(TransferError::stale(format!("{side} resource_id mismatch")));
        }
        if p.revision() != plan.revision() {
            return Err(TransferError::stale(format!("{side} revision mismatch")));
        }
        if p.weight_generation() != plan.weight_generation() {
            return Err(TransferError::stale(format!("{side} weight_generation mismatch")));
        }
    }
    let planned = |side: Side, participant: &str| plan.executors(side).iter().any(|e| e.participant_id == participant);
    for t in target_bindings.iter().filter(|t| planned(Side::Target, t.participant_id())) {
        plan.resolve_executors(Side::Target, target_placement, t).map_err(TransferError::engine_from)?;
    }
    if !planned(Side::Source, source_binding.participant_id()) {
        return Ok(Vec::new());
    }
    plan.resolve_executors(Side::Source, source_placement, source_binding).map_err(TransferError::engine_from)
}

fn send_all(
    exec: &TransferExecutor,
    key: Option<&[u8]>,
    notes: &[PlannedNotify],
    kind: NotifyKind,
    delivered: &mut Vec<NotifyDelivery>,
) -> TransferResult<()> {
    for n in notes {
        let bytes = encode(&n.message, key);
        let what = format!("notify {} to {} ({})", kind.as_str(), n.endpoint, n.message.target_participant);
        match exec.engine().send_notify(&n.endpoint, NOTIFY_NAME, &bytes) {
            None => {
                return Err(TransferError::contract(Error::new(
                    ErrorKind::Unsupported,
                    "the transfer engine cannot send notifications (its send_notify is not provided: the C vtable's field is NULL, or the Rust engine does not override it)",
                )))
            }
            Some(Ok(0)) => delivered.push(NotifyDelivery {
                kind,
                target_participant: n.message.target_participant.clone(),
                endpoint: n.endpoint.clone(),
            }),
            Some(Ok(code)) => return Err(TransferError::engine(format!("{what} failed: engine code {code}"))),
            Some(Err(e)) => return Err(TransferError::engine(format!("{what} failed: {e}"))),
        }
    }
    Ok(())
}

/// [`TransferExecutor::execute_sink`] with the notify protocol of this module:
/// stale checks (no engine call) -> `begin` to every target endpoint the local
/// executor writes -> the sink call -> `done` to the same endpoints. `key`: `None`
/// (unkeyed) or the shared key (at least 16 bytes) of the targets' acceptors. A
/// source participant the plan does not read from sends nothing and returns `[]`.
///
/// Errors: the executor's; `StaleBinding` before any engine call for a stale lease
/// or generation; `Unsupported` when the engine has no notify support (before any
/// transfer); an engine error when a `begin` could not be delivered (nothing was
/// written; `submitted == false`) or a `done` could not be delivered (the bytes
/// landed; `submitted == true`; that target stays Torn until a later call).
///
/// # Safety
/// As [`TransferExecutor::execute_sink`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn execute_sink_notified(
    exec: &TransferExecutor,
    key: Option<&[u8]>,
    plan: &TransferPlan,
    source_placement: &Placement,
    source_binding: &RuntimeBinding,
    target_placement: &Placement,
    target_bindings: &[RuntimeBinding],
    args: &ExecuteArgs<'_>,
) -> TransferResult<NotifiedSink> {
    let key = check_key(key).map_err(TransferError::contract)?;
    let key = key.as_deref();
    let mut local = check_current(plan, source_placement, source_binding, target_placement, target_bindings)?;
    let execs = plan.executors(Side::Source);
    if let Some(w) = args.local_worker_id {
        local.retain(|&i| execs[i].worker_id == w);
    }
    let transfer_id = args.transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let call = ExecuteArgs { transfer_id: Some(&transfer_id), ..*args };
    let Some(&mine) = local.first().filter(|_| local.len() == 1) else {
        // Unplanned participant ([]) or an error the executor words precisely.
        // SAFETY: this function's contract.
        let receipts = unsafe {
            exec.execute_sink(plan, source_placement, source_binding, target_placement, target_bindings, &call)
        }?;
        return Ok(NotifiedSink { receipts, transfer_id, delivered: Vec::new() });
    };
    let executor = &execs[mine];
    let identity = plan_identity(plan);
    let mut delivered = Vec::new();
    let begin = planned_notifies(plan, &identity, executor, NotifyKind::Begin, &transfer_id);
    send_all(exec, key, &begin, NotifyKind::Begin, &mut delivered)?;
    // SAFETY: this function's contract.
    let receipts =
        unsafe { exec.execute_sink(plan, source_placement, source_binding, target_placement, target_bindings, &call) }?;
    let done = planned_notifies(plan, &identity, executor, NotifyKind::Done, &transfer_id);
    send_all(exec, key, &done, NotifyKind::Done, &mut delivered).map_err(|mut e| {
        e.submitted = true;
        e.message = format!("the sink call completed but {}", e.message);
        e
    })?;
    Ok(NotifiedSink { receipts, transfer_id, delivered })
}

/// What an executor writing into the acceptor's participant has announced.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WriterState {
    /// `begin` of the transfer id, no `done` yet.
    Begun(String),
    /// `done` of the transfer id.
    Done(String),
}

/// An accepted message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotifyAccepted {
    /// Its kind.
    pub kind: NotifyKind,
    /// The writing executor's participant.
    pub source_participant: String,
    /// The writing executor's worker.
    pub source_worker: String,
    /// Its transfer id.
    pub transfer_id: String,
    /// The acceptor's outcome after it.
    pub outcome: TargetOutcome,
}

/// The target side of the notify hook: bound to one plan (hence one generation) and
/// one target participant, it checks each message its engine's notify poll received
/// and keeps the participant's outcome. A refused message changes nothing.
///
/// Thread safety: `Send + Sync`; [`Self::accept`] takes `&mut self` (wrap it in a
/// mutex to share it).
#[derive(Clone, Debug)]
pub struct NotifyAcceptor {
    plan: TransferPlan,
    identity: String,
    participant: String,
    key: Option<Vec<u8>>,
    /// (participant, worker) -> (operations, bytes, ranges) predicted into `participant`.
    writers: BTreeMap<(String, String), (u64, u64, String)>,
    state: BTreeMap<(String, String), WriterState>,
    seen: BTreeSet<(NotifyKind, String, String, String)>,
    /// Transfers each writer began (at most [`MAX_TRANSFERS_PER_WRITER`]).
    begun: BTreeMap<(String, String), usize>,
}

impl NotifyAcceptor {
    /// An acceptor for `target_participant` under `plan` (a bound plan: the one the
    /// target itself bound for this generation). `key`: `None` (messages carry a
    /// SHA-256 of their body) or the key shared with the sinks (at least 16 bytes).
    ///
    /// Errors (`InvalidArgument`): `notify key must be at least 16 bytes, got <n>`,
    /// `<participant> is not a target participant of this plan`.
    pub fn new(plan: &TransferPlan, target_participant: &str, key: Option<&[u8]>) -> crate::Result<Self> {
        let key = check_key(key)?;
        if !plan.executors(Side::Target).iter().any(|e| e.participant_id == target_participant) {
            return Err(Error::invalid(format!("{target_participant} is not a target participant of this plan")));
        }
        let mut writers = BTreeMap::new();
        for e in super::outcome::calls_of(plan, TransferMode::Sink, target_participant) {
            writers.insert(
                (e.participant_id.clone(), e.worker_id.clone()),
                target_range_digest(plan, e, target_participant),
            );
        }
        Ok(NotifyAcceptor {
            plan: plan.clone(),
            identity: plan_identity(plan),
            participant: target_participant.to_string(),
            key,
            writers,
            state: BTreeMap::new(),
            seen: BTreeSet::new(),
            begun: BTreeMap::new(),
        })
    }

    /// The plan identity messages must carry.
    pub fn plan_identity(&self) -> &str {
        &self.identity
    }
    /// The generation the acceptor is bound to.
    pub fn weight_generation(&self) -> u64 {
        self.plan.weight_generation()
    }
    /// The target participant.
    pub fn participant(&self) -> &str {
        &self.participant
    }
    /// The source executors `(participant, worker)` that write this participant.
    pub fn writers(&self) -> Vec<(String, String)> {
        self.writers.keys().cloned().collect()
    }

    /// Checks one message (the notify payload as received) and, when it is
    /// accepted, records it. Order of checks: format and authenticator ([`decode`]),
    /// generation (older: `Stale`; later: `OtherPlan`), plan identity (`OtherPlan`),
    /// addressee (`Misrouted`), writer and claims against the plan (`Forged`),
    /// replay (`Replayed`), sequence (`done` needs the writer's current `begin` of
    /// the same transfer: `Stale` when superseded, `Forged` when never begun).
    pub fn accept(&mut self, message: &[u8]) -> Result<NotifyAccepted, NotifyError> {
        let m = decode(message, self.key.as_deref())?;
        let kind = m.parsed_kind()?;
        let g = self.weight_generation();
        if m.generation < g {
            return Err(NotifyError::new(
                NotifyRefusal::Stale,
                format!("stale notification: generation {} is older than the bound generation {g}", m.generation),
            ));
        }
        if m.generation > g {
            return Err(NotifyError::new(
                NotifyRefusal::OtherPlan,
                format!("notification for generation {} but the acceptor is bound to generation {g}", m.generation),
            ));
        }
        if m.plan != self.identity || m.resource_id != self.plan.resource_id() {
            return Err(NotifyError::new(
                NotifyRefusal::OtherPlan,
                format!("notification for generation {g} names another plan than the bound one"),
            ));
        }
        if m.target_participant != self.participant {
            return Err(NotifyError::new(
                NotifyRefusal::Misrouted,
                format!(
                    "notification is for target {} but this acceptor is for {}",
                    m.target_participant, self.participant
                ),
            ));
        }
        let who = (m.source_participant.clone(), m.source_worker.clone());
        let Some((ops, bytes, ranges)) = self.writers.get(&who) else {
            return Err(NotifyError::new(
                NotifyRefusal::Forged,
                format!("source executor ({}, {}) does not write {} under this plan", who.0, who.1, self.participant),
            ));
        };
        if m.operations != *ops || m.bytes != *bytes || m.ranges != *ranges {
            return Err(NotifyError::new(
                NotifyRefusal::Forged,
                format!(
                    "notification from ({}, {}) claims other target ranges than the plan ({} segments, {} bytes)",
                    who.0, who.1, m.operations, m.bytes
                ),
            ));
        }
        let key = (kind, who.0.clone(), who.1.clone(), m.transfer_id.clone());
        if self.seen.contains(&key) {
            return Err(NotifyError::new(
                NotifyRefusal::Replayed,
                format!("replayed notification: {} of transfer {} from ({}, {})", m.kind, m.transfer_id, who.0, who.1),
            ));
        }
        if kind == NotifyKind::Begin
            && self.seen.contains(&(NotifyKind::Done, who.0.clone(), who.1.clone(), m.transfer_id.clone()))
        {
            return Err(NotifyError::new(
                NotifyRefusal::Replayed,
                format!(
                    "replayed notification: begin of finished transfer {} from ({}, {})",
                    m.transfer_id, who.0, who.1
                ),
            ));
        }
        if kind == NotifyKind::Done {
            match self.state.get(&who) {
                Some(WriterState::Begun(t)) if *t == m.transfer_id => {}
                _ if self.seen.contains(&(NotifyKind::Begin, who.0.clone(), who.1.clone(), m.transfer_id.clone())) => {
                    return Err(NotifyError::new(
                        NotifyRefusal::Stale,
                        format!(
                            "stale notification: transfer {} from ({}, {}) was superseded",
                            m.transfer_id, who.0, who.1
                        ),
                    ))
                }
                _ => {
                    return Err(NotifyError::new(
                        NotifyRefusal::Forged,
                        format!("done without begin: transfer {} from ({}, {})", m.transfer_id, who.0, who.1),
                    ))
                }
            }
        }
        if kind == NotifyKind::Begin {
            let n = self.begun.entry(who.clone()).or_default();
            if *n >= MAX_TRANSFERS_PER_WRITER {
                return Err(NotifyError::new(
                    NotifyRefusal::TooMany,
                    format!(
                        "({}, {}) already began {MAX_TRANSFERS_PER_WRITER} transfers under this acceptor (the most \
                         it remembers); bind a new acceptor",
                        who.0, who.1
                    ),
                ));
            }
            *n += 1;
        }
        self.seen.insert(key);
        let next = match kind {
            NotifyKind::Begin => WriterState::Begun(m.transfer_id.clone()),
            NotifyKind::Done => WriterState::Done(m.transfer_id.clone()),
        };
        self.state.insert(who.clone(), next);
        Ok(NotifyAccepted {
            kind,
            source_participant: who.0,
            source_worker: who.1,
            transfer_id: m.transfer_id,
            outcome: self.outcome(),
        })
    }

    /// The participant's outcome from the messages accepted so far (the rules of
    /// [`target_outcomes`]): Updated once every writer said `done` for its latest
    /// transfer; Unchanged while none said anything; Torn otherwise (the incomplete
    /// writers listed).
    pub fn outcome(&self) -> TargetOutcome {
        let execs = plan_executors_by_key(&self.plan);
        let records: Vec<CallRecord> = self
            .state
            .iter()
            .filter_map(|(who, st)| {
                let e = execs.get(&(who.0.as_str(), who.1.as_str()))?;
                let result = match st {
                    WriterState::Done(_) => Ok(predicted_receipts(&self.plan, e)),
                    WriterState::Begun(_) => {
                        let mut err = TransferError::engine("the sink began and has not reported done");
                        err.submitted = true;
                        Err(err)
                    }
                };
                Some(CallRecord {
                    plan: self.plan.clone(),
                    participant_id: who.0.clone(),
                    worker_id: who.1.clone(),
                    result,
                })
            })
            .collect();
        target_outcomes(&self.plan, TransferMode::Sink, &records)
            .remove(&self.participant)
            .unwrap_or(TargetOutcome::Unchanged)
    }
}

fn plan_executors_by_key(plan: &TransferPlan) -> BTreeMap<(&str, &str), &ExecutorTransferPlan> {
    plan.executors(Side::Source).iter().map(|e| ((e.participant_id.as_str(), e.worker_id.as_str()), e)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> NotifyMessage {
        NotifyMessage {
            kind: "done".into(),
            plan: "ab".repeat(32),
            generation: 7,
            resource_id: "m".into(),
            source_participant: "s0".into(),
            source_worker: "w0".into(),
            target_participant: "t0".into(),
            transfer_id: "x1".into(),
            operations: 3,
            bytes: 12,
            ranges: "cd".repeat(32),
        }
    }

    #[test]
    fn round_trip_unkeyed_and_keyed() {
        let m = msg();
        assert_eq!(decode(&encode(&m, None), None).unwrap(), m);
        let key = [7u8; 32];
        assert_eq!(decode(&encode(&m, Some(&key)), Some(&key)).unwrap(), m);
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = encode(&msg(), None);
        for n in 0..bytes.len() {
            let e = decode(&bytes[..n], None).unwrap_err();
            if n == 0 {
                assert_eq!(e.refusal, NotifyRefusal::Malformed, "{n}: {e}");
            } else {
                assert_eq!(e.refusal, NotifyRefusal::Truncated, "{n}: {e}");
            }
        }
    }

    #[test]
    fn flipped_bytes_and_wrong_keys_are_forged_or_malformed() {
        let key = [9u8; 16];
        let bytes = encode(&msg(), Some(&key));
        let body_at = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
        for i in body_at..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            let e = decode(&b, Some(&key)).unwrap_err();
            assert_eq!(e.refusal, NotifyRefusal::Forged, "byte {i}: {e}");
        }
        let e = decode(&bytes, Some(&[8u8; 16])).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Forged);
        let e = decode(&bytes, None).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Forged);
        assert!(e.message.contains("hmac-sha256"), "{e}");
        let e = decode(&encode(&msg(), None), Some(&key)).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Forged);
    }

    #[test]
    fn malformed_messages_are_named() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"hello".to_vec(), "not a mooncake_weight_store notification"),
            (b"MWS-NOTIFY/2 sha256 00 2\n{}".to_vec(), "unsupported notify version"),
            (b"MWS-NOTIFY/1 sha256 00\n{}".to_vec(), "3 fields, expected 4"),
            (b"MWS-NOTIFY/1 sha256 00 x\n{}".to_vec(), "body length"),
            (b"MWS-NOTIFY/1 sha256 00 1\n{}".to_vec(), "after its 1-byte body"),
            (vec![b'M'; MAX_NOTIFY_BYTES + 1], "at most"),
        ];
        for (bytes, want) in cases {
            let e = decode(&bytes, None).unwrap_err();
            assert!(e.message.contains(want), "{want}: {e}");
        }
        // A valid authenticator over a body that is not a message.
        let body = br#"{"kind":"done"}"#;
        let tag = hex(&Sha256::digest(body));
        let bytes = format!("MWS-NOTIFY/1 sha256 {tag} {}\n{}", body.len(), std::str::from_utf8(body).unwrap());
        let e = decode(bytes.as_bytes(), None).unwrap_err();
        assert_eq!(e.refusal, NotifyRefusal::Malformed);
        assert!(e.message.contains("notify body is not valid"), "{e}");
        let mut m = msg();
        m.kind = "maybe".into();
        let e = decode(&encode(&m, None), None).unwrap_err();
        assert!(e.message.contains("begin or done"), "{e}");
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(check_key(Some(&[1u8; 15])).unwrap_err().message().contains("at least 16 bytes"));
        assert!(check_key(Some(&[1u8; 16])).is_ok());
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let tag = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&tag), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }
}
