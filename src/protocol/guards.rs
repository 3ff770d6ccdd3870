//! Allocation guards and lifetime tokens (`store-protocol.md` §6): before any
//! store I/O touches a runtime address, the framework pins the allocation and the
//! library re-checks the binding it observes under that pin.

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::runtime::{fence_binding_digest, RuntimeBinding, RuntimeFragment};
use std::collections::BTreeSet;

/// How a pin ends (`TerminalTransferState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TerminalState {
    /// No I/O was submitted (or registration failed before I/O).
    Aborted,
    /// All I/O finished successfully.
    Completed,
    /// I/O was submitted and failed; no submitted I/O can still touch the memory.
    FailedDrained,
}

impl TerminalState {
    /// `aborted`, `completed` or `failed_drained`.
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalState::Aborted => "aborted",
            TerminalState::Completed => "completed",
            TerminalState::FailedDrained => "failed_drained",
        }
    }
}

/// What a pin covers: the binding identity plus a digest of the guarded fragments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllocationFence {
    /// Resource id.
    pub resource_id: String,
    /// Revision.
    pub revision: String,
    /// Placement id.
    pub placement_id: String,
    /// Placement digest.
    pub placement_digest: String,
    /// Instance id.
    pub instance_id: String,
    /// Participant id.
    pub participant_id: String,
    /// The binding's lease id.
    pub runtime_lease_id: String,
    /// The binding's generation.
    pub runtime_generation: u64,
    /// `wire-format.md` §9 digest over the guarded fragments.
    pub binding_digest: String,
    /// Guarded runtime fragment ids, sorted, distinct, non-empty.
    pub fragment_ids: Vec<String>,
    /// The token's id.
    pub token_id: String,
}

/// `weight_allocation_fence(binding, required_ids, token_id)`.
///
/// Errors: `runtime binding is missing guarded fragments: <ids>`, and the fence
/// field rules (`allocation fence <field> must be non-empty`, ...).
pub fn weight_allocation_fence(
    binding: &RuntimeBinding,
    required_ids: &[String],
    token_id: &str,
) -> Result<AllocationFence> {
    let ids: BTreeSet<&str> = required_ids.iter().map(String::as_str).collect();
    if ids.is_empty() {
        return invalid("allocation fence fragment_ids are invalid");
    }
    if token_id.is_empty() {
        return invalid("allocation fence token_id must be non-empty");
    }
    let frags: Vec<&RuntimeFragment> = binding.fragments().iter().filter(|f| ids.contains(f.fragment_id())).collect();
    if frags.len() != ids.len() {
        let have: BTreeSet<&str> = frags.iter().map(|f| f.fragment_id()).collect();
        let missing: Vec<&str> = ids.difference(&have).copied().collect();
        return invalid(format!("runtime binding is missing guarded fragments: {}", missing.join(", ")));
    }
    Ok(AllocationFence {
        resource_id: binding.resource_id().into(),
        revision: binding.revision().into(),
        placement_id: binding.placement_id().into(),
        placement_digest: binding.placement_digest().into(),
        instance_id: binding.instance_id().into(),
        participant_id: binding.participant_id().into(),
        runtime_lease_id: binding.lease_id().into(),
        runtime_generation: binding.generation(),
        binding_digest: fence_binding_digest(&frags),
        fragment_ids: ids.iter().map(|s| s.to_string()).collect(),
        token_id: token_id.into(),
    })
}

/// A framework pin on runtime allocations. Released exactly once.
pub trait LifetimeToken: Send {
    /// The fence the pin covers.
    fn fence(&self) -> &AllocationFence;
    /// Releases the pin after I/O ended with `state`. Must not panic.
    fn release(&mut self, state: TerminalState) -> Result<()>;
}

/// A framework object that pins allocations atomically and reports the binding it
/// observes under the pin. Must be thread-safe and must not panic.
pub trait GuardProvider: Send + Sync {
    /// Pins the allocations of `required_ids` (sorted, distinct runtime fragment ids)
    /// of `expected` and returns the binding observed under the pin with its token.
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)>;
}

/// A guard provider for buffers that the caller keeps alive and unchanged for the
/// whole call (for example plain host buffers owned by the caller's stack frame):
/// it reports the expected binding unchanged and its token's release does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct StaticGuard;

struct StaticToken(AllocationFence);

impl LifetimeToken for StaticToken {
    fn fence(&self) -> &AllocationFence {
        &self.0
    }
    fn release(&mut self, _state: TerminalState) -> Result<()> {
        Ok(())
    }
}

impl GuardProvider for StaticGuard {
    fn acquire(
        &self,
        transfer_id: &str,
        expected: &RuntimeBinding,
        required_ids: &[String],
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        let fence = weight_allocation_fence(expected, required_ids, &format!("static-{transfer_id}"))?;
        Ok((expected.clone(), Box::new(StaticToken(fence))))
    }
}

/// Acquires one pin and checks what it observed (`store-protocol.md` §6.3). On any
/// check failure the token is released as `aborted`. Errors are store errors
/// ([`ErrorKind::StaleBinding`] for differences from the plan).
pub fn acquire_pin(
    provider: &dyn GuardProvider,
    side: &str,
    transfer_id: &str,
    expected: &RuntimeBinding,
    required_ids: &[String],
) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
    let mut ids: Vec<String> = required_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("{side} allocation guard requires fragments")));
    }
    let (fresh, mut token) = provider.acquire(transfer_id, expected, &ids)?;
    let check = (|| {
        let fence = weight_allocation_fence(&fresh, &ids, &token.fence().token_id)?;
        if *token.fence() != fence {
            return Err(Error::new(
                ErrorKind::StaleBinding,
                format!("{side} allocation guard fence differs from binding"),
            ));
        }
        let stale = |field: &str| {
            Err(Error::new(ErrorKind::StaleBinding, format!("acquired runtime binding {field} differs from plan")))
        };
        if fresh.resource_id() != expected.resource_id() {
            return stale("resource_id");
        }
        if fresh.revision() != expected.revision() {
            return stale("revision");
        }
        if fresh.placement_id() != expected.placement_id() {
            return stale("placement_id");
        }
        if fresh.placement_digest() != expected.placement_digest() {
            return stale("placement_digest");
        }
        if fresh.instance_id() != expected.instance_id() {
            return stale("instance_id");
        }
        if fresh.participant_id() != expected.participant_id() {
            return stale("participant_id");
        }
        if fresh.generation() != expected.generation() {
            return stale("generation");
        }
        if fresh.lease_id() != expected.lease_id() {
            return stale("lease_id");
        }
        // Indexed by fragment id once (a scan per id was quadratic).
        let fresh_by_id: std::collections::HashMap<&str, &crate::runtime::RuntimeFragment> =
            fresh.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
        let expected_by_id: std::collections::HashMap<&str, &crate::runtime::RuntimeFragment> =
            expected.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
        for id in &ids {
            let a = fresh_by_id.get(id.as_str()).copied();
            let b = expected_by_id.get(id.as_str()).copied();
            match (a, b) {
                (Some(a), Some(b)) if a == b => {}
                (Some(_), Some(_)) => {
                    return Err(Error::new(
                        ErrorKind::StaleBinding,
                        "acquired runtime binding address differs from plan",
                    ))
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::StaleBinding,
                        "acquired runtime binding fragments differ from plan",
                    ))
                }
            }
        }
        Ok(())
    })();
    match check {
        Ok(()) => Ok((fresh, token)),
        Err(e) => {
            let _ = token.release(TerminalState::Aborted);
            Err(e)
        }
    }
}
