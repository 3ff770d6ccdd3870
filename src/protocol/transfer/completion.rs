//! Completion tracking of live transfers (`live-transfer.md` §8): the process-wide
//! table of pending transfers (keyed by ids we allocate, never by a native
//! pointer), the per-engine submission reservation, one batch's outcome (legacy
//! status codes, tickets, drains), status queries and drains, and the
//! registration-cleanup quarantine (§8.5).
//!
//! Hand-off (§8.4): an executor call hands its whole part over at once, so its
//! entry is *sealed* when created. Nested registration scopes
//! ([`super::scope::RegistrationScope`]) create the entry when the batch's outcome is
//! unknown and then add their parts one by one as they close (innermost first);
//! until the outermost scope of that engine has added its part the hand-off is
//! *incomplete*: the entry blocks its engine like any other, but status queries and
//! drains refuse it (`pending transfer resource handoff is incomplete: <id>`), so a
//! drain can never unregister memory that a scope still holds.
//!
//! A pending entry owns everything that DMA might still touch: the engine handle,
//! the ticket, the addresses we registered, the allocation lifetime tokens (whose
//! guards keep the framework's owners alive) and the plan and bindings. It blocks
//! its engine identity until a drain releases it; a restart-required entry can never
//! be drained: only a new engine (a new identity) runs again.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use super::error::{TransferError, TransferErrorKind};
use crate::engine::{CompletionStatus, EngineCallError, EngineResult, TransferBatch, TransferEngine, TransferTicket};
use crate::protocol::guards::{LifetimeToken, TerminalState};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Status name of a restart-required unknown entry.
pub const COMPLETION_UNKNOWN_RESTART_REQUIRED: &str = "COMPLETION_UNKNOWN_RESTART_REQUIRED";

pub(crate) struct PendingEntry {
    identity: u64,
    engine: Arc<dyn TransferEngine>,
    ticket: Option<Arc<dyn TransferTicket>>,
    /// Addresses we registered and must unregister after the drain.
    registrations: Vec<u64>,
    tokens: Vec<Box<dyn LifetimeToken>>,
    /// Kept alive until the drain (plan, bindings, leases).
    resources: Vec<Box<dyn Any + Send>>,
    restart_required: bool,
    /// Set for cleanup entries (and after a drain saw a terminal status): the status
    /// name and the state the tokens are released with.
    terminal: Option<(String, TerminalState)>,
    draining: bool,
    /// Every part has been handed off (`resources_handed_off`): only then can the
    /// entry be queried or drained.
    sealed: bool,
}

#[derive(Default)]
struct Table {
    entries: BTreeMap<String, PendingEntry>,
    active: BTreeSet<u64>,
}

static TABLE: Mutex<Table> = Mutex::new(Table { entries: BTreeMap::new(), active: BTreeSet::new() });

fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// An active submission on one engine identity; released on drop.
pub(crate) struct Reservation {
    identity: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        TABLE.lock().active.remove(&self.identity);
    }
}

/// Reserves `identity` for one execution (§8.2): refused while a pending entry of
/// that identity exists (the smallest id is named) or another submission is active.
pub(crate) fn reserve(identity: u64) -> Result<Reservation, TransferError> {
    let mut t = TABLE.lock();
    if let Some((id, e)) = t.entries.iter().find(|(_, e)| e.identity == identity) {
        let msg = if e.restart_required {
            format!("transfer engine is blocked by restart-required pending transfer {id}; restart before submitting another transfer")
        } else {
            format!("transfer engine has pending transfer {id}; call drain_pending_transfer before submitting another transfer, or restart if it cannot be drained")
        };
        return Err(TransferError::engine(msg));
    }
    if !t.active.insert(identity) {
        return Err(TransferError::engine("transfer engine already has an active resource transfer submission"));
    }
    Ok(Reservation { identity })
}

/// True while another submission is active on `identity` (and no pending entry
/// blocks it): [`reserve`] would refuse now, but not for good.
pub(crate) fn engine_busy(identity: u64) -> bool {
    let t = TABLE.lock();
    t.active.contains(&identity) && !t.entries.values().any(|e| e.identity == identity)
}

