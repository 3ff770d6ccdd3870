//! `WeightStore`: the protocol's entry point for snapshots and restores — a store
//! backend plus the configuration and registration state of the weight protocol
//! (`docs/spec/store-protocol.md` §2).
//!
//! The API of [`WeightStore`] is its methods, and each job's logic lives in exactly
//! one of them. This file holds construction and configuration, the key-prefix
//! rules every job shares (`plan_upload`, `check_plan_prefix`), the manifest read
//! and restore planning (`load_manifest`, `plan_load`) and the registration leases
//! (over the store's table in [`super::registration`]), plus [`SharedLease`]. Every
//! other job's methods are the `impl WeightStore` block of the job's own file:
//! [`super::upload`] (`upload`, `upload_many`), [`super::commit`] (`commit`,
//! `abort_upload`, `finalize`, the decision and manifest reads, `require_writable`,
//! ...), [`super::load`] (`load`), [`super::writer`] (`begin_snapshot`,
//! `begin_snapshot_with`, `snapshot`) and [`super::revisions`] (`revisions`,
//! `latest_revision`). The state lives in [`super::state`].

use super::guards::{acquire_pin, GuardProvider, TerminalState};
use super::load;
use super::registration::RegistrationLease;
use super::state::StoreLimits;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::{Placement, StoredManifest};
use crate::plan::bound_load::LoadPlan;
use crate::plan::load::PlanningLimits;
use crate::plan::upload::{plan_upload, UploadOptions, UploadPlan};
use crate::runtime::RuntimeBinding;
use crate::store::ObjectStore;
use std::sync::Arc;

pub use super::state::WeightStore;

impl WeightStore {
    /// Wraps `store` with the default prefix `weights` and default limits.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        WeightStore {
            store,
            key_prefix: "weights".into(),
            limits: StoreLimits::default(),
            registrar: Default::default(),
            staging: Default::default(),
            integrity_records: Default::default(),
            device: None,
        }
    }

    /// Sets the device engine through which snapshots read device sources and
    /// restores write device targets (staged in host buffers of the engine: the
    /// backend sees host bytes only, restores are verified before a byte reaches the
    /// device). Without one, device memory is refused (`MWS_UNSUPPORTED`, before any
    /// I/O) unless the backend reaches it itself ([`ObjectStore::supports_memory`]).
    pub fn with_device_engine(mut self, device: Arc<dyn crate::device::DeviceEngine>) -> Self {
        self.device = Some(device);
        self
    }

    /// The device engine, if any.
    pub fn device_engine(&self) -> Option<&Arc<dyn crate::device::DeviceEngine>> {
        self.device.as_ref()
    }

    /// Sets the key prefix (stored stripped of leading/trailing `/`; planning rejects
    /// an empty result).
    pub fn with_key_prefix(mut self, key_prefix: &str) -> Self {
        self.key_prefix = key_prefix.trim_matches('/').to_string();
        self
    }

    /// Sets the limits; each must be positive (`range limits must be positive`).
    pub fn with_limits(mut self, limits: StoreLimits) -> Result<Self> {
        limits.validate()?;
        self.limits = limits;
        Ok(self)
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }
    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }
    /// The limits.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    // --- snapshot: planning (payloads: upload.rs; the transaction: commit.rs; the
    // snapshot writer: writer.rs) ------------------------------------------------

    /// `plan_upload` with this store's key prefix (`transaction_id`/`created_at`
    /// from `options`; `options.key_prefix` is ignored). Pure: no store I/O.
    pub fn plan_upload(
        &self,
        placement: &Placement,
        bindings: &[RuntimeBinding],
        options: &UploadOptions,
    ) -> Result<UploadPlan> {
        let mut o = options.clone();
        o.key_prefix = self.key_prefix.clone();
        plan_upload(placement, bindings, &o)
    }

    /// Fails unless `plan`'s keys live under this store's key prefix (a plan made
    /// for another prefix would otherwise write where no reader of this store looks).
    pub fn check_plan_prefix(&self, plan: &UploadPlan) -> Result<()> {
        let g = plan.manifest().group_id();
        let p = &self.key_prefix;
        if g.len() > p.len() && g.starts_with(p.as_str()) && g.as_bytes()[p.len()] == b'/' {
            Ok(())
        } else {
            invalid(format!("upload plan keys ({g}) are not under this store's key prefix {p}"))
        }
    }

    // --- restore: the manifest and planning (the execution: load.rs; the committed
    // revisions: revisions.rs) -----------------------------------------------------

    /// Reads and strictly decodes the manifest at `manifest_key` (at most
    /// `limits().max_metadata_bytes`, see [`super::load::load_manifest_limited`]).
    pub fn load_manifest(&self, manifest_key: &str) -> Result<StoredManifest> {
        load::load_manifest_limited(&*self.store, manifest_key, self.limits.max_metadata_bytes)
    }

    /// Plans a restore (see [`LoadPlan::plan`]). Pure: no store I/O.
    pub fn plan_load(
        &self,
        manifest: Arc<StoredManifest>,
        target: Arc<Placement>,
        bindings: &[RuntimeBinding],
        limits: PlanningLimits,
    ) -> Result<LoadPlan> {
        let plan = LoadPlan::plan(manifest, target, bindings, limits)?;
        log::info!(
            "load plan for {}: {} regions, {} segments, {} bytes",
            plan.manifest().manifest_key(),
            plan.regions().len(),
            plan.logical().total_segments(),
            plan.total_bytes()
        );
        Ok(plan)
    }

    // --- registration leases ---------------------------------------------------

    /// Pins and registers `fragment_ids` of `binding` once, for any number of
    /// uploads or loads (`register_weight_buffers`). `side` is `source` or
    /// `target`. Errors: `Store registration lease requires fragments`, guard and
    /// registration errors (the pin is released or quarantined, never leaked).
    pub fn register_weight_buffers(
        &self,
        binding: &RuntimeBinding,
        fragment_ids: &[String],
        guard: &dyn GuardProvider,
        side: &str,
        transfer_id: Option<&str>,
    ) -> Result<RegistrationLease> {
        if side != "source" && side != "target" {
            return invalid(format!("invalid lifetime side: {side}"));
        }
        let mut ids: Vec<String> = fragment_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument, "Store registration lease requires fragments"));
        }
        let transfer_id = transfer_id.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let (fresh, token) = acquire_pin(guard, side, &transfer_id, binding, &ids)?;
        self.registrar.register_lease(&*self.store, fresh, ids, token)
    }

    /// Closes a lease: unregisters its buffers and releases its pin with `state`
    /// (quarantined on unregister failure). A no-op when already closed.
    pub fn close_registration_lease(&self, lease: &mut RegistrationLease, state: TerminalState) -> Result<()> {
        self.registrar.close_lease(&*self.store, lease, state)
    }

    /// Sorted ids of quarantined registrations (new I/O is blocked while any exist).
    pub fn pending_registration_ids(&self) -> Vec<String> {
        self.registrar.pending_ids()
    }

    /// Retries the cleanup of a quarantined registration and releases its pin.
    pub fn drain_pending_registration(&self, id: &str) -> Result<()> {
        self.registrar.drain(&*self.store, id)
    }

    /// Retries the cleanup of every quarantined registration (in id order) and
    /// releases their pins, stopping at the first failure (that entry and the later
    /// ones stay quarantined).
    pub fn drain_pending_registrations(&self) -> Result<()> {
        for id in self.pending_registration_ids() {
            self.drain_pending_registration(&id)?;
        }
        Ok(())
    }
}

