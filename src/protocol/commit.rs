//! The upload transaction (`store-protocol.md` §3–§4): payload checks, receipts,
//! the decision record (create-only put + re-read), commit, abort and finalize.
//!
//! Every write is followed by a re-read, which is the only source of truth: a put
//! may land although its response was lost, or be reported before it is visible.
//!
//! These jobs are the [`WeightStore`] methods of this file's `impl` block (`commit`,
//! `abort_upload`, `finalize`, `read_decision`, `current_decision`, `read_manifest`,
//! `require_complete_payloads`, `remove_keys`, `require_writable`,
//! `validate_receipts`); the helpers beside them are private.

use super::load::load_manifest_limited;
use super::receipt::UploadReceipt;
use super::state::WeightStore;
use crate::error::{Error, ErrorKind, Result};
use crate::model::StoredManifest;
use crate::plan::upload::{Decision, UploadPlan};
use crate::store::{RecordType, WriteConfig};
use std::collections::{BTreeSet, HashMap, HashSet};

fn err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

fn describe<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "0".into(),
        Err(e) => e.message().to_string(),
    }
}

fn metadata_put(ws: &WeightStore, key: &str, value: &[u8], group: &str) -> Result<()> {
    let groups = [group.to_string()];
    ws.store.put(key, value, &WriteConfig { group_ids: &groups, record_type: RecordType::Metadata })
}

impl WeightStore {
    /// Commits the upload (§4.4) and returns the published manifest.
    ///
    /// `on_decision_may_exist` is called right before the commit decision is
    /// claimed: from then on the caller must keep the plan and retry `commit`
    /// (never abort). Retryable failures (`upload decision is not complete; retry`,
    /// `manifest put failed`, `payload is not complete`) are [`ErrorKind::Store`];
    /// lost races are [`ErrorKind::Conflict`].
    pub fn commit(
        &self,
        plan: &UploadPlan,
        receipts: &[UploadReceipt],
        on_decision_may_exist: Option<&mut dyn FnMut()>,
    ) -> Result<StoredManifest> {
        self.validate_receipts(plan, receipts, true)?;
        self.check_plan_prefix(plan)?;
        let keys: Vec<&str> = receipts.iter().map(|r| r.object_key.as_str()).collect();
        if self.current_decision(plan)?.is_none() {
            self.require_complete_payloads(&keys)?;
            super::integrity::write_record(self, plan, receipts)?;
            // Stores that cannot list keys: the revision is indexed before any
            // decision exists (`revision_index`).
            self.record_revision(plan)?;
        }
        if let Some(cb) = on_decision_may_exist {
            cb();
        }
        claim(self, plan, Decision::Commit)?;
        self.require_complete_payloads(&keys)?;
        if let Some(m) = self.read_manifest(plan)? {
            return resolve(self, plan, receipts, m);
        }
        let m = plan.manifest();
        log::info!("commit of {}: decision recorded, publishing the manifest", m.manifest_key());
        let put = metadata_put(self, m.manifest_key(), m.to_json().as_bytes(), m.group_id());
        match self.read_manifest(plan)? {
            Some(persisted) => resolve(self, plan, receipts, persisted),
            None => Err(err(ErrorKind::Store, format!("manifest put failed: {}", describe(&put)))),
        }
    }

    /// Aborts the upload (§4.5): records `abort` and removes every plan payload
    /// that no published manifest references.
    pub fn abort_upload(&self, plan: &UploadPlan, receipts: &[UploadReceipt]) -> Result<()> {
        self.validate_receipts(plan, receipts, false)?;
        self.check_plan_prefix(plan)?;
        let published = || -> Result<Option<StoredManifest>> {
            let m = self.read_manifest(plan)?;
            if m.as_ref() == Some(plan.manifest()) {
                return Err(err(ErrorKind::Conflict, "cannot abort a published weight revision"));
            }
            Ok(m)
        };
        published()?;
        claim(self, plan, Decision::Abort)?;
        log::info!("upload {} of {} aborted", plan.transaction_id(), plan.manifest().manifest_key());
        let manifest = published()?;
        let keys = unreferenced(plan.operations().iter().map(|o| o.target().object_key()), manifest.as_ref());
        let failures = remove_with_record(self, plan, keys, manifest.as_ref());
        if failures.is_empty() {
            Ok(())
        } else {
            Err(err(ErrorKind::Store, format!("upload cleanup failed: {}", failures_text(&failures))))
        }
    }

