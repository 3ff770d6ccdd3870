//! Issue 14, item 5: `RemoteStore` enforces the store vtable contract exactly
//! (`docs/STORE-VTABLE.md`): per entry point, a value outside its documented range is
//! a precise store error, never taken as success; documented negative codes keep
//! their meaning. One test per entry point, over a vtable fake whose return values
//! can be overridden per callback.

use crate::callbacks::store::store_from_vtable;
use crate::{mws_bytes, mws_put_item, mws_range_item, mws_store_cost, mws_store_vtable, MWS_STORE_VTABLE_VERSION};
use mws::runtime::MemoryRegion;
use mws::store::remote::RemoteStore;
use mws::store::{ObjectStore, PutFrom, RangeRead, RecordType, StoreCost, WriteConfig};
use mws::{ErrorKind, MemoryKind, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;

/// An in-memory store behind a vtable; `overrides[op]` replaces the return value of
/// callback `op` (`"<op>.item"`: the per-item result of a batch callback).
#[derive(Default)]
struct Fake {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    overrides: Mutex<HashMap<&'static str, i64>>,
    /// Calls per callback (`get_size`, `batch_get_size`) and keys per `batch_get_size` call.
    calls: Mutex<HashMap<&'static str, usize>>,
    batch_sizes: Mutex<Vec<usize>>,
}

fn count(f: &Fake, op: &'static str) {
    *f.calls.lock().entry(op).or_insert(0) += 1;
}

fn calls(f: &Fake, op: &str) -> usize {
    f.calls.lock().get(op).copied().unwrap_or(0)
}

unsafe fn fake<'a>(ctx: *mut c_void) -> &'a Fake {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    unsafe { &*(ctx as *const Fake) }
}

unsafe fn key(b: mws_bytes) -> String {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len) }).into_owned()
}

fn ov(f: &Fake, op: &str) -> Option<i64> {
    f.overrides.lock().get(op).copied()
}

