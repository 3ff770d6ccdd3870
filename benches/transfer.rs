//! Live-transfer benchmark (a benchmark, not a test), two parts measured in the same
//! run against their references:
//!
//! 1. A live reshard of the io benchmark's model (default 1 GiB; trainer TP4 x PP2 x
//!    EP2 x DP2 -> server TP2 x EP4) through the embedded `LocalEngine`, sink mode
//!    (sources push) and reader mode (targets pull), against a single-thread memcpy
//!    of the same number of bytes. Target: >= 0.7x memcpy. Every byte is verified
//!    after each mode (not timed).
//! 2. Placement -> placement planning and binding at the scale of a core-benchmark
//!    workload, next to the manifest -> placement load planning of the same target,
//!    and the peak RSS of the transfer planning and binding. With `--workload
//!    w1m-moe`: `figure: transfer_vs_load_planning_w1m` ((planning + binding) / load
//!    planning; target <= 1.2) and `figure: transfer_planning_rss_bytes_per_fragment_w1m`
//!    (target <= 1536).
//!
//! ```text
//! cargo bench --bench transfer                         # 1 GiB reshard + w100k-moe planning
//! cargo bench --bench transfer -- --size-mib 256       # smaller model
//! cargo bench --bench transfer -- --workload w1m-moe   # planning at 1.1M fragments (GiBs)
//! cargo bench --bench transfer -- --skip-reshard | --skip-planning
//! ```

#[path = "../tests/common/model.rs"]
mod model;
#[path = "workloads.rs"]
mod workloads;

use model::*;
use mooncake_weight_store::engine::local::LocalEngine;
use mooncake_weight_store::engine::{MemoryRegion, TransferEngine};
use mooncake_weight_store::plan::bound_load::LoadPlan;
use mooncake_weight_store::plan::load::{LogicalLoadPlan, PlanningLimits};
use mooncake_weight_store::plan::transfer::LogicalTransferPlan;
use mooncake_weight_store::plan::transfer_bind::TransferPlan;
use mooncake_weight_store::protocol::transfer::*;
use mooncake_weight_store::protocol::StaticGuard;
use mooncake_weight_store::*;
use std::sync::Arc;
use std::time::Instant;

fn die(context: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("transfer bench: {context}: {e}");
    std::process::exit(1)
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

fn leases_of(m: &HostModel) -> Vec<MemoryRegistrationLease> {
    m.bindings
        .iter()
        .flat_map(|b| {
            b.fragments().iter().map(|f| MemoryRegistrationLease::from_fragment(f, b.generation(), Some(b.lease_id())))
        })
        .collect()
}

fn register_all(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        let r = MemoryRegion { address: buf.as_ptr() as u64, len: buf.len() as u64, kind: MemoryKind::Host };
        // SAFETY: the buffers outlive every transfer and are unregistered before drop.
        assert_eq!(unsafe { engine.register_memory(r) }.unwrap(), 0);
    }
}

fn unregister_all(engine: &LocalEngine, m: &HostModel) {
    for buf in &m.buffers {
        assert_eq!(engine.unregister_memory(buf.as_ptr() as u64).unwrap(), 0);
    }
}

