//! Directory-handle primitives of the directory store: every path below the store's
//! root is resolved one component at a time relative to an open directory, with
//! `O_NOFOLLOW` (and `O_DIRECTORY` for directories), so a symbolic link planted
//! anywhere below the root is never followed (`openat(2)`, `mkdirat(2)`,
//! `fstatat(2)` with `AT_SYMLINK_NOFOLLOW`, `linkat(2)`, `renameat(2)`,
//! `unlinkat(2)`). Where the kernel has it (Linux 5.6+), [`Dir::open_beneath`] does
//! the same walk in one call (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`); the
//! store uses it as a fast path and falls back to the component walk, which gives the
//! exact per-component errors, whenever it fails.
//!
//! All functions are thread-safe (they only use their own descriptors) and never panic.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What `fstatat(AT_SYMLINK_NOFOLLOW)` found at a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A regular file of this many bytes.
    File(u64),
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

impl EntryKind {
    fn of(st: &libc::stat) -> EntryKind {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => EntryKind::File(st.st_size.max(0) as u64),
            libc::S_IFDIR => EntryKind::Dir,
            libc::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A file name as a C string (names never contain NUL: keys are validated).
pub(crate) fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file name contains NUL"))
}

/// An open directory (`O_RDONLY | O_DIRECTORY | O_CLOEXEC`).
#[derive(Debug)]
pub(crate) struct Dir(OwnedFd);

impl Dir {
    /// Opens the directory at `path`, following links in `path` itself (the caller
    /// named it).
    pub(crate) fn open_path(path: &Path) -> io::Result<Dir> {
        let p = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        // SAFETY: `p` is a valid C string; the returned descriptor is owned below.
        let fd = cvt(unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Opens the subdirectory `name`; a symbolic link fails (`ELOOP` or `ENOTDIR`).
    pub(crate) fn open_dir(&self, name: &CStr) -> io::Result<Dir> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid descriptor and C string; the result is owned below.
        let fd = cvt(unsafe { libc::openat(self.0.as_raw_fd(), name.as_ptr(), flags) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Opens the directory at the relative path `rel` (components separated by `/`)
    /// in one `openat2(2)` call that refuses every symbolic link on the way
    /// (`RESOLVE_NO_SYMLINKS`, also "magic" links) and any escape from this directory
    /// (`RESOLVE_BENEATH`): the same directory the component walk of
    /// [`Dir::open_dir`] reaches, or an error. `Unsupported` when the kernel (or a
    /// seccomp filter) lacks `openat2`; remembered process-wide after the first such
    /// answer, so later calls cost nothing.
    pub(crate) fn open_beneath(&self, rel: &CStr) -> io::Result<Dir> {
        use std::sync::atomic::{AtomicBool, Ordering};
        static MISSING: AtomicBool = AtomicBool::new(false);
        if MISSING.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        // SAFETY: `open_how` is plain data; all-zero is a valid value, filled below.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: valid descriptor, C string and `open_how` of the size passed; the
        // result is a new descriptor owned below (or -1).
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.0.as_raw_fd(),
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) {
                MISSING.store(true, Ordering::Relaxed);
                return Err(io::ErrorKind::Unsupported.into());
            }
            return Err(e);
        }
        // SAFETY: a fresh descriptor we own (`r` fits an int: the kernel returns one).
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) }))
    }

    /// A second handle of the same directory.
    pub(crate) fn try_clone(&self) -> io::Result<Dir> {
        self.0.try_clone().map(Dir)
    }

    /// Creates the subdirectory `name` (mode 0777 before the umask).
    pub(crate) fn mkdir(&self, name: &CStr) -> io::Result<()> {
        // SAFETY: valid descriptor and C string.
        cvt(unsafe { libc::mkdirat(self.0.as_raw_fd(), name.as_ptr(), 0o777) }).map(drop)
    }

    /// What is at `name`, without following a link.
    pub(crate) fn entry(&self, name: &CStr) -> io::Result<EntryKind> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: valid descriptor, C string and output buffer.
        cvt(unsafe { libc::fstatat(self.0.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
        // SAFETY: fstatat succeeded, so the buffer is initialised.
        Ok(EntryKind::of(unsafe { &st.assume_init() }))
    }

    /// Opens `name` for reading without following a link and without blocking (a
    /// FIFO does not wait for a writer). The caller checks the type with [`kind_of`].
    pub(crate) fn open_read(&self, name: &CStr) -> io::Result<File> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
        // SAFETY: valid descriptor and C string; the result is owned below.
        let fd = cvt(unsafe { libc::openat(self.0.as_raw_fd(), name.as_ptr(), flags) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates the new regular file `name` for writing (`O_EXCL | O_NOFOLLOW`, mode
    /// 0666 before the umask).
    pub(crate) fn create_new(&self, name: &CStr) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid descriptor and C string; the result is owned below.
        let fd = cvt(unsafe { libc::openat(self.0.as_raw_fd(), name.as_ptr(), flags, 0o666 as libc::c_uint) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// `linkat(self/name, to/to_name)`: fails with `EEXIST` if the target exists
    /// (never replaces it, never follows a link at either name).
    pub(crate) fn link(&self, name: &CStr, to: &Dir, to_name: &CStr) -> io::Result<()> {
        // SAFETY: valid descriptors and C strings.
        cvt(unsafe { libc::linkat(self.0.as_raw_fd(), name.as_ptr(), to.0.as_raw_fd(), to_name.as_ptr(), 0) }).map(drop)
    }

    /// `renameat(self/name, to/to_name)`: atomically replaces the target entry (a
    /// link at the target is replaced, not followed).
    pub(crate) fn rename(&self, name: &CStr, to: &Dir, to_name: &CStr) -> io::Result<()> {
        // SAFETY: valid descriptors and C strings.
        cvt(unsafe { libc::renameat(self.0.as_raw_fd(), name.as_ptr(), to.0.as_raw_fd(), to_name.as_ptr()) }).map(drop)
    }

    /// Removes the non-directory entry `name` (a link itself, never its target).
    pub(crate) fn unlink(&self, name: &CStr) -> io::Result<()> {
        // SAFETY: valid descriptor and C string.
        cvt(unsafe { libc::unlinkat(self.0.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
    }

    /// `fsync` of the directory (makes its entries durable).
    pub(crate) fn sync(&self) -> io::Result<()> {
        // SAFETY: valid descriptor.
        cvt(unsafe { libc::fsync(self.0.as_raw_fd()) }).map(drop)
    }

    /// The names in the directory (without `.` and `..`), read through this handle.
    pub(crate) fn names(&self) -> io::Result<Vec<CString>> {
        let fd = self.0.try_clone()?;
        // SAFETY: fdopendir takes ownership of the duplicated descriptor on success.
        let dir = unsafe { libc::fdopendir(fd.as_raw_fd()) };
        if dir.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd); // now owned by `dir`, closed by closedir
                              // SAFETY: rewind: a duplicated descriptor shares the offset of earlier reads.
        unsafe { libc::rewinddir(dir) };
        let mut out = Vec::new();
        loop {
            // errno tells an error from the end of the directory.
            // SAFETY: `__errno_location` is always valid for the calling thread.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `dir` is a valid, open directory stream.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                // SAFETY: closes the stream (and the descriptor) once.
                unsafe { libc::closedir(dir) };
                return if e.raw_os_error() == Some(0) { Ok(out) } else { Err(e) };
            }
            // SAFETY: `d_name` is a NUL-terminated array inside the entry.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                out.push(name.to_owned());
            }
        }
    }
}

/// The kind of an open file (`fstat`).
pub(crate) fn kind_of(file: &File) -> io::Result<EntryKind> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: valid descriptor and output buffer.
    cvt(unsafe { libc::fstat(file.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded.
    Ok(EntryKind::of(unsafe { &st.assume_init() }))
}

/// Last-modification time of `name` in `dir` (seconds since the epoch), not
/// following a link; `None` if it cannot be read.
pub(crate) fn mtime_secs(dir: &Dir, name: &CStr) -> Option<i64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: valid descriptor, C string and output buffer.
    let r = unsafe { libc::fstatat(dir.0.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    // SAFETY: initialised when fstatat succeeded.
    (r == 0).then(|| unsafe { st.assume_init() }.st_mtime)
}