/// What the executor hands to a pending entry.
pub(crate) struct Handoff {
    pub registrations: Vec<u64>,
    pub tokens: Vec<Box<dyn LifetimeToken>>,
    pub resources: Vec<Box<dyn Any + Send>>,
}

fn insert(entry: PendingEntry) -> String {
    let id = new_id();
    TABLE.lock().entries.insert(id.clone(), entry);
    id
}

/// Creates a registration-cleanup entry (§8.5) for `failed` addresses.
pub(crate) fn quarantine_cleanup(
    identity: u64,
    engine: &Arc<dyn TransferEngine>,
    failed: Vec<u64>,
    state: TerminalState,
    handoff: Handoff,
) -> String {
    let status = match state {
        TerminalState::Completed => "COMPLETED",
        TerminalState::FailedDrained => "FAILED_DRAINED",
        TerminalState::Aborted => "ABORTED",
    };
    insert(PendingEntry {
        identity,
        engine: engine.clone(),
        ticket: None,
        registrations: failed,
        tokens: handoff.tokens,
        resources: handoff.resources,
        restart_required: false,
        terminal: Some((status.to_string(), state)),
        draining: false,
        sealed: true,
    })
}

/// How one batch ended, before hand-off.
pub(crate) enum BatchOutcome {
    Completed,
    /// A known failure: no operation can still touch memory.
    Failed(String),
    /// DMA may still run: the ticket (if any) and restart-required flag go to a
    /// pending entry; `interrupted` carries the interruption text.
    Unknown {
        ticket: Option<Box<dyn TransferTicket>>,
        restart_required: bool,
        interrupted: Option<String>,
    },
}

/// A batch handed to the engine ([`submit_batch`]).
pub(crate) enum Submission {
    /// Running under the engine's ticket.
    Ticket(Box<dyn TransferTicket>),
    /// The engine has no ticketed call: run it with [`run_synchronous`].
    Synchronous,
    /// The submission failed: completion is unknown.
    Failed(BatchOutcome),
}

/// Submits one batch (§8.3): the scatter call when the engine has one, else the
/// ticketed call; [`Submission::Synchronous`] when it has neither.
pub(crate) fn submit_batch(engine: &dyn TransferEngine, batch: &TransferBatch) -> Submission {
    let submitted = match engine.submit_ranges_with_ticket(batch) {
        Some(r) => Some(r),
        None => engine.submit_with_ticket(batch),
    };
    match submitted {
        Some(Ok(ticket)) => Submission::Ticket(ticket),
        Some(Err(e)) => Submission::Failed(BatchOutcome::Unknown {
            ticket: None,
            restart_required: true,
            interrupted: e.interrupted.then(|| e.message.clone()),
        }),
        None => Submission::Synchronous,
    }
}

/// What a ticket's status says of its batch: `Err(ticket)` while it runs
/// (`CompletionUnknown`), else how the batch ended.
pub(crate) fn judge_ticket(
    batch: &TransferBatch,
    ticket: Box<dyn TransferTicket>,
    status: EngineResult<CompletionStatus>,
) -> Result<BatchOutcome, Box<dyn TransferTicket>> {
    match status {
        Ok(CompletionStatus::Completed) => Ok(BatchOutcome::Completed),
        Ok(CompletionStatus::CompletionUnknown) => Err(ticket),
        Ok(other) => {
            let dir = match batch.direction() {
                crate::engine::Direction::Read => "from",
                crate::engine::Direction::Write => "to",
            };
            Ok(BatchOutcome::Failed(format!("batch transfer {dir} {} failed: {}", batch.endpoint(), other.name())))
        }
        Err(e) => Ok(BatchOutcome::Unknown {
            ticket: Some(ticket),
            restart_required: false,
            interrupted: e.interrupted.then(|| e.message.clone()),
        }),
    }
}

