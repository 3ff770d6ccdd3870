//! The committed revisions of a resource, so that no caller builds manifest keys by
//! hand: found by listing keys in a store that can ([`crate::store::ObjectStore::list`]),
//! and through the revision index ([`super::revision_index`]) in one that cannot
//! (Mooncake Store).
//!
//! # What counts as a committed revision
//!
//! Every key `<prefix>/<enc(ns)>/<enc(resource)>/<enc(revision)>/<generation>/manifest`
//! under this store's key prefix (`wire-format.md` §5, [`KeyLayout`]) whose object
//! decodes strictly as a stored manifest of exactly that namespace, resource,
//! revision and generation. The protocol publishes a manifest (create-only) only
//! after its commit decision was claimed, so a published manifest is a committed
//! revision; decision records, payloads and integrity records are not read. Keys that
//! follow another layout under the resource's prefix (payloads, decisions, foreign
//! objects, a generation that is not canonical decimal) are not revisions and are
//! skipped; a manifest removed between the listing and its read is skipped too (a
//! listing is not a snapshot).
//!//! In a store that cannot list its keys the candidates are the revisions its index
//! names (every commit of this library records one before claiming its decision);
//! each is the same manifest check, and in addition its transaction's decision record
//! must say commit (a candidate without a published manifest or without a commit
//! decision is skipped). Revisions committed by a writer that keeps no index (the
//! Python reference, or this library before the index) are not found there: load
//! them by manifest key.
//!
//! # Which revision is the newest
//!
//! The one with the highest `weight_generation`; among revisions of the same
//! generation, the one with the greatest `created_at` (compared as strings: the
//! planner writes UTC `YYYY-MM-DDTHH:MM:SSZ`, which sorts chronologically), then the
//! greatest `revision` in code-point order. `(weight_generation, created_at,
//! revision)` is a total order over the revisions of a resource (two manifests of one
//! revision and generation share a key), so the answer never depends on the listing
//! order. [`WeightStore::revisions`] returns them in that order, oldest first: the
//! newest is the last.
//!
//! # Errors
//!
//! [`ErrorKind::InvalidArgument`] for an empty resource
//! id or namespace, [`ErrorKind::InvalidManifest`] for a manifest that does not decode
//! or describes another revision than its key says (the message names the key; `mws
//! ls` shows the store), and the backend's errors. Each message names the resource
//! asked for.
//!
//! The jobs are [`WeightStore::revisions`] and [`WeightStore::latest_revision`],
//! defined here; [`revisions()`] and [`latest`] are their free-function forms.

use super::load::load_manifest_limited;
use super::state::WeightStore;
use crate::error::{Error, ErrorKind, Result};
use crate::model::keys::resource_key_prefix;
use crate::model::{KeyLayout, StoredManifest};
use crate::pyrepr::repr;

/// One committed revision of a resource (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionInfo {
    /// Store namespace.
    pub namespace: String,
    /// Resource id.
    pub resource_id: String,
    /// Revision name.
    pub revision: String,
    /// Weight generation.
    pub weight_generation: u64,
    /// Key of the published manifest (what [`WeightStore::load_manifest`] takes).
    pub manifest_key: String,
    /// `manifest_digest` of the manifest (64 lowercase hex).
    pub manifest_digest: String,
    /// The manifest's `created_at`: when the upload was planned (UTC
    /// `YYYY-MM-DDTHH:MM:SSZ` from this library's planner; opaque when another
    /// writer chose it). The commit follows it; the store keeps no commit time.
    pub created_at: String,
}

impl RevisionInfo {
    /// The revision a manifest describes.
    pub fn of(m: &StoredManifest) -> RevisionInfo {
        RevisionInfo {
            namespace: m.namespace().to_string(),
            resource_id: m.resource_id().to_string(),
            revision: m.revision().to_string(),
            weight_generation: m.weight_generation(),
            manifest_key: m.manifest_key().to_string(),
            manifest_digest: m.manifest_digest().to_string(),
            created_at: m.created_at().to_string(),
        }
    }