unsafe extern "C" fn put(ctx: *mut c_void, k: mws_bytes, v: *const u8, n: u64, _: mws_bytes, _: u32) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    if let Some(c) = ov(f, "put") {
        return c as i32;
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    f.objects
        .lock()
        .entry(unsafe { key(k) })
        .or_insert_with(|| unsafe { std::slice::from_raw_parts(v, n as usize) }.to_vec());
    0
}
unsafe extern "C" fn upsert(ctx: *mut c_void, k: mws_bytes, v: *const u8, n: u64, _: mws_bytes, _: u32) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    if let Some(c) = ov(f, "upsert") {
        return c as i32;
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    f.objects.lock().insert(unsafe { key(k) }, unsafe { std::slice::from_raw_parts(v, n as usize) }.to_vec());
    0
}
unsafe extern "C" fn get_size(ctx: *mut c_void, k: mws_bytes) -> i64 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    count(f, "get_size");
    if let Some(c) = ov(f, "get_size") {
        return c;
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    f.objects.lock().get(&unsafe { key(k) }).map_or(-704, |v| v.len() as i64)
}
unsafe extern "C" fn get_into(ctx: *mut c_void, k: mws_bytes, buf: *mut u8, cap: u64) -> i64 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    if let Some(c) = ov(f, "get_into") {
        return if c == i64::MAX { cap as i64 + 1 } else { c };
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    match f.objects.lock().get(&unsafe { key(k) }) {
        None => -704,
        Some(v) if v.len() as u64 > cap => -600,
        Some(v) => {
            // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), buf, v.len()) };
            v.len() as i64
        }
    }
}
unsafe extern "C" fn exists(ctx: *mut c_void, k: mws_bytes) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    if let Some(c) = ov(f, "exists") {
        return c as i32;
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    f.objects.lock().contains_key(&unsafe { key(k) }) as i32
}
unsafe extern "C" fn remove(ctx: *mut c_void, k: mws_bytes) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    if let Some(c) = ov(f, "remove") {
        return c as i32;
    }
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    if f.objects.lock().remove(&unsafe { key(k) }).is_some() {
        0
    } else {
        -704
    }
}
unsafe extern "C" fn batch_put_from(
    ctx: *mut c_void,
    items: *const mws_put_item,
    n: usize,
    _: u32,
    r: *mut i32,
) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    for (i, it) in unsafe { std::slice::from_raw_parts(items, n) }.iter().enumerate() {
        let code = match ov(f, "batch_put_from.item") {
            Some(c) => c as i32,
            None => {
                // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
                let v = unsafe { std::slice::from_raw_parts(it.address as *const u8, it.len as usize) }.to_vec();
                // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
                f.objects.lock().entry(unsafe { key(it.key) }).or_insert(v);
                0
            }
        };
        // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
        *unsafe { &mut *r.add(i) } = code;
    }
    ov(f, "batch_put_from").unwrap_or(0) as i32
}
unsafe extern "C" fn get_into_ranges(ctx: *mut c_void, items: *const mws_range_item, n: usize, r: *mut i64) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    for (i, it) in unsafe { std::slice::from_raw_parts(items, n) }.iter().enumerate() {
        let code = match ov(f, "get_into_ranges.item") {
            Some(c) if c == i64::MAX => it.len as i64 + 1,
            Some(c) => c,
            // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
            None => match f.objects.lock().get(&unsafe { key(it.key) }) {
                None => -704,
                Some(v) if it.object_offset + it.len > v.len() as u64 => -600,
                Some(v) => {
                    let src = &v[it.object_offset as usize..(it.object_offset + it.len) as usize];
                    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), it.dest_address as *mut u8, src.len()) };
                    it.len as i64
                }
            },
        };
        // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
        *unsafe { &mut *r.add(i) } = code;
    }
    ov(f, "get_into_ranges").unwrap_or(0) as i32
}
unsafe extern "C" fn register_buffer(ctx: *mut c_void, _: u64, _: u64, _: u32, _: u32) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    ov(unsafe { fake(ctx) }, "register_buffer").unwrap_or(0) as i32
}
unsafe extern "C" fn unregister_buffer(ctx: *mut c_void, _: u64) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    ov(unsafe { fake(ctx) }, "unregister_buffer").unwrap_or(0) as i32
}
unsafe extern "C" fn batch_exists(ctx: *mut c_void, keys: *const mws_bytes, n: usize, r: *mut i32) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    for (i, k) in unsafe { std::slice::from_raw_parts(keys, n) }.iter().enumerate() {
        // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
        *unsafe { &mut *r.add(i) } = match ov(f, "batch_exists.item") {
            Some(c) => c as i32,
            // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
            None => f.objects.lock().contains_key(&unsafe { key(*k) }) as i32,
        };
    }
    ov(f, "batch_exists").unwrap_or(0) as i32
}

/// `"batch_get_size.item"` overrides every key's size (`i64::MIN`: leaves it unwritten).
unsafe extern "C" fn batch_get_size(ctx: *mut c_void, keys: *const mws_bytes, n: usize, r: *mut i64) -> i32 {
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    let f = unsafe { fake(ctx) };
    count(f, "batch_get_size");
    f.batch_sizes.lock().push(n);
    // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
    for (i, k) in unsafe { std::slice::from_raw_parts(keys, n) }.iter().enumerate() {
        let size = match ov(f, "batch_get_size.item") {
            Some(i64::MIN) => continue,
            Some(c) => c,
            // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
            None => f.objects.lock().get(&unsafe { key(*k) }).map_or(-704, |v| v.len() as i64),
        };
        // SAFETY: the library hands back the `ctx`, keys and buffers this test gave it, alive and valid for the call.
        *unsafe { &mut *r.add(i) } = size;
    }
    ov(f, "batch_get_size").unwrap_or(0) as i32
}

/// The fake (leaked: the store does not own it; `destroy` is NULL) and its store.
fn store() -> (&'static Fake, RemoteStore) {
    let f: &'static Fake = Box::leak(Box::default());
    let vt = vtable();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let s = unsafe { store_from_vtable(&vt, f as *const Fake as *mut c_void) }.unwrap();
    (f, s)
}

