//! `mws_revision_list`: the committed revisions of one resource in a store
//! (`WeightStore::revisions` / `WeightStore::latest_revision`), so that C callers
//! never build manifest keys by hand.

use crate::args::{at, Caller, Lent, Texts};
use crate::boundary::{mws_status, FfiResult};
use crate::store::mws_store;
use mws::model::DEFAULT_NAMESPACE;
use mws::protocol::{RevisionInfo, WeightStore};
use std::ffi::c_char;

/// Committed revisions of one resource, oldest first: ordered by weight generation,
/// then `created_at`, then revision name (code-point order), so the newest is the
/// last. Created by `mws_revision_list_from_store` (every revision) or
/// `mws_revision_list_latest_from_store` (the newest only); freed by
/// `mws_revision_list_free`. Immutable: may be used from several threads at once.
/// A snapshot of the store at the call: revisions committed later are not in it.
pub struct mws_revision_list {
    _texts: Texts,
    items: Lent<mws_revision_info>,
}

impl mws_revision_list {
    fn new(items: Vec<RevisionInfo>) -> mws_revision_list {
        let texts = Texts::default();
        let items = items
            .iter()
            .map(|r| mws_revision_info {
                revision: texts.ptr(&r.revision),
                weight_generation: r.weight_generation,
                manifest_key: texts.ptr(&r.manifest_key),
                manifest_digest: texts.ptr(&r.manifest_digest),
                created_at: texts.ptr(&r.created_at),
            })
            .collect();
        mws_revision_list { _texts: texts, items: Lent(items) }
    }
}

handle!(mws_revision_list);

/// One committed revision, as returned by `mws_revision_list_get`. Every pointer is
/// a NUL-terminated string borrowed from the list and valid until it is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mws_revision_info {
    /// Revision name.
    pub revision: *const c_char,
    /// Weight generation.
    pub weight_generation: u64,
    /// Key of its published manifest (pass it to `mws_stored_manifest_from_store`).
    pub manifest_key: *const c_char,
    /// Its manifest digest (64 lowercase hex).
    pub manifest_digest: *const c_char,
    /// The manifest's `created_at`: when the upload was planned, UTC
    /// `YYYY-MM-DDTHH:MM:SSZ` when this library planned it (opaque text when another
    /// writer did). The store keeps no commit time; the commit follows this time.
    pub created_at: *const c_char,
}

/// The body of both listing entry points: reads the arguments, asks the core with
/// `list`, and stores the new list handle in `*out`.
fn fill(
    c: Caller<'_>,
    store: *const mws_store,
    store_namespace: *const c_char,
    resource_id: *const c_char,
    out: *mut *mut mws_revision_list,
    list: impl FnOnce(&WeightStore, &str, &str) -> mws::Result<Vec<RevisionInfo>>,
) -> FfiResult<()> {
    let s = c.handle(store, "store")?;
    let ns = c.opt_str(store_namespace, "store_namespace")?.unwrap_or(DEFAULT_NAMESPACE);
    let resource_id = c.str(resource_id, "resource_id")?;
    let out = c.out(out, "out")?;
    out.give_handle(mws_revision_list::new(list(&s.ws, ns, resource_id)?))
}

/// Lists every committed revision of `resource_id` in namespace `store_namespace`
/// (NULL means `"default"`, the namespace uploads default to) under the store's key
/// prefix: each key `<prefix>/<ns>/<resource>/<revision>/<generation>/manifest` whose
/// manifest decodes strictly as that revision (a published manifest is a committed
/// revision; keys of other layouts are skipped). A store that cannot list its keys (a
/// vtable store without `list`, such as Mooncake Store) is read through the revision
/// index every commit of this library writes there, each indexed revision also
/// checked against its decision record (the layout: `docs/mooncake/CPP-STORE.md`,
/// "Revision listing"). Reads every manifest of the
/// resource. New handle in `*out` (free with `mws_revision_list_free`); an empty list
/// when the resource has no revision.
///
/// Errors (each message names `resource_id`): `MWS_NULL_ARGUMENT`,
/// `MWS_INVALID_UTF8`, `MWS_INVALID_ARGUMENT` (empty namespace or resource id),
/// `MWS_INVALID_MANIFEST` (a manifest that does not decode, or that describes another
/// revision than its key, or an indexed revision's decision record that does not
/// decode; the message names the key), `MWS_LIMIT_EXCEEDED` (a manifest above
/// `max_metadata_bytes`), `MWS_STORE` / `MWS_IO`.
///
/// Thread safety: any number of calls may run at once, also beside uploads and
/// commits (a revision committed meanwhile may or may not be listed).
///
/// # Safety
/// `store` is NULL or a live handle; `store_namespace` and `resource_id` are NULL or
/// NUL-terminated; `out` is NULL or valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn mws_revision_list_from_store(
    store: *const mws_store,
    store_namespace: *const c_char,
    resource_id: *const c_char,
    out: *mut *mut mws_revision_list,
) -> mws_status {
    status_call!(|c| fill(c, store, store_namespace, resource_id, out, |ws, ns, id| ws.revisions(ns, id)))
}

/// As `mws_revision_list_from_store`, keeping only the newest revision: a list of
/// one element, or an empty list when the resource has no revision. The newest has
/// the highest weight generation; among equal generations the greatest `created_at`,
/// then the greatest revision name (code-point order) wins. Reads only the
/// manifests of the highest generation. Errors and thread safety as
/// `mws_revision_list_from_store`.
///
/// # Safety
/// As `mws_revision_list_from_store`.
#[no_mangle]
pub unsafe extern "C" fn mws_revision_list_latest_from_store(
    store: *const mws_store,
    store_namespace: *const c_char,
    resource_id: *const c_char,
    out: *mut *mut mws_revision_list,
) -> mws_status {
    status_call!(|c| fill(c, store, store_namespace, resource_id, out, |ws, ns, id| {
        Ok(ws.latest_revision(ns, id)?.into_iter().collect())
    }))
}

/// Frees a revision list. `NULL` does nothing. Strings borrowed from it become
/// invalid.
///
/// Thread safety: waits for the calls on the handle that other threads are running;
/// from inside such a call on the same thread (a callback), the handle is freed when
/// that call returns.
///
/// # Safety
/// `list` is NULL or a live handle not yet freed; no call starts on it once this
/// returns.
#[no_mangle]
pub unsafe extern "C" fn mws_revision_list_free(list: *mut mws_revision_list) {
    value_call!((), |c| c.free(list))
}

/// Returns the number of revisions, or 0 (and the last error) if `list` is NULL.
///
/// # Safety
/// `list` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn mws_revision_list_count(list: *const mws_revision_list) -> usize {
    value_call!(0, |c| Ok(c.handle(list, "list")?.items.len()))
}

/// Describes revision `index` (0 is the oldest, `count - 1` the newest) into `*out`;
/// pointers borrowed from `list`.
///
/// Errors: `MWS_NULL_ARGUMENT`, `MWS_INVALID_ARGUMENT` (index out of range).
///
/// # Safety
/// `list` is NULL or a live handle; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn mws_revision_list_get(
    list: *const mws_revision_list,
    index: usize,
    out: *mut mws_revision_info,
) -> mws_status {
    status_call!(|c| {
        let l = c.handle(list, "list")?;
        let out = c.out(out, "out")?;
        let r = at(&l.items, index, "revision", |n| format!("list has {n}"))?;
        out.give(*r)
    })
}
