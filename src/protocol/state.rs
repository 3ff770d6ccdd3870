//! The state of a [`WeightStore`]: its backend, key prefix, limits and
//! registration state, plus the two rules every job shares (the store's key prefix
//! for plans). The store's API is one `impl` block in `weight_store.rs`; the jobs
//! (upload, commit, load, snapshot) are free functions over this state in their own
//! files, so no module imports the API it implements.

use super::registration::Registrar;
use crate::error::{invalid, Result};
use crate::model::Placement;
use crate::plan::upload::{plan_upload as plan_upload_with, UploadOptions, UploadPlan};
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
    /// [`crate::ErrorKind::LimitExceeded`] before it is read or allocated.
    pub max_metadata_bytes: u64,
    /// Verify restored payloads against the revision's integrity record when it has
    /// one (`protocol::integrity`: every touched 1 MiB block re-read and checked
    /// with CRC-32C, delivered bytes compared); a corrupted, truncated or swapped
    /// payload then fails with [`crate::ErrorKind::Integrity`] naming the fragment.
    /// Default: false, because it costs more than 10% of a restore (measured by
    /// `cargo bench --bench io`: about +230% on the memory and directory stores,
    /// where a restore runs near memcpy speed). `mws verify` checks a revision
    /// offline at any time. Snapshots write the record regardless.
    pub verify_integrity: bool,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_range_bytes: 64 << 20,
            max_ranges_per_request: 1024,
            max_region_segments: 1 << 32,
            staging_bytes: 0,
            max_metadata_bytes: crate::store::DEFAULT_MAX_METADATA_BYTES,
            verify_integrity: false,
        }
    }
}

/// A weight store: the protocol's entry point for snapshots and restores (its API:
/// `weight_store.rs`). `Send + Sync`; calls may run concurrently from several threads.
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

/// `plan_upload` with `ws`'s key prefix (see [`WeightStore::plan_upload`]).
pub(crate) fn plan_upload(
    ws: &WeightStore,
    placement: &Placement,
    bindings: &[RuntimeBinding],
    options: &UploadOptions,
) -> Result<UploadPlan> {
    let mut o = options.clone();
    o.key_prefix = ws.key_prefix.clone();
    plan_upload_with(placement, bindings, &o)
}

/// Fails unless `plan`'s keys live under `ws`'s key prefix (see
/// [`WeightStore::check_plan_prefix`]).
pub(crate) fn check_plan_prefix(ws: &WeightStore, plan: &UploadPlan) -> Result<()> {
    let g = plan.manifest().group_id();
    let p = &ws.key_prefix;
    if g.len() > p.len() && g.starts_with(p.as_str()) && g.as_bytes()[p.len()] == b'/' {
        Ok(())
    } else {
        invalid(format!("upload plan keys ({g}) are not under this store's key prefix {p}"))
    }
}
