//! Steps that do not block ([`PreparedTransfer::start_step`](super::PreparedTransfer::start_step)):
//! a [`StepHandle`] to poll, wait on with a timeout, or cancel, and an optional
//! completion callback.
//!
//! Every started step is advanced by the *step driver*: one library thread, started
//! at the first started step and shared by all of them. It takes each step through
//! its checks and pins, then submits its batches one after another and follows each
//! through the engine's own completion (the ticket's status: Mooncake's batch
//! status), never blocking on one step while another can move. While steps are in
//! flight it polls their tickets, yielding at first and then sleeping up to
//! [`MAX_IDLE_SLEEP`] between rounds in which nothing moved; with no step in flight
//! it sleeps until the next one starts. An engine without ticketed calls runs each
//! batch on a thread of its own (the engine needs one).

use super::loader::{LiveError, LiveReport};
use super::TransferError;
use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The outcome of a step: its report, or the error with the report.
pub type StepResult = std::result::Result<LiveReport, LiveError>;

/// A completion callback: runs once, on the step driver's thread, with the step's
/// outcome, after that outcome is published (a waiter may see it first). It must be
/// quick and must not wait for another started step (the driver waits for it).
pub type StepCallback = Box<dyn FnOnce(&StepResult) + Send>;

/// The longest the step driver sleeps between two polls of steps in flight.
pub const MAX_IDLE_SLEEP: Duration = Duration::from_micros(200);

/// How one advance of a started step went.
pub(super) enum Advance {
    /// Nothing moved (a batch is still running).
    Waiting,
    /// Something moved; advance again soon.
    Moved,
    /// The step ended.
    Done(StepResult),
}

/// A started step, as the driver advances it. `advance` never blocks on the
/// engine's completion; `cancelled` is the handle's cancellation.
pub(super) trait StepDriven: Send {
    fn advance(&mut self, cancelled: bool) -> Advance;
}

/// What a handle and the driver share.
struct Task {
    cancel: AtomicBool,
    out: Mutex<Out>,
    done: Condvar,
}

struct Out {
    result: Option<StepResult>,
    callback: Option<StepCallback>,
}

/// A step started by
/// [`PreparedTransfer::start_step`](super::PreparedTransfer::start_step).
///
/// Dropping the handle does not stop the step: it runs to its end on the driver
/// (use [`Self::cancel`] first to stop it before its next batch); the buffers it
/// moves must stay valid until it ended. Thread safety: `Send + Sync`; every
/// method may be called from any thread, the waits concurrently.
#[derive(Clone)]
pub struct StepHandle {
    task: Arc<Task>,
}

impl std::fmt::Debug for StepHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepHandle").field("finished", &self.is_finished()).finish_non_exhaustive()
    }
}

impl StepHandle {
    fn new(callback: Option<StepCallback>) -> StepHandle {
        StepHandle {
            task: Arc::new(Task {
                cancel: AtomicBool::new(false),
                out: Mutex::new(Out { result: None, callback }),
                done: Condvar::new(),
            }),
        }
    }

    /// A handle of a step that ended before it started (its callback runs now, on
    /// the calling thread).
    pub(super) fn finished(result: StepResult, callback: Option<StepCallback>) -> StepHandle {
        let h = StepHandle::new(callback);
        complete(&h.task, result);
        h
    }

    /// Hands `work` to the step driver.
    pub(super) fn start(work: Box<dyn StepDriven>, callback: Option<StepCallback>) -> StepHandle {
        let h = StepHandle::new(callback);
        driver().push(Job { task: h.task.clone(), work });
        h
    }

    /// True once the step ended (its outcome is ready).
    pub fn is_finished(&self) -> bool {
        self.task.out.lock().result.is_some()
    }

    /// The step's outcome once it ended (a clone), else `None`; never blocks.
    pub fn poll(&self) -> Option<StepResult> {
        self.task.out.lock().result.clone()
    }

