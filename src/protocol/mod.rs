//! The store-facing protocol (`store-protocol.md`, `writer-and-snapshot.md`,
//! `load-path.md`): allocation guards, buffer registration, the upload
//! transaction, `upload`, and restores. Keys always come from plans.

pub mod guards;
pub mod load;
pub mod registration;
pub mod transaction;
pub mod transfer;
pub mod transport;
pub mod upload;
pub mod weight_store;
pub mod writer;

pub use guards::{AllocationFence, GuardProvider, LifetimeToken, StaticGuard, TerminalState};
pub use load::{load_manifest, LoadArgs, LoadOptions, LoadPlan, LoadStats};
pub use registration::RegistrationLease;
pub use transaction::UploadReceipt;
pub use upload::UploadArgs;
pub use weight_store::{StoreLimits, WeightStore};
pub use writer::{SnapshotAdapter, SnapshotDescriptor, SnapshotSource, SnapshotWriter};
