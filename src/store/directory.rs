//! Directory backend (the embedded default): one file per key under a root, crash-safe.
//!
//! # Layout
//!
//! ```text
//! <root>/objects/   the objects: key `a/b/c` is the file `objects/d.a/d.b/f.c`
//! <root>/tmp/       temporary files of writers in progress (same filesystem)
//! ```
//!
//! Keys are checked with [`validate_key`] (no empty, `.` or `..` segment, not absolute,
//! no NUL), so no key can leave `objects/`. Every directory segment is prefixed `d.`
//! and the final segment `f.`, so a key never collides with another key's directory:
//! `a/b` (`d.a/f.b`) and `a/b/c` (`d.a/d.b/f.c`) coexist. A segment may be at most
//! 253 bytes (the file-name limit minus the prefix).
//!
//! # Writes
//!
//! Every write goes to a fresh temporary file in `tmp/` (named from the pid, a
//! counter and a random nonce, created with `O_EXCL`), which is written completely
//! and `fsync`ed before its final name appears:
//!
//! * create-only `put` / `batch_put_from`: `link(2)` the temporary file to the final
//!   name. `link` fails with `EEXIST` if the name exists and never replaces it, so
//!   among any number of threads or processes writing one key exactly one wins; the
//!   others get [`ErrorKind::AlreadyExists`] and the stored value is unchanged.
//! * `upsert`: `rename(2)` over the final name (atomic replace).
//!
//! Then the temporary name is removed and the parent directory `fsync`ed. Missing
//! parent directories are created on the way, each new directory's parent being
//! `fsync`ed. The final name therefore only ever refers to a complete, durable file:
//! a reader sees a key whole or not at all, also after `kill -9` (or power loss) at
//! any instant. Objects are never modified in place, so an open file is a stable
//! snapshot of one value.
//!
//! `remove` unlinks the file and `fsync`s its directory; directories are never removed
//! (so a writer never races a disappearing parent), empty ones are left behind.
//!
//! A writer killed mid-write leaves its temporary file behind; it is never visible as
//! an object. [`DirectoryStore::clean_temp`] and
//! [`DirectoryStore::clean_temp_older_than`] remove such files.
//!
//! There is no global lock: every operation works on its own files. Batches that move
//! at least 8 MiB (`batch_put_from`, `get_into_ranges`) run on up to 4 scoped threads
//! (overlapping the per-object `fsync`s); results stay per item, in item order.
//!
//! Keys are case-sensitive only where the filesystem is (Linux: yes).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;

use super::memory::{
    already_exists, check_range, device_unsupported, host_bytes, host_ptr_mut, precheck_put_from, region_len,
};
use super::{
    not_found, run_parallel, validate_key, CopyHook, MemoryRegion, ObjectStore, PutFrom, RangeRead, StridedRead,
    WriteConfig,
};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::MemoryKind;

/// Bounce buffer size for device copies through the copy hook.
const BOUNCE_BYTES: usize = 8 << 20;
/// Longest key segment (255-byte file-name limit minus the 2-byte prefix).
const MAX_SEGMENT_BYTES: usize = 253;
/// Suffix of temporary files.
const TMP_SUFFIX: &str = ".tmp";

/// The directory-backed [`ObjectStore`] (see the module documentation).
pub struct DirectoryStore {
    root: PathBuf,
    objects: PathBuf,
    tmp: PathBuf,
    hook: Option<Arc<dyn CopyHook>>,
    counter: AtomicU64,
    nonce: u64,
    /// Directories this process has created or found and made durable (parent
    /// fsynced); they are never removed by this backend.
    durable_dirs: RwLock<HashSet<PathBuf>>,
}

impl fmt::Debug for DirectoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectoryStore").field("root", &self.root).field("copy_hook", &self.hook.is_some()).finish()
    }
}

/// How a temporary file becomes the object.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Publish {
    /// `link`: fails if the key exists.
    CreateOnly,
    /// `rename`: replaces.
    Replace,
}

