//! Calls in flight per handle: what makes a `*_free` wait for the calls that use
//! the handle instead of freeing memory under them.
//!
//! C owns every handle as a [`Slot`]: the value and the number of calls using it now.
//! Each entry point runs inside the boundary ([`begin`] .. [`end`]); every handle it
//! borrows through the `Caller` is counted ([`enter`]) until the entry point returns.
//! A `*_free` ([`free`]) then:
//! - from a thread with no call on the handle: waits until the calls of other threads
//!   that use it have returned, then drops it (a step running on one thread while
//!   another frees the prepared transfer finishes first, report included);
//! - from inside a call that uses the handle on the same thread (a callback of that
//!   call freeing it): cannot wait for itself, so the handle is dropped when that
//!   call returns.
//!
//! A call that *starts* after the free returned still uses freed memory: that is the
//! caller's contract (`# Safety` of every entry point), which no counter can check.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The box behind every C handle pointer: calls in flight, then the value.
#[repr(C)]
pub(crate) struct Slot<T> {
    /// Calls using the handle, plus [`FREE_ON_RELEASE`] once a free was deferred to
    /// the last of them.
    calls: AtomicUsize,
    pub(crate) value: T,
}

/// Set once a `*_free` ran inside a call using the handle: the last call to return
/// drops it.
const FREE_ON_RELEASE: usize = 1 << (usize::BITS - 1);

impl<T> Slot<T> {
    pub(crate) fn new(value: T) -> Slot<T> {
        Slot { calls: AtomicUsize::new(0), value }
    }
}

/// One handle borrowed by a call on this thread.
struct Borrow {
    slot: *const (),
    release: unsafe fn(*const ()),
}

#[derive(Default)]
struct Calls {
    /// Index into `borrows` where each call in progress on this thread (outermost
    /// first) began.
    marks: Vec<usize>,
    borrows: Vec<Borrow>,
}

thread_local! {
    static CALLS: RefCell<Calls> = RefCell::new(Calls::default());
}

/// Starts an entry point on this thread (the boundary calls it first).
pub(crate) fn begin() {
    let _ = CALLS.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            let n = c.borrows.len();
            c.marks.push(n);
        }
    });
}

/// Ends the entry point [`begin`] started: the handles it borrowed are released (a
/// handle whose free was deferred to this call is dropped here).
pub(crate) fn end() {
    let done: Vec<Borrow> = CALLS
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut c) => match c.marks.pop() {
                Some(mark) => c.borrows.split_off(mark),
                None => Vec::new(),
            },
            Err(_) => Vec::new(),
        })
        .unwrap_or_default();
    for b in done.into_iter().rev() {
        // A deferred free drops the handle here: a panic in its drop must neither
        // unwind into C nor skip the releases after it.
        let _ = std::panic::catch_unwind(|| {
            // SAFETY: `b` was recorded by `enter` for a live slot whose count it
            // raised; the slot cannot be dropped before this release (`free` waits
            // for it or defers to it).
            unsafe { (b.release)(b.slot) }
        });
    }
}

/// Counts the current call as a user of `slot` until it returns. Outside an entry
/// point (no [`begin`] on this thread) nothing is counted.
pub(crate) fn enter<T>(slot: &Slot<T>) {
    let _ = CALLS.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if !c.marks.is_empty() {
                slot.calls.fetch_add(1, Ordering::AcqRel);
                c.borrows.push(Borrow { slot: (slot as *const Slot<T>).cast(), release: release::<T> });
            }
        }
    });
}

/// Ends one call's use of a slot; drops the slot when a free was deferred to the last
/// call and this was it.
///
/// # Safety
/// `slot` is a `Slot<T>` made by [`into_raw`] whose count this call raised in
/// [`enter`] and has not released yet.
unsafe fn release<T>(slot: *const ()) {
    let slot = slot.cast::<Slot<T>>();
    // SAFETY: the contract: the slot is live while its count is raised.
    let before = unsafe { &*slot }.calls.fetch_sub(1, Ordering::AcqRel);
    if before == FREE_ON_RELEASE | 1 {
        // SAFETY: the free was deferred to the last call and no call uses the slot any
        // more: nothing else can reach it (the caller freed it), so it is dropped once.
        drop(unsafe { Box::from_raw(slot.cast_mut()) });
    }
}

/// Moves `value` into a new slot owned by C.
pub(crate) fn into_raw<T>(value: T) -> *mut Slot<T> {
    Box::into_raw(Box::new(Slot::new(value)))
}

