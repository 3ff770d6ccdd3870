//! Buffer registration with quarantine (`store-protocol.md` §5): every address
//! registered for a call is unregistered after it; an unregister failure keeps the
//! allocation pin held in a *pending* entry and blocks new weight I/O until it is
//! drained.

use super::guards::{LifetimeToken, TerminalState};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::MemoryRegion;
use crate::runtime::RuntimeFragment;
use crate::store::ObjectStore;
use parking_lot::Mutex;
use std::collections::BTreeMap;

struct Pending {
    addresses: Vec<u64>,
    tokens: Vec<Box<dyn LifetimeToken>>,
    state: TerminalState,
}

/// The pending-registration table of one weight store.
#[derive(Default)]
pub struct Registrar {
    pending: Mutex<BTreeMap<String, Pending>>,
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar").field("pending", &self.pending_ids()).finish()
    }
}

/// Registration requests of `fragments`: `(address, nbytes)` in order of first
/// appearance; an exact alias (same address and size) is registered once; the same
/// address with another size fails (`Store registration address capacity mismatch`).
pub fn registration_requests(fragments: &[&RuntimeFragment]) -> Result<Vec<MemoryRegion>> {
    let mut out: Vec<MemoryRegion> = Vec::new();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for f in fragments {
        match seen.get(&f.address()) {
            Some(&n) if n == f.nbytes() => {}
            Some(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidBinding,
                    format!("Store registration address capacity mismatch: fragment {}", f.fragment_id()),
                ))
            }
            None => {
                seen.insert(f.address(), f.nbytes());
                out.push(MemoryRegion { address: f.address(), len: f.nbytes(), kind: f.memory() });
            }
        }
    }
    Ok(out)
}

impl Registrar {
    /// Sorted ids of pending (quarantined) registrations.
    pub fn pending_ids(&self) -> Vec<String> {
        self.pending.lock().keys().cloned().collect()
    }

    /// The blocking rule: fails while any pending registration exists
    /// (`Store weight I/O is blocked by pending registration cleanup: <id>`).
    pub fn check_unblocked(&self) -> Result<()> {
        match self.pending.lock().keys().next() {
            Some(id) => Err(Error::new(
                ErrorKind::Store,
                format!("Store weight I/O is blocked by pending registration cleanup: {id}"),
            )),
            None => Ok(()),
        }
    }