    /// Idempotent recovery (§4.6): brings a transaction to its terminal state and
    /// removes the payloads it must not keep. Never removes a decision or manifest.
    pub fn finalize(&self, plan: &UploadPlan) -> Result<()> {
        self.check_plan_prefix(plan)?;
        log::info!("recovery: finalizing upload {} of {}", plan.transaction_id(), plan.manifest().manifest_key());
        let mut decision = self.read_decision(plan)?;
        if decision.is_none() {
            if self.read_manifest(plan)?.as_ref() == Some(plan.manifest()) {
                let _ = metadata_put(
                    self,
                    plan.control_key(),
                    plan.decision_record(Decision::Commit).as_bytes(),
                    plan.transaction_group_id(),
                );
                decision = self.read_decision(plan)?;
                if decision.is_none() {
                    return Err(err(ErrorKind::Store, "upload transaction terminal decision is incomplete"));
                }
            } else {
                return Err(err(ErrorKind::Conflict, "upload transaction has no terminal decision"));
            }
        }
        let (d, digest) = decision.expect("decision present");
        if digest != plan.plan_digest() {
            return Err(err(ErrorKind::Conflict, "upload decision belongs to another plan"));
        }
        let manifest = self.read_manifest(plan)?;
        let plan_keys = plan.operations().iter().map(|o| o.target().object_key());
        match d {
            Decision::Commit => match manifest {
                None => Err(err(ErrorKind::Store, "committed upload transaction has no manifest")),
                Some(m) if m == *plan.manifest() => Ok(()),
                Some(m) => {
                    let failures = remove_with_record(self, plan, unreferenced(plan_keys, Some(&m)), Some(&m));
                    if failures.is_empty() {
                        Ok(())
                    } else {
                        Err(err(
                            ErrorKind::Store,
                            format!("conflicting upload cleanup failed: {}", failures_text(&failures)),
                        ))
                    }
                }
            },
            Decision::Abort => {
                if manifest.as_ref() == Some(plan.manifest()) {
                    return Err(err(ErrorKind::Conflict, "aborted upload has a published manifest"));
                }
                let failures =
                    remove_with_record(self, plan, unreferenced(plan_keys, manifest.as_ref()), manifest.as_ref());
                if failures.is_empty() {
                    Ok(())
                } else {
                    Err(err(ErrorKind::Store, format!("upload cleanup failed: {}", failures_text(&failures))))
                }
            }
        }
    }

