//! The C log callback (`mws_set_log_callback`) as a [`log::Log`] backend: the library
//! logs through the `log` facade (plan sizes, retries, quarantines, recoveries, slow
//! calls); when a caller installs a callback, records at or above its level are
//! formatted and handed to it.

use parking_lot::RwLock;
use std::ffi::{c_char, c_void, CString};

/// A C log callback: `level` is an `MWS_LOG_*` value (1 error .. 5 trace), `target`
/// the library module (`mooncake_weight_store::protocol::commit`), `message` the
/// formatted record; both NUL-terminated, valid only for the call. Called from any
/// library thread, possibly concurrently; must not unwind and must not call back
/// into the library (in particular not `mws_set_log_callback`).
pub type mws_log_fn = unsafe extern "C" fn(ctx: *mut c_void, level: i32, target: *const c_char, message: *const c_char);

#[derive(Clone, Copy)]
struct Sink {
    f: mws_log_fn,
    ctx: super::Ctx,
    level: log::LevelFilter,
}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

struct CLogger;

static LOGGER: CLogger = CLogger;

impl log::Log for CLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        SINK.read().is_some_and(|s| metadata.level() <= s.level)
    }

    fn log(&self, record: &log::Record<'_>) {
        // Held for the call: once `set` returns, the old callback is never running.
        let guard = SINK.read();
        let Some(s) = guard.as_ref() else { return };
        if record.level() > s.level {
            return;
        }
        let clean = |t: String| CString::new(t.replace('\0', "\u{FFFD}")).unwrap_or_default();
        let message = clean(record.args().to_string());
        let target = clean(record.target().to_string());
        // SAFETY: the caller installed `f` with `ctx` under the contract of
        // `mws_set_log_callback`; both strings live for the call.
        unsafe { (s.f)(s.ctx.0, level_code(record.level()), target.as_ptr(), message.as_ptr()) };
    }

    fn flush(&self) {}
}

fn level_code(l: log::Level) -> i32 {
    match l {
        log::Level::Error => 1,
        log::Level::Warn => 2,
        log::Level::Info => 3,
        log::Level::Debug => 4,
        log::Level::Trace => 5,
    }
}

/// `MWS_LOG_*` code to a filter (`0` off .. `5` trace); `None` when out of range.
pub(crate) fn level_filter(code: i32) -> Option<log::LevelFilter> {
    Some(match code {
        0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Error,
        2 => log::LevelFilter::Warn,
        3 => log::LevelFilter::Info,
        4 => log::LevelFilter::Debug,
        5 => log::LevelFilter::Trace,
        _ => return None,
    })
}

/// Installs (or with `f == None` / `level == Off` removes) the callback. Fails when
/// another `log` backend was installed in this process before the first call (a
/// Rust host with its own logger: the library's records already go there).
pub(crate) fn set(level: log::LevelFilter, f: Option<mws_log_fn>, ctx: *mut c_void) -> Result<(), String> {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    let mut ours = false;
    INSTALL.call_once(|| ours = log::set_logger(&LOGGER).is_ok());
    if !ours && !std::ptr::eq(log::logger() as *const dyn log::Log as *const (), &LOGGER as *const CLogger as *const ())
    {
        return Err("another logger is installed in this process (the library's records go to it)".into());
    }
    let sink = f.filter(|_| level != log::LevelFilter::Off).map(|f| Sink { f, ctx: super::Ctx(ctx), level });
    *SINK.write() = sink;
    log::set_max_level(sink.map_or(log::LevelFilter::Off, |s| s.level));
    Ok(())
}
