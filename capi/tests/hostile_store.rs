//! Issue 14, items 1 and 2: hostile store content never aborts the process and never
//! leads a read or write outside the directory store's root.
//!
//! * sizes: a vtable reporting 2^60 bytes, a sparse 8 TiB file, a `/dev/zero` link
//!   and a FIFO at the manifest key each give a precise error (kind and message);
//! * links: directory and file links planted at every level below the root (the
//!   root's `objects/` and `tmp/`, an intermediate key segment, the object file,
//!   dangling links) make every operation on the key fail alike, and nothing outside
//!   the root is read, written or removed.

use crate::test_model as model;

use crate::callbacks::store::store_from_vtable;
use crate::{
    mws_bytes, mws_last_error_message, mws_put_item, mws_range_item, mws_status, mws_store, mws_store_free,
    mws_store_from_vtable, mws_store_get, mws_store_open_dir, mws_store_vtable, mws_stored_manifest,
    mws_stored_manifest_free, mws_stored_manifest_from_store, MWS_STORE_VTABLE_VERSION,
};
use model::*;
use mws::protocol::{load_manifest, StoreLimits, WeightStore};
use mws::runtime::MemoryRegion;
use mws::store::directory::DirectoryStore;
use mws::store::{ObjectStore, PutFrom, RangeRead, RecordType, WriteConfig, DEFAULT_MAX_METADATA_BYTES};
use mws::{ErrorKind, MemoryKind, Result};
use std::ffi::{c_void, CStr, CString};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- fixtures ------------------------------------------------------------------------

/// A temporary directory removed on drop (`remove_dir_all` never follows links).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "mws-hostile-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn groups() -> Vec<String> {
    vec!["g".to_string()]
}

fn meta(g: &[String]) -> WriteConfig<'_> {
    WriteConfig { group_ids: g, record_type: RecordType::Metadata }
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, text: &str) -> String {
    match r {
        Ok(v) => panic!("expected {kind:?} containing {text:?}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.message().contains(text), "message {:?} lacks {text:?}", e.message());
            e.message().to_string()
        }
    }
}

fn last_error() -> String {
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    unsafe { CStr::from_ptr(mws_last_error_message()) }.to_string_lossy().into_owned()
}

/// Every file and directory below `dir` with its contents (links listed, not followed).
fn snapshot_tree(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<(PathBuf, Option<Vec<u8>>)>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.push((p.clone(), None));
                walk(&p, out);
            } else if m.is_file() {
                out.push((p.clone(), Some(std::fs::read(&p).unwrap())));
            } else {
                out.push((p.clone(), None));
            }
        }
    }
    walk(dir, &mut out);
    out.sort();
    out
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// A small snapshot in `root` (returns the manifest key and the manifest's file).
fn snapshot_in(root: &Path) -> (String, PathBuf) {
    let store = Arc::new(DirectoryStore::open(root).unwrap());
    let ws = WeightStore::new(store.clone());
    let defs = model_tensors(1, 32, 0);
    let src = HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let m = src.snapshot_into(&ws).unwrap();
    let key = m.manifest_key().to_string();
    let path = store.object_path(&key).unwrap();
    (key, path)
}

// ---- item 1: sizes ---------------------------------------------------------------

const HUGE: i64 = 1 << 60;

unsafe extern "C" fn huge_put(_: *mut c_void, _: mws_bytes, _: *const u8, _: u64, _: mws_bytes, _: u32) -> i32 {
    0
}
unsafe extern "C" fn huge_get_size(_: *mut c_void, _: mws_bytes) -> i64 {
    HUGE
}
unsafe extern "C" fn huge_get_into(_: *mut c_void, _: mws_bytes, _: *mut u8, _: u64) -> i64 {
    -600 // buffer too small: the object is "larger"
}
unsafe extern "C" fn huge_exists(_: *mut c_void, _: mws_bytes) -> i32 {
    1
}
unsafe extern "C" fn huge_remove(_: *mut c_void, _: mws_bytes) -> i32 {
    0
}
unsafe extern "C" fn huge_batch_put(_: *mut c_void, _: *const mws_put_item, _: usize, _: u32, r: *mut i32) -> i32 {
    let _ = r;
    -1
}
unsafe extern "C" fn huge_ranges(_: *mut c_void, _: *const mws_range_item, _: usize, _: *mut i64) -> i32 {
    -1
}

