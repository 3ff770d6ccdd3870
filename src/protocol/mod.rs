//! The store-facing protocol (`docs/spec/store-protocol.md`,
//! `writer-and-snapshot.md`, `load-path.md`): everything that does I/O through a
//! store. Keys always come from plans.
//!
//! - [`weight_store`]: [`WeightStore`]'s construction, configuration, key-prefix
//!   rules, restore planning and registration leases; each job below defines its own
//!   `WeightStore` methods, the one place of its logic; [`state`]: its fields and
//!   limits.
//! - [`upload`]: payload writes of one participant; [`commit`]: the decision record,
//!   commit, abort, finalize; [`transaction`]: [`Transaction`], the stateful front
//!   (receipts, decision-may-exist); [`receipt`]: receipts and their JSON transport.
//! - [`load`]: restores (ranged or strided reads into target buffers).
//! - [`progress`]: throttled progress reports of long calls.
//! - [`revisions`]: the committed revisions of a resource and the newest one
//!   (found by listing keys, or through [`revision_index`] in stores that cannot
//!   list them).
//! - [`operator`]: survey and garbage collection of a listable store (`mws`).
//! - [`integrity`]: payload checksums: computed at upload, written before commit,
//!   verified at restore and by operators.
//! - [`writer`]: the snapshot writer; [`guards`]: allocation guards and pins;
//!   [`registration`]: buffer registration, leases and quarantine.

pub mod commit;
mod device_staging;
pub mod guards;
pub mod integrity;
pub mod load;
pub mod operator;
pub mod progress;
pub mod receipt;
pub mod registration;
pub mod revision_index;
pub mod revisions;
pub mod state;
pub mod transaction;
pub mod transfer;
pub mod upload;
pub mod weight_store;
pub mod writer;

pub use crate::plan::bound_load::LoadPlan;
pub use guards::{AllocationFence, GuardProvider, LifetimeToken, StaticGuard, TerminalState};
pub use load::{load_manifest, LoadArgs, LoadOptions, LoadStats};
pub use progress::{Progress, ProgressFn, ProgressPhase, PROGRESS_INTERVAL};
pub use receipt::{receipts_from_json, receipts_to_json, UploadReceipt};
pub use registration::RegistrationLease;
pub use revisions::RevisionInfo;
pub use state::StoreLimits;
pub use transaction::{Transaction, TransactionState};
pub use upload::{UploadArgs, UploadSource};
pub use weight_store::{SharedLease, WeightStore};
pub use writer::{SnapshotAdapter, SnapshotDescriptor, SnapshotSource, SnapshotWriter};
