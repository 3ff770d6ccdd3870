//! Operator views of a store that can list ([`crate::store::ObjectStore::list`]):
//! what revisions and transactions it holds ([`survey`]) and garbage collection
//! ([`gc`]), without the plans (the `mws` CLI).
//!
//! # Transaction states
//!
//! Keys are grouped by the layout of `model::keys` and `plan::integrity`
//! (`<group>/manifest`, `<group>/payload/<tx>/<fragment>`,
//! `<group>/transactions/<tx>/decision`, `<group>/integrity/<tx>`):
//!
//! | state | meaning | what `gc` does |
//! | --- | --- | --- |
//! | `committed` | the group's manifest references the transaction's payloads | nothing; if its decision is missing (a crash between manifest and decision cannot happen in this library, but the reference's finalize handles it) it records `commit`, as `finalize` does |
//! | `aborted` | decision `abort` | removes its payloads and integrity record no manifest references (as `abort_upload`/`finalize`) |
//! | `lost` | decision `commit`, the manifest is another transaction's | removes its unreferenced payloads (as `finalize`) |
//! | `commit-pending` | decision `commit`, no manifest yet | nothing: only the coordinator, with the plan, can publish it (retry `commit`) |
//! | `undecided` | no decision, not referenced | older than `--older-than`: claims `abort` (create-only put, then re-read: whoever wrote first wins, exactly the protocol's claim), and removes its objects only when the re-read shows that abort; younger: nothing |
//! | `corrupt` | a decision or manifest that does not decode | nothing |
//!
//! An abort claimed by `gc` carries the plan digest from the transaction's
//! integrity record when there is one, else 64 zeros (the plan is unknown): a writer
//! still running then fails with `upload decision belongs to another plan` and never
//! publishes. Safety against a concurrent writer rests on three rules: a committed
//! revision's keys (manifest, decisions, referenced payloads) are never removed;
//! nothing is removed before a decision exists in the store; an undecided
//! transaction is only aborted when its newest object is older than the threshold
//! (stores without modification times never abort undecided transactions).

use crate::error::{Error, ErrorKind, Result};
use crate::model::StoredManifest;
use crate::plan::integrity::IntegrityRecord;
use crate::plan::upload::Decision;
use crate::protocol::load::load_manifest_limited;
use crate::store::{list_sorted, ObjectStore, RecordType, WriteConfig, DEFAULT_MAX_METADATA_BYTES};
use std::collections::{BTreeMap, BTreeSet};

/// State of one transaction (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TxState {
    /// Referenced by the published manifest.
    Committed,
    /// Decision `abort`.
    Aborted,
    /// Decision `commit`, another transaction's manifest was published.
    Lost,
    /// Decision `commit`, no manifest yet.
    CommitPending,
    /// No decision, not referenced.
    Undecided,
    /// A decision record that does not decode.
    Corrupt,
}

impl TxState {
    /// Lower-case name (`committed`, `aborted`, `lost`, `commit-pending`, `undecided`, `corrupt`).
    pub fn as_str(self) -> &'static str {
        match self {
            TxState::Committed => "committed",
            TxState::Aborted => "aborted",
            TxState::Lost => "lost",
            TxState::CommitPending => "commit-pending",
            TxState::Undecided => "undecided",
            TxState::Corrupt => "corrupt",
        }
    }
}

/// One transaction of a group.
#[derive(Clone, Debug)]
pub struct TxReport {
    /// Transaction id.
    pub id: String,
    /// Its state.
    pub state: TxState,
    /// Payload keys with sizes.
    pub payloads: Vec<(String, u64)>,
    /// The decision key, when present.
    pub decision_key: Option<String>,
    /// The integrity record key, when present.
    pub integrity_key: Option<String>,
    /// The decision's plan digest, when it decodes.
    pub plan_digest: Option<String>,
}

impl TxReport {
    /// Bytes of its payloads.
    pub fn payload_bytes(&self) -> u64 {
        self.payloads.iter().map(|p| p.1).sum()
    }

    /// True for an aborted or lost transaction whose payloads and integrity record
    /// are gone (what `gc` leaves): only its decision record stays, which is never
    /// removed. Listings leave it out and `gc` has nothing more to do for it.
    pub fn is_cleaned(&self) -> bool {
        matches!(self.state, TxState::Aborted | TxState::Lost)
            && self.payloads.is_empty()
            && self.integrity_key.is_none()
    }
}