fn huge_vtable() -> mws_store_vtable {
    mws_store_vtable {
        size: std::mem::size_of::<mws_store_vtable>() as u32,
        version: MWS_STORE_VTABLE_VERSION,
        put: Some(huge_put),
        upsert: Some(huge_put),
        get_size: Some(huge_get_size),
        get_into: Some(huge_get_into),
        exists: Some(huge_exists),
        remove: Some(huge_remove),
        batch_put_from: Some(huge_batch_put),
        get_into_ranges: Some(huge_ranges),
        register_buffer: None,
        unregister_buffer: None,
        destroy: None,
        batch_exists: None,
        list: None,
        get_cost: None,
        batch_get_size: None,
    }
}

#[test]
fn vtable_reporting_2_pow_60_bytes_is_an_error_not_an_abort() {
    let vt = huge_vtable();
    let mut s: *mut mws_store = std::ptr::null_mut();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { mws_store_from_vtable(&vt, std::ptr::null_mut(), &mut s) }, mws_status::MWS_OK);
    let key = c"weights/default/r/manifest";

    // mws_stored_manifest_from_store: bounded by the metadata limit, nothing allocated.
    let mut m: *mut mws_stored_manifest = std::ptr::null_mut();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { mws_stored_manifest_from_store(s, key.as_ptr(), &mut m) }, mws_status::MWS_LIMIT_EXCEEDED);
    assert!(m.is_null());
    assert_eq!(
        last_error(),
        format!(
            "mws_stored_manifest_from_store: manifest get failed: weights/default/r/manifest: object weights/default/r/manifest holds {HUGE} bytes, \
             more than the limit of {DEFAULT_MAX_METADATA_BYTES} bytes"
        )
    );

    // mws_store_get: the length query reports the size; a read never allocates more
    // than the caller's buffer.
    let mut len = 0usize;
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { mws_store_get(s, key.as_ptr(), std::ptr::null_mut(), 0, &mut len) }, mws_status::MWS_OK);
    assert_eq!(len as i64, HUGE);
    let mut buf = vec![0u8; 4096];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let st = unsafe { mws_store_get(s, key.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(st, mws_status::MWS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        format!("mws_store_get: buffer of 4096 bytes is too small for weights/default/r/manifest ({HUGE} bytes)")
    );
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    unsafe { mws_store_free(s) };

    // The Rust API: an unbounded get fails to allocate (try_reserve), a bounded one
    // refuses before allocating.
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let cs = unsafe { store_from_vtable(&vt, std::ptr::null_mut()) }.unwrap();
    expect_err(cs.get("k"), ErrorKind::LimitExceeded, &format!("cannot allocate {HUGE} bytes to read object k"));
    expect_err(cs.get_limited("k", 1 << 20), ErrorKind::LimitExceeded, "object k holds 1152921504606846976 bytes");
    let ws = WeightStore::new(Arc::new(cs));
    expect_err(ws.load_manifest("k"), ErrorKind::LimitExceeded, "more than the limit of 268435456 bytes");
}

#[test]
fn sparse_8_tib_manifest_file_is_refused_before_reading() {
    let dir = TempDir::new("sparse");
    let root = dir.path().join("store");
    let (key, path) = snapshot_in(&root);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let size: u64 = 8 << 40;
    file.set_len(size).unwrap(); // ftruncate: sparse, nothing allocated on disk
    drop(file);
    let store = Arc::new(DirectoryStore::open(&root).unwrap());
    assert_eq!(store.object_size(&key).unwrap(), size);
    let t = Instant::now();
    let want = format!("object {key} holds {size} bytes, more than the limit of {DEFAULT_MAX_METADATA_BYTES} bytes");
    let msg = expect_err(load_manifest(&*store, &key), ErrorKind::LimitExceeded, &want);
    assert_eq!(msg, format!("manifest get failed: {key}: {want}"));
    expect_err(store.get_limited(&key, 1 << 30), ErrorKind::LimitExceeded, "more than the limit of 1073741824 bytes");
    // A configured limit applies to the weight store's reads.
    let small = StoreLimits { max_metadata_bytes: 1000, ..StoreLimits::default() };
    let ws = WeightStore::new(store.clone()).with_limits(small).unwrap();
    expect_err(ws.load_manifest(&key), ErrorKind::LimitExceeded, "more than the limit of 1000 bytes");
    assert!(t.elapsed() < Duration::from_secs(10), "the refusals read nothing");

    // Through the C ABI (directory store).
    let c_root = CString::new(root.to_str().unwrap()).unwrap();
    let c_key = CString::new(key.as_str()).unwrap();
    let mut s: *mut mws_store = std::ptr::null_mut();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { mws_store_open_dir(c_root.as_ptr(), std::ptr::null(), &mut s) }, mws_status::MWS_OK);
    let mut m: *mut mws_stored_manifest = std::ptr::null_mut();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert_eq!(unsafe { mws_stored_manifest_from_store(s, c_key.as_ptr(), &mut m) }, mws_status::MWS_LIMIT_EXCEEDED);
    assert_eq!(last_error(), format!("mws_stored_manifest_from_store: manifest get failed: {key}: {want}"));
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0usize;
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let st = unsafe { mws_store_get(s, c_key.as_ptr(), buf.as_mut_ptr(), buf.len(), &mut len) };
    assert_eq!(st, mws_status::MWS_INVALID_ARGUMENT);
    assert_eq!(last_error(), format!("mws_store_get: buffer of 65536 bytes is too small for {key} ({size} bytes)"));
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    unsafe { mws_store_free(s) };
    if !m.is_null() {
        // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
        unsafe { mws_stored_manifest_free(m) };
    }
}