    /// Waits until the step ended or `timeout` passed (`None`: no limit) and returns
    /// its outcome (a clone), or `None` when it is still running.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<StepResult> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut out = self.task.out.lock();
        while out.result.is_none() {
            match deadline {
                None => self.task.done.wait(&mut out),
                Some(d) => {
                    if self.task.done.wait_until(&mut out, d).timed_out() {
                        break;
                    }
                }
            }
        }
        out.result.clone()
    }

    /// Asks the step to stop: it submits no further batch (a running batch runs to
    /// its completion, which the step still follows) and ends with `transfer was
    /// cancelled before a batch was submitted` unless it already ended. Idempotent.
    pub fn cancel(&self) {
        self.task.cancel.store(true, Ordering::Release);
    }
}

/// Records a step's outcome, wakes its waiters and runs its callback.
fn complete(task: &Task, result: StepResult) {
    let callback = {
        let mut out = task.out.lock();
        out.result = Some(result.clone());
        out.callback.take()
    };
    task.done.notify_all();
    if let Some(cb) = callback {
        // A callback's panic must not stop the driver (nor cross into C).
        let _ = catch_unwind(AssertUnwindSafe(|| cb(&result)));
    }
}

struct Job {
    task: Arc<Task>,
    work: Box<dyn StepDriven>,
}

/// The step driver: the started steps not yet taken by its thread.
struct Driver {
    queue: Mutex<Vec<Job>>,
    wake: Condvar,
    /// Why the driver thread could not start (then every started step ends at once
    /// with that error).
    failed: OnceLock<String>,
}

fn driver() -> &'static Driver {
    static DRIVER: OnceLock<&'static Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let d: &'static Driver = Box::leak(Box::new(Driver {
            queue: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            failed: OnceLock::new(),
        }));
        if let Err(e) = std::thread::Builder::new().name("mws-step-driver".into()).spawn(move || d.run()) {
            let _ = d.failed.set(format!("cannot start the step driver thread: {e}"));
        }
        d
    })
}

impl Driver {
    fn push(&self, job: Job) {
        if let Some(why) = self.failed.get() {
            // Nothing of the step ran: it ends unchanged (its work is dropped).
            let error = TransferError::engine(why.clone());
            return complete(&job.task, Err(LiveError { error, report: Box::default() }));
        }
        self.queue.lock().push(job);
        self.wake.notify_one();
    }

    fn run(&self) {
        let mut jobs: Vec<Job> = Vec::new();
        let mut idle: u32 = 0;
        loop {
            {
                let mut q = self.queue.lock();
                while jobs.is_empty() && q.is_empty() {
                    self.wake.wait(&mut q);
                }
                jobs.append(&mut q);
            }
            let mut moved = false;
            jobs.retain_mut(|j| {
                let cancelled = j.task.cancel.load(Ordering::Acquire);
                let advanced = catch_unwind(AssertUnwindSafe(|| j.work.advance(cancelled)));
                match advanced {
                    Ok(Advance::Waiting) => true,
                    Ok(Advance::Moved) => {
                        moved = true;
                        true
                    }
                    Ok(Advance::Done(result)) => {
                        moved = true;
                        complete(&j.task, result);
                        false
                    }
                    Err(_) => {
                        let error = TransferError::engine("internal error: a started step panicked on the step driver");
                        complete(&j.task, Err(LiveError { error, report: Box::default() }));
                        false
                    }
                }
            });
            if moved || jobs.is_empty() {
                idle = 0;
            } else if idle < 32 {
                idle += 1;
                std::thread::yield_now();
            } else {
                idle = idle.saturating_add(1);
                let sleep = Duration::from_micros(u64::from(idle - 32) * 10).min(MAX_IDLE_SLEEP);
                let mut q = self.queue.lock();
                if q.is_empty() {
                    self.wake.wait_for(&mut q, sleep);
                }
            }
        }
    }
}
