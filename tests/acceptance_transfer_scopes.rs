//! Acceptance items 356, 357, 358 and 374 of `acceptance-live-transfer.md`: nested
//! registration scopes ([`RegistrationScope`]) and the sealing of a pending
//! hand-off, against the scripted fake engine of `tests/common/fake_engine.rs`.
//!
//! The sink and reader hand a call's whole part over at once (their entries are
//! sealed when created, items 355 and 383 in `acceptance_transfer_exec.rs`); the
//! scopes are the nestable form in which an incomplete hand-off exists.

#[path = "common/builders.rs"]
mod builders;
#[path = "common/fake_engine.rs"]
mod fake_engine;

use fake_engine::*;
use mooncake_weight_store::engine::{CompletionStatus, Direction, MemoryRegion, TransferBatch, TransferBatchRange};
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::MemoryKind;
use std::sync::Arc;

const SOURCE: u64 = 0x10000;
const TARGET: u64 = 0x40000;
const CAP: u64 = 0x1000;

fn region(address: u64) -> MemoryRegion {
    MemoryRegion { address, len: CAP, kind: MemoryKind::Host }
}

/// One 8-byte write from `SOURCE` into `TARGET` on `target-t0:12345`.
fn batch() -> TransferBatch {
    let r = TransferBatchRange {
        source_base_address: SOURCE,
        source_capacity: CAP,
        target_base_address: TARGET,
        target_capacity: CAP,
        source_offsets: vec![0],
        target_offsets: vec![0],
        sizes: vec![8],
    };
    TransferBatch::from_ranges("target-t0:12345", Direction::Write, vec![r]).unwrap()
}

fn exec_with(engine: &Arc<FakeEngine>, attempts: u32) -> TransferExecutor {
    let limits = ExecutorLimits { max_completion_drain_attempts: attempts, ..Default::default() };
    TransferExecutor::new(engine.clone(), limits).unwrap()
}

/// A ticket engine whose ticket on `target-t0:12345` is unknown; with `interrupt`
/// its first inline drain is interrupted (`KeyboardInterrupt`).
fn unknown_engine(interrupt: bool) -> (Arc<FakeEngine>, Arc<FakeTicket>) {
    let engine = FakeEngine::ticketed();
    let ticket = FakeTicket::new(CompletionStatus::CompletionUnknown);
    if interrupt {
        ticket.drain_script.lock().push_back(TicketStep::Interrupt("KeyboardInterrupt".into()));
    }
    engine.set_submit("target-t0:12345", Submit::Ticket(ticket.clone()));
    (engine, ticket)
}

#[track_caller]
fn err_has<T: std::fmt::Debug>(r: TransferResult<T>, needle: &str) -> TransferError {
    let e = r.expect_err("expected an error");
    assert!(e.message.contains(needle), "error {:?} does not contain {needle:?}", e.message);
    e
}

fn handed_off(id: &str, sealed: bool) -> ScopeExit {
    ScopeExit::HandedOff { pending_transfer_id: id.to_string(), sealed }
}