fn vtable() -> mws_store_vtable {
    mws_store_vtable {
        size: std::mem::size_of::<mws_store_vtable>() as u32,
        version: MWS_STORE_VTABLE_VERSION,
        put: Some(put),
        upsert: Some(upsert),
        get_size: Some(get_size),
        get_into: Some(get_into),
        exists: Some(exists),
        remove: Some(remove),
        batch_put_from: Some(batch_put_from),
        get_into_ranges: Some(get_into_ranges),
        register_buffer: Some(register_buffer),
        unregister_buffer: Some(unregister_buffer),
        destroy: None,
        batch_exists: Some(batch_exists),
        list: None,
        get_cost: None,
        batch_get_size: None,
    }
}

fn set(f: &Fake, op: &'static str, code: i64) {
    f.overrides.lock().insert(op, code);
}

fn clear(f: &Fake) {
    f.overrides.lock().clear();
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, msg: &str) {
    match r {
        Ok(v) => panic!("expected {kind:?} {msg:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind(), kind, "{e}");
            assert_eq!(e.message(), msg);
        }
    }
}

fn violation(op: &str, key: &str, value: i64, contract: &str) -> String {
    format!("store callback {op} returned {value} for {key}, outside its contract ({contract})")
}

const STATUS: &str = "0 or a negative error code";
const PRESENCE: &str = "1 present, 0 absent or a negative error code";
const BATCH: &str = "batch status: 0 or a negative error code";

fn groups(n: usize) -> Vec<String> {
    vec!["g".to_string(); n]
}

fn cfg(g: &[String]) -> WriteConfig<'_> {
    WriteConfig { group_ids: g, record_type: RecordType::Payload }
}

#[test]
fn put_accepts_only_zero_or_negative_codes() {
    let (f, s) = store();
    let g = groups(1);
    s.put("k", b"v", &cfg(&g)).unwrap();
    set(f, "put", 1);
    expect_err(s.put("k", b"v", &cfg(&g)), ErrorKind::Store, &violation("put", "k", 1, STATUS));
    set(f, "put", -705);
    expect_err(s.put("k", b"v", &cfg(&g)), ErrorKind::AlreadyExists, "object already exists: k");
    set(f, "put", -9);
    expect_err(s.put("k", b"v", &cfg(&g)), ErrorKind::Store, "store callback put failed for k: error code -9");
}

#[test]
fn upsert_accepts_only_zero_or_negative_codes() {
    let (f, s) = store();
    let g = groups(1);
    s.upsert("k", b"v", &cfg(&g)).unwrap();
    set(f, "upsert", 2);
    expect_err(s.upsert("k", b"v", &cfg(&g)), ErrorKind::Store, &violation("upsert", "k", 2, STATUS));
}

#[test]
fn get_size_is_validated_before_any_allocation() {
    let (f, s) = store();
    let g = groups(1);
    s.put("k", &vec![7u8; 300 << 10], &cfg(&g)).unwrap(); // above the first, unsized try
    assert_eq!(s.object_size("k").unwrap(), 300 << 10);
    assert_eq!(s.get("k").unwrap().len(), 300 << 10);
    expect_err(s.object_size("nope"), ErrorKind::NotFound, "object not found: nope");
    set(f, "get_size", -3);
    expect_err(s.object_size("k"), ErrorKind::Store, "store callback get_size failed for k: error code -3");
    expect_err(s.get("k"), ErrorKind::Store, "store callback get_size failed for k: error code -3");
    set(f, "get_size", 1 << 60);
    expect_err(
        s.get_limited("k", 1 << 20),
        ErrorKind::LimitExceeded,
        "object k holds 1152921504606846976 bytes, more than the limit of 1048576 bytes",
    );
    expect_err(s.get("k"), ErrorKind::LimitExceeded, "cannot allocate 1152921504606846976 bytes to read object k");
    set(f, "get_size", i64::MAX);
    expect_err(s.get("k"), ErrorKind::LimitExceeded, "cannot allocate 9223372036854775807 bytes to read object k");
}

