//! The store contract (`store-protocol.md` §1), checked against both embedded
//! backends through the same generic functions, plus backend-specific checks
//! (directory: key mapping and hostile keys; memory: recorded groups).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use mooncake_weight_store::runtime::MemoryRegion;
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::memory::MemoryStore;
use mooncake_weight_store::store::{ObjectStore, PutFrom, RangeRead, RecordType, WriteConfig};
use mooncake_weight_store::{Error, ErrorKind, MemoryKind, Result};

// ---- fixtures ------------------------------------------------------------------------

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "mws-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
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

struct Fixture<S> {
    store: S,
    _dir: Option<TempDir>,
}

fn memory() -> Fixture<MemoryStore> {
    Fixture { store: MemoryStore::new(), _dir: None }
}

fn directory() -> Fixture<DirectoryStore> {
    let dir = TempDir::new("dirstore");
    let root = dir.path().join("store");
    Fixture { store: DirectoryStore::open(&root).unwrap(), _dir: Some(dir) }
}

fn groups(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("g{i}")).collect()
}

fn cfg(g: &[String]) -> WriteConfig<'_> {
    WriteConfig { group_ids: g, record_type: RecordType::Payload }
}

fn host(buf: &[u8]) -> MemoryRegion {
    MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host }
}

fn host_mut(buf: &mut [u8]) -> MemoryRegion {
    MemoryRegion { address: buf.as_mut_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[track_caller]
fn assert_kind<T: std::fmt::Debug>(r: &Result<T>, kind: ErrorKind) -> Error {
    match r {
        Err(e) if e.kind() == kind => e.clone(),
        other => panic!("expected {kind:?}, got {other:?}"),
    }
}

// ---- the contract, generic over the backend -------------------------------------------

fn create_only_put<S: ObjectStore>(s: &S) {
    let g = groups(1);
    s.put("t/k", b"first", &cfg(&g)).unwrap();
    let e = assert_kind(&s.put("t/k", b"second value", &cfg(&g)), ErrorKind::AlreadyExists);
    assert!(e.message().contains("t/k"), "{e}");
    assert_eq!(s.get("t/k").unwrap(), b"first");
    // An empty value is a value.
    s.put("t/empty", b"", &cfg(&g)).unwrap();
    assert_eq!(s.get("t/empty").unwrap(), b"");
    assert!(s.exists("t/empty").unwrap());
    assert_kind(&s.put("t/empty", b"x", &cfg(&g)), ErrorKind::AlreadyExists);
    assert_eq!(s.get("t/empty").unwrap(), b"");
}

fn upsert_replaces<S: ObjectStore>(s: &S) {
    let g = groups(1);
    s.upsert("u/k", b"one", &cfg(&g)).unwrap();
    assert_eq!(s.get("u/k").unwrap(), b"one");
    s.upsert("u/k", b"two, longer", &cfg(&g)).unwrap();
    assert_eq!(s.get("u/k").unwrap(), b"two, longer");
    s.upsert("u/k", b"3", &cfg(&g)).unwrap();
    assert_eq!(s.get("u/k").unwrap(), b"3");
    assert_kind(&s.put("u/k", b"four", &cfg(&g)), ErrorKind::AlreadyExists);
    assert_eq!(s.get("u/k").unwrap(), b"3");
}

fn get_exists_remove<S: ObjectStore>(s: &S) {
    let g = groups(1);
    let e = assert_kind(&s.get("r/k"), ErrorKind::NotFound);
    assert!(e.message().contains("r/k"), "{e}");
    assert!(!s.exists("r/k").unwrap());
    s.remove("r/k").unwrap(); // absent is fine
    s.put("r/k", b"v", &cfg(&g)).unwrap();
    assert!(s.exists("r/k").unwrap());
    assert_eq!(
        s.batch_exists(&["r/k", "r/other", "r/k"]).into_iter().map(|r| r.unwrap()).collect::<Vec<_>>(),
        vec![true, false, true]
    );
    s.remove("r/k").unwrap();
    assert!(!s.exists("r/k").unwrap());
    assert_kind(&s.get("r/k"), ErrorKind::NotFound);
    s.remove("r/k").unwrap();
    // Create-only put works again after a remove.
    s.put("r/k", b"again", &cfg(&g)).unwrap();
    assert_eq!(s.get("r/k").unwrap(), b"again");
}

fn batch_put_from_host<S: ObjectStore>(s: &S) {
    s.put("b/existing", b"keep me", &cfg(&groups(1))).unwrap();
    let a = pattern(1, 1000);
    let b = pattern(2, 70_000);
    let empty: Vec<u8> = Vec::new();
    let items = [
        PutFrom { key: "b/a", source: host(&a) },
        PutFrom { key: "b/existing", source: host(&b) },
        PutFrom { key: "b/b", source: host(&b) },
        PutFrom { key: "b/null", source: MemoryRegion { address: 0, len: 5, kind: MemoryKind::Host } },
        PutFrom { key: "b/empty", source: host(&empty) },
    ];
    let g = groups(items.len());
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    assert_eq!(res.len(), items.len());
    assert!(res[0].is_ok(), "{:?}", res[0]);
    assert_kind(&res[1], ErrorKind::AlreadyExists);
    assert!(res[2].is_ok(), "{:?}", res[2]);
    assert_kind(&res[3], ErrorKind::InvalidArgument);
    assert!(res[4].is_ok(), "{:?}", res[4]);
    assert_eq!(s.get("b/a").unwrap(), a);
    assert_eq!(s.get("b/b").unwrap(), b);
    assert_eq!(s.get("b/existing").unwrap(), b"keep me");
    assert!(!s.exists("b/null").unwrap());
    assert_eq!(s.get("b/empty").unwrap(), b"");
}

/// Large batches (the directory backend spreads them over threads): results stay in
/// item order, one bad item fails alone.
fn large_batches<S: ObjectStore>(s: &S) {
    const N: usize = 7;
    s.put("l/3", b"taken", &cfg(&groups(1))).unwrap();
    let vals: Vec<Vec<u8>> = (0..N).map(|i| pattern(i as u8, (2 << 20) + i)).collect();
    let keys: Vec<String> = (0..N).map(|i| format!("l/{i}")).collect();
    let items: Vec<PutFrom> = keys.iter().zip(&vals).map(|(k, v)| PutFrom { key: k, source: host(v) }).collect();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.batch_put_from(&items, &cfg(&groups(N))) };
    for (i, r) in res.iter().enumerate() {
        if i == 3 {
            assert_kind(r, ErrorKind::AlreadyExists);
        } else {
            assert!(r.is_ok(), "{i}: {r:?}");
        }
    }
    assert_eq!(s.get("l/3").unwrap(), b"taken");
    let total: usize = vals.iter().map(Vec::len).sum();
    let mut dst = vec![0x5Au8; total];
    let base = dst.as_mut_ptr() as u64;
    let mut off = 0u64;
    let ranges: Vec<RangeRead> = (0..N)
        .rev()
        .map(|i| {
            let len = if i == 3 { 10 } else { vals[i].len() as u64 };
            let r = RangeRead {
                key: &keys[i],
                object_offset: 0,
                dest: MemoryRegion { address: base + off, len, kind: MemoryKind::Host },
            };
            off += vals[i].len() as u64;
            r
        })
        .collect();
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.get_into_ranges(&ranges) };
    let mut off = 0usize;
    for (j, i) in (0..N).rev().enumerate() {
        if i == 3 {
            assert_kind(&res[j], ErrorKind::Integrity); // "taken" is 5 bytes
            assert!(dst[off..off + vals[i].len()].iter().all(|&b| b == 0x5A));
        } else {
            assert_eq!(*res[j].as_ref().unwrap(), vals[i].len() as u64);
            assert!(dst[off..off + vals[i].len()] == vals[i][..], "range {j}");
        }
        off += vals[i].len();
    }
}

