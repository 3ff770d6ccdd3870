//! Core benchmark: the stages of `shared/bench/README.md` on the synthetic
//! workloads of `shared/bench/workloads.json`, compared with the reference
//! (Python `mooncake-reshard`) timings of that README.
//!
//! ```text
//! cargo bench --bench core                  # w1k-dense, w10k-moe, w100k-moe
//! cargo bench --bench core -- --all         # + w1m-moe (1.1M fragments; minutes, GiBs)
//! cargo bench --bench core -- --only w10k   # one workload (name or unique prefix)
//! cargo bench --bench core -- --reps 1      # runs per stage (default 3, best shown)
//! ```
//! Env: `MWS_BENCH_ALL=1` (= `--all`), `MWS_BENCH_WORKLOADS=<path>` (default
//! `../shared/bench/workloads.json` from the crate root), `MWS_BENCH_REPS=<n>`.
//!
//! Each workload runs in a fresh child process (this binary re-executed with
//! `MWS_BENCH_CHILD=<name>`), which first rebuilds the workload from the rules and
//! checks every expected count and id (byte-for-byte identity), times the stages
//! (single thread, best of N; a stage whose first run exceeds 20 s runs once, as
//! in the reference) and reports its `ru_maxrss`. Any mismatch or error makes the
//! benchmark exit non-zero.

#[path = "workloads.rs"]
mod workloads;

use mooncake_weight_store::{plan_upload, sha256_hex, Placement, StoredManifest};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;
use workloads::{Workload, WorkloadFile};

/// Workloads run by default (w1m-moe needs `--all`).
const DEFAULT_WORKLOADS: [&str; 3] = ["w1k-dense", "w10k-moe", "w100k-moe"];
const CHILD_ENV: &str = "MWS_BENCH_CHILD";
const SINGLE_RUN_OVER_S: f64 = 20.0;

// ---------------------------------------------------------------------------
// Heap accounting: live bytes and their peak, so that each stage can report the
// extra heap it needed (like the reference's tracemalloc pass, but in the timed
// run itself; the cost is a few plain loads and stores per allocation on the
// main thread, an atomic add on others).
// ---------------------------------------------------------------------------
struct CountingAlloc;
static HEAP_PEAK: AtomicUsize = AtomicUsize::new(0);
/// Live bytes counted by the bench's main thread (plain loads and stores: only
/// that thread writes it) and by every other thread (atomic adds). Each may wrap
/// below zero (one thread frees what another allocated); their sum is the live
/// heap.
static HEAP_MAIN: AtomicUsize = AtomicUsize::new(0);
static HEAP_OTHER: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the bench's main thread (const-initialized, no destructor: reading
    /// it never allocates, so the allocator may).
    static MAIN_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn heap_live() -> usize {
    HEAP_MAIN.load(Relaxed).wrapping_add(HEAP_OTHER.load(Relaxed))
}

// Planning stages run parts of their work on scoped threads: the main thread keeps
// its cheap plain counter, the others add atomically, so no update is lost. The
// peak is a plain load and store, approximate while other threads allocate.
#[inline(always)]
fn heap_add(n: usize) {
    if MAIN_THREAD.with(Cell::get) {
        HEAP_MAIN.store(HEAP_MAIN.load(Relaxed).wrapping_add(n), Relaxed);
    } else {
        HEAP_OTHER.fetch_add(n, Relaxed);
    }
    let live = heap_live();
    if live > HEAP_PEAK.load(Relaxed) {
        HEAP_PEAK.store(live, Relaxed);
    }
}
#[inline(always)]
fn heap_sub(n: usize) {
    if MAIN_THREAD.with(Cell::get) {
        HEAP_MAIN.store(HEAP_MAIN.load(Relaxed).wrapping_sub(n), Relaxed);
    } else {
        HEAP_OTHER.fetch_sub(n, Relaxed);
    }
}