    /// The key that orders revisions from oldest to newest:
    /// `(weight_generation, created_at, revision)`.
    pub fn newness(&self) -> (u64, &str, &str) {
        (self.weight_generation, &self.created_at, &self.revision)
    }
}

/// A manifest key found by the listing or the index, with the generation its key
/// names.
struct Candidate {
    key: String,
    weight_generation: u64,
    /// Found through the revision index: its decision record is checked too.
    indexed: bool,
}

/// Parses `<enc(revision)>/<generation>/manifest` (the rest of a key after the
/// resource's prefix). The generation must be canonical decimal (what the planner
/// writes), else the key is not a revision's.
fn parse_rest(rest: &str) -> Option<u64> {
    let mut parts = rest.split('/');
    let (revision, generation, leaf) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || revision.is_empty() || leaf != "manifest" {
        return None;
    }
    if generation.is_empty() || !generation.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if generation.len() > 1 && generation.starts_with('0') {
        return None;
    }
    generation.parse().ok()
}

/// The prefix of every error message: the resource asked for, quoted as Python's
/// `repr` quotes it (the bindings' messages quote names that way).
fn context(resource_id: &str, e: &Error) -> String {
    format!("cannot list the revisions of {}: {}", repr(resource_id), e.message())
}

/// The manifest keys under the resource's prefix.
fn candidates(ws: &WeightStore, namespace: &str, resource_id: &str) -> Result<Vec<Candidate>> {
    if resource_id.is_empty() {
        return Err(Error::invalid("resource_id must be a non-empty string"));
    }
    let prefix = resource_key_prefix(&ws.key_prefix, namespace, resource_id)?;
    let mut out = Vec::new();
    if !ws.store.supports_list() {
        let indexed =
            ws.indexed_revisions(namespace, resource_id).map_err(|e| Error::new(e.kind(), context(resource_id, &e)))?;
        for (revision, g) in indexed {
            let key = KeyLayout::new(&ws.key_prefix, namespace, resource_id, &revision, g)?.manifest_key();
            out.push(Candidate { key, weight_generation: g, indexed: true });
        }
    } else {
        let listed = ws.store.list(&prefix, &mut |key, _| {
            if let Some(g) = key.strip_prefix(prefix.as_str()).and_then(parse_rest) {
                out.push(Candidate { key: key.to_string(), weight_generation: g, indexed: false });
            }
            true
        });
        if let Err(e) = listed {
            return Err(Error::new(e.kind(), context(resource_id, &e)));
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out.dedup_by(|a, b| a.key == b.key);
    Ok(out)
}

/// Reads one candidate: `None` when it vanished since the listing.
fn read(ws: &WeightStore, namespace: &str, resource_id: &str, c: &Candidate) -> Result<Option<RevisionInfo>> {
    let m = match load_manifest_limited(&*ws.store, &c.key, ws.limits.max_metadata_bytes) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::new(e.kind(), context(resource_id, &e))),
    };
    let own_key = KeyLayout::new(&ws.key_prefix, m.namespace(), m.resource_id(), m.revision(), m.weight_generation())
        .map(|k| k.manifest_key());
    if m.namespace() != namespace
        || m.resource_id() != resource_id
        || m.weight_generation() != c.weight_generation
        || own_key.as_deref().ok() != Some(c.key.as_str())
    {
        return Err(Error::new(
            ErrorKind::InvalidManifest,
            format!(
                "cannot list the revisions of {}: the manifest at {} describes revision {} (generation {}) of {} \
                 in namespace {}, which belongs at another key",
                repr(resource_id),
                c.key,
                repr(m.revision()),
                m.weight_generation(),
                repr(m.resource_id()),
                repr(m.namespace())
            ),
        ));
    }
    if c.indexed {
        match ws.indexed_revision_committed(&m) {
            Ok(true) => {}
            Ok(false) => {
                log::debug!("revision index: {} has no commit decision; not listed", c.key);
                return Ok(None);
            }
            Err(e) => return Err(Error::new(e.kind(), context(resource_id, &e))),
        }
    }
    Ok(Some(RevisionInfo::of(&m)))
}