/// Runs one batch through the engine's legacy synchronous call: any result but 0
/// leaves completion unknown (restart required).
pub(crate) fn run_synchronous(engine: &dyn TransferEngine, batch: &TransferBatch) -> BatchOutcome {
    match engine.batch_transfer_sync(batch) {
        Ok(0) => BatchOutcome::Completed,
        Ok(_) => BatchOutcome::Unknown { ticket: None, restart_required: true, interrupted: None },
        Err(e) => BatchOutcome::Unknown {
            ticket: None,
            restart_required: true,
            interrupted: e.interrupted.then(|| e.message.clone()),
        },
    }
}

/// Runs one batch through the engine (§8.3): [`submit_batch`], then up to `attempts`
/// inline drains of `timeout_ms` each while completion is unknown (an interrupted
/// drain stops at once; other drain errors are retried).
pub(crate) fn execute_batch(
    engine: &dyn TransferEngine,
    batch: &TransferBatch,
    attempts: u32,
    timeout_ms: u64,
) -> BatchOutcome {
    let mut ticket = match submit_batch(engine, batch) {
        Submission::Ticket(t) => t,
        Submission::Synchronous => return run_synchronous(engine, batch),
        Submission::Failed(outcome) => return outcome,
    };
    let status = ticket.status();
    ticket = match judge_ticket(batch, ticket, status) {
        Ok(outcome) => return outcome,
        Err(t) => t,
    };
    for _ in 0..attempts {
        match ticket.drain(timeout_ms) {
            Err(EngineCallError { interrupted: false, .. }) => continue,
            status => {
                ticket = match judge_ticket(batch, ticket, status) {
                    Ok(outcome) => return outcome,
                    Err(t) => t,
                }
            }
        }
    }
    BatchOutcome::Unknown { ticket: Some(ticket), restart_required: false, interrupted: None }
}

/// Unregisters each of `addresses` in the given order, attempting all; returns the
/// failures in that order: the address with the engine's non-zero code (`Ok`) or
/// its error text (`Err`: the outcome is unknown).
fn unregister_each(
    engine: &dyn TransferEngine,
    addresses: impl IntoIterator<Item = u64>,
) -> Vec<(u64, std::result::Result<String, String>)> {
    addresses
        .into_iter()
        .filter_map(|a| match engine.unregister_memory(a) {
            Ok(0) => None,
            Ok(code) => Some((a, Ok(crate::pyrepr::repr(&(a, i64::from(code)))))),
            Err(e) => Some((a, Err(e.message))),
        })
        .collect()
}

/// The reference's `<failures>` list from per-failure tuple texts.
fn failures_list(failures: &[String]) -> String {
    format!("[{}]", failures.join(", "))
}

/// Unregisters `addresses` in reverse order, attempting all; returns the failed
/// addresses and, per failure, the reference's tuple text: `(address, status)` or
/// `(address, 'error')`.
pub(crate) fn unregister_all(engine: &dyn TransferEngine, addresses: &[u64]) -> (Vec<u64>, Vec<String>) {
    unregister_each(engine, addresses.iter().rev().copied())
        .into_iter()
        .map(|(a, r)| (a, r.unwrap_or_else(|message| crate::pyrepr::repr(&(a, message)))))
        .unzip()
}

/// Hands an unknown batch's resources to a new pending entry and builds the error
/// (`TransferCompletionUnknownError` or `TransferCompletionInterrupted`). The
/// hand-off is complete at once (the entry is sealed).
pub(crate) fn retain_unknown(
    identity: u64,
    engine: &Arc<dyn TransferEngine>,
    ticket: Option<Box<dyn TransferTicket>>,
    restart_required: bool,
    interrupted: Option<String>,
    handoff: Handoff,
) -> TransferError {
    new_unknown(identity, engine, ticket, restart_required, interrupted, handoff, true)
}

/// Creates the pending entry of an unknown batch run inside registration scopes
/// with nothing handed off yet (an incomplete hand-off; see the module docs). The
/// scopes add their parts with [`hand_off`]; the last one seals it.
pub(crate) fn begin_unknown(
    identity: u64,
    engine: &Arc<dyn TransferEngine>,
    ticket: Option<Box<dyn TransferTicket>>,
    restart_required: bool,
    interrupted: Option<String>,
) -> TransferError {
    let empty = Handoff { registrations: Vec::new(), tokens: Vec::new(), resources: Vec::new() };
    new_unknown(identity, engine, ticket, restart_required, interrupted, empty, false)
}

