//! Allocation guards and lifetime tokens (`store-protocol.md` §6): before any
//! store I/O touches a runtime address, the framework pins the allocation and the
//! library re-checks the binding it observes under that pin.

use crate::error::{invalid, Error, ErrorKind, Result};
use crate::runtime::{fence_binding_digest, RuntimeBinding};
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// How a pin ends (`TerminalTransferState`). The discriminants are the states'
/// numbers ([`TerminalState::code`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TerminalState {
    /// No I/O was submitted (or registration failed before I/O).
    Aborted = 0,
    /// All I/O finished successfully.
    Completed = 1,
    /// I/O was submitted and failed; no submitted I/O can still touch the memory.
    FailedDrained = 2,
}

impl TerminalState {
    /// The state's number: 0 aborted, 1 completed, 2 failed-drained (how the C ABI,
    /// `mws_terminal_state`, and the guards behind it carry a state).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The state numbered `code` ([`TerminalState::code`]); `invalid terminal state:
    /// <code>` ([`ErrorKind::InvalidArgument`]) for any other number.
    pub fn from_code(code: u32) -> Result<TerminalState> {
        let all = [TerminalState::Aborted, TerminalState::Completed, TerminalState::FailedDrained];
        all.into_iter()
            .find(|s| s.code() == code)
            .ok_or_else(|| Error::invalid(format!("invalid terminal state: {code}")))
    }

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
    if required_ids.is_empty() {
        return invalid("allocation fence fragment_ids are invalid");
    }
    if token_id.is_empty() {
        return invalid("allocation fence token_id must be non-empty");
    }
    let ids: std::borrow::Cow<'_, [String]> = if required_ids.windows(2).all(|w| w[0] < w[1]) {
        required_ids.into()
    } else {
        let mut v = required_ids.to_vec();
        v.sort_unstable();
        v.dedup();
        v.into()
    };
    if binding.has_exactly_fragment_ids(&ids) {
        // Every fragment (the common case: a participant's pins cover its binding):
        // the binding's digest, computed once per binding.
        return Ok(fence_header(binding, binding.fence_digest_all().into(), ids.into_owned(), token_id));
    }
    // A subset pinned before (a plan pins the same subset at every call) is held and
    // its digest known; any other is found fragment by fragment, then kept.
    let digest = match binding.cached_subset_digest(&ids) {
        Some(digest) => digest,
        None => {
            let frags = binding.fragments_with_ids(&ids).map_err(|missing| {
                Error::invalid(format!("runtime binding is missing guarded fragments: {}", missing.join(", ")))
            })?;
            let digest = fence_binding_digest(&frags);
            binding.keep_subset_digest(&ids, &digest);
            digest
        }
    };
    Ok(fence_header(binding, digest, ids.into_owned(), token_id))
}

fn fence_header(binding: &RuntimeBinding, digest: String, ids: Vec<String>, token_id: &str) -> AllocationFence {
    AllocationFence {
        resource_id: binding.resource_id().into(),
        revision: binding.revision().into(),
        placement_id: binding.placement_id().into(),
        placement_digest: binding.placement_digest().into(),
        instance_id: binding.instance_id().into(),
        participant_id: binding.participant_id().into(),
        runtime_lease_id: binding.lease_id().into(),
        runtime_generation: binding.lease_generation(),
        binding_digest: digest,
        fragment_ids: ids,
        token_id: token_id.into(),
    }
}

/// Whether `fence` is `weight_allocation_fence(binding, ids, &fence.token_id)`,
/// compared field by field without building one when `ids` are every fragment of
/// `binding` (sorted, distinct).
fn fence_matches(fence: &AllocationFence, binding: &RuntimeBinding, ids: &[String]) -> Result<bool> {
    if !binding.has_exactly_fragment_ids(ids) {
        return Ok(*fence == weight_allocation_fence(binding, ids, &fence.token_id)?);
    }
    Ok(fence.resource_id == binding.resource_id()
        && fence.revision == binding.revision()
        && fence.placement_id == binding.placement_id()
        && fence.placement_digest == binding.placement_digest()
        && fence.instance_id == binding.instance_id()
        && fence.participant_id == binding.participant_id()
        && fence.runtime_lease_id == binding.lease_id()
        && fence.runtime_generation == binding.lease_generation()
        && fence.binding_digest == binding.fence_digest_all()
        && fence.fragment_ids == ids
        && !fence.token_id.is_empty())
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

    /// Pins the allocations of `pin` for one step of a prepared transfer
    /// (`protocol::transfer::PreparedTransfer`): the same binding and fragment ids
    /// every step (with any rotated lease). A prepared transfer calls this for each of
    /// its bindings at every step, so a provider that can vouch that the allocations
    /// are exactly `pin.binding()` answers [`Observed::Unchanged`] at a cost that does
    /// not grow with the fragments ([`StaticGuard`] does, and so does the C ABI's
    /// guard when it reports no observed binding). The default calls
    /// [`Self::acquire`] and reports the binding it returned
    /// ([`Observed::Binding`]), which the caller then checks fragment by fragment as
    /// [`acquire_pin`] does.
    fn acquire_step(&self, transfer: &StepTransfer, pin: &StepPin) -> Result<(Observed, Box<dyn LifetimeToken>)> {
        let (fresh, token) = self.acquire(transfer.id(), pin.binding(), pin.required_ids())?;
        Ok((Observed::Binding(fresh), token))
    }
}

