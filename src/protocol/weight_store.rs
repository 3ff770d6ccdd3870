//! `WeightStore`: a store backend plus the configuration and registration state of
//! the weight protocol (`store-protocol.md` §2).

use super::guards::{acquire_pin, GuardProvider, TerminalState};
use super::registration::{Registrar, RegistrationLease};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::model::{Placement, StoredManifest};
use crate::plan::upload::{plan_upload, UploadOptions, UploadPlan};
use crate::runtime::RuntimeBinding;
use crate::store::ObjectStore;
use std::sync::Arc;

/// Range and batching limits (all > 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest single range read in bytes (default 64 MiB).
    pub max_range_bytes: u64,
    /// Keys or ranges per backend request (default 1024).
    pub max_ranges_per_request: usize,
    /// Largest segment count of one region at execution (default 2^32; the
    /// reference's 1,000,000 rejects realistic dim-1 reshards of large matrices).
    pub max_region_segments: u64,
    /// Restores through stores without native strided reads (Mooncake) pay per
    /// range. With `staging_bytes > 0`, a region of many small rows whose source
    /// rows lie close together is read as one span into a registered host staging
    /// buffer of this size and scattered locally (host targets only). Default 0:
    /// off, so requests are exactly the specified ranges.
    pub staging_bytes: u64,
    /// Largest manifest or decision record read back from the store, in bytes
    /// (default [`crate::store::DEFAULT_MAX_METADATA_BYTES`], 256 MiB: about 2.9x the
    /// largest benchmark manifest). A larger object fails with
    /// [`ErrorKind::LimitExceeded`] before it is read or allocated.
    pub max_metadata_bytes: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_range_bytes: 64 << 20,
            max_ranges_per_request: 1024,
            max_region_segments: 1 << 32,
            staging_bytes: 0,
            max_metadata_bytes: crate::store::DEFAULT_MAX_METADATA_BYTES,
        }
    }
}

/// A weight store: the protocol's entry point for snapshots and restores.
/// `Send + Sync`; calls may run concurrently from several threads.
pub struct WeightStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) key_prefix: String,
    pub(crate) limits: StoreLimits,
    pub(crate) registrar: Registrar,
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore").field("key_prefix", &self.key_prefix).field("limits", &self.limits).finish()
    }
}

impl WeightStore {
    /// Wraps `store` with the default prefix `weights` and default limits.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        WeightStore {
            store,
            key_prefix: "weights".into(),
            limits: StoreLimits::default(),
            registrar: Registrar::default(),
        }
    }

    /// Sets the key prefix (stored stripped of leading/trailing `/`; planning rejects
    /// an empty result).
    pub fn with_key_prefix(mut self, key_prefix: &str) -> Self {
        self.key_prefix = key_prefix.trim_matches('/').to_string();
        self
    }

    /// Sets the limits; each must be positive (`range limits must be positive`).
    pub fn with_limits(mut self, limits: StoreLimits) -> Result<Self> {
        if limits.max_range_bytes == 0
            || limits.max_ranges_per_request == 0
            || limits.max_region_segments == 0
            || limits.max_metadata_bytes == 0
        {
            return invalid("range limits must be positive");
        }
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

    /// `plan_upload` with this store's key prefix (`transaction_id`/`created_at`
    /// from `options`; `options.key_prefix` is ignored).
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
        if g.len() > self.key_prefix.len()
            && g.starts_with(&self.key_prefix)
            && g.as_bytes()[self.key_prefix.len()] == b'/'
        {
            Ok(())
        } else {
            invalid(format!("upload plan keys ({g}) are not under this store's key prefix {}", self.key_prefix))
        }
    }

    /// Reads and strictly decodes the manifest at `manifest_key` (at most
    /// `limits().max_metadata_bytes`, see [`super::load::load_manifest_limited`]).
    pub fn load_manifest(&self, manifest_key: &str) -> Result<StoredManifest> {
        super::load::load_manifest_limited(&*self.store, manifest_key, self.limits.max_metadata_bytes)
    }

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
}
