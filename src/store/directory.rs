//! Directory backend (the embedded default): one file per key under a root, crash-safe.
//!
//! # Layout
//!
//! ```text
//! <root>/objects/   the objects: key `a/b/c` is the file `objects/d.a/d.b/f.c`
//! <root>/tmp/       temporary files of writers in progress (same filesystem)
//! <root>/MOONCAKE_WEIGHT_STORE   marker: this directory is a store of this library
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
//!
//! # Untrusted content below the root
//!
//! The store never follows a symbolic link below its root, for any operation:
//! `objects/` and `tmp/` are opened once without following links, and every object
//! path is resolved one component at a time relative to an open directory with
//! `O_NOFOLLOW` (`src/store/dirfd.rs`). A link (or a file of the wrong type) at any
//! component of a key makes every operation on that key (`exists`, `get`,
//! `object_size`, ranged reads, `put`, `upsert`, `remove`) fail alike with
//! [`ErrorKind::Io`] `directory store entry objects/... of key K is a symbolic link
//! ...`; nothing outside the root is read, written or removed. Only regular files are
//! read (checked before and after `open`, which never blocks on a FIFO); whole-object
//! reads are bounded ([`ObjectStore::get_limited`]) and allocate with `try_reserve`.
//!
//! Long and strided reads copy from read-only mappings of the object files (faster
//! on the benchmark machine than `pread` into the destination or through a bounce
//! buffer, measured). Removing objects while they are read is safe (an unlinked file
//! keeps its pages until unmapped), and this library never truncates or rewrites an
//! object file in place; but a *foreign* process that truncates an object file while
//! a restore copies from its mapping makes the kernel send `SIGBUS` to the reading
//! process. Do not edit files under `objects/` by hand while the store is in use;
//! `mws verify` and integrity verification find damage done at rest.
//!
//! [`DirectoryStore::open`] writes the marker file [`STORE_MARKER`] at the root, so
//! tools can recognise a store this library made ([`DirectoryStore::is_store_root`]).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;

use super::dirfd::{c_name, kind_of, mtime_secs, Dir, EntryKind};
use super::kernels::{run_parallel_on, CrcRuns};
use super::memory::{already_exists, check_range, device_unsupported, host_bytes, host_ptr_mut, precheck_put_from};
use super::{
    alloc_failed, not_found, too_large, validate_key, CheckedRead, ObjectStore, PutFrom, RangeRead, StridedRead,
    WriteConfig,
};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::MemoryKind;
use crate::runtime::MemoryRegion;

/// Page size assumed for mapping offsets (mmap offsets must be multiples of it).
const PAGE: u64 = 4096;
/// Longest key segment (255-byte file-name limit minus the 2-byte prefix).
const MAX_SEGMENT_BYTES: usize = 253;
/// Suffix of temporary files.
const TMP_SUFFIX: &str = ".tmp";

/// Name of the marker file every [`DirectoryStore::open`] writes at the root (if
/// absent): it makes a directory recognisable as a store this library made (see
/// [`DirectoryStore::is_store_root`]).
pub const STORE_MARKER: &str = "MOONCAKE_WEIGHT_STORE";
/// Content of [`STORE_MARKER`].
pub const STORE_MARKER_TEXT: &str = "mooncake-weight-store directory store, layout 1\n";

/// The directory-backed [`ObjectStore`] (see the module documentation).
pub struct DirectoryStore {
    root: PathBuf,
    objects: PathBuf,
    /// `objects/` and `tmp/`, opened once (not following links); every object path
    /// is resolved relative to `objects_dir`, one component at a time.
    objects_dir: Dir,
    tmp_dir: Dir,
    counter: AtomicU64,
    nonce: u64,
    /// Directories (relative to the root, `objects/d.a/...`) this process has created
    /// or found and made durable (parent fsynced); never removed by this backend.
    durable_dirs: RwLock<HashSet<String>>,
    /// Threads of one large batch ([`DirectoryStore::set_max_threads`]).
    threads: super::kernels::ThreadLimit,
}

impl fmt::Debug for DirectoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectoryStore").field("root", &self.root).finish()
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

/// The directory that holds a key's file, and the file's name in it.
struct Parent {
    dir: Dir,
    leaf: CString,
    /// `objects/d.a/f.b`, for messages.
    rel: String,
}

fn io_err(op: &str, key: &str, e: io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{op} {key}: {e}"))
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// An entry below the root that this backend did not make: a symbolic link (never
/// followed), or a file of the wrong type. Every operation on the key refuses it.
fn foreign(key: &str, rel: &str, kind: EntryKind) -> Error {
    let what = match kind {
        EntryKind::Symlink => "is a symbolic link (links below the store root are never followed)",
        EntryKind::Dir => "is a directory, not a regular file",
        EntryKind::File(_) => "is a regular file, not a directory",
        EntryKind::Other => "is not a regular file (FIFO, socket or device)",
    };
    Error::new(ErrorKind::Io, format!("directory store entry {rel} of key {key} {what}"))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The path itself, or its nearest existing ancestor, when that is not a directory
/// (a regular file, a device, ...): a store root can then neither be opened nor
/// created. `None` when the nearest existing one is a directory (or nothing exists).
fn file_in_the_way(given: &Path) -> Option<&Path> {
    let mut at = Some(given);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => return None,
            Ok(_) => return Some(p),
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => at = p.parent(),
            Err(_) => return None,
        }
    }
    None
}