#[test]
fn scopes_without_a_pending_transfer_unregister_when_they_close() {
    // Control for the items below: a completed batch; each scope unregisters its own
    // allocation as it closes (inner first), a pre-registered scope nothing.
    let engine = FakeEngine::ticketed();
    let ex = exec_with(&engine, 3);
    // SAFETY: the fake engine never touches memory.
    let outer = unsafe { ex.open_registration_scope("target", &[region(TARGET)]) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { outer.nested(&ex, "source", &[region(SOURCE), region(SOURCE)]) }.unwrap();
    // SAFETY: as above.
    let pre = unsafe { inner.nested(&ex, "target", &[]) }.unwrap();
    // SAFETY: as above.
    unsafe { pre.execute_batch(&batch()) }.unwrap();
    assert_eq!(pre.close().unwrap(), ScopeExit::Unregistered);
    assert_eq!(inner.registered(), &[SOURCE], "two views of one allocation register it once");
    assert_eq!(inner.close().unwrap(), ScopeExit::Unregistered);
    assert_eq!(engine.unregisters(), vec![SOURCE]);
    assert_eq!(outer.close().unwrap(), ScopeExit::Unregistered);
    assert_eq!(engine.registers(), vec![(TARGET, CAP), (SOURCE, CAP)]);
    assert_eq!(engine.unregisters(), vec![SOURCE, TARGET]);
    assert!(ex.pending_transfer_ids().is_empty());
    // The reservation ended with the outermost scope.
    // SAFETY: as above.
    unsafe { ex.open_registration_scope("source", &[]) }.unwrap().close().unwrap();
}

#[test]
fn acc_356_interruption_caught_inside_the_outer_scope_keeps_it_handed_off() {
    let (engine, ticket) = unknown_engine(true);
    let ex = exec_with(&engine, 3);
    // SAFETY: the fake engine never touches memory.
    let outer = unsafe { ex.open_registration_scope("target", &[region(TARGET)]) }.unwrap();
    let id = {
        // SAFETY: as above.
        let inner = unsafe { outer.nested(&ex, "source", &[region(SOURCE)]) }.unwrap();
        // SAFETY: as above.
        let e = unsafe { inner.execute_batch(&batch()) }.unwrap_err();
        assert_eq!(e.kind, TransferErrorKind::Interrupted);
        assert_eq!(e.cause.as_deref(), Some("KeyboardInterrupt"));
        let id = e.pending_transfer_id.unwrap();
        // The interruption propagates out of the inner scope ...
        assert_eq!(inner.close().unwrap(), handed_off(&id, false));
        id
    };
    // ... and is caught inside the outer one, which goes on and then ends normally.
    assert!(engine.unregisters().is_empty(), "nothing unregistered while DMA may run");
    // SAFETY: as above.
    err_has(unsafe { outer.execute_batch(&batch()) }, "transfer engine has pending transfer");
    assert_eq!(outer.close().unwrap(), handed_off(&id, true));
    assert!(engine.unregisters().is_empty(), "the outer registration stays handed off");
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![TARGET, SOURCE], "the drain unregisters both (descending)");
    assert!(ex.pending_transfer_ids().is_empty());
}

