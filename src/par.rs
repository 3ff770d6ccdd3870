//! Data parallelism for the pure stages (planning, validation): one index range cut
//! into contiguous chunks, each on a scoped thread, results in index order and the
//! first error in index order, so the outcome never depends on the thread count.
//!
//! Small inputs run on the calling thread: below [`MIN_ITEMS_PER_WORKER`] items per
//! worker a thread costs more than it saves. A thread that cannot be started runs
//! its chunk on the calling thread instead.

use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Fewest items worth a thread of their own.
pub(crate) const MIN_ITEMS_PER_WORKER: usize = 1 << 15;

/// Most threads one call uses.
const MAX_WORKERS: usize = 8;

/// How many threads (the calling one included) a stage of `items` items uses: 1
/// below `2 * MIN_ITEMS_PER_WORKER`, at most the machine's parallelism.
pub(crate) fn workers(items: usize) -> usize {
    #[cfg(test)]
    if let Some(n) = TEST_WORKERS.with(|w| w.get()) {
        return n;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (items / MIN_ITEMS_PER_WORKER).clamp(1, cores.clamp(1, MAX_WORKERS))
}

#[cfg(test)]
thread_local! {
    /// Unit tests: every stage started on this thread uses this many workers
    /// whatever its size, so small inputs exercise the parallel paths.
    static TEST_WORKERS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Unit tests: runs `f` with every stage it starts on this thread using `n`
/// workers (`None`: sized as in production).
#[cfg(test)]
pub(crate) fn with_workers<T>(n: Option<usize>, f: impl FnOnce() -> T) -> T {
    let before = TEST_WORKERS.with(|w| w.replace(n));
    let out = f();
    TEST_WORKERS.with(|w| w.set(before));
    out
}

/// Runs `a` and `b`, `b` on a second thread when `parallel` (and one can be
/// started), and returns both results. A panic in either is resumed here.
pub(crate) fn join<A: Send, B: Send>(
    parallel: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !parallel {
        return (a(), b());
    }
    // `spawn_scoped` consumes its closure even when it fails: `b` waits in a cell
    // that the fallback takes it back from.
    let cell = Mutex::new(Some(b));
    std::thread::scope(|sc| {
        let cell = &cell;
        let spawned = std::thread::Builder::new().name("mws-plan".into()).spawn_scoped(sc, move || take(cell)());
        let ra = a();
        let rb = match spawned {
            Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            Err(_) => take(cell)(),
        };
        (ra, rb)
    })
}

/// Takes the value out of a cell that holds it (each cell is taken once).
fn take<T>(cell: &Mutex<Option<T>>) -> T {
    cell.lock().unwrap_or_else(|p| p.into_inner()).take().expect("a cell is taken once")
}

/// The slots of one chunk and how many of them hold a value; dropping it drops
/// those values (an incomplete or abandoned chunk).
struct Filled<'a, T> {
    slots: &'a mut [MaybeUninit<T>],
    len: usize,
}

impl<T> Drop for Filled<'_, T> {
    fn drop(&mut self) {
        for s in &mut self.slots[..self.len] {
            // SAFETY: the first `len` slots were written (see `fill`) and are
            // dropped only here, once.
            unsafe { s.assume_init_drop() };
        }
    }
}

/// Writes `f(start + k)` into `slots[k]` in order; stops at the first error.
fn fill<'a, T, E>(
    mut filled: Filled<'a, T>,
    start: usize,
    f: &impl Fn(usize) -> Result<T, E>,
) -> (Filled<'a, T>, Option<E>) {
    while filled.len < filled.slots.len() {
        match f(start + filled.len) {
            Ok(v) => {
                filled.slots[filled.len].write(v);
                filled.len += 1;
            }
            Err(e) => return (filled, Some(e)),
        }
    }
    (filled, None)
}

