//! Status codes, the thread-local last error, the panic boundary and the version.

use mws::protocol::transfer::TransferError;
use mws::{Error, ErrorKind};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Result of every fallible `mws_` function. `MWS_OK` (0) is success.
///
/// The values are stable: they are never renumbered or reused, and new ones are only
/// appended. They are coarse (what a caller can act on); the detail of a failure is in
/// `mws_last_error_message()`. `MWS_NULL_ARGUMENT`, `MWS_PANIC` and `MWS_INVALID_UTF8`
/// are raised by the C ABI itself; every other value corresponds 1:1 to an error kind
/// of the library.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum mws_status {
    /// Success.
    MWS_OK = 0,
    /// A required pointer argument was NULL.
    MWS_NULL_ARGUMENT = 1,
    /// An internal error (a Rust panic) was caught at the ABI boundary. The call had no
    /// effect on its out-parameters; the handles passed to it remain usable.
    MWS_PANIC = 2,
    /// A NUL-terminated string argument is not valid UTF-8.
    MWS_INVALID_UTF8 = 3,
    /// Invalid input: a value, JSON document, placement, option, index or length is
    /// not acceptable, or the inputs cannot be planned. Retrying cannot help.
    MWS_INVALID_ARGUMENT = 4,
    /// A runtime binding does not pair with its placement, or a binding set is
    /// incomplete or inconsistent.
    MWS_INVALID_BINDING = 5,
    /// A stored manifest or decision record read back from a store is invalid.
    MWS_INVALID_MANIFEST = 6,
    /// A key or object does not exist.
    MWS_NOT_FOUND = 7,
    /// A create-only write found the key already present.
    MWS_ALREADY_EXISTS = 8,
    /// A transaction lost a race, or a decision/manifest conflicts with the plan.
    MWS_CONFLICT = 9,
    /// Runtime evidence (lease, generation, address) no longer matches the plan.
    MWS_STALE_BINDING = 10,
    /// A planning or resource limit was exceeded.
    MWS_LIMIT_EXCEEDED = 11,
    /// A feature or memory kind is not supported by this backend or build.
    MWS_UNSUPPORTED = 12,
    /// The store backend failed; the operation may be retried.
    MWS_STORE = 13,
    /// Local I/O failed.
    MWS_IO = 14,
    /// Data read back does not match what was expected.
    MWS_INTEGRITY = 15,
}

/// Lists the `mws_status` variants once more, in numeric order, to derive their
/// static names and the table of all values (a test checks the list against the
/// header: every value, name and number).
macro_rules! status_names {
    ($($variant:ident),* $(,)?) => {
        impl mws_status {
            /// Every status value, in numeric order.
            pub const ALL: &'static [mws_status] = &[$(mws_status::$variant),*];

            /// The static, NUL-terminated name of a status value ("MWS_OK", ...).
            pub(crate) fn name(self) -> &'static CStr {
                let s: &'static str = match self { $(mws_status::$variant => concat!(stringify!($variant), "\0"),)* };
                CStr::from_bytes_with_nul(s.as_bytes()).expect("static status names are NUL-terminated")
            }
        }
    };
}

status_names!(
    MWS_OK,
    MWS_NULL_ARGUMENT,
    MWS_PANIC,
    MWS_INVALID_UTF8,
    MWS_INVALID_ARGUMENT,
    MWS_INVALID_BINDING,
    MWS_INVALID_MANIFEST,
    MWS_NOT_FOUND,
    MWS_ALREADY_EXISTS,
    MWS_CONFLICT,
    MWS_STALE_BINDING,
    MWS_LIMIT_EXCEEDED,
    MWS_UNSUPPORTED,
    MWS_STORE,
    MWS_IO,
    MWS_INTEGRITY,
);

impl mws_status {
    /// The status a library error kind maps to (1:1, by the kind's stable number).
    pub fn from_kind(kind: ErrorKind) -> mws_status {
        let code = kind.status_code();
        match mws_status::ALL.iter().find(|s| **s as i32 == code) {
            Some(s) => *s,
            // Unreachable while the test `error_kinds_map_one_to_one` passes.
            None => mws_status::MWS_PANIC,
        }
    }
}

/// A failure inside an entry point: the status to return and the message to record.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: mws_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: mws_status, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    /// `argument` was NULL.
    pub(crate) fn null(argument: &str) -> Self {
        Failure::new(mws_status::MWS_NULL_ARGUMENT, format!("argument `{argument}` is NULL"))
    }

    /// An invalid argument detected by the ABI layer (a length, an index, an enum value).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Failure::new(mws_status::MWS_INVALID_ARGUMENT, message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(mws_status::from_kind(e.kind()), e.message())
    }
}

impl From<TransferError> for Failure {
    /// A live-transfer failure as the core reports it to C: its kind, and the message
    /// naming the pending transfer when the call left one.
    fn from(e: TransferError) -> Self {
        e.into_reported().into()
    }
}

pub(crate) type FfiResult<T> = std::result::Result<T, Failure>;

thread_local! {
    /// The message of the last failed call on this thread, NUL-terminated.
    static LAST_ERROR: RefCell<Vec<u8>> = RefCell::new(vec![0]);
}

