//! The revision index: how [`WeightStore::revisions`] finds the committed revisions
//! of a resource in a store that cannot list its keys (Mooncake Store;
//! [`crate::store::ObjectStore::supports_list`] false). Stores that list keep their
//! listing and never see an index object.
//!
//! The specification defines no revision listing, so this is the library's own
//! layout; the reference (Python mooncake-reshard) neither writes nor reads it, and
//! every key it defines is left as it is.
//!
//! # Layout
//!
//! One small object per recorded commit attempt, at a numbered slot under the
//! resource's key prefix:
//!
//! ```text
//! <prefix>/<enc(ns)>/<enc(resource)>/%revisions/<n>      n = 0, 1, 2, ... (decimal)
//! {"record_type":"weight-revision-index-entry","revision":"<revision>","weight_generation":<g>}
//! ```
//!
//! (canonical JSON as the decision record: sorted keys, no spaces, ASCII profile). The segment `%revisions` can never be a revision's:
//! an encoded segment ([`crate::model::keys::encode_key_segment`]) has `%` only before
//! two uppercase hex digits. The entry's group id is the resource's key prefix
//! without its trailing `/`; it is a metadata record.
//!
//! # Writing (commit)
//!
//! [`WeightStore::commit`] records the plan's revision BEFORE it claims the commit
//! decision, so every revision whose decision says commit has an entry. The writer
//! probes slots from 0 with `batch_exists`, 32 at a time (fewer when
//! `StoreLimits::max_ranges_per_request` is smaller), and writes its entry with a
//! create-only `put` into the first free one, then reads the slot back (the re-read
//! decides, as for the decision record): its own bytes = recorded; another entry
//! = another writer won that slot, so it tries the next; absent = the put failed, and
//! the commit fails before any decision exists (retryable, [`ErrorKind::Store`]).
//! Two committers racing for a slot: the first put wins, the other moves on; neither
//! entry is lost. A crashed committer leaves either no entry (nothing was decided:
//! the revision is not committed), or an entry whose revision has no commit decision
//! (skipped on read), or an entry of a committed revision. An aborted upload leaves its
//! entry (skipped on read); a retried commit of the same plan writes no second entry
//! once its decision exists, and duplicates (a commit retried before it decided)
//! are merged on read.
//!
//! # Reading
//!
//! The index is a hint; the store's records are the truth. The reader reads slots
//! from 0 (`batch_exists` of 32, then a `get` of each present slot) until 16
//! consecutive slots are empty: a slot is empty only while a put is in flight or after
//! a put failed, and writers fill the lowest free slot, so a gap of 16 is not
//! reached between entries in practice (bounded: 16 abandoned puts in a row). Each
//! distinct `(revision, weight_generation)` is then verified as a listing store's
//! candidate is ([`super::revisions`]: the manifest at its key decodes strictly as
//! that revision of that resource), and in addition through its decision record: the
//! transaction that wrote the manifest's payloads (`<group>/payload/<tx>/...`) must
//! have a decision record that says commit (`<group>/transactions/<tx>/decision`).
//! A missing manifest or a decision that is absent or says abort: not committed,
//! skipped. Entries that do not decode are skipped with a warning (the index holds
//! hints, not truth).
//!
//! # Costs
//!
//! A commit adds `ceil((slots + 1) / 32)` `batch_exists` calls, one put and one get.
//! A listing reads every slot (one `batch_exists` per 32 slots, one get per entry)
//! and, per distinct revision, its manifest and decision record.
//!
//! Thread safety: every function may run on any number of threads at once, also
//! beside commits of the same resource (a listing that runs beside a commit may or
//! may not include it).

use super::state::WeightStore;
use crate::error::{Error, ErrorKind, Result};
use crate::json::{self, Obj, Profile, Value};
use crate::model::keys::resource_key_prefix;
use crate::model::{KeyLayout, StoredManifest};
use crate::plan::upload::{Decision, UploadPlan};
use crate::store::{RecordType, WriteConfig};

/// The key segment under a resource's prefix that holds its index slots.
pub const INDEX_SEGMENT: &str = "%revisions";
/// The `record_type` of an index entry.
pub const ENTRY_RECORD_TYPE: &str = "weight-revision-index-entry";
/// Slots asked per `batch_exists`.
const PROBE: u64 = 32;
/// A reader stops after this many consecutive empty slots.
const GAP: u64 = 16;
/// Largest entry read (an entry is about 100 bytes plus the revision name).
const MAX_ENTRY_BYTES: u64 = 64 << 10;
/// Slots a writer tries before giving up (a resource with a million commit
/// attempts is not what this index is for).
const MAX_SLOTS: u64 = 1 << 20;

/// The key of slot `n` of the index under `resource_prefix` (which ends in `/`).
pub fn slot_key(resource_prefix: &str, n: u64) -> String {
    format!("{resource_prefix}{INDEX_SEGMENT}/{n}")
}

