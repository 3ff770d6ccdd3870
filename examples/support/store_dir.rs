//! The examples' rule for their store directory: never remove anything they did not
//! create. Shared by `examples/snapshot_restore.rs` and `tests/example_store_dir.rs`
//! (the C and C++ examples implement the same rule).
//!
//! * a missing directory is created (by `DirectoryStore::open`) and removed at the end;
//! * an empty directory is used; at the end the store's own entries are removed and
//!   the (user's) directory is kept;
//! * a directory that is recognisably a store of this library
//!   (`DirectoryStore::is_store_root`: the marker file, `objects/`, `tmp/` and nothing
//!   else) is replaced only with the explicit `--reuse` flag;
//! * anything else is refused, and nothing is touched.
#![allow(dead_code)]

use mooncake_weight_store::store::directory::{DirectoryStore, STORE_MARKER};
use std::path::{Path, PathBuf};

/// A store directory the example may use.
#[derive(Debug)]
pub struct StoreDir {
    path: PathBuf,
    /// The example created the directory itself (so it may remove it).
    created: bool,
}

impl StoreDir {
    /// Decides whether `path` may be used (see the module documentation); with
    /// `reuse`, an earlier run's store there is removed first. Errors name the reason
    /// and leave everything untouched.
    pub fn prepare(path: &Path, reuse: bool) -> Result<StoreDir, String> {
        let shown = path.display();
        let meta = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StoreDir { path: path.to_path_buf(), created: true })
            }
            Err(e) => return Err(format!("cannot inspect {shown}: {e}")),
            Ok(m) => m,
        };
        if !meta.is_dir() {
            return Err(format!("refusing to use {shown}: not a directory"));
        }
        let first = std::fs::read_dir(path).map_err(|e| format!("cannot read {shown}: {e}"))?.next();
        if first.is_none() {
            return Ok(StoreDir { path: path.to_path_buf(), created: false });
        }
        if !DirectoryStore::is_store_root(path).map_err(|e| e.to_string())? {
            return Err(format!(
                "refusing to use {shown}: it is not empty and not a directory store made by this library \
                 (nothing was changed; pass an empty or missing directory)"
            ));
        }
        if !reuse {
            return Err(format!(
                "refusing to use {shown}: it holds a directory store (of an earlier run?); pass --reuse to replace it"
            ));
        }
        remove_store_entries(path)?;
        Ok(StoreDir { path: path.to_path_buf(), created: false })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes what the example made: the store's entries, and the directory itself
    /// if the example created it. If anything else appeared in the directory
    /// meanwhile, nothing is removed (the returned message says so).
    pub fn cleanup(&self) -> Result<(), String> {
        if !DirectoryStore::is_store_root(&self.path).map_err(|e| e.to_string())? {
            return Err(format!("not removing {}: it no longer holds only the example's store", self.path.display()));
        }
        remove_store_entries(&self.path)?;
        if self.created {
            std::fs::remove_dir(&self.path).map_err(|e| format!("cannot remove {}: {e}", self.path.display()))?;
        }
        Ok(())
    }
}

/// Removes `objects/`, `tmp/` and the marker of the store at `path` (links inside are
/// removed, never followed).
fn remove_store_entries(path: &Path) -> Result<(), String> {
    for sub in ["objects", "tmp"] {
        let p = path.join(sub);
        std::fs::remove_dir_all(&p).map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    }
    let marker = path.join(STORE_MARKER);
    std::fs::remove_file(&marker).map_err(|e| format!("cannot remove {}: {e}", marker.display()))
}