fn sink_once(
    ex: &TransferExecutor,
    plan: &TransferPlan,
    src: &HostModel,
    dst: &HostModel,
    leases: &[MemoryRegistrationLease],
) -> f64 {
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = SinkArgs {
        target_registrations: Some(leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let t = Instant::now();
    for b in &src.bindings {
        // SAFETY: both models' buffers outlive the call and nobody else touches them.
        unsafe { ex.execute_sink(plan, &src.placement, b, &dst.placement, &dst.bindings, &args) }
            .unwrap_or_else(|e| die("sink", e));
    }
    t.elapsed().as_secs_f64()
}

fn reader_once(
    ex: &TransferExecutor,
    plan: &TransferPlan,
    src: &HostModel,
    dst: &HostModel,
    leases: &[MemoryRegistrationLease],
) -> f64 {
    let guards = GuardProviders::all(Arc::new(StaticGuard));
    let args = ReaderArgs {
        source_pre_registered: true,
        source_registrations: Some(leases),
        source_guards: Some(&guards),
        target_guards: Some(&guards),
        ..Default::default()
    };
    let t = Instant::now();
    for b in &dst.bindings {
        // SAFETY: both models' buffers outlive the call and nobody else touches them.
        unsafe { ex.execute_reader(plan, &src.placement, &src.bindings, &dst.placement, b, &args) }
            .unwrap_or_else(|e| die("reader", e));
    }
    t.elapsed().as_secs_f64()
}

fn direct_copy(plan: &TransferPlan) -> f64 {
    use mooncake_weight_store::plan::transfer_bind::Side;
    let t = Instant::now();
    for (i, r) in plan.regions().iter().enumerate() {
        let (_, s) = plan.operation_fragment(i, Side::Source);
        let (_, d) = plan.operation_fragment(i, Side::Target);
        r.for_each_segment(u64::MAX, |so, to, n| {
            // SAFETY: the bound plan's fragments are live host buffers of the models
            // (checked against their views by the planner), disjoint between sides.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (s.address() + so) as *const u8,
                    (d.address() + to) as *mut u8,
                    n as usize,
                )
            }
        })
        .unwrap_or_else(|e| die("direct copy", e));
    }
    t.elapsed().as_secs_f64()
}

