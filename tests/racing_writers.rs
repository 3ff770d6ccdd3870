//! Racing processes on one `DirectoryStore` (issues 4 and 14):
//!
//! * 8 writer processes x 30 rounds commit the same revision at once (each its own
//!   plan): exactly one manifest is published, every loser gets `conflicting weight
//!   revision`, and no loser payload survives its finalize;
//! * 8 processes x 30 rounds share one plan and race `commit` (4) against
//!   `abort_upload` (4) on the same decision key: exactly one outcome wins, every
//!   process of the other side gets a conflict, and the store holds either the whole
//!   revision (decision, manifest, every payload) or nothing but the abort decision:
//!   no torn or orphaned revision.
//!
//! The tests re-execute their own binary: with `MWS_RACE_CHILD` set, the test body
//! runs one process of the race instead. Both take a few seconds (see the report in
//! their output).

#[path = "common/dirkeys.rs"]
mod dirkeys;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use dirkeys::directory_keys;
use fake_store::upload_all;
use model::*;
use mooncake_weight_store::protocol::{StaticGuard, UploadReceipt, WeightStore};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::*;
use mooncake_weight_store::{plan_from_json, plan_to_json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TEST_NAME: &str = "racing_writers_publish_exactly_one_revision";
const SHARED_TEST_NAME: &str = "commit_and_abort_racing_on_one_plan_have_exactly_one_outcome";
const WRITERS: usize = 8;
const ROUNDS: usize = 30;
/// Retries of a retryable (`Store`) error, as the protocol prescribes.
const RETRIES: usize = 50;

fn source_model() -> HostModel {
    let defs = model_tensors(1, 32, 0);
    HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs, 1), true, "trainer", 1)
}

fn child(root: &Path, index: usize) {
    let ws = WeightStore::new(Arc::new(DirectoryStore::open(root.join("store")).unwrap()));
    let src = source_model();
    let opts = UploadOptions {
        namespace: "default".into(),
        key_prefix: "weights".into(),
        transaction_id: Some(format!("writer-{index}")),
        created_at: Some(format!("2026-01-01T00:00:{index:02}Z")),
    };
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts).unwrap();
    std::fs::write(root.join(format!("plan-{index}.json")), plan_to_json(&plan)).unwrap();
    let receipts = upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    std::fs::write(root.join(format!("ready-{index}")), b"").unwrap();
    wait_for_go(root);
    let line = match ws.commit(&plan, &receipts, None) {
        Ok(m) => {
            assert_eq!(&m, plan.manifest());
            "OK".to_string()
        }
        Err(e) => {
            let fin = ws.finalize(&plan).map_err(|f| f.to_string());
            format!("ERR {:?} {} | finalize {:?}", e.kind(), e.message(), fin)
        }
    };
    std::fs::write(root.join(format!("result-{index}")), line).unwrap();
}

