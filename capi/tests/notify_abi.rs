//! Issue 27: the notify hook's C ABI. The engine vtable's appended `send_notify` is
//! size-versioned (a vtable of the version-1 size has no notify support, a shorter
//! one is refused); the acceptor's entry points check their arguments, refuse bad
//! messages with a verdict and a status, and change nothing when they refuse.

use crate::callbacks::engine::{mws_transfer_engine_vtable, CallbackEngine, MWS_TRANSFER_ENGINE_VTABLE_VERSION};
use crate::mws_target_verdict::MWS_TARGET_UNCHANGED;
use crate::notify::*;
use crate::transfer_plan::mws_transfer_plan;
use crate::{mws_bytes, mws_status};
use mws::engine::TransferEngine;
use mws::plan::load::PlanningLimits;
use mws::plan::transfer::LogicalTransferPlan;
use mws::plan::transfer_bind::TransferPlan;
use parking_lot::Mutex;
use std::ffi::{c_void, CString};

static SENT: Mutex<Vec<(String, String, Vec<u8>)>> = Mutex::new(Vec::new());

unsafe fn bytes(b: mws_bytes) -> Vec<u8> {
    // SAFETY: the library passes views valid for the call.
    unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len) }.to_vec()
}
unsafe extern "C" fn id(_: *mut c_void) -> u64 {
    77
}
unsafe extern "C" fn reg(_: *mut c_void, _: u64, _: u64, _: i32) -> i32 {
    0
}
unsafe extern "C" fn unreg(_: *mut c_void, _: u64) -> i32 {
    0
}
unsafe extern "C" fn batch(_: *mut c_void, _: mws_bytes, _: *const u64, _: *const u64, _: *const u64, _: usize) -> i32 {
    0
}
unsafe extern "C" fn notify(_: *mut c_void, e: mws_bytes, n: mws_bytes, m: mws_bytes) -> i32 {
    // SAFETY: the library passes views valid for the call.
    let (e, n, m) = unsafe { (bytes(e), bytes(n), bytes(m)) };
    SENT.lock().push((String::from_utf8(e).unwrap(), String::from_utf8(n).unwrap(), m));
    0
}

fn vtable() -> mws_transfer_engine_vtable {
    mws_transfer_engine_vtable {
        size: std::mem::size_of::<mws_transfer_engine_vtable>() as u32,
        version: MWS_TRANSFER_ENGINE_VTABLE_VERSION,
        get_engine_id: Some(id),
        register_memory: Some(reg),
        unregister_memory: Some(unreg),
        batch_transfer_sync_write: Some(batch),
        batch_transfer_sync_read: Some(batch),
        submit_with_ticket: None,
        ticket_status: None,
        ticket_drain: None,
        ticket_release: None,
        send_notify: Some(notify),
    }
}

#[test]
fn send_notify_is_size_versioned() {
    let v1 = std::mem::offset_of!(mws_transfer_engine_vtable, send_notify) as u32;
    let mut vt = vtable();
    // SAFETY: a complete vtable on the stack.
    let full = unsafe { CallbackEngine::new(&vt, std::ptr::null_mut(), None) }.unwrap();
    assert_eq!(full.send_notify("peer:1", "n", b"msg"), Some(Ok(0)));
    assert_eq!(SENT.lock().pop(), Some(("peer:1".into(), "n".into(), b"msg".to_vec())));
    // A caller compiled before send_notify existed: the field beyond `size` is not read.
    vt.size = v1;
    // SAFETY: as above (the struct is larger than `size`).
    let old = unsafe { CallbackEngine::new(&vt, std::ptr::null_mut(), None) }.unwrap();
    assert_eq!(old.send_notify("peer:1", "n", b"msg"), None);
    assert!(SENT.lock().is_empty());
    vt.size = v1 - 1;
    // SAFETY: as above.
    let e = unsafe { CallbackEngine::new(&vt, std::ptr::null_mut(), None) }.unwrap_err();
    assert!(e.message().contains(&format!("expected at least {v1}")), "{e}");
}