#[test]
fn dev_zero_link_at_the_manifest_key_is_refused() {
    let dir = TempDir::new("zero");
    let root = dir.path().join("store");
    let (key, path) = snapshot_in(&root);
    std::fs::remove_file(&path).unwrap();
    symlink("/dev/zero", &path).unwrap();
    let store = DirectoryStore::open(&root).unwrap();
    let rel = path.strip_prefix(store.root()).unwrap().to_str().unwrap().to_string();
    let want = format!(
        "directory store entry {rel} of key {key} is a symbolic link (links below the store root are never followed)"
    );
    let t = Instant::now();
    let msg = expect_err(load_manifest(&store, &key), ErrorKind::Io, &want);
    assert_eq!(msg, format!("manifest get failed: {key}: {want}"));
    assert_eq!(expect_err(store.get(&key), ErrorKind::Io, &want), want);
    expect_err(store.exists(&key), ErrorKind::Io, &want);
    expect_err(store.object_size(&key), ErrorKind::Io, &want);
    assert!(t.elapsed() < Duration::from_secs(10), "nothing was read from /dev/zero");
}

#[test]
fn fifo_at_the_manifest_key_is_refused_without_blocking() {
    let dir = TempDir::new("fifo");
    let root = dir.path().join("store");
    let (key, path) = snapshot_in(&root);
    std::fs::remove_file(&path).unwrap();
    mkfifo(&path);
    let store = DirectoryStore::open(&root).unwrap();
    let rel = path.strip_prefix(store.root()).unwrap().to_str().unwrap().to_string();
    let want = format!("directory store entry {rel} of key {key} is not a regular file (FIFO, socket or device)");
    let t = Instant::now();
    let msg = expect_err(load_manifest(&store, &key), ErrorKind::Io, &want);
    assert_eq!(msg, format!("manifest get failed: {key}: {want}"));
    expect_err(store.get(&key), ErrorKind::Io, &want);
    expect_err(store.exists(&key), ErrorKind::Io, &want);
    let mut dst = vec![0u8; 4];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe {
        store.get_into_ranges(&[RangeRead {
            key: &key,
            object_offset: 0,
            dest: MemoryRegion { address: dst.as_mut_ptr() as u64, len: 4, kind: MemoryKind::Host },
        }])
    };
    expect_err(r.into_iter().next().unwrap(), ErrorKind::Io, &want);
    assert!(t.elapsed() < Duration::from_secs(10), "opening the FIFO did not wait for a writer");
}