/// A registration lease that owns its store ([`WeightStore::register_weight_buffers`]
/// made it), for callers that share it between calls and may drop it open (the C
/// ABI's `mws_registration_lease`): each upload or load read-locks it for the call,
/// [`SharedLease::close`] waits for them, and dropping an open lease closes it as
/// [`TerminalState::Aborted`] (an unregistration failure leaves the pin quarantined
/// in the store, where [`WeightStore::pending_registration_ids`] sees it).
pub struct SharedLease {
    store: Arc<WeightStore>,
    lease: parking_lot::RwLock<RegistrationLease>,
}

impl SharedLease {
    /// Shares `lease`, made by `store`.
    pub fn new(store: Arc<WeightStore>, lease: RegistrationLease) -> SharedLease {
        SharedLease { store, lease: parking_lot::RwLock::new(lease) }
    }

    /// The lease, read-locked for one call on `store`. Errors: `the registration
    /// lease belongs to another store` ([`ErrorKind::InvalidArgument`]); a closed lease
    /// is refused by the call itself.
    pub fn for_store(&self, store: &Arc<WeightStore>) -> Result<impl std::ops::Deref<Target = RegistrationLease> + '_> {
        if !Arc::ptr_eq(&self.store, store) {
            return invalid("the registration lease belongs to another store");
        }
        Ok(self.lease.read())
    }

    /// [`WeightStore::close_registration_lease`] with `state`, once no call uses the
    /// lease any more.
    pub fn close(&self, state: TerminalState) -> Result<()> {
        self.store.close_registration_lease(&mut self.lease.write(), state)
    }

    /// Whether the lease is closed.
    pub fn is_closed(&self) -> bool {
        self.lease.read().is_closed()
    }
}

impl Drop for SharedLease {
    fn drop(&mut self) {
        let lease = self.lease.get_mut();
        if !lease.is_closed() {
            // Unregister failures quarantine the pin in the store (drainable there).
            let _ = self.store.close_registration_lease(lease, TerminalState::Aborted);
        }
    }
}
