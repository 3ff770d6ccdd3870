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
//!   writes into T, [`target_range_digest`]); then, only in a content-verified
//!   push, `content` (below). A message without `content` is byte for byte the
//!   message of earlier releases; an acceptor of an earlier release refuses one with
//!   it (its body is strict), so verified pushes need updated targets.
//!
//! `generation` is the weight generation the call moves: the plan's for a plain call
//! ([`execute_sink_notified`]), the step's for a step of a prepared transfer
//! ([`PreparedTransfer::step`](super::PreparedTransfer::step) with
//! [`StepArgs::notify`](super::StepArgs::notify)), which moves many generations
//! under one plan (one plan identity). The pair (plan identity, generation) names
//! what landed; an acceptor follows the newest generation of its plan (see
//! [`NotifyAcceptor::accept`]), so an older generation's message is stale.
//!
//! # Content checksums (optional `content` member)
//!
//! `{"crc32c": [c0, c1, ...]}`: the CRC-32C of the bytes the executor sends into
//! the target, computed by the source from its own (host) memory before the bytes
//! move. The executor's operations into the target, in ascending operation order,
//! are cut into `min(n, MAX_CONTENT_GROUPS)` consecutive groups ([`content_groups`]);
//! `ck` is the CRC-32C of the segments of group k's operations, each operation's
//! segments in row-major order (outer loops, then the contiguous inner bytes). A
//! verifying acceptor ([`NotifyAcceptor::verify_content`]) recomputes them from the
//! target ranges it owns and reports the participant `Torn` with the mismatched
//! ranges ([`NotifyAcceptor::mismatches`]) when one differs. Device memory is not
//! summed: a verified push from a device source fragment, and a verifying acceptor
//! of a device target fragment, are refused (`Unsupported`).
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
    /// A delta step's message whose base generation is not the one the target's
    /// bytes hold, or that the acceptor cannot apply (no inbox, a malformed or
    /// oversized delta): the target needs a full step.
    DeltaBase = 10,
    /// A `done` without content checksums at an acceptor that verifies content
    /// (the sink did not run a content-verified push).
    Unverified = 9,
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
            NotifyRefusal::Forged | NotifyRefusal::Unverified => ErrorKind::Integrity,
            NotifyRefusal::Replayed => ErrorKind::Conflict,
            NotifyRefusal::Stale | NotifyRefusal::OtherPlan | NotifyRefusal::DeltaBase => ErrorKind::StaleBinding,
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
    /// The content checksums of a content-verified push (see the module
    /// documentation); absent otherwise (and then not written at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<NotifyContent>,
    /// A delta step's base and slot bytes ([`super::delta`]); absent otherwise (and
    /// then not written at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<NotifyDelta>,
}

pub use super::delta::NotifyDelta;

/// The content checksums of one message: per group of the writer's operations into
/// the target ([`content_groups`]), the CRC-32C of the bytes written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyContent {
    /// One CRC-32C per group, in group order.
    pub crc32c: Vec<u32>,
}

/// The most groups the content checksums of one message have (so a message stays
/// far below [`MAX_NOTIFY_BYTES`] whatever the number of operations).
pub const MAX_CONTENT_GROUPS: usize = 64;

/// The groups of `n` operations (indices into the writer's ascending operations
/// into one target): `min(n, MAX_CONTENT_GROUPS)` consecutive ranges, group k being
/// `k*n/g .. (k+1)*n/g`.
pub fn content_groups(n: usize) -> Vec<std::ops::Range<usize>> {
    let g = n.min(MAX_CONTENT_GROUPS);
    (0..g).map(|k| k * n / g..(k + 1) * n / g).collect()
}

/// The operations of `executor` whose target is `participant`, ascending.
pub fn operations_into(plan: &TransferPlan, executor: &ExecutorTransferPlan, participant: &str) -> Vec<u32> {
    let mut ops: Vec<u32> = executor
        .operation_indices
        .iter()
        .copied()
        .filter(|&i| plan.operation_fragment(i as usize, Side::Target).0.participant_id() == participant)
        .collect();
    ops.sort_unstable();
    ops
}