// SAFETY: every call forwards to the system allocator unchanged; the counters are
// plain atomics and never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's `GlobalAlloc::alloc` contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            heap_add(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's `GlobalAlloc::alloc_zeroed` contract.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            heap_add(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwards the caller's `GlobalAlloc::dealloc` contract.
        unsafe { System.dealloc(p, l) };
        heap_sub(l.size());
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwards the caller's `GlobalAlloc::realloc` contract.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            heap_sub(l.size());
            heap_add(new_size);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------
// Reference (Python) seconds, from shared/bench/README.md ("Results (seconds)").
// Columns: w1k-dense, w10k-moe, w100k-moe, w1m-moe.
// ---------------------------------------------------------------------------
const REFERENCE_WORKLOADS: [&str; 4] = ["w1k-dense", "w10k-moe", "w100k-moe", "w1m-moe"];
/// (stage key, reference seconds per workload).
const REFERENCE_SECONDS: [(&str, [f64; 4]); 12] = [
    ("a0", [0.024, 0.235, 1.957, 25.8]),
    ("a", [0.035, 0.507, 7.669, 218.2]),
    ("a_digest", [0.006, 0.074, 1.087, 15.2]),
    ("b_to", [0.006, 0.067, 1.064, 14.6]),
    ("b_from", [0.065, 0.899, 10.8, 260.6]),
    ("c0", [0.011, 0.123, 1.078, 13.8]),
    ("c", [0.025, 0.270, 3.399, 71.5]),
    ("d_to", [0.007, 0.061, 0.546, 3.870]),
    ("d_from", [0.021, 0.165, 2.150, 13.7]),
    ("d_digest", [0.007, 0.064, 0.576, 4.226]),
    ("e0", [0.018, 0.202, 9.031, 19.1]),
    ("e", [0.050, 0.616, 24.8, 81.5]),
];
/// Reference peak RSS of the whole process (MiB), same README table.
const REFERENCE_RSS_MIB: [f64; 4] = [35.0, 82.0, 495.0, 3784.0];

/// (stage key, label) in print order.
const STAGES: [(&str, &str); 20] = [
    ("a0", "a0  build PlacementFragments (info)"),
    ("a", "(a) from_fragments"),
    ("a_digest", "(a) digest = compute_digest() [1]"),
    ("a_sha", "(a) baseline: sha256 of those bytes [2]"),
    ("b_to", "(b) placement to_json"),
    ("b_copy", "(b) baseline: copy into fresh memory [3]"),
    ("b_skim", "(b) baseline: JSON skim, nothing built [4]"),
    ("b_from", "(b) placement from_json"),
    ("c0", "c0  build runtime bindings (info)"),
    ("c", "(c) plan_upload"),
    ("c_to", "(c) upload plan transport to_json"),
    ("c_from", "(c) upload plan transport from_json"),
    ("d_to", "(d) manifest to_json"),
    ("d_copy", "(d) baseline: copy into fresh memory [3]"),
    ("d_skim", "(d) baseline: JSON skim, nothing built [4]"),
    ("d_from", "(d) manifest from_json"),
    ("d_digest", "(d) digest = compute_digest() [1]"),
    ("d_sha", "(d) baseline: sha256 of those bytes [2]"),
    ("e0", "e0  build target placement (info)"),
    ("e", "(e) plan load to target"),
];

fn reference_seconds(workload: &str, stage: &str) -> Option<f64> {
    let col = REFERENCE_WORKLOADS.iter().position(|w| *w == workload)?;
    REFERENCE_SECONDS.iter().find(|(k, _)| *k == stage).map(|(_, v)| v[col])
}

fn reference_rss_mib(workload: &str) -> Option<f64> {
    REFERENCE_WORKLOADS.iter().position(|w| *w == workload).map(|i| REFERENCE_RSS_MIB[i])
}

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

fn fmt_secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.1}")
    } else if s >= 1.0 {
        format!("{s:.3}")
    } else {
        format!("{s:.6}")
    }
}

fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e9 {
        format!("{:.2}G/s", per_s / 1e9)
    } else if per_s >= 1e6 {
        format!("{:.2}M/s", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1}k/s", per_s / 1e3)
    } else {
        format!("{per_s:.0}/s")
    }
}

