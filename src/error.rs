//! The one error type of the library.
//!
//! [`ErrorKind`] values are coarse and stable: the C ABI maps them 1:1 onto
//! `mws_status` codes, so a kind is never renumbered or removed. The message carries
//! the detail (the reference's message text where the spec quotes one) and names the
//! offending id or key, never a runtime address.

use std::fmt;

/// Coarse, stable classification of an [`Error`].
///
/// The reference distinguishes *contract errors* (invalid inputs; retrying cannot
/// help) from *store errors* (raised by the store-facing services).
/// [`ErrorKind::is_contract`] tells which family a kind belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Invalid input value, JSON document, placement or unplannable input
    /// (reference: `ValueError`). Contract error.
    InvalidArgument,
    /// A runtime binding does not pair with its placement, or a binding set is
    /// incomplete (reference: `WeightStoreError` raised by binding pairing).
    InvalidBinding,
    /// A stored manifest or decision record read back from a store is invalid.
    InvalidManifest,
    /// A key or object does not exist.
    NotFound,
    /// A create-only write found the key already present.
    AlreadyExists,
    /// A transaction lost a race, or a decision/manifest conflicts with the plan.
    Conflict,
    /// Runtime evidence (lease, generation, address) no longer matches the plan.
    StaleBinding,
    /// A planning or resource limit (regions, segments, budget) was exceeded.
    LimitExceeded,
    /// A feature or memory kind is not supported by this backend or build.
    Unsupported,
    /// The store backend failed; the operation may be retried.
    Store,
    /// Local I/O failed (directory store).
    Io,
    /// Data read back does not match what was expected (short read, size mismatch).
    Integrity,
}

impl ErrorKind {
    /// True for contract errors (reference `ValueError`): retrying the same call
    /// with the same inputs cannot succeed.
    pub fn is_contract(self) -> bool {
        matches!(self, ErrorKind::InvalidArgument | ErrorKind::LimitExceeded)
    }

    /// A short stable name (`"invalid_argument"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::InvalidBinding => "invalid_binding",
            ErrorKind::InvalidManifest => "invalid_manifest",
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::Conflict => "conflict",
            ErrorKind::StaleBinding => "stale_binding",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Store => "store",
            ErrorKind::Io => "io",
            ErrorKind::Integrity => "integrity",
        }
    }
}

/// The library's error: a stable [`ErrorKind`] plus a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// Creates an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }

    /// A contract error ([`ErrorKind::InvalidArgument`]).
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The error's message (never contains a runtime address).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Returns the same error with `prefix` prepended to the message.
    pub fn context(self, prefix: &str) -> Self {
        Error { kind: self.kind, message: format!("{prefix}{}", self.message) }
    }

    /// Returns the same message under another kind.
    pub fn with_kind(self, kind: ErrorKind) -> Self {
        Error { kind, ..self }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand: `Err(Error::invalid(msg))`.
pub(crate) fn invalid<T>(message: impl Into<String>) -> Result<T> {
    Err(Error::invalid(message))
}