fn new_unknown(
    identity: u64,
    engine: &Arc<dyn TransferEngine>,
    ticket: Option<Box<dyn TransferTicket>>,
    restart_required: bool,
    interrupted: Option<String>,
    handoff: Handoff,
    sealed: bool,
) -> TransferError {
    let id = insert(PendingEntry {
        identity,
        engine: engine.clone(),
        ticket: ticket.map(Arc::from),
        registrations: handoff.registrations,
        tokens: handoff.tokens,
        resources: handoff.resources,
        restart_required,
        terminal: None,
        draining: false,
        sealed,
    });
    let suffix = if restart_required {
        "; legacy API exposes no drainable ticket, so this engine is restart-required"
    } else {
        ""
    };
    let mut e = match interrupted {
        Some(cause) => TransferError::new(
            TransferErrorKind::Interrupted,
            format!("batch transfer was interrupted while completion was unknown ({cause}); registrations remain quarantined as {id}{suffix}"),
        )
        .with_cause(cause),
        None => TransferError::new(
            TransferErrorKind::CompletionUnknown,
            format!("batch transfer completion is unknown; registrations remain quarantined as {id}{suffix}"),
        ),
    };
    e.pending_transfer_id = Some(id);
    e.engine_identity = Some(identity);
    e.restart_required = restart_required;
    e.submitted = true;
    e
}

/// Adds one scope's part to the incomplete hand-off `id` (`_retain_pending_resources`,
/// §8.4) and seals it when `seal` (the outermost scope). On error nothing is taken
/// over and the part is leaked: its addresses stay registered and its resources and
/// tokens are never dropped, since DMA may still touch the memory they keep alive.
///
/// Errors (engine): `pending transfer does not exist: <id>` (unknown id or another
/// identity), `pending transfer resources cannot be handed off while draining: <id>`,
/// `pending transfer resources were already handed off: <id>` (sealed),
/// `pending transfer has conflicting allocation lifetime token` (a token id already
/// present with another token).
pub(crate) fn hand_off(identity: u64, id: &str, part: Handoff, seal: bool) -> Result<(), TransferError> {
    let mut t = TABLE.lock();
    let refused = match t.entries.get_mut(id).filter(|e| e.identity == identity) {
        None => Some(not_found(id)),
        Some(e) if e.draining => {
            Some(TransferError::engine(format!("pending transfer resources cannot be handed off while draining: {id}")))
        }
        Some(e) if e.sealed => {
            Some(TransferError::engine(format!("pending transfer resources were already handed off: {id}")))
        }
        Some(e) => {
            let held: BTreeSet<&str> = e.tokens.iter().map(|t| t.fence().token_id.as_str()).collect();
            if part.tokens.iter().any(|t| held.contains(t.fence().token_id.as_str())) {
                Some(TransferError::engine("pending transfer has conflicting allocation lifetime token"))
            } else {
                None
            }
        }
    };
    if let Some(err) = refused {
        drop(t);
        std::mem::forget(part);
        return Err(err);
    }
    let e = t.entries.get_mut(id).expect("checked above");
    e.registrations.extend(part.registrations);
    e.tokens.extend(part.tokens);
    e.resources.extend(part.resources);
    e.sealed = seal;
    Ok(())
}

fn incomplete(id: &str) -> TransferError {
    TransferError::engine(format!("pending transfer resource handoff is incomplete: {id}"))
}

/// Sorted pending ids of `identity`.
pub fn pending_transfer_ids(identity: u64) -> Vec<String> {
    TABLE.lock().entries.iter().filter(|(_, e)| e.identity == identity).map(|(k, _)| k.clone()).collect()
}

