//! `mws_set_log_callback` (issue 12, item 5): the library's records reach a C
//! callback at or above its level; removal stops them; bad levels are refused.

use crate::test_model as model;

use crate::{mws_set_log_callback, mws_status, MWS_LOG_DEBUG, MWS_LOG_INFO, MWS_LOG_OFF, MWS_LOG_WARN};
use model::*;
use mws::plan::load::PlanningLimits;
use mws::protocol::WeightStore;
use mws::protocol::{LoadArgs, StaticGuard};
use mws::store::memory::MemoryStore;
use parking_lot::Mutex;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

type Records = Mutex<Vec<(i32, String, String)>>;

unsafe extern "C" fn record(ctx: *mut c_void, level: i32, target: *const c_char, message: *const c_char) {
    // SAFETY: ctx is the `Records` this test passed; the strings are valid for the call.
    let (r, t, m) = unsafe { (&*(ctx as *const Records), CStr::from_ptr(target), CStr::from_ptr(message)) };
    r.lock().push((level, t.to_string_lossy().into(), m.to_string_lossy().into()));
}

fn snapshot() -> String {
    let defs = model_tensors(1, 16, 0);
    let src = HostModel::new(build_placement("s", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let ws = WeightStore::new(Arc::new(MemoryStore::new()));
    src.snapshot_into(&ws).unwrap().manifest_key().to_string()
}

#[test]
fn acc_125_log_callback_from_c() {
    let records: &'static Records = Box::leak(Box::default());
    let ctx = records as *const Records as *mut c_void;
    // SAFETY: `record` honours the callback contract; `records` lives forever.
    assert_eq!(unsafe { mws_set_log_callback(9, Some(record), ctx) }, mws_status::MWS_INVALID_ARGUMENT);
    // SAFETY: as above.
    assert_eq!(unsafe { mws_set_log_callback(MWS_LOG_INFO, Some(record), ctx) }, mws_status::MWS_OK);
    let key = snapshot();
    {
        let r = records.lock();
        assert!(
            r.iter()
                .any(|(l, _, m)| *l == MWS_LOG_INFO && m.starts_with("upload plan for ") && m.contains("operations")),
            "{r:?}"
        );
        assert!(
            r.iter().any(|(_, t, m)| t.starts_with("mooncake_weight_store::protocol") && m.contains(&key)),
            "{r:?}"
        );
    }
    // A stricter level filters the info records out.
    // SAFETY: as above.
    assert_eq!(unsafe { mws_set_log_callback(MWS_LOG_WARN, Some(record), ctx) }, mws_status::MWS_OK);
    let n = records.lock().len();
    snapshot();
    assert_eq!(records.lock().len(), n);
    // SAFETY: removing needs no callback.
    assert_eq!(unsafe { mws_set_log_callback(MWS_LOG_OFF, None, std::ptr::null_mut()) }, mws_status::MWS_OK);
    snapshot();
    assert_eq!(records.lock().len(), n);

    // At debug level, a restore explains its request pattern (issue 16, item 4).
    // SAFETY: as above.
    assert_eq!(unsafe { mws_set_log_callback(MWS_LOG_DEBUG, Some(record), ctx) }, mws_status::MWS_OK);
    let defs = model_tensors(1, 16, 0);
    let src = HostModel::new(build_placement("s", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let ws = WeightStore::new(Arc::new(MemoryStore::new()));
    let m = Arc::new(src.snapshot_into(&ws).unwrap());
    let mut dst = HostModel::new(build_placement("d", Layout { tp: 1, pp: 1, ep: 1, dp: 1 }, &defs, 1), false, "s", 1);
    dst.bindings = dst.make_bindings("s", 1);
    let plan = ws.plan_load(m, dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: dst's buffers outlive the call and nobody else touches them.
    let st = unsafe { ws.load(&plan, &dst.bindings[0], args) }.unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { mws_set_log_callback(MWS_LOG_OFF, None, std::ptr::null_mut()) }, mws_status::MWS_OK);
    let r = records.lock();
    let line =
        r.iter().find(|(l, _, m)| *l == MWS_LOG_DEBUG && m.starts_with("restore of ")).expect("a restore record");
    assert!(line.2.contains(&format!("{} regions", st.regions)), "{line:?}");
    assert!(line.2.contains(&format!("{} strided", st.strided_regions)), "{line:?}");
    assert!(line.2.contains("the store reads strided regions natively"), "{line:?}");
}

/// The `MWS_LOG_*` codes are the `log` crate's numbers of its levels and filters (the
/// callback receives `level as i32`; `mws_set_log_callback` reads a filter by index).
#[test]
fn log_codes_are_the_log_crate_numbering() {
    use crate::callbacks::log::level_filter;
    use crate::{MWS_LOG_ERROR, MWS_LOG_TRACE};
    let levels = [log::Level::Error, log::Level::Warn, log::Level::Info, log::Level::Debug, log::Level::Trace];
    for (code, level) in (MWS_LOG_ERROR..=MWS_LOG_TRACE).zip(levels) {
        assert_eq!(level as i32, code);
        assert_eq!(level_filter(code), Some(level.to_level_filter()));
    }
    assert_eq!(level_filter(MWS_LOG_OFF), Some(log::LevelFilter::Off));
    assert_eq!((level_filter(-1), level_filter(6)), (None, None));
}