fn fmt_int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn die(context: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("ERROR: {context}: {e}");
    std::process::exit(2);
}

// ---------------------------------------------------------------------------
// Child: one workload
// ---------------------------------------------------------------------------

struct Timing {
    best: f64,
    /// Thread CPU time of the run that gave `best` (wall time minus waiting for a
    /// core: the fairer figure on a shared machine).
    cpu: f64,
    runs: usize,
    /// Peak heap above the heap live at the start of the (last) timed run, bytes.
    heap_extra: usize,
}

/// Runs `setup` (untimed) then `run` (timed) up to `reps` times and returns the
/// best time and the last result. The previous result is dropped before the next
/// setup, outside the timer, so at most one result is alive.
/// The floor of a `to_json` row: the same bytes copied into a new allocation of
/// the same size (first-touch page faults included, as a fresh `String` pays them).
/// Reads the whole document with serde_json, building nothing (`IgnoredAny`): what
/// tokenizing alone costs, a floor under any decoder of the same bytes.
fn json_skim(s: &str) -> serde::de::IgnoredAny {
    serde_json::from_str::<serde::de::IgnoredAny>(s).unwrap_or_else(|e| die("json skim", e))
}

fn fresh_copy(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len());
    advise_huge_pages(&mut v);
    v.extend_from_slice(s.as_bytes());
    v
}

/// What the crate's writers do with a large output buffer before writing it
/// (`mem::advise_huge_pages`, from 64 MiB): the aligned interior of the spare capacity
/// advised for transparent huge pages, so the floor row is charged the same
/// page faults as the to_json row.
fn advise_huge_pages(v: &mut Vec<u8>) {
    const HUGE: usize = 2 << 20;
    const MIN_BYTES: usize = 64 << 20;
    if v.capacity() < MIN_BYTES {
        return;
    }
    let start = v.as_ptr() as usize;
    let (lo, hi) = ((start + HUGE - 1) & !(HUGE - 1), (start + v.capacity()) & !(HUGE - 1));
    if hi > lo {
        // SAFETY: [lo, hi) lies inside the allocation `v` owns; the advice changes
        // no contents.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
}

/// glibc keeps freed small blocks in "fast bins" and coalesces them only when a
/// later request needs a large block, so the first large allocation after many
/// small frees pays for all of them: at w1m-moe, 100 ms of the placement digest
/// stage was its first 1 MiB buffer, right after the bench dropped its 1.1 M input
/// fragments. One large request before the clock starts settles what the bench
/// (or an earlier stage) freed; a stage still pays for its own frees.
fn settle_allocator() {
    drop(std::hint::black_box(Vec::<u8>::with_capacity(64 << 10)));
}

fn bench<I, T>(reps: usize, mut setup: impl FnMut() -> I, mut run: impl FnMut(I) -> T) -> (Timing, T) {
    let mut best = f64::INFINITY;
    let mut best_cpu = f64::INFINITY;
    let mut out: Option<T> = None;
    let mut runs = 0;
    let mut heap_extra = 0;
    for _ in 0..reps.max(1) {
        drop(out.take());
        let input = setup();
        settle_allocator();
        let base = heap_live();
        HEAP_PEAK.store(base, Relaxed);
        let c0 = thread_cpu_seconds();
        let t0 = Instant::now();
        let v = run(input);
        let dt = t0.elapsed().as_secs_f64();
        let dc = thread_cpu_seconds() - c0;
        heap_extra = HEAP_PEAK.load(Relaxed).saturating_sub(base);
        out = Some(v);
        runs += 1;
        best = best.min(dt);
        best_cpu = best_cpu.min(dc);
        if dt > SINGLE_RUN_OVER_S {
            break;
        }
    }
    (Timing { best, cpu: best_cpu, runs, heap_extra }, out.expect("at least one run"))
}

/// CPU time of the calling thread, seconds.
fn thread_cpu_seconds() -> f64 {
    // SAFETY: clock_gettime writes into the zeroed timespec we own.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) != 0 {
            return 0.0;
        }
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
}