/// Takes the value back out of a slot made by [`into_raw`] that C handed over to us
/// (a callback's out-parameter whose ownership passes to the library).
///
/// # Safety
/// `slot` came from [`into_raw`], its ownership passes to the caller, and no call uses
/// it or starts using it.
pub(crate) unsafe fn take<T>(slot: *mut Slot<T>) -> T {
    // SAFETY: the contract: made by `into_raw` and ours alone from now on.
    unsafe { Box::from_raw(slot) }.value
}

/// Frees a slot made by [`into_raw`]: at once when no call uses it; after the calls
/// of other threads using it returned; or, when a call on this thread uses it (a
/// callback freeing the handle of the call that runs it), when that call returns.
///
/// # Safety
/// `slot` came from [`into_raw`], is freed once, and no call starts using it after
/// this one returns.
pub(crate) unsafe fn free<T>(slot: *mut Slot<T>) {
    let (mine, outer) = CALLS
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut c) => {
                let mark = c.marks.last().copied().unwrap_or(c.borrows.len());
                let key: *const () = slot.cast_const().cast();
                // The free's own borrow of the handle (a free that reads the handle
                // first, such as a loader's) is released now.
                let mut mine = Vec::new();
                let mut k = mark;
                while k < c.borrows.len() {
                    if c.borrows[k].slot == key {
                        mine.push(c.borrows.remove(k));
                    } else {
                        k += 1;
                    }
                }
                let outer = c.borrows[..mark].iter().any(|b| b.slot == key);
                (mine, outer)
            }
            Err(_) => (Vec::new(), false),
        })
        .unwrap_or((Vec::new(), false));
    // SAFETY: the contract: `slot` is live until this free drops it.
    let calls = &unsafe { &*slot }.calls;
    for _ in mine {
        calls.fetch_sub(1, Ordering::AcqRel);
    }
    if outer {
        // A call on this thread still uses it: the last release drops it. Its count
        // is at least 1 (that call), so no release can have seen the flag at 1 yet.
        calls.fetch_or(FREE_ON_RELEASE, Ordering::AcqRel);
        return;
    }
    let mut pause = Duration::from_micros(20);
    while calls.load(Ordering::Acquire) != 0 {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    // SAFETY: the contract (made by `into_raw`, freed once) and no call uses it now.
    drop(unsafe { Box::from_raw(slot) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_free_waits_for_a_call_of_another_thread() {
        let dropped = Arc::new(AtomicBool::new(false));
        let slot = into_raw(Flag(dropped.clone()));
        let addr = slot as usize;
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let returned = Arc::new(AtomicBool::new(false));
        let r = returned.clone();
        let t = std::thread::spawn(move || {
            begin();
            // SAFETY: the slot is live: the main thread frees it only after `entered`.
            enter(unsafe { &*(addr as *const Slot<Flag>) });
            entered_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            r.store(true, Ordering::SeqCst);
            end();
        });
        entered_rx.recv().unwrap();
        // SAFETY: made by into_raw, freed once.
        unsafe { free(slot) };
        assert!(returned.load(Ordering::SeqCst), "the free returned before the call");
        assert!(dropped.load(Ordering::SeqCst));
        t.join().unwrap();
    }

    #[test]
    fn a_free_inside_a_call_using_the_handle_is_deferred_to_its_end() {
        let dropped = Arc::new(AtomicBool::new(false));
        let slot = into_raw(Flag(dropped.clone()));
        begin();
        // SAFETY: live until freed below.
        enter(unsafe { &*slot });
        // A callback's entry point frees the handle of the outer call.
        begin();
        // SAFETY: made by into_raw, freed once.
        unsafe { free(slot) };
        end();
        assert!(!dropped.load(Ordering::SeqCst), "dropped under the outer call");
        end();
        assert!(dropped.load(Ordering::SeqCst), "dropped when the outer call returned");
    }

    #[test]
    fn a_free_that_read_its_handle_first_does_not_wait_for_itself() {
        let dropped = Arc::new(AtomicBool::new(false));
        let slot = into_raw(Flag(dropped.clone()));
        begin();
        // SAFETY: live until freed below.
        enter(unsafe { &*slot });
        // SAFETY: made by into_raw, freed once.
        unsafe { free(slot) };
        assert!(dropped.load(Ordering::SeqCst));
        end();
    }
}