    /// Reads the decision record: `None` when absent. Errors:
    /// `upload decision existence check failed: <key>: <e>`,
    /// `invalid upload decision: <key>` ([`ErrorKind::InvalidManifest`]).
    pub fn read_decision(&self, plan: &UploadPlan) -> Result<Option<(Decision, String)>> {
        let key = plan.control_key();
        // One round trip: a missing object is "no decision" (the reference asks
        // `is_exist` first; a get that finds nothing means the same).
        let bytes = match get_if_visible(self, key) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            Err(e) => {
                return Err(err(ErrorKind::Store, format!("upload decision read failed: {key}: {}", e.message())))
            }
        };
        Decision::parse_record(&bytes)
            .map(Some)
            .map_err(|e| err(ErrorKind::InvalidManifest, format!("invalid upload decision: {key}: {}", e.message())))
    }

    /// The decision of this plan's transaction: `None` when absent; a decision
    /// record of another plan fails with `upload decision belongs to another plan`
    /// ([`ErrorKind::Conflict`]).
    pub fn current_decision(&self, plan: &UploadPlan) -> Result<Option<Decision>> {
        match self.read_decision(plan)? {
            None => Ok(None),
            Some((d, digest)) if digest == plan.plan_digest() => Ok(Some(d)),
            Some(_) => Err(err(ErrorKind::Conflict, "upload decision belongs to another plan")),
        }
    }

    /// Reads the published manifest of the plan's key: `None` when absent.
    pub fn read_manifest(&self, plan: &UploadPlan) -> Result<Option<StoredManifest>> {
        let key = plan.manifest().manifest_key();
        let max = self.limits.max_metadata_bytes;
        match load_manifest_limited(&*self.store, key, max) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            // A read can fail while a put of the key is still in flight (another
            // writer's): then the existence check decides, as in the reference.
            Err(e) if e.kind() == ErrorKind::Store => match self.store.exists(key) {
                Ok(false) => Ok(None),
                Ok(true) => load_manifest_limited(&*self.store, key, max).map(Some),
                Err(_) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// `require_complete_payloads`: every key present, queried in bounded chunks.
    /// Errors: `payload existence check failed for <key>: <e>`,
    /// `payload is not complete: <keys>` (retryable, [`ErrorKind::Store`]).
    pub fn require_complete_payloads(&self, keys: &[&str]) -> Result<()> {
        let mut incomplete: Vec<&str> = Vec::new();
        for chunk in keys.chunks(self.limits.max_ranges_per_request) {
            let results = self.store.batch_exists(chunk);
            if results.len() != chunk.len() {
                return Err(err(ErrorKind::Store, "payload existence check returned invalid count"));
            }
            for (k, r) in chunk.iter().zip(results) {
                match r {
                    Ok(true) => {}
                    Ok(false) => incomplete.push(k),
                    Err(e) => {
                        return Err(err(
                            ErrorKind::Store,
                            format!("payload existence check failed for {k}: {}", e.message()),
                        ))
                    }
                }
            }
        }
        if incomplete.is_empty() {
            Ok(())
        } else {
            incomplete.sort_unstable();
            Err(err(ErrorKind::Store, format!("payload is not complete: {}", incomplete.join(", "))))
        }
    }

    /// Removes every key (never stopping early); returns the failures.
    pub fn remove_keys(&self, keys: &[&str]) -> Vec<(String, String)> {
        keys.iter()
            .filter_map(|k| match self.store.remove(k) {
                Ok(()) => None,
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => Some((k.to_string(), e.message().to_string())),
            })
            .collect()
    }

    /// `require_writable(plan, cleanup_keys)` (§4.3): fails (after removing the
    /// unreferenced `cleanup_keys`) when an abort or a conflicting revision won.
    pub fn require_writable(&self, plan: &UploadPlan, cleanup_keys: &[&str]) -> Result<()> {
        let decision = match self.current_decision(plan)? {
            None => return Ok(()),
            Some(d) => d,
        };
        let manifest = self.read_manifest(plan)?;
        if decision == Decision::Commit && manifest.as_ref().is_none_or(|m| m == plan.manifest()) {
            return Ok(());
        }
        let failures = remove_with_record(
            self,
            plan,
            unreferenced(cleanup_keys.iter().copied(), manifest.as_ref()),
            manifest.as_ref(),
        );
        let mut msg = match decision {
            Decision::Abort => "weight upload already chose abort".to_string(),
            Decision::Commit => "weight upload lost to a conflicting revision".to_string(),
        };
        if !failures.is_empty() {
            msg.push_str(&format!("; cleanup failed: {}", failures_text(&failures)));
        }
        Err(err(ErrorKind::Conflict, msg))
    }

    /// `validate_receipts` (§3).
    pub fn validate_receipts(
        &self,
        plan: &UploadPlan,
        receipts: &[UploadReceipt],
        require_complete: bool,
    ) -> Result<()> {
        let mut seen = HashSet::new();
        if !receipts.iter().all(|r| seen.insert(r.fragment_id.as_str())) {
            return Err(err(ErrorKind::InvalidArgument, "duplicate upload receipt"));
        }
        let ops: HashMap<&str, (&str, &str)> = plan
            .operations()
            .iter()
            .map(|o| (o.target().fragment_id(), (o.target().object_key(), o.source_snapshot().worker_id())))
            .collect();
        let unexpected: BTreeSet<&str> =
            receipts.iter().map(|r| r.fragment_id.as_str()).filter(|id| !ops.contains_key(id)).collect();
        if !unexpected.is_empty() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("unexpected upload receipts: {}", unexpected.into_iter().collect::<Vec<_>>().join(", ")),
            ));
        }
        for r in receipts {
            let (key, worker) = ops[r.fragment_id.as_str()];
            if r.object_key != key || r.worker_id != worker {
                return Err(err(ErrorKind::InvalidArgument, format!("invalid upload receipt: {}", r.fragment_id)));
            }
        }
        if require_complete {
            let missing: BTreeSet<&str> = ops.keys().copied().filter(|id| !seen.contains(id)).collect();
            if !missing.is_empty() {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    format!("missing upload receipts: {}", missing.into_iter().collect::<Vec<_>>().join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// One round trip in the common cases (present, or absent); when the read
/// fails otherwise (for example a put still in flight), the existence check
/// decides, as in the reference.
fn get_if_visible(ws: &WeightStore, key: &str) -> Result<Option<Vec<u8>>> {
    let max = ws.limits.max_metadata_bytes;
    match ws.store.get_limited(key, max) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == ErrorKind::LimitExceeded => Err(e),
        Err(e) => match ws.store.exists(key) {
            Ok(false) => Ok(None),
            Ok(true) => ws.store.get_limited(key, max).map(Some),
            Err(_) => Err(e),
        },
    }
}

fn claim(ws: &WeightStore, plan: &UploadPlan, d: Decision) -> Result<()> {
    let put = metadata_put(ws, plan.control_key(), plan.decision_record(d).as_bytes(), plan.transaction_group_id());
    match ws.current_decision(plan)? {
        None => Err(err(ErrorKind::Store, format!("upload decision is not complete; retry: {}", describe(&put)))),
        Some(p) if p == d => Ok(()),
        Some(p) => Err(err(ErrorKind::Conflict, format!("weight upload already chose {}", p.as_str()))),
    }
}

fn unreferenced<'a>(plan_keys: impl Iterator<Item = &'a str>, persisted: Option<&StoredManifest>) -> Vec<&'a str> {
    let referenced: HashSet<&str> =
        persisted.map(|m| m.fragments().iter().map(|f| f.object_key()).collect()).unwrap_or_default();
    plan_keys.filter(|k| !referenced.contains(k)).collect()
}