// ---- item 2: links ---------------------------------------------------------------

/// Runs every operation on `key` and asserts each fails with the message `want`
/// (the same for all), and that `outside` is unchanged.
fn all_refuse(store: &DirectoryStore, key: &str, want: &str, outside: &Path) {
    let before = snapshot_tree(outside);
    let g = groups();
    let src = b"payload bytes".to_vec();
    let mut dst = vec![0u8; 4];
    expect_err(store.exists(key), ErrorKind::Io, want);
    expect_err(store.get(key), ErrorKind::Io, want);
    expect_err(store.get_limited(key, 1 << 20), ErrorKind::Io, want);
    expect_err(store.object_size(key), ErrorKind::Io, want);
    expect_err(store.put(key, b"value", &meta(&g)), ErrorKind::Io, want);
    expect_err(store.upsert(key, b"value", &meta(&g)), ErrorKind::Io, want);
    expect_err(store.remove(key), ErrorKind::Io, want);
    let item = PutFrom { key, source: MemoryRegion { address: src.as_ptr() as u64, len: 13, kind: MemoryKind::Host } };
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe { store.batch_put_from(&[item], &WriteConfig { group_ids: &g, record_type: RecordType::Payload }) };
    expect_err(r.into_iter().next().unwrap(), ErrorKind::Io, want);
    let range = RangeRead {
        key,
        object_offset: 0,
        dest: MemoryRegion { address: dst.as_mut_ptr() as u64, len: 4, kind: MemoryKind::Host },
    };
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let r = unsafe { store.get_into_ranges(&[range]) };
    expect_err(r.into_iter().next().unwrap(), ErrorKind::Io, want);
    assert_eq!(dst, vec![0u8; 4], "nothing read");
    assert_eq!(snapshot_tree(outside), before, "nothing outside the root changed");
}

fn link_msg(rel: &str, key: &str) -> String {
    format!(
        "directory store entry {rel} of key {key} is a symbolic link (links below the store root are never followed)"
    )
}

/// An "outside" directory with a file the links point at.
fn outside(dir: &TempDir) -> PathBuf {
    let out = dir.path().join("outside");
    std::fs::create_dir_all(out.join("d.s")).unwrap();
    std::fs::write(out.join("f.s"), b"secret outside the root").unwrap();
    std::fs::write(out.join("d.s").join("f.t"), b"deeper secret").unwrap();
    out
}

#[test]
fn links_as_objects_or_tmp_directory_are_refused_at_open() {
    for sub in ["objects", "tmp"] {
        let dir = TempDir::new("rootlinks");
        let out = outside(&dir);
        let root = dir.path().join("store");
        std::fs::create_dir_all(&root).unwrap();
        symlink(&out, root.join(sub)).unwrap();
        let before = snapshot_tree(&out);
        let e = DirectoryStore::open(&root).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(
            e.message(),
            format!(
                "cannot open directory store {}: {sub} is not a directory (a symbolic link or a file); refusing to use it",
                root.display()
            )
        );
        assert_eq!(snapshot_tree(&out), before);
    }
}