fn batch_put_from_group_count<S: ObjectStore>(s: &S) {
    let a = pattern(3, 10);
    let items = [PutFrom { key: "c/a", source: host(&a) }, PutFrom { key: "c/b", source: host(&a) }];
    let g = groups(1);
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    assert_eq!(res.len(), 2);
    for r in &res {
        assert_kind(r, ErrorKind::InvalidArgument);
    }
    assert!(!s.exists("c/a").unwrap() && !s.exists("c/b").unwrap());
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    assert!(unsafe { s.batch_put_from(&[], &cfg(&[])) }.is_empty());
}

fn get_into_ranges_host<S: ObjectStore>(s: &S) {
    let g = groups(1);
    let x = pattern(7, 1000);
    let y = pattern(9, 300);
    s.put("g/x", &x, &cfg(&g)).unwrap();
    s.put("g/y", &y, &cfg(&g)).unwrap();
    let mut dst = vec![0xEEu8; 2000];
    let base = dst.as_mut_ptr() as u64;
    let at = |off: u64, len: u64| MemoryRegion { address: base + off, len, kind: MemoryKind::Host };
    let ranges = [
        RangeRead { key: "g/x", object_offset: 0, dest: at(0, 100) },
        RangeRead { key: "g/y", object_offset: 10, dest: at(100, 290) },
        RangeRead { key: "g/x", object_offset: 900, dest: at(400, 100) },
        RangeRead { key: "g/missing", object_offset: 0, dest: at(500, 10) },
        RangeRead { key: "g/x", object_offset: 1000, dest: at(600, 0) },
        RangeRead { key: "g/x", object_offset: 0, dest: at(1000, 1000) },
    ];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.get_into_ranges(&ranges) };
    assert_eq!(res.len(), ranges.len());
    assert_eq!(*res[0].as_ref().unwrap(), 100);
    assert_eq!(*res[1].as_ref().unwrap(), 290);
    assert_eq!(*res[2].as_ref().unwrap(), 100);
    let e = assert_kind(&res[3], ErrorKind::NotFound);
    assert!(e.message().contains("g/missing"), "{e}");
    assert_eq!(*res[4].as_ref().unwrap(), 0);
    assert_eq!(*res[5].as_ref().unwrap(), 1000);
    let mut want = vec![0xEEu8; 2000];
    want[0..100].copy_from_slice(&x[0..100]);
    want[100..390].copy_from_slice(&y[10..300]);
    want[400..500].copy_from_slice(&x[900..1000]);
    want[1000..2000].copy_from_slice(&x);
    assert!(dst == want, "destination bytes differ");
}