/// The content checksums of operations `ops` (ascending) read on `side`: one
/// CRC-32C per group of [`content_groups`]. Host fragments are read in place, device
/// fragments through `device` (staged in host memory, [`super::device_bytes`]).
/// Errors: `<side> fragment <id> is device memory (<kind>): content checksums need a
/// device engine` (`Unsupported`, before anything is read), the device engine's.
///
/// # Safety
/// The fragments of `side` of `ops` are valid for reads (of their memory kind) at
/// their planned addresses.
pub unsafe fn content_checksums(
    plan: &TransferPlan,
    ops: &[u32],
    side: Side,
    device: Option<&dyn crate::device::DeviceEngine>,
) -> crate::Result<Vec<u32>> {
    super::device_bytes::check_reachable(plan, ops, side, device, "content checksums")?;
    let mut scratch = Vec::new();
    let mut out = Vec::new();
    for g in content_groups(ops.len()) {
        let mut crc = 0u32;
        for &i in &ops[g] {
            // SAFETY: this function's contract.
            unsafe {
                super::device_bytes::read_op(plan, i as usize, side, device, &mut scratch, |b| {
                    crc = crate::crc::crc32c_append(crc, b)
                })
            }?;
        }
        out.push(crc);
    }
    Ok(out)
}

/// A target range whose bytes differ from what the source sent (a group of a
/// verified message whose checksum does not match names each of its operations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MismatchedRange {
    /// The plan operation.
    pub operation: u32,
    /// The target runtime fragment.
    pub fragment_id: String,
    /// First byte of the operation's box in the fragment (its target base offset).
    pub offset: u64,
    /// Bytes the operation writes.
    pub bytes: u64,
}

/// A writer whose verified bytes differ in the acceptor's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentMismatch {
    /// The writing executor's participant.
    pub source_participant: String,
    /// The writing executor's worker.
    pub source_worker: String,
    /// The transfer whose `done` carried the checksums.
    pub transfer_id: String,
    /// The ranges of every mismatched group.
    pub ranges: Vec<MismatchedRange>,
}

/// What the acceptor did with the content checksums of an accepted message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentCheck {
    /// A `begin`, or a `done` without checksums at an acceptor that does not verify.
    Absent,
    /// The `done` carried checksums; the acceptor does not verify content.
    NotChecked,
    /// Every group's bytes in the target match.
    Verified,
    /// Some groups differ: the participant is `Torn` (the writer is incomplete).
    Mismatch(Vec<MismatchedRange>),
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

/// The header's authenticator kind and tag, and the body (not authenticated).
fn split(bytes: &[u8]) -> Result<(&str, &str, &[u8]), NotifyError> {
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
    Ok((kind, tag, body))
}

/// The plan identity and target participant a message names, read without
/// authenticating it (what [`super::NotifyRouter`] routes by; the acceptor it picks
/// then checks everything). Errors: those of [`decode`] but the authenticator's.
pub fn peek(bytes: &[u8]) -> Result<(String, String), NotifyError> {
    let (_, _, body) = split(bytes)?;
    let m: NotifyMessage = serde_json::from_slice(body)
        .map_err(|e| NotifyError::new(NotifyRefusal::Malformed, format!("notify body is not valid: {e}")))?;
    Ok((m.plan, m.target_participant))
}