#[test]
fn directory_link_at_an_intermediate_segment_is_never_followed() {
    let dir = TempDir::new("midlink");
    let out = outside(&dir);
    let store = DirectoryStore::open(dir.path().join("store")).unwrap();
    let g = groups();
    // First segment (directly in objects/) and a deeper one.
    std::fs::create_dir_all(store.root().join("objects/d.a")).unwrap();
    symlink(&out, store.root().join("objects/d.k")).unwrap();
    symlink(&out, store.root().join("objects/d.a/d.b")).unwrap();
    // Relative link, as in the issue (`objects/d.weights -> ../outside`).
    symlink("../../outside", store.root().join("objects/d.weights")).unwrap();
    for (key, rel) in [
        ("k/s", "objects/d.k"),
        ("k/s/t", "objects/d.k"),
        ("a/b/s", "objects/d.a/d.b"),
        ("a/b/s/t", "objects/d.a/d.b"),
        ("weights/s", "objects/d.weights"),
    ] {
        all_refuse(&store, key, &link_msg(rel, key), &out);
    }
    // Keys beside the links still work.
    store.put("a/c", b"fine", &meta(&g)).unwrap();
    assert_eq!(store.get("a/c").unwrap(), b"fine");
}

/// A directory this store handle already created (and knows durable) replaced by a
/// link afterwards: the one-call resolution (`openat2`) refuses the link and the
/// component walk reports it exactly, for writes as for reads.
#[test]
fn directory_replaced_by_a_link_after_use_is_never_followed() {
    let dir = TempDir::new("latelink");
    let out = outside(&dir);
    let store = DirectoryStore::open(dir.path().join("store")).unwrap();
    let g = groups();
    store.put("a/b/first", b"written before", &meta(&g)).unwrap();
    assert_eq!(store.get("a/b/first").unwrap(), b"written before");
    let b = store.root().join("objects/d.a/d.b");
    std::fs::rename(&b, store.root().join("moved-away")).unwrap();
    symlink(&out, &b).unwrap();
    for key in ["a/b/s", "a/b/first", "a/b/s/t"] {
        all_refuse(&store, key, &link_msg("objects/d.a/d.b", key), &out);
    }
    // The real directory back in place: the store works there again.
    std::fs::remove_file(&b).unwrap();
    std::fs::rename(store.root().join("moved-away"), &b).unwrap();
    assert_eq!(store.get("a/b/first").unwrap(), b"written before");
    store.put("a/b/second", b"after", &meta(&g)).unwrap();
    assert_eq!(store.get("a/b/second").unwrap(), b"after");
}

#[test]
fn file_link_at_the_object_is_never_followed() {
    let dir = TempDir::new("filelink");
    let out = outside(&dir);
    let store = DirectoryStore::open(dir.path().join("store")).unwrap();
    let g = groups();
    store.put("k/other", b"x", &meta(&g)).unwrap();
    symlink(out.join("f.s"), store.root().join("objects/d.k/f.s")).unwrap();
    symlink(out.join("missing"), store.root().join("objects/d.k/f.dangling")).unwrap();
    symlink(out.join("f.s"), store.root().join("objects/f.top")).unwrap();
    all_refuse(&store, "k/s", &link_msg("objects/d.k/f.s", "k/s"), &out);
    all_refuse(&store, "k/dangling", &link_msg("objects/d.k/f.dangling", "k/dangling"), &out);
    all_refuse(&store, "top", &link_msg("objects/f.top", "top"), &out);
    assert!(!out.join("missing").exists(), "a dangling link's target was never created");
    // The links are still there (remove refused them too) and other keys work.
    assert!(std::fs::symlink_metadata(store.root().join("objects/d.k/f.s")).unwrap().file_type().is_symlink());
    assert_eq!(store.get("k/other").unwrap(), b"x");
}