/// The canonical JSON of an entry (see the module documentation).
pub fn entry_json(revision: &str, weight_generation: u64) -> String {
    let mut out = String::with_capacity(96 + revision.len());
    out.push('{');
    json::key(&mut out, "record_type");
    json::write_str(&mut out, ENTRY_RECORD_TYPE, Profile::Ascii);
    out.push(',');
    json::key(&mut out, "revision");
    json::write_str(&mut out, revision, Profile::Ascii);
    out.push(',');
    json::key(&mut out, "weight_generation");
    json::write_u64(&mut out, weight_generation);
    out.push('}');
    out
}

/// Decodes an entry: `(revision, weight_generation)`. Errors
/// ([`ErrorKind::InvalidArgument`]): not JSON, other fields, another record type, an
/// empty revision, a generation that is not a non-negative integer.
pub fn parse_entry(bytes: &[u8]) -> Result<(String, u64)> {
    let v = json::parse_bytes(bytes, "revision index entry")?;
    let o = Obj::new(&v, || "revision index entry must be an object".into())?;
    o.expect_keys(&["record_type", "revision", "weight_generation"], || {
        "revision index entry fields do not match contract".into()
    })?;
    if o.get("record_type") != &Value::Str(ENTRY_RECORD_TYPE.into()) {
        return Err(Error::invalid("invalid revision index entry record_type"));
    }
    let revision = json::req_str(o.get("revision"), "revision")?;
    if revision.is_empty() {
        return Err(Error::invalid("revision index entry has an empty revision"));
    }
    Ok((revision, json::req_int(o.get("weight_generation"), "weight_generation", 0)?))
}

/// Slots asked per `batch_exists`: [`PROBE`], or fewer when the store's limits
/// bound a batch (`StoreLimits::max_ranges_per_request`, as for payload checks).
fn probe_width(ws: &WeightStore) -> u64 {
    PROBE.min(ws.limits.max_ranges_per_request as u64).max(1)
}

/// The presence of `n` slots from `from`, in slot order.
fn probe(ws: &WeightStore, prefix: &str, from: u64, n: u64) -> Result<Vec<bool>> {
    let keys: Vec<String> = (from..from + n).map(|i| slot_key(prefix, i)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let results = ws.store.batch_exists(&refs);
    if results.len() != keys.len() {
        return Err(Error::new(ErrorKind::Store, "revision index existence check returned invalid count"));
    }
    results
        .into_iter()
        .zip(&keys)
        .map(|(r, k)| {
            r.map_err(|e| Error::new(e.kind(), format!("revision index existence check failed: {k}: {}", e.message())))
        })
        .collect()
}

/// Reads slot `key`: `None` when it is absent (or vanished since it was seen).
fn read_slot(ws: &WeightStore, key: &str) -> Result<Option<Vec<u8>>> {
    match ws.store.get_limited(key, MAX_ENTRY_BYTES) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::new(e.kind(), format!("revision index read failed: {key}: {}", e.message()))),
    }
}

impl WeightStore {
    /// Records `plan`'s revision in the revision index of its resource (module
    /// documentation), when the store cannot list its keys; a no-op otherwise. Called
    /// by [`WeightStore::commit`] before the commit decision is claimed. Errors:
    /// [`ErrorKind::Store`] (`revision index entry put failed`: the slot is still
    /// empty after the put; retry the commit), [`ErrorKind::LimitExceeded`] (over a
    /// million slots), the store's errors of `batch_exists` and `get`, each naming the
    /// key. Thread safety: any number of calls at once, for any resources.
    pub fn record_revision(&self, plan: &UploadPlan) -> Result<()> {
        if self.store.supports_list() {
            return Ok(());
        }
        let m = plan.manifest();
        let prefix = resource_key_prefix(&self.key_prefix, m.namespace(), m.resource_id())?;
        let value = entry_json(m.revision(), m.weight_generation());
        let group = [prefix.trim_end_matches('/').to_string()];
        let config = WriteConfig { group_ids: &group, record_type: RecordType::Metadata };
        let width = probe_width(self);
        let mut from = 0;
        while from < MAX_SLOTS {
            for (i, present) in probe(self, &prefix, from, width)?.into_iter().enumerate() {
                if present {
                    continue;
                }
                let key = slot_key(&prefix, from + i as u64);
                let put = self.store.put(&key, value.as_bytes(), &config);
                match read_slot(self, &key)? {
                    Some(b) if b == value.as_bytes() => {
                        log::debug!("revision {} recorded at {key}", m.manifest_key());
                        return Ok(());
                    }
                    Some(_) => continue, // another writer's entry: the next free slot
                    None => {
                        let why = put.err().map(|e| e.message().to_string()).unwrap_or_else(|| "not visible".into());
                        return Err(Error::new(
                            ErrorKind::Store,
                            format!("revision index entry put failed: {key}: {why}"),
                        ));
                    }
                }
            }
            from += width;
        }
        Err(Error::new(ErrorKind::LimitExceeded, format!("revision index of {prefix} has more than {MAX_SLOTS} slots")))
    }

