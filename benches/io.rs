//! Snapshot and restore throughput against the machine's limits, measured in the
//! same run (a benchmark, not a test):
//! * snapshot into the directory store vs a plain sequential write + fsync of the
//!   same bytes (one file per stored object);
//! * restore from the memory store and from the directory store (page cache warm,
//!   and cold when the caches can be dropped) vs a single-thread memcpy of the
//!   same number of bytes.
//!
//! Restores run twice: resharded (TP4 x PP2 x EP2 x DP2 into TP2 x EP4, many short
//! rows) and into the snapshot's own layout (whole-object reads). The headline ratio
//! is the restore without integrity verification (`verify_integrity: false`); the
//! same with the stores' copies on one thread, and the default restore (verified:
//! checksums fused with the copy) are printed beside it. Unverified and verified
//! restores alternate, best of `--reps` each.
//!
//! The last line is `figure: restore_verified_vs_unverified = X`: the throughput of
//! the verified restores over that of the unverified ones, all four cases together
//! (memory and warm directory store, resharded and same layout: the sum of the
//! unverified best times over the sum of the verified ones); the line before it
//! gives each case's ratio.
//!
//! `cargo bench --bench io -- [--size-mib N] [--dir PATH] [--reps N] [--no-integrity]`
//! (default 1024 MiB, best of 3).

#[path = "../tests/common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, LoadPlan, StaticGuard, StoreLimits, WeightStore};
use mooncake_weight_store::store::{
    directory::DirectoryStore, memory::MemoryStore, ObjectStore, RecordType, WriteConfig,
};
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

fn restore(ws: &WeightStore, plan: &LoadPlan, dst: &HostModel) -> f64 {
    let t = Instant::now();
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        unsafe { ws.load(plan, b, args) }.expect("restore");
    }
    t.elapsed().as_secs_f64()
}