/// Decodes and authenticates one message. Errors: [`NotifyRefusal::Malformed`]
/// (`not a mooncake_weight_store notification`, `unsupported notify version <v>`,
/// `notify header is malformed: <why>`, `notify body is not valid: <why>`, over
/// [`MAX_NOTIFY_BYTES`]), [`NotifyRefusal::Truncated`] (`notify message is truncated:
/// body has <n> of <m> bytes`), [`NotifyRefusal::Forged`] (`notify message
/// authentication failed`, or an authenticator kind other than the acceptor's).
pub fn decode(bytes: &[u8], key: Option<&[u8]>) -> Result<NotifyMessage, NotifyError> {
    let malformed = |m: String| NotifyError::new(NotifyRefusal::Malformed, m);
    let (kind, tag, body) = split(bytes)?;
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
                    content: None,
                    delta: None,
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

/// The notify side of a prepared sink's steps ([`super::PreparedTransfer::step`]
/// with [`super::StepArgs::notify`]): the messages of its executor, made once, sent
/// with each step's generation and transfer id.
#[derive(Debug)]
pub(crate) struct StepNotifier {
    identity: String,
    /// The `begin` messages of the plan's generation and an empty transfer id.
    notes: Vec<PlannedNotify>,
    /// Per target participant the executor writes: its operations, ascending.
    ops: BTreeMap<String, Vec<u32>>,
}

impl StepNotifier {
    /// The messages `executor` (a source executor of `plan`) sends at each step.
    pub(crate) fn new(plan: &TransferPlan, executor: &ExecutorTransferPlan) -> StepNotifier {
        let identity = plan_identity(plan);
        let notes = planned_notifies(plan, &identity, executor, NotifyKind::Begin, "");
        let ops = notes
            .iter()
            .map(|n| n.message.target_participant.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|t| {
                let ops = operations_into(plan, executor, &t);
                (t, ops)
            })
            .collect();
        StepNotifier { identity, notes, ops }
    }

    /// The plan identity every message carries.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// The content checksums of the step, per target participant, from the source
    /// fragments, device ones read through `device` (errors, as contract errors:
    /// nothing moved: a device source fragment without a device engine,
    /// `Unsupported`; the device engine's).
    ///
    /// # Safety
    /// The source fragments of the executor's operations are valid for reads.
    pub(crate) unsafe fn source_checksums(
        &self,
        plan: &TransferPlan,
        device: Option<&dyn crate::device::DeviceEngine>,
    ) -> TransferResult<BTreeMap<String, Vec<u32>>> {
        let mut out = BTreeMap::new();
        for (t, ops) in &self.ops {
            // SAFETY: this function's contract.
            let crcs =
                unsafe { content_checksums(plan, ops, Side::Source, device) }.map_err(TransferError::contract)?;
            out.insert(t.clone(), crcs);
        }
        Ok(out)
    }

    /// Sends the step's messages of `kind` (generation, transfer id and, for a
    /// verified `done`, the checksums per target) and records each delivery.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &self,
        exec: &TransferExecutor,
        key: Option<&[u8]>,
        kind: NotifyKind,
        generation: u64,
        transfer_id: &str,
        content: Option<&BTreeMap<String, Vec<u32>>>,
        delta: Option<&BTreeMap<String, NotifyDelta>>,
        delivered: &mut Vec<NotifyDelivery>,
    ) -> TransferResult<()> {
        let notes: Vec<PlannedNotify> = self
            .notes
            .iter()
            .map(|n| {
                let mut n = n.clone();
                n.message.kind = kind.as_str().into();
                n.message.generation = generation;
                n.message.transfer_id = transfer_id.to_string();
                n.message.content = content
                    .and_then(|c| c.get(&n.message.target_participant))
                    .map(|crc32c| NotifyContent { crc32c: crc32c.clone() });
                n.message.delta = delta.and_then(|d| d.get(&n.message.target_participant)).copied();
                n
            })
            .collect();
        send_all(exec, key, &notes, kind, delivered)
    }
}

/// A notify key, checked for a step (`notify key must be at least 16 bytes`, as a
/// contract error).
pub(crate) fn step_key(key: Option<&[u8]>) -> TransferResult<Option<Vec<u8>>> {
    check_key(key).map_err(TransferError::contract)
}

/// What an executor writing into the acceptor's participant has announced.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WriterState {
    /// `begin` of the transfer id, no `done` yet.
    Begun(String),
    /// `done` of the transfer id.
    Done(String),
    /// `done` of the transfer id whose content checksums do not match the target.
    Mismatch(String, Vec<MismatchedRange>),
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
    /// The weight generation it is about (the acceptor's, after it).
    pub weight_generation: u64,
    /// What the acceptor did with its content checksums.
    pub content: ContentCheck,
    /// The acceptor's outcome after it.
    pub outcome: TargetOutcome,
}