fn out_of_range_read<S: ObjectStore>(s: &S) {
    let g = groups(1);
    s.put("o/x", &pattern(5, 100), &cfg(&g)).unwrap();
    let mut dst = vec![0xABu8; 64];
    let base = dst.as_mut_ptr() as u64;
    let at = |len: u64| MemoryRegion { address: base, len, kind: MemoryKind::Host };
    let ranges = [
        RangeRead { key: "o/x", object_offset: 50, dest: at(51) },
        RangeRead { key: "o/x", object_offset: 101, dest: at(0) },
        RangeRead { key: "o/x", object_offset: u64::MAX, dest: at(2) },
    ];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.get_into_ranges(&ranges) };
    for r in &res {
        let e = assert_kind(r, ErrorKind::Integrity);
        assert!(e.message().contains("o/x"), "{e}");
    }
    assert!(dst.iter().all(|&b| b == 0xAB), "destination was written");
}

fn device_memory_is_refused<S: ObjectStore>(s: &S) {
    // A bogus "device" address: touching it would crash the test.
    let bogus = MemoryRegion { address: 0x10, len: 4096, kind: MemoryKind::Device(0) };
    let ok = pattern(4, 10);
    let items = [PutFrom { key: "d/dev", source: bogus }, PutFrom { key: "d/host", source: host(&ok) }];
    let g = groups(2);
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe { s.batch_put_from(&items, &cfg(&g)) };
    let e = assert_kind(&res[0], ErrorKind::Unsupported);
    assert!(e.message().contains("d/dev"), "{e}");
    assert!(res[1].is_ok(), "{:?}", res[1]);
    assert!(!s.exists("d/dev").unwrap());
    assert_eq!(s.get("d/host").unwrap(), ok);

    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    let res = unsafe {
        s.get_into_ranges(&[
            RangeRead { key: "d/host", object_offset: 0, dest: MemoryRegion { len: 10, ..bogus } },
            RangeRead { key: "d/absent", object_offset: 0, dest: MemoryRegion { len: 10, ..bogus } },
        ])
    };
    for (r, key) in res.iter().zip(["d/host", "d/absent"]) {
        let e = assert_kind(r, ErrorKind::Unsupported);
        assert!(e.message().contains(key), "{e}");
    }
}