/// Opens (creating if needed) the subdirectory `name` of `root`, refusing a link.
fn open_subdir(root: &Dir, name: &str) -> io::Result<Dir> {
    let c = c_name(name)?;
    match root.mkdir(&c) {
        Ok(()) => {}
        Err(e) if errno(&e) == libc::EEXIST => {}
        Err(e) => return Err(e),
    }
    root.open_dir(&c).map_err(|e| match errno(&e) {
        libc::ELOOP | libc::ENOTDIR => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is not a directory (a symbolic link or a file); refusing to use it"),
        ),
        _ => e,
    })
}

impl DirectoryStore {
    /// Opens (creating if needed) the store rooted at `root` (kept as its canonical,
    /// absolute path; links in `root` itself are followed, the caller named it).
    /// `objects/` and `tmp/` must be real directories, not links. Writes the marker
    /// file [`STORE_MARKER`] if absent. Stale temporary files of crashed writers are
    /// left alone (see [`DirectoryStore::clean_temp`]); several stores, in one or
    /// more processes, may share a root.
    ///
    /// One rule for every surface (Rust, C, C++, Python, the `mws` CLI and the
    /// examples): a missing or empty directory becomes a store, a store's root (only
    /// `objects/`, `tmp/` and the marker, a store of an older build without the
    /// marker included) is opened, and anything else is refused untouched: a
    /// directory store never adopts a directory that holds other data (`lost+found`
    /// included).
    ///
    /// Errors: [`ErrorKind::InvalidArgument`] `refusing to open <root> as a directory
    /// store: it holds entries a store of this library never makes (<names>); nothing
    /// was changed`; [`ErrorKind::Io`] `cannot open directory store <root>: <detail>`
    /// (`it is a file, not a directory` when `root`, or `<ancestor> is a file, not a
    /// directory` when an ancestor of it, is a regular file).
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let given = root.as_ref();
        let ctx =
            |e: io::Error| Error::new(ErrorKind::Io, format!("cannot open directory store {}: {e}", given.display()));
        if let Some(file) = file_in_the_way(given) {
            let what = if file == given {
                "it is a file, not a directory".to_string()
            } else {
                format!("{} is a file, not a directory", file.display())
            };
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "cannot open directory store {}: {what} (pass a directory, or a path to create one)",
                    given.display()
                ),
            ));
        }
        fs::create_dir_all(given).map_err(ctx)?;
        // Absolute, so a later change of the working directory does not matter.
        let root = fs::canonicalize(given).map_err(ctx)?;
        let root_dir = Dir::open_path(&root).map_err(ctx)?;
        let foreign: Vec<String> = root_dir
            .names()
            .map_err(ctx)?
            .into_iter()
            .filter(|n| !matches!(n.to_bytes(), b"objects" | b"tmp") && n.to_bytes() != STORE_MARKER.as_bytes())
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        if !foreign.is_empty() {
            let mut names: Vec<&str> = foreign.iter().map(String::as_str).take(5).collect();
            names.sort_unstable();
            let more = if foreign.len() > 5 { format!(" and {} more", foreign.len() - 5) } else { String::new() };
            return Err(Error::invalid(format!(
                "refusing to open {} as a directory store: it holds entries a store of this library never makes \
                 ({}{more}); nothing was changed (pass a missing or empty directory, or a store's root)",
                given.display(),
                names.join(", ")
            )));
        }
        let objects_dir = open_subdir(&root_dir, "objects").map_err(ctx)?;
        let tmp_dir = open_subdir(&root_dir, "tmp").map_err(ctx)?;
        root_dir.sync().map_err(ctx)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Best effort: makes a freshly created root durable.
            let _ = fsync_dir(parent);
        }
        let objects = root.join("objects");
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
        h.write_usize(&root as *const _ as usize);
        let mut durable = HashSet::new();
        durable.insert("objects".to_string());
        let store = DirectoryStore {
            root,
            objects,
            objects_dir,
            tmp_dir,
            counter: AtomicU64::new(0),
            nonce: h.finish(),
            durable_dirs: RwLock::new(durable),
            threads: super::kernels::ThreadLimit::default(),
        };
        store.write_marker(&root_dir).map_err(ctx)?;
        Ok(store)
    }

    /// Writes [`STORE_MARKER`] at the root unless an entry of that name exists
    /// (atomically: a temporary file linked into place).
    fn write_marker(&self, root_dir: &Dir) -> io::Result<()> {
        let marker = c_name(STORE_MARKER)?;
        match root_dir.entry(&marker) {
            Err(e) if errno(&e) == libc::ENOENT => {}
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
        let (tmp, mut file) = self.temp_file(STORE_MARKER).map_err(|e| io::Error::other(e.message().to_string()))?;
        let r = file.write_all(STORE_MARKER_TEXT.as_bytes()).and_then(|()| file.sync_all()).and_then(|()| {
            match self.tmp_dir.link(&tmp, root_dir, &marker) {
                Err(e) if errno(&e) != libc::EEXIST => Err(e),
                _ => root_dir.sync(),
            }
        });
        let _ = self.tmp_dir.unlink(&tmp);
        r
    }

    /// True when `path` is recognisably a directory store this library made: a
    /// directory (not a link) holding the marker file [`STORE_MARKER`] with its exact
    /// content, `objects/` and `tmp/` directories, and nothing else. A missing path
    /// is `false`. Examples and tools use it before they reuse or remove a directory.
    ///
    /// Errors: [`ErrorKind::Io`] when `path` exists but cannot be read.
    pub fn is_store_root(path: impl AsRef<Path>) -> Result<bool> {
        let path = path.as_ref();
        let ctx = |e: io::Error| Error::new(ErrorKind::Io, format!("cannot inspect {}: {e}", path.display()));
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(ctx(e)),
            Ok(m) if !m.is_dir() => return Ok(false),
            Ok(_) => {}
        }
        let dir = Dir::open_path(path).map_err(ctx)?;
        let mut seen = 0;
        for name in dir.names().map_err(ctx)? {
            let ok = match name.to_bytes() {
                b"objects" | b"tmp" => dir.entry(&name).map_err(ctx)? == EntryKind::Dir,
                n if n == STORE_MARKER.as_bytes() => match dir.entry(&name).map_err(ctx)? {
                    EntryKind::File(len) if len == STORE_MARKER_TEXT.len() as u64 => {
                        let mut text = String::new();
                        dir.open_read(&name).and_then(|mut f| f.read_to_string(&mut text)).map_err(ctx)?;
                        text == STORE_MARKER_TEXT
                    }
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return Ok(false);
            }
            seen += 1;
        }
        Ok(seen == 3)
    }

    /// Limits the threads one large batch (reads, `batch_put_from`) runs on to `n`
    /// (1 = the calling thread only; 0 = the default, [`super::io_threads`]). Takes
    /// effect for later calls; thread-safe.
    pub fn set_max_threads(&self, n: usize) {
        self.threads.set(n);
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file names of `key`: its directory segments (`d.<seg>`) and its file
    /// (`f.<seg>`), after validating it.
    fn names(key: &str) -> Result<(Vec<String>, String)> {
        validate_key(key)?;
        let mut segs: Vec<&str> = key.split('/').collect();
        if segs.iter().any(|s| s.len() > MAX_SEGMENT_BYTES) {
            return Err(Error::invalid(format!(
                "invalid store key {key:?}: segment longer than {MAX_SEGMENT_BYTES} bytes"
            )));
        }
        let leaf = format!("f.{}", segs.pop().expect("a valid key has a segment"));
        Ok((segs.iter().map(|s| format!("d.{s}")).collect(), leaf))
    }

    /// The file that holds `key` (after validating it): segment `i` of `a/b/c` maps
    /// to `objects/d.a/d.b/f.c`. Informational: the store itself never resolves
    /// this path (it walks it component by component without following links).
    pub fn object_path(&self, key: &str) -> Result<PathBuf> {
        let (dirs, leaf) = Self::names(key)?;
        let mut path = self.objects.clone();
        path.extend(dirs);
        path.push(leaf);
        Ok(path)
    }

    /// Resolves the directory of `key` below `objects/`, one component at a time,
    /// never following a link. `None` when a directory is missing and `create` is
    /// false; with `create`, missing directories are created and made durable.
    fn parent(&self, key: &str, create: bool) -> Result<Option<Parent>> {
        let (dirs, leaf) = Self::names(key)?;
        let name = |s: &str| c_name(s).map_err(|e| io_err("invalid name for", key, e));
        if let Some(p) = self.parent_fast(&dirs, &leaf, create) {
            return Ok(Some(p));
        }
        let mut cur = self.objects_dir.try_clone().map_err(|e| io_err("cannot open directory for", key, e))?;
        let mut rel = String::from("objects");
        for seg in &dirs {
            rel.push('/');
            rel.push_str(seg);
            let c = name(seg)?;
            let next = match cur.open_dir(&c) {
                Ok(d) => d,
                Err(e) if errno(&e) == libc::ENOENT => {
                    if !create {
                        return Ok(None);
                    }
                    match cur.mkdir(&c) {
                        Ok(()) => {}
                        Err(e) if errno(&e) == libc::EEXIST => {}
                        Err(e) => return Err(io_err("cannot create directory for", key, e)),
                    }
                    cur.open_dir(&c).map_err(|e| Self::dir_error(&cur, &c, key, &rel, e))?
                }
                Err(e) => return Err(Self::dir_error(&cur, &c, key, &rel, e)),
            };
            if create && !self.durable_dirs.read().contains(&rel) {
                // Whether we or a concurrent writer created it, its entry is durable
                // once its parent has been fsynced after the creation.
                cur.sync().map_err(|e| io_err("cannot sync directory for", key, e))?;
                self.durable_dirs.write().insert(rel.clone());
            }
            cur = next;
        }
        rel.push('/');
        rel.push_str(&leaf);
        Ok(Some(Parent { dir: cur, leaf: name(&leaf)?, rel }))
    }

    /// [`DirectoryStore::parent`] in one system call ([`Dir::open_beneath`]) when the
    /// key has directories, they all exist and (with `create`) are known durable;
    /// `None` otherwise, and on any error, so that the component walk runs and gives
    /// its exact result (missing directories, links, foreign entries).
    fn parent_fast(&self, dirs: &[String], leaf: &str, create: bool) -> Option<Parent> {
        if dirs.is_empty() {
            return None;
        }
        let path = dirs.join("/");
        let rel = format!("objects/{path}");
        // The walk marks each directory durable after syncing its parent, outermost
        // first, so the deepest one being known durable covers all of them.
        if create && !self.durable_dirs.read().contains(&rel) {
            return None;
        }
        let dir = self.objects_dir.open_beneath(&c_name(&path).ok()?).ok()?;
        Some(Parent { dir, leaf: c_name(leaf).ok()?, rel: format!("{rel}/{leaf}") })
    }

    /// The error of a directory component that could not be opened.
    fn dir_error(parent: &Dir, name: &CStr, key: &str, rel: &str, e: io::Error) -> Error {
        if matches!(errno(&e), libc::ELOOP | libc::ENOTDIR) {
            if let Ok(kind) = parent.entry(name) {
                if kind != EntryKind::Dir {
                    return foreign(key, rel, kind);
                }
            }
        }
        io_err("cannot open directory for", key, e)
    }

    /// What is at the key's file name: `None` when absent, the size of a regular
    /// file, or the refusal of anything else.
    fn leaf_size(&self, p: &Parent, key: &str) -> Result<Option<u64>> {
        match p.dir.entry(&p.leaf) {
            Ok(EntryKind::File(n)) => Ok(Some(n)),
            Ok(kind) => Err(foreign(key, &p.rel, kind)),
            Err(e) if errno(&e) == libc::ENOENT => Ok(None),
            Err(e) => Err(io_err("cannot stat", key, e)),
        }
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
    /// write takes, this is safe while writers are active. Only regular files are
    /// removed (never a link's target).
    pub fn clean_temp_older_than(&self, age: Duration) -> Result<usize> {
        let ctx = |e: io::Error| Error::new(ErrorKind::Io, format!("cannot clean temporary files: {e}"));
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let mut removed = 0;
        for name in self.tmp_dir.names().map_err(ctx)? {
            if !name.to_bytes().ends_with(TMP_SUFFIX.as_bytes()) {
                continue;
            }
            if !matches!(self.tmp_dir.entry(&name), Ok(EntryKind::File(_))) {
                continue;
            }
            if !age.is_zero() {
                let Some(modified) = mtime_secs(&self.tmp_dir, &name) else { continue };
                if now.saturating_sub(modified) < age.as_secs() as i64 {
                    continue;
                }
            }
            match self.tmp_dir.unlink(&name) {
                Ok(()) => removed += 1,
                Err(e) if errno(&e) == libc::ENOENT => {}
                Err(e) => return Err(ctx(e)),
            }
        }
        Ok(removed)
    }

    /// Creates a fresh temporary file in `tmp/` (`O_EXCL | O_NOFOLLOW`).
    fn temp_file(&self, key: &str) -> Result<(CString, File)> {
        loop {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}.{n}.{:016x}{TMP_SUFFIX}", std::process::id(), self.nonce);
            let name = c_name(&name).map_err(|e| io_err("cannot create temporary file for", key, e))?;
            match self.tmp_dir.create_new(&name) {
                Ok(f) => return Ok((name, f)),
                Err(e) if errno(&e) == libc::EEXIST => continue,
                Err(e) => return Err(io_err("cannot create temporary file for", key, e)),
            }
        }
    }

    /// Writes a temporary file with `fill`, fsyncs it and publishes it as `key`.
    fn write_object(&self, key: &str, mode: Publish, fill: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
        let parent = self.parent(key, true)?.expect("created");
        // A link or foreign file at the name is refused by every operation; for a
        // create-only put an existing file is a cheap early refusal (`link` below is
        // the authoritative check).
        if self.leaf_size(&parent, key)?.is_some() && mode == Publish::CreateOnly {
            return Err(already_exists(key));
        }
        let (tmp, mut file) = self.temp_file(key)?;
        let result = (|| {
            fill(&mut file)?;
            file.sync_all().map_err(|e| io_err("cannot sync", key, e))?;
            drop(file);
            self.publish(&tmp, parent, key, mode)
        })();
        // After a rename the temporary name is gone already; otherwise remove it (for a
        // link the object keeps its own name).
        if !(mode == Publish::Replace && result.is_ok()) {
            let _ = self.tmp_dir.unlink(&tmp);
        }
        result
    }

    fn publish(&self, tmp: &CStr, mut parent: Parent, key: &str, mode: Publish) -> Result<()> {
        let mut retried = false;
        loop {
            let r = match mode {
                Publish::CreateOnly => self.tmp_dir.link(tmp, &parent.dir, &parent.leaf),
                Publish::Replace => self.tmp_dir.rename(tmp, &parent.dir, &parent.leaf),
            };
            match r {
                Ok(()) => break,
                Err(e) if errno(&e) == libc::EEXIST && mode == Publish::CreateOnly => {
                    return Err(already_exists(key));
                }
                // A parent directory removed behind our back (outside this backend):
                // forget what we know and recreate it once.
                Err(e) if errno(&e) == libc::ENOENT && !retried && self.tmp_dir.entry(tmp).is_ok() => {
                    retried = true;
                    self.durable_dirs.write().retain(|d| d == "objects");
                    parent = self.parent(key, true)?.expect("created");
                }
                Err(e) => return Err(io_err("cannot publish", key, e)),
            }
        }
        parent.dir.sync().map_err(|e| io_err("cannot sync directory of", key, e))
    }

    /// Opens the object's file for reading: a regular file only (checked before and,
    /// on the open file, after opening), never through a link. Returns its size.
    fn open_object(&self, key: &str) -> Result<(File, u64)> {
        let Some(p) = self.parent(key, false)? else { return Err(not_found(key)) };
        self.open_in(&p, key)
    }

    /// [`DirectoryStore::open_object`] in a resolved directory.
    fn open_in(&self, p: &Parent, key: &str) -> Result<(File, u64)> {
        if self.leaf_size(p, key)?.is_none() {
            return Err(not_found(key));
        }
        let f = p.dir.open_read(&p.leaf).map_err(|e| match errno(&e) {
            libc::ENOENT => not_found(key),
            libc::ELOOP => foreign(key, &p.rel, EntryKind::Symlink),
            _ => io_err("cannot open", key, e),
        })?;
        match kind_of(&f).map_err(|e| io_err("cannot stat", key, e))? {
            EntryKind::File(size) => Ok((f, size)),
            kind => Err(foreign(key, &p.rel, kind)),
        }
    }

    /// As [`DirectoryStore::parent`] without `create`, reusing the directory of the
    /// previous key when `key` lies in the same one (`last`: that key directory and
    /// its resolved handle). The walk is done once per directory and batch instead of
    /// once per key; `last` lives only for one call (a batch), like the open-file
    /// cache of ranged reads, and the leaf is still checked and opened without
    /// following links on every key.
    fn parent_cached<'c>(&self, key: &str, last: &'c mut Option<(String, Parent)>) -> Result<Option<&'c Parent>> {
        let (_, leaf) = Self::names(key)?;
        let dir = key.rsplit_once('/').map_or("", |(d, _)| d);
        if last.as_ref().is_none_or(|(d, _)| d != dir) {
            *last = None;
            let Some(p) = self.parent(key, false)? else { return Ok(None) };
            *last = Some((dir.to_owned(), p));
        }
        let (_, p) = last.as_mut().expect("resolved above");
        if p.leaf.to_bytes() != leaf.as_bytes() {
            p.leaf = c_name(&leaf).map_err(|e| io_err("invalid name for", key, e))?;
            let cut = p.rel.rfind('/').map_or(0, |i| i + 1);
            p.rel.truncate(cut);
            p.rel.push_str(&leaf);
        }
        Ok(Some(p))
    }

    /// Reads the whole object if it holds at most `max_bytes` (reads at most one byte
    /// more than its size, so a file that grows is caught).
    fn read_bounded(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>> {
        let (f, size) = self.open_object(key)?;
        if size > max_bytes {
            return Err(too_large(key, size, max_bytes));
        }
        let mut out = Vec::new();
        usize::try_from(size)
            .ok()
            .and_then(|n| out.try_reserve_exact(n).ok())
            .ok_or_else(|| alloc_failed(key, size))?;
        f.take(size.saturating_add(1)).read_to_end(&mut out).map_err(|e| io_err("cannot read", key, e))?;
        if out.len() as u64 != size {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!("read of {key} returned {} bytes, its file holds {size}", out.len()),
            ));
        }
        Ok(out)
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
            MemoryKind::Device(_) => Err(device_unsupported(item.key)),
        }
    }

    /// One range; with `span`, also the CRC-32C of what it delivered.
    unsafe fn read_one(&self, r: &RangeRead<'_>, cache: &mut ReadCache, span: Option<u64>) -> Result<CheckedRead> {
        let mut sums = span.map(CrcRuns::new);
        // SAFETY: forwarded from this function's contract.
        let bytes = unsafe { self.read_one_into(r, cache, sums.as_mut()) }?;
        Ok(CheckedRead { bytes, crcs: sums.map(CrcRuns::finish) })
    }

    /// One range, summing what it delivers into `sums` when given: host reads `pread`
    /// in pieces of [`PREAD_CRC_BYTES`] and sum each piece from the destination right
    /// after it landed (still in cache). Device destinations are refused.
    unsafe fn read_one_into(
        &self,
        r: &RangeRead<'_>,
        cache: &mut ReadCache,
        sums: Option<&mut CrcRuns>,
    ) -> Result<u64> {
        if matches!(r.dest.kind, MemoryKind::Device(_)) {
            return Err(device_unsupported(r.key));
        }
        let (file, size) = self.cached_file(r.key, cache)?;
        let (_, len) = check_range(r, size)?;
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
                    match sums {
                        None => file.read_exact_at(dst, r.object_offset).map_err(short)?,
                        Some(sums) => {
                            for (k, piece) in dst.chunks_mut(PREAD_CRC_BYTES).enumerate() {
                                let at = r.object_offset + (k * PREAD_CRC_BYTES) as u64;
                                file.read_exact_at(piece, at).map_err(short)?;
                                sums.account(at, piece);
                            }
                        }
                    }
                }
            }
            MemoryKind::Device(_) => return Err(device_unsupported(r.key)),
        }
        Ok(len as u64)
    }
}