/// The transfer id of one step of a prepared transfer, shared by the tokens of all
/// its pins (a clone is a reference count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTransfer(Arc<str>);

impl StepTransfer {
    /// The step's transfer id.
    pub fn new(id: &str) -> StepTransfer {
        StepTransfer(id.into())
    }
    /// The id.
    pub fn id(&self) -> &str {
        &self.0
    }
}

/// What a guard observed when it pinned one binding of a prepared transfer for one
/// step ([`GuardProvider::acquire_step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// Exactly the expected binding: the guard vouches for it and nothing is compared.
    Unchanged,
    /// The binding as observed under the pin: checked against the expected one like
    /// [`acquire_pin`] checks a fresh binding (fence, identity, lease, generation and
    /// every required fragment).
    Binding(RuntimeBinding),
}

struct StepPinInner {
    binding: RuntimeBinding,
    ids: Arc<[String]>,
    digest: Arc<str>,
    cache: Arc<OnceLock<Box<dyn Any + Send + Sync>>>,
}

/// One binding's pin request in a prepared transfer, made once and repeated at every
/// step: the expected binding (as prepared, with any rotated lease), its sorted
/// required fragment ids, and the fence digest of those fragments (computed once:
/// it does not depend on the lease). Clones share everything. `Send + Sync`.
#[derive(Clone)]
pub struct StepPin {
    inner: Arc<StepPinInner>,
}

impl std::fmt::Debug for StepPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepPin")
            .field("participant_id", &self.inner.binding.participant_id())
            .field("instance_id", &self.inner.binding.instance_id())
            .field("fragments", &self.inner.ids.len())
            .finish()
    }
}

impl StepPin {
    /// The pin of `required_ids` (sorted and de-duplicated here) of `binding`.
    /// Errors: those of [`weight_allocation_fence`] (`allocation fence fragment_ids
    /// are invalid`, `runtime binding is missing guarded fragments: <ids>`).
    pub fn new(binding: RuntimeBinding, required_ids: &[String]) -> Result<StepPin> {
        let mut ids: Vec<String> = required_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let fence = weight_allocation_fence(&binding, &ids, "prepared")?;
        Ok(StepPin {
            inner: Arc::new(StepPinInner {
                binding,
                ids: ids.into(),
                digest: fence.binding_digest.into(),
                cache: Arc::default(),
            }),
        })
    }
    /// The binding the step expects (as prepared, with any rotated lease).
    pub fn binding(&self) -> &RuntimeBinding {
        &self.inner.binding
    }
    /// The pinned runtime fragment ids, sorted and distinct.
    pub fn required_ids(&self) -> &[String] {
        &self.inner.ids
    }
    /// The same pin under a rotated lease (O(1) in fragments; ids, digest and cache
    /// shared). Errors: `lease_id must be a non-empty string`.
    pub fn with_lease(&self, lease_id: &str, generation: u64) -> Result<StepPin> {
        let i = &self.inner;
        Ok(StepPin {
            inner: Arc::new(StepPinInner {
                binding: i.binding.with_lease(lease_id, generation)?,
                ids: i.ids.clone(),
                digest: i.digest.clone(),
                cache: i.cache.clone(),
            }),
        })
    }
    /// The fence of this pin for `token_id` (no digest is computed; the ids are
    /// copied).
    pub fn fence(&self, token_id: &str) -> AllocationFence {
        let b = &self.inner.binding;
        AllocationFence {
            resource_id: b.resource_id().into(),
            revision: b.revision().into(),
            placement_id: b.placement_id().into(),
            placement_digest: b.placement_digest().into(),
            instance_id: b.instance_id().into(),
            participant_id: b.participant_id().into(),
            runtime_lease_id: b.lease_id().into(),
            runtime_generation: b.lease_generation(),
            binding_digest: self.inner.digest.to_string(),
            fragment_ids: self.inner.ids.to_vec(),
            token_id: token_id.into(),
        }
    }
    /// A fence of this pin for the token id `<prefix><transfer id>`, made on first
    /// use (what a step token returns from [`LifetimeToken::fence`] without copying
    /// the ids, or even formatting its id, every step).
    pub fn lazy_fence(&self, prefix: &'static str, transfer: &StepTransfer) -> LazyFence {
        LazyFence { pin: self.clone(), prefix, transfer: transfer.clone(), cell: OnceLock::new() }
    }
    /// A slot where a guard implementation may keep its own form of the ids (for
    /// example C strings), built on its first step and shared by every clone and
    /// rotation of the pin.
    pub fn cache(&self) -> &OnceLock<Box<dyn Any + Send + Sync>> {
        &self.inner.cache
    }
}

