//! Buffer registration with quarantine (`store-protocol.md` §5): every address
//! registered for a call is unregistered after it; an unregister failure keeps the
//! allocation pin held in a *pending* entry and blocks new weight I/O until it is
//! drained.

use super::guards::{LifetimeToken, TerminalState};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::RuntimeFragment;
use crate::store::{MemoryRegion, ObjectStore};
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
            let id = uuid::Uuid::new_v4().simple().to_string();
            let detail: Vec<String> = failures.iter().map(|(_, m)| m.clone()).collect();
            self.pending.lock().insert(
                id.clone(),
                Pending { addresses: failures.iter().map(|(a, _)| *a).collect(), tokens: vec![token], state },
            );
            let msg = format!("unregister_buffer failed: {}; allocation lifetime is quarantined as {id}", detail.join("; "));
            return Err(match outcome {
                Ok(_) => Error::new(ErrorKind::Store, msg),
                Err(e) => Error::new(e.kind(), format!("{}; {msg}", e.message())),
            });
        }
        let release = token.release(state);
        match (outcome, release) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(e)) => Err(Error::new(ErrorKind::Store, format!("allocation lifetime release failed: {}", e.message()))),
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
        let entry = table
            .get_mut(id)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("pending Store registration does not exist: {id}")))?;
        let mut addresses = entry.addresses.clone();
        addresses.sort_unstable_by(|a, b| b.cmp(a));
        let mut failed = Vec::new();
        let mut messages = Vec::new();
        for a in addresses {
            if let Err(e) = store.unregister_buffer(a) {
                failed.push(a);
                messages.push(e.message().to_string());
            }
        }
        if !failed.is_empty() {
            entry.addresses = failed;
            return Err(Error::new(
                ErrorKind::Store,
                format!("pending Store registration cleanup failed: {}", messages.join("; ")),
            ));
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