fn io_err(op: &str, key: &str, e: io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{op} {key}: {e}"))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl DirectoryStore {
    /// Opens (creating if needed) the store rooted at `root` (kept as its canonical,
    /// absolute path). Stale temporary files of crashed writers are left alone (see
    /// [`DirectoryStore::clean_temp`]); several stores, in one or more processes, may
    /// share a root.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let given = root.as_ref();
        let ctx =
            |e: io::Error| Error::new(ErrorKind::Io, format!("cannot open directory store {}: {e}", given.display()));
        fs::create_dir_all(given.join("objects")).map_err(ctx)?;
        fs::create_dir_all(given.join("tmp")).map_err(ctx)?;
        // Absolute, so a later change of the working directory does not matter.
        let root = fs::canonicalize(given).map_err(ctx)?;
        let objects = root.join("objects");
        let tmp = root.join("tmp");
        fsync_dir(&root).map_err(ctx)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Best effort: makes a freshly created root durable.
            let _ = fsync_dir(parent);
        }
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
        h.write_usize(&root as *const _ as usize);
        let mut durable = HashSet::new();
        durable.insert(objects.clone());
        Ok(DirectoryStore {
            root,
            objects,
            tmp,
            hook: None,
            counter: AtomicU64::new(0),
            nonce: h.finish(),
            durable_dirs: RwLock::new(durable),
        })
    }

    /// As [`DirectoryStore::open`], reaching device memory through `hook`.
    pub fn with_copy_hook(root: impl AsRef<Path>, hook: Arc<dyn CopyHook>) -> Result<Self> {
        let mut s = DirectoryStore::open(root)?;
        s.hook = Some(hook);
        Ok(s)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds `key` (after validating it): segment `i` of `a/b/c` maps
    /// to `objects/d.a/d.b/f.c`.
    pub fn object_path(&self, key: &str) -> Result<PathBuf> {
        validate_key(key)?;
        let mut path = self.objects.clone();
        let mut segs = key.split('/').peekable();
        while let Some(seg) = segs.next() {
            if seg.len() > MAX_SEGMENT_BYTES {
                return Err(Error::invalid(format!(
                    "invalid store key {key:?}: segment longer than {MAX_SEGMENT_BYTES} bytes"
                )));
            }
            let prefix = if segs.peek().is_some() { "d." } else { "f." };
            path.push(format!("{prefix}{seg}"));
        }
        Ok(path)
    }

    /// Removes every temporary file of `tmp/` and returns how many it removed.
    ///
    /// Only call this while no writer (thread or process) uses the store: a writer
    /// whose temporary file is removed fails with an `Io` error (it never publishes a
    /// partial object). Use [`DirectoryStore::clean_temp_older_than`] otherwise.
    pub fn clean_temp(&self) -> Result<usize> {
        self.clean_temp_older_than(Duration::ZERO)
    }

    /// Removes temporary files of `tmp/` last modified at least `age` ago (files of
    /// crashed writers) and returns how many it removed. With an `age` longer than any
    /// write takes, this is safe while writers are active.
    pub fn clean_temp_older_than(&self, age: Duration) -> Result<usize> {
        let ctx = |e: io::Error| Error::new(ErrorKind::Io, format!("cannot clean temporary files: {e}"));
        let now = SystemTime::now();
        let mut removed = 0;
        for entry in fs::read_dir(&self.tmp).map_err(ctx)? {
            let entry = entry.map_err(ctx)?;
            if !entry.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
                continue;
            }
            if !age.is_zero() {
                let Ok(meta) = entry.metadata() else { continue };
                let modified = meta.modified().unwrap_or(now);
                if now.duration_since(modified).unwrap_or(Duration::ZERO) < age {
                    continue;
                }
            }
            match fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ctx(e)),
            }
        }
        Ok(removed)
    }

    /// Creates a fresh temporary file (`O_EXCL`).
    fn temp_file(&self, key: &str) -> Result<(PathBuf, File)> {
        loop {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let path = self.tmp.join(format!("{}.{n}.{:016x}{TMP_SUFFIX}", std::process::id(), self.nonce));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => return Ok((path, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("cannot create temporary file for", key, e)),
            }
        }
    }

    /// Makes sure every directory above `path` exists and is durable.
    fn ensure_parents(&self, path: &Path, key: &str) -> Result<()> {
        let parent = path.parent().expect("object paths have a parent");
        if self.durable_dirs.read().contains(parent) {
            return Ok(());
        }
        let rel = parent.strip_prefix(&self.objects).expect("object paths are under objects/");
        let mut dir = self.objects.clone();
        for comp in rel.components() {
            let above = dir.clone();
            dir.push(comp);
            if self.durable_dirs.read().contains(&dir) {
                continue;
            }
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("cannot create directory for", key, e)),
            }
            // Whether we or a concurrent writer created it, its entry is durable once
            // its parent has been fsynced after the creation.
            fsync_dir(&above).map_err(|e| io_err("cannot sync directory for", key, e))?;
            self.durable_dirs.write().insert(dir.clone());
        }
        Ok(())
    }

    /// Writes a temporary file with `fill`, fsyncs it and publishes it as `key`.
    fn write_object(&self, key: &str, mode: Publish, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
        let path = self.object_path(key)?;
        if mode == Publish::CreateOnly {
            // Cheap early refusal; `link` below is the authoritative check.
            if fs::symlink_metadata(&path).is_ok() {
                return Err(already_exists(key));
            }
        }
        let (tmp, mut file) = self.temp_file(key)?;
        let result = (|| {
            fill(&mut file)?;
            file.sync_all().map_err(|e| io_err("cannot sync", key, e))?;
            drop(file);
            self.publish(&tmp, &path, key, mode)
        })();
        // After a rename the temporary name is gone already; otherwise remove it (for a
        // link the object keeps its own name).
        if !(mode == Publish::Replace && result.is_ok()) {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn publish(&self, tmp: &Path, path: &Path, key: &str, mode: Publish) -> Result<()> {
        let parent = path.parent().expect("object paths have a parent");
        let mut retried = false;
        loop {
            self.ensure_parents(path, key)?;
            let r = match mode {
                Publish::CreateOnly => fs::hard_link(tmp, path),
                Publish::Replace => fs::rename(tmp, path),
            };
            match r {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && mode == Publish::CreateOnly => {
                    return Err(already_exists(key));
                }
                // A parent directory removed behind our back (outside this backend):
                // forget what we know and recreate it once.
                Err(e) if e.kind() == io::ErrorKind::NotFound && !retried && tmp.exists() => {
                    retried = true;
                    self.durable_dirs.write().retain(|d| d == &self.objects);
                }
                Err(e) => return Err(io_err("cannot publish", key, e)),
            }
        }
        fsync_dir(parent).map_err(|e| io_err("cannot sync directory of", key, e))
    }

    fn open_object(&self, key: &str) -> Result<File> {
        let path = self.object_path(key)?;
        File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => not_found(key),
            _ if e.raw_os_error() == Some(libc::ENOTDIR) => not_found(key),
            _ => io_err("cannot open", key, e),
        })
    }

    unsafe fn put_from_one(&self, item: &PutFrom<'_>) -> Result<()> {
        match item.source.kind {
            MemoryKind::Host => {
                // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                let bytes = unsafe { host_bytes(&item.source, item.key) }?;
                self.write_object(item.key, Publish::CreateOnly, |f| {
                    f.write_all(bytes).map_err(|e| io_err("cannot write", item.key, e))
                })
            }
            MemoryKind::Device(_) => {
                let hook = self.hook.as_ref().ok_or_else(|| device_unsupported(item.key))?;
                let len = region_len(&item.source, item.key)?;
                self.write_object(item.key, Publish::CreateOnly, |f| {
                    let mut buf = vec![0u8; len.min(BOUNCE_BYTES)];
                    let mut off = 0usize;
                    while off < len {
                        let n = (len - off).min(buf.len());
                        let src = MemoryRegion {
                            address: item.source.address + off as u64,
                            len: n as u64,
                            kind: item.source.kind,
                        };
                        hook.device_to_host(src, &mut buf[..n])
                            .map_err(|e| e.context(&format!("copy from device for {}: ", item.key)))?;
                        f.write_all(&buf[..n]).map_err(|e| io_err("cannot write", item.key, e))?;
                        off += n;
                    }
                    Ok(())
                })
            }
        }
    }

    unsafe fn read_one(&self, r: &RangeRead<'_>, cache: &mut Option<(String, File, u64)>) -> Result<u64> {
        if matches!(r.dest.kind, MemoryKind::Device(_)) && self.hook.is_none() {
            return Err(device_unsupported(r.key));
        }
        if cache.as_ref().is_none_or(|(k, _, _)| k != r.key) {
            *cache = None;
            let f = self.open_object(r.key)?;
            let size = f.metadata().map_err(|e| io_err("cannot stat", r.key, e))?.len();
            *cache = Some((r.key.to_owned(), f, size));
        }
        let (_, file, size) = cache.as_ref().expect("cached above");
        let (_, len) = check_range(r, *size)?;
        let short = |e: io::Error| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::new(ErrorKind::Integrity, format!("short read of {}", r.key))
            } else {
                io_err("cannot read", r.key, e)
            }
        };
        match r.dest.kind {
            MemoryKind::Host => {
                if len > 0 {
                    // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                    let dst = unsafe { std::slice::from_raw_parts_mut(host_ptr_mut(&r.dest, r.key)?, len) };
                    file.read_exact_at(dst, r.object_offset).map_err(short)?;
                }
            }
            MemoryKind::Device(_) => {
                let hook = self.hook.as_ref().ok_or_else(|| device_unsupported(r.key))?;
                let mut buf = vec![0u8; len.min(BOUNCE_BYTES)];
                let mut off = 0usize;
                while off < len {
                    let n = (len - off).min(buf.len());
                    file.read_exact_at(&mut buf[..n], r.object_offset + off as u64).map_err(short)?;
                    let dst = MemoryRegion { address: r.dest.address + off as u64, len: n as u64, kind: r.dest.kind };
                    hook.host_to_device(&buf[..n], dst)
                        .map_err(|e| e.context(&format!("copy to device for {}: ", r.key)))?;
                    off += n;
                }
            }
        }
        Ok(len as u64)
    }
}

