//! Translation of arguments: handles, C strings, (pointer, length) arrays, C structs
//! and out-parameters, and the NUL-terminated copies of Rust strings that handles
//! lend out.
//!
//! Every entry point reads its pointer arguments through a [`Caller`], the token
//! that the boundary macros (`status_call!(|c| ...)`, `value_call!(fallback, |c|
//! ...)`) create once per call. The token carries the entry point's `# Safety`
//! contract — every pointer argument is NULL or valid as documented, for the whole
//! call — so the readers below are safe functions: they check what C can get wrong
//! and Rust cannot express (NULL, UTF-8, alignment, lengths, enum values) and leave
//! the `// SAFETY:` comments of an entry point to what is specific to it.

use crate::boundary::{mws_status, Failure, FfiResult};
use crate::calls::{self, Slot};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::marker::PhantomData;

/// How a C handle is made and given back: every handle type is owned by C as a boxed
/// [`Slot`] of itself (the value and the calls using it now; the C pointer type is
/// opaque, so it points at the slot). Declared with `handle!`; borrowed and freed
/// through a [`Caller`], which counts the calls in flight so that a `*_free` never
/// frees a handle under a running call (`calls`).
pub(crate) trait Handle: Sized {
    /// Moves `self` to the heap and hands ownership to C (freed by its `*_free`).
    fn into_raw(self) -> *mut Self {
        calls::into_raw(self).cast()
    }
}

/// Declares C handle types (`impl Handle`): made by [`Handle::into_raw`], borrowed by
/// [`Caller::handle`] / [`Caller::handles`], freed by [`Caller::free`] in the type's
/// `*_free` entry point. (The entry points themselves are written out, one line
/// each: cbindgen reads source files and does not expand macros, so a generated
/// `extern "C"` function would be missing from the header.)
macro_rules! handle {
    ($($t:ty),* $(,)?) => {
        $(impl $crate::args::Handle for $t {})*
    };
}

/// The panic boundary of an entry point that returns `mws_status`:
/// `status_call!(|c| { ... })` runs the body (an `FfiResult<()>`) with `c`, the
/// call's [`Caller`] token, catches any panic and records the
/// message of a failure, prefixed with the entry point's name.
macro_rules! status_call {
    (|$c:ident| $body:expr) => {
        $crate::boundary::status_call(function_name!(), || {
            // SAFETY: used only in the body of an `unsafe extern "C"` entry point
            // whose `# Safety` section requires every pointer argument to be NULL or
            // valid as documented for the whole call: the token carries that promise.
            #[allow(unused_variables)]
            let $c = unsafe { $crate::args::Caller::trusted() };
            $body
        })
    };
}

/// The body of an entry point that lends a string of a handle:
/// `text_call!(handle, "name", len, |h| text)` borrows the handle argument `handle`
/// (`MWS_NULL_ARGUMENT` naming `name`) as `h`, and returns the NUL-terminated string
/// `text` (a [`CText`] the handle owns, often from its [`Texts`]), writing its length
/// to `*len` when `len` is not NULL; NULL (and the last error) on failure.
macro_rules! text_call {
    ($handle:expr, $name:literal, $len:expr, |$h:ident| $text:expr) => {
        value_call!(std::ptr::null(), |c| {
            let $h = c.handle($handle, $name)?;
            Ok(c.lend($text, $len))
        })
    };
}

/// The panic boundary of an entry point that returns a value:
/// `value_call!(fallback, |c| { ... })` returns `fallback` (NULL, 0) on failure; the
/// token as for [`status_call!`].
macro_rules! value_call {
    ($fallback:expr, |$c:ident| $body:expr) => {
        $crate::boundary::value_call(function_name!(), $fallback, || {
            // SAFETY: as in `status_call!`: only in entry points whose `# Safety`
            // section covers every pointer argument.
            #[allow(unused_variables)]
            let $c = unsafe { $crate::args::Caller::trusted() };
            $body
        })
    };
}