/// Piece of a checked host `pread` summed right after it landed (fits in L2).
const PREAD_CRC_BYTES: usize = 256 << 10;

/// Single-segment host reads shorter than this use `pread`; longer ones and every
/// strided read are copied from a read-only mapping (one user-space streaming copy
/// instead of the kernel's copy, which reads every destination line first) —
/// unless the batch runs on several threads: then single-segment reads use `pread`
/// at any size, since every `munmap` interrupts the other copying threads (a TLB
/// shootdown). Measured on the io benchmark's same-layout restore from a warm
/// directory store (ratio to memcpy, 5 runs each): 2 threads, mapping 0.43-0.72
/// (median 0.61), `pread` 0.63-0.74 (0.73); 1 thread, mapping 0.52-0.62 (0.56),
/// `pread` 0.39-0.43 (0.42).
const MAP_MIN_BYTES: u64 = 64 << 10;

/// Per-thread state of one read batch: the last object opened (key, file, size),
/// the last key directory resolved, and whether other threads read the same batch.
#[derive(Default)]
struct ReadCache {
    file: Option<(String, File, u64)>,
    dir: Option<(String, Parent)>,
    concurrent: bool,
}

impl DirectoryStore {
    /// The open file of `key` (from `cache` when it was the previous key).
    fn cached_file<'c>(&self, key: &str, cache: &'c mut ReadCache) -> Result<(&'c File, u64)> {
        if cache.file.as_ref().is_none_or(|(k, _, _)| k != key) {
            cache.file = None;
            let Some(p) = self.parent_cached(key, &mut cache.dir)? else { return Err(not_found(key)) };
            let (f, size) = self.open_in(p, key)?;
            cache.file = Some((key.to_owned(), f, size));
        }
        let (_, f, size) = cache.file.as_ref().expect("cached above");
        Ok((f, *size))
    }
}

