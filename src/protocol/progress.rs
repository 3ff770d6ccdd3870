//! Progress reports of long calls (uploads, restores, live transfers, offline
//! verification): bytes and items done of a total known up front, throttled so a
//! caller's callback runs at most every [`PROGRESS_INTERVAL`] (plus once at the
//! start and once at the end).
//!
//! A report is only ever a snapshot of work that has *completed* (the bytes are in
//! the store, or in the target buffers); `bytes_done == bytes_total` means the
//! data phase is over, not that the call succeeded: the call's result says that.

use std::time::{Duration, Instant};

/// The smallest time between two reports of one call (the first and the last report
/// are never held back).
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// What kind of work a [`Progress`] report describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgressPhase {
    /// Payload writes of one participant into a store (`WeightStore::upload`, the
    /// snapshot writer). Items: objects.
    Upload,
    /// A restore from a store into target buffers (`WeightStore::load`). Items:
    /// transfer regions.
    Restore,
    /// A live transfer between instances (sink or reader). Items: engine operations.
    Transfer,
    /// Offline verification of stored payloads (`mws verify`). Items: objects.
    Verify,
}

impl ProgressPhase {
    /// The phase's stable name (`"upload"`, `"restore"`, `"transfer"`, `"verify"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProgressPhase::Upload => "upload",
            ProgressPhase::Restore => "restore",
            ProgressPhase::Transfer => "transfer",
            ProgressPhase::Verify => "verify",
        }
    }
}

/// One progress report: how much of the call's work has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// What the call is doing.
    pub phase: ProgressPhase,
    /// Payload bytes completed so far (never more than `bytes_total`).
    pub bytes_done: u64,
    /// Payload bytes the call moves in all.
    pub bytes_total: u64,
    /// Items (see [`ProgressPhase`]) completed so far.
    pub items_done: u64,
    /// Items the call handles in all.
    pub items_total: u64,
}

/// A caller's progress callback. It runs on the calling thread, inside the call, so
/// it must be quick and must not call back into the same store or executor.
pub type ProgressFn<'a> = &'a (dyn Fn(&Progress) + Sync);

/// Where a [`Reporter`] sends its reports: a callback borrowed for one call, or one
/// it shares (a step that outlives its starting call).
enum Sink<'a> {
    Borrowed(ProgressFn<'a>),
    Shared(std::sync::Arc<dyn Fn(&Progress) + Send + Sync>),
}

/// Throttles the reports of one call into an optional callback.
pub(crate) struct Reporter<'a> {
    sink: Option<Sink<'a>>,
    now: Progress,
    last: Option<Instant>,
    finished: bool,
}

impl<'a> Reporter<'a> {
    /// A reporter for a call with the given totals; reports 0 of the totals at once.
    pub(crate) fn start(
        sink: Option<ProgressFn<'a>>,
        phase: ProgressPhase,
        bytes_total: u64,
        items_total: u64,
    ) -> Self {
        Self::with_sink(sink.map(Sink::Borrowed), phase, bytes_total, items_total)
    }

    /// As [`Reporter::start`], sharing the callback (the reporter may outlive the
    /// call that made it).
    pub(crate) fn shared(
        sink: Option<std::sync::Arc<dyn Fn(&Progress) + Send + Sync>>,
        phase: ProgressPhase,
        bytes_total: u64,
        items_total: u64,
    ) -> Reporter<'static> {
        Reporter::with_sink(sink.map(Sink::Shared), phase, bytes_total, items_total)
    }

    fn with_sink(sink: Option<Sink<'a>>, phase: ProgressPhase, bytes_total: u64, items_total: u64) -> Self {
        let mut r = Reporter {
            sink,
            now: Progress { phase, bytes_done: 0, bytes_total, items_done: 0, items_total },
            last: None,
            finished: false,
        };
        r.emit();
        r.last = None; // the first completed step is reported at once
        r
    }

    /// Records `bytes` and `items` more completed work; reports on the first step,
    /// when the last report is at least [`PROGRESS_INTERVAL`] old, and always when
    /// the totals are reached.
    pub(crate) fn advance(&mut self, bytes: u64, items: u64) {
        if self.sink.is_none() {
            return;
        }
        let n = &mut self.now;
        n.bytes_done = n.bytes_done.saturating_add(bytes).min(n.bytes_total);
        n.items_done = n.items_done.saturating_add(items).min(n.items_total);
        let complete = n.bytes_done == n.bytes_total && n.items_done == n.items_total;
        if complete {
            self.finish();
        } else if self.last.is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL) {
            self.emit();
        }
    }

    /// As [`Reporter::advance`], with the work done so far given as totals (never
    /// moves backwards).
    pub(crate) fn advance_to(&mut self, bytes_done: u64, items_done: u64) {
        let (b, i) = (self.now.bytes_done, self.now.items_done);
        self.advance(bytes_done.saturating_sub(b), items_done.saturating_sub(i));
    }

    /// Reports the totals as reached (once; later calls do nothing). Called when the
    /// data phase completed.
    pub(crate) fn finish(&mut self) {
        if self.finished || self.sink.is_none() {
            return;
        }
        self.now.bytes_done = self.now.bytes_total;
        self.now.items_done = self.now.items_total;
        self.finished = true;
        self.emit();
    }

    fn emit(&mut self) {
        match &self.sink {
            Some(Sink::Borrowed(f)) => f(&self.now),
            Some(Sink::Shared(f)) => f(&self.now),
            None => return,
        }
        self.last = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[test]
    fn reports_start_and_end_and_throttles_between() {
        let seen = Mutex::new(Vec::new());
        let f = |p: &Progress| seen.lock().push(*p);
        let mut r = Reporter::start(Some(&f), ProgressPhase::Restore, 1000, 10);
        for _ in 0..9 {
            r.advance(100, 1);
        }
        r.advance(100, 1);
        r.finish();
        let seen = seen.into_inner();
        // Start, the first step, at most what the clock allowed, exactly one final.
        assert_eq!(seen[0].bytes_done, 0);
        assert_eq!(seen[0].items_total, 10);
        assert_eq!((seen[1].bytes_done, seen[1].items_done), (100, 1));
        let last = seen.last().unwrap();
        assert_eq!((last.bytes_done, last.items_done), (1000, 10));
        assert_eq!(seen.iter().filter(|p| p.bytes_done == 1000).count(), 1);
        assert!(seen.len() <= 4, "throttled: {seen:?}");
        assert!(seen.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done));
    }

    #[test]
    fn reports_again_after_the_interval_and_clamps_to_totals() {
        let seen = Mutex::new(Vec::new());
        let f = |p: &Progress| seen.lock().push(*p);
        let mut r = Reporter::start(Some(&f), ProgressPhase::Upload, 10, 3);
        r.advance(1, 1); // the first step: at once
        r.advance(1, 0); // held back
        std::thread::sleep(PROGRESS_INTERVAL + Duration::from_millis(5));
        r.advance(2, 1); // the interval passed
        r.advance(100, 5); // more than the totals: clamped, then final
        r.advance(1, 1); // after the end: nothing
        let seen = seen.into_inner();
        let done: Vec<(u64, u64)> = seen.iter().map(|p| (p.bytes_done, p.items_done)).collect();
        assert_eq!(done, vec![(0, 0), (1, 1), (4, 2), (10, 3)]);
    }

    #[test]
    fn no_callback_costs_nothing_and_never_panics() {
        let mut r = Reporter::start(None, ProgressPhase::Transfer, 0, 0);
        r.advance(5, 5);
        r.finish();
        assert_eq!(r.now.bytes_done, 0);
    }
}