/// The proof that an entry point's caller upheld its `# Safety` contract: every
/// pointer argument is NULL or points to what the documentation says (a live handle
/// of the named type not freed during the call, a NUL-terminated string, `len`
/// readable elements, a writable out-parameter), valid for the whole call.
///
/// Made only by the boundary macros, inside `unsafe extern "C"` entry points whose
/// `# Safety` sections say so; never stored beyond the call.
#[derive(Clone, Copy)]
pub(crate) struct Caller<'a>(PhantomData<&'a ()>);

/// An out-parameter checked non-NULL: written at most once, on success.
pub(crate) struct Out<'a, T>(&'a mut std::mem::MaybeUninit<T>);

impl<T> Out<'_, T> {
    /// Writes the value.
    pub(crate) fn set(self, value: T) {
        self.0.write(value);
    }

    /// Writes `value` as the last step of a call, whose success it returns.
    pub(crate) fn give(self, value: T) -> FfiResult<()> {
        self.set(value);
        Ok(())
    }
}

impl<H: Handle> Out<'_, *mut H> {
    /// Hands a new handle to C (which owns it from then on and frees it with the
    /// type's `*_free`) as the last step of a constructor, whose success it returns.
    pub(crate) fn give_handle(self, handle: H) -> FfiResult<()> {
        self.give(handle.into_raw())
    }
}