    /// Registers `requests`, runs `body`, always unregisters what was registered (in
    /// reverse order, attempting all), then releases `token` with the terminal state
    /// (`completed`, `failed_drained` once `body` reported that I/O started, else
    /// `aborted`). Unregister failures quarantine the token instead of releasing it
    /// and are reported together with any body error.
    pub fn scoped<T>(
        &self,
        store: &dyn ObjectStore,
        requests: &[MemoryRegion],
        mut token: Box<dyn LifetimeToken>,
        body: impl FnOnce(&mut bool) -> Result<T>,
    ) -> Result<T> {
        if let Err(e) = self.check_unblocked() {
            let _ = token.release(TerminalState::Aborted);
            return Err(e);
        }
        let mut registered: Vec<u64> = Vec::with_capacity(requests.len());
        let mut reg_error: Option<Error> = None;
        for r in requests {
            match store.register_buffer(*r) {
                Ok(()) => registered.push(r.address),
                Err(e) => {
                    reg_error = Some(Error::new(e.kind(), format!("register_buffer failed: {}", e.message())));
                    break;
                }
            }
        }
        let mut io_started = false;
        let outcome: Result<T> = match reg_error {
            Some(e) => Err(e),
            None => body(&mut io_started),
        };
        let state = match (&outcome, io_started) {
            (Ok(_), _) => TerminalState::Completed,
            (Err(_), true) => TerminalState::FailedDrained,
            (Err(_), false) => TerminalState::Aborted,
        };
        let mut failures: Vec<(u64, String)> = Vec::new();
        for address in registered.iter().rev() {
            if let Err(e) = store.unregister_buffer(*address) {
                failures.push((*address, e.message().to_string()));
            }
        }
        if !failures.is_empty() {
            let detail = crate::pyrepr::repr(&failures);
            let id = self.quarantine(failures.iter().map(|(a, _)| *a).collect(), token, state);
            let msg = format!("unregister_buffer failed: {detail}; allocation lifetime is quarantined as {id}");
            log::warn!("{msg}");
            return Err(match outcome {
                Ok(_) => Error::new(ErrorKind::Store, msg),
                Err(e) => Error::new(e.kind(), format!("{}; {msg}", e.message())),
            });
        }
        let release = token.release(state);
        match (outcome, release) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => {
                Err(Error::new(ErrorKind::Store, format!("allocation lifetime release failed: {}", e.message())))
            }
            (Err(e), _) => Err(e),
        }
    }

    /// Retries the unregistration of a pending entry (descending address order);
    /// on success releases its tokens with the recorded state and removes it.
    ///
    /// Errors: `pending Store registration does not exist: <id>`,
    /// `pending Store registration cleanup failed: <failures>`,
    /// `pending Store allocation lifetime release failed: <error>`.
    pub fn drain(&self, store: &dyn ObjectStore, id: &str) -> Result<()> {
        let mut table = self.pending.lock();
        let entry = table.get_mut(id).ok_or_else(|| {
            Error::new(ErrorKind::NotFound, format!("pending Store registration does not exist: {id}"))
        })?;
        let mut addresses = entry.addresses.clone();
        addresses.sort_unstable_by(|a, b| b.cmp(a));
        let mut failures: Vec<(u64, String)> = Vec::new();
        for a in addresses {
            if let Err(e) = store.unregister_buffer(a) {
                failures.push((a, e.message().to_string()));
            }
        }
        if !failures.is_empty() {
            let detail = crate::pyrepr::repr(&failures);
            entry.addresses = failures.into_iter().map(|f| f.0).collect();
            return Err(Error::new(ErrorKind::Store, format!("pending Store registration cleanup failed: {detail}")));
        }
        entry.addresses.clear();
        let state = entry.state;
        for t in entry.tokens.iter_mut().rev() {
            if let Err(e) = t.release(state) {
                return Err(Error::new(
                    ErrorKind::Store,
                    format!("pending Store allocation lifetime release failed: {}", e.message()),
                ));
            }
        }
        table.remove(id);
        Ok(())
    }
}

/// A long-lived buffer registration bound to an allocation pin
/// (`StoreRegistrationLease`, `store-protocol.md` §5.2): register once, upload or
/// load many times. Close it with [`crate::protocol::WeightStore::close_registration_lease`];
/// dropping an open lease keeps its buffers registered and its pin held (a leak the
/// caller must avoid).
pub struct RegistrationLease {
    binding: crate::runtime::RuntimeBinding,
    fragment_ids: Vec<String>,
    addresses: Vec<(u64, u64)>,
    token: Option<Box<dyn LifetimeToken>>,
    closed: bool,
}

impl std::fmt::Debug for RegistrationLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationLease")
            .field("participant_id", &self.binding.participant_id())
            .field("fragment_ids", &self.fragment_ids)
            .field("closed", &self.closed)
            .finish()
    }
}

fn sorted_requests(fragments: &[&RuntimeFragment]) -> Result<Vec<(u64, u64)>> {
    let mut v: Vec<(u64, u64)> = registration_requests(fragments)?.iter().map(|r| (r.address, r.len)).collect();
    v.sort_unstable();
    Ok(v)
}

impl RegistrationLease {
    /// The binding observed under the lease's pin.
    pub fn binding(&self) -> &crate::runtime::RuntimeBinding {
        &self.binding
    }
    /// The registered runtime fragment ids, sorted.
    pub fn fragment_ids(&self) -> &[String] {
        &self.fragment_ids
    }
    /// True once closed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Checks that the lease covers exactly `fragments` of `binding`:
    /// `Store registration lease is closed`, `... binding differs`,
    /// `... fragments differ`, `... address bounds differ`.
    pub fn validate(&self, binding: &crate::runtime::RuntimeBinding, fragments: &[&RuntimeFragment]) -> Result<()> {
        let err = |m: &str| Err(Error::new(ErrorKind::StaleBinding, m.to_string()));
        if self.closed {
            return err("Store registration lease is closed");
        }
        if *binding != self.binding {
            return err("Store registration lease binding differs");
        }
        let mut ids: Vec<&str> = fragments.iter().map(|f| f.fragment_id()).collect();
        ids.sort_unstable();
        ids.dedup();
        if !ids.iter().copied().eq(self.fragment_ids.iter().map(String::as_str)) {
            return err("Store registration lease fragments differ");
        }
        if sorted_requests(fragments)? != self.addresses {
            return err("Store registration lease address bounds differ");
        }
        Ok(())
    }
}