#[test]
fn get_into_may_not_report_more_than_the_buffer() {
    let (f, s) = store();
    let g = groups(1);
    s.put("k", b"small", &cfg(&g)).unwrap();
    assert_eq!(s.get("k").unwrap(), b"small");
    assert_eq!(s.get_limited("k", 5).unwrap(), b"small");
    expect_err(
        s.get_limited("k", 4),
        ErrorKind::LimitExceeded,
        "object k holds 5 bytes, more than the limit of 4 bytes",
    );
    set(f, "get_into", i64::MAX); // capacity + 1
    expect_err(
        s.get("k"),
        ErrorKind::Store,
        &violation("get_into", "k", 262145, "at most the capacity of 262144 bytes"),
    );
    set(f, "get_into", -704);
    expect_err(s.get("k"), ErrorKind::NotFound, "object not found: k");
}

#[test]
fn exists_accepts_exactly_zero_one_or_negative() {
    let (f, s) = store();
    let g = groups(1);
    assert!(!s.exists("k").unwrap());
    s.put("k", b"v", &cfg(&g)).unwrap();
    assert!(s.exists("k").unwrap());
    set(f, "exists", 2);
    expect_err(s.exists("k"), ErrorKind::Store, &violation("exists", "k", 2, PRESENCE));
    set(f, "exists", i32::MAX as i64);
    expect_err(s.exists("k"), ErrorKind::Store, &violation("exists", "k", i32::MAX as i64, PRESENCE));
    set(f, "exists", -1);
    expect_err(s.exists("k"), ErrorKind::Store, "store callback exists failed for k: error code -1");
}

#[test]
fn batch_exists_accepts_exactly_zero_one_or_negative() {
    let (f, s) = store();
    let g = groups(1);
    s.put("a", b"v", &cfg(&g)).unwrap();
    let r = s.batch_exists(&["a", "b"]);
    assert_eq!(r, vec![Ok(true), Ok(false)]);
    set(f, "batch_exists.item", 2);
    let r = s.batch_exists(&["a", "b"]);
    expect_err(r[0].clone(), ErrorKind::Store, &violation("batch_exists", "a", 2, PRESENCE));
    expect_err(r[1].clone(), ErrorKind::Store, &violation("batch_exists", "b", 2, PRESENCE));
    clear(f);
    set(f, "batch_exists", 1);
    let r = s.batch_exists(&["a"]);
    expect_err(r[0].clone(), ErrorKind::Store, &violation("batch_exists", "a", 1, BATCH));
}

#[test]
fn remove_accepts_zero_not_found_or_negative() {
    let (f, s) = store();
    let g = groups(1);
    s.put("k", b"v", &cfg(&g)).unwrap();
    s.remove("k").unwrap();
    s.remove("k").unwrap(); // -704: success
    set(f, "remove", 1);
    expect_err(s.remove("k"), ErrorKind::Store, &violation("remove", "k", 1, STATUS));
    set(f, "remove", -5);
    expect_err(s.remove("k"), ErrorKind::Store, "store callback remove failed for k: error code -5");
}

#[test]
fn batch_put_from_accepts_only_zero_or_negative_codes() {
    let (f, s) = store();
    let g = groups(2);
    let a = b"aaaa".to_vec();
    let host = |v: &Vec<u8>| MemoryRegion { address: v.as_ptr() as u64, len: v.len() as u64, kind: MemoryKind::Host };
    let items = [PutFrom { key: "x", source: host(&a) }, PutFrom { key: "y", source: host(&a) }];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    assert_eq!(r, vec![Ok(()), Ok(())]);
    set(f, "batch_put_from.item", 1);
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    expect_err(r[0].clone(), ErrorKind::Store, &violation("batch_put_from", "x", 1, STATUS));
    expect_err(r[1].clone(), ErrorKind::Store, &violation("batch_put_from", "y", 1, STATUS));
    clear(f);
    set(f, "batch_put_from", 3);
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    expect_err(r[0].clone(), ErrorKind::Store, &violation("batch_put_from", "x", 3, BATCH));
    expect_err(r[1].clone(), ErrorKind::Store, &violation("batch_put_from", "y", 3, BATCH));
}