/// A read-only mapping of an object range, unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr+len` is a mapping this value created and owns.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

impl DirectoryStore {
    /// Maps `[start, end)` of `file` read-only (`start` page-aligned), populated.
    fn map_range(file: &File, key: &str, start: u64, end: u64) -> Result<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(end - start).map_err(|_| Error::invalid(format!("read of {key} is too large")))?;
        // SAFETY: a fresh private read-only mapping of our own descriptor; no Rust
        // reference aliases it; `Mapping` unmaps it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io_err("cannot map", key, io::Error::last_os_error()));
        }
        Ok(Mapping { addr, len })
    }

    /// Reads a group of strided reads into one destination view (see
    /// [`super::kernels::dest_groups`]): each read is opened, checked and mapped on its own
    /// (its own result), then the host reads that passed are copied merged by
    /// destination ([`super::kernels::copy_merged`]). Device reads and short single-segment
    /// reads go one by one ([`DirectoryStore::read_strided`]).
    /// With `span`, every item also returns the CRC-32C of what it delivered (summed
    /// from the mappings as the kernels copy, or from the destination after each
    /// `pread` piece).
    unsafe fn read_group(
        &self,
        reads: &[StridedRead<'_>],
        cache: &mut ReadCache,
        span: Option<u64>,
    ) -> Vec<Result<CheckedRead>> {
        let mut results: Vec<Result<CheckedRead>> = Vec::with_capacity(reads.len());
        let mut maps: Vec<(usize, Mapping, u64)> = Vec::new(); // (read index, mapping, its object offset)
        let mut base: *mut u8 = std::ptr::null_mut();
        for (i, r) in reads.iter().enumerate() {
            let exp_map = span.is_some() && std::env::var_os("MWS_EXP_MAP_CHECKED").is_some();
            let direct = r.segment_count() <= 1 && ((cache.concurrent && !exp_map) || r.total_bytes() < MAP_MIN_BYTES);
            if r.dest.kind != MemoryKind::Host || direct {
                // SAFETY: forwarded from this function's contract.
                results.push(unsafe { self.read_strided(r, cache, span) });
                continue;
            }
            let checked = (|| {
                let (file, size) = self.cached_file(r.key, cache)?;
                if r.segment_count() <= 1 {
                    // The checks (and errors) of a ranged read, as for short ones.
                    let range = RangeRead {
                        key: r.key,
                        object_offset: r.object_offset,
                        dest: MemoryRegion {
                            address: r.dest.address.wrapping_add(r.dest_offset),
                            len: r.inner_bytes,
                            kind: r.dest.kind,
                        },
                    };
                    check_range(&range, size)?;
                }
                r.check_bounds(size)?;
                if r.total_bytes() > 0 {
                    base = host_ptr_mut(&r.dest, r.key)?;
                    let start = r.object_offset / PAGE * PAGE;
                    let end = r.object_offset + r.reach_src().expect("checked by check_bounds");
                    maps.push((i, Self::map_range(file, r.key, start, end)?, start));
                }
                Ok(CheckedRead { bytes: r.total_bytes(), crcs: span.map(|_| Vec::new()) })
            })();
            results.push(checked);
        }
        if !maps.is_empty() {
            let parts: Vec<super::kernels::MappedRead<'_, '_>> = maps
                .iter()
                .map(|(i, m, start)| super::kernels::MappedRead {
                    read: &reads[*i],
                    src: m.addr as *const u8,
                    src_origin: *start,
                })
                .collect();
            let mut sums: Option<Vec<CrcRuns>> = span.map(|s| maps.iter().map(|_| CrcRuns::new(s)).collect());
            // SAFETY: every part passed `check_bounds` against its object's size and the
            // shared destination view (valid and ours: this function's contract); each
            // mapping covers the object bytes its read touches and outlives the sums.
            unsafe { super::kernels::copy_merged(base, &parts, sums.as_deref_mut()) };
            for (runs, (i, _, _)) in sums.into_iter().flatten().zip(&maps) {
                if let Ok(c) = &mut results[*i] {
                    c.crcs = Some(runs.finish());
                }
            }
        }
        results
    }

    /// One strided read segment by segment through [`DirectoryStore::read_one`]
    /// (`pread`): for short single-segment reads.
    unsafe fn read_strided(
        &self,
        r: &StridedRead<'_>,
        cache: &mut ReadCache,
        span: Option<u64>,
    ) -> Result<CheckedRead> {
        let mut total = 0;
        let mut sums = span.map(CrcRuns::new);
        r.for_each_segment(|s, d, n| {
            let range = RangeRead {
                key: r.key,
                object_offset: s,
                dest: MemoryRegion { address: r.dest.address + d, len: n, kind: r.dest.kind },
            };
            // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
            total += unsafe { self.read_one_into(&range, cache, sums.as_mut()) }?;
            Ok(())
        })?;
        Ok(CheckedRead { bytes: total, crcs: sums.map(CrcRuns::finish) })
    }

    unsafe fn strided(&self, reads: &[StridedRead<'_>], span: Option<u64>) -> Vec<Result<CheckedRead>> {
        let bytes: u64 = reads.iter().map(|r| r.total_bytes()).sum();
        let mut results: Vec<Result<CheckedRead>> = (0..reads.len()).map(|_| Ok(CheckedRead::default())).collect();
        let groups = super::kernels::dest_groups(reads);
        let concurrent = super::kernels::parallel_workers(groups.len(), bytes, self.threads.get()) > 1;
        let done =
            run_parallel_on((0..groups.len()).collect(), bytes, self.threads.get(), |g, cache: &mut ReadCache| {
                cache.concurrent = concurrent;
                // SAFETY: this function's caller guarantees every destination region valid and exclusively ours for the call (its `# Safety`), which is `read_group`'s contract.
                unsafe { self.read_group(&reads[groups[g].clone()], cache, span) }
            });
        for (g, rs) in done {
            for (i, r) in groups[g].clone().zip(rs) {
                results[i] = r;
            }
        }
        results
    }

    unsafe fn ranges(&self, ranges: &[RangeRead<'_>], span: Option<u64>) -> Vec<Result<CheckedRead>> {
        let bytes: u64 = ranges.iter().map(|r| r.dest.len).sum();
        let mut results: Vec<Result<CheckedRead>> = (0..ranges.len()).map(|_| Ok(CheckedRead::default())).collect();
        // SAFETY: as above, for `read_one`'s ranges.
        let done = run_parallel_on((0..ranges.len()).collect(), bytes, self.threads.get(), |i, cache| unsafe {
            self.read_one(&ranges[i], cache, span)
        });
        for (i, r) in done {
            results[i] = r;
        }
        results
    }
}

impl DirectoryStore {
    /// Walks `dir` (the directory of key prefix `path`, `""` or ending in `/`)
    /// through open directory handles, never following a link: `d.` entries that
    /// are real directories are descended into when they can hold keys starting with
    /// `prefix`, `f.` entries that are regular files are visited. Anything else (a
    /// link, a foreign name) is skipped. Returns `false` when `visit` stopped.
    fn walk(&self, dir: &Dir, path: &str, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<bool> {
        let ctx = |e: io::Error| Error::new(ErrorKind::Io, format!("cannot list objects/{path}: {e}"));
        for name in dir.names().map_err(ctx)? {
            let Ok(text) = name.to_str() else { continue };
            if let Some(seg) = text.strip_prefix("d.") {
                let sub = format!("{path}{seg}/");
                if !(sub.starts_with(prefix) || prefix.starts_with(&sub)) {
                    continue;
                }
                let next = match dir.open_dir(&name) {
                    Ok(d) => d,
                    // A link or a file where a directory belongs: never followed.
                    Err(e) if matches!(errno(&e), libc::ELOOP | libc::ENOTDIR | libc::ENOENT) => continue,
                    Err(e) => return Err(ctx(e)),
                };
                if !self.walk(&next, &sub, prefix, visit)? {
                    return Ok(false);
                }
            } else if let Some(seg) = text.strip_prefix("f.") {
                let key = format!("{path}{seg}");
                if !key.starts_with(prefix) {
                    continue;
                }
                match dir.entry(&name) {
                    Ok(EntryKind::File(n)) => {
                        if !visit(&key, n) {
                            return Ok(false);
                        }
                    }
                    Ok(_) => {}
                    Err(e) if errno(&e) == libc::ENOENT => {}
                    Err(e) => return Err(ctx(e)),
                }
            }
        }
        Ok(true)
    }

    /// Last-modification time (seconds since the epoch) of `key`'s file, not
    /// following links; `None` when absent or unreadable. For tools (`mws gc`).
    pub fn object_mtime(&self, key: &str) -> Option<i64> {
        let p = self.parent(key, false).ok()??;
        mtime_secs(&p.dir, &p.leaf)
    }
}

impl ObjectStore for DirectoryStore {
    fn supports_list(&self) -> bool {
        true
    }

    /// Walks `objects/` with the same no-follow directory handles as every other
    /// operation (links below the root are skipped, never followed).
    fn list(&self, prefix: &str, visit: &mut dyn FnMut(&str, u64) -> bool) -> Result<()> {
        let root = self.objects_dir.try_clone().map_err(|e| Error::new(ErrorKind::Io, format!("cannot list: {e}")))?;
        self.walk(&root, "", prefix, visit).map(drop)
    }

    fn object_size(&self, key: &str) -> Result<u64> {
        let Some(p) = self.parent(key, false)? else { return Err(not_found(key)) };
        self.leaf_size(&p, key)?.ok_or_else(|| not_found(key))
    }

    fn object_sizes(&self, keys: &[&str]) -> Vec<Result<u64>> {
        let mut last = None;
        keys.iter()
            .map(|key| {
                let Some(p) = self.parent_cached(key, &mut last)? else { return Err(not_found(key)) };
                self.leaf_size(p, key)?.ok_or_else(|| not_found(key))
            })
            .collect()
    }

    fn cost(&self) -> super::StoreCost {
        super::StoreCost::LOCAL
    }

    fn supports_strided_reads(&self) -> bool {
        true
    }

    unsafe fn get_into_strided(&self, reads: &[StridedRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.strided(reads, None) }.into_iter().map(|r| r.map(|c| c.bytes)).collect()
    }

    /// Sums the mapped source bytes as the copy kernels copy them, `pread` pieces
    /// right after they landed.
    unsafe fn get_into_strided_checked(&self, reads: &[StridedRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.strided(reads, Some(crc_span)) }
    }

    fn put(&self, key: &str, value: &[u8], _config: &WriteConfig<'_>) -> Result<()> {
        self.write_object(key, Publish::CreateOnly, |f| f.write_all(value).map_err(|e| io_err("cannot write", key, e)))
    }

    fn upsert(&self, key: &str, value: &[u8], _config: &WriteConfig<'_>) -> Result<()> {
        self.write_object(key, Publish::Replace, |f| f.write_all(value).map_err(|e| io_err("cannot write", key, e)))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.read_bounded(key, u64::MAX)
    }

    fn get_limited(&self, key: &str, max_bytes: u64) -> Result<Vec<u8>> {
        self.read_bounded(key, max_bytes)
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let Some(p) = self.parent(key, false)? else { return Ok(false) };
        Ok(self.leaf_size(&p, key)?.is_some())
    }

    fn remove(&self, key: &str) -> Result<()> {
        let Some(p) = self.parent(key, false)? else { return Ok(()) };
        if self.leaf_size(&p, key)?.is_none() {
            return Ok(());
        }
        match p.dir.unlink(&p.leaf) {
            Ok(()) => p.dir.sync().map_err(|e| io_err("cannot sync directory of", key, e)),
            Err(e) if errno(&e) == libc::ENOENT => Ok(()),
            Err(e) => Err(io_err("cannot remove", key, e)),
        }
    }

    unsafe fn batch_put_from(&self, items: &[PutFrom<'_>], config: &WriteConfig<'_>) -> Vec<Result<()>> {
        // Keys are checked up front too, so an invalid key fails before any I/O.
        let mut results: Vec<Result<()>> = precheck_put_from(items, config)
            .into_iter()
            .zip(items)
            .map(|(c, item)| c.and_then(|_| Self::names(item.key).map(drop)))
            .collect();
        let jobs: Vec<usize> = (0..items.len()).filter(|&i| results[i].is_ok()).collect();
        let bytes: u64 = jobs.iter().map(|&i| items[i].source.len).sum();
        let threads = self.threads.get();
        // SAFETY: the pointers and regions used here come from this function's caller, who upholds its `# Safety` contract (valid, disjoint memory for the call); bounds were checked above.
        for (i, r) in run_parallel_on(jobs, bytes, threads, |i, _: &mut ()| unsafe { self.put_from_one(&items[i]) }) {
            results[i] = r;
        }
        results
    }

    unsafe fn get_into_ranges(&self, ranges: &[RangeRead<'_>]) -> Vec<Result<u64>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.ranges(ranges, None) }.into_iter().map(|r| r.map(|c| c.bytes)).collect()
    }

    unsafe fn get_into_ranges_checked(&self, ranges: &[RangeRead<'_>], crc_span: u64) -> Vec<Result<CheckedRead>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.ranges(ranges, Some(crc_span)) }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<DirectoryStore>();
    is::<super::memory::MemoryStore>();
}