/// Starts `WRITERS` children of test `name` in `root`, waits until all are ready,
/// starts the race and waits for every child.
fn race(root: &Path, name: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..WRITERS)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", name, "--nocapture", "--test-threads=1"])
                .env("MWS_RACE_CHILD", i.to_string())
                .env("MWS_RACE_ROOT", root)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(0..WRITERS).all(|i| root.join(format!("ready-{i}")).exists()) {
        assert!(Instant::now() < deadline, "writers never got ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::fs::write(root.join("go"), b"").unwrap();
    for c in &mut children {
        assert!(c.wait().unwrap().success(), "a race process failed");
    }
}

fn wait_for_go(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !root.join("go").exists() {
        assert!(Instant::now() < deadline, "parent never started the race");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn round(root: &Path) {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    race(root, TEST_NAME);
    let results: Vec<String> =
        (0..WRITERS).map(|i| std::fs::read_to_string(root.join(format!("result-{i}"))).unwrap()).collect();
    let plans: Vec<UploadPlan> = (0..WRITERS)
        .map(|i| plan_from_json(&std::fs::read(root.join(format!("plan-{i}.json"))).unwrap()).unwrap())
        .collect();
    let winners: Vec<usize> = (0..WRITERS).filter(|&i| results[i] == "OK").collect();
    assert_eq!(winners.len(), 1, "exactly one writer must win: {results:?}");
    let w = winners[0];
    for (i, r) in results.iter().enumerate() {
        if i != w {
            assert!(r.starts_with("ERR Conflict conflicting weight revision"), "loser {i}: {r}");
            assert!(r.ends_with("finalize Ok(())"), "loser {i}: {r}");
        }
    }
    let ws = WeightStore::new(Arc::new(DirectoryStore::open(root.join("store")).unwrap()));
    let key = plans[w].manifest().manifest_key();
    assert_eq!(ws.load_manifest(key).unwrap(), *plans[w].manifest());
    let keys = directory_keys(&root.join("store"));
    let manifests: Vec<&String> = keys.iter().filter(|k| k.ends_with("/manifest")).collect();
    assert_eq!(manifests, vec![key], "exactly one manifest");
    let payloads: BTreeSet<&str> = keys.iter().filter(|k| k.contains("/payload/")).map(|k| k.as_str()).collect();
    let expected: BTreeSet<&str> = plans[w].manifest().fragments().iter().map(|f| f.object_key()).collect();
    assert_eq!(payloads, expected, "only the winner's payloads remain");
    for (i, p) in plans.iter().enumerate() {
        assert!(ws.read_decision(p).unwrap().is_some(), "writer {i} has a decision");
    }
    println!("race round: winner writer-{w}, {} losers refused", WRITERS - 1);
}

#[test]
fn racing_writers_publish_exactly_one_revision() {
    if let Ok(i) = std::env::var("MWS_RACE_CHILD") {
        let root = PathBuf::from(std::env::var("MWS_RACE_ROOT").unwrap());
        child(&root, i.parse().unwrap());
        return;
    }
    let base = std::env::temp_dir().join(format!("mws-race-{}", std::process::id()));
    let t = Instant::now();
    for r in 0..ROUNDS {
        round(&base.join(format!("round-{r}")));
    }
    println!("{WRITERS} writers x {ROUNDS} rounds: {:.1} s", t.elapsed().as_secs_f64());
    std::fs::remove_dir_all(&base).unwrap();
}

// ---- commit against abort on one shared plan ------------------------------------------

fn shared_store(root: &Path) -> WeightStore {
    WeightStore::new(Arc::new(DirectoryStore::open(root.join("store")).unwrap()))
}

/// One process of the shared-plan race: even indices commit, odd ones abort; a
/// retryable error is retried (the protocol's rule), a conflict is the answer.
fn shared_child(root: &Path, index: usize) {
    let ws = shared_store(root);
    let plan = plan_from_json(&std::fs::read(root.join("plan.json")).unwrap()).unwrap();
    let receipts = UploadReceipt::all_for(&plan);
    std::fs::write(root.join(format!("ready-{index}")), b"").unwrap();
    wait_for_go(root);
    let commit = index.is_multiple_of(2);
    let mut last = String::new();
    for _ in 0..RETRIES {
        let r = if commit {
            ws.commit(&plan, &receipts, None).map(|m| assert_eq!(&m, plan.manifest()))
        } else {
            ws.abort_upload(&plan, &receipts)
        };
        last = match r {
            Ok(()) => "OK".into(),
            Err(e) if e.kind() == ErrorKind::Store => {
                last = format!("ERR {:?} {}", e.kind(), e.message());
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => format!("ERR {:?} {}", e.kind(), e.message()),
        };
        break;
    }
    std::fs::write(root.join(format!("result-{index}")), last).unwrap();
}

/// One round: plan and upload once, race, then check the one outcome. Returns the
/// decision.
fn shared_round(root: &Path) -> Decision {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let ws = shared_store(root);
    let src = source_model();
    let opts = UploadOptions {
        namespace: "default".into(),
        key_prefix: "weights".into(),
        transaction_id: Some("shared".into()),
        created_at: Some("2026-01-01T00:00:00Z".into()),
    };
    let plan = ws.plan_upload(&src.placement, &src.bindings, &opts).unwrap();
    upload_all(&ws, &plan, &src, &StaticGuard).unwrap();
    std::fs::write(root.join("plan.json"), plan_to_json(&plan)).unwrap();
    race(root, SHARED_TEST_NAME);
    let results: Vec<String> =
        (0..WRITERS).map(|i| std::fs::read_to_string(root.join(format!("result-{i}"))).unwrap()).collect();
    ws.finalize(&plan).unwrap();
    let decision = ws.current_decision(&plan).unwrap().expect("a decision was recorded");
    let (winners, losers): (Vec<usize>, Vec<usize>) = match decision {
        Decision::Commit => ((0..WRITERS).step_by(2).collect(), (1..WRITERS).step_by(2).collect()),
        Decision::Abort => ((1..WRITERS).step_by(2).collect(), (0..WRITERS).step_by(2).collect()),
    };
    for &i in &winners {
        assert_eq!(results[i], "OK", "{decision:?} won, process {i}: {results:?}");
    }
    for &i in &losers {
        let r = &results[i];
        let ok = match decision {
            Decision::Commit => {
                r == "ERR Conflict weight upload already chose commit"
                    || r == "ERR Conflict cannot abort a published weight revision"
            }
            Decision::Abort => r == "ERR Conflict weight upload already chose abort",
        };
        assert!(ok, "{decision:?} won, process {i}: {results:?}");
    }
    let keys: BTreeSet<String> = directory_keys(&root.join("store")).into_iter().collect();
    let mut expected: BTreeSet<String> = BTreeSet::from([plan.control_key().to_string()]);
    match decision {
        Decision::Commit => {
            assert_eq!(ws.read_manifest(&plan).unwrap().as_ref(), Some(plan.manifest()));
            expected.insert(plan.manifest().manifest_key().to_string());
            expected.extend(plan.manifest().fragments().iter().map(|f| f.object_key().to_string()));
            ws.require_complete_payloads(
                &plan.manifest().fragments().iter().map(|f| f.object_key()).collect::<Vec<_>>(),
            )
            .unwrap();
        }
        Decision::Abort => assert_eq!(ws.read_manifest(&plan).unwrap(), None),
    }
    assert_eq!(keys, expected, "{decision:?}: the whole revision or nothing but the decision");
    assert_eq!(std::fs::read_dir(root.join("store/tmp")).unwrap().count(), 0, "no temporary file left");
    decision
}

#[test]
fn commit_and_abort_racing_on_one_plan_have_exactly_one_outcome() {
    if let Ok(i) = std::env::var("MWS_RACE_CHILD") {
        let root = PathBuf::from(std::env::var("MWS_RACE_ROOT").unwrap());
        shared_child(&root, i.parse().unwrap());
        return;
    }
    let base = std::env::temp_dir().join(format!("mws-race-shared-{}", std::process::id()));
    let t = Instant::now();
    let (mut commits, mut aborts) = (0, 0);
    for r in 0..ROUNDS {
        match shared_round(&base.join(format!("round-{r}"))) {
            Decision::Commit => commits += 1,
            Decision::Abort => aborts += 1,
        }
    }
    println!(
        "{WRITERS} processes (4 commit, 4 abort) x {ROUNDS} rounds on one plan: commit won {commits}, abort won {aborts}; \
         {:.1} s",
        t.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&base).unwrap();
}