/// One group (`<prefix>/<ns>/<resource>/<revision>/<generation>`).
#[derive(Clone, Debug)]
pub struct GroupReport {
    /// The group id.
    pub group_id: String,
    /// The published manifest, if any and valid.
    pub manifest: Option<StoredManifest>,
    /// Why the manifest could not be read, when it exists but is invalid.
    pub manifest_error: Option<String>,
    /// Its transactions, by id.
    pub transactions: Vec<TxReport>,
}

/// What [`survey`] found.
#[derive(Clone, Debug, Default)]
pub struct Survey {
    /// Groups, sorted by id.
    pub groups: Vec<GroupReport>,
    /// Keys that follow no known layout.
    pub other: Vec<(String, u64)>,
}

#[derive(Default)]
struct TxKeys {
    payloads: Vec<(String, u64)>,
    decision: Option<String>,
    integrity: Option<String>,
}

#[derive(Default)]
struct GroupKeys {
    manifest: bool,
    txs: BTreeMap<String, TxKeys>,
}

/// Splits a key into (group, role): `manifest`, `payload/<tx>/<f>`,
/// `transactions/<tx>/decision` or `integrity/<tx>`.
fn classify(key: &str) -> Option<(&str, Role<'_>)> {
    if let Some(g) = key.strip_suffix("/manifest") {
        return Some((g, Role::Manifest));
    }
    if let Some(i) = key.rfind("/payload/") {
        let rest = &key[i + 9..];
        if let Some((tx, f)) = rest.split_once('/') {
            if !tx.is_empty() && !f.is_empty() && !f.contains('/') {
                return Some((&key[..i], Role::Payload(tx)));
            }
        }
    }
    if let Some(i) = key.rfind("/transactions/") {
        if let Some(tx) = key[i + 14..].strip_suffix("/decision") {
            if !tx.is_empty() && !tx.contains('/') {
                return Some((&key[..i], Role::Decision(tx)));
            }
        }
    }
    if let Some(i) = key.rfind("/integrity/") {
        let tx = &key[i + 11..];
        if !tx.is_empty() && !tx.contains('/') {
            return Some((&key[..i], Role::Integrity(tx)));
        }
    }
    None
}

enum Role<'a> {
    Manifest,
    Payload(&'a str),
    Decision(&'a str),
    Integrity(&'a str),
}

/// Lists everything under `prefix` and classifies it (reads every manifest and
/// decision record, each bounded by `max_metadata_bytes`). Errors: a store that
/// cannot list ([`ErrorKind::Unsupported`]) or a failing listing.
pub fn survey(store: &dyn ObjectStore, prefix: &str, max_metadata_bytes: u64) -> Result<Survey> {
    let mut groups: BTreeMap<String, GroupKeys> = BTreeMap::new();
    let mut other = Vec::new();
    for o in list_sorted(store, prefix)? {
        match classify(&o.key) {
            None => other.push((o.key.clone(), o.size)),
            Some((g, role)) => {
                let gk = groups.entry(g.to_string()).or_default();
                match role {
                    Role::Manifest => gk.manifest = true,
                    Role::Payload(tx) => gk.txs.entry(tx.into()).or_default().payloads.push((o.key.clone(), o.size)),
                    Role::Decision(tx) => gk.txs.entry(tx.into()).or_default().decision = Some(o.key.clone()),
                    Role::Integrity(tx) => gk.txs.entry(tx.into()).or_default().integrity = Some(o.key.clone()),
                }
            }
        }
    }
    let mut out = Survey { groups: Vec::new(), other };
    for (g, keys) in groups {
        let (manifest, manifest_error) = if keys.manifest {
            match load_manifest_limited(store, &format!("{g}/manifest"), max_metadata_bytes) {
                Ok(m) => (Some(m), None),
                Err(e) if e.kind() == ErrorKind::NotFound => (None, None),
                Err(e) => (None, Some(e.message().to_string())),
            }
        } else {
            (None, None)
        };
        let referenced: BTreeSet<&str> =
            manifest.iter().flat_map(|m| m.fragments().iter().map(|f| f.object_key())).collect();
        let mut transactions = Vec::new();
        for (tx, k) in keys.txs {
            let is_ref = k.payloads.iter().any(|(p, _)| referenced.contains(p.as_str()));
            let decision = match &k.decision {
                None => None,
                Some(key) => Some(match store.get_limited(key, max_metadata_bytes) {
                    Ok(bytes) => Decision::parse_record(&bytes).ok(),
                    Err(e) if e.kind() == ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                }),
            };
            let state = match (&decision, is_ref, &manifest) {
                (_, true, _) => TxState::Committed,
                (Some(None), _, _) => TxState::Corrupt,
                (Some(Some((Decision::Abort, _))), _, _) => TxState::Aborted,
                (Some(Some((Decision::Commit, _))), false, Some(_)) => TxState::Lost,
                (Some(Some((Decision::Commit, _))), false, None) => TxState::CommitPending,
                (None, false, _) => TxState::Undecided,
            };
            let plan_digest = decision.flatten().map(|d| d.1);
            transactions.push(TxReport {
                id: tx,
                state,
                payloads: k.payloads,
                decision_key: k.decision,
                integrity_key: k.integrity,
                plan_digest,
            });
        }
        out.groups.push(GroupReport { group_id: g, manifest, manifest_error, transactions });
    }
    Ok(out)
}

/// Options of [`gc`].
pub struct GcOptions<'a> {
    /// Report what would be done, change nothing.
    pub dry_run: bool,
    /// An undecided transaction is aborted only when its newest object is at least
    /// this many seconds old.
    pub older_than_secs: u64,
    /// Modification time (seconds since the epoch) of a key; `None` when unknown
    /// (then undecided transactions are never aborted).
    pub mtime: &'a dyn Fn(&str) -> Option<i64>,
    /// Current time, seconds since the epoch.
    pub now_secs: i64,
}

/// One action of [`gc`] (done, or planned in a dry run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcAction {
    /// Group id.
    pub group_id: String,
    /// Transaction id.
    pub transaction_id: String,
    /// What was (or would be) done.
    pub what: String,
    /// Keys removed (or to remove).
    pub removed: Vec<String>,
    /// Bytes freed.
    pub bytes: u64,
}