#[test]
fn file_and_fifo_where_a_directory_belongs_are_refused_alike() {
    let dir = TempDir::new("wrongtype");
    let out = outside(&dir);
    let store = DirectoryStore::open(dir.path().join("store")).unwrap();
    std::fs::write(store.root().join("objects/d.k"), b"not a directory").unwrap();
    let want = "directory store entry objects/d.k of key k/s is a regular file, not a directory";
    all_refuse(&store, "k/s", want, &out);
    std::fs::create_dir_all(store.root().join("objects/d.x/f.dir")).unwrap();
    all_refuse(&store, "x/dir", "directory store entry objects/d.x/f.dir of key x/dir is a directory", &out);
    mkfifo(&store.root().join("objects/d.x/f.fifo"));
    let want = "directory store entry objects/d.x/f.fifo of key x/fifo is not a regular file (FIFO, socket or device)";
    all_refuse(&store, "x/fifo", want, &out);
}

#[test]
fn snapshot_through_a_planted_directory_link_writes_nothing_outside() {
    let dir = TempDir::new("snaplink");
    let out = dir.path().join("outside");
    std::fs::create_dir_all(&out).unwrap();
    let root = dir.path().join("store");
    let store = Arc::new(DirectoryStore::open(&root).unwrap());
    symlink("../../outside", root.join("objects/d.weights")).unwrap();
    let ws = WeightStore::new(store.clone());
    let defs = model_tensors(1, 32, 0);
    let src = HostModel::new(build_placement("src", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "t", 1);
    let e = src.snapshot_into(&ws).unwrap_err();
    // The first key the snapshot touches is the decision record (read as "upload
    // decision read failed", a store error); the abort that follows fails alike.
    assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    assert!(e.message().contains("directory store entry objects/d.weights of key weights/"), "{e}");
    assert!(e.message().contains("is a symbolic link"), "{e}");
    assert_eq!(snapshot_tree(&out), Vec::new(), "nothing was written outside the root");
}

#[test]
fn clean_temp_removes_only_regular_temporary_files() {
    let dir = TempDir::new("cleantmp");
    let out = outside(&dir);
    let store = DirectoryStore::open(dir.path().join("store")).unwrap();
    let tmp = store.root().join("tmp");
    std::fs::write(tmp.join("1.2.3.tmp"), b"stale").unwrap();
    symlink(out.join("f.s"), tmp.join("4.5.6.tmp")).unwrap();
    std::fs::create_dir(tmp.join("7.8.9.tmp")).unwrap();
    let before = snapshot_tree(&out);
    assert_eq!(store.clean_temp().unwrap(), 1);
    assert!(!tmp.join("1.2.3.tmp").exists());
    assert!(std::fs::symlink_metadata(tmp.join("4.5.6.tmp")).is_ok(), "a link in tmp/ is left alone");
    assert_eq!(snapshot_tree(&out), before);
}

#[test]
fn open_writes_a_marker_that_identifies_the_store() {
    let dir = TempDir::new("marker");
    let root = dir.path().join("store");
    assert!(!DirectoryStore::is_store_root(&root).unwrap(), "missing");
    let store = DirectoryStore::open(&root).unwrap();
    assert!(DirectoryStore::is_store_root(&root).unwrap());
    store.put("a/b", b"v", &meta(&groups())).unwrap();
    assert!(DirectoryStore::is_store_root(&root).unwrap(), "objects do not change the root");
    std::fs::write(root.join("notes.txt"), b"mine").unwrap();
    assert!(!DirectoryStore::is_store_root(&root).unwrap(), "a foreign file makes it not (only) a store");
    std::fs::remove_file(root.join("notes.txt")).unwrap();
    std::fs::write(root.join(mws::store::directory::STORE_MARKER), b"forged").unwrap();
    assert!(!DirectoryStore::is_store_root(&root).unwrap(), "a marker with other content");
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(plain.join("objects")).unwrap();
    std::fs::create_dir_all(plain.join("tmp")).unwrap();
    assert!(!DirectoryStore::is_store_root(&plain).unwrap(), "objects/ and tmp/ alone are not a marker");
}