struct Checks {
    lines: Vec<String>,
    failed: usize,
}

impl Checks {
    fn count(&mut self, w: &Workload, key: &str, got: u64) {
        match w.expected_counts.get(key) {
            Some(&exp) if exp == got => self.lines.push(format!("OK       {key:<22} {}", fmt_int(got))),
            Some(&exp) => {
                self.failed += 1;
                self.lines.push(format!("MISMATCH {key:<22} {} (expected {})", fmt_int(got), fmt_int(exp)));
            }
            None => self.lines.push(format!("n/a      {key:<22} {} (no expectation)", fmt_int(got))),
        }
    }

    fn id(&mut self, w: &Workload, key: &str, got: &str) {
        match w.expected_ids.get(key) {
            Some(exp) if exp == got => self.lines.push(format!("OK       {key:<22} {got}")),
            Some(exp) => {
                self.failed += 1;
                self.lines.push(format!("MISMATCH {key:<22} {got} (expected {exp})"));
            }
            None => {
                self.failed += 1;
                self.lines.push(format!("MISMATCH {key:<22} {got} (no expected id in workloads.json)"));
            }
        }
    }

    fn same(&mut self, label: &str, ok: bool) {
        if ok {
            self.lines.push(format!("OK       {label}"));
        } else {
            self.failed += 1;
            self.lines.push(format!("MISMATCH {label}"));
        }
    }
}

fn max_rss_bytes() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0;
        }
        ru.ru_maxrss as u64 * 1024 // kilobytes on Linux
    }
}

