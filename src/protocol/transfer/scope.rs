//! Registration scopes (`live-transfer.md` §7.1 and the hand-off of §8.4): own
//! registrations of local memory as nestable scopes, and batches run inside them.
//!
//! The sink and reader ([`super::executor`]) register one side per call and hand
//! everything off at once. A caller that composes its own transfers (the
//! reference's nested `registered_targets` / `registered_sources` context managers:
//! register a target allocation, inside it a source allocation, run batches) uses
//! these scopes instead:
//!
//! * [`TransferExecutor::open_registration_scope`] opens the outermost scope on the
//!   executor's engine: it reserves the engine (§8.2, so the fences of the executors
//!   hold) and registers the given whole allocations (none = pre-registered memory).
//! * [`RegistrationScope::nested`] opens a scope inside another. On the same engine
//!   identity it joins the enclosing nest of that engine; on another engine it starts
//!   that engine's own nest (and reserves it). A scope can only close after the
//!   scopes nested in it (they borrow it).
//! * [`RegistrationScope::execute_batch`] runs one batch (§8.3). When its completion
//!   is unknown (or an engine call was interrupted) a pending entry is created with
//!   nothing handed off yet and the error names it.
//! * [`RegistrationScope::close`] (or drop): when its engine's nest has a pending
//!   entry — whether or not the caller propagated the error — the scope hands its
//!   registrations and retained resources to that entry instead of unregistering;
//!   the outermost scope of that engine seals the hand-off. Until then
//!   `pending_transfer_status` and `drain_pending_transfer` fail `pending transfer
//!   resource handoff is incomplete: <id>`. Scopes of other engines are unaffected:
//!   they unregister at once. Without a pending entry a scope unregisters its own
//!   addresses in reverse order (attempting all); failures go to a
//!   registration-cleanup entry (§8.5) and the close fails
//!   `<label> unregister_memory failed: <failures>; registration cleanup is
//!   quarantined as <id>`.
//!
//! The outermost scope of an engine holds that engine's submission reservation, so
//! while it is open the sink and reader refuse to run on the same engine
//! (`transfer engine already has an active resource transfer submission`): batches
//! of a nest go through [`RegistrationScope::execute_batch`].
//!
//! Lifetime tokens are not part of a scope: a caller that holds pins passes them as
//! resources ([`RegistrationScope::retain`]), which a pending entry keeps until its
//! drain has unregistered every address.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use super::completion::{
    self, begin_unknown, cleanup_error, execute_batch, hand_off, quarantine_cleanup, unregister_all, BatchOutcome,
    Handoff,
};
use super::error::{TransferError, TransferErrorKind, TransferResult};
use super::executor::TransferExecutor;
use crate::engine::{MemoryRegion, TransferBatch};
use crate::protocol::guards::TerminalState;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// The state shared by the scopes of one engine identity in one nest.
#[derive(Default)]
struct Nest {
    /// The pending entry whose hand-off is in progress.
    pending: Option<String>,
    /// A batch of the nest failed with a known failure (the terminal state of a
    /// registration-cleanup entry is then `failed_drained`).
    failed: bool,
}

/// How a scope ended ([`RegistrationScope::close`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScopeExit {
    /// Every own address was unregistered; retained resources were dropped.
    Unregistered,
    /// The own addresses and resources were handed to the pending entry
    /// `pending_transfer_id`; `sealed` is true for the outermost scope of the engine
    /// (the hand-off is complete).
    HandedOff {
        /// The pending entry.
        pending_transfer_id: String,
        /// The hand-off is complete.
        sealed: bool,
    },
}

/// One registration scope on one engine. Not `Sync`; `Send`. See the module docs.
pub struct RegistrationScope<'p> {
    exec: TransferExecutor,
    label: String,
    /// Own registrations, in registration order.
    registered: Vec<u64>,
    resources: Vec<Box<dyn Any + Send>>,
    nest: Arc<Mutex<Nest>>,
    /// The nests of the enclosing scopes by engine identity (this one's included).
    chain: Vec<(u64, Arc<Mutex<Nest>>)>,
    outermost: bool,
    /// Held by the outermost scope of each engine; released after it closes.
    reservation: Option<completion::Reservation>,
    closed: bool,
    _parent: PhantomData<&'p ()>,
}

impl std::fmt::Debug for RegistrationScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationScope")
            .field("identity", &self.exec.engine_identity())
            .field("label", &self.label)
            .field("registered", &self.registered.len())
            .field("outermost", &self.outermost)
            .finish()
    }
}

