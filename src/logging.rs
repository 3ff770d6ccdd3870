//! The library's log records for a host that installs its receiver at run time (the
//! C ABI's `mws_set_log_callback`, and through it the Python and C++ bindings): the
//! library logs through the `log` facade (plan sizes, retries, quarantines,
//! recoveries, slow calls); [`set_log_sink`] installs this module's `log` backend
//! once and hands every record at or above the sink's level to the sink.
//!
//! A Rust host with its own `log` backend needs none of this: the records go to it.

use crate::error::{Error, ErrorKind, Result};
use parking_lot::RwLock;

/// Receives one record: its level, its target (the library module, e.g.
/// `mooncake_weight_store::protocol::commit`) and its formatted message. Called from
/// any thread that runs library code, possibly concurrently.
pub type LogSink = Box<dyn Fn(log::Level, &str, &str) + Send + Sync>;

struct Installed {
    sink: LogSink,
    level: log::LevelFilter,
}

static SINK: RwLock<Option<Installed>> = RwLock::new(None);

struct Forward;

static LOGGER: Forward = Forward;

impl log::Log for Forward {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        SINK.read().as_ref().is_some_and(|s| metadata.level() <= s.level)
    }

    fn log(&self, record: &log::Record<'_>) {
        // Held for the call: once `set_log_sink` returns, the old sink is never running.
        let guard = SINK.read();
        let Some(s) = guard.as_ref() else { return };
        if record.level() <= s.level {
            (s.sink)(record.level(), record.target(), &record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Installs `sink` for the records of level `level` or more severe, replacing the
/// previous one; `None` (or [`log::LevelFilter::Off`]) removes it. Once this returns,
/// the previous sink is not running and is never called again. Thread-safe; a sink
/// must not call this function (it would deadlock).
///
/// Errors: [`ErrorKind::Unsupported`] `another logger is installed in this process
/// (the library's records go to it)` when a `log` backend other than this module's
/// was installed before the first call.
pub fn set_log_sink(level: log::LevelFilter, sink: Option<LogSink>) -> Result<()> {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    let mut ours = false;
    INSTALL.call_once(|| ours = log::set_logger(&LOGGER).is_ok());
    if !ours && !std::ptr::eq(log::logger() as *const dyn log::Log as *const (), &LOGGER as *const Forward as *const ())
    {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "another logger is installed in this process (the library's records go to it)",
        ));
    }
    let installed = sink.filter(|_| level != log::LevelFilter::Off).map(|sink| Installed { sink, level });
    let max = installed.as_ref().map_or(log::LevelFilter::Off, |s| s.level);
    *SINK.write() = installed;
    log::set_max_level(max);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn records_reach_the_sink_at_its_level_until_it_is_removed() {
        let seen: Arc<Mutex<Vec<(log::Level, String)>>> = Arc::default();
        let s = seen.clone();
        let sink: LogSink = Box::new(move |level, target, message| {
            if target == "mws-logging-test" {
                s.lock().unwrap().push((level, message.to_string()));
            }
        });
        set_log_sink(log::LevelFilter::Info, Some(sink)).unwrap();
        log::info!(target: "mws-logging-test", "kept {}", 1);
        log::debug!(target: "mws-logging-test", "filtered");
        set_log_sink(log::LevelFilter::Off, None).unwrap();
        log::warn!(target: "mws-logging-test", "after removal");
        assert_eq!(*seen.lock().unwrap(), vec![(log::Level::Info, "kept 1".to_string())]);
    }
}
