//! Crash safety and multi-process create-only semantics of `DirectoryStore`.
//!
//! The child processes are this test binary re-executed with
//! `--exact child_main` and `MWS_CRASH_CHILD=<mode>` in the environment; without that
//! variable `child_main` does nothing.
//!
//! * `kill_minus_9_never_exposes_partial_objects`: a child writes self-describing
//!   values (create-only `put`, `batch_put_from` and `upsert`, 1 B to 1 MiB) in a
//!   loop and is killed with `SIGKILL` after a random delay; the parent then checks
//!   that every object present in the store is complete and correct.
//! * `processes_racing_create_only_put`: 4 children create-only `put` one key with
//!   different values; exactly one child succeeds and its value is the one stored.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mooncake_weight_store::runtime::MemoryRegion;
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::{ObjectStore, PutFrom, RecordType, WriteConfig};
use mooncake_weight_store::{ErrorKind, MemoryKind};

const CHILD_ENV: &str = "MWS_CRASH_CHILD";
const MAX_VALUE: usize = 1 << 20;
const HEADER: usize = 16;

// ---- helpers ---------------------------------------------------------------------------

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
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn time_seed() -> u64 {
    let mut h = DefaultHasher::new();
    std::time::SystemTime::now().hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

fn cfg(g: &[String]) -> WriteConfig<'_> {
    WriteConfig { group_ids: g, record_type: RecordType::Payload }
}

/// A self-describing value: total length (u64 LE), version (u64 LE), then content
/// derived from `(key, version)`.
fn make_value(key: &str, version: u64, content_len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + content_len);
    v.extend_from_slice(&((HEADER + content_len) as u64).to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let mut h = DefaultHasher::new();
    (key, version).hash(&mut h);
    let mut rng = Rng::new(h.finish());
    while v.len() < HEADER + content_len {
        let w = rng.next().to_le_bytes();
        let n = (HEADER + content_len - v.len()).min(8);
        v.extend_from_slice(&w[..n]);
    }
    v
}

/// Checks a value read back for `key`; returns its version.
fn check_value(key: &str, v: &[u8]) -> std::result::Result<u64, String> {
    if v.len() < HEADER {
        return Err(format!("{key}: {} bytes, shorter than the header", v.len()));
    }
    let len = u64::from_le_bytes(v[0..8].try_into().unwrap()) as usize;
    let version = u64::from_le_bytes(v[8..16].try_into().unwrap());
    if len != v.len() {
        return Err(format!("{key}: header says {len} bytes, object has {}", v.len()));
    }
    if make_value(key, version, len - HEADER) != v {
        return Err(format!("{key}: content does not match version {version}"));
    }
    Ok(version)
}

fn content_len(rng: &mut Rng) -> usize {
    let cap = match rng.below(100) {
        0..=49 => 4096,
        50..=84 => 64 << 10,
        _ => MAX_VALUE - HEADER,
    };
    1 + rng.below(cap as u64) as usize
}

/// Every key in the store, recovered from the file layout (`d.`/`f.` prefixes).
fn stored_keys(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let ty = e.file_type().unwrap();
            if let Some(seg) = name.strip_prefix("d.") {
                assert!(ty.is_dir(), "{name} is not a directory");
                walk(&e.path(), &format!("{prefix}{seg}/"), out);
            } else if let Some(seg) = name.strip_prefix("f.") {
                assert!(ty.is_file(), "{name} is not a file");
                out.push(format!("{prefix}{seg}"));
            } else {
                panic!("unexpected entry {name} under {}", dir.display());
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join("objects"), "", &mut out);
    out.sort();
    out
}