impl TransferExecutor {
    /// Opens the outermost registration scope on this executor's engine: reserves
    /// the engine (§8.2) and registers `regions` (whole allocations, in order; an
    /// empty list is a scope over pre-registered memory). `label` names the side in
    /// errors (`source`, `target`).
    ///
    /// Errors: the reservation refusals of §8.2 (a pending transfer, an active
    /// submission), engine identity changes,
    /// `<label> allocation capacity mismatch: <address>` (one base with two sizes),
    /// `<label> register_memory failed for <address>: <status or error>` (what was
    /// registered before is unregistered again; if that fails, a
    /// `RegistrationCleanupPending` error naming the quarantine entry).
    /// Thread-safe; the scope belongs to the calling code.
    ///
    /// # Safety
    /// Each region must stay valid for reads and writes by the engine until the
    /// scope's registrations are unregistered: by the scope when it closes without a
    /// pending transfer, otherwise by the drain of the pending entry (possibly never).
    pub unsafe fn open_registration_scope(
        &self,
        label: &str,
        regions: &[MemoryRegion],
    ) -> TransferResult<RegistrationScope<'static>> {
        self.check_engine_identity()?;
        let reservation = completion::reserve(self.engine_identity())?;
        let nest = Arc::new(Mutex::new(Nest::default()));
        // SAFETY: forwarded from the caller.
        unsafe { RegistrationScope::open(self, label, regions, nest.clone(), Vec::new(), Some(reservation)) }
    }
}

