//! `ObjectStore::list` (issue 12, item 2): keys with sizes under a prefix, for the
//! memory and directory stores; the directory walk never follows a link.

use mooncake_weight_store::store::{
    directory::DirectoryStore, list_sorted, memory::MemoryStore, ListedObject, ObjectStore, RecordType, WriteConfig,
};

fn fill(s: &dyn ObjectStore) {
    let cfg = WriteConfig { group_ids: &[], record_type: RecordType::Metadata };
    for (k, n) in [("a/b/c", 3usize), ("a/b", 1), ("a/bc/d", 5), ("ab/x", 2), ("z", 0)] {
        s.put(k, &vec![7u8; n], &cfg).unwrap();
    }
}

fn keys(v: &[ListedObject]) -> Vec<(&str, u64)> {
    v.iter().map(|o| (o.key.as_str(), o.size)).collect()
}

fn check(s: &dyn ObjectStore) {
    assert!(s.supports_list());
    fill(s);
    let all = list_sorted(s, "").unwrap();
    assert_eq!(keys(&all), [("a/b", 1), ("a/b/c", 3), ("a/bc/d", 5), ("ab/x", 2), ("z", 0)]);
    assert_eq!(keys(&list_sorted(s, "a/b").unwrap()), [("a/b", 1), ("a/b/c", 3), ("a/bc/d", 5)]);
    assert_eq!(keys(&list_sorted(s, "a/b/").unwrap()), [("a/b/c", 3)]);
    assert_eq!(keys(&list_sorted(s, "ab").unwrap()), [("ab/x", 2)]);
    assert!(list_sorted(s, "nope").unwrap().is_empty());
    // The visitor can stop early.
    let mut seen = 0;
    s.list("", &mut |_, _| {
        seen += 1;
        seen < 2
    })
    .unwrap();
    assert_eq!(seen, 2);
}

#[test]
fn acc_122_memory_store_lists_keys_with_sizes() {
    check(&MemoryStore::new());
}

#[test]
fn acc_122_directory_store_lists_keys_with_sizes_and_skips_links() {
    let dir = std::env::temp_dir().join(format!("mws-list-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = DirectoryStore::open(&dir).unwrap();
    check(&s);
    // Links planted below the root are never followed nor listed.
    let outside = dir.with_extension("outside");
    std::fs::create_dir_all(outside.join("d.q")).unwrap();
    std::fs::write(outside.join("d.q").join("f.secret"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("objects").join("d.link")).unwrap();
    std::os::unix::fs::symlink(outside.join("d.q").join("f.secret"), dir.join("objects").join("f.l")).unwrap();
    let all = list_sorted(&s, "").unwrap();
    assert_eq!(all.len(), 5, "{all:?}");
    assert!(all.iter().all(|o| !o.key.starts_with("link") && o.key != "l"));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&outside).unwrap();
}