/// A step pin's fence, made on first use ([`StepPin::lazy_fence`]).
pub struct LazyFence {
    pin: StepPin,
    prefix: &'static str,
    transfer: StepTransfer,
    cell: OnceLock<Box<AllocationFence>>,
}

impl LazyFence {
    /// The fence.
    pub fn get(&self) -> &AllocationFence {
        self.cell.get_or_init(|| Box::new(self.pin.fence(&format!("{}{}", self.prefix, self.transfer.id()))))
    }
}

/// How a pin ends, for [`ReleaseToken`]: called once, with the terminal state.
pub type ReleaseFn = Box<dyn FnMut(TerminalState) -> Result<()> + Send>;

/// The lifetime token of a guard implemented outside Rust, whose pin ends by calling
/// a release function (the C ABI's `mws_guard_vtable`): its fence is computed when it
/// is made ([`ReleaseToken::checked`]) or on first use ([`ReleaseToken::lazy`]).
pub struct ReleaseToken {
    fence: TokenFence,
    release: ReleaseFn,
}

enum TokenFence {
    Now(AllocationFence),
    Lazy(LazyFence),
}

impl ReleaseToken {
    /// The token of a pin whose guard observed `fresh`, covering `required_ids` with
    /// the fence of `token_id`. When `fresh` is an error, or the fence cannot be made
    /// ([`weight_allocation_fence`]; [`ErrorKind::StaleBinding`]: the observed binding
    /// misses guarded fragments), the pin is released at once as
    /// [`TerminalState::Aborted`] and the error returned.
    pub fn checked(
        fresh: Result<RuntimeBinding>,
        required_ids: &[String],
        token_id: &str,
        mut release: ReleaseFn,
    ) -> Result<(RuntimeBinding, Box<dyn LifetimeToken>)> {
        let fenced = fresh.and_then(|b| {
            let fence = weight_allocation_fence(&b, required_ids, token_id);
            Ok((fence.map_err(|e| e.with_kind(ErrorKind::StaleBinding))?, b))
        });
        let (fence, fresh) = fenced.inspect_err(|_| {
            let _ = release(TerminalState::Aborted);
        })?;
        Ok((fresh, Box::new(ReleaseToken { fence: TokenFence::Now(fence), release })))
    }

    /// The token of a step pin its guard vouched for (the binding is exactly the
    /// pin's): its fence is `fence`, made on first use.
    pub fn lazy(fence: LazyFence, release: ReleaseFn) -> Box<dyn LifetimeToken> {
        Box::new(ReleaseToken { fence: TokenFence::Lazy(fence), release })
    }
}

impl LifetimeToken for ReleaseToken {
    fn fence(&self) -> &AllocationFence {
        match &self.fence {
            TokenFence::Now(f) => f,
            TokenFence::Lazy(f) => f.get(),
        }
    }
    fn release(&mut self, state: TerminalState) -> Result<()> {
        (self.release)(state)
    }
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

struct StaticStepToken(LazyFence);

impl LifetimeToken for StaticStepToken {
    fn fence(&self) -> &AllocationFence {
        self.0.get()
    }
    fn release(&mut self, _state: TerminalState) -> Result<()> {
        Ok(())
    }
}

impl GuardProvider for StaticGuard {
    fn acquire_step(&self, transfer: &StepTransfer, pin: &StepPin) -> Result<(Observed, Box<dyn LifetimeToken>)> {
        Ok((Observed::Unchanged, Box::new(StaticStepToken(pin.lazy_fence("static-", transfer)))))
    }

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
    let ids: std::borrow::Cow<'_, [String]> = if required_ids.windows(2).all(|w| w[0] < w[1]) {
        required_ids.into()
    } else {
        let mut ids = required_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        ids.into()
    };
    if ids.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("{side} allocation guard requires fragments")));
    }
    let (fresh, mut token) = provider.acquire(transfer_id, expected, &ids)?;
    let check = check_fresh(side, expected, &ids, &fresh, &*token);
    match check {
        Ok(()) => Ok((fresh, token)),
        Err(e) => {
            let _ = token.release(TerminalState::Aborted);
            Err(e)
        }
    }
}

