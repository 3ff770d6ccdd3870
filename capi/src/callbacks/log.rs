//! The C log callback (`mws_set_log_callback`) as the core's log sink
//! (`mws::logging`): the library logs through the `log` facade (plan sizes, retries,
//! quarantines, recoveries, slow calls); when a caller installs a callback, records
//! at or above its level are formatted and handed to it.

use mws::logging::LogSink;
use std::ffi::{c_char, c_void, CString};

/// A C log callback: `level` is an `MWS_LOG_*` value (1 error .. 5 trace), `target`
/// the library module (`mooncake_weight_store::protocol::commit`), `message` the
/// formatted record; both NUL-terminated, valid only for the call. Called from any
/// library thread, possibly concurrently; must not unwind and must not call back
/// into the library (in particular not `mws_set_log_callback`).
pub type mws_log_fn = unsafe extern "C" fn(ctx: *mut c_void, level: i32, target: *const c_char, message: *const c_char);

/// The C callback `f` with its `ctx` as the core's log sink: each record's target and
/// message become NUL-terminated strings (an interior NUL becomes U+FFFD) valid for
/// the call.
///
/// # Safety
/// `f` honours the contract of [`mws_log_fn`] with `ctx` while the sink is installed.
pub(crate) unsafe fn sink(f: mws_log_fn, ctx: *mut c_void) -> LogSink {
    let ctx = super::Ctx(ctx);
    Box::new(move |level, target, message| {
        let ctx = ctx;
        let clean = |t: &str| CString::new(t.replace('\0', "\u{FFFD}")).unwrap_or_default();
        let (target, message) = (clean(target), clean(message));
        // `log::Level` numbers its levels as the `MWS_LOG_*` codes (error 1 .. trace 5).
        // SAFETY: this function's contract; both strings live for the call.
        unsafe { f(ctx.0, level as i32, target.as_ptr(), message.as_ptr()) };
    })
}

/// `MWS_LOG_*` code to a filter (`0` off .. `5` trace, the order of
/// `log::LevelFilter::iter`); `None` when out of range.
pub(crate) fn level_filter(code: i32) -> Option<log::LevelFilter> {
    usize::try_from(code).ok().and_then(|i| log::LevelFilter::iter().nth(i))
}
