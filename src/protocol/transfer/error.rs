//! The error of the live-transfer executors (`live-transfer.md` §12.1): a class
//! (contract, engine, completion failed, completion unknown, registration cleanup
//! pending, interrupted), the message, and what a caller needs to recover: the
//! pending transfer id, the engine identity, whether the engine must be restarted,
//! and whether any batch was submitted (the §12.2 step 5 proof: `submitted == false`
//! means the call wrote nothing).

use crate::error::{Error, ErrorKind};

/// The class of a [`TransferError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferErrorKind {
    /// Invalid inputs, limits, guard acquisition (`ValueError`): retrying the same
    /// inputs cannot succeed.
    Contract,
    /// Runtime checks (stale snapshots, leases, registration, reservation, pending
    /// table misuse) (`TransferEngineError`): rebind, re-register, drain and retry.
    Engine,
    /// A batch reached a terminal failure (`TransferCompletionFailedError`): memory
    /// is no longer touched, pins were released `failed_drained`.
    CompletionFailed,
    /// DMA may still touch memory (`TransferCompletionUnknownError`): nothing was
    /// released; drain `pending_transfer_id` or restart the engine.
    CompletionUnknown,
    /// Our own unregistration failed (`TransferRegistrationCleanupPendingError`):
    /// pins are held until a successful drain of `pending_transfer_id`.
    RegistrationCleanupPending,
    /// The engine call or an inline drain was interrupted while completion was
    /// unknown (`TransferCompletionInterrupted`); like `CompletionUnknown`.
    Interrupted,
}

/// An error of a live-transfer execution or of the pending-transfer table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferError {
    /// The class.
    pub kind: TransferErrorKind,
    /// The library error kind a C caller sees (`InvalidArgument`, `LimitExceeded`,
    /// `StaleBinding`, `InvalidBinding`, `Store`, ...).
    pub error_kind: ErrorKind,
    /// The message (never an address).
    pub message: String,
    /// The pending entry that now holds the call's resources.
    pub pending_transfer_id: Option<String>,
    /// The engine identity of that entry.
    pub engine_identity: Option<u64>,
    /// True when the entry can never be drained (restart the engine).
    pub restart_required: bool,
    /// True once any batch of the call was handed to the engine.
    pub submitted: bool,
    /// The interruption or original error that caused this one, if any.
    pub cause: Option<String>,
}

impl TransferError {
    /// A new error of `kind` (the error kind defaults to the class: contract ->
    /// `InvalidArgument`, others -> `Store`).
    pub fn new(kind: TransferErrorKind, message: impl Into<String>) -> Self {
        let error_kind =
            if kind == TransferErrorKind::Contract { ErrorKind::InvalidArgument } else { ErrorKind::Store };
        TransferError {
            kind,
            error_kind,
            message: message.into(),
            pending_transfer_id: None,
            engine_identity: None,
            restart_required: false,
            submitted: false,
            cause: None,
        }
    }
    /// A `TransferEngineError`.
    pub fn engine(message: impl Into<String>) -> Self {
        Self::new(TransferErrorKind::Engine, message)
    }
    /// A `TransferEngineError` for a runtime-evidence mismatch (`StaleBinding`).
    pub fn stale(message: impl Into<String>) -> Self {
        Self::engine(message).with_error_kind(ErrorKind::StaleBinding)
    }
    /// A contract error carrying `e`'s kind and message.
    pub fn contract(e: Error) -> Self {
        let mut t = Self::new(TransferErrorKind::Contract, e.message());
        t.error_kind = e.kind();
        t
    }
    /// An engine error carrying `e`'s message (the TE layer wrapping a contract error
    /// "with the same text").
    pub fn engine_from(e: Error) -> Self {
        let kind = match e.kind() {
            ErrorKind::InvalidArgument => ErrorKind::StaleBinding,
            k => k,
        };
        Self::engine(e.message()).with_error_kind(kind)
    }
    /// Replaces the library error kind.
    pub fn with_error_kind(mut self, kind: ErrorKind) -> Self {
        self.error_kind = kind;
        self
    }
    /// Attaches a cause.
    pub fn with_cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }
    /// True when completion is unknown or was interrupted (resources are retained).
    pub fn is_completion_unknown(&self) -> bool {
        matches!(self.kind, TransferErrorKind::CompletionUnknown | TransferErrorKind::Interrupted)
    }

    /// The error a caller that only sees an [`Error`] (the C ABI, its bindings) is
    /// given: the library error kind and the message, with ` (pending transfer <id>)`
    /// appended when the call left a pending transfer that the message does not name
    /// (the caller drains it by that id). `From<TransferError> for Error` keeps the
    /// message as it is.
    pub fn into_reported(self) -> Error {
        match &self.pending_transfer_id {
            Some(id) if !self.message.contains(id.as_str()) => {
                Error::new(self.error_kind, format!("{} (pending transfer {id})", self.message))
            }
            _ => Error::new(self.error_kind, self.message),
        }
    }
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TransferError {}

impl From<TransferError> for Error {
    fn from(e: TransferError) -> Error {
        Error::new(e.error_kind, e.message)
    }
}

/// Result of the live-transfer executors.
pub type TransferResult<T> = std::result::Result<T, TransferError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_error_names_the_pending_transfer_once() {
        let mut e = TransferError::new(TransferErrorKind::CompletionUnknown, "batch completion unknown");
        assert_eq!(e.clone().into_reported().message(), "batch completion unknown");
        e.pending_transfer_id = Some("pt-7".into());
        let r = e.clone().into_reported();
        assert_eq!((r.kind(), r.message()), (ErrorKind::Store, "batch completion unknown (pending transfer pt-7)"));
        e.message = "drain pt-7 first".into();
        assert_eq!(e.clone().into_reported().message(), "drain pt-7 first");
        let c = TransferError::contract(Error::new(ErrorKind::LimitExceeded, "too many segments"));
        assert_eq!(c.into_reported().kind(), ErrorKind::LimitExceeded);
    }
}
