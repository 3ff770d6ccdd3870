//! Every opaque C handle and the Rust value it mirrors. A handle is a `Box` made by
//! [`Handle::into_raw`], borrowed with [`Handle::borrow`] and freed by its `*_free`
//! with [`Handle::free`]; the NUL-terminated strings and C views it lends are built
//! once, when the handle is created, so every handle is immutable (or guards its
//! state with a lock) and can be shared between threads.

use crate::boundary::{Failure, FfiResult};
use crate::strings::CText;
use mws::protocol::guards::TerminalState;
use mws::protocol::LoadPlan;
use mws::protocol::RegistrationLease;
use mws::protocol::Transaction;
use mws::protocol::UploadReceipt;
use mws::protocol::WeightStore;
use mws::Decision;
use mws::Placement;
use mws::RuntimeBinding;
use mws::RuntimeBindingSpec;
use mws::RuntimeFragment;
use mws::StoredManifest;
use mws::UploadPlan;
use parking_lot::RwLock;
use parking_lot::RwLockReadGuard;
use std::sync::Arc;
use std::sync::OnceLock;

/// How a C handle is made, borrowed and freed (in the spirit of rustls-ffi's
/// `Castable`): every handle type is owned by C as a `Box` of itself. The few lines
/// that cast raw pointers live here, so entry points never cast by hand.
pub(crate) trait Handle: Sized {
    /// Moves `self` to the heap and hands ownership to C (free with [`Handle::free`]).
    fn into_raw(self) -> *mut Self {
        Box::into_raw(Box::new(self))
    }

    /// Borrows a handle argument; NULL is `MWS_NULL_ARGUMENT` naming `name`.
    ///
    /// # Safety
    /// `p` is NULL or a live handle of this type made by [`Handle::into_raw`], not
    /// freed during the borrow.
    unsafe fn borrow<'a>(p: *const Self, name: &str) -> FfiResult<&'a Self> {
        // SAFETY: the caller guarantees `p` is NULL or a live handle (see above).
        unsafe { p.as_ref() }.ok_or_else(|| Failure::null(name))
    }