/// Pins one binding of a prepared transfer for one step through `provider`
/// ([`GuardProvider::acquire_step`]); a binding the guard observed instead of
/// vouching for the expected one is checked as [`acquire_pin`] checks a fresh
/// binding ([`check_fresh`]), and on a failed check the token is released
/// `aborted`. Errors: the provider's, and [`check_fresh`]'s
/// ([`ErrorKind::StaleBinding`]).
pub fn acquire_step_pin(
    provider: &dyn GuardProvider,
    side: &str,
    transfer: &StepTransfer,
    pin: &StepPin,
) -> Result<Box<dyn LifetimeToken>> {
    let (observed, mut token) = provider.acquire_step(transfer, pin)?;
    match observed {
        Observed::Unchanged => Ok(token),
        Observed::Binding(fresh) => match check_fresh(side, pin.binding(), pin.required_ids(), &fresh, &*token) {
            Ok(()) => Ok(token),
            Err(e) => {
                let _ = token.release(TerminalState::Aborted);
                Err(e)
            }
        },
    }
}

/// The checks of [`acquire_pin`] on a binding observed under a pin: the token's
/// fence is the fence of `fresh`, and `fresh` has `expected`'s identity, lease,
/// generation and required fragments. Errors: [`ErrorKind::StaleBinding`]
/// (`<side> allocation guard fence differs from binding`, `acquired runtime binding
/// <field> differs from plan`, `... address differs from plan`, `... fragments differ
/// from plan`) and the fence rules.
pub fn check_fresh(
    side: &str,
    expected: &RuntimeBinding,
    ids: &[String],
    fresh: &RuntimeBinding,
    token: &dyn LifetimeToken,
) -> Result<()> {
    if !fence_matches(token.fence(), fresh, ids)? {
        return Err(Error::new(ErrorKind::StaleBinding, format!("{side} allocation guard fence differs from binding")));
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
    if fresh.lease_generation() != expected.lease_generation() {
        return stale("generation");
    }
    if fresh.lease_id() != expected.lease_id() {
        return stale("lease_id");
    }
    // The fence matched, so every id is in `fresh`: one fragment list shared with
    // `expected` (the same binding observed again) holds nothing that differs.
    if fresh.shares_fragments(expected) {
        return Ok(());
    }
    let differs = |address: bool| {
        let what = if address { "address differs" } else { "fragments differ" };
        Err(Error::new(ErrorKind::StaleBinding, format!("acquired runtime binding {what} from plan")))
    };
    // Sorted ids (what providers are handed) found in both by one merge each.
    if ids.windows(2).all(|w| w[0] < w[1]) {
        if let (Ok(a), Ok(b)) = (fresh.fragments_with_ids(ids), expected.fragments_with_ids(ids)) {
            return if a == b { Ok(()) } else { differs(true) };
        }
    }
    // Otherwise indexed by fragment id once (a scan per id was quadratic); the first
    // id in `ids` order that differs names the error.
    let fresh_by_id: crate::fxhash::FxHashMap<&str, &crate::runtime::RuntimeFragment> =
        fresh.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
    let expected_by_id: crate::fxhash::FxHashMap<&str, &crate::runtime::RuntimeFragment> =
        expected.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
    for id in ids {
        match (fresh_by_id.get(id.as_str()), expected_by_id.get(id.as_str())) {
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => return differs(true),
            _ => return differs(false),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_round_trip_through_their_numbers() {
        for (code, state) in
            [(0, TerminalState::Aborted), (1, TerminalState::Completed), (2, TerminalState::FailedDrained)]
        {
            assert_eq!(state.code(), code);
            assert_eq!(TerminalState::from_code(code).unwrap(), state);
        }
        let e = TerminalState::from_code(3).unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::InvalidArgument, "invalid terminal state: 3"));
    }
}