#[test]
fn acc_357_outer_scope_on_another_engine_unregisters_at_once() {
    let (inner_engine, ticket) = unknown_engine(true);
    let outer_engine = FakeEngine::ticketed();
    let (ex_in, ex_out) = (exec_with(&inner_engine, 3), exec_with(&outer_engine, 3));
    // SAFETY: the fake engines never touch memory.
    let outer = unsafe { ex_out.open_registration_scope("target", &[region(TARGET)]) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { outer.nested(&ex_in, "source", &[region(SOURCE)]) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { inner.execute_batch(&batch()) }.unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::Interrupted);
    let id = e.pending_transfer_id.unwrap();
    // The inner scope is the outermost one of its engine: it seals the hand-off.
    assert_eq!(inner.close().unwrap(), handed_off(&id, true));
    assert_eq!(ex_in.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    // The interruption propagates through the outer scope: its engine has no pending
    // transfer, so its allocation is unregistered at once.
    assert_eq!(outer.close().unwrap(), ScopeExit::Unregistered);
    assert_eq!(outer_engine.unregisters(), vec![TARGET]);
    assert!(inner_engine.unregisters().is_empty());
    assert!(ex_out.pending_transfer_ids().is_empty());
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex_in.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(inner_engine.unregisters(), vec![SOURCE], "the inner allocation only at its drain");
    assert_eq!(outer_engine.unregisters(), vec![TARGET]);
}

#[test]
fn nest_on_one_engine_spans_a_scope_of_another_engine() {
    // A (outer) -> B (middle) -> A (inner): the inner scope joins A's nest, so A's
    // hand-off is sealed only by A's outermost scope; B unregisters at once.
    let (a, ticket) = unknown_engine(false);
    let b = FakeEngine::ticketed();
    let (ea, eb) = (exec_with(&a, 0), exec_with(&b, 0));
    // SAFETY: the fake engines never touch memory.
    let outer = unsafe { ea.open_registration_scope("target", &[region(TARGET)]) }.unwrap();
    // SAFETY: as above.
    let middle = unsafe { outer.nested(&eb, "target", &[region(0x70000)]) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { middle.nested(&ea, "source", &[region(SOURCE)]) }.unwrap();
    // SAFETY: as above.
    let id = unsafe { inner.execute_batch(&batch()) }.unwrap_err().pending_transfer_id.unwrap();
    assert_eq!(inner.close().unwrap(), handed_off(&id, false));
    assert_eq!(middle.close().unwrap(), ScopeExit::Unregistered);
    assert_eq!(b.unregisters(), vec![0x70000]);
    err_has(ea.pending_transfer_status(&id), "handoff is incomplete");
    assert_eq!(outer.close().unwrap(), handed_off(&id, true));
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ea.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(a.unregisters(), vec![TARGET, SOURCE]);
}

#[test]
fn acc_358_status_fails_until_the_outermost_scope_seals_the_handoff() {
    let (engine, ticket) = unknown_engine(false);
    let ex = exec_with(&engine, 0);
    // SAFETY: the fake engine never touches memory.
    let outer = unsafe { ex.open_registration_scope("target", &[region(TARGET)]) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { outer.nested(&ex, "source", &[region(SOURCE)]) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { inner.execute_batch(&batch()) }.unwrap_err();
    assert_eq!(e.kind, TransferErrorKind::CompletionUnknown);
    let id = e.pending_transfer_id.unwrap();
    let incomplete = format!("pending transfer resource handoff is incomplete: {id}");
    // Nothing handed off yet, then the inner part only.
    err_has(ex.pending_transfer_status(&id), &incomplete);
    assert_eq!(inner.close().unwrap(), handed_off(&id, false));
    err_has(ex.pending_transfer_status(&id), &incomplete);
    err_has(ex.drain_pending_transfer(&id, 1000), &incomplete);
    assert!(ticket.drains().is_empty() && engine.unregisters().is_empty());
    // The entry is listed and blocks its engine meanwhile.
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    let other = exec_with(&engine, 0);
    // SAFETY: as above.
    err_has(unsafe { other.open_registration_scope("source", &[]) }, &format!("has pending transfer {id}"));
    // The outermost scope seals it.
    assert_eq!(outer.close().unwrap(), handed_off(&id, true));
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETION_UNKNOWN");
    ticket.set(CompletionStatus::Completed);
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETED");
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![TARGET, SOURCE]);
}

#[test]
fn acc_374_drain_during_a_blocked_handoff_neither_drains_nor_unregisters() {
    let (engine, ticket) = unknown_engine(false);
    let ex = exec_with(&engine, 0);
    let owner = Arc::new("source allocation owner".to_string());
    let (id_tx, id_rx) = std::sync::mpsc::channel::<String>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ex2, owner2) = (ex.clone(), owner.clone());
    // The hand-off: own source registration (outer), pre-registered target (inner);
    // it blocks between the inner and the outer part.
    let handoff = std::thread::spawn(move || {
        // SAFETY: the fake engine never touches memory.
        let mut outer = unsafe { ex2.open_registration_scope("source", &[region(SOURCE)]) }.unwrap();
        outer.retain(Box::new(owner2));
        let id = {
            // SAFETY: as above.
            let inner = unsafe { outer.nested(&ex2, "target", &[]) }.unwrap();
            // SAFETY: as above.
            let id = unsafe { inner.execute_batch(&batch()) }.unwrap_err().pending_transfer_id.unwrap();
            assert_eq!(inner.close().unwrap(), handed_off(&id, false));
            id
        };
        id_tx.send(id.clone()).unwrap();
        go_rx.recv().unwrap(); // blocked mid-way
        outer.close().unwrap()
    });
    let id = id_rx.recv().unwrap();
    ticket.set(CompletionStatus::Completed); // a drain would now succeed, if it ran
    let e = err_has(ex.drain_pending_transfer(&id, 1000), "resource handoff");
    assert_eq!(e.kind, TransferErrorKind::Engine);
    assert!(ticket.drains().is_empty(), "not drained");
    assert!(engine.unregisters().is_empty(), "nothing unregistered");
    assert_eq!(ex.pending_transfer_ids(), vec![id.clone()]);
    go_tx.send(()).unwrap();
    assert_eq!(handoff.join().unwrap(), handed_off(&id, true));
    assert!(Arc::strong_count(&owner) > 1, "the entry keeps the retained owner");
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETED");
    assert_eq!(ex.drain_pending_transfer(&id, 1000).unwrap(), "COMPLETED");
    assert_eq!(ticket.drains(), vec![1000]);
    assert_eq!(engine.registers(), vec![(SOURCE, CAP)]);
    assert_eq!(engine.unregisters(), vec![SOURCE], "exactly the own allocation");
    assert_eq!(Arc::strong_count(&owner), 1, "released after the drain");
    assert!(ex.pending_transfer_ids().is_empty());
}

#[test]
fn scope_cleanup_failures_are_quarantined_and_register_failures_fail_the_open() {
    // A failed unregistration at close: a registration-cleanup entry that blocks the
    // engine until a drain succeeds.
    let engine = FakeEngine::ticketed();
    engine.unregister.lock().push_back(Step::Code(-7));
    let ex = exec_with(&engine, 0);
    // SAFETY: the fake engine never touches memory.
    let scope = unsafe { ex.open_registration_scope("source", &[region(SOURCE)]) }.unwrap();
    // SAFETY: as above.
    unsafe { scope.execute_batch(&batch()) }.unwrap();
    let e = err_has(
        scope.close(),
        "source unregister_memory failed: [(65536, -7)]; registration cleanup is quarantined as",
    );
    assert_eq!(e.kind, TransferErrorKind::RegistrationCleanupPending);
    let id = e.pending_transfer_id.unwrap();
    assert_eq!(ex.pending_transfer_status(&id).unwrap(), "COMPLETED");
    // SAFETY: as above.
    err_has(unsafe { ex.open_registration_scope("source", &[]) }, "has pending transfer");
    assert_eq!(ex.drain_pending_transfer(&id, 0).unwrap(), "COMPLETED");
    assert_eq!(engine.unregisters(), vec![SOURCE, SOURCE]);
    // A failed registration fails the open; a base with two sizes is refused before
    // any registration.
    engine.clear();
    *engine.register.lock() = Step::Code(0);
    let ex = exec_with(&engine, 0);
    let failing = FakeEngine::ticketed();
    *failing.register.lock() = Step::Code(-4);
    // SAFETY: as above.
    let e = unsafe { exec_with(&failing, 0).open_registration_scope("target", &[region(TARGET)]) }.unwrap_err();
    assert_eq!(e.message, format!("target register_memory failed for {TARGET:#x}: -4"));
    assert!(failing.unregisters().is_empty());
    // SAFETY: as above.
    let outer = unsafe { ex.open_registration_scope("target", &[region(TARGET), region(0x50000)]) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { outer.nested(&ex, "source", &[region(SOURCE), MemoryRegion { len: 8, ..region(SOURCE) }]) };
    err_has(e, "source allocation capacity mismatch");
    drop(outer);
    assert_eq!(engine.unregisters(), vec![0x50000, TARGET], "a dropped scope unregisters in reverse order");
}