impl<'a> Caller<'a> {
    /// The token of one call.
    ///
    /// # Safety
    /// Only in the body of an entry point whose `# Safety` section requires every
    /// pointer argument to be NULL or valid as documented, for the whole call.
    pub(crate) unsafe fn trusted() -> Caller<'a> {
        Caller(PhantomData)
    }

    /// Borrows a required handle argument (`MWS_NULL_ARGUMENT` naming `name`).
    pub(crate) fn handle<T: Handle>(self, p: *const T, name: &str) -> FfiResult<&'a T> {
        self.opt_handle(p).ok_or_else(|| Failure::null(name))
    }

    /// Borrows a required handle argument for a call that modifies it.
    pub(crate) fn handle_mut<T: Handle>(self, p: *mut T, name: &str) -> FfiResult<&'a mut T> {
        // SAFETY: the token's contract: `p` is NULL or a live handle (a slot made by
        // `Handle::into_raw`) that no other thread uses during the call (the entry
        // point documents it).
        let slot = unsafe { p.cast::<Slot<T>>().as_mut() }.ok_or_else(|| Failure::null(name))?;
        calls::enter(slot);
        Ok(&mut slot.value)
    }

    /// Borrows an optional handle argument (NULL gives `None`), counted as in use by
    /// this call until it returns.
    pub(crate) fn opt_handle<T: Handle>(self, p: *const T) -> Option<&'a T> {
        // SAFETY: the token's contract: `p` is NULL or a live handle (a slot made by
        // `Handle::into_raw`) for the call.
        let slot = unsafe { p.cast::<Slot<T>>().as_ref() }?;
        calls::enter(slot);
        Some(&slot.value)
    }

    /// Borrows an array of `n` handles (`name[i]` names a NULL element).
    pub(crate) fn handles<T: Handle>(self, p: *const *const T, n: usize, name: &str) -> FfiResult<Vec<&'a T>> {
        self.slice(p, n, name)?.iter().enumerate().map(|(i, &h)| self.handle(h, &format!("{name}[{i}]"))).collect()
    }

    /// Takes a handle back from C and drops it once no call uses it (waiting for
    /// the calls of other threads; deferred to the end of a call of this thread that
    /// uses it, such as a callback freeing its caller's handle); NULL does nothing.
    pub(crate) fn free<T: Handle>(self, p: *mut T) -> FfiResult<()> {
        if !p.is_null() {
            // SAFETY: the token's contract for a `*_free`: `p` came from
            // `Handle::into_raw` (a slot), is freed once and no call starts using it
            // after this free.
            unsafe { calls::free(p.cast::<Slot<T>>()) };
        }
        Ok(())
    }

    /// Takes ownership of a handle that C hands over (a callback's out-parameter,
    /// such as the binding a guard observed); NULL gives `None`.
    ///
    /// # Safety
    /// `p` is NULL or a handle made by `Handle::into_raw` whose ownership passes to
    /// the library: C neither uses nor frees it afterwards.
    pub(crate) unsafe fn take_handle<T: Handle>(self, p: *mut T) -> Option<T> {
        // SAFETY: the function's contract.
        (!p.is_null()).then(|| unsafe { calls::take(p.cast::<Slot<T>>()) })
    }

    /// Reads a required NUL-terminated UTF-8 string argument.
    pub(crate) fn str(self, p: *const c_char, name: &str) -> FfiResult<&'a str> {
        self.opt_str(p, name)?.ok_or_else(|| Failure::null(name))
    }

    /// Reads an optional NUL-terminated UTF-8 string argument (NULL gives `None`).
    pub(crate) fn opt_str(self, p: *const c_char, name: &str) -> FfiResult<Option<&'a str>> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: the token's contract: a non-NULL string argument is NUL-terminated
        // and valid for the call.
        utf8(unsafe { CStr::from_ptr(p) }.to_bytes(), name).map(Some)
    }

    /// Reads a required (pointer, length) byte array, such as a JSON document: NULL is
    /// `MWS_NULL_ARGUMENT` even when `len` is 0.
    pub(crate) fn bytes(self, p: *const c_char, len: usize, name: &str) -> FfiResult<&'a [u8]> {
        if p.is_null() {
            return Err(Failure::null(name));
        }
        self.slice(p as *const u8, len, name)
    }

    /// Reads a (pointer, count) array argument: a count of 0 gives an empty slice
    /// whatever the pointer; otherwise the pointer must be non-NULL and aligned.
    pub(crate) fn slice<T>(self, p: *const T, len: usize, name: &str) -> FfiResult<&'a [T]> {
        if len == 0 {
            return Ok(&[]);
        }
        if p.is_null() {
            return Err(Failure::null(name));
        }
        if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Failure::invalid(format!("argument `{name}` is not suitably aligned")));
        }
        match len.checked_mul(std::mem::size_of::<T>()) {
            // SAFETY: the token's contract: `len` initialized elements at `p`, unmodified
            // for the call; the total size fits `isize`.
            Some(bytes) if bytes <= isize::MAX as usize => Ok(unsafe { std::slice::from_raw_parts(p, len) }),
            _ => Err(Failure::invalid(format!("length of argument `{name}` ({len}) is too large"))),
        }
    }

    /// Borrows a required pointer to a C struct argument (options, vtables, views).
    pub(crate) fn struct_ref<T>(self, p: *const T, name: &str) -> FfiResult<&'a T> {
        self.opt_struct(p).ok_or_else(|| Failure::null(name))
    }

    /// Borrows an optional pointer to a C struct argument (NULL gives `None`).
    pub(crate) fn opt_struct<T>(self, p: *const T) -> Option<&'a T> {
        // SAFETY: the token's contract: `p` is NULL or a valid, initialized `T`.
        unsafe { p.as_ref() }
    }

    /// A required out-parameter, checked before any work (`MWS_NULL_ARGUMENT`).
    pub(crate) fn out<T>(self, p: *mut T, name: &str) -> FfiResult<Out<'a, T>> {
        self.opt_out(p).ok_or_else(|| Failure::null(name))
    }

    /// An optional out-parameter (NULL gives `None`).
    pub(crate) fn opt_out<T>(self, p: *mut T) -> Option<Out<'a, T>> {
        // SAFETY: the token's contract: `p` is NULL or valid for a write of `T` (an
        // out-parameter may be uninitialized, hence `MaybeUninit`).
        unsafe { p.cast::<std::mem::MaybeUninit<T>>().as_mut() }.map(Out)
    }

    /// Writes `value` to an optional out-parameter; nothing when it is NULL (never give
    /// a new handle this way: it would leak).
    pub(crate) fn opt_set<T>(self, p: *mut T, value: T) {
        if let Some(out) = self.opt_out(p) {
            out.set(value);
        }
    }

    /// Reads a caller's versioned vtable of type `T` (`size` at least `T`'s, the
    /// given `version`) and copies it (`MWS_INVALID_ARGUMENT` naming `name` when
    /// NULL or too small, `MWS_UNSUPPORTED` for another version).
    pub(crate) fn vtable<T: Copy>(self, p: *const T, name: &str, version: u32) -> mws::Result<T> {
        // SAFETY: the token's contract: a non-NULL vtable argument is readable for its
        // `size` field's bytes; `read_vtable` reads the header first.
        unsafe { crate::callbacks::read_vtable(p, name, version) }
    }

    /// Lends `text` to C, writing its length to `len` when `len` is not NULL.
    pub(crate) fn lend(self, text: &CText, len: *mut usize) -> *const c_char {
        self.opt_set(len, text.len());
        text.as_ptr()
    }

    /// Copies `bytes` into the caller's buffer of `cap` bytes at `buf` (which must be
    /// non-NULL and at least `bytes.len()` long: checked by the caller).
    pub(crate) fn copy_to(self, bytes: &[u8], buf: *mut u8, cap: usize) {
        debug_assert!(!buf.is_null() && bytes.len() <= cap);
        // SAFETY: the token's contract: `buf` is valid for `cap >= bytes.len()` bytes
        // of writes; `bytes` is our own memory, so the ranges are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len()) };
    }
}