/// The target side of the notify hook: bound to one plan and one target
/// participant, it checks each message its engine's notify poll received and keeps
/// the participant's outcome for its current weight generation. A refused message
/// changes nothing.
///
/// Generations: the acceptor starts at the plan's weight generation and follows the
/// newest generation of its plan: a `begin` of a later generation (a prepared
/// transfer's next step under the same plan identity) that passes every other check
/// moves it there and forgets the older generation's messages (which are stale from
/// then on: a replay can never report the new generation updated). A `done` of a
/// later generation, without its `begin`, is refused. [`Self::expect_generation`]
/// moves it explicitly (a floor: older messages are refused as stale).
///
/// Content: with [`Self::verify_content`], a `done` must carry content checksums,
/// and the acceptor reads its own target ranges of that writer and compares before
/// it counts the writer done; a mismatch leaves the participant `Torn` with the
/// ranges named ([`Self::mismatches`]).
///
/// Thread safety: `Send + Sync`; [`Self::accept`] takes `&mut self` (wrap it in a
/// mutex to share it, as [`super::NotifyRouter`] does).
#[derive(Clone, Debug)]
pub struct NotifyAcceptor {
    plan: TransferPlan,
    identity: String,
    participant: String,
    key: Option<Vec<u8>>,
    /// The generation the state is about.
    generation: u64,
    /// Read the target ranges of a `done` and compare its checksums.
    verify: bool,
    /// (participant, worker) -> (operations, bytes, ranges) predicted into `participant`.
    writers: BTreeMap<(String, String), (u64, u64, String)>,
    state: BTreeMap<(String, String), WriterState>,
    seen: BTreeSet<(NotifyKind, String, String, String)>,
    /// Transfers each writer began (at most [`MAX_TRANSFERS_PER_WRITER`]).
    begun: BTreeMap<(String, String), usize>,
    /// Where delta steps' encodings arrive ([`Self::accept_deltas`]).
    inbox: Option<super::delta::DeltaInbox>,
    /// Per writer, the generation its target ranges hold, verified by content and
    /// untouched since (a writer's full `begin` forgets it; see
    /// [`Self::held_generation`]).
    held: BTreeMap<(String, String), u64>,
    /// Reaches the participant's device buffers ([`Self::use_device_engine`]).
    device: Option<std::sync::Arc<dyn crate::device::DeviceEngine>>,
}

fn refuse(refusal: NotifyRefusal, message: String) -> Result<NotifyAccepted, NotifyError> {
    Err(NotifyError::new(refusal, message))
}

