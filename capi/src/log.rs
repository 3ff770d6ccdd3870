//! `mws_set_log_callback`: routes the library's log records (the `log` facade) to a
//! C, C++ or Python logger.

use crate::boundary::{mws_status, Failure};
use crate::callbacks::log::{level_filter, sink};
use mws::logging::set_log_sink;
use std::ffi::{c_char, c_void};

/// Log levels of `mws_set_log_callback` (a record is delivered when its level is at
/// most the installed one).
pub const MWS_LOG_OFF: i32 = 0;
/// Errors only.
pub const MWS_LOG_ERROR: i32 = 1;
/// Warnings (retries, quarantines, slow store calls) and errors.
pub const MWS_LOG_WARN: i32 = 2;
/// Informational records (plan sizes, commits, recoveries, gc).
pub const MWS_LOG_INFO: i32 = 3;
/// Debug records.
pub const MWS_LOG_DEBUG: i32 = 4;
/// Everything.
pub const MWS_LOG_TRACE: i32 = 5;

/// Installs `callback` to receive every library log record of level `level` or more
/// severe (`MWS_LOG_ERROR` 1 .. `MWS_LOG_TRACE` 5), with `ctx` passed back. A NULL
/// `callback` or `MWS_LOG_OFF` removes the current one. One callback per process: a
/// new call replaces the previous one; when this function returns, the previous
/// callback is no longer running and is never called again (so its `ctx` may be freed).
///
/// The callback (type `mws_log_fn`) receives `(ctx, level, target, message)`, strings NUL-terminated and
/// valid only for the call. It is called from any thread that runs library code,
/// possibly concurrently, so it must be thread-safe; it must not unwind and must not
/// call back into the library (`mws_set_log_callback` would deadlock).
///
/// Errors: `MWS_INVALID_ARGUMENT` (level outside 0..=5), `MWS_UNSUPPORTED` (the
/// process already has another Rust `log` backend). Thread-safe.
///
/// # Safety
/// `callback` is NULL or a function honouring the contract above for as long as it
/// stays installed; `ctx` is whatever it expects.
#[no_mangle]
pub unsafe extern "C" fn mws_set_log_callback(
    level: i32,
    callback: Option<unsafe extern "C" fn(ctx: *mut c_void, level: i32, target: *const c_char, message: *const c_char)>,
    ctx: *mut c_void,
) -> mws_status {
    status_call!(|c| {
        let filter = level_filter(level)
            .ok_or_else(|| Failure::invalid(format!("log level must be 0 (off) to 5 (trace), got {level}")))?;
        // SAFETY: this function's contract: the callback honours `mws_log_fn` with `ctx`
        // while it stays installed.
        Ok(set_log_sink(filter, callback.map(|f| unsafe { sink(f, ctx) }))?)
    })
}