impl<'p> RegistrationScope<'p> {
    /// # Safety
    /// As [`TransferExecutor::open_registration_scope`].
    unsafe fn open<'c>(
        exec: &TransferExecutor,
        label: &str,
        regions: &[MemoryRegion],
        nest: Arc<Mutex<Nest>>,
        mut chain: Vec<(u64, Arc<Mutex<Nest>>)>,
        reservation: Option<completion::Reservation>,
    ) -> TransferResult<RegistrationScope<'c>> {
        let identity = exec.engine_identity();
        let outermost = reservation.is_some();
        if outermost {
            chain.push((identity, nest.clone()));
        }
        let mut seen: HashMap<u64, u64> = HashMap::new();
        let mut unique = Vec::new();
        for r in regions {
            match seen.get(&r.address) {
                Some(&len) if len == r.len => {}
                Some(_) => {
                    return Err(TransferError::engine(format!(
                        "{label} allocation capacity mismatch: {:#x}",
                        r.address
                    )))
                }
                None => {
                    seen.insert(r.address, r.len);
                    unique.push(*r);
                }
            }
        }
        let engine = exec.engine();
        let mut registered = Vec::with_capacity(unique.len());
        for r in unique {
            // SAFETY: the caller guarantees the region stays valid until it is
            // unregistered (by this scope or by a pending entry's drain).
            let res = unsafe { engine.register_memory(r) };
            let failure = match res {
                Ok(0) => {
                    registered.push(r.address);
                    continue;
                }
                Ok(code) => code.to_string(),
                Err(e) => e.message,
            };
            let err = TransferError::engine(format!("{label} register_memory failed for {:#x}: {failure}", r.address));
            let (failed, failures) = unregister_all(&**engine, &registered);
            if failed.is_empty() {
                return Err(err);
            }
            let empty = Handoff { registrations: Vec::new(), tokens: Vec::new(), resources: Vec::new() };
            let id = quarantine_cleanup(identity, engine, failed, TerminalState::Aborted, empty);
            return Err(cleanup_error(label, &failures, id, identity).with_cause(err.message));
        }
        Ok(RegistrationScope {
            exec: exec.clone(),
            label: label.to_string(),
            registered,
            resources: Vec::new(),
            nest,
            chain,
            outermost,
            reservation,
            closed: false,
            _parent: PhantomData,
        })
    }

    /// Opens a scope inside this one on `executor`'s engine (the same engine or
    /// another). On an engine identity that an enclosing scope already uses, the new
    /// scope joins that engine's nest (its reservation and hand-off); otherwise it
    /// reserves that engine and is the outermost scope there. Errors and safety as
    /// [`TransferExecutor::open_registration_scope`].
    ///
    /// # Safety
    /// As [`TransferExecutor::open_registration_scope`].
    pub unsafe fn nested(
        &self,
        executor: &TransferExecutor,
        label: &str,
        regions: &[MemoryRegion],
    ) -> TransferResult<RegistrationScope<'_>> {
        executor.check_engine_identity()?;
        let identity = executor.engine_identity();
        let joined = self.chain.iter().find(|(i, _)| *i == identity).map(|(_, n)| n.clone());
        let (nest, reservation) = match joined {
            Some(n) => (n, None),
            None => (Arc::new(Mutex::new(Nest::default())), Some(completion::reserve(identity)?)),
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::open(executor, label, regions, nest, self.chain.clone(), reservation) }
    }

    /// The engine identity of this scope.
    pub fn engine_identity(&self) -> u64 {
        self.exec.engine_identity()
    }

    /// The addresses this scope registered (in registration order).
    pub fn registered(&self) -> &[u64] {
        &self.registered
    }

    /// Keeps `resource` alive until the scope closes, or, with a pending transfer,
    /// until that entry's drain (owners, pins, bindings).
    pub fn retain(&mut self, resource: Box<dyn Any + Send>) {
        self.resources.push(resource);
    }

    /// Runs one batch on this scope's engine with the executor's inline-drain limits
    /// (§8.3). A known failure fails `batch transfer <from|to> <endpoint> failed:
    /// <status>` (`CompletionFailed`). An unknown outcome or an interruption creates a
    /// pending entry (incomplete until the scopes of this engine have closed) and
    /// fails `CompletionUnknown` / `Interrupted` with its id. While that entry exists
    /// every further batch of the nest fails `transfer engine has pending transfer
    /// <id>; ...` without an engine call.
    ///
    /// # Safety
    /// Every local address range of `batch` must be memory the engine may read (WRITE)
    /// or write (READ) until the batch's completion is known (for an unknown outcome:
    /// until the pending entry is drained), typically inside a region registered by
    /// this scope or an enclosing one; the remote ranges must be registered by their
    /// owner.
    pub unsafe fn execute_batch(&self, batch: &TransferBatch) -> TransferResult<()> {
        if let Some(id) = &self.nest.lock().pending {
            return Err(TransferError::engine(format!(
                "transfer engine has pending transfer {id}; call drain_pending_transfer before submitting another transfer, or restart if it cannot be drained"
            )));
        }
        let limits = self.exec.limits();
        let engine = self.exec.engine();
        let outcome =
            execute_batch(&**engine, batch, limits.max_completion_drain_attempts, limits.completion_drain_timeout_ms);
        match outcome {
            BatchOutcome::Completed => Ok(()),
            BatchOutcome::Failed(msg) => {
                self.nest.lock().failed = true;
                let mut e = TransferError::new(TransferErrorKind::CompletionFailed, msg);
                e.submitted = true;
                Err(e)
            }
            BatchOutcome::Unknown { ticket, restart_required, interrupted } => {
                let e = begin_unknown(self.engine_identity(), engine, ticket, restart_required, interrupted);
                self.nest.lock().pending = e.pending_transfer_id.clone();
                Err(e)
            }
        }
    }

    /// Ends the scope (see the module docs): hands its part to the nest's pending
    /// entry (sealing it when outermost), or unregisters its own addresses.
    ///
    /// Errors: the hand-off errors of §8.4 (then nothing is unregistered: the
    /// addresses stay registered and the retained resources are leaked, since DMA may
    /// still touch them);
    /// `<label> unregister_memory failed: <failures>; registration cleanup is
    /// quarantined as <id>` (`RegistrationCleanupPending`).
    pub fn close(mut self) -> TransferResult<ScopeExit> {
        self.finish()
    }

    fn finish(&mut self) -> TransferResult<ScopeExit> {
        if self.closed {
            return Ok(ScopeExit::Unregistered);
        }
        self.closed = true;
        let identity = self.engine_identity();
        let (pending, failed) = {
            let n = self.nest.lock();
            (n.pending.clone(), n.failed)
        };
        let part = Handoff {
            registrations: std::mem::take(&mut self.registered),
            tokens: Vec::new(),
            resources: std::mem::take(&mut self.resources),
        };
        if let Some(id) = pending {
            return match hand_off(identity, &id, part, self.outermost) {
                Ok(()) => {
                    if self.outermost {
                        self.nest.lock().pending = None;
                    }
                    Ok(ScopeExit::HandedOff { pending_transfer_id: id, sealed: self.outermost })
                }
                // DMA may still run: `hand_off` leaked the part (addresses stay
                // registered, resources are never freed under it).
                Err(e) => Err(e),
            };
        }
        let engine = self.exec.engine();
        let (failed_addrs, failures) = unregister_all(&**engine, &part.registrations);
        if failed_addrs.is_empty() {
            return Ok(ScopeExit::Unregistered);
        }
        let state = if failed { TerminalState::FailedDrained } else { TerminalState::Completed };
        let rest = Handoff { registrations: Vec::new(), tokens: Vec::new(), resources: part.resources };
        let id = quarantine_cleanup(identity, engine, failed_addrs, state, rest);
        Err(cleanup_error(&self.label, &failures, id, identity))
    }
}

impl Drop for RegistrationScope<'_> {
    fn drop(&mut self) {
        // A scope dropped without `close` ends the same way; its error (a quarantine
        // entry or a refused hand-off) stays visible in the pending table.
        let _ = self.finish();
        drop(self.reservation.take());
    }
}
