//! Routing received notifications to the right acceptor when one process hosts
//! several targets (several participants, or several plans at once): a
//! [`NotifyRouter`] keeps acceptors keyed by (plan identity, target participant) and
//! hands each message to the acceptor it names, so a serving engine's notify poll
//! needs no string search of its own.

use super::notify::{peek, NotifyAccepted, NotifyAcceptor, NotifyError, NotifyRefusal};
use crate::error::{Error, ErrorKind};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::Arc;

/// An acceptor shared between its owner and a router.
pub type SharedAcceptor = Arc<Mutex<NotifyAcceptor>>;

/// A message a router handed to an acceptor, accepted by it.
#[derive(Clone, Debug)]
pub struct Routed {
    /// The acceptor that took it.
    pub acceptor: SharedAcceptor,
    /// What the acceptor recorded.
    pub accepted: NotifyAccepted,
}

/// The first 12 characters of a plan identity (for messages).
fn short(plan: &str) -> String {
    plan.chars().take(12).collect()
}

/// Acceptors keyed by (plan identity, target participant). A received message is
/// read (not yet authenticated) for the plan and target it names, and handed to that
/// acceptor, which checks everything ([`NotifyAcceptor::accept`]).
///
/// Thread safety: `Send + Sync`; every method takes `&self` (the map under a
/// read-write lock, each acceptor under its own mutex: messages for different
/// acceptors are checked concurrently).
#[derive(Debug, Default)]
pub struct NotifyRouter {
    acceptors: RwLock<BTreeMap<(String, String), SharedAcceptor>>,
}

/// The refusal of a message whose acceptor is not here, or the refusal of the
/// acceptor that took it (with that acceptor).
#[derive(Clone, Debug)]
pub struct RouteError {
    /// The acceptor that refused it (`None`: no acceptor of this router matched).
    pub acceptor: Option<SharedAcceptor>,
    /// Why.
    pub error: NotifyError,
}

impl NotifyRouter {
    /// `why` for a message that cannot be routed, unless no routed acceptor's key
    /// authenticates it: then it is forged.
    fn unroutable(&self, message: &[u8], why: NotifyError) -> NotifyError {
        let map = self.acceptors.read();
        let mut forged = None;
        for a in map.values() {
            match a.lock().authenticates(message) {
                Ok(()) => return why,
                Err(e) if e.refusal == NotifyRefusal::Forged => forged = Some(e),
                Err(_) => return why,
            }
        }
        forged.unwrap_or(why)
    }

    /// An empty router.
    pub fn new() -> NotifyRouter {
        NotifyRouter::default()
    }

    /// Adds an acceptor under its plan identity and participant.
    ///
    /// Errors (`Conflict`): `a notify acceptor for target <participant> under plan
    /// <identity> is already routed` (remove it first).
    pub fn insert(&self, acceptor: SharedAcceptor) -> crate::Result<()> {
        let key = {
            let a = acceptor.lock();
            (a.plan_identity().to_string(), a.participant().to_string())
        };
        let mut map = self.acceptors.write();
        if map.contains_key(&key) {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("a notify acceptor for target {} under plan {} is already routed", key.1, key.0),
            ));
        }
        map.insert(key, acceptor);
        Ok(())
    }

    /// Removes and returns the acceptor of `participant` under `plan_identity`
    /// (`None` when there is none).
    pub fn remove(&self, plan_identity: &str, participant: &str) -> Option<SharedAcceptor> {
        self.acceptors.write().remove(&(plan_identity.to_string(), participant.to_string()))
    }

    /// Removes `acceptor` (the same shared acceptor) if it is routed; true when it was.
    pub fn remove_acceptor(&self, acceptor: &SharedAcceptor) -> bool {
        let mut map = self.acceptors.write();
        let key = map.iter().find(|(_, a)| Arc::ptr_eq(a, acceptor)).map(|(k, _)| k.clone());
        key.is_some_and(|k| map.remove(&k).is_some())
    }

    /// The number of routed acceptors.
    pub fn len(&self) -> usize {
        self.acceptors.read().len()
    }

    /// True when no acceptor is routed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands one received message to the acceptor of the plan and target it names.
    ///
    /// A message it cannot route (a body that is not a message, or no acceptor for
    /// what it names) is first authenticated with the routed acceptors' keys: when
    /// none of them authenticates it, it is refused as [`NotifyRefusal::Forged`] (what
    /// an acceptor would have said of it; a byte flipped in a body is forged, whatever
    /// it turned the body into).
    ///
    /// Errors: a message whose header cannot be read ([`NotifyRefusal::Malformed`] /
    /// `Truncated`, no acceptor); an unroutable message no routed key authenticates
    /// (`Forged`, no acceptor); a body that is not a message (`Malformed`); no
    /// acceptor for its (plan, target): [`NotifyRefusal::Stale`] when the target's
    /// acceptor of the newest generation finds it older (as it would judge it),
    /// [`NotifyRefusal::OtherPlan`] (`no notify acceptor for plan <id> of target <t>;
    /// the routed plans of <t>: ...`) when the target has acceptors under other plans,
    /// else [`NotifyRefusal::Misrouted`] (`no notify acceptor for target <t> in this
    /// router`); otherwise the acceptor's refusal, with the acceptor.
    pub fn accept(&self, message: &[u8]) -> Result<Routed, RouteError> {
        let no = |error| RouteError { acceptor: None, error };
        let (plan, target) = match peek(message) {
            Ok(named) => named,
            Err(e) if e.refusal == NotifyRefusal::Malformed => return Err(no(self.unroutable(message, e))),
            Err(e) => return Err(no(e)),
        };
        let found = {
            let map = self.acceptors.read();
            match map.get(&(plan.clone(), target.clone())) {
                Some(a) => Ok(a.clone()),
                None => {
                    let others: Vec<String> = map.keys().filter(|(_, t)| *t == target).map(|(p, _)| short(p)).collect();
                    // The target's acceptor of the newest generation judges a message of
                    // another plan as it would its own: an older generation is stale
                    // (its key authenticates it first). It refuses it in any case.
                    let newest = map
                        .iter()
                        .filter(|((_, t), _)| *t == target)
                        .map(|(_, a)| a)
                        .max_by_key(|a| a.lock().weight_generation());
                    if let Some(a) = newest {
                        if let Err(e) = a.lock().accept(message) {
                            if matches!(e.refusal, NotifyRefusal::Stale | NotifyRefusal::Forged) {
                                return Err(no(e));
                            }
                        }
                    }
                    Err(if others.is_empty() {
                        NotifyError {
                            refusal: NotifyRefusal::Misrouted,
                            message: format!("no notify acceptor for target {target} in this router"),
                        }
                    } else {
                        NotifyError {
                            refusal: NotifyRefusal::OtherPlan,
                            message: format!(
                                "no notify acceptor for plan {} of target {target}; the routed plans of {target}: {}",
                                short(&plan),
                                others.join(", ")
                            ),
                        }
                    })
                }
            }
        };
        let acceptor = found.map_err(|e| no(self.unroutable(message, e)))?;
        let result = acceptor.lock().accept(message);
        match result {
            Ok(accepted) => Ok(Routed { acceptor, accepted }),
            Err(error) => Err(RouteError { acceptor: Some(acceptor), error }),
        }
    }
}
