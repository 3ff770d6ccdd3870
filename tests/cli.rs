//! The `mws` operator CLI (issue 12, item 3), run as a binary on a directory store.

#[path = "common/model.rs"]
mod model;

use model::*;
use mooncake_weight_store::protocol::{StaticGuard, Transaction, UploadArgs, WeightStore};
use mooncake_weight_store::store::{directory::DirectoryStore, ObjectStore};
use mooncake_weight_store::{ErrorKind, UploadOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("mws-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Dir(d)
}

fn mws(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mws")).arg("--dir").arg(dir).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn defs() -> Vec<TensorDef> {
    model_tensors(1, 512, 0)
}

/// A store with one committed revision (generation 1).
fn committed(dir: &Path) -> (Arc<DirectoryStore>, WeightStore, mooncake_weight_store::model::StoredManifest) {
    let store = Arc::new(DirectoryStore::open(dir).unwrap());
    let ws = WeightStore::new(store.clone());
    let src =
        HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs(), 1), true, "t", 1);
    let m = src.snapshot_into(&ws).unwrap();
    (store, ws, m)
}

#[test]
fn acc_123_ls_inspect_verify_plan_on_a_written_store() {
    let d = tmp("five");
    let (_store, _ws, m) = committed(&d.0);
    let (rc, out, err) = mws(&d.0, &["ls"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains(m.group_id()) && out.contains("committed"), "{out}");
    assert!(out.contains("integrity"), "{out}");
    let (rc, out, _) = mws(&d.0, &["inspect", m.manifest_key()]);
    assert_eq!(rc, 0);
    assert!(out.contains("model.layers.0.mlp.up_proj.weight"), "{out}");
    assert_eq!(out.matches("    fragment ").count(), m.fragments().len(), "{out}");
    assert!(out.contains("CRC-32C per 1 MiB block"), "{out}");
    let (rc, out, _) = mws(&d.0, &["inspect", m.group_id(), "--json"]);
    assert_eq!(rc, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fragments"].as_array().unwrap().len(), m.fragments().len());
    assert_eq!(v["manifest_digest"], m.manifest_digest());
    let (rc, out, _) = mws(&d.0, &["verify", m.manifest_key()]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.starts_with("ok:"), "{out}");
    // plan: into a tp=4 layout.
    let target = build_placement("target", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs(), 1);
    let tpath = d.0.with_extension("target.json");
    std::fs::write(&tpath, target.to_json()).unwrap();
    let (rc, out, err) = mws(&d.0, &["plan", m.manifest_key(), "--target", tpath.to_str().unwrap()]);
    let _ = std::fs::remove_file(&tpath);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("per target participant") && out.contains("<="), "{out}");
    for p in target.parts() {
        assert!(out.contains(p.participant_id()), "{out}");
    }
}

#[test]
fn acc_123_verify_names_the_fragment_of_a_flipped_byte() {
    let d = tmp("flip");
    let (store, _ws, m) = committed(&d.0);
    let f = &m.fragments()[3];
    let path = store.object_path(f.object_key()).unwrap();
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let at = f.nbytes() / 3;
    let mut b = [0u8; 1];
    use std::io::Read;
    file.seek(SeekFrom::Start(at)).unwrap();
    file.read_exact(&mut b).unwrap();
    b[0] ^= 0x40;
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&b).unwrap();
    let (rc, out, _) = mws(&d.0, &["verify", m.manifest_key()]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains(&format!("FAIL fragment {}", f.fragment_id())), "{out}");
    // A missing payload is listed too.
    store.remove(m.fragments()[0].object_key()).unwrap();
    let (rc, out, _) = mws(&d.0, &["verify", m.manifest_key()]);
    assert_eq!(rc, 1);
    assert!(out.contains(m.fragments()[0].fragment_id()) && out.contains("2 problem(s)"), "{out}");
}

#[test]
fn acc_123_clear_errors_for_bad_path_missing_key_corrupt_manifest() {
    let d = tmp("errors");
    let (rc, _, err) = mws(&d.0, &["ls"]);
    assert_eq!(rc, 2);
    assert!(err.contains("is not a mooncake-weight-store directory store"), "{err}");
    let (store, _ws, m) = committed(&d.0);
    let (rc, _, err) = mws(&d.0, &["inspect", "weights/default/nope/rev/1"]);
    assert_eq!(rc, 2);
    assert!(err.contains("not found") && err.contains("weights/default/nope/rev/1/manifest"), "{err}");
    let cfg = mooncake_weight_store::store::WriteConfig {
        group_ids: &[],
        record_type: mooncake_weight_store::store::RecordType::Metadata,
    };
    store.upsert(m.manifest_key(), b"{\"broken\":", &cfg).unwrap();
    let (rc, _, err) = mws(&d.0, &["verify", m.manifest_key()]);
    assert_eq!(rc, 2);
    assert!(err.contains("invalid weight manifest"), "{err}");
    let (rc, out, _) = mws(&d.0, &["--help"]);
    assert_eq!(rc, 0);
    assert!(out.contains("Examples:") && out.contains("mws --dir"), "{out}");
}