impl Registrar {
    /// Creates a lease: pins the fragments, re-reads them from the fresh binding and
    /// registers them. Every failure releases the pin (as `aborted`) or quarantines
    /// it when an unregister failed; unlike the reference, the blocking rule never
    /// leaks the pin.
    pub fn register_lease(
        &self,
        store: &dyn ObjectStore,
        fresh: crate::runtime::RuntimeBinding,
        ids: Vec<String>,
        mut token: Box<dyn LifetimeToken>,
    ) -> Result<RegistrationLease> {
        let mut frags: Vec<&RuntimeFragment> = Vec::with_capacity(ids.len());
        // Indexed by fragment id once (a scan per id was quadratic).
        let by_id: std::collections::HashMap<&str, &RuntimeFragment> =
            fresh.fragments().iter().map(|f| (f.fragment_id(), f)).collect();
        for id in &ids {
            match by_id.get(id.as_str()).copied() {
                Some(f) => frags.push(f),
                None => {
                    let _ = token.release(TerminalState::Aborted);
                    return Err(Error::new(
                        ErrorKind::StaleBinding,
                        format!("Store registration fragment is missing: {id}"),
                    ));
                }
            }
        }
        let addresses = match sorted_requests(&frags) {
            Ok(a) => a,
            Err(e) => {
                let _ = token.release(TerminalState::Aborted);
                return Err(e);
            }
        };
        if let Err(e) = self.check_unblocked() {
            let _ = token.release(TerminalState::Aborted);
            return Err(e);
        }
        let requests = registration_requests(&frags)?;
        let mut registered: Vec<u64> = Vec::new();
        for r in &requests {
            if let Err(e) = store.register_buffer(*r) {
                let err = Error::new(e.kind(), format!("register_buffer failed: {}", e.message()));
                let mut failures = Vec::new();
                for a in registered.iter().rev() {
                    if let Err(u) = store.unregister_buffer(*a) {
                        failures.push((*a, u.message().to_string()));
                    }
                }
                if failures.is_empty() {
                    let _ = token.release(TerminalState::Aborted);
                    return Err(err);
                }
                let id = self.quarantine(failures.iter().map(|f| f.0).collect(), token, TerminalState::Aborted);
                let detail: Vec<String> = failures.into_iter().map(|f| f.1).collect();
                return Err(Error::new(
                    err.kind(),
                    format!(
                        "{}; unregister_buffer failed: {}; allocation lifetime is quarantined as {id}",
                        err.message(),
                        detail.join("; ")
                    ),
                ));
            }
            registered.push(r.address);
        }
        drop(frags);
        Ok(RegistrationLease { binding: fresh, fragment_ids: ids, addresses, token: Some(token), closed: false })
    }

    /// Closes a lease (no-op when closed): unregisters its addresses (reverse
    /// sorted order) and releases the pin with `state`; unregister failures
    /// quarantine the pin instead and the lease is closed anyway.
    pub fn close_lease(
        &self,
        store: &dyn ObjectStore,
        lease: &mut RegistrationLease,
        state: TerminalState,
    ) -> Result<()> {
        if lease.closed {
            return Ok(());
        }
        lease.closed = true;
        let mut failures = Vec::new();
        for (a, _) in lease.addresses.iter().rev() {
            if let Err(e) = store.unregister_buffer(*a) {
                failures.push((*a, e.message().to_string()));
            }
        }
        let mut token = lease.token.take().expect("an open lease holds its pin");
        if !failures.is_empty() {
            let detail = crate::pyrepr::repr(&failures);
            let id = self.quarantine(failures.iter().map(|f| f.0).collect(), token, state);
            return Err(Error::new(
                ErrorKind::Store,
                format!("unregister_buffer failed: {detail}; allocation lifetime is quarantined as {id}"),
            ));
        }
        token
            .release(state)
            .map_err(|e| Error::new(ErrorKind::Store, format!("allocation lifetime release failed: {}", e.message())))
    }

    fn quarantine(&self, addresses: Vec<u64>, token: Box<dyn LifetimeToken>, state: TerminalState) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        self.pending.lock().insert(id.clone(), Pending { addresses, tokens: vec![token], state });
        id
    }
}