fn run_child(file: &WorkloadFile, w: &Workload, reps: usize) -> i32 {
    MAIN_THREAD.with(|m| m.set(true));
    let rules = &file.rules;
    let src = w.source;
    let gen = w.tensors(rules, src).unwrap_or_else(|e| die("tensors", e));
    let descriptors = workloads::descriptors(&gen).unwrap_or_else(|e| die("tensor descriptors", e));
    let topology = workloads::topology(src).unwrap_or_else(|e| die("topology", e));
    let mut times: Vec<(&str, Timing)> = Vec::new();

    // a0: the PlacementFragment objects (content-derived ids).
    let (t, frags) = bench(reps, || (), |_| workloads::fragments(&gen, src, rules.itemsize));
    let frags = frags.unwrap_or_else(|e| die("fragments", e));
    times.push(("a0", t));
    let n_frags = frags.len() as u64;

    // (a) from_fragments: assemble, validate, placement_id (and, in this crate, the digest).
    let (t, placement) = bench(
        reps,
        || workloads::flat_spec(w, w.source_set_id(), topology.clone(), descriptors.clone(), frags.clone()),
        Placement::from_fragments,
    );
    let placement = placement.unwrap_or_else(|e| die("from_fragments", e));
    times.push(("a", t));
    drop(frags);

    // (a) digest: computed at construction here, so time what it costs: the
    // canonical JSON hashed as it is written (what construction does; large
    // documents hash on a second thread while the first serializes).
    let (t, digest) = bench(reps, || (), |_| placement.compute_digest());
    times.push(("a_digest", t));

    // (b) to_json, from_json.
    let (t, placement_json) = bench(reps, || (), |_| placement.to_json());
    times.push(("b_to", t));
    let (t, _) = bench(reps, || (), |_| fresh_copy(&placement_json));
    times.push(("b_copy", t));
    // The physical limit of the digest row: SHA-256 alone over the already
    // serialized bytes (one stream cannot hash faster).
    let (t, sha_only) = bench(reps, || (), |_| sha256_hex(placement_json.as_bytes()));
    times.push(("a_sha", t));
    let sha_only_matches = sha_only == digest;
    let (t, _) = bench(reps, || (), |_| json_skim(&placement_json));
    times.push(("b_skim", t));
    let (t, reparsed) = bench(reps, || (), |_| Placement::from_json(placement_json.as_bytes()));
    let reparsed = reparsed.unwrap_or_else(|e| die("placement from_json", e));
    times.push(("b_from", t));
    let placement_roundtrip = reparsed == placement;
    // A pipeline has no use for the document once it is written and read back:
    // keep its length (checked below), not its bytes, through the later stages.
    let placement_json_bytes = placement_json.len() as u64;
    drop((reparsed, placement_json));

    // c0: bindings.
    let (t, bindings) = bench(reps, || (), |_| workloads::bindings(&placement));
    let bindings = bindings.unwrap_or_else(|e| die("bindings", e));
    times.push(("c0", t));

    // (c) plan_upload.
    let options = workloads::upload_options();
    let (t, plan) = bench(reps, || (), |_| plan_upload(&placement, &bindings, &options));
    let plan = plan.unwrap_or_else(|e| die("plan_upload", e));
    times.push(("c", t));
    let manifest = plan.manifest();

    // (d) manifest to_json, from_json, digest.
    let (t, manifest_json) = bench(reps, || (), |_| manifest.to_json());
    times.push(("d_to", t));
    let (t, _) = bench(reps, || (), |_| fresh_copy(&manifest_json));
    times.push(("d_copy", t));
    let (t, _) = bench(reps, || (), |_| json_skim(&manifest_json));
    times.push(("d_skim", t));
    let (t, manifest2) = bench(reps, || (), |_| StoredManifest::from_json(manifest_json.as_bytes()));
    let manifest2 = manifest2.unwrap_or_else(|e| die("manifest from_json", e));
    times.push(("d_from", t));
    let manifest_roundtrip = manifest2 == *manifest;
    drop(manifest2);
    let (t, manifest_digest) = bench(reps, || (), |_| manifest.compute_digest());
    times.push(("d_digest", t));
    let (t, sha_only) = bench(reps, || (), |_| sha256_hex(manifest_json.as_bytes()));
    times.push(("d_sha", t));
    let manifest_sha_only_matches = sha_only == manifest_digest;
    let manifest_json_bytes = manifest_json.len() as u64;
    drop(manifest_json);

    // e0: target placement (tensors, fragments, from_fragments).
    let (t, target) = bench(reps, || (), |_| workloads::build_placement(file, w, w.target, w.target_set_id()));
    let target = std::sync::Arc::new(target.unwrap_or_else(|e| die("target placement", e)));
    times.push(("e0", t));

    // (e) load planning: the stored manifest into the target placement (default
    // limits, which accept these workloads; the reference needed raised limits).
    let shared_manifest = std::sync::Arc::new(manifest.clone());
    let (t, load) = bench(
        reps,
        || (),
        |_| {
            mooncake_weight_store::plan::load::LogicalLoadPlan::plan(
                shared_manifest.clone(),
                target.clone(),
                mooncake_weight_store::plan::load::PlanningLimits::default(),
            )
        },
    );
    let load = load.unwrap_or_else(|e| die("plan load", e));
    times.push(("e", t));

    // The peak over the reference's stages (a)-(e), before the stages it does not
    // have: the upload plan's transport holds the plan, its JSON and a decoded
    // second plan at once.
    let rss_reference_stages = max_rss_bytes();

    // (c) the upload plan's transport between processes (encode, strict decode);
    // printed with (c), run last.
    let (t, plan_json) = bench(reps, || (), |_| mooncake_weight_store::plan_to_json(&plan));
    times.push(("c_to", t));
    let (t, plan2) = bench(reps, || (), |_| mooncake_weight_store::plan_from_json(plan_json.as_bytes()));
    let plan2 = plan2.unwrap_or_else(|e| die("upload plan from_json", e));
    times.push(("c_from", t));
    let plan_roundtrip = plan2 == plan;
    drop((plan2, plan_json));

    // Checks.
    let mut c = Checks { lines: Vec::new(), failed: 0 };
    c.count(w, "tensors", placement.tensors().len() as u64);
    c.count(w, "placement_fragments", placement.fragment_count() as u64);
    c.count(w, "participants", placement.topology().participants().len() as u64);
    let logical: u128 = placement.tensors().iter().map(|t| t.byte_volume_of(t.global_shape())).sum();
    c.count(w, "logical_bytes", logical as u64);
    c.count(w, "placement_json_bytes", placement_json_bytes);
    c.count(w, "upload_operations", plan.operations().len() as u64);
    c.count(w, "stored_fragments", manifest.fragments().len() as u64);
    c.count(w, "manifest_json_bytes", manifest_json_bytes);
    c.count(w, "target_fragments", target.fragment_count() as u64);
    c.count(w, "load_regions", load.regions().len() as u64);
    c.count(w, "load_segments", load.total_segments());
    c.count(w, "load_total_bytes", load.total_bytes());
    c.id(w, "placement_id", placement.placement_id());
    c.id(w, "placement_digest", placement.digest());
    c.id(w, "topology_id", placement.topology().topology_id());
    c.id(w, "manifest_digest", manifest.manifest_digest());
    c.id(w, "target_placement_id", target.placement_id());
    c.same("placement.digest() == sha256(to_json())", digest == placement.digest());
    c.same("placement sha256 baseline == digest", sha_only_matches);
    c.same("manifest sha256 baseline == digest", manifest_sha_only_matches);
    c.same("manifest_digest() == sha256(to_json())", manifest_digest == manifest.manifest_digest());
    c.same("placement from_json(to_json()) == placement", placement_roundtrip);
    c.same("manifest from_json(to_json()) == manifest", manifest_roundtrip);
    c.same("upload plan transport from_json(to_json()) == plan", plan_roundtrip);
    c.same("source fragment count == a0 count", n_frags == placement.fragment_count() as u64);

    let rss = max_rss_bytes();
    drop((bindings, plan, load, shared_manifest, target));
    let live = heap_live();
    drop(placement);
    let placement_heap = live.saturating_sub(heap_live());

    // Report.
    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "\n== {}: {} tensors, {} source placement fragments, {} participants (tp/pp/ep/dp {}/{}/{}/{}) ==",
        w.name,
        fmt_int(w.expected_counts.get("tensors").copied().unwrap_or(0)),
        fmt_int(n_frags),
        fmt_int(src.tp * src.pp * src.ep * src.dp),
        src.tp,
        src.pp,
        src.ep,
        src.dp
    );
    let _ = writeln!(out, "checks ({} failed):", c.failed);
    for l in &c.lines {
        let _ = writeln!(out, "  {l}");
    }
    let _ = writeln!(
        out,
        "  {:<38} {:>11} {:>4} {:>10} {:>10} {:>9} {:>10} {:>11}",
        "stage", "ours (s)", "runs", "frags/s", "ref (s)", "ref/ours", "+heap MiB", "cpu (s)"
    );
    for (key, label) in STAGES {
        let reference = reference_seconds(&w.name, key);
        let ref_s = reference.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
        match times.iter().find(|(k, _)| *k == key) {
            Some((_, t)) => {
                let speedup = reference.map(|r| format!("{:.0}x", r / t.best)).unwrap_or_else(|| "-".into());
                let _ = writeln!(
                    out,
                    "  {:<38} {:>11} {:>4} {:>10} {:>10} {:>9} {:>10.1} {:>11}",
                    label,
                    fmt_secs(t.best),
                    t.runs,
                    fmt_rate(n_frags as f64 / t.best),
                    ref_s,
                    speedup,
                    t.heap_extra as f64 / (1024.0 * 1024.0),
                    fmt_secs(t.cpu)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:<38} {:>11} {:>4} {:>10} {:>10} {:>9}  (not measured)",
                    label, "n/a", "", "n/a", ref_s, "-"
                );
            }
        }
    }
    let best = |k: &str| times.iter().find(|(key, _)| *key == k).map(|(_, t)| t.best);
    for (digest, sha, label) in [("a_digest", "a_sha", "placement"), ("d_digest", "d_sha", "manifest")] {
        if let (Some(d), Some(s)) = (best(digest), best(sha)) {
            let _ = writeln!(out, "  {label} digest / sha256-only = {:.2}x (target <= 1.3x)", d / s);
        }
    }
    let _ = writeln!(
        out,
        "  peak RSS over the reference's stages (a)-(e) {:.1} MiB = {:.0} B per placement fragment (reference {} MiB); \
         a built Placement holds {:.1} MiB = {:.0} B/frag",
        rss_reference_stages as f64 / (1024.0 * 1024.0),
        rss_reference_stages as f64 / n_frags as f64,
        reference_rss_mib(&w.name).map(|m| format!("{m:.0}")).unwrap_or_else(|| "-".into()),
        placement_heap as f64 / (1024.0 * 1024.0),
        placement_heap as f64 / n_frags as f64
    );
    let _ = writeln!(
        out,
        "  peak RSS of the whole process, with the upload plan transport stages (not in the reference) {:.1} MiB = {:.0} B/frag",
        rss as f64 / (1024.0 * 1024.0),
        rss as f64 / n_frags as f64
    );
    // Machine-readable lines for the parent: each stage's speedup over the
    // reference, then the summary.
    for (key, _) in STAGES {
        if let (Some(r), Some(t)) = (reference_seconds(&w.name, key), best(key)) {
            let _ = writeln!(out, "@@R {key} {}", r / t);
        }
    }
    let _ = writeln!(out, "@@ {} {} {} {} {}", w.name, n_frags, rss_reference_stages, rss, c.failed);
    print!("{out}");
    let _ = std::io::stdout().flush();
    if c.failed > 0 {
        1
    } else {
        0
    }
}