/// A writer mid-upload (payloads written, no decision) while gc runs: a young
/// transaction is never touched and commits afterwards; an old one is aborted by
/// gc's create-only claim, its payloads go, and the writer can no longer commit.
/// The committed revision survives every gc run intact.
#[test]
fn acc_123_gc_is_safe_against_a_concurrent_writer() {
    let d = tmp("gc");
    let (_store, ws, m1) = committed(&d.0);
    let ws = Arc::new(ws);
    let src2 =
        HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs(), 2), true, "t", 1);
    let plan = ws.plan_upload(&src2.placement, &src2.bindings, &UploadOptions::default()).unwrap();
    let tx = Transaction::new(ws.clone(), plan.clone());
    let args = UploadArgs { guard: Some(&StaticGuard), ..Default::default() };
    // SAFETY: src2's buffers outlive the call and are not written during it.
    unsafe { tx.upload(&src2.placement, &src2.bindings[0], args) }.unwrap();
    // Mid-upload: participant 0 written, participant 1 not yet.
    let (rc, out, _) = mws(&d.0, &["gc", "--older-than", "1h"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("younger than --older-than"), "{out}");
    assert!(out.contains("0 action(s)"), "{out}");
    let (_, ls, _) = mws(&d.0, &["ls"]);
    assert!(ls.contains("undecided"), "{ls}");
    // The writer finishes and commits: nothing it wrote was lost.
    // SAFETY: as above.
    unsafe { tx.upload(&src2.placement, &src2.bindings[1], args) }.unwrap();
    let m2 = tx.commit().unwrap();
    assert_eq!(mws(&d.0, &["verify", m2.manifest_key()]).0, 0);

    // A third upload (generation 3) abandoned mid-way; gc with --older-than 0s aborts it.
    let src3 =
        HostModel::new(build_placement("source", Layout { tp: 2, pp: 1, ep: 1, dp: 1 }, &defs(), 3), true, "t", 1);
    let plan3 = ws.plan_upload(&src3.placement, &src3.bindings, &UploadOptions::default()).unwrap();
    let tx3 = Transaction::new(ws.clone(), plan3.clone());
    // SAFETY: as above.
    unsafe { tx3.upload(&src3.placement, &src3.bindings[0], args) }.unwrap();
    let (rc, out, _) = mws(&d.0, &["gc", "--dry-run", "--older-than", "0s"]);
    assert_eq!(rc, 0);
    assert!(out.contains("would remove") && out.contains("(dry run: nothing was changed)"), "{out}");
    assert!(out.contains("would abort an abandoned upload"), "a dry run speaks in the conditional: {out}");
    assert!(ws.backend().exists(plan3.operations()[0].target().object_key()).unwrap(), "dry run changes nothing");
    let (rc, out, _) = mws(&d.0, &["gc", "--older-than", "0s"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("aborted an abandoned upload"), "{out}");
    let removed = plan3.operations().iter().filter(|o| !ws.backend().exists(o.target().object_key()).unwrap()).count();
    assert_eq!(removed, plan3.operations().len());
    // The writer wakes up: it can neither upload nor commit any more.
    // SAFETY: as above.
    let e = unsafe { tx3.upload(&src3.placement, &src3.bindings[1], args) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    // Both committed revisions are intact after every gc run.
    for m in [&m1, &m2] {
        let (rc, out, _) = mws(&d.0, &["verify", m.manifest_key()]);
        assert_eq!(rc, 0, "{out}");
    }
    let (_, ls, _) = mws(&d.0, &["ls"]);
    assert_eq!(ls.matches("committed").count(), 4, "{ls}");
    // The cleaned transaction leaves the listing (its decision record stays) and a
    // second gc does not report it again (issue 29).
    assert!(!ls.contains("aborted") && ls.contains("(1 cleaned transaction(s) not shown"), "{ls}");
    let (rc, out, _) = mws(&d.0, &["gc", "--older-than", "0s"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("0 action(s)") && out.contains("1 transaction(s) already cleaned"), "{out}");
    assert!(!out.contains("removed the payloads"), "{out}");
}

#[test]
fn json_on_every_command_and_clear_answers_for_empty_results() {
    let d = tmp("json");
    let (_store, _ws, m) = committed(&d.0);
    let json = |args: &[&str]| -> (i32, serde_json::Value) {
        let mut a = args.to_vec();
        a.push("--json");
        let (rc, out, err) = mws(&d.0, &a);
        (rc, serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out} {err}")))
    };
    let (rc, v) = json(&["ls"]);
    assert_eq!(rc, 0);
    assert_eq!(v["revisions"][0]["manifest_key"], m.manifest_key());
    assert_eq!(v["revisions"][0]["weight_generation"], 1);
    let (rc, v) = json(&["inspect", m.manifest_key()]);
    assert_eq!((rc, v["manifest_digest"].as_str()), (0, Some(m.manifest_digest())));
    let (rc, v) = json(&["verify", m.group_id()]);
    assert_eq!(rc, 0);
    assert_eq!((v["ok"].as_bool(), v["integrity_record"].as_bool()), (Some(true), Some(true)));
    let (rc, v) = json(&["gc", "--dry-run"]);
    assert_eq!(rc, 0);
    assert_eq!(v["dry_run"], true);
    assert!(v["actions"].as_array().unwrap().is_empty());
    let target = build_placement("target", Layout { tp: 4, pp: 1, ep: 1, dp: 1 }, &defs(), 1);
    let tpath = d.0.with_extension("json-target.json");
    std::fs::write(&tpath, target.to_json()).unwrap();
    let (rc, v) = json(&["plan", m.manifest_key(), "--target", tpath.to_str().unwrap()]);
    let _ = std::fs::remove_file(&tpath);
    assert_eq!(rc, 0);
    assert_eq!(v["participants"].as_array().unwrap().len(), target.parts().len());
    // A failure is JSON too, with the exit status.
    let (rc, v) = json(&["inspect", "weights/default/nothing/here/1"]);
    assert_eq!(rc, 2);
    assert!(v["error"].as_str().unwrap().contains("nothing/here"), "{v}");
    // A prefix that matches nothing says so.
    let (rc, out, _) = mws(&d.0, &["ls", "--prefix", "weights/default/nope"]);
    assert_eq!(rc, 0);
    assert_eq!(out.trim(), "no key of this store starts with \"weights/default/nope\"");
}

/// Issue 43, defect 8: a usage error or a non-UTF-8 argument under `--json` is one
/// JSON document on stdout (clap used to exit with plain text on stderr first).
#[test]
fn json_usage_errors_are_json() {
    let d = tmp("json-usage");
    let (_store, _ws, _m) = committed(&d.0);
    for args in [&["--json", "nonsense"][..], &["ls", "--json", "--no-such-flag"], &["--json", "inspect"]] {
        let (rc, out, _) = mws(&d.0, args);
        assert_eq!(rc, 2, "{args:?}");
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out:?}"));
        assert_eq!(v["exit_status"], 2);
        assert!(!v["error"].as_str().unwrap().is_empty(), "{v}");
    }
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"weights/\xff\xfe/manifest");
    let out = Command::new(env!("CARGO_BIN_EXE_mws"))
        .arg("--dir")
        .arg(&d.0)
        .args(["--json", "inspect"])
        .arg(bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(v["error"].as_str().unwrap().contains("UTF-8"), "{v}");
    // Without --json the usage error stays clap's text on stderr; --help is not an error.
    let (rc, out, err) = mws(&d.0, &["nonsense"]);
    assert_eq!((rc, out.as_str()), (2, ""));
    assert!(err.contains("nonsense"), "{err}");
    let (rc, out, _) = mws(&d.0, &["--json", "--help"]);
    assert_eq!(rc, 0);
    assert!(out.contains("Usage"), "{out}");
}

/// Issue 43, defect 9: `--max-metadata-bytes` bounds the manifest `inspect` (and
/// `verify`, `plan`) read.
#[test]
fn max_metadata_bytes_bounds_every_manifest_read() {
    let d = tmp("max-meta");
    let (store, _ws, m) = committed(&d.0);
    let size = store.get(m.manifest_key()).unwrap().len();
    let limit = (size - 1).to_string();
    for cmd in ["inspect", "verify"] {
        let (rc, out, err) = mws(&d.0, &["--max-metadata-bytes", &limit, cmd, m.manifest_key()]);
        assert_eq!(rc, 2, "{cmd}: {out}");
        assert!(err.contains("more than the limit"), "{cmd}: {err}");
        let ok = size.to_string();
        let (rc, _, err) = mws(&d.0, &["--max-metadata-bytes", &ok, cmd, m.manifest_key()]);
        assert_eq!(rc, 0, "{cmd}: {err}");
    }
}
