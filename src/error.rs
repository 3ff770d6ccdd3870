//! The one error type of the library.
//!
//! [`ErrorKind`] values are coarse and stable: the C ABI maps them 1:1 onto
//! `mws_status` codes, so a kind is never renumbered or removed. The message carries
//! the detail (the reference's message text where the spec quotes one) and names the
//! offending id or key, never a runtime address.

use std::fmt;

/// Defines [`ErrorKind`] from one table: variant, stable `mws_status` number (the C
/// ABI's `mws_status` enum carries the same numbers; a test checks them against the
/// generated header, and Python's `errors.py` is checked against the header too) and
/// short name.
macro_rules! error_kinds {
    ($( $(#[doc = $doc:literal])* $variant:ident = $code:literal, $name:literal; )*) => {
        /// Coarse, stable classification of an [`Error`].
        ///
        /// The reference distinguishes *contract errors* (invalid inputs; retrying cannot
        /// help) from *store errors* (raised by the store-facing services).
        /// [`ErrorKind::is_contract`] tells which family a kind belongs to.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorKind {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl ErrorKind {
            /// Every kind, in status-code order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$variant),*];

            /// A short stable name (`"invalid_argument"`, ...).
            pub fn name(self) -> &'static str {
                match self { $(ErrorKind::$variant => $name,)* }
            }

            /// The stable `mws_status` number of this kind in the C ABI.
            pub fn status_code(self) -> i32 {
                match self { $(ErrorKind::$variant => $code,)* }
            }
        }
    };
}

error_kinds! {
    /// Invalid input value, JSON document, placement or unplannable input
    /// (reference: `ValueError`). Contract error.
    InvalidArgument = 4, "invalid_argument";
    /// A runtime binding does not pair with its placement, or a binding set is
    /// incomplete (reference: `WeightStoreError` raised by binding pairing).
    InvalidBinding = 5, "invalid_binding";
    /// A stored manifest or decision record read back from a store is invalid.
    InvalidManifest = 6, "invalid_manifest";
    /// A key or object does not exist.
    NotFound = 7, "not_found";
    /// A create-only write found the key already present.
    AlreadyExists = 8, "already_exists";
    /// A transaction lost a race, or a decision/manifest conflicts with the plan.
    Conflict = 9, "conflict";
    /// Runtime evidence (lease, generation, address) no longer matches the plan.
    StaleBinding = 10, "stale_binding";
    /// A planning or resource limit (regions, segments, budget) was exceeded.
    LimitExceeded = 11, "limit_exceeded";
    /// A feature or memory kind is not supported by this backend or build.
    Unsupported = 12, "unsupported";
    /// The store backend failed; the operation may be retried.
    Store = 13, "store";
    /// Local I/O failed (directory store).
    Io = 14, "io";
    /// Data read back does not match what was expected (short read, size mismatch).
    Integrity = 15, "integrity";
}

impl ErrorKind {
    /// True for contract errors (reference `ValueError`): retrying the same call
    /// with the same inputs cannot succeed.
    pub fn is_contract(self) -> bool {
        matches!(self, ErrorKind::InvalidArgument | ErrorKind::LimitExceeded)
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