fn plan() -> mws_transfer_plan {
    use crate::test_model::*;
    let defs = model_tensors(1, 16, 0);
    let layout = |tp| Layout { tp, pp: 1, ep: 1, dp: 1 };
    let src = HostModel::new(build_placement("a", layout(2), &defs, 1), true, "trainer", 1);
    let dst = HostModel::new(build_placement("b", layout(1), &defs, 1), false, "server", 1);
    let (sb, tb) = (src.make_bindings("trainer", 1), dst.make_bindings("server", 1));
    let logical =
        LogicalTransferPlan::plan(src.placement.clone(), dst.placement.clone(), PlanningLimits::reference()).unwrap();
    let bound = TransferPlan::bind(&logical, &tb, &sb).unwrap();
    std::mem::forget((src, dst)); // the bindings' buffers stay valid (never dereferenced here)
    mws_transfer_plan::new(logical, Some(bound))
}

#[test]
fn acceptor_entry_points_check_arguments_and_refuse_bad_messages() {
    let plan = plan();
    let target =
        plan.bound.as_ref().unwrap().executors(mws::plan::transfer_bind::Side::Target)[0].participant_id.clone();
    // A handle as C holds it (the library's own box, freed below).
    let p: *mut mws_transfer_plan = crate::args::Handle::into_raw(plan);
    let participant = CString::new(target).unwrap();
    let mut acc = std::ptr::null_mut();
    // SAFETY: every pointer is NULL or valid for the call.
    unsafe {
        assert_eq!(
            mws_notify_acceptor_new(std::ptr::null(), participant.as_ptr(), std::ptr::null(), 0, &mut acc),
            mws_status::MWS_NULL_ARGUMENT
        );
        let short = [1u8; 8];
        assert_eq!(
            mws_notify_acceptor_new(p, participant.as_ptr(), short.as_ptr(), short.len(), &mut acc),
            mws_status::MWS_INVALID_ARGUMENT
        );
        let nobody = CString::new("nobody").unwrap();
        assert_eq!(
            mws_notify_acceptor_new(p, nobody.as_ptr(), std::ptr::null(), 0, &mut acc),
            mws_status::MWS_INVALID_ARGUMENT
        );
        assert_eq!(mws_notify_acceptor_new(p, participant.as_ptr(), std::ptr::null(), 0, &mut acc), mws_status::MWS_OK);
        let (mut verdict, mut outcome) =
            (99u32, mws_notify_outcome { verdict: 99, weight_generation: 0, incomplete: 0 });
        let junk = b"hello";
        assert_eq!(
            mws_notify_acceptor_accept(acc, junk.as_ptr(), junk.len(), &mut verdict, &mut outcome),
            mws_status::MWS_INVALID_ARGUMENT
        );
        assert_eq!(
            (verdict, outcome.verdict, outcome.weight_generation),
            (MWS_NOTIFY_MALFORMED, MWS_TARGET_UNCHANGED as u32, 1)
        );
        let cut = b"MWS-NOTIFY/1 sha256 00 99\n{}";
        assert_eq!(
            mws_notify_acceptor_accept(acc, cut.as_ptr(), cut.len(), &mut verdict, std::ptr::null_mut()),
            mws_status::MWS_INVALID_ARGUMENT
        );
        assert_eq!(verdict, MWS_NOTIFY_TRUNCATED);
        assert_eq!(
            mws_notify_acceptor_accept(acc, std::ptr::null(), 3, &mut verdict, std::ptr::null_mut()),
            mws_status::MWS_NULL_ARGUMENT
        );
        assert_eq!(mws_notify_acceptor_outcome(acc, &mut outcome), mws_status::MWS_OK);
        assert_eq!(outcome.verdict, MWS_TARGET_UNCHANGED as u32);
        assert_eq!(mws_notify_acceptor_outcome(acc, std::ptr::null_mut()), mws_status::MWS_NULL_ARGUMENT);
        mws_notify_acceptor_free(acc);
        mws_notify_acceptor_free(std::ptr::null_mut());
        crate::transfer_plan::mws_transfer_plan_free(p);
        let name = std::ffi::CStr::from_ptr(mws_notify_name()).to_str().unwrap();
        assert_eq!(name, "mooncake_weight_store.notify");
    }
}