impl NotifyAcceptor {
    /// An acceptor for `target_participant` under `plan` (a bound plan: the one the
    /// target itself bound). `key`: `None` (messages carry a SHA-256 of their body)
    /// or the key shared with the sinks (at least 16 bytes). It does not verify
    /// content until [`Self::verify_content`].
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
            generation: plan.weight_generation(),
            verify: false,
            writers,
            state: BTreeMap::new(),
            seen: BTreeSet::new(),
            begun: BTreeMap::new(),
            inbox: None,
            held: BTreeMap::new(),
            device: None,
        })
    }

    /// Turns content verification on: from now on a `done` must carry content
    /// checksums (else it is refused, [`NotifyRefusal::Unverified`]), and the
    /// acceptor reads the target ranges of that writer in the participant's
    /// fragments at their planned addresses and compares before it counts the writer
    /// done. Device fragments are read through the acceptor's device engine
    /// ([`Self::use_device_engine`]). Errors (`Unsupported`, nothing changes): `target
    /// fragment <id> is device memory (...): content checksums need a device engine`.
    ///
    /// # Safety
    /// Every fragment of the acceptor's participant in the plan stays valid for reads
    /// (of its memory kind) at its planned address while the acceptor lives (the
    /// serving engine's weight buffers; a writer may be writing them while the
    /// acceptor reads).
    pub unsafe fn verify_content(&mut self) -> crate::Result<()> {
        let ops: Vec<u32> = (0..self.plan.regions().len() as u32)
            .filter(|&i| self.plan.operation_fragment(i as usize, Side::Target).0.participant_id() == self.participant)
            .collect();
        super::device_bytes::check_reachable(
            &self.plan,
            &ops,
            Side::Target,
            self.device.as_deref(),
            "content checksums",
        )?;
        self.verify = true;
        Ok(())
    }

    /// Sets the device copy engine through which the acceptor reads (content
    /// checksums) and writes (delta steps) the participant's device buffers, staged in
    /// host memory: call it before [`Self::verify_content`] when the participant's
    /// buffers are device memory. The acceptor keeps its own reference. Thread
    /// safety: `&mut self`.
    pub fn use_device_engine(&mut self, device: std::sync::Arc<dyn crate::device::DeviceEngine>) {
        self.device = Some(device);
    }

    /// Checks only the authenticator of `message` with the acceptor's key (what a
    /// router asks of a message it cannot route). Errors: those of [`decode`] before
    /// its body is read.
    pub fn authenticates(&self, message: &[u8]) -> Result<(), NotifyError> {
        let (kind, tag, body) = split(message)?;
        let (want_kind, want_tag) = mac(self.key.as_deref(), body);
        if kind != want_kind || !same_bytes(tag.as_bytes(), want_tag.as_bytes()) {
            return Err(NotifyError::new(
                NotifyRefusal::Forged,
                "notify message authentication failed (forged or corrupted)",
            ));
        }
        Ok(())
    }

    /// True once [`Self::verify_content`] turned verification on.
    pub fn verifies_content(&self) -> bool {
        self.verify
    }

    /// Accepts delta steps ([`super::delta`]): a `done` carrying a delta makes the
    /// acceptor read the writer's slot of `inbox`, apply the encoded changes to the
    /// target ranges, then verify their content as for any verified `done`. A delta
    /// applies only on the generation the target holds ([`Self::held_generation`]);
    /// any other is refused ([`NotifyRefusal::DeltaBase`]) and the target stays
    /// Torn until a full step. Errors (`InvalidArgument`, nothing changes): content
    /// verification is off (call [`Self::verify_content`] first), an empty inbox.
    ///
    /// # Safety
    /// `inbox` is host memory valid for reads while the acceptor lives (registered
    /// with the target's engine, written only by the sources' delta batches); every
    /// fragment of the participant stays valid for writes at its planned address,
    /// and nothing else writes it while a message is accepted.
    pub unsafe fn accept_deltas(&mut self, inbox: super::delta::DeltaInbox) -> crate::Result<()> {
        if !self.verify {
            return Err(Error::invalid("delta steps need content verification: call verify_content first"));
        }
        if inbox.capacity == 0 || inbox.address == 0 {
            return Err(Error::invalid("a delta inbox needs a non-NULL address and a capacity"));
        }
        self.inbox = Some(inbox);
        Ok(())
    }

    /// The weight generation the target's bytes hold, verified by content: the
    /// generation this acceptor reports Updated, when every writer's ranges were
    /// verified at it and are untouched since (a writer's full `begin` forgets its
    /// ranges); `None` before the first verified update, while a step is under way,
    /// after a mismatch, and in an acceptor that does not verify content. What a
    /// sink's delta steps need to hear from the target ([`super::TargetHeld`]).
    pub fn held_generation(&self) -> Option<u64> {
        let TargetOutcome::Updated { weight_generation: g } = self.outcome() else { return None };
        (self.verify && self.writers.keys().all(|w| self.held.get(w) == Some(&g))).then_some(g)
    }

    /// The plan identity messages must carry.
    pub fn plan_identity(&self) -> &str {
        &self.identity
    }
    /// The weight generation the acceptor's outcome is about (the plan's at first,
    /// then the newest accepted generation of the plan).
    pub fn weight_generation(&self) -> u64 {
        self.generation
    }
    /// The target participant.
    pub fn participant(&self) -> &str {
        &self.participant
    }
    /// The source executors `(participant, worker)` that write this participant.
    pub fn writers(&self) -> Vec<(String, String)> {
        self.writers.keys().cloned().collect()
    }

    /// Moves the acceptor to `generation` (a prepared transfer's next step, before
    /// any of its messages): the older generation's messages are forgotten and
    /// refused as stale from then on; the outcome is `Unchanged` until a writer
    /// announces the new generation. The same generation changes nothing.
    ///
    /// Errors (`StaleBinding`, nothing changes): `generation <g> is older than the
    /// acceptor's generation <current>`.
    pub fn expect_generation(&mut self, generation: u64) -> crate::Result<()> {
        if generation < self.generation {
            return Err(Error::new(
                ErrorKind::StaleBinding,
                format!("generation {generation} is older than the acceptor's generation {}", self.generation),
            ));
        }
        if generation > self.generation {
            self.generation = generation;
            self.state.clear();
            self.seen.clear();
            self.begun.clear();
        }
        Ok(())
    }

    /// Checks one message (the notify payload as received) and, when it is
    /// accepted, records it. Order of checks: format and authenticator ([`decode`]),
    /// plan identity (`OtherPlan`), generation (older than the acceptor's: `Stale`;
    /// later: `OtherPlan` unless it is a `begin`, checked on), addressee
    /// (`Misrouted`), writer and claims against the plan (`Forged`), replay
    /// (`Replayed`), sequence (`done` needs the writer's current `begin` of the same
    /// transfer: `Stale` when superseded, `Forged` when never begun), content (a
    /// verifying acceptor refuses a `done` without checksums: `Unverified`). An
    /// accepted `begin` of a later generation moves the acceptor to it first (see
    /// the type's documentation). A verified `done` whose bytes differ is accepted
    /// (it is authentic) and leaves the participant `Torn`
    /// ([`ContentCheck::Mismatch`]).
    pub fn accept(&mut self, message: &[u8]) -> Result<NotifyAccepted, NotifyError> {
        let m = decode(message, self.key.as_deref())?;
        let kind = m.parsed_kind()?;
        let g = self.generation;
        if m.plan != self.identity || m.resource_id != self.plan.resource_id() {
            if m.generation < g {
                return refuse(
                    NotifyRefusal::Stale,
                    format!("stale notification: generation {} is older than the bound generation {g}", m.generation),
                );
            }
            return refuse(
                NotifyRefusal::OtherPlan,
                format!("notification for generation {} names another plan than the bound one", m.generation),
            );
        }
        if m.generation < g {
            return refuse(
                NotifyRefusal::Stale,
                format!("stale notification: generation {} is older than the bound generation {g}", m.generation),
            );
        }
        if m.generation > g && kind == NotifyKind::Done {
            return refuse(
                NotifyRefusal::OtherPlan,
                format!(
                    "notification for generation {} but the acceptor is bound to generation {g} (and no writer began {})",
                    m.generation, m.generation
                ),
            );
        }
        if m.target_participant != self.participant {
            return refuse(
                NotifyRefusal::Misrouted,
                format!(
                    "notification is for target {} but this acceptor is for {}",
                    m.target_participant, self.participant
                ),
            );
        }
        let who = (m.source_participant.clone(), m.source_worker.clone());
        let Some((ops, bytes, ranges)) = self.writers.get(&who) else {
            return refuse(
                NotifyRefusal::Forged,
                format!("source executor ({}, {}) does not write {} under this plan", who.0, who.1, self.participant),
            );
        };
        if m.operations != *ops || m.bytes != *bytes || m.ranges != *ranges {
            return refuse(
                NotifyRefusal::Forged,
                format!(
                    "notification from ({}, {}) claims other target ranges than the plan ({} segments, {} bytes)",
                    who.0, who.1, m.operations, m.bytes
                ),
            );
        }
        if kind == NotifyKind::Done && self.verify && m.content.is_none() {
            return refuse(
                NotifyRefusal::Unverified,
                format!(
                    "done of transfer {} from ({}, {}) carries no content checksums but this acceptor verifies content \
                     (run the sink's steps content-verified)",
                    m.transfer_id, who.0, who.1
                ),
            );
        }
        if m.generation > g {
            // A begin of a later generation of this plan: the older one is over.
            let mut next = self.clone_empty(m.generation);
            let accepted = next.accept_current(&m, kind, who)?;
            *self = next;
            return Ok(accepted);
        }
        self.accept_current(&m, kind, who)
    }

    /// This acceptor at `generation` with no message recorded.
    fn clone_empty(&self, generation: u64) -> NotifyAcceptor {
        NotifyAcceptor {
            plan: self.plan.clone(),
            identity: self.identity.clone(),
            participant: self.participant.clone(),
            key: self.key.clone(),
            generation,
            verify: self.verify,
            writers: self.writers.clone(),
            state: BTreeMap::new(),
            seen: BTreeSet::new(),
            begun: BTreeMap::new(),
            inbox: self.inbox,
            held: self.held.clone(),
            device: self.device.clone(),
        }
    }

    /// The replay, sequence and content checks of a message of the acceptor's
    /// generation, then its record.
    fn accept_current(
        &mut self,
        m: &NotifyMessage,
        kind: NotifyKind,
        who: (String, String),
    ) -> Result<NotifyAccepted, NotifyError> {
        let key = (kind, who.0.clone(), who.1.clone(), m.transfer_id.clone());
        if self.seen.contains(&key) {
            return refuse(
                NotifyRefusal::Replayed,
                format!("replayed notification: {} of transfer {} from ({}, {})", m.kind, m.transfer_id, who.0, who.1),
            );
        }
        if kind == NotifyKind::Begin
            && self.seen.contains(&(NotifyKind::Done, who.0.clone(), who.1.clone(), m.transfer_id.clone()))
        {
            return refuse(
                NotifyRefusal::Replayed,
                format!(
                    "replayed notification: begin of finished transfer {} from ({}, {})",
                    m.transfer_id, who.0, who.1
                ),
            );
        }
        if kind == NotifyKind::Done {
            match self.state.get(&who) {
                Some(WriterState::Begun(t)) if *t == m.transfer_id => {}
                _ if self.seen.contains(&(NotifyKind::Begin, who.0.clone(), who.1.clone(), m.transfer_id.clone())) => {
                    return refuse(
                        NotifyRefusal::Stale,
                        format!(
                            "stale notification: transfer {} from ({}, {}) was superseded",
                            m.transfer_id, who.0, who.1
                        ),
                    )
                }
                _ => {
                    return refuse(
                        NotifyRefusal::Forged,
                        format!("done without begin: transfer {} from ({}, {})", m.transfer_id, who.0, who.1),
                    )
                }
            }
        }
        if let (NotifyKind::Done, Some(d)) = (kind, &m.delta) {
            self.apply_delta(&who, d, &m.transfer_id)?;
        }
        let content = match (kind, &m.content) {
            (NotifyKind::Begin, _) | (NotifyKind::Done, None) => ContentCheck::Absent,
            (NotifyKind::Done, Some(_)) if !self.verify => ContentCheck::NotChecked,
            (NotifyKind::Done, Some(c)) => self.check_content(&who, c)?,
        };
        if kind == NotifyKind::Begin {
            let n = self.begun.entry(who.clone()).or_default();
            if *n >= MAX_TRANSFERS_PER_WRITER {
                return refuse(
                    NotifyRefusal::TooMany,
                    format!(
                        "({}, {}) already began {MAX_TRANSFERS_PER_WRITER} transfers under this acceptor (the most \
                         it remembers); bind a new acceptor",
                        who.0, who.1
                    ),
                );
            }
            *n += 1;
        }
        self.seen.insert(key);
        let next = match (kind, &content) {
            (NotifyKind::Begin, _) => WriterState::Begun(m.transfer_id.clone()),
            (NotifyKind::Done, ContentCheck::Mismatch(r)) => WriterState::Mismatch(m.transfer_id.clone(), r.clone()),
            (NotifyKind::Done, _) => WriterState::Done(m.transfer_id.clone()),
        };
        self.state.insert(who.clone(), next);
        let outcome = self.outcome();
        match (kind, &m.delta, &content) {
            // A full step's bytes land in the writer's ranges before its done.
            (NotifyKind::Begin, None, _) | (NotifyKind::Done, _, ContentCheck::Mismatch(_)) => {
                self.held.remove(&who);
            }
            (NotifyKind::Done, _, ContentCheck::Verified) => {
                self.held.insert(who.clone(), self.generation);
            }
            _ => {}
        }
        Ok(NotifyAccepted {
            kind,
            source_participant: who.0,
            source_worker: who.1,
            transfer_id: m.transfer_id.clone(),
            weight_generation: self.generation,
            content,
            outcome,
        })
    }

    /// Applies a writer's delta from its inbox slot to the target ranges (refused,
    /// [`NotifyRefusal::DeltaBase`], when it cannot apply; the held generation is
    /// forgotten once anything may have been written).
    fn apply_delta(&mut self, who: &(String, String), d: &NotifyDelta, transfer: &str) -> Result<(), NotifyError> {
        let refuse = |why: String| {
            Err(NotifyError::new(
                NotifyRefusal::DeltaBase,
                format!(
                    "delta of transfer {transfer} from ({}, {}): {why}; the target needs a full step",
                    who.0, who.1
                ),
            ))
        };
        let Some(inbox) = self.inbox else { return refuse("this acceptor takes no deltas (no inbox)".into()) };
        if self.held.get(who) != Some(&d.base) {
            let holds = self.held.get(who).map_or("no verified generation".to_string(), |g| format!("generation {g}"));
            return refuse(format!("it applies to generation {} but the writer's target ranges hold {holds}", d.base));
        }
        let Some((offset, len)) =
            super::delta::inbox_slot(&self.plan, &self.participant, (&who.0, &who.1), inbox.capacity)
        else {
            return refuse("the writer has no slot in the inbox".into());
        };
        if d.bytes > len {
            return refuse(format!("{} bytes exceed the writer's slot of {len}", d.bytes));
        }
        let e = plan_executors_by_key(&self.plan);
        let Some(e) = e.get(&(who.0.as_str(), who.1.as_str())) else {
            return refuse("the writer is not a source executor of the plan".into());
        };
        let ops = operations_into(&self.plan, e, &self.participant);
        // SAFETY: `accept_deltas`'s contract: the inbox is readable host memory and
        // the slot lies inside it (`inbox_slot` splits its capacity).
        let bytes =
            unsafe { std::slice::from_raw_parts((inbox.address + offset) as usize as *const u8, d.bytes as usize) };
        // SAFETY: `accept_deltas`'s contract: the participant's fragments are valid
        // for writes, written by no one else meanwhile.
        let applied = unsafe { super::delta::apply_to_target(&self.plan, &ops, bytes, self.device.as_deref()) };
        if let Err(e) = applied {
            self.held.remove(who);
            return refuse(format!("it does not apply: {}", e.message()));
        }
        Ok(())
    }

    /// Compares a writer's checksums with the target ranges (a message whose group
    /// count differs from the plan's is forged).
    fn check_content(&self, who: &(String, String), c: &NotifyContent) -> Result<ContentCheck, NotifyError> {
        let e = plan_executors_by_key(&self.plan);
        let Some(e) = e.get(&(who.0.as_str(), who.1.as_str())) else {
            return Err(NotifyError::new(NotifyRefusal::Forged, "writer is not a source executor of the plan"));
        };
        let ops = operations_into(&self.plan, e, &self.participant);
        let groups = content_groups(ops.len());
        if groups.len() != c.crc32c.len() {
            return Err(NotifyError::new(
                NotifyRefusal::Forged,
                format!(
                    "notification from ({}, {}) carries {} content checksums, the plan has {} groups",
                    who.0,
                    who.1,
                    c.crc32c.len(),
                    groups.len()
                ),
            ));
        }
        // SAFETY: `verify_content`'s contract: the participant's fragments are valid
        // for reads while the acceptor lives.
        let local = unsafe { content_checksums(&self.plan, &ops, Side::Target, self.device.as_deref()) }
            .map_err(|e| NotifyError::new(NotifyRefusal::Malformed, e.message().to_string()))?;
        let mut ranges = Vec::new();
        for ((g, want), got) in groups.into_iter().zip(&c.crc32c).zip(&local) {
            if want == got {
                continue;
            }
            for &i in &ops[g] {
                let r = &self.plan.regions()[i as usize];
                let f = self.plan.operation_fragment(i as usize, Side::Target).1;
                ranges.push(MismatchedRange {
                    operation: i,
                    fragment_id: f.fragment_id().to_string(),
                    offset: r.target_base_offset,
                    bytes: r.total_bytes(),
                });
            }
        }
        Ok(if ranges.is_empty() { ContentCheck::Verified } else { ContentCheck::Mismatch(ranges) })
    }

    /// The writers of the current generation whose verified bytes differ in the
    /// target, with the mismatched ranges (empty when none).
    pub fn mismatches(&self) -> Vec<ContentMismatch> {
        self.state
            .iter()
            .filter_map(|(who, st)| match st {
                WriterState::Mismatch(t, r) => Some(ContentMismatch {
                    source_participant: who.0.clone(),
                    source_worker: who.1.clone(),
                    transfer_id: t.clone(),
                    ranges: r.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// The participant's outcome for [`Self::weight_generation`] from the messages
    /// accepted so far (the rules of [`target_outcomes`]): Updated once every writer
    /// said `done` for its latest transfer (with matching content when the acceptor
    /// verifies); Unchanged while none said anything; Torn otherwise (the incomplete
    /// or mismatched writers listed).
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
                    WriterState::Mismatch(..) => {
                        let mut err = TransferError::engine("the target's bytes differ from the source's checksums");
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
        match target_outcomes(&self.plan, TransferMode::Sink, &records).remove(&self.participant) {
            Some(TargetOutcome::Updated { .. }) => TargetOutcome::Updated { weight_generation: self.generation },
            Some(o) => o,
            None => TargetOutcome::Unchanged,
        }
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
            content: None,
            delta: None,
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
