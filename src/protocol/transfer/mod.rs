//! Live weight transfer between running instances (`live-transfer.md` §4–§12): the
//! sink and reader executors over a [`crate::engine::TransferEngine`], completion
//! tracking (pending transfers, drains, engine identity), memory registration
//! leases, nestable registration scopes, receipts, and the coordinator's
//! per-target verdict.

pub mod completion;
pub mod delta;
pub mod delta_pull;
pub mod device_bytes;
pub mod error;
pub mod executor;
pub mod lease;
pub mod loader;
pub mod notify;
pub mod notify_router;
pub mod outcome;
pub mod prepared;
pub mod prepared_stored;
pub mod scope;
pub mod step_handle;

pub use completion::{PendingTransferInfo, COMPLETION_UNKNOWN_RESTART_REQUIRED};
pub use delta::{DeltaInbox, DeltaReport, TargetDelta, TargetHeld};
pub use delta_pull::{DeltaOutbox, DeltaPublisher, SourceOutbox};
pub use error::{TransferError, TransferErrorKind, TransferResult};
pub use executor::{
    EngineResources, ExecuteArgs, ExecutionStats, ExecutorLimits, GuardRelease, TransferExecutor, TransferReceipt,
};
pub use lease::{GuardProviders, MemoryRegistrationLease};
pub use loader::{
    CancelToken, LiveArgs, LiveError, LiveReport, Loader, ProgressCallback, Sink, TargetReport, TransferStats,
};
pub use notify::{
    execute_sink_notified, ContentCheck, ContentMismatch, MismatchedRange, NotifiedSink, NotifyAccepted,
    NotifyAcceptor, NotifyError, NotifyKind, NotifyRefusal,
};
pub use notify_router::{NotifyRouter, RouteError, Routed, SharedAcceptor};
pub use outcome::{
    call_outcomes, calls_of, predicted_receipts, target_outcomes, CallRecord, TargetOutcome, TransferMode,
};
pub use prepared::{LeaseRotation, PreparedInfo, PreparedTransfer, StepArgs, StepNotify};
pub use prepared_stored::{PreparedRestore, StepRequest, StoredPrepareArgs, StoredStepArgs};
pub use scope::{RegistrationScope, ScopeExit};
pub use step_handle::{StepCallback, StepHandle, StepResult};