/// What one pending transfer of an engine still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingTransferInfo {
    /// The pending transfer id (drain it with [`drain_pending_transfer`]).
    pub id: String,
    /// Addresses the library registered and has not unregistered (quarantined).
    pub registrations: Vec<u64>,
    /// Allocation-guard pins (lifetime tokens) it holds.
    pub pinned_tokens: usize,
    /// True when it can never be drained (restart the engine).
    pub restart_required: bool,
    /// True while a submitted batch's completion is unknown (the engine may still
    /// move bytes); false for a registration-cleanup entry.
    pub completion_unknown: bool,
}

/// Every pending transfer of the engine `identity`, with what it holds (sorted by
/// id): what a caller proving that nothing leaked asks. Entries still being handed
/// off are included with what they hold so far.
pub fn pending_transfers(identity: u64) -> Vec<PendingTransferInfo> {
    TABLE
        .lock()
        .entries
        .iter()
        .filter(|(_, e)| e.identity == identity)
        .map(|(id, e)| PendingTransferInfo {
            id: id.clone(),
            registrations: e.registrations.clone(),
            pinned_tokens: e.tokens.len(),
            restart_required: e.restart_required,
            completion_unknown: e.terminal.is_none(),
        })
        .collect()
}

fn not_found(id: &str) -> TransferError {
    TransferError::engine(format!("pending transfer does not exist: {id}"))
}