impl WeightStore {
    /// Every committed revision of `resource_id` in `namespace` (uploads default to
    /// the namespace `"default"`) under this store's key prefix, oldest first: by
    /// `(weight_generation, created_at, revision)` ([`RevisionInfo::newness`]), so
    /// the newest is the last. Empty when there is none. Reads every manifest of the
    /// resource (each bounded by `limits().max_metadata_bytes`): in a store that can
    /// list its keys (the embedded stores, a vtable store with `list`) those under the
    /// resource's prefix; in one that cannot (Mooncake Store), those its revision
    /// index names, each also checked against its decision record
    /// ([`super::revision_index`]). Errors ([`super::revisions`]):
    /// [`ErrorKind::InvalidArgument`] (empty namespace or resource id),
    /// [`ErrorKind::InvalidManifest`] (a manifest that does not decode or lies at
    /// another revision's key), backend errors; every message names `resource_id`.
    /// Thread safety: any number of calls may run at once, also beside uploads and
    /// commits (a revision committed meanwhile may or may not be listed).
    pub fn revisions(&self, namespace: &str, resource_id: &str) -> Result<Vec<RevisionInfo>> {
        let mut out = Vec::new();
        for c in candidates(self, namespace, resource_id)? {
            if let Some(info) = read(self, namespace, resource_id, &c)? {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.newness().cmp(&b.newness()));
        Ok(out)
    }

    /// The newest committed revision of `resource_id` in `namespace` (the last of
    /// [`WeightStore::revisions`]: highest weight generation, then latest
    /// `created_at`, then greatest revision name), or `None` when there is none.
    /// Reads only the manifests of the highest generation that still has one. Errors
    /// and thread safety as [`WeightStore::revisions`].
    pub fn latest_revision(&self, namespace: &str, resource_id: &str) -> Result<Option<RevisionInfo>> {
        let mut all = candidates(self, namespace, resource_id)?;
        all.sort_by(|a, b| b.weight_generation.cmp(&a.weight_generation).then_with(|| a.key.cmp(&b.key)));
        let mut i = 0;
        while i < all.len() {
            let generation = all[i].weight_generation;
            let mut best: Option<RevisionInfo> = None;
            while i < all.len() && all[i].weight_generation == generation {
                if let Some(info) = read(self, namespace, resource_id, &all[i])? {
                    if best.as_ref().is_none_or(|b| info.newness() > b.newness()) {
                        best = Some(info);
                    }
                }
                i += 1;
            }
            if best.is_some() {
                return Ok(best);
            }
        }
        Ok(None)
    }
}

/// The free-function form of [`WeightStore::revisions`] (same result, errors and
/// thread safety), kept for callers of this public path.
pub fn revisions(ws: &WeightStore, namespace: &str, resource_id: &str) -> Result<Vec<RevisionInfo>> {
    ws.revisions(namespace, resource_id)
}

/// The free-function form of [`WeightStore::latest_revision`] (same result, errors
/// and thread safety), kept for callers of this public path.
pub fn latest(ws: &WeightStore, namespace: &str, resource_id: &str) -> Result<Option<RevisionInfo>> {
    ws.latest_revision(namespace, resource_id)
}

#[cfg(test)]
mod tests {
    use super::parse_rest;

    #[test]
    fn only_canonical_revision_manifest_keys_are_candidates() {
        assert_eq!(parse_rest("step-42/7/manifest"), Some(7));
        assert_eq!(parse_rest("v%2F1/0/manifest"), Some(0));
        assert_eq!(parse_rest("v/18446744073709551615/manifest"), Some(u64::MAX));
        for bad in [
            "v/07/manifest",
            "v/18446744073709551616/manifest",
            "v/-1/manifest",
            "v/1/manifest/x",
            "v/1",
            "/1/manifest",
            "v/1/payload/tx/f",
            "v/1/transactions/tx/decision",
            "v//manifest",
            "v/+1/manifest",
        ] {
            assert_eq!(parse_rest(bad), None, "{bad}");
        }
    }
}