    /// The distinct `(revision, weight_generation)` pairs of the index of
    /// `namespace`/`resource_id` under this store's key prefix, sorted (module
    /// documentation: read until 16 consecutive empty slots; entries that do not
    /// decode are skipped with a warning). Not verified: see
    /// [`WeightStore::indexed_revision_committed`]. Errors: the store's errors of
    /// `batch_exists` and `get`, naming the key; [`ErrorKind::InvalidArgument`] for an
    /// empty namespace. Thread safety: any number of calls at once.
    pub fn indexed_revisions(&self, namespace: &str, resource_id: &str) -> Result<Vec<(String, u64)>> {
        let prefix = resource_key_prefix(&self.key_prefix, namespace, resource_id)?;
        let mut out = Vec::new();
        let width = probe_width(self);
        let (mut from, mut empty) = (0u64, 0u64);
        while empty < GAP && from < MAX_SLOTS {
            for (i, present) in probe(self, &prefix, from, width)?.into_iter().enumerate() {
                let key = slot_key(&prefix, from + i as u64);
                let bytes = if present { read_slot(self, &key)? } else { None };
                let Some(bytes) = bytes else {
                    empty += 1;
                    if empty >= GAP {
                        break;
                    }
                    continue;
                };
                empty = 0;
                match parse_entry(&bytes) {
                    Ok(e) => out.push(e),
                    Err(e) => log::warn!("revision index: {key} skipped: {}", e.message()),
                }
            }
            from += width;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Whether the published manifest `m` (read from its own key) was committed: the
    /// transaction that wrote its payloads has a decision record that says commit.
    /// `Ok(false)` when the decision is absent or says abort, or when the manifest
    /// names no payload of its group (so no transaction). Errors: the store's, and
    /// [`ErrorKind::InvalidManifest`] for a decision record that does not decode, each
    /// naming the key. Thread safety: any number of calls at once.
    pub fn indexed_revision_committed(&self, m: &StoredManifest) -> Result<bool> {
        let payloads = format!("{}/payload/", m.group_id());
        let Some(tx) = m
            .fragments()
            .first()
            .and_then(|f| f.object_key().strip_prefix(payloads.as_str()))
            .and_then(|rest| rest.split('/').next())
            .filter(|tx| !tx.is_empty())
        else {
            return Ok(false);
        };
        let layout =
            KeyLayout::new(&self.key_prefix, m.namespace(), m.resource_id(), m.revision(), m.weight_generation())?;
        let key = layout.control_key(tx);
        let Some(bytes) = read_slot(self, &key)? else { return Ok(false) };
        match Decision::parse_record(&bytes) {
            Ok((Decision::Commit, _)) => Ok(true),
            Ok((Decision::Abort, _)) => Ok(false),
            Err(e) => {
                Err(Error::new(ErrorKind::InvalidManifest, format!("invalid upload decision: {key}: {}", e.message())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_refuse_other_shapes() {
        let j = entry_json("step-42 \u{e9}/\"x\"", 7);
        assert_eq!(
            j,
            "{\"record_type\":\"weight-revision-index-entry\",\"revision\":\"step-42 \\u00e9/\\\"x\\\"\",\
             \"weight_generation\":7}"
        );
        assert_eq!(parse_entry(j.as_bytes()).unwrap(), ("step-42 \u{e9}/\"x\"".to_string(), 7));
        for bad in [
            "{}",
            "[]",
            "{\"record_type\": \"weight-upload-decision\", \"revision\": \"r\", \"weight_generation\": 1}",
            "{\"record_type\": \"weight-revision-index-entry\", \"revision\": \"\", \"weight_generation\": 1}",
            "{\"record_type\": \"weight-revision-index-entry\", \"revision\": \"r\", \"weight_generation\": -1}",
            "{\"record_type\": \"weight-revision-index-entry\", \"revision\": \"r\", \"weight_generation\": 1, \"x\": 1}",
            "{\"record_type\": \"weight-revision-index-entry\", \"revision\": \"r\"}",
            "not json",
        ] {
            assert!(parse_entry(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn slot_keys_live_beside_revisions_and_never_collide_with_one() {
        assert_eq!(slot_key("weights/default/m/", 12), "weights/default/m/%revisions/12");
        // Every encoded revision keeps `%` for a hex escape only.
        for rev in ["%revisions", "%", "revisions", "%re"] {
            assert_ne!(crate::model::keys::encode_key_segment(rev), INDEX_SEGMENT);
        }
    }
}