    /// Takes a handle back from C and drops it; NULL does nothing.
    ///
    /// # Safety
    /// `p` is NULL or a live handle of this type made by [`Handle::into_raw`], not yet
    /// freed and not in use by another thread.
    unsafe fn free(p: *mut Self) {
        if !p.is_null() {
            // SAFETY: `p` came from `Box::into_raw` in `into_raw` and is freed once.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// Borrows a handle argument (`MWS_NULL_ARGUMENT` naming `name` when NULL).
///
/// # Safety
/// As [`Handle::borrow`].
pub(crate) unsafe fn handle<'a, T: Handle>(p: *const T, name: &str) -> FfiResult<&'a T> {
    // SAFETY: forwarded contract.
    unsafe { T::borrow(p, name) }
}

/// Shared body of the string accessors: borrows handle `h` (argument `name`) and lends
/// the string `pick` chooses, writing its length to `len` when not NULL. NULL (and the
/// last error, under `function`'s name) when `h` is NULL.
///
/// # Safety
/// `h` is NULL or a live handle; `len` is NULL or valid for a write of `size_t`.
pub(crate) unsafe fn lend_text<T: Handle>(
    function: &'static str,
    h: *const T,
    name: &str,
    len: *mut usize,
    pick: impl FnOnce(&T) -> &CText,
) -> *const std::ffi::c_char {
    crate::boundary::value_call(function, std::ptr::null(), || {
        // SAFETY: forwarded contract: `h` is NULL or live, `len` NULL or writable.
        Ok(unsafe { pick(handle(h, name)?).lend(len) })
    })
}

impl Handle for mws_binding {}
impl Handle for mws_upload_plan {}
impl Handle for mws_placement {}
impl Handle for mws_placement_builder {}
impl Handle for mws_transaction {}
impl Handle for mws_store {}
impl Handle for mws_receipts {}
impl Handle for mws_registration_lease {}
impl Handle for mws_stored_manifest {}
impl Handle for mws_load_plan {}

/// A runtime binding under construction: the identity of one participant's binding
/// plus the fragments added so far.
///
/// Created by `mws_binding_new`, filled with `mws_binding_add_fragment`, freed by
/// `mws_binding_free`. The binding is checked as a whole (against its placement) by
/// `mws_binding_validate` and `mws_upload_plan_new`.
///
/// The handle copies every string and array it is given. It does not dereference the
/// buffer addresses; the caller keeps the buffers valid and stable for as long as
/// operations that move bytes (a later upload) use them.
///
/// Thread safety: `mws_binding_add_fragment` modifies the handle and must not run
/// concurrently with any other call on the same handle; functions taking a
/// `const mws_binding *` may run concurrently with each other.
pub struct mws_binding {
    pub(crate) identity: Identity,
    pub(crate) fragments: Vec<RuntimeFragment>,
}

#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) resource_id: String,
    pub(crate) revision: String,
    pub(crate) placement_id: String,
    pub(crate) placement_digest: String,
    pub(crate) participant_id: String,
    pub(crate) instance_id: String,
    pub(crate) lease_id: String,
    pub(crate) generation: u64,
}

impl mws_binding {
    /// Builds the Rust binding (validates it as a whole).
    pub(crate) fn build(&self) -> FfiResult<RuntimeBinding> {
        let id = self.identity.clone();
        Ok(RuntimeBinding::new(RuntimeBindingSpec {
            resource_id: id.resource_id,
            placement_id: id.placement_id,
            placement_digest: id.placement_digest,
            instance_id: id.instance_id,
            generation: id.generation,
            lease_id: id.lease_id,
            revision: id.revision,
            participant_id: id.participant_id,
            fragments: self.fragments.clone(),
        })?)
    }
}

pub(crate) struct OperationView {
    pub(crate) participant_id: CText,
    pub(crate) instance_id: CText,
    pub(crate) lease_id: CText,
    pub(crate) generation: u64,
    pub(crate) fragment_id: CText,
    pub(crate) worker_id: CText,
    pub(crate) placement_fragment_id: CText,
    pub(crate) target_fragment_id: CText,
    pub(crate) object_key: CText,
    pub(crate) nbytes: u64,
}

/// A planned upload: the stored manifest to commit, every key of the upload
/// transaction, and the copy operations, in plan order.
///
/// Created by `mws_upload_plan_new`, freed by `mws_upload_plan_free`. Immutable: every
/// function taking a `const mws_upload_plan *` may be called from several threads at
/// once. It holds no runtime address in any string and does not borrow the placement
/// or bindings it was planned from. Strings returned by its accessors are owned by the
/// handle and stay valid until it is freed.
pub struct mws_upload_plan {
    pub(crate) inner: UploadPlan,
    pub(crate) manifest_json: CText,
    pub(crate) manifest_digest: CText,
    pub(crate) manifest_key: CText,
    pub(crate) group_id: CText,
    pub(crate) control_key: CText,
    pub(crate) transaction_group_id: CText,
    pub(crate) transaction_id: CText,
    pub(crate) source_placement_id: CText,
    pub(crate) source_placement_digest: CText,
    pub(crate) commit_record: CText,
    pub(crate) operations: Vec<OperationView>,
    /// Transport JSON (`mws_upload_plan_to_json`), built on first use.
    pub(crate) transport_json: std::sync::OnceLock<CText>,
}

impl mws_upload_plan {
    pub(crate) fn new(inner: UploadPlan) -> Self {
        let operations = inner
            .operations()
            .iter()
            .map(|op| OperationView {
                participant_id: CText::new(op.source_participant_id()),
                instance_id: CText::new(op.source_instance_id()),
                lease_id: CText::new(op.source_lease_id()),
                generation: op.source_generation(),
                fragment_id: CText::new(op.source_snapshot().fragment_id()),
                worker_id: CText::new(op.source_snapshot().worker_id()),
                placement_fragment_id: CText::new(op.source_placement().placement_fragment_id()),
                target_fragment_id: CText::new(op.target().fragment_id()),
                object_key: CText::new(op.target().object_key()),
                nbytes: op.target().nbytes(),
            })
            .collect();
        let manifest = inner.manifest();
        mws_upload_plan {
            manifest_json: CText::new(&manifest.to_json()),
            manifest_digest: CText::new(manifest.manifest_digest()),
            manifest_key: CText::new(manifest.manifest_key()),
            group_id: CText::new(manifest.group_id()),
            control_key: CText::new(inner.control_key()),
            transaction_group_id: CText::new(inner.transaction_group_id()),
            transaction_id: CText::new(inner.transaction_id()),
            source_placement_id: CText::new(inner.source_placement_id()),
            source_placement_digest: CText::new(inner.source_placement_digest()),
            commit_record: CText::new(&inner.decision_record(Decision::Commit)),
            operations,
            transport_json: std::sync::OnceLock::new(),
            inner,
        }
    }
}

/// A placement under construction (`mws_placement_builder_new`): participants,
/// tensors and fragments added one call at a time, then `mws_placement_builder_build`.
/// Mirrors `model::PlacementBuilder`.
///
/// Freed by `mws_placement_builder_free`. Thread safety: calls are serialized by a
/// mutex; fragment ids it lends stay valid until it is freed.
pub struct mws_placement_builder {
    pub(crate) inner: parking_lot::Mutex<mws::model::PlacementBuilder>,
    /// The ids returned by `mws_placement_builder_add_fragment` (boxed: stable).
    pub(crate) ids: parking_lot::Mutex<Vec<CText>>,
}

/// A parsed and validated complete weight placement (address-free: tensors, topology,
/// and which participant holds which fragment of which tensor).
///
/// Created by `mws_placement_from_json`, freed by `mws_placement_free`. Immutable: every
/// function taking a `const mws_placement *` may be called from several threads at
/// once. Strings returned by its accessors are owned by the handle and stay valid until
/// it is freed.
pub struct mws_placement {
    pub(crate) inner: Placement,
    pub(crate) json: CText,
    pub(crate) placement_id: CText,
    pub(crate) digest: CText,
    pub(crate) topology_id: CText,
    pub(crate) resource_id: CText,
    pub(crate) revision: CText,
    pub(crate) fragments: Vec<FragmentView>,
}

pub(crate) struct FragmentView {
    pub(crate) placement_fragment_id: CText,
    pub(crate) participant_id: CText,
    pub(crate) tensor_id: CText,
    pub(crate) global_offset: Vec<u64>,
    pub(crate) local_shape: Vec<u64>,
    pub(crate) nbytes: u64,
    pub(crate) itemsize: u64,
}

impl mws_placement {
    pub(crate) fn new(inner: Placement) -> Self {
        let mut fragments = Vec::new();
        for part in inner.parts() {
            for f in part.fragments() {
                // Tensors are sorted by id: a binary search, not a scan (n log n overall).
                let itemsize = inner.tensor(f.tensor_id()).map_or(0, |t| t.itemsize());
                fragments.push(FragmentView {
                    placement_fragment_id: CText::new(f.placement_fragment_id()),
                    participant_id: CText::new(part.participant_id()),
                    tensor_id: CText::new(f.tensor_id()),
                    global_offset: f.global_offset().to_vec(),
                    local_shape: f.local_shape().to_vec(),
                    nbytes: f.nbytes(),
                    itemsize,
                });
            }
        }
        mws_placement {
            json: CText::new(&inner.to_json()),
            placement_id: CText::new(inner.placement_id()),
            digest: CText::new(inner.digest()),
            topology_id: CText::new(inner.topology().topology_id()),
            resource_id: CText::new(inner.resource_id()),
            revision: CText::new(inner.revision()),
            fragments,
            inner,
        }
    }
}

/// An upload transaction: one upload plan in one store, uploaded participant by
/// participant (`mws_transaction_upload`), with receipts collected in the handle
/// (plus those of other processes, `mws_transaction_add_receipts`), then committed
/// (`mws_transaction_commit`) or aborted (`mws_transaction_abort`).
///
/// Created by `mws_transaction_new`, freed by `mws_transaction_free`. The handle keeps
/// the store alive and holds its own copy of the plan: both may be freed while it
/// lives. Freeing it never aborts: recovery is explicit (see `mws_transaction_free`).
///
/// Thread safety: calls on one transaction are serialized internally (a mutex held
/// for the whole call, I/O included), so it may be shared between threads, but
/// uploads through one transaction never run in parallel. For parallel uploads, give
/// each thread or process its own transaction over the same plan (or
/// `mws_upload_plan_from_json` of it) and merge their receipts into the committing
/// one. Guard callbacks run under that mutex and must not call into the same
/// transaction.
pub struct mws_transaction {
    pub(crate) inner: Transaction,
}

/// A weight store: an object store backend (memory, directory or caller vtable) plus
/// the key prefix, limits and buffer-registration state of the weight protocol.
///
/// Created by `mws_store_open_memory`, `mws_store_open_dir`, `mws_store_from_vtable`
/// or `mws_store_from_vtable_with_options`; freed by `mws_store_free`.
///
/// Thread safety: every function taking a `const mws_store *` may be called from
/// several threads at once (uploads and loads of different participants run in
/// parallel). Writers (`mws_writer`) keep the store alive: freeing the store while a
/// writer lives is allowed; the backend is released when the last of them goes.
pub struct mws_store {
    pub(crate) ws: Arc<WeightStore>,
    pub(crate) key_prefix: CText,
}

impl mws_store {
    pub(crate) fn new(ws: WeightStore) -> mws_store {
        mws_store { key_prefix: CText::new(ws.key_prefix()), ws: Arc::new(ws) }
    }
}

/// Upload receipts: proof that stored fragments were written and are visible.
/// Returned by `mws_store_upload` and `mws_writer_write_tensor`, decoded by
/// `mws_receipts_from_json`, merged by `mws_receipts_concat`; freed by
/// `mws_receipts_free`. Immutable: may be used from several threads at once.
pub struct mws_receipts {
    pub(crate) inner: Vec<UploadReceipt>,
    pub(crate) json: OnceLock<CText>,
}

impl mws_receipts {
    pub(crate) fn new(inner: Vec<UploadReceipt>) -> mws_receipts {
        mws_receipts { inner, json: OnceLock::new() }
    }
}

/// A registration lease: the buffers of some runtime fragments of one binding, pinned
/// (allocation guard) and registered with the store's backend once, for any number of
/// `mws_store_upload` / `mws_store_load` calls that pass it in `mws_io_args.lease`
/// (those calls then neither pin nor register anything).
///
/// Created by `mws_registration_lease_new`, closed by `mws_registration_lease_close`
/// (unregisters and releases the pin with a terminal state), freed by
/// `mws_registration_lease_free` (which closes an open lease as
/// `MWS_TERMINAL_ABORTED` first). The lease keeps its store's backend alive.
///
/// Thread safety: uploads and loads using one lease may run concurrently; a close
/// waits until they returned.
pub struct mws_registration_lease {
    pub(crate) ws: Arc<WeightStore>,
    pub(crate) inner: RwLock<RegistrationLease>,
}

impl mws_registration_lease {
    /// The lease, read-locked for one call on `ws` (refused when it belongs to
    /// another store; a closed lease is refused by the call itself).
    pub(crate) fn for_store(&self, ws: &Arc<WeightStore>) -> FfiResult<RwLockReadGuard<'_, RegistrationLease>> {
        if !Arc::ptr_eq(&self.ws, ws) {
            return Err(Failure::invalid("the registration lease belongs to another store"));
        }
        Ok(self.inner.read())
    }
}

impl Drop for mws_registration_lease {
    fn drop(&mut self) {
        let lease = self.inner.get_mut();
        if !lease.is_closed() {
            // Unregister failures quarantine the pin in the store (drainable there).
            let _ = self.ws.close_registration_lease(lease, TerminalState::Aborted);
        }
    }
}

pub(crate) struct StoredFragmentView {
    pub(crate) fragment_id: CText,
    pub(crate) tensor_id: CText,
    pub(crate) object_key: CText,
    pub(crate) object_offset: u64,
    pub(crate) nbytes: u64,
    pub(crate) global_offset: Vec<u64>,
    pub(crate) local_shape: Vec<u64>,
}

/// A stored manifest: the published, immutable description of one weight revision
/// (tensors, stored fragments, object keys).
///
/// Created by `mws_stored_manifest_from_store`, `mws_stored_manifest_from_json`,
/// `mws_store_commit` and `mws_writer_commit`; freed by `mws_stored_manifest_free`.
/// Immutable: may be used from several threads at once. Strings returned by its
/// accessors are borrowed from the handle and valid until it is freed.
pub struct mws_stored_manifest {
    pub(crate) inner: Arc<StoredManifest>,
    pub(crate) json: CText,
    pub(crate) digest: CText,
    pub(crate) key: CText,
    pub(crate) group_id: CText,
    pub(crate) namespace: CText,
    pub(crate) resource_id: CText,
    pub(crate) revision: CText,
    pub(crate) fragments: Vec<StoredFragmentView>,
}

impl mws_stored_manifest {
    pub(crate) fn new(inner: Arc<StoredManifest>) -> Self {
        let fragments = inner
            .fragments()
            .iter()
            .map(|f| StoredFragmentView {
                fragment_id: CText::new(f.fragment_id()),
                tensor_id: CText::new(f.tensor_id()),
                object_key: CText::new(f.object_key()),
                object_offset: f.object_offset(),
                nbytes: f.nbytes(),
                global_offset: f.global_offset().to_vec(),
                local_shape: f.local_shape().to_vec(),
            })
            .collect();
        mws_stored_manifest {
            json: CText::new(&inner.to_json()),
            digest: CText::new(inner.manifest_digest()),
            key: CText::new(inner.manifest_key()),
            group_id: CText::new(inner.group_id()),
            namespace: CText::new(inner.namespace()),
            resource_id: CText::new(inner.resource_id()),
            revision: CText::new(inner.revision()),
            fragments,
            inner,
        }
    }
}

/// A restore plan: the transfer regions that move a stored manifest into the target
/// buffers of the bound participants of a target placement.
///
/// Created by `mws_load_plan_new`, freed by `mws_load_plan_free`. Immutable: may be
/// used from several threads at once (each participant's `mws_store_load` may run
/// concurrently). It copies what it needs from the manifest, placement and bindings
/// (which may be freed afterwards) but records the bindings' buffer addresses: the
/// buffers must stay where they are until the loads ran.
pub struct mws_load_plan {
    pub(crate) inner: LoadPlan,
    pub(crate) participants: Vec<CText>,
}