impl DirectoryStore {
    /// One strided read into host memory: a single `pread` for one segment, else a
    /// read-only mapping of the touched object range and one copy per segment (no
    /// system call per segment). Objects are immutable once linked (writers never
    /// truncate or rewrite a published file; upsert replaces it by rename), so the
    /// mapping stays valid. Device destinations go through ranges and the hook.
    unsafe fn read_strided(&self, r: &StridedRead<'_>, cache: &mut Option<(String, File, u64)>) -> Result<u64> {
        if matches!(r.dest.kind, MemoryKind::Device(_)) || r.segment_count() <= 1 {
            let mut total = 0;
            r.for_each_segment(|s, d, n| {
                let range = RangeRead {
                    key: r.key,
                    object_offset: s,
                    dest: MemoryRegion { address: r.dest.address + d, len: n, kind: r.dest.kind },
                };
                // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
                total += unsafe { self.read_one(&range, cache) }?;
                Ok(())
            })?;
            return Ok(total);
        }
        if cache.as_ref().is_none_or(|(k, _, _)| k != r.key) {
            *cache = None;
            let f = self.open_object(r.key)?;
            let size = f.metadata().map_err(|e| io_err("cannot stat", r.key, e))?.len();
            *cache = Some((r.key.to_owned(), f, size));
        }
        let (_, file, size) = cache.as_ref().expect("cached above");
        r.check_bounds(*size)?;
        let base = host_ptr_mut(&r.dest, r.key)?;
        let page = 4096u64;
        let start = r.object_offset / page * page;
        let end = {
            let mut e = r.object_offset + r.inner_bytes;
            for (c, st) in r.counts.iter().zip(r.src_strides) {
                e += (c - 1) * st;
            }
            e
        };
        let map_len = (end - start) as usize;
        use std::os::fd::AsRawFd;
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io_err("cannot map", r.key, io::Error::last_os_error()));
        }
        let src = map as *const u8;
        let result = r.for_each_segment(|s, d, n| {
            // Both ranges were checked against the object size and the view.
            // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
            unsafe { super::copy_for_restore(base.add(d as usize), src.add((s - start) as usize), n as usize) };
            Ok(())
        });
        super::copy_fence();
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        unsafe { libc::munmap(map, map_len) };
        result.map(|()| r.total_bytes())
    }
}

