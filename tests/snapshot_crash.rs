//! Issue 4: a snapshot killed with SIGKILL at a random point. A child process (this
//! test binary re-executed with `MWS_CRASH_CHILD` set) snapshots a TP4 x DP2 model
//! into a `DirectoryStore` with the writer, after saving its plan (fixed
//! transaction id) to a file before any store I/O. The parent kills it at a random
//! instant, then recovers like a fresh operator: `finalize` when a decision exists
//! (retrying `commit` with the plan's receipts when the commit decision exists but
//! the manifest does not), else `abort_upload(plan, [])`.
//!
//! Invariant, before and after recovery: a manifest is only visible with every
//! payload present and byte-exact; after recovery either the committed manifest
//! with all payloads, or no manifest and no payload object under the group.

#[path = "common/dirkeys.rs"]
mod dirkeys;
#[path = "common/model.rs"]
mod model;

use dirkeys::directory_keys;
use model::*;
use mooncake_weight_store::protocol::{UploadReceipt, WeightStore};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::ObjectStore;
use mooncake_weight_store::*;
use mooncake_weight_store::{plan_from_json, plan_to_json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TEST_NAME: &str = "snapshot_killed_at_random_points_recovers";
const TRIALS: usize = 120;

fn source_model() -> HostModel {
    let defs = model_tensors(1, 32, 0);
    HostModel::new(build_placement("source", Layout { tp: 4, pp: 1, ep: 1, dp: 2 }, &defs, 1), true, "trainer", 1)
}

fn options(tx: &str) -> UploadOptions {
    UploadOptions {
        namespace: "default".into(),
        key_prefix: "weights".into(),
        transaction_id: Some(tx.into()),
        created_at: Some("2026-01-01T00:00:00Z".into()),
    }
}

fn child(root: &Path, tx: &str) {
    let ws = WeightStore::new(Arc::new(DirectoryStore::open(root.join("store")).unwrap()));
    let src = source_model();
    let mut w = ws.begin_snapshot_with(&src.descriptor("default"), HostAdapter(&src), &options(tx)).unwrap();
    let tmp = root.join("plan.json.tmp");
    std::fs::write(&tmp, plan_to_json(w.plan())).unwrap();
    std::fs::rename(&tmp, root.join("plan.json")).unwrap();
    let mut items: Vec<(String, String)> = w
        .plan()
        .operations()
        .iter()
        .map(|o| (o.source_placement().tensor_id().to_string(), o.source_participant_id().to_string()))
        .collect();
    items.dedup();
    for (t, p) in items {
        w.write_tensor(&t, &p).unwrap();
    }
    w.commit().unwrap();
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
}

fn spawn(root: &Path, tx: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env("MWS_CRASH_CHILD", root)
        .env("MWS_CRASH_TX", tx)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Polls until the child's plan file exists (false when the child exited first).
fn wait_for_plan(root: &Path, c: &mut std::process::Child) -> Option<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if root.join("plan.json").exists() {
            return Some(());
        }
        if c.try_wait().unwrap().is_some() || Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Checks "a visible manifest implies complete, byte-exact payloads".
fn check_manifest_complete(store: &DirectoryStore, src: &HostModel, plan: &UploadPlan) -> Result<bool> {
    let key = plan.manifest().manifest_key();
    if !store.exists(key)? {
        return Ok(false);
    }
    let m = mooncake_weight_store::protocol::load_manifest(store, key)?;
    assert_eq!(&m, plan.manifest(), "the manifest is the plan's");
    for f in m.fragments() {
        let t = src.placement.tensor(f.tensor_id()).unwrap();
        let bytes = store
            .get(f.object_key())
            .unwrap_or_else(|e| panic!("published manifest misses payload {}: {e}", f.object_key()));
        assert_eq!(bytes, expected_bytes(t, f.global_offset(), f.local_shape()), "payload {} differs", f.object_key());
    }
    Ok(true)
}

#[test]
fn snapshot_killed_at_random_points_recovers() {
    if let Ok(root) = std::env::var("MWS_CRASH_CHILD") {
        child(&PathBuf::from(root), &std::env::var("MWS_CRASH_TX").unwrap());
        return;
    }
    let base = std::env::temp_dir().join(format!("mws-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let src = source_model();
    // Calibrate: one complete child run.
    let calib = base.join("calibrate");
    std::fs::create_dir_all(&calib).unwrap();
    let start = Instant::now();
    let mut c = spawn(&calib, "calibrate");
    wait_for_plan(&calib, &mut c).expect("calibration child planned");
    let io_start = Instant::now();
    assert!(c.wait().unwrap().success(), "calibration snapshot failed");
    let io = io_start.elapsed();
    let full = start.elapsed();
    let seed = std::env::var("MWS_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    println!("snapshot_crash: full run {full:?}, store I/O phase {io:?}, seed {seed}");
    let mut rng = Rng(seed);
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    let budget = Instant::now();
    let mut trials = 0;
    while trials < TRIALS {
        let root = base.join(format!("trial-{trials}"));
        std::fs::create_dir_all(&root).unwrap();
        let tx = format!("trial-{trials}");
        let mut c = spawn(&root, &tx);
        // One trial in eight dies anywhere from process start; the others during
        // the store I/O phase (after the plan file appeared).
        if trials % 8 == 0 {
            std::thread::sleep(Duration::from_nanos(rng.next() % (full.as_nanos() as u64 + 1)));
        } else {
            let _ = wait_for_plan(&root, &mut c);
            std::thread::sleep(Duration::from_nanos(rng.next() % (io.as_nanos() as u64 * 11 / 10 + 1)));
        }
        let _ = c.kill();
        let status = c.wait().unwrap();
        trials += 1;
        let store = DirectoryStore::open(root.join("store")).unwrap();
        let Ok(text) = std::fs::read(root.join("plan.json")) else {
            let keys = directory_keys(&root.join("store"));
            if !keys.is_empty() {
                violations.push(format!("{tx}: objects without a plan: {keys:?}"));
            }
            *outcomes.entry("killed before planning").or_default() += 1;
            continue;
        };
        let plan = plan_from_json(&text).unwrap();
        let published_before = match check_manifest_complete(&store, &src, &plan) {
            Ok(b) => b,
            Err(e) => {
                violations.push(format!("{tx}: {e}"));
                continue;
            }
        };
        let ws = WeightStore::new(Arc::new(store));
        let outcome = match ws.read_decision(&plan).unwrap() {
            Some(_) => match ws.finalize(&plan) {
                Ok(()) => None,
                Err(e) if e.message().contains("has no manifest") => ws
                    .commit(&plan, &UploadReceipt::all_for(&plan), None)
                    .map(|_| ())
                    .and_then(|_| ws.finalize(&plan))
                    .err()
                    .map(|e| format!("commit retry: {e}")),
                Err(e) => Some(format!("finalize: {e}")),
            },
            None => ws.abort_upload(&plan, &[]).err().map(|e| format!("abort: {e}")),
        };
        if let Some(e) = outcome {
            violations.push(format!("{tx}: recovery failed: {e}"));
            continue;
        }
        let store = DirectoryStore::open(root.join("store")).unwrap();
        let published = match check_manifest_complete(&store, &src, &plan) {
            Ok(b) => b,
            Err(e) => {
                violations.push(format!("{tx}: {e}"));
                continue;
            }
        };
        let payload_prefix = format!("{}/payload/", plan.manifest().group_id());
        let payloads =
            directory_keys(&root.join("store")).into_iter().filter(|k| k.starts_with(&payload_prefix)).count();
        if published {
            if payloads != plan.operations().len() {
                violations.push(format!("{tx}: committed with {payloads} payload objects"));
            }
        } else if payloads != 0 {
            violations.push(format!("{tx}: no manifest but {payloads} payload objects left"));
        }
        let label = match (status.success(), published_before, published) {
            (true, _, _) => "completed before the kill",
            (false, true, _) => "killed after publishing",
            (false, false, true) => "committed by recovery",
            (false, false, false) => "aborted and cleaned by recovery",
        };
        *outcomes.entry(label).or_default() += 1;
        let _ = std::fs::remove_dir_all(&root);
    }
    println!(
        "snapshot_crash: {trials} trials in {:?}: {outcomes:?}; violations: {}",
        budget.elapsed(),
        violations.len()
    );
    assert!(violations.is_empty(), "violations: {violations:#?}");
    std::fs::remove_dir_all(&base).unwrap();
}
