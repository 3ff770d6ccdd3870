//! Lists the keys of a `DirectoryStore` by walking its `objects/` directory.
#![allow(dead_code)]

use std::path::Path;

/// Every stored key, sorted (`objects/d.a/d.b/f.c` is `a/b/c`).
pub fn directory_keys(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let path = e.path();
            if let Some(seg) = name.strip_prefix("d.") {
                if path.is_dir() {
                    walk(&path, &format!("{prefix}{seg}/"), out);
                }
            } else if let Some(seg) = name.strip_prefix("f.") {
                out.push(format!("{prefix}{seg}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join("objects"), "", &mut out);
    out.sort();
    out
}