#[test]
fn get_into_ranges_may_not_report_more_than_the_range() {
    let (f, s) = store();
    let g = groups(1);
    s.put("k", b"0123456789", &cfg(&g)).unwrap();
    let mut dst = vec![0u8; 4];
    let mut read = |s: &RemoteStore| {
        let dest = MemoryRegion { address: dst.as_mut_ptr() as u64, len: 4, kind: MemoryKind::Host };
        // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
        let r = unsafe { s.get_into_ranges(&[RangeRead { key: "k", object_offset: 2, dest }]) };
        r.into_iter().next().unwrap()
    };
    assert_eq!(read(&s).unwrap(), 4);
    set(f, "get_into_ranges.item", i64::MAX); // len + 1
    expect_err(read(&s), ErrorKind::Store, &violation("get_into_ranges", "k", 5, "at most the 4 bytes of the range"));
    set(f, "get_into_ranges.item", 3);
    expect_err(read(&s), ErrorKind::Integrity, "short read of k at offset 2: 3 of 4 bytes");
    clear(f);
    set(f, "get_into_ranges", 1);
    expect_err(read(&s), ErrorKind::Store, &violation("get_into_ranges", "k", 1, BATCH));
    assert_eq!(&dst, b"2345");
}

#[test]
fn register_and_unregister_accept_only_zero_or_negative_codes() {
    let (f, s) = store();
    let buf = [0u8; 64];
    let region = MemoryRegion { address: buf.as_ptr() as u64, len: 64, kind: MemoryKind::Host };
    s.register_buffer(region).unwrap();
    s.unregister_buffer(region.address).unwrap();
    set(f, "register_buffer", 1);
    expect_err(s.register_buffer(region), ErrorKind::Store, &violation("register_buffer", "a buffer", 1, STATUS));
    set(f, "unregister_buffer", 4);
    expect_err(
        s.unregister_buffer(region.address),
        ErrorKind::Store,
        &violation("unregister_buffer", "a buffer", 4, STATUS),
    );
    set(f, "register_buffer", -2);
    expect_err(s.register_buffer(region), ErrorKind::Store, "store callback register_buffer failed: error code -2");
}

unsafe extern "C" fn get_cost(ctx: *mut c_void, out: *mut mws_store_cost) -> i32 {
    // SAFETY: the library passes back the `Fake` this test gave it and a live out-pointer.
    let f = unsafe { fake(ctx) };
    if let Some(code) = ov(f, "get_cost") {
        return code as i32;
    }
    let bw = ov(f, "get_cost.bandwidth").unwrap_or(7_000_000_000) as u64;
    // SAFETY: as above.
    unsafe { *out = mws_store_cost { per_request_ns: 1_000, per_range_ns: 2_000, bytes_per_second: bw } };
    0
}

fn open_with(vt: &mws_store_vtable, f: &'static Fake) -> Result<RemoteStore> {
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    unsafe { store_from_vtable(vt, f as *const Fake as *mut c_void) }
}

#[test]
fn get_cost_is_asked_once_at_open_and_validated() {
    // Absent: a remote, range-priced store is assumed.
    let (_, s) = store();
    assert_eq!(s.cost(), StoreCost::REMOTE);
    // Present: the backend's numbers.
    let f: &'static Fake = Box::leak(Box::default());
    let vt = mws_store_vtable { get_cost: Some(get_cost), ..vtable() };
    let s = open_with(&vt, f).unwrap();
    assert_eq!(s.cost(), StoreCost { per_request_ns: 1_000, per_range_ns: 2_000, bytes_per_second: 7_000_000_000 });
    // A failing or nonsensical answer refuses the open with a precise error.
    set(f, "get_cost", -600);
    expect_err(open_with(&vt, f).map(|_| ()), ErrorKind::Store, "store callback get_cost returned -600");
    clear(f);
    set(f, "get_cost.bandwidth", 0);
    expect_err(
        open_with(&vt, f).map(|_| ()),
        ErrorKind::InvalidArgument,
        "store cost bytes_per_second must be positive",
    );
}