/// Issue 46: the router, generation and content entry points check their arguments
/// and refuse with a verdict and a status.
#[test]
fn router_and_acceptor_extensions_check_arguments() {
    let plan = plan();
    let target =
        plan.bound.as_ref().unwrap().executors(mws::plan::transfer_bind::Side::Target)[0].participant_id.clone();
    let p: *mut mws_transfer_plan = crate::args::Handle::into_raw(plan);
    let participant = CString::new(target).unwrap();
    let (mut acc, mut router) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: every pointer is NULL or valid for the call.
    unsafe {
        assert_eq!(mws_notify_acceptor_new(p, participant.as_ptr(), std::ptr::null(), 0, &mut acc), mws_status::MWS_OK);
        assert_eq!(mws_notify_router_new(std::ptr::null_mut()), mws_status::MWS_NULL_ARGUMENT);
        assert_eq!(mws_notify_router_new(&mut router), mws_status::MWS_OK);
        assert_eq!(mws_notify_router_add(router, std::ptr::null()), mws_status::MWS_NULL_ARGUMENT);
        assert_eq!(mws_notify_router_add(router, acc), mws_status::MWS_OK);
        assert_eq!(mws_notify_router_add(router, acc), mws_status::MWS_CONFLICT);
        let (mut verdict, mut routed) = (99u32, acc as *const mws_notify_acceptor);
        let junk = b"hello";
        assert_eq!(
            mws_notify_router_accept(
                router,
                junk.as_ptr(),
                junk.len(),
                &mut verdict,
                std::ptr::null_mut(),
                &mut routed
            ),
            mws_status::MWS_INVALID_ARGUMENT
        );
        assert_eq!((verdict, routed), (MWS_NOTIFY_MALFORMED, std::ptr::null()));
        // Generations: forward is fine, backward is stale.
        assert_eq!(mws_notify_acceptor_expect_generation(acc, 5), mws_status::MWS_OK);
        assert_eq!(mws_notify_acceptor_expect_generation(acc, 4), mws_status::MWS_STALE_BINDING);
        let mut o = mws_notify_outcome { verdict: 99, weight_generation: 0, incomplete: 0 };
        assert_eq!(mws_notify_acceptor_outcome(acc, &mut o), mws_status::MWS_OK);
        assert_eq!((o.verdict, o.weight_generation), (MWS_TARGET_UNCHANGED as u32, 5));
        // Content verification of host buffers; no mismatch yet.
        assert_eq!(mws_notify_acceptor_verify_content(acc), mws_status::MWS_OK);
        let mut n = 99usize;
        assert_eq!(mws_notify_acceptor_mismatch_count(acc, &mut n), mws_status::MWS_OK);
        assert_eq!(n, 0);
        let mut m = std::mem::MaybeUninit::<mws_notify_mismatch>::uninit();
        assert_eq!(mws_notify_acceptor_mismatch(acc, 0, m.as_mut_ptr()), mws_status::MWS_INVALID_ARGUMENT);
        let mut removed = 9u32;
        assert_eq!(mws_notify_router_remove(router, acc, &mut removed), mws_status::MWS_OK);
        assert_eq!(removed, 1);
        assert_eq!(mws_notify_router_remove(router, acc, &mut removed), mws_status::MWS_OK);
        assert_eq!(removed, 0);
        mws_notify_router_free(router);
        mws_notify_router_free(std::ptr::null_mut());
        mws_notify_acceptor_free(acc);
        crate::transfer_plan::mws_transfer_plan_free(p);
    }
}