fn child(mode: &str, envs: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_main", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, mode).stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

// ---- the child -------------------------------------------------------------------------

/// The child process entry point (does nothing unless `MWS_CRASH_CHILD` is set).
#[test]
fn child_main() {
    let Ok(mode) = std::env::var(CHILD_ENV) else { return };
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let store = DirectoryStore::open(env("MWS_ROOT")).unwrap();
    match mode.as_str() {
        "writer" => writer_child(&store, env("MWS_SEED").parse().unwrap()),
        "race" => race_child(&store, &env("MWS_KEY"), env("MWS_INDEX").parse().unwrap(), Path::new(&env("MWS_GO"))),
        other => panic!("unknown child mode {other}"),
    }
}

fn writer_child(store: &DirectoryStore, seed: u64) {
    let mut rng = Rng::new(seed);
    let g1 = vec!["g".to_string()];
    let g3 = vec!["g".to_string(); 3];
    // Bounded, in case the parent never kills us.
    for i in 0u64..20_000 {
        match i % 5 {
            // Upsert one of a few keys with a new version.
            3 => {
                let key = format!("u/{seed}/{}", i % 4);
                let v = make_value(&key, i, content_len(&mut rng));
                store.upsert(&key, &v, &cfg(&g1)).unwrap();
            }
            // batch_put_from of three keys.
            4 => {
                let keys: Vec<String> = (0..3).map(|j| format!("b/{seed}/{i}/{j}")).collect();
                let vals: Vec<Vec<u8>> = keys.iter().map(|k| make_value(k, 0, content_len(&mut rng))).collect();
                let items: Vec<PutFrom> = keys
                    .iter()
                    .zip(&vals)
                    .map(|(k, v)| PutFrom {
                        key: k,
                        source: MemoryRegion {
                            address: v.as_ptr() as u64,
                            len: v.len() as u64,
                            kind: MemoryKind::Host,
                        },
                    })
                    .collect();
                // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
                for r in unsafe { store.batch_put_from(&items, &cfg(&g3)) } {
                    r.unwrap();
                }
            }
            _ => {
                let key = format!("p/{seed}/{i}");
                let v = make_value(&key, 0, content_len(&mut rng));
                store.put(&key, &v, &cfg(&g1)).unwrap();
            }
        }
    }
}

fn race_child(store: &DirectoryStore, key: &str, index: u64, go: &Path) {
    let value = make_value(key, index, 4 << 20);
    let g = vec!["g".to_string()];
    println!("READY {index}");
    let t = Instant::now();
    while !go.exists() {
        assert!(t.elapsed() < Duration::from_secs(30), "no go signal");
        std::thread::sleep(Duration::from_micros(100));
    }
    match store.put(key, &value, &cfg(&g)) {
        Ok(()) => println!("RESULT {index} ok"),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => println!("RESULT {index} exists"),
        Err(e) => println!("RESULT {index} error {e}"),
    }
}

// ---- the parents -----------------------------------------------------------------------

#[test]
fn kill_minus_9_never_exposes_partial_objects() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    const TRIALS: u64 = 60;
    let dir = TempDir::new("crash");
    let root = dir.0.join("store");
    let mut rng = Rng::new(time_seed());
    let base_seed = rng.next() % 1_000_000;
    let started = Instant::now();
    let mut killed = 0;
    for trial in 0..TRIALS {
        let seed = base_seed + trial;
        let mut c = child("writer", &[("MWS_ROOT", root.display().to_string()), ("MWS_SEED", seed.to_string())])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(2_000 + rng.below(150_000)));
        // SAFETY: test code: every pointer comes from a buffer this test owns and keeps alive, unaliased, for the call.
        let rc = unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill failed");
        let status = c.wait().unwrap();
        if std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGKILL) {
            killed += 1;
        } else {
            assert!(status.success(), "child failed: {status:?}");
        }
    }
    assert!(killed >= TRIALS / 2, "only {killed} of {TRIALS} children were killed mid-run");

    // Every object present is complete and correct.
    let store = DirectoryStore::open(&root).unwrap();
    let keys = stored_keys(&root);
    let mut bytes = 0usize;
    for key in &keys {
        assert!(store.exists(key).unwrap());
        let v = store.get(key).unwrap();
        let version = check_value(key, &v).unwrap();
        if !key.starts_with("u/") {
            assert_eq!(version, 0, "{key}");
        }
        bytes += v.len();
    }
    let seeds_seen: std::collections::HashSet<&str> = keys.iter().map(|k| k.split('/').nth(1).unwrap()).collect();
    let stale = store.clean_temp().unwrap();
    println!(
        "{TRIALS} trials ({killed} killed mid-run) in {:.1} s: {} objects ({} MiB) verified from {} writers; {stale} stale temporary files removed",
        started.elapsed().as_secs_f64(),
        keys.len(),
        bytes >> 20,
        seeds_seen.len()
    );
    assert!(keys.len() >= TRIALS as usize / 2, "too few objects written: {}", keys.len());
    // The store still works after the crashes: create-only against survivors.
    let g = vec!["g".to_string()];
    assert_eq!(store.put(&keys[0], b"x", &cfg(&g)).unwrap_err().kind(), ErrorKind::AlreadyExists);
    store.put("after/crash", b"fine", &cfg(&g)).unwrap();
    assert_eq!(store.get("after/crash").unwrap(), b"fine");
}

#[test]
fn processes_racing_create_only_put() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    const CHILDREN: u64 = 4;
    let dir = TempDir::new("race");
    let root = dir.0.join("store");
    let store = DirectoryStore::open(&root).unwrap();
    for round in 0..4 {
        let key = format!("race/{round}/decision");
        let go = dir.0.join(format!("go{round}"));
        let mut kids: Vec<_> = (0..CHILDREN)
            .map(|i| {
                child(
                    "race",
                    &[
                        ("MWS_ROOT", root.display().to_string()),
                        ("MWS_KEY", key.clone()),
                        ("MWS_INDEX", i.to_string()),
                        ("MWS_GO", go.display().to_string()),
                    ],
                )
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        // Wait until every child is ready (its READY line), then start them together.
        let mut outs: Vec<String> = Vec::new();
        for k in kids.iter_mut() {
            let out = k.stdout.as_mut().unwrap();
            let mut buf = Vec::new();
            let mut byte = [0u8; 1];
            while !String::from_utf8_lossy(&buf).contains("READY") {
                assert_eq!(out.read(&mut byte).unwrap(), 1, "child exited before READY");
                buf.push(byte[0]);
            }
            outs.push(String::from_utf8_lossy(&buf).into_owned());
        }
        std::fs::write(&go, b"").unwrap();
        for (k, out) in kids.iter_mut().zip(outs.iter_mut()) {
            k.stdout.as_mut().unwrap().read_to_string(out).unwrap();
            assert!(k.wait().unwrap().success(), "child failed: {out}");
        }
        let results: Vec<(u64, String)> = outs
            .iter()
            .flat_map(|o| o.lines())
            .filter_map(|l| l.strip_prefix("RESULT "))
            .map(|l| {
                let (i, r) = l.split_once(' ').unwrap();
                (i.parse().unwrap(), r.to_string())
            })
            .collect();
        assert_eq!(results.len(), CHILDREN as usize, "{outs:?}");
        let winners: Vec<u64> = results.iter().filter(|(_, r)| r == "ok").map(|(i, _)| *i).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        assert!(results.iter().all(|(_, r)| r == "ok" || r == "exists"), "{results:?}");
        let v = store.get(&key).unwrap();
        assert_eq!(check_value(&key, &v).unwrap(), winners[0], "stored value is not the winner's");
    }
    assert_eq!(stored_keys(&root).len(), 4);
    assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0, "temporary files left behind");
}