fn concurrent_create_only<S: ObjectStore>(s: &S) {
    const THREADS: usize = 8;
    for round in 0..10 {
        let key = format!("race/{round}/k");
        let barrier = Barrier::new(THREADS);
        let values: Vec<Vec<u8>> = (0..THREADS).map(|t| pattern(t as u8, 1000 + 37 * t)).collect();
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (barrier, key, v) = (&barrier, &key, &values[t]);
                    sc.spawn(move || {
                        let g = groups(1);
                        barrier.wait();
                        s.put(key, v, &cfg(&g))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = (0..THREADS).filter(|&t| results[t].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (t, r) in results.iter().enumerate() {
            if t != winners[0] {
                assert_kind(r, ErrorKind::AlreadyExists);
            }
        }
        assert!(s.get(&key).unwrap() == values[winners[0]]);
    }
}

/// Readers racing upserts see one whole value or the other, never a mix.
fn concurrent_upsert_reads<S: ObjectStore>(s: &S) {
    let g = groups(1);
    let a = vec![1u8; 100_000];
    let b = vec![2u8; 30_000];
    s.upsert("ur/k", &a, &cfg(&g)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                sc.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let v = s.get("ur/k").unwrap();
                        assert!(v == a || v == b, "torn read: {} bytes", v.len());
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut i = 0;
        let t = Instant::now();
        while i < 100 || (reads.load(Ordering::Relaxed) < 50 && t.elapsed() < Duration::from_secs(10)) {
            s.upsert("ur/k", if i % 2 == 0 { &b } else { &a }, &cfg(&g)).unwrap();
            i += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    });
    assert!(reads.load(Ordering::Relaxed) >= 50);
}

macro_rules! backend_tests {
    ($backend:ident) => {
        mod $backend {
            #[test]
            fn create_only_put() {
                super::create_only_put(&super::$backend().store);
            }
            #[test]
            fn upsert_replaces() {
                super::upsert_replaces(&super::$backend().store);
            }
            #[test]
            fn get_exists_remove() {
                super::get_exists_remove(&super::$backend().store);
            }
            #[test]
            fn batch_put_from_host() {
                super::batch_put_from_host(&super::$backend().store);
            }
            #[test]
            fn large_batches() {
                super::large_batches(&super::$backend().store);
            }
            #[test]
            fn batch_put_from_group_count() {
                super::batch_put_from_group_count(&super::$backend().store);
            }
            #[test]
            fn get_into_ranges_host() {
                super::get_into_ranges_host(&super::$backend().store);
            }
            #[test]
            fn out_of_range_read() {
                super::out_of_range_read(&super::$backend().store);
            }
            #[test]
            fn device_memory_is_refused() {
                super::device_memory_is_refused(&super::$backend().store);
            }
            #[test]
            fn concurrent_create_only() {
                super::concurrent_create_only(&super::$backend().store);
            }
            #[test]
            fn concurrent_upsert_reads() {
                super::concurrent_upsert_reads(&super::$backend().store);
            }
        }
    };
}

backend_tests!(memory);
backend_tests!(directory);

// ---- memory backend specifics ---------------------------------------------------------

#[test]
fn memory_records_groups_and_keys() {
    let s = MemoryStore::new();
    assert!(s.is_empty());
    fn meta(g: &[String]) -> WriteConfig<'_> {
        WriteConfig { group_ids: g, record_type: RecordType::Metadata }
    }
    let tx = vec!["tx-group".to_string()];
    let gen = vec!["gen-group".to_string()];
    s.put("z/decision", b"d", &meta(&tx)).unwrap();
    s.upsert("z/manifest", b"m", &meta(&gen)).unwrap();
    let p0 = pattern(0, 10);
    let p1 = pattern(1, 10);
    let items = [PutFrom { key: "a/p1", source: host(&p1) }, PutFrom { key: "a/p0", source: host(&p0) }];
    let pg = vec!["gen-a".to_string(), "gen-b".to_string()];
    // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
    for r in unsafe { s.batch_put_from(&items, &cfg(&pg)) } {
        r.unwrap();
    }
    assert_eq!(s.group_of("z/decision"), Some(("tx-group".into(), RecordType::Metadata)));
    assert_eq!(s.group_of("z/manifest"), Some(("gen-group".into(), RecordType::Metadata)));
    assert_eq!(s.group_of("a/p1"), Some(("gen-a".into(), RecordType::Payload)));
    assert_eq!(s.group_of("a/p0"), Some(("gen-b".into(), RecordType::Payload)));
    assert_eq!(s.group_of("nope"), None);
    // A failed create-only put does not change the recorded group.
    assert_kind(&s.put("z/decision", b"x", &meta(&gen)), ErrorKind::AlreadyExists);
    assert_eq!(s.group_of("z/decision").unwrap().0, "tx-group");
    assert_eq!(s.keys(), vec!["a/p0", "a/p1", "z/decision", "z/manifest"]);
    assert_eq!(s.len(), 4);
    s.remove("a/p0").unwrap();
    assert_eq!(s.len(), 3);
    // The memory backend does not map keys to paths: any string is a key.
    s.put("../odd//key", b"k", &cfg(&groups(1))).unwrap();
    assert_eq!(s.get("../odd//key").unwrap(), b"k");
}

// ---- directory backend specifics ------------------------------------------------------

fn list_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn directory_hostile_keys_refused() {
    let dir = TempDir::new("hostile");
    let root = dir.path().join("nest").join("store");
    let s = DirectoryStore::open(&root).unwrap();
    let before = list_tree(dir.path());
    let hostile = ["", "../x", "..", ".", "a/../../x", "a//b", "/abs", "/", "a/./b", "a/.", "a/", "a\0b", "x/.."];
    let g = groups(1);
    let buf = pattern(1, 16);
    let mut dst = vec![0u8; 16];
    for key in hostile {
        assert_kind(&s.put(key, b"v", &cfg(&g)), ErrorKind::InvalidArgument);
        assert_kind(&s.upsert(key, b"v", &cfg(&g)), ErrorKind::InvalidArgument);
        assert_kind(&s.get(key), ErrorKind::InvalidArgument);
        assert_kind(&s.exists(key), ErrorKind::InvalidArgument);
        assert_kind(&s.remove(key), ErrorKind::InvalidArgument);
        // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
        let r = unsafe { s.batch_put_from(&[PutFrom { key, source: host(&buf) }], &cfg(&g)) };
        assert_kind(&r[0], ErrorKind::InvalidArgument);
        // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
        let r = unsafe { s.get_into_ranges(&[RangeRead { key, object_offset: 0, dest: host_mut(&mut dst) }]) };
        assert_kind(&r[0], ErrorKind::InvalidArgument);
    }
    let long = "x".repeat(254);
    assert_kind(&s.put(&long, b"v", &cfg(&g)), ErrorKind::InvalidArgument);
    assert_eq!(list_tree(dir.path()), before, "something was created");
    assert_eq!(list_tree(&root.join("objects")), Vec::<PathBuf>::new());
    assert_eq!(list_tree(&root.join("tmp")), Vec::<PathBuf>::new());
}

#[test]
fn directory_prefix_keys_coexist() {
    let f = directory();
    let s = &f.store;
    let g = groups(1);
    let keys = ["a", "a/b", "a/b/c", "a/b/c/d", "b/a", "d.a", "f.a", "a/f.b", "a/d.b"];
    for (i, k) in keys.iter().enumerate() {
        s.put(k, &pattern(i as u8, 10 + i), &cfg(&g)).unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(s.get(k).unwrap(), pattern(i as u8, 10 + i), "{k}");
    }
    s.remove("a/b").unwrap();
    assert!(!s.exists("a/b").unwrap());
    assert!(s.exists("a/b/c").unwrap() && s.exists("a/b/c/d").unwrap() && s.exists("a").unwrap());
    assert!(!s.exists("a/b/c/d/e").unwrap());
    assert!(!s.exists("a/x/y").unwrap());
    assert_eq!(s.object_path("a/b/c").unwrap(), s.root().join("objects").join("d.a").join("d.b").join("f.c"));
    // Valid but unusual keys.
    for k in ["..a", ".hidden", "a b/ü", "back\\slash", "x/...", "tab\there"] {
        s.put(k, k.as_bytes(), &cfg(&g)).unwrap();
        assert_eq!(s.get(k).unwrap(), k.as_bytes());
    }
    let tmp = list_tree(&s.root().join("tmp"));
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
}

#[test]
fn directory_reopen_and_clean_temp() {
    let dir = TempDir::new("reopen");
    let root = dir.path().join("store");
    let g = groups(1);
    {
        let s = DirectoryStore::open(&root).unwrap();
        s.put("p/k", b"persisted", &cfg(&g)).unwrap();
    }
    // A crashed writer's leftovers.
    std::fs::write(root.join("tmp").join("12345.7.00000000deadbeef.tmp"), b"partial").unwrap();
    std::fs::write(root.join("tmp").join("12345.8.00000000deadbeef.tmp"), b"partial").unwrap();
    let s = DirectoryStore::open(&root).unwrap();
    assert_eq!(s.get("p/k").unwrap(), b"persisted");
    assert_eq!(s.clean_temp_older_than(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(s.clean_temp().unwrap(), 2);
    assert_eq!(s.clean_temp().unwrap(), 0);
    assert_kind(&s.put("p/k", b"other", &cfg(&g)), ErrorKind::AlreadyExists);
    assert_eq!(s.get("p/k").unwrap(), b"persisted");
}

/// The embedded stores hold host bytes only: device memory reaches them through the
/// weight store's device engine, which stages it (tests/device_memory.rs), so they
/// say no to device memory and the protocol never hands them a device region.
#[test]
fn embedded_stores_hold_host_bytes_only() {
    for kind in [MemoryKind::Device(0), MemoryKind::Device(3)] {
        assert!(!memory().store.supports_memory(kind));
        assert!(!directory().store.supports_memory(kind));
    }
    assert!(memory().store.supports_memory(MemoryKind::Host));
    assert!(directory().store.supports_memory(MemoryKind::Host));
}

/// Issue 29: a path that is a regular file (or lies below one) cannot be a store root;
/// the error names the path given and says what is in the way, and nothing is created.
#[test]
fn a_regular_file_where_the_store_root_belongs_is_named() {
    let t = TempDir::new("root-is-a-file");
    let file = t.0.join("weights.bin");
    std::fs::write(&file, b"not a store").unwrap();
    let Err(e) = DirectoryStore::open(&file) else { panic!("a file is not a store root") };
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains(&format!("{}: it is a file, not a directory", file.display())), "{e}");
    let below = file.join("store");
    let Err(e) = DirectoryStore::open(&below) else { panic!("nothing can be created below a file") };
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains(&below.display().to_string()), "{e}");
    assert!(e.message().contains(&format!("{} is a file, not a directory", file.display())), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a store", "the file is left alone");
}