/// Element `index` of what a handle lends, or `MWS_INVALID_ARGUMENT`
/// `<item> index <index> is out of range (the <has(len)>)`, e.g. `fragment index 7 is
/// out of range (the placement has 3 fragments)`.
pub(crate) fn at<'a, T>(
    items: &'a [T],
    index: usize,
    item: &str,
    has: impl FnOnce(usize) -> String,
) -> FfiResult<&'a T> {
    items
        .get(index)
        .ok_or_else(|| Failure::invalid(format!("{item} index {index} is out of range (the {})", has(items.len()))))
}

/// Decodes a string argument's bytes (`MWS_INVALID_UTF8` naming `name`).
pub(crate) fn utf8<'a>(bytes: &'a [u8], name: &str) -> FfiResult<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| {
        Failure::new(
            mws_status::MWS_INVALID_UTF8,
            format!("argument `{name}` is not valid UTF-8 (invalid byte at offset {})", e.valid_up_to()),
        )
    })
}

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
}

/// The strings a handle lends to C, interned: each distinct string is copied once,
/// NUL-terminated, when it is first asked for, and stays at its address until the
/// handle (which owns this table) is freed, so every pointer lent from it stays valid
/// that long. Thread-safe (a mutex around the table).
#[derive(Debug, Default)]
pub(crate) struct Texts(Mutex<HashMap<Box<str>, Box<CText>>>);

impl Texts {
    /// The interned copy of `s`.
    pub(crate) fn get(&self, s: &str) -> &CText {
        let mut table = self.0.lock();
        if !table.contains_key(s) {
            table.insert(s.into(), Box::new(CText::new(s)));
        }
        let text: *const CText = &*table[s];
        // SAFETY: entries are only ever added, never removed or replaced, so the boxed
        // text stays at its address, unchanged, for as long as `self` lives.
        unsafe { &*text }
    }

    /// The interned copy of `s` as a C string pointer (for the C structs a handle lends).
    pub(crate) fn ptr(&self, s: &str) -> *const c_char {
        self.get(s).as_ptr()
    }
}

/// The C structs a handle lends (`*_fragment`, `*_operation`, ... accessors), built once
/// when the handle is made: their pointers point into the same handle (its [`Texts`]
/// and the core value it holds), which is immutable while it lives.
#[derive(Debug)]
pub(crate) struct Lent<T>(pub(crate) Vec<T>);

// SAFETY: the raw pointers inside point into data owned by the same handle, immutable
// after construction; the structs are only read.
unsafe impl<T> Send for Lent<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Lent<T> {}

impl<T> std::ops::Deref for Lent<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}