/// Records `message` (prefixed with the entry point's name) as this thread's last error.
pub(crate) fn set_last_error(function: &str, message: &str) {
    let mut bytes: Vec<u8> = Vec::with_capacity(function.len() + message.len() + 3);
    bytes.extend_from_slice(function.as_bytes());
    bytes.extend_from_slice(b": ");
    // An interior NUL would silently truncate the message for C; make it visible.
    bytes.extend(message.bytes().map(|b| if b == 0 { b'?' } else { b }));
    bytes.push(0);
    // `try_with`: during thread teardown the slot may be gone; losing the message then
    // is better than aborting.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = bytes;
        }
    });
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

/// The one panic boundary. Runs `body`, catches any panic, and records the message of
/// a failure as this thread's last error.
pub(crate) fn run<T>(function: &'static str, body: impl FnOnce() -> FfiResult<T>) -> Result<T, mws_status> {
    crate::calls::begin();
    let outcome = catch_unwind(AssertUnwindSafe(body));
    // The handles the call borrowed are released (a free deferred to it happens here).
    crate::calls::end();
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(failure)) => {
            set_last_error(function, &failure.message);
            Err(failure.status)
        }
        Err(payload) => {
            // Formatting the message must not unwind either.
            let message = catch_unwind(AssertUnwindSafe(|| panic_message(payload.as_ref())))
                .unwrap_or_else(|_| "panic while formatting a panic message".to_owned());
            set_last_error(function, &format!("internal error (panic): {message}"));
            // Dropping a payload could itself panic: contain that too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            Err(mws_status::MWS_PANIC)
        }
    }
}

/// The name of the enclosing function (the entry point), taken from the function
/// itself so that no entry point spells its own name.
macro_rules! function_name {
    () => {{
        fn f() {}
        let name = ::std::any::type_name_of_val(&f);
        // "mooncake_weight_store::ffi::store::mws_store_get::f" -> "mws_store_get"
        let name = name.strip_suffix("::f").unwrap_or(name);
        match name.rfind("::") {
            Some(i) => &name[i + 2..],
            None => name,
        }
    }};
}

/// Boundary for entry points that return `mws_status`.
pub(crate) fn status_call(function: &'static str, body: impl FnOnce() -> FfiResult<()>) -> mws_status {
    match run(function, body) {
        Ok(()) => mws_status::MWS_OK,
        Err(status) => status,
    }
}

/// Boundary for entry points that return a value (`fallback` on failure: NULL, 0).
pub(crate) fn value_call<T>(function: &'static str, fallback: T, body: impl FnOnce() -> FfiResult<T>) -> T {
    run(function, body).unwrap_or(fallback)
}

/// Returns the static name of a status value, such as `"MWS_INVALID_ARGUMENT"`.
///
/// `status` is an `int` so that any value is safe to pass: a value that is not an
/// `mws_status` gives `"MWS_UNKNOWN_STATUS"`. Never returns NULL. The returned string
/// is static: never free it.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn mws_status_name(status: c_int) -> *const c_char {
    // SAFETY: literal with exactly one, trailing NUL.
    let unknown: &'static CStr = c"MWS_UNKNOWN_STATUS";
    value_call(function_name!(), unknown.as_ptr(), || {
        let name = mws_status::ALL.iter().find(|s| **s as c_int == status).map_or(unknown, |s| s.name());
        Ok(name.as_ptr())
    })
}

/// Returns the message of the last failed `mws_` call on the calling thread, or `""` if
/// no call has failed on this thread yet. Never returns NULL.
///
/// The message starts with the name of the function that failed, names the offending
/// id, key or argument, and never contains a runtime address.
///
/// Ownership: the string is owned by the library (thread-local storage). It stays valid
/// until the next `mws_` call on the same thread; copy it if you need it longer. Never
/// free it.
///
/// Thread safety: each thread has its own last error.
#[no_mangle]
pub extern "C" fn mws_last_error_message() -> *const c_char {
    // SAFETY: literal with exactly one, trailing NUL.
    let empty: &'static CStr = c"";
    LAST_ERROR
        .try_with(|slot| match slot.try_borrow() {
            // The buffer lives in thread-local storage and is only replaced by a later
            // failing call on this thread, so the pointer stays valid until then.
            Ok(bytes) => bytes.as_ptr() as *const c_char,
            Err(_) => empty.as_ptr(),
        })
        .unwrap_or(empty.as_ptr())
}

/// Returns the library version as a static NUL-terminated string `"MAJOR.MINOR.PATCH"`.
/// It equals the header's `MWS_VERSION_MAJOR`, `MWS_VERSION_MINOR` and
/// `MWS_VERSION_PATCH` when header and library come from the same release.
///
/// Ownership: static; never free it. Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn mws_version() -> *const c_char {
    static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr() as *const c_char
}

/// Testing aid: panics inside the ABI boundary and returns `MWS_PANIC`, with a
/// last error message that contains "mws_test_panic". It proves that no panic crosses
/// the C ABI. Has no other effect.
///
/// Thread safety: may be called from any thread.
#[no_mangle]
pub extern "C" fn mws_test_panic() -> mws_status {
    status_call(function_name!(), || {
        panic!("mws_test_panic: deliberate panic for tests");
    })
}