/// Drains every pending transfer of the engine `identity` once
/// ([`drain_pending_transfer`] with `timeout_ms` each, in id order), also after a
/// failure: the first failure, if any (a transfer that failed to drain, or whose
/// completion is still unknown, stays pending; [`pending_transfer_ids`] says which).
pub fn drain_pending_transfers(identity: u64, timeout_ms: u64) -> Result<(), TransferError> {
    let mut first = None;
    for id in pending_transfer_ids(identity) {
        if let Err(e) = drain_pending_transfer(identity, &id, timeout_ms) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// `pending_transfer_status(id)`: the ticket's status name,
/// `COMPLETION_UNKNOWN_RESTART_REQUIRED`, or the recorded terminal status of a
/// cleanup entry. A ticket whose status cannot be read reports `COMPLETION_UNKNOWN`.
///
/// Errors: `pending transfer does not exist: <id>`; `pending transfer resource
/// handoff is incomplete: <id>` while registration scopes are still handing their
/// parts to the entry.
pub fn pending_transfer_status(identity: u64, id: &str) -> Result<String, TransferError> {
    let ticket = {
        let t = TABLE.lock();
        let e = t.entries.get(id).filter(|e| e.identity == identity).ok_or_else(|| not_found(id))?;
        if !e.sealed {
            return Err(incomplete(id));
        }
        if let Some((name, _)) = &e.terminal {
            return Ok(name.clone());
        }
        if e.restart_required {
            return Ok(COMPLETION_UNKNOWN_RESTART_REQUIRED.into());
        }
        e.ticket.clone()
    };
    // The ticket is asked outside the table lock (it may be a C callback).
    Ok(match ticket.map(|t| t.status()) {
        Some(Ok(s)) => s.name().to_string(),
        _ => "COMPLETION_UNKNOWN".into(),
    })
}

/// `drain_pending_transfer(id, timeout_ms)` (§8.4): drains the ticket once; while
/// completion is unknown (or the entry is restart-required) returns
/// `COMPLETION_UNKNOWN` and keeps everything; on a terminal status unregisters the
/// entry's own registrations (descending addresses), releases its tokens last-first
/// with `completed` / `failed_drained` (or the recorded state), removes the entry
/// and returns the status name. Thread-safe: a concurrent drain of the same id fails
/// `pending transfer is already being drained: <id>`.
///
/// Errors: `pending transfer does not exist: <id>`; `pending transfer resource
/// handoff is incomplete: <id>` (nothing drained or unregistered); `pending transfer registration
/// cleanup failed: <failures>` (entry kept with the failed addresses); `pending
/// transfer unregister_memory outcome is unknown; engine restart required: <error>`
/// and `pending transfer allocation lifetime release outcome is unknown; engine
/// restart required: <error>` (entry kept, restart-required).
pub fn drain_pending_transfer(identity: u64, id: &str, timeout_ms: u64) -> Result<String, TransferError> {
    // Phase 1: claim the entry.
    let (ticket, recorded) = {
        let mut t = TABLE.lock();
        let e = t.entries.get_mut(id).filter(|e| e.identity == identity).ok_or_else(|| not_found(id))?;
        if !e.sealed {
            return Err(incomplete(id));
        }
        if e.draining {
            return Err(TransferError::engine(format!("pending transfer is already being drained: {id}")));
        }
        if e.restart_required {
            return Ok("COMPLETION_UNKNOWN".into());
        }
        e.draining = true;
        (e.ticket.clone(), e.terminal.clone())
    };
    // Phase 2: the drain, outside the lock.
    let (name, state) = match recorded {
        Some(r) => r,
        None => {
            let status = ticket.as_ref().map(|t| t.drain(timeout_ms));
            match status {
                Some(Ok(CompletionStatus::Completed)) => ("COMPLETED".to_string(), TerminalState::Completed),
                Some(Ok(CompletionStatus::CompletionUnknown)) | Some(Err(_)) | None => {
                    let mut t = TABLE.lock();
                    let e = t.entries.get_mut(id).expect("a claimed entry stays");
                    e.draining = false;
                    return Ok("COMPLETION_UNKNOWN".into());
                }
                Some(Ok(other)) => (other.name().to_string(), TerminalState::FailedDrained),
            }
        }
    };
    // Phase 3: unregister and release, outside the lock.
    let (engine, registrations, mut tokens) = {
        let mut t = TABLE.lock();
        let e = t.entries.get_mut(id).expect("a claimed entry stays");
        e.terminal = Some((name.clone(), state));
        (e.engine.clone(), std::mem::take(&mut e.registrations), std::mem::take(&mut e.tokens))
    };
    let mut addresses = registrations;
    addresses.sort_unstable_by(|a, b| b.cmp(a));
    let outcomes = unregister_each(&*engine, addresses);
    let failed: Vec<u64> = outcomes.iter().map(|(a, _)| *a).collect();
    let failures: Vec<String> = outcomes.iter().filter_map(|(_, r)| r.as_ref().ok().cloned()).collect();
    let unknown = outcomes.into_iter().find_map(|(_, r)| r.err());
    let restore = |failed: Vec<u64>, tokens: Vec<Box<dyn LifetimeToken>>, restart: bool| {
        let mut t = TABLE.lock();
        let e = t.entries.get_mut(id).expect("a claimed entry stays");
        e.registrations = failed;
        e.tokens = tokens;
        e.draining = false;
        e.restart_required |= restart;
    };
    if let Some(err) = unknown {
        restore(failed, tokens, true);
        return Err(TransferError::engine(format!(
            "pending transfer unregister_memory outcome is unknown; engine restart required: {err}"
        )));
    }
    if !failed.is_empty() {
        restore(failed, tokens, false);
        return Err(TransferError::engine(format!(
            "pending transfer registration cleanup failed: {}",
            failures_list(&failures)
        )));
    }
    while let Some(mut tok) = tokens.pop() {
        if let Err(err) = tok.release(state) {
            restore(Vec::new(), tokens, true);
            return Err(TransferError::engine(format!(
                "pending transfer allocation lifetime release outcome is unknown; engine restart required: {}",
                err.message()
            )));
        }
    }
    TABLE.lock().entries.remove(id);
    Ok(name)
}

/// Test support: true while the pending entry `id` keeps resources.
pub fn pending_transfer_holds_resources(identity: u64, id: &str) -> bool {
    TABLE.lock().entries.get(id).is_some_and(|e| e.identity == identity && !e.resources.is_empty())
}

/// The error of a registration cleanup that failed and is quarantined as `id`
/// (`{label} unregister_memory failed: ...`) on the engine of `identity`.
pub(crate) fn cleanup_error(label: &str, failures: &[String], id: String, identity: u64) -> TransferError {
    let mut e = TransferError::new(
        TransferErrorKind::RegistrationCleanupPending,
        format!(
            "{label} unregister_memory failed: {}; registration cleanup is quarantined as {id}",
            failures_list(failures)
        ),
    );
    e.pending_transfer_id = Some(id);
    e.engine_identity = Some(identity);
    e
}
