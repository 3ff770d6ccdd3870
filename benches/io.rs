//! Snapshot and restore throughput against the machine's limits, measured in the
//! same run (a benchmark, not a test):
//! * snapshot into the directory store vs a plain sequential write + fsync of the
//!   same bytes (one file per stored object);
//! * restore from the memory store and from the directory store (page cache warm,
//!   and cold when the caches can be dropped) vs a single-thread memcpy of the
//!   same number of bytes.
//!
//! `cargo bench --bench io -- [--size-mib N] [--dir PATH]` (default 1024 MiB).

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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let size_mib: u64 = arg("--size-mib").map(|s| s.parse().expect("--size-mib N")).unwrap_or(1024);
    let root = std::path::PathBuf::from(arg("--dir").unwrap_or_else(|| "target/mws-bench-io".into()));
    let _ = std::fs::remove_dir_all(&root);
    let hidden = 1024;
    let layers = (size_mib << 20).div_ceil(16 * hidden * hidden * 2).max(1);
    let defs = model_tensors(layers, hidden, 8);
    let src =
        HostModel::new(build_placement("trainer", Layout { tp: 4, pp: 2, ep: 2, dp: 2 }, &defs, 1), true, "trainer", 1);
    let gb = |b: u64, s: f64| b as f64 / s / 1e9;

    // Snapshot into the directory store vs sequential write + fsync.
    let dir_store = Arc::new(DirectoryStore::open(root.join("store")).unwrap());
    let verified = StoreLimits { verify_integrity: true, ..StoreLimits::default() };
    let ws_dir = WeightStore::new(dir_store.clone()).with_limits(verified).unwrap();
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
    let ws_mem = WeightStore::new(mem.clone()).with_limits(verified).unwrap();
    let group = [manifest.group_id().to_string()];
    let cfg = WriteConfig { group_ids: &group, record_type: RecordType::Payload };
    for f in manifest.fragments() {
        mem.put(f.object_key(), &dir_store.get(f.object_key()).unwrap(), &cfg).unwrap();
    }
    mem.put(manifest.manifest_key(), manifest.to_json().as_bytes(), &cfg).unwrap();
    let ikey = mooncake_weight_store::plan::integrity::manifest_integrity_key(&manifest).expect("integrity key");
    mem.put(&ikey, &dir_store.get(&ikey).expect("integrity record written by the snapshot"), &cfg).unwrap();
    drop(src);
    checksum_speeds();

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
    let manifest = Arc::new(manifest);
    let plan =
        LoadPlan::plan(manifest.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default()).unwrap();
    let bytes = plan.total_bytes();
    let memcpy = memcpy_seconds(bytes as usize);
    println!(
        "restore plan: {} regions, {} segments, {:.2} GiB; memcpy of the same bytes (1 thread) {:.3} s {:.2} GB/s",
        plan.regions().len(),
        plan.logical().total_segments(),
        bytes as f64 / (1u64 << 30) as f64,
        memcpy,
        gb(bytes, memcpy)
    );
    let best = |ws: &WeightStore| (0..3).map(|_| restore(ws, &plan, &dst)).fold(f64::MAX, f64::min);
    let unverified = |b: Arc<dyn ObjectStore>| {
        WeightStore::new(b).with_limits(StoreLimits { verify_integrity: false, ..StoreLimits::default() }).unwrap()
    };
    let (ws_mem_off, ws_dir_off) = (unverified(mem.clone()), unverified(dir_store.clone()));
    for (name, on, off) in [("memory store     ", &ws_mem, &ws_mem_off), ("directory (warm) ", &ws_dir, &ws_dir_off)] {
        let s_off = best(off);
        let s = best(on);
        println!(
            "restore <- {name}   {:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2} | without integrity {:>7.3} s \
             {:>6.2} GB/s | integrity cost {:+.1}%",
            s,
            gb(bytes, s),
            memcpy / s,
            s_off,
            gb(bytes, s_off),
            (s / s_off - 1.0) * 100.0
        );
    }
    if drop_caches() {
        let s = restore(&ws_dir, &plan, &dst);
        println!(
            "restore <- directory (cold)    {:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2}",
            s,
            gb(bytes, s),
            memcpy / s
        );
    } else {
        println!("restore <- directory (cold)    n/a (cannot drop the page cache here)");
    }
    dst.verify().expect("restored bytes");
    println!("verified: every restored byte matches");
    let _ = std::fs::remove_dir_all(&root);
}