impl ObjectStore for DirectoryStore {
    fn object_size(&self, key: &str) -> Result<u64> {
        let f = self.open_object(key)?;
        Ok(f.metadata().map_err(|e| io_err("cannot stat", key, e))?.len())
    }

    fn supports_strided_reads(&self) -> bool {
        true
    }

    /// Host memory always; device memory when the store has a copy hook.
    fn supports_memory(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::Host || self.hook.is_some()
    }

    unsafe fn get_into_strided(&self, reads: &[StridedRead<'_>]) -> Vec<Result<u64>> {
        let bytes: u64 = reads.iter().map(|r| r.total_bytes()).sum();
        let mut results: Vec<Result<u64>> = (0..reads.len()).map(|_| Ok(0)).collect();
        // SAFETY: this function's caller guarantees every destination region valid and exclusively ours for the call (its `# Safety`), which is `read_strided`'s contract.
        let done =
            run_parallel((0..reads.len()).collect(), bytes, |i, cache| unsafe { self.read_strided(&reads[i], cache) });
        for (i, r) in done {
            results[i] = r;
        }
        results
    }

    fn put(&self, key: &str, value: &[u8], _config: &WriteConfig<'_>) -> Result<()> {
        self.write_object(key, Publish::CreateOnly, |f| f.write_all(value).map_err(|e| io_err("cannot write", key, e)))
    }

    fn upsert(&self, key: &str, value: &[u8], _config: &WriteConfig<'_>) -> Result<()> {
        self.write_object(key, Publish::Replace, |f| f.write_all(value).map_err(|e| io_err("cannot write", key, e)))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut f = self.open_object(key)?;
        let size = f.metadata().map_err(|e| io_err("cannot stat", key, e))?.len();
        let mut out = Vec::with_capacity(size as usize);
        f.read_to_end(&mut out).map_err(|e| io_err("cannot read", key, e))?;
        if out.len() as u64 != size {
            return Err(Error::new(ErrorKind::Integrity, format!("short read of {key}")));
        }
        Ok(out)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let path = self.object_path(key)?;
        match fs::symlink_metadata(path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
            Err(e) => Err(io_err("cannot stat", key, e)),
        }
    }

    fn remove(&self, key: &str) -> Result<()> {
        let path = self.object_path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {
                let parent = path.parent().expect("object paths have a parent");
                fsync_dir(parent).map_err(|e| io_err("cannot sync directory of", key, e))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => Ok(()),
            Err(e) => Err(io_err("cannot remove", key, e)),
        }
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
        // Keys are checked up front too, so an invalid key fails before any I/O.
        let mut results: Vec<Result<()>> = precheck_put_from(items, config, self.hook.is_some())
            .into_iter()
            .zip(items)
            .map(|(c, item)| c.and_then(|_| self.object_path(item.key).map(drop)))
            .collect();
        let jobs: Vec<usize> = (0..items.len()).filter(|&i| results[i].is_ok()).collect();
        let bytes: u64 = jobs.iter().map(|&i| items[i].source.len).sum();
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        for (i, r) in run_parallel(jobs, bytes, |i, _: &mut ()| unsafe { self.put_from_one(&items[i]) }) {
            results[i] = r;
        }
        results
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        let bytes: u64 = ranges.iter().map(|r| r.dest.len).sum();
        let mut results: Vec<Result<u64>> = (0..ranges.len()).map(|_| Ok(0)).collect();
        // SAFETY: as above, for `read_one`'s ranges.
        let done =
            run_parallel((0..ranges.len()).collect(), bytes, |i, cache| unsafe { self.read_one(&ranges[i], cache) });
        for (i, r) in done {
            results[i] = r;
        }
        results
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<DirectoryStore>();
    is::<super::memory::MemoryStore>();
}