#[test]
fn a_vtable_of_an_older_size_keeps_its_optional_entries() {
    // A caller built against the header before `get_cost` existed: `size` ends after
    // `batch_exists`. That entry is still used; `get_cost` is never read.
    let f: &'static Fake = Box::leak(Box::default());
    let mut vt = mws_store_vtable { get_cost: Some(get_cost), ..vtable() };
    vt.size = std::mem::offset_of!(mws_store_vtable, get_cost) as u32;
    set(f, "get_cost", -1); // would fail the open if it were called
    let s = open_with(&vt, f).unwrap();
    assert_eq!(s.cost(), StoreCost::REMOTE);
    // If the library fell back to per-key `exists`, these would be errors.
    set(f, "exists", -5);
    set(f, "batch_exists.item", 1);
    let r = s.batch_exists(&["a", "b"]);
    assert!(r.iter().all(|x| matches!(x, Ok(true))), "batch_exists was used: {r:?}");
}

/// A store whose vtable has `batch_get_size`, holding objects `a` (3 bytes) and `b` (0 bytes).
fn sized_store() -> (&'static Fake, RemoteStore) {
    let f: &'static Fake = Box::leak(Box::default());
    let vt = mws_store_vtable { batch_get_size: Some(batch_get_size), ..vtable() };
    let s = open_with(&vt, f).unwrap();
    let g = groups(1);
    s.put("a", b"aaa", &cfg(&g)).unwrap();
    s.put("b", b"", &cfg(&g)).unwrap();
    (f, s)
}

fn reset_calls(f: &Fake) {
    f.calls.lock().clear();
    f.batch_sizes.lock().clear();
}

#[test]
fn object_sizes_asks_batch_get_size_once_per_chunk_and_never_get_size() {
    let (f, s) = sized_store();
    let r = s.object_sizes(&["a", "b", "nope", "a"]);
    assert_eq!(r[0], Ok(3));
    assert_eq!(r[1], Ok(0));
    expect_err(r[2].clone(), ErrorKind::NotFound, "object not found: nope");
    assert_eq!(r[3], Ok(3));
    assert_eq!(calls(f, "batch_get_size"), 1);
    assert_eq!(calls(f, "get_size"), 0);
    assert_eq!(*f.batch_sizes.lock(), vec![4]);
    // The callee's value is passed through unchanged, whatever it is (>= 0).
    set(f, "batch_get_size.item", 1 << 60);
    assert_eq!(s.object_sizes(&["a"]), vec![Ok(1 << 60)]);
    set(f, "batch_get_size.item", i64::MAX);
    assert_eq!(s.object_sizes(&["a"]), vec![Ok(i64::MAX as u64)]);
    clear(f);
    // Many keys: chunks of at most 1024 keys, results in key order.
    reset_calls(f);
    let keys: Vec<&str> = (0..2500).map(|i| if i % 2 == 0 { "a" } else { "b" }).collect();
    let r = s.object_sizes(&keys);
    assert_eq!(r.len(), 2500);
    assert!(r.iter().enumerate().all(|(i, x)| *x == Ok(if i % 2 == 0 { 3 } else { 0 })), "{r:?}");
    assert_eq!(*f.batch_sizes.lock(), vec![1024, 1024, 452]);
    assert_eq!(calls(f, "get_size"), 0);
    // No keys: no call.
    reset_calls(f);
    assert!(s.object_sizes(&[]).is_empty());
    assert_eq!(calls(f, "batch_get_size"), 0);
}