/// What [`gc`] did.
#[derive(Clone, Debug, Default)]
pub struct GcReport {
    /// Actions taken (or planned in a dry run, then worded in the conditional).
    pub actions: Vec<GcAction>,
    /// Aborted or lost transactions an earlier run already cleaned
    /// ([`TxReport::is_cleaned`]): nothing to do, not reported again.
    pub already_cleaned: usize,
    /// Transactions left alone, with why.
    pub kept: Vec<(String, String, String)>,
    /// Failures (key, error); gc goes on after one.
    pub failures: Vec<(String, String)>,
}

fn put_decision(store: &dyn ObjectStore, group: &str, tx: &str, d: Decision, digest: &str) -> Result<()> {
    let key = format!("{group}/transactions/{tx}/decision");
    let groups = [format!("{group}/transactions/{tx}")];
    match store.put(
        &key,
        d.record(digest).as_bytes(),
        &WriteConfig { group_ids: &groups, record_type: RecordType::Metadata },
    ) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn reread_decision(store: &dyn ObjectStore, group: &str, tx: &str) -> Result<Option<Decision>> {
    let key = format!("{group}/transactions/{tx}/decision");
    match store.get_limited(&key, DEFAULT_MAX_METADATA_BYTES) {
        Ok(b) => Decision::parse_record(&b).map(|d| Some(d.0)).map_err(|e| {
            Error::new(ErrorKind::InvalidManifest, format!("invalid upload decision: {key}: {}", e.message()))
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Garbage-collects what [`survey`] found (rules in the module documentation).
pub fn gc(store: &dyn ObjectStore, survey: &Survey, opts: &GcOptions<'_>) -> GcReport {
    let mut report = GcReport::default();
    for g in &survey.groups {
        if let Some(e) = &g.manifest_error {
            for t in &g.transactions {
                report.kept.push((g.group_id.clone(), t.id.clone(), format!("manifest is invalid: {e}")));
            }
            continue;
        }
        let referenced: BTreeSet<&str> =
            g.manifest.iter().flat_map(|m| m.fragments().iter().map(|f| f.object_key())).collect();
        for t in &g.transactions {
            if t.is_cleaned() {
                report.already_cleaned += 1;
                continue;
            }
            let keep = |why: &str, report: &mut GcReport| {
                report.kept.push((g.group_id.clone(), t.id.clone(), why.to_string()));
            };
            let garbage = || -> Vec<(String, u64)> {
                let mut v: Vec<(String, u64)> =
                    t.payloads.iter().filter(|(k, _)| !referenced.contains(k.as_str())).cloned().collect();
                v.extend(t.integrity_key.iter().map(|k| (k.clone(), 0)));
                v
            };
            let what = match t.state {
                TxState::Committed => {
                    if t.decision_key.is_none() {
                        let m = g.manifest.as_ref().expect("committed implies a manifest");
                        if !opts.dry_run {
                            if let Err(e) =
                                put_decision(store, &g.group_id, &t.id, Decision::Commit, m.manifest_digest())
                            {
                                report
                                    .failures
                                    .push((format!("{}/transactions/{}/decision", g.group_id, t.id), e.to_string()));
                                continue;
                            }
                        }
                        report.actions.push(GcAction {
                            group_id: g.group_id.clone(),
                            transaction_id: t.id.clone(),
                            what: if opts.dry_run {
                                "would record the commit decision of the published revision"
                            } else {
                                "recorded the commit decision of the published revision"
                            }
                            .into(),
                            removed: Vec::new(),
                            bytes: 0,
                        });
                    } else {
                        keep("committed", &mut report);
                    }
                    continue;
                }
                TxState::CommitPending => {
                    keep("commit decided, manifest not yet published: retry commit with the plan", &mut report);
                    continue;
                }
                TxState::Corrupt => {
                    keep("decision record does not decode", &mut report);
                    continue;
                }
                TxState::Aborted if opts.dry_run => "would remove the payloads of an aborted upload",
                TxState::Aborted => "removed the payloads of an aborted upload",
                TxState::Lost if opts.dry_run => "would remove the payloads of an upload that lost to another revision",
                TxState::Lost => "removed the payloads of an upload that lost to another revision",
                TxState::Undecided => {
                    let keys: Vec<&str> = t
                        .payloads
                        .iter()
                        .map(|p| p.0.as_str())
                        .chain(t.integrity_key.as_deref())
                        .chain(t.decision_key.as_deref())
                        .collect();
                    let times: Option<Vec<i64>> = keys.iter().map(|k| (opts.mtime)(k)).collect();
                    let newest = times.and_then(|t| t.into_iter().max());
                    match newest {
                        None => {
                            keep("undecided; its age is unknown (the store has no modification times)", &mut report);
                            continue;
                        }
                        Some(n) if opts.now_secs.saturating_sub(n) < opts.older_than_secs as i64 => {
                            keep("undecided and younger than --older-than (an upload may be running)", &mut report);
                            continue;
                        }
                        Some(_) => {}
                    }
                    if !opts.dry_run {
                        let digest = t
                            .integrity_key
                            .as_deref()
                            .and_then(|k| store.get_limited(k, DEFAULT_MAX_METADATA_BYTES).ok())
                            .and_then(|b| IntegrityRecord::from_json(&b).ok())
                            .map(|r| r.plan_digest)
                            .unwrap_or_else(|| "0".repeat(64));
                        if let Err(e) = put_decision(store, &g.group_id, &t.id, Decision::Abort, &digest) {
                            report
                                .failures
                                .push((format!("{}/transactions/{}/decision", g.group_id, t.id), e.to_string()));
                            continue;
                        }
                        // The claim rule: act only on what the store holds now.
                        match reread_decision(store, &g.group_id, &t.id) {
                            Ok(Some(Decision::Abort)) => {}
                            Ok(Some(Decision::Commit)) => {
                                keep("a writer committed first; left alone", &mut report);
                                continue;
                            }
                            Ok(None) => {
                                report.failures.push((t.id.clone(), "abort decision is not visible yet; retry".into()));
                                continue;
                            }
                            Err(e) => {
                                report.failures.push((t.id.clone(), e.to_string()));
                                continue;
                            }
                        }
                    }
                    if opts.dry_run {
                        "would abort an abandoned upload (no decision, older than --older-than) and remove its payloads"
                    } else {
                        "aborted an abandoned upload (no decision, older than --older-than) and removed its payloads"
                    }
                }
            };
            let victims = garbage();
            let mut removed = Vec::new();
            let mut bytes = 0;
            for (k, n) in victims {
                if !opts.dry_run {
                    if let Err(e) = store.remove(&k) {
                        report.failures.push((k.clone(), e.to_string()));
                        continue;
                    }
                }
                bytes += n;
                removed.push(k);
            }
            report.actions.push(GcAction {
                group_id: g.group_id.clone(),
                transaction_id: t.id.clone(),
                what: what.to_string(),
                removed,
                bytes,
            });
        }
    }
    report
}