/// [`WeightStore::remove_keys`] of `keys` plus the plan's integrity record unless `persisted`
/// owns it (`protocol::integrity`).
fn remove_with_record(
    ws: &WeightStore,
    plan: &UploadPlan,
    keys: Vec<&str>,
    persisted: Option<&StoredManifest>,
) -> Vec<(String, String)> {
    // Only when present: a transaction that never reached commit has no record, and
    // the removal sequence of such a transaction stays exactly the reference's.
    let record = super::integrity::removable_key(plan, persisted).filter(|k| !matches!(ws.store.exists(k), Ok(false)));
    let mut all: Vec<&str> = keys;
    all.extend(record.as_deref());
    ws.remove_keys(&all)
}

/// The reference's `<failures>`: the Python list of `(key, error)` tuples.
fn failures_text(failures: &[(String, String)]) -> String {
    crate::pyrepr::repr(failures)
}

fn resolve(
    ws: &WeightStore,
    plan: &UploadPlan,
    receipts: &[UploadReceipt],
    persisted: StoredManifest,
) -> Result<StoredManifest> {
    if persisted == *plan.manifest() {
        return Ok(persisted);
    }
    let failures = remove_with_record(
        ws,
        plan,
        unreferenced(receipts.iter().map(|r| r.object_key.as_str()), Some(&persisted)),
        Some(&persisted),
    );
    let same = super::integrity::compare_content(ws, plan, receipts, &persisted);
    let mut msg = format!("conflicting weight revision: {}; {}", plan.manifest().manifest_key(), same.clause());
    if !failures.is_empty() {
        msg.push_str(&format!("; cleanup failed: {}", failures_text(&failures)));
    }
    Err(err(ErrorKind::Conflict, msg))
}