#[test]
fn batch_get_size_codes_keep_their_meaning() {
    let (f, s) = sized_store();
    set(f, "batch_get_size.item", -3);
    let r = s.object_sizes(&["a", "b"]);
    expect_err(r[0].clone(), ErrorKind::Store, "store callback batch_get_size failed for a: error code -3");
    expect_err(r[1].clone(), ErrorKind::Store, "store callback batch_get_size failed for b: error code -3");
    set(f, "batch_get_size.item", -704);
    expect_err(s.object_sizes(&["a"]).remove(0), ErrorKind::NotFound, "object not found: a");
    // A key left unwritten is an error naming it, never a size.
    set(f, "batch_get_size.item", i64::MIN);
    let r = s.object_sizes(&["a", "b"]);
    expect_err(r[0].clone(), ErrorKind::Store, "store callback batch_get_size left no result for a");
    expect_err(r[1].clone(), ErrorKind::Store, "store callback batch_get_size left no result for b");
    clear(f);
    // A positive batch status is a violation for every key, even with sizes written.
    set(f, "batch_get_size", 1);
    let r = s.object_sizes(&["a", "b"]);
    expect_err(r[0].clone(), ErrorKind::Store, &violation("batch_get_size", "a", 1, BATCH));
    expect_err(r[1].clone(), ErrorKind::Store, &violation("batch_get_size", "b", 1, BATCH));
    // A negative batch status is every key's error, even with sizes written.
    set(f, "batch_get_size", -9);
    let r = s.object_sizes(&["a", "b"]);
    expect_err(r[0].clone(), ErrorKind::Store, "store callback batch_get_size failed for a: error code -9");
    expect_err(r[1].clone(), ErrorKind::Store, "store callback batch_get_size failed for b: error code -9");
    set(f, "batch_get_size", -704);
    expect_err(s.object_sizes(&["a"]).remove(0), ErrorKind::NotFound, "object not found: a");
    assert_eq!(calls(f, "get_size"), 0);
}

#[test]
fn batch_get_size_transient_codes_fall_back_to_get_size_per_key() {
    let (f, s) = sized_store();
    // Per key -200 / -706: that key is asked again with get_size (with its retries).
    for code in [-200, -706] {
        reset_calls(f);
        set(f, "batch_get_size.item", code);
        assert_eq!(s.object_sizes(&["a", "b", "nope"])[..2], [Ok(3), Ok(0)]);
        expect_err(s.object_sizes(&["nope"]).remove(0), ErrorKind::NotFound, "object not found: nope");
        assert_eq!(calls(f, "batch_get_size"), 2);
        assert_eq!(calls(f, "get_size"), 4);
    }
    clear(f);
    // A transient batch status: every key through get_size.
    reset_calls(f);
    set(f, "batch_get_size", -706);
    assert_eq!(s.object_sizes(&["a", "b"]), vec![Ok(3), Ok(0)]);
    assert_eq!(calls(f, "get_size"), 2);
    // The fallback's own errors are get_size's.
    set(f, "get_size", -3);
    expect_err(
        s.object_sizes(&["a"]).remove(0),
        ErrorKind::Store,
        "store callback get_size failed for a: error code -3",
    );
}

#[test]
fn object_sizes_without_batch_get_size_asks_get_size_per_key() {
    // NULL callback.
    let (f, s) = store();
    let g = groups(1);
    s.put("a", b"aaa", &cfg(&g)).unwrap();
    let r = s.object_sizes(&["a", "nope"]);
    assert_eq!(r[0], Ok(3));
    expect_err(r[1].clone(), ErrorKind::NotFound, "object not found: nope");
    assert_eq!(calls(f, "get_size"), 2);
    // A vtable whose `size` ends before `batch_get_size`: the field is never read.
    let f: &'static Fake = Box::leak(Box::default());
    let mut vt = mws_store_vtable { batch_get_size: Some(batch_get_size), ..vtable() };
    vt.size = std::mem::offset_of!(mws_store_vtable, batch_get_size) as u32;
    let s = open_with(&vt, f).unwrap();
    s.put("a", b"aaa", &cfg(&g)).unwrap();
    set(f, "batch_get_size.item", -3); // would be an error if it were called
    assert_eq!(s.object_sizes(&["a", "a"]), vec![Ok(3), Ok(3)]);
    assert_eq!(calls(f, "batch_get_size"), 0);
    assert_eq!(calls(f, "get_size"), 2);
}
