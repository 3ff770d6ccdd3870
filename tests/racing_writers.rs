//! Issue 4: several processes commit the same revision at once on one
//! `DirectoryStore`. Exactly one manifest is published, every loser gets
//! `conflicting weight revision`, and no loser payload survives its finalize.
//!
//! The test re-executes its own binary: with `MWS_RACE_CHILD` set, the test body
//! runs one writer instead.

#[path = "common/dirkeys.rs"]
mod dirkeys;
#[path = "common/fake_store.rs"]
mod fake_store;
#[path = "common/model.rs"]
mod model;

use dirkeys::directory_keys;
use fake_store::upload_all;
use model::*;
use mooncake_weight_store::protocol::{StaticGuard, WeightStore};
use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::*;
use mooncake_weight_store::{plan_from_json, plan_to_json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TEST_NAME: &str = "racing_writers_publish_exactly_one_revision";
const WRITERS: usize = 4;
const ROUNDS: usize = 3;

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
    let deadline = Instant::now() + Duration::from_secs(60);
    while !root.join("go").exists() {
        assert!(Instant::now() < deadline, "parent never started the race");
        std::thread::sleep(Duration::from_micros(200));
    }
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

fn round(root: &Path) {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..WRITERS)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
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
        assert!(c.wait().unwrap().success(), "a writer process failed");
    }
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
    for r in 0..ROUNDS {
        round(&base.join(format!("round-{r}")));
    }
    std::fs::remove_dir_all(&base).unwrap();
}