fn memcpy_seconds(bytes: usize) -> f64 {
    let src = vec![7u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // touch
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn sequential_write_fsync(dir: &std::path::Path, sizes: &[u64]) -> f64 {
    std::fs::create_dir_all(dir).unwrap();
    let buf = vec![3u8; *sizes.iter().max().unwrap_or(&0) as usize];
    let t = Instant::now();
    for (i, &n) in sizes.iter().enumerate() {
        let mut f = std::fs::File::create(dir.join(format!("{i}.bin"))).unwrap();
        f.write_all(&buf[..n as usize]).unwrap();
        f.sync_all().unwrap();
    }
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    let s = t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(dir).unwrap();
    s
}

/// Single-thread speed of the checksum candidates over 256 MiB (why CRC-32C).
fn checksum_speeds() {
    let data: Vec<u8> = (0..256u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let time = |f: &dyn Fn(&[u8]) -> u64| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            std::hint::black_box(f(std::hint::black_box(&data)));
            best = best.min(t.elapsed().as_secs_f64());
        }
        data.len() as f64 / best / 1e9
    };
    let crc = time(&|d| mooncake_weight_store::plan::integrity::block_checksums(d).len() as u64);
    let xxh = time(&|d| d.chunks(1 << 20).map(xxhash_rust::xxh3::xxh3_64).fold(0, |a, b| a ^ b));
    let sha = time(&|d| {
        use sha2::Digest;
        d.chunks(1 << 20).map(|c| sha2::Sha256::digest(c)[0] as u64).sum()
    });
    println!(
        "checksums per 1 MiB block, 1 thread: crc32c {crc:.2} GB/s | xxh3-64 {xxh:.2} GB/s | sha-256 {sha:.2} GB/s \
         (hardware crc32c: {})",
        std::arch::is_x86_feature_detected!("sse4.2")
    );
}

fn drop_caches() -> bool {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Best of `reps` restores of `plan` into `dst` through `ws`.
fn best_restore(ws: &WeightStore, plan: &LoadPlan, dst: &HostModel, reps: usize) -> f64 {
    (0..reps.max(1)).map(|_| restore(ws, plan, dst)).fold(f64::MAX, f64::min)
}

/// A store under test: its name, its weight store without and with integrity
/// verification, and how to set its copy threads.
type StoreCase<'a> = (&'a str, &'a WeightStore, &'a WeightStore, &'a dyn Fn(usize));

/// Best unverified and verified restore times of one case, alternating runs.
fn alternated(off: &WeightStore, on: &WeightStore, plan: &LoadPlan, dst: &HostModel, reps: usize) -> (f64, f64) {
    let (mut a, mut b) = (f64::MAX, f64::MAX);
    for _ in 0..reps.max(1) {
        a = a.min(restore(off, plan, dst));
        b = b.min(restore(on, plan, dst));
    }
    (a, b)
}

/// One restore case against the memcpy baseline: without integrity verification,
/// the same with the stores' copies on one thread, and the default (verified).
/// Appends `(case, unverified s, verified s)` to `figures`.
#[allow(clippy::too_many_arguments)]
fn restore_case(
    name: &str,
    stores: &[StoreCase<'_>],
    plan: &LoadPlan,
    dst: &HostModel,
    memcpy: f64,
    reps: usize,
    threads: usize,
    with_integrity: bool,
    figures: &mut Vec<(String, f64, f64)>,
) {
    let bytes = plan.total_bytes();
    let gb = |s: f64| bytes as f64 / s / 1e9;
    for &(store, off, on, set_threads) in stores {
        set_threads(threads);
        let (s, si) = if with_integrity {
            alternated(off, on, plan, dst, reps)
        } else {
            (best_restore(off, plan, dst, reps), f64::NAN)
        };
        set_threads(1);
        let s1 = best_restore(off, plan, dst, reps);
        set_threads(threads);
        print!(
            "restore {name} <- {store:<17} {:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2} ({threads} threads) | \
             1 thread {:>7.3} s ratio {:.2}",
            s,
            gb(s),
            memcpy / s,
            s1,
            memcpy / s1
        );
        if with_integrity {
            print!(
                " | verified (default) {:>7.3} s ratio {:.2} ({:+.1}%, throughput x{:.3})",
                si,
                memcpy / si,
                (si / s - 1.0) * 100.0,
                s / si
            );
            figures.push((format!("{name} <- {store}"), s, si));
        }
        println!();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let size_mib: u64 = arg("--size-mib").map(|s| s.parse().expect("--size-mib N")).unwrap_or(1024);
    let reps: usize = arg("--reps").map(|s| s.parse().expect("--reps N")).unwrap_or(3);
    let no_integrity = flag("--no-integrity");
    // Optional filters (for profiling): `--store memory|directory`, `--case resharded|same`.
    let only_store = arg("--store");
    let only_case = arg("--case");
    let case_on = |c: &str| only_case.as_deref().is_none_or(|o| o == c);
    let root = std::path::PathBuf::from(arg("--dir").unwrap_or_else(|| "target/mws-bench-io".into()));
    let _ = std::fs::remove_dir_all(&root);
    let hidden = 1024;
    let layers = (size_mib << 20).div_ceil(16 * hidden * hidden * 2).max(1);
    let defs = model_tensors(layers, hidden, 8);
    let trainer = Layout { tp: 4, pp: 2, ep: 2, dp: 2 };
    let src = HostModel::new(build_placement("trainer", trainer, &defs, 1), true, "trainer", 1);
    let gb = |b: u64, s: f64| b as f64 / s / 1e9;

    // Snapshot into the directory store vs sequential write + fsync.
    let dir_store = Arc::new(DirectoryStore::open(root.join("store")).unwrap());
    // The default weight store verifies restores.
    let ws_dir = WeightStore::new(dir_store.clone());
    assert!(ws_dir.limits().verify_integrity);
    let t = Instant::now();
    let manifest = src.snapshot_into(&ws_dir).expect("snapshot");
    let snap_s = t.elapsed().as_secs_f64();
    let sizes: Vec<u64> = manifest.fragments().iter().map(|f| f.nbytes()).collect();
    let stored: u64 = sizes.iter().sum();
    let seq_s = sequential_write_fsync(&root.join("plain"), &sizes);
    println!(
        "workload: {} tensors, {} stored objects, {:.2} GiB stored",
        manifest.tensors().len(),
        sizes.len(),
        stored as f64 / (1u64 << 30) as f64
    );
    println!(
        "snapshot -> directory store   {:>7.3} s {:>6.2} GB/s | plain write+fsync {:>7.3} s {:>6.2} GB/s | ratio {:.2}",
        snap_s,
        gb(stored, snap_s),
        seq_s,
        gb(stored, seq_s),
        seq_s / snap_s
    );

    // Memory store with the same objects (copied from the directory store).
    let mem = Arc::new(MemoryStore::new());
    let ws_mem = WeightStore::new(mem.clone());
    let group = [manifest.group_id().to_string()];
    let cfg = WriteConfig { group_ids: &group, record_type: RecordType::Payload };
    for f in manifest.fragments() {
        mem.put(f.object_key(), &dir_store.get(f.object_key()).unwrap(), &cfg).unwrap();
    }
    mem.put(manifest.manifest_key(), manifest.to_json().as_bytes(), &cfg).unwrap();
    let ikey = mooncake_weight_store::plan::integrity::manifest_integrity_key(&manifest).expect("integrity key");
    mem.put(&ikey, &dir_store.get(&ikey).expect("integrity record written by the snapshot"), &cfg).unwrap();
    drop(src);
    if !no_integrity {
        checksum_speeds();
    }

    let unverified = |b: Arc<dyn ObjectStore>| {
        WeightStore::new(b).with_limits(StoreLimits { verify_integrity: false, ..StoreLimits::default() }).unwrap()
    };
    let (ws_mem_off, ws_dir_off) = (unverified(mem.clone()), unverified(dir_store.clone()));
    let threads = mooncake_weight_store::store::io_threads();
    let (mem_t, dir_t) = (mem.clone(), dir_store.clone());
    let set_mem = move |n: usize| mem_t.set_max_threads(n);
    let set_dir = move |n: usize| dir_t.set_max_threads(n);
    let all: [StoreCase<'_>; 2] =
        [("memory store", &ws_mem_off, &ws_mem, &set_mem), ("directory (warm)", &ws_dir_off, &ws_dir, &set_dir)];
    let stores: Vec<_> = all.into_iter().filter(|s| only_store.as_deref().is_none_or(|o| s.0.starts_with(o))).collect();
    println!("store copies run on up to {threads} threads (the memcpy baseline on one)");
    let manifest = Arc::new(manifest);
    let mut figures: Vec<(String, f64, f64)> = Vec::new();

    // Resharded restore: TP4 x PP2 x EP2 x DP2 -> TP2 x EP4.
    if case_on("resharded") {
        let dst = {
            let mut d = HostModel::new(
                build_placement("serving", Layout { tp: 2, pp: 1, ep: 4, dp: 1 }, &defs, 1),
                false,
                "serving",
                1,
            );
            d.bindings = d.make_bindings("serving", 1);
            d
        };
        let plan =
            LoadPlan::plan(manifest.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
        let bytes = plan.total_bytes();
        let memcpy = memcpy_seconds(bytes as usize);
        println!(
        "restore plan (resharded): {} regions, {} segments, {:.2} GiB; memcpy of the same bytes (1 thread) {:.3} s \
         {:.2} GB/s",
        plan.regions().len(),
        plan.logical().total_segments(),
        bytes as f64 / (1u64 << 30) as f64,
        memcpy,
        gb(bytes, memcpy)
    );
        restore_case("resharded", &stores, &plan, &dst, memcpy, reps, threads, !no_integrity, &mut figures);
        if only_store.is_none() && drop_caches() {
            let s = restore(&ws_dir_off, &plan, &dst);
            println!(
                "restore resharded <- directory (cold)  {:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2}",
                s,
                gb(bytes, s),
                memcpy / s
            );
        } else {
            println!("restore resharded <- directory (cold)  n/a (cannot drop the page cache here)");
        }
        dst.verify().expect("restored bytes");
    }

    // Same layout: every target fragment is one stored object (whole-object reads).
    if case_on("same") {
        let same = {
            let mut d = HostModel::new(build_placement("trainer", trainer, &defs, 1), false, "trainer2", 1);
            d.bindings = d.make_bindings("trainer2", 1);
            d
        };
        let plan = LoadPlan::plan(manifest.clone(), same.placement.clone(), &same.bindings, PlanningLimits::default())
            .unwrap();
        let bytes = plan.total_bytes();
        let memcpy = memcpy_seconds(bytes as usize);
        println!(
        "restore plan (same layout): {} regions, {} segments, {:.2} GiB; memcpy of the same bytes (1 thread) {:.3} s \
         {:.2} GB/s",
        plan.regions().len(),
        plan.logical().total_segments(),
        bytes as f64 / (1u64 << 30) as f64,
        memcpy,
        gb(bytes, memcpy)
    );
        restore_case("same layout", &stores, &plan, &same, memcpy, reps, threads, !no_integrity, &mut figures);
        same.verify().expect("restored bytes");
    }
    println!("verified: every restored byte matches");
    let _ = std::fs::remove_dir_all(&root);
    if !figures.is_empty() {
        let cases: Vec<String> = figures.iter().map(|(c, a, b)| format!("{c} {:.3}", a / b)).collect();
        println!("verified vs unverified restore throughput per case: {}", cases.join(" | "));
        let (a, b) = figures.iter().fold((0.0, 0.0), |(x, y), (_, a, b)| (x + a, y + b));
        println!("streaming copy pattern: {}", mooncake_weight_store::streaming_copy_pattern());
        println!("figure: restore_verified_vs_unverified = {:.3}", a / b);
    }
}