// ---------------------------------------------------------------------------
// Parent: select workloads, run each in a child, summarize memory
// ---------------------------------------------------------------------------

struct Options {
    all: bool,
    only: Option<String>,
    reps: usize,
}

fn parse_options() -> Options {
    let env_flag = |k: &str| std::env::var(k).map(|v| !v.is_empty() && v != "0").unwrap_or(false);
    let mut o = Options {
        all: env_flag("MWS_BENCH_ALL"),
        only: None,
        reps: std::env::var("MWS_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--all" => o.all = true,
            "--only" => o.only = Some(args.next().unwrap_or_else(|| die("--only", "needs a workload name"))),
            "--reps" => {
                o.reps = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| die("--reps", "needs a positive integer"))
            }
            "-h" | "--help" => {
                println!("usage: cargo bench --bench core [-- [--all] [--only NAME] [--reps N]]");
                std::process::exit(0);
            }
            // cargo passes `--bench`; ignore it and other harness flags.
            _ => {}
        }
    }
    o
}

fn main() {
    let path = workloads::default_path();
    let file = WorkloadFile::load(&path).unwrap_or_else(|e| die("workloads", e));
    let opts = parse_options();

    if let Ok(name) = std::env::var(CHILD_ENV) {
        let w = file.find(&name).unwrap_or_else(|| die("child", format!("unknown workload {name}")));
        std::process::exit(run_child(&file, w, opts.reps));
    }

    let selected: Vec<&Workload> = match &opts.only {
        Some(name) => vec![file.find(name).unwrap_or_else(|| die("--only", format!("unknown workload {name}")))],
        None => file.workloads.iter().filter(|w| opts.all || DEFAULT_WORKLOADS.contains(&w.name.as_str())).collect(),
    };
    println!("mooncake-weight-store core benchmark ({})", path.display());
    println!(
        "best of {} runs per stage, each workload in a fresh process; large planning stages split work over the \
         machine's cores (par.rs);",
        opts.reps
    );
    println!("frags/s = source placement fragments / our time; ref = reference (Python) seconds from shared/bench/README.md.");
    println!("+heap = peak heap above the heap in use when the stage started (counting allocator, timed run).");
    println!(
        "cpu = lowest CPU time of the calling thread over the runs (below wall when the machine is shared, or when \
         the stage ran part of its work on other threads)."
    );
    println!(
        "[1] our digests are computed inside construction; this row times compute_digest(), the same work: the \
         canonical JSON hashed as it is written (over 8 MiB: on a second thread, overlapped with serializing)."
    );
    println!("[2] SHA-256 alone over the already serialized JSON: the floor of the digest row above it.");
    println!(
        "[3] the serialized JSON copied into a fresh allocation of its size, advised for transparent huge pages as \
         the writers advise theirs (memcpy plus first-touch page faults): the floor of the to_json row above it."
    );
    println!(
        "[4] serde_json reading the document without building anything (IgnoredAny): a floor under the from_json \
         row below it, which must also build every value, validate, and recompute the digest ([2])."
    );

    let exe = std::env::current_exe().unwrap_or_else(|e| die("current_exe", e));
    let mut summary: Vec<(String, u64, u64, u64, usize)> = Vec::new();
    // (workload, stage, speedup over the reference) from the children.
    let mut speedups: Vec<(String, String, f64)> = Vec::new();
    let mut failures = 0usize;
    for w in selected {
        let t0 = Instant::now();
        let mut child = Command::new(&exe)
            .env(CHILD_ENV, &w.name)
            .env("MWS_BENCH_WORKLOADS", &path)
            .env("MWS_BENCH_REPS", opts.reps.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| die("spawn child", e));
        let stdout = child.stdout.take().expect("piped");
        let mut got_result = false;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap_or_default();
            if let Some(rest) = line.strip_prefix("@@R ") {
                if let Some((key, x)) = rest.split_once(' ') {
                    speedups.push((w.name.clone(), key.to_string(), x.parse().unwrap_or(0.0)));
                }
            } else if let Some(rest) = line.strip_prefix("@@ ") {
                let f: Vec<&str> = rest.split_whitespace().collect();
                if f.len() == 5 {
                    let n = f[1].parse().unwrap_or(0);
                    let rss = f[2].parse().unwrap_or(0);
                    let whole = f[3].parse().unwrap_or(0);
                    let failed = f[4].parse().unwrap_or(0);
                    summary.push((f[0].to_string(), n, rss, whole, failed));
                    got_result = true;
                }
            } else {
                println!("{line}");
            }
        }
        let status = child.wait().unwrap_or_else(|e| die("wait child", e));
        println!("  ({} wall {:.1} s, exit {})", w.name, t0.elapsed().as_secs_f64(), status.code().unwrap_or(-1));
        if !status.success() || !got_result {
            failures += 1;
        }
    }

    println!("\npeak memory (ru_maxrss of each workload's own process, over the reference's stages (a)-(e); whole = all stages):");
    println!(
        "  {:<12} {:>12} {:>10} {:>10} {:>10} {:>9} {:>10}  ids",
        "workload", "fragments", "MiB", "B/frag", "ref MiB", "ref/ours", "whole MiB"
    );
    for (name, n, rss, whole, failed) in &summary {
        let mib = *rss as f64 / (1024.0 * 1024.0);
        let r = reference_rss_mib(name);
        println!(
            "  {:<12} {:>12} {:>10.1} {:>10.0} {:>10} {:>9} {:>10.1}  {}",
            name,
            fmt_int(*n),
            mib,
            *rss as f64 / *n as f64,
            r.map(|m| format!("{m:.0}")).unwrap_or_else(|| "-".into()),
            r.map(|m| format!("{:.1}x", m / mib)).unwrap_or_else(|| "-".into()),
            *whole as f64 / (1024.0 * 1024.0),
            if *failed == 0 { "all OK".to_string() } else { format!("{failed} MISMATCH") }
        );
    }
    // Headline figures (issue 28): each stage's speedup over the reference at the
    // largest workload of the run (w1m-moe with --all; the 100x target is there).
    if let Some((last, _, _)) = speedups.last().cloned() {
        println!("\nfigures: speedup over the reference (reference seconds / ours, best of runs) at {last}");
        for (_, key, x) in speedups.iter().filter(|(w, _, _)| *w == last) {
            println!("figure: core_{key}_vs_reference = {x:.1}");
        }
    }
    if failures > 0 {
        eprintln!("core benchmark: {failures} workload(s) failed or mismatched");
        std::process::exit(1);
    }
}
