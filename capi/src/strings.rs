//! Translation of C strings and (pointer, length) pairs, and NUL-terminated copies of
//! Rust strings that handles lend out.

use crate::boundary::{mws_status, Failure, FfiResult};
use std::ffi::c_char;
use std::ffi::CStr;

/// An owned, NUL-terminated copy of a Rust string, lent to C as `const char *` plus
/// a length (which excludes the terminator, so an interior NUL stays visible through
/// the length).
#[derive(Debug)]
pub(crate) struct CText(Box<[u8]>);

impl CText {
    pub(crate) fn new(s: &str) -> Self {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        CText(v.into_boxed_slice())
    }

    pub(crate) fn as_ptr(&self) -> *const c_char {
        self.0.as_ptr() as *const c_char
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len() - 1
    }

    /// Writes the length to `len_out` (when not NULL) and returns the pointer.
    ///
    /// # Safety
    /// `len_out` is NULL or valid for a write of `size_t`.
    pub(crate) unsafe fn lend(&self, len_out: *mut usize) -> *const c_char {
        if !len_out.is_null() {
            // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
            unsafe { *len_out = self.len() };
        }
        self.as_ptr()
    }
}

/// Reads a required NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    utf8(unsafe { CStr::from_ptr(p) }.to_bytes(), name)
}

/// Reads an optional NUL-terminated UTF-8 string argument (NULL gives `None`).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(p: *const c_char, name: &str) -> FfiResult<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: `p` is NULL or a NUL-terminated string valid for the call (this function's contract).
        unsafe { str_arg(p, name) }.map(Some)
    }
}

pub(crate) fn utf8<'a>(bytes: &'a [u8], name: &str) -> FfiResult<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| {
        Failure::new(
            mws_status::MWS_INVALID_UTF8,
            format!("argument `{name}` is not valid UTF-8 (invalid byte at offset {})", e.valid_up_to()),
        )
    })
}

/// Reads a (pointer, count) array argument. A count of 0 gives an empty slice whatever
/// the pointer; otherwise the pointer must be non-NULL and suitably aligned.
///
/// # Safety
/// When `len > 0` and `p` is not NULL, `p` points to `len` valid, initialized `T`s that
/// stay valid and unmodified for the call.
pub(crate) unsafe fn slice_arg<'a, T>(p: *const T, len: usize, name: &str) -> FfiResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(name));
    }
    if (p as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Failure::invalid(format!("argument `{name}` is not suitably aligned")));
    }
    match len.checked_mul(std::mem::size_of::<T>()) {
        // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
        Some(bytes) if bytes <= isize::MAX as usize => Ok(unsafe { std::slice::from_raw_parts(p, len) }),
        _ => Err(Failure::invalid(format!("length of argument `{name}` ({len}) is too large"))),
    }
}

/// Writes `value` to a required out-parameter.
///
/// # Safety
/// `out` is NULL (an error) or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    debug_assert!(!out.is_null());
    // SAFETY: the arguments satisfy the callee's contract, which this function's `# Safety` section passes on to its caller.
    unsafe { out.write(value) };
}

/// Checks that a required out-parameter is not NULL (before doing any work).
pub(crate) fn check_out<T>(out: *mut T, name: &str) -> FfiResult<()> {
    if out.is_null() {
        Err(Failure::null(name))
    } else {
        Ok(())
    }
}

/// Borrows a required pointer to a C struct argument (options, vtables, views).
///
/// # Safety
/// `p` is NULL or points to a valid, initialized `T` for the call.
pub(crate) unsafe fn struct_arg<'a, T>(p: *const T, name: &str) -> FfiResult<&'a T> {
    // SAFETY: the caller guarantees `p` is NULL or valid (see above).
    unsafe { p.as_ref() }.ok_or_else(|| Failure::null(name))
}
