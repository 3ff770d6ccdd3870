//! Issue 14, item 4: the examples never remove what they did not create. The Rust
//! example takes its decision from `examples/support/store_dir.rs`, tested here; the
//! C and C++ examples implement the same rule.

#[path = "../examples/support/store_dir.rs"]
mod store_dir;

use mooncake_weight_store::store::directory::DirectoryStore;
use mooncake_weight_store::store::{ObjectStore, RecordType, WriteConfig};
use std::path::{Path, PathBuf};
use store_dir::StoreDir;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("mws-example-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_store(path: &Path) {
    let s = DirectoryStore::open(path).unwrap();
    let g = vec!["g".to_string()];
    s.put("weights/a/b", b"earlier run", &WriteConfig { group_ids: &g, record_type: RecordType::Metadata }).unwrap();
}

#[test]
fn an_unrelated_file_survives_with_and_without_reuse() {
    let t = TempDir::new("unrelated");
    let dir = t.0.join("mine");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("thesis.tex"), b"years of work").unwrap();
    for reuse in [false, true] {
        let e = StoreDir::prepare(&dir, reuse).unwrap_err();
        assert!(e.contains("is not empty and not a directory store made by this library"), "{e}");
    }
    assert_eq!(std::fs::read(dir.join("thesis.tex")).unwrap(), b"years of work");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "nothing was added");
}

#[test]
fn a_store_with_a_user_file_inside_is_refused_even_with_reuse() {
    let t = TempDir::new("mixed");
    let dir = t.0.join("store");
    make_store(&dir);
    std::fs::write(dir.join("notes.txt"), b"keep me").unwrap();
    let e = StoreDir::prepare(&dir, true).unwrap_err();
    assert!(e.contains("not a directory store made by this library"), "{e}");
    assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"keep me");
    // The library itself applies the same rule (issue 29): a directory with foreign
    // entries is not opened as a store, and nothing in it changes.
    let Err(refused) = DirectoryStore::open(&dir) else { panic!("a store root with a user file is refused") };
    assert_eq!(refused.kind(), mooncake_weight_store::ErrorKind::InvalidArgument);
    assert!(
        refused.message().contains("(notes.txt)") && refused.message().contains("nothing was changed"),
        "{refused}"
    );
    std::fs::remove_file(dir.join("notes.txt")).unwrap();
    assert_eq!(DirectoryStore::open(&dir).unwrap().get("weights/a/b").unwrap(), b"earlier run");
    // Nor does cleanup remove anything once a foreign file is there.
    let d = StoreDir::prepare(&t.0.join("fresh"), false).unwrap();
    make_store(d.path());
    std::fs::write(d.path().join("added.txt"), b"added meanwhile").unwrap();
    assert!(d.cleanup().unwrap_err().contains("no longer holds only the example's store"));
    assert!(d.path().join("added.txt").exists());
    assert!(d.path().join("objects").exists());
}

#[test]
fn an_earlier_store_is_replaced_only_with_reuse() {
    let t = TempDir::new("reuse");
    let dir = t.0.join("store");
    make_store(&dir);
    let e = StoreDir::prepare(&dir, false).unwrap_err();
    assert!(e.contains("holds a directory store (of an earlier run?); pass --reuse to replace it"), "{e}");
    assert_eq!(DirectoryStore::open(&dir).unwrap().get("weights/a/b").unwrap(), b"earlier run", "untouched");
    let d = StoreDir::prepare(&dir, true).unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the earlier store's entries were removed");
    make_store(d.path());
    d.cleanup().unwrap();
    assert!(dir.exists(), "the directory was not created by this run: kept");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn missing_and_empty_directories_are_used_and_cleaned_up_to_what_was_there() {
    let t = TempDir::new("fresh");
    let missing = t.0.join("a").join("new");
    let d = StoreDir::prepare(&missing, false).unwrap();
    make_store(d.path());
    d.cleanup().unwrap();
    assert!(!missing.exists(), "created by the run: removed");
    assert!(t.0.join("a").exists(), "only the named directory is removed, never a parent");

    let empty = t.0.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let d = StoreDir::prepare(&empty, false).unwrap();
    make_store(d.path());
    d.cleanup().unwrap();
    assert!(empty.exists(), "the user's empty directory is kept");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);

    let file = t.0.join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(StoreDir::prepare(&file, true).unwrap_err().contains("not a directory"));
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}
