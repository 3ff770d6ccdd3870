//! The main job: fabricate a sharded model in a trainer layout, snapshot it into
//! the directory store, restore it into a different serving layout, verify every
//! byte, and print a report.
//!
//! ```text
//! cargo run --release --example snapshot_restore -- [--size-mib N] [--dir PATH] [--reuse] [--keep]
//! ```
//!
//! The store directory (default: a fresh `target/mws-demo-store-<pid>`) must be
//! missing or empty; a directory store of an earlier run is replaced only with
//! `--reuse`, and anything else is refused untouched. At the end the example removes
//! only what it created (`examples/support/store_dir.rs`); with `--keep` it leaves the
//! store in place, to inspect with `mws --dir PATH ls` (and `inspect`, `verify`, ...).

#[path = "../tests/common/model.rs"]
mod model;
#[path = "support/store_dir.rs"]
mod store_dir;

use model::*;
use mooncake_weight_store::plan::load::PlanningLimits;
use mooncake_weight_store::protocol::{LoadArgs, StaticGuard, WeightStore};
use mooncake_weight_store::store::directory::DirectoryStore;
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let size_mib: u64 = arg("--size-mib").map(|s| s.parse().expect("--size-mib N")).unwrap_or(1024);
    let dir = arg("--dir").unwrap_or_else(|| format!("target/mws-demo-store-{}", std::process::id()));
    let store_dir = match store_dir::StoreDir::prepare(std::path::Path::new(&dir), args.iter().any(|a| a == "--reuse"))
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("snapshot_restore: {e}");
            std::process::exit(2);
        }
    };

    // 8 experts per layer, hidden 1024: ~32 MiB per layer (bf16).
    let hidden = 1024;
    let per_layer = 16 * hidden * hidden * 2;
    let layers = (size_mib << 20).div_ceil(per_layer).max(1);
    let defs = model_tensors(layers, hidden, 8);
    let source_layout = Layout { tp: 4, pp: 2, ep: 2, dp: 2 };
    let target_layout = Layout { tp: 2, pp: 1, ep: 4, dp: 1 };

    let t = Instant::now();
    let src = HostModel::new(build_placement("trainer-tp4-pp2-ep2-dp2", source_layout, &defs, 1), true, "trainer", 1);
    let fabricate = t.elapsed().as_secs_f64();
    let model_bytes: u64 =
        src.placement.tensors().iter().map(|t| t.global_shape().iter().product::<u64>() * t.itemsize()).sum();

    let ws = WeightStore::new(Arc::new(DirectoryStore::open(&dir).expect("open directory store")));
    let t = Instant::now();
    let manifest = src.snapshot_into(&ws).expect("snapshot");
    let snapshot = t.elapsed().as_secs_f64();
    drop(src);

    let t = Instant::now();
    let manifest = Arc::new(ws.load_manifest(manifest.manifest_key()).expect("load manifest"));
    let mut dst = HostModel::new(build_placement("serving-tp2-ep4", target_layout, &defs, 1), false, "serving", 1);
    dst.bindings = dst.make_bindings("serving", 1);
    let plan = ws
        .plan_load(manifest.clone(), dst.placement.clone(), &dst.bindings, PlanningLimits::default())
        .expect("plan load");
    let planning = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut ranges = 0;
    for b in &dst.bindings {
        let args = LoadArgs { guard: Some(&StaticGuard), ..Default::default() };
        // SAFETY: dst.buffers outlive the call and nobody else touches them.
        ranges += unsafe { ws.load(&plan, b, args) }.expect("restore").ranges;
    }
    let restore = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let verified = dst.verify().expect("verification");
    let verify = t.elapsed().as_secs_f64();

    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let gbs = |b: u64, s: f64| b as f64 / s / 1e9;
    println!("mooncake-weight-store: snapshot and resharded restore (directory store at {dir})");
    println!(
        "  model        {} tensors, {:.2} GiB bf16, {} layers x 8 experts",
        manifest.tensors().len(),
        gib(model_bytes),
        layers
    );
    println!(
        "  source       TP4 x PP2 x EP2 x DP2: {} participants, {} fragments",
        src_participants(source_layout),
        fragments_of(&defs, source_layout)
    );
    println!(
        "  target       TP2 x EP4: {} participants, {} fragments",
        dst.placement.topology().world_size(),
        dst.placement.fragment_count()
    );
    println!(
        "  stored       {} fragments (one DP replica), manifest {}",
        manifest.fragments().len(),
        manifest.manifest_digest()
    );
    println!("  regions      {} regions, {} ranges", plan.regions().len(), ranges);
    println!("  fabricate    {fabricate:>7.3} s");
    println!(
        "  snapshot     {snapshot:>7.3} s  {:>6.2} GB/s  ({:.2} GiB, fsynced)",
        gbs(model_bytes, snapshot),
        gib(model_bytes)
    );
    println!("  plan restore {planning:>7.3} s");
    println!(
        "  restore      {restore:>7.3} s  {:>6.2} GB/s  ({:.2} GiB moved)",
        gbs(plan.total_bytes(), restore),
        gib(plan.total_bytes())
    );
    println!("  verify       {verify:>7.3} s  {} bytes checked: OK", verified);
    drop((ws, plan, manifest));
    if args.iter().any(|a| a == "--keep") {
        println!("  kept the store at {} (inspect it: mws --dir {} ls)", dir, dir);
    } else if let Err(e) = store_dir.cleanup() {
        eprintln!("snapshot_restore: {e}");
    }
}

fn src_participants(l: Layout) -> u64 {
    l.tp * l.pp * l.ep * l.dp
}

fn fragments_of(defs: &[TensorDef], l: Layout) -> usize {
    build_placement("count", l, defs, 1).fragment_count()
}