/// `(0..n).map(f).collect()`, on up to `workers` threads: each takes a contiguous
/// chunk and writes its results in place (no copy afterwards). Returns the error of
/// the lowest failing index among the chunks that failed (each chunk stops at its
/// first), dropping every value already built; a panic in `f` is resumed here
/// (values built by other chunks then leak, which is safe).
pub(crate) fn try_map<T: Send, E: Send>(
    n: usize,
    workers: usize,
    f: impl Fn(usize) -> Result<T, E> + Sync,
) -> Result<Vec<T>, E> {
    if workers <= 1 || n < 2 {
        return (0..n).map(f).collect();
    }
    let mut out: Vec<T> = Vec::with_capacity(n);
    let chunk = n.div_ceil(workers);
    // One cell per chunk of `out`'s spare capacity (see `join` for why cells).
    let cells: Vec<Mutex<Option<&mut [MaybeUninit<T>]>>> =
        out.spare_capacity_mut()[..n].chunks_mut(chunk).map(|c| Mutex::new(Some(c))).collect();
    let outcome: Vec<(Filled<'_, T>, Option<E>)> = std::thread::scope(|sc| {
        let f = &f;
        let run = move |k: usize, slots| fill(Filled { slots, len: 0 }, k * chunk, f);
        let spawned: Vec<_> = (1..cells.len())
            .map(|k| {
                let cell = &cells[k];
                std::thread::Builder::new().name("mws-plan".into()).spawn_scoped(sc, move || run(k, take(cell)))
            })
            .collect();
        let mut outcome = vec![run(0, take(&cells[0]))];
        for (k, h) in (1..).zip(spawned) {
            outcome.push(match h {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => run(k, take(&cells[k])),
            });
        }
        outcome
    });
    drop(cells);
    if outcome.iter().all(|(_, err)| err.is_none()) {
        // The values now belong to `out`.
        outcome.into_iter().for_each(|(filled, _)| std::mem::forget(filled));
        // SAFETY: the chunks partition slots 0..n of `out`'s capacity, and every
        // chunk completed, so each of those slots holds a value.
        unsafe { out.set_len(n) };
        return Ok(out);
    }
    // Dropping the chunks drops the values they hold; `out` stays empty.
    let first_error = outcome.into_iter().find_map(|(_, err)| err);
    Err(first_error.expect("some chunk failed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts live values, so a test can see that nothing built is leaked or
    /// dropped twice.
    struct Counted<'a>(usize, &'a AtomicUsize);
    impl<'a> Counted<'a> {
        fn new(v: usize, live: &'a AtomicUsize) -> Self {
            live.fetch_add(1, Ordering::Relaxed);
            Counted(v, live)
        }
    }
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn try_map_keeps_index_order_at_any_worker_count() {
        for workers in [1, 2, 3, 8, 64] {
            for n in [0, 1, 2, 7, 100, 1000] {
                let out: Vec<usize> = try_map(n, workers, |i| Ok::<_, ()>(i * 3)).unwrap();
                assert_eq!(out, (0..n).map(|i| i * 3).collect::<Vec<_>>(), "n={n} workers={workers}");
            }
        }
    }

    #[test]
    fn try_map_returns_the_lowest_failing_index_and_drops_what_it_built() {
        let live = AtomicUsize::new(0);
        for workers in [1, 2, 4, 7] {
            // Failures in several chunks: the lowest index wins, as in a sequential pass.
            let r = try_map(100, workers, |i| if i == 30 || i == 90 { Err(i) } else { Ok(Counted::new(i, &live)) });
            assert_eq!(r.err(), Some(30), "workers={workers}");
            assert_eq!(live.load(Ordering::Relaxed), 0, "every value built before the errors was dropped");
            let ok = try_map(100, workers, |i| Ok::<_, ()>(Counted::new(i, &live))).unwrap();
            assert_eq!(ok.iter().map(|c| c.0).collect::<Vec<_>>(), (0..100).collect::<Vec<_>>());
            assert_eq!(live.load(Ordering::Relaxed), 100);
            drop(ok);
            assert_eq!(live.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| try_map(100, 4, |i| if i == 80 { panic!("boom") } else { Ok::<_, ()>(i) }));
        assert!(r.is_err());
    }

    #[test]
    fn join_runs_both_sides_either_way() {
        for parallel in [false, true] {
            let (a, b) = join(parallel, || 1 + 1, || "two".len());
            assert_eq!((a, b), (2, 3));
        }
        let r = std::panic::catch_unwind(|| join(true, || 1, || -> usize { panic!("boom") }));
        assert!(r.is_err());
    }

    #[test]
    fn small_inputs_stay_on_the_calling_thread() {
        assert_eq!(workers(0), 1);
        assert_eq!(workers(2 * MIN_ITEMS_PER_WORKER - 1), 1);
        assert!(workers(usize::MAX) <= MAX_WORKERS);
        assert_eq!(with_workers(Some(5), || workers(1)), 5);
        assert_eq!(workers(1), 1);
    }
}