fn reshard(size_mib: u64) {
    let hidden = 1024;
    let layers = (size_mib << 20).div_ceil(16 * hidden * hidden * 2).max(1);
    let defs = model_tensors(layers, hidden, 8);
    let src =
        HostModel::new(build_placement("trainer", Layout { tp: 4, pp: 2, ep: 2, dp: 2 }, &defs, 1), true, "trainer", 1);
    let mut dst = HostModel::new(
        build_placement("serving", Layout { tp: 2, pp: 1, ep: 4, dp: 1 }, &defs, 1),
        false,
        "serving",
        1,
    );
    let t = Instant::now();
    let logical = LogicalTransferPlan::plan(src.placement.clone(), dst.placement.clone(), PlanningLimits::default())
        .unwrap_or_else(|e| die("plan", e));
    let plan = TransferPlan::bind(&logical, &dst.bindings, &src.bindings).unwrap_or_else(|e| die("bind", e));
    let plan_s = t.elapsed().as_secs_f64();
    let bytes = plan.total_bytes();
    let gb = |s: f64| bytes as f64 / s / 1e9;
    let memcpy = memcpy_seconds(bytes as usize);
    println!(
        "live reshard TP4xPP2xEP2xDP2 -> TP2xEP4: {} regions, {} segments, {:.2} GiB; plan+bind {:.3} s",
        plan.regions().len(),
        logical.total_segments(),
        bytes as f64 / (1u64 << 30) as f64,
        plan_s
    );
    println!("memcpy of the same bytes (1 thread)      {memcpy:>7.3} s {:>6.2} GB/s", gb(memcpy));
    // The floor of this plan on this machine: every segment copied by a plain loop
    // (no executor, no engine, no checks), single thread.
    let direct = (0..3).map(|_| direct_copy(&plan)).fold(f64::MAX, f64::min);
    println!(
        "direct segment copies (no executor)     {direct:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2}x",
        gb(direct),
        memcpy / direct
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    for (label, engine, limits) in [
        ("1 thread, batches of 1024", LocalEngine::new(), ExecutorLimits::default()),
        (
            "threaded, batches of 65536",
            LocalEngine::with_threads(threads, 0),
            ExecutorLimits { max_batch_operations: 65536, ..Default::default() },
        ),
    ] {
        println!("LocalEngine {label} ({} copy threads):", if label.starts_with('1') { 1 } else { threads });
        engine_modes(Arc::new(engine), limits, &plan, &src, &mut dst, memcpy, bytes);
    }
}

fn engine_modes(
    engine: Arc<LocalEngine>,
    limits: ExecutorLimits,
    plan: &TransferPlan,
    src: &HostModel,
    dst: &mut HostModel,
    memcpy: f64,
    bytes: u64,
) {
    let plan = plan.clone();
    let gb = |s: f64| bytes as f64 / s / 1e9;
    for buf in &mut dst.buffers {
        buf.fill(0xA5);
    }
    let ex = TransferExecutor::new(engine.clone(), limits).unwrap_or_else(|e| die("executor", e));

    // Sink mode: the owner pre-registers the targets; each source registers its own.
    register_all(&engine, dst);
    let leases = leases_of(dst);
    let sink = (0..3).map(|_| sink_once(&ex, &plan, src, dst, &leases)).fold(f64::MAX, f64::min);
    unregister_all(&engine, dst);
    dst.verify().unwrap_or_else(|e| die("sink verify", e));
    println!(
        "  sink   (sources push)                 {sink:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2}x",
        gb(sink),
        memcpy / sink
    );
    for buf in &mut dst.buffers {
        buf.fill(0xA5);
    }
    // Reader mode: the owners pre-register the sources; each target registers its own.
    register_all(&engine, src);
    let leases = leases_of(src);
    let read = (0..3).map(|_| reader_once(&ex, &plan, src, dst, &leases)).fold(f64::MAX, f64::min);
    unregister_all(&engine, src);
    dst.verify().unwrap_or_else(|e| die("reader verify", e));
    println!(
        "  reader (targets pull)                 {read:>7.3} s {:>6.2} GB/s | ratio to memcpy {:.2}x",
        gb(read),
        memcpy / read
    );
}

/// `workloads::bindings` with instance ids prefixed (so source and target
/// participants of equal ids live in different address spaces).
fn prefixed(bindings: Vec<RuntimeBinding>, prefix: &str) -> Vec<RuntimeBinding> {
    bindings
        .into_iter()
        .map(|b| {
            RuntimeBinding::new(RuntimeBindingSpec {
                resource_id: b.resource_id().into(),
                placement_id: b.placement_id().into(),
                placement_digest: b.placement_digest().into(),
                instance_id: format!("{prefix}{}", b.instance_id()),
                generation: b.generation(),
                lease_id: b.lease_id().into(),
                revision: b.revision().into(),
                participant_id: b.participant_id().into(),
                fragments: b.fragments().to_vec(),
            })
            .unwrap_or_else(|e| die("binding", e))
        })
        .collect()
}

/// Best wall time of `reps` runs of `f` and the last result. The previous result is
/// dropped before each run, so at most one is alive (what the peak RSS sees).
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..reps {
        drop(out.take());
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (best, out.expect("reps >= 1"))
}

/// Peak resident memory from now on: returns freed heap to the system
/// (`malloc_trim`), then resets the kernel's high-water mark to the current RSS
/// (`/proc/self/clear_refs`, value 5). False where that is not possible.
fn reset_peak_rss() -> bool {
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe { libc::malloc_trim(0) };
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The kernel's high-water mark of this process's RSS (`VmHWM`), bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Placement -> placement planning and binding next to the load planning of the
/// same target (issue 28 item 4): best of `reps` each, the peak RSS of the transfer
/// planning and binding with their inputs alive (both placements and both sides'
/// bindings), per source placement fragment. At w1m-moe the figures
/// `transfer_vs_load_planning_w1m` ((transfer planning + binding) / load planning)
/// and `transfer_planning_rss_bytes_per_fragment_w1m` are printed.
fn planning(name: &str, reps: usize) {
    let path = workloads::default_path();
    let file = workloads::WorkloadFile::load(&path).unwrap_or_else(|e| die("workloads", e));
    let w = file.find(name).unwrap_or_else(|| die("workload", format!("unknown workload {name}")));
    let src = Arc::new(
        workloads::build_placement(&file, w, w.source, w.source_set_id()).unwrap_or_else(|e| die("source", e)),
    );
    let dst = Arc::new(
        workloads::build_placement(&file, w, w.target, w.target_set_id()).unwrap_or_else(|e| die("target", e)),
    );
    let sb = prefixed(workloads::bindings(&src).unwrap_or_else(|e| die("source bindings", e)), "src-");
    let tb = prefixed(workloads::bindings(&dst).unwrap_or_else(|e| die("target bindings", e)), "dst-");
    println!(
        "planning workload {name}: {} source fragments, {} target fragments",
        src.fragment_count(),
        dst.fragment_count()
    );
    // The load side: the stored manifest of the same source, planned into the target.
    let upload = plan_upload(&src, &sb, &workloads::upload_options()).unwrap_or_else(|e| die("plan_upload", e));
    let manifest = Arc::new(upload.manifest().clone());
    drop(upload);
    let (load_s, load) = best(reps, || {
        LogicalLoadPlan::plan(manifest.clone(), dst.clone(), PlanningLimits::default())
            .unwrap_or_else(|e| die("load plan", e))
    });
    let load_regions = load.regions().len();
    let mut load_bind_s = f64::MAX;
    for _ in 0..reps {
        let logical = load.clone(); // not timed: LoadPlan::bind takes the plan by value
        let t = Instant::now();
        let bound = LoadPlan::bind(logical, &tb).unwrap_or_else(|e| die("load bind", e));
        load_bind_s = load_bind_s.min(t.elapsed().as_secs_f64());
        drop(bound);
    }
    drop((load, manifest));
    let (plan_s, logical) = best(reps, || {
        LogicalTransferPlan::plan(src.clone(), dst.clone(), PlanningLimits::default())
            .unwrap_or_else(|e| die("transfer plan", e))
    });
    let (bind_s, bound) = best(reps, || TransferPlan::bind(&logical, &tb, &sb).unwrap_or_else(|e| die("bind", e)));
    let (logical_regions, source_execs, target_execs) = (
        logical.regions().len(),
        bound.executors(mooncake_weight_store::plan::transfer_bind::Side::Source).len(),
        bound.executors(mooncake_weight_store::plan::transfer_bind::Side::Target).len(),
    );
    drop((bound, logical));
    // The peak RSS of one more planning and binding, untimed, from a heap trimmed
    // to what is live (the timed runs above reuse the heap the earlier stages freed,
    // as the load planning did; trimming before them would charge the transfer
    // alone for faulting fresh pages).
    let rss_reset = reset_peak_rss();
    let logical = LogicalTransferPlan::plan(src.clone(), dst.clone(), PlanningLimits::default())
        .unwrap_or_else(|e| die("transfer plan", e));
    let bound = TransferPlan::bind(&logical, &tb, &sb).unwrap_or_else(|e| die("bind", e));
    let rss = peak_rss_bytes();
    let per_fragment = rss as f64 / src.fragment_count() as f64;
    let ratio = (plan_s + bind_s) / load_s;
    println!("load planning (manifest -> placement)      {load_s:>8.3} s  {load_regions} regions");
    println!("  + binding to the target bindings          {load_bind_s:>8.3} s  (LoadPlan::bind, for reference)");
    drop((bound, logical));
    println!(
        "transfer planning (placement -> placement) {plan_s:>8.3} s  {logical_regions} regions | ratio to load planning {:.2}x",
        plan_s / load_s
    );
    println!(
        "binding (both sides, executor plans)       {bind_s:>8.3} s  {source_execs} source + {target_execs} target executors"
    );
    println!(
        "transfer planning + binding                {:>8.3} s  ratio to load planning {ratio:.2}x (target <= 1.2x); \
         to load planning + binding {:.2}x",
        plan_s + bind_s,
        (plan_s + bind_s) / (load_s + load_bind_s)
    );
    println!(
        "peak RSS during transfer planning + binding {:.1} MiB = {per_fragment:.0} B per source fragment \
         (inputs included; target <= 1536){}",
        rss as f64 / (1u64 << 20) as f64,
        if rss_reset { "" } else { " [high-water mark not resettable: whole process]" }
    );
    if name == "w1m-moe" {
        println!("figure: transfer_vs_load_planning_w1m = {ratio:.3}");
        println!("figure: transfer_planning_rss_bytes_per_fragment_w1m = {per_fragment:.0}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let has = |name: &str| args.iter().any(|a| a == name);
    let size_mib: u64 = arg("--size-mib").map(|s| s.parse().expect("--size-mib N")).unwrap_or(1024);
    let workload = arg("--workload").unwrap_or_else(|| "w100k-moe".into());
    let reps: usize = arg("--reps").map(|s| s.parse().expect("--reps N")).unwrap_or(3);
    if !has("--skip-reshard") {
        reshard(size_mib);
    }
    if !has("--skip-planning") {
        planning(&workload, reps.max(1));
    }
}
